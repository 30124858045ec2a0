"""Revisions on real lab hosts (2 hosts x 2 serve-probe instances, roles/vllm_lmcache, the
fleet and checkpoint of tests/test_rollout_vllm_lab.py): the same variables give the same
revision on both hosts; a change to the unit file alone is a new revision and restarts every
instance; ``fxkit rollout status`` shows the revision each instance runs and the one wanted,
``history`` the revisions each host keeps; a host keeps its last 2, and an older one while an
instance still runs it; a revision with other pins has its own venv, removed with the last
revision that names it."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_play_lab import FXKIT
from test_rollout_vllm_lab import HOSTS, inventory, pids, programs, rollout, rows
from test_rollout_vllm_lab import lab as lab  # the module's fixture: its fleet and checkpoint

pytestmark = pytest.mark.lab

REVISIONS = "/var/lib/fxkit/revisions/probe"
VENVS = "/opt/fxkit/venvs/probe.venvs"


def variant(fx: dict[str, Any], name: str, **values: Any) -> Path:
    """The lab's inventory with more variables for every host."""
    path = inventory(fx, name)
    data = yaml.safe_load(path.read_text())
    data["all"]["vars"].update(values)
    path.write_text(yaml.safe_dump(data))
    return path


def play_one(fx: dict[str, Any], inv: Path, host: str, name: str) -> None:
    """``fxkit play`` of the rollout playbook on ``host``, acting on its instance ``name``."""
    played = subprocess.run(
        [str(FXKIT), "play", str(fx["folder"] / "rollout.yml"), "-i", str(inv), "-l", host,
         "-e", json.dumps({"vllm_lmcache_rollout_instances": [name]})],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert played.returncode == 0, played.stdout + played.stderr


def inspect(fx: dict[str, Any], inv: Path, what: str) -> tuple[int, str, dict[str, Any]]:
    report = fx["folder"] / f"{what}.json"
    report.unlink(missing_ok=True)
    proc = subprocess.run(
        [str(FXKIT), "rollout", what, str(fx["folder"] / "rollout.yml"), "-i", str(inv),
         "--report", str(report)],
        capture_output=True, text=True, timeout=300, env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip
    output = proc.stdout + proc.stderr
    assert report.exists(), output
    return proc.returncode, output, json.loads(report.read_text())


def running(fx: dict[str, Any], inv: Path) -> dict[str, tuple[int, int, str, str]]:
    """Per instance: (PID, port, revision running, revision wanted), from ``rollout status``."""
    _, _, report = inspect(fx, inv, "status")
    return {
        f"{i['host']}/{i['name']}": (i["pid"], i["port"], i["running"], i["wanted"])
        for i in report["instances"]
    }


def kept(fx: dict[str, Any], host: str) -> list[str]:
    """The revision records on ``host``, newest first."""
    with fx["fleet"].connect(host) as conn:
        return conn.run(f"cd {REVISIONS} && ls -t -- *.json | sed 's/.json$//'").stdout.split()


def env_revision(fx: dict[str, Any], host: str, name: str) -> str:
    with fx["fleet"].connect(host) as conn:
        text = conn.run(f"cat /etc/fxkit/vllm/probe/{name}.env").stdout
    return next(line.split("=", 1)[1].strip("'") for line in text.splitlines()
                if line.startswith("FXKIT_REVISION="))  # fmt: skip


@pytest.mark.timeout(1800)
def test_revisions_status_unit_only_change_and_history_pruning(lab: dict[str, Any]) -> None:
    inv = inventory(lab, "inventory.yml")
    code, out, report = rollout(lab, inv, "--serial", "2")
    assert code == 0, out
    first = running(lab, inv)
    assert set(first) == {f"{h}/{n}" for h in HOSTS for n in ("tp4-0", "tp4-1")}
    revisions = {rev for _, _, rev, _ in first.values()}
    assert len(revisions) == 1, first  # one revision: the same on both hosts
    [r1] = revisions
    assert r1.startswith("r-") and all(want == r1 for *_, want in first.values())
    assert {port for _, port, _, _ in first.values()} == {8000, 8001}
    assert pids(lab) == {key: pid for key, (pid, *_) in first.items()}
    code, out, report = inspect(lab, inv, "status")
    assert code == 0 and all(i["current"] and i["health"] == "ready" for i in report["instances"])

    # The unit file alone changes ([Service] Nice=5): a new revision, every instance restarted.
    unit_only = variant(lab, "unit.yml", vllm_lmcache_unit_options={"Nice": "5"})
    code, out, report = inspect(lab, unit_only, "status")
    assert code == 1  # before the rollout: every instance runs r1, another is wanted
    wanted = {i["wanted"] for i in report["instances"]}
    assert len(wanted) == 1 and r1 not in wanted
    code, out, report = rollout(lab, unit_only, "--serial", "2")
    assert code == 0, out
    assert {r["status"] for r in rows(report).values()} == {"ready"}, out
    second = running(lab, unit_only)
    [r2] = {rev for _, _, rev, _ in second.values()}
    assert r2 == wanted.pop()
    assert all(second[k][0] != first[k][0] for k in first)  # new processes
    assert [second[k][1] for k in sorted(second)] == [first[k][1] for k in sorted(first)]
    with lab["fleet"].connect("lab01") as conn:
        assert "Nice=5\n" in conn.run("cat /etc/systemd/system/vllm@.service").stdout
    assert kept(lab, "lab01") == kept(lab, "lab02") == [r2, r1]

    # History: both hosts keep r2 (used by every instance) and r1.
    code, out, report = inspect(lab, unit_only, "history")
    assert code == 0, out
    for host in HOSTS:
        history = report["history"][host]
        assert [h["revision"] for h in history] == [r2, r1]
        assert history[0]["used_by"] == ["tp4-0", "tp4-1"] and history[1]["used_by"] is None
    assert r1 in out and r2 in out

    # r3 on lab01's tp4-0 only (a play that names it): tp4-1 still runs r2; r1 is pruned.
    play_one(
        lab, variant(lab, "nice6.yml", vllm_lmcache_unit_options={"Nice": "6"}), "lab01", "tp4-0"
    )
    r3 = env_revision(lab, "lab01", "tp4-0")
    assert r3 not in (r1, r2) and env_revision(lab, "lab01", "tp4-1") == r2
    assert kept(lab, "lab01") == [r3, r2]
    # r4 on the same instance: r2 is older than the 2 kept, but tp4-1 runs it: kept.
    nice7 = variant(lab, "nice7.yml", vllm_lmcache_unit_options={"Nice": "7"})
    play_one(lab, nice7, "lab01", "tp4-0")
    r4 = env_revision(lab, "lab01", "tp4-0")
    assert kept(lab, "lab01") == [r4, r3, r2]
    now = running(lab, nice7)
    assert now["lab01/tp4-0"][2] == r4 and now["lab01/tp4-1"][2] == r2
    assert now["lab02/tp4-0"][2] == r2 and now["lab01/tp4-1"][0] == second["lab01/tp4-1"][0]

    # Every revision so far has the same pins: one venv, the deployment's link to it.
    venv_a = programs(lab)["lab01/tp4-0"].split("/bin/")[0].rsplit("/", 1)[1]
    assert programs(lab)["lab01/tp4-1"].startswith(f"{VENVS}/{venv_a}/bin/")
    present = set(venvs(lab, "lab01"))  # (other tests' venvs may be left on the shared fleet)
    # r5 adds a package: its own venv beside the first, which tp4-1 (on r2) runs from.
    more = [*lab["vars"]["vllm_lmcache_packages"], "safetensors"]
    play_one(lab, variant(lab, "venv.yml", vllm_lmcache_packages=more), "lab01", "tp4-0")
    r5 = env_revision(lab, "lab01", "tp4-0")
    [venv_b] = set(venvs(lab, "lab01")) - present
    assert programs(lab)["lab01/tp4-0"].startswith(f"{VENVS}/{venv_b}/bin/")
    assert programs(lab)["lab01/tp4-1"].startswith(f"{VENVS}/{venv_a}/bin/")
    assert link(lab, "lab01") == f"probe.venvs/{venv_b}"
    # r6 and r7 (the first pins again): r5 and r4 pruned, and with r5 the venv no revision kept
    # names; tp4-1 still runs r2 (kept) from the first.
    for nice in ("8", "9"):
        play_one(lab, variant(lab, f"nice{nice}.yml", vllm_lmcache_unit_options={"Nice": nice}),
                 "lab01", "tp4-0")  # fmt: skip
    r7 = env_revision(lab, "lab01", "tp4-0")
    assert r5 not in kept(lab, "lab01") and kept(lab, "lab01")[0] == r7
    assert venv_b not in venvs(lab, "lab01") and venv_a in venvs(lab, "lab01")
    assert link(lab, "lab01") == f"probe.venvs/{venv_a}"
    assert programs(lab)["lab01/tp4-1"].startswith(f"{VENVS}/{venv_a}/bin/")


def venvs(fx: dict[str, Any], host: str) -> list[str]:
    """The deployment's venvs on ``host``."""
    with fx["fleet"].connect(host) as conn:
        return conn.run(f"ls {VENVS}").stdout.split()


def link(fx: dict[str, Any], host: str) -> str:
    with fx["fleet"].connect(host) as conn:
        return conn.run("readlink /opt/fxkit/venvs/probe").stdout.strip()
