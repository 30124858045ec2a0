"""nvmeof_target: a Linux nvmet NVMe-oF target from variables (ports, subsystems, namespaces).

The configuration is written as nvmetcli's /etc/nvmet/config.json (what ``nvmetcli save``
writes and ``nvmetcli restore`` / nvmet.service read), applied with ``nvmetcli restore`` when the
file changed or configfs differs from it, and then read back from configfs and compared key by
key: nvmetcli exits 0 even when an object fails, so only the read-back proves the result.
"""

from __future__ import annotations

import ipaddress
import json
import posixpath
from shlex import quote
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field

from fxkit import nvme_fabric
from fxkit.engine.role import Host
from fxkit.engine.rolevars import (
    AbsolutePath,
    FleetVars,
    IpAddress,
    Nqn,
    RoleKeys,
    RoleVars,
    Rule,
    Size,
    Text,
    Whole,
    pattern,
)
from fxkit.facts.kernel import ModuleState
from fxkit.facts.nvme import UUID
from fxkit.facts.nvmet import NVMET, NvmetConfig, PathKinds, differences
from fxkit.ops.base import OpContext, Result, failed, ok

MAX_ID = 8192  # nvmetcli: Port.MAX_PORTID and Namespace.MAX_NSID


# -- variables --------------------------------------------------------------------------------


def _printable(limit: int) -> AfterValidator:
    """attr_serial / attr_model: 1 to ``limit`` printable ASCII characters (NVMe Identify
    Controller SN 20, MN 40 bytes; nvmet's nvmet_is_ascii refuses the rest)."""
    return pattern(rf"[ -~]{{1,{limit}}}", f"1 to {limit} printable ASCII characters")


Uuid = Annotated[
    str, AfterValidator(Rule("UUID", lambda s: "" if UUID.fullmatch(s) else "not a UUID"))
]
BackingPath = Annotated[str, pattern(r"/.*[^/]", "an absolute path (not ending in /)")]


class Namespace(RoleKeys):
    """A namespace of a subsystem, backed by a block device or a file."""

    nsid: Whole = Field(ge=1, le=MAX_ID, description="namespace id, unique in its subsystem")
    path: BackingPath = Field(
        description="the backing block device or file",
        examples=["/dev/nvme0n1", "/srv/nvmet/ns1.img"],
    )
    size: Size | None = Field(
        None,
        description="files only: created sparse with this size when absent (`truncate -s`); "
        "an existing file is never touched",
        examples=["100G"],
    )
    uuid: Uuid | None = Field(None, description="device_uuid")
    nguid: Uuid | None = Field(None, description="device_nguid")
    enable: bool = Field(True, description="enabled")


class Subsystem(RoleKeys):
    """A subsystem: its NQN, who may connect, its attributes and namespaces."""

    nqn: Nqn = Field(
        description="the subsystem's NQN, unique in the fabric",
        examples=["nqn.2024-01.com.example:models"],
    )
    allow_any_host: bool = Field(False, description="every host may connect (attr_allow_any_host)")
    allowed_hosts: list[Nqn] = Field(
        [],
        description="host NQNs allowed to connect (give these or allow_any_host)",
        examples=[["nqn.2014-08.org.nvmexpress:uuid:0a6cb37d-1915-40d2-97a1-4de3c4017f0b"]],
    )
    serial: Annotated[str, _printable(20)] | None = Field(
        None, description="attr_serial (nvme list shows it as SerialNumber)"
    )
    model: Annotated[str, _printable(40)] | None = Field(None, description="attr_model")
    attr: dict[
        Annotated[str, pattern(r"[a-z][a-z0-9_]*", "an attribute name (a-z, 0-9, _)")],
        Text,  # as nvmetcli writes them: version: 1.3 is "1.3"
    ] = Field(
        {}, description="other `attr_*` values of the subsystem", examples=[{"version": "1.3"}]
    )
    namespaces: list[Namespace] = Field([], description="its namespaces")


class Port(RoleKeys):
    """A port the target listens on (a listener: transport, address, service id)."""

    id: Whole = Field(ge=1, le=MAX_ID, description="port id (portid), unique on the host")
    transport: Literal["rdma", "tcp", "loop"] = Field(
        description="`rdma` (RoCE, InfiniBand) or `tcp`; `loop` only for local tests (no address)"
    )
    address: IpAddress | None = Field(
        None,
        description="traddr: the IP address the target listens on (all but loop)",
        examples=["192.168.100.10"],
    )
    service_id: Whole = Field(4420, ge=1, le=65535, description="trsvcid")
    adrfam: Literal["ipv4", "ipv6"] | None = Field(
        None, description="addr_adrfam (default: from the address)"
    )
    subsystems: list[Nqn] | None = Field(
        None, description="NQNs offered on this port (default: every subsystem)"
    )


class Vars(RoleVars):
    nvmeof_target_ports: list[Port] = Field(
        [],
        description="ports the target listens on",
        examples=[[{"id": 1, "transport": "rdma", "address": "192.168.100.10"}]],
    )
    nvmeof_target_subsystems: list[Subsystem] = Field(
        [], description="subsystems, the hosts allowed to connect, and their namespaces"
    )
    nvmeof_target_hosts: list[Nqn] = Field(
        [],
        description="host NQNs created on the target besides those in `allowed_hosts` "
        "(nvmetcli's `hosts`)",
    )
    nvmeof_target_config_file: AbsolutePath = Field(
        "/etc/nvmet/config.json",
        description="the saved configuration nvmet.service restores at boot (nvmetcli's "
        "default file)",
    )
    nvmeof_target_packages: list[str] = Field(["nvmetcli"], description="packages installed")
    nvmeof_target_modules: list[str] = Field(
        ["nvmet", "nvmet-rdma", "nvmet-tcp"], description="kernel modules persisted and loaded"
    )
    nvmeof_target_service: str = Field(
        "nvmet.service", description="the unit enabled (restores the file at boot)"
    )


def adrfam(address: str) -> str:
    """``ipv4`` or ``ipv6`` for an IP address (nvmet's addr_adrfam)."""
    return "ipv6" if ipaddress.ip_address(address).version == 6 else "ipv4"


def validate(v: Vars) -> None:
    """What the types cannot say: NQNs, nsids, port ids and listeners used twice, hosts
    allowed, addresses and the ports' subsystems."""
    names: set[str] = set()
    for i, sub in enumerate(v.nvmeof_target_subsystems):
        var = f"nvmeof_target_subsystems[{i}]"
        if sub.nqn in names:
            raise v.wrong(
                f"{var}.nqn", f"subsystem {sub.nqn} is defined twice", "one entry per NQN"
            )
        names.add(sub.nqn)
        _check_subsystem(v, var, sub)
    _check_ports(v, names)


def _check_subsystem(v: Vars, var: str, sub: Subsystem) -> None:
    if sub.allow_any_host and sub.allowed_hosts:
        raise v.wrong(
            f"{var}.allow_any_host",
            "allow_any_host is true and allowed_hosts are given",
            hint="with allow_any_host every host may connect: drop one of the two",
        )
    if not sub.allow_any_host and not sub.allowed_hosts:
        raise v.wrong(
            f"{var}.allowed_hosts",
            f"no host may connect to {sub.nqn}",
            hint="list the initiators' host NQNs in allowed_hosts, or set allow_any_host: true",
        )
    nsids: set[int] = set()
    for j, ns in enumerate(sub.namespaces):
        if ns.nsid in nsids:
            raise v.wrong(
                f"{var}.namespaces[{j}].nsid",
                f"nsid {ns.nsid} is used twice in {sub.nqn}",
                "give each namespace of a subsystem its own nsid",
            )
        nsids.add(ns.nsid)


def _check_ports(v: Vars, subsystems: set[str]) -> None:
    ids: set[int] = set()
    listeners: set[tuple[str, str, int]] = set()
    for i, port in enumerate(v.nvmeof_target_ports):
        var = f"nvmeof_target_ports[{i}]"
        if port.id in ids:
            raise v.wrong(
                f"{var}.id", f"port id {port.id} is used twice", "give each port its own id"
            )
        ids.add(port.id)
        if port.transport != "loop":
            if port.address is None:
                raise v.wrong(
                    f"{var}.address",
                    f"port {port.id} ({port.transport}) has no address",
                    hint="the IP address the target listens on, e.g. 192.168.100.10",
                )
            family = adrfam(port.address)
            if port.adrfam not in (None, family):
                raise v.wrong(
                    f"{var}.adrfam",
                    f"adrfam {port.adrfam!r} but {port.address} is {family}",
                    f"adrfam: {family}, or leave it out (it follows the address)",
                )
            listener = (port.transport, port.address, port.service_id)
            if listener in listeners:
                raise v.wrong(
                    f"{var}.address",
                    f"{port.transport} {port.address}:{port.service_id} is used by two ports",
                    "one port per listener: list every subsystem it offers under one port",
                )
            listeners.add(listener)
        unknown = [n for n in port.subsystems or [] if n not in subsystems]
        if unknown:
            raise v.wrong(
                f"{var}.subsystems",
                f"{unknown[0]} is not in nvmeof_target_subsystems",
                "a port offers subsystems this target defines: list their NQNs",
            )


def validate_all(hosts: dict[str, Vars], fleet: FleetVars) -> None:
    """An NQN names one subsystem in the whole fabric: no two targets may define the same one.
    Then the fabric as a whole, targets and initiators (:mod:`fxkit.nvme_fabric`)."""
    owner: dict[str, str] = {}
    for name, v in hosts.items():
        for i, sub in enumerate(v.nvmeof_target_subsystems):
            if sub.nqn in owner and owner[sub.nqn] != name:
                raise v.wrong(
                    f"nvmeof_target_subsystems[{i}].nqn",
                    f"subsystem {sub.nqn} is defined on {owner[sub.nqn]} and on {name}",
                    hint="an NQN names one subsystem fabric-wide: give each target its own",
                )
            owner.setdefault(sub.nqn, name)
    nvme_fabric.check(fleet)


# -- the configuration nvmetcli restores ------------------------------------------------------


def nvmet_config(v: Vars) -> dict[str, Any]:
    """The desired state in nvmetcli's config.json structure (linux-nvme/nvmetcli, nvme.py
    ``Root.dump``): ``hosts``, ``ports``, ``subsystems``; values as nvmetcli writes them."""
    subsystems = v.nvmeof_target_subsystems
    allowed = {h for s in subsystems for h in s.allowed_hosts}
    hosts = sorted(allowed | set(v.nvmeof_target_hosts))
    every = [s.nqn for s in subsystems]
    return {
        "hosts": [{"nqn": nqn} for nqn in hosts],
        "ports": [_port(p, every) for p in v.nvmeof_target_ports],
        "subsystems": [_subsystem(s) for s in subsystems],
    }


def _port(port: Port, every: list[str]) -> dict[str, Any]:
    loop = port.transport == "loop"
    address = "" if loop or port.address is None else port.address
    return {
        "addr": {
            "adrfam": "" if loop else port.adrfam or adrfam(address),
            "traddr": address,
            "treq": "not specified",
            "trsvcid": "" if loop else str(port.service_id),
            "trtype": port.transport,
        },
        "portid": port.id,
        "referrals": [],
        "subsystems": list(port.subsystems or every),
    }


def _subsystem(sub: Subsystem) -> dict[str, Any]:
    attr = dict(sub.attr)
    attr["allow_any_host"] = "1" if sub.allow_any_host else "0"
    attr.update({k: text for k, text in (("serial", sub.serial), ("model", sub.model)) if text})
    return {
        "allowed_hosts": list(sub.allowed_hosts),
        "attr": attr,
        "namespaces": [_namespace(ns) for ns in sub.namespaces],
        "nqn": sub.nqn,
    }


def _namespace(ns: Namespace) -> dict[str, Any]:
    device = {"path": ns.path}
    device.update({k: text.lower() for k, text in (("nguid", ns.nguid), ("uuid", ns.uuid)) if text})
    return {"device": device, "enable": int(ns.enable), "nsid": ns.nsid}


def render(config: dict[str, Any]) -> str:
    """config.json as ``nvmetcli save`` writes it: sorted keys, two-space indent, a newline."""
    return json.dumps(config, sort_keys=True, indent=2) + "\n"


# -- applying it ------------------------------------------------------------------------------


def nvmet_restore(
    ctx: OpContext, config_file: str, desired: dict[str, Any], written: bool, configfs: str = NVMET
) -> Result:
    """``nvmetcli restore`` the file when it was just written or configfs differs from it; then
    read configfs back: the step fails unless every key of the file is what configfs holds."""
    state = ctx.fresh(NvmetConfig, configfs)
    where = " (simulated lab host)" if state.simulated else ""
    before = differences(desired, state.config)
    if not before and not written:
        return ok(f"configfs matches {config_file}{where}")
    why = "; ".join(before[:5]) if before else f"{config_file} changed"
    restored = ctx.change(
        f"nvmetcli restore {quote(config_file)}",
        would=f"nvmetcli restore {config_file} ({why})",
        done=f"restored {config_file}",
        diff="".join(f"{line}\n" for line in before) or f"{config_file} changed\n",
    )
    if not restored.changed or ctx.check:
        return restored
    after = differences(desired, ctx.fresh(NvmetConfig, configfs).config)
    if after:
        said = restored.data.get("stdout", "").strip()
        return failed(
            f"nvmetcli restore exited 0 but configfs differs from {config_file}: "
            + "; ".join(after)
            + (f" (nvmetcli said: {said[-400:]})" if said else ""),
            stdout=said,
        )
    restored.msg = f"restored {config_file}; configfs read back matches it{where}"
    return restored


def create_file(ctx: OpContext, path: str, size: str) -> Result:
    """A sparse backing file of ``size`` where ``path`` does not exist; an existing file, with
    whatever data it holds, is never touched."""
    if ctx.fresh(PathKinds, path)[path] != "absent":
        return ok(f"{path} exists")
    return ctx.change(
        f"mkdir -p -- {quote(posixpath.dirname(path))} && "
        f"truncate -s {quote(size)} -- {quote(path)}",
        would=f"create the {size} backing file {path}",
        done=f"created the {size} backing file {path}",
        diff=f"{path}: absent -> sparse file of {size}\n",
    )


def apply(host: Host, v: Vars) -> None:
    desired = nvmet_config(v)
    config_file = v.nvmeof_target_config_file
    host.packages(v.nvmeof_target_packages)
    namespaces = [(sub.nqn, ns) for sub in v.nvmeof_target_subsystems for ns in sub.namespaces]
    for _, ns in namespaces:
        if ns.size is not None:
            host.call(create_file, ns.path, ns.size)
    host.directory(posixpath.dirname(config_file), mode="0755")
    written = host.task(f"file {config_file}").file(config_file, render(desired), mode="0600")
    for name in v.nvmeof_target_modules:
        host.module(name)
    host.service(v.nvmeof_target_service, enabled=True)

    state = host.fact(NvmetConfig)
    # In check mode the module step only said it would load nvmet: configfs is not there yet.
    nvmet = host.fact(ModuleState, "nvmet")
    coming = host.check and not nvmet.loaded and not nvmet.cannot_load
    if not host.needs(not state.missing or coming, "apply the nvmet configuration", state.missing):
        return
    kinds = host.fact(PathKinds, *(ns.path for _, ns in namespaces)) if namespaces else {}
    ready = True
    for nqn, ns in namespaces:
        kind = kinds[ns.path]
        if kind == "other":
            host.fail(
                f"namespace {ns.nsid} of {nqn}: {ns.path} is neither a block device nor a file"
            )
        made = ns.size is not None  # created above (in check mode: would be)
        ready &= host.needs(
            kind != "absent" or made,
            f"namespace {ns.nsid} of {nqn}",
            f"{ns.path} does not exist",
        )
    if ready:
        host.task("apply and verify the nvmet configuration").call(
            nvmet_restore, config_file, desired, bool(written)
        )
