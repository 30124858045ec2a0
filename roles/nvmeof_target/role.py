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
import re
from shlex import quote
from typing import Any

from fxkit.engine.role import Host
from fxkit.engine.rolevars import mappings, valid_nqn, var_error, whole_number
from fxkit.engine.variables import HostVars
from fxkit.errors import VarError
from fxkit.facts.kernel import ModuleState
from fxkit.facts.nvme import UUID
from fxkit.facts.nvmet import NVMET, NvmetConfig, PathKinds, differences
from fxkit.ops.base import OpContext, Result, failed, ok

TRANSPORTS = ("rdma", "tcp", "loop")
MAX_ID = 8192  # nvmetcli: Port.MAX_PORTID and Namespace.MAX_NSID
_SIZE = re.compile(r"[1-9][0-9]*[KMGT]?")
_ATTR = re.compile(r"[a-z][a-z0-9_]*")
#: attr_serial and attr_model limits (NVMe Identify Controller: SN 20, MN 40 ASCII bytes).
_TEXT_LIMITS = {"serial": 20, "model": 40}


# -- variables --------------------------------------------------------------------------------


def adrfam(address: str) -> str:
    """``ipv4`` or ``ipv6`` for an IP address (nvmet's addr_adrfam)."""
    return "ipv6" if ipaddress.ip_address(address).version == 6 else "ipv4"


def validate(v: HostVars) -> None:
    """Every variable of one target, before any host is touched."""
    subsystems = mappings(v, "nvmeof_target_subsystems")
    names: set[str] = set()
    for i, sub in enumerate(subsystems):
        var = f"nvmeof_target_subsystems[{i}]"
        nqn = valid_nqn(v, f"{var}.nqn", sub.get("nqn"))
        if nqn in names:
            raise var_error(v, f"{var}.nqn", f"subsystem {nqn} is defined twice")
        names.add(nqn)
        _check_subsystem(v, var, sub)
    for i, nqn in enumerate(v.get("nvmeof_target_hosts") or []):
        valid_nqn(v, f"nvmeof_target_hosts[{i}]", nqn)
    _check_ports(v, names)


def _check_subsystem(v: HostVars, var: str, sub: dict[str, Any]) -> None:
    hosts = sub.get("allowed_hosts") or []
    if not isinstance(hosts, list):
        raise var_error(v, f"{var}.allowed_hosts", "allowed_hosts must be a list of host NQNs")
    for j, host in enumerate(hosts):
        valid_nqn(v, f"{var}.allowed_hosts[{j}]", host)
    if sub.get("allow_any_host") not in (None, True, False):
        raise var_error(v, f"{var}.allow_any_host", "allow_any_host must be true or false")
    if sub.get("allow_any_host") and hosts:
        raise var_error(
            v,
            f"{var}.allow_any_host",
            "allow_any_host is true and allowed_hosts are given",
            hint="with allow_any_host every host may connect: drop one of the two",
        )
    if not sub.get("allow_any_host") and not hosts:
        raise var_error(
            v,
            f"{var}.allowed_hosts",
            f"no host may connect to {sub['nqn']}",
            hint="list the initiators' host NQNs in allowed_hosts, or set allow_any_host: true",
        )
    for key, limit in _TEXT_LIMITS.items():
        text = sub.get(key)
        if text is not None and (
            not isinstance(text, str) or not text.isascii() or not 0 < len(text) <= limit
        ):
            raise var_error(v, f"{var}.{key}", f"{key} must be 1 to {limit} ASCII characters")
    attr = sub.get("attr") or {}
    if not isinstance(attr, dict) or not all(_ATTR.fullmatch(str(k)) for k in attr):
        raise var_error(v, f"{var}.attr", "attr must map attribute names (attr_<name>) to values")
    namespaces = sub.get("namespaces") or []
    if not isinstance(namespaces, list) or not all(isinstance(n, dict) for n in namespaces):
        raise var_error(v, f"{var}.namespaces", "namespaces must be a list of mappings")
    nsids: set[int] = set()
    for j, ns in enumerate(namespaces):
        at = f"{var}.namespaces[{j}]"
        nsid = whole_number(v, f"{at}.nsid", ns.get("nsid"), 1, MAX_ID)
        if nsid in nsids:
            raise var_error(v, f"{at}.nsid", f"nsid {nsid} is used twice in {sub['nqn']}")
        nsids.add(nsid)
        path = ns.get("path")
        if not isinstance(path, str) or not path.startswith("/") or path.endswith("/"):
            raise var_error(
                v,
                f"{at}.path",
                f"backing path {path!r} is not an absolute path",
                hint="a block device (/dev/nvme0n1) or a file (/srv/nvmet/ns1.img)",
            )
        size = ns.get("size")
        if size is not None and not _SIZE.fullmatch(str(size)):
            raise var_error(
                v,
                f"{at}.size",
                f"size {size!r} is not a size",
                hint="bytes, or a number with K, M, G or T (truncate -s)",
            )
        for key in ("uuid", "nguid"):
            if ns.get(key) is not None and not UUID.fullmatch(str(ns[key])):
                raise var_error(v, f"{at}.{key}", f"{ns[key]!r} is not a UUID")


def _check_ports(v: HostVars, subsystems: set[str]) -> None:
    ids: set[int] = set()
    listeners: set[tuple[str, str, int]] = set()
    for i, port in enumerate(mappings(v, "nvmeof_target_ports")):
        var = f"nvmeof_target_ports[{i}]"
        portid = whole_number(v, f"{var}.id", port.get("id"), 1, MAX_ID)
        if portid in ids:
            raise var_error(v, f"{var}.id", f"port id {portid} is used twice")
        ids.add(portid)
        transport = port.get("transport")
        if transport not in TRANSPORTS:
            raise var_error(
                v,
                f"{var}.transport",
                f"transport {transport!r} is not one of rdma, tcp",
                hint="rdma (RoCE, InfiniBand) or tcp; loop only for local tests",
            )
        service = whole_number(v, f"{var}.service_id", port.get("service_id", 4420), 1, 65535)
        address = port.get("address")
        if transport != "loop":
            if not address:
                raise var_error(
                    v,
                    f"{var}.address",
                    f"port {portid} ({transport}) has no address",
                    hint="the IP address the target listens on, e.g. 192.168.100.10",
                )
            try:
                family = adrfam(str(address))
            except ValueError:
                raise var_error(v, f"{var}.address", f"{address!r} is not an IP address") from None
            if port.get("adrfam", family) != family:
                raise var_error(
                    v, f"{var}.adrfam", f"adrfam {port['adrfam']!r} but {address} is {family}"
                )
            if (transport, str(address), service) in listeners:
                raise var_error(
                    v, f"{var}.address", f"{transport} {address}:{service} is used by two ports"
                )
            listeners.add((transport, str(address), service))
        offered = port.get("subsystems")
        if offered is not None:
            if not isinstance(offered, list):
                raise var_error(v, f"{var}.subsystems", "subsystems must be a list of NQNs")
            unknown = [n for n in offered if n not in subsystems]
            if unknown:
                raise var_error(
                    v, f"{var}.subsystems", f"{unknown[0]} is not in nvmeof_target_subsystems"
                )


def validate_all(hosts: dict[str, HostVars]) -> None:
    """An NQN names one subsystem in the whole fabric: no two targets may define the same one."""
    owner: dict[str, str] = {}
    for name, v in hosts.items():
        for i, sub in enumerate(mappings(v, "nvmeof_target_subsystems")):
            nqn = sub.get("nqn")
            if nqn in owner and owner[nqn] != name:
                raise VarError(
                    f"subsystem {nqn} is defined on {owner[nqn]} and on {name}",
                    where=f"{name}: nvmeof_target_subsystems[{i}].nqn",
                    hint="an NQN names one subsystem fabric-wide: give each target its own",
                )
            owner.setdefault(str(nqn), name)


# -- the configuration nvmetcli restores ------------------------------------------------------


def nvmet_config(v: HostVars) -> dict[str, Any]:
    """The desired state in nvmetcli's config.json structure (linux-nvme/nvmetcli, nvme.py
    ``Root.dump``): ``hosts``, ``ports``, ``subsystems``; values as nvmetcli writes them."""
    subsystems = mappings(v, "nvmeof_target_subsystems")
    allowed = {h for s in subsystems for h in s.get("allowed_hosts") or []}
    hosts = sorted(allowed | set(v.get("nvmeof_target_hosts") or []))
    every = [s["nqn"] for s in subsystems]
    return {
        "hosts": [{"nqn": nqn} for nqn in hosts],
        "ports": [_port(p, every) for p in mappings(v, "nvmeof_target_ports")],
        "subsystems": [_subsystem(s) for s in subsystems],
    }


def _port(port: dict[str, Any], every: list[str]) -> dict[str, Any]:
    loop = port["transport"] == "loop"
    address = "" if loop else str(port["address"])
    return {
        "addr": {
            "adrfam": "" if loop else port.get("adrfam", adrfam(address)),
            "traddr": address,
            "treq": "not specified",
            "trsvcid": "" if loop else str(port.get("service_id", 4420)),
            "trtype": port["transport"],
        },
        "portid": int(port["id"]),
        "referrals": [],
        "subsystems": list(port.get("subsystems") or every),
    }


def _subsystem(sub: dict[str, Any]) -> dict[str, Any]:
    attr = {k: str(val) for k, val in (sub.get("attr") or {}).items()}
    attr["allow_any_host"] = "1" if sub.get("allow_any_host") else "0"
    attr.update({k: str(sub[k]) for k in _TEXT_LIMITS if sub.get(k) is not None})
    return {
        "allowed_hosts": list(sub.get("allowed_hosts") or []),
        "attr": attr,
        "namespaces": [_namespace(ns) for ns in sub.get("namespaces") or []],
        "nqn": sub["nqn"],
    }


def _namespace(ns: dict[str, Any]) -> dict[str, Any]:
    device = {"path": ns["path"]}
    device.update({k: str(ns[k]).lower() for k in ("nguid", "uuid") if ns.get(k)})
    return {
        "device": device,
        "enable": 0 if ns.get("enable") is False else 1,
        "nsid": int(ns["nsid"]),
    }


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


def apply(host: Host, v: HostVars) -> None:
    desired = nvmet_config(v)
    config_file = v.nvmeof_target_config_file
    host.packages(v.nvmeof_target_packages)
    namespaces = [
        (sub["nqn"], ns) for sub in v.nvmeof_target_subsystems for ns in sub.get("namespaces") or []
    ]
    for _, ns in namespaces:
        if ns.get("size") is not None:
            host.call(create_file, ns["path"], str(ns["size"]))
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
    kinds = host.fact(PathKinds, *(ns["path"] for _, ns in namespaces)) if namespaces else {}
    ready = True
    for nqn, ns in namespaces:
        kind = kinds[ns["path"]]
        if kind == "other":
            host.fail(
                f"namespace {ns['nsid']} of {nqn}: {ns['path']} is neither a block device "
                "nor a file"
            )
        made = ns.get("size") is not None  # created above (in check mode: would be)
        ready &= host.needs(
            kind != "absent" or made,
            f"namespace {ns['nsid']} of {nqn}",
            f"{ns['path']} does not exist",
        )
    if ready:
        host.task("apply and verify the nvmet configuration").call(
            nvmet_restore, config_file, desired, bool(written)
        )
