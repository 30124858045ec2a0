"""The GID table of an RDMA port with its values, as ``ibv_devinfo -v -d DEV -i PORT`` prints
it (rdma-core libibverbs/examples/devinfo.c, ``print_formated_gid``, at 691953d8)::

    GID[  2]:		0000:0000:0000:0000:0000:ffff:1b69:b303, RoCE v1
    GID[  3]:		::ffff:27.105.179.3, RoCE v2

RoCE v1 GIDs are printed as 8 groups of hex digits, RoCE v2 ones with ``inet_ntop`` (an IPv4
address as ``::ffff:a.b.c.d``); empty entries are not printed. The kernel fills the table from
the port's netdev: a default GID (fe80::/64 from the MAC) and one GID of each type per IP
address on the interface (drivers/infiniband/core/roce_gid_mgmt.c), so without an address the
IPv4 RoCE v2 GID does not exist.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field
from shlex import quote

from fxkit.connection.base import RunResult
from fxkit.facts.base import Fact, FactError
from fxkit.facts.rdma import tool_output, with_tool

_GID = re.compile(r"\s*GID\[\s*(\d+)\]:\s+(\S+?)(?:,\s*(.+?))?\s*")


@dataclass(frozen=True)
class Gid:
    index: int
    #: The GID as an IPv6 address (``::ffff:192.168.1.201``, ``fe80::...``).
    address: str
    #: ``RoCE v1``, ``RoCE v2`` ("" on an InfiniBand port).
    kind: str

    @property
    def ipv4(self) -> str:
        """The IPv4 address an IPv4-mapped GID carries ("" for any other GID)."""
        mapped = ipaddress.IPv6Address(self.address).ipv4_mapped
        return str(mapped) if mapped else ""


@dataclass(frozen=True)
class GidTableInfo:
    device: str
    gids: dict[int, Gid] = field(default_factory=dict)
    missing: str = ""
    simulated: bool = False


def parse_gids(text: str, where: str) -> dict[int, Gid]:
    """The ``GID[...]`` lines of ``ibv_devinfo -v`` output; other lines are skipped."""
    gids = {}
    for line in text.splitlines():
        match = _GID.fullmatch(line)
        if not match:
            continue
        index, raw, kind = match.groups()
        try:
            address = str(ipaddress.IPv6Address(raw))
        except ValueError:
            raise FactError(
                f"ibv_devinfo -v of {where}: GID {index} is not a GID: {raw!r}"
            ) from None
        gids[int(index)] = Gid(int(index), address, kind or "")
    return gids


class GidTable(Fact[GidTableInfo]):
    """``ibv_devinfo -v -d DEV -i PORT``: the GIDs of one port, with their values and types."""

    def command(self, device: str, port: int = 1) -> str:
        return with_tool("ibv_devinfo", f"ibv_devinfo -v -d {quote(device)} -i {int(port)}")

    def parse(self, result: RunResult, device: str, port: int = 1) -> GidTableInfo:
        simulated, out = tool_output(f"GID table of {device}/{port}", result)
        if out is None:
            missing = "ibv_devinfo not found (install ibverbs-utils)"
            return GidTableInfo(device, missing=missing, simulated=simulated)
        if not result.ok:
            if "wasn't found" in result.stderr or "No IB devices" in out + result.stderr:
                missing = f"no RDMA device {device} (ibv_devinfo)"
                return GidTableInfo(device, missing=missing, simulated=simulated)
            raise FactError.from_result(f"ibv_devinfo -v -d {device}", result)
        return GidTableInfo(device, parse_gids(out, f"{device}/{port}"), simulated=simulated)
