"""``fxkit rollout`` on real lab hosts, with a small role whose instances are the stand-in
server of tests/test_ops_lab_instances.py (the end-to-end run with roles/vllm_lmcache and the
probe is tests/test_rollout_vllm_lab.py): batches across hosts (canary first), readiness and
load times in the report, a re-run that restarts nothing, and a failing instance that stops
its batch while the instances of earlier batches, and the later ones, keep running.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml
from test_ops_lab_instances import SERVER
from test_play_lab import FXKIT, write_role

pytestmark = pytest.mark.lab

ROLE = f"""
from pydantic import Field

from fxkit.engine.rolevars import RoleVars
from fxkit.engine.serving import SimpleInstance

SERVER = {SERVER!r}
SELECT = "fake_serve_instances"


class Vars(RoleVars):
    model: str = Field(description="what the instances serve")
    crash: str = Field("", description="a model folder the server fails on")
    fake_serve_instances: list[str] | None = Field(None, description="the instances a run acts on")


def instance_specs(v: Vars) -> list[SimpleInstance]:
    return [
        SimpleInstance(f"i{{n}}", f"fxserve@i{{n}}.service", (2 * n, 2 * n + 1), 18200 + n, v.model)
        for n in range(2)
    ]


def apply(host, v: Vars) -> None:
    chosen = v.fake_serve_instances
    specs = [s for s in instance_specs(v) if chosen is None or f"{{v.host}}/{{s.name}}" in chosen]
    for s in specs:
        env = {{"MODEL": v.model, "PORT": str(s.port)}}
        if v.crash:
            env["CRASH"] = v.crash
        host.instance(s.unit, ["python3", "-c", SERVER], env)
    for s in specs:
        host.instance_ready(s.unit, f"http://127.0.0.1:{{s.port}}/v1/models", s.served_name,
                            timeout=60)
"""
PLAYBOOK = "- hosts: gpu_nodes\n  roles: [fake_serve]\n"


def inventory(fleet, path: Path, **host_vars: dict) -> Path:
    data = yaml.safe_load(fleet.inventory.read_text())
    data["all"]["vars"] = {**data["all"].get("vars", {}), "model": "m1"}
    lab = data["all"]["children"]["lab"]
    data["all"]["children"]["gpu_nodes"] = {
        "hosts": {h: host_vars.get(h, {}) for h in lab["hosts"]}
    }
    path.write_text(yaml.safe_dump(data))
    return path


def rollout(folder: Path, inv: Path, *args: str) -> tuple[int, str, dict]:
    report = folder / "report.json"
    report.unlink(missing_ok=True)
    proc = subprocess.run(
        [
            str(FXKIT),
            "rollout",
            str(folder / "rollout.yml"),
            "-i",
            str(inv),
            "--report",
            str(report),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "COLUMNS": "160"},
    )
    return proc.returncode, proc.stdout + proc.stderr, json.loads(report.read_text())


def pids(fleet, host: str) -> dict[str, int]:
    with fleet.connect(host) as conn:
        out = conn.run("cat /var/lib/fxkit/instances/*.json").stdout
    return {
        f"{host}/{i}": json.loads(line)["pid"]
        for i, line in zip(("i0", "i1"), out.splitlines(), strict=True)
    }


def test_rollout_in_batches_then_rerun_then_a_failure_stops_it(lab_fleet, tmp_path: Path) -> None:
    fleet = lab_fleet(2, name="rollout")
    write_role(tmp_path, "fake_serve", ROLE)
    (tmp_path / "rollout.yml").write_text(PLAYBOOK)
    inv = inventory(fleet, tmp_path / "inventory.yml")

    code, out, report = rollout(tmp_path, inv, "--canary", "--serial", "2")
    assert code == 0, out
    assert report["batches"] == [["lab01/i0"], ["lab02/i0", "lab01/i1"], ["lab02/i1"]]
    rows = {f"{i['host']}/{i['name']}": i for i in report["instances"]}
    assert {r["status"] for r in rows.values()} == {"ready"}
    for row in rows.values():
        assert row["restarted"] and 0 < row["time_to_ready_s"] < 60
        assert row["load_s"] == 0.731  # the server's own log line
    assert rows["lab01/i1"]["gpus"] == [2, 3] and rows["lab01/i1"]["port"] == 18201
    assert report["fleet_time_to_ready_s"] >= max(r["time_to_ready_s"] for r in rows.values())
    assert "fleet time to ready" in out and "lab02" in out
    running = {**pids(fleet, "lab01"), **pids(fleet, "lab02")}

    code, out, report = rollout(tmp_path, inv, "--serial", "1")
    assert code == 0, out
    assert {i["status"] for i in report["instances"]} == {"unchanged"}
    assert {**pids(fleet, "lab01"), **pids(fleet, "lab02")} == running

    bad = inventory(fleet, tmp_path / "bad.yml", lab02={"crash": "/models/missing"})
    code, out, report = rollout(tmp_path, bad, "--serial", "1")
    assert code == 1
    rows = {f"{i['host']}/{i['name']}": i for i in report["instances"]}
    assert rows["lab01/i0"]["status"] == "unchanged"
    assert rows["lab02/i0"]["status"] == "failed"
    assert "no safetensors files in /models/missing" in rows["lab02/i0"]["msg"]
    assert rows["lab02/i1"]["status"] == "not_run"
    assert report["stopped"].startswith("batch 2/4: 1 of 1 instances failed")
    assert "STOPPED" in out
    # The instances of other batches were left alone.
    now = {**pids(fleet, "lab01"), **pids(fleet, "lab02")}
    assert now["lab01/i0"] == running["lab01/i0"] and now["lab02/i1"] == running["lab02/i1"]
