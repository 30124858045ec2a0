"""GPUs: amd-smi, rocm-smi, rocminfo."""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

from .common import Profile, Tool, fail, load_state

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
    more = {
        "metric": _amd_metric,
        "firmware": _amd_firmware,
        "monitor": _amd_monitor,
        "topology": _amd_topology,
    }
    if args[:1] and args[0] in more:
        return more[args[0]](p, args[1:])
    if not args or args[0] not in ("static", "list", "version"):
        answers = "`static`, `list`, `version`, " + ", ".join(f"`{name}`" for name in more)
        fail("amd-smi", f"the lab's amd-smi answers {answers}, not {args[:1]}", 2)
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
        fail("amd-smi", "the lab's amd-smi metric answers --ecc --json", 2)
    faults = load_state("ecc.json", {})
    names = ("correctable", "uncorrectable", "deferred")
    data = []
    for gpu in _gpus(p):
        ecc = {f"total_{n}_count": 0 for n in names}
        ecc.update(cache_correctable_count=0, cache_uncorrectable_count=0)
        ecc.update(faults.get(str(gpu["index"]), {}))
        data.append({"gpu": gpu["index"], "ecc": ecc})
    print(json.dumps({"gpu_data": data}, indent=4))
    return 0


def _amd_firmware(p: Profile, args: list[str]) -> int:
    """``amd-smi firmware [--json]``: each GPU's ``fw_list`` of ``fw_id``/``fw_version``
    (amdsmi_cli's firmware()), the profile's ``gpus.firmware`` with a variant's
    ``gpus.firmware_changed`` (``{"3": {"PM": "..."}}``) over it."""
    changed = p["gpus"].get("firmware_changed", {})
    data = []
    for gpu in _gpus(p):
        versions = {**p["gpus"]["firmware"], **changed.get(str(gpu["index"]), {})}
        fw_list = [{"fw_id": k, "fw_version": v} for k, v in versions.items()]
        data.append({"gpu": gpu["index"], "fw_list": fw_list})
    if "--json" in args:
        print(json.dumps({"gpu_data": data}, indent=4))
        return 0
    for gpu in data:
        print(f"GPU: {gpu['gpu']}\n    FW_LIST:")
        for n, fw in enumerate(gpu["fw_list"]):
            print(f"        FW {n}:\n            FW_ID: {fw['fw_id']}")
            print(f"            FW_VERSION: {fw['fw_version']}")
        print()
    return 0


def _amd_monitor(p: Profile, args: list[str]) -> int:
    """``amd-smi monitor -putm``: the table AMD's acceptance page shows (its columns, one
    row per GPU of the profile's ``gpus.idle`` values)."""
    if not args or any(not a.startswith("-") or set(a[1:]) - set("putm") for a in args):
        fail("amd-smi", "the lab's amd-smi monitor answers -p -u -t -m (e.g. -putm)", 2)
    idle = p["gpus"]["idle"]
    print("GPU  POWER  PWR_CAP  GPU_T  MEM_T  GFX_CLK  GFX%  MEM%  MEM_CLOCK")
    for gpu in _gpus(p):
        print(
            f"{gpu['index']:>3}  {idle['power_w']} W  {idle['power_cap_w']} W  "
            f"{idle['gpu_temp_c']} \N{DEGREE SIGN}C  {idle['mem_temp_c']} \N{DEGREE SIGN}C  "
            f"{idle['gfx_clock_mhz']} MHz  {idle['gfx_util_pct']} %  {idle['mem_util_pct']} %  "
            f"{idle['mem_clock_mhz']} MHz"
        )
    return 0


def _amd_topology(p: Profile, args: list[str]) -> int:
    """``amd-smi topology -a -t --json``: every GPU reaches every other over an enabled xGMI
    link (amdsmi's CHANGELOG shows the format); a variant's ``gpus.xgmi_down`` (pairs of GPU
    indices) are PCIE and DISABLED, both ways."""
    if "--json" not in args:
        fail("amd-smi", "the lab's amd-smi topology answers -a -t --json", 2)
    down = {frozenset(pair) for pair in p["gpus"].get("xgmi_down", [])}
    gpus = _gpus(p)
    data = []
    for gpu in gpus:
        links = []
        for peer in gpus:
            pair = frozenset((gpu["index"], peer["index"]))
            kind, status = ("XGMI", "ENABLED") if pair not in down else ("PCIE", "DISABLED")
            if peer is gpu:
                kind, status = "SELF", "ENABLED"
            links.append({"gpu": peer["index"], "bdf": peer["bdf"], "link_status": status,
                          "link_type": kind})  # fmt: skip
        data.append({"gpu": gpu["index"], "bdf": gpu["bdf"], "links": links})
    print(json.dumps(data, indent=4))
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
        fail("rocm-smi", "the lab's rocm-smi answers --showproductname and --showmeminfo vram", 2)
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


TOOLS: dict[str, Tool] = {
    "amd-smi": amd_smi,
    "rocm-smi": rocm_smi,
    "rocminfo": rocminfo,
}
