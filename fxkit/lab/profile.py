"""Simulated hardware profiles of lab hosts (``fxkit lab up N --profile mi308x``).

A profile is a folder of ``fxkit/lab/profiles/`` with a ``profile.json`` (the GPUs, RDMA ports
and NVMe defaults the host pretends to have) and the text the stand-in tools print. A variant
is a folder whose profile.json ``extends`` another profile and changes a few values (one GPU
fewer, an RDMA link down: ``rdma.down`` names the devices whose veth peer stays down). The tools
themselves are test doubles: the package :mod:`fxkit.lab.standins`, started by one launcher that
picks the tool by the name it is called by (see docs/lab.md, "Simulated hardware: test doubles").

:func:`build_layer` writes, once per fleet, what ``host-init.sh`` mounts into each host of the
profile: ``usr/`` (a lower layer of the host's /usr overlay: the stand-ins in /usr/local/bin,
their data in /usr/local/lib/fxkit-lab), ``sys/`` (read-only layers over the host's sysfs:
``class/infiniband``, ``bus/pci/devices/BDF`` (the GPUs' and backend NICs' PCIe links),
``module/nvme_core``, ``module/NAME/version`` (the profile's ``modules``), ``kernel/config``,
``kernel/debug/bnxt_re/DEV/info``, ``devices/virtual/net/IF/ecn`` and ``IF/device`` (the link to
the NIC's PCI device),
``config/`` (what the host's writable configfs stand-in starts with: rdma_cm, and bnxt_re's
congestion control where the profile has ``rdma.bnxt_re``), ``ecn.fstab`` and ``ecn``
(a small writable tmpfs on each RDMA netdev's ``ecn`` folder, and the attribute files, one
``PATH VALUE`` a line, each of them starts with: the mlx5 ECN attributes; both empty where the
profile's ``rdma.ecn`` is null), ``netdevs`` (an ``ip -batch`` file making a veth pair per RDMA
netdev) and ``drives`` (the profile's local NVMe drives, ``NAME BYTES`` a line: host-init makes
each a sparse file in the fleet's shared folder, linked from the host's /dev, so that what a
target exports of it is what its initiators see). :func:`calls` reads the log the stand-ins
write on a host.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from fxkit.connection.base import Connection
from fxkit.lab import standins

PROFILES_DIR = Path(__file__).with_name("profiles")
STANDINS = Path(standins.__file__).parent
#: The launcher every stand-in in /usr/local/bin links to (on the host, /usr/local/lib/fxkit-lab/).
LAUNCHER = """#!/usr/bin/python3
# The fxkit lab's stand-ins (fxkit/lab/standins): the name this is called by picks the tool.
import sys
sys.dont_write_bytecode = True  # no __pycache__ in the host's /usr: a call leaves no trace there
sys.path.insert(0, "/usr/local/lib/fxkit-lab")
from standins import main
sys.exit(main())
"""
#: The tools the stand-ins answer for, by name.
TOOLS = tuple(sorted(standins.tools()))
#: On the host: the marker every lab host has, the stand-ins' call log and their state.
MARKER = "/etc/fxkit-lab/host.json"
CALL_LOG = "/var/log/fxkit-lab/calls.jsonl"
STATE_DIR = "/var/lib/fxkit-lab"
FABRIC = "/etc/fxkit-lab/fabric.json"
#: Mount options of the tmpfs on each RDMA netdev's /sys/class/net/IF/ecn (18 files of a page).
ECN_TMPFS = "mode=0755,size=256k,nosuid,nodev,noexec"

#: The counters of each RDMA port: ports/N/counters (drivers/infiniband/core/sysfs.c) and
#: ports/N/hw_counters (a few of mlx5's), as the soak (G4) reads them.
PORT_COUNTERS = (
    "symbol_error",
    "link_error_recovery",
    "link_downed",
    "port_rcv_errors",
    "port_rcv_remote_physical_errors",
    "port_xmit_discards",
    "local_link_integrity_errors",
    "excessive_buffer_overrun_errors",
    "port_xmit_data",
    "port_rcv_data",
)
HW_COUNTERS = ("out_of_sequence", "packet_seq_err", "local_ack_timeout_err", "np_cnp_sent")


def names() -> list[str]:
    """The profiles there are (folders of fxkit/lab/profiles with a profile.json)."""
    return sorted(p.parent.name for p in PROFILES_DIR.glob("*/profile.json"))


def load(name: str) -> dict[str, Any]:
    """A profile's data; a variant (``"extends": "mi308x"``) is its base's with the variant's
    values over it: mappings merged key by key, anything else (lists too, and an empty
    mapping: ``"gpus": {}`` leaves none) replaced."""
    data: dict[str, Any] = json.loads((PROFILES_DIR / name / "profile.json").read_text())
    base = data.pop("extends", None)
    if base is None:
        return data
    return {**_merged(load(base), data), "name": name, "extends": base}


def chain(name: str) -> list[str]:
    """The profile and the ones it extends, the base first (their folders' files are layered)."""
    base = json.loads((PROFILES_DIR / name / "profile.json").read_text()).get("extends")
    return [*chain(base), name] if base else [name]


def _merged(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        if value and isinstance(value, dict) and isinstance(base.get(key), dict):
            out[key] = _merged(base[key], value)
        else:
            out[key] = value
    return out


def marker(profile: str | None) -> str:
    """The text of /etc/fxkit-lab/host.json on a lab host."""
    return json.dumps({"lab": True, "profile": profile}) + "\n"


def build_layer(layer: Path, name: str) -> None:
    """Write the profile's layer into ``layer`` (atomically: a temporary folder, renamed)."""
    data = load(name)
    tmp = layer.with_name(f".{layer.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    lib = tmp / "usr" / "local" / "lib" / "fxkit-lab"
    bin_dir = tmp / "usr" / "local" / "bin"
    bin_dir.mkdir(parents=True)
    for folder in chain(name):  # a variant's files over its base's, then the merged data
        shutil.copytree(PROFILES_DIR / folder, lib / name, dirs_exist_ok=True)
    (lib / name / "profile.json").write_text(json.dumps(data, indent=1) + "\n")
    shutil.copytree(STANDINS, lib / "standins", ignore=shutil.ignore_patterns("__pycache__"))
    (lib / "standin").write_text(LAUNCHER)
    os.chmod(lib / "standin", 0o755)
    for tool in TOOLS:
        os.symlink("../lib/fxkit-lab/standin", bin_dir / tool)

    sys_dir = tmp / "sys"
    ports = data["rdma"]["ports"]
    #: MLNX_OFED's mlx5 ECN attributes (none on a NIC of another driver: ``"ecn": null``).
    ecn_files = _ecn_files(data["rdma"].get("ecn") or {})
    #: RDMA devices whose link is down (a variant's cable pulled): their veth peer stays down.
    down = set(data["rdma"].get("down", []))
    for port in ports:
        port_dir = sys_dir / "class" / "infiniband" / port["dev"] / "ports" / "1"
        state = ("1: DOWN", "3: Disabled") if port["dev"] in down else ("4: ACTIVE", "5: LinkUp")
        _files(port_dir, {"state": state[0], "phys_state": state[1], "link_layer": "Ethernet"})
        # Error and data counters, all 0 (the kernel's PMA port counters, mlx5's hw_counters).
        _files(port_dir / "counters", dict.fromkeys(PORT_COUNTERS, "0"))
        _files(port_dir / "hw_counters", dict.fromkeys(HW_COUNTERS, "0"))
        for index, kind in enumerate(data["rdma"]["gid_types"]):
            _files(port_dir / "gid_attrs" / "types", {str(index): kind})
            _files(port_dir / "gid_attrs" / "ndevs", {str(index): port["netdev"]})
            _files(port_dir / "gids", {str(index): _gid(port, index, ports.index(port))})
        _files(
            sys_dir / "class" / "infiniband" / port["dev"],
            {
                "node_type": "1: CA",
                "fw_ver": data["rdma"]["fw_ver"],
                "node_guid": port["node_guid"],
            },
        )
        # The mount point of the netdev's ECN stand-in (/sys/class/net/IF links here), and the
        # link speed in Mb/s as the kernel shows it (a veth's own says 10000).
        netdev_dir = sys_dir / "devices" / "virtual" / "net" / port["netdev"]
        if ecn_files:
            (netdev_dir / "ecn").mkdir(parents=True)
        _files(netdev_dir, {"speed": str(port_speed(data, port["dev"]))})
    pcie, links = data["gpus"]["pcie"], data["pci"]["links"]
    for bdf in data["gpus"]["bdfs"]:  # each GPU's PCIe link, as sysfs shows it
        _pci_link(sys_dir, bdf, pcie["speed"], pcie["width"], links.get(bdf, {}))
    for netdev, nic in data["pci"]["nics"].items():  # each backend NIC's PCI device and link
        _pci_link(sys_dir, nic["bdf"], pcie["speed"], pcie["width"], links.get(nic["bdf"], {}))
        net = sys_dir / "devices" / "virtual" / "net" / netdev
        net.mkdir(parents=True, exist_ok=True)
        os.symlink(f"../../../../bus/pci/devices/{nic['bdf']}", net / "device")
    _files(sys_dir / "module" / "nvme_core" / "parameters", {"multipath": "Y"})
    # The loaded amdgpu: a DKMS build says its version (the kernel's own amdgpu has none).
    _files(sys_dir / "module" / "amdgpu", {"version": data["gpus"]["driver"]["version"]})
    for module, version in data.get("modules", {}).items():  # loaded; its MODULE_VERSION ("": none)
        if version is not None:
            _files(sys_dir / "module" / module, {"version": version} if version else {})
    (sys_dir / "kernel" / "config").mkdir(parents=True)  # the configfs stand-in's mount point

    config = tmp / "config"
    for group in ("hosts", "ports", "subsystems"):
        (config / "nvmet" / group).mkdir(parents=True)
    bnxt = data["rdma"].get("bnxt_re")
    for port in ports:
        port_dir = config / "rdma_cm" / port["dev"] / "ports" / "1"
        _files(port_dir, {"default_roce_tos": "0", "default_roce_mode": "RoCE v2"})
        if bnxt:  # Broadcom's bnxt_re: its configfs group as `mkdir bnxt_re/DEV` makes it
            _files(config / "bnxt_re" / port["dev"] / "ports" / "1" / "cc", bnxt["cc"])
            info = f"\tfw_service_prof_type_sup : {bnxt['service_type']}"
            _files(sys_dir / "kernel" / "debug" / "bnxt_re" / port["dev"], {"info": info})

    # Targets relative to the folder host-init.sh builds the host's root in (root/ there).
    mounts = [f"root/sys/devices/virtual/net/{port['netdev']}/ecn" for port in ports]
    fstab = [f"fxkit-lab {target} tmpfs {ECN_TMPFS} 0 0" for target in mounts if ecn_files]
    _lines(tmp / "ecn.fstab", fstab)
    _lines(tmp / "ecn", ecn_files)

    batch = []
    for port in ports:
        batch.append(f"link add {port['netdev']} type veth peer name {port['peer']}")
        batch.append(f"link set {port['netdev']} up")
        if port["dev"] not in down:
            batch.append(f"link set {port['peer']} up")
    _lines(tmp / "netdevs", batch)
    _lines(tmp / "drives", [f"{n} {size}" for n, size in data.get("drives", {}).items()])
    shutil.rmtree(layer, ignore_errors=True)
    tmp.rename(layer)


def _ecn_files(ecn: dict[str, Any]) -> list[str]:
    """``PATH VALUE`` lines of the ECN attributes: roce_np/, roce_rp/: enable/<priority> and the
    other attributes."""
    lines: list[str] = []
    for protocol, attributes in ecn.items():
        for attribute, value in attributes.items():
            if isinstance(value, list):
                lines += [f"{protocol}/{attribute}/{i} {x}" for i, x in enumerate(value)]
            else:
                lines.append(f"{protocol}/{attribute} {value}")
    return lines


def _pci_link(sys_dir: Path, bdf: str, speed: str, width: int, now: dict[str, Any]) -> None:
    """/sys/bus/pci/devices/BDF/{current,max}_link_{speed,width}: the kernel's text
    (``32.0 GT/s PCIe``); ``now`` (the profile's ``pci.links``) is a link trained lower."""
    current = f"{float(now['speed']):.1f} GT/s PCIe" if "speed" in now else speed
    _files(
        sys_dir / "bus" / "pci" / "devices" / bdf,
        {
            "current_link_speed": current,
            "current_link_width": str(now.get("width", width)),
            "max_link_speed": speed,
            "max_link_width": str(width),
        },
    )


def port_speed(data: dict[str, Any], device: str) -> int:
    """A port's link speed in Mb/s: the profile's ``rdma.speed_mbps``, half of it for the
    devices ``rdma.half_speed`` names (a variant's port that trained at half speed)."""
    speed = int(data["rdma"].get("speed_mbps", 400000))
    return speed // 2 if device in data["rdma"].get("half_speed", []) else speed


def _gid(port: dict[str, Any], index: int, number: int) -> str:
    """The GID sysfs shows at ``index``: 0 and 1 the link-local address (the node GUID as
    EUI-64, bit 1 flipped), 2 and 3 the IPv4-mapped address of the netdev (made up:
    192.168.100.N, N the port's number), as ConnectX lists them for RoCE v1 and v2."""
    if index < 2:
        guid = port["node_guid"].replace(":", "")
        eui = f"{int(guid[:2], 16) ^ 2:02x}{guid[2:]}"
        return "fe80:0000:0000:0000:" + ":".join(eui[i : i + 4] for i in range(0, 16, 4))
    return f"0000:0000:0000:0000:0000:ffff:c0a8:64{number + 1:02x}"


def _lines(path: Path, lines: list[str]) -> None:
    path.write_text("".join(line + "\n" for line in lines))


def _files(folder: Path, files: dict[str, str]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name).write_text(text + "\n")


def calls(source: str | bytes | Connection | None) -> list[dict[str, Any]]:
    """The stand-ins' call log, one dict per call (``argv``, ``stdin``, maybe ``input``):
    from the log's text, or read over ``source`` when it is a connection to the host."""
    if isinstance(source, Connection):
        source = source.get(CALL_LOG)
    if isinstance(source, bytes):
        source = source.decode()
    return [json.loads(line) for line in (source or "").splitlines() if line.strip()]
