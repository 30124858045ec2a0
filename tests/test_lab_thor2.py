"""The mi308x-thor2 lab profile (``fxkit lab up N --profile mi308x-thor2``): eight Broadcom Thor2
ports as AMD's network validation page lists them, Broadcom's out-of-tree bnxt_re (its version,
its configfs congestion control, its debugfs CNP service type), no mlx5 ECN attributes, and the
dcb and ethtool stand-ins, read through the facts roles/roce_nic uses.

References: rdma_link_bnxt_thor2_8x_amd.txt (ROCm/system-acceptance-docs docs/network/
validation.md, real `rdma link` output); the formats of dcb (iproute2 dcb/*.c at ee2a4a86) and of
`ethtool -a` (ethtool netlink/pause.c), for which no recorded Thor2 output was found.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from fxkit.connection.base import Connection, RunResult
from fxkit.facts.rdma import BnxtCc, DcbApp, DcbEts, DcbPfc, EthtoolPause, KernelModule
from fxkit.lab import CALL_LOG, Fleet

pytestmark = pytest.mark.lab

REFERENCE = Path(__file__).parent / "data" / "reference"
LINK = re.compile(r"^link (\S+)/(\d+) state (\S+) physical_state (\S+) netdev (\S+)\s*$")


@pytest.fixture(scope="module")
def thor2_fleet(lab_fleet) -> Fleet:
    return lab_fleet(1, name="thor2", profile="mi308x-thor2")


@pytest.fixture
def node(thor2_fleet: Fleet):
    """A root connection to the Thor2 host, its stand-ins' state and call log reset."""
    with thor2_fleet.connect("lab01") as conn:
        run(conn, f"rm -rf /var/lib/fxkit-lab {CALL_LOG}")
        yield conn


def run(conn: Connection, command: str, ok: bool = True) -> RunResult:
    result = conn.run(command)
    if ok:
        assert result.rc == 0, result
    return result


def test_rdma_link_is_amds_8_thor2_ports(node) -> None:
    real = [LINK.match(line).groups() for line in (REFERENCE / "rdma_link_bnxt_thor2_8x_amd.txt")
            .read_text().splitlines()]  # fmt: skip
    ours = [LINK.match(line).groups() for line in run(node, "rdma link").stdout.splitlines()]
    assert ours == real


def test_broadcoms_bnxt_re_and_no_mlx5_ecn(node) -> None:
    """The out-of-tree bnxt_re: its version, its congestion-control group with the driver's
    defaults (bnxt_re_init_cc_param, bnxt_re_setup_cc), service type 0 in its debugfs info."""
    module = KernelModule().parse(node.run(KernelModule().command("bnxt_re")), "bnxt_re")
    assert (module.loaded, module.version) == (True, "233.2.77.9")
    cc = BnxtCc().parse(node.run(BnxtCc().command("bnxt_re3")), "bnxt_re3")
    assert (cc.missing, cc.service_type, cc.driver_version) == ("", 0, "233.2.77.9")
    assert cc.values == {
        "ecn_marking": 1,
        "ecn_enable": 1,
        "cc_mode": 0,
        "cnp_prio": 7,
        "roce_prio": 3,
        "roce_dscp": 26,
        "cnp_dscp": 48,
    }
    assert run(node, "ls /sys/class/net/ens26np0/ecn", ok=False).rc != 0
    assert run(node, "ls /sys/module/mlx5_core", ok=False).rc != 0


def test_dcb_shows_and_sets_as_iproute2_does(node) -> None:
    ets = DcbEts().parse(node.run(DcbEts().command("ens26np0")), "ens26np0")
    assert (ets.tc_tsa, ets.tc_bw, ets.prio_tc) == (("strict",) * 8, (0,) * 8, (0,) * 8)
    # dcb_ets_validate_bw: an ETS class makes the shares sum to 100
    bad = run(node, "dcb ets set dev ens26np0 tc-tsa 0:ets tc-bw 0:60", ok=False)
    assert bad.rc != 0 and "sum to 60%, expected 100%" in bad.stderr
    run(node, "dcb ets set dev ens26np0 tc-tsa 0:ets 1:ets tc-bw 0:40 1:60 prio-tc 3:1")
    ets = DcbEts().parse(node.run(DcbEts().command("ens26np0")), "ens26np0")
    assert (ets.tc_tsa[:3], ets.tc_bw[:2], ets.prio_tc[3]) == (
        ("ets", "ets", "strict"),
        (40, 60),
        1,
    )
    run(node, "dcb pfc set dev ens26np0 prio-pfc all:off 3:on")
    assert DcbPfc().parse(node.run(DcbPfc().command("ens26np0")), "ens26np0").pfc == (
        0, 0, 0, 1, 0, 0, 0, 0
    )  # fmt: skip
    # add keeps other priorities of a protocol; replace drops them (dcb_app_table_remove_replaced)
    run(node, "dcb app add dev ens26np0 dscp-prio 26:2 48:7 dgram-port-prio 4791:2")
    run(node, "dcb app replace dev ens26np0 dscp-prio 26:3 dgram-port-prio 4791:3")
    app = DcbApp().parse(node.run(DcbApp().command("ens26np0")), "ens26np0")
    assert (app.table("dscp_prio"), app.table("dgram_port_prio")) == ({26: 3, 48: 7}, {4791: 3})
    text = run(node, "dcb app show dev ens26np0").stdout
    assert text.splitlines() == ["dscp-prio 26:3  48:7 ", "dgram-port-prio 4791:3 "]
    unknown = run(node, "dcb pfc show dev eth9", ok=False)
    assert unknown.rc != 0 and "eth9" in unknown.stderr
    sets = [c for c in node.run(f"cat {CALL_LOG}").stdout.splitlines() if '"set"' in c]
    assert len(sets) == 3  # the refused one is logged too


def test_ethtool_pause(node) -> None:
    pause = EthtoolPause().parse(node.run(EthtoolPause().command("ens26np0")), "ens26np0")
    assert (pause.autoneg, pause.rx, pause.tx, pause.simulated) == ("on", "on", "on", True)
    run(node, "ethtool -A ens26np0 rx off tx off")
    text = run(node, "ethtool -a ens26np0").stdout
    assert (
        text
        == "Pause parameters for ens26np0:\nAutonegotiate:\ton\nRX:\t\toff\nTX:\t\toff\n"
        + ("RX negotiated: off\nTX negotiated: off\n\n")
    )
    assert EthtoolPause().parse(node.run(EthtoolPause().command("ens27np0")), "ens27np0").rx == "on"
    assert run(node, "ethtool -A ens26np0 rx maybe", ok=False).rc != 0
    other = run(node, f"ethtool -i {shlex.quote('ens26np0')}", ok=False)
    assert other.rc != 0 and "answers -a and -A only" in other.stderr
    assert json.loads(run(node, "cat /var/lib/fxkit-lab/ethtool.json").stdout)["ens26np0"] == {
        "autoneg": "on",
        "rx": "off",
        "tx": "off",
    }
