"""``fxkit rollout undo [--to REVISION]``: the whole deployment back to an earlier revision, in
batches, by the rollout's rules (drain and hooks, ``max_fail_percentage``, rollback of a failed
batch, and with ``--max-surge`` a copy on free GPUs that serves while the instance is replaced).

Each instance starts again exactly as it ran on that revision: the run kept on its host when
the revision was replaced or became ready (:func:`fxkit.rollout.rollback.keep`). Without
``--to`` the revision is the newest one the first host keeps runs of, other than the one its
instances run.
The variables still want the newer revision: ``fxkit rollout status`` shows the difference, and
the next ``fxkit rollout`` brings it back.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path

from fxkit.engine.record import Recorder
from fxkit.engine.runner import RunOptions, interruptible
from fxkit.errors import FxkitError, PlaybookError, masked_errors
from fxkit.ops.systemd import systemd_missing
from fxkit.rollout import batches, folders, instances_of, planner, serving_hosts
from fxkit.rollout.batches import Batches
from fxkit.rollout.report import Hooks, Instance, InstanceStatus, Rollout
from fxkit.rollout.rollback import Previous, load, moved, restore
from fxkit.rollout.state import HostHistory, InstanceState, gather
from fxkit.rollout.surge import Surge
from fxkit.rollout.swap import Swap


@dataclass
class UndoBatches(Batches):
    """Batches that start each instance as its target revision ran, instead of a playbook."""

    #: The run each changing instance of the batch returns to (by its key).
    runs: dict[str, Previous] = field(default_factory=dict)

    def batch(self, number: int, count: int, group: list[Instance], order: list[str]) -> str | None:
        """Read the target's run of each changing instance first: one its host keeps no run
        for fails, untouched (neither drained nor given a copy), and counts against
        ``max_fail_percentage`` as any failure does."""
        assert self.drain is not None
        swap, rest = self.drain, []
        for item in group:
            if swap.changing(item):
                ctx = swap.context(item.host)
                state = swap.before[item.key]
                run = load(ctx.conn, ctx.become, swap.folders[item.host], state.wanted, item.name)
                if run is None or not (run.files or systemd_missing(ctx)):
                    item.status = InstanceStatus.FAILED
                    item.msg = f"{item.host} keeps no run of {state.wanted} for {item.name}"
                    if run is not None:  # under systemd a run needs its files
                        item.msg += " with its unit and environment file (kept by an earlier fxkit)"
                    continue
                self.runs[item.key] = run
            rest.append(item)
        stopped = super().batch(number, count, rest, order) if rest else None
        if stopped or len(rest) == len(group):
            return stopped
        stopped = self.judge(number, count, group)
        return stopped + self.undo(rest, False) if stopped else None

    def start_copies(self, copies: list[Instance]) -> None:
        """Start the surge copies as the target revision ran, and await them."""
        assert self.surge is not None
        beside = {c.unit: key for key, c in self.surge.copies.items()}
        for copy in copies:
            spec = self.surge.specs[copy.unit]
            kept = self.runs.get(beside.get(copy.unit, ""))
            run = Previous(spec.argv, spec.env, kept.files if kept else {})
            self.restart(copy, moved(run, copy.unit, spec.env_file))

    def step(self, number: int, count: int, group: list[Instance], order: list[str]) -> bool:
        assert self.drain is not None
        swap = self.drain
        self.recorder.note(f"batch {number}/{count}: {', '.join(i.key for i in group)}")
        for item in group:
            if swap.changing(item):
                self.restart(item, self.runs[item.key])
            else:
                item.status, item.revision = InstanceStatus.UNCHANGED, swap.before[item.key].running
        return False

    def restart(self, item: Instance, run: Previous) -> None:
        """Start ``item`` as ``run`` ran and await it: its status, message and time to ready."""
        assert self.drain is not None
        ctx = self.drain.context(item.host)
        done = restore(
            ctx.conn, ctx.become, item.unit, run, item.ready_url, item.served_name,
            self.drain.hooks.ready_timeout,
        )  # fmt: skip
        item.restarted = True
        item.status = InstanceStatus.FAILED if done.failed else InstanceStatus.READY
        item.msg = done.msg
        item.time_to_ready_s = done.data.get("time_to_ready_s")


def undo(
    playbook: str | Path,
    inventory: str | Path | Sequence[str | Path],
    options: RunOptions,
    recorder: Recorder,
    *,
    to: str | None = None,
    serial: list[int | str] | None = None,
    max_fail_percentage: float | None = None,
    hooks: Hooks | None = None,
    max_surge: int = 0,
    surge_memory_reserve: int = 0,
) -> Rollout:
    """Return every instance of the playbook's serving role to revision ``to`` (default: the
    previous one), batch by batch (see the module's docstring); with ``max_surge``, each
    instance's target revision started beside it first, as :mod:`fxkit.rollout.surge` does."""
    book, hosts, runner = planner(playbook, inventory, options, recorder)
    with masked_errors(runner.recorder.redact):
        play, role, hostvars = serving_hosts(runner)
        instances = instances_of(role, hostvars.values())
        states, histories = gather(runner, role, hostvars)
        if max_surge and not hasattr(role, "surge_copies"):
            raise PlaybookError(
                "--max-surge needs a serving role that defines surge_copies(v, specs)",
                hint="roles/vllm_lmcache does; or leave out --max-surge",
            )
    target = to or _previous(states, histories)
    before: dict[str, InstanceState] = {
        f"{s.host}/{s.name}": replace(s, wanted=target) for s in states
    }
    if serial is not None:
        play = play.model_copy(update={"serial": serial})
    limit = max_fail_percentage if max_fail_percentage is not None else play.max_fail_percentage
    result = Rollout(instances, started=datetime.now(UTC))
    groups = batches(play, instances, canary=False)
    result.batches = [[i.key for i in group] for group in groups]
    for number, group in enumerate(groups, 1):
        for item in group:
            item.batch, item.previous = number, before[item.key].running
    run = UndoBatches(book, hosts, options, recorder, limit or 0.0, role.SELECT)
    hooks = hooks or Hooks()
    run.drain = Swap(runner, hostvars, before, hooks, folders(role, hostvars))
    if max_surge:
        run.surge = Surge(
            runner, role, hostvars, before, hooks, max_surge, surge_memory_reserve, runs=run.runs
        )
    try:
        with interruptible():
            result.stopped = run.all(groups)
    except KeyboardInterrupt:
        result.stopped = "interrupted"
    result.interrupted = (result.stopped or "").startswith("interrupted")
    return result


def _previous(states: list[InstanceState], histories: Sequence[HostHistory]) -> str:
    """The newest revision the first host keeps runs of, other than those its instances run
    (a revision that never became ready has none)."""
    for history in histories:
        running = {s.running for s in states if s.host == history.host}
        for kept in history.kept:
            if kept.runs and kept.revision not in running:
                return kept.revision
    raise FxkitError(
        "no earlier revision is kept on the hosts",
        hint="fxkit rollout history lists what each host keeps; give --to REVISION",
    )
