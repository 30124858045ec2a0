"""User-facing errors: what is wrong, where, and what to do about it.

Every mistake a user can make (a bad inventory line, an undefined template variable, an
unknown host key) surfaces as a subclass of :class:`FxkitError`; the CLI prints it without a
traceback. Anything else is a bug in fxkit and keeps its traceback.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterator
from typing import Self


class FxkitError(Exception):
    """An error the user can fix. ``where`` is a file:line, host or variable; ``hint`` says how."""

    def __init__(self, message: str, *, where: str | None = None, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.where = where
        self.hint = hint

    def __str__(self) -> str:
        text = f"{self.where}: {self.message}" if self.where else self.message
        return f"{text}\n  hint: {self.hint}" if self.hint else text

    def masked(self, mask: Callable[[str], str]) -> Self:
        """This error with ``mask`` (a :class:`~fxkit.redaction.Masker`'s ``text``) applied
        to its message, place and hint: as it may leave fxkit."""
        out = copy.copy(self)
        out.message = mask(self.message)
        out.where = self.where and mask(self.where)
        out.hint = self.hint and mask(self.hint)
        out.args = (out.message, *self.args[1:])
        return out


@contextlib.contextmanager
def masked_errors(mask: Callable[[str], str]) -> Iterator[None]:
    """The :class:`FxkitError` raised inside leaves :meth:`~FxkitError.masked` by ``mask``."""
    try:
        yield
    except FxkitError as exc:
        raise exc.masked(mask) from None


class InventoryError(FxkitError):
    """An inventory file, group_vars/host_vars file or host pattern is wrong."""


class PlaybookError(FxkitError):
    """A playbook, role or role file is wrong."""


class TemplateError(FxkitError):
    """A Jinja2 template failed to render (undefined variable, syntax error)."""


class VarError(FxkitError):
    """A variable's value is wrong for a role: ``where`` names the host and the variable."""


class ConnectionFailed(FxkitError):
    """A host could not be reached or logged into: the host counts as unreachable."""


class HostKeyError(ConnectionFailed):
    """A host's SSH key is unknown or changed: fxkit refuses to talk to it."""
