"""The rollout's report: each instance's part in it, the fleet's, and the table shown."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

from rich.table import Table

from fxkit.rollout.drain import Hook


class InstanceStatus(StrEnum):
    """How an instance's part in the rollout went."""

    READY = "ready"  # started or restarted, and ready
    UNCHANGED = "unchanged"  # ran as configured: left as it was, ready
    FAILED = "failed"
    UNREACHABLE = "unreachable"
    NOT_RUN = "not_run"  # the rollout stopped before its batch
    WOULD_START = "would_start"  # check mode: it would be started or restarted
    ROLLED_BACK = "rolled_back"  # its batch failed: it runs its previous revision again


#: The statuses of an instance that failed: they count against ``max_fail_percentage``.
FAILURES = (InstanceStatus.FAILED, InstanceStatus.UNREACHABLE)


@dataclass
class Instance:
    """One instance of the rollout and how it went."""

    host: str
    name: str
    unit: str
    gpus: list[int]
    port: int
    served_name: str
    batch: int = 0
    status: InstanceStatus = InstanceStatus.NOT_RUN
    restarted: bool = False
    load_s: float | None = None
    time_to_ready_s: float | None = None
    msg: str = ""
    #: Where clients reach it (the host's ansible_host), and its readiness URL.
    address: str = ""
    ready_url: str = ""
    #: The revision it ran before the rollout and the one it runs after ("": none, or unknown).
    previous: str = ""
    revision: str = ""
    #: Seconds it took to drain once deregistered (None: not drained), and whether it did.
    drain_s: float | None = None
    drained: bool | None = None
    #: Seconds from its deregistration until it was registered again (None: it was not both).
    not_serving_s: float | None = None
    #: Seconds its register hook took, the end of ``not_serving_s`` (None: it had none).
    register_s: float | None = None
    #: Its surge copy while it was replaced ("": none, it was drained first): name, port, GPUs.
    surge: str = ""
    #: Why it had no surge copy though surge was on: no free GPUs, no room in memory, the
    #: node's copies at their limit ("": it had one, or surge was off, or it did not change).
    no_surge: str = ""

    @property
    def key(self) -> str:
        return f"{self.host}/{self.name}"


@dataclass(frozen=True)
class Hooks:
    """How an instance is replaced: the load balancer's hooks, how long a drain and a rollback
    may take, and the smoke request."""

    deregister: Hook | None = None
    register: Hook | None = None
    drain_timeout: float = 60.0
    #: Seconds an instance rolled back may take until it serves again.
    ready_timeout: float = 900.0
    #: A prompt each replaced instance must answer (``/v1/completions``) before it counts as
    #: ready ("": readiness is ``/v1/models`` alone).
    smoke_prompt: str = ""


@dataclass
class Rollout:
    """The whole rollout: every instance, the batches, why it stopped, the fleet's timing."""

    instances: list[Instance]
    batches: list[list[str]] = field(default_factory=list)
    check: bool = False
    stopped: str | None = None
    interrupted: bool = False
    started: datetime | None = None
    #: Seconds from the rollout's start until its last instance was ready; None unless all were.
    fleet_time_to_ready_s: float | None = None

    @property
    def exit_code(self) -> int:
        if self.interrupted:
            return 130
        ready = InstanceStatus.READY
        return 1 if self.stopped or any(i.status is not ready for i in self._acted()) else 0

    def _acted(self) -> list[Instance]:
        left = (InstanceStatus.UNCHANGED, InstanceStatus.WOULD_START)
        return [i for i in self.instances if i.status not in left]

    def to_json(self) -> dict[str, Any]:
        return {
            "check": self.check,
            "started": self.started.isoformat() if self.started else None,
            "stopped": self.stopped,
            "interrupted": self.interrupted,
            "exit_code": self.exit_code,
            "fleet_time_to_ready_s": self.fleet_time_to_ready_s,
            "batches": self.batches,
            "instances": [asdict(i) for i in self.instances],
        }


def table(result: Rollout) -> Table:
    """The report as a rich table: one row per instance, then the fleet's time to ready."""
    grid = Table(title="rollout", title_justify="left")
    for column in ("batch", "host", "instance", "GPUs", "port", "status", "load s", "ready s"):
        grid.add_column(column, justify="right" if column.endswith(" s") else "left")
    style = {
        InstanceStatus.READY: "green",
        InstanceStatus.UNCHANGED: "cyan",
        InstanceStatus.FAILED: "red",
        InstanceStatus.UNREACHABLE: "red",
    }
    for i in result.instances:
        grid.add_row(
            str(i.batch),
            i.host,
            i.name,
            ",".join(map(str, i.gpus)),
            str(i.port),
            f"[{style.get(i.status, 'yellow')}]{i.status}[/]",
            f"{i.load_s:.1f}" if i.load_s is not None else "-",
            f"{i.time_to_ready_s:.1f}" if i.time_to_ready_s is not None else "-",
        )
    if result.fleet_time_to_ready_s is not None:
        grid.caption = f"fleet time to ready: {result.fleet_time_to_ready_s:.1f} s"
        grid.caption_justify = "left"
    return grid
