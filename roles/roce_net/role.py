"""roce_net: the back-end RDMA interfaces addressed as AMD's network configuration guide does
it (an IPv4 address per interface, a routing table and a source rule per interface, the ARP and
reverse-path sysctls), RDMA ports left unused reported or brought down, the RoCE v2 GID of each
address verified; reapplied at boot by a oneshot unit.

One source of truth for the commands: :func:`plan` gives each setting (what, wanted state, how
to read it, command); the role runs a command only when the read differs, and the boot script
(templates/fxkit-roce-net.sh.j2) runs the same commands in the same order.
"""

from __future__ import annotations

import ipaddress
import posixpath
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from shlex import quote
from typing import Annotated, Any, Literal

from pydantic import Field

from fxkit.engine.role import Host
from fxkit.engine.rolevars import AbsolutePath, InterfaceName, RoleKeys, RoleVars, Whole, pattern
from fxkit.engine.variables import environment
from fxkit.errors import VarError
from fxkit.facts.gids import Gid, GidTable
from fxkit.facts.kernel import SysctlState
from fxkit.facts.netaddr import (
    Bond,
    IpAddr,
    IpRoutes,
    IpRules,
    Route,
    Rule,
    front_end,
    rule_source,
)
from fxkit.facts.rdma import RdmaLink, RdmaLinks, RdmaPort
from fxkit.ops.base import OpContext, Result, failed, ok, skipped
from fxkit.ops.readback import set_and_read_back
from fxkit.ops.systemd import device_unit

#: Routing tables the kernel keeps for itself (include/uapi/linux/rtnetlink.h: RT_TABLE_*).
RESERVED_TABLES = {0: "unspec", 253: "default", 254: "main", 255: "local"}
#: Rule priorities of the kernel's default rules (0 local, 32766 main, 32767 default).
RESERVED_PRIORITIES = (0, 32766, 32767)
#: How long the kernel may take to add an address's GIDs (roce_gid_mgmt.c works from a queue).
GID_WAIT_S = 5.0

# -- variables ------------------------------------------------------------------------------------

Ipv4Interface = Annotated[
    str, pattern(r"\d{1,3}(\.\d{1,3}){3}/\d{1,2}", "an IPv4 address with its prefix length")
]
Ipv4 = Annotated[str, pattern(r"\d{1,3}(\.\d{1,3}){3}", "an IPv4 address")]


class Port(RoleKeys):
    """One back-end interface and its addressing."""

    name: InterfaceName = Field(description="the interface, as `ip link` shows it")
    address: Ipv4Interface = Field(
        description="its address and prefix (`192.168.1.201/31`), one per interface"
    )
    gateway: Ipv4 | None = Field(
        None,
        description="the next hop of its table's default route (none: the other address of a "
        "/31, as in AMD's example)",
    )
    table: Whole | None = Field(
        None, ge=1, le=2**31 - 1, description="its routing table (none: 101, 102... by position)"
    )
    priority: Whole | None = Field(
        None, ge=1, le=32765, description="its rule's priority (none: 1010, 1020... by position)"
    )


class Vars(RoleVars):
    roce_net_interfaces: list[Port] = Field(
        [],
        description="the back-end ports: the interfaces RDMA traffic uses, each with its "
        "address (`{name: IF, address: A/N, gateway: G, table: T, priority: P}`); every other "
        "RDMA port is unused (`roce_net_unused_ports`)",
        examples=[[{"name": "ens6np0", "address": "192.168.1.201/31"}]],
    )
    roce_net_arp_ignore: Whole = Field(
        2, ge=0, le=8, description="`net.ipv4.conf.all.arp_ignore` (AMD: 2)"
    )
    roce_net_arp_announce: Whole = Field(
        1, ge=0, le=2, description="`net.ipv4.conf.all.arp_announce` (AMD: 1)"
    )
    roce_net_rp_filter: Whole = Field(
        2, ge=0, le=2, description="`net.ipv4.conf.all.rp_filter` (AMD: 2, loose)"
    )
    roce_net_sysctl_file: AbsolutePath = Field(
        "/etc/sysctl.d/60-fxkit-roce-net.conf", description="where the sysctls persist"
    )
    roce_net_unused_ports: Literal["report", "down"] = Field(
        "report",
        description="RDMA ports that are neither back-end ports nor in `roce_net_keep`: "
        "`report` them, or bring their interface `down` (AMD: disable unused ports)",
        examples=["report", "down"],
    )
    roce_net_keep: list[InterfaceName] = Field(
        [],
        description="RDMA interfaces that are not back-end ports but stay as they are (a "
        "storage NIC another role configures); a front-end bond always does",
    )
    roce_net_gid_index: Whole = Field(
        3,
        ge=0,
        le=255,
        description="the GID index of each address's RoCE v2 GID (`NCCL_IB_GID_INDEX`), "
        "verified to hold the interface's address",
    )
    roce_net_script: AbsolutePath = Field(
        "/usr/local/sbin/fxkit-roce-net", description="the boot script"
    )
    roce_net_unit: Annotated[str, pattern(r"[\w:.@-]+\.service", "a systemd service name")] = Field(
        "fxkit-roce-net.service", description="the oneshot unit that runs it at boot"
    )


SYSCTLS = ("arp_ignore", "arp_announce", "rp_filter")


@dataclass(frozen=True)
class Addressing:
    """One back-end interface's addressing, defaults filled in."""

    name: str
    address: str
    gateway: str
    table: int
    priority: int

    @property
    def ip(self) -> str:
        return rule_source(self.address)


def addressing(v: Vars) -> list[Addressing]:
    """The interfaces with the defaults of AMD's example (tables 101..., priorities 1010...,
    the gateway the other end of a /31)."""
    out = []
    for i, port in enumerate(v.roce_net_interfaces):
        iface = ipaddress.IPv4Interface(port.address)
        gateway = port.gateway
        if gateway is None and iface.network.prefixlen == 31:
            gateway = str(next(a for a in iface.network if a != iface.ip))
        out.append(
            Addressing(
                port.name,
                str(iface),
                gateway or "",
                port.table if port.table is not None else 101 + i,
                port.priority if port.priority is not None else 1010 + 10 * i,
            )
        )
    return out


def _check_port(v: Vars, i: int, port: Port) -> None:
    var = f"roce_net_interfaces[{i}]"
    try:
        iface = ipaddress.IPv4Interface(port.address)
    except ValueError as exc:
        raise v.wrong(f"{var}.address", f"{port.address}: {exc}", "e.g. 192.168.1.201/31") from None
    net = iface.network
    edges = (net.network_address, net.broadcast_address) if net.prefixlen < 31 else ()
    if net.prefixlen == 32 or iface.ip in edges:
        raise v.wrong(
            f"{var}.address",
            f"{port.address} is not a host address of a subnet its gateway can be in",
            "a /31 point-to-point link as in AMD's guide, or a host address of a larger subnet",
        )
    if port.gateway is None and iface.network.prefixlen != 31:
        raise v.wrong(
            f"{var}.gateway",
            f"{port.name}: no gateway, and {port.address} is not a /31 whose other end it is",
            "set gateway: the next hop of this interface's default route",
        )
    if port.gateway is not None:
        try:
            gateway = ipaddress.IPv4Address(port.gateway)
        except ValueError as exc:
            raise v.wrong(f"{var}.gateway", str(exc), "e.g. 192.168.1.200") from None
        if gateway not in iface.network or gateway == iface.ip:
            raise v.wrong(
                f"{var}.gateway",
                f"gateway {gateway} is not another address of {iface.network}",
                "the next hop must be on the interface's own subnet",
            )
    if port.table in RESERVED_TABLES:
        raise v.wrong(
            f"{var}.table",
            f"table {port.table} is the kernel's {RESERVED_TABLES[port.table]} table",
            "use a table of its own, e.g. 101",
        )


def validate(v: Vars) -> None:
    """What the types cannot say: addresses, gateways, tables and priorities that make sense
    and are each used once; the kept interfaces are not back-end ports."""
    for i, port in enumerate(v.roce_net_interfaces):
        _check_port(v, i, port)
    seen: dict[str, dict[object, int]] = {k: {} for k in ("name", "ip", "table", "priority")}
    for i, entry in enumerate(addressing(v)):
        for key, value in (
            ("name", entry.name),
            ("ip", entry.ip),
            ("table", entry.table),
            ("priority", entry.priority),
        ):
            if value in seen[key]:
                raise v.wrong(
                    f"roce_net_interfaces[{i}]",
                    f"{key} {value} is also that of roce_net_interfaces[{seen[key][value]}]",
                    "each interface has its own address, routing table and rule priority",
                )
            seen[key][value] = i
    for name in v.roce_net_keep:
        if name in seen["name"]:
            raise v.wrong(
                "roce_net_keep",
                f"{name} is a back-end port (roce_net_interfaces) and cannot also be kept apart",
                "list it in one of the two",
            )


def validate_all(hosts: Mapping[str, Vars]) -> None:
    """An address is one interface's on one host: two hosts with the same one cannot both
    reach the fabric."""
    owner: dict[str, tuple[str, int]] = {}
    errors: list[VarError] = []
    for host, v in hosts.items():
        for i, entry in enumerate(addressing(v)):
            if entry.ip in owner and owner[entry.ip][0] != host:
                other, j = owner[entry.ip]
                errors.append(
                    v.wrong(
                        f"roce_net_interfaces[{i}].address",
                        f"{entry.ip} is also the address of {other}'s roce_net_interfaces[{j}]",
                        "every RDMA interface of the fabric has an address of its own",
                    )
                )
            owner.setdefault(entry.ip, (host, i))
    if errors:
        raise errors[0]


# -- what each setting is -------------------------------------------------------------------------


@dataclass(frozen=True)
class Setting:
    """One setting: ``command`` makes ``read(ctx)`` return ``want``."""

    what: str
    want: str
    command: str
    read: Callable[[OpContext], str]


def _link_state(name: str) -> Callable[[OpContext], str]:
    return lambda ctx: "up" if ctx.fresh(IpAddr, name).up else "down"


def _has_address(name: str, address: str) -> Callable[[OpContext], str]:
    return lambda ctx: address if address in ctx.fresh(IpAddr, name).ipv4 else "absent"


def _default_route(table: int) -> Callable[[OpContext], str]:
    def read(ctx: OpContext) -> str:
        route = next((r for r in ctx.fresh(IpRoutes, table) if r.dst == "default"), None)
        return _route_text(route) if route else "absent"

    return read


def _route_text(route: Route) -> str:
    return f"default via {route.gateway} dev {route.dev}"


def _rule(priority: int) -> Callable[[OpContext], str]:
    def read(ctx: OpContext) -> str:
        rules = [r for r in ctx.fresh(IpRules) if r.priority == priority]
        return "; ".join(_rule_text(r) for r in rules) or "absent"

    return read


def _rule_text(rule: Rule) -> str:
    return f"{rule.priority}: from {rule.src} lookup {rule.table}"


def plan(entry: Addressing) -> list[Setting]:
    """The settings of one back-end interface, in the order they run (and the boot script
    runs them): AMD's nmcli profile as iproute2 commands."""
    q, t, p = quote(entry.name), entry.table, entry.priority
    route = Route("default", entry.gateway, entry.name)
    return [
        Setting(f"link of {entry.name}", "up", f"ip link set dev {q} up", _link_state(entry.name)),
        Setting(
            f"address of {entry.name}",
            entry.address,
            f"ip addr replace {quote(entry.address)} dev {q}",
            _has_address(entry.name, entry.address),
        ),
        Setting(
            f"table {t} of {entry.name}",
            _route_text(route),
            f"ip route replace default via {quote(entry.gateway)} dev {q} table {t}",
            _default_route(t),
        ),
        Setting(
            f"rule {p} of {entry.name}",
            _rule_text(Rule(p, entry.ip, str(t))),
            f"while ip rule del priority {p} 2>/dev/null; do :; done; "
            f"ip rule add priority {p} from {quote(entry.ip)} table {t}",
            _rule(p),
        ),
    ]


def down(name: str) -> Setting:
    """An unused port's interface brought down (AMD: disable unused ports)."""
    return Setting(
        f"link of unused {name}", "down", f"ip link set dev {quote(name)} down", _link_state(name)
    )


def converge(ctx: OpContext, setting: Setting) -> Result:
    """Run ``setting.command`` when the setting does not read ``setting.want``; read it back.

    Example::

        host.task("address of ens6np0").call(converge, setting)
    """
    return set_and_read_back(ctx, setting.what, setting.want, setting.command, setting.read)


# -- ports ----------------------------------------------------------------------------------------


def front_end_of(host: Host, port: RdmaPort) -> str:
    """Why ``port`` is a front-end bond ("" when it is not)."""
    return front_end(port.device, host.fact(Bond, port.netdev) if port.netdev else None)


@dataclass(frozen=True)
class Ports:
    #: Back-end interface -> its RDMA port (None where `rdma link` shows none).
    backend: dict[str, RdmaPort | None]
    #: RDMA ports neither back-end nor kept, nor a front-end bond.
    unused: tuple[RdmaPort, ...]
    #: Front-end bond ports and why.
    front: tuple[tuple[RdmaPort, str], ...]


def sort_ports(host: Host, links: RdmaLinks, names: list[str], keep: list[str]) -> Ports:
    """The host's RDMA ports sorted: back-end, unused, front-end; a back-end interface that
    is a front-end bond fails the host before anything changed."""
    front = tuple((port, why) for port in links.ports if (why := front_end_of(host, port)))
    fronts = {port.netdev: why for port, why in front}
    for name in names:
        if name in fronts:
            host.fail(
                f"{name} is listed in roce_net_interfaces, but {fronts[name]}: the front-end "
                "bond is never a back-end port (fix roce_net_interfaces)"
            )
    backend = {name: links.by_netdev(name) for name in names}
    unused = tuple(
        port
        for port in links.ports
        if port.netdev
        and port.netdev not in names
        and port.netdev not in keep
        and port.netdev not in fronts
    )
    return Ports(backend, unused, front)


def report_unused(ctx: OpContext, ports: Ports) -> Result:
    """The unused RDMA ports, and the command that brings each down.

    Example::

        host.call(report_unused, ports)
    """
    front = ", ".join(f"{p.netdev} ({why})" for p, why in ports.front)
    kept = f"; front-end, left alone: {front}" if front else ""
    if not ports.unused:
        return ok(f"no unused RDMA ports{kept}")
    listed = ", ".join(f"{p.netdev} ({p.device}, {p.state})" for p in ports.unused)
    commands = "; ".join(f"ip link set dev {quote(p.netdev or '')} down" for p in ports.unused)
    return ok(
        f"unused RDMA ports (not in roce_net_interfaces): {listed}; AMD advises disabling "
        f"them: set roce_net_unused_ports: down, or run `{commands}`{kept}"
    )


# -- verification ---------------------------------------------------------------------------------


def _gid(ctx: OpContext, device: str, index: int, ip: str) -> tuple[Gid | None, str, bool]:
    """The GID at ``index`` once it holds ``ip`` (the kernel adds it from a work queue), or as
    found after :data:`GID_WAIT_S`; why the table could not be read; whether simulated."""
    deadline = time.monotonic() + GID_WAIT_S
    while True:
        table = ctx.fresh(GidTable, device, 1)
        gid = table.gids.get(index)
        done = gid is not None and gid.kind == "RoCE v2" and gid.ipv4 == ip
        if done or table.missing or time.monotonic() > deadline:
            return gid, table.missing, table.simulated
        time.sleep(0.5)


def verify_gids(
    ctx: OpContext, entries: list[Addressing], devices: dict[str, str], index: int
) -> Result:
    """The GID at ``index`` of each interface's RDMA device is a RoCE v2 one holding the
    interface's address (``ibv_devinfo -v``).

    Example::

        host.call(verify_gids, entries, {"ens6np0": "mlx5_0"}, 3)
    """
    if ctx.check:
        return skipped("check mode: nothing was changed, so there is nothing to verify")
    problems, simulated = [], False
    for entry in entries:
        device = devices[entry.name]
        gid, missing, lab = _gid(ctx, device, index, entry.ip)
        simulated |= lab
        if missing:
            problems.append(f"{device}: {missing}")
        elif gid is None or gid.kind != "RoCE v2" or gid.ipv4 != entry.ip:
            found = f"{gid.address}, {gid.kind}" if gid else "no GID"
            problems.append(
                f"{device} ({entry.name}): wanted GID {index} to be ::ffff:{entry.ip}, RoCE v2 "
                f"(roce_net_gid_index), found {found}"
            )
    if problems:
        return failed("RoCE v2 GID verification failed: " + "; ".join(problems))
    names = ", ".join(f"{devices[e.name]} GID {index} ::ffff:{e.ip}" for e in entries)
    return ok(f"{names}: RoCE v2{' (simulated lab host)' if simulated else ''}")


def in_force(ctx: OpContext, key: str, interface: str) -> int | None:
    """The value of ``net.ipv4.conf.*.key`` the kernel applies on ``interface``: the larger
    of ``all`` and the interface's own (ip-sysctl.rst, for arp_ignore, arp_announce and
    rp_filter)."""
    values = [ctx.fresh(SysctlState, f"net.ipv4.conf.{n}.{key}").value for n in ("all", interface)]
    numbers = [int(x) for x in values if x is not None and x.isdigit()]
    return max(numbers) if numbers else None


def verify_sysctls(ctx: OpContext, names: list[str], wanted: dict[str, int]) -> Result:
    """On each interface, the ARP and reverse-path values in force are the wanted ones.

    Example::

        host.call(verify_sysctls, ["ens6np0"], {"rp_filter": 2})
    """
    if ctx.check:
        return skipped("check mode: nothing was changed, so there is nothing to verify")
    problems = [
        f"{name}: {key} in force is {found} (the larger of conf.all and conf.{name}), wanted {want}"
        for name in names
        for key, want in wanted.items()
        if (found := in_force(ctx, key, name)) != want
    ]
    if problems:
        return failed("ARP and rp_filter verification failed: " + "; ".join(problems))
    return ok(f"{', '.join(f'{k} {x}' for k, x in wanted.items())} in force on {', '.join(names)}")


# -- the role -------------------------------------------------------------------------------------


def render(host: Host, template: str, **context: Any) -> str:
    return environment(str(host.role.templates)).get_template(template).render(**context)


def backend_devices(host: Host, ports: Ports | None, live: list[Addressing]) -> dict[str, str]:
    """Back-end interface -> its RDMA device, for those `rdma link` shows one; the others are
    skipped (lab host) or fail the host, with the reason."""
    devices = {}
    for entry in live:
        port = ports.backend.get(entry.name) if ports else None
        reason = f"rdma link shows no RDMA device on {entry.name}"
        if ports and host.needs(port is not None, f"verify the GID of {entry.name}", reason):
            devices[entry.name] = port.device if port else ""
    return devices


def apply(host: Host, v: Vars) -> None:
    entries = addressing(v)
    wanted = {
        "arp_ignore": v.roce_net_arp_ignore,
        "arp_announce": v.roce_net_arp_announce,
        "rp_filter": v.roce_net_rp_filter,
    }
    # What this host lacks, before anything changes: a host that is not a lab host stops here.
    links = host.fact(RdmaLink)
    ports = None
    if host.needs(not links.missing, "RDMA ports", links.missing):
        ports = sort_ports(host, links, [e.name for e in entries], v.roce_net_keep)
    live = [
        entry
        for entry in entries
        if host.needs(
            not (iface := host.fact(IpAddr, entry.name)).missing,
            f"addressing of {entry.name}",
            iface.missing,
        )
    ]
    devices = backend_devices(host, ports, live)
    tool = host.fact(GidTable, next(iter(devices.values())), 1).missing if devices else ""
    gids = host.needs("ibv_devinfo not found" not in tool, "verify RoCE v2 GIDs", tool)
    why = [
        info.reason
        for key in wanted
        if (info := host.fact(SysctlState, f"net.ipv4.conf.all.{key}")).reason
    ]
    sysctls = host.needs(not why, "verify ARP and rp_filter in force", why[0] if why else "")
    unused = list(ports.unused) if ports else []
    downs = [down(p.netdev or "") for p in unused] if v.roce_net_unused_ports == "down" else []

    for key, value in wanted.items():
        host.sysctl(f"net.ipv4.conf.all.{key}", value, file=v.roce_net_sysctl_file)
    # Persistence: the same commands in a boot script, run by a oneshot unit.
    script = v.roce_net_script
    plans = {e.name: plan(e) for e in entries}
    text = render(host, "fxkit-roce-net.sh.j2", entries=entries, plans=plans, down=downs, q=quote)
    host.directory(posixpath.dirname(script), mode="0755")
    host.task(f"template {script}").file(script, text, mode="0755")
    units = [device_unit(e.name) for e in entries]
    unit = render(host, "fxkit-roce-net.service.j2", script=script, devices=units)
    host.unit(v.roce_net_unit, unit)
    host.service(v.roce_net_unit, enabled=True)

    for setting in [s for e in live for s in plans[e.name]] + downs:
        host.task(setting.what).call(converge, setting)
    if ports and not downs:
        host.task("unused RDMA ports").call(report_unused, ports)
    checked = [e for e in live if e.name in devices]
    if checked and gids:
        index = v.roce_net_gid_index
        host.task("verify RoCE v2 GIDs").call(verify_gids, checked, devices, index)
    if live and sysctls:
        names = [e.name for e in live]
        host.task("verify ARP and rp_filter in force").call(verify_sysctls, names, wanted)
