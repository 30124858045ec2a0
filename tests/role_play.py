"""Running one role on a lab host, for the role tests: ``fxkit play`` in this process with the
fleet's own inventory and the test's variables, judged from the JSON log's task events; and a
snapshot of what the host holds, to prove check mode changed nothing."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import yaml

from fxkit.lab import Fleet

#: Where roles write (files) on a host; with the network state, what a snapshot compares.
TREES = "/etc /usr/local /var/lib"
#: IPv4 only: a fresh interface's IPv6 link-local address is "tentative" for a while (duplicate
#: address detection), which would change a snapshot that the roles did not.
NETWORK = "ip -br link; ip -4 -j addr; ip -j rule; ip -4 -j route show table all"


def snapshot(fleet: Fleet, host: str = "lab01") -> str:
    """The host's files under :data:`TREES` (path, type, mode, size, mtime and content digest)
    and its addresses, rules and routes."""
    with fleet.connect(host) as conn:
        # A stand-in's first run compiles the stand-ins' modules (__pycache__ in the host's
        # /usr/local overlay): run one before looking, so that only the role's changes show.
        result = conn.run(
            "rdma link >/dev/null 2>&1; "
            f"find {TREES} -xdev -printf '%p %y %m %s %T@\\n' | LC_ALL=C sort; "
            f"find {TREES} -xdev -type f -size -1M -exec sha256sum {{}} + | LC_ALL=C sort; "
            f"{NETWORK}"
        )
    assert result.ok, result.stderr
    return result.stdout


def play(
    folder: Path, fleet: Fleet, role: str, hostvars: dict[str, Any], *args: str
) -> tuple[int, list[dict[str, Any]]]:
    """``fxkit play`` of ``role`` on lab01 with ``hostvars`` in the lab group's vars: its exit
    code and the JSON log's task events."""
    from click.testing import CliRunner

    from fxkit.cli import cli

    inventory = yaml.safe_load(fleet.inventory.read_text())
    inventory["all"]["children"]["lab"].setdefault("vars", {}).update(hostvars)
    (folder / "inventory.yml").write_text(yaml.safe_dump(inventory))
    (folder / "site.yml").write_text(f"- hosts: all\n  roles: [{role}]\n")
    log = folder / "log.jsonl"
    log.unlink(missing_ok=True)
    where = ["-i", str(folder / "inventory.yml"), "-l", "lab01", "--log-json", str(log)]
    command = ["play", str(folder / "site.yml"), *where, *args]
    result = CliRunner().invoke(cli, command, catch_exceptions=False)
    lines = log.read_text().splitlines() if log.exists() else []
    events = [json.loads(line) for line in lines]
    return result.exit_code, [e for e in events if e["event"] == "task"]


def statuses(tasks: list[dict[str, Any]]) -> Counter[str]:
    return Counter(task["status"] for task in tasks)


def by_operation(tasks: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {task["operation"]: task for task in tasks}
