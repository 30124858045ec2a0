"""The kinds of measurement a check can name (``measure: {KIND: PARAMS}``); importing this
package registers them all in :data:`fxkit.gate.measure.KINDS`."""

from fxkit.gate.measures import bench, command, facts, perf, serving, soak, validation

__all__ = ["bench", "command", "facts", "perf", "serving", "soak", "validation"]
