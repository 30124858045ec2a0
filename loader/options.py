"""The loader's options, listed once: their types, defaults and help.

``load``/``iter_tensors`` take them as keyword arguments or as a ``LoadOptions``; ``fxkit load``
builds its command-line options from its fields (``metadata``: ``help``, and ``choices`` where
the value is one of a few words); ``fxkit bench load -o KEY=VALUE`` and the vLLM
plugin's ``--model-loader-extra-config`` check their keys and values with :meth:`from_mapping`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from .errors import LoaderError
from .plan import DEFAULT_CHUNK

DirectIO = Literal["auto", "on", "off"] | bool
DIRECT_IO_CHOICES = ("auto", "on", "off")


@dataclass(frozen=True)
class LoadOptions:
    """How a model is read (not where to: ``device`` and ``dtype`` are arguments of their own)."""

    threads: int = field(default=8, metadata={"help": "Reader threads."})
    chunk_size: int = field(
        default=DEFAULT_CHUNK, metadata={"help": "Bytes per read (rounded up to 4 KiB blocks)."}
    )
    direct_io: DirectIO = field(
        default="auto",
        metadata={
            "help": "O_DIRECT reads: on, off, or auto (CPU: read into the page cache and "
            "mapped; a device, or network/FUSE storage whose requests are slow: O_DIRECT for "
            "uncached files).",
            "choices": DIRECT_IO_CHOICES,
        },
    )
    drop_cache: bool = field(
        default=False, metadata={"help": "Evict the files from the page cache afterwards."}
    )
    share: bool = field(
        default=False,
        metadata={
            "help": "Read each file once per node: the processes loading it at the same time "
            "split its chunks into the page cache, which all of them map (direct_io and "
            "drop_cache do not apply)."
        },
    )
    claim_timeout: float = field(
        default=60.0,
        metadata={
            "help": "With share: seconds to wait for a chunk another process is reading before "
            "reading it here too, with a warning (a stopped or hung process holds it)."
        },
    )
    progress: bool = field(default=False, metadata={"help": "Show a progress bar with GB/s."})

    def __post_init__(self) -> None:
        for name, value in dataclasses.asdict(self).items():
            _check(name, value)

    @classmethod
    def from_mapping(
        cls, values: Mapping[str, Any], base: LoadOptions | None = None, where: str = "options"
    ) -> LoadOptions:
        """``base`` (the defaults) with ``values`` set (``None`` keeps the default); an unknown key
        or a wrong value is a ``LoaderError``."""
        known = names()
        if unknown := [key for key in values if key not in known]:
            raise LoaderError(
                f"{where}: unknown loader option(s) {', '.join(map(repr, unknown))}",
                hint=f"the loader's options are {', '.join(known)}",
            )
        given = {key: value for key, value in values.items() if value is not None}
        try:
            return dataclasses.replace(base or cls(), **given)
        except LoaderError as exc:
            raise LoaderError(f"{where}: {exc.message}", hint=exc.hint) from None


def fields() -> tuple[dataclasses.Field[Any], ...]:
    """The options, in order, each with its default and ``metadata["help"]``."""
    return dataclasses.fields(LoadOptions)


def names() -> tuple[str, ...]:
    return tuple(f.name for f in fields())


def _check(name: str, value: Any) -> None:
    if name in ("threads", "chunk_size"):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise LoaderError(f"{name} must be a positive integer, got {value!r}")
    elif name == "claim_timeout":
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not 0 < value < math.inf
        ):
            raise LoaderError(f"{name} must be a positive number of seconds, got {value!r}")
    elif name == "direct_io":
        if not isinstance(value, bool) and value not in DIRECT_IO_CHOICES:
            raise LoaderError(f"direct_io must be 'auto', 'on' or 'off', got {value!r}")
    elif not isinstance(value, bool):
        raise LoaderError(f"{name} must be true or false, got {value!r}")
