"""roles/vllm_lmcache against the real programs' sources, from PyPI, at the versions it pins.

LMCache: the release the role pins (``vllm_lmcache_lmcache_version``). Its sdist is fetched from
PyPI's simple index (sha256-checked against the index; what ``pip download lmcache==<pin>
--no-deps --no-binary :all:`` fetches, without pip building its metadata, which needs torch)
into ``.cache/lmcache-src/`` or ``$FXKIT_LMCACHE_SRC_CACHE``. ``lmcache/__init__.py`` imports
its GPU platform (torch), so the three files that define the configuration,
``lmcache/logging.py``, ``lmcache/v1/config_base.py`` and ``lmcache/v1/config.py``, run here
under their own names inside empty ``lmcache`` / ``lmcache.v1`` packages (``requests``, used only
to fetch remote configs, stubbed where absent). The rendered file's every key must be in
``_CONFIG_DEFINITIONS`` (not deprecated), and LMCache's own ``LMCacheEngineConfig.from_file``
must read back the values meant.

vLLM: every flag the unit passes must be one ``vllm serve`` parses, at the pinned 0.20.1 (the
+rocm721 build is that source) and at the latest release, from the sdists that
tests/vllm_source.py caches. vLLM does not import without its dependencies, so its parser is
read with ``ast``: ``vllm/entrypoints/cli/serve.py`` (the ``serve`` subcommand and where it
imports ``make_arg_parser`` from: ``vllm/entrypoints/openai/cli_args.py`` in 0.20.1,
``vllm/entrypoints/common/cli_args.py`` later), that module, and ``vllm/engine/arg_utils.py``.
A flag is every string given to an ``add_argument`` call there, plus ``--<field>`` for the
fields of each frontend dataclass ``make_arg_parser`` registers through an ``add_cli_args`` that
calls ``get_kwargs(cls)`` (it adds ``--{key.replace('_', '-')}`` per field).
"""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import inspect
import json
import os
import sys
import tarfile
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import vllm_source
import yaml
from packaging.version import Version
from pypi_sdists import fetch, run_file, simple_index
from test_loader_vllm_contract import latest_version

from fxkit.engine.role import RoleLoader, roles_path
from fxkit.engine.variables import HostVars, Layer

ROLE = RoleLoader(roles_path(None)).load("vllm_lmcache")
CODE = inspect.getmodule(ROLE.apply)
LMCACHE_VERSION = ROLE.defaults["vllm_lmcache_lmcache_version"]
VLLM_VERSION = Version(ROLE.defaults["vllm_lmcache_vllm_version"]).public  # 0.20.1
LMCACHE_INDEX = "https://pypi.org/simple/lmcache/"
LMCACHE_CACHE = Path(
    os.environ.get("FXKIT_LMCACHE_SRC_CACHE", Path(__file__).parent.parent / ".cache/lmcache-src")
)
LMCACHE_FILES = ("lmcache/logging.py", "lmcache/v1/config_base.py", "lmcache/v1/config.py")


def host_vars(tmp_path: Path, **values: Any) -> Any:
    """The role's typed ``Vars`` of host gpu01."""
    wheel = tmp_path / "fxkit-0.1.0-py3-none-any.whl"
    wheel.write_bytes(b"")
    inventory = {"vllm_lmcache_model": "/mnt/models/m", "vllm_lmcache_fxkit_wheel": str(wheel)}
    layers = [Layer("role defaults", ROLE.defaults), Layer("inventory", {**inventory, **values})]
    return ROLE.typed(HostVars("gpu01", layers))


# -- LMCache ----------------------------------------------------------------------------------


def lmcache_sdist(version: str) -> Path:
    """LMCache ``version``'s sdist from the cache, downloaded (sha256-checked) when missing."""
    path = LMCACHE_CACHE / f"lmcache-{version}.tar.gz"
    if path.exists():
        return path
    try:
        return fetch(path, simple_index(LMCACHE_INDEX))
    except OSError as exc:
        pytest.skip(f"PyPI is unreachable ({exc}) and {path.name} is not in {LMCACHE_CACHE}")


@contextlib.contextmanager
def lmcache_config_module(version: str, workdir: Path) -> Iterator[types.ModuleType]:
    """LMCache's real ``lmcache.v1.config`` module, importable until the block ends."""
    root = workdir / f"lmcache-{version}"
    with tarfile.open(lmcache_sdist(version)) as tar:
        members = [m for m in tar if m.name.split("/", 1)[-1] in LMCACHE_FILES]
        assert len(members) == len(LMCACHE_FILES), [m.name for m in members]
        tar.extractall(workdir, members=members, filter="data")
    saved = {k: v for k, v in sys.modules.items() if k.split(".")[0] in ("lmcache", "requests")}
    packages = {"lmcache": root / "lmcache", "lmcache.v1": root / "lmcache/v1"}
    for name, folder in packages.items():
        package = types.ModuleType(name)
        package.__path__ = [str(folder)]  # the real folders, without their __init__.py
        sys.modules[name] = package
    if importlib.util.find_spec("requests") is None:
        sys.modules["requests"] = types.ModuleType("requests")  # remote configs only
    try:
        for path in LMCACHE_FILES:
            run_file(path.removesuffix(".py").replace("/", "."), root / path)
        yield sys.modules["lmcache.v1.config"]
    finally:
        for name in [k for k in sys.modules if k.split(".")[0] in ("lmcache", "requests")]:
            del sys.modules[name]
        sys.modules.update(saved)


LMCACHE_CASES = [
    {},
    {"vllm_lmcache_local_disk": "/mnt/fx/lmcache", "vllm_lmcache_max_local_disk_size": 100,
     "vllm_lmcache_chunk_size": 512, "vllm_lmcache_max_local_cpu_size": 40.5,
     "vllm_lmcache_use_odirect": True, "vllm_lmcache_disk_io_threads": 16,
     "vllm_lmcache_extra_config": {"save_chunk_meta": False}},
    {"vllm_lmcache_local_disk": "file:///mnt/fx/lmcache//", "vllm_lmcache_local_cpu": False,
     "vllm_lmcache_max_local_disk_size": 1.5},
    {"vllm_lmcache_local_disk": ["/mnt/nvme0/lmcache", "file:///mnt/nvme1/lmcache/"],
     "vllm_lmcache_max_local_disk_size": 20, "vllm_lmcache_disk_io_threads": 32,
     "vllm_lmcache_local_disk_path_sharding": "by_gpu"},
]  # fmt: skip


@pytest.mark.parametrize("values", LMCACHE_CASES)
def test_every_rendered_key_is_one_the_pinned_lmcache_reads(
    values: dict[str, Any], tmp_path: Path
) -> None:
    v = host_vars(tmp_path, **values)
    CODE.validate(v)
    rendered = tmp_path / "lmcache.yaml"
    rendered.write_text(CODE.lmcache_yaml(v))
    meant = yaml.safe_load(rendered.read_text())
    with lmcache_config_module(LMCACHE_VERSION, tmp_path) as config:
        definitions = config._CONFIG_DEFINITIONS
        assert sorted(set(meant) - set(definitions)) == [], "keys LMCache does not know"
        assert sorted(set(meant) & set(config._DEPRECATED_CONFIGS)) == []
        read = config.LMCacheEngineConfig.from_file(str(rendered))
    for key, value in meant.items():
        if key == "local_disk":  # LMCache strips file:// (config_base._parse_local_disk)
            parts = value.split(",")
            assert len(parts) == len(v.vllm_lmcache_local_disk)
            for part in parts:
                assert part.startswith("file:///") and part.endswith("/") and "//" not in part[7:]
            assert read.local_disk == ",".join(p.removeprefix("file://") for p in parts)
        else:
            assert getattr(read, key) == value, key


def test_the_disk_tier_s_settings_are_read_where_the_role_writes_them(tmp_path: Path) -> None:
    """LocalDiskBackend (lmcache/v1/storage_backend/local_disk_backend.py of the pinned sdist)
    reads ``use_odirect`` and ``disk_io_threads`` from ``extra_config``, its default thread count
    is the role's default, and ``by_gpu`` is what PathSharder (path_sharder.py) supports."""
    backend = _sdist_module(LMCACHE_VERSION, "lmcache/v1/storage_backend/local_disk_backend.py")
    read = {
        (call.func.attr, call.args[0].value): call.args[1]
        for call in ast.walk(backend)
        if isinstance(call, ast.Call)
        and isinstance(call.func, ast.Attribute)
        and call.func.attr in ("get", "get_extra_config_value")
        and len(call.args) == 2
        and isinstance(call.args[0], ast.Constant)
    }
    odirect = read[("get", "use_odirect")]
    assert (
        isinstance(odirect, ast.Constant)
        and odirect.value is ROLE.defaults["vllm_lmcache_use_odirect"]
    )
    threads = read[("get_extra_config_value", "disk_io_threads")]
    assert isinstance(threads, ast.Name)
    (default,) = [
        n.value.value
        for n in backend.body
        if isinstance(n, ast.Assign)
        and getattr(n.targets[0], "id", "") == threads.id
        and isinstance(n.value, ast.Constant)
    ]
    assert default == ROLE.defaults["vllm_lmcache_disk_io_threads"] == 4
    sharder = _sdist_module(LMCACHE_VERSION, "lmcache/v1/storage_backend/path_sharder.py")
    supported = {
        c.value
        for n in ast.walk(sharder)
        if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "_SUPPORTED_STRATEGIES"
        for c in ast.walk(n.value)
        if isinstance(c, ast.Constant)
    }
    field = CODE.Vars.model_fields["vllm_lmcache_local_disk_path_sharding"]
    assert set(typing.get_args(field.annotation)) == supported == {"by_gpu"}


def _sdist_module(version: str, path: str) -> ast.Module:
    """One file of LMCache ``version``'s sdist, parsed."""
    with tarfile.open(lmcache_sdist(version)) as tar:
        (member,) = [m for m in tar if m.name.split("/", 1)[-1] == path]
        file = tar.extractfile(member)
        assert file is not None
        return ast.parse(file.read(), filename=path)


def test_lmcache_s_defaults_are_the_roles_defaults(tmp_path: Path) -> None:
    """The role writes chunk_size, local_cpu and max_local_cpu_size always: its defaults are
    LMCache's own, so an unset variable means what LMCache would do."""
    with lmcache_config_module(LMCACHE_VERSION, tmp_path) as config:
        definitions = config._CONFIG_DEFINITIONS
    keys = ("chunk_size", "local_cpu", "max_local_cpu_size", "max_local_disk_size")
    for key in (*keys, "local_disk_path_sharding"):
        assert definitions[key]["default"] == ROLE.defaults[f"vllm_lmcache_{key}"], key


# -- vLLM -------------------------------------------------------------------------------------

SERVE = "vllm/entrypoints/cli/serve.py"
ARG_UTILS = "vllm/engine/arg_utils.py"


def _python_files(sdist: Path) -> dict[str, ast.Module]:
    """Every ``vllm/**.py`` of the sdist under ``vllm/entrypoints`` and ``vllm/engine``."""
    modules = {}
    with tarfile.open(sdist) as tar:
        for member in tar:
            path = member.name.split("/", 1)[-1]
            if path.startswith(("vllm/entrypoints/", "vllm/engine/")) and path.endswith(".py"):
                file = tar.extractfile(member)
                if file is not None:
                    modules[path] = ast.parse(file.read(), filename=path)
    return modules


def _string_flags(tree: ast.AST) -> set[str]:
    """The option strings of every ``*.add_argument(...)`` call."""
    return {
        arg.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "add_argument"
        for arg in node.args
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str)
    }


def _classes(tree: ast.Module) -> dict[str, ast.ClassDef]:
    return {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}


def _calls_get_kwargs(cls: ast.ClassDef, classes: dict[str, ast.ClassDef]) -> bool:
    """Whether ``cls.add_cli_args`` (its own or a base's in the module) calls get_kwargs."""
    for node in cls.body:
        if isinstance(node, ast.FunctionDef) and node.name == "add_cli_args":
            return any(
                isinstance(n, ast.Call) and getattr(n.func, "id", None) == "get_kwargs"
                for n in ast.walk(node)
            )
    bases = [classes[b.id] for b in cls.bases if isinstance(b, ast.Name) and b.id in classes]
    return any(_calls_get_kwargs(base, classes) for base in bases)


def _fields(cls: ast.ClassDef, classes: dict[str, ast.ClassDef]) -> set[str]:
    """A dataclass's fields, its bases' in the module too."""
    names = {
        n.target.id
        for n in cls.body
        if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
    }
    for base in cls.bases:
        if isinstance(base, ast.Name) and base.id in classes:
            names |= _fields(classes[base.id], classes)
    return names


def serve_flags(version: str) -> tuple[set[str], list[str]]:
    """Every flag ``vllm serve`` of ``version`` parses, and the files they were read from."""
    modules = _python_files(vllm_source.sdist(version))
    serve = modules[SERVE]
    assert any(
        isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant) and n.value.value == "serve"
        for n in ast.walk(serve)
    ), f"{SERVE} defines no 'serve' subcommand"
    (origin,) = {
        n.module
        for n in ast.walk(serve)
        if isinstance(n, ast.ImportFrom) and any(a.name == "make_arg_parser" for a in n.names)
    }
    cli_args = origin.replace(".", "/") + ".py"
    tree = modules[cli_args]
    (make,) = [
        n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "make_arg_parser"
    ]
    flags = _string_flags(serve) | _string_flags(make) | _string_flags(modules[ARG_UTILS])
    classes = _classes(tree)
    registered = {
        n.func.value.id
        for n in ast.walk(make)
        if isinstance(n, ast.Call)
        and isinstance(n.func, ast.Attribute)
        and n.func.attr == "add_cli_args"
        and isinstance(n.func.value, ast.Name)
    }
    for name in registered & set(classes):
        if _calls_get_kwargs(classes[name], classes):
            flags |= {f"--{field.replace('_', '-')}" for field in _fields(classes[name], classes)}
    assert "model_tag" in _string_flags(make), "vllm serve takes no positional model"
    return flags, [SERVE, cli_args, ARG_UTILS]


def our_flags(v: Any) -> set[str]:
    return {a.split("=")[0] for spec in CODE.instance_specs(v) for a in spec.argv if a[:2] == "--"}


@pytest.mark.parametrize("which", ["pinned", "latest"])
def test_every_flag_the_unit_passes_is_one_vllm_serve_parses(which: str, tmp_path: Path) -> None:
    version = VLLM_VERSION if which == "pinned" else latest_version()
    flags, files = serve_flags(version)
    # The derivation finds what vLLM's docs list for serve (a sanity check on the reading).
    assert {"--model", "--port", "--host", "--served-model-name", "--max-model-len"} <= flags
    v = host_vars(tmp_path, vllm_lmcache_layout="TP4x2", vllm_lmcache_extra_args=[
        "--max-model-len=8192", "--gpu-memory-utilization=0.9", "--model-loader-extra-config={}",
    ])  # fmt: skip
    ours = our_flags(v)
    assert {"--tensor-parallel-size", "--load-format", "--kv-transfer-config"} <= ours
    assert sorted(ours - flags) == [], f"not parsed by vllm serve {version} ({', '.join(files)})"


def test_the_reading_would_catch_a_flag_vllm_lacks(tmp_path: Path) -> None:
    flags, _ = serve_flags(VLLM_VERSION)
    v = host_vars(tmp_path, vllm_lmcache_extra_args=["--tensor-paralel-size=2"])
    assert our_flags(v) - flags == {"--tensor-paralel-size"}
    assert len(flags) > 150  # engine and frontend flags, not a handful


KV_CONFIG = "vllm/config/kv_transfer.py"
KV_FACTORY = "vllm/distributed/kv_transfer/kv_connector/factory.py"


def kv_transfer_source(version: str) -> tuple[set[str], set[str], set[str]]:
    """vLLM ``version``'s KVTransferConfig fields, its kv_role values (the KVProducer and
    KVConsumer Literals) and the connectors its factory registers, read with ast."""
    trees = {}
    with tarfile.open(vllm_source.sdist(version)) as tar:
        for member in tar:
            path = member.name.split("/", 1)[-1]
            file = tar.extractfile(member) if path in (KV_CONFIG, KV_FACTORY) else None
            if file is not None:
                trees[path] = ast.parse(file.read(), filename=path)
    (config,) = [
        n
        for n in trees[KV_CONFIG].body
        if isinstance(n, ast.ClassDef) and n.name == "KVTransferConfig"
    ]
    fields = _fields(config, {})
    roles = {
        c.value
        for n in trees[KV_CONFIG].body
        if isinstance(n, ast.Assign)
        and getattr(n.targets[0], "id", "") in ("KVProducer", "KVConsumer")
        for c in ast.walk(n.value)
        if isinstance(c, ast.Constant) and isinstance(c.value, str)
    }
    connectors = {
        n.args[0].value
        for n in ast.walk(trees[KV_FACTORY])
        if isinstance(n, ast.Call)
        and getattr(n.func, "attr", "") == "register_connector"
        and n.args
        and isinstance(n.args[0], ast.Constant)
    }
    return fields, roles, connectors


@pytest.mark.parametrize("which", ["pinned", "latest"])
def test_the_kv_transfer_config_is_one_vllm_accepts(which: str, tmp_path: Path) -> None:
    """--kv-transfer-config's JSON: KVTransferConfig's fields (vllm/config/kv_transfer.py), a
    kv_role of its Literals, a connector its factory registers (kv_connector/factory.py)."""
    version = VLLM_VERSION if which == "pinned" else latest_version()
    fields, roles, connectors = kv_transfer_source(version)
    assert set(CODE.KV_ROLES) == roles, "the role's kv_role choices are vLLM's"
    [spec] = CODE.instance_specs(host_vars(tmp_path))
    sent = json.loads(spec.argv[spec.argv.index("--kv-transfer-config") + 1])
    assert set(sent) <= fields
    assert sent["kv_role"] in roles and sent["kv_connector"] in connectors
