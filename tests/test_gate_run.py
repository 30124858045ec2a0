"""``fxkit gate FILE`` and ``fxkit gate evaluate`` on real lab hosts, with a small gate of
``command`` checks: hosts measured at once, one measurement per kind and parameters, per-host
thresholds from the inventory, SKIP / WARN / FAIL / ERROR, an unreachable host, a secret that
reaches no results file, mistakes found before any host is touched, and re-evaluation against
edited thresholds without the hosts.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from sync_helpers import SAFETY, Meeting, Pause, Transcript
from test_play_lab import FXKIT

pytestmark = pytest.mark.lab

GATE = """\
gate: lab
title: Lab gate
hosts: lab
vars:
  min_cpus: 1
checks:
  - id: window
    title: A measurement window
    why: Both hosts are measured at the same time.
    measure: {command: {run: "date +%s.%N; sleep 1; date +%s.%N", parse: lines}}
    rule: {"!=": []}
  - id: cpus
    title: CPUs
    why: Enough CPUs for the host's work (the inventory says how many).
    measure: {command: {run: "grep -c ^processor /proc/cpuinfo", parse: number}}
    rule: {">=": "{{ min_cpus }}"}
    unit: CPUs
  - id: cpus_again
    title: CPUs, warned
    why: The same measurement, read again by a second check.
    measure: {command: {run: "grep -c ^processor /proc/cpuinfo", parse: number}}
    rule: {">=": 100000}
    severity: warning
  - id: token_free
    title: The token works
    why: A command given a secret.
    measure: {command: {run: "echo 'token {{ api_token }} ok' | wc -c", parse: number}}
    rule: {">": 0}
  - id: amd_smi
    title: amd-smi answers
    why: A missing tool is ERROR, never PASS.
    measure: {command: {run: "amd-smi list --json", parse: json, tool: amd-smi}}
    rule: {"==": 8}
  - id: only_on_gpus
    title: Skipped where there is no GPU
    why: Conditions are per host.
    when: "{{ has_gpus | default(false) }}"
    measure: {command: {run: "false"}}
    rule: {"==": 1}
"""


def inventory(fleet, path: Path, **extra_hosts: dict) -> Path:
    data = yaml.safe_load(fleet.inventory.read_text())
    lab = data["all"]["children"]["lab"]
    lab["hosts"]["lab02"] = {**lab["hosts"]["lab02"], "min_cpus": 100000}
    lab["hosts"].update(extra_hosts)
    data["all"]["vars"] = {**data["all"].get("vars", {}), "api_token": "s3cr3t-t0ken-91"}
    path.write_text(yaml.safe_dump(data))
    return path


#: The gate whose measurement window waits on each host's ``window_wait`` (a sync point).
WAITING_GATE = GATE.replace("sleep 1", "{{ window_wait | default('sleep 1') }}")


def windows_wait(inv: Path, commands: dict[str, str]) -> None:
    """Per host, what its measurement window waits on (``window_wait``)."""
    data = yaml.safe_load(inv.read_text())
    for host, command in commands.items():
        data["all"]["children"]["lab"]["hosts"][host]["window_wait"] = command
    inv.write_text(yaml.safe_dump(data))


def start_gate(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [str(FXKIT), "gate", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "COLUMNS": "200"},
    )


def gate(*args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(FXKIT), "gate", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "COLUMNS": "200"},
    )


def checks(result: dict, host: str) -> dict[str, dict]:
    return {c["id"]: c for c in result["hosts"][host]["checks"]}


def test_a_gate_on_lab_hosts_then_reevaluated(lab_fleet, tmp_path: Path) -> None:
    with contextlib.ExitStack() as stack:
        _a_gate_on_lab_hosts_then_reevaluated(lab_fleet(2, name="gate"), tmp_path, stack)


def _a_gate_on_lab_hosts_then_reevaluated(fleet, tmp_path: Path, stack) -> None:
    gate_file = tmp_path / "lab.yml"
    gate_file.write_text(WAITING_GATE)
    down = {"ansible_host": "127.0.0.1", "ansible_port": 9}  # nothing listens on port 9
    # Each host's window stays open until both are open (a Pause on each): proof of parallelism.
    pauses = {h: Pause(stack.enter_context(fleet.connect(h))) for h in ("lab01", "lab02")}
    inv = inventory(fleet, tmp_path / "inventory.yml", lab03=down)
    windows_wait(inv, {h: pause.reach for h, pause in pauses.items()})
    out = tmp_path / "run"

    running = start_gate(
        str(gate_file), "-i", str(inv), "--out", str(out), "--connect-retries", "0"
    )
    try:
        for pause in pauses.values():
            pause.wait()
    except AssertionError:
        running.kill()
        raise AssertionError(running.communicate()) from None
    for pause in pauses.values():
        pause.release()
    stdout, stderr = running.communicate(timeout=SAFETY)
    proc = subprocess.CompletedProcess(running.args, running.returncode, stdout, stderr)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    text = (out / "result.json").read_text()
    result = json.loads(text)
    assert result["schema"] == "fxkit-gate-result/1" and result["verdict"] == "FAIL"

    lab01, lab02, lab03 = (checks(result, h) for h in ("lab01", "lab02", "lab03"))
    assert lab01["cpus"]["status"] == "PASS" and lab01["cpus"]["rule"] == {">=": 1}
    assert lab02["cpus"]["status"] == "FAIL"  # its inventory asks for more
    assert lab02["cpus"]["rule"] == {">=": 100000}
    assert lab01["cpus_again"]["status"] == "WARN"
    # One measurement for both CPU checks.
    assert lab01["cpus"]["measurement"] == lab01["cpus_again"]["measurement"]
    assert len(result["hosts"]["lab01"]["measurements"]) == 4
    assert lab01["amd_smi"]["status"] == "ERROR"
    assert "amd-smi not found on lab01" in lab01["amd_smi"]["reason"]
    assert lab01["only_on_gpus"]["status"] == "SKIP"
    assert "is false" in lab01["only_on_gpus"]["reason"]
    assert {c["status"] for c in lab03.values()} == {"ERROR", "SKIP"}
    assert "unreachable" in lab03["cpus"]["reason"]
    assert result["hosts"]["lab03"]["unreachable"]
    assert result["hosts"]["lab01"]["verdict"] == "ERROR"  # amd-smi: ERROR, nothing FAILed

    # Both hosts were measured at once: their windows overlap.
    windows = [[float(t) for t in checks(result, h)["window"]["value"]] for h in ("lab01", "lab02")]
    assert max(w[0] for w in windows) < min(w[1] for w in windows)

    # The secret went to the host (the command printed its length) and nowhere else.
    assert lab01["token_free"]["value"] == len("token s3cr3t-t0ken-91 ok\n")
    assert "s3cr3t-t0ken-91" not in text + proc.stdout + proc.stderr
    assert "min_cpus" in result["hosts"]["lab02"]["vars"]

    # Re-evaluated against an edited threshold: no host is needed (the fleet is not asked).
    edited = tmp_path / "edited.yml"
    edited.write_text(GATE.replace('{">=": 100000}', '{">=": 1}'))
    again = tmp_path / "again"
    proc = gate(
        "evaluate",
        str(out / "result.json"),
        "--gate",
        str(edited),
        "--out",
        str(again),
        "-e",
        "min_cpus=1",
    )
    result2 = json.loads((again / "result.json").read_text())
    now01, now02 = checks(result2, "lab01"), checks(result2, "lab02")
    assert now01["cpus_again"]["status"] == "PASS" and now02["cpus"]["status"] == "PASS"
    assert now01["amd_smi"]["status"] == "ERROR"  # still: there is nothing to judge
    assert result2["reevaluated_from"] == str(out / "result.json")
    assert result2["gate_sha256"] != result["gate_sha256"]
    assert proc.returncode == 1  # lab01's amd-smi ERROR and lab03 stay


def test_mistakes_show_before_any_host_is_touched(lab_fleet, tmp_path: Path) -> None:
    fleet = lab_fleet(2, name="gate")
    gate_file = tmp_path / "bad.yml"
    gate_file.write_text(
        GATE.replace("{{ min_cpus }}", "{{ min_cpu }}").replace(
            "grep -c", "touch /tmp/touched; grep -c"
        )
    )
    proc = gate(str(gate_file), "-i", str(inventory(fleet, tmp_path / "inv.yml")))
    assert proc.returncode == 2
    assert "'min_cpu' is undefined" in proc.stderr or "min_cpu" in proc.stderr
    assert f"{gate_file}:12" in proc.stderr and "host lab01" in proc.stderr
    with fleet.connect("lab01") as conn:
        assert not conn.run("test -e /tmp/touched").ok


@pytest.mark.parametrize(
    ("old", "new", "line", "message"),
    [
        ("{{ min_cpus }}", "{{ min_cpus / 0 }}", 12, "ZeroDivisionError for host lab01"),
        ("{{ min_cpus }}", "{{ [min_cpus, 'a'] | sum }}", 12, "TypeError for host lab01"),
        ("{{ min_cpus }}", "{{ ''.__class__ }}", 12, "SecurityError for host lab01"),
        ("parse: lines}", "parse: regex, pattern: \"{{ '(' }}\"}", 7, "pattern is not a regex"),
        ("parse: lines}", 'parse: regex, pattern: "("}', 10, "command: pattern is not a regex"),
    ],
)
def test_a_rule_or_parameter_that_cannot_work_stops_the_gate_before_any_host(
    lab_fleet, tmp_path: Path, old: str, new: str, line: int, message: str
) -> None:
    fleet = lab_fleet(2, name="gate")
    gate_file = tmp_path / "bad.yml"
    gate_file.write_text(GATE.replace(old, new).replace("date +%s", "touch /tmp/touched; date"))
    out = tmp_path / "out"
    proc = gate(str(gate_file), "-i", str(inventory(fleet, tmp_path / "inv.yml")), "-o", str(out))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"{gate_file}:{line}" in proc.stderr and message in proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    assert not out.exists()
    for host in ("lab01", "lab02"):
        with fleet.connect(host) as conn:
            assert not conn.run("test -e /tmp/touched").ok


def test_a_number_that_is_not_finite_is_an_error_in_strict_json(lab_fleet, tmp_path) -> None:
    fleet = lab_fleet(2, name="gate")
    gate_file = tmp_path / "nan.yml"
    gate_file.write_text(GATE.replace("grep -c ^processor /proc/cpuinfo", "echo nan"))
    out = tmp_path / "out"
    proc = gate(str(gate_file), "-i", str(inventory(fleet, tmp_path / "inv.yml")), "-o", str(out))
    assert proc.returncode == 1, proc.stdout + proc.stderr

    def refuse(constant: str) -> None:
        raise ValueError(f"{constant} is not JSON")

    result = json.loads((out / "result.json").read_text(), parse_constant=refuse)
    cpus = checks(result, "lab01")["cpus_again"]  # {">=": 100000}: nan is not below it either
    assert cpus["status"] == "ERROR" and cpus["value"] == "NaN"
    assert "the measured value nan is not a finite number" in cpus["reason"]


def test_ctrl_c_reports_what_was_measured(lab_fleet, tmp_path: Path) -> None:
    fleet = lab_fleet(2, name="gate")
    gate_file = tmp_path / "slow.yml"
    gate_file.write_text(WAITING_GATE.replace("timeout: 600", ""))
    out = tmp_path / "out"
    with contextlib.ExitStack() as stack:
        meetings = [Meeting(stack.enter_context(fleet.connect(h))) for h in ("lab01", "lab02")]
        inv = inventory(fleet, tmp_path / "i.yml")
        windows_wait(inv, {f"lab0{i}": f"{m.reach}; sleep 60" for i, m in enumerate(meetings, 1)})
        proc = subprocess.Popen(
            [str(FXKIT), "gate", str(gate_file), "-i", str(inv), "--out", str(out)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, "COLUMNS": "200"},
        )
        try:
            for meeting in meetings:  # both hosts are in their 60 s window
                meeting.wait()
            output = Transcript().follow(proc.stdout)  # type: ignore[arg-type]
            proc.send_signal(signal.SIGINT)
            output.wait_for("Ctrl-C again")  # the first is taken: now the second
            proc.send_signal(signal.SIGINT)  # it cuts off the 60 s measurement
            proc.wait(SAFETY)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert proc.returncode == 130, output.text()
    result = json.loads((out / "result.json").read_text())
    assert result["interrupted"] is True
    for host in ("lab01", "lab02"):
        found = checks(result, host)
        assert "cut off" in found["window"]["reason"]
        assert "before it ran" in found["cpus"]["reason"]
        assert found["cpus"]["status"] == "ERROR"


def test_ctrl_c_twice_kills_the_running_measurements_on_the_hosts(
    lab_fleet, tmp_path: Path
) -> None:
    """A long measurement (fio in the field: here two sleeps, one in the background) cut off by
    a second Ctrl-C is killed on each host, with all it started: over SSH and on a local host."""
    fleet = lab_fleet(2, name="gate")
    token = f"{os.getpid()}{time.monotonic_ns() % 10**6}"
    run = f"sleep 601.{token}{{{{ marker }}}} & sleep 600.{token}{{{{ marker }}}}; wait"
    gate_file = tmp_path / "long.yml"
    gate_file.write_text(
        "gate: long\ntitle: A long measurement\nhosts: lab\nchecks:\n"
        "  - id: long\n    title: Runs for minutes\n    why: As fio does.\n"
        f"    measure: {{command: {{run: {json.dumps(run)}}}}}\n"
        '    rule: {"!=": ""}\n'
    )
    hosts = {"lab01": 1, "lab02": 2, "here": 3}
    inv = yaml.safe_load(fleet.inventory.read_text())
    lab = inv["all"]["children"]["lab"]["hosts"]
    lab["here"] = {"ansible_connection": "local"}
    for name, marker in hosts.items():
        lab[name]["marker"] = marker
    (tmp_path / "inv.yml").write_text(yaml.safe_dump(inv))

    def sleeps(name: str, *markers: int) -> list[str]:
        """The measurement's processes on host ``name`` (of ``markers``: its own)."""
        if name == "here":
            listing = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
        else:
            with fleet.connect(name) as conn:
                listing = conn.run("ps -eo args").stdout
        wanted = {f"sleep 60{i}.{token}{m}" for i in (0, 1) for m in markers or [hosts[name]]}
        return [p for p in listing.splitlines() if p.strip() in wanted]

    proc = subprocess.Popen(
        [str(FXKIT), "gate", str(gate_file), "-i", str(tmp_path / "inv.yml"),
         "--out", str(tmp_path / "out")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not all(len(sleeps(name)) >= 2 for name in hosts):  # every host measuring
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        proc.send_signal(signal.SIGINT)
        assert proc.stdout is not None
        for line in proc.stdout:  # the first Ctrl-C is taken: now the second
            if "Ctrl-C again" in line:
                break
        proc.send_signal(signal.SIGINT)
        rest = proc.communicate(timeout=60)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, rest
    for name in hosts:
        assert sleeps(name) == [], name
    assert sleeps("here", *hosts.values()) == []  # this machine sees the lab hosts' too
    result = json.loads((tmp_path / "out" / "result.json").read_text())
    for name in hosts:
        assert "cut off while it ran" in checks(result, name)["long"]["reason"]
