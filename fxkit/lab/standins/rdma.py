"""RDMA: rdma, ibv_devinfo, mlnx_qos."""

from __future__ import annotations

import ipaddress
import json
import subprocess
from typing import Any

from .common import Profile, Tool, fail, load_state, netdev_attr, new_parser, save_state

# -- RDMA: rdma, ibv_devinfo ----------------------------------------------------------------------


def _ports(p: Profile) -> list[dict[str, Any]]:
    ports = []
    for index, port in enumerate(p["rdma"]["ports"]):
        up = netdev_attr(port["netdev"], "operstate") in ("up", "unknown")
        mtu = int(netdev_attr(port["netdev"], "mtu", "1500"))
        ports.append(
            {
                **port,
                "ifindex": index,
                "up": up,
                "mtu": mtu,
                "netdev_index": int(netdev_attr(port["netdev"], "ifindex", "0")),
            }
        )
    return ports


def rdma(p: Profile, args: list[str], stdin: str, entry: dict[str, Any]) -> int:
    as_json = False
    while args and args[0].startswith("-"):
        option = args.pop(0)
        if option in ("-j", "-json", "--json"):
            as_json = True
        elif option not in ("-p", "-pretty", "--pretty", "-d", "-details", "--details"):
            fail("", f'Unknown option "{option}"', 1)
    objects = {"link": _rdma_link, "dev": _rdma_dev}
    obj = args[0] if args else "link"
    matches = [name for name in objects if name.startswith(obj)]
    if not matches:
        fail("", f'Object "{obj}" is unknown, try "rdma help".', 1)
    rest = args[1:]
    if rest and rest[0] in ("show", "list"):
        rest = rest[1:]
    rows = objects[matches[0]](_ports(p), p, rest[0] if rest else None)
    if as_json:
        print(json.dumps([json_row for json_row, _ in rows]))
    else:
        print("".join(text + "\n" for _, text in rows), end="")
    return 0


Row = tuple[dict[str, Any], str]


def _rdma_link(ports: list[dict[str, Any]], p: Profile, which: str | None) -> list[Row]:
    rows = []
    for port in ports:
        if which not in (None, port["dev"], f"{port['dev']}/1"):
            continue
        state, phys = ("ACTIVE", "LINK_UP") if port["up"] else ("DOWN", "DISABLED")
        row = {
            "ifindex": port["ifindex"],
            "ifname": port["dev"],
            "port": 1,
            "state": state,
            "physical_state": phys,
            "netdev": port["netdev"],
            "netdev_index": port["netdev_index"],
        }
        rows.append(
            (
                row,
                f"link {port['dev']}/1 state {state} physical_state {phys} "
                f"netdev {port['netdev']} ",
            )
        )
    if which is not None and not rows:
        fail("", f"Wrong device name {which.split('/')[0]}", 1)
    return rows


def _rdma_dev(ports: list[dict[str, Any]], p: Profile, which: str | None) -> list[Row]:
    r, rows = p["rdma"], []
    for port in ports:
        if which not in (None, port["dev"]):
            continue
        row = {
            "ifindex": port["ifindex"],
            "ifname": port["dev"],
            "node_type": "ca",
            "fw": r["fw_ver"],
            "node_guid": port["node_guid"],
            "sys_image_guid": r["sys_image_guid"],
        }
        rows.append(
            (
                row,
                f"{port['ifindex']}: {port['dev']}: node_type ca fw {r['fw_ver']} "
                f"node_guid {port['node_guid']} sys_image_guid {r['sys_image_guid']} ",
            )
        )
    if which is not None and not rows:
        fail("", f"Wrong device name {which}", 1)
    return rows


#: The IB MTUs (ibv_devinfo prints the size and the enum) and RoCE's header overhead.
IB_MTUS = [(4096, 5), (2048, 4), (1024, 3), (512, 2), (256, 1)]
ROCE_OVERHEAD = 88


def _ib_mtu(netdev_mtu: int) -> str:
    size, code = next((s, c) for s, c in IB_MTUS if s <= netdev_mtu - ROCE_OVERHEAD or s == 256)
    return f"{size} ({code})"


def ibv_devinfo(p: Profile, args: list[str], stdin: str, entry: dict[str, Any]) -> int:
    parser = new_parser("ibv_devinfo")
    parser.add_argument("-d", "--ib-dev")
    parser.add_argument("-i", "--ib-port", type=int)
    parser.add_argument("-v", "--verbose", action="store_true")
    parser.add_argument("-l", "--list", action="store_true")
    opts = parser.parse_args(args)
    r, ports = p["rdma"], _ports(p)
    if opts.ib_dev and opts.ib_dev not in [port["dev"] for port in ports]:
        fail("", f"IB device '{opts.ib_dev}' wasn't found", 255)
    if opts.list:
        print(f"{len(ports)} HCAs found:")
        print("".join(f"\t{port['dev']}\n" for port in ports), end="")
        return 0
    blocks = []
    for port in ports:
        if opts.ib_dev not in (None, port["dev"]):
            continue
        state = "PORT_ACTIVE (4)" if port["up"] else "PORT_DOWN (1)"
        active = _ib_mtu(port["mtu"]) if port["up"] else "1024 (3)"
        lines = [
            f"hca_id:\t{port['dev']}",
            "\ttransport:\t\t\tInfiniBand (0)",
            f"\tfw_ver:\t\t\t\t{r['fw_ver']}",
            f"\tnode_guid:\t\t\t{port['node_guid']}",
            f"\tsys_image_guid:\t\t\t{r['sys_image_guid']}",
            f"\tvendor_id:\t\t\t{r['vendor_id']}",
            f"\tvendor_part_id:\t\t\t{r['vendor_part_id']}",
            "\thw_ver:\t\t\t\t0x0",
            f"\tboard_id:\t\t\t{r['board_id']}",
            "\tphys_port_cnt:\t\t\t1",
            "\t\tport:\t1",
            f"\t\t\tstate:\t\t\t{state}",
            "\t\t\tmax_mtu:\t\t4096 (5)",
            f"\t\t\tactive_mtu:\t\t{active}",
            "\t\t\tsm_lid:\t\t\t0",
            "\t\t\tport_lid:\t\t0",
            "\t\t\tport_lmc:\t\t0x00",
            "\t\t\tlink_layer:\t\tEthernet",
        ]
        if opts.verbose:
            lines += _gid_lines(port)
        blocks.append("\n".join(lines) + "\n")
    print("\n".join(blocks))
    return 0


def _gid_lines(port: dict[str, Any]) -> list[str]:
    """The port's GID table as the kernel fills it from the netdev now (roce_gid_mgmt.c): the
    default GID (fe80::/64 and the EUI-64 of the port), then one GID per IP address of the
    interface, each as RoCE v1 and RoCE v2; printed as rdma-core's devinfo.c does (v1 in hex
    groups, v2 through inet_ntop)."""
    guid = port["node_guid"]  # the link-local GID's interface id: the EUI-64, bit 1 flipped
    eui = f"{int(guid[:2], 16) ^ 2:02x}{guid[2:]}"
    gids = [ipaddress.IPv6Address(f"fe80::{eui}")]
    shown = subprocess.run(
        ["ip", "-j", "addr", "show", "dev", port["netdev"]],
        capture_output=True,
        text=True,
        check=False,
    )
    links = json.loads(shown.stdout or "[]") if shown.returncode == 0 else []
    for info in (a for link in links for a in link.get("addr_info", [])):
        if info.get("family") == "inet":
            gids.append(ipaddress.IPv6Address(f"::ffff:{info['local']}"))
        elif info.get("family") == "inet6" and info.get("scope") == "global":
            gids.append(ipaddress.IPv6Address(info["local"]))
    lines = []
    for number, gid in enumerate(gids):
        lines.append(f"\t\t\tGID[{2 * number:3}]:\t\t{gid.exploded}, RoCE v1")
        # inet_ntop writes an IPv4-mapped address in dotted form (::ffff:192.168.1.201)
        v2 = f"::ffff:{gid.ipv4_mapped}" if gid.ipv4_mapped else gid.compressed
        lines.append(f"\t\t\tGID[{2 * number + 1:3}]:\t\t{v2}, RoCE v2")
    return lines


# -- mlnx_qos -----------------------------------------------------------------------------------

#: DSCP trust's starting map, in the order mlnx_qos lists it (the newest application entry first:
#: 63 down to 0, as in reference/mlnx_qos_trust_dscp_pfc3_output.txt): DSCP >> 3.
DEFAULT_DSCP2PRIO = [[dscp, dscp >> 3] for dscp in range(63, -1, -1)]


def mlnx_qos(p: Profile, args: list[str], stdin: str, entry: dict[str, Any]) -> int:
    parser = new_parser("mlnx_qos")
    parser.error = lambda message: fail(  # type: ignore[method-assign]
        "",
        "Usage: mlnx_qos -i <interface> [options]\n\nmlnx_qos: error: "
        + message.replace("unrecognized arguments", "no such option"),
        2,
    )
    parser.add_argument("-i", "--interface", required=True)
    parser.add_argument("--trust", choices=["pcp", "dscp"])
    parser.add_argument("-f", "--pfc")
    parser.add_argument("--dscp2prio", action="append")
    for option in (
        "-p",
        "--prio_tc",
        "-s",
        "--tsa",
        "-t",
        "--tcbw",
        "-r",
        "--ratelimit",
        "--cable_len",
        "-d",
        "--dcbx",
        "--buffer_size",
        "--prio2buffer",
    ):
        parser.add_argument(option, action="append")  # accepted and logged, not modelled
    opts = parser.parse_args(args)
    interface = opts.interface
    if interface not in [port["netdev"] for port in p["rdma"]["ports"]]:
        fail("", f"Interface {interface} doesn't exist", 1)  # wording not checked upstream
    if opts.dscp2prio and opts.trust:  # mlnx-tools python/mlnx_qos: printed, exit 1
        print("trust and dscp2prio commands cannot be used at the same time.")
        return 1
    state = load_state("mlnx_qos.json", {})
    mine = state.setdefault(interface, {"trust": "pcp", "pfc": [0] * 8, "dscp2prio": []})
    if opts.trust:
        # mlx5 (en_dcbnl.c, mlx5e_dcbnl_dscp_app): DSCP trust lists the DSCP map as
        # application entries, PCP trust removes them.
        if opts.trust != mine["trust"]:
            mine["dscp2prio"] = [list(x) for x in DEFAULT_DSCP2PRIO] if opts.trust == "dscp" else []
        mine["trust"] = opts.trust
    for command in opts.dscp2prio or []:
        _dscp2prio(mine, command)
    if opts.pfc is not None:
        values = opts.pfc.split(",")
        if len(values) != 8 or any(v not in ("0", "1") for v in values):
            fail(
                "",
                f"Usage: mlnx_qos -i <interface> [options]\n\nmlnx_qos: error: "
                f"Invalid PFC value: {opts.pfc} (8 comma separated 0/1 values)",
                2,
            )
        mine["pfc"] = [int(v) for v in values]
    if opts.trust or opts.pfc is not None or opts.dscp2prio:  # a query changes nothing
        save_state("mlnx_qos.json", state)
    print(_qos_text(mine), end="")
    return 0


def _dscp2prio(state: dict[str, Any], command: str) -> None:
    """``set,DSCP,PRIO`` / ``del,DSCP,PRIO`` / ``flush`` (mlnx-tools python/mlnx_qos): mlx5
    replaces the DSCP's entry (the new one listed first) and turns DSCP trust on with the first
    entry, PCP trust on when the last is gone."""
    parts = command.split(",")
    if parts == ["flush"]:
        state["dscp2prio"] = []
    elif len(parts) == 3 and parts[0] in ("set", "del") and all(x.isdigit() for x in parts[1:]):
        dscp, prio = int(parts[1]), int(parts[2])
        if dscp > 63 or prio > 7:
            fail("", "Invalid dscp2prio command. Refer to the help.", 1)
        if state["trust"] != "dscp" and parts[0] == "set":
            state["trust"], state["dscp2prio"] = "dscp", [list(x) for x in DEFAULT_DSCP2PRIO]
        kept = [e for e in state["dscp2prio"] if e[0] != dscp]
        state["dscp2prio"] = [[dscp, prio], *kept] if parts[0] == "set" else kept
    else:
        fail("", "Invalid dscp2prio command. Refer to the help.", 1)
    if not state["dscp2prio"]:
        state["trust"] = "pcp"


def _dscp_lines(mapping: list[list[int]]) -> list[str]:
    """mlnx-tools dcbnetlink.py printAppSelector: per priority its DSCPs (``%02d,``), in the
    table's order, at most 8 a line; indented as the recorded output shows it (8 spaces where
    mlnx_qos prints a tab, as for the PFC table)."""
    lines = []
    for prio in range(8):
        dscps = [f"{d:02d}," for d, p in mapping if p == prio]
        start = f"        prio:{prio} dscp:"
        lines += [start + "".join(dscps[i : i + 8]) for i in range(0, len(dscps), 8)]
    return lines


def _qos_text(state: dict[str, Any]) -> str:
    """The format of reference/mlnx_qos_trust_dscp_pfc3_output.txt (a real mlnx_qos)."""
    out = ["DCBX mode: OS controlled", f"Priority trust state: {state['trust']}"]
    if state["trust"] == "dscp":
        out.append("dscp2prio mapping:")
        out += _dscp_lines(state.get("dscp2prio") or DEFAULT_DSCP2PRIO)
    out += [
        "Cable len: 7",
        "PFC configuration:",
        "        priority    0   1   2   3   4   5   6   7",
        "        enabled     " + "".join(f"{v}   " for v in state["pfc"]),
    ]
    for tc, prio in enumerate([1, 0, 2, 3, 4, 5, 6, 7]):
        out += [f"tc: {tc} ratelimit: unlimited, tsa: vendor", f"         priority:  {prio}"]
    return "\n".join(out) + "\n"


TOOLS: dict[str, Tool] = {
    "rdma": rdma,
    "ibv_devinfo": ibv_devinfo,
    "mlnx_qos": mlnx_qos,
}
