"""nvmeof_initiator: an NVMe-oF host: nvme-cli, the inventory's host NQN and a host ID of its
UUID (replacing what nvme-cli's package wrote while no subsystem is connected, never rotated
after), native multipath, /etc/nvme/discovery.conf, the connections (``nvme connect`` only
where ``nvme list-subsys`` shows none), nvmf-autoconnect.service, optional XFS filesystems
(made only by the namespace's owner and only where blkid finds nothing, mounted by UUID with
_netdev,nofail, read-only on the other hosts), and a verification of the namespaces through
``nvme list -o json``. Across the inventory (``validate_all``, :mod:`fxkit.nvme_fabric`): no
namespace written by two hosts, and what the targets export is what the initiators expect.
"""

from __future__ import annotations

import re
import uuid
from shlex import quote
from typing import Annotated, Literal

from pydantic import AfterValidator, Field

from fxkit import nvme_fabric
from fxkit.engine.role import Host
from fxkit.engine.rolevars import (
    SIZE,
    AbsolutePath,
    FleetVars,
    InterfaceName,
    IpAddress,
    Nqn,
    RoleKeys,
    RoleVars,
    Rule,
    Size,
    Whole,
    pattern,
)
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
_DEVICE = re.compile(r"/dev/nvme(\d+)n(\d+)")


# -- variables --------------------------------------------------------------------------------


def size_bytes(text: object) -> int:
    """``10G`` -> 10737418240 (powers of 1024, as truncate and nvme-cli's sizes)."""
    match = SIZE.fullmatch(str(text))
    if not match:
        raise ValueError(f"{text!r} is not a size")
    return int(match[1]) << (10 * " KMGT".index(match[2] or " "))


def _unsplit(text: str) -> str:
    """nvme-cli splits a discovery.conf line at ' ' and '='; '#' starts a comment."""
    return "holds '=' or '#', where a discovery.conf line splits" if set(text) & set("=#") else ""


#: A service id (a TCP port, or RDMA's).
ServiceId = Annotated[Whole, Field(ge=1, le=65535)]
Positive = Annotated[Whole, Field(ge=1)]


class Discovery(RoleKeys):
    """A discovery controller: where it is and how to connect (nvme-cli's options); a
    connection has these keys too."""

    transport: Literal["rdma", "tcp"] = Field(description="the transport (`-t`)")
    address: IpAddress = Field(
        description="the controller's address, traddr (`-a`)", examples=["192.168.100.10"]
    )
    service_id: ServiceId | None = Field(
        None, description="trsvcid (`-s`; default: 8009 for tcp, 4420 for rdma, nvme-cli's)"
    )
    host_traddr: IpAddress | None = Field(None, description="the host's own address (`-w`)")
    host_iface: (
        Annotated[InterfaceName, AfterValidator(Rule("without '=' or '#'", _unsplit))] | None
    ) = Field(None, description="the host's interface (`-f`)", examples=["ens6np0"])
    nr_io_queues: Positive | None = Field(None, description="I/O queues (`-i`)")
    ctrl_loss_tmo: Annotated[Whole, Field(ge=-1)] | None = Field(
        None, description="`-l`, seconds; -1 retries forever"
    )
    reconnect_delay: Positive | None = Field(None, description="`-c`, seconds")


class Connection(Discovery):
    """A subsystem to connect to now (``nvme connect``), and what ``nvme list`` must show."""

    nqn: Nqn = Field(
        description="the subsystem (`-n`)", examples=["nqn.2024-01.com.example:models"]
    )
    service_id: ServiceId = Field(4420, description="trsvcid (`-s`)")
    namespaces: Annotated[Whole, Field(ge=0)] | None = Field(
        None, description="verified: how many namespaces nvme list shows (default: at least 1)"
    )
    size: Size | None = Field(
        None, description="verified when given: the size of each namespace", examples=["10G"]
    )


class Filesystem(RoleKeys):
    """XFS on a namespace, made only on a device without any signature, mounted by UUID."""

    path: Annotated[str, pattern(r"/.+", "an absolute path other than /")] = Field(
        description="the mount point", examples=["/mnt/models"]
    )
    device: Annotated[str, pattern(r"/dev/.+", "a device under /dev")] | None = Field(
        None, description="the device itself, or give nqn and nsid", examples=["/dev/nvme1n1"]
    )
    nqn: Nqn | None = Field(
        None, description="with nsid: the namespace as nvme list shows it (one of the connections)"
    )
    nsid: Positive | None = Field(None, description="with nqn")
    label: (
        Annotated[
            str, pattern(r"[A-Za-z0-9_.-]{1,12}", "an XFS label: up to 12 of A-Z a-z 0-9 _ . -")
        ]
        | None
    ) = Field(None, description="the filesystem's label", examples=["models"])
    owner: str | None = Field(
        None,
        description="the inventory host that makes the filesystem and mounts it read-write (a "
        "shared namespace: its staging host, the same on every host); the others mount it with "
        "`reader_opts` and never make it. Default: this host (a namespace of its own)",
        examples=["gpu01"],
    )
    opts: str = Field("defaults,_netdev,nofail", description="mount options of the owner")
    reader_opts: str = Field(
        "ro,norecovery,_netdev,nofail",
        description="mount options of the other hosts: read-only, and for XFS without log "
        "recovery (a reader must not replay the owner's log)",
    )


class Vars(RoleVars):
    nvmeof_initiator_hostnqn: Annotated[
        str, AfterValidator(Rule('NQN or ""', lambda s: s and nqn_problem(s)))
    ] = Field(
        "",
        description="the host NQN (targets allow hosts by it): replaces the one nvme-cli's "
        'package wrote while no subsystem is connected, never once one is; `""`: keep the '
        "file's, or make `nqn.2014-08.org.nvmexpress:uuid:<random uuid>` where there is none",
        examples=["nqn.2014-08.org.nvmexpress:uuid:3b2f6c1e-0d0a-4a51-9a57-0c5d1f2e0a01"],
    )
    nvmeof_initiator_hostnqn_file: AbsolutePath = Field(
        "/etc/nvme/hostnqn", description="where nvme-cli reads the host NQN"
    )
    nvmeof_initiator_hostid_file: AbsolutePath = Field(
        "/etc/nvme/hostid", description="where nvme-cli reads the host ID"
    )
    nvmeof_initiator_multipath: bool = Field(
        True,
        description="native NVMe multipath on (nvme_core multipath=Y, persisted in "
        "`/etc/modprobe.d/nvme_core.conf`) and verified",
    )
    nvmeof_initiator_discovery: list[Discovery] = Field(
        [],
        description="discovery controllers, one line each in the discovery file "
        "(`nvme connect-all` at boot)",
        examples=[[{"transport": "rdma", "address": "192.168.100.10"}]],
    )
    nvmeof_initiator_discovery_file: AbsolutePath = Field(
        "/etc/nvme/discovery.conf", description="their file"
    )
    nvmeof_initiator_connections: list[Connection] = Field(
        [], description="subsystems to connect to now (`nvme connect`), when not connected already"
    )
    nvmeof_initiator_filesystems: list[Filesystem] = Field(
        [], description="XFS filesystems on the namespaces"
    )
    nvmeof_initiator_owner_wait: float = Field(
        300,
        ge=0,
        description="seconds a host waits for the owner of a shared namespace to make its "
        "filesystem (the owner may do it in the same run; fxkit's choice: no guide sets it)",
    )
    nvmeof_initiator_fstab: AbsolutePath = Field(
        "/etc/fstab", description="where the mounts are persisted"
    )
    nvmeof_initiator_packages: list[str] = Field(["nvme-cli"], description="packages installed")
    nvmeof_initiator_service: str = Field(
        "nvmf-autoconnect.service", description="the unit enabled"
    )


def validate(v: Vars) -> None:
    """What the types cannot say: connections listed twice, the namespace of each filesystem,
    mount points used twice."""
    seen: set[tuple[str, str, str, int]] = set()
    for i, conn in enumerate(v.nvmeof_initiator_connections):
        key = (conn.nqn, conn.transport, conn.address, conn.service_id)
        if key in seen:
            raise v.wrong(
                f"nvmeof_initiator_connections[{i}]",
                f"{conn.nqn} over {conn.transport} {conn.address}:{conn.service_id} is listed "
                "twice",
            )
        seen.add(key)
    connected = {c.nqn for c in v.nvmeof_initiator_connections}
    paths: set[str] = set()
    for i, fs in enumerate(v.nvmeof_initiator_filesystems):
        var = f"nvmeof_initiator_filesystems[{i}]"
        if fs.path in paths:
            raise v.wrong(
                f"{var}.path", f"mount point {fs.path} is used twice", "one filesystem per path"
            )
        paths.add(fs.path)
        if fs.device is None and (fs.nqn not in connected or fs.nsid is None):
            raise v.wrong(
                var,
                "give device, or nqn (one of nvmeof_initiator_connections) and nsid",
                "e.g. {nqn: nqn.2024-01.com.example:models, nsid: 1, path: /mnt/models}",
            )
        if "ro" not in fs.reader_opts.split(",") or "rw" in fs.reader_opts.split(","):
            raise v.wrong(
                f"{var}.reader_opts",
                f"{fs.reader_opts!r} does not mount read-only: a host other than the owner "
                "must never write the namespace",
                "ro,norecovery,_netdev,nofail (XFS)",
            )


def validate_all(hosts: dict[str, Vars], fleet: FleetVars) -> None:
    """Across the inventory, targets and initiators (:mod:`fxkit.nvme_fabric`): no namespace
    written by two hosts; every connection exported as expected, to this host."""
    nvme_fabric.check(fleet)


# -- what is written and run ------------------------------------------------------------------


def fabric_args(entry: Discovery, discovery: bool = False) -> list[str]:
    """nvme-cli arguments for one discovery controller or connection (without ``-n``)."""
    default = DISCOVERY_PORT[entry.transport] if discovery else 4420
    port = default if entry.service_id is None else entry.service_id
    args = ["-t", entry.transport, "-a", entry.address, "-s", str(port)]
    for key, option in OPTIONS.items():
        value = getattr(entry, key)
        if value is not None:
            args += [option, str(value)]
    return args


def discovery_conf(v: Vars) -> str:
    """/etc/nvme/discovery.conf: one line of arguments per discovery controller, as
    ``nvme discover`` / ``nvme connect-all`` read it (fabrics.c discover_from_conf_file)."""
    lines = [
        "# Written by fxkit (role nvmeof_initiator). One discovery controller per line: the",
        "# arguments of `nvme discover`; `nvme connect-all` (nvmf-autoconnect.service) reads them.",
    ]
    lines += [" ".join(fabric_args(d, discovery=True)) for d in v.nvmeof_initiator_discovery]
    return "\n".join(lines) + "\n"


def host_identity(ctx: OpContext, nqn_file: str, id_file: str, wanted: str = "") -> Result:
    """/etc/nvme/hostnqn and /etc/nvme/hostid: the NQN ``wanted`` (else the file's, else a
    new one) and the host ID of its UUID. Debian's and Ubuntu's nvme-cli package writes both
    when it installs (its postinst: ``nvme gen-hostnqn``, and ``uuidgen``, a UUID of its own):
    they are replaced while no subsystem is connected over a fabric. Once one is, the NQN is
    never rotated (targets allow hosts by it): a difference fails and changes nothing."""
    old = _read(ctx, nqn_file)
    nqn = wanted or (old if old and not nqn_problem(old) else f"{UUID_NQN}{uuid.uuid4()}")
    old_id = _read(ctx, id_file)
    if nqn.startswith(UUID_NQN):
        hostid = nqn[len(UUID_NQN) :].lower()
    else:
        hostid = old_id if old_id and UUID.fullmatch(old_id) else str(uuid.uuid4())
    if (old, old_id) == (nqn, hostid):
        return ok(f"{nqn_file} is {nqn}, {id_file} {hostid}")
    connected = _fabric_paths(ctx) if old else []
    if connected and old != nqn:
        return failed(
            f"{nqn_file} says {old}, fxkit would write {nqn} (nvmeof_initiator_hostnqn), and "
            f"this host is connected as {old} ({', '.join(connected)}): fxkit never rotates "
            "the host NQN of a connected host (targets allow hosts by it); set the variable to "
            "the file's value, or disconnect (nvme disconnect-all) and run again"
        )
    if connected:
        return ok(
            f"{nqn_file} is {nqn}; {id_file} ({old_id or 'none'}) is not its UUID, left as it "
            f"is while connected ({', '.join(connected)})"
        )
    return combine(
        files.file(ctx, nqn_file, f"{nqn}\n", mode="0644"),
        files.file(ctx, id_file, f"{hostid}\n", mode="0644"),
    )


def _read(ctx: OpContext, path: str) -> str:
    """A one-line file's text, "" when absent or empty (as the postinst's ``[ -s ]``)."""
    data = ctx.get(path)
    return "" if data is None else data.decode(errors="replace").strip()


def _fabric_paths(ctx: OpContext) -> list[str]:
    """The controllers connected over a fabric (``nvme list-subsys``; a local PCIe drive does
    not count), as ``nvme1 (NQN)``; none where nvme-cli is not there yet."""
    subsystems = ctx.fresh(NvmeListSubsys)
    return [
        f"{path.name} ({sub.nqn})"
        for sub in subsystems.subsystems
        for path in sub.paths
        if path.transport != "pcie"
    ]


def nvme_connect(ctx: OpContext, entry: Connection) -> Result:
    """``nvme connect`` to the entry's subsystem unless ``nvme list-subsys`` shows a path to it
    over this transport, address and service id already."""
    nqn, args = entry.nqn, fabric_args(entry)
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


def verify(ctx: OpContext, connections: list[Connection]) -> Result:
    """Every connection shows its namespaces in ``nvme list -o json`` (count, and size)."""
    subsystems, devices = ctx.fresh(NvmeListSubsys), ctx.fresh(NvmeList)
    seen = []
    for entry in connections:
        found = namespaces_of(entry.nqn, subsystems, devices)
        shown = ", ".join(f"{ns.device} ({ns.size} bytes)" for ns in found) or "none"
        wanted = entry.namespaces
        if (wanted is None and not found) or (wanted is not None and len(found) != wanted):
            return failed(
                f"nvme list -o json shows {len(found)} namespace(s) of {entry.nqn} ({shown}), "
                f"wanted {'at least 1' if wanted is None else wanted}"
            )
        if entry.size is not None:
            size = size_bytes(entry.size)
            if any(ns.size != size for ns in found):
                return failed(
                    f"namespaces of {entry.nqn} are not {entry.size} ({size} bytes): {shown}"
                )
        seen.append(f"{entry.nqn}: {shown}")
    where = ", simulated lab host" if devices.simulated else ""
    return ok(f"{'; '.join(seen)} (source: nvme list -o json{where})")


def apply(host: Host, v: Vars) -> None:
    connections = v.nvmeof_initiator_connections
    filesystems = v.nvmeof_initiator_filesystems
    extra = ["xfsprogs"] if filesystems else []
    installing = host.packages([*v.nvmeof_initiator_packages, *extra])
    host.directory("/etc/nvme", mode="0755")
    host.task(f"host identity {v.nvmeof_initiator_hostnqn_file}").call(
        host_identity,
        v.nvmeof_initiator_hostnqn_file,
        v.nvmeof_initiator_hostid_file,
        v.nvmeof_initiator_hostnqn,
    )
    if v.nvmeof_initiator_multipath:
        host.module("nvme_core", params={"multipath": "Y"})
    used = {e.transport for e in [*connections, *v.nvmeof_initiator_discovery]}
    for transport in sorted(used):
        host.module(TRANSPORTS[transport])
    discovery = v.nvmeof_initiator_discovery_file
    host.task(f"file {discovery}").file(discovery, discovery_conf(v), mode="0644")
    host.service(v.nvmeof_initiator_service, enabled=True)

    if v.nvmeof_initiator_multipath:
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
    state = connect(host, connections, coming) if connections else "done"
    for fs in filesystems:
        if fs.device is None and state != "done":
            if state == "skipped":
                host.needs(False, f"XFS at {fs.path}", "the NVMe-oF connections did not run")
            continue  # check mode: the namespace is not connected yet
        make_filesystem(host, v, fs)


def would_load(host: Host, module: str) -> bool:
    """In check mode: the module step only said it would load ``module`` (it is not loaded)."""
    state = host.fact(ModuleState, module)
    return host.check and not state.loaded and not state.cannot_load


def connect(host: Host, connections: list[Connection], coming: bool) -> str:
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
    made = [host.task(f"nvme connect {e.nqn}").call(nvme_connect, e) for e in connections]
    if host.check and any(made):
        return "pending"
    host.task("verify NVMe-oF namespaces").call(verify, connections)
    return "done"


def make_filesystem(host: Host, v: Vars, fs: Filesystem) -> None:
    """XFS on the namespace, made only by its owner and only where blkid finds nothing, mounted
    by UUID: read-write on the owner, with ``reader_opts`` elsewhere."""
    owner = fs.owner if fs.owner and fs.owner != v.host else None
    step = f"XFS at {fs.path}"
    device = fs.device
    if device is None:
        found = namespaces_of(fs.nqn or "", host.fact(NvmeListSubsys), host.fact(NvmeList))
        matches = [ns.device for ns in found if ns.nsid == fs.nsid]
        if not host.needs(matches, step, f"nvme list shows no namespace {fs.nsid} of {fs.nqn}"):
            return
        device = matches[0]
    if not host.needs(host.fact(BlockSignature, device).exists, step, f"{device} does not exist"):
        return
    made = host.task(f"xfs on {device}").filesystem(
        device, "xfs", fs.label, owner=owner, wait=v.nvmeof_initiator_owner_wait
    )
    if made.data.get("uuid"):
        host.mount(
            fs.path,
            f"UUID={made.data['uuid']}",
            "xfs",
            opts=fs.reader_opts if owner else fs.opts,
            fstab=v.nvmeof_initiator_fstab,
        )
