"""The kinds of measurement a check can name (``measure: {KIND: PARAMS}``); importing this
package registers them all in :data:`fxkit.gate.measure.KINDS`."""

from fxkit.gate.measures import (
    amd_smi,
    bench,
    command,
    fabric,
    facts,
    kv,
    perf,
    platform,
    serving,
    soak,
    storage,
    validation,
)

__all__ = [
    "amd_smi",
    "bench",
    "command",
    "fabric",
    "facts",
    "kv",
    "perf",
    "platform",
    "serving",
    "soak",
    "storage",
    "validation",
]
