"""Lab hosts with the simulated MI308X profile (``fxkit lab up N --profile mi308x``): the stand-in
tools answer in the real tools' formats, log their calls and keep their state; the host's /sys
has the profile's grafts, a writable configfs stand-in and writable mlx5 ECN attributes; its
RDMA netdevs are real veth interfaces. Plain lab hosts and the real machine have none of it.

The expected formats are real outputs in tests/data/reference/, copied from the project's
reference set (/work/shared/reference, see its SOURCES.md): amd_smi_static_mi300x_FIXTURE_shortened
(a shortened amd-smi test fixture), rocm_smi_showproductname_mi300x_RECONSTRUCTED and
rocm_smi_showmeminfo_vram_mi300x_FIXTURE (public parsers), rdma_link_mi300x_8x_connectx and
ibv_devinfo_connectx7_roce (public write-ups of MI300X / ConnectX-7 hosts),
mlnx_qos_trust_dscp_pfc3_output (att/netarbiter), nvme_list_o_json_nvmecli2x (vast-data/vast-csi),
nvmetcli_rdma and nvmetcli_tcp (linux-nvme/nvmetcli).
"""

from __future__ import annotations

import json
import re
import shlex
import socket
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from fxkit.cli.lab import lab
from fxkit.gate.measures.bench import parse_ib_write_bw
from fxkit.lab import CALL_LOG, FABRIC, Fleet, LabError, calls
from fxkit.lab.profile import LAUNCHER, TOOLS

pytestmark = pytest.mark.lab

REFERENCE = Path(__file__).parent / "data" / "reference"
NETDEVS = ["ens6np0", "ens5np0", "ens8np0", "ens7np0", "ens2np0", "ens1np0", "ens4np0", "ens3np0"]


@pytest.fixture(scope="module")
def gpu_fleet(lab_fleet) -> Fleet:
    return lab_fleet(1, name="mi308x", profile="mi308x")


@pytest.fixture
def node(gpu_fleet: Fleet):
    """A root connection to the MI308X host, its stand-ins' state and call log reset."""
    with gpu_fleet.connect("lab01") as conn:
        run(conn, f"rm -rf /var/lib/fxkit-lab {CALL_LOG} {FABRIC} /etc/nvmet /etc/nvme /dev/nvme*")
        yield conn


def run(conn, command: str, ok: bool = True, stdin: bytes | None = None):
    result = conn.run(command, stdin=stdin)
    if ok:
        assert result.rc == 0, result
    return result


def reference(name: str) -> str:
    return (REFERENCE / name).read_text()


def keys(value):
    """The structure of a JSON value: its keys, recursively (lists by their first item)."""
    if isinstance(value, dict):
        return {k: keys(v) for k, v in value.items()}
    if isinstance(value, list):
        return [keys(value[0])] if value else []
    return type(value).__name__


# -- markers ------------------------------------------------------------------------------------


def test_every_lab_host_and_inventory_says_it_is_one(gpu_fleet: Fleet, lab_fleet) -> None:
    plain = lab_fleet(1)
    with gpu_fleet.connect("lab01") as conn:
        assert json.loads(conn.get("/etc/fxkit-lab/host.json")) == {
            "lab": True,
            "profile": "mi308x",
        }
    with plain.connect("lab01") as conn:
        assert json.loads(conn.get("/etc/fxkit-lab/host.json")) == {"lab": True, "profile": None}
    profiled = yaml.safe_load(gpu_fleet.inventory.read_text())["all"]["children"]["lab"]["vars"]
    assert profiled == {"fxkit_lab": True, "fxkit_lab_profile": "mi308x"}
    bare = yaml.safe_load(plain.inventory.read_text())["all"]["children"]["lab"]["vars"]
    assert bare == {"fxkit_lab": True}
    assert json.loads(gpu_fleet.state_file.read_text())["profile"] == "mi308x"


def test_the_stand_ins_exist_only_on_profiled_hosts(node, lab_fleet) -> None:
    for tool in TOOLS:
        assert run(node, f"command -v {tool}").stdout.strip() == f"/usr/local/bin/{tool}"
    with lab_fleet(1).connect("lab01") as plain:
        for tool in TOOLS:  # (rdma, dcb, dmesg, lsmem: the real ones, in /usr/bin or /usr/sbin)
            assert run(plain, f"test -e /usr/local/bin/{tool}", ok=False).rc != 0, tool
            assert run(plain, f"command -v {tool}", ok=False).stdout.strip() in (
                "",
                f"/usr/bin/{tool}",
                f"/usr/sbin/{tool}",
            )
        assert run(plain, "ls /sys/class/infiniband /sys/kernel/config", ok=False).rc != 0
        assert run(plain, "ls /sys/class/net").stdout.split() == ["lo"]
    # Never on the real machine: no stand-in anywhere on this machine's PATH.
    standin = LAUNCHER.encode()
    for directory in ("/usr/local/bin", "/usr/local/sbin", "/usr/bin", "/usr/sbin", "/bin"):
        for tool in TOOLS:
            path = Path(directory) / tool
            assert not path.exists() or path.read_bytes() != standin, f"{path} is a stand-in"


# -- GPUs ---------------------------------------------------------------------------------------


def test_amd_smi_answers_in_the_fixtures_shape_for_8_mi308x(node) -> None:
    static = json.loads(run(node, "amd-smi static --asic --vram --driver --bus --json").stdout)
    fixture = json.loads(reference("amd_smi_static_mi300x_FIXTURE_shortened.json"))
    assert keys(static) == keys(fixture)
    gpus = static["gpu_data"]
    assert [g["gpu"] for g in gpus] == list(range(8))
    assert {g["asic"]["market_name"] for g in gpus} == {"AMD Instinct MI308X"}
    assert {g["asic"]["device_id"] for g in gpus} == {"0x74a2"}
    assert {g["asic"]["target_graphics_version"] for g in gpus} == {"gfx942"}
    assert {g["vram"]["size"]["value"] for g in gpus} == {196592}  # MB: 192 GB of HBM3
    assert len({g["bus"]["bdf"] for g in gpus}) == 8
    only_asic = json.loads(run(node, "amd-smi static --asic --json").stdout)["gpu_data"][0]
    assert set(only_asic) == {"gpu", "asic"}
    listed = json.loads(run(node, "amd-smi list --json").stdout)["gpu_data"]
    assert [g["bdf"] for g in listed] == [g["bus"]["bdf"] for g in gpus]
    assert {"gpu", "bdf", "uuid"} <= set(listed[0])
    assert "MARKET_NAME: AMD Instinct MI308X" in run(node, "amd-smi static").stdout


def test_rocm_smi_and_rocminfo(node) -> None:
    product = json.loads(run(node, "rocm-smi --showproductname --json").stdout)
    assert keys(product["card0"]) == keys(
        json.loads(reference("rocm_smi_showproductname_mi300x_RECONSTRUCTED.json"))["card0"]
    )
    assert list(product) == [f"card{i}" for i in range(8)]
    assert {c["Card Series"] for c in product.values()} == {"AMD Instinct MI308X"}
    assert {c["Card Model"] for c in product.values()} == {"0x74a2"}
    vram = json.loads(run(node, "rocm-smi --showmeminfo vram --json").stdout)
    fixture = json.loads(reference("rocm_smi_showmeminfo_vram_mi300x_FIXTURE.json"))
    assert vram["card7"] == fixture["card0"]  # 192 GiB, as the reference's

    text = run(node, "rocminfo").stdout
    agents = re.findall(r"^Agent (\d+)\s*$", text, re.M)
    assert agents == [str(i) for i in range(1, 11)]  # 2 CPUs, 8 GPUs
    assert len(re.findall(r"^  Name:\s+gfx942\s*$", text, re.M)) == 8
    assert len(re.findall(r"^  Marketing Name:\s+AMD Instinct MI308X\s*$", text, re.M)) == 8
    assert len(re.findall(r"^  Chip ID:\s+29858\(0x74a2\)\s*$", text, re.M)) == 8
    assert text.startswith("ROCk module is loaded") and text.rstrip().endswith("*** Done ***")


# -- RDMA ---------------------------------------------------------------------------------------

LINK = re.compile(r"^link (\S+)/(\d+) state (\S+) physical_state (\S+) netdev (\S+)\s*$")


def test_rdma_link_is_the_references_8_connectx_ports(node) -> None:
    real = [LINK.match(line).groups() for line in reference("rdma_link_mi300x_8x_connectx.txt")
            .splitlines()]  # fmt: skip
    text = run(node, "rdma link").stdout
    ours = [LINK.match(line).groups() for line in text.splitlines()]
    assert ours == real[:8]  # the reference's 8 mlx5 ports (its front-end bond left out)
    assert run(node, "rdma link show").stdout == text
    rows = json.loads(run(node, "rdma -j link").stdout)
    # iproute2 rdma/link.c: ifindex, ifname, port, state, physical_state, netdev, netdev_index
    assert list(rows[0]) == [
        "ifindex", "ifname", "port", "state", "physical_state", "netdev", "netdev_index"
    ]  # fmt: skip
    assert [(r["ifname"], r["netdev"], r["state"]) for r in rows] == [
        (dev, netdev, state) for dev, _, state, _, netdev in real[:8]
    ]
    index = int(run(node, "cat /sys/class/net/ens6np0/ifindex").stdout)
    assert rows[0]["netdev_index"] == index
    assert run(node, "rdma link show mlx5_9/1").stdout.split()[1] == "mlx5_9/1"
    assert run(node, "rdma dev").stdout.splitlines()[0].startswith("0: mlx5_0: node_type ca fw ")
    assert run(node, "rdma link show mlx5_42/1", ok=False).rc != 0


def _devinfo_fields(text: str) -> list[list[str]]:
    """Each hca block's field names, in order."""
    blocks = [block for block in text.strip().split("\n\n") if block.strip()]
    return [[line.split(":")[0].strip() for line in block.splitlines()] for block in blocks]


def test_ibv_devinfo_has_the_references_fields(node) -> None:
    real = _devinfo_fields(reference("ibv_devinfo_connectx7_roce.txt"))
    text = run(node, "ibv_devinfo").stdout
    assert _devinfo_fields(text) == [real[0]] * 8
    one = run(node, "ibv_devinfo -d mlx5_2").stdout
    assert one.startswith("hca_id:\tmlx5_2\n") and "link_layer:\t\tEthernet" in one
    assert "state:\t\t\tPORT_ACTIVE (4)" in one

    # The GID table follows the netdev's addresses, as the kernel's (roce_gid_mgmt.c): the
    # default GIDs only, then with an IPv4 address its RoCE v1 and v2 GIDs (rdma-core's format).
    def gids() -> list[tuple[str, str, str]]:
        shown = run(node, "ibv_devinfo -d mlx5_2 -v").stdout
        return re.findall(r"GID\[\s*(\d+)\]:\s+(\S+), (.+)", shown)

    assert [(i, kind) for i, _, kind in gids()] == [("0", "RoCE v1"), ("1", "RoCE v2")]
    run(node, "ip addr add 192.168.1.205/31 dev ens8np0")
    try:
        assert gids()[2:] == [
            ("2", "0000:0000:0000:0000:0000:ffff:c0a8:01cd", "RoCE v1"),
            ("3", "::ffff:192.168.1.205", "RoCE v2"),
        ]
    finally:
        run(node, "ip addr del 192.168.1.205/31 dev ens8np0")
    missing = run(node, "ibv_devinfo -d mlx5_42", ok=False)
    assert missing.rc != 0 and "wasn't found" in missing.stderr


def test_the_rdma_netdevs_are_real_interfaces_and_mtu_changes(node) -> None:
    links = json.loads(run(node, "ip -j link").stdout)
    names = {link["ifname"] for link in links}
    assert set(NETDEVS) <= names
    assert all(
        json.loads(run(node, f"ip -j link show {n}").stdout)[0]["mtu"] == 1500 for n in NETDEVS
    )
    try:
        run(node, "ip link set dev ens8np0 mtu 9000")
        assert run(node, "cat /sys/class/net/ens8np0/mtu").stdout.strip() == "9000"
        assert "active_mtu:\t\t4096 (5)" in run(node, "ibv_devinfo -d mlx5_2").stdout
        assert "active_mtu:\t\t1024 (3)" in run(node, "ibv_devinfo -d mlx5_0").stdout
    finally:
        run(node, "ip link set dev ens8np0 mtu 1500")
    written = run(node, "echo 9000 > /sys/class/net/ens8np0/mtu", ok=False)
    assert written.rc != 0 and "Read-only file system" in written.stderr


def test_sysfs_grafts_and_the_configfs_stand_in(node) -> None:
    gid = "/sys/class/infiniband/mlx5_0/ports/1/gid_attrs/types/3"
    assert run(node, f"cat {gid}").stdout.strip() == "RoCE v2"
    assert run(node, "cat /sys/module/nvme_core/parameters/multipath").stdout.strip() == "Y"
    assert run(node, "ls /sys/class/infiniband").stdout.split() == sorted(
        ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3", "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_9"]
    )
    assert set(NETDEVS) <= set(run(node, "ls /sys/class/net").stdout.split())
    cm = "/sys/kernel/config/rdma_cm/mlx5_0/ports/1"
    assert run(node, f"cat {cm}/default_roce_mode {cm}/default_roce_tos").stdout == "RoCE v2\n0\n"
    try:
        run(node, f"echo 106 > {cm}/default_roce_tos")
        assert run(node, f"cat {cm}/default_roce_tos").stdout.strip() == "106"
    finally:
        run(node, f"echo 0 > {cm}/default_roce_tos")
    assert run(node, "ls /sys/kernel/config/nvmet").stdout.split() == [
        "hosts",
        "ports",
        "subsystems",
    ]
    for path in (gid, "/sys/module/nvme_core/parameters/multipath", "/sys/kernel/mm/x"):
        assert run(node, f"echo x > {path}", ok=False).rc != 0, f"{path} is writable"


def test_lspci_shows_amds_topology_format_and_each_nic_links_to_its_pci_device(node) -> None:
    """`lspci -d 1002:74a2 -PP` as AMD's topology page shows MI300X's (root port, switch ports,
    GPU; system-acceptance-docs docs/network/topology-mapping.md), the ConnectX-7 NICs under the
    same root ports, and /sys/class/net/IF/device leading to the NIC's PCI device."""
    gpus = run(node, "lspci -d 1002:74a2 -PP").stdout.splitlines()
    assert len(gpus) == 8
    assert gpus[0] == (
        "00:01.1/01:00.0/02:00.0/03:00.0/04:00.0/05:00.0 Processing accelerators: "
        "Advanced Micro Devices, Inc. [AMD/ATI] Device 74a2"
    )
    nics = run(node, "lspci -d 15b3:1021 -PP").stdout.splitlines()
    assert nics[0] == (
        "00:01.1/01:00.0/02:01.0/09:00.0 Ethernet controller: "
        "Mellanox Technologies MT2910 Family [ConnectX-7]"
    )
    block = run(node, "lspci -vvv -s 05:00.0").stdout
    assert "\t\tLnkSta:\tSpeed 32GT/s (ok), Width x16 (ok)\n" in block
    assert "\t\tDevSta:\tCorrErr- NonFatalErr- FatalErr- UnsupReq- AuxPwr- TransPend-\n" in block
    assert "ACSCtl:\tSrcValid- " in run(node, "lspci -vvv -s 00:01.1").stdout
    device = run(node, "basename $(readlink -f /sys/class/net/ens6np0/device)").stdout.strip()
    assert device == "0000:09:00.0"
    link = f"/sys/bus/pci/devices/{device}/current_link"
    assert run(node, f"cat {link}_speed {link}_width").stdout == "32.0 GT/s PCIe\n16\n"


def test_lsmem_dmidecode_dmesg_answer_as_the_real_tools(node) -> None:
    """util-linux lsmem's table and summary (2 TiB online, AMD's MI308X minimum), dmidecode's
    one line per keyword and its refusal of an unknown one, the profile's kernel log."""
    table = run(node, "lsmem").stdout
    assert "Total online memory:       2T\n" in table and "Memory block size:         2G\n" in table
    # util-linux's layout, as the real `lsmem -b` prints it: sizes right-aligned, 15 wide.
    assert "Total online memory:      2199023255552\n" in run(node, "lsmem -b").stdout
    assert run(node, "dmidecode -s bios-version").stdout == "1.7\n"
    wrong = run(node, "dmidecode -s bios-colour", ok=False)
    assert wrong.rc == 2 and "Invalid string keyword: bios-colour" in wrong.stderr
    log = run(node, "dmesg").stdout
    assert "[   37.766927] [drm] amdgpu kernel modesetting enabled.\n" in log
    assert "error" not in log.replace("failed to INIT error", "")


def test_amd_smi_firmware_monitor_topology(node) -> None:
    """amd-smi firmware (CVS's pinned MI300X versions), monitor -putm (AMD's idle row, the
    newer columns) and topology (all xGMI), in amdsmi_cli's shapes."""
    firmware = json.loads(run(node, "amd-smi firmware --json").stdout)["gpu_data"]
    assert len(firmware) == 8
    assert firmware[0]["fw_list"][0] == {"fw_id": "CP_MEC1", "fw_version": "32945"}
    text = run(node, "amd-smi firmware").stdout
    assert text.startswith("GPU: 0\n    FW_LIST:\n        FW 0:\n            FW_ID: CP_MEC1\n")
    monitor = run(node, "amd-smi monitor -putm").stdout.splitlines()
    assert monitor[0].split() == [
        "GPU", "POWER", "PWR_CAP", "GPU_T", "MEM_T", "GFX_CLK", "GFX%", "MEM%", "MEM_CLOCK"
    ]  # fmt: skip
    assert monitor[1].split() == ["0", "251", "W", "1000", "W", "55", "°C", "43", "°C", "144",
                                  "MHz", "0", "%", "0", "%", "1900", "MHz"]  # fmt: skip
    topology = json.loads(run(node, "amd-smi topology -a -t --json").stdout)
    assert [link["link_type"] for link in topology[1]["links"]] == ["XGMI", "SELF", *["XGMI"] * 6]
    assert {link["link_status"] for link in topology[1]["links"]} == {"ENABLED"}


ECN_FILES = [  # what a fresh ConnectX port shows under /sys/class/net/IF/ecn (see the test)
    "roce_np/cnp_802p_prio:6",
    "roce_np/cnp_dscp:48",
    *(f"roce_np/enable/{p}:1" for p in range(8)),
    *(f"roce_rp/enable/{p}:1" for p in range(8)),
]


def test_each_connectx_netdev_has_writable_mlx5_ecn_attributes(node, lab_fleet) -> None:
    """The attribute names and read-back format of MLNX_OFED's mlx5 driver (en_sysfs.c and
    en_ecn.c of drivers/net/ethernet/mellanox/mlx5/core/ in oracle/linux-uek at f57c6307;
    mlx5e_sysfs_create: ecn/roce_rp and ecn/roce_np, each with enable/0..7, and roce_np's
    cnp_dscp and cnp_802p_prio, mode 0644 on a PF; en_ecn.c prints each as "%d\n"); the values
    of a fresh port are the firmware's defaults as `mlxconfig query` lists them for ConnectX
    (ROCE_CC_PRIO_MASK 255: ECN on every priority; CNP_DSCP 48; CNP_802P_PRIO 6)."""
    for netdev in NETDEVS:
        ecn = f"/sys/class/net/{netdev}/ecn"
        assert run(node, f"cd {ecn} && grep -r . | LC_ALL=C sort").stdout.split() == ECN_FILES
    np = "/sys/class/net/ens6np0/ecn/roce_np"
    assert run(node, f"stat -c %a {np}/cnp_dscp {np}/enable/3").stdout.split() == ["644"] * 2
    try:
        run(node, f"echo 7 > {np}/cnp_802p_prio && echo 0 > {np}/enable/3")
        assert run(node, f"cat {np}/cnp_802p_prio {np}/enable/3").stdout == "7\n0\n"
        other = "/sys/class/net/ens5np0/ecn/roce_np/cnp_802p_prio"
        assert run(node, f"cat {other}").stdout == "6\n"  # each port its own
    finally:
        run(node, f"echo 6 > {np}/cnp_802p_prio && echo 1 > {np}/enable/3")
    assert run(node, "test -e /sys/class/net/fxpeer0/ecn", ok=False).rc != 0  # not a ConnectX
    with lab_fleet(1).connect("lab01") as plain:
        assert run(plain, "ls -d /sys/class/net/*/ecn", ok=False).rc != 0


# -- mlnx_qos -----------------------------------------------------------------------------------


def test_mlnx_qos_keeps_trust_and_pfc_and_prints_the_real_format(node) -> None:
    out = run(node, "mlnx_qos -i ens6np0").stdout
    assert "Priority trust state: pcp" in out and "dscp2prio" not in out
    assert "        enabled     0   0   0   0   0   0   0   0   \n" in out
    run(node, "mlnx_qos -i ens6np0 --trust dscp")
    out = run(node, "mlnx_qos -i ens6np0 --pfc 0,0,0,1,0,0,0,0").stdout
    # The reference: the output of `mlnx_qos -i eth4 --pfc 0,0,0,1,0,0,0,0` after --trust dscp.
    lines = reference("mlnx_qos_trust_dscp_pfc3_output.txt").splitlines()
    start = lines.index("+ mlnx_qos -i eth4 --pfc 0,0,0,1,0,0,0,0") + 1
    assert out == "\n".join(lines[start:]) + "\n"
    assert "Priority trust state: dscp" in run(node, "mlnx_qos -i ens6np0").stdout
    assert "Priority trust state: pcp" in run(node, "mlnx_qos -i ens5np0").stdout  # per interface
    unknown = run(node, "mlnx_qos -i eth9 --trust=dscp", ok=False)
    assert unknown.rc != 0 and "eth9" in unknown.stderr
    bad = run(node, "mlnx_qos -i ens6np0 --pfc 0,1", ok=False)
    assert bad.rc == 2 and "Invalid PFC" in bad.stderr
    argvs = [c["argv"] for c in calls(node)]
    assert ["mlnx_qos", "-i", "ens6np0", "--trust", "dscp"] in argvs
    assert argvs[-1] == ["mlnx_qos", "-i", "ens6np0", "--pfc", "0,1"]


# -- nvme ---------------------------------------------------------------------------------------

NQN = "nqn.2026-12.io.fxkit.lab:vol1"


def test_nvme_connect_shows_the_namespaces_until_disconnect(node) -> None:
    fabric = {"subsystems": {NQN: {"namespaces": [2 * 2**30, 2**30]}}}
    node.put(FABRIC, json.dumps(fabric).encode())
    assert json.loads(run(node, "nvme list -o json").stdout) == {"Devices": []}
    connect = (
        f"nvme connect -t rdma -a 192.168.10.5 -s 4420 -n {NQN} -q nqn.2014-08.org.nvmexpress:"
        "uuid:11111111-2222-3333-4444-555555555555 -I 11111111-2222-3333-4444-555555555555 "
        "-i 8 -Q 128 -k 5 -c 10 -l 600 --tos=106"
    )
    assert run(node, connect).stdout == "connecting to device: nvme0\n"
    again = run(node, connect, ok=False)
    assert again.rc != 0 and again.stderr.strip() == "already connected"  # nvme-cli 2.x
    devices = json.loads(run(node, "nvme list -o json").stdout)
    real = json.loads(reference("nvme_list_o_json_nvmecli2x.json"))
    assert keys(devices) == keys(real)
    assert [(d["DevicePath"], d["PhysicalSize"]) for d in devices["Devices"]] == [
        ("/dev/nvme0n1", 2 * 2**30), ("/dev/nvme0n2", 2**30)
    ]  # fmt: skip
    assert devices["Devices"][0]["MaximumLBA"] == 2 * 2**30 // 512
    kind, size, blocks = run(node, "stat -c '%F|%s|%b' /dev/nvme0n1").stdout.strip().split("|")
    assert (kind, int(size), int(blocks)) == ("regular file", 2 * 2**30, 0)  # sparse
    assert run(node, "blkid /dev/nvme0n1", ok=False).rc == 2  # no filesystem on it
    subsys = json.loads(run(node, "nvme list-subsys -o json").stdout)
    assert isinstance(subsys, list)  # nvme-cli 2.x: a list of hosts
    path = subsys[0]["Subsystems"][0]["Paths"][0]
    assert subsys[0]["Subsystems"][0]["NQN"] == NQN
    assert path == {"Name": "nvme0", "Transport": "rdma",
                    "Address": "traddr=192.168.10.5,trsvcid=4420", "State": "live"}  # fmt: skip
    other = run(
        node, "nvme connect -t tcp -a 192.168.10.6 -n nqn.2026-12.io.fxkit.lab:none", ok=False
    )
    assert other.rc != 0 and "could not add new controller" in other.stderr
    assert (
        run(node, f"nvme disconnect -n {NQN}").stdout == f"NQN:{NQN} disconnected 1 controller(s)\n"
    )
    assert json.loads(run(node, "nvme list -o json").stdout) == {"Devices": []}
    assert run(node, "test -e /dev/nvme0n1", ok=False).rc != 0
    logged = [c["argv"] for c in calls(node) if c["argv"][:2] == ["nvme", "connect"]]
    assert logged[0] == shlex.split(connect)


def test_nvme_connect_all_reads_discovery_conf_and_gen_hostnqn(node) -> None:
    hostnqn = run(node, "nvme gen-hostnqn").stdout.strip()
    assert re.fullmatch(r"nqn\.2014-08\.org\.nvmexpress:uuid:[0-9a-f-]{36}", hostnqn)
    fabric = {"subsystems": {NQN: {"namespaces": [2**30], "traddr": "192.168.10.5"}}}
    node.put(FABRIC, json.dumps(fabric).encode())
    run(node, "mkdir -p /etc/nvme")
    node.put("/etc/nvme/discovery.conf", b"# lab\n-t rdma -a 192.168.10.5 -s 4420\n")
    node.put("/etc/nvme/hostnqn", (hostnqn + "\n").encode())
    found = run(node, "nvme discover -t rdma -a 192.168.10.5 -s 4420").stdout
    assert "Discovery Log Number of Records 1" in found and f"subnqn:  {NQN}" in found
    assert run(node, "nvme connect-all").stdout == "connecting to device: nvme0\n"
    run(node, "nvme connect-all")  # already connected: nothing to do
    subsys = json.loads(run(node, "nvme list-subsys -o json").stdout)
    assert subsys[0]["HostNQN"] == hostnqn and len(subsys[0]["Subsystems"]) == 1
    run(node, "nvme disconnect-all")
    assert json.loads(run(node, "nvme list -o json").stdout) == {"Devices": []}


# -- nvmetcli -----------------------------------------------------------------------------------


def test_nvmetcli_restore_writes_the_configfs_tree_and_logs_its_input(node) -> None:
    config = json.loads(reference("nvmetcli_rdma.json"))
    config["subsystems"][0]["namespaces"][0]["device"]["path"] = "/srv/lab-disk"
    run(node, "truncate -s 64M /srv/lab-disk && mkdir -p /etc/nvmet")
    node.put("/etc/nvmet/config.json", json.dumps(config).encode())
    result = run(node, "nvmetcli restore")
    assert result.stdout == ""
    nvmet = "/sys/kernel/config/nvmet"
    values = {
        "ports/2/addr_trtype": "rdma", "ports/2/addr_traddr": "192.168.6.68",
        "ports/2/addr_trsvcid": "4420", "ports/2/addr_adrfam": "ipv4",
        "subsystems/testnqn/attr_allow_any_host": "1",
        "subsystems/testnqn/namespaces/1/device_path": "/srv/lab-disk",
        "subsystems/testnqn/namespaces/1/device_nguid": "ef90689c-6c46-d44c-89c1-4067801309a8",
        "subsystems/testnqn/namespaces/1/enable": "1",
    }  # fmt: skip
    for path, value in values.items():
        assert run(node, f"cat {nvmet}/{path}").stdout.strip() == value, path
    link = run(node, f"readlink {nvmet}/ports/2/subsystems/testnqn").stdout.strip()
    assert link == f"{nvmet}/subsystems/testnqn"
    assert run(node, f"test -d {nvmet}/hosts/hostnqn").rc == 0
    assert calls(node)[-1] == {"argv": ["nvmetcli", "restore"], "stdin": "", "input": config}

    saved = run(node, "nvmetcli save /tmp/saved.json && cat /tmp/saved.json").stdout
    assert json.loads(saved)["subsystems"][0]["namespaces"][0]["device"]["path"] == "/srv/lab-disk"
    assert json.loads(saved)["ports"][0]["subsystems"] == ["testnqn"]

    # A second restore clears the tree first; a namespace whose device is missing is reported
    # but, as with the real nvmetcli, the exit code stays 0.
    tcp = json.loads(reference("nvmetcli_tcp.json"))
    node.put("/etc/nvmet/config.json", json.dumps(tcp).encode())
    result = run(node, "nvmetcli restore /etc/nvmet/config.json")
    assert "/dev/nvme0n1" in result.stdout
    assert run(node, f"ls {nvmet}/subsystems").stdout.split() == ["nvmet-always"]
    assert run(node, f"cat {nvmet}/subsystems/nvmet-always/namespaces/1/enable").stdout == "0\n"
    run(node, "nvmetcli clear")
    assert run(node, f"find {nvmet} -mindepth 2").stdout == ""
    missing = run(node, "nvmetcli restore /etc/nvmet/none.json")
    assert missing.stdout.strip() == "No saved config file"


def test_perftest_stand_ins_answer_per_port_from_the_recorded_run(node) -> None:
    """ib_write_bw: the recorded 400G pair (779.21 Gb/s) on a 400G port, AMD's 390/770 of it on
    a loopback, the profile's GPU named with --use_rocm; ibv_rc_pingpong: rc_pingpong.c's
    lines with the port's RoCE v2 GID; each call logs its device, start and end."""
    assert run(node, "cat /sys/class/net/ens6np0/speed").stdout.strip() == "400000"
    flags = "-d mlx5_0 -x 3 -a -b -F --report_gbits"
    # A client needs its server listening: here one on this host, reached at its address (a
    # pair's figure) or at 127.0.0.1 (a loopback).
    serve = f"(ib_write_bw {flags} >/dev/null &) && "
    pair = parse_ib_write_bw(run(node, f"{serve}ib_write_bw {flags} $(hostname -i)").stdout)
    assert max(r["bw_average"] for r in pair["rows"]) == 779.21 and pair["device"] == "mlx5_0"
    loop = run(node, f"{serve}ib_write_bw {flags} --use_rocm=2 127.0.0.1").stdout
    assert max(r["bw_average"] for r in parse_ib_write_bw(loop)["rows"]) == 394.66
    assert "Using ROCm Device with ID: 2, Name: AMD Instinct MI308X, PCI Bus ID: 0x46" in loop
    ping = "ibv_rc_pingpong -d mlx5_1 -g 3 -p 18600"
    ping = run(node, f"({ping} >/dev/null &) && {ping} $(hostname -i)").stdout
    assert "GID ::ffff:192.168.100.2" in ping and "8192000 bytes in" in ping
    logged = [c for c in calls(node) if c["argv"][0] in ("ib_write_bw", "ibv_rc_pingpong")]
    clients = [c for c in logged if "." in c["argv"][-1]]  # a client names its server
    assert [c["device"] for c in clients[-3:]] == ["mlx5_0", "mlx5_0", "mlx5_1"]
    assert all(c["started"] < c["ended"] for c in logged)
    assert run(node, "ib_write_bw -d mlx5_7 -a -b --report_gbits", ok=False).rc == 1


def test_calls_parses_the_log_text() -> None:
    text = '{"argv": ["nvme", "list"], "stdin": ""}\n\n{"argv": ["rdma", "link"], "stdin": "x"}\n'
    assert calls(text) == [{"argv": ["nvme", "list"], "stdin": ""},
                           {"argv": ["rdma", "link"], "stdin": "x"}]  # fmt: skip
    assert calls(None) == [] and calls(b"") == []


def test_stdin_is_logged(node) -> None:
    run(node, "rdma link", stdin=b"hello")
    assert calls(node) == [{"argv": ["rdma", "link"], "stdin": "hello"}]


# -- isolation and the fleet ----------------------------------------------------------------------


def test_a_profiled_host_still_cannot_reach_the_real_network(node) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as outside:
        outside.bind(("127.0.0.1", 0))
        outside.listen()
        port = outside.getsockname()[1]
        refused = run(node, f"timeout 5 bash -c 'echo > /dev/tcp/127.0.0.1/{port}'", ok=False)
        assert refused.rc != 0
        outside.settimeout(0.5)
        with pytest.raises(TimeoutError):
            outside.accept()
    assert run(node, "cat /proc/net/route").stdout.splitlines()[1:] == []  # no IPv4 route at all
    links = json.loads(run(node, "ip -d -j link").stdout)
    assert not [link["ifname"] for link in links if "link_netnsid" in link]  # no peer outside
    status = dict(line.split(":\t") for line in run(node, "grep ^Cap /proc/self/status").stdout
                  .splitlines())  # fmt: skip
    bounding = int(status["CapBnd"], 16)
    assert bounding >> 12 & 1  # CAP_NET_ADMIN, for its own interfaces
    for cap in (
        13,
        16,
        17,
        19,
        21,
        27,
    ):  # net_raw, sys_module, sys_rawio, sys_ptrace, sys_admin, mknod
        assert not bounding >> cap & 1, f"capability {cap} kept"


def test_a_running_fleet_refuses_another_profile(gpu_fleet: Fleet, lab_fleet) -> None:
    with pytest.raises(LabError, match="run with profile mi308x, not no profile") as info:
        Fleet(gpu_fleet.dir).up(1)
    assert "--profile mi308x" in info.value.hint
    with pytest.raises(LabError, match="not profile mi308x"):
        Fleet(lab_fleet(1).dir).up(1, profile="mi308x")
    with pytest.raises(LabError, match="no lab profile 'mi999'"):
        Fleet(gpu_fleet.dir).up(1, profile="mi999")
    assert Fleet(gpu_fleet.dir).up(1, profile="mi308x") == []


def test_cli_offers_the_profiles(tmp_path) -> None:
    result = CliRunner().invoke(lab, ["up", "1", "--dir", str(tmp_path), "--profile", "mi999"])
    assert result.exit_code == 2 and "mi308x" in result.output
