"""What a run shows and logs: live progress, one line per change or failure, diffs, the recap
and a JSON event log. Every text passes through :meth:`Reporter.redact` first, so the values of
secret variables (see :mod:`fxkit.variables`) never reach the terminal or the log.
"""

from __future__ import annotations

import json
import threading
import traceback
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import IO, Any

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from fxkit.ops.base import Result, Status
from fxkit.redaction import maskable, redact

UNREACHABLE = "unreachable"
STYLE = {
    "ok": "green",
    "changed": "yellow",
    "failed": "bold red",
    "skipped": "cyan",
    UNREACHABLE: "bold magenta",
}


@dataclass
class Event:
    """One operation's outcome on one host (also host-level outcomes: unreachable, errors)."""

    host: str
    play: str
    role: str | None
    operation: str
    status: str
    msg: str
    diff: str | None
    duration_s: float


@dataclass
class Counts:
    ok: int = 0
    changed: int = 0
    failed: int = 0
    skipped: int = 0
    unreachable: int = 0


class Reporter:
    """Thread-safe: host threads report to one instance."""

    def __init__(
        self,
        console: Console | None = None,
        *,
        diff: bool = False,
        verbose: bool = False,
        log_json: IO[str] | None = None,
    ):
        self.console = console or Console(highlight=False, soft_wrap=True)
        self.show_diff = diff
        self.verbose = verbose
        self.counts: dict[str, Counts] = {}
        self._log = log_json
        self._secret_values: set[str] = set()
        self._secrets: list[str] = []
        self._current: dict[str, str] = {}
        self._lock = threading.RLock()
        self._live: Live | None = None

    # -- secrets ---------------------------------------------------------------------------

    def add_secrets(self, values: Iterable[str]) -> None:
        """Secret values to redact from now on (with their variants: :mod:`fxkit.redaction`)."""
        with self._lock:
            new = set(values) - self._secret_values
            if new:
                self._secret_values |= new
                self._secrets = maskable(self._secret_values)

    def redact(self, text: str) -> str:
        return redact(text, self._secrets)

    # -- live progress ---------------------------------------------------------------------

    def __enter__(self) -> Reporter:
        if self.console.is_terminal:
            self._live = Live(
                get_renderable=self.progress,
                console=self.console,
                refresh_per_second=8,
                transient=True,
            )
            self._live.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live:
            self._live.stop()
            self._live = None

    def progress(self) -> RenderableType:
        """The live view: what each busy host is doing (its role and operation)."""
        # Called from Live's refresh thread: no lock here (a copy is atomic), so a host thread
        # printing under self._lock can never wait on a refresh that waits on it.
        table = Table.grid(padding=(0, 2))
        for host, doing in dict(self._current).items():
            table.add_row(Text(host, style="bold"), Text(self.redact(doing), style="dim"))
        return table

    def _print(self, *renderables: RenderableType) -> None:
        self.console.print(Group(*renderables))

    # -- what host threads report ----------------------------------------------------------

    def play_started(self, name: str, hosts: list[str]) -> None:
        with self._lock:
            for host in hosts:
                self.counts.setdefault(host, Counts())
            count = f"{len(hosts)} host{'s' if len(hosts) != 1 else ''}"
            self._print(Text(f"\nPLAY {self.redact(name)} ({count})", style="bold"))

    def op_started(self, host: str, role: str | None, operation: str) -> None:
        with self._lock:
            self._current[host] = f"{role} / {operation}" if role else operation

    def host_done(self, host: str) -> None:
        with self._lock:
            self._current.pop(host, None)

    def op_done(
        self, host: str, play: str, role: str | None, result: Result, duration_s: float
    ) -> None:
        """Count, print (changes, failures, skips; all with verbose) and log one result."""
        event = Event(
            host=host,
            play=play,
            role=role,
            operation=result.name,
            status=str(result.status),
            msg=result.msg,
            diff=result.diff,
            duration_s=round(duration_s, 6),
        )
        self._record(event)

    def host_unreachable(
        self,
        host: str,
        play: str,
        msg: str,
        role: str | None = None,
        operation: str = "connect",
    ) -> None:
        """The host could not be reached, or its link broke during ``role``'s ``operation``."""
        self._record(Event(host, play, role, operation, UNREACHABLE, msg, None, 0.0))

    def host_error(self, host: str, play: str, role: str | None, msg: str) -> None:
        """A role or template error stopped the host (not an operation's result)."""
        self._record(Event(host, play, role, "role", str(Status.FAILED), msg, None, 0.0))

    def note(self, msg: str, style: str = "bold") -> None:
        with self._lock:
            self._print(Text(self.redact(msg), style=style))

    def traceback(self, exc: BaseException) -> None:
        """Print the traceback of a bug (in fxkit or an operation), redacted like the rest."""
        text = "".join(traceback.format_exception(exc))
        with self._lock:
            self._print(Text(self.redact(text), style="dim"))

    def _record(self, event: Event) -> None:
        with self._lock:
            event = self._redacted(event)
            counts = self.counts.setdefault(event.host, Counts())
            setattr(counts, event.status, getattr(counts, event.status) + 1)
            if self._log:
                self._log.write(json.dumps(asdict(event), default=str) + "\n")
                self._log.flush()
            if event.status != str(Status.OK) or self.verbose:
                self._print(*self._lines(event))

    def _redacted(self, event: Event) -> Event:
        fields: dict[str, Any] = asdict(event)
        for key in ("host", "play", "role", "operation", "msg", "diff"):
            if fields[key] is not None:
                fields[key] = self.redact(str(fields[key]))
        return Event(**fields)

    def _lines(self, event: Event) -> list[RenderableType]:
        where = " | ".join(p for p in (event.host, event.role, event.operation) if p)
        line = Text.assemble((f"{event.status:<11} ", STYLE.get(event.status, "")), where)
        if event.msg:
            line.append(f"  {event.msg}", style="dim")
        out: list[RenderableType] = [line]
        if self.show_diff and event.diff:
            out.append(_diff_text(event.diff))
        return out

    # -- the end ---------------------------------------------------------------------------

    def recap(self) -> None:
        """The per-host table: ok, changed, failed, skipped, unreachable."""
        table = Table(title="RECAP", title_justify="left", title_style="bold")
        table.add_column("host")
        for column in ("ok", "changed", "failed", "skipped", "unreachable"):
            table.add_column(column, justify="right")
        with self._lock:
            for host, counts in self.counts.items():
                cells = [
                    Text(str(n), style=STYLE[name] if n else "dim")
                    for name, n in asdict(counts).items()
                ]
                table.add_row(Text(host, style=_host_style(counts)), *cells)
            self.console.print(table)

    @property
    def failed_hosts(self) -> list[str]:
        return [h for h, c in self.counts.items() if c.failed]

    @property
    def unreachable_hosts(self) -> list[str]:
        return [h for h, c in self.counts.items() if c.unreachable]


def _host_style(counts: Counts) -> str:
    if counts.unreachable:
        return STYLE[UNREACHABLE]
    if counts.failed:
        return STYLE["failed"]
    return STYLE["changed"] if counts.changed else STYLE["ok"]


def _diff_text(diff: str) -> Text:
    text = Text()
    for number, line in enumerate(diff.rstrip("\n").splitlines()):
        style = "green" if line.startswith("+") else "red" if line.startswith("-") else "dim"
        text.append(("\n" if number else "") + "    " + line, style=style)
    return text
