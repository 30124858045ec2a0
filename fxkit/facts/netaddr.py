"""IP addressing facts, as iproute2 prints them with ``-j`` (JSON): an interface's link state
and addresses (``ip -j addr show dev IF``), the routes of a table (``ip -j route show table
N``) and the policy rules (``ip -j rule show``); and whether an interface is a bond.

The JSON keys are iproute2's own (ip/ipaddress.c ``print_linkinfo``/``print_addrinfo``,
ip/iproute.c ``print_route``, ip/iprule.c ``print_rule``): ``ifname``, ``flags``,
``operstate``, ``addr_info[].family/local/prefixlen``; ``dst``, ``gateway``, ``dev``;
``priority``, ``src``, ``srclen``, ``table``. A device that does not exist is a value with
``missing`` set, never an exception.
"""

from __future__ import annotations

import ipaddress
import json
from dataclasses import dataclass
from shlex import quote
from typing import Any

from fxkit.connection.base import RunResult
from fxkit.facts.base import Fact, FactError
from fxkit.facts.rdma import in_folder, tool_output, with_tool


def _json_list(fact: str, out: str) -> list[dict[str, Any]]:
    try:
        data = json.loads(out or "[]")
    except ValueError as exc:
        raise FactError(f"{fact}: not JSON ({exc}): {out.strip()[:120]!r}") from None
    if not isinstance(data, list) or not all(isinstance(d, dict) for d in data):
        raise FactError(f"{fact}: not a JSON list of objects: {out.strip()[:120]!r}")
    return data


@dataclass(frozen=True)
class LinkAddresses:
    """One interface: whether it is administratively up and its addresses (``a.b.c.d/nn``)."""

    name: str
    missing: str = ""
    up: bool = False
    operstate: str = ""
    #: IPv4 addresses with their prefix length, as ``ip addr`` shows them.
    ipv4: tuple[str, ...] = ()
    #: IPv6 addresses of global scope (link-local ones left out).
    ipv6: tuple[str, ...] = ()


class IpAddr(Fact[LinkAddresses]):
    """``ip -j addr show dev IF``."""

    def command(self, name: str) -> str:
        return with_tool("ip", f"ip -j addr show dev {quote(name)}")

    def parse(self, result: RunResult, name: str) -> LinkAddresses:
        _, out = tool_output(f"ip addr of {name}", result)
        if out is None:
            return LinkAddresses(name, "ip not found (install iproute2)")
        if not result.ok:
            if "does not exist" in result.stderr:
                return LinkAddresses(name, f"no network interface {name} (ip addr)")
            raise FactError.from_result(f"ip addr of {name}", result)
        links = _json_list(f"ip -j addr show dev {name}", out)
        if len(links) != 1:
            raise FactError(f"ip -j addr show dev {name}: {len(links)} interfaces, wanted 1")
        link = links[0]
        info = [a for a in link.get("addr_info", []) if isinstance(a, dict)]
        try:
            v4 = tuple(f"{a['local']}/{a['prefixlen']}" for a in info if a.get("family") == "inet")
            v6 = tuple(
                f"{a['local']}/{a['prefixlen']}"
                for a in info
                if a.get("family") == "inet6" and a.get("scope") == "global"
            )
        except KeyError as exc:
            raise FactError(f"ip -j addr show dev {name}: an address lacks {exc}") from None
        return LinkAddresses(
            name,
            up="UP" in link.get("flags", []),
            operstate=str(link.get("operstate", "")),
            ipv4=v4,
            ipv6=v6,
        )


@dataclass(frozen=True)
class Route:
    dst: str
    gateway: str = ""
    dev: str = ""


class IpRoutes(Fact[tuple[Route, ...]]):
    """``ip -j route show table N``: the table's routes (none when the table is empty)."""

    def command(self, table: int) -> str:
        return with_tool("ip", f"ip -j route show table {int(table)}")

    def parse(self, result: RunResult, table: int) -> tuple[Route, ...]:
        _, out = tool_output(f"routes of table {table}", result)
        if out is None:
            raise FactError("ip not found (install iproute2)")
        if not result.ok:
            if "table does not exist" in result.stderr:  # no route was ever added to it
                return ()
            raise FactError.from_result(f"ip route show table {table}", result)
        rows = _json_list(f"ip -j route show table {table}", out)
        return tuple(
            Route(str(r.get("dst", "")), str(r.get("gateway", "")), str(r.get("dev", "")))
            for r in rows
        )


@dataclass(frozen=True)
class Rule:
    priority: int
    #: ``all``, or an address (with ``/len`` when ``srclen`` is not the full length).
    src: str
    table: str


class IpRules(Fact[tuple[Rule, ...]]):
    """``ip -j rule show`` (IPv4 rules)."""

    cmd = with_tool("ip", "ip -j rule show")

    def parse(self, result: RunResult, *args: object) -> tuple[Rule, ...]:
        _, out = tool_output("ip rules", result)
        if out is None:
            raise FactError("ip not found (install iproute2)")
        if not result.ok:
            raise FactError.from_result("ip rule show", result)
        rules = []
        for row in _json_list("ip -j rule show", out):
            src = str(row.get("src", "all"))
            if "srclen" in row:
                src = f"{src}/{row['srclen']}"
            rules.append(Rule(int(row.get("priority", 0)), src, str(row.get("table", ""))))
        return tuple(rules)


def rule_source(address: str) -> str:
    """How ``ip -j rule show`` writes ``from ADDRESS`` (a host address without its length)."""
    return str(ipaddress.ip_interface(address).ip)


@dataclass(frozen=True)
class BondInfo:
    name: str
    #: The interface is a bond (``/sys/class/net/IF/bonding`` exists).
    bond: bool = False
    #: The bond this interface is a port of ("" when none).
    master: str = ""


class Bond(Fact[BondInfo]):
    """Whether ``/sys/class/net/IF`` is a bond (drivers/net/bonding: its ``bonding`` folder)
    or a port of one (its ``master`` link)."""

    def command(self, name: str) -> str:
        return in_folder(
            f"/sys/class/net/{name}",
            "[ -d bonding ] && echo bond=1; m=$(readlink master 2>/dev/null); echo master=${m##*/}",
        )

    def parse(self, result: RunResult, name: str) -> BondInfo:
        _, out = tool_output(f"bond state of {name}", result)
        if out is None:
            return BondInfo(name)
        fields = dict(line.partition("=")[::2] for line in out.splitlines() if "=" in line)
        return BondInfo(name, fields.get("bond") == "1", fields.get("master", ""))


def front_end(device: str, bond: BondInfo | None) -> str:
    """Why the RDMA port of ``device`` (its netdev's :class:`BondInfo`) is a front-end bond, ""
    when it is not: mlx5 names the RDMA device of a LAG ``mlx5_bond_N``
    (drivers/infiniband/hw/mlx5/main.c), a bond's netdev has a ``bonding`` folder and its ports
    a ``master`` link (drivers/net/bonding)."""
    if device.startswith("mlx5_bond_"):
        return f"{device} is a LAG (bond) RDMA device"
    if bond and bond.bond:
        return f"{bond.name} is a bond"
    if bond and bond.master:
        return f"{bond.name} is a port of bond {bond.master}"
    return ""
