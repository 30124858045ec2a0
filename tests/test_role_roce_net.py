"""roles/roce_net: variables checked first, the iproute2 commands it runs for AMD's nmcli
profiles, iproute2's JSON and ibv_devinfo's GID lines read, and real runs on lab hosts.

On an mi308x lab host the addresses, routing tables, rules and link states are real (the host's
own network namespace, veth RDMA netdevs, the real `ip`); the GID table is the ibv_devinfo
stand-in's, derived from the interface's real addresses as the kernel derives it.

Sources: AMD's commands, ROCm/system-acceptance-docs docs/network/configuration.md ("Configure
Network Routing": `ipv4.addresses 192.168.1.201/31 ipv4.routes "0.0.0.0/0 192.168.1.200
table=101" ipv4.routing-rules "priority 1010 from 192.168.1.201 table 101"`, and the three
sysctls); iproute2's JSON, recorded from iproute2 6.1.0 (`ip -j addr show dev`, `ip -j route
show table`, `ip -j rule show`) on a lab host; the GID lines, rdma-core
libibverbs/examples/devinfo.c `print_formated_gid` at 691953d8 (`"\t\t\tGID[%3d]:\t\t%s%s\n"`,
v1 as hex groups, v2 through inet_ntop).
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from fxkit.connection.base import RunResult
from fxkit.engine.role import RoleLoader
from fxkit.engine.variables import HostVars, Layer, environment
from fxkit.errors import VarError
from fxkit.facts.gids import parse_gids
from fxkit.facts.lab import SEPARATOR
from fxkit.facts.netaddr import BondInfo, IpAddr, IpRoutes, IpRules, Route, Rule, front_end
from fxkit.lab import Fleet
from tests.role_play import by_operation, play, snapshot, statuses

ROLES = Path(__file__).resolve().parents[1] / "roles"
ROLE = RoleLoader([ROLES]).load("roce_net")
R: ModuleType = sys.modules[ROLE.apply.__module__]

AMD = [  # the first two interfaces of AMD's example
    {"name": "ens6np0", "address": "192.168.1.201/31"},
    {"name": "ens5np0", "address": "192.168.1.203/31"},
]


def hostvars(host: str = "gpu01", **values: Any) -> HostVars:
    return HostVars(host, [Layer("role defaults", ROLE.defaults), Layer("inventory", values)])


def typed(**values: Any) -> Any:
    v = ROLE.typed(hostvars(**values))
    R.validate(v)
    return v


# -- variables ------------------------------------------------------------------------------------


def test_amds_example_gets_its_tables_priorities_and_gateways() -> None:
    v = typed(roce_net_interfaces=AMD)
    assert R.addressing(v) == [
        R.Addressing("ens6np0", "192.168.1.201/31", "192.168.1.200", 101, 1010),
        R.Addressing("ens5np0", "192.168.1.203/31", "192.168.1.202", 102, 1020),
    ]
    assert (v.roce_net_arp_ignore, v.roce_net_arp_announce, v.roce_net_rp_filter) == (2, 1, 2)
    given = {"name": "ens6np0", "address": "10.0.0.5/24", "gateway": "10.0.0.1", "table": 7}
    assert R.addressing(typed(roce_net_interfaces=[given | {"priority": 99}])) == [
        R.Addressing("ens6np0", "10.0.0.5/24", "10.0.0.1", 7, 99)
    ]


def port(**over: Any) -> list[dict[str, Any]]:
    return [{"name": "ens6np0", "address": "192.168.1.201/31"} | over]


@pytest.mark.parametrize(
    "values, where, words",
    [
        ({"roce_net_interfaces": port(address="192.168.1.201")}, "roce_net_interfaces", "prefix"),
        ({"roce_net_interfaces": port(address="fe80::1/64")}, "roce_net_interfaces", "IPv4"),
        ({"roce_net_interfaces": port(address="192.168.1.300/31")}, "[0].address", "192.168"),
        ({"roce_net_interfaces": port(address="10.0.0.1/32")}, "[0].address", "not a host"),
        (
            {"roce_net_interfaces": port(address="10.0.0.0/24", gateway="10.0.0.1")},
            "[0].address",
            "not a host",
        ),
        ({"roce_net_interfaces": port(address="10.0.0.5/24")}, "[0].gateway", "no gateway"),
        (
            {"roce_net_interfaces": port(gateway="192.168.2.1")},
            "[0].gateway",
            "not another address",
        ),
        ({"roce_net_interfaces": port(gateway="192.168.1.201")}, "[0].gateway", "not another"),
        ({"roce_net_interfaces": port(table=254)}, "[0].table", "kernel's main table"),
        (
            {"roce_net_interfaces": port(table=0)},
            "roce_net_interfaces",
            "greater than or equal to 1",
        ),
        (
            {"roce_net_interfaces": port(priority=32766)},
            "roce_net_interfaces",
            "less than or equal",
        ),
        ({"roce_net_interfaces": port(speed=1)}, "roce_net_interfaces", "Extra inputs"),
        ({"roce_net_interfaces": [AMD[0], AMD[0]]}, "roce_net_interfaces[1]", "name ens6np0"),
        (
            {
                "roce_net_interfaces": [
                    AMD[0],
                    {"name": "ens5np0", "address": "192.168.1.201/24", "gateway": "192.168.1.1"},
                ]
            },
            "roce_net_interfaces[1]",
            "ip 192.168.1.201",
        ),
        (
            {"roce_net_interfaces": [AMD[0], {**AMD[1], "table": 101}]},
            "roce_net_interfaces[1]",
            "table 101",
        ),
        ({"roce_net_interfaces": AMD, "roce_net_keep": ["ens5np0"]}, "roce_net_keep", "back-end"),
        ({"roce_net_arp_ignore": 9}, "roce_net_arp_ignore", "less than or equal to 8"),
        ({"roce_net_rp_filter": "loose"}, "roce_net_rp_filter", "valid integer"),
        ({"roce_net_unused_ports": "off"}, "roce_net_unused_ports", "'off'"),
        ({"roce_net_gid_index": 256}, "roce_net_gid_index", "less than or equal to 255"),
    ],
)
def test_wrong_variables_name_host_and_variable(values: dict, where: str, words: str) -> None:
    with pytest.raises(VarError) as caught:
        typed(**values)
    assert caught.value.where.startswith("gpu01: roce_net_")
    assert where in caught.value.where
    assert words in caught.value.message, caught.value.message
    assert caught.value.hint


def test_an_address_on_two_hosts_is_refused() -> None:
    one = ROLE.typed(hostvars("gpu01", roce_net_interfaces=AMD))
    two = ROLE.typed(hostvars("gpu02", roce_net_interfaces=[AMD[1]]))
    with pytest.raises(VarError) as caught:
        R.validate_all({"gpu01": one, "gpu02": two})
    assert caught.value.where.startswith("gpu02: roce_net_interfaces[0].address")
    assert "192.168.1.203 is also the address of gpu01's roce_net_interfaces[1]" in str(
        caught.value
    )


# -- the commands ---------------------------------------------------------------------------------


def test_the_plan_is_amds_nmcli_profile_in_iproute2() -> None:
    entry = R.addressing(typed(roce_net_interfaces=AMD))[0]
    assert [(s.what, s.want, s.command) for s in R.plan(entry)] == [
        ("link of ens6np0", "up", "ip link set dev ens6np0 up"),
        ("address of ens6np0", "192.168.1.201/31", "ip addr replace 192.168.1.201/31 dev ens6np0"),
        (
            "table 101 of ens6np0",
            "default via 192.168.1.200 dev ens6np0",
            "ip route replace default via 192.168.1.200 dev ens6np0 table 101",
        ),
        (
            "rule 1010 of ens6np0",
            "1010: from 192.168.1.201 lookup 101",
            "while ip rule del priority 1010 2>/dev/null; do :; done; "
            "ip rule add priority 1010 from 192.168.1.201 table 101",
        ),
    ]
    assert R.down("ens8np0").command == "ip link set dev ens8np0 down"


def test_the_boot_script_is_valid_shell(tmp_path: Path) -> None:
    entries = R.addressing(typed(roce_net_interfaces=AMD))
    text = (
        environment(str(ROLE.templates))
        .get_template("fxkit-roce-net.sh.j2")
        .render(
            entries=entries,
            plans={e.name: R.plan(e) for e in entries},
            down=[R.down("ens8np0")],
            q=shlex.quote,
        )
    )
    script = tmp_path / "fxkit-roce-net"
    script.write_text(text)
    assert subprocess.run(["sh", "-n", str(script)], check=False).returncode == 0
    commands = [line for line in text.splitlines() if line.startswith("{ ")]
    assert [c.split("; } ||")[0][2:] for c in commands] == [
        s.command for e in entries for s in R.plan(e)
    ] + ["ip link set dev ens8np0 down"]


# -- reading iproute2 and ibv_devinfo -------------------------------------------------------------

ADDR = (
    '[{"ifindex":3,"link":"fxpeer0","ifname":"ens6np0","flags":["BROADCAST","MULTICAST","UP",'
    '"LOWER_UP"],"mtu":1500,"qdisc":"noqueue","operstate":"UP","group":"default","txqlen":1000,'
    '"link_type":"ether","address":"3e:fc:0d:52:20:62","broadcast":"ff:ff:ff:ff:ff:ff",'
    '"addr_info":[{"family":"inet","local":"192.168.1.201","prefixlen":31,"scope":"global",'
    '"label":"ens6np0","valid_life_time":4294967295,"preferred_life_time":4294967295},'
    '{"family":"inet6","local":"fe80::3cfc:dff:fe52:2062","prefixlen":64,"scope":"link",'
    '"valid_life_time":4294967295,"preferred_life_time":4294967295}]}]'
)
ROUTES = '[{"dst":"default","gateway":"192.168.1.200","dev":"ens6np0","flags":[]}]'
RULES = (
    '[{"priority":0,"src":"all","table":"local"},{"priority":1010,"src":"192.168.1.201",'
    '"table":"101"},{"priority":1020,"src":"10.0.0.0","srclen":24,"table":"102"},'
    '{"priority":32766,"src":"all","table":"main"},{"priority":32767,"src":"all",'
    '"table":"default"}]'
)


def out(text: str, rc: int = 0, stderr: str = "") -> RunResult:
    return RunResult("cmd", rc, f"\n{SEPARATOR}\n{text}", stderr)


def test_iproute2_json_is_read() -> None:
    link = IpAddr().parse(out(ADDR), "ens6np0")
    assert (link.up, link.operstate, link.ipv4, link.ipv6) == (
        True,
        "UP",
        ("192.168.1.201/31",),
        (),
    )
    gone = IpAddr().parse(out("", 1, 'Device "ens9np0" does not exist.'), "ens9np0")
    assert gone.missing == "no network interface ens9np0 (ip addr)"
    assert IpRoutes().parse(out(ROUTES), 101) == (Route("default", "192.168.1.200", "ens6np0"),)
    empty = out("", 2, "Error: ipv4: FIB table does not exist.\nDump terminated")
    assert IpRoutes().parse(empty, 102) == ()
    assert IpRules().parse(out(RULES))[1:3] == (
        Rule(1010, "192.168.1.201", "101"),
        Rule(1020, "10.0.0.0/24", "102"),
    )


def test_gid_lines_as_rdma_core_prints_them() -> None:
    text = (
        "\t\t\tphys_state:\t\tLINK_UP (5)\n"
        "\t\t\tGID[  0]:\t\tfe80:0000:0000:0000:0ac0:ebff:fef0:28b2, RoCE v1\n"
        "\t\t\tGID[  1]:\t\tfe80::ac0:ebff:fef0:28b2, RoCE v2\n"
        "\t\t\tGID[  2]:\t\t0000:0000:0000:0000:0000:ffff:c0a8:01c9, RoCE v1\n"
        "\t\t\tGID[  3]:\t\t::ffff:192.168.1.201, RoCE v2\n"
    )
    gids = parse_gids(text, "mlx5_0/1")
    assert [(g.index, g.kind, g.ipv4) for g in gids.values()] == [
        (0, "RoCE v1", ""),
        (1, "RoCE v2", ""),
        (2, "RoCE v1", "192.168.1.201"),
        (3, "RoCE v2", "192.168.1.201"),
    ]


def test_a_front_end_bond_is_known_by_its_name_or_its_netdev() -> None:
    assert "LAG" in front_end("mlx5_bond_0", None)
    assert front_end("bnxt_re2", BondInfo("bond0", bond=True)) == "bond0 is a bond"
    assert "port of bond bond0" in front_end("mlx5_7", BondInfo("ens9np0", master="bond0"))
    assert front_end("mlx5_0", BondInfo("ens6np0")) == ""


# -- on lab hosts ---------------------------------------------------------------------------------

VARS = {"roce_net_interfaces": AMD}


def sh(fleet: Fleet, command: str) -> str:
    with fleet.connect("lab01") as conn:
        result = conn.run(command)
    assert result.ok, result.stderr
    return result.stdout


def gid3(fleet: Fleet, device: str) -> dict[int, Any]:
    return parse_gids(sh(fleet, f"ibv_devinfo -v -d {device} -i 1"), device)


@pytest.mark.lab
def test_check_converge_read_back_then_nothing(lab_fleet, tmp_path: Path) -> None:
    fleet = lab_fleet(1, name="roce-net", profile="mi308x-frontend-bond")
    assert 3 not in gid3(fleet, "mlx5_0")  # no address: no IPv4 GID
    before = snapshot(fleet)
    code, checked = play(tmp_path, fleet, "roce_net", VARS, "--check")
    assert code == 0 and snapshot(fleet) == before  # check mode changed nothing
    would = {t["operation"] for t in checked if t["status"] == "changed"}
    assert {"address of ens6np0", "table 101 of ens6np0", "rule 1020 of ens5np0"} <= would

    code, first = play(tmp_path, fleet, "roce_net", VARS)
    ops = by_operation(first)
    assert code == 0, [t for t in first if t["status"] == "failed"]
    for what in ("address of", "table 101 of", "rule 1010 of"):
        assert ops[f"{what} ens6np0"]["status"] == "changed"
    assert ops["link of ens6np0"]["status"] == "ok"  # up already: read, not changed
    # read back here, with the real ip
    link = json.loads(sh(fleet, "ip -j addr show dev ens5np0"))[0]
    assert {(a["local"], a["prefixlen"]) for a in link["addr_info"] if a["family"] == "inet"} == {
        ("192.168.1.203", 31)
    }
    assert json.loads(sh(fleet, "ip -j route show table 102")) == [
        {"dst": "default", "gateway": "192.168.1.202", "dev": "ens5np0", "flags": []}
    ]
    rules = {r["priority"]: r for r in json.loads(sh(fleet, "ip -j rule show"))}
    assert rules[1010] == {"priority": 1010, "src": "192.168.1.201", "table": "101"}
    gid = gid3(fleet, "mlx5_1")[3]
    assert (gid.address, gid.kind) == ("::ffff:c0a8:1cb", "RoCE v2")
    assert ops["verify RoCE v2 GIDs"]["status"] == "ok"
    # the sysctls: persisted; the lab's /proc/sys is read-only, so their live part is skipped
    conf = sh(fleet, "cat /etc/sysctl.d/60-fxkit-roce-net.conf")
    assert conf.splitlines() == [
        "net.ipv4.conf.all.arp_ignore = 2",
        "net.ipv4.conf.all.arp_announce = 1",
        "net.ipv4.conf.all.rp_filter = 2",
    ]
    assert "read-only" in ops["verify ARP and rp_filter in force"]["msg"]
    unused = ops["unused RDMA ports"]["msg"]
    assert "ens8np0 (mlx5_2, ACTIVE)" in unused and "ip link set dev ens8np0 down" in unused
    assert "front-end, left alone: ens10f0np0 (mlx5_bond_0 is a LAG" in unused
    assert "ens6np0" not in unused.split(";")[0]

    code, again = play(tmp_path, fleet, "roce_net", VARS)
    assert code == 0 and statuses(again)["changed"] == 0, [
        t for t in again if t["status"] == "changed"
    ]
    code, checked = play(tmp_path, fleet, "roce_net", VARS, "--check")
    assert code == 0 and statuses(checked)["changed"] == 0

    # A reboot loses addresses, routes and rules: the boot script puts them back.
    sh(
        fleet,
        "ip addr flush dev ens6np0 scope global; ip addr flush dev ens5np0 scope global; "
        "ip rule del priority 1010; ip rule del priority 1020; /usr/local/sbin/fxkit-roce-net",
    )
    code, after = play(tmp_path, fleet, "roce_net", VARS)
    assert code == 0 and statuses(after)["changed"] == 0


@pytest.mark.lab
def test_unused_ports_go_down_and_the_front_end_stays(lab_fleet, tmp_path: Path) -> None:
    fleet = lab_fleet(1, name="roce-net-down", profile="mi308x-frontend-bond")
    hostvars = {**VARS, "roce_net_keep": ["ens8np0"], "roce_net_unused_ports": "down"}
    code, first = play(tmp_path, fleet, "roce_net", hostvars)
    assert code == 0, [t for t in first if t["status"] == "failed"]
    downed = {t["operation"] for t in first if t["operation"].startswith("link of unused")}
    assert downed == {
        f"link of unused {n}" for n in ("ens7np0", "ens2np0", "ens1np0", "ens4np0", "ens3np0")
    }
    links = {line.split()[1]: line.split()[3] for line in sh(fleet, "rdma link").splitlines()}
    assert links["mlx5_3/1"] == "DOWN" and links["mlx5_0/1"] == "ACTIVE"
    assert links["mlx5_2/1"] == "ACTIVE"  # kept
    assert links["mlx5_bond_0/1"] == "ACTIVE"  # the front-end is never touched
    code, again = play(tmp_path, fleet, "roce_net", hostvars)
    assert code == 0 and statuses(again)["changed"] == 0


@pytest.mark.lab
def test_the_front_end_as_a_back_end_port_is_refused_untouched(lab_fleet, tmp_path: Path) -> None:
    fleet = lab_fleet(1, name="roce-net", profile="mi308x-frontend-bond")
    before = snapshot(fleet)
    hostvars = {"roce_net_interfaces": [{"name": "ens10f0np0", "address": "10.1.0.1/31"}]}
    code, tasks = play(tmp_path, fleet, "roce_net", hostvars)
    assert code != 0 and snapshot(fleet) == before
    assert [t["status"] for t in tasks] == ["failed"]
    assert "mlx5_bond_0 is a LAG (bond) RDMA device" in tasks[0]["msg"]
    assert "never a back-end port" in tasks[0]["msg"]


@pytest.mark.lab
def test_a_wrong_variable_touches_no_host(lab_fleet, tmp_path: Path) -> None:
    fleet = lab_fleet(1, name="roce-net", profile="mi308x-frontend-bond")
    before = snapshot(fleet)
    with pytest.raises(VarError) as caught:  # fxkit's main() prints it and exits 2
        play(tmp_path, fleet, "roce_net", {"roce_net_interfaces": port(table=255)})
    assert caught.value.where.startswith("lab01: roce_net_interfaces[0].table (")
    events = (tmp_path / "log.jsonl").read_text().splitlines()
    assert not [e for e in map(json.loads, events) if e["event"] == "task"]
    assert snapshot(fleet) == before


@pytest.mark.lab
def test_a_plain_lab_host_skips_and_another_host_fails_untouched(lab_fleet, tmp_path: Path) -> None:
    fleet = lab_fleet(1, name="roce-net-plain")  # no profile: no RDMA, no ens6np0
    code, skipped = play(tmp_path, fleet, "roce_net", VARS)
    assert code == 0 and not [t for t in skipped if t["status"] == "failed"]
    reasons = {t["operation"]: t["msg"] for t in skipped if t["status"] == "skipped"}
    assert "no network interface ens6np0" in reasons["addressing of ens6np0"]
    assert "RDMA ports" in reasons
    before = snapshot(fleet)  # the files of the lab run are there: the next run adds nothing
    code, failed = play(tmp_path, fleet, "roce_net", {**VARS, "fxkit_lab": False})
    assert code != 0 and [t["status"] for t in failed] == ["failed"] and snapshot(fleet) == before
    assert failed[0]["msg"].startswith("RDMA ports: ")
    assert "not marked as a lab host" in failed[0]["msg"]
