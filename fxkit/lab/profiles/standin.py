#!/usr/bin/python3
"""Test doubles of hardware tools on a lab host with a simulated profile (see docs/lab.md,
"Simulated hardware: test doubles"). NOT the real tools: they answer from the profile's data in
the formats the real tools print, keep the little state their configuration commands change,
and log every call.

One program, installed (only inside a lab host's own /usr overlay) as /usr/local/bin/amd-smi,
rocm-smi, rocminfo, rdma, ibv_devinfo, nvme, mlnx_qos and nvmetcli, all links to this file; the
name it is called by picks the tool. It runs with the host's /usr/bin/python3 and imports only
the standard library. Every call appends ``{"argv": [...], "stdin": "..."}`` (plus ``"input"``
for ``nvmetcli restore``) to /var/log/fxkit-lab/calls.jsonl; state is in /var/lib/fxkit-lab/.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import select
import shutil
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

MARKER = Path("/etc/fxkit-lab/host.json")
CALL_LOG = Path("/var/log/fxkit-lab/calls.jsonl")
STATE = Path("/var/lib/fxkit-lab")
FABRIC = Path("/etc/fxkit-lab/fabric.json")
CONFIGFS = Path("/sys/kernel/config")
NVMET = CONFIGFS / "nvmet"
SYS_NET = Path("/sys/class/net")
HOSTNQN, HOSTID = Path("/etc/nvme/hostnqn"), Path("/etc/nvme/hostid")
DISCOVERY_CONF = Path("/etc/nvme/discovery.conf")
NVMET_CONFIG = Path("/etc/nvmet/config.json")

Profile = dict[str, Any]


def main() -> int:
    tool = Path(sys.argv[0]).name
    stdin = _read_stdin()
    entry: dict[str, Any] = {"argv": [tool, *sys.argv[1:]], "stdin": stdin}
    handler = TOOLS.get(tool)
    if handler is None:
        print(f"{tool}: not a tool of the fxkit lab profile", file=sys.stderr)
        return 127
    try:
        return handler(_profile(), sys.argv[1:], stdin, entry)
    finally:
        _log(entry)


# -- plumbing -----------------------------------------------------------------------------------


def _read_stdin() -> str:
    """What the caller sent on stdin, without waiting on a stdin left open and silent."""
    if sys.stdin is None or sys.stdin.isatty():
        return ""
    data = bytearray()
    fd = sys.stdin.fileno()
    while select.select([fd], [], [], 0.05)[0]:
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        data += chunk
    return data.decode(errors="replace")


def _log(entry: dict[str, Any]) -> None:
    CALL_LOG.parent.mkdir(parents=True, exist_ok=True)
    line = (json.dumps(entry) + "\n").encode()
    fd = os.open(CALL_LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)  # one write in append mode: lines of parallel calls never mix
    finally:
        os.close(fd)


def _profile() -> Profile:
    name = json.loads(MARKER.read_text())["profile"]
    here = Path(__file__).resolve().parent
    data: Profile = json.loads((here / name / "profile.json").read_text())
    data["dir"] = here / name
    return data


def _load(name: str, default: Any) -> Any:
    try:
        return json.loads((STATE / name).read_text())
    except FileNotFoundError:
        return default


def _save(name: str, value: Any) -> None:
    STATE.mkdir(parents=True, exist_ok=True)
    tmp = STATE / f".{name}.tmp"
    tmp.write_text(json.dumps(value, indent=1) + "\n")
    tmp.replace(STATE / name)


def _fail(tool: str, message: str, rc: int = 1) -> NoReturn:
    print(f"{tool}: {message}" if tool else message, file=sys.stderr)
    raise SystemExit(rc)


def _netdev(name: str, attribute: str, default: str = "") -> str:
    try:
        return (SYS_NET / name / attribute).read_text().strip()
    except OSError:
        return default


def _parser(prog: str) -> argparse.ArgumentParser:
    return argparse.ArgumentParser(prog=prog, add_help=False, allow_abbrev=False)


# -- GPUs: amd-smi, rocm-smi, rocminfo ------------------------------------------------------------


def _gpus(p: Profile) -> list[dict[str, Any]]:
    g = p["gpus"]
    cpus = int(g["cpu_nodes"])
    return [
        {
            "index": i,
            "bdf": bdf,
            "serial": g["serials"][i],
            "node": cpus + i,
            "uuid": f"{int(g['device_id'], 16):04x}{g['serials'][i][-12:].lower()}",
        }
        for i, bdf in enumerate(g["bdfs"])
    ]


def amd_smi(p: Profile, args: list[str], stdin: str, entry: dict[str, Any]) -> int:
    if args[:1] == ["metric"]:
        return _amd_metric(p, args[1:])
    if not args or args[0] not in ("static", "list", "version"):
        answers = "`static`, `list`, `metric`, `version`"
        _fail("amd-smi", f"the lab's amd-smi answers {answers}, not {args[:1]}", 2)
    g, as_json = p["gpus"], "--json" in args
    if args[0] == "version":  # amd-smi's own keys (amdsmi_commands.py version), one entry
        version = {
            "tool": "AMDSMI Tool",
            "version": "lab stand-in",
            "amdsmi_library_version": "lab stand-in",
            "rocm_version": g["rocm_version"],
        }
        print(
            json.dumps([version], indent=4)
            if as_json
            else " | ".join(f"{k}: {v}" for k, v in version.items())
        )
        return 0
    sections = [
        s for s in ("asic", "bus", "vram", "driver") if f"--{s}" in args or f"-{s[0]}" in args
    ]
    data = []
    for gpu in _gpus(p):
        if args[0] == "list":
            data.append(
                {
                    "gpu": gpu["index"],
                    "bdf": gpu["bdf"],
                    "uuid": _amd_uuid(gpu),
                    "kfd_id": 10000 + gpu["index"],
                    "node_id": gpu["node"],
                    "partition_id": 0,
                }
            )
            continue
        full = {
            "gpu": gpu["index"],
            "asic": {
                "market_name": g["market_name"],
                "vendor_id": g["vendor_id"],
                "vendor_name": g["vendor_name"],
                "device_id": g["device_id"],
                "asic_serial": gpu["serial"],
                "target_graphics_version": g["gfx"],
            },
            "bus": {"bdf": gpu["bdf"]},
            "vram": {"type": g["vram_type"], "size": {"value": g["vram_mb"], "unit": "MB"}},
            "driver": dict(g["driver"]),
        }
        data.append({k: v for k, v in full.items() if k == "gpu" or not sections or k in sections})
    if as_json:
        print(json.dumps({"gpu_data": data}, indent=4))
    else:
        print(_amd_text(data), end="")
    return 0


def _amd_metric(p: Profile, args: list[str]) -> int:
    """``amd-smi metric --ecc --json``: each GPU's ECC totals, 0 unless ecc.json in the state
    folder says otherwise (``{"3": {"total_uncorrectable_count": 1}}``: a test's fault)."""
    if not ({"--ecc", "-e"} & set(args)) or "--json" not in args:
        _fail("amd-smi", "the lab's amd-smi metric answers --ecc --json", 2)
    faults = _load("ecc.json", {})
    names = ("correctable", "uncorrectable", "deferred")
    data = []
    for gpu in _gpus(p):
        ecc = {f"total_{n}_count": 0 for n in names}
        ecc.update(cache_correctable_count=0, cache_uncorrectable_count=0)
        ecc.update(faults.get(str(gpu["index"]), {}))
        data.append({"gpu": gpu["index"], "ecc": ecc})
    print(json.dumps({"gpu_data": data}, indent=4))
    return 0


def _amd_uuid(gpu: dict[str, Any]) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_OID, gpu["bdf"]))


def _amd_text(data: list[dict[str, Any]]) -> str:
    """amd-smi's plain output: ``GPU: N`` then the fields, upper case, indented by level."""

    def lines(value: Any, depth: int) -> list[str]:
        out = []
        for key, item in value.items():
            if isinstance(item, dict) and set(item) == {"value", "unit"}:
                out.append(f"{'    ' * depth}{key.upper()}: {item['value']} {item['unit']}")
            elif isinstance(item, dict):
                out += [f"{'    ' * depth}{key.upper()}:", *lines(item, depth + 1)]
            else:
                out.append(f"{'    ' * depth}{key.upper()}: {item}")
        return out

    text = ""
    for gpu in data:
        rest = {k: v for k, v in gpu.items() if k != "gpu"}
        text += "\n".join([f"GPU: {gpu['gpu']}", *lines(rest, 1)]) + "\n\n"
    return text


def rocm_smi(p: Profile, args: list[str], stdin: str, entry: dict[str, Any]) -> int:
    g = p["gpus"]
    cards: dict[str, dict[str, str]] = {}
    for gpu in _gpus(p):
        card = cards.setdefault(f"card{gpu['index']}", {})
        if "--showproductname" in args:
            card.update(
                {
                    "Card Series": g["market_name"],
                    "Card Model": g["device_id"],
                    "Card Vendor": g["card_vendor"],
                    "Card SKU": "MI308X",
                    "Subsystem ID": g["device_id"],
                    "Device Rev": g["revision"],
                    "Node ID": str(gpu["node"]),
                    "GUID": str(40000 + gpu["index"]),
                    "GFX Version": g["gfx"],
                }
            )
        if "--showmeminfo" in args and "vram" in args:
            card.update(
                {
                    "VRAM Total Memory (B)": str(g["vram_bytes"]),
                    "VRAM Total Used Memory (B)": str(g["vram_used_bytes"]),
                }
            )
    if not any(cards.values()):
        _fail("rocm-smi", "the lab's rocm-smi answers --showproductname and --showmeminfo vram", 2)
    if "--json" in args:
        print(json.dumps(cards))
        return 0
    bar = "=" * 24
    print(f"\n{bar} ROCm System Management Interface {bar}")
    for name, fields in cards.items():
        for key, value in fields.items():
            print(f"GPU[{name.removeprefix('card')}]\t\t: {key}: {value}")
    print(f"{bar}=== End of ROCm SMI Log ==={bar}")
    return 0


def rocminfo(p: Profile, args: list[str], stdin: str, entry: dict[str, Any]) -> int:
    g, folder = p["gpus"], p["dir"]
    cpu = (folder / "rocminfo_cpu_agent.txt").read_text()
    gpu_text = (folder / "rocminfo_gpu_agent.txt").read_text()
    chip = int(g["device_id"], 16)
    agents = [_set(cpu, {"Node": n, "Internal Node ID": n}) for n in range(int(g["cpu_nodes"]))]
    for gpu in _gpus(p):
        bus, dev_fn = gpu["bdf"].split(":")[1:]
        dev, fn = dev_fn.split(".")
        bdfid = int(bus, 16) << 8 | int(dev, 16) << 3 | int(fn, 16)
        agents.append(
            _set(
                gpu_text,
                {
                    "Uuid": f"GPU-{gpu['uuid'][-16:]}",
                    "Marketing Name": g["market_name"],
                    "Node": gpu["node"],
                    "Chip ID": f"{chip}({g['device_id']})",
                    "BDFID": bdfid,
                    "Internal Node ID": gpu["node"],
                    "Compute Unit": g["compute_units"],
                },
            )
        )
    out = (folder / "rocminfo_head.txt").read_text()
    for number, agent in enumerate(agents, 1):
        out += f"{'*' * 7:<25}\n{f'Agent {number}':<25}\n{'*' * 7:<25}\n{agent}"
    print(out + f"{'*** Done ***':<25}")
    return 0


def _set(block: str, values: dict[str, Any]) -> str:
    """Replace the values of ``  Key:   value`` lines, keeping rocminfo's columns."""
    out = []
    for line in block.splitlines():
        match = re.match(r"^(  (\S[^:]*):\s+)(\S.*?)(\s*)$", line)
        if match and match.group(2) in values:
            width = len(match.group(3)) + len(match.group(4))
            line = match.group(1) + str(values[match.group(2)]).ljust(width)
        out.append(line)
    return "\n".join(out) + "\n"


# -- RDMA: rdma, ibv_devinfo ----------------------------------------------------------------------


def _ports(p: Profile) -> list[dict[str, Any]]:
    ports = []
    for index, port in enumerate(p["rdma"]["ports"]):
        up = _netdev(port["netdev"], "operstate") in ("up", "unknown")
        mtu = int(_netdev(port["netdev"], "mtu", "1500"))
        ports.append(
            {
                **port,
                "ifindex": index,
                "up": up,
                "mtu": mtu,
                "netdev_index": int(_netdev(port["netdev"], "ifindex", "0")),
            }
        )
    return ports


def rdma(p: Profile, args: list[str], stdin: str, entry: dict[str, Any]) -> int:
    as_json = False
    while args and args[0].startswith("-"):
        option = args.pop(0)
        if option in ("-j", "-json", "--json"):
            as_json = True
        elif option not in ("-p", "-pretty", "--pretty", "-d", "-details", "--details"):
            _fail("", f'Unknown option "{option}"', 1)
    objects = {"link": _rdma_link, "dev": _rdma_dev}
    obj = args[0] if args else "link"
    matches = [name for name in objects if name.startswith(obj)]
    if not matches:
        _fail("", f'Object "{obj}" is unknown, try "rdma help".', 1)
    rest = args[1:]
    if rest and rest[0] in ("show", "list"):
        rest = rest[1:]
    rows = objects[matches[0]](_ports(p), p, rest[0] if rest else None)
    if as_json:
        print(json.dumps([json_row for json_row, _ in rows]))
    else:
        print("".join(text + "\n" for _, text in rows), end="")
    return 0


Row = tuple[dict[str, Any], str]


def _rdma_link(ports: list[dict[str, Any]], p: Profile, which: str | None) -> list[Row]:
    rows = []
    for port in ports:
        if which not in (None, port["dev"], f"{port['dev']}/1"):
            continue
        state, phys = ("ACTIVE", "LINK_UP") if port["up"] else ("DOWN", "DISABLED")
        row = {
            "ifindex": port["ifindex"],
            "ifname": port["dev"],
            "port": 1,
            "state": state,
            "physical_state": phys,
            "netdev": port["netdev"],
            "netdev_index": port["netdev_index"],
        }
        rows.append(
            (
                row,
                f"link {port['dev']}/1 state {state} physical_state {phys} "
                f"netdev {port['netdev']} ",
            )
        )
    if which is not None and not rows:
        _fail("", f"Wrong device name {which.split('/')[0]}", 1)
    return rows


def _rdma_dev(ports: list[dict[str, Any]], p: Profile, which: str | None) -> list[Row]:
    r, rows = p["rdma"], []
    for port in ports:
        if which not in (None, port["dev"]):
            continue
        row = {
            "ifindex": port["ifindex"],
            "ifname": port["dev"],
            "node_type": "ca",
            "fw": r["fw_ver"],
            "node_guid": port["node_guid"],
            "sys_image_guid": r["sys_image_guid"],
        }
        rows.append(
            (
                row,
                f"{port['ifindex']}: {port['dev']}: node_type ca fw {r['fw_ver']} "
                f"node_guid {port['node_guid']} sys_image_guid {r['sys_image_guid']} ",
            )
        )
    if which is not None and not rows:
        _fail("", f"Wrong device name {which}", 1)
    return rows


#: The IB MTUs (ibv_devinfo prints the size and the enum) and RoCE's header overhead.
IB_MTUS = [(4096, 5), (2048, 4), (1024, 3), (512, 2), (256, 1)]
ROCE_OVERHEAD = 88


def _ib_mtu(netdev_mtu: int) -> str:
    size, code = next((s, c) for s, c in IB_MTUS if s <= netdev_mtu - ROCE_OVERHEAD or s == 256)
    return f"{size} ({code})"


def ibv_devinfo(p: Profile, args: list[str], stdin: str, entry: dict[str, Any]) -> int:
    parser = _parser("ibv_devinfo")
    parser.add_argument("-d", "--ib-dev")
    parser.add_argument("-i", "--ib-port", type=int)
    parser.add_argument("-v", "--verbose", action="store_true")
    parser.add_argument("-l", "--list", action="store_true")
    opts = parser.parse_args(args)
    r, ports = p["rdma"], _ports(p)
    if opts.ib_dev and opts.ib_dev not in [port["dev"] for port in ports]:
        _fail("", f"IB device '{opts.ib_dev}' wasn't found", 255)
    if opts.list:
        print(f"{len(ports)} HCAs found:")
        print("".join(f"\t{port['dev']}\n" for port in ports), end="")
        return 0
    blocks = []
    for port in ports:
        if opts.ib_dev not in (None, port["dev"]):
            continue
        state = "PORT_ACTIVE (4)" if port["up"] else "PORT_DOWN (1)"
        active = _ib_mtu(port["mtu"]) if port["up"] else "1024 (3)"
        lines = [
            f"hca_id:\t{port['dev']}",
            "\ttransport:\t\t\tInfiniBand (0)",
            f"\tfw_ver:\t\t\t\t{r['fw_ver']}",
            f"\tnode_guid:\t\t\t{port['node_guid']}",
            f"\tsys_image_guid:\t\t\t{r['sys_image_guid']}",
            f"\tvendor_id:\t\t\t{r['vendor_id']}",
            f"\tvendor_part_id:\t\t\t{r['vendor_part_id']}",
            "\thw_ver:\t\t\t\t0x0",
            f"\tboard_id:\t\t\t{r['board_id']}",
            "\tphys_port_cnt:\t\t\t1",
            "\t\tport:\t1",
            f"\t\t\tstate:\t\t\t{state}",
            "\t\t\tmax_mtu:\t\t4096 (5)",
            f"\t\t\tactive_mtu:\t\t{active}",
            "\t\t\tsm_lid:\t\t\t0",
            "\t\t\tport_lid:\t\t0",
            "\t\t\tport_lmc:\t\t0x00",
            "\t\t\tlink_layer:\t\tEthernet",
        ]
        if opts.verbose:
            guid = port["node_guid"]  # the link-local GID's interface id: the EUI-64, bit 1 flipped
            eui = f"{int(guid[:2], 16) ^ 2:02x}{guid[2:]}"
            for index, kind in enumerate(r["gid_types"]):
                lines.append(f"\t\t\tGID[{index:3}]:\t\tfe80:0000:0000:0000:{eui}, {kind}")
        blocks.append("\n".join(lines) + "\n")
    print("\n".join(blocks))
    return 0


# -- mlnx_qos -----------------------------------------------------------------------------------


def mlnx_qos(p: Profile, args: list[str], stdin: str, entry: dict[str, Any]) -> int:
    parser = _parser("mlnx_qos")
    parser.error = lambda message: _fail(  # type: ignore[method-assign]
        "",
        "Usage: mlnx_qos -i <interface> [options]\n\nmlnx_qos: error: "
        + message.replace("unrecognized arguments", "no such option"),
        2,
    )
    parser.add_argument("-i", "--interface", required=True)
    parser.add_argument("--trust", choices=["pcp", "dscp"])
    parser.add_argument("-f", "--pfc")
    for option in (
        "--dscp2prio",
        "-p",
        "--prio_tc",
        "-s",
        "--tsa",
        "-t",
        "--tcbw",
        "-r",
        "--ratelimit",
        "--cable_len",
        "-d",
        "--dcbx",
        "--buffer_size",
        "--prio2buffer",
    ):
        parser.add_argument(option, action="append")  # accepted and logged, not modelled
    opts = parser.parse_args(args)
    interface = opts.interface
    if interface not in [port["netdev"] for port in p["rdma"]["ports"]]:
        _fail("", f"Interface {interface} doesn't exist", 1)  # wording not checked upstream
    state = _load("mlnx_qos.json", {})
    mine = state.setdefault(interface, {"trust": "pcp", "pfc": [0] * 8})
    if opts.trust:
        mine["trust"] = opts.trust
    if opts.pfc is not None:
        values = opts.pfc.split(",")
        if len(values) != 8 or any(v not in ("0", "1") for v in values):
            _fail(
                "",
                f"Usage: mlnx_qos -i <interface> [options]\n\nmlnx_qos: error: "
                f"Invalid PFC value: {opts.pfc} (8 comma separated 0/1 values)",
                2,
            )
        mine["pfc"] = [int(v) for v in values]
    if opts.trust or opts.pfc is not None:  # a query changes nothing, as on the real NIC
        _save("mlnx_qos.json", state)
    print(_qos_text(mine), end="")
    return 0


def _qos_text(state: dict[str, Any]) -> str:
    """The format of reference/mlnx_qos_trust_dscp_pfc3_output.txt (a real mlnx_qos)."""
    out = ["DCBX mode: OS controlled", f"Priority trust state: {state['trust']}"]
    if state["trust"] == "dscp":
        out.append("dscp2prio mapping:")
        for prio in range(8):
            dscps = ",".join(f"{d:02d}" for d in range(prio * 8 + 7, prio * 8 - 1, -1))
            out.append(f"        prio:{prio} dscp:{dscps},")
    out += [
        "Cable len: 7",
        "PFC configuration:",
        "        priority    0   1   2   3   4   5   6   7",
        "        enabled     " + "".join(f"{v}   " for v in state["pfc"]),
    ]
    for tc, prio in enumerate([1, 0, 2, 3, 4, 5, 6, 7]):
        out += [f"tc: {tc} ratelimit: unlimited, tsa: vendor", f"         priority:  {prio}"]
    return "\n".join(out) + "\n"


# -- nvmetcli: the target's configfs tree -------------------------------------------------------


def nvmetcli(p: Profile, args: list[str], stdin: str, entry: dict[str, Any]) -> int:
    command = args[0] if args else "ls"
    path = Path(args[1]) if len(args) > 1 else NVMET_CONFIG
    if command == "clear":
        _nvmet_clear()
    elif command == "restore":
        if str(path) in ("-", "/dev/stdin"):
            text = stdin
        elif path.exists():
            text = path.read_text()
        else:
            print("No saved config file")
            return 0
        try:
            config = json.loads(text)
        except ValueError as exc:
            _fail("", f"Error processing config file at {path}, error {exc}", 1)
        entry["input"] = config
        _nvmet_clear()
        for error in _nvmet_restore(config):
            print(error)  # like nvmetcli: reported, and the exit code stays 0
    elif command == "save":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(_nvmet_dump(), indent=2) + "\n")
    elif command == "ls":
        for item in sorted(NVMET.rglob("*")):
            print(item.relative_to(NVMET))
    else:
        _fail("", f"Unknown command {command}: the lab's nvmetcli has restore, clear, save, ls", 1)
    return 0


def _nvmet_clear() -> None:
    for group in ("ports", "subsystems", "hosts"):
        folder = NVMET / group
        if folder.exists():
            for child in folder.iterdir():
                shutil.rmtree(child)
        folder.mkdir(parents=True, exist_ok=True)


def _write_attrs(folder: Path, prefix: str, attrs: dict[str, Any]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for key, value in attrs.items():
        (folder / f"{prefix}_{key}").write_text(f"{value}\n")


def _nvmet_restore(config: dict[str, Any]) -> list[str]:
    """Write hosts, subsystems (attributes, allowed hosts, namespaces) and ports (addresses,
    parameters, ANA groups, subsystem links) with configfs's attribute-file names."""
    errors = []
    for host in config.get("hosts", []):
        (NVMET / "hosts" / host["nqn"]).mkdir(parents=True, exist_ok=True)
    for sub in config.get("subsystems", []):
        folder = NVMET / "subsystems" / sub["nqn"]
        _write_attrs(folder, "attr", {"allow_any_host": "0", **sub.get("attr", {})})
        (folder / "allowed_hosts").mkdir(exist_ok=True)
        (folder / "namespaces").mkdir(exist_ok=True)
        for host in sub.get("allowed_hosts", []):
            target = NVMET / "hosts" / host
            if not target.exists():
                errors.append(f"Could not find host {host}")
                continue
            (folder / "allowed_hosts" / host).symlink_to(target)
        for ns in sub.get("namespaces", []):
            ns_dir = folder / "namespaces" / str(ns["nsid"])
            _write_attrs(ns_dir, "device", ns.get("device", {}))
            (ns_dir / "ana_grpid").write_text(f"{ns.get('ana_grpid', 1)}\n")
            enable = int(ns.get("enable", 0))
            device = ns.get("device", {}).get("path", "")
            if enable and not Path(device).exists():
                errors.append(
                    f"Error enabling namespace {ns['nsid']} of {sub['nqn']}: cannot open {device}"
                )
                enable = 0
            (ns_dir / "enable").write_text(f"{enable}\n")
    for port in config.get("ports", []):
        folder = NVMET / "ports" / str(port["portid"])
        _write_attrs(folder, "addr", port.get("addr", {}))
        _write_attrs(folder, "param", port.get("param", {}))
        for group in port.get("ana_groups", []):
            ana = folder / "ana_groups" / str(group["grpid"])
            ana.mkdir(parents=True, exist_ok=True)
            (ana / "ana_state").write_text(f"{group.get('ana', {}).get('state', 'optimized')}\n")
        (folder / "referrals").mkdir(exist_ok=True)
        (folder / "subsystems").mkdir(exist_ok=True)
        for nqn in port.get("subsystems", []):
            target = NVMET / "subsystems" / nqn
            if not target.exists():
                errors.append(f"Could not find subsystem {nqn}")
                continue
            (folder / "subsystems" / nqn).symlink_to(target)
    return errors


def _attrs(folder: Path, prefix: str) -> dict[str, str]:
    return {
        f.name.removeprefix(f"{prefix}_"): f.read_text().strip()
        for f in sorted(folder.glob(f"{prefix}_*"))
    }


def _nvmet_dump() -> dict[str, Any]:
    """The tree read back in nvmetcli's saved-config format (reference/nvmetcli_*.json)."""
    hosts = [{"nqn": h.name} for h in sorted((NVMET / "hosts").glob("*"))]
    subsystems = []
    for folder in sorted((NVMET / "subsystems").glob("*")):
        namespaces = [
            {
                "device": _attrs(ns, "device"),
                "enable": int((ns / "enable").read_text()),
                "nsid": int(ns.name),
                "ana_grpid": int((ns / "ana_grpid").read_text()),
            }
            for ns in sorted((folder / "namespaces").glob("*"), key=lambda n: int(n.name))
        ]
        subsystems.append(
            {
                "allowed_hosts": sorted(h.name for h in (folder / "allowed_hosts").glob("*")),
                "attr": _attrs(folder, "attr"),
                "namespaces": namespaces,
                "nqn": folder.name,
            }
        )
    ports = []
    for folder in sorted((NVMET / "ports").glob("*"), key=lambda n: int(n.name)):
        ana = [
            {"ana": {"state": (g / "ana_state").read_text().strip()}, "grpid": int(g.name)}
            for g in sorted((folder / "ana_groups").glob("*"))
        ]
        ports.append(
            {
                "addr": _attrs(folder, "addr"),
                "ana_groups": ana,
                "param": _attrs(folder, "param"),
                "portid": int(folder.name),
                "referrals": [],
                "subsystems": sorted(s.name for s in (folder / "subsystems").glob("*")),
            }
        )
    return {"hosts": hosts, "ports": ports, "subsystems": subsystems}


# -- nvme: the initiator ----------------------------------------------------------------------


def _fabric(p: Profile) -> dict[str, Any] | None:
    """/etc/fxkit-lab/fabric.json: what the simulated fabric exports (tests write it), as
    ``{"subsystems": {NQN: {"namespaces": [size in bytes, ...], "traddr": ..., ...}}}``."""
    try:
        return dict(json.loads(FABRIC.read_text()).get("subsystems", {}))
    except FileNotFoundError:
        return None


def _connect_parser(prog: str) -> argparse.ArgumentParser:
    parser = _parser(prog)
    parser.error = lambda message: _fail(prog, message, 22)  # type: ignore[method-assign]
    for short, long, kind in (
        ("-t", "--transport", str),
        ("-a", "--traddr", str),
        ("-s", "--trsvcid", str),
        ("-n", "--nqn", str),
        ("-q", "--hostnqn", str),
        ("-I", "--hostid", str),
        ("-i", "--nr-io-queues", int),
        ("-W", "--nr-write-queues", int),
        ("-P", "--nr-poll-queues", int),
        ("-Q", "--queue-size", int),
        ("-k", "--keep-alive-tmo", int),
        ("-c", "--reconnect-delay", int),
        ("-l", "--ctrl-loss-tmo", int),
        ("-T", "--tos", int),
        ("-w", "--host-traddr", str),
        ("-f", "--host-iface", str),
        ("-o", "--output-format", str),
        ("-C", "--config", str),
    ):
        parser.add_argument(short, long, type=kind)
    for short, long in (
        ("-D", "--duplicate-connect"),
        ("-p", "--persistent"),
        ("-g", "--hdr-digest"),
        ("-G", "--data-digest"),
        ("-v", "--verbose"),
    ):
        parser.add_argument(short, long, action="store_true")
    return parser


def _hostnqn(opts: argparse.Namespace) -> str:
    if opts.hostnqn:
        return str(opts.hostnqn)
    if HOSTNQN.exists():
        return HOSTNQN.read_text().strip()
    # nvme-cli derives it from the machine's product UUID: stable, like this one
    return f"nqn.2014-08.org.nvmexpress:uuid:{uuid.uuid5(uuid.NAMESPACE_DNS, os.uname().nodename)}"


def _connect(p: Profile, opts: argparse.Namespace, state: dict[str, Any]) -> dict[str, Any]:
    """Add one controller (and its namespaces) to ``state``; exits the way nvme-cli does."""
    for required in ("transport", "nqn", "traddr"):
        if not getattr(opts, required) and not (required == "traddr" and opts.transport == "loop"):
            _fail("", f"required argument [--{required} | -{required[0]}] not specified", 22)
    trsvcid = opts.trsvcid or ("4420" if opts.transport in ("rdma", "tcp") else "")
    for ctrl in state["controllers"]:
        same = (ctrl["nqn"], ctrl["transport"], ctrl["traddr"], ctrl["trsvcid"])
        if same == (opts.nqn, opts.transport, opts.traddr, trsvcid) and not opts.duplicate_connect:
            _fail("", "already connected", 1)  # nvme-cli 2.x fabrics.c (errno EALREADY)
    fabric = _fabric(p)
    if fabric is not None and opts.nqn not in fabric:
        _fail("", "could not add new controller: failed to write to nvme-fabrics device", 1)
    exported = (fabric or {}).get(opts.nqn, {})
    sizes = exported.get("namespaces", [p["nvme"]["namespace_bytes"]])
    taken = {c["instance"] for c in state["controllers"]}
    instance = next(i for i in range(len(taken) + 1) if i not in taken)
    namespaces = []
    for nsid, size in enumerate(sizes, 1):
        device = Path(f"/dev/nvme{instance}n{nsid}")
        with open(device, "wb") as f:
            f.truncate(int(size))  # sparse: blkid finds no filesystem on it
        namespaces.append({"nsid": nsid, "size": int(size), "device": str(device)})
    ctrl = {
        "instance": instance,
        "nqn": opts.nqn,
        "transport": opts.transport,
        "traddr": opts.traddr or "",
        "trsvcid": trsvcid,
        "hostnqn": _hostnqn(opts),
        "hostid": opts.hostid or (HOSTID.read_text().strip() if HOSTID.exists() else ""),
        "serial": exported.get("serial", uuid.uuid5(uuid.NAMESPACE_URL, opts.nqn).hex[:20]),
        "model": exported.get("model", p["nvme"]["model"]),
        "namespaces": namespaces,
        "options": {k: v for k, v in vars(opts).items() if v not in (None, False)},
    }
    state["controllers"].append(ctrl)
    return ctrl


def _disconnect(ctrl: dict[str, Any]) -> None:
    for ns in ctrl["namespaces"]:
        Path(ns["device"]).unlink(missing_ok=True)


def _output_format(args: list[str]) -> str:
    for index, arg in enumerate(args):
        if arg in ("-o", "--output-format") and index + 1 < len(args):
            return args[index + 1]
        for prefix in ("-o=", "--output-format=", "-o"):
            if arg.startswith(prefix) and arg != prefix:
                return arg.removeprefix(prefix)
    return "normal"


def nvme(p: Profile, args: list[str], stdin: str, entry: dict[str, Any]) -> int:
    command, rest = (args[0], args[1:]) if args else ("help", [])
    state = _load("nvme.json", {"controllers": []})
    as_json = _output_format(rest) == "json"
    if command == "gen-hostnqn":
        print(f"nqn.2014-08.org.nvmexpress:uuid:{uuid.uuid4()}")
    elif command == "list":
        _nvme_list(p, state, as_json)
    elif command == "list-subsys":
        _nvme_list_subsys(p, state)
    elif command == "connect":
        ctrl = _connect(p, _connect_parser("connect").parse_args(rest), state)
        _save("nvme.json", state)
        print(f"connecting to device: nvme{ctrl['instance']}")
    elif command in ("discover", "connect-all"):
        _discover(p, command, rest, state)
    elif command == "disconnect":
        parser = _parser("disconnect")
        parser.add_argument("-n", "--nqn")
        parser.add_argument("-d", "--device")
        opts = parser.parse_args(rest)
        if not opts.nqn and not opts.device:
            _fail("", "need a device name (-d <device>) or the NQN (-n <nqn>)", 22)
        gone = [
            c
            for c in state["controllers"]
            if c["nqn"] == opts.nqn
            or f"nvme{c['instance']}" == (opts.device or "").removeprefix("/dev/")
        ]
        for ctrl in gone:
            _disconnect(ctrl)
            state["controllers"].remove(ctrl)
        _save("nvme.json", state)
        if opts.nqn:
            print(f"NQN:{opts.nqn} disconnected {len(gone)} controller(s)")
    elif command == "disconnect-all":
        for ctrl in state["controllers"]:
            _disconnect(ctrl)
        _save("nvme.json", {"controllers": []})
    else:
        _fail("", f"the lab's nvme has no command {command!r}", 1)
    return 0


def _nvme_list(p: Profile, state: dict[str, Any], as_json: bool) -> None:
    """``nvme list`` in nvme-cli 2.x's shape (reference/nvme_list_o_json_nvmecli2x.json)."""
    sector, devices = int(p["nvme"]["sector_size"]), []
    for ctrl in state["controllers"]:
        for ns in ctrl["namespaces"]:
            devices.append(
                {
                    "NameSpace": ns["nsid"],
                    "DevicePath": ns["device"],
                    "GenericPath": ns["device"].replace("/dev/nvme", "/dev/ng"),
                    "Firmware": p["nvme"]["firmware"],
                    "ModelNumber": ctrl["model"],
                    "SerialNumber": ctrl["serial"],
                    "UsedBytes": 0,
                    "MaximumLBA": ns["size"] // sector,
                    "PhysicalSize": ns["size"],
                    "SectorSize": sector,
                }
            )
    if as_json:
        print(json.dumps({"Devices": devices}, indent=2))
        return
    print(
        f"{'Node':<21} {'Generic':<21} {'SN':<20} {'Model':<40} {'Namespace':<9} "
        f"{'Usage':<26} {'Format':<16} {'FW Rev':<8}"
    )
    print(" ".join("-" * n for n in (21, 21, 20, 40, 9, 26, 16, 8)))
    for d in devices:
        size = f"{d['PhysicalSize'] / 1e9:6.2f}  GB"
        print(
            f"{d['DevicePath']:<21} {d['GenericPath']:<21} {d['SerialNumber']:<20} "
            f"{d['ModelNumber']:<40} {d['NameSpace']:<9} {f'  0.00   B / {size}':<26} "
            f"{d['SectorSize']:>3}   B +  0 B   {d['Firmware']:<8}"
        )


def _nvme_list_subsys(p: Profile, state: dict[str, Any]) -> None:
    """``nvme list-subsys -o json`` in nvme-cli 2.x's list shape (nvme-print-json.c)."""
    hosts: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for ctrl in state["controllers"]:
        address = f"traddr={ctrl['traddr']},trsvcid={ctrl['trsvcid']}"
        hosts.setdefault((ctrl["hostnqn"], ctrl["hostid"]), []).append(
            {
                "Name": f"nvme-subsys{ctrl['instance']}",
                "NQN": ctrl["nqn"],
                "IOPolicy": p["nvme"]["iopolicy"],
                "Paths": [
                    {
                        "Name": f"nvme{ctrl['instance']}",
                        "Transport": ctrl["transport"],
                        "Address": address,
                        "State": "live",
                    }
                ],
            }
        )
    out = []
    for (hostnqn, hostid), subsystems in hosts.items():
        host: dict[str, Any] = {"HostNQN": hostnqn}
        if hostid:
            host["HostID"] = hostid
        out.append({**host, "Subsystems": subsystems})
    print(json.dumps(out, indent=2))


def _discover(p: Profile, command: str, args: list[str], state: dict[str, Any]) -> None:
    """Discovery against the simulated fabric; ``connect-all`` connects what it finds."""
    parser = _connect_parser(command)
    if args:
        targets = [parser.parse_args(args)]
    elif DISCOVERY_CONF.exists():
        lines = [line.split() for line in DISCOVERY_CONF.read_text().splitlines()]
        targets = [parser.parse_args(words) for words in lines if words and words[0][0] != "#"]
    else:
        _fail("", f"Failed to open config file {DISCOVERY_CONF}: no such file", 2)
    fabric = _fabric(p) or {}
    for target in targets:
        found = [
            (nqn, sub)
            for nqn, sub in fabric.items()
            if sub.get("traddr", target.traddr) == target.traddr
        ]
        if command == "discover":
            print(f"\nDiscovery Log Number of Records {len(found)}, Generation counter 1")
            for number, (nqn, sub) in enumerate(found):
                print(
                    f"=====Discovery Log Entry {number}======\ntrtype:  {target.transport}\n"
                    f"adrfam:  ipv4\nsubtype: nvme subsystem\ntreq:    not specified\n"
                    f"portid:  {sub.get('portid', 1)}\ntrsvcid: {target.trsvcid or '4420'}\n"
                    f"subnqn:  {nqn}\ntraddr:  {target.traddr}"
                )
            continue
        connected = {c["nqn"] for c in state["controllers"]}
        for nqn, _ in found:
            if nqn not in connected:
                target.nqn = nqn
                ctrl = _connect(p, target, state)
                print(f"connecting to device: nvme{ctrl['instance']}")
    _save("nvme.json", state)


TOOLS: dict[str, Callable[[Profile, list[str], str, dict[str, Any]], int]] = {
    "amd-smi": amd_smi,
    "rocm-smi": rocm_smi,
    "rocminfo": rocminfo,
    "rdma": rdma,
    "ibv_devinfo": ibv_devinfo,
    "mlnx_qos": mlnx_qos,
    "nvmetcli": nvmetcli,
    "nvme": nvme,
}

if __name__ == "__main__":
    sys.exit(main())
