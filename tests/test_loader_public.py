"""fxkit calls its loader only through the loader's public names (``fxkit.loader.__all__``): no
module of fxkit/ or roles/ imports a loader module (``fxkit.loader.format``...) or a name the
loader does not export. The benchmark harness is fxkit.loadbench, outside the loader package."""

from __future__ import annotations

import ast
from pathlib import Path

import fxkit.loader

REPO = Path(__file__).resolve().parents[1]
PUBLIC = frozenset(fxkit.loader.__all__)


def private_uses(source: str) -> list[str]:
    """``line: what`` for each use of the loader in ``source`` that goes past its public names."""
    found = []
    aliases = {"fxkit.loader"}  # names bound to the loader package itself
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("fxkit.loader."):
                    found.append(f"{node.lineno}: import {alias.name}")
                elif alias.name == "fxkit.loader" and alias.asname:
                    aliases.add(alias.asname)
        elif isinstance(node, ast.ImportFrom) and not node.level:
            if node.module and node.module.startswith("fxkit.loader."):
                found.append(f"{node.lineno}: from {node.module} import ...")
            elif node.module == "fxkit.loader":
                found += [
                    f"{node.lineno}: from fxkit.loader import {alias.name}"
                    for alias in node.names
                    if alias.name not in PUBLIC
                ]
            elif node.module == "fxkit":
                aliases |= {a.asname or a.name for a in node.names if a.name == "loader"}
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Attribute)
            and ast.unparse(node.value) in aliases
            and node.attr not in PUBLIC
        ):
            found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def test_the_engine_uses_only_the_loader_s_public_names() -> None:
    used = {
        f"{path.relative_to(REPO)}:{use}"
        for folder in ("fxkit", "roles")
        for path in sorted((REPO / folder).rglob("*.py"))
        for use in private_uses(path.read_text())
    }
    assert not used, f"fxkit reaches past the loader's __all__: {sorted(used)}"


def test_the_check_finds_every_way_past_the_public_names() -> None:
    source = (
        "import fxkit.loader.format\n"
        "from fxkit.loader.bench import touch\n"
        "from fxkit.loader import load, cache\n"
        "import fxkit.loader as fl\n"
        "from fxkit import loader\n"
        "fl.read.host_buffer(1); loader.format.Checkpoint; fxkit.loader.files\n"
        "fl.load; loader.open_checkpoint; fxkit.loader.LoadOptions\n"
    )
    assert sorted(private_uses(source)) == [
        "1: import fxkit.loader.format",
        "2: from fxkit.loader.bench import ...",
        "3: from fxkit.loader import cache",
        "6: fl.read",
        "6: fxkit.loader.files",
        "6: loader.format",
    ]


def test_every_public_name_is_there() -> None:
    assert all(getattr(fxkit.loader, name) for name in PUBLIC)


def test_the_benchmark_harness_is_out_of_the_loader_package() -> None:
    assert not any("bench" in p.name for p in (REPO / "loader").glob("*.py"))
