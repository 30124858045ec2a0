"""Facts: small typed classes, each a shell command and a parser of its output.

A fact is gathered only when an operation or a role asks for it, and then kept (see
:class:`FactCache`) until something changes the host: every change an operation makes drops the
cached facts that are not :attr:`Fact.stable`, so a fact read after a change is read anew.
Parametrised facts (a file's stat, a package's version) take arguments in :meth:`Fact.command`;
the cache keys on the class, the arguments and whether the fact was gathered as root.
"""

from __future__ import annotations

from typing import Any, ClassVar, Generic, TypeVar

from fxkit.connection.base import Connection, RunResult
from fxkit.errors import FxkitError

T = TypeVar("T")


class FactError(FxkitError):
    """A fact's command failed on a host, or printed something fxkit cannot read."""

    @classmethod
    def from_result(cls, fact: str, result: RunResult) -> FactError:
        tail = (result.stderr or result.stdout).strip()[-300:]
        return cls(f"{fact}: `{result.command}` exited {result.rc}: {tail}")


class Fact(Generic[T]):
    """Subclass, set ``command`` (or override :meth:`command`) and implement :meth:`parse`."""

    #: Shell command for facts without arguments.
    cmd: ClassVar[str] = ""
    #: Whether the command needs root (it then runs through sudo even without ``become``).
    become: ClassVar[bool] = False
    #: Whether the value survives changes the operations make (the OS release, the CPU); only a
    #: reboot drops it.
    stable: ClassVar[bool] = False

    def command(self, *args: Any) -> str:
        return self.cmd

    def parse(self, result: RunResult, *args: Any) -> T:
        raise NotImplementedError

    def direct(self, facts: FactCache, *args: Any, become: bool) -> T | None:
        """The value learnt without a command (the host-side helper or the connection's SFTP
        session: no process on the host, no round trip of its own), or None where it cannot
        be: then :meth:`command` runs. Facts that can override it."""
        return None


class FactCache:
    """One host's gathered facts for a run, dropped when the host changes."""

    def __init__(self, conn: Connection):
        self.conn = conn
        self._cache: dict[tuple[type[Fact[Any]], tuple[Any, ...], bool], Any] = {}

    def gather(self, fact: type[Fact[T]], *args: Any, become: bool = False) -> T:
        """Run the fact's command now (as root when ``become`` or the fact needs it)."""
        instance = fact()
        become = become or instance.become
        value = instance.direct(self, *args, become=become)
        if value is not None:
            return value
        result = self.conn.run(instance.command(*args), become=become)
        return instance.parse(result, *args)

    def get(self, fact: type[Fact[T]], *args: Any, become: bool = False) -> T:
        """The fact's value, gathered on first use and kept until the host changes."""
        key = (fact, args, become or fact.become)
        if key not in self._cache:
            self._cache[key] = self.gather(fact, *args, become=become)
        value: T = self._cache[key]
        return value

    def forget(self, fact: type[Fact[Any]]) -> None:
        """Drop ``fact`` (all its arguments): its source changed (a stable fact checks its own)."""
        self._cache = {key: value for key, value in self._cache.items() if key[0] is not fact}

    def changed(self) -> None:
        """Something changed the host: drop every fact that is not :attr:`Fact.stable`."""
        self._cache = {key: value for key, value in self._cache.items() if key[0].stable}

    def clear(self) -> None:
        """The host rebooted: drop every fact."""
        self._cache.clear()
