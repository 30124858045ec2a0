"""``fxkit rollout`` and its role talk through a typed contract (:mod:`fxkit.engine.serving`):
a role that breaks it is refused when it loads, naming the role and what it lacks; the plan
asks the role for its instances with its typed ``Vars``; how each instance went is read from the
typed reports of the instance operations (:mod:`fxkit.ops.instances`), as the results and the
JSON log hold them. The runs on real hosts are tests/test_rollout_lab.py and
tests/test_rollout_vllm_lab.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from test_runner import write

from fxkit.cli import cli
from fxkit.engine.playbook import Playbook
from fxkit.engine.record import HostResult, Outcome, PlaybookResult, Recorder, TaskResult
from fxkit.engine.role import RoleLoader
from fxkit.engine.runner import Runner, RunOptions
from fxkit.errors import PlaybookError
from fxkit.inventory import Inventory
from fxkit.ops.base import Status
from fxkit.ops.instances import InstanceReady, InstanceReport, InstanceStarted
from fxkit.rollout import Instance, _read, batches, plan, rollout

SERVING = """
from pydantic import Field

from fxkit.engine.rolevars import RoleVars, Whole
from fxkit.engine.serving import SimpleInstance

SELECT = "svc_instances"


class Vars(RoleVars):
    svc_count: Whole = Field(1, ge=1, description="instances per host")
    svc_instances: list[str] | None = Field(None, description="the instances a run acts on")


def instance_specs(v: Vars) -> list[SimpleInstance]:
    assert type(v).__name__ == "Vars", v  # typed, not the host's untyped variables
    return [
        SimpleInstance(f"i{n}", f"svc@i{n}.service", (n,), 9000 + n, "m")
        for n in range(v.svc_count)
    ]


def apply(host, v: Vars) -> None:
    pass
"""


@pytest.mark.parametrize(
    ("source", "says"),
    [
        ("def instance_specs(v):\n    return []\n", "no Vars; no SELECT"),
        (
            SERVING.replace('SELECT = "svc_instances"', 'SELECT = "svc_chosen"'),
            "SELECT names 'svc_chosen', which its Vars does not declare",
        ),
        (
            SERVING.replace("def instance_specs(v: Vars)", "def instance_specs(host, v: Vars)"),
            "instance_specs is not a function of one argument (v)",
        ),
        (
            SERVING.replace("def instance_specs(v: Vars)", "def instance_spec(v: Vars)"),
            "no instance_specs(v)",
        ),
        (SERVING.replace('SELECT = "svc_instances"', "SELECT = 1"), "SELECT is 1, not a variable"),
    ],
)
def test_a_role_that_breaks_the_serving_contract_is_refused_when_it_loads(
    tmp_path: Path, source: str, says: str
) -> None:
    write(tmp_path, {"roles/svc/role.py": source + "\n\ndef apply(host, v):\n    pass\n"})
    with pytest.raises(PlaybookError) as caught:
        RoleLoader([tmp_path / "roles"]).load("svc")
    assert caught.value.message.startswith("role svc defines ")
    assert "but is not a serving role as fxkit rollout needs one" in caught.value.message
    assert says in caught.value.message
    assert caught.value.where == str(tmp_path / "roles/svc/role.py")
    assert "instance_specs(v)" in (caught.value.hint or "")


def test_a_role_without_any_of_the_contract_is_no_serving_role(tmp_path: Path) -> None:
    write(
        tmp_path,
        {
            "site.yml": "- hosts: all\n  roles: [plain]\n",
            "hosts.yml": "all:\n  hosts:\n    h1: {}\n",
            "roles/plain/role.py": "def apply(host, v):\n    pass\n",
        },
    )
    assert RoleLoader([tmp_path / "roles"]).load("plain").serving is None
    with pytest.raises(PlaybookError) as caught:
        rollout(tmp_path / "site.yml", tmp_path / "hosts.yml", RunOptions(), Recorder())
    assert caught.value.message == (
        f"no play of {tmp_path / 'site.yml'} has a serving role (roles: plain)"
    )
    assert "instance_specs(v), SELECT and Vars" in (caught.value.hint or "")


def test_the_plan_asks_the_role_for_its_instances_with_its_typed_vars(tmp_path: Path) -> None:
    write(
        tmp_path,
        {
            "site.yml": "- hosts: all\n  roles: [svc]\n",
            "hosts.yml": "all:\n  hosts:\n    h1: {svc_count: '2'}\n    h2: {}\n",
            "roles/svc/role.py": SERVING,
        },
    )
    runner = Runner(
        Playbook.load(tmp_path / "site.yml"),
        Inventory.load(tmp_path / "hosts.yml"),
        RunOptions(),
        Recorder(),
    )
    _, role, instances = plan(runner)
    assert role.SELECT == "svc_instances"
    assert [(i.key, i.unit, i.gpus, i.port) for i in instances] == [
        ("h1/i0", "svc@i0.service", [0], 9000),
        ("h2/i0", "svc@i0.service", [0], 9000),
        ("h1/i1", "svc@i1.service", [1], 9001),
    ]


def task(status: Status, msg: str, data: dict[str, object]) -> TaskResult:
    """A task as the run's results hold it: its data as the JSON log writes it."""
    return TaskResult("rollout", "svc", "instance", status, msg, data=json.loads(json.dumps(data)))


def test_the_rollout_reads_each_instance_from_the_typed_reports_of_its_operations() -> None:
    started = InstanceStarted(
        unit="svc@i0.service", backend="direct", restarted=True, started_at=1.5, pid=42
    )
    ready = InstanceReady(
        unit="svc@i0.service",
        backend="direct",
        time_to_ready_s=12.5,
        load_s=3.25,
        load_source="metrics",
    )
    same = InstanceStarted(unit="svc@i1.service", backend="systemd", restarted=False)
    dead = InstanceReport(unit="svc@i2.service")
    tasks = [
        task(Status.CHANGED, "started svc@i0.service", started.data()),
        task(Status.OK, "env file", {"path": "/etc/svc/i1.env"}),  # not an instance operation's
        task(Status.OK, "serves m", ready.data()),
        task(Status.OK, "runs as configured", same.data()),
        task(Status.OK, "serves m", {**ready.data(), "unit": "svc@i1.service", "load_s": None}),
        task(
            Status.FAILED, "svc@i2.service stopped before it was ready", {**dead.data(), "seen": ""}
        ),
    ]
    results = PlaybookResult(hosts={"h1": HostResult("h1", Outcome.FAILED, tasks)})
    group = [Instance("h1", f"i{n}", f"svc@i{n}.service", [n], 9000 + n, "m") for n in range(3)]
    _read(results, group)
    fresh, unchanged, failed = group
    assert (fresh.status, fresh.restarted, fresh.load_s, fresh.time_to_ready_s) == (
        "ready",
        True,
        3.25,
        12.5,
    )
    assert fresh.msg == "serves m"
    assert (unchanged.status, unchanged.restarted, unchanged.load_s) == ("unchanged", False, None)
    assert unchanged.time_to_ready_s is None  # it was not started by this run
    assert (failed.status, failed.msg) == (
        "failed",
        "svc@i2.service stopped before it was ready",
    )


def test_a_report_reads_back_only_as_its_own_kind() -> None:
    started = InstanceStarted(unit="u@a.service", backend="systemd", restarted=True).data()
    assert started == {"unit": "u@a.service", "backend": "systemd", "restarted": True}
    assert InstanceStarted.read(started) == InstanceStarted(
        unit="u@a.service", backend="systemd", restarted=True
    )
    assert InstanceReady.read(started) is None
    assert InstanceReport.read({"rc": 0}) is None
    assert InstanceReport.read({**started, "rc": 1}) == InstanceReport(unit="u@a.service")


def test_a_node_limit_cuts_a_batch_that_takes_too_many_of_one_host(tmp_path: Path) -> None:
    write(
        tmp_path,
        {
            "site.yml": "- hosts: all\n  serial: 4\n  roles: [svc]\n",
            "hosts.yml": "all:\n  hosts:\n    h1: {svc_count: '3'}\n    h2: {svc_count: '3'}\n",
            "roles/svc/role.py": SERVING,
        },
    )
    book = Playbook.load(tmp_path / "site.yml")
    runner = Runner(book, Inventory.load(tmp_path / "hosts.yml"), RunOptions(), Recorder())
    play, _, instances = plan(runner)
    keys = [[i.key for i in group] for group in batches(play, instances, canary=False)]
    assert keys == [["h1/i0", "h2/i0", "h1/i1", "h2/i1"], ["h1/i2", "h2/i2"]]
    per_node = [[i.key for i in g] for g in batches(play, instances, False, per_node=1)]
    assert per_node == [["h1/i0", "h2/i0"], ["h1/i1", "h2/i1"], ["h1/i2", "h2/i2"]]
    canary = [[i.key for i in g] for g in batches(play, instances, True, per_node=1)]
    assert canary == [["h1/i0"], ["h2/i0", "h1/i1"], ["h2/i1", "h1/i2"], ["h2/i2"]]


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["--surge-memory-reserve", "nan", "--max-surge", "1"], "not a number of GiB"),
        (["--surge-memory-reserve", "inf", "--max-surge", "1"], "is not in the range"),
        (["--surge-memory-reserve", "5"], "--surge-memory-reserve needs --max-surge N"),
        (["undo", "--surge-memory-reserve", "5"], "--surge-memory-reserve needs --max-surge N"),
    ],
)
def test_a_surge_memory_reserve_is_a_number_and_needs_surge(
    tmp_path: Path, args: list[str], error: str
) -> None:
    (tmp_path / "hosts.yml").write_text("all:\n  hosts:\n    h1:\n")
    result = CliRunner().invoke(cli, ["rollout", *args, "-i", str(tmp_path / "hosts.yml")])
    assert result.exit_code == 2 and error in result.output, result.output
