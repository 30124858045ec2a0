"""roce_nic: lossless RoCEv2 on RDMA NICs (the RoCE and CNP DSCPs on their priorities, PFC on
one priority, ECN, the default RoCE ToS, a jumbo MTU; on Thor2 also ETS and global pause off, as
Broadcom's bnxt_setupcc.sh), per interface, by the NIC's driver; reapplied at boot by a oneshot
unit. README.md cites the source of every setting.

One source of truth for the commands: :func:`plan` gives each interface's steps (what, wanted
state, command); the role runs a step's command only when facts show another state, and the boot
script (templates/fxkit-roce-nic.sh.j2) runs the same commands in the same order.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass
from shlex import quote
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field

from fxkit.engine.role import Host
from fxkit.engine.rolevars import AbsolutePath, InterfaceName, RoleKeys, RoleVars, Whole, pattern
from fxkit.engine.variables import environment
from fxkit.facts.base import Fact
from fxkit.facts.rdma import (
    BnxtCc,
    DcbApp,
    DcbEts,
    DcbPfc,
    EthtoolPause,
    GidTypes,
    IbvDevinfo,
    KernelModule,
    MlnxQos,
    NetInterface,
    RdmaLink,
    driver_family,
)
from fxkit.facts.sysfs import Attribute
from fxkit.ops.base import OpContext, Result, failed, ok, skipped
from fxkit.ops.readback import set_and_read_back

#: RoCEv2 headers the kernel takes off the interface MTU to get the RDMA MTU (include/rdma/
#: ib_addr.h iboe_get_mtu: GRH 40 + UDP 8 + BTH 12 + XRC 4 + AtomicETH 28 + ICRC 4).
ROCE_HEADERS = 96
IB_MTUS = (4096, 2048, 1024, 512, 256)
RDMA_CM = "/sys/kernel/config/rdma_cm"
BNXT_RE = "/sys/kernel/config/bnxt_re"
#: The UDP port of RoCEv2 (IANA), the one bnxt_setupcc.sh maps to the RoCE priority.
ROCE_V2_PORT = 4791


# -- variables ----------------------------------------------------------------------------------

#: RoCE MTU: 1280 is the least an IPv6 link carries (RoCEv2 GIDs are IPv4 and IPv6 addresses;
#: it still gives an RDMA MTU of 1024), 9216 the largest jumbo frame data-centre switches
#: forward (ConnectX and Thor2 take more, the fabric does not).
Mtu = Annotated[Whole, Field(ge=1280, le=9216)]
#: An 802.1p priority (traffic class).
Priority = Annotated[Whole, Field(ge=0, le=7)]
#: A DSCP: the 6 high bits of the IP ToS byte.
Dscp = Annotated[Whole, Field(ge=0, le=63)]
#: RDMA device names, as `rdma link` shows them (mlx5_0, bnxt_re0, rocep1s0f0).
RdmaDevice = Annotated[str, pattern(r"[A-Za-z0-9_.-]{1,63}", "an RDMA device name")]


class Interface(RoleKeys):
    """One interface to configure; a plain name in the list is ``{name: IF}``."""

    name: InterfaceName = Field(description="the interface, as `ip link` shows it")
    device: RdmaDevice | None = Field(
        None,
        description="its RDMA device, as `rdma link` shows it (none: the one `rdma link` "
        "shows with netdev IF)",
    )
    mtu: Mtu | None = Field(None, description="its MTU (none: `roce_nic_mtu`)")


def _name_only(entry: object) -> object:
    """A plain name in ``roce_nic_interfaces`` is ``{name: IF}``."""
    return {"name": entry} if isinstance(entry, str) else entry


class Vars(RoleVars):
    roce_nic_interfaces: list[Annotated[Interface, BeforeValidator(_name_only)]] = Field(
        [],
        description="interfaces to configure: names (`ens6np0`) or `{name: IF, device: DEV, "
        "mtu: N}`, each interface and device once",
        examples=[["ens6np0", {"name": "ens26np0", "device": "bnxt_re0", "mtu": 9000}]],
    )
    roce_nic_mtu: Mtu = Field(
        9000,
        description="interface MTU (1280: the least an IPv6 link carries; 9216: the largest "
        "jumbo frame data-centre switches forward)",
        examples=[9000],
    )
    roce_nic_trust: Literal["dscp", "pcp"] = Field(
        "dscp",
        description="priority trust state (`dscp`: RoCEv2 routed over IP; ConnectX)",
        examples=["dscp", "pcp"],
    )
    roce_nic_pfc_priority: Priority = Field(
        3,
        description="the RoCE priority: the one 802.1p priority with PFC (lossless), the one "
        "`roce_nic_dscp` is mapped to, and the ECN priority on ConnectX. The common lossless "
        "plan: FACTS.md",
        examples=[3],
    )
    roce_nic_dscp: Dscp = Field(26, description="DSCP of RoCE traffic", examples=[26])
    roce_nic_tos: Annotated[Whole, Field(ge=0, le=255)] | None = Field(
        None,
        description="rdma_cm default ToS (and `NCCL_IB_TC`): `DSCP << 2 | ECN bits`, the DSCP "
        "`roce_nic_dscp`; none: derived per NIC, 106 on ConnectX (ECN bits 2, ECT(0), with "
        "`roce_nic_ecn`) and 104 on Thor2 (bnxt_setupcc.sh writes `DSCP << 2`; the NIC's "
        "`ecn_marking` sets the ECN bits); never ECN bits 3 (CE)",
        examples=[None, 106, 104],
    )
    roce_nic_roce_bandwidth: Annotated[Whole, Field(ge=1, le=99)] = Field(
        50,
        description="Thor2 ETS: the RoCE traffic class's share of the bandwidth in percent, the "
        "rest to traffic class 0 (bnxt_setupcc.sh `-b`, default 50)",
        examples=[50],
    )
    roce_nic_cnp_dscp: Dscp = Field(
        48, description="DSCP of congestion notification packets (CNP)", examples=[48]
    )
    roce_nic_cnp_priority: Priority = Field(7, description="802.1p priority of CNPs", examples=[7])
    roce_nic_ecn: bool = Field(
        True, description="ECN (DCQCN) on the RoCE priority", examples=[True, False]
    )
    roce_nic_gid_index: Whole = Field(
        3,
        ge=0,
        le=255,
        description="the RoCE v2 GID RCCL uses (`NCCL_IB_GID_INDEX`), verified to be one",
        examples=[3],
    )
    roce_nic_script: AbsolutePath = Field(
        "/usr/local/sbin/fxkit-roce-nic", description="the boot script"
    )
    roce_nic_unit: Annotated[str, pattern(r"[\w:.@-]+\.service", "a systemd service name")] = Field(
        "fxkit-roce-nic.service", description="the oneshot unit that runs it at boot"
    )
    roce_nic_env_file: AbsolutePath = Field(
        "/etc/fxkit/roce-nic.env", description="the environment file for RCCL jobs"
    )


#: ECN bits of an ECN-capable transport, ECT(0) (RFC 3168 section 5), and of a congested one (CE).
ECT0, CE = 2, 3


@dataclass(frozen=True)
class Settings:
    trust: str
    pfc_priority: int
    dscp: int
    #: ``roce_nic_tos``; None: derived per NIC (:meth:`tos_for`).
    tos: int | None
    cnp_dscp: int
    cnp_priority: int
    ecn: bool
    gid_index: int
    roce_bandwidth: int = 50

    @property
    def pfc(self) -> str:
        """``0,0,0,1,0,0,0,0``: PFC on the RoCE priority only (mlnx_qos ``--pfc``)."""
        return ",".join("1" if p == self.pfc_priority else "0" for p in range(8))

    def tos_for(self, family: str) -> int:
        """The ToS of RoCE traffic on a NIC of ``family``: ``roce_nic_tos``, or ``DSCP << 2``
        with the ECN bits ECT(0) on ConnectX when ECN is on (106 for DSCP 26) and none on Thor2,
        whose firmware marks ECN itself (bnxt_setupcc.sh: ``DSCP << 2``, 104)."""
        if self.tos is not None:
            return self.tos
        return self.dscp << 2 | (ECT0 if family == "connectx" and self.ecn else 0)


def settings(v: Vars) -> Settings:
    return Settings(
        v.roce_nic_trust,
        v.roce_nic_pfc_priority,
        v.roce_nic_dscp,
        v.roce_nic_tos,
        v.roce_nic_cnp_dscp,
        v.roce_nic_cnp_priority,
        v.roce_nic_ecn,
        v.roce_nic_gid_index,
        v.roce_nic_roce_bandwidth,
    )


def validate(v: Vars) -> None:
    """What the types cannot say: a ToS that carries the DSCP and consistent ECN bits, RoCE and
    CNPs on DSCPs of their own, no interface or device twice."""
    tos, dscp = v.roce_nic_tos, v.roce_nic_dscp
    hint = (
        f"ToS = DSCP << 2 | ECN bits: {dscp << 2 | ECT0} (ECN-capable, ECT(0)) or {dscp << 2} "
        "(the ECN bits left to the NIC, as on Thor2); or leave roce_nic_tos unset to derive it"
    )
    if tos is not None and tos >> 2 != dscp:
        msg = f"roce_nic_tos {tos} carries DSCP {tos >> 2}, but roce_nic_dscp is {dscp}"
        raise v.wrong("roce_nic_tos", msg, hint)
    if tos is not None and tos & 3 == CE:
        msg = f"roce_nic_tos {tos} has ECN bits 3 (CE): only a congested switch sets those"
        raise v.wrong("roce_nic_tos", msg, hint)
    if tos is not None and tos & 3 and not v.roce_nic_ecn:
        msg = (
            f"roce_nic_tos {tos} marks RoCE traffic ECN-capable (ECN bits {tos & 3}), but "
            "roce_nic_ecn is false: switches would mark congestion no NIC reacts to"
        )
        raise v.wrong("roce_nic_tos", msg, f"use {dscp << 2}, or set roce_nic_ecn: true")
    if v.roce_nic_cnp_dscp == dscp:
        raise v.wrong(
            "roce_nic_cnp_dscp",
            f"roce_nic_cnp_dscp {dscp} is also the RoCE DSCP (roce_nic_dscp): one DSCP cannot map "
            f"to the RoCE priority {v.roce_nic_pfc_priority} and the CNP priority "
            f"{v.roce_nic_cnp_priority}",
            hint="give congestion notifications a DSCP of their own (48 is the common one)",
        )
    names: set[str] = set()
    devices: set[str] = set()
    for i, entry in enumerate(v.roce_nic_interfaces):
        var = f"roce_nic_interfaces[{i}]"
        if entry.name in names:
            raise v.wrong(
                var, f"interface {entry.name} is listed twice", "list each interface once"
            )
        if entry.device and entry.device in devices:
            msg = f"RDMA device {entry.device} is listed twice"
            raise v.wrong(var, msg, "each interface has its own RDMA device")
        names.add(entry.name)
        if entry.device:
            devices.add(entry.device)


# -- what each NIC gets --------------------------------------------------------------------------


@dataclass(frozen=True)
class Nic:
    """An interface as found on the host: its RDMA device and driver family, or why not."""

    name: str
    mtu: int
    device: str = ""
    #: ``connectx`` or ``thor2``.
    family: str = ""
    missing: str = ""
    #: Thor2: the CNP service type the firmware reports (1: it owns the RoCE and CNP priorities
    #: and DSCPs of bnxt_re's congestion control), as bnxt_setupcc.sh reads it.
    service_type: int = 0


@dataclass(frozen=True)
class Step:
    """One setting: ``command`` makes ``what`` read ``want``; ``kind`` says how to read it."""

    what: str
    want: str
    command: str
    #: ``mtu``, ``mlnx_qos``, ``mlnx_dscp``, ``pause``, ``dcb_ets``, ``dcb_pfc``, ``dcb_app``,
    #: ``bnxt_cc`` or ``attributes``.
    kind: str
    target: str
    #: For ``attributes``: (label, path) read back and compared with ``want``.
    attributes: tuple[tuple[str, str], ...] = ()
    #: (path, what provides it, its kernel module): the step runs only where that path exists.
    requires: tuple[str, str, str] | None = None


def ib_mtu(mtu: int) -> int:
    """The RDMA (IB) MTU the kernel derives from an interface MTU (iboe_get_mtu)."""
    return next((m for m in IB_MTUS if mtu - ROCE_HEADERS >= m), 0)


def _writes(pairs: list[tuple[str, str, str]]) -> tuple[str, tuple[tuple[str, str], ...]]:
    """(label, path, value) -> the want text, and the (label, path) pairs to read back."""
    want = ", ".join(f"{label} {value}" for label, _, value in pairs)
    return want, tuple((label, path) for label, path, _ in pairs)


def _printf(path: str, value: str) -> str:
    return f"printf '%s\\n' {quote(value)} > {quote(path)}"


def _pairs(mapping: dict[int, Any]) -> str:
    """``{0: 'ets', 1: 'ets'}`` -> ``0:ets 1:ets``, as dcb takes and this role reads them."""
    return " ".join(f"{key}:{value}" for key, value in mapping.items())


def plan(nic: Nic, s: Settings) -> list[Step]:
    """The steps for one NIC, in the order they run (and the boot script runs them)."""
    mtu = f"ip link set dev {quote(nic.name)} mtu {nic.mtu}"
    steps = [Step(f"MTU of {nic.name}", str(nic.mtu), mtu, "mtu", nic.name)]
    steps += _connectx_qos(nic, s) if nic.family == "connectx" else _thor2_qos(nic, s)
    folder = f"{RDMA_CM}/{nic.device}"
    tos = [
        ("default_roce_mode", f"{folder}/ports/1/default_roce_mode", "RoCE v2"),
        ("default_roce_tos", f"{folder}/ports/1/default_roce_tos", str(s.tos_for(nic.family))),
    ]
    want, reads = _writes(tos)
    command = " && ".join([f"mkdir -p {quote(folder)}", *(_printf(p, x) for _, p, x in tos)])
    needs = (RDMA_CM, "configfs not mounted or the rdma_cm module not loaded", "")
    what = f"rdma_cm defaults of {nic.device}"
    steps.append(Step(what, want, command, "attributes", nic.device, reads, needs))
    if nic.family == "connectx":
        steps.append(_connectx_ecn(nic, s))
    elif nic.service_type != 1:  # bnxt_setupcc.sh leaves it to the firmware with service type 1
        steps.append(_bnxt_cc(nic, s))
    return steps


def _connectx_qos(nic: Nic, s: Settings) -> list[Step]:
    """mlnx_qos: trust and PFC (one call), then the RoCE and CNP DSCPs' priorities (mlnx_qos
    refuses ``--trust`` and ``--dscp2prio`` in one call), as AMD's network guide does it."""
    q = quote(nic.name)
    steps = [
        Step(
            f"trust and PFC of {nic.name}",
            f"trust {s.trust}, pfc {s.pfc}",
            f"mlnx_qos -i {q} --trust={s.trust} --pfc={s.pfc}",
            "mlnx_qos",
            nic.name,
        )
    ]
    if s.trust == "dscp":
        mapping = {s.dscp: s.pfc_priority, s.cnp_dscp: s.cnp_priority}
        sets = " ".join(f"--dscp2prio set,{d},{p}" for d, p in mapping.items())
        what = f"DSCP priorities of {nic.name}"
        want = f"dscp2prio {_pairs(mapping)}"
        steps.append(Step(what, want, f"mlnx_qos -i {q} {sets}", "mlnx_dscp", nic.name))
    return steps


def _thor2_qos(nic: Nic, s: Settings) -> list[Step]:
    """As bnxt_setupcc.sh with iproute2's dcb: global pause off, ETS (RoCE in traffic class 1;
    with the CNP service type, CNPs in a strict class 2), PFC on the RoCE priority, and the DCB
    application entries: UDP port 4791 (RoCEv2) and, with DSCP trust, the RoCE DSCP (and the
    CNP DSCP with the CNP service type) to their priorities."""
    q = quote(nic.name)
    cnp_class = nic.service_type == 1 and s.ecn
    tsa = {0: "ets", 1: "ets", **({2: "strict"} if nic.service_type == 1 else {})}
    bw = {0: 100 - s.roce_bandwidth, 1: s.roce_bandwidth}
    prio_tc = {
        p: 1 if p == s.pfc_priority else 2 if cnp_class and p == s.cnp_priority else 0
        for p in range(8)
    }
    ets = f"prio-tc {_pairs(prio_tc)} tc-tsa {_pairs(tsa)} tc-bw {_pairs(bw)}"
    pfc = {p: "on" if p == s.pfc_priority else "off" for p in range(8)}
    apps = f"dgram-port-prio {ROCE_V2_PORT}:{s.pfc_priority}"
    if s.trust == "dscp":
        dscps = {s.dscp: s.pfc_priority, **({s.cnp_dscp: s.cnp_priority} if cnp_class else {})}
        apps += f" dscp-prio {_pairs(dscps)}"
    return [
        Step(
            f"global pause of {nic.name}",
            "rx off, tx off",
            f"ethtool -A {q} rx off tx off",
            "pause",
            nic.name,
        ),
        Step(f"ETS of {nic.name}", ets, f"dcb ets set dev {q} {ets}", "dcb_ets", nic.name),
        Step(
            f"PFC of {nic.name}",
            f"pfc {s.pfc}",
            f"dcb pfc set dev {q} prio-pfc {_pairs(pfc)}",
            "dcb_pfc",
            nic.name,
        ),
        Step(
            f"DCB apps of {nic.name}", apps, f"dcb app replace dev {q} {apps}", "dcb_app", nic.name
        ),
    ]


def _connectx_ecn(nic: Nic, s: Settings) -> Step:
    """MLNX_OFED's mlx5 ECN attributes: DCQCN on the RoCE priority, the CNPs' DSCP and
    priority."""
    ecn = f"/sys/class/net/{nic.name}/ecn"
    on = "1" if s.ecn else "0"
    pairs = [
        ("roce_np", f"{ecn}/roce_np/enable/{s.pfc_priority}", on),
        ("roce_rp", f"{ecn}/roce_rp/enable/{s.pfc_priority}", on),
        ("cnp_dscp", f"{ecn}/roce_np/cnp_dscp", str(s.cnp_dscp)),
        ("cnp_802p_prio", f"{ecn}/roce_np/cnp_802p_prio", str(s.cnp_priority)),
    ]
    want, reads = _writes(pairs)
    needs = (ecn, "the mlx5 ECN attributes come with MLNX_OFED/DOCA-OFED's mlx5_core", "mlx5_core")
    return Step(
        f"ECN of {nic.name} priority {s.pfc_priority}",
        want,
        " && ".join(_printf(p, x) for _, p, x in pairs),
        "attributes",
        nic.name,
        reads,
        needs,
    )


def _bnxt_cc(nic: Nic, s: Settings) -> Step:
    """Broadcom's bnxt_re congestion control (configfs), as bnxt_setupcc.sh writes it where the
    CNP service type is 0: ECN marking and DCQCN on (cc_mode 1) or both off, the CNP and RoCE
    priorities and DSCPs, then ``apply``."""
    values = {"ecn_marking": int(s.ecn), "ecn_enable": int(s.ecn)}
    if s.ecn:
        values["cc_mode"] = 1
    values |= {
        "cnp_prio": s.cnp_priority,
        "roce_prio": s.pfc_priority,
        "roce_dscp": s.dscp,
        "cnp_dscp": s.cnp_dscp,
    }
    cc = f"{BNXT_RE}/{nic.device}/ports/1/cc"
    writes = [f"printf '%s' {_hex(x)} > {quote(f'{cc}/{k}')}" for k, x in values.items()]
    command = " && ".join(
        [
            f"mkdir -p {quote(f'{BNXT_RE}/{nic.device}')}",
            *writes,
            f"printf '%s' 0x1 > {quote(f'{cc}/apply')}",
        ]
    )
    want = ", ".join(f"{k} {_hex(x)}" for k, x in values.items())
    return Step(f"congestion control of {nic.device}", want, command, "bnxt_cc", nic.device)


def _hex(value: int) -> str:
    """As bnxt_re prints its attributes and bnxt_setupcc.sh writes them (``%#x``: ``0x1a``, and
    ``0`` for zero; the driver reads what is written as hexadecimal)."""
    return f"{value:#x}" if value else "0"


def read_state(ctx: OpContext, step: Step) -> str:
    """The step's setting now, in the words of ``step.want``."""
    if step.kind == "mtu":
        return str(ctx.fresh(NetInterface, step.target).mtu)
    if step.kind == "mlnx_qos":
        qos = ctx.fresh(MlnxQos, step.target)
        return f"trust {qos.trust}, pfc {','.join(map(str, qos.pfc))}"
    if step.kind == "mlnx_dscp":
        mapping = ctx.fresh(MlnxQos, step.target).dscp2prio or {}
        return "dscp2prio " + _pairs({d: mapping.get(d, "unset") for d in _keys(step.want)})
    if step.kind == "pause":
        pause = ctx.fresh(EthtoolPause, step.target)
        return f"rx {pause.rx}, tx {pause.tx}"
    if step.kind == "dcb_ets":
        ets = ctx.fresh(DcbEts, step.target)
        wanted = step.want.split(" tc-tsa ")[1].split(" tc-bw ")
        tcs, bws = _keys(wanted[0]), _keys(wanted[1])
        return (
            f"prio-tc {_pairs(dict(enumerate(ets.prio_tc)))} "
            f"tc-tsa {_pairs({tc: ets.tc_tsa[tc] for tc in tcs})} "
            f"tc-bw {_pairs({tc: ets.tc_bw[tc] for tc in bws})}"
        )
    if step.kind == "dcb_pfc":
        return f"pfc {','.join(map(str, ctx.fresh(DcbPfc, step.target).pfc))}"
    if step.kind == "dcb_app":
        app = ctx.fresh(DcbApp, step.target)
        found = []
        for selector, pairs in re.findall(r"([a-z-]+-prio) ((?:\d+:\d+ ?)+)", step.want):
            table = app.table(selector.replace("-", "_"))
            found.append(f"{selector} {_pairs({k: table.get(k, 'unset') for k in _keys(pairs)})}")
        return " ".join(found)
    if step.kind == "bnxt_cc":
        values = ctx.fresh(BnxtCc, step.target).values
        if values is None:
            return "unset"
        wanted = [pair.split()[0] for pair in step.want.split(", ")]
        return ", ".join(f"{k} {_hex(values[k]) if k in values else 'unset'}" for k in wanted)
    read = [(label, ctx.fresh(Attribute, path)) for label, path in step.attributes]
    return ", ".join(f"{label} {info.value if info.exists else 'unset'}" for label, info in read)


def _keys(pairs: str) -> list[int]:
    """The keys of ``26:3 48:7`` (or ``dscp2prio 26:3 48:7``): [26, 48]."""
    return [int(pair.split(":")[0]) for pair in pairs.split() if ":" in pair]


def converge(ctx: OpContext, step: Step) -> Result:
    """Run ``step.command`` when the setting does not read ``step.want``; read it back after.

    Example::

        host.task("MTU of ens6np0").call(converge, step)
    """
    return set_and_read_back(
        ctx, step.what, step.want, step.command, lambda ctx: read_state(ctx, step)
    )


#: The fact that reads each kind of step: its ``missing`` says why the step cannot run.
_READERS: dict[str, type[Fact[Any]]] = {
    "mlnx_qos": MlnxQos,
    "mlnx_dscp": MlnxQos,
    "pause": EthtoolPause,
    "dcb_ets": DcbEts,
    "dcb_pfc": DcbPfc,
    "dcb_app": DcbApp,
    "bnxt_cc": BnxtCc,
}


def requirement(host: Host, step: Step) -> str:
    """Why ``step`` cannot run on this host ("" when it can). Where a path the vendor's own
    driver provides is missing, the reason names the driver that is loaded instead."""
    if step.kind in _READERS:
        return str(host.fact(_READERS[step.kind], step.target).missing)
    if step.requires and not host.fact(Attribute, step.requires[0]).exists:
        path, provider, module = step.requires
        reason = f"no {path} ({provider}"
        if module:
            loaded = host.fact(KernelModule, module)
            found = (
                f"{module} {loaded.version}"
                if loaded.version
                else f"{module}, which declares no version"
                if loaded.loaded
                else f"no {module}"
            )
            reason += f"; loaded: {found}"
        return reason + ")"
    return ""


def resolve(host: Host, wanted: Interface, mtu: int) -> Nic:
    """The interface (at ``mtu``): its RDMA device and driver family from facts, or why they
    are missing."""
    device = wanted.device or ""
    links = host.fact(RdmaLink)
    if links.missing:
        return Nic(wanted.name, mtu, device, missing=links.missing)
    port = links.by_device(device) if device else links.by_netdev(wanted.name)
    shown = ", ".join(f"{p.name} netdev {p.netdev}" for p in links.ports)
    if port is None:
        what = f"RDMA device {device}" if device else f"RDMA device on {wanted.name}"
        return Nic(wanted.name, mtu, device, missing=f"no {what} (rdma link shows {shown})")
    if port.netdev != wanted.name:
        host.fail(
            f"{wanted.name}: {port.device} is the RDMA device of {port.netdev}, not of "
            f"{wanted.name} (rdma link); fix roce_nic_interfaces"
        )
    iface = host.fact(NetInterface, wanted.name)
    if iface.missing:
        return Nic(wanted.name, mtu, port.device, missing=iface.missing)
    family = driver_family(iface.driver, port.device)
    if not family:
        return Nic(
            wanted.name,
            mtu,
            port.device,
            missing=(
                f"driver {iface.driver or 'unknown'} of {port.device} is neither ConnectX "
                "(mlx5_core) nor Broadcom Thor2 (bnxt_en)"
            ),
        )
    if family == "thor2":
        service = host.fact(BnxtCc, port.device).service_type
        return Nic(wanted.name, mtu, port.device, family, service_type=service)
    return Nic(wanted.name, mtu, port.device, family)


# -- verification --------------------------------------------------------------------------------


def verify(ctx: OpContext, nics: list[Nic], gid_index: int, ibv_devinfo: bool) -> Result:
    """Every configured device's port ACTIVE (rdma link), its interface at the wanted MTU; with
    ``ibv_devinfo``, link layer Ethernet and the RDMA MTU that interface MTU gives; the GID at
    ``gid_index`` a RoCE v2 one.

    Example::

        host.call(verify, nics, 3, True)
    """
    if ctx.check:
        return skipped("check mode: nothing was changed, so there is nothing to verify")
    links = ctx.fresh(RdmaLink)
    devinfo = ctx.fresh(IbvDevinfo) if ibv_devinfo else None
    problems = []
    for nic in nics:
        port = links.by_device(nic.device)
        if port is None or port.state != "ACTIVE":
            found = port.state if port else "no such port"
            problems.append(
                f"{nic.device}/1 ({nic.name}): wanted state ACTIVE, found {found} (rdma link)"
            )
        mtu = ctx.fresh(NetInterface, nic.name).mtu
        if mtu != nic.mtu:
            problems.append(
                f"{nic.name}: wanted MTU {nic.mtu}, found {mtu} (/sys/class/net/{nic.name}/mtu)"
            )
        device = devinfo.get(nic.device) if devinfo else None
        ibport = device.port(1) if device else None
        if devinfo and ibport is None:
            problems.append(f"{nic.device}: wanted port 1 in ibv_devinfo, found none")
        if ibport and ibport.link_layer != "Ethernet":
            problems.append(
                f"{nic.device}: wanted link layer Ethernet, found {ibport.link_layer} (ibv_devinfo)"
            )
        if ibport and ibport.active_mtu != min(ibport.max_mtu, ib_mtu(nic.mtu)):
            problems.append(
                f"{nic.device}: wanted active_mtu {min(ibport.max_mtu, ib_mtu(nic.mtu))} for "
                f"interface MTU {nic.mtu}, found {ibport.active_mtu} (ibv_devinfo)"
            )
        gids = ctx.fresh(GidTypes, nic.device, 1)
        if gids.types.get(gid_index) != "RoCE v2":
            found = gids.missing or gids.types.get(gid_index, "no GID")
            problems.append(
                f"{nic.device}: wanted GID {gid_index} of type RoCE v2 "
                f"(roce_nic_gid_index), found {found}"
            )
    if problems:
        return failed("RoCE verification failed: " + "; ".join(problems))
    names = ", ".join(f"{n.device}/1 ({n.name})" for n in nics)
    simulated = " (simulated lab host)" if links.simulated else ""
    return ok(f"{names}: ACTIVE, Ethernet, MTU as wanted, GID {gid_index} RoCE v2{simulated}")


# -- the role ------------------------------------------------------------------------------------


def render(host: Host, template: str, **context: Any) -> str:
    return environment(str(host.role.templates)).get_template(template).render(**context)


def unit_device(interface: str) -> str:
    """systemd's device unit of a network interface (``sys-subsystem-net-devices-IF.device``),
    the name escaped as ``systemd-escape`` does."""
    escaped = "".join(
        c
        if c.isascii() and (c.isalnum() or c in ":_.") and not (i == 0 and c == ".")
        else "".join(f"\\x{b:02x}" for b in c.encode())
        for i, c in enumerate(interface)
    )
    return f"sys-subsystem-net-devices-{escaped}.device"


def apply(host: Host, v: Vars) -> None:
    s = settings(v)
    nics = [
        resolve(host, wanted, v.roce_nic_mtu if wanted.mtu is None else wanted.mtu)
        for wanted in v.roce_nic_interfaces
    ]
    # What this host lacks, before anything changes: a host that is not a lab host stops here.
    live = [nic for nic in nics if host.needs(not nic.missing, f"RoCE on {nic.name}", nic.missing)]
    plans = {nic.name: plan(nic, s) for nic in live}
    steps = []
    for step in (step for nic in live for step in plans[nic.name]):
        reason = requirement(host, step)
        if host.needs(not reason, step.what, reason):
            steps.append(step)

    # Persistence: the boot script, its unit, the environment RCCL jobs read.
    script = v.roce_nic_script
    host.directory(posixpath.dirname(script), mode="0755")
    host.task(f"template {script}").file(
        script, render(host, "fxkit-roce-nic.sh.j2", nics=nics, plans=plans, q=quote), mode="0755"
    )
    units = [unit_device(nic.name) for nic in nics]
    host.unit(
        v.roce_nic_unit, render(host, "fxkit-roce-nic.service.j2", script=script, devices=units)
    )
    host.service(v.roce_nic_unit, enabled=True)
    env = v.roce_nic_env_file
    host.directory(posixpath.dirname(env), mode="0755")
    devices = [nic.device for nic in nics if nic.device]
    # RCCL takes one traffic class: that of the first interface's NIC (or roce_nic_tos).
    tos = s.tos_for(next((nic.family for nic in nics if nic.family), "connectx"))
    text = render(host, "roce-nic.env.j2", s=s, tos=tos, devices=devices)
    host.task(f"template {env}").file(env, text, mode="0644")

    for step in steps:
        host.task(step.what).call(converge, step)
    if not live:
        if nics:
            host.needs(False, "verify RoCE", "no interface could be configured (see above)")
        return
    ibv = host.fact(IbvDevinfo)
    has_ibv = host.needs(not ibv.missing, "verify link layer and RDMA MTU", ibv.missing)
    host.task("verify RoCE").call(verify, live, s.gid_index, has_ibv)
