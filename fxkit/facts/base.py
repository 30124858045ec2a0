"""Facts: small typed classes, each a shell command and a parser of its output.

A fact is gathered at most once per host per run (see :class:`FactCache`), and only when an
operation or a role asks for it. Parametrised facts (a file's stat, a package's version) take
arguments in :meth:`Fact.command`; the cache keys on the class and the arguments.
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
    #: Whether the command needs root.
    become: ClassVar[bool] = False

    def command(self, *args: Any) -> str:
        return self.cmd

    def parse(self, result: RunResult, *args: Any) -> T:
        raise NotImplementedError


class FactCache:
    """Per-host, per-run cache of gathered facts."""

    def __init__(self, conn: Connection):
        self.conn = conn
        self._cache: dict[tuple[type, tuple[Any, ...]], Any] = {}

    def get(self, fact: type[Fact[T]], *args: Any) -> T:
        key = (fact, args)
        if key not in self._cache:
            instance = fact()
            result = self.conn.run(instance.command(*args), become=instance.become)
            self._cache[key] = instance.parse(result, *args)
        return self._cache[key]

    def forget(self, fact: type[Fact[Any]], *args: Any) -> None:
        """Drop a cached value after an operation changed what the fact describes."""
        self._cache.pop((fact, args), None)
