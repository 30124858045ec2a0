"""``fxkit rollout`` where systemd runs the instances: playbooks/rollout.yml's role
(vllm_lmcache, ``fxkit serve-probe`` as the server, its venv from the wheelhouse of
tests/lab_wheelhouse.py, the model staged from an NFS stand-in) on the systemd lab host
(tests/systemd_host.py), 2 instances. Checked against systemd itself (``systemctl show``, the
main process's environ):

- the first rollout starts both units from their own unit files, enabled;
- a revision that cannot start is rolled back: the instance runs the previous revision again,
  from its own unit file with that revision's text while the template holds the new one;
- a change to the unit alone (``Nice=``) is rolled out and systemd applies it;
- ``fxkit rollout undo --max-surge 1`` returns both to the first revision, ``Nice=`` and all,
  each beside a copy of the first revision on the GPUs the layout leaves free (its own unit
  file and environment file, retired after: stopped, disabled, its files gone).
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
from systemd_host import SystemdHost
from test_play_lab import FXKIT
from test_rollout_vllm_lab import TOKEN, rollout_folder, rows

pytestmark = pytest.mark.lab

UNITS = ("vllm@tp4-0.service", "vllm@tp4-1.service")
UNIT_DIR = "/etc/systemd/system"


@pytest.fixture(scope="module")
def lab(systemd_lab: SystemdHost, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    house = lab_wheelhouse.build(tmp_path_factory.mktemp("wheelhouse") / "wheels")
    folder = tmp_path_factory.mktemp("rollout-systemd")
    variables = rollout_folder(folder, house)
    variables["vllm_lmcache_gpus"] = 12  # TP4x2 takes 8: room for one copy (--max-surge)
    return {"host": systemd_lab, "folder": folder, "vars": variables}


def inventory(lab: dict[str, Any], name: str, **values: Any) -> Path:
    host: SystemdHost = lab["host"]
    common = {
        **host.hostvars(),
        "ansible_ssh_common_args": f"-o UserKnownHostsFile={host.known_hosts}",
    }
    data = {
        "all": {
            "vars": {**lab["vars"], **values},
            "children": {"gpu_nodes": {"hosts": {"sd01": common}}},
        }
    }
    path = lab["folder"] / name
    path.write_text(yaml.safe_dump(data))
    return path


def rollout(lab: dict[str, Any], inv: Path, *args: str) -> tuple[int, str, dict[str, Any]]:
    report = lab["folder"] / "report.json"
    report.unlink(missing_ok=True)
    proc = subprocess.run(
        [str(FXKIT), "rollout", *args[:1], str(lab["folder"] / "rollout.yml"), "-i", str(inv),
         "--report", str(report), *args[1:]],
        capture_output=True, text=True, timeout=1500, env={**os.environ, "COLUMNS": "160"},
    )  # fmt: skip
    output = proc.stdout + proc.stderr
    assert report.exists(), output
    assert TOKEN not in output and TOKEN not in report.read_text()
    return proc.returncode, output, json.loads(report.read_text())


def systemd(lab: dict[str, Any]) -> dict[str, dict[str, str]]:
    """Per unit: what systemd shows of it, its own unit file, and its main process's
    revision."""
    found = {}
    with lab["host"].connect() as conn:
        for unit in UNITS:
            shown = conn.run(
                f"systemctl show -p FragmentPath,ActiveState,MainPID,Nice {unit}; "
                f"echo UnitFileState=$(systemctl is-enabled {unit})"
            ).stdout
            state = dict(line.partition("=")[::2] for line in shown.splitlines())
            environ = conn.run(f"tr '\\0' '\\n' < /proc/{state['MainPID']}/environ").stdout
            env = dict(w.partition("=")[::2] for w in environ.splitlines())
            state["revision"] = env.get("FXKIT_REVISION", "")
            state["own"] = (conn.get(f"{UNIT_DIR}/{unit}") or b"").decode()
            found[unit] = state
        template = (conn.get(f"{UNIT_DIR}/vllm@.service") or b"").decode()
    found["template"] = {"text": template}
    return found


@pytest.mark.timeout(2400)
def test_rollout_rollback_unit_change_and_undo_under_systemd(lab: dict[str, Any]) -> None:
    code, out, report = rollout(lab, inventory(lab, "first.yml"), "run", "--serial", "1")
    assert code == 0, out
    assert {r["status"] for r in rows(report).values()} == {"ready"}, out
    first = systemd(lab)
    [r1] = {r["revision"] for r in rows(report).values()}
    for unit in UNITS:
        assert first[unit]["FragmentPath"] == f"{UNIT_DIR}/{unit}"  # its own file
        assert first[unit]["ActiveState"] == "active" and first[unit]["UnitFileState"] == "enabled"
        assert first[unit]["revision"] == r1
        assert first[unit]["own"] == first["template"]["text"]

    # A revision that cannot start: rolled back to r1, pinned by its own unit file.
    bad = inventory(
        lab, "bad.yml", vllm_lmcache_model="/srv/fast/missing", vllm_lmcache_model_source=""
    )
    code, out, report = rollout(lab, bad, "run", "--serial", "1")
    assert code == 1, out
    found = rows(report)
    assert found["sd01/tp4-0"]["status"] == "rolled_back", found
    assert found["sd01/tp4-0"]["revision"] == r1
    assert "/srv/fast/missing" in found["sd01/tp4-0"]["msg"]
    assert found["sd01/tp4-1"]["status"] == "not_run"
    back = systemd(lab)
    assert back["vllm@tp4-0.service"]["revision"] == r1
    assert back["vllm@tp4-0.service"]["MainPID"] != first["vllm@tp4-0.service"]["MainPID"]
    assert back["vllm@tp4-0.service"]["ActiveState"] == "active"
    assert back["vllm@tp4-0.service"]["own"] == first["vllm@tp4-0.service"]["own"]
    assert "/srv/fast/missing" in back["template"]["text"]  # the failed revision's template
    assert back["vllm@tp4-1.service"]["MainPID"] == first["vllm@tp4-1.service"]["MainPID"]

    # A change to the unit alone: a new revision, and systemd runs it with Nice=5.
    nice = inventory(lab, "nice.yml", vllm_lmcache_unit_options={"Nice": "5"})
    code, out, report = rollout(lab, nice, "run", "--serial", "1")
    assert code == 0, out
    [r3] = {r["revision"] for r in rows(report).values()}
    assert r3 != r1
    now = systemd(lab)
    assert {now[u]["Nice"] for u in UNITS} == {"5"} and {now[u]["revision"] for u in UNITS} == {r3}

    # Undo with surge: both back on r1, as they ran it (Nice 0), each beside a copy of r1.
    code, out, report = rollout(lab, nice, "undo", "--serial", "1", "--max-surge", "1")
    assert code == 0, out
    found = rows(report)
    assert {r["revision"] for r in found.values()} == {r1}, out
    for name in ("tp4-0", "tp4-1"):
        assert found[f"sd01/{name}"]["surge"] == f"{name}-surge (port 8002, GPUs [8, 9, 10, 11])"
    undone = systemd(lab)
    for unit in UNITS:
        assert undone[unit]["revision"] == r1 and undone[unit]["Nice"] == "0"
        assert undone[unit]["own"] == first[unit]["own"]
        assert undone[unit]["ActiveState"] == "active"
    with lab["host"].connect() as conn:
        left = conn.run(
            "ls /etc/systemd/system /etc/fxkit/vllm/probe | grep -- -surge; "
            "systemctl is-enabled vllm@tp4-0-surge.service; "
            "systemctl show -p ActiveState --value vllm@tp4-0-surge.service"
        ).stdout.split()
    assert left == ["disabled", "inactive"], left  # no file of it left, not back at boot
