"""roles/roce_nic: variables checked first, the commands it renders against the real tools'
syntax, the boot script and unit (systemd-analyze verify), and real runs on lab hosts.

Plain lab hosts have no RDMA hardware: every hardware step is skipped with its reason, the file
steps (script, unit, RCCL environment) are applied, check mode changes nothing, a second run
changes nothing; a host not marked as a lab host fails with the reason.

Syntax sources: `mlnx_qos` options from Mellanox/mlnx-tools python/mlnx_qos at 8fbfd9cf (optparse:
-i/--interface, --trust pcp|dscp, -f/--pfc "comma separated value for each priority starting from
0 to 7"); `dcb pfc set dev DEV prio-pfc PRIO:on|off...` from iproute2 dcb/dcb_pfc.c (man
dcb-pfc); the rdma_cm and bnxt_re configfs writes from FACTS.md and Broadcom's bnxt_setupcc.sh
(mkdir DEV, write ports/1/cc/{ecn_enable,cc_mode,roce_prio,cnp_prio,roce_dscp,cnp_dscp}, then
apply); `ip link set dev IF mtu N` is run for real below.
"""

from __future__ import annotations

import difflib
import json
import optparse
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from fxkit.connection.base import Connection, RunResult
from fxkit.connection.local import LocalConnection
from fxkit.engine.record import Recorder
from fxkit.engine.role import Host, RoleLoader
from fxkit.engine.variables import HostVars, Layer
from fxkit.errors import VarError
from fxkit.facts.base import FactCache
from fxkit.facts.lab import SEPARATOR
from fxkit.facts.rdma import GidTypes, IbvDevinfo, MlnxQos, NetInterface, RdmaLink
from fxkit.lab import Fleet, calls
from fxkit.ops.base import OpContext, Status

ROLES = Path(__file__).resolve().parents[1] / "roles"
ROLE_DIR = ROLES / "roce_nic"
REFERENCE = Path(__file__).parent / "data" / "reference"


ROLE = RoleLoader([ROLES]).load("roce_nic")  # as the runner loads it
#: role.py's module, for its functions (validate, plan, render...).
R: ModuleType = sys.modules[ROLE.apply.__module__]
DEFAULTS = ROLE.defaults


def hostvars(**values: Any) -> HostVars:
    return HostVars("gpu01", [Layer("role defaults", DEFAULTS), Layer("inventory", values)])


# -- validate -------------------------------------------------------------------------------------


def typed(**values: Any) -> Any:
    """The role's typed values, checked as the runner checks them: the types of its Vars, then
    its validate()."""
    v = ROLE.typed(hostvars(**values))
    R.validate(v)
    return v


def test_the_defaults_and_a_full_interface_list_validate() -> None:
    typed()
    v = typed(roce_nic_interfaces=["ens6np0", {"name": "ens5np0", "device": "mlx5_1", "mtu": 4200}])
    assert [(i.name, i.device, i.mtu) for i in v.roce_nic_interfaces] == [
        ("ens6np0", None, None),
        ("ens5np0", "mlx5_1", 4200),
    ]
    v = typed(roce_nic_mtu="9000", roce_nic_ecn="no")  # INI / -e strings
    assert (v.roce_nic_mtu, v.roce_nic_ecn) == (9000, False)


@pytest.mark.parametrize(
    "values, where, words",
    [
        ({"roce_nic_mtu": 1279}, "roce_nic_mtu (inventory)", "greater than or equal to 1280"),
        ({"roce_nic_mtu": 9217}, "roce_nic_mtu (inventory)", "less than or equal to 9216"),
        ({"roce_nic_mtu": True}, "roce_nic_mtu (inventory)", "a boolean is not a number"),
        ({"roce_nic_pfc_priority": 8}, "roce_nic_pfc_priority (inventory)", "or equal to 7"),
        ({"roce_nic_cnp_priority": -1}, "roce_nic_cnp_priority (inventory)", "or equal to 0"),
        ({"roce_nic_dscp": 64}, "roce_nic_dscp (inventory)", "less than or equal to 63"),
        ({"roce_nic_cnp_dscp": "high"}, "roce_nic_cnp_dscp (inventory)", "valid integer"),
        ({"roce_nic_tos": 256}, "roce_nic_tos (inventory)", "less than or equal to 255"),
        ({"roce_nic_gid_index": -1}, "roce_nic_gid_index (inventory)", "or equal to 0"),
        ({"roce_nic_tos": 104 + 8}, "roce_nic_tos", "carries DSCP 28, but roce_nic_dscp is 26"),
        ({"roce_nic_tos": 107}, "roce_nic_tos", "ECN bits 3"),
        (
            {"roce_nic_tos": 105, "roce_nic_ecn": False},
            "roce_nic_tos",
            "(ECN bits 1), but roce_nic_ecn is false",
        ),
        ({"roce_nic_cnp_dscp": 26}, "roce_nic_cnp_dscp", "is also the RoCE DSCP"),
        ({"roce_nic_roce_bandwidth": 100}, "roce_nic_roce_bandwidth (inventory)", "or equal to 99"),
        ({"roce_nic_trust": "vlan"}, "roce_nic_trust (inventory)", "'vlan'"),
        ({"roce_nic_ecn": "maybe"}, "roce_nic_ecn (inventory)", "'maybe'"),
        ({"roce_nic_script": "fxkit-roce-nic"}, "roce_nic_script (inventory)", "not absolute"),
        ({"roce_nic_env_file": "roce.env"}, "roce_nic_env_file (inventory)", "not absolute"),
        ({"roce_nic_unit": "fxkit roce"}, "roce_nic_unit (inventory)", "not a systemd service"),
        ({"roce_nic_interfaces": "ens6np0"}, "roce_nic_interfaces (inventory)", "valid list"),
        (
            {"roce_nic_interfaces": [{"device": "mlx5_0"}]},
            "roce_nic_interfaces (inventory)",
            "roce_nic_interfaces[0].name is not set",
        ),
        (
            {"roce_nic_interfaces": [{"name": "a", "speed": 1}]},
            "roce_nic_interfaces (inventory)",
            "roce_nic_interfaces[0].speed is 1: Extra inputs are not permitted",
        ),
        (
            {"roce_nic_interfaces": [7]},
            "roce_nic_interfaces (inventory)",
            "roce_nic_interfaces[0] is 7: Input should be a valid dictionary",
        ),
        (
            {"roce_nic_interfaces": ["a/b"]},
            "roce_nic_interfaces (inventory)",
            "roce_nic_interfaces[0].name is 'a/b': not a Linux interface name",
        ),
        (
            {"roce_nic_interfaces": ["x" * 16]},
            "roce_nic_interfaces (inventory)",
            "[0].name is 'xxxxxxxxxxxxxxxx': not a Linux interface name",
        ),
        (
            {"roce_nic_interfaces": [{"name": "a", "device": "m x"}]},
            "roce_nic_interfaces (inventory)",
            "roce_nic_interfaces[0].device is 'm x': not an RDMA device name",
        ),
        (
            {"roce_nic_interfaces": [{"name": "a", "mtu": 100}]},
            "roce_nic_interfaces (inventory)",
            "roce_nic_interfaces[0].mtu is 100: Input should be greater than or equal to 1280",
        ),
        ({"roce_nic_interfaces": ["a", "b", "a"]}, "roce_nic_interfaces[2]", "listed twice"),
        (
            {"roce_nic_interfaces": [{"name": "a", "device": "d0"}, {"name": "b", "device": "d0"}]},
            "roce_nic_interfaces[1]",
            "RDMA device d0 is listed twice",
        ),
    ],
)
def test_wrong_variables_name_host_and_variable(values: dict, where: str, words: str) -> None:
    with pytest.raises(VarError) as caught:
        typed(**values)
    # the host, the variable (or a path into it) and where its value was set
    assert caught.value.where.startswith(f"gpu01: {where.removesuffix(' (inventory)')}")
    assert caught.value.where.endswith(" (inventory)")
    assert words in caught.value.message, caught.value.message
    assert caught.value.hint


def test_the_tos_rule_and_any_dscp_on_the_roce_priority() -> None:
    """ToS = DSCP << 2 | ECN bits: unset, it is derived per NIC; set, it must carry the DSCP.
    Both NICs get the DSCP-to-priority map set explicitly, so any DSCP may carry RoCE."""
    s = R.settings(typed())
    assert (s.tos, s.tos_for("connectx"), s.tos_for("thor2")) == (None, 106, 104)
    assert R.settings(typed(roce_nic_ecn=False)).tos_for("connectx") == 104
    assert R.settings(typed(roce_nic_tos=104)).tos_for("connectx") == 104
    typed(roce_nic_dscp=46, roce_nic_tos=186)
    typed(roce_nic_trust="pcp", roce_nic_dscp=46)


# -- the commands, against the real tools' syntax ------------------------------------------------

S = R.settings(typed())
CONNECTX = R.Nic("ens6np0", 9000, "mlx5_0", "connectx")
THOR2 = R.Nic("ens26np0", 9000, "bnxt_re0", "thor2")


def mlnx_qos_parser() -> optparse.OptionParser:
    """The options of mlnx_qos that the role uses, declared as mlnx-tools declares them."""
    parser = optparse.OptionParser()
    parser.add_option("-i", "--interface", dest="intf")
    parser.add_option("--trust", dest="trust")
    parser.add_option("-f", "--pfc", dest="pfc", metavar="LIST")
    parser.add_option("--dscp2prio", dest="dscp2prio", action="append")
    return parser


def test_connectx_steps() -> None:
    steps = R.plan(CONNECTX, S)
    assert [s.what for s in steps] == [
        "MTU of ens6np0",
        "trust and PFC of ens6np0",
        "DSCP priorities of ens6np0",
        "rdma_cm defaults of mlx5_0",
        "ECN of ens6np0 priority 3",
    ]
    argv = shlex.split(steps[1].command)
    assert argv[0] == "mlnx_qos"
    options, args = mlnx_qos_parser().parse_args(argv[1:])
    assert args == []  # mlnx_qos refuses extra arguments ("Bad arguments")
    assert (options.intf, options.trust) == ("ens6np0", "dscp")
    assert [int(x) for x in options.pfc.split(",")] == [0, 0, 0, 1, 0, 0, 0, 0]
    assert steps[1].want == "trust dscp, pfc 0,0,0,1,0,0,0,0"

    # AMD's network guide (nic-installation.md, "PFC Enable"): --dscp2prio set,26,3 and
    # set,48,7; mlnx_qos refuses --trust and --dscp2prio in one call.
    options, args = mlnx_qos_parser().parse_args(shlex.split(steps[2].command)[1:])
    assert (args, options.intf, options.trust) == ([], "ens6np0", None)
    assert options.dscp2prio == ["set,26,3", "set,48,7"]
    assert steps[2].want == "dscp2prio 26:3 48:7"

    tos = steps[3]
    assert tos.command == (
        "mkdir -p /sys/kernel/config/rdma_cm/mlx5_0 && "
        "printf '%s\\n' 'RoCE v2' > /sys/kernel/config/rdma_cm/mlx5_0/ports/1/default_roce_mode && "
        "printf '%s\\n' 106 > /sys/kernel/config/rdma_cm/mlx5_0/ports/1/default_roce_tos"
    )
    assert tos.want == "default_roce_mode RoCE v2, default_roce_tos 106"

    ecn = steps[4]
    paths = [p for _, p in ecn.attributes]
    assert paths == [
        "/sys/class/net/ens6np0/ecn/roce_np/enable/3",
        "/sys/class/net/ens6np0/ecn/roce_rp/enable/3",
        "/sys/class/net/ens6np0/ecn/roce_np/cnp_dscp",
        "/sys/class/net/ens6np0/ecn/roce_np/cnp_802p_prio",
    ]
    assert ecn.want == "roce_np 1, roce_rp 1, cnp_dscp 48, cnp_802p_prio 7"
    assert all(f"> {p}" in ecn.command for p in paths)
    assert ecn.requires and ecn.requires[2] == "mlx5_core"


def cc_writes(step: Any) -> list[tuple[str, str]]:
    """(attribute, value) of a bnxt_re congestion-control command, after its mkdir."""
    parts = step.command.split(" && ")
    assert parts[0] == "mkdir -p /sys/kernel/config/bnxt_re/bnxt_re0"
    base = "/sys/kernel/config/bnxt_re/bnxt_re0/ports/1/cc/"
    found = [re.fullmatch(r"printf '%s' (\S+) > (\S+)", c).groups() for c in parts[1:]]  # type: ignore[union-attr]
    assert all(path.startswith(base) for _, path in found)
    return [(path.removeprefix(base), value) for value, path in found]


def test_thor2_steps_as_bnxt_setupcc() -> None:
    """bnxt_setupcc.sh (Hinokami-Kagura/bnxt_re-ofed at 1ba6eeea; lykeioner/driver at be704352,
    version 233.2.77.9, with -u 4 its dcb path), CNP service type 0: ethtool -A IF rx off tx off;
    dcb ets set with tc-tsa 0:ets 1:ets, tc-bw 0:L2 1:RoCE, prio-tc RoCE priority -> 1; dcb pfc
    on the RoCE priority; dcb app dgram-port-prio 4791:PRIO and dscp-prio DSCP:PRIO; rdma_cm ToS
    DSCP << 2; bnxt_re cc: ecn_marking, ecn_enable, cc_mode, cnp_prio, roce_prio, roce_dscp,
    cnp_dscp (written in hexadecimal), apply."""
    steps = R.plan(THOR2, S)
    assert [s.kind for s in steps] == [
        "mtu",
        "pause",
        "dcb_ets",
        "dcb_pfc",
        "dcb_app",
        "attributes",
        "bnxt_cc",
    ]
    assert shlex.split(steps[1].command) == ["ethtool", "-A", "ens26np0", "rx", "off", "tx", "off"]
    argv = shlex.split(steps[2].command)
    assert argv[:5] == ["dcb", "ets", "set", "dev", "ens26np0"]
    words = " ".join(argv[5:])
    assert "tc-tsa 0:ets 1:ets tc-bw" in words and "tc-bw 0:50 1:50" in words
    assert "prio-tc 0:0 1:0 2:0 3:1 4:0 5:0 6:0 7:0" in words
    argv = shlex.split(steps[3].command)
    assert argv[:5] == ["dcb", "pfc", "set", "dev", "ens26np0"] and argv[5] == "prio-pfc"
    mapping = dict(item.split(":") for item in argv[6:])
    assert mapping == {str(p): "on" if p == 3 else "off" for p in range(8)}
    # dcb app { add | del | replace } dev DEV dgram-port-prio PORT:PRIO dscp-prio DSCP:PRIO
    assert shlex.split(steps[4].command) == [
        "dcb",
        "app",
        "replace",
        "dev",
        "ens26np0",
        "dgram-port-prio",
        "4791:3",
        "dscp-prio",
        "26:3",
    ]
    assert steps[5].want == "default_roce_mode RoCE v2, default_roce_tos 104"  # 26 << 2
    assert cc_writes(steps[6]) == [
        ("ecn_marking", "0x1"),
        ("ecn_enable", "0x1"),
        ("cc_mode", "0x1"),
        ("cnp_prio", "0x7"),
        ("roce_prio", "0x3"),
        ("roce_dscp", "0x1a"),
        ("cnp_dscp", "0x30"),
        ("apply", "0x1"),
    ]


def test_thor2_with_the_cnp_service_type() -> None:
    """Service type 1 (the firmware owns the priorities and DSCPs of RoCE and CNPs: bnxt_re
    refuses roce_prio and cnp_prio then, configfs.c): ETS with a strict class 2 for CNPs, their
    DSCP in the application table, and no bnxt_re congestion-control writes at all (233.2.77.9:
    `if [ "$CNP_SERVICE_TYPE" == "0" ]` around them)."""
    thor2 = R.Nic("ens26np0", 9000, "bnxt_re0", "thor2", service_type=1)
    steps = R.plan(thor2, S)
    assert [s.kind for s in steps] == [
        "mtu",
        "pause",
        "dcb_ets",
        "dcb_pfc",
        "dcb_app",
        "attributes",
    ]
    assert steps[2].want == (
        "prio-tc 0:0 1:0 2:0 3:1 4:0 5:0 6:0 7:2 tc-tsa 0:ets 1:ets 2:strict tc-bw 0:50 1:50"
    )
    assert steps[4].want == "dgram-port-prio 4791:3 dscp-prio 26:3 48:7"
    off = R.plan(thor2, R.settings(typed(roce_nic_ecn=False)))
    assert off[2].want.endswith("7:0 tc-tsa 0:ets 1:ets 2:strict tc-bw 0:50 1:50")
    assert off[4].want == "dgram-port-prio 4791:3 dscp-prio 26:3"


def test_ecn_off_and_other_priorities() -> None:
    s = R.settings(
        typed(roce_nic_ecn=False, roce_nic_pfc_priority=4, roce_nic_dscp=34, roce_nic_tos=136)
    )
    connectx = R.plan(CONNECTX, s)
    assert "--pfc=0,0,0,0,1,0,0,0" in connectx[1].command
    assert connectx[2].want == "dscp2prio 34:4 48:7"
    assert connectx[4].want.startswith("roce_np 0, roce_rp 0")
    assert "/enable/4" in connectx[4].command
    thor2 = R.plan(THOR2, s)
    assert thor2[6].want == "ecn_marking 0, ecn_enable 0, cnp_prio 0x7, roce_prio 0x4, " + (
        "roce_dscp 0x22, cnp_dscp 0x30"
    )
    assert thor2[4].want == "dgram-port-prio 4791:4 dscp-prio 34:4"
    assert "3:0 4:1" in thor2[2].want
    pcp = R.settings(typed(roce_nic_trust="pcp"))
    assert R.plan(THOR2, pcp)[4].want == "dgram-port-prio 4791:3"
    assert "mlnx_dscp" not in [step.kind for step in R.plan(CONNECTX, pcp)]
    assert "--trust=pcp" in R.plan(CONNECTX, pcp)[1].command
    wide = R.settings(typed(roce_nic_roce_bandwidth=80))
    assert R.plan(THOR2, wide)[2].want.endswith("tc-bw 0:20 1:80")


@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare (util-linux)")
def test_the_mtu_step_sets_the_mtu_for_real(tmp_path: Path) -> None:
    """The MTU step as the boot script runs it, by the real ip on a veth in a network namespace
    of its own (with its own sysfs, where the MTU reads back); then the NetInterface fact there."""
    mtu = R.plan(CONNECTX, S)[0]
    script = tmp_path / "fxkit-roce-nic"
    script.write_text(
        render("fxkit-roce-nic.sh.j2", nics=[CONNECTX], plans={"ens6np0": [mtu]}, q=shlex.quote)
    )
    fact = NetInterface().command("ens6np0")
    inside = (
        "mount -t sysfs sysfs /sys && ip link add ens6np0 type veth peer name fxpeer0 && "
        f"sh {shlex.quote(str(script))} && {fact}"
    )
    run = subprocess.run(
        ["unshare", "--net", "--mount", "sh", "-c", inside],
        capture_output=True,
        text=True,
        timeout=30,
    )
    if run.returncode and "Operation not permitted" in run.stderr:
        pytest.skip(f"no network namespaces here: {run.stderr.strip()}")
    assert run.returncode == 0, run.stderr
    info = NetInterface().parse(RunResult(fact, 0, run.stdout, ""), "ens6np0")
    assert (info.mtu, info.driver, info.missing) == (9000, "", "")  # a veth: no device driver


def test_the_rdma_mtu_the_kernel_derives() -> None:
    # iboe_get_mtu: interface MTU minus 96 bytes of RoCEv2 headers, rounded down to an IB MTU.
    assert [R.ib_mtu(m) for m in (9000, 4192, 4191, 1500, 1280)] == [4096, 4096, 2048, 1024, 1024]


# -- converge and verify, the role's own operations ----------------------------------------------


def test_converge_writes_only_what_differs_and_reads_it_back(tmp_path: Path) -> None:
    """The generic step on real files (attributes kind): check mode writes nothing, apply
    writes and reads back, the second run is ok; a value that does not stick fails."""
    first, second = tmp_path / "tos", tmp_path / "mode"
    first.write_text("0\n")
    step = R.Step(
        "rdma_cm defaults of t0",
        "tos 106, mode RoCE v2",
        f"printf '106\\n' > {first} && printf 'RoCE v2\\n' > {second}",
        "attributes",
        "t0",
        (("tos", str(first)), ("mode", str(second))),
    )
    conn = LocalConnection("localhost")
    checking = OpContext(conn, FactCache(conn), check=True, diff=True)
    result = R.converge(checking, step)
    assert (
        result.changed and result.msg == "would set rdma_cm defaults of t0 to tos 106, mode RoCE v2"
    )
    assert result.diff == "rdma_cm defaults of t0: tos 0, mode unset -> tos 106, mode RoCE v2\n"
    assert first.read_text() == "0\n" and not second.exists()
    ctx = OpContext(conn, FactCache(conn))
    assert R.converge(ctx, step).changed
    assert (first.read_text(), second.read_text()) == ("106\n", "RoCE v2\n")
    assert R.converge(ctx, step).status is Status.OK
    stubborn = R.Step("t1", "tos 106", "true", "attributes", "t1", (("tos", str(tmp_path / "x")),))
    failure = R.converge(ctx, stubborn)
    assert failure.failed and failure.msg == "t1: wanted tos 106, found tos unset after `true`"


def test_each_step_names_what_this_machine_lacks() -> None:
    """The requirements, read on this machine (no RDMA NIC, no configfs): each step says why
    it cannot run, from the real tools and paths."""
    conn = LocalConnection("localhost")
    host = Host(
        OpContext(conn, FactCache(conn)), hostvars(), role=ROLE, play="p", recorder=Recorder()
    )
    lo_connectx = R.Nic("lo", 9000, "mlx5_0", "connectx")
    lo_thor2 = R.Nic("lo", 9000, "bnxt_re0", "thor2")
    reasons = [R.requirement(host, step) for step in R.plan(lo_connectx, S)]
    assert reasons[0] == ""  # the MTU: ip is everywhere
    if shutil.which("mlnx_qos") is None:
        assert reasons[1] == reasons[2] == "mlnx_qos not found (install MLNX_OFED or DOCA-OFED)"
    assert reasons[3] == (
        "no /sys/kernel/config/rdma_cm (configfs not mounted or the rdma_cm module not loaded)"
    )
    # The ECN attributes: which mlx5_core is loaded (none on this machine).
    assert reasons[4] == (
        "no /sys/class/net/lo/ecn (the mlx5 ECN attributes come with MLNX_OFED/DOCA-OFED's "
        "mlx5_core; loaded: no mlx5_core)"
    )
    reasons = [R.requirement(host, step) for step in R.plan(lo_thor2, S)]
    if shutil.which("ethtool"):
        assert "lo has no pause frame settings" in reasons[1]
    else:
        assert reasons[1] == "ethtool not found (install ethtool)"
    if shutil.which("dcb"):
        assert (
            reasons[2]
            == reasons[3]
            == reasons[4]
            == ("lo has no DCB support (dcb: Operation not supported)")
        )
    assert reasons[6].startswith("no /sys/kernel/config/bnxt_re: its congestion control comes ")
    assert "(loaded: no bnxt_re; or configfs is not mounted)" in reasons[6]


class RecordedHost(Connection):
    """A host that answers the facts' exact commands with recorded outputs (as a host with those
    devices prints them); any other command fails. For the verification's logic only."""

    name, user = "gpu01", "root"

    def __init__(self, answers: dict[str, str]):
        self.answers = answers

    def open(self) -> None: ...

    def close(self) -> None: ...

    def run(self, command: str, **kwargs: Any) -> RunResult:
        if command not in self.answers:
            return RunResult(command, 127, "", "not recorded")
        return RunResult(command, 0, f"{SEPARATOR}\n{self.answers[command]}", "")

    def get(self, path: str, *, become: bool = False) -> bytes | None:
        return None


def recorded(device: str, netdev: str, state: str, mtu: int, gid3: str) -> RecordedHost:
    """rdma link in the reference's line format; ibv_devinfo the ConnectX-7 reference itself
    (rocep1s0f1: PORT_ACTIVE, active_mtu 4096; rocep1s0f0: PORT_DOWN, active_mtu 1024)."""
    link = f"link {device}/1 state {state} physical_state LINK_UP netdev {netdev}\n"
    return RecordedHost(
        {
            RdmaLink().command(): link,
            IbvDevinfo().command(): (REFERENCE / "ibv_devinfo_connectx7_roce.txt").read_text(),
            NetInterface().command(netdev): f"mtu={mtu}\noperstate=up\ndriver=mlx5_core\n",
            GidTypes().command(device, 1): f"0\tIB/RoCE v1\n1\tRoCE v2\n3\t{gid3}\n",
        }
    )


def test_verify_passes_on_an_active_roce_port() -> None:
    host = recorded("rocep1s0f1", "ens1f1np1", "ACTIVE", 9000, "RoCE v2")
    nic = R.Nic("ens1f1np1", 9000, "rocep1s0f1", "connectx")
    result = R.verify(OpContext(host, FactCache(host)), [nic], 3, True)
    assert result.status is Status.OK, result.msg
    assert result.msg.startswith("rocep1s0f1/1 (ens1f1np1): ACTIVE, Ethernet")


def test_verify_names_device_wanted_and_found() -> None:
    host = recorded("rocep1s0f0", "ens1f0np0", "DOWN", 1500, "IB/RoCE v1")
    nic = R.Nic("ens1f0np0", 9000, "rocep1s0f0", "connectx")
    result = R.verify(OpContext(host, FactCache(host)), [nic], 3, True)
    assert result.failed
    assert result.msg.split(": ", 1)[1].split("; ") == [
        "rocep1s0f0/1 (ens1f0np0): wanted state ACTIVE, found DOWN (rdma link)",
        "ens1f0np0: wanted MTU 9000, found 1500 (/sys/class/net/ens1f0np0/mtu)",
        "rocep1s0f0: wanted active_mtu 4096 for interface MTU 9000, found 1024 (ibv_devinfo)",
        "rocep1s0f0: wanted GID 3 of type RoCE v2 (roce_nic_gid_index), found IB/RoCE v1",
    ]
    checking = OpContext(host, FactCache(host), check=True)
    assert R.verify(checking, [nic], 3, True).status is Status.SKIPPED


# -- the rendered files ---------------------------------------------------------------------------


class FakeRole:
    templates = ROLE_DIR / "templates"


class FakeHost:
    role = FakeRole


def render(template: str, **context: Any) -> str:
    return R.render(FakeHost, template, **context)


def test_the_boot_script_runs_the_plan_commands_in_order(tmp_path: Path) -> None:
    missing = R.Nic("ens9np0", 9000, missing="rdma not found (install iproute2)")
    nics = [CONNECTX, THOR2, missing]
    plans = {n.name: R.plan(n, S) for n in nics if not n.missing}
    text = render("fxkit-roce-nic.sh.j2", nics=nics, plans=plans, q=shlex.quote)
    script = tmp_path / "fxkit-roce-nic"
    script.write_text(text)
    assert subprocess.run(["sh", "-n", str(script)], capture_output=True).returncode == 0
    lines = [re.fullmatch(r"\{ (.*); \} \|\| failed (.*)", line) for line in text.splitlines()]
    runs = [(shlex.split(m.group(2))[0], m.group(1)) for m in lines if m]
    wanted = [step for n in nics if not n.missing for step in plans[n.name]]
    assert runs == [(s.what, s.command) for s in wanted]
    assert "# not configured when this was written: rdma not found (install iproute2)" in text


def test_the_boot_script_reports_a_failed_step_and_runs_the_others(tmp_path: Path) -> None:
    """The script itself, run: a failing command (no such interface here) is reported, the next
    one still runs, and the exit status is 1."""
    marker = tmp_path / "ran"
    nic = R.Nic("fxnone0", 9000, "mlx5_0", "connectx")
    plans = {
        "fxnone0": [
            R.Step("first", "", "false", "mtu", "x"),
            R.Step("second", "", f"touch {marker}", "mtu", "x"),
        ]
    }
    script = tmp_path / "s"
    script.write_text(render("fxkit-roce-nic.sh.j2", nics=[nic], plans=plans, q=shlex.quote))
    run = subprocess.run(["sh", str(script)], capture_output=True, text=True)
    assert run.returncode == 1
    assert run.stderr == "fxkit-roce-nic: first failed\n"
    assert marker.exists()


def test_the_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed")
    script = tmp_path / "fxkit-roce-nic"
    script.write_text("#!/bin/sh\nexit 0\n")
    script.chmod(0o755)
    devices = [R.unit_device("ens6np0"), R.unit_device("eth-1.5")]
    assert devices[1] == "sys-subsystem-net-devices-eth\\x2d1.5.device"
    unit = tmp_path / "fxkit-roce-nic.service"
    unit.write_text(render("fxkit-roce-nic.service.j2", script=str(script), devices=devices))
    run = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", str(unit)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    problems = [line for line in (run.stdout + run.stderr).splitlines() if "fxkit-roce-nic" in line]
    assert run.returncode == 0 and not problems, run.stdout + run.stderr
    text = unit.read_text()
    assert "Type=oneshot" in text and f"ExecStart={script}" in text
    assert "Wants=sys-subsystem-net-devices-ens6np0.device" in text


def test_the_rccl_environment() -> None:
    text = render("roce-nic.env.j2", s=S, tos=106, devices=["mlx5_0", "mlx5_1"])
    assert text.splitlines()[2:] == [
        "NCCL_IB_TC=106",
        "NCCL_IB_GID_INDEX=3",
        "NCCL_IB_HCA=mlx5_0,mlx5_1",
    ]
    assert "NCCL_IB_HCA" not in render("roce-nic.env.j2", s=S, tos=106, devices=[])


# -- real runs on lab hosts -----------------------------------------------------------------------

TREES = "/etc /usr/local /var/lib"
#: Not ctime: on this shared machine the lab hosts' /etc files see ctime changes with nothing
#: running on them (measured: ~300 files every few seconds), so mode, size, mtime and content.
PLAYBOOK = "- hosts: all\n  roles: [roce_nic]\n"
FILES = (
    "/usr/local/sbin/fxkit-roce-nic",
    "/etc/systemd/system/fxkit-roce-nic.service",
    "/etc/fxkit/roce-nic.env",
)


def snapshot(fleet: Fleet, host: str) -> str:
    with fleet.connect(host) as conn:
        result = conn.run(
            f"find {TREES} -xdev -printf '%p %y %m %s %T@\\n' | LC_ALL=C sort; "
            f"find {TREES} -xdev -type f -size -1M -exec sha256sum {{}} + | LC_ALL=C sort"
        )
    assert result.ok, result.stderr
    return result.stdout


def play(folder: Path, fleet: Fleet, *args: str, **hostvars: Any) -> list[dict]:
    """fxkit play in this process; the JSON log's task events."""
    from click.testing import CliRunner

    from fxkit.cli import cli

    inventory = yaml.safe_load(fleet.inventory.read_text())
    # The lab group's vars: they win over all's (the group says fxkit_lab: true).
    inventory["all"]["children"]["lab"].setdefault("vars", {}).update(
        {"roce_nic_interfaces": ["ens6np0", {"name": "ens26np0", "device": "bnxt_re0"}]}, **hostvars
    )
    (folder / "inventory.yml").write_text(yaml.safe_dump(inventory))
    (folder / "site.yml").write_text(PLAYBOOK)
    log = folder / "log.jsonl"
    log.unlink(missing_ok=True)
    result = CliRunner().invoke(
        cli,
        [
            "play",
            str(folder / "site.yml"),
            "-i",
            str(folder / "inventory.yml"),
            "-l",
            "lab01",
            "--log-json",
            str(log),
            *args,
        ],
        catch_exceptions=False,
    )
    events = [json.loads(line) for line in log.read_text().splitlines()]
    tasks = [e for e in events if e["event"] == "task"]
    assert tasks, result.output
    return tasks


def statuses(tasks: list[dict]) -> dict[str, int]:
    found: dict[str, int] = {}
    for task in tasks:
        found[task["status"]] = found.get(task["status"], 0) + 1
    return found


@pytest.mark.lab
def test_a_plain_lab_host_gets_the_files_and_skips_every_hardware_step(
    lab_fleet, tmp_path: Path
) -> None:
    fleet = lab_fleet(1, name="roce")
    before = snapshot(fleet, "lab01")
    checked = play(tmp_path, fleet, "--check", fxkit_lab=True)
    assert snapshot(fleet, "lab01") == before  # check mode changed nothing
    assert not [t for t in checked if t["status"] == "failed"]
    assert {t["operation"] for t in checked if t["status"] == "changed"} >= {
        f"template {f}" for f in ("/usr/local/sbin/fxkit-roce-nic", "/etc/fxkit/roce-nic.env")
    }

    first = play(tmp_path, fleet, fxkit_lab=True)
    assert not [t for t in first if t["status"] == "failed"], first
    skips = {t["operation"]: t["msg"] for t in first if t["status"] == "skipped"}
    for name in ("ens6np0", "ens26np0"):
        reason = skips[f"RoCE on {name}"]
        assert reason.startswith(f"RoCE on {name}: ")
        assert "rdma" in reason.lower()  # no rdma tool, or no RDMA in this kernel/netns
    assert skips["verify RoCE"] == "verify RoCE: no interface could be configured (see above)"
    assert "systemd is not running" in skips["service fxkit-roce-nic.service"]
    changed = {t["operation"] for t in first if t["status"] == "changed"}
    assert {
        f"template {FILES[0]}",
        f"template {FILES[2]}",
        f"unit {FILES[1].rsplit('/')[-1]}",
    } <= changed
    # no hardware step reported ok or changed: only the files were
    hardware = [t for t in first if t["operation"].startswith(("MTU", "trust", "PFC", "ECN"))]
    assert hardware == []

    with fleet.connect("lab01") as conn:
        script = conn.run(f"cat {FILES[0]}; stat -c %a {FILES[0]}").stdout
        unit = conn.run(f"cat {FILES[1]}").stdout
    assert script.rstrip().endswith("755")
    assert "# not configured when this was written:" in script
    assert "ExecStart=/usr/local/sbin/fxkit-roce-nic" in unit
    assert "Wants=sys-subsystem-net-devices-ens26np0.device" in unit

    again = play(tmp_path, fleet, fxkit_lab=True)
    assert statuses(again).get("changed", 0) == 0, [t for t in again if t["status"] == "changed"]
    assert statuses(again)["skipped"] == statuses(first)["skipped"]


@pytest.mark.lab
def test_a_host_not_marked_as_lab_fails_with_the_reason(lab_fleet, tmp_path: Path) -> None:
    fleet = lab_fleet(1, name="roce-real")  # a fresh host: nothing of the role there yet
    before = snapshot(fleet, "lab01")
    tasks = play(tmp_path, fleet, fxkit_lab=False)
    assert snapshot(fleet, "lab01") == before  # it stopped before changing anything
    assert [t["status"] for t in tasks] == ["failed"]
    failures = [t for t in tasks if t["status"] == "failed"]
    assert len(failures) == 1
    assert failures[0]["msg"].startswith("RoCE on ens6np0: ")
    assert "not marked as a lab host" in failures[0]["msg"]


@pytest.mark.lab
def test_on_an_mi308x_lab_host_the_ecn_step_runs_for_real(lab_fleet, tmp_path: Path) -> None:
    """The simulated ConnectX netdevs have the mlx5 ECN attributes (docs/lab.md): the ECN step
    writes them, and the trust and PFC step runs the mlnx_qos stand-in."""
    fleet = lab_fleet(1, name="roce-mi308x", profile="mi308x")
    ecn = "ECN of ens6np0 priority 3"
    first = play(tmp_path, fleet, roce_nic_interfaces=["ens6np0"])
    assert not [t for t in first if t["status"] == "failed"], first
    assert {t["operation"]: t["status"] for t in first}[ecn] == "changed"
    again = play(tmp_path, fleet, roce_nic_interfaces=["ens6np0"])
    assert {t["operation"]: t["status"] for t in again}[ecn] == "ok"
    assert statuses(again).get("changed", 0) == 0, [t for t in again if t["status"] == "changed"]
    with fleet.connect("lab01") as conn:
        folder = "/sys/class/net/ens6np0/ecn"
        values = conn.run(
            f"cat {folder}/roce_np/enable/3 {folder}/roce_rp/enable/3 "
            f"{folder}/roce_np/cnp_dscp {folder}/roce_np/cnp_802p_prio"
        ).stdout.split()
        assert values == ["1", "1", "48", "7"]
        qos = [c["argv"] for c in calls(conn) if c["argv"][0] == "mlnx_qos"]
    assert ["mlnx_qos", "-i", "ens6np0", "--trust=dscp", "--pfc=0,0,0,1,0,0,0,0"] in qos
    assert ["mlnx_qos", "-i", "ens6np0"] in qos  # the read before it and after


# -- each setting on lab hosts of both NIC vendors ------------------------------------------------

#: What the stand-ins change: their state (/var/lib/fxkit-lab), the configfs stand-in (rdma_cm,
#: bnxt_re) and, on the ConnectX profile, the mlx5 ECN attributes (a tmpfs of their own).
HARDWARE = "/sys/kernel/config /sys/devices/virtual/net/ens6np0/ecn"
THOR2_STEPS = (
    "MTU of ens26np0",
    "global pause of ens26np0",
    "ETS of ens26np0",
    "PFC of ens26np0",
    "DCB apps of ens26np0",
    "rdma_cm defaults of bnxt_re0",
    "congestion control of bnxt_re0",
)
CONNECTX_STEPS = (
    "MTU of ens6np0",
    "trust and PFC of ens6np0",
    "DSCP priorities of ens6np0",
    "rdma_cm defaults of mlx5_0",
    "ECN of ens6np0 priority 3",
)


def hardware(fleet: Fleet, host: str) -> str:
    """The stand-ins' state and the simulated sysfs/configfs files, with their content."""
    with fleet.connect(host) as conn:
        result = conn.run(
            f"for d in {HARDWARE} /var/lib/fxkit-lab; do [ ! -d $d ] || "
            'find $d -xdev -type f -exec sh -c \'printf "%s=%s\\n" "$1" "$(cat "$1")"\' '
            "_ {} \\; ; done | LC_ALL=C sort"
        )
    assert result.ok, result.stderr
    return result.stdout


def unchanged(before: str, after: str) -> None:
    """``after`` is ``before``; else the lines that differ."""
    diff = difflib.unified_diff(before.splitlines(), after.splitlines(), lineterm="", n=0)
    assert before == after, "\n".join(list(diff)[:40])


def by_operation(tasks: list[dict]) -> dict[str, str]:
    return {t["operation"]: t["status"] for t in tasks}


def converges(fleet: Fleet, folder: Path, steps: tuple[str, ...], **hostvars: Any) -> None:
    """Check mode changes nothing and reports each step; a run changes each step and reads it
    back (a value that does not read back fails the step); a second run changes nothing."""
    before = snapshot(fleet, "lab01") + hardware(fleet, "lab01")
    checked = by_operation(play(folder, fleet, "--check", **hostvars))
    unchanged(before, snapshot(fleet, "lab01") + hardware(fleet, "lab01"))
    assert [checked[s] for s in steps] == ["changed"] * len(steps), checked
    first = by_operation(play(folder, fleet, **hostvars))
    assert [first[s] for s in steps] == ["changed"] * len(steps), first
    assert first["verify RoCE"] == "ok"
    again = play(folder, fleet, **hostvars)
    assert statuses(again).get("changed", 0) == 0, [t for t in again if t["status"] == "changed"]
    assert [by_operation(again)[s] for s in steps] == ["ok"] * len(steps)


def reads_and_writes(conn: Connection, tool: str) -> list[list[str]]:
    return [c["argv"] for c in calls(conn) if c["argv"][0] == tool]


@pytest.mark.lab
def test_thor2_lab_host_as_bnxt_setupcc(lab_fleet, tmp_path: Path) -> None:
    """A Thor2 node (profile mi308x-thor2): every setting is read, changed, read back; then
    other values change only the settings they touch; the stand-ins' state shows them."""
    fleet = lab_fleet(1, name="roce-thor2", profile="mi308x-thor2")
    converges(fleet, tmp_path, THOR2_STEPS, roce_nic_interfaces=["ens26np0"])
    with fleet.connect("lab01") as conn:
        ethtool = reads_and_writes(conn, "ethtool")
        dcb = reads_and_writes(conn, "dcb")
        cc = "/sys/kernel/config/bnxt_re/bnxt_re0/ports/1/cc"
        values = conn.run(
            f"cd {cc} && for f in ecn_marking ecn_enable cc_mode cnp_prio roce_prio roce_dscp "
            "cnp_dscp apply; do printf '%s ' $(cat $f); done; "
            "cat /sys/kernel/config/rdma_cm/bnxt_re0/ports/1/default_roce_tos"
        ).stdout.split()
        ets = json.loads(conn.run("dcb -j ets show dev ens26np0").stdout)
        app = json.loads(conn.run("dcb -j app show dev ens26np0").stdout)
        pause = conn.run("ethtool -a ens26np0").stdout
    # read, set once, read back
    writes = [argv for argv in ethtool if argv[1] == "-A"]
    assert writes == [["ethtool", "-A", "ens26np0", "rx", "off", "tx", "off"]]
    assert ethtool.index(writes[0]) > 0 and ethtool[-1] == ["ethtool", "-a", "ens26np0"]
    ets_set = [argv for argv in dcb if argv[1:3] == ["ets", "set"]]
    assert len(ets_set) == 1 and dcb[dcb.index(ets_set[0]) + 1][1:4] == ["-j", "ets", "show"]
    assert "RX:\t\toff\nTX:\t\toff" in pause
    assert (ets["tc_tsa"][:2], ets["tc_bw"][:2], ets["prio_tc"]) == (
        ["ets", "ets"],
        [50, 50],
        [0, 0, 0, 1, 0, 0, 0, 0],
    )
    assert app == {"dscp_prio": [[26, 3, " "]], "dgram_port_prio": [[4791, 3, " "]]}
    assert values == ["0x1", "0x1", "0x1", "0x7", "0x3", "0x1a", "0x30", "0x1", "104"]

    # Other values: what they do not touch stays (the pause, the MTU, ecn_marking...).
    moved = by_operation(
        play(
            tmp_path,
            fleet,
            roce_nic_interfaces=["ens26np0"],
            roce_nic_pfc_priority=4,
            roce_nic_dscp=34,
            roce_nic_roce_bandwidth=60,
        )
    )
    assert [moved[s] for s in THOR2_STEPS] == ["ok", "ok", *["changed"] * 5], moved
    with fleet.connect("lab01") as conn:
        app = json.loads(conn.run("dcb -j app show dev ens26np0").stdout)
        tos = conn.run("cat /sys/kernel/config/rdma_cm/bnxt_re0/ports/1/default_roce_tos").stdout
    # replace: 4791 moves to priority 4; DSCP 34 is added beside the earlier 26
    assert app["dgram_port_prio"] == [[4791, 4, " "]] and [34, 4, " "] in app["dscp_prio"]
    assert tos.strip() == "136"  # 34 << 2


@pytest.mark.lab
def test_connectx_lab_host_dscp2prio_and_the_rest(lab_fleet, tmp_path: Path) -> None:
    """A ConnectX node (profile mi308x): trust and PFC, the RoCE and CNP DSCPs' priorities
    (the default map put DSCP 48 on priority 6), the rdma_cm ToS 106, ECN: each read, changed,
    read back; check mode and a second run change nothing."""
    fleet = lab_fleet(1, name="roce-connectx", profile="mi308x")
    with fleet.connect("lab01") as conn:
        conn.run("mlnx_qos -i ens6np0 --trust=dscp")  # the default map, as mlx5 shows it
        default = MlnxQos().parse(conn.run(MlnxQos().command("ens6np0")), "ens6np0")
    assert default.dscp2prio and (default.dscp2prio[26], default.dscp2prio[48]) == (3, 6)
    converges(fleet, tmp_path, CONNECTX_STEPS[2:], roce_nic_interfaces=["ens6np0"])
    with fleet.connect("lab01") as conn:
        qos = MlnxQos().parse(conn.run(MlnxQos().command("ens6np0")), "ens6np0")
        text = conn.run("mlnx_qos -i ens6np0").stdout
        tos = conn.run("cat /sys/kernel/config/rdma_cm/mlx5_0/ports/1/default_roce_tos").stdout
        qos_calls = reads_and_writes(conn, "mlnx_qos")
    assert qos.dscp2prio and (qos.dscp2prio[26], qos.dscp2prio[48]) == (3, 7)
    assert "  prio:7 dscp:48,63,62,61,60,59,58,57,\n        prio:7 dscp:56," in text
    assert tos.strip() == "106"
    sets = [a for a in qos_calls if "--dscp2prio" in a]
    assert sets == [
        ["mlnx_qos", "-i", "ens6np0", "--dscp2prio", "set,26,3", "--dscp2prio", "set,48,7"]
    ]


@pytest.mark.lab
@pytest.mark.parametrize(
    "profile, values, words",
    [
        ("mi308x-thor2", {"roce_nic_tos": 108}, "carries DSCP 27, but roce_nic_dscp is 26"),
        ("mi308x", {"roce_nic_cnp_dscp": 26}, "is also the RoCE DSCP"),
    ],
)
def test_a_wrong_variable_is_refused_before_any_host_is_touched(
    lab_fleet, tmp_path: Path, profile: str, values: dict, words: str
) -> None:
    from click.testing import CliRunner

    from fxkit.cli import cli

    fleet = lab_fleet(1, name=f"roce-{profile}", profile=profile)
    before = snapshot(fleet, "lab01") + hardware(fleet, "lab01")
    with fleet.connect("lab01") as conn:
        logged = len(calls(conn))
    inventory = yaml.safe_load(fleet.inventory.read_text())
    inventory["all"]["children"]["lab"].setdefault("vars", {}).update(values)
    (tmp_path / "inventory.yml").write_text(yaml.safe_dump(inventory))
    (tmp_path / "site.yml").write_text(PLAYBOOK)
    with pytest.raises(VarError) as caught:
        CliRunner().invoke(
            cli,
            ["play", str(tmp_path / "site.yml"), "-i", str(tmp_path / "inventory.yml")],
            catch_exceptions=False,
        )
    assert words in caught.value.message and "lab01" in str(caught.value.where)
    unchanged(before, snapshot(fleet, "lab01") + hardware(fleet, "lab01"))
    with fleet.connect("lab01") as conn:
        assert len(calls(conn)) == logged  # no stand-in was even asked


@pytest.mark.lab
def test_thor2_with_the_kernels_own_bnxt_re_says_which_driver_is_loaded(
    lab_fleet, tmp_path: Path
) -> None:
    """Profile mi308x-thor2-inbox: bnxt_re loaded without a version, no bnxt_re configfs. On a
    lab host the congestion-control step is skipped naming the loaded driver and the one it
    needs (the dcb steps run: bnxt_en's DCB is the kernel's); a host not marked as a lab host
    fails with that reason before anything changes."""
    fleet = lab_fleet(1, name="roce-thor2-inbox", profile="mi308x-thor2-inbox")
    before = snapshot(fleet, "lab01") + hardware(fleet, "lab01")
    refused = play(tmp_path, fleet, roce_nic_interfaces=["ens26np0"], fxkit_lab=False)
    unchanged(before, snapshot(fleet, "lab01") + hardware(fleet, "lab01"))
    assert [t["status"] for t in refused] == ["failed"]
    assert refused[0]["msg"].startswith("congestion control of bnxt_re0: ")
    reason = (
        "no /sys/kernel/config/bnxt_re: its congestion control comes with Broadcom's "
        "out-of-tree bnxt_re (loaded: the kernel's own bnxt_re, which declares no version; "
        "or configfs is not mounted)"
    )
    assert reason in refused[0]["msg"] and "not marked as a lab host" in refused[0]["msg"]

    tasks = play(tmp_path, fleet, roce_nic_interfaces=["ens26np0"])
    done = by_operation(tasks)
    assert [done[s] for s in THOR2_STEPS[:-1]] == ["changed"] * 6
    skipped = {t["operation"]: t["msg"] for t in tasks if t["status"] == "skipped"}
    assert reason in skipped["congestion control of bnxt_re0"]
