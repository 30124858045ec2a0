"""The kinds of measurement a check can name (``measure: {KIND: PARAMS}``); importing this
package registers them all in :data:`fxkit.gate.measure.KINDS`."""

from fxkit.gate.measures import bench, command, fabric, facts, serving, soak, storage

__all__ = ["bench", "command", "fabric", "facts", "serving", "soak", "storage"]
