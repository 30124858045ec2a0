"""RDMA facts (fxkit/facts/rdma.py) over every matching reference output, malformed output, and
the real tools of this machine.

Reference files (tests/data/reference/, copied from /work/shared/reference/; SOURCES.md):

- rdma_link_mi300x_8x_connectx.txt: real `rdma link` of an MI300X node with 8 ConnectX ports and
  a bond (public write-up of Megatron-LM on an MI300X node);
- rdma_link_bnxt_thor2.txt: `rdma link` with Broadcom Thor2 names (unit-test input of ROCm
  cluster validation code);
- ibv_devinfo_connectx7_roce.txt: real `ibv_devinfo` of a ConnectX-7 RoCE host (public write-up);
- mlnx_qos_trust_dscp_pfc3_output.txt: real `mlnx_qos` output inside the trace of a lossless
  set-up script (att/netarbiter nvmf/ output sample).

The JSON shapes (`rdma -j link`, `dcb -j pfc show`) are those iproute2 prints: rdma/link.c and
dcb/dcb_pfc.c at iproute2 ee2a4a86 (read with the search tool); the JSON inputs below are the
reference text outputs written in that shape, said so where they are built.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from fxkit.connection.base import RunResult
from fxkit.connection.local import LocalConnection
from fxkit.facts.base import FactCache, FactError
from fxkit.facts.lab import SEPARATOR
from fxkit.facts.rdma import (
    NOT_FOUND,
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
    RdmaPort,
    driver_family,
    parse_dcb_app,
    parse_dcb_ets,
    parse_dcb_pfc,
    parse_ethtool_pause,
    parse_gid_types,
    parse_ibv_devinfo,
    parse_mlnx_qos,
    parse_rdma_link_json,
    parse_rdma_link_text,
)

REFERENCE = Path(__file__).parent / "data" / "reference"
LAB = '{"lab": true, "profile": "mi308x"}\n'


def ref(name: str) -> str:
    return (REFERENCE / name).read_text()


def output(text: str, marker: str = "", rc: int = 0, stderr: str = "") -> RunResult:
    """What a fact's command prints: the lab marker, the separator, the tool's output."""
    return RunResult("cmd", rc, f"{marker}{SEPARATOR}\n{text}", stderr)


RDMA_LINK_FILES = sorted(p.name for p in REFERENCE.glob("rdma_link_*.txt"))


def test_every_rdma_link_reference_is_covered() -> None:
    assert RDMA_LINK_FILES == [
        "rdma_link_bnxt_thor2.txt",
        "rdma_link_bnxt_thor2_8x_amd.txt",
        "rdma_link_mi300x_8x_connectx.txt",
    ]


@pytest.mark.parametrize("name", RDMA_LINK_FILES)
def test_rdma_link_text_references_parse_line_by_line(name: str) -> None:
    text = ref(name)
    ports = parse_rdma_link_text(text)
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(ports) == len(lines)
    for port, line in zip(ports, lines, strict=True):
        words = line.split()
        assert f"link {port.name}" == " ".join(words[:2])
        assert (port.state, port.physical_state, port.netdev) == (words[3], words[5], words[7])
    assert all(p.state == "ACTIVE" and p.physical_state == "LINK_UP" for p in ports)


def test_rdma_link_connectx_reference_values() -> None:
    links = RdmaLink().parse(output(ref("rdma_link_mi300x_8x_connectx.txt")))
    assert not links.missing and not links.simulated
    assert len(links.ports) == 9
    assert links.by_netdev("ens6np0") == RdmaPort("mlx5_0", 1, "ACTIVE", "LINK_UP", "ens6np0")
    assert links.by_device("mlx5_bond_0").netdev == "ens10f0np0"  # type: ignore[union-attr]
    assert links.by_device("mlx5_7") is None  # the file has no mlx5_7 nor mlx5_8


def test_rdma_link_thor2_reference_keeps_the_trailing_space_line() -> None:
    # The first line of the Thor2 file ends with a space; it must read the same.
    links = RdmaLink().parse(output(ref("rdma_link_bnxt_thor2.txt"), LAB))
    assert [(p.name, p.netdev) for p in links.ports] == [
        ("bnxt_re0/1", "ens26np0"),
        ("bnxt_re1/1", "ens27np1"),
    ]
    assert links.simulated


def as_rdma_json(text: str, old_ifname: bool = False) -> str:
    """A reference `rdma link` text output written as `rdma -j link` prints it (rdma/link.c:
    ifindex, ifname, port, state, physical_state, netdev, netdev_index; iproute2 < 5.5 printed
    ifname as DEV/PORT)."""
    entries = []
    for i, port in enumerate(parse_rdma_link_text(text)):
        ifname = port.name if old_ifname else port.device
        entries.append(
            {
                "ifindex": i,
                "ifname": ifname,
                "port": port.port,
                "state": port.state,
                "physical_state": port.physical_state,
                "netdev": port.netdev,
                "netdev_index": 10 + i,
            }
        )
    return json.dumps(entries)


@pytest.mark.parametrize("name", RDMA_LINK_FILES)
@pytest.mark.parametrize("old_ifname", [False, True])
def test_rdma_link_json_reads_as_the_text_does(name: str, old_ifname: bool) -> None:
    text = ref(name)
    assert parse_rdma_link_json(as_rdma_json(text, old_ifname)) == parse_rdma_link_text(text)
    fact = RdmaLink().parse(output(as_rdma_json(text, old_ifname)))
    assert fact.ports == parse_rdma_link_text(text)


def test_rdma_link_json_without_netdev_is_an_infiniband_port() -> None:
    text = '[{"ifindex":0,"ifname":"mlx5_0","port":1,"state":"ACTIVE","physical_state":"LINK_UP"}]'
    assert parse_rdma_link_json(text) == (RdmaPort("mlx5_0", 1, "ACTIVE", "LINK_UP", None),)


@pytest.mark.parametrize(
    "text, words",
    [
        ("link mlx5_0/1 state ACTIVE physical_state", "key value"),
        ("mlx5_0/1 state ACTIVE physical_state LINK_UP", "key value"),
        ("link mlx5_0/1 netdev ens6np0", "no state"),
        ("link mlx5_0 state ACTIVE physical_state LINK_UP", "key value"),
    ],
)
def test_malformed_rdma_link_text_is_a_fact_error(text: str, words: str) -> None:
    with pytest.raises(FactError, match=words):
        RdmaLink().parse(output(text))


@pytest.mark.parametrize(
    "text, words",
    [
        ('[{"ifname": "mlx5_0"', "did not print JSON"),
        ('{"ifname": "mlx5_0"}', "wanted a list"),
        ('[{"ifname": "mlx5_0", "port": 1}]', "entry 0 lacks"),
        ('[{"ifname": "mlx5_0", "port": "x", "state": "A", "physical_state": "B"}]', "entry 0"),
        ("[3]", "entry 0 lacks"),
    ],
)
def test_malformed_rdma_link_json_is_a_fact_error(text: str, words: str) -> None:
    with pytest.raises(FactError, match=words):
        RdmaLink().parse(output(text))


def test_rdma_link_missing_tool_empty_list_no_netlink_and_empty_output() -> None:
    assert RdmaLink().parse(output(NOT_FOUND + "\n")).missing == "rdma not found (install iproute2)"
    assert RdmaLink().parse(output("[]\n")).missing == "no RDMA devices (rdma link lists none)"
    no_netlink = output("", rc=1, stderr="Failed to open NETLINK_RDMA socket\n")
    assert "no RDMA support" in RdmaLink().parse(no_netlink).missing
    with pytest.raises(FactError, match="printed nothing"):
        RdmaLink().parse(output(""))
    with pytest.raises(FactError, match="exited 2"):
        RdmaLink().parse(output("", rc=2, stderr="boom"))
    with pytest.raises(FactError, match="exited 1"):  # no separator: the shell itself failed
        RdmaLink().parse(RunResult("cmd", 1, "", "sh: syntax error"))


def test_ibv_devinfo_reference() -> None:
    devices = IbvDevinfo().parse(output(ref("ibv_devinfo_connectx7_roce.txt"))).devices
    assert [d.hca_id for d in devices] == [
        "rocep1s0f0",
        "rocep1s0f1",
        "roceP2p1s0f0",
        "roceP2p1s0f1",
    ]
    states = [(d.port(1).state, d.port(1).active_mtu) for d in devices]  # type: ignore[union-attr]
    assert states == [("PORT_DOWN", 1024), ("PORT_ACTIVE", 4096)] * 2
    for device in devices:
        assert (device.transport, device.fw_ver, device.vendor_id) == (
            "InfiniBand (0)",
            "28.45.4028",
            "0x02c9",
        )
        port = device.port(1)
        assert port and (port.max_mtu, port.link_layer) == (4096, "Ethernet")
        assert device.port(2) is None


def test_ibv_devinfo_reference_counts_every_block() -> None:
    text = ref("ibv_devinfo_connectx7_roce.txt")
    blocks = re.findall(r"^hca_id:", text, re.M)
    assert len(parse_ibv_devinfo(text)) == len(blocks) == 4


@pytest.mark.parametrize(
    "text, words",
    [
        ("transport: InfiniBand (0)\n", "before any hca_id"),
        ("just words\n", "not `key: value`"),
        ("hca_id:\tx\n\ttransport:\tIB\n", "lacks fw_ver"),
        (
            "hca_id:\tx\n\ttransport:\ta\n\tfw_ver:\t1\n\tvendor_id:\t2\n\tvendor_part_id:\t3\n",
            "lacks ports",
        ),
        (
            "hca_id:\tx\n\ttransport:\ta\n\tfw_ver:\t1\n\tvendor_id:\t2\n\tvendor_part_id:\t3\n"
            "\t\tport:\t1\n\t\t\tstate:\tPORT_ACTIVE (4)\n",
            "port 1 max_mtu",
        ),
        (
            "hca_id:\tx\n\ttransport:\ta\n\tfw_ver:\t1\n\tvendor_id:\t2\n\tvendor_part_id:\t3\n"
            "\t\tport:\t1\n\t\t\tstate:\tPORT_ACTIVE (4)\n\t\t\tmax_mtu:\tbig\n"
            "\t\t\tactive_mtu:\t4096 (5)\n\t\t\tlink_layer:\tEthernet\n",
            "not a number",
        ),
        ("\n", "no hca_id"),
    ],
)
def test_malformed_ibv_devinfo_is_a_fact_error(text: str, words: str) -> None:
    with pytest.raises(FactError, match=words):
        IbvDevinfo().parse(output(text))


def test_ibv_devinfo_truncated_reference_fails_clearly() -> None:
    text = ref("ibv_devinfo_connectx7_roce.txt")
    cut = text[: text.index("link_layer")]  # the first device's port loses its last lines
    with pytest.raises(FactError, match="rocep1s0f0 lacks port 1 link_layer"):
        parse_ibv_devinfo(cut)


def test_ibv_devinfo_missing_and_no_devices() -> None:
    assert "not found" in IbvDevinfo().parse(output(NOT_FOUND + "\n")).missing
    none = output("", rc=255, stderr="No IB devices found\n")
    assert IbvDevinfo().parse(none).missing.startswith("no RDMA devices")


def mlnx_qos_outputs(text: str) -> list[str]:
    """The outputs of the `+ mlnx_qos ...` commands in the reference's shell trace."""
    found, current = [], None
    for line in text.splitlines(keepends=True):
        if line.startswith("+ "):
            if current is not None:
                found.append("".join(current))
            current = [] if line.startswith("+ mlnx_qos ") else None
        elif current is not None:
            current.append(line)
    if current is not None:
        found.append("".join(current))
    return found


def test_mlnx_qos_reference_outputs() -> None:
    outputs = mlnx_qos_outputs(ref("mlnx_qos_trust_dscp_pfc3_output.txt"))
    assert len(outputs) == 2  # after --trust dscp, and after --pfc 0,0,0,1,0,0,0,0
    for text in outputs:
        qos = MlnxQos().parse(output(text, LAB), "eth4")
        assert (qos.trust, qos.pfc, qos.simulated) == ("dscp", (0, 0, 0, 1, 0, 0, 0, 0), True)
        assert qos.dscp2prio == {dscp: dscp >> 3 for dscp in range(64)}  # the default map
    # mlnx-tools printAppSelector: 8 DSCPs a line, a ninth on a line of its own; pcp: no map.
    nine = outputs[0].replace(
        "prio:6 dscp:55,54,53,52,51,50,49,48,", "prio:6 dscp:55,54,53,52,51,50,49,"
    )
    nine = nine.replace(
        "prio:7 dscp:63,62,61,60,59,58,57,56,",
        "prio:7 dscp:48,63,62,61,60,59,58,57,\n\tprio:7 dscp:56,",
    )
    assert parse_mlnx_qos(nine, "eth4").dscp2prio == {**{d: d >> 3 for d in range(64)}, 48: 7}
    pcp = outputs[0].replace("trust state: dscp", "trust state: pcp").split("dscp2prio mapping:")
    pcp_text = pcp[0] + "Cable len" + pcp[1].split("Cable len", 1)[1]
    assert parse_mlnx_qos(pcp_text, "eth4").dscp2prio is None


def test_mlnx_qos_whole_trace_or_cut_output_is_a_fact_error() -> None:
    text = ref("mlnx_qos_trust_dscp_pfc3_output.txt")
    with pytest.raises(FactError, match="single PFC table"):
        parse_mlnx_qos(text, "eth4")  # two tables: not one mlnx_qos output
    first = mlnx_qos_outputs(text)[0]
    with pytest.raises(FactError, match="single PFC table"):
        parse_mlnx_qos(first[: first.index("PFC configuration")], "eth4")
    with pytest.raises(FactError, match="trust state"):
        parse_mlnx_qos(first.replace("Priority trust state", "Trust"), "eth4")
    with pytest.raises(FactError, match="trust state"):
        MlnxQos().parse(output(""), "eth4")
    with pytest.raises(FactError, match="exited 1"):
        MlnxQos().parse(output("", rc=1, stderr="Netlink error"), "eth4")
    assert "not found" in MlnxQos().parse(output(NOT_FOUND + "\n"), "eth4").missing


def test_dcb_pfc_json() -> None:
    # The shape dcb/dcb_pfc.c prints for `dcb -j pfc show dev IF` (print_on_off -> booleans).
    prio_pfc = [False, False, False, True, False, False, False, False]
    text = json.dumps({"pfc_cap": 8, "macsec_bypass": False, "delay": 0, "prio_pfc": prio_pfc})
    assert parse_dcb_pfc(text, "ens26np0") == (0, 0, 0, 1, 0, 0, 0, 0)
    assert DcbPfc().parse(output(text), "ens26np0").pfc == (0, 0, 0, 1, 0, 0, 0, 0)
    for bad in ("", "{}", '{"prio_pfc": [true]}', '{"prio_pfc": [0,0,0,1,0,0,0,0]}'):
        with pytest.raises(FactError, match="not the JSON dcb prints"):
            parse_dcb_pfc(bad, "ens26np0")
    assert "dcb not found" in DcbPfc().parse(output(NOT_FOUND + "\n"), "x").missing
    # What iproute2 6.1's dcb prints for a veth (seen here in a network namespace of its own).
    veth = output("", rc=1, stderr="Attribute read: Operation not supported\n")
    assert DcbPfc().parse(veth, "ens26np0").missing == (
        "ens26np0 has no DCB support (dcb: Operation not supported)"
    )
    with pytest.raises(FactError, match="exited 1"):
        DcbPfc().parse(output("", rc=1, stderr="Attribute read: No such device\n"), "x")


def test_dcb_app_json() -> None:
    # dcb/dcb_app.c: each entry an array of the protocol, the priority and a " " separator.
    text = json.dumps(
        {"dscp_prio": [[26, 3, " "], [48, 7, " "]], "dgram_port_prio": [[4791, 3, " "]]}
    )
    assert parse_dcb_app(text, "ens26np0") == {
        "dscp_prio": {26: 3, 48: 7},
        "dgram_port_prio": {4791: 3},
    }
    info = DcbApp().parse(output(text), "ens26np0")
    assert info.table("dgram_port_prio") == {4791: 3} and info.table("stream_port_prio") == {}
    assert parse_dcb_app("{}", "ens26np0") == {"dscp_prio": {}, "dgram_port_prio": {}}
    assert parse_dcb_app("", "ens26np0") == {"dscp_prio": {}, "dgram_port_prio": {}}
    for bad in (
        "[",
        "[]",
        '{"dscp_prio": [[26]]}',
        '{"dscp_prio": 3}',
        '{"dscp_prio": [[1, 2, 3]]}',
    ):
        with pytest.raises(FactError, match="not the JSON dcb prints"):
            parse_dcb_app(bad, "ens26np0")
    veth = output("", rc=1, stderr="Attribute read: Operation not supported\n")
    assert "no DCB support" in DcbApp().parse(veth, "ens26np0").missing


def test_dcb_ets_json() -> None:
    # dcb/dcb_ets.c dcb_ets_print: the arrays by their JSON names, TSAs by name.
    ets = {
        "willing": False,
        "ets_cap": 8,
        "cbs": False,
        "tc_bw": [50, 50, 0, 0, 0, 0, 0, 0],
        "pg_bw": [0] * 8,
        "tc_tsa": ["ets", "ets"] + ["strict"] * 6,
        "prio_tc": [0, 0, 0, 1, 0, 0, 0, 0],
    }
    info = DcbEts().parse(output(json.dumps(ets)), "ens26np0")
    assert (info.tc_tsa[:3], info.tc_bw[:2], info.prio_tc[3]) == (
        ("ets", "ets", "strict"),
        (50, 50),
        1,
    )
    assert parse_dcb_ets(json.dumps(ets), "x").prio_tc == (0, 0, 0, 1, 0, 0, 0, 0)
    for bad in (
        "",
        "{}",
        json.dumps({**ets, "tc_bw": [50]}),
        json.dumps({**ets, "tc_tsa": [0] * 8}),
    ):
        with pytest.raises(FactError, match="not the JSON dcb prints"):
            parse_dcb_ets(bad, "ens26np0")
    assert "dcb not found" in DcbEts().parse(output(NOT_FOUND + "\n"), "x").missing


def test_ethtool_pause_text() -> None:
    # ethtool netlink/pause.c: "Pause parameters for %s:", then "Autonegotiate:\t%s",
    # "RX:\t\t%s", "TX:\t\t%s" (and "RX negotiated"... with autonegotiation on).
    text = "Pause parameters for ens26np0:\nAutonegotiate:\ton\nRX:\t\ton\nTX:\t\ton\n"
    text += "RX negotiated: on\nTX negotiated: on\n\n"
    info = EthtoolPause().parse(output(text, LAB), "ens26np0")
    assert (info.autoneg, info.rx, info.tx, info.simulated) == ("on", "on", "on", True)
    assert parse_ethtool_pause(text.replace("on\nTX:", "off\nTX:"), "ens26np0").rx == "off"
    with pytest.raises(FactError, match="not its pause parameters"):
        parse_ethtool_pause(text.replace("ens26np0", "eth0"), "ens26np0")
    unsupported = output("", rc=76, stderr="netlink error: Operation not supported\n")
    assert "Operation not supported" in EthtoolPause().parse(unsupported, "veth0").missing
    assert "ethtool not found" in EthtoolPause().parse(output(NOT_FOUND + "\n"), "x").missing


def test_bnxt_cc_values_are_numbers_as_the_driver_prints_them() -> None:
    # bnxt_re's configfs show functions print "%#x\n" (0x1a); 0 prints as "0". The CNP service
    # type is debugfs.c's "\tfw_service_prof_type_sup : %u" line of bnxt_re/DEV/info.
    head = "version=233.2.77.9\nservice=\tfw_service_prof_type_sup : 1\n"
    text = head + "ecn_marking=0x1\necn_enable=0x1\ncc_mode=0x1\nroce_prio=0x3\ncnp_prio=0x7\n"
    text += "roce_dscp=0x1a\ncnp_dscp=0\n"
    info = BnxtCc().parse(output(text), "bnxt_re0")
    assert info.values == {
        "ecn_marking": 1,
        "ecn_enable": 1,
        "cc_mode": 1,
        "roce_prio": 3,
        "cnp_prio": 7,
        "roce_dscp": 26,
        "cnp_dscp": 0,
    }
    assert (info.service_type, info.driver_version) == (1, "233.2.77.9")
    nodir = BnxtCc().parse(output("version=\nservice=\nnodir\n"), "bnxt_re0")
    assert (nodir.values, nodir.service_type, nodir.missing) == (None, 0, "")
    nocfs = BnxtCc().parse(output("version=\nservice=\nnocfs\n"), "bnxt_re0").missing
    assert "out-of-tree bnxt_re (loaded: the kernel's own bnxt_re, which declares no" in nocfs
    absent = BnxtCc().parse(output("version=-\nservice=\nnocfs\n"), "bnxt_re0")
    assert "(loaded: no bnxt_re;" in absent.missing and absent.driver_version == ""
    with pytest.raises(FactError, match="cannot read"):
        BnxtCc().parse(output("version=\nservice=\necn_enable=on\n"), "bnxt_re0")


def test_kernel_module() -> None:
    loaded = KernelModule().parse(output("loaded\nversion=233.2.77.9\n"), "bnxt_re")
    assert (loaded.loaded, loaded.version) == (True, "233.2.77.9")
    absent = KernelModule().parse(output("version=\n"), "mlx5_core")
    assert (absent.loaded, absent.version) == (False, "")


def test_gid_types_lines() -> None:
    types = parse_gid_types("0\tIB/RoCE v1\n1\tRoCE v2\n2\tIB/RoCE v1\n3\tRoCE v2\n", "mlx5_0/1")
    assert types == {0: "IB/RoCE v1", 1: "RoCE v2", 2: "IB/RoCE v1", 3: "RoCE v2"}
    info = GidTypes().parse(output("3\tRoCE v2\n1\tRoCE v2\n", LAB), "mlx5_0", 1)
    assert (info.roce_v2(), info.simulated) == ((1, 3), True)
    assert "does not exist" in GidTypes().parse(output(NOT_FOUND + "\n"), "mlx5_0").missing
    with pytest.raises(FactError, match="index<TAB>type"):
        parse_gid_types("x\tRoCE v2\n", "mlx5_0/1")
    with pytest.raises(FactError, match="index<TAB>type"):
        parse_gid_types("3\t\n", "mlx5_0/1")


def test_net_interface_parse() -> None:
    text = "mtu=9000\noperstate=up\ndriver=mlx5_core\n"
    info = NetInterface().parse(output(text), "ens6np0")
    assert (info.mtu, info.operstate, info.driver, info.missing) == (9000, "up", "mlx5_core", "")
    with pytest.raises(FactError):
        NetInterface().parse(output("mtu=\n"), "ens6np0")


@pytest.mark.parametrize(
    "driver, device, family",
    [
        ("mlx5_core", "rocep1s0f0", "connectx"),  # udev-renamed device: the driver decides
        ("bnxt_en", "rdma0", "thor2"),
        ("", "mlx5_0", "connectx"),  # no device link (a veth): the name decides
        ("", "bnxt_re0", "thor2"),
        ("ice", "irdma0", ""),
        ("bnxt_en", "mlx5_0", "thor2"),  # the driver wins over the name
    ],
)
def test_driver_family(driver: str, device: str, family: str) -> None:
    assert driver_family(driver, device) == family


# -- the real commands on this machine (no RDMA hardware here) ----------------------------------


def test_the_commands_run_on_this_machine() -> None:
    if not os.path.exists("/sys/class/net/lo"):
        pytest.skip(
            "this machine's /sys shows no network interface, not even lo (a sysfs of another "
            "network namespace is mounted over /sys: see /proc/self/mountinfo)"
        )
    facts = FactCache(LocalConnection("localhost"))
    links = facts.get(RdmaLink)
    assert not links.ports and links.missing  # rdma absent, or no NETLINK_RDMA here
    assert facts.get(IbvDevinfo).missing
    assert facts.get(GidTypes, "no_such_dev0", 1).missing.startswith("no GID table")
    lo = facts.get(NetInterface, "lo")
    assert (lo.missing, lo.driver) == ("", "") and lo.mtu >= 1280
    assert facts.get(NetInterface, "nonexistent0").missing.startswith("no network interface")
    assert facts.get(BnxtCc, "bnxt_re0").missing
