"""The layers of docs/ARCHITECTURE.md, read from the imports: cli -> engine -> ops -> facts ->
connection, with the shared modules at fxkit's root under all of them. A module imports only
from its own layer and those below (a lab host gets fxkit's connection modules without the
engine, for one)."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest

FXKIT = Path(__file__).resolve().parent.parent / "fxkit"

#: The shared modules every layer may use: they import none of the layers.
SHARED = {"fxkit.errors", "fxkit.redaction", "fxkit.yamlfile", "fxkit.varfiles", "fxkit.paths"}
#: Contracts declared once for a layer and one below it, importing only SHARED.
CONTRACTS = {"fxkit.staging_report"}

#: Each lower layer and what it may import beside itself and SHARED.
BELOW = {
    "fxkit.connection": set(),
    "fxkit.facts": {"fxkit.connection"},
    # staging_report: what `fxkit stage` prints, declared once for it and the stage operation
    "fxkit.ops": {"fxkit.connection", "fxkit.facts", "fxkit.staging_report"},
    "fxkit.inventory": set(),
}


def imports(path: Path) -> set[str]:
    """The fxkit modules ``path`` imports (at any depth of its code)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("fxkit"):
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("fxkit")}
    return found


def outside(module: str, allowed: set[str]) -> bool:
    return not any(module == a or module.startswith(a + ".") for a in allowed)


@pytest.mark.parametrize("layer", sorted(BELOW))
def test_a_lower_layer_imports_nothing_above_it(layer: str) -> None:
    allowed = {layer, *BELOW[layer], *SHARED}
    folder = FXKIT / layer.removeprefix("fxkit.")
    wrong = {
        f"{path.relative_to(FXKIT.parent)} imports {module}"
        for path in folder.rglob("*.py")
        for module in imports(path)
        if outside(module, allowed)
    }
    assert wrong == set()


@pytest.mark.parametrize(
    "module", ["fxkit/staging.py", "fxkit/staging_dest.py", "fxkit/serve_probe.py"]
)
def test_what_runs_on_a_node_imports_no_engine(module: str) -> None:
    """fxkit stage and serve-probe run on the nodes, beside vLLM: no engine, no benchmarks."""
    found = imports(FXKIT.parent / module)
    assert {m for m in found if m.startswith(("fxkit.engine", "fxkit.loadbench"))} == set()


def test_the_loader_imports_nothing_from_fxkit() -> None:
    """loader/ (installed as fxkit.loader) stands on its own: relative imports only."""
    loader = FXKIT.parent / "loader"
    found = {f"{p.name}: {m}" for p in loader.glob("*.py") for m in imports(p)}
    assert {f for f in found if not f.split(": ")[1].startswith("fxkit.loader")} == set()


def test_the_wheel_lists_every_package() -> None:
    """pyproject.toml names fxkit's packages by hand: a new one left out breaks an installed
    fxkit (fxkit.engine was, twice)."""
    listed = set(
        tomllib.loads((FXKIT.parent / "pyproject.toml").read_text())["tool"]["setuptools"][
            "packages"
        ]
    )
    found = {".".join(p.parent.relative_to(FXKIT.parent).parts) for p in FXKIT.rglob("__init__.py")}
    assert found - listed == set()


def test_the_shared_modules_import_no_layer() -> None:
    for name in SHARED | CONTRACTS:
        path = FXKIT.parent / (name.replace(".", "/") + ".py")
        assert {m for m in imports(path) if outside(m, SHARED)} == set(), name


def test_the_check_sees_an_import_from_above(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from fxkit.engine.role import Host\n")
    assert outside(next(iter(imports(module))), {"fxkit.connection", *SHARED})
