"""vLLM plugin: ``vllm serve MODEL --load-format fxkit`` reads weights with fxkit's loader.

vLLM calls ``register()`` in every process through the ``vllm.general_plugins`` entry point. It
registers vLLM's own ``DefaultModelLoader`` (file discovery, download, prefixes, weight loading)
with one part replaced: the weights iterator, which becomes ``iter_tensors``. Options come from
``--model-loader-extra-config '{"threads": 16, "chunk_size": 33554432}'``; the other keys there
go to vLLM's loader as usual. Nothing from vLLM is imported until ``register()`` runs.

``share`` is on by default here (``"share": false`` turns it off): every rank of a tensor-parallel
model iterates over every file, so the ranks on a node read each file once between them, into the
page cache they all map (:mod:`fxkit.loader.shared`). That needs no rank numbers from vLLM: ranks of
one instance, several instances of one model and separate jobs share alike.

vLLM chooses the files (download, patterns, index); fxkit checks that list with the loader's own
rule (:mod:`fxkit.loader.files`: regular files only, symlinks to regular files, each file once).
"""

from __future__ import annotations

import copy
import logging
import re
from collections.abc import Iterator
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


def weights_iterator(files: list[str], options: dict[str, Any]) -> Iterator[tuple[str, Any]]:
    """What vLLM's weight iterators yield: ``(name, CPU tensor)`` in file order."""
    from .api import iter_tensors

    yield from iter_tensors(list(files), device="cpu", **options)


def _loader_class(default_loader: type) -> type:
    class FxkitModelLoader(default_loader):
        """vLLM's default loader, reading safetensors with fxkit's parallel loader."""

        def __init__(self, load_config: Any) -> None:
            options, rest = split_extra_config(load_config.model_loader_extra_config)
            # vLLM's loader refuses keys it does not know and formats it does not know: it gets
            # a copy of the config without fxkit's keys, asking for safetensors files.
            config = copy.copy(load_config)
            config.model_loader_extra_config = rest
            config.load_format = "safetensors"
            super().__init__(config)
            self.fxkit_options = {**PLUGIN_DEFAULTS, **options}

        def _get_weights_iterator(self, source: Any) -> Iterator[tuple[str, Any]]:
            prepared = self._prepare_weights(
                model_name_or_path=source.model_or_path,
                subfolder=source.subfolder,
                revision=source.revision,
                fall_back_to_pt=False,
                allow_patterns_overrides=source.allow_patterns_overrides,
            )
            files, use_safetensors = prepared[1], prepared[2]
            if not use_safetensors:
                raise ValueError(
                    f"load format {LOAD_FORMAT!r} reads safetensors; "
                    f"{source.model_or_path} has none"
                )
            weights = weights_iterator(files, self.fxkit_options)
            return ((source.prefix + name, tensor) for name, tensor in weights)

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
    try:
        check_vllm_version(getattr(vllm, "__version__", "unknown"))
    except ValueError as exc:  # --load-format fxkit then fails with this reason
        logger.error("fxkit: %s", exc)
        loader = _refusing_class(DefaultModelLoader, str(exc))
    register_model_loader(LOAD_FORMAT)(loader)
    _registered = True
    logger.info("fxkit: registered vLLM load format %r", LOAD_FORMAT)
