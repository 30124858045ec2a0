"""``fxkit play`` over real SSH on the lab fleet: check mode, converge, idempotent re-run,
an unreachable host, and sudo with a password that never shows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from fxkit.cli import cli
from fxkit.lab import Fleet

pytestmark = pytest.mark.lab

MANAGED = "/etc/fxkit /opt/fxkit /etc/sysctl.d /etc/modules-load.d /etc/security"


def state(fleet: Fleet, host: str) -> str:
    """Every managed path on the host: name, mode, size, and each file's sha256."""
    with fleet.connect(host) as conn:
        result = conn.run(
            f"find {MANAGED} -printf '%p %m %s\\n' 2>/dev/null | sort; "
            f"find {MANAGED} -type f -exec sha256sum {{}} + 2>/dev/null | sort"
        )
    return result.stdout


def play(fleet: Fleet, tmp_path: Path, *args: str, inventory: Path | None = None):
    log = tmp_path / "events.json"
    log.unlink(missing_ok=True)
    result = CliRunner().invoke(
        cli,
        ["play", "site", "-i", str(inventory or fleet.inventory), "--log-json", str(log), *args],
        catch_exceptions=False,
    )
    events = [json.loads(line) for line in log.read_text().splitlines()]
    return result, events


def changed(events: list[dict]) -> dict[str, int]:
    out: dict[str, int] = {}
    for event in events:
        out[event["host"]] = out.get(event["host"], 0) + (event["status"] == "changed")
    return out


def test_check_converge_and_rerun_over_ssh(lab_fleet, tmp_path: Path) -> None:
    fleet = lab_fleet(3, name="runner-converge")
    hosts = ["lab01", "lab02", "lab03"]
    before = {h: state(fleet, h) for h in hosts}

    result, events = play(fleet, tmp_path, "--check", "--diff")
    assert result.exit_code == 0, result.output
    assert {h: state(fleet, h) for h in hosts} == before  # byte for byte
    assert changed(events) == dict.fromkeys(hosts, 9)

    result, events = play(fleet, tmp_path)
    assert result.exit_code == 0, result.output
    assert changed(events) == dict.fromkeys(hosts, 9)
    with fleet.connect("lab02") as conn:
        node = conn.run("cat /etc/fxkit/node.yaml").stdout
    assert "name: lab02\n" in node and f"address: {fleet.address('lab02')}\n" in node

    result, events = play(fleet, tmp_path)
    assert result.exit_code == 0
    assert changed(events) == dict.fromkeys(hosts, 0)


def test_an_unreachable_host_stops_only_itself(lab_fleet, tmp_path: Path) -> None:
    fleet = lab_fleet(3, name="runner-unreachable")
    fleet.stop("lab02")
    result, events = play(fleet, tmp_path, "--connect-timeout", "3", "--connect-retries", "0")
    assert result.exit_code == 1
    [down] = [e for e in events if e["host"] == "lab02"]
    assert down["status"] == "unreachable"
    assert changed(events) == {"lab01": 9, "lab02": 0, "lab03": 9}
    assert "unreachable" in result.output


def test_sudo_with_a_password_that_never_shows(lab_fleet, tmp_path: Path) -> None:
    fleet = lab_fleet(1, name="runner-sudo")
    password = fleet.become_password()
    if not password:
        pytest.skip("the lab hosts have no sudo user here (needs sudo and openssl)")
    inventory = yaml.safe_load(fleet.inventory.read_text())
    inventory["all"]["vars"].update(ansible_user="fxkit", ansible_become=True)
    path = tmp_path / "sudo.yml"
    path.write_text(yaml.safe_dump(inventory))
    secret_file = tmp_path / "become-password"
    secret_file.write_text(password + "\n")
    extra = ["--become-password-file", str(secret_file), "--diff", "-v"]
    result, _ = play(fleet, tmp_path, *extra, "-e", f"node_role={password}", inventory=path)
    assert result.exit_code == 0, result.output
    with fleet.connect("lab01") as conn:
        owner = conn.run("stat -c %U /etc/fxkit/node.yaml").stdout.strip()
        node = conn.run("cat /etc/fxkit/node.yaml").stdout
    assert owner == "root" and f"role: {password}\n" in node
    assert password not in result.output
    assert password not in (tmp_path / "events.json").read_text()
