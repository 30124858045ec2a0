"""vLLM plugin: ``vllm serve MODEL --load-format fxkit`` reads weights with fxkit's loader.

vLLM calls ``register()`` in every process through the ``vllm.general_plugins`` entry point. It
registers vLLM's own ``DefaultModelLoader``, run as for vLLM's default load format (``auto``), with
one part replaced: the safetensors iterator vLLM's ``_get_weights_iterator`` calls, which becomes
``iter_tensors`` inside fxkit's loader only. Everything around it stays vLLM's: the choice of
files (download, patterns, a Mistral layout's ``consolidated*.safetensors`` and its index), the
shards a model does not use, the experts a rank owns under expert parallelism, the timing log.
fxkit reads only the byte ranges of the tensors a rank keeps (vLLM's own ``should_skip_weight``
and the model's ``is_unused_checkpoint_weight`` decide which). What is not safetensors (``.bin``,
``.pt``) vLLM reads with its own iterators, and so are the ``safetensors_load_strategy`` values
fxkit does not implement (``torchao``), with a warning each.

Options come from ``--model-loader-extra-config '{"threads": 16, "chunk_size": 33554432}'``;
vLLM's ``num_threads`` sets fxkit's ``threads``, the other keys go to vLLM's loader as usual.
Nothing from vLLM is imported until ``register()`` runs.

``share`` is on by default here (``"share": false`` turns it off): every rank of a tensor-parallel
model iterates over every file, so the ranks on a node read each file once between them, into the
page cache they all map (:mod:`fxkit.loader.shared`). That needs no rank numbers from vLLM: ranks of
one instance, several instances of one model and separate jobs share alike.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import inspect
import itertools
import logging
import re
import sys
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import Any

from .errors import LoaderError
from .options import LoadOptions, names

LOAD_FORMAT = "fxkit"
#: fxkit's options under vLLM, before ``--model-loader-extra-config``.
PLUGIN_DEFAULTS = {"share": True}

#: The vLLM releases whose loader source the plugin was checked against
#: (tests/test_loader_vllm_contract.py). Older ones are refused; newer ones are used, with a
#: warning.
VLLM_CHECKED = ("0.18.0", "0.33.0")

#: vLLM's safetensors iterators, in ``default_loader``, that fxkit reads for inside its loader.
STOOD_IN_FOR = ("safetensors_weights_iterator", "multi_thread_safetensors_weights_iterator")
#: ``safetensors_load_strategy`` values that change only how vLLM reads the bytes; fxkit reads
#: them its own way. Any other (``torchao`` rebuilds tensor subclasses) is left to vLLM.
READ_STRATEGIES = (None, "lazy", "eager", "prefetch")
#: The arguments of those iterators fxkit knows: any other is left to vLLM.
KNOWN_ARGUMENTS = {
    "hf_weights_files",
    "use_tqdm_on_load",
    "safetensors_load_strategy",
    "local_expert_ids",
    "max_workers",  # the multi-thread iterator's: fxkit's threads are set in __init__
    "safetensors_prefetch_num_threads",  # how vLLM prefetches the page cache
    "safetensors_prefetch_block_size",
}

logger = logging.getLogger(__name__)
_registered = False


def split_extra_config(extra: dict[str, Any] | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(fxkit's options, the rest)`` of a loader extra config: the keys of
    :class:`~fxkit.loader.options.LoadOptions` are fxkit's (wrong values raise ValueError), the
    rest are vLLM's, which refuses the keys it does not know."""
    extra = dict(extra or {})
    options = {key: extra.pop(key) for key in list(extra) if key in names()}
    try:
        LoadOptions.from_mapping(options, where="model_loader_extra_config")
    except LoaderError as exc:
        raise ValueError(str(exc)) from None
    return options, extra


def thread_options(options: dict[str, Any], vllm_extra: dict[str, Any]) -> dict[str, Any]:
    """fxkit's options with vLLM's ``num_threads`` as ``threads`` (fxkit always reads with
    threads: ``enable_multithread_load`` needs nothing more); refuses (ValueError) two different
    thread counts."""
    if "num_threads" not in vllm_extra:
        return options
    threads = vllm_extra["num_threads"]
    if options.get("threads", threads) != threads:
        raise ValueError(
            f"load format {LOAD_FORMAT!r}: model_loader_extra_config sets num_threads "
            f"{threads} and threads {options['threads']}; give one of them"
        )
    return {**options, "threads": threads}


def weights_iterator(
    files: list[str], options: dict[str, Any], keep: Callable[[str], bool] | None = None
) -> Iterator[tuple[str, Any]]:
    """What vLLM's weight iterators yield: ``(name, CPU tensor)`` in file order, only the
    tensors ``keep`` accepts (all without it)."""
    from .api import iter_tensors

    yield from iter_tensors(list(files), device="cpu", keep=keep, **options)


def keeper(
    local_expert_ids: set[int] | None, is_unused_weight: Callable[[str], bool] | None
) -> Callable[[str], bool] | None:
    """The names a rank reads: vLLM's own EP rule (``should_skip_weight``: non-local experts'
    heavy tensors are skipped) and what the model says it does not use; None keeps all."""
    from vllm.model_executor.model_loader.ep_weight_filter import should_skip_weight

    if local_expert_ids is None and is_unused_weight is None:
        return None

    def keep(name: str) -> bool:
        if is_unused_weight is not None and is_unused_weight(name):
            return False
        return not should_skip_weight(name, local_expert_ids)

    return keep


@dataclasses.dataclass
class _Reading:
    """One call of fxkit's ``_get_weights_iterator``: its loader and source."""

    loader: Any
    source: Any
    stood_in: bool = False


_reading: ContextVar[_Reading | None] = ContextVar("fxkit_vllm_reading", default=None)


def _stand_in(original: Callable[..., Any], vllm_iterator: Callable[..., Any]) -> Callable:
    """``original`` (one of STOOD_IN_FOR) as vLLM calls it, read by fxkit inside fxkit's loader
    (``vllm_iterator``: vLLM's safetensors iterator, for what fxkit leaves to vLLM)."""
    signature = inspect.signature(original)

    @functools.wraps(original)
    def iterator(*args: Any, **kwargs: Any) -> Iterator[tuple[str, Any]]:
        reading = _reading.get()
        if reading is None:  # another loader's call
            return original(*args, **kwargs)
        reading.stood_in = True
        arguments = signature.bind(*args, **kwargs).arguments
        config = reading.loader.load_config
        strategy = arguments.get("safetensors_load_strategy", config.safetensors_load_strategy)
        expert_ids = arguments.get("local_expert_ids", reading.loader.local_expert_ids)
        files = list(arguments["hf_weights_files"])
        unknown = sorted(set(arguments) - KNOWN_ARGUMENTS)
        if unknown:
            logger.warning(
                "fxkit: vLLM passes %s to its safetensors iterator, which load format %r does "
                "not know: vLLM reads %d files itself",
                unknown,
                LOAD_FORMAT,
                len(files),
            )
            return original(*args, **kwargs)
        if strategy not in READ_STRATEGIES:
            logger.warning(
                "fxkit: load format %r does not implement safetensors_load_strategy %r: vLLM "
                "reads %d files itself",
                LOAD_FORMAT,
                strategy,
                len(files),
            )
            return vllm_iterator(
                files, arguments.get("use_tqdm_on_load", False), strategy,
                local_expert_ids=expert_ids,
            )  # fmt: skip
        keep = keeper(expert_ids, getattr(reading.source, "is_unused_weight", None))
        return _read(reading.loader, files, keep)

    iterator.fxkit_stands_in = True  # type: ignore[attr-defined]
    return iterator


def _read(loader: Any, files: list[str], keep: Callable[[str], bool] | None) -> Iterator:
    """The files in vLLM's order: safetensors by fxkit, anything else by vLLM's own iterator for
    ``.bin``/``.pt`` files (a model's patterns can list ``.pt`` files among safetensors)."""
    from vllm.model_executor.model_loader.weight_utils import (
        _natural_sort_key,
        pt_weights_iterator,
    )

    config = loader.load_config
    ordered = sorted(files, key=_natural_sort_key)
    for safetensors, run in itertools.groupby(ordered, key=lambda f: f.endswith(".safetensors")):
        group = list(run)
        if safetensors:
            yield from weights_iterator(group, loader.fxkit_options, keep)
            continue
        logger.warning(
            "fxkit: %s not safetensors: vLLM reads it with its own iterator, not load format %r",
            ", ".join(group), LOAD_FORMAT,
        )  # fmt: skip
        yield from pt_weights_iterator(group, config.use_tqdm_on_load, config.pt_load_map_location)


def stand_in_for_safetensors(default_loader_module: Any) -> None:
    """Put fxkit in place of STOOD_IN_FOR in vLLM's ``default_loader`` (once; other loaders'
    calls go to vLLM's own)."""
    vllm_iterator = getattr(default_loader_module, STOOD_IN_FOR[0])
    vllm_iterator = getattr(vllm_iterator, "__wrapped__", vllm_iterator)
    for name in STOOD_IN_FOR:
        original = getattr(default_loader_module, name)
        if not getattr(original, "fxkit_stands_in", False):
            setattr(default_loader_module, name, _stand_in(original, vllm_iterator))


def _loader_class(default_loader: type) -> type:
    class FxkitModelLoader(default_loader):
        """vLLM's default loader, reading safetensors with fxkit's parallel loader."""

        def __init__(self, load_config: Any) -> None:
            options, rest = split_extra_config(load_config.model_loader_extra_config)
            # vLLM's loader refuses keys it does not know: it gets a copy of the config without
            # fxkit's keys. Its errors name the load format asked for, fxkit; then it chooses
            # files as for its default format (auto).
            config = copy.copy(load_config)
            config.model_loader_extra_config = rest
            super().__init__(config)
            config.load_format = "auto"
            self.fxkit_options = {**PLUGIN_DEFAULTS, **thread_options(options, rest)}

        def _get_weights_iterator(self, source: Any) -> Iterator[tuple[str, Any]]:
            reading = _Reading(self, source)
            token = _reading.set(reading)
            try:
                weights = super()._get_weights_iterator(source)
            finally:
                _reading.reset(token)
            if not reading.stood_in:
                logger.warning(
                    "fxkit: %s has no safetensors files here: vLLM reads its weights itself, "
                    "not load format %r", source.model_or_path, LOAD_FORMAT,
                )  # fmt: skip
            return weights

    return FxkitModelLoader


def _release(version: str) -> tuple[int, ...]:
    match = re.match(r"\d+(\.\d+)*", version)
    return tuple(int(part) for part in match.group().split(".")) if match else ()


def check_vllm_version(version: str) -> None:
    """Refuse (ValueError) a vLLM older than checked; warn about one newer than checked."""
    oldest, newest = VLLM_CHECKED
    if not _release(version) or _release(version) < _release(oldest):
        raise ValueError(
            f"load format {LOAD_FORMAT!r} does not support vLLM {version}: fxkit's plugin "
            f"relies on vLLM's loader as it is in vLLM {oldest} to {newest}; upgrade vLLM"
        )
    if _release(version) > _release(newest):
        logger.warning(
            "fxkit: vLLM %s is newer than the newest vLLM checked against (%s)", version, newest
        )


def warn_when_bypassed(engine_args: Any) -> None:
    """Make ``EngineArgs.create_engine_config`` warn when it switches ``--load-format fxkit`` to
    another loader (vLLM does for GGUF and bitsandbytes models, silently)."""
    create = engine_args.create_engine_config
    if getattr(create, "fxkit_stands_in", False):
        return

    @functools.wraps(create)
    def create_engine_config(self: Any, *args: Any, **kwargs: Any) -> Any:
        asked = self.load_format
        engine_config = create(self, *args, **kwargs)
        chosen = engine_config.load_config.load_format
        if asked == LOAD_FORMAT and chosen != LOAD_FORMAT:
            logger.warning(
                "fxkit: vLLM loads %s with load format %r, not %r: fxkit reads none of its "
                "weights", self.model, chosen, LOAD_FORMAT,
            )  # fmt: skip
        return engine_config

    create_engine_config.fxkit_stands_in = True  # type: ignore[attr-defined]
    engine_args.create_engine_config = create_engine_config


def _refusing_class(default_loader: type, reason: str) -> type:
    def refuse(self: Any, load_config: Any) -> None:
        raise ValueError(reason)

    return type("FxkitModelLoader", (default_loader,), {"__init__": refuse})


def register() -> None:
    """Register load format ``fxkit`` with vLLM (once per process; a no-op without vLLM)."""
    global _registered
    if _registered:
        return
    try:
        import vllm
        from vllm.model_executor.model_loader import DefaultModelLoader, register_model_loader
    except ImportError as exc:
        logger.warning("fxkit: vLLM is not importable (%s); load format not registered", exc)
        return
    loader = _loader_class(DefaultModelLoader)
    stand_in_for_safetensors(sys.modules[DefaultModelLoader.__module__])
    arg_utils = sys.modules.get("vllm.engine.arg_utils")  # imported where engine args are made
    if arg_utils is not None:
        warn_when_bypassed(arg_utils.EngineArgs)
    try:
        check_vllm_version(getattr(vllm, "__version__", "unknown"))
    except ValueError as exc:  # --load-format fxkit then fails with this reason
        logger.error("fxkit: %s", exc)
        loader = _refusing_class(DefaultModelLoader, str(exc))
    register_model_loader(LOAD_FORMAT)(loader)
    _registered = True
    logger.info("fxkit: registered vLLM load format %r", LOAD_FORMAT)
