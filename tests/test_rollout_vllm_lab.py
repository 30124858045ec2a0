"""The rollout end to end on 2 lab hosts x 2 instances: ``fxkit rollout`` with
playbooks/rollout.yml's role (vllm_lmcache), a generated checkpoint staged from an NFS stand-in
(a folder on each host) onto its fast store with ``fxkit stage``, and ``fxkit serve-probe`` as
the instances' server (vLLM cannot run here; the role's command is a variable). It checks the
batches (canary first), readiness and the report (load times from each instance's /metrics),
that a re-run restarts nothing, and that a bad model path fails its batch with the probe's own
message and stops the rollout, its batch rolled back to the revision it ran, the other instances
left running.

The virtualenvs come from the wheelhouse of tests/lab_wheelhouse.py; the fleet is the one
tests/test_role_vllm_lmcache_lab.py uses (its virtualenvs are reused when it ran first).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import lab_wheelhouse
import pytest
import yaml
from test_play_lab import FXKIT, write_role
from test_role_vllm_lmcache_lab import VENV, lab_vars

from fxkit import paths

pytestmark = pytest.mark.lab

HOSTS = ["lab01", "lab02"]
TOKEN = "hf_rollout_secret_4f9a2c"
NFS = "/srv/nfs/tiny"
MODEL = "/srv/fast/tiny"
#: Copies the controller's checkpoint to a folder on the host: the NFS export, as a node sees it.
NFS_ROLE = """
from pathlib import Path


def apply(host, v):
    host.directory(v.nfs_path, mode="0755")
    for file in sorted(Path(v.nfs_checkpoint).iterdir()):
        host.copy(str(file), f"{v.nfs_path}/{file.name}", mode="0644")
"""


@pytest.fixture(scope="module")
def lab(lab_fleet: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    house = lab_wheelhouse.build(tmp_path_factory.mktemp("wheelhouse") / "wheels")
    fleet = lab_fleet(2, name="vllm-lmcache")
    folder = tmp_path_factory.mktemp("rollout")
    variables = rollout_folder(folder, house)
    return {"fleet": fleet, "folder": folder, "vars": variables}


def rollout_folder(folder: Path, house: Path) -> dict[str, Any]:
    """``folder`` made ready for ``fxkit rollout``: a generated checkpoint, the NFS stand-in
    role and rollout.yml behind it; the inventory's variables (the wheelhouse ``house``)."""
    checkpoint = folder / "checkpoint"
    made = subprocess.run(
        [str(FXKIT), "make-checkpoint", str(checkpoint), "--size", "48MB", "--shards", "2"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert made.returncode == 0, made.stderr
    write_role(folder, "lab_nfs", NFS_ROLE)
    rollout = yaml.safe_load(paths.builtin("playbooks").joinpath("rollout.yml").read_text())
    book = [{"name": "NFS stand-in", "hosts": "gpu_nodes", "roles": ["lab_nfs"]}, *rollout]
    (folder / "rollout.yml").write_text(yaml.safe_dump(book))
    variables = lab_vars(
        house,
        vllm_lmcache_model=MODEL,
        vllm_lmcache_model_source=NFS,
        vllm_lmcache_served_name="tiny",
        vllm_lmcache_ready_timeout=300,
        vllm_lmcache_env={"HF_TOKEN": TOKEN},  # a secret: in the instances, nowhere else
        nfs_path=NFS,
        nfs_checkpoint=str(checkpoint),
    )
    del variables["vllm_lmcache_rollout_instances"]
    return variables


def inventory(lab: dict[str, Any], name: str, **host_vars: dict[str, Any]) -> Path:
    data = yaml.safe_load(lab["fleet"].inventory.read_text())
    data["all"]["vars"] = {**data["all"].get("vars", {}), **lab["vars"]}
    data["all"]["children"]["gpu_nodes"] = {"hosts": {h: host_vars.get(h, {}) for h in HOSTS}}
    path = lab["folder"] / name
    path.write_text(yaml.safe_dump(data))
    return path


def rollout(lab: dict[str, Any], inv: Path, *args: str) -> tuple[int, str, dict[str, Any]]:
    report = lab["folder"] / "report.json"
    report.unlink(missing_ok=True)
    proc = subprocess.run(
        [str(FXKIT), "rollout", str(lab["folder"] / "rollout.yml"), "-i", str(inv),
         "--report", str(report), *args],
        capture_output=True, text=True, timeout=1500, env={**os.environ, "COLUMNS": "160"},
    )  # fmt: skip
    output = proc.stdout + proc.stderr
    assert report.exists(), output
    return proc.returncode, output, json.loads(report.read_text())


def rows(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {f"{i['host']}/{i['name']}": i for i in report["instances"]}


def pids(lab: dict[str, Any]) -> dict[str, int]:
    found = {}
    for host in HOSTS:
        with lab["fleet"].connect(host) as conn:
            for name in ("tp4-0", "tp4-1"):
                raw = conn.get(f"/var/lib/fxkit/instances/vllm@{name}.service.json")
                found[f"{host}/{name}"] = json.loads(raw or b"{}").get("pid", 0)
    return found


def programs(lab: dict[str, Any]) -> dict[str, str]:
    """The program each instance runs (its process's first word: the venv it runs from)."""
    found = {}
    for key, pid in pids(lab).items():
        with lab["fleet"].connect(key.split("/")[0]) as conn:
            words = conn.run(f"tr '\\0' '\\n' < /proc/{pid}/cmdline").stdout.split("\n")
        found[key] = words[0]
    return found


def get(lab: dict[str, Any], host: str, url: str) -> str:
    with lab["fleet"].connect(host) as conn:
        done = conn.run(f"{VENV}/bin/python -c 'import sys, urllib.request as u; "
                        f"print(u.urlopen(sys.argv[1]).read().decode())' {url}")  # fmt: skip
    assert done.ok, done
    return done.stdout


# Several rollouts of venvs with torch: 7 min here at a load of 6-9, past the 600 s default.
@pytest.mark.timeout(1800)
def test_rollout_end_to_end(lab: dict[str, Any]) -> None:
    inv = inventory(lab, "inventory.yml")
    code, out, report = rollout(lab, inv, "--canary", "--serial", "2")
    assert code == 0, out
    assert report["batches"] == [["lab01/tp4-0"], ["lab02/tp4-0", "lab01/tp4-1"], ["lab02/tp4-1"]]
    found = rows(report)
    assert {r["status"] for r in found.values()} == {"ready"}, out
    for row in found.values():
        assert row["restarted"] and 0 < row["load_s"] < row["time_to_ready_s"] < 300
    assert found["lab01/tp4-1"]["gpus"] == [4, 5, 6, 7] and found["lab01/tp4-1"]["port"] == 8001
    assert report["fleet_time_to_ready_s"] >= max(r["time_to_ready_s"] for r in found.values())
    assert "fleet time to ready" in out

    # The instance serves what readiness saw: vLLM's /v1/models shape, /health, /metrics.
    address = yaml.safe_load(inv.read_text())["all"]["children"]["lab"]["hosts"]["lab02"]
    base = f"http://{address['ansible_host']}:8001"
    models = json.loads(get(lab, "lab02", f"{base}/v1/models"))
    assert models["object"] == "list" and models["data"][0]["id"] == "tiny"
    assert models["data"][0]["root"] == MODEL
    assert get(lab, "lab02", f"{base}/health") == "\n"  # liveness: 200, an empty body
    metrics = get(lab, "lab02", f"{base}/metrics")
    assert "fxkit_load_seconds" in metrics
    running = pids(lab)
    # Its environment file (what the unit reads under systemd), root's only, and the same
    # environment in the process that runs here without systemd.
    with lab["fleet"].connect("lab02") as conn:
        env_file = "/etc/fxkit/vllm/probe/tp4-1.env"
        assert conn.run(f"stat -c %a {env_file}").stdout.strip() == "600"
        assert "HIP_VISIBLE_DEVICES='4,5,6,7'\n" in conn.run(f"cat {env_file}").stdout
        environ = conn.run(f"tr '\\0' '\\n' < /proc/{running['lab02/tp4-1']}/environ").stdout
        assert "HIP_VISIBLE_DEVICES=4,5,6,7" in environ.split()
        assert f"HF_TOKEN={TOKEN}" in environ.split()
    assert TOKEN not in out and TOKEN not in json.dumps(report)

    # Again: nothing changed, so nothing restarts.
    code, out, report = rollout(lab, inv, "--serial", "1")
    assert code == 0, out
    assert {r["status"] for r in rows(report).values()} == {"unchanged"}, out
    assert pids(lab) == running

    # A bad model path on lab02: its first instance fails, the rollout stops there.
    bad = inventory(lab, "bad.yml", lab02={"vllm_lmcache_model": "/srv/fast/missing",
                                           "vllm_lmcache_model_source": ""})  # fmt: skip
    code, out, report = rollout(lab, bad, "--serial", "1", "--check")
    assert code == 0, out  # check mode: what would change, nothing changed
    assert rows(report)["lab02/tp4-0"]["status"] == "would_start"
    assert rows(report)["lab01/tp4-0"]["status"] == "unchanged"
    assert pids(lab) == running
    code, out, report = rollout(lab, bad, "--serial", "1")
    assert code == 1, out
    found = rows(report)
    assert found["lab01/tp4-0"]["status"] == "unchanged"
    # Its batch is rolled back: it runs again as before (fxkit/rollout/rollback.py).
    assert found["lab02/tp4-0"]["status"] == "rolled_back"
    assert "/srv/fast/missing" in found["lab02/tp4-0"]["msg"], found["lab02/tp4-0"]
    assert found["lab02/tp4-0"]["revision"] == found["lab02/tp4-0"]["previous"] != ""
    assert [found[k]["status"] for k in ("lab01/tp4-1", "lab02/tp4-1")] == ["not_run"] * 2
    assert report["stopped"].startswith("batch 2/4: 1 of 1 instances failed")
    assert report["stopped"].endswith(
        "rolled back: lab02/tp4-0 to " + found["lab02/tp4-0"]["revision"]
    )
    now = pids(lab)
    assert {k: now[k] for k in now if k != "lab02/tp4-0"} == {
        k: running[k] for k in running if k != "lab02/tp4-0"
    }
