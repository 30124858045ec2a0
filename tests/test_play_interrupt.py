"""Ctrl-C during ``fxkit play`` over real SSH (issue 8): the real executable in its own process,
lab hosts running commands that wait for the test, SIGINT sent to it as a terminal's Ctrl-C does.

Before the fix, a second Ctrl-C left host threads running past the recap: their connections
closed under them, they reported "unreachable" after the RECAP (or not at all: the JSON log was
closed by then), and the recap missed them.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import yaml
from sync_helpers import SAFETY, Pause, Transcript

pytestmark = pytest.mark.lab

FXKIT = Path(sys.executable).with_name("fxkit")
COLUMNS = ("ok", "changed", "failed", "skipped", "unreachable")
SLOW_ROLE = """\
def apply(host, v):
    host.command("true", changed_when=False)
    host.command(v.slow, changed_when=False)  # tells the test it runs, then waits for it
    host.command("true", changed_when=False)
"""
#: What ``fxkit play`` prints once it has acted on a first Ctrl-C.
STOPPING = "interrupted: hosts stop after their current operation"


def play_and_interrupt(
    fleet, tmp_path: Path, presses: int, forks: int = 50
) -> tuple[int, str, list[dict]]:
    """Run the slow role; once every started host is in its slow command, press Ctrl-C
    ``presses`` times, the second once fxkit has acted on the first. After one press the slow
    commands are let go; after two, only once fxkit has ended. Returns rc, output, JSON events."""
    (tmp_path / "roles/slow").mkdir(parents=True, exist_ok=True)
    (tmp_path / "roles/slow/role.py").write_text(SLOW_ROLE)
    (tmp_path / "slow.yml").write_text("- hosts: lab\n  roles: [slow]\n")
    log = tmp_path / "events.json"
    started = sorted(fleet.hosts)[: min(forks, len(fleet.hosts))]  # the others wait their turn
    with contextlib.ExitStack() as stack:
        conns = [stack.enter_context(fleet.connect(name)) for name in started]
        pauses = [Pause(conn) for conn in conns]
        slow = {name: pause.reach for name, pause in zip(started, pauses, strict=True)}
        inventory = tmp_path / "inventory.yml"
        inventory.write_text(with_host_var(fleet, "slow", slow))
        proc = subprocess.Popen(
            [str(FXKIT), "play", str(tmp_path / "slow.yml"), "-i", str(inventory),
             "--log-json", str(log), "--forks", str(forks)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env={**os.environ, "COLUMNS": "160"},
        )  # fmt: skip
        output = Transcript().follow(proc.stdout)
        try:
            for pause in pauses:
                pause.wait()
            proc.send_signal(signal.SIGINT)
            output.wait_for(STOPPING)  # acted on: the next press is another one
            if presses == 2:
                proc.send_signal(signal.SIGINT)  # the slow commands wait on till the end
            else:
                for pause in pauses:
                    pause.release()
            proc.wait(SAFETY)
        finally:
            if proc.poll() is None:
                proc.kill()
            for pause in pauses:
                pause.release()
    return proc.returncode, output.text(), read_events(log)


def with_host_var(fleet, name: str, values: dict[str, str]) -> str:
    """The fleet's inventory, with a variable of some of its hosts (the others get "true")."""
    data = yaml.safe_load(fleet.inventory.read_text())
    for host, hostvars in data["all"]["children"]["lab"]["hosts"].items():
        hostvars[name] = values.get(host, "true")
    return yaml.safe_dump(data)


def read_events(log: Path) -> list[dict]:
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines() if line.endswith("}")]


def recap(output: str) -> dict[str, dict[str, int]]:
    rows = {}
    for line in output[output.index("RECAP") :].splitlines():
        cells = [c.strip() for c in re.split(r"[│|]", line) if c.strip()]
        if len(cells) == 6 and cells[1].isdigit():
            rows[cells[0]] = dict(zip(COLUMNS, map(int, cells[1:]), strict=True))
    return rows


def after_recap(output: str) -> list[str]:
    """What was printed after the RECAP's table."""
    return output[output.index("RECAP") :].split("┘", 1)[1].strip().splitlines()


def check_recap_matches_the_log(output: str, events: list[dict], hosts: list[str]) -> None:
    tasks = [e for e in events if e.get("event", "task") == "task"]
    found = Counter((e["host"], e["status"]) for e in tasks)
    counted = {h: {c: found[h, c] for c in COLUMNS} for h in hosts}
    assert output.count("RECAP") == 1, output
    assert recap(output) == counted, output
    summaries = {e["host"]: e for e in events if e.get("event") == "summary"}
    assert list(summaries) == hosts, "the log ends with one summary per host"
    assert events[-len(hosts) :] == list(summaries.values())
    assert {h: {c: summaries[h][c] for c in COLUMNS} for h in hosts} == counted


@pytest.mark.parametrize("forks", [50, 1])
def test_a_double_ctrl_c_cuts_off_the_hosts_and_the_recap_comes_once_after_them(
    lab_fleet, tmp_path: Path, forks: int
) -> None:
    fleet = lab_fleet(3, name="interrupt")
    hosts = ["lab01", "lab02", "lab03"]
    code, output, events = play_and_interrupt(fleet, tmp_path, 2, forks)
    assert code == 130, output  # it ended while the slow commands still waited
    assert "Traceback" not in output and not re.search(r"^unreachable ", output, re.M), output
    check_recap_matches_the_log(output, events, hosts)
    assert after_recap(output) == [f"interrupted (Ctrl-C): {', '.join(hosts)} did not finish"]
    assert {e["host"]: e["outcome"] for e in events if e["event"] == "summary"} == dict.fromkeys(
        hosts, "interrupted"
    )


def test_one_ctrl_c_lets_the_running_commands_finish_then_hosts_stop(
    lab_fleet, tmp_path: Path
) -> None:
    fleet = lab_fleet(3, name="interrupt")
    hosts = ["lab01", "lab02", "lab03"]
    code, output, events = play_and_interrupt(fleet, tmp_path, 1)
    assert code == 130, output
    check_recap_matches_the_log(output, events, hosts)
    # Each host's slow command finished and was reported; the "true" after it never ran.
    assert recap(output) == {h: dict(ok=2, changed=0, failed=0, skipped=0, unreachable=0)
                             for h in hosts}  # fmt: skip
    assert after_recap(output) == [f"interrupted (Ctrl-C): {', '.join(hosts)} did not finish"]
