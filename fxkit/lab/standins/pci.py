"""PCI: lspci (pciutils), for the profile's GPUs, backend NICs and the bridges above them.

The devices and their paths are the profile's ``pci`` (docs/lab.md); the text is lspci's
(pciutils lspci.c show_slot_path/show_slot_name, ls-caps.c cap_express_dev/cap_express_link/
cap_acs), with the lines AMD's acceptance pages and public logs show (SOURCES.md).
"""

from __future__ import annotations

from typing import Any

from .common import Profile, Tool, fail, new_parser

#: Names lspci prints (pci.ids), by role. The GPU is "Device 74a2" as lspci without an
#: MI308X entry in pci.ids prints it; the bridges' names and ids are the lab's own.
NAMES = {
    "root": ("PCI bridge", "0604", "Advanced Micro Devices, Inc. [AMD] Device", "1022:14ab"),
    "switch": ("PCI bridge", "0604", "PCI Express Switch Port", "1000:c030"),
    "gpu": ("Processing accelerators", "1200", "Advanced Micro Devices, Inc. [AMD/ATI] Device", ""),
    "nic": ("Ethernet controller", "0200", "Mellanox Technologies MT2910 Family [ConnectX-7]", ""),
}
PORT = {"root": "Root Port (Slot+)", "switch": "Downstream Port (Slot-)", "gpu": "Endpoint"}
DRIVER = {"root": "pcieport", "switch": "pcieport", "gpu": "amdgpu", "nic": "mlx5_core"}


def devices(p: Profile) -> dict[str, dict[str, Any]]:
    """Every device by domain:bus:dev.fn: its role, ids, the bridges above it and its link."""
    pci = p["pci"]
    found: dict[str, dict[str, Any]] = {}
    gpu_id = f"{p['gpus']['vendor_id'][2:]}:{p['gpus']['device_id'][2:]}"
    ends = [(bdf, "gpu", path, gpu_id) for bdf, path in pci["gpus"].items()]
    ends += [(nic["bdf"], "nic", nic["path"], pci["nic_id"]) for nic in pci["nics"].values()]
    for bdf, role, path, ids in ends:
        for depth, bridge in enumerate(path):
            kind = "root" if depth == 0 else "switch"
            found.setdefault(bridge, {"role": kind, "ids": NAMES[kind][3], "path": path[:depth]})
        found[bdf] = {"role": role, "ids": ids, "path": list(path)}
    for bdf, device in found.items():
        link = dict(pci["link"], **pci.get("links", {}).get(bdf, {}))
        device.update(link=link, fatal=bdf in pci.get("fatal", []), acs=bdf in pci["acs"])
    return dict(sorted(found.items()))


def lspci(p: Profile, args: list[str], stdin: str, entry: dict[str, Any]) -> int:
    parser = new_parser("lspci")
    parser.error = lambda message: fail("lspci", message, 2)  # type: ignore[method-assign]
    for flag in ("-D", "-n", "-nn", "-P", "-PP", "-v", "-vv", "-vvv", "-k"):
        parser.add_argument(flag, action="store_true", dest=flag.lstrip("-"))
    parser.add_argument("-d", dest="device", default=None)
    parser.add_argument("-s", dest="slot", default=None)
    o = parser.parse_args(args)
    verbose = 3 if o.vvv else 2 if o.vv else 1 if o.v else 0
    out = []
    for bdf, device in devices(p).items():
        vendor, _, dev_id = device["ids"].partition(":")
        if o.device and not _matches(o.device, vendor, dev_id):
            continue
        if o.slot and not bdf.endswith(o.slot):
            continue
        out.append(_header(bdf, device, o) + "".join(_block(device, verbose)))
    print(("\n\n" if verbose else "\n").join(out) + ("\n" if verbose else ""))
    return 0


def _matches(wanted: str, vendor: str, device: str) -> bool:
    want_vendor, _, want_device = wanted.partition(":")
    return want_vendor in ("", vendor) and want_device in ("", device)


def _header(bdf: str, device: dict[str, Any], o: Any) -> str:
    """``0000:00:01.1/01:00.0/05:00.0 Processing accelerators [1200]: ... [1002:74a2]``."""
    chain = [*device["path"], bdf] if (o.P or o.PP) else [bdf]
    slots = [b[5:] if o.PP or i == 0 else b[8:] for i, b in enumerate(chain)]
    slot = ("0000:" if o.D else "") + "/".join(slots)
    kind, code, name, _ = NAMES[device["role"]]
    if device["role"] == "gpu":
        name = f"{name} {device['ids'].partition(':')[2]}"
    if o.nn:
        return f"{slot} {kind} [{code}]: {name} [{device['ids']}]"
    return f"{slot} {kind}: {name}"


def _block(device: dict[str, Any], verbose: int) -> list[str]:
    """The -v / -vv / -vvv lines fxkit's checks and AMD's pages read: the Express capability's
    DevSta and LnkCap/LnkSta, ACS on bridges, the kernel driver."""
    if not verbose:
        return []
    link, role = device["link"], device["role"]
    lines = ["\n\tControl: I/O- Mem+ BusMaster+ SpecCycle- MemWINV- VGASnoop- ParErr- Stepping-"]
    if verbose >= 2:
        fatal = "FatalErr+" if device["fatal"] else "FatalErr-"
        full = link["width"] == 16 and link["speed"] == 32
        note = " (ok)" if full else " (downgraded)"
        lines += [
            f"\n\tCapabilities: [64] Express (v2) {PORT.get(role, 'Endpoint')}, IntMsgNum 0",
            "\n\t\tDevCap:\tMaxPayload 512 bytes, PhantFunc 0, Latency L0s <64ns, L1 <1us",
            "\n\t\tDevCtl:\tCorrErr+ NonFatalErr+ FatalErr+ UnsupReq-",
            f"\n\t\tDevSta:\tCorrErr- NonFatalErr- {fatal} UnsupReq- AuxPwr- TransPend-",
            "\n\t\tLnkCap:\tPort #0, Speed 32GT/s, Width x16, ASPM not supported",
            f"\n\t\tLnkSta:\tSpeed {link['speed']}GT/s{note}, Width x{link['width']}{note}",
            "\n\t\t\tTrErr- Train- SlotClk+ DLActive+ BWMgmt- ABWMgmt-",
        ]
        if role in ("root", "switch"):
            valid = "SrcValid+" if device["acs"] else "SrcValid-"
            lines += [
                "\n\tCapabilities: [2a0 v1] Access Control Services",
                "\n\t\tACSCap:\tSrcValid+ TransBlk+ ReqRedir+ CmpltRedir+ UpstreamFwd+ "
                "EgressCtrl- DirectTrans+",
                f"\n\t\tACSCtl:\t{valid} TransBlk- ReqRedir- CmpltRedir- UpstreamFwd- "
                "EgressCtrl- DirectTrans-",
            ]
    return [*lines, f"\n\tKernel driver in use: {DRIVER[role]}"]


TOOLS: dict[str, Tool] = {"lspci": lspci}
