"""The vLLM plugin's contract, checked with ``ast`` against real vLLM source from PyPI.

``loader/vllm_plugin.py`` subclasses vLLM's ``DefaultModelLoader`` and stands in for the
safetensors iterators its ``_get_weights_iterator`` calls. CONTRACT lists every name and
signature it relies on; the test checks that list against vLLM's sdist from PyPI (the smallest
artifact with the Python sources: 32 MB for 0.20.1 and 45 MB for 0.33.0, against 233 and 320 MB
for the x86_64 wheels), read out of the tarball without installing it, at the ends of the
plugin's VLLM_CHECKED range, the field's version and the latest release; and 0.17.1, the release
before the range, is shown to break it. Another test reads the plugin's own source and fails if
it uses a name CONTRACT does not list.

The sdists are downloaded once (sha256-checked against the index) into ``.cache/vllm-src/``, or
``$FXKIT_VLLM_SRC_CACHE``; without PyPI, a version that is not cached is skipped with the reason.
"""

from __future__ import annotations

import ast
import os
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fxkit.loader import vllm_plugin
from packaging.version import Version
from pypi_sdists import fetch, simple_index

FIELD_VERSION = "0.20.1"  # what the field runs (MISSION.md: vLLM 0.20.1+rocm721)
INDEX = "https://pypi.org/simple/vllm/"
#: where the sdists are kept; FXKIT_VLLM_SRC_CACHE points a CI runner at a cache it keeps
CACHE = Path(
    os.environ.get("FXKIT_VLLM_SRC_CACHE", Path(__file__).parent.parent / ".cache/vllm-src")
)
LOADER = "vllm/model_executor/model_loader/"
EP_FILTER = LOADER + "ep_weight_filter.py"  # expert parallelism's filter, new in 0.18.0
#: The release before VLLM_CHECKED's oldest, and why the plugin refuses it.
BROKEN_VERSION, BROKEN_BY = "0.17.1", f"should_skip_weight def: {EP_FILTER} is missing"
LOAD_CONFIG_FILES = ("vllm/config/load.py", "vllm/config/__init__.py", "vllm/config.py")


@dataclass(frozen=True)
class Rely:
    """One thing the plugin relies on: ``what`` of ``name`` (``Class.member``) in ``file``.

    kinds: ``def`` (a function or method whose first parameters after ``self`` are ``value``, in
    that order, any others with defaults), ``binds`` (a module-level name, defined or imported),
    ``subclass`` (``value`` among the bases), ``fields`` (class attributes), ``returns`` (every
    ``return`` is a tuple with these names at these positions), ``calls`` (the body calls
    ``value``), ``compares`` (the body compares something with the string ``value``),
    ``constant`` (a module-level string).
    """

    file: str
    name: str
    kind: str
    value: Any = None


INIT, BASE, DEFAULT = (LOADER + f for f in ("__init__.py", "base_loader.py", "default_loader.py"))
UTILS, EP = LOADER + "weight_utils.py", EP_FILTER
ITERATE = "DefaultModelLoader._get_weights_iterator"
CONTRACT = (
    Rely(INIT, "register_model_loader", "def", ("load_format",)),
    Rely(INIT, "DefaultModelLoader", "binds"),
    Rely(BASE, "BaseModelLoader.__init__", "def", ("load_config",)),
    Rely(BASE, "BaseModelLoader.download_model", "def", ("model_config",)),
    Rely(BASE, "BaseModelLoader.load_weights", "def", ("model", "model_config")),
    Rely(DEFAULT, "DefaultModelLoader", "subclass", "BaseModelLoader"),
    Rely(DEFAULT, "DefaultModelLoader.__init__", "def", ("load_config",)),
    # the plugin's copy of the config asks for the default format, "auto", after __init__
    Rely(DEFAULT, "DefaultModelLoader._prepare_weights", "compares", "auto"),
    Rely(DEFAULT, ITERATE, "def", ("source",)),
    # the overridden iterator is the one that feeds load_weights
    Rely(DEFAULT, "DefaultModelLoader.get_all_weights", "calls", "self._get_weights_iterator"),
    # ... and it calls the safetensors iterators fxkit stands in for, by their names there
    Rely(DEFAULT, ITERATE, "calls", "safetensors_weights_iterator"),
    Rely(DEFAULT, ITERATE, "calls", "multi_thread_safetensors_weights_iterator"),
    Rely(DEFAULT, "safetensors_weights_iterator", "binds"),
    Rely(DEFAULT, "multi_thread_safetensors_weights_iterator", "binds"),
    Rely(
        UTILS,
        "safetensors_weights_iterator",
        "def",
        ("hf_weights_files", "use_tqdm_on_load", "safetensors_load_strategy", "local_expert_ids"),
    ),
    Rely(
        UTILS,
        "multi_thread_safetensors_weights_iterator",
        "def",
        ("hf_weights_files", "use_tqdm_on_load"),
    ),
    Rely(
        UTILS,
        "pt_weights_iterator",
        "def",
        ("hf_weights_files", "use_tqdm_on_load", "pt_load_map_location"),
    ),
    Rely(UTILS, "_natural_sort_key", "def", ("filepath",)),
    Rely(EP, "should_skip_weight", "def", ("weight_name", "local_expert_ids")),
    Rely(DEFAULT, "DefaultModelLoader.Source", "fields", ("model_or_path",)),
    Rely(
        "LoadConfig",
        "LoadConfig",
        "fields",
        (
            "load_format",
            "model_loader_extra_config",
            "safetensors_load_strategy",
            "use_tqdm_on_load",
            "pt_load_map_location",
        ),
    ),
    Rely("vllm/plugins/__init__.py", "DEFAULT_PLUGINS_GROUP", "constant", "vllm.general_plugins"),
    # the warning when vLLM switches --load-format fxkit to GGUF's or bitsandbytes' loader
    Rely("vllm/engine/arg_utils.py", "EngineArgs.create_engine_config", "def", ()),
    Rely("vllm/engine/arg_utils.py", "EngineArgs", "fields", ("model", "load_format")),
    Rely("vllm/config/vllm.py", "VllmConfig", "fields", ("load_config",)),
)


def _index() -> dict:
    return simple_index(INDEX)


def _latest(index: dict) -> str:
    return str(max(v for v in map(Version, index["versions"]) if not v.is_prerelease))


def latest_version() -> str:
    """vLLM's latest release on PyPI; offline, the newest sdist in the cache (else skip)."""
    try:
        return _latest(_index())
    except OSError as exc:
        cached = sorted(CACHE.glob("vllm-*.tar.gz"))
        if not cached:
            pytest.skip(f"PyPI is unreachable ({exc}) and no vLLM sdist is cached")
        return max((p.name[5:-7] for p in cached), key=Version)


def _sdist(version: str, index: dict | None) -> Path:
    """The cached sdist of ``version``, downloaded (sha256-checked) when missing."""
    path = CACHE / f"vllm-{version}.tar.gz"
    if index is None and not path.exists():
        pytest.skip(f"PyPI is unreachable and vLLM {version}'s sdist is not in {CACHE}")
    return fetch(path, index or {})


def _sources(sdist: Path) -> dict[str, ast.Module]:
    """The parsed modules CONTRACT names, by path inside the package (``vllm/...``)."""
    wanted = {r.file for r in CONTRACT} | set(LOAD_CONFIG_FILES)
    modules = {}
    with tarfile.open(sdist) as tar:
        for member in tar:
            path = member.name.split("/", 1)[-1]  # drop "vllm-<version>/"
            file = tar.extractfile(member) if path in wanted else None
            if file is not None:
                modules[path] = ast.parse(file.read(), filename=path)
    for path in LOAD_CONFIG_FILES:  # LoadConfig moved from vllm/config.py to vllm/config/load.py
        if path in modules and _find(modules[path], "LoadConfig") is not None:
            modules["LoadConfig"] = modules[path]
            break
    return modules


def _find(node: ast.AST, qualname: str) -> ast.AST | None:
    for part in qualname.split("."):
        body = getattr(node, "body", [])
        found = [
            n for n in body
            if isinstance(n, ast.ClassDef | ast.FunctionDef) and n.name == part
        ]  # fmt: skip
        if not found:
            return None
        node = found[-1]
    return node


def _binds(module: ast.Module, name: str) -> bool:
    for node in module.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)) and node.name == name:
            return True
        if isinstance(node, ast.ImportFrom | ast.Import) and any(
            (alias.asname or alias.name) == name for alias in node.names
        ):
            return True
    return False


def _broken(rely: Rely, modules: dict[str, ast.Module]) -> str | None:
    """What is wrong with ``rely`` in these modules, or None."""
    if rely.file not in modules:
        return f"{rely.file} is missing"
    module = modules[rely.file]
    if rely.kind == "binds":
        return None if _binds(module, rely.name) else "not defined or imported"
    if rely.kind == "constant":
        values = [
            n.value.value for n in module.body
            if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant)
            and any(isinstance(t, ast.Name) and t.id == rely.name for t in n.targets)
        ]  # fmt: skip
        return None if values == [rely.value] else f"is {values}"
    node = _find(module, rely.name)
    if node is None:
        return "not found"
    if rely.kind == "def":
        assert isinstance(node, ast.FunctionDef)
        args = node.args
        positional = [a.arg for a in args.posonlyargs + args.args]
        required = positional[: len(positional) - len(args.defaults)]
        params = [p for p in positional if p != "self"]
        wanted = list(rely.value)
        if params[: len(wanted)] != wanted:
            return f"parameters are {params}"
        extra = [p for p in required if p not in ("self", *wanted)]
        extra += [
            a.arg for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True) if d is None
        ]
        if extra:
            return f"also requires {extra}"
        return None
    if rely.kind == "subclass":
        assert isinstance(node, ast.ClassDef)
        bases = [ast.unparse(b) for b in node.bases]
        return None if rely.value in bases else f"bases are {bases}"
    if rely.kind == "fields":
        assert isinstance(node, ast.ClassDef)
        fields = {
            n.target.id for n in node.body
            if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
        }  # fmt: skip
        missing = set(rely.value) - fields
        return f"has no {sorted(missing)}" if missing else None
    if rely.kind == "returns":
        returns = [n for n in ast.walk(node) if isinstance(n, ast.Return)]
        if not returns:
            return "returns nothing"
        for ret in returns:
            if not isinstance(ret.value, ast.Tuple):
                return f"returns {ast.unparse(ret)!r}, not a tuple"
            names = [ast.unparse(e) for e in ret.value.elts]
            for position, name in rely.value.items():
                if names[position : position + 1] != [name]:
                    return f"returns {ast.unparse(ret.value)!r}: [{position}] is not {name}"
        return None
    if rely.kind == "calls":
        calls = {ast.unparse(n.func) for n in ast.walk(node) if isinstance(n, ast.Call)}
        return None if rely.value in calls else "does not call it"
    if rely.kind == "compares":
        strings = {
            c.value for n in ast.walk(node) if isinstance(n, ast.Compare)
            for c in ast.walk(n) if isinstance(c, ast.Constant)
        }  # fmt: skip
        return None if rely.value in strings else f"never compares with {rely.value!r}"
    raise AssertionError(f"unknown kind {rely.kind!r}")


@pytest.fixture(scope="module")
def index() -> dict | None:
    try:
        return _index()
    except OSError:
        return None


@pytest.mark.parametrize("which", [*sorted({*vllm_plugin.VLLM_CHECKED, FIELD_VERSION}), "latest"])
def test_the_plugin_contract_holds_in_vllms_source(which: str, index: dict | None) -> None:
    if which == "latest":
        if index is None:
            pytest.skip("PyPI is unreachable: the latest vLLM is unknown")
        version = _latest(index)
    else:
        version = which
    modules = _sources(_sdist(version, index))
    broken = {f"{r.file}: {r.name} ({r.kind})": _broken(r, modules) for r in CONTRACT}
    broken = {where: why for where, why in broken.items() if why}
    assert not broken, f"vLLM {version} breaks the plugin: {broken}"
    # A newer release that keeps the contract passes: the plugin warns for it and works; widen
    # VLLM_CHECKED in loader/vllm_plugin.py when one is checked here.
    oldest = Version(vllm_plugin.VLLM_CHECKED[0])
    assert oldest <= Version(version), f"vLLM {version} is older than VLLM_CHECKED"


def test_the_contract_lists_what_the_plugin_uses() -> None:
    """Every vLLM name in the plugin's source: imported names, ``source.*``, ``self._*()``,
    config fields."""
    plugin = ast.parse(Path(vllm_plugin.__file__).read_text())
    listed = {r.name.rsplit(".", 1)[-1] for r in CONTRACT}
    fields = {r.name: set(r.value) for r in CONTRACT if r.kind == "fields"}
    classes = {
        "source": "DefaultModelLoader.Source",
        "load_config": "LoadConfig",
        "config": "LoadConfig",
    }
    used: set[str] = set()
    for node in ast.walk(plugin):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("vllm"):
            used |= {alias.name for alias in node.names}
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            if node.value.id in classes:
                listed_fields = fields[classes[node.value.id]]
                assert node.attr in listed_fields, f"the plugin uses {node.value.id}.{node.attr}"
            elif node.value.id == "self" and node.attr.startswith("_"):
                used.add(node.attr)  # a vLLM method the plugin calls
        elif isinstance(node, ast.ClassDef):  # the methods the plugin's loader overrides
            used |= {n.name for n in node.body if isinstance(n, ast.FunctionDef)}
    assert used, "the plugin's vLLM names were not found: this test reads the wrong file"
    assert used <= listed, f"the plugin uses {sorted(used - listed)}, which CONTRACT does not list"


def test_the_release_before_the_oldest_checked_breaks_the_contract(index: dict | None) -> None:
    """Why the plugin refuses vLLM older than VLLM_CHECKED: it had no expert-parallel weight
    filter (``should_skip_weight``), which decides the tensors a rank reads."""
    modules = _sources(_sdist(BROKEN_VERSION, index))
    broken = [f"{r.name.split('.')[-1]} {r.kind}: {_broken(r, modules)}" for r in CONTRACT]
    assert BROKEN_BY in broken
    assert Version(BROKEN_VERSION) < Version(vllm_plugin.VLLM_CHECKED[0])
