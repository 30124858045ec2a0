"""What a run shows: live progress, one line per change or failure, diffs, and the recap. The
:class:`Reporter` is a listener of the run's :class:`~fxkit.engine.record.Recorder`, which
redacts every text before it comes here, so the values of secret variables (see
:mod:`fxkit.redaction`) never reach the terminal.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import IO, Self

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from fxkit.engine.jsonlog import JsonLog
from fxkit.engine.record import (
    Counts,
    HostResult,
    Listener,
    Outcome,
    PlaybookResult,
    Recorder,
    TaskResult,
)
from fxkit.ops.base import Status

STYLE = {
    Status.OK: "green",
    Status.CHANGED: "yellow",
    Status.FAILED: "bold red",
    Status.SKIPPED: "cyan",
    Status.UNREACHABLE: "bold magenta",
    Outcome.INTERRUPTED: "bold red",
}


def console_recorder(
    console: Console | None = None,
    *,
    diff: bool = False,
    verbose: bool = False,
    log_json: IO[str] | None = None,
) -> Recorder:
    """A recorder that shows the run on ``console`` (the terminal by default) as ``fxkit play``
    does, and writes its JSON event log to ``log_json`` (``--log-json``), if given."""
    reporter = Reporter(console, diff=diff, verbose=verbose)
    return Recorder([reporter, JsonLog(log_json)] if log_json else [reporter])


class Reporter(Listener):
    """The run on the terminal: what each busy host does (live, on a terminal), a line per
    change, failure or skip (every task with ``verbose``), diffs with ``diff``, the recap."""

    def __init__(
        self, console: Console | None = None, *, diff: bool = False, verbose: bool = False
    ):
        self.console = console or Console(highlight=False, soft_wrap=True)
        self.show_diff = diff
        self.verbose = verbose
        self._current: dict[str, str] = {}
        self._live: Live | None = None

    # -- live progress ---------------------------------------------------------------------

    def __enter__(self) -> Self:
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
        # printing under the recorder's lock can never wait on a refresh that waits on it.
        table = Table.grid(padding=(0, 2))
        for host, doing in dict(self._current).items():
            table.add_row(Text(host, style="bold"), Text(doing, style="dim"))
        return table

    def _print(self, *renderables: RenderableType) -> None:
        self.console.print(Group(*renderables))

    # -- what the recorder tells -----------------------------------------------------------

    def play_started(self, name: str, hosts: list[str]) -> None:
        count = f"{len(hosts)} host{'s' if len(hosts) != 1 else ''}"
        self._print(Text(f"\nPLAY {name} ({count})", style="bold"))

    def op_started(self, host: str, doing: str) -> None:
        self._current[host] = doing

    def task(self, host: str, task: TaskResult) -> None:
        """Changes, failures, skips (all with verbose)."""
        if task.status is not Status.OK or self.verbose:
            self._print(*self._lines(host, task))

    def host_done(self, host: str, outcome: Outcome) -> None:
        self._current.pop(host, None)

    def note(self, msg: str, style: str = "bold") -> None:
        self._print(Text(msg, style=style))

    def traceback(self, text: str) -> None:
        self._print(Text(text, style="dim"))

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

    def recap(self, results: PlaybookResult) -> None:
        """The per-host table (ok, changed, failed, skipped, unreachable), then the final notes:
        the hosts an interruption stopped, and check mode."""
        table = Table(title="RECAP", title_justify="left", title_style="bold")
        table.add_column("host")
        for column in asdict(Counts()):
            table.add_column(column, justify="right")
        for host in results.hosts.values():
            cells = [
                Text(str(n), style=STYLE[Status(name)] if n else "dim")
                for name, n in asdict(host.counts).items()
            ]
            table.add_row(Text(host.name, style=_host_style(host)), *cells)
        self.console.print(table)
        stopped = results.hosts_with(Outcome.INTERRUPTED)
        if results.interrupted:
            which = f": {', '.join(stopped)} did not finish" if stopped else ""
            self.note(f"interrupted (Ctrl-C){which}", style="bold red")
        if results.check:
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
