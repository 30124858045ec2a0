"""The interface every connection (SSH, local) provides to operations and facts.

A connection runs shell commands and moves file contents; it knows nothing about operations.
Commands are strings for a POSIX shell: callers quote every value with :func:`shlex.quote`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass


@dataclass(frozen=True)
class RunResult:
    """The outcome of one remote command."""

    command: str
    rc: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.rc == 0


class Connection(ABC):
    """One host's connection, opened once and reused for every operation of a run."""

    #: The inventory name of the host (not necessarily its address).
    name: str

    @abstractmethod
    def open(self) -> None:
        """Connect (idempotent). Raises :class:`fxkit.errors.ConnectionFailed` when unreachable."""

    @abstractmethod
    def run(
        self,
        command: str,
        *,
        become: bool = False,
        timeout: float | None = None,
        stdin: bytes | None = None,
    ) -> RunResult:
        """Run ``command`` with ``sh -c`` (via sudo when ``become``); never raises on rc != 0.

        Raises :class:`fxkit.errors.ConnectionFailed` when the connection is lost.
        """

    @abstractmethod
    def get(self, path: str, *, become: bool = False) -> bytes | None:
        """Return the contents of the remote file ``path``, or None when it does not exist."""

    @abstractmethod
    def put(self, path: str, data: bytes, *, become: bool = False) -> None:
        """Write ``data`` to ``path`` (not atomic: callers write a temp file, then rename)."""

    @abstractmethod
    def close(self) -> None:
        """Close the connection (idempotent)."""

    def __enter__(self) -> Connection:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
