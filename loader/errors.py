"""Errors of the loader: every one names the file (and the tensor) and what is wrong.

A malformed safetensors file raises one of the named subclasses below, which mirror the reference
reader's ``SafeTensorError`` variants (huggingface/safetensors, safetensors/src/tensor.rs), so a
caller or a test can tell the cases apart by class, not by message.
"""

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


class HeaderTooSmall(LoaderError):
    """The file is shorter than the 8-byte header size."""


class HeaderTooLarge(LoaderError):
    """The header size is over the limit (100,000,000 bytes)."""


class InvalidHeaderLength(LoaderError):
    """The header runs past the end of the file."""


class InvalidHeader(LoaderError):
    """The header is not valid UTF-8."""


class InvalidHeaderStart(LoaderError):
    """The header does not start with ``{``."""


class InvalidHeaderDeserialization(LoaderError):
    """The header is not JSON of the expected shape (an object of tensor entries)."""


class UnknownDtype(InvalidHeaderDeserialization):
    """A tensor's dtype is not one of safetensors' dtypes."""


class TensorInvalidInfo(LoaderError):
    """A tensor's shape and dtype disagree with the size of its byte span."""


class ValidationOverflow(LoaderError):
    """A tensor's shape overflows 64-bit arithmetic."""


class InvalidOffset(LoaderError):
    """A tensor's data offsets leave a gap, overlap another's, or end before they begin."""


class MetadataIncompleteBuffer(LoaderError):
    """The tensors' offsets do not end exactly at the end of the file (short, or trailing bytes)."""


class DuplicateTensor(LoaderError):
    """Two files of one model hold a tensor of the same name."""
