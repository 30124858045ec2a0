"""RDMA facts: ports and their netdevs (``rdma link``), HCA ports (``ibv_devinfo``), GID types,
network interfaces (MTU, driver), the NIC's QoS (``mlnx_qos``, ``dcb pfc``, ``dcb ets`` and
``dcb app``, ``ethtool -a``, bnxt_re congestion control) and the loaded kernel modules.

Every command first prints the lab marker (:func:`fxkit.facts.lab.marked`), so each value says
whether it came from a simulated lab host's stand-in tools (``simulated``). An absent tool,
device or interface is a value with ``missing`` set to the reason, never an exception: roles
gate their steps on it with ``host.needs()``. Output that cannot be read is a
:class:`~fxkit.facts.base.FactError` naming the command.

Which driver a NIC uses: the interface's ``/sys/class/net/IF/device/driver`` link (``mlx5_core``
for ConnectX, ``bnxt_en`` for Broadcom Thor2), read by :class:`NetInterface`. RDMA device names
follow the driver by default (``mlx5_0``, ``bnxt_re0``) but udev may rename them
(``rocep1s0f0``), so the name is only the fallback where the link is absent (see
:func:`driver_family`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from shlex import quote
from typing import Any

from fxkit.connection.base import RunResult
from fxkit.facts.base import Fact, FactError
from fxkit.facts.lab import marked, split_marked

#: Printed instead of the tool's output when the tool (or folder) is not there.
NOT_FOUND = "--- fxkit: not found ---"


_ABSENT = f"{{ echo {quote(NOT_FOUND)}; exit 0; }}"


def with_tool(tool: str, command: str) -> str:
    """``command`` after the lab marker (:func:`~fxkit.facts.lab.marked`); where ``tool`` is not
    installed, :data:`NOT_FOUND` instead."""
    return marked(f"command -v {quote(tool)} >/dev/null 2>&1 || {_ABSENT}; {command}")


def in_folder(folder: str, command: str) -> str:
    """``command`` run in ``folder``, after the lab marker; where there is no such folder,
    :data:`NOT_FOUND` instead."""
    return marked(f"cd {quote(folder)} 2>/dev/null || {_ABSENT}; {command}")


def tool_output(fact: str, result: RunResult) -> tuple[bool, str | None]:
    """(simulated, the tool's output or None when the tool or folder is not there)."""
    lab, out = split_marked(result, fact)
    return lab.simulated, None if out.strip() == NOT_FOUND else out


# -- rdma link ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class RdmaPort:
    """One port of an RDMA device as ``rdma link`` shows it."""

    device: str
    port: int
    state: str
    physical_state: str
    #: The network interface under a RoCE port (None for InfiniBand, or not shown).
    netdev: str | None = None

    @property
    def name(self) -> str:
        return f"{self.device}/{self.port}"


@dataclass(frozen=True)
class RdmaLinks:
    ports: tuple[RdmaPort, ...] = ()
    #: Why there are no ports to look at (no ``rdma`` tool, no RDMA netlink); "" when read.
    missing: str = ""
    simulated: bool = False

    def by_netdev(self, netdev: str) -> RdmaPort | None:
        return next((p for p in self.ports if p.netdev == netdev), None)

    def by_device(self, device: str, port: int = 1) -> RdmaPort | None:
        return next((p for p in self.ports if (p.device, p.port) == (device, port)), None)


_TEXT_LINK = re.compile(r"link (?P<device>[^/\s]+)/(?P<port>\d+)\s+(?P<rest>.*)")
_FIELDS = ("state", "physical_state", "netdev")


def parse_rdma_link_text(text: str) -> tuple[RdmaPort, ...]:
    """``rdma link``: ``link mlx5_0/1 state ACTIVE physical_state LINK_UP netdev ens6np0``."""
    ports = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        match = _TEXT_LINK.fullmatch(line.strip())
        words = match.group("rest").split() if match else []
        if not match or len(words) % 2:
            raise FactError(
                f"rdma link: line {number} is not `link DEV/PORT key value...`: {line!r}"
            )
        fields = dict(zip(words[::2], words[1::2], strict=True))
        if "state" not in fields or "physical_state" not in fields:
            raise FactError(f"rdma link: line {number} has no state/physical_state: {line!r}")
        ports.append(
            RdmaPort(
                match.group("device"),
                int(match.group("port")),
                fields["state"],
                fields["physical_state"],
                fields.get("netdev"),
            )
        )
    return tuple(ports)


def parse_rdma_link_json(text: str) -> tuple[RdmaPort, ...]:
    """``rdma -j link``: a list of ``{ifindex, ifname, port, state, physical_state, netdev,
    netdev_index}`` (iproute2 rdma/link.c); before iproute2 5.5 ``ifname`` was ``mlx5_0/1``."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise FactError(f"rdma -j link did not print JSON ({exc}): {text.strip()[:80]!r}") from None
    if not isinstance(data, list):
        raise FactError(f"rdma -j link: wanted a list of ports, got {type(data).__name__}")
    return tuple(_json_port(entry, i) for i, entry in enumerate(data))


def _json_port(entry: Any, index: int) -> RdmaPort:
    try:
        device, _, port = str(entry["ifname"]).partition("/")
        netdev = entry.get("netdev")
        return RdmaPort(
            device,
            int(entry.get("port", port)),
            str(entry["state"]),
            str(entry["physical_state"]),
            None if netdev is None else str(netdev),
        )
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise FactError(
            f"rdma -j link: entry {index} lacks ifname/port/state/physical_state ({exc!r}): "
            f"{json.dumps(entry)[:120]}"
        ) from None


class RdmaLink(Fact[RdmaLinks]):
    """``rdma -j link`` (iproute2); the text form is read too, should a tool print it."""

    cmd = with_tool("rdma", "rdma -j link")

    def parse(self, result: RunResult, *args: object) -> RdmaLinks:
        simulated, out = tool_output("rdma link", result)
        if out is None:
            return RdmaLinks(missing="rdma not found (install iproute2)", simulated=simulated)
        if not result.ok:
            if "NETLINK_RDMA" in result.stderr:
                reason = "the kernel has no RDMA support here (rdma: no NETLINK_RDMA socket)"
                return RdmaLinks(missing=reason, simulated=simulated)
            raise FactError.from_result("rdma link", result)
        if not out.strip():
            raise FactError("rdma -j link printed nothing", hint="a JSON list was expected")
        text = out.strip()
        ports = parse_rdma_link_json(text) if text[0] in "[{" else parse_rdma_link_text(text)
        missing = "" if ports else "no RDMA devices (rdma link lists none)"
        return RdmaLinks(ports, missing, simulated)


# -- ibv_devinfo --------------------------------------------------------------------------------


@dataclass(frozen=True)
class IbvPort:
    port: int
    state: str
    max_mtu: int
    active_mtu: int
    link_layer: str


@dataclass(frozen=True)
class IbvDevice:
    hca_id: str
    transport: str
    fw_ver: str
    vendor_id: str
    vendor_part_id: str
    ports: tuple[IbvPort, ...]

    def port(self, number: int = 1) -> IbvPort | None:
        return next((p for p in self.ports if p.port == number), None)


@dataclass(frozen=True)
class IbvDevices:
    devices: tuple[IbvDevice, ...] = ()
    missing: str = ""
    simulated: bool = False

    def get(self, hca_id: str) -> IbvDevice | None:
        return next((d for d in self.devices if d.hca_id == hca_id), None)


_KEY_VALUE = re.compile(r"\s*([A-Za-z_]+):\s*(.*?)\s*")
#: ``PORT_ACTIVE (4)`` -> ``PORT_ACTIVE``; ``4096 (5)`` -> ``4096``.
_CODE = re.compile(r"(\S+)(?:\s+\(\d+\))?")
_DEVICE_KEYS = ("transport", "fw_ver", "vendor_id", "vendor_part_id")
_PORT_KEYS = ("state", "max_mtu", "active_mtu", "link_layer")


def parse_ibv_devinfo(text: str) -> tuple[IbvDevice, ...]:
    """``ibv_devinfo``: ``hca_id:`` blocks of ``key: value`` lines, each ``port: N`` opening the
    port's own lines (state ``PORT_ACTIVE (4)``, ``active_mtu: 4096 (5)``, ``link_layer``)."""
    blocks: list[tuple[str, dict[str, str], list[dict[str, str]]]] = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        match = _KEY_VALUE.fullmatch(line)
        if not match:
            raise FactError(f"ibv_devinfo: line {number} is not `key: value`: {line!r}")
        key, value = match.groups()
        if key == "hca_id":
            blocks.append((value, {}, []))
        elif not blocks:
            raise FactError(f"ibv_devinfo: line {number} comes before any hca_id: {line!r}")
        elif key == "port":
            blocks[-1][2].append({"port": value})
        elif blocks[-1][2]:
            blocks[-1][2][-1][key] = value
        else:
            blocks[-1][1][key] = value
    if not blocks:
        raise FactError(f"ibv_devinfo printed no hca_id: {text.strip()[:80]!r}")
    return tuple(_ibv_device(*block) for block in blocks)


def _ibv_device(hca_id: str, fields: dict[str, str], ports: list[dict[str, str]]) -> IbvDevice:
    lacking = [k for k in _DEVICE_KEYS if k not in fields] or [
        f"port {p.get('port')} {k}" for p in ports for k in _PORT_KEYS if k not in p
    ]
    if lacking or not ports:
        raise FactError(f"ibv_devinfo: {hca_id} lacks {', '.join(lacking) or 'ports'}")
    try:
        parsed = tuple(
            IbvPort(
                int(p["port"]),
                _code(p["state"]),
                int(_code(p["max_mtu"])),
                int(_code(p["active_mtu"])),
                p["link_layer"],
            )
            for p in ports
        )
    except ValueError as exc:
        raise FactError(
            f"ibv_devinfo: {hca_id}: a port number or MTU is not a number ({exc})"
        ) from None
    transport, fw_ver, vendor_id, vendor_part_id = (fields[k] for k in _DEVICE_KEYS)
    return IbvDevice(hca_id, transport, fw_ver, vendor_id, vendor_part_id, parsed)


def _code(value: str) -> str:
    match = _CODE.fullmatch(value)
    return match.group(1) if match else value


class IbvDevinfo(Fact[IbvDevices]):
    """``ibv_devinfo`` (rdma-core's ibverbs-utils): HCAs, their ports, link layer and MTUs."""

    cmd = with_tool("ibv_devinfo", "ibv_devinfo")

    def parse(self, result: RunResult, *args: object) -> IbvDevices:
        simulated, out = tool_output("ibv_devinfo", result)
        if out is None:
            return IbvDevices(
                missing="ibv_devinfo not found (install ibverbs-utils)", simulated=simulated
            )
        if "No IB devices found" in out + result.stderr:
            return IbvDevices(
                missing="no RDMA devices (ibv_devinfo: No IB devices found)", simulated=simulated
            )
        if not result.ok:
            raise FactError.from_result("ibv_devinfo", result)
        return IbvDevices(parse_ibv_devinfo(out), simulated=simulated)


# -- sysfs: GID types, network interfaces --------------------------------------------------------


@dataclass(frozen=True)
class GidTypesInfo:
    #: GID index -> type (``RoCE v2``, ``IB/RoCE v1``), for the indexes that hold a GID.
    types: dict[int, str]
    missing: str = ""
    simulated: bool = False

    def roce_v2(self) -> tuple[int, ...]:
        return tuple(i for i, t in sorted(self.types.items()) if t == "RoCE v2")


class GidTypes(Fact[GidTypesInfo]):
    """``/sys/class/infiniband/DEV/ports/N/gid_attrs/types/IDX`` of one port. An index without
    a GID cannot be read (EINVAL) and is left out."""

    def command(self, device: str, port: int = 1) -> str:
        return in_folder(
            f"/sys/class/infiniband/{device}/ports/{port}/gid_attrs/types",
            'for f in *; do t=$(cat -- "$f" 2>/dev/null) && printf \'%s\\t%s\\n\' "$f" "$t"; '
            "done; true",
        )

    def parse(self, result: RunResult, device: str, port: int = 1) -> GidTypesInfo:
        simulated, out = tool_output(f"GID types of {device}/{port}", result)
        if out is None:
            where = f"/sys/class/infiniband/{device}/ports/{port}/gid_attrs/types"
            return GidTypesInfo({}, f"no GID table ({where} does not exist)", simulated)
        return GidTypesInfo(parse_gid_types(out, f"{device}/{port}"), simulated=simulated)


def parse_gid_types(text: str, where: str) -> dict[int, str]:
    """``IDX<TAB>TYPE`` lines."""
    types = {}
    for line in text.splitlines():
        index, tab, kind = line.partition("\t")
        if not line:
            continue
        if not tab or not index.isdigit() or not kind.strip():
            raise FactError(f"GID types of {where}: not `index<TAB>type`: {line!r}")
        types[int(index)] = kind.strip()
    return types


@dataclass(frozen=True)
class NetInterfaceInfo:
    name: str
    missing: str = ""
    mtu: int = 0
    operstate: str = ""
    #: The kernel driver of the device under the interface (``mlx5_core``, ``bnxt_en``); ""
    #: for a virtual interface (veth, bond).
    driver: str = ""
    simulated: bool = False


class NetInterface(Fact[NetInterfaceInfo]):
    """``/sys/class/net/IF``: ``mtu``, ``operstate`` and the ``device/driver`` link."""

    def command(self, name: str) -> str:
        return in_folder(
            f"/sys/class/net/{name}",
            "echo mtu=$(cat mtu); echo operstate=$(cat operstate); "
            "d=$(readlink device/driver 2>/dev/null); echo driver=${d##*/}",
        )

    def parse(self, result: RunResult, name: str) -> NetInterfaceInfo:
        simulated, out = tool_output(f"interface {name}", result)
        if out is None:
            missing = f"no network interface {name} (/sys/class/net/{name} does not exist)"
            return NetInterfaceInfo(name, missing, simulated=simulated)
        fields = dict(line.partition("=")[::2] for line in out.splitlines() if "=" in line)
        if not result.ok or not fields.get("mtu", "").isdigit():
            raise FactError.from_result(f"interface {name}", result)
        return NetInterfaceInfo(
            name,
            "",
            int(fields["mtu"]),
            fields.get("operstate", ""),
            fields.get("driver", ""),
            simulated,
        )


def driver_family(driver: str, device: str) -> str:
    """``connectx``, ``thor2`` or "" (unknown): by the interface's kernel driver, else by the
    RDMA device's name (the kernel names devices after their driver unless udev renames them)."""
    if driver == "mlx5_core" or (not driver and device.startswith("mlx5_")):
        return "connectx"
    if driver == "bnxt_en" or (not driver and device.startswith("bnxt_re")):
        return "thor2"
    return ""


# -- QoS state: mlnx_qos, dcb (pfc, ets, app), ethtool pause, bnxt_re congestion control --------


@dataclass(frozen=True)
class QosInfo:
    interface: str
    missing: str = ""
    #: ``Priority trust state``: ``pcp`` or ``dscp``.
    trust: str = ""
    #: PFC enabled per priority 0..7 (0/1).
    pfc: tuple[int, ...] = ()
    simulated: bool = False
    #: DSCP -> priority as ``mlnx_qos`` lists it (``dscp2prio mapping``, shown with DSCP trust).
    dscp2prio: dict[int, int] | None = None


_TRUST = re.compile(r"Priority trust state:\s*(\S+)")
_PFC = re.compile(r"^\s*enabled((?:\s+[01]){8})\s*$", re.M)
_DSCP2PRIO = re.compile(r"^\s*prio:([0-7]) dscp:((?:\d\d,)+)\s*$", re.M)


def parse_mlnx_qos(text: str, interface: str) -> QosInfo:
    """``mlnx_qos -i IF``: ``Priority trust state: dscp``, the ``dscp2prio mapping`` lines
    (``prio:3 dscp:31,30,...,``; a priority with more than 8 DSCPs takes more lines) and the
    ``PFC configuration`` table (``enabled 0 0 0 1 0 0 0 0``)."""
    trust = _TRUST.search(text)
    pfc = _PFC.findall(text)
    if not trust or len(pfc) != 1:
        raise FactError(
            f"mlnx_qos -i {interface}: no {'trust state' if not trust else 'single PFC table'} "
            f"in its output: {text.strip()[:120]!r}"
        )
    mapping = {
        int(dscp): int(prio)
        for prio, dscps in _DSCP2PRIO.findall(text)
        for dscp in dscps.rstrip(",").split(",")
    }
    return QosInfo(
        interface,
        trust=trust.group(1),
        pfc=tuple(int(x) for x in pfc[0].split()),
        dscp2prio=mapping if "dscp2prio mapping:" in text else None,
    )


class MlnxQos(Fact[QosInfo]):
    """``mlnx_qos -i IF`` (NVIDIA's MLNX_OFED/DOCA tool): trust state, DSCP-to-priority map and
    PFC of a ConnectX port."""

    def command(self, interface: str) -> str:
        return with_tool("mlnx_qos", f"mlnx_qos -i {quote(interface)}")

    def parse(self, result: RunResult, interface: str) -> QosInfo:
        simulated, out = tool_output(f"mlnx_qos -i {interface}", result)
        if out is None:
            return QosInfo(
                interface,
                "mlnx_qos not found (install MLNX_OFED or DOCA-OFED)",
                simulated=simulated,
            )
        if not result.ok:
            raise FactError.from_result(f"mlnx_qos -i {interface}", result)
        found = parse_mlnx_qos(out, interface)
        return QosInfo(
            interface,
            trust=found.trust,
            pfc=found.pfc,
            simulated=simulated,
            dscp2prio=found.dscp2prio,
        )


def _dcb_json(text: str, what: str) -> dict[str, Any]:
    """The JSON object ``dcb -j WHAT`` printed ({} for nothing)."""
    try:
        data = json.loads(text) if text.strip() else {}
        if not isinstance(data, dict):
            raise ValueError("not an object")
    except ValueError as exc:
        raise FactError(
            f"dcb -j {what}: not the JSON dcb prints ({exc!r}): {text.strip()[:80]!r}"
        ) from None
    return data


def parse_dcb_pfc(text: str, interface: str) -> tuple[int, ...]:
    """``dcb -j pfc show dev IF``: ``{"pfc_cap": 8, ..., "prio_pfc": [false, ..., true, ...]}``
    (iproute2 dcb/dcb_pfc.c)."""
    prio = _dcb_json(text, f"pfc show dev {interface}").get("prio_pfc")
    if not isinstance(prio, list) or len(prio) != 8 or not all(isinstance(x, bool) for x in prio):
        raise FactError(
            f"dcb -j pfc show dev {interface}: not the JSON dcb prints (prio_pfc is not 8 "
            f"booleans): {text.strip()[:80]!r}"
        )
    return tuple(int(x) for x in prio)


def _no_dcb(result: RunResult, interface: str, what: str) -> str:
    """Why ``dcb WHAT show dev IF`` has no answer (the NIC has no DCB); "" when it succeeded."""
    if result.ok:
        return ""
    if "Operation not supported" in result.stderr:
        return f"{interface} has no DCB support (dcb: Operation not supported)"
    raise FactError.from_result(f"dcb {what} show dev {interface}", result)


class DcbPfc(Fact[QosInfo]):
    """``dcb -j pfc show dev IF`` (iproute2): PFC per priority, for NICs without mlnx_qos."""

    def command(self, interface: str) -> str:
        return with_tool("dcb", f"dcb -j pfc show dev {quote(interface)}")

    def parse(self, result: RunResult, interface: str) -> QosInfo:
        simulated, out = tool_output(f"dcb pfc show dev {interface}", result)
        if out is None:
            return QosInfo(interface, "dcb not found (install iproute2)", simulated=simulated)
        missing = _no_dcb(result, interface, "pfc")
        if missing:
            return QosInfo(interface, missing, simulated=simulated)
        return QosInfo(interface, pfc=parse_dcb_pfc(out, interface), simulated=simulated)


@dataclass(frozen=True)
class EtsInfo:
    interface: str
    missing: str = ""
    #: Per traffic class 0..7: its scheduler (``strict``, ``ets``...) and bandwidth share (%).
    tc_tsa: tuple[str, ...] = ()
    tc_bw: tuple[int, ...] = ()
    #: Per priority 0..7: its traffic class.
    prio_tc: tuple[int, ...] = ()
    simulated: bool = False


def parse_dcb_ets(text: str, interface: str) -> EtsInfo:
    """``dcb -j ets show dev IF``: ``{"willing": false, "ets_cap": 8, "cbs": false, "tc_bw":
    [8 numbers], "pg_bw": [...], "tc_tsa": ["strict", "ets", ...], "prio_tc": [8 numbers],
    "reco_...": ...}`` (iproute2 dcb/dcb_ets.c, dcb_ets_print)."""
    data = _dcb_json(text, f"ets show dev {interface}")
    lists = {key: data.get(key) for key in ("tc_tsa", "tc_bw", "prio_tc")}
    for key, value in lists.items():
        kind = str if key == "tc_tsa" else int
        if (
            not isinstance(value, list)
            or len(value) != 8
            or not all(isinstance(x, kind) and not isinstance(x, bool) for x in value)
        ):
            raise FactError(
                f"dcb -j ets show dev {interface}: not the JSON dcb prints ({key} is not 8 "
                f"{kind.__name__}s): {text.strip()[:80]!r}"
            )
    return EtsInfo(
        interface,
        tc_tsa=tuple(lists["tc_tsa"] or ()),
        tc_bw=tuple(lists["tc_bw"] or ()),
        prio_tc=tuple(lists["prio_tc"] or ()),
    )


class DcbEts(Fact[EtsInfo]):
    """``dcb -j ets show dev IF`` (iproute2): the NIC's ETS (enhanced transmission selection)."""

    def command(self, interface: str) -> str:
        return with_tool("dcb", f"dcb -j ets show dev {quote(interface)}")

    def parse(self, result: RunResult, interface: str) -> EtsInfo:
        simulated, out = tool_output(f"dcb ets show dev {interface}", result)
        if out is None:
            return EtsInfo(interface, "dcb not found (install iproute2)", simulated=simulated)
        missing = _no_dcb(result, interface, "ets")
        if missing:
            return EtsInfo(interface, missing, simulated=simulated)
        found = parse_dcb_ets(out, interface)
        return EtsInfo(interface, "", found.tc_tsa, found.tc_bw, found.prio_tc, simulated)


@dataclass(frozen=True)
class DcbAppInfo:
    interface: str
    missing: str = ""
    #: The NIC's DCB application table, by selector (``dscp_prio``, ``dgram_port_prio``):
    #: protocol (a DSCP, a UDP port) -> priority.
    tables: dict[str, dict[int, int]] | None = None
    simulated: bool = False

    def table(self, selector: str) -> dict[int, int]:
        return (self.tables or {}).get(selector, {})


#: The selectors of ``dcb app`` the role reads, as dcb's JSON names them.
DCB_APP_SELECTORS = ("dscp_prio", "dgram_port_prio")


def parse_dcb_app(text: str, interface: str) -> dict[str, dict[int, int]]:
    """``dcb -j app show dev IF``: ``{"dscp_prio": [[26, 3, " "], ...], "dgram_port_prio":
    [[4791, 3, " "]], ...}`` (iproute2 dcb/dcb_app.c prints each entry as an array: the
    protocol, the priority, a separator); a selector without entries is left out."""
    data = _dcb_json(text, f"app show dev {interface}")
    tables = {}
    for selector in DCB_APP_SELECTORS:
        try:
            mapping = {}
            for entry in data.get(selector, []):
                protocol, prio = (
                    x for x in entry if isinstance(x, int) and not isinstance(x, bool)
                )
                mapping[protocol] = prio
        except (ValueError, TypeError) as exc:
            raise FactError(
                f"dcb -j app show dev {interface}: not the JSON dcb prints ({selector}: "
                f"{exc!r}): {text.strip()[:80]!r}"
            ) from None
        tables[selector] = mapping
    return tables


class DcbApp(Fact[DcbAppInfo]):
    """``dcb -j app show dev IF`` (iproute2): the priorities of DSCPs and UDP ports."""

    def command(self, interface: str) -> str:
        return with_tool("dcb", f"dcb -j app show dev {quote(interface)}")

    def parse(self, result: RunResult, interface: str) -> DcbAppInfo:
        simulated, out = tool_output(f"dcb app show dev {interface}", result)
        if out is None:
            return DcbAppInfo(interface, "dcb not found (install iproute2)", simulated=simulated)
        missing = _no_dcb(result, interface, "app")
        if missing:
            return DcbAppInfo(interface, missing, simulated=simulated)
        return DcbAppInfo(interface, tables=parse_dcb_app(out, interface), simulated=simulated)


@dataclass(frozen=True)
class PauseInfo:
    interface: str
    missing: str = ""
    #: ``on``/``off`` as ethtool prints them.
    autoneg: str = ""
    rx: str = ""
    tx: str = ""
    simulated: bool = False


_PAUSE = re.compile(r"^(Autonegotiate|RX|TX):\s+(on|off)\s*$", re.M)


def parse_ethtool_pause(text: str, interface: str) -> PauseInfo:
    """``ethtool -a IF``: ``Pause parameters for IF:`` then ``Autonegotiate:\\ton``,
    ``RX:\\t\\toff``, ``TX:\\t\\toff`` (ethtool netlink/pause.c; the ioctl path of ethtool.c
    prints the same)."""
    fields = dict(_PAUSE.findall(text))
    if f"Pause parameters for {interface}:" not in text or set(fields) != {
        "Autonegotiate",
        "RX",
        "TX",
    }:
        raise FactError(f"ethtool -a {interface}: not its pause parameters: {text.strip()[:120]!r}")
    return PauseInfo(interface, "", fields["Autonegotiate"], fields["RX"], fields["TX"])


class EthtoolPause(Fact[PauseInfo]):
    """``ethtool -a IF``: the port's global (802.3x) pause frames."""

    def command(self, interface: str) -> str:
        return with_tool("ethtool", f"ethtool -a {quote(interface)}")

    def parse(self, result: RunResult, interface: str) -> PauseInfo:
        simulated, out = tool_output(f"ethtool -a {interface}", result)
        if out is None:
            return PauseInfo(interface, "ethtool not found (install ethtool)", simulated=simulated)
        if not result.ok and "Operation not supported" in result.stderr:
            reason = f"{interface} has no pause frame settings (ethtool: Operation not supported)"
            return PauseInfo(interface, reason, simulated=simulated)
        if not result.ok:
            raise FactError.from_result(f"ethtool -a {interface}", result)
        found = parse_ethtool_pause(out, interface)
        return PauseInfo(interface, "", found.autoneg, found.rx, found.tx, simulated)


#: The bnxt_re congestion-control attributes the role sets, in the order bnxt_setupcc.sh writes
#: them (Broadcom's bnxt_re driver, configfs ``bnxt_re/DEV/ports/1/cc/``).
BNXT_CC = (
    "ecn_marking",
    "ecn_enable",
    "cc_mode",
    "cnp_prio",
    "roce_prio",
    "roce_dscp",
    "cnp_dscp",
)


@dataclass(frozen=True)
class BnxtCcInfo:
    device: str
    missing: str = ""
    #: attribute -> value (the driver prints ``%#x``: ``0x1a``; read as a number); None before
    #: ``mkdir /sys/kernel/config/bnxt_re/DEV``. An attribute this driver lacks is left out.
    values: dict[str, int] | None = None
    #: ``fw_service_prof_type_sup`` of ``/sys/kernel/debug/bnxt_re/DEV/info`` (1: the firmware
    #: owns the RoCE and CNP priorities and DSCPs); 0 where that file is absent, as
    #: bnxt_setupcc.sh takes it.
    service_type: int = 0
    #: ``/sys/module/bnxt_re/version``: Broadcom's out-of-tree bnxt_re declares one
    #: (``MODULE_VERSION``), the kernel's own does not; "" without.
    driver_version: str = ""


_SERVICE_TYPE = re.compile(r"^\s*fw_service_prof_type_sup\s*:\s*(\d+)\s*$", re.M)


class BnxtCc(Fact[BnxtCcInfo]):
    """``/sys/kernel/config/bnxt_re/DEV/ports/1/cc/*`` (exists once ``mkdir
    /sys/kernel/config/bnxt_re/DEV`` made it), the CNP service type from the driver's debugfs
    ``info`` and the loaded bnxt_re's version."""

    def command(self, device: str) -> str:
        base = quote(f"/sys/kernel/config/bnxt_re/{device}")
        info = quote(f"/sys/kernel/debug/bnxt_re/{device}/info")
        names = " ".join(BNXT_CC)
        return marked(
            "m=/sys/module/bnxt_re; "
            "echo version=$([ -d $m ] || echo -; cat $m/version 2>/dev/null); "
            f"echo service=$(grep fw_service_prof_type_sup {info} 2>/dev/null); "
            "[ -d /sys/kernel/config/bnxt_re ] || { echo nocfs; exit 0; }; "
            f"cd {base}/ports/1/cc 2>/dev/null || {{ echo nodir; exit 0; }}; "
            f'for f in {names}; do [ -e "$f" ] && printf \'%s=%s\\n\' "$f" "$(cat "$f")"; '
            "done; true"
        )

    def parse(self, result: RunResult, device: str) -> BnxtCcInfo:
        _, out = split_marked(result, f"bnxt_re cc of {device}")
        lines = out.strip().splitlines()
        head = dict(line.split("=", 1) for line in lines[:2] if "=" in line)
        service = _SERVICE_TYPE.search(head.get("service", "").replace("\t", " "))
        version = head.get("version", "").strip()
        common: dict[str, Any] = {
            "service_type": int(service.group(1)) if service else 0,
            "driver_version": "" if version == "-" else version,
        }
        rest = lines[2:]
        if rest == ["nocfs"]:
            loaded = (
                "no bnxt_re"
                if version == "-"
                else version or "the kernel's own bnxt_re, which declares no version"
            )
            reason = (
                "no /sys/kernel/config/bnxt_re: its congestion control comes with Broadcom's "
                f"out-of-tree bnxt_re (loaded: {loaded}; or configfs is not mounted)"
            )
            return BnxtCcInfo(device, reason, **common)
        if rest == ["nodir"]:
            return BnxtCcInfo(device, **common)
        try:
            fields = dict(line.split("=", 1) for line in rest)
            values = {name: int(fields[name], 0) for name in BNXT_CC if name in fields}
        except ValueError as exc:
            raise FactError(
                f"bnxt_re cc of {device}: cannot read {exc} from {out[:120]!r}",
                hint="the driver prints each attribute as a number (0x1a)",
            ) from None
        return BnxtCcInfo(device, values=values, **common)


@dataclass(frozen=True)
class ModuleInfo:
    name: str
    #: Whether the module is loaded (``/sys/module/NAME`` exists).
    loaded: bool = False
    #: ``/sys/module/NAME/version``: what ``MODULE_VERSION`` the loaded module declares ("").
    version: str = ""


class KernelModule(Fact[ModuleInfo]):
    """``/sys/module/NAME``: loaded or not, and the version the loaded module declares (an
    out-of-tree driver such as MLNX_OFED's mlx5_core or Broadcom's bnxt_re declares one)."""

    def command(self, name: str) -> str:
        folder = quote(f"/sys/module/{name}")
        return marked(
            f"[ -d {folder} ] && echo loaded; "
            f"echo version=$(cat {folder}/version 2>/dev/null); true"
        )

    def parse(self, result: RunResult, name: str) -> ModuleInfo:
        _, out = split_marked(result, f"module {name}")
        lines = out.splitlines()
        version = next((x.split("=", 1)[1] for x in lines if x.startswith("version=")), "")
        return ModuleInfo(name, "loaded" in lines, version.strip())
