"""playbooks/site.yml on lab fleets, in both forms (issue 9): a storage target (lab01) and an
MI308X node (lab02), converged from scratch.

- **plain** lab hosts: every hardware step is skipped with its reason, every file-level step is
  applied;
- **mi308x** lab hosts (``fxkit lab up --profile mi308x``: stand-in amd-smi, rdma, mlnx_qos, nvme,
  nvmetcli..., see docs/lab.md): every step runs, and the commands the roles ran are read back from
  the stand-ins' call log;
- either way check mode changes nothing first, and the second run and a last check change nothing.

The node's apt sees a signed mirror laid out like repo.radeon.com (fxkit/lab/mirror.py) and an
Ubuntu /etc/os-release; both hosts get stand-in packages named nvmetcli and nvme-cli
(tests/nvme_lab.py: Debian 12, these hosts' base, has no nvmetcli).
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from fxkit.lab import Fleet, calls
from fxkit.lab.mirror import add_ubuntu_archive, build, install
from tests.gpg_helpers import signing_key
from tests.lab_helpers import events_of, sh
from tests.nvme_lab import stand_in_packages
from tests.test_play_lab import Run, cli_play, snapshot
from tests.test_role_rocm_host import OS_RELEASE

REPO = Path(__file__).resolve().parent.parent
SITE = REPO / "playbooks" / "site.yml"
NQN = "nqn.2026-01.io.fxkit.lab:models"
HOSTNQN = "nqn.2014-08.org.nvmexpress:uuid:6f1c2a9e-4b7d-4e21-9a3c-5d8e7f6a1b20"
STORAGE = "192.168.100.1"
#: The only steps skipped on mi308x hosts: those a lab host cannot do whatever its hardware
#: (no systemd: PID 1 is sshd), and the reboot the inventory did not opt in to.
NOT_HARDWARE = (
    "systemd is not running on this host",
    "rocm_host_reboot is false",
    "a reboot is pending",  # /proc/cmdline is this machine's: GRUB's new arguments never boot
    "/proc/sys is read-only",  # the lab keeps the kernel's settings read-only (docs/lab.md)
)
#: What both groups set for roles/nic_firmware: the stand-ins' NVM starts with other values.
NIC_FIRMWARE = {"nic_firmware_write": True, "nic_firmware_on_difference": "report"}
#: Steps that change the NICs: on plain hosts they must not even be tried.
NIC_STEPS = ("MTU of ", "trust and PFC of ", "rdma_cm defaults of ", "ECN of ")


@dataclass
class Site:
    fleet: Fleet
    form: str
    inventory: Path
    folder: Path

    def play(self, *args: str) -> Run:
        run = cli_play(SITE, self.inventory, self.folder / "events.json", *args)
        assert run.code == 0, run.output
        return run

    def snapshots(self) -> dict[str, str]:
        return {name: snapshot(self.fleet, name) for name in ("lab01", "lab02")}


def inventory(fleet: Fleet, mirror_url: str, key_sha256: str, arch: str) -> dict:
    """The fleet's own inventory, its two hosts put in the site's groups, with the variables a
    small site sets (inventory/mi308x.yml and its group_vars show the real ones)."""
    data = yaml.safe_load(fleet.inventory.read_text())
    hosts = data["all"]["children"]["lab"]["hosts"]
    data["all"]["children"].update(
        storage_targets={
            "hosts": {"lab01": hosts["lab01"]},
            "vars": {
                **NIC_FIRMWARE,
                "roce_nic_interfaces": ["ens6np0"],
                "nvmeof_target_ports": [
                    {"id": 1, "transport": "rdma", "address": STORAGE, "service_id": 4420}
                ],
                "nvmeof_target_subsystems": [
                    {
                        "nqn": NQN,
                        "allowed_hosts": [HOSTNQN],
                        "serial": "fxkit-lab-models",
                        "namespaces": [{"nsid": 1, "path": "/srv/nvmet/models.img", "size": "2G"}],
                    }
                ],
            },
        },
        gpu_nodes={
            "hosts": {"lab02": hosts["lab02"]},
            "vars": {
                "rocm_repo_base": mirror_url,
                "rocm_host_key_sha256": key_sha256,
                "rocm_host_apt_arch": arch,
                "rocm_host_users": ["ops"],
                **NIC_FIRMWARE,
                "roce_nic_interfaces": ["ens6np0", "ens5np0"],
                "roce_net_interfaces": [
                    {"name": "ens6np0", "address": "10.100.0.1/31"},
                    {"name": "ens5np0", "address": "10.100.1.1/31"},
                ],
                "nvmeof_initiator_hostnqn": HOSTNQN,
                "nvmeof_initiator_discovery": [
                    {"transport": "rdma", "address": STORAGE, "service_id": 4420}
                ],
                "nvmeof_initiator_connections": [
                    {
                        "nqn": NQN,
                        "transport": "rdma",
                        "address": STORAGE,
                        "service_id": 4420,
                        "nr_io_queues": 8,
                        "ctrl_loss_tmo": -1,
                        "namespaces": 1,
                    }
                ],
                "nvmeof_initiator_filesystems": [
                    {"nqn": NQN, "nsid": 1, "path": "/mnt/models", "label": "models"}
                ],
            },
        },
    )
    return data


@pytest.fixture(scope="module", params=["plain", "mi308x"])
def site(request, lab_fleet, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    form = request.param
    fleet: Fleet = lab_fleet(2, name=f"site-{form}", profile=None if form == "plain" else form)
    with fleet.connect("lab02") as conn:
        arch = sh(conn, "dpkg --print-architecture").strip()
    folder = tmp_path_factory.mktemp(f"site-{form}")
    with signing_key("fxkit lab site mirror") as key:
        mirror = build(key, arch, ("noble",))
        for name in ("lab01", "lab02"):
            with fleet.connect(name) as conn:
                stand_in_packages(conn, "nvmetcli", "nvme-cli")
        with fleet.connect("lab02") as conn:
            install(conn, mirror)
            sh(conn, "id ops >/dev/null 2>&1 || useradd ops; rm -f /etc/os-release")
            conn.put(
                "/etc/os-release", OS_RELEASE.format(version="24.04", codename="noble").encode()
            )
            add_ubuntu_archive(conn, mirror, arch, key.dearmored())  # the kernel's headers
            # An Ubuntu server has GRUB's defaults file; the lab's Debian base has none.
            conn.put("/etc/default/grub", b'GRUB_DEFAULT=0\nGRUB_CMDLINE_LINUX_DEFAULT=""\n')
        path = folder / "inventory.yml"
        path.write_text(yaml.safe_dump(inventory(fleet, mirror.url, mirror.key_sha256, arch)))
        yield Site(fleet, form, path, folder)


def test_site_converges_in_check_then_apply_then_nothing_more(site: Site) -> None:
    before = site.snapshots()
    check = site.play("--check", "--diff")
    after = site.snapshots()
    for host in before:  # not one byte, mode or ctime
        assert after[host] == before[host], "\n".join(
            difflib.unified_diff(before[host].splitlines(), after[host].splitlines(), lineterm="")
        )
    assert check.counts("changed")["lab01"] > 0 and check.counts("changed")["lab02"] > 0

    first = site.play()
    assert first.counts("failed") == {"lab01": 0, "lab02": 0}
    if site.form == "plain":
        plain_hardware_steps_are_skipped_with_their_reasons(first)
    else:
        every_hardware_step_ran(site, first)

    again = site.play()
    assert again.counts("changed") == {"lab01": 0, "lab02": 0}, again.output
    assert site.play("--check").counts("changed") == {"lab01": 0, "lab02": 0}


def plain_hardware_steps_are_skipped_with_their_reasons(run: Run) -> None:
    node, target = (
        dict(events_of(run, "lab02", "skipped")),
        dict(events_of(run, "lab01", "skipped")),
    )
    assert node["verify GPUs"].startswith("verify GPUs: no GPU tool found (amd-smi, rocm-smi")
    for host, interfaces in ((target, ["ens6np0"]), (node, ["ens6np0", "ens5np0"])):
        for netdev in interfaces:
            assert "the kernel has no RDMA support here" in host[f"RoCE on {netdev}"]
    assert "/sys/kernel/config/nvmet does not exist" in target["apply the nvmet configuration"]
    assert node["connect NVMe-oF subsystems"] == "connect NVMe-oF subsystems: nvme not found"
    tried = [e["operation"] for e in run.events if e["operation"].startswith(NIC_STEPS)]
    assert tried == []
    # The file-level steps ran: the boot script, nvmetcli's saved config, discovery.conf.
    changed = {e["operation"] for e in run.events if e["status"] == "changed"}
    assert "template /usr/local/sbin/fxkit-roce-nic" in changed
    assert any("/etc/nvmet/config.json" in op for op in changed)
    assert any("/etc/nvme/discovery.conf" in op for op in changed)


def every_hardware_step_ran(site: Site, run: Run) -> None:
    not_run = [
        f"{host}: {operation}: {msg}"
        for host in ("lab01", "lab02")
        for operation, msg in events_of(run, host, "skipped")
        if not any(reason in msg for reason in NOT_HARDWARE)
    ]
    assert not_run == []
    with site.fleet.connect("lab01") as conn:
        target = calls(conn)
        saved = json.loads(sh(conn, "cat /etc/nvmet/config.json"))
    restores = [c for c in target if c["argv"][:2] == ["nvmetcli", "restore"]]
    assert len(restores) == 1 and restores[0]["input"] == saved
    assert saved["subsystems"][0]["nqn"] == NQN
    assert saved["ports"][0]["addr"]["traddr"] == STORAGE
    with site.fleet.connect("lab02") as conn:
        node = calls(conn)
    argvs = [c["argv"] for c in node]
    connects = [a for a in argvs if a[:2] == ["nvme", "connect"]]
    assert len(connects) == 1
    options = dict(zip(connects[0][2::2], connects[0][3::2], strict=False))
    assert options | {"-n": NQN} == options  # the subsystem the inventory names
    assert {
        "-t": "rdma",
        "-a": STORAGE,
        "-s": "4420",
        "-i": "8",
        "-l": "-1",
    }.items() <= options.items()
    for netdev in ("ens6np0", "ens5np0"):
        assert ["mlnx_qos", "-i", netdev, "--trust=dscp", "--pfc=0,0,0,1,0,0,0,0"] in argvs
    assert ["amd-smi", "static", "--json"] in argvs


def test_the_example_inventory_passes_every_role_s_validation() -> None:
    """inventory/mi308x.yml with its group_vars/host_vars, against site.yml's roles: every
    variable validates (only the key's digest must be the site's own); no host is contacted."""
    from fxkit.engine.playbook import Playbook
    from fxkit.engine.record import Outcome, Recorder
    from fxkit.engine.runner import Runner, RunOptions, load_inventory
    from fxkit.errors import ConnectionFailed

    def unreachable(name: str, *_: object) -> None:
        raise ConnectionFailed("not contacted by this test", where=f"host {name}")

    options = RunOptions(check=True, extra_vars={"rocm_host_key_sha256": "ab" * 32})
    runner = Runner(
        Playbook.load(SITE),
        load_inventory(REPO / "inventory" / "mi308x.yml"),
        options,
        Recorder(),
        connector=unreachable,  # type: ignore[arg-type]
    )
    results = runner.run()
    assert {h: r.outcome for h, r in results.hosts.items()} == dict.fromkeys(
        ["gpu01", "gpu02", "gpu03", "gpu04", "nvme-tgt01", "nvme-tgt02"], Outcome.UNREACHABLE
    )
