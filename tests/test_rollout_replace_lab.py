"""Replacing a revision on lab hosts that serve traffic (2 hosts x 2 serve-probe instances,
roles/vllm_lmcache, the fleet and checkpoint of tests/test_rollout_vllm_lab.py).

On each host bench/rollout_lb.py runs a round-robin balancer over the host's two instances and
a closed-loop client through it (lab hosts cannot reach each other, nor the controller their
instances); the rollout's hooks (bench/rollout_lb_hook.py) take an instance out of the balancer
before it is drained and replaced, and put it back once ready. Checked, each with the PIDs,
revisions and ports of the instances and the client's failed requests:

- an upgrade without surge (serial 1): every instance replaced, drained first, 0 failed;
- ``fxkit rollout undo``: every instance back on the previous revision, in batches, drained;
- a new revision that fails to start: its batch rolled back to the previous revision, the
  rollout stopped, later batches untouched, the report naming the instance's log lines;
- Ctrl-C inside a batch: every instance ends on exactly one revision, old or new, and serves.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_play_lab import FXKIT
from test_rollout_vllm_lab import HOSTS, TOKEN, inventory, pids, programs, rows
from test_rollout_vllm_lab import lab as lab  # the module's fixture: its fleet and checkpoint

pytestmark = pytest.mark.lab

BENCH = Path(__file__).resolve().parent.parent / "bench"
LB = "/root/lb"
ENV = {"HF_TOKEN": TOKEN, "PROBE_COMPLETION_SECONDS": "0.2"}


def variant(fx: dict[str, Any], name: str, **values: Any) -> Path:
    """The lab's inventory, every instance answering in 0.2 s, with more variables."""
    path = inventory(fx, name)
    data = yaml.safe_load(path.read_text())
    data["all"]["vars"].update({"vllm_lmcache_env": ENV, **values})
    path.write_text(yaml.safe_dump(data))
    return path


def hooks(inv: Path) -> list[str]:
    hook = f"{sys.executable} {BENCH / 'rollout_lb_hook.py'} -i {inv} --file {LB}/backends"
    return [
        "--deregister-hook", f"{hook} {{host}} {{address}}:{{port}}",
        "--register-hook", f"{hook} {{host}} {{address}}:{{port}}",
    ]  # fmt: skip


#: Runs a command with SIGINT ignored, as a shell starts a background job (`make test &`):
#: fxkit must honour Ctrl-C there too (fxkit.engine.runner.interruptible).
IGNORING_SIGINT = [
    sys.executable, "-c", "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); "
    "os.execv(sys.argv[1], sys.argv[1:])",
]  # fmt: skip


def rollout_cmd(fx: dict[str, Any], inv: Path, *args: str, what: str = "run") -> list[str]:
    report = fx["folder"] / "report.json"
    report.unlink(missing_ok=True)
    return [str(FXKIT), "rollout", what, str(fx["folder"] / "rollout.yml"), "-i", str(inv),
            "--report", str(report), *hooks(inv), *args]  # fmt: skip


def run_rollout(
    fx: dict[str, Any], inv: Path, *args: str, what: str = "run"
) -> tuple[int, str, dict[str, Any]]:
    proc = subprocess.run(
        rollout_cmd(fx, inv, *args, what=what), capture_output=True, text=True, timeout=1500,
        env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip
    return (
        proc.returncode,
        proc.stdout + proc.stderr,
        json.loads((fx["folder"] / "report.json").read_text()),
    )


def status(fx: dict[str, Any], inv: Path) -> dict[str, dict[str, Any]]:
    report = fx["folder"] / "status.json"
    subprocess.run(
        [str(FXKIT), "rollout", "status", str(fx["folder"] / "rollout.yml"), "-i", str(inv),
         "--report", str(report)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    return {f"{i['host']}/{i['name']}": i for i in json.loads(report.read_text())["instances"]}


def start_traffic(fx: dict[str, Any]) -> None:
    """The balancer over both instances and the client, on each host."""
    script = (BENCH / "rollout_lb.py").read_bytes()
    for host in HOSTS:
        address = fx["fleet"].address(host)
        with fx["fleet"].connect(host) as conn:
            conn.run(f"mkdir -p {LB} && rm -f {LB}/stop {LB}/client.json")
            conn.put(f"{LB}/rollout_lb.py", script)
            conn.put(f"{LB}/backends", f"{address}:8000\n{address}:8001\n".encode())
            lb = f"python3 {LB}/rollout_lb.py"
            started = conn.run(
                f"setsid {lb} proxy --listen 127.0.0.1:9000 --backends {LB}/backends "
                f"</dev/null >{LB}/proxy.log 2>&1 & echo $! > {LB}/proxy.pid; "
                f"sleep 0.5; setsid {lb} client --url http://127.0.0.1:9000 --model tiny "
                f"--workers 4 --stop {LB}/stop --out {LB}/client.json "
                f"</dev/null >{LB}/client.log 2>&1 &"
            )
            assert started.ok, started


def stop_traffic(fx: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Stop the clients; each host's counts. The balancers are left (stopped with the fleet)."""
    found = {}
    for host in HOSTS:
        with fx["fleet"].connect(host) as conn:
            conn.run(f"touch {LB}/stop")
            deadline = time.monotonic() + 60
            while (raw := conn.get(f"{LB}/client.json")) is None:
                assert time.monotonic() < deadline, conn.run(f"cat {LB}/client.log").stdout
                time.sleep(0.5)
            conn.run(f"kill $(cat {LB}/proxy.pid)")
        found[host] = json.loads(raw)
    return found


def serving(lab: dict[str, Any], inv: Path) -> dict[str, dict[str, Any]]:
    """The fleet rolled out as ``inv`` says, then under traffic: each instance's status."""
    code, out, _ = run_rollout(lab, inv, "--serial", "2")
    assert code == 0, out
    found = status(lab, inv)
    start_traffic(lab)
    return found


@pytest.mark.timeout(2400)
def test_replace_without_surge_rollback_and_ctrl_c(lab: dict[str, Any]) -> None:
    before = serving(lab, variant(lab, "base.yml"))
    [r1] = {s["running"] for s in before.values()}
    new_venv = ""
    try:
        # An upgrade without surge: one instance at a time, deregistered and drained first. The
        # new revision has another package: its own venv, made while the old one serves.
        old_programs = programs(lab)
        more = [*lab["vars"]["vllm_lmcache_packages"], "numpy"]
        new = variant(lab, "new.yml", vllm_lmcache_unit_options={"Nice": "5"},
                      vllm_lmcache_packages=more)  # fmt: skip
        # Check mode: each batch's whole run in check mode; nothing drained, switched or kept.
        code, out, report = run_rollout(lab, new, "--serial", "4", "--check", "--diff")
        assert code == 0, out
        assert {r["status"] for r in rows(report).values()} == {"would_start"}, out
        assert pids(lab) == {k: s["pid"] for k, s in before.items()}
        code, out, report = run_rollout(lab, new, "--serial", "1", "--smoke-prompt", "hello")
        assert code == 0, out
        found = rows(report)
        assert {r["status"] for r in found.values()} == {"ready"}, out
        assert all(r["drained"] and r["previous"] == r1 for r in found.values()), found
        # Out of the balancer from its deregistration to its registration: at least the drain
        # and the new instance's time to ready.
        assert all(
            r["not_serving_s"] >= r["drain_s"] + r["time_to_ready_s"] for r in found.values()
        ), found
        after = status(lab, new)
        [r2] = {s["running"] for s in after.values()}
        assert r2 != r1 and all(s["health"] == "ready" for s in after.values())
        assert all(after[k]["pid"] != before[k]["pid"] for k in before)
        assert {k: s["port"] for k, s in after.items()} == {k: s["port"] for k, s in before.items()}
        assert {r["revision"] for r in found.values()} == {r2}
        # Each instance runs from the new venv; the old one is kept for r1.
        new_programs = programs(lab)
        [old_venv] = {path.rsplit("/bin/", 1)[0] for path in old_programs.values()}
        [new_venv] = {path.rsplit("/bin/", 1)[0] for path in new_programs.values()}
        assert new_venv != old_venv and new_venv.startswith("/opt/fxkit/venvs/probe.venvs/v-")
        for host in HOSTS:
            with lab["fleet"].connect(host) as conn:
                assert conn.run(f"test -x {old_venv}/bin/fxkit").ok, host
        # Each batch's run prepared the revision before its instance was drained (one run per
        # batch); the instance's environment file was written under the revision's name.
        assert out.count(" (its revision): ") == len(report["batches"]), out
        for host in HOSTS:
            with lab["fleet"].connect(host) as conn:
                env = conn.run(f"cat /var/lib/fxkit/revisions/*/{r2}.env/tp4-0.env").stdout
            assert f"FXKIT_REVISION='{r2}'" in env, (host, env)

        # Undo: back to r1 (the previous revision), one instance at a time, drained first.
        code, out, report = run_rollout(lab, new, "--serial", "1", what="undo")
        assert code == 0, out
        found = rows(report)
        assert {r["status"] for r in found.values()} == {"ready"}, out
        assert {r["revision"] for r in found.values()} == {r1}
        assert all(r["drained"] and r["previous"] == r2 for r in found.values()), found
        undone = status(lab, new)
        assert {s["running"] for s in undone.values()} == {r1}  # the variables still want r2
        assert {s["wanted"] for s in undone.values()} == {r2}
        assert all(s["health"] == "ready" for s in undone.values())
        assert all(undone[k]["pid"] != after[k]["pid"] for k in after)
        assert {k: s["port"] for k, s in undone.items()} == {k: s["port"] for k, s in after.items()}
        assert programs(lab) == old_programs  # r1 runs from its own venv again

        # A revision that fails to start: the canary is rolled back, nothing else is touched.
        bad = variant(lab, "bad.yml", vllm_lmcache_model="/srv/fast/missing",
                      vllm_lmcache_model_source="")  # fmt: skip
        code, out, report = run_rollout(lab, bad, "--canary", "--serial", "2")
        assert code == 1, out
        found = rows(report)
        canary = found["lab01/tp4-0"]
        assert canary["status"] == "rolled_back", canary
        assert f"rolled back to {r1}" in canary["msg"] and "/srv/fast/missing" in canary["msg"]
        assert "last lines of its log" in canary["msg"]
        assert {found[k]["status"] for k in found if k != "lab01/tp4-0"} == {"not_run"}
        assert "rolled back: lab01/tp4-0 to " + r1 in report["stopped"], report["stopped"]
        now = status(lab, bad)
        assert {s["running"] for s in now.values()} == {r1}
        assert all(s["health"] == "ready" for s in now.values())
        assert now["lab01/tp4-0"]["pid"] != undone["lab01/tp4-0"]["pid"]
        assert {k: now[k]["pid"] for k in now if k != "lab01/tp4-0"} == {
            k: undone[k]["pid"] for k in undone if k != "lab01/tp4-0"
        }
        assert pids(lab) == {k: s["pid"] for k, s in now.items()}

        # Ctrl-C inside a batch: each instance on one revision, old or new, serving.
        third = variant(lab, "third.yml", vllm_lmcache_unit_options={"Nice": "6"})
        proc = subprocess.Popen(
            [*IGNORING_SIGINT, *rollout_cmd(lab, third, "--serial", "2")], stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True,
            env={**os.environ, "COLUMNS": "200", "PYTHONUNBUFFERED": "1"},
        )  # fmt: skip
        assert proc.stdout is not None
        for line in proc.stdout:
            if "batch 1/2: switching" in line:  # prepared, drained: now being replaced
                break
        time.sleep(0.5)  # inside the switch: its instances stop, start, are awaited
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=900)
        assert proc.returncode == 130, rest
        report = json.loads((lab["folder"] / "report.json").read_text())
        assert report["interrupted"] and report["stopped"].startswith("interrupted")
        ended = status(lab, third)
        revisions = {s["running"] for s in ended.values()}
        assert revisions <= {r1, ended["lab01/tp4-0"]["wanted"]} and "" not in revisions, ended
        assert all(s["health"] == "ready" and s["pid"] for s in ended.values()), ended
    finally:
        traffic = stop_traffic(lab)
        for host in HOSTS if new_venv else ():  # no instance runs from it now; the fleet is
            with lab["fleet"].connect(host) as conn:  # shared, and a third venv would not fit
                conn.run(f"rm -rf {new_venv}")
    for host, counts in traffic.items():
        assert counts["sent"] > 100, (host, counts)
        assert counts["failed"] == 0, (host, counts["failures"])
