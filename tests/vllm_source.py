"""vLLM's real weight-loading code, run from its PyPI sdist with its heavy dependencies stubbed.

vLLM cannot be imported whole without a GPU, but its default loader can run: ``running(version)``
executes the release's own ``default_loader.py``, ``base_loader.py``, ``weight_utils.py``,
``ep_weight_filter.py``, ``config/load.py`` (``LoadConfig``, a pydantic dataclass) and
``transformers_utils/repo_utils.py`` (the Mistral layout's file listing) under their real module
names. What they import from the rest of vLLM and from transformers, huggingface_hub, tqdm,
psutil and regex is stubbed below: placeholders for what the loading path does not call (GPU
platforms, quantization, downloads), and small stand-ins for what it does (a logger with
``info_once``, ``tqdm`` as a plain iteration, ``regex`` as ``re``, the parallel config). The
sdists come from the cache of tests/test_loader_vllm_contract.py (downloaded and sha256-checked
there).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import tarfile
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pydantic
from pypi_sdists import run_file
from test_loader_vllm_contract import CACHE, _index, _sdist

REAL = (
    "vllm/config/load.py",
    "vllm/transformers_utils/repo_utils.py",
    "vllm/model_executor/model_loader/ep_weight_filter.py",
    "vllm/model_executor/model_loader/weight_utils.py",
    "vllm/model_executor/model_loader/base_loader.py",
    "vllm/model_executor/model_loader/default_loader.py",
)  # in import order
STUBBED = ("vllm", "transformers", "huggingface_hub", "tqdm", "psutil", "regex")


class Placeholder:
    """Anything vLLM's loading path imports but does not call here."""

    def __init__(self, name: str = "placeholder") -> None:
        self._name = name

    def __getattr__(self, name: str) -> Placeholder:
        return Placeholder(f"{self._name}.{name}")

    def __call__(self, *args: Any, **kwargs: Any) -> Placeholder:
        return Placeholder(f"{self._name}()")

    def __repr__(self) -> str:
        return f"<stub {self._name}>"

    def __or__(self, other: Any) -> Placeholder:  # in annotations: ``HfApi | None``
        return self

    __ror__ = __or__


class StubModule(types.ModuleType):
    """A module whose unset names are placeholders (a package: submodules can be added)."""

    def __init__(self, name: str, **names: Any) -> None:
        super().__init__(name)
        self.__path__: list[str] = []
        self.__dict__.update(names)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return Placeholder(f"{self.__name__}.{name}")


class OnceLogger(logging.LoggerAdapter):
    """vLLM's logger: ``info_once`` and friends log once per message."""

    def __init__(self, name: str) -> None:
        super().__init__(logging.getLogger(name), {})
        self.seen: set[tuple[Any, ...]] = set()

    def _once(self, level: int, msg: str, *args: Any, **kwargs: Any) -> None:
        kwargs.pop("scope", None)
        if (msg, *args) not in self.seen:
            self.seen.add((msg, *args))
            self.log(level, msg, *args, **kwargs)

    def info_once(self, msg: str, *args: Any, **kwargs: Any) -> None:
        self._once(logging.INFO, msg, *args, **kwargs)

    def warning_once(self, msg: str, *args: Any, **kwargs: Any) -> None:
        self._once(logging.WARNING, msg, *args, **kwargs)

    def debug_once(self, msg: str, *args: Any, **kwargs: Any) -> None:
        self._once(logging.DEBUG, msg, *args, **kwargs)


class Tqdm:
    """``tqdm``: the iteration without a bar."""

    def __init__(self, iterable: Any = None, *args: Any, **kwargs: Any) -> None:
        self.iterable = iterable

    def __iter__(self) -> Iterator[Any]:
        return iter(self.iterable)

    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass


def _config_decorator(cls: Any = None, *, config: Any = None, **kwargs: Any) -> Any:
    """vllm/config/utils.py's ``config``: a pydantic dataclass that forbids extra fields."""
    merged = pydantic.ConfigDict(extra="forbid", **(config or {}))

    def decorate(c: Any) -> Any:
        return pydantic.dataclasses.dataclass(c, config=merged, **kwargs)

    return decorate if cls is None else decorate(cls)


class Parallel:
    """What ``DefaultModelLoader._init_ep_weight_filter`` reads of vLLM's parallel config and
    its process groups: an EP rank among ``ep_size`` flattened into TP (dp = pcp = 1)."""

    def __init__(self) -> None:
        self.set(ep_size=1, ep_rank=0)

    def set(self, ep_size: int, ep_rank: int, placement: str = "linear") -> None:
        self.rank = ep_rank
        self.parallel_config = types.SimpleNamespace(
            enable_expert_parallel=ep_size > 1,
            enable_ep_weight_filter=True,
            enable_eplb=False,
            data_parallel_size=1,
            tensor_parallel_size=ep_size,
            prefill_context_parallel_size=1,
            expert_placement_strategy=placement,
        )


class VllmSource(types.SimpleNamespace):
    """One release's modules: ``default_loader``, ``weight_utils``, ``ep_weight_filter``,
    ``LoadConfig``, ``DefaultModelLoader``, the ``registered`` loaders and the ``parallel``
    config."""


def _stubs(version: str, parallel: Parallel, registered: dict[str, type]) -> dict[str, Any]:
    def register_model_loader(load_format: str) -> Any:
        def register(cls: type) -> type:
            registered[load_format] = cls
            return cls

        return register

    class HubError(Exception):
        pass

    hub_utils = StubModule(
        "huggingface_hub.utils",
        **{
            n: type(n, (HubError,), {})
            for n in (
                "EntryNotFoundError",
                "HfHubHTTPError",
                "LocalEntryNotFoundError",
                "RepositoryNotFoundError",
                "RevisionNotFoundError",
            )
        },
    )
    hub_constants = StubModule(
        "huggingface_hub.constants", HF_HUB_OFFLINE=True, HF_HUB_CACHE="/nonexistent"
    )
    hub = StubModule(
        "huggingface_hub",
        constants=hub_constants,
        utils=hub_utils,
        errors=types.SimpleNamespace(OfflineModeIsEnabled=HubError),
    )
    kv_cache = StubModule("kv_cache", BaseKVCacheMethod=type("BaseKVCacheMethod", (), {}))
    stubs: dict[str, Any] = {
        "vllm": StubModule("vllm", __version__=version),
        "vllm.version": StubModule("vllm.version", __version__=version),
        "vllm.envs": types.SimpleNamespace(VLLM_USE_MODELSCOPE=False),
        "vllm.logger": StubModule("vllm.logger", init_logger=OnceLogger),
        "vllm.tracing": StubModule("vllm.tracing", instrument=lambda **_: lambda f: f),
        "vllm.config": StubModule(
            "vllm.config",
            get_current_vllm_config=lambda: parallel,
            get_current_vllm_config_or_none=lambda: None,
        ),
        "vllm.config.utils": StubModule("vllm.config.utils", config=_config_decorator),
        "vllm.distributed": StubModule(
            "vllm.distributed", get_tensor_model_parallel_rank=lambda: parallel.rank
        ),
        "vllm.model_executor": StubModule("vllm.model_executor"),
        "vllm.model_executor.model_loader": StubModule(
            "vllm.model_executor.model_loader", register_model_loader=register_model_loader
        ),
        "vllm.model_executor.layers.quantization.torchao": StubModule(
            "torchao", torchao_version_at_least=lambda version: False
        ),
        "vllm.model_executor.layers.quantization.kv_cache": kv_cache,
        "vllm.transformers_utils": StubModule("vllm.transformers_utils"),
        "transformers": StubModule("transformers"),
        "transformers.utils": StubModule(
            "transformers.utils", SAFE_WEIGHTS_INDEX_NAME="model.safetensors.index.json"
        ),
        "huggingface_hub": hub,
        "huggingface_hub.utils": hub_utils,
        "huggingface_hub.constants": hub_constants,
        "tqdm": StubModule("tqdm"),
        "tqdm.auto": StubModule("tqdm.auto", tqdm=Tqdm),
        "psutil": StubModule(
            "psutil",
            virtual_memory=lambda: types.SimpleNamespace(
                available=os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
            ),
        ),
        "regex": re,
        "vllm.utils.cpu_resource_utils": StubModule(
            "vllm.utils.cpu_resource_utils",
            get_cgroup_memory_limit=lambda: None,
            get_cgroup_memory_usage=lambda: None,
        ),
    }
    for name in (
        "vllm.platforms",
        "vllm.utils",
        "vllm.utils.import_utils",
        "vllm.utils.hashing",
        "vllm.utils.mem_utils",
        "vllm.utils.torch_utils",
        "vllm.model_executor.layers",
        "vllm.model_executor.layers.quantization",
        "vllm.model_executor.model_loader.reload",
        "vllm.model_executor.model_loader.utils",
        "vllm.model_executor.models",
        "vllm.model_executor.models.utils",
    ):
        stubs.setdefault(name, StubModule(name))
    for name, module in stubs.items():  # ``from vllm import envs``
        parent, _, leaf = name.rpartition(".")
        if parent:
            setattr(stubs[parent], leaf, module)
    return stubs


def sdist(version: str) -> Path:
    """vLLM ``version``'s sdist from the cache, downloaded into it when missing (skips the test
    without PyPI)."""
    index = None
    if not (CACHE / f"vllm-{version}.tar.gz").exists():
        with contextlib.suppress(OSError):
            index = _index()
    return _sdist(version, index)


def _extract(version: str, into: Path) -> Path:
    root = into / f"vllm-{version}"
    if not root.exists():
        with tarfile.open(sdist(version)) as tar:
            members = [m for m in tar if m.name.split("/", 1)[-1] in REAL]
            tar.extractall(into, members=members, filter="data")
    return root


@contextlib.contextmanager
def running(version: str, workdir: Path) -> Iterator[VllmSource]:
    """vLLM ``version``'s loader modules, importable as ``vllm.*`` until the block ends."""
    root = _extract(version, workdir)
    saved = {
        k: v for k, v in sys.modules.items() if k.split(".")[0] in STUBBED
    }  # fmt: skip
    for name in saved:
        del sys.modules[name]
    parallel, registered = Parallel(), {}
    sys.modules.update(_stubs(version, parallel, registered))
    try:
        modules = {}
        for path in REAL:
            name = path.removesuffix(".py").replace("/", ".")
            module = run_file(name, root / path)
            parent, _, leaf = name.rpartition(".")
            setattr(sys.modules[parent], leaf, module)
            modules[leaf] = module
        package = sys.modules["vllm.model_executor.model_loader"]
        package.DefaultModelLoader = modules["default_loader"].DefaultModelLoader
        package.BaseModelLoader = modules["base_loader"].BaseModelLoader
        yield VllmSource(
            version=version,
            parallel=parallel,
            registered=registered,
            LoadConfig=modules["load"].LoadConfig,
            DefaultModelLoader=modules["default_loader"].DefaultModelLoader,
            **modules,
        )
    finally:
        for name in [k for k in sys.modules if k.split(".")[0] in STUBBED]:
            del sys.modules[name]
        sys.modules.update(saved)


def rchar() -> int:
    """Bytes this process has read with read calls (/proc/self/io)."""
    return int(Path("/proc/self/io").read_text().split("rchar: ")[1].split()[0])
