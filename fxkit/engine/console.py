"""What a run shows and logs: live progress, one line per change or failure, diffs, the recap
and a JSON event log; and the run's record, :class:`~fxkit.engine.record.PlaybookResult`. Every text
passes through :meth:`Reporter.redact` first, so the values of secret variables (see
:mod:`fxkit.engine.redaction`) never reach the terminal, the log or the results.
"""

from __future__ import annotations

import json
import threading
import traceback
from collections.abc import Iterable
from dataclasses import asdict, replace
from typing import IO, Any

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from fxkit.engine.record import Counts, HostResult, Outcome, PlaybookResult, TaskResult
from fxkit.engine.redaction import Masker
from fxkit.ops.base import Result, Status

STYLE = {
    Status.OK: "green",
    Status.CHANGED: "yellow",
    Status.FAILED: "bold red",
    Status.SKIPPED: "cyan",
    Status.UNREACHABLE: "bold magenta",
    Outcome.INTERRUPTED: "bold red",
}


class Reporter:
    """Thread-safe: host threads report to one instance, which records into :attr:`results`."""

    def __init__(
        self,
        console: Console | None = None,
        *,
        diff: bool = False,
        verbose: bool = False,
        log_json: IO[str] | None = None,
        masker: Masker | None = None,
    ):
        """``masker``: the secrets to mask (a new one by default)."""
        self.console = console or Console(highlight=False, soft_wrap=True)
        self.show_diff = diff
        self.verbose = verbose
        self.results = PlaybookResult()
        self._log = log_json
        self.masker = masker or Masker()
        self._current: dict[str, str] = {}
        self._lock = threading.RLock()
        self._live: Live | None = None

    def fresh(self) -> Reporter:
        """A reporter for another run, printing and logging as this one does (masking its
        secrets too), with results of its own."""
        return Reporter(
            self.console,
            diff=self.show_diff,
            verbose=self.verbose,
            log_json=self._log,
            masker=self.masker,
        )

    # -- secrets ---------------------------------------------------------------------------

    def add_secrets(self, values: Iterable[str]) -> None:
        """Secret values to redact from now on (with their variants:
        :mod:`fxkit.engine.redaction`)."""
        self.masker.add(values)

    def redact(self, text: str) -> str:
        return self.masker.text(text)

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

    # -- what the runner and host threads report -------------------------------------------

    def run_started(self, *, check: bool) -> None:
        with self._lock:
            self.results.check = check
            self.results.start()

    def play_started(self, name: str, hosts: list[str]) -> None:
        with self._lock:
            for host in hosts:
                self._host(host)
            count = f"{len(hosts)} host{'s' if len(hosts) != 1 else ''}"
            self._print(Text(f"\nPLAY {self.redact(name)} ({count})", style="bold"))

    def op_started(self, host: str, role: str | None, operation: str) -> None:
        with self._lock:
            self._current[host] = f"{role} / {operation}" if role else operation

    def op_done(
        self, host: str, play: str, role: str | None, result: Result, duration_s: float
    ) -> None:
        """Record, log and print (changes, failures, skips; all with verbose) one result."""
        task = TaskResult(
            play=play,
            role=role,
            operation=result.name,
            status=result.status,
            msg=result.msg,
            diff=result.diff,
            duration_s=round(duration_s, 6),
            data=result.data,
        )
        self._record(host, task)

    def host_unreachable(
        self,
        host: str,
        play: str,
        msg: str,
        role: str | None = None,
        operation: str = "connect",
    ) -> None:
        """The host could not be reached, or its link broke during ``role``'s ``operation``."""
        self._record(host, TaskResult(play, role, operation, Status.UNREACHABLE, msg))

    def host_error(self, host: str, play: str, role: str | None, msg: str) -> None:
        """A role or template error stopped the host (not an operation's result)."""
        self._record(host, TaskResult(play, role, "role", Status.FAILED, msg))

    def host_done(self, host: str, outcome: Outcome) -> None:
        """The host's thread is done with a play: how its part ended, so far."""
        with self._lock:
            self._current.pop(host, None)
            self._host(host).outcome = outcome

    def run_done(self, *, interrupted: bool) -> None:
        """Every host thread has reported: the run's end, and one summary event per host."""
        with self._lock:
            self.results.interrupted = interrupted
            self.results.end()
            for host in self.results.hosts.values():
                self._write({"event": "summary", **host.summary()})

    def note(self, msg: str, style: str = "bold") -> None:
        with self._lock:
            self._print(Text(self.redact(msg), style=style))

    def traceback(self, exc: BaseException) -> None:
        """Print the traceback of a bug (in fxkit or an operation), redacted like the rest."""
        text = "".join(traceback.format_exception(exc))
        with self._lock:
            self._print(Text(self.redact(text), style="dim"))

    def _record(self, host: str, task: TaskResult) -> None:
        with self._lock:
            record = self._host(host)
            task = self._redacted(task)
            record.tasks.append(task)
            self._write({"event": "task", "host": record.name, **asdict(task)})
            if task.status is not Status.OK or self.verbose:
                self._print(*self._lines(record.name, task))

    def _host(self, name: str) -> HostResult:
        return self.results.host(self.redact(name))

    def _write(self, event: dict[str, Any]) -> None:
        if self._log:
            self._log.write(json.dumps(event, default=str) + "\n")
            self._log.flush()

    def _redacted(self, task: TaskResult) -> TaskResult:
        return replace(
            task,
            play=self.redact(task.play),
            role=task.role and self.redact(task.role),
            operation=self.redact(task.operation),
            msg=self.redact(task.msg),
            diff=task.diff and self.redact(task.diff),
            data=self.masker.data(task.data),
        )

    def _lines(self, host: str, task: TaskResult) -> list[RenderableType]:
        where = " | ".join(p for p in (host, task.role, task.operation) if p)
        line = Text.assemble((f"{task.status:<11} ", STYLE.get(task.status, "")), where)
        if task.msg:
            line.append(f"  {task.msg}", style="dim")
        out: list[RenderableType] = [line]
        if self.show_diff and task.diff:
            out.append(_diff_text(task.diff))
        return out

    # -- the end ---------------------------------------------------------------------------

    def recap(self) -> None:
        """The per-host table (ok, changed, failed, skipped, unreachable), then the final notes:
        the hosts an interruption stopped, and check mode."""
        table = Table(title="RECAP", title_justify="left", title_style="bold")
        table.add_column("host")
        for column in asdict(Counts()):
            table.add_column(column, justify="right")
        with self._lock:
            for host in self.results.hosts.values():
                cells = [
                    Text(str(n), style=STYLE[Status(name)] if n else "dim")
                    for name, n in asdict(host.counts).items()
                ]
                table.add_row(Text(host.name, style=_host_style(host)), *cells)
            self.console.print(table)
            stopped = self.results.hosts_with(Outcome.INTERRUPTED)
            if self.results.interrupted:
                which = f": {', '.join(stopped)} did not finish" if stopped else ""
                self.note(f"interrupted (Ctrl-C){which}", style="bold red")
            if self.results.check:
                self.note("check mode: nothing was changed", style="dim")


def _host_style(host: HostResult) -> str:
    if host.outcome in (Outcome.UNREACHABLE, Outcome.FAILED, Outcome.INTERRUPTED):
        return STYLE[host.outcome]
    return STYLE[Status.CHANGED] if host.counts.changed else STYLE[Status.OK]


def _diff_text(diff: str) -> Text:
    text = Text()
    for number, line in enumerate(diff.rstrip("\n").splitlines()):
        style = "green" if line.startswith("+") else "red" if line.startswith("-") else "dim"
        text.append(("\n" if number else "") + "    " + line, style=style)
    return text
