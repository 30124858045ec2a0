"""nvmetcli: the target's configfs tree.

After each change the target publishes what it exports in the fleet's shared folder
(``SHARED/nvmet/ADDRESS.json``): per port address and service, the subsystems linked to it, with
their allowed hosts and enabled namespaces (each its size and, where it lives in the shared
folder, its path). That is what an initiator's nvme stand-in discovers and connects to.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from .common import NVMET, NVMET_CONFIG, SHARED, Profile, Tool, fail, own_address

# -- nvmetcli: the target's configfs tree -------------------------------------------------------


def nvmetcli(p: Profile, args: list[str], stdin: str, entry: dict[str, Any]) -> int:
    command = args[0] if args else "ls"
    path = Path(args[1]) if len(args) > 1 else NVMET_CONFIG
    if command == "clear":
        _nvmet_clear()
        _publish()
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
            fail("", f"Error processing config file at {path}, error {exc}", 1)
        entry["input"] = config
        _nvmet_clear()
        for error in _nvmet_restore(config):
            print(error)  # like nvmetcli: reported, and the exit code stays 0
        _publish()
    elif command == "save":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(_nvmet_dump(), indent=2) + "\n")
    elif command == "ls":
        for item in sorted(NVMET.rglob("*")):
            print(item.relative_to(NVMET))
    else:
        fail("", f"Unknown command {command}: the lab's nvmetcli has restore, clear, save, ls", 1)
    return 0


def _publish() -> None:
    """What this target exports, for the fleet's initiators (the shared folder, if any)."""
    if not SHARED.is_dir():
        return
    dump = _nvmet_dump()
    subsystems = {sub["nqn"]: sub for sub in dump["subsystems"]}
    exports = []
    for port in dump["ports"]:
        for nqn in port["subsystems"]:
            sub = subsystems[nqn]
            namespaces = []
            for ns in sub["namespaces"]:
                device = Path(ns["device"].get("path", ""))
                if not ns["enable"] or not device.exists():
                    continue
                real = device.resolve()
                shared = real.is_relative_to(SHARED.resolve())
                namespaces.append(
                    {"nsid": ns["nsid"], "size": real.stat().st_size,
                     "path": str(real) if shared else None}
                )  # fmt: skip
            exports.append(
                {
                    "traddr": port["addr"].get("traddr", ""),
                    "trsvcid": port["addr"].get("trsvcid", ""),
                    "trtype": port["addr"].get("trtype", ""),
                    "nqn": nqn,
                    "allow_any_host": sub["attr"].get("allow_any_host", "0") == "1",
                    "allowed_hosts": sub["allowed_hosts"],
                    "namespaces": namespaces,
                }
            )
    folder = SHARED / "nvmet"
    folder.mkdir(exist_ok=True)
    tmp = folder / f".{own_address()}.tmp"
    tmp.write_text(json.dumps({"exports": exports}, indent=1) + "\n")
    tmp.replace(folder / f"{own_address()}.json")


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


TOOLS: dict[str, Tool] = {
    "nvmetcli": nvmetcli,
}
