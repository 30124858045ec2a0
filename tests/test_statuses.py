"""Each status vocabulary is one enum, and what result files and logs keep is its value, as it
always was: an operation's and a task's (ops.Status), a host's outcome in a run (Outcome), a gate
check's (CheckStatus) and a rollout instance's (InstanceStatus)."""

from __future__ import annotations

import json
from dataclasses import fields
from enum import StrEnum

import pytest

from fxkit.engine.record import Counts, Outcome, PlaybookResult, TaskResult
from fxkit.gate.verdicts import CheckStatus
from fxkit.ops.base import Status
from fxkit.rollout import Instance, InstanceStatus, Rollout

#: Every vocabulary and the values written in result files, JSON logs and reports.
VALUES: dict[type[StrEnum], list[str]] = {
    Status: ["ok", "changed", "failed", "skipped", "unreachable"],
    Outcome: ["not_run", "ok", "failed", "unreachable", "interrupted"],
    CheckStatus: ["PASS", "FAIL", "WARN", "ERROR", "SKIP"],
    InstanceStatus: [
        "ready",
        "unchanged",
        "failed",
        "unreachable",
        "not_run",
        "would_start",
        "rolled_back",
    ],
}


@pytest.mark.parametrize("vocabulary", list(VALUES), ids=lambda v: v.__name__)
def test_every_status_is_written_as_it_always_was_and_reads_back(vocabulary):
    assert [member.value for member in vocabulary] == VALUES[vocabulary]
    for member in vocabulary:
        written = json.dumps({"status": member, member: 1})
        assert written == f'{{"status": "{member.value}", "{member.value}": 1}}'
        assert vocabulary(json.loads(written)["status"]) is member


def test_the_recap_has_a_column_per_task_status():
    assert [f.name for f in fields(Counts)] == [s.value for s in Status]


def test_a_run_counts_its_tasks_by_status_in_its_json():
    results = PlaybookResult()
    for status in Status:
        results.host("h1").tasks.append(TaskResult("play", None, "op", status))
    results.host("h2").tasks.append(TaskResult("play", "role", "op", Status.CHANGED))
    data = json.loads(json.dumps(results.to_json()))
    assert data["counts"] == {"ok": 1, "changed": 2, "failed": 1, "skipped": 1, "unreachable": 1}
    tasks = data["hosts"]["h1"]["tasks"]
    assert [Status(t["status"]) for t in tasks] == list(Status)
    assert results.hosts["h2"].counts == Counts(changed=1)


def test_a_rollout_report_keeps_each_instance_status():
    instances = [Instance("h1", f"i{n}", "u", [0], 8000 + n, "m") for n in range(2)]
    instances[0].status = InstanceStatus.READY
    report = json.loads(json.dumps(Rollout(instances).to_json()))
    statuses = [InstanceStatus(i["status"]) for i in report["instances"]]
    assert statuses == [InstanceStatus.READY, InstanceStatus.NOT_RUN]
