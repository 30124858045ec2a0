"""``fxkit lab up --like inventory/mi308x.yml``: the user's own inventory rehearsed on lab hosts,
with the user's own command lines (the real executable):

- one lab host per inventory host of ``--limit`` (two GPU nodes, both storage targets), with the
  inventory's names and groups, mi308x for GPU nodes, storage-target for targets, and
  ``--fault gpu02=gpu-link-x8``; ``lab status`` lists them;
- the overlay changes nothing but the lab's connection variables (and, on hosts with simulated
  hardware, the lab mirror's address and key);
- a host the lab left out is refused before anything connects to its real address;
- site.yml converges (0 failed), then changes nothing; the storage is wired across hosts: what
  gpu01 wrote on the shared model namespace, gpu02 reads;
- G1's health stage passes gpu01's GPU links and fails gpu02's, and only the link checks
  differ;
- a target/initiator mismatch in a copied inventory fails the rehearsal with the role's message;
  a target configured from another inventory (gpu02 not allowed) fails gpu02's connection on
  the wire, with the role's message.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from test_play_lab import FXKIT

from fxkit.inventory import Inventory
from fxkit.lab import Fleet
from fxkit.lab.fleet import LabError, check_requirements

pytestmark = pytest.mark.lab

REPO = Path(__file__).resolve().parent.parent
INVENTORY = REPO / "inventory" / "mi308x.yml"
LIMIT = "gpu01:gpu02:nvme-tgt01:nvme-tgt02"
MODELS = "nqn.2026-01.io.fxkit:models"
GPU02_ALLOWED = '      - "{{ site_gpu_hostnqn.gpu02 }}"\n'
#: What the overlay may set on a lab host: the connection, the lab's marks, the mirror.
LAB_VARS = {
    "ansible_host", "ansible_port", "ansible_user", "ansible_ssh_private_key_file",
    "ansible_ssh_common_args", "fxkit_lab", "fxkit_lab_profile", "fxkit_lab_only",
    "rocm_repo_base", "rocm_host_key_sha256", "rocm_host_apt_arch",
}  # fmt: skip


def fxkit(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    wide = {**os.environ, "COLUMNS": "200"}  # rich's tables: a terminal this wide
    done = subprocess.run(
        [str(FXKIT), *args], capture_output=True, text=True, timeout=1200, env=wide
    )
    if check:
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    try:
        check_requirements()
    except LabError as exc:
        pytest.skip(f"the lab fleet cannot run here: {exc}")
    state = tmp_path_factory.mktemp("like") / "lab"
    prefix = f"127.{random.randint(100, 250)}.{random.randint(0, 255)}"
    try:
        fxkit("lab", "up", "--like", str(INVENTORY), "--limit", LIMIT, "--fault",
              "gpu02=gpu-link-x8", "--dir", str(state), "--prefix", prefix)  # fmt: skip
        yield Fleet(state)
    finally:
        fxkit("lab", "down", "--dir", str(state), check=False)


def play(lab: Fleet, *args: str, inventory: Path = INVENTORY) -> subprocess.CompletedProcess[str]:
    return fxkit("play", "site", "-i", str(inventory), "-i", str(lab.inventory), *args, check=False)


def test_the_hosts_are_the_inventorys_with_their_groups_profiles_and_faults(lab: Fleet) -> None:
    assert sorted(lab.hosts) == ["gpu01", "gpu02", "nvme-tgt01", "nvme-tgt02"]
    assert {n: lab.profile_of(n) for n in lab.hosts} == {
        "gpu01": "mi308x",
        "gpu02": "mi308x-gpu-link-x8",
        "nvme-tgt01": "storage-target",
        "nvme-tgt02": "storage-target",
    }
    assert lab.hosts["gpu02"]["fault"] == "gpu-link-x8"
    assert lab.hosts["gpu01"]["groups"] == ["gpu_nodes", "gpu_rack1"]
    status = fxkit("lab", "status", "--dir", str(lab.dir)).stdout
    assert "gpu-link-x8" in status and "storage-target" in status


def test_the_overlay_changes_nothing_but_the_labs_connection_variables(lab: Fleet) -> None:
    mine = Inventory.load([str(INVENTORY)])
    rehearsed = Inventory.load([str(INVENTORY), str(lab.inventory)])
    assert list(rehearsed.hosts) == list(mine.hosts)
    for name, host in rehearsed.hosts.items():
        before = mine.hosts[name]
        assert host.groups == before.groups
        changed = {k for k in {*host.vars, *before.vars} if host.vars.get(k) != before.vars.get(k)}
        assert changed <= (LAB_VARS if name in lab.hosts else {"fxkit_lab_only"}), name
        if name in lab.hosts:
            assert host.vars["ansible_host"] == lab.address(name) != before.vars.get("ansible_host")


def test_a_host_the_lab_left_out_is_refused_before_anything_connects(lab: Fleet) -> None:
    done = play(lab, "--check")
    assert done.returncode != 0
    assert "not in the lab: nvme-tgt02" not in done.stderr  # it is in the lab
    assert "gpu03, gpu04" in done.stderr and "does not connect" in done.stderr


def test_site_converges_and_the_storage_is_wired_across_hosts(lab: Fleet) -> None:
    limit = ("--limit", LIMIT)
    assert play(lab, *limit, "--check").returncode == 0
    first = play(lab, *limit)
    assert first.returncode == 0, first.stdout[-3000:]
    again = play(lab, *limit)
    assert again.returncode == 0
    recap = [line for line in again.stdout.splitlines() if line.startswith("│ ")]
    assert len(recap) == 4 and all(line.split("│")[3].strip() == "0" for line in recap), recap
    # gpu01 owns the shared model namespace and made its filesystem; gpu02 reads the same drive.
    with lab.connect("gpu02") as conn:
        devices = conn.run("nvme list-subsys -o json").stdout
        assert MODELS in devices
        found = conn.run("for d in /dev/nvme*n1; do blkid -o value -s LABEL $d; done").stdout
    assert "models" in found.split()


def test_g1_health_passes_the_healthy_node_and_fails_exactly_the_faulty_links(
    lab: Fleet, tmp_path: Path
) -> None:
    done = fxkit("gate", "g1", "-i", str(INVENTORY), "-i", str(lab.inventory), "--limit",
                 "gpu01:gpu02", "--stage", "health", "--out", str(tmp_path / "g1"),
                 check=False)  # fmt: skip
    result = yaml.safe_load((tmp_path / "g1" / "result.json").read_text())
    got = {h: {c["id"]: c for c in result["hosts"][h]["checks"]} for h in ("gpu01", "gpu02")}
    assert got["gpu01"]["gpu_link_width"]["status"] == "PASS"
    assert got["gpu02"]["gpu_link_width"]["status"] == "FAIL"
    assert got["gpu02"]["gpu_link_width"]["source"]
    differ = {c: got["gpu02"][c]["status"] for c in got["gpu01"]
              if got["gpu01"][c]["status"] != got["gpu02"][c]["status"]}  # fmt: skip
    # As the variant does on its own (tests/test_gate_g1_lab.py): amd-smi's link width too.
    assert differ == {"gpu_link_width": "FAIL", "gpu_pcie_width": "WARN"}, differ
    assert done.returncode != 0


def test_a_target_initiator_mismatch_in_a_copied_inventory_fails_the_rehearsal(
    lab: Fleet, tmp_path: Path
) -> None:
    """A copy of the inventory whose nvme-tgt01 no longer allows gpu02: the rehearsal fails
    before any host is touched, with the role's message."""
    copy = _copy(tmp_path)
    target = copy / "host_vars" / "nvme-tgt01.yml"
    target.write_text(target.read_text().replace(GPU02_ALLOWED, ""))
    done = play(lab, "--limit", LIMIT, inventory=copy / "mi308x.yml")
    assert done.returncode != 0
    assert "allowed_hosts of nqn.2026-01.io.fxkit:models in nvme-tgt01" in done.stderr


def test_a_target_from_another_inventory_fails_the_connection_on_the_wire(
    lab: Fleet, tmp_path: Path
) -> None:
    """The targets configured from a copy that is consistent in itself (gpu02 is not in it, and
    nvme-tgt01 does not allow it), the nodes from the site's own: no validation sees both, and
    gpu02's connection fails on the wire as on real nodes, with the role's message."""
    copy = _copy(tmp_path)
    target = copy / "host_vars" / "nvme-tgt01.yml"
    target.write_text(target.read_text().replace(GPU02_ALLOWED, ""))
    hosts = copy / "mi308x.yml"
    hosts.write_text(hosts.read_text().replace("gpu[01:02]:", "gpu01:"))
    moved = play(lab, "--limit", "nvme-tgt01", inventory=hosts)
    assert moved.returncode == 0, moved.stdout[-3000:] + moved.stderr
    with lab.connect("gpu02") as conn:
        assert conn.run(f"nvme disconnect -n {MODELS}").ok
    done = play(lab, "--limit", "gpu02")
    assert done.returncode != 0
    assert f"connect to {MODELS}" in done.stdout
    assert "could not add new controller" in done.stdout
    assert play(lab, "--limit", "nvme-tgt01").returncode == 0  # the site's inventory again


def _copy(tmp_path: Path) -> Path:
    copy = tmp_path / "inventory"
    shutil.copytree(INVENTORY.parent, copy)
    return copy
