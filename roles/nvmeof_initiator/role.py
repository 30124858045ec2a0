"""nvmeof_initiator: an NVMe-oF host: nvme-cli, a host NQN and host ID made once and never
rotated, native multipath, /etc/nvme/discovery.conf, the connections (``nvme connect`` only
where ``nvme list-subsys`` shows none), nvmf-autoconnect.service, optional XFS filesystems
(made only where blkid finds nothing, mounted by UUID with _netdev,nofail), and a verification
of the namespaces through ``nvme list -o json``.
"""

from __future__ import annotations

import ipaddress
import re
import uuid
from shlex import quote
from typing import Any

from fxkit.engine.role import Host
from fxkit.engine.rolevars import is_interface_name, mappings, valid_nqn, var_error
from fxkit.engine.variables import HostVars, truthy
from fxkit.facts.files import FileStat
from fxkit.facts.filesystems import BlockSignature
from fxkit.facts.kernel import ModuleState
from fxkit.facts.nvme import (
    UUID,
    UUID_NQN,
    NvmeDevices,
    NvmeList,
    NvmeListSubsys,
    NvmeMultipath,
    NvmeNamespace,
    NvmeSubsystems,
    nqn_problem,
)
from fxkit.ops import files
from fxkit.ops.base import OpContext, Result, combine, failed, ok

TRANSPORTS = {"rdma": "nvme-rdma", "tcp": "nvme-tcp"}
#: nvme-cli's default service ids (fabrics.c get_default_trsvcid): discovery over TCP 8009.
DISCOVERY_PORT = {"rdma": 4420, "tcp": 8009}
FABRICS = "/dev/nvme-fabrics"
#: Connect options from variables, as nvme-cli's short options (fabrics.c NVMF_ARGS).
OPTIONS = {
    "host_traddr": "-w",
    "host_iface": "-f",
    "nr_io_queues": "-i",
    "ctrl_loss_tmo": "-l",
    "reconnect_delay": "-c",
}
_SIZE = re.compile(r"([1-9][0-9]*)([KMGT]?)")
_DEVICE = re.compile(r"/dev/nvme(\d+)n(\d+)")


# -- variables --------------------------------------------------------------------------------


def size_bytes(text: object) -> int:
    """``10G`` -> 10737418240 (powers of 1024, as truncate and nvme-cli's sizes)."""
    match = _SIZE.fullmatch(str(text))
    if not match:
        raise ValueError(f"{text!r} is not a size")
    return int(match[1]) << (10 * " KMGT".index(match[2] or " "))


def _check_fabric(v: HostVars, var: str, entry: dict[str, Any]) -> None:
    """transport, address, service id and the connect options of one line/connection; values
    must not hold what nvme-cli splits discovery.conf lines at (space, '=', '#')."""
    if entry.get("transport") not in TRANSPORTS:
        raise var_error(
            v, f"{var}.transport", f"transport {entry.get('transport')!r} is not one of rdma, tcp"
        )
    for key in ("address", "host_traddr"):
        if key == "address" or entry.get(key) is not None:
            try:
                ipaddress.ip_address(str(entry.get(key)))
            except ValueError:
                raise var_error(
                    v, f"{var}.{key}", f"{entry.get(key)!r} is not an IP address"
                ) from None
    iface = entry.get("host_iface")
    if iface is not None and (not is_interface_name(iface) or set(iface) & set("=#")):
        raise var_error(
            v,
            f"{var}.host_iface",
            f"{iface!r} is not an interface name without '=' or '#'",
            hint="as `ip link` shows it, e.g. ens6np0",
        )
    service = entry.get("service_id", 4420)
    if isinstance(service, bool) or not str(service).isdigit() or not 0 < int(service) < 65536:
        raise var_error(v, f"{var}.service_id", f"service id {service!r} is not a port (1-65535)")
    for key in ("nr_io_queues", "reconnect_delay"):
        value = entry.get(key)
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or value < 1
        ):
            raise var_error(v, f"{var}.{key}", f"{key} must be a positive number, not {value!r}")
    loss = entry.get("ctrl_loss_tmo")
    if loss is not None and (isinstance(loss, bool) or not isinstance(loss, int) or loss < -1):
        raise var_error(
            v, f"{var}.ctrl_loss_tmo", f"ctrl_loss_tmo must be seconds or -1, not {loss!r}"
        )


def validate(v: HostVars) -> None:
    """Every variable of one initiator, before any host is touched."""
    if v.get("nvmeof_initiator_hostnqn"):
        valid_nqn(v, "nvmeof_initiator_hostnqn", v.nvmeof_initiator_hostnqn)
    for i, entry in enumerate(mappings(v, "nvmeof_initiator_discovery")):
        _check_fabric(v, f"nvmeof_initiator_discovery[{i}]", entry)
    seen: set[tuple[str, str, str, str]] = set()
    for i, entry in enumerate(mappings(v, "nvmeof_initiator_connections")):
        var = f"nvmeof_initiator_connections[{i}]"
        valid_nqn(v, f"{var}.nqn", entry.get("nqn"))
        _check_fabric(v, var, entry)
        key = (
            entry["nqn"],
            entry["transport"],
            str(entry["address"]),
            str(entry.get("service_id", 4420)),
        )
        if key in seen:
            raise var_error(
                v, var, f"{entry['nqn']} over {key[1]} {key[2]}:{key[3]} is listed twice"
            )
        seen.add(key)
        count = entry.get("namespaces")
        if count is not None and (
            isinstance(count, bool) or not isinstance(count, int) or count < 0
        ):
            raise var_error(v, f"{var}.namespaces", f"namespaces must be a count, not {count!r}")
        if entry.get("size") is not None:
            try:
                size_bytes(entry["size"])
            except ValueError as exc:
                raise var_error(
                    v, f"{var}.size", str(exc), hint="bytes, or a number with K, M, G or T"
                ) from None
    connected = {e["nqn"] for e in mappings(v, "nvmeof_initiator_connections")}
    paths: set[str] = set()
    for i, fs in enumerate(mappings(v, "nvmeof_initiator_filesystems")):
        var = f"nvmeof_initiator_filesystems[{i}]"
        path = fs.get("path")
        if not isinstance(path, str) or not path.startswith("/") or path in paths or path == "/":
            raise var_error(
                v, f"{var}.path", f"mount point {path!r} is not an absolute path, or is used twice"
            )
        paths.add(path)
        if fs.get("device") is not None:
            if not str(fs["device"]).startswith("/dev/"):
                raise var_error(v, f"{var}.device", f"{fs['device']!r} is not a device under /dev")
        elif fs.get("nqn") not in connected or not str(fs.get("nsid", "")).isdigit():
            raise var_error(
                v, var, "give device, or nqn (one of nvmeof_initiator_connections) and nsid"
            )
        label = fs.get("label")
        if label is not None and not re.fullmatch(r"[A-Za-z0-9_.-]{1,12}", str(label)):
            raise var_error(
                v, f"{var}.label", f"XFS label {label!r}: up to 12 of A-Z a-z 0-9 _ . -"
            )


# -- what is written and run ------------------------------------------------------------------


def fabric_args(entry: dict[str, Any], discovery: bool = False) -> list[str]:
    """nvme-cli arguments for one discovery controller or connection (without ``-n``)."""
    port = entry.get("service_id", DISCOVERY_PORT[entry["transport"]] if discovery else 4420)
    args = ["-t", entry["transport"], "-a", str(entry["address"]), "-s", str(port)]
    for key, option in OPTIONS.items():
        if entry.get(key) is not None:
            args += [option, str(entry[key])]
    return args


def discovery_conf(v: HostVars) -> str:
    """/etc/nvme/discovery.conf: one line of arguments per discovery controller, as
    ``nvme discover`` / ``nvme connect-all`` read it (fabrics.c discover_from_conf_file)."""
    lines = [
        "# Written by fxkit (role nvmeof_initiator). One discovery controller per line: the",
        "# arguments of `nvme discover`; `nvme connect-all` (nvmf-autoconnect.service) reads them.",
    ]
    lines += [
        " ".join(fabric_args(d, discovery=True)) for d in mappings(v, "nvmeof_initiator_discovery")
    ]
    return "\n".join(lines) + "\n"


def host_identity(ctx: OpContext, nqn_file: str, id_file: str, wanted: str = "") -> Result:
    """/etc/nvme/hostnqn and /etc/nvme/hostid, written only where they do not exist: a target
    allows hosts by NQN, so an existing identity is never changed (a wrong one fails)."""
    old = ctx.get(nqn_file)
    if old is None:
        nqn = wanted or f"{UUID_NQN}{uuid.uuid4()}"
        steps = [files.file(ctx, nqn_file, f"{nqn}\n", mode="0644")]
    else:
        nqn = old.decode(errors="replace").strip()
        problem = nqn_problem(nqn)
        if problem:
            return failed(f"{nqn_file}: {problem}; fxkit never rotates a host NQN: fix it by hand")
        if wanted and nqn != wanted:
            return failed(
                f"{nqn_file} says {nqn}, nvmeof_initiator_hostnqn says {wanted}: fxkit never "
                "rotates a host NQN (targets allow hosts by it); set the variable to the file's "
                "value, or replace the file by hand"
            )
        steps = [ok(f"{nqn_file} is {nqn}")]
    old_id = ctx.get(id_file)
    if old_id is None:
        tail = nqn[len(UUID_NQN) :]
        hostid = tail if nqn.startswith(UUID_NQN) else str(uuid.uuid4())
        steps.append(files.file(ctx, id_file, f"{hostid}\n", mode="0644"))
    elif not UUID.fullmatch(old_id.decode(errors="replace").strip()):
        return failed(
            f"{id_file} does not hold a UUID; fxkit never rotates a host ID: fix it by hand"
        )
    return combine(*steps)


def nvme_connect(ctx: OpContext, nqn: str, entry: dict[str, Any]) -> Result:
    """``nvme connect`` to ``nqn`` unless ``nvme list-subsys`` shows a path to it over this
    transport, address and service id already."""
    args = fabric_args(entry)
    transport, address, port = args[1], args[3], args[5]
    path = ctx.fresh(NvmeListSubsys).path_to(nqn, transport, address, port)
    if path is not None:
        return ok(f"connected: {path.name} ({path.state or 'state unknown'})")
    where = f"{transport} {address}:{port}"
    return ctx.change(
        " ".join(quote(a) for a in ["nvme", "connect", *args, "-n", nqn]),
        would=f"connect to {nqn} over {where}",
        done=f"connected to {nqn} over {where}",
        diff=f"{nqn}: not connected -> connected over {where}\n",
    )


def namespaces_of(
    nqn: str, subsystems: NvmeSubsystems, devices: NvmeDevices
) -> list[NvmeNamespace]:
    """The namespaces of ``nqn`` in ``nvme list``: /dev/nvme<K>n<N> where K is the subsystem's
    instance (native multipath: nvme-subsys<K>) or one of its controllers' (nvme<K>)."""
    numbers = set()
    for sub in subsystems.subsystems:
        if sub.nqn == nqn:
            numbers.add(sub.name.removeprefix("nvme-subsys"))
            numbers.update(p.name.removeprefix("nvme") for p in sub.paths)
    return [
        ns
        for ns in devices.namespaces
        if (m := _DEVICE.fullmatch(ns.device)) is not None and m[1] in numbers
    ]


def verify(ctx: OpContext, connections: list[dict[str, Any]]) -> Result:
    """Every connection shows its namespaces in ``nvme list -o json`` (count, and size)."""
    subsystems, devices = ctx.fresh(NvmeListSubsys), ctx.fresh(NvmeList)
    seen = []
    for entry in connections:
        found = namespaces_of(entry["nqn"], subsystems, devices)
        shown = ", ".join(f"{ns.device} ({ns.size} bytes)" for ns in found) or "none"
        wanted = entry.get("namespaces")
        if (wanted is None and not found) or (wanted is not None and len(found) != wanted):
            return failed(
                f"nvme list -o json shows {len(found)} namespace(s) of {entry['nqn']} ({shown}), "
                f"wanted {'at least 1' if wanted is None else wanted}"
            )
        if entry.get("size") is not None:
            size = size_bytes(entry["size"])
            if any(ns.size != size for ns in found):
                return failed(
                    f"namespaces of {entry['nqn']} are not {entry['size']} ({size} bytes): {shown}"
                )
        seen.append(f"{entry['nqn']}: {shown}")
    where = ", simulated lab host" if devices.simulated else ""
    return ok(f"{'; '.join(seen)} (source: nvme list -o json{where})")


def apply(host: Host, v: HostVars) -> None:
    connections = mappings(v, "nvmeof_initiator_connections")
    filesystems = mappings(v, "nvmeof_initiator_filesystems")
    extra = ["xfsprogs"] if filesystems else []
    installing = host.packages([*v.nvmeof_initiator_packages, *extra])
    host.directory("/etc/nvme", mode="0755")
    host.task(f"host identity {v.nvmeof_initiator_hostnqn_file}").call(
        host_identity,
        v.nvmeof_initiator_hostnqn_file,
        v.nvmeof_initiator_hostid_file,
        v.nvmeof_initiator_hostnqn or "",
    )
    if truthy(v.nvmeof_initiator_multipath):
        host.module("nvme_core", params={"multipath": "Y"})
    used = {e["transport"] for e in [*connections, *mappings(v, "nvmeof_initiator_discovery")]}
    for transport in sorted(used):
        host.module(TRANSPORTS[transport])
    discovery = v.nvmeof_initiator_discovery_file
    host.task(f"file {discovery}").file(discovery, discovery_conf(v), mode="0644")
    host.service(v.nvmeof_initiator_service, enabled=True)

    if truthy(v.nvmeof_initiator_multipath):
        multipath = host.fact(NvmeMultipath)
        present = not multipath.missing or would_load(host, "nvme_core")
        on = host.needs(present, "native NVMe multipath", multipath.missing)
        if on and multipath.value == "N":
            host.fail(
                "native NVMe multipath is off in the running kernel (nvme_core multipath="
                f"{multipath.value}); /etc/modprobe.d/nvme_core.conf turns it on when nvme_core "
                "is next loaded: reboot (after update-initramfs -u where nvme_core is in the "
                "initramfs)"
            )
    # In check mode nvme-cli or the fabrics modules may only be about to come: the connections
    # are then reported as they would be made.
    coming = host.check and (bool(installing) or any(would_load(host, TRANSPORTS[t]) for t in used))
    state = connect(host, v, connections, coming) if connections else "done"
    for fs in filesystems:
        if fs.get("device") is None and state != "done":
            if state == "skipped":
                host.needs(False, f"XFS at {fs['path']}", "the NVMe-oF connections did not run")
            continue  # check mode: the namespace is not connected yet
        make_filesystem(host, v, fs)


def would_load(host: Host, module: str) -> bool:
    """In check mode: the module step only said it would load ``module`` (it is not loaded)."""
    state = host.fact(ModuleState, module)
    return host.check and not state.loaded and not state.cannot_load


def connect(host: Host, v: HostVars, connections: list[dict[str, Any]], coming: bool) -> str:
    """Connect and verify: ``done``, ``pending`` (check mode: connections would be made) or
    ``skipped`` (no nvme-cli or fabrics on a lab host)."""
    subsystems = host.fact(NvmeListSubsys)
    step = "connect NVMe-oF subsystems"
    if not host.needs(not subsystems.missing or coming, step, subsystems.missing):
        return "skipped"
    # A simulated host's stand-in nvme connects without the kernel's device (it says so).
    fabrics = host.fact(FileStat, FABRICS).exists or subsystems.simulated
    why = f"{FABRICS} is absent (the nvme-fabrics module is not loaded)"
    if not host.needs(fabrics or coming, step, why):
        return "skipped"
    made = [
        host.task(f"nvme connect {e['nqn']}").call(nvme_connect, e["nqn"], e) for e in connections
    ]
    if host.check and any(made):
        return "pending"
    host.task("verify NVMe-oF namespaces").call(verify, v.nvmeof_initiator_connections)
    return "done"


def make_filesystem(host: Host, v: HostVars, fs: dict[str, Any]) -> None:
    """XFS on the namespace (only where blkid finds nothing), mounted by UUID."""
    step = f"XFS at {fs['path']}"
    device = fs.get("device")
    if device is None:
        found = namespaces_of(fs["nqn"], host.fact(NvmeListSubsys), host.fact(NvmeList))
        matches = [ns.device for ns in found if ns.nsid == int(fs["nsid"])]
        if not host.needs(
            matches, step, f"nvme list shows no namespace {fs['nsid']} of {fs['nqn']}"
        ):
            return
        device = matches[0]
    if not host.needs(host.fact(BlockSignature, device).exists, step, f"{device} does not exist"):
        return
    made = host.task(f"xfs on {device}").filesystem(device, "xfs", fs.get("label"))
    if made.data.get("uuid"):
        opts = fs.get("opts", "defaults,_netdev,nofail")
        host.mount(
            fs["path"],
            f"UUID={made.data['uuid']}",
            "xfs",
            opts=opts,
            fstab=v.nvmeof_initiator_fstab,
        )
