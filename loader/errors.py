"""Errors of the loader: every one names the file (and the tensor) and what is wrong."""

from __future__ import annotations


class LoaderError(Exception):
    """A checkpoint that cannot be loaded as asked; ``hint``, when given, says what to do.

    Printed like the engine's ``FxkitError`` (the loader imports nothing from the engine)."""

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return f"{self.message}\n  hint: {self.hint}" if self.hint else self.message
