"""``fact``: what the host's facts (:mod:`fxkit.facts`) say, as plain data for checks.

    measure: {fact: gpus}              # value: count, gpus.*.model, gpus.*.vram_gib
    measure: {fact: gpu_pcie}          # value: gpus.*.speed_gts, gpus.*.width
    measure: {fact: rdma}              # value: active, ports.*.state, ports.*.netdev_mtu
    measure: {fact: nvmeof}            # value: count, namespaces.*.size_bytes
    measure: {fact: {name: sysctl, names: [kernel.numa_balancing]}}   # value: settings
    measure: {fact: os}  /  {fact: kernel}  /  {fact: rocm}

Where the hardware or its tool is absent the measurement is an error that says so plainly
("amd-smi not found ...", "no RDMA devices ...", "no NVMe-oF namespaces ..."): its checks are
ERROR, never PASS. Every value of a simulated lab host (``fxkit lab up --profile``) carries
``simulated: true``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from shlex import quote
from typing import Any, Literal

from fxkit.facts.gpu import Gpus
from fxkit.facts.kernel import KernelCmdline, SysctlState
from fxkit.facts.lab import marked, split_marked
from fxkit.facts.nvme import NvmeList, NvmeListSubsys
from fxkit.facts.rdma import IbvDevinfo, NetInterface, RdmaLink
from fxkit.facts.system import Kernel, OsRelease
from fxkit.gate.measure import MeasuredHost, MeasureError, Params, kind
from fxkit.gate.measures.command import parse_output

#: Where ROCm says its version: rocm-core's file (what AMD's CVS reads), else amd-smi.
ROCM_VERSION_FILE = "/opt/rocm/.info/version"
#: NVMe over Fabrics transports (``nvme list-subsys`` paths); pcie/loop are local.
FABRIC_TRANSPORTS = ("rdma", "tcp", "fc")
_DEVICE = re.compile(r"/dev/nvme(\d+)n\d+")


class FactParams(Params):
    name: Literal["gpus", "gpu_pcie", "rdma", "nvmeof", "sysctl", "os", "kernel", "rocm"]
    #: For ``sysctl``: the keys to read (``kernel.numa_balancing``).
    names: tuple[str, ...] = ()


@kind("fact", FactParams)
def fact(node: MeasuredHost, p: FactParams) -> Any:
    """A fact of the host as plain data: gpus, gpu_pcie, rdma, nvmeof, sysctl, os, kernel, rocm."""
    if p.name == "sysctl":
        return sysctl(node, p.names)
    return _FACTS[p.name](node)


# -- GPUs ------------------------------------------------------------------------------------------


def _gpu_inventory(node: MeasuredHost) -> Any:
    inventory = node.fact(Gpus)
    if inventory.count:
        return inventory
    if inventory.missing.startswith("no GPU tool found"):
        raise MeasureError(
            f"amd-smi not found on {node.host} (nor rocm-smi or rocminfo): is ROCm installed? "
            "(roles/rocm_host)"
        )
    raise MeasureError(f"no GPUs on {node.host}: {inventory.missing}")


def gpus(node: MeasuredHost) -> dict[str, Any]:
    """``count``, the ``source`` command, and per GPU index: model, device id, gfx target,
    VRAM in GiB (amd-smi's MB are MiB), PCI address, driver version."""
    inventory = _gpu_inventory(node)
    return {
        "count": inventory.count,
        "source": inventory.source,
        "simulated": inventory.simulated,
        "gpus": {
            str(g.index): {
                "model": g.name,
                "device_id": g.device_id_hex,
                "gfx_target": g.gfx_target,
                "vram_gib": round(g.vram_gib, 2) if g.vram_gib is not None else None,
                "bdf": g.bdf,
                "driver_version": g.driver_version,
            }
            for g in inventory.gpus
        },
    }


def gpu_pcie(node: MeasuredHost) -> dict[str, Any]:
    """Each GPU's PCIe link as the kernel negotiated it: ``/sys/bus/pci/devices/BDF/
    current_link_speed`` (GT/s) and ``current_link_width`` (lanes), with the maximum ones."""
    inventory = _gpu_inventory(node)
    unknown = [str(g.index) for g in inventory.gpus if not g.bdf]
    if unknown:
        raise MeasureError(
            f"PCIe link unavailable: `{inventory.source}` gives no PCI address for GPU(s) "
            f"{', '.join(unknown)}"
        )
    script = "; ".join(
        f"d=/sys/bus/pci/devices/{quote(g.bdf)}; "
        "if [ -r \"$d/current_link_speed\" ]; then printf '%s\\t%s\\t%s\\t%s\\t%s\\n' "
        f'{quote(g.bdf)} "$(cat "$d/current_link_speed")" "$(cat "$d/current_link_width")" '
        '"$(cat "$d/max_link_speed")" "$(cat "$d/max_link_width")"; '
        f"else printf '%s\\tabsent\\n' {quote(g.bdf)}; fi"
        for g in inventory.gpus
    )
    lab, out = split_marked(node.run(marked(script)), "PCIe links")
    links = parse_pcie_links(out)
    absent = [bdf for bdf, link in links.items() if link is None]
    if absent:
        raise MeasureError(
            f"PCIe link unavailable on {node.host}: no /sys/bus/pci/devices/{absent[0]}/"
            f"current_link_speed ({len(absent)} GPU(s); a VM or container may hide it)"
        )
    return {
        "simulated": lab.simulated,
        "gpus": {str(g.index): {"bdf": g.bdf, **(links[g.bdf] or {})} for g in inventory.gpus},
    }


def parse_pcie_links(text: str) -> dict[str, dict[str, Any] | None]:
    """``BDF<TAB>speed<TAB>width<TAB>max speed<TAB>max width`` lines (``BDF<TAB>absent`` where
    sysfs has no link): speeds as the kernel writes them, ``32.0 GT/s PCIe`` (``Unknown``: 0)."""
    links: dict[str, dict[str, Any] | None] = {}
    for line in text.splitlines():
        fields = line.split("\t")
        if len(fields) == 2 and fields[1] == "absent":
            links[fields[0]] = None
        elif len(fields) == 5:
            bdf, speed, width, max_speed, max_width = fields
            links[bdf] = {
                "speed_gts": _gts(speed),
                "width": _lanes(width),
                "max_speed_gts": _gts(max_speed),
                "max_width": _lanes(max_width),
            }
        elif line.strip():
            raise MeasureError(f"PCIe links: cannot read {line!r}")
    return links


def _gts(text: str) -> float:
    match = re.match(r"\s*([\d.]+)\s*GT/s", text)
    return float(match[1]) if match else 0.0


def _lanes(text: str) -> int:
    text = text.strip().lstrip("x")
    return int(text) if text.isdigit() else 0


# -- RDMA ------------------------------------------------------------------------------------------


def rdma(node: MeasuredHost) -> dict[str, Any]:
    """Every RDMA port (``rdma link``) with its state, link layer and active MTU
    (``ibv_devinfo``) and its netdev's MTU; ``count`` ports, ``active`` of them ACTIVE."""
    links = node.fact(RdmaLink)
    if not links.ports:
        raise MeasureError(f"no RDMA devices on {node.host}: {links.missing}")
    hcas = node.fact(IbvDevinfo)
    layers = {} if hcas.devices else _sysfs_link_layers(node)
    ports = {}
    for port in links.ports:
        device = hcas.get(port.device)
        ibv = device.port(port.port) if device else None
        mtu = node.fact(NetInterface, port.netdev) if port.netdev else None
        ports[port.name] = {
            "state": port.state,
            "physical_state": port.physical_state,
            "link_layer": ibv.link_layer if ibv else layers.get(port.name),
            "active_mtu": ibv.active_mtu if ibv else None,
            "netdev": port.netdev,
            "netdev_mtu": mtu.mtu if mtu and not mtu.missing else None,
        }
    return {
        "count": len(ports),
        "active": sum(1 for p in ports.values() if p["state"] == "ACTIVE"),
        "simulated": links.simulated,
        "ibv_devinfo": hcas.missing or "read",
        "ports": ports,
    }


def _sysfs_link_layers(node: MeasuredHost) -> dict[str, str]:
    """``DEV/PORT`` -> the kernel's ``/sys/class/infiniband/DEV/ports/PORT/link_layer``: where
    ibv_devinfo is not installed."""
    out = node.run(
        'for f in /sys/class/infiniband/*/ports/*/link_layer; do [ -r "$f" ] && '
        'printf \'%s %s\\n\' "$f" "$(cat "$f")"; done; true'
    ).stdout
    layers = {}
    for line in out.splitlines():
        path, _, layer = line.partition(" ")
        parts = path.split("/")
        if len(parts) == 8:  # /sys/class/infiniband/DEV/ports/PORT/link_layer
            layers[f"{parts[4]}/{parts[6]}"] = layer.strip()
    return layers


# -- NVMe-oF ---------------------------------------------------------------------------------------


def nvmeof(node: MeasuredHost) -> dict[str, Any]:
    """The namespaces of NVMe-oF subsystems (paths over rdma or tcp in ``nvme list-subsys``):
    each one's NQN, transport and size (``nvme list``); ``count`` of them."""
    subsystems, devices = node.fact(NvmeListSubsys), node.fact(NvmeList)
    if subsystems.missing or devices.missing:
        raise MeasureError(
            f"no NVMe-oF namespaces on {node.host}: {subsystems.missing or devices.missing}"
        )
    owners: dict[str, tuple[str, str]] = {}  # the number K of /dev/nvmeKnN -> (NQN, transport)
    for sub in subsystems.subsystems:
        fabric = [p for p in sub.paths if p.transport in FABRIC_TRANSPORTS]
        if fabric:
            owners[sub.name.removeprefix("nvme-subsys")] = (sub.nqn, fabric[0].transport)
            for path in sub.paths:
                owners[path.name.removeprefix("nvme")] = (sub.nqn, fabric[0].transport)
    namespaces = {}
    for ns in devices.namespaces:
        match = _DEVICE.fullmatch(ns.device)
        if match and match[1] in owners:
            nqn, transport = owners[match[1]]
            namespaces[ns.device] = {
                "nqn": nqn,
                "transport": transport,
                "size_bytes": ns.size,
                "size_gib": round(ns.size / (1 << 30), 2),
            }
    if not namespaces:
        shown = ", ".join(ns.device for ns in devices.namespaces) or "none"
        raise MeasureError(
            f"no NVMe-oF namespaces on {node.host}: no namespace of a subsystem connected over "
            f"{'/'.join(FABRIC_TRANSPORTS)} (nvme list shows: {shown}); connect them with "
            "roles/nvmeof_initiator"
        )
    return {"count": len(namespaces), "simulated": devices.simulated, "namespaces": namespaces}


# -- kernel, OS, ROCm ---------------------------------------------------------------------------


def sysctl(node: MeasuredHost, names: tuple[str, ...]) -> dict[str, Any]:
    """``values`` by key (None: not on this kernel), and ``settings``: ``key=value`` lines,
    for a ``contains`` rule over what the roles set."""
    if not names:
        raise MeasureError("fact sysctl needs names: [the keys to read]")
    values = {name: node.fact(SysctlState, name).value for name in names}
    return {
        "values": values,
        "settings": [f"{k}={v}" if v is not None else f"{k} (absent)" for k, v in values.items()],
    }


def os_release(node: MeasuredHost) -> dict[str, Any]:
    """``/etc/os-release``: ``release`` (``ubuntu 24.04``), id, version_id, codename."""
    info = node.fact(OsRelease)
    return {
        "release": f"{info.id} {info.version_id}".strip(),
        "id": info.id,
        "version_id": info.version_id,
        "codename": info.codename,
        "pretty_name": info.pretty_name,
    }


def kernel(node: MeasuredHost) -> dict[str, Any]:
    """The running kernel's ``release`` (``uname -r``) and its ``cmdline``, word by word."""
    return {"release": node.fact(Kernel), "cmdline": list(node.fact(KernelCmdline).args)}


def rocm(node: MeasuredHost) -> dict[str, Any]:
    """ROCm's ``version``: rocm-core's /opt/rocm/.info/version (``7.2.0-43``), else the
    ``rocm_version`` of ``amd-smi version --json``; ``source`` says which."""
    script = (
        f"if [ -r {ROCM_VERSION_FILE} ]; then echo file; cat {ROCM_VERSION_FILE}; "
        "elif command -v amd-smi >/dev/null 2>&1; then echo amd-smi; amd-smi version --json; "
        "else echo none; fi"
    )
    result = node.run(script)
    how, _, out = result.stdout.partition("\n")
    if how == "none":
        raise MeasureError(
            f"ROCm not found on {node.host}: no {ROCM_VERSION_FILE} and amd-smi not found "
            "(roles/rocm_host installs it)"
        )
    if how == "file":
        version = out.strip().splitlines()[0] if out.strip() else ""
        source = ROCM_VERSION_FILE
    elif result.ok:
        data = parse_output(out, "json", None, "amd-smi version --json")
        entry = data[0] if isinstance(data, list) and data else data
        version = str(entry.get("rocm_version", "")) if isinstance(entry, dict) else ""
        source = "amd-smi version --json"
    else:
        raise MeasureError(f"`amd-smi version --json` exited {result.rc}: {result.stderr[-300:]}")
    if not version or version == "N/A":
        raise MeasureError(f"{source} on {node.host} gives no ROCm version")
    return {"version": version, "source": source}


_FACTS: dict[str, Callable[[MeasuredHost], Any]] = {
    "gpus": gpus,
    "gpu_pcie": gpu_pcie,
    "rdma": rdma,
    "nvmeof": nvmeof,
    "os": os_release,
    "kernel": kernel,
    "rocm": rocm,
}
