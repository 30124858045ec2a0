"""fxkit.api, the front door for Python: each job through it on this machine's real parts (the
local connection, the runner, the gate, the stager, the loader), and a docstring on every name
it offers."""

from __future__ import annotations

import inspect
import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from fxkit import api
from fxkit.engine.record import Outcome, PlaybookResult, TaskResult

SECRET = "tok-0xDEADBEEF"
LOCAL = (
    f"all:\n  hosts:\n    localhost:\n      ansible_connection: local\n      api_token: {SECRET}\n"
)
ROLE = (
    'def apply(host, v):\n    host.file(f"{v.dir}/hello.txt", content=f"token {v.api_token}\\n")\n'
)


class Seen(api.Listener):
    """A listener of one's own: what it was told."""

    def __init__(self) -> None:
        self.events: list[tuple[object, ...]] = []

    def play_started(self, name: str, hosts: list[str]) -> None:
        self.events.append(("play", name, hosts))

    def task(self, host: str, task: TaskResult) -> None:
        self.events.append(("task", host, task.operation, task.status, task.diff))

    def host_done(self, host: str, outcome: Outcome) -> None:
        self.events.append(("host done", host, outcome))

    def run_done(self, results: PlaybookResult) -> None:
        self.events.append(("run done", results.exit_code))


@pytest.fixture
def site(tmp_path: Path) -> Path:
    """A playbook of one role that writes a file with a secret in it, for localhost."""
    (tmp_path / "roles/hello").mkdir(parents=True)
    (tmp_path / "roles/hello/role.py").write_text(ROLE)
    (tmp_path / "site.yml").write_text("- name: hello\n  hosts: all\n  roles: [hello]\n")
    (tmp_path / "hosts.yml").write_text(LOCAL)
    return tmp_path


def test_run_playbook_tells_a_listener_of_one_s_own_every_secret_masked(site: Path) -> None:
    seen = Seen()
    options = api.RunOptions(diff=True, extra_vars={"dir": str(site)})
    results = api.run_playbook(site / "site.yml", site / "hosts.yml", options, api.Recorder([seen]))
    assert results.exit_code == 0 and (site / "hello.txt").read_text() == f"token {SECRET}\n"
    [(_, _, operation, status, diff)] = [e for e in seen.events if e[0] == "task"]
    assert (operation, status) == (f"file {site}/hello.txt", "changed")
    assert "+token ********" in diff
    assert seen.events == [
        ("play", "hello", ["localhost"]),
        ("task", "localhost", operation, status, diff),
        ("host done", "localhost", Outcome.OK),
        ("run done", 0),
    ]
    assert SECRET not in repr(seen.events) and SECRET not in json.dumps(results.to_json())


def test_run_playbook_with_the_console_recorder_prints_and_logs_as_fxkit_play(site: Path) -> None:
    """The second run changes nothing; its recap and JSON log say so."""
    options = api.RunOptions(extra_vars={"dir": str(site)})
    api.run_playbook(site / "site.yml", site / "hosts.yml", options, api.Recorder())
    out, log = io.StringIO(), io.StringIO()
    recorder = api.console_recorder(Console(file=out, width=120), verbose=True, log_json=log)
    results = api.run_playbook(site / "site.yml", site / "hosts.yml", options, recorder)
    assert results.hosts["localhost"].outcome is Outcome.OK and results.counts.changed == 0
    assert "PLAY hello (1 host)" in out.getvalue() and "RECAP" in out.getvalue()
    task, summary = [json.loads(line) for line in log.getvalue().splitlines()]
    assert task["event"] == "task" and task["status"] == "ok"
    counts = {"ok": 1, "changed": 0, "failed": 0, "skipped": 0, "unreachable": 0}
    assert summary == {"event": "summary", "host": "localhost", "outcome": "ok", **counts}


def test_run_gate_on_this_machine_writes_its_reports(tmp_path: Path) -> None:
    gate = tmp_path / "here.yml"
    gate.write_text(
        "gate: here\ntitle: This machine\nhosts: all\nchecks:\n"
        "  - id: cpus\n    title: CPUs\n    why: Some.\n"
        "    measure: {command: {run: 'grep -c ^processor /proc/cpuinfo', parse: number}}\n"
        "    rule: {'>=': 1}\n"
        "  - id: token\n    title: A token\n    why: A command given a secret.\n"
        "    measure: {command: {run: 'echo {{ api_token }}', parse: lines}}\n"
        "    rule: {'!=': []}\n"
    )
    (tmp_path / "hosts.yml").write_text(LOCAL)
    seen: list[tuple[str, str]] = []
    result = api.run_gate(
        gate,
        tmp_path / "hosts.yml",
        progress=lambda host, check: seen.append((host, check.id)),
        reports=tmp_path / "reports",
    )
    assert result.verdict == "PASS" and result.inventory == [str(tmp_path / "hosts.yml")]
    assert seen == [("localhost", "cpus"), ("localhost", "token")]
    written = sorted(p.name for p in (tmp_path / "reports").iterdir())
    assert "result.json" in written
    for name in written:
        assert SECRET not in (tmp_path / "reports" / name).read_text()


def test_stage_a_generated_checkpoint_then_load_it(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from safetensors.torch import load_file

    model = api.make_checkpoint(tmp_path / "nfs", 2_000_000, shards=2)
    with api.open_source(str(model)) as source:
        summary = api.stage(source, tmp_path / "fast", verify=True)
    files = sorted(p.name for p in model.iterdir())
    assert summary.copied == len(files) and sorted(summary.copied_files) == files
    checkpoint = api.open_checkpoint(tmp_path / "fast")
    tensors = api.load(checkpoint, threads=2)
    original = {k: v for f in sorted(model.glob("*.safetensors")) for k, v in load_file(f).items()}
    assert tensors.keys() == original.keys() and len(tensors) == len(checkpoint)
    assert all(torch.equal(tensors[name], original[name]) for name in original)


def test_every_name_of_the_api_has_a_docstring_and_the_module_an_example_per_job() -> None:
    for name in api.__all__:
        doc = inspect.getdoc(getattr(api, name)) or ""
        assert doc and not doc.startswith(f"{name}("), f"{name} has no docstring"
    for job in ("run_playbook(", "run_gate(", "rollout(", "stage(", "load("):
        assert job in (api.__doc__ or ""), job
