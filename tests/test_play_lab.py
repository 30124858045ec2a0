"""``fxkit play`` over real SSH against the lab fleet (issue 3, "Tests against the lab").

The example playbook (playbooks/site.yml, role node_base at its real paths: a lab host's /etc,
/opt, /srv and /var are overlays) converges, re-runs with no change and changes nothing in check
mode; hosts down before or lost during a run; host keys; ``serial`` with
``max_fail_percentage``; secrets. Runs go through the real ``fxkit`` executable (subprocess) or
click's CliRunner, and are judged from the JSON event log and the printed recap.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from sync_helpers import SAFETY, Meeting

from fxkit.cli import cli
from fxkit.lab import Fleet

pytestmark = pytest.mark.lab

FXKIT = Path(sys.executable).with_name("fxkit")
#: What a lab host may change (overlays), listed with mode, owner, size, mtime and ctime;
#: a write of the same bytes or a chmod to the same mode still moves ctime (a write to a shared
#: lower file copies it up: a new inode of its own, with nlink 1).
TREES = "/etc /opt /srv /var/lib"
#: Small enough to hash every file.
HASHED = "/etc /srv"
#: Operations of node_base that change a fresh host (its sysctl is only persisted: /proc/sys
#: of a lab host is read-only).
NODE_BASE_CHANGES = 9


@dataclass
class Run:
    code: int
    output: str
    events: list[dict]

    def counts(self, status: str) -> dict[str, int]:
        found = Counter(e["host"] for e in self.events if e["status"] == status)
        return {host: found[host] for host in self.hosts}

    @property
    def hosts(self) -> list[str]:
        return sorted({e["host"] for e in self.events})

    def recap(self) -> dict[str, dict[str, int]]:
        """The printed RECAP table: host -> {ok, changed, failed, skipped, unreachable}."""
        rows = {}
        columns = ("ok", "changed", "failed", "skipped", "unreachable")
        tail = self.output[self.output.rindex("RECAP") :]
        for line in tail.splitlines():
            cells = [c.strip() for c in re.split(r"[│|]", line) if c.strip()]
            if len(cells) == 6 and cells[1].isdigit():
                rows[cells[0]] = dict(zip(columns, map(int, cells[1:]), strict=True))
        return rows

    def recap_from_events(self) -> dict[str, dict[str, int]]:
        columns = ("ok", "changed", "failed", "skipped", "unreachable")
        return {
            host: {c: sum(1 for e in self.events if e["host"] == host and e["status"] == c)
                   for c in columns}
            for host in self.hosts
        }  # fmt: skip


def fxkit_play(playbook: str | Path, inventory: Path, log: Path, *args: str, **kw) -> Run:
    """``fxkit play`` as a user runs it: the real executable, in its own process."""
    log.unlink(missing_ok=True)
    proc = subprocess.run(
        [str(FXKIT), "play", str(playbook), "-i", str(inventory), "--log-json", str(log), *args],
        capture_output=True,
        text=True,
        timeout=kw.pop("timeout", 120),
        env={**os.environ, "COLUMNS": "160"},
        **kw,
    )
    return Run(proc.returncode, proc.stdout + proc.stderr, task_events(log))


def cli_play(playbook: str | Path, inventory: Path, log: Path, *args: str) -> Run:
    """``fxkit play`` in this process (click's CliRunner): quicker, same code path."""
    log.unlink(missing_ok=True)
    result = CliRunner().invoke(
        cli,
        ["play", str(playbook), "-i", str(inventory), "--log-json", str(log), *args],
        catch_exceptions=False,
        terminal_width=160,
    )
    return Run(result.exit_code, result.output, task_events(log))


def task_events(log: Path) -> list[dict]:
    """The JSON log's operation events (the summary events after them are left out)."""
    if not log.exists():
        return []
    events = [json.loads(line) for line in log.read_text().splitlines()]
    return [e for e in events if e["event"] == "task"]


def snapshot(fleet: Fleet, host: str) -> str:
    """A host's file trees: every entry's metadata, and a sha256 of each small file."""
    with fleet.connect(host) as conn:
        result = conn.run(
            # Files hard-linked from this machine (the fleet's base layer, nlink > 1) share
            # their inode, whose ctime moves when any fleet links it again: no ctime for them.
            f"find {TREES} -xdev \\( -type d -o -links 1 \\) "
            "-printf '%p %y %m %u %g %s %T@ %C@ %l\\n' "
            "-o -printf '%p %y %m %u %g %s %T@ shared %l\\n' | LC_ALL=C sort; "
            f"find {HASHED} -xdev -type f -exec sha256sum {{}} + | LC_ALL=C sort"
        )
    assert result.ok, result.stderr
    return result.stdout


def write_inventory(fleet: Fleet, path: Path, **common: object) -> Path:
    """The fleet's inventory with some variables changed (None removes one)."""
    inventory = yaml.safe_load(fleet.inventory.read_text())
    group_vars = inventory["all"]["vars"]
    group_vars.update(common)
    inventory["all"]["vars"] = {k: v for k, v in group_vars.items() if v is not None}
    lab = inventory["all"]["children"]["lab"]  # its vars (fxkit_lab) win over all's
    lab["vars"] = {k: v for k, v in lab.get("vars", {}).items() if k not in common}
    path.write_text(yaml.safe_dump(inventory))
    return path


def write_role(folder: Path, name: str, code: str) -> None:
    (folder / "roles" / name).mkdir(parents=True, exist_ok=True)
    (folder / "roles" / name / "role.py").write_text(code)


# -- the example playbook ---------------------------------------------------------------------


def test_site_check_changes_nothing_then_converges_then_reruns_with_no_change(
    lab_fleet, tmp_path: Path
) -> None:
    fleet = lab_fleet(4, name="site")  # fresh hosts: nothing of node_base there yet
    hosts = ["lab01", "lab02", "lab03", "lab04"]
    log = tmp_path / "events.json"
    before = {h: snapshot(fleet, h) for h in hosts}
    assert all("/etc/fxkit " not in tree for tree in before.values())  # (fxkit-lab/ is the lab's)

    check = fxkit_play("playbooks/site.yml", fleet.inventory, log, "--check", "--diff")
    assert check.code == 0, check.output
    assert {h: snapshot(fleet, h) for h in hosts} == before  # not one byte, mode or ctime
    assert check.counts("changed") == dict.fromkeys(hosts, NODE_BASE_CHANGES)
    assert "+role: inference" in check.output  # the diff of node.yaml that would be written
    assert "check mode: nothing was changed" in check.output

    first = fxkit_play("playbooks/site.yml", fleet.inventory, log)
    assert first.code == 0, first.output
    assert first.counts("changed") == dict.fromkeys(hosts, NODE_BASE_CHANGES)
    assert first.recap() == first.recap_from_events()
    for host in hosts:
        with fleet.connect(host) as conn:
            node = conn.run("cat /etc/fxkit/node.yaml").stdout
            limits = conn.run("grep '^[*].*memlock' /etc/security/limits.conf").stdout
        assert f"name: {host}\n" in node and f"address: {fleet.address(host)}\n" in node
        assert limits == "*  soft  memlock  unlimited\n*  hard  memlock  unlimited\n"
    converged = {h: snapshot(fleet, h) for h in hosts}
    assert all(converged[h] != before[h] for h in hosts)  # the snapshot sees what a run writes

    second = fxkit_play("playbooks/site.yml", fleet.inventory, log)
    assert second.code == 0, second.output
    assert second.counts("changed") == dict.fromkeys(hosts, 0)
    assert second.counts("failed") == dict.fromkeys(hosts, 0)
    assert {h: r["changed"] for h, r in second.recap().items()} == dict.fromkeys(hosts, 0)
    assert {h: snapshot(fleet, h) for h in hosts} == converged  # a no-change run writes nothing


# -- hosts that go away -----------------------------------------------------------------------


def test_a_host_down_before_the_run_is_unreachable_and_the_others_finish(
    lab_fleet, tmp_path: Path
) -> None:
    fleet = lab_fleet(3, name="down-before")
    fleet.stop("lab02")
    run = cli_play(
        "site", fleet.inventory, tmp_path / "events.json",
        "--connect-timeout", "3", "--connect-retries", "0",
    )  # fmt: skip
    assert run.code == 1
    [down] = [e for e in run.events if e["host"] == "lab02"]
    assert (down["operation"], down["status"]) == ("connect", "unreachable")
    assert "cannot connect" in down["msg"]
    assert run.counts("changed") == {"lab01": NODE_BASE_CHANGES, "lab02": 0, "lab03": 9}
    assert run.recap() == run.recap_from_events()
    assert run.recap()["lab02"]["unreachable"] == 1
    fleet.up(3)


SLOW_ROLE = """\
def apply(host, v):
    if host.name == v.slow_host:
        # Tells the test it runs, then waits to be cut off (guarded: idempotent).
        host.command(v.slow_command, creates="/srv/slow-done")
"""


def test_a_host_lost_in_the_middle_of_the_run(lab_fleet, tmp_path: Path) -> None:
    fleet = lab_fleet(4, name="lost")
    book = tmp_path / "lost.yml"
    book.write_text("- hosts: lab\n  roles: [slow, node_base]\n")
    write_role(tmp_path, "slow", SLOW_ROLE)
    killed = threading.Event()
    conn = fleet.connect("lab03")
    meeting = Meeting(conn)

    def kill_when_slow_command_runs() -> None:
        meeting.wait()
        conn.close()
        fleet.stop("lab03")  # its sshd, by PID: the host and its sessions go with it
        killed.set()

    killer = threading.Thread(target=kill_when_slow_command_runs)
    killer.start()
    # Had the run waited for the lost host's command, it would end at its timeout (90 s), with
    # "timed out" (and not "connection lost") as what happened to lab03.
    slow = {"slow_host": "lab03", "slow_command": f"{meeting.reach} && sleep 3600"}
    run = fxkit_play(
        book, fleet.inventory, tmp_path / "events.json",
        "-e", json.dumps(slow), "--command-timeout", "90",
    )  # fmt: skip
    killer.join(SAFETY)
    assert killed.is_set()
    assert run.code == 1, run.output
    lost = [e for e in run.events if e["host"] == "lab03"]
    assert lost[-1]["status"] in ("unreachable", "failed"), lost
    assert "connection lost" in lost[-1]["msg"]
    assert lost[-1]["role"] == "slow" and lost[-1]["operation"].startswith("command echo")
    others = ["lab01", "lab02", "lab04"]
    assert {h: run.counts("changed")[h] for h in others} == dict.fromkeys(others, 9)
    assert {h: run.counts("failed")[h] + run.counts("unreachable")[h] for h in others} == {
        h: 0 for h in others
    }
    recap = run.recap()
    assert recap == run.recap_from_events()
    assert recap["lab03"]["changed"] == 0
    assert recap["lab03"]["unreachable"] + recap["lab03"]["failed"] == 1
    fleet.up(4)


# -- host keys --------------------------------------------------------------------------------


def test_a_changed_host_key_is_refused_even_with_accept_new(lab_fleet, tmp_path: Path) -> None:
    fleet = lab_fleet(2, name="hostkeys")
    forged = (
        Ed25519PrivateKey.generate()
        .public_key()
        .public_bytes(Encoding.OpenSSH, PublicFormat.OpenSSH)
        .decode()
    )
    known = tmp_path / "known_hosts"
    lines = fleet.known_hosts.read_text().splitlines()
    known.write_text(f"{fleet.address('lab01')} {forged}\n{lines[1]}\n")
    inventory = write_inventory(
        fleet, tmp_path / "inv.yml", ansible_ssh_common_args=f"-o UserKnownHostsFile={known}"
    )
    own = tmp_path / "own_known_hosts"
    for accept in ([], ["--accept-new-host-keys"]):
        run = cli_play(
            "site", inventory, tmp_path / "events.json",
            "--check", "--known-hosts", str(own), *accept,
        )  # fmt: skip
        assert run.code == 1
        [refused] = [e for e in run.events if e["host"] == "lab01"]
        assert refused["status"] == "unreachable"
        assert "CHANGED" in refused["msg"] and "CHANGED" in run.output
        assert run.counts("changed")["lab02"] == NODE_BASE_CHANGES  # the other host goes on
        assert not own.exists() or fleet.address("lab01") not in own.read_text()


def test_an_unknown_host_key_is_refused_unless_accepted(lab_fleet, tmp_path: Path) -> None:
    fleet = lab_fleet(2, name="hostkeys")
    inventory = write_inventory(fleet, tmp_path / "inv.yml", ansible_ssh_common_args=None)
    own = tmp_path / "own_known_hosts"
    log = tmp_path / "events.json"

    refused = cli_play("site", inventory, log, "--check", "--known-hosts", str(own))
    assert refused.code == 1
    assert refused.counts("unreachable") == {"lab01": 1, "lab02": 1}
    assert all("unknown ssh-ed25519 host key" in e["msg"] for e in refused.events)
    assert "--accept-new-host-keys" in refused.output
    assert not own.exists()

    accepted = cli_play(
        "site", inventory, log, "--check", "--known-hosts", str(own), "--accept-new-host-keys"
    )
    assert accepted.code == 0, accepted.output
    recorded = sorted(own.read_text().splitlines())
    assert recorded == sorted(fleet.known_hosts.read_text().splitlines())  # the real keys

    again = cli_play("site", inventory, log, "--check", "--known-hosts", str(own))
    assert again.code == 0, again.output  # known now, without the option


# -- serial and max_fail_percentage -----------------------------------------------------------

FLAKY_ROLE = """\
def apply(host, v):
    if host.name in v.fail_hosts:
        host.command("echo broken >&2; exit 3")
    host.directory("/srv/fxkit-serial")
"""


@pytest.mark.parametrize(
    ("max_fail", "batches_run"),
    [(40, 2), (50, 3)],  # 1 of 2 hosts failed in batch 2: 50% > 40% stops; 50% does not
)
def test_serial_batches_honour_max_fail_percentage(
    lab_fleet, tmp_path: Path, max_fail: int, batches_run: int
) -> None:
    fleet = lab_fleet(6, name="serial")
    book = tmp_path / "serial.yml"
    book.write_text(
        f"- hosts: lab\n  serial: 2\n  max_fail_percentage: {max_fail}\n  roles: [flaky]\n"
    )
    write_role(tmp_path, "flaky", FLAKY_ROLE)
    run = cli_play(
        book, fleet.inventory, tmp_path / "events.json", "-e", '{"fail_hosts": ["lab03"]}'
    )
    assert run.code == 1
    batches = [["lab01", "lab02"], ["lab03", "lab04"], ["lab05", "lab06"]]
    ran = [b for b in batches if any(e["host"] in b for e in run.events)]
    assert ran == batches[:batches_run]
    # Batch by batch: every event of a batch comes before any of the next one.
    order = [next(i for i, b in enumerate(batches) if e["host"] in b) for e in run.events]
    assert order == sorted(order)
    assert [e["host"] for e in run.events if e["status"] == "failed"] == ["lab03"]
    assert ("STOPPED" in run.output) == (batches_run < 3)
    recap = run.recap()
    assert recap == {**run.recap_from_events(), **{
        h: dict.fromkeys(("ok", "changed", "failed", "skipped", "unreachable"), 0)
        for b in batches[batches_run:] for h in b
    }}  # fmt: skip


# -- secrets ----------------------------------------------------------------------------------


def test_become_password_and_secret_variable_never_show(lab_fleet, tmp_path: Path) -> None:
    fleet = lab_fleet(2, name="secrets")
    password = fleet.become_password()
    if not password:
        pytest.skip("the lab hosts have no sudo user here (needs sudo and openssl)")
    inventory = write_inventory(
        fleet, tmp_path / "sudo.yml", ansible_user="fxkit", ansible_become=True
    )
    password_file = tmp_path / "become-password"
    password_file.write_text(password + "\n")
    secret = "s3cret-" + os.urandom(8).hex()
    book = tmp_path / "secret.yml"
    book.write_text("- hosts: lab\n  secret_vars: [node_role]\n  roles: [node_base]\n")
    log = tmp_path / "events.json"
    args = [
        "--become-password-file",
        str(password_file),
        "--diff",
        "-v",
        "-e",
        f"node_role={secret}",
    ]

    check = fxkit_play(book, inventory, log, "--check", *args)
    check_log = log.read_text()
    run = fxkit_play(book, inventory, log, *args)
    assert check.code == 0 and run.code == 0, check.output + run.output
    assert run.counts("changed") == {"lab01": 9, "lab02": 9}
    assert "+role: ********" in run.output  # the diff is shown, the value is not
    for text in (check.output, check_log, run.output, log.read_text()):
        assert password not in text
        assert secret not in text
    with fleet.connect("lab01") as conn:  # the host got the real value, written by root
        owner = conn.run("stat -c %U /etc/fxkit/node.yaml").stdout.strip()
        node = conn.run("cat /etc/fxkit/node.yaml").stdout
    assert owner == "root" and f"role: {secret}\n" in node
