"""nvme: the initiator (nvme-cli).

What it connects to, first found of: /etc/fxkit-lab/fabric.json (a test writes it); what the
fleet's target lab hosts export (their nvmetcli stand-in publishes it in the shared folder: a
subsystem this host's NQN is not allowed to see, or that no target exports at the address, does
not connect, as the kernel refuses it; a namespace on a target's drive is that very file, so what
one initiator writes another reads); else any NQN, one namespace of the profile's size.
"""

from __future__ import annotations

import argparse
import json
import os
import uuid
from pathlib import Path
from typing import Any

from .common import (
    DISCOVERY_CONF,
    FABRIC,
    HOSTID,
    HOSTNQN,
    SHARED,
    Profile,
    Tool,
    fail,
    load_state,
    new_parser,
    save_state,
)

# -- nvme: the initiator ----------------------------------------------------------------------


def _fabric(p: Profile) -> dict[str, Any] | None:
    """/etc/fxkit-lab/fabric.json: what the simulated fabric exports (tests write it), as
    ``{"subsystems": {NQN: {"namespaces": [size in bytes, ...], "traddr": ..., ...}}}``."""
    try:
        return dict(json.loads(FABRIC.read_text()).get("subsystems", {}))
    except FileNotFoundError:
        return None


def _exports() -> list[dict[str, Any]] | None:
    """What the fleet's targets export (``SHARED/nvmet/*.json``); None where none published."""
    folder = SHARED / "nvmet"
    files = sorted(folder.glob("*.json")) if folder.is_dir() else []
    if not files:
        return None
    return [e for f in files for e in json.loads(f.read_text()).get("exports", [])]


def _visible(
    exports: list[dict[str, Any]], traddr: str, trsvcid: str, hostnqn: str
) -> list[dict[str, Any]]:
    """The exports at ``traddr`` (and ``trsvcid``) that ``hostnqn`` is allowed to see."""
    return [
        e
        for e in exports
        if e["traddr"] == traddr
        and (not trsvcid or e["trsvcid"] == trsvcid)
        and (e["allow_any_host"] or hostnqn in e["allowed_hosts"])
    ]


def _connect_parser(prog: str) -> argparse.ArgumentParser:
    parser = new_parser(prog)
    parser.error = lambda message: fail(prog, message, 22)  # type: ignore[method-assign]
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
            fail("", f"required argument [--{required} | -{required[0]}] not specified", 22)
    trsvcid = opts.trsvcid or ("4420" if opts.transport in ("rdma", "tcp") else "")
    for ctrl in state["controllers"]:
        same = (ctrl["nqn"], ctrl["transport"], ctrl["traddr"], ctrl["trsvcid"])
        if same == (opts.nqn, opts.transport, opts.traddr, trsvcid) and not opts.duplicate_connect:
            fail("", "already connected", 1)  # nvme-cli 2.x fabrics.c (errno EALREADY)
    refused = "could not add new controller: failed to write to nvme-fabrics device"
    fabric = _fabric(p)
    if fabric is not None and opts.nqn not in fabric:
        fail("", refused, 1)
    exported = (fabric or {}).get(opts.nqn, {})
    sizes = exported.get("namespaces", [p["nvme"]["namespace_bytes"]])
    found = [(nsid, int(size), None) for nsid, size in enumerate(sizes, 1)]
    exports = _exports() if fabric is None else None
    if exports is not None:  # the fleet's targets: what they export, to whom they allow it
        wired = _visible(exports, opts.traddr or "", trsvcid, _hostnqn(opts))
        match = [e for e in wired if e["nqn"] == opts.nqn]
        if not match:
            fail("", refused, 1)
        found = [(ns["nsid"], ns["size"], ns["path"]) for ns in match[0]["namespaces"]]
    taken = {c["instance"] for c in state["controllers"]}
    instance = next(i for i in range(len(taken) + 1) if i not in taken)
    namespaces = []
    for nsid, size, path in found:
        device = Path(f"/dev/nvme{instance}n{nsid}")
        device.unlink(missing_ok=True)
        if path:
            device.symlink_to(path)  # the target's drive itself
        else:
            with open(device, "wb") as f:
                f.truncate(size)  # sparse: blkid finds no filesystem on it
        namespaces.append({"nsid": nsid, "size": size, "device": str(device)})
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
    state = load_state("nvme.json", {"controllers": []})
    as_json = _output_format(rest) == "json"
    if command == "gen-hostnqn":
        print(f"nqn.2014-08.org.nvmexpress:uuid:{uuid.uuid4()}")
    elif command == "list":
        _nvme_list(p, state, as_json)
    elif command == "list-subsys":
        _nvme_list_subsys(p, state)
    elif command == "connect":
        ctrl = _connect(p, _connect_parser("connect").parse_args(rest), state)
        save_state("nvme.json", state)
        print(f"connecting to device: nvme{ctrl['instance']}")
    elif command in ("discover", "connect-all"):
        _discover(p, command, rest, state)
    elif command == "disconnect":
        parser = new_parser("disconnect")
        parser.add_argument("-n", "--nqn")
        parser.add_argument("-d", "--device")
        opts = parser.parse_args(rest)
        if not opts.nqn and not opts.device:
            fail("", "need a device name (-d <device>) or the NQN (-n <nqn>)", 22)
        gone = [
            c
            for c in state["controllers"]
            if c["nqn"] == opts.nqn
            or f"nvme{c['instance']}" == (opts.device or "").removeprefix("/dev/")
        ]
        for ctrl in gone:
            _disconnect(ctrl)
            state["controllers"].remove(ctrl)
        save_state("nvme.json", state)
        if opts.nqn:
            print(f"NQN:{opts.nqn} disconnected {len(gone)} controller(s)")
    elif command == "disconnect-all":
        for ctrl in state["controllers"]:
            _disconnect(ctrl)
        save_state("nvme.json", {"controllers": []})
    else:
        fail("", f"the lab's nvme has no command {command!r}", 1)
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
        fail("", f"Failed to open config file {DISCOVERY_CONF}: no such file", 2)
    fabric = _fabric(p)
    exports = _exports() if fabric is None else None
    for target in targets:
        found = [
            (nqn, sub)
            for nqn, sub in (fabric or {}).items()
            if sub.get("traddr", target.traddr) == target.traddr
        ]
        if exports is not None:
            seen = _visible(exports, target.traddr or "", target.trsvcid or "", _hostnqn(target))
            found = [(e["nqn"], {"portid": 1}) for e in seen]
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
    save_state("nvme.json", state)


TOOLS: dict[str, Tool] = {
    "nvme": nvme,
}
