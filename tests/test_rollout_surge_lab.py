"""Surge on lab hosts that serve traffic (2 hosts x 2 serve-probe instances of 4 GPUs each,
roles/vllm_lmcache, the fleet and checkpoint of tests/test_rollout_vllm_lab.py, the balancer,
client and hooks of tests/test_rollout_replace_lab.py).

lab01 has 12 GPUs (4 free beside its layout's 8: room for one copy), lab02 has 8 (no room).
An upgrade with ``--max-surge 1 --serial 1``: each of lab01's instances gets a copy on the new
revision on GPUs 8-11 and port 8002, in the balancer before the instance is drained and
replaced in its slot, retired after; lab02's instances fall back to draining first. Checked:
the PIDs, revisions and ports of the instances, the copies gone afterwards (no record, no
environment file, nothing on port 8002), and the client's 0 failed requests. Then ``fxkit
rollout undo --max-surge 1``: the same, back to the first revision, each copy started as that
revision ran. Last, surge with a memory reserve larger than the nodes have: no copy, each
instance drained first, the report saying why.
"""

from __future__ import annotations

import re
from pathlib import Path
from shlex import quote
from typing import Any

import pytest
import yaml
from test_rollout_replace_lab import run_rollout, serving, status, stop_traffic, variant
from test_rollout_vllm_lab import HOSTS, rows
from test_rollout_vllm_lab import lab as lab  # the module's fixture: its fleet and checkpoint

pytestmark = pytest.mark.lab


def with_gpus(path: Path, **gpus: int) -> Path:
    """The inventory at ``path`` with each host's GPU count."""
    data = yaml.safe_load(path.read_text())
    hosts = data["all"]["children"]["gpu_nodes"]["hosts"]
    for host, count in gpus.items():
        hosts[host] = {**(hosts.get(host) or {}), "vllm_lmcache_gpus": count}
    path.write_text(yaml.safe_dump(data))
    return path


def copies_left(fx: dict[str, Any], host: str) -> str:
    """What is left of surge copies on ``host``: records, environment and unit files, a
    listener."""
    address = fx["fleet"].address(host)
    listening = f"import socket; socket.create_connection(({address!r}, 8002), 1)"
    with fx["fleet"].connect(host) as conn:
        done = conn.run(
            "ls /var/lib/fxkit/instances/ /etc/fxkit/*/ /etc/systemd/system/ 2>/dev/null "
            "| grep -- -surge; "
            f"python3 -c {quote(listening)} 2>/dev/null && echo 'port 8002 answers'; true"
        )
    return done.stdout.strip()


@pytest.mark.timeout(2400)
def test_upgrade_with_surge_and_fallback(lab: dict[str, Any]) -> None:
    before = serving(lab, with_gpus(variant(lab, "surge-base.yml"), lab01=12, lab02=8))
    [r1] = {s["running"] for s in before.values()}
    try:
        new = with_gpus(
            variant(lab, "surge-new.yml", vllm_lmcache_unit_options={"Nice": "4"}),
            lab01=12,
            lab02=8,
        )
        code, out, report = run_rollout(lab, new, "--serial", "1", "--max-surge", "1")
        assert code == 0, out
        found = rows(report)
        assert {r["status"] for r in found.values()} == {"ready"}, out
        assert all(r["previous"] == r1 and r["drained"] for r in found.values()), found
        for name in ("tp4-0", "tp4-1"):
            assert (
                found[f"lab01/{name}"]["surge"] == f"{name}-surge (port 8002, GPUs [8, 9, 10, 11])"
            )
            assert found[f"lab02/{name}"]["surge"] == "", found  # no room: drained first
        # One playbook run per batch (its revision prepared); the copy and the instance are
        # both started on that revision, without a run of their own.
        assert out.count(" (its revision): ") == len(report["batches"]), out
        assert "surge copies lab01/tp4-0-surge" in out, out
        after = status(lab, new)
        [r2] = {s["running"] for s in after.values()}
        assert r2 != r1 and all(s["health"] == "ready" for s in after.values()), after
        assert {r["revision"] for r in found.values()} == {r2}
        assert all(after[k]["pid"] != before[k]["pid"] for k in before)
        assert {k: s["port"] for k, s in after.items()} == {k: s["port"] for k, s in before.items()}
        for host in HOSTS:
            assert copies_left(lab, host) == "", host

        # Undo with surge: lab01's instances each served by a copy of r1 (its kept run, on the
        # copy's GPUs and port) while they return to r1; lab02's drained first.
        code, out, report = run_rollout(lab, new, "--serial", "1", "--max-surge", "1", what="undo")
        assert code == 0, out
        found = rows(report)
        assert {r["status"] for r in found.values()} == {"ready"}, out
        assert {r["revision"] for r in found.values()} == {r1}
        assert all(r["previous"] == r2 and r["drained"] for r in found.values()), found
        for name in ("tp4-0", "tp4-1"):
            assert found[f"lab01/{name}"]["surge"].startswith(f"{name}-surge (port 8002"), found
            assert found[f"lab02/{name}"]["surge"] == "", found
        assert "surge copies lab01/tp4-0-surge" in out and "lab01/tp4-0-surge: ready" in out, out
        undone = status(lab, new)
        assert {s["running"] for s in undone.values()} == {r1}
        assert all(s["health"] == "ready" for s in undone.values()), undone
        assert all(undone[k]["pid"] != after[k]["pid"] for k in after)
        assert {k: s["port"] for k, s in undone.items()} == {k: s["port"] for k, s in after.items()}
        for host in HOSTS:
            assert copies_left(lab, host) == "", host

        # Undo to a revision no host keeps a run of: every instance fails, untouched.
        code, out, report = run_rollout(
            lab, new, "--serial", "4", "--max-surge", "1", "--to", "r-000000000000", what="undo"
        )
        assert code == 1, out
        found = rows(report)
        assert {r["status"] for r in found.values()} == {"failed"}, out
        assert all("keeps no run of r-000000000000" in r["msg"] for r in found.values()), found
        assert "4 of 4 instances failed" in report["stopped"], report["stopped"]
        assert {k: s["pid"] for k, s in status(lab, new).items()} == {
            k: s["pid"] for k, s in undone.items()
        }

        # A node keeps a memory reserve larger than it has: lab01's instances get no copy and
        # are drained first, and the report says why (lab02's: no free GPUs), with what the
        # instance holds (its processes' RssAnon, read on the host) as the copy's need.
        code, out, report = run_rollout(
            lab, new, "--serial", "2", "--max-surge", "1", "--surge-memory-reserve", "100000"
        )
        assert code == 0, out
        found = rows(report)
        assert {r["status"] for r in found.values()} == {"ready"}, out
        assert {r["surge"] for r in found.values()} == {""}, found
        assert all(r["drained"] for r in found.values()), found
        for name in ("tp4-0", "tp4-1"):
            why = found[f"lab01/{name}"]["no_surge"]
            need = re.match(r"no room in lab01's memory: its copy needs ([0-9.]+) GiB", why)
            assert need and float(need[1]) > 0 and "reserve of 100000.00 GiB" in why, why
            assert found[f"lab02/{name}"]["no_surge"].startswith("no free GPUs"), found
        assert "no surge copy for lab01/tp4-0: no room in lab01's memory" in out, out
        assert {s["running"] for s in status(lab, new).values()} == {r2}
    finally:
        traffic = stop_traffic(lab)
    for host, counts in traffic.items():
        assert counts["sent"] > 100, (host, counts)
        assert counts["failed"] == 0, (host, counts["failures"])
