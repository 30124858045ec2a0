"""G1's fabric checks across lab hosts (``fxkit gate g1`` on a fleet of three mi308x hosts):

- G1 plans the node pairs itself: three nodes make two rounds, (lab01, lab02) then (lab03,
  lab01); every node is measured, each pair once.
- No NIC is ever in two tests at once, proven from the stand-ins' call log (each call logs when
  it started and ended, fxkit/lab/standins/perftest.py): on every host, the calls on one NIC
  that overlap in time are one test (one server and one client on the same TCP port).
- The two sides of a pair's test ran at the same time, on the same NIC of both nodes.
- GPU to GPU through the switch runs the pairs' tests with each side's buffers in the GPU
  adjacent to its NIC (``--use_rocm``); RCCL across two nodes runs under mpirun, one rank per
  GPU of a pair, launched from the pair's first node, each pair once.
- One NIC at half speed (two mi308x-nic-half hosts) fails exactly ``fabric_link_speed``: its
  pair's bandwidth is judged against its own 200G.

The stand-ins answer from recorded real perftest output (fxkit/lab/profiles/mi308x/SOURCES.md);
the hosts do not reach each other, so the figures are the recording's, not a measured fabric.
"""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path

import pytest
from test_gate_g1_lab import backend, check, prepare, run_g1, statuses

from fxkit.lab import profile as profiles

pytestmark = pytest.mark.lab

HOSTS = ("lab01", "lab02", "lab03")
TRAFFIC = {"ib_write_bw", "ibv_rc_pingpong"}
#: The options of both tools that take a value.
#: The site's figure for RCCL across two nodes: the mi308x platform has none (the recorded
#: two-node MI308X run reaches 313.87 GB/s in place at 2 GiB, its largest size).
SITE = {"g1_rccl_multinode_busbw_min_gbps": 300}
VALUED = {"-d", "-x", "-p", "-q", "-g", "-i", "-s", "-n", "-D"}


def _option(argv: list[str], flag: str) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv else None


def _addressed(argv: list[str]) -> bool:
    """A client's last argument is the server's address (not an option, nor an option's value)."""
    return not argv[-1].startswith("-") and argv[-2] not in VALUED


def _tests(calls: list[dict]) -> list[dict]:
    """The traffic calls of one host: tool, NIC, TCP port, side, start and end."""
    return [
        {
            "tool": c["argv"][0],
            "device": _option(c["argv"], "-d"),
            "port": _option(c["argv"], "-p"),
            "side": "client" if _addressed(c["argv"]) else "server",
            "to": c["argv"][-1],
            "started": c["started"],
            "ended": c["ended"],
        }
        for c in calls
        if c["argv"][0] in TRAFFIC and "ended" in c
    ]


@pytest.fixture(scope="module")
def fabric_run(lab_fleet, tmp_path_factory) -> dict:
    fleet = lab_fleet(len(HOSTS), name="g1-fabric", profile="mi308x")
    for host in HOSTS:
        extra = prepare(fleet, host)
        with fleet.connect(host) as conn:
            assert conn.run("rm -f /var/log/fxkit-lab/calls.jsonl").ok
    extra.pop("numa_balancing")
    extra |= SITE
    done, result = run_g1(fleet, tmp_path_factory.mktemp("g1-fabric") / "run", extra)
    calls, mpirun = {}, {}
    for host in HOSTS:
        with fleet.connect(host) as conn:
            logged = profiles.calls(conn)
        calls[host] = _tests(logged)
        mpirun[host] = [c for c in logged if c["argv"][0] == "mpirun"]
    return {"done": done, "result": result, "calls": calls, "mpirun": mpirun, "fleet": fleet}


def test_the_fabric_checks_pass_on_every_node(fabric_run) -> None:
    result = fabric_run["result"]
    for host in HOSTS:
        got = statuses(result, host)
        for check_id in got:
            if check_id.startswith("fabric_"):
                assert got[check_id] == "PASS", check(result, check_id, host)
        # 779.21 Gb/s of the recorded 400G pair: 97.4 % of 800.
        assert set(check(result, "fabric_nic_nic_bandwidth", host)["value"].values()) == {97.4}
        assert len(check(result, "fabric_rc_pingpong", host)["value"]) == 8
        assert check(result, "rccl_multinode_busbw", host)["status"] == "PASS"


def test_every_node_is_paired_and_each_pair_once(fabric_run) -> None:
    result = fabric_run["result"]
    tested = set()
    for host in HOSTS:
        at = check(result, "fabric_nic_nic_bandwidth", host)["measurement"]
        data = result["hosts"][host]["measurements"][at]["data"]
        assert data["rounds"] == 2 and len(data["ports"]) == 8
        for port, found in data["ports"].items():
            for test in found["tests"]:
                assert test["peer_port"] == port  # the same NIC on both nodes
                pair = frozenset((host, test["peer"]))
                tested.add((pair, test["round"]))
    assert tested == {(frozenset(("lab01", "lab02")), 1), (frozenset(("lab01", "lab03")), 2)}


def test_no_nic_is_in_two_tests_at_once(fabric_run) -> None:
    calls = fabric_run["calls"]
    for host in HOSTS:
        by_device: dict[str, list[dict]] = {}
        for call in calls[host]:
            by_device.setdefault(call["device"], []).append(call)
        assert len(by_device) == 8
        for device, found in by_device.items():
            found.sort(key=lambda c: c["started"])
            clusters = [[found[0]]]
            for call in found[1:]:
                if call["started"] < max(c["ended"] for c in clusters[-1]):
                    clusters[-1].append(call)
                else:
                    clusters.append([call])
            for cluster in clusters:  # overlapping calls: one test, one server, one client
                assert len({(c["tool"], c["port"]) for c in cluster}) == 1, (host, device, cluster)
                sides = [c["side"] for c in cluster]
                assert sorted(sides) in (["server"], ["client"], ["client", "server"]), cluster
            # The GPU to NIC loopback, then the pingpong, NIC to NIC and GPU to GPU tests
            # between nodes, one after the other: lab01 is in both rounds.
            rounds = 2 if host == "lab01" else 1
            assert len(clusters) == 1 + 3 * rounds, (host, device, clusters)
            assert all(a[-1]["ended"] <= b[0]["started"] for a, b in pairwise(clusters))


def test_both_sides_of_a_pair_ran_together(fabric_run) -> None:
    """Every test between nodes: its server on one node and exactly one client on another,
    on the same NIC and TCP port, the client starting while the server waits."""
    calls = fabric_run["calls"]
    clients = [(h, c) for h in HOSTS for c in calls[h] if c["to"] not in ("127.0.0.1",)]
    clients = [(h, c) for h, c in clients if c["side"] == "client"]
    assert len(clients) == 2 * 8 * 3  # two pairs, 8 NICs, pingpong and two bandwidth tests
    for host, client in clients:
        servers = [
            (h, s)
            for h in HOSTS
            for s in calls[h]
            if h != host
            and s["side"] == "server"
            and (s["tool"], s["device"], s["port"])
            == (client["tool"], client["device"], client["port"])
            and s["started"] <= client["started"] <= s["ended"]
        ]
        assert len(servers) == 1, (host, client, servers)


def test_the_report_names_the_pairs(fabric_run, tmp_path: Path) -> None:
    """Each port's result names its peer node and port, and the round it ran in."""
    result = fabric_run["result"]
    at = check(result, "fabric_rc_pingpong", "lab03")["measurement"]
    port = result["hosts"]["lab03"]["measurements"][at]["data"]["ports"]["mlx5_9/1"]
    assert port["peer"] == "lab01" and port["peer_port"] == "mlx5_9/1" and port["round"] == 2
    assert port["connected"] is True and port["role"] == "server"


def test_gpu_to_gpu_uses_the_gpu_adjacent_to_each_nic_on_both_sides(fabric_run) -> None:
    """AMD's "GPU to GPU through the Switch": both sides of every pair's test on NIC i pass
    --use_rocm=i (the default adjacency: the i-th backend NIC's GPU is GPU i)."""
    result = fabric_run["result"]
    devices = [port["device"] for port in backend(fabric_run["fleet"].profile)]
    for host in HOSTS:
        assert check(result, "fabric_gpu_gpu_bandwidth", host)["status"] == "PASS"
        with fabric_run["fleet"].connect(host) as conn:
            logged = [c["argv"] for c in profiles.calls(conn) if c["argv"][0] == "ib_write_bw"]
        between = [a for a in logged if "127.0.0.1" not in a and "--use_rocm" in " ".join(a)]
        rounds = 2 if host == "lab01" else 1
        assert len(between) == 8 * rounds, host  # its side of each pair's test, per NIC
        for argv in between:
            gpu = next(a for a in argv if a.startswith("--use_rocm=")).split("=")[1]
            assert devices.index(_option(argv, "-d")) == int(gpu), argv


def test_rccl_runs_once_per_pair_under_mpirun_and_both_nodes_get_the_pair(fabric_run) -> None:
    """validation.md, "RCCL Multi-Node Test" (a two node cluster): one mpirun per pair, from its
    first node, 16 ranks, 8 on each node's address, -g 1 per rank; both nodes are judged on the
    pair's in-place bus bandwidth, a node in two pairs (lab01) on the lower."""
    result, fleet = fabric_run["result"], fabric_run["fleet"]
    launched = {host: fabric_run["mpirun"][host] for host in HOSTS}
    assert [len(launched[h]) for h in HOSTS] == [1, 0, 1]  # (lab01, lab02), then (lab03, lab01)
    address = {h: fleet.address(h) for h in HOSTS}
    for launcher, peer in (("lab01", "lab02"), ("lab03", "lab01")):
        argv = launched[launcher][0]["argv"]
        assert _option(argv, "-np") == "16"
        assert _option(argv, "-H") == f"{address[launcher]}:8,{address[peer]}:8"
        program = argv[argv.index("all_reduce_perf") :]
        assert _option(program, "-g") == "1" and _option(program, "-e") == "8G"
    values = {h: check(result, "rccl_multinode_busbw", h)["value"] for h in HOSTS}
    at = check(result, "rccl_multinode_busbw", "lab02")["measurement"]
    data = result["hosts"]["lab02"]["measurements"][at]["data"]
    assert (data["peer"], data["launcher"], data["round"]) == ("lab01", "lab01", 1)
    assert values["lab02"] == data["in_place_busbw_gbps"] > 300
    assert values["lab01"] == min(values.values())


def test_a_nic_at_half_speed_fails_exactly_its_link_speed_across_pairs(
    lab_fleet, fabric_run, tmp_path: Path
) -> None:
    """Two mi308x-nic-half hosts (mlx5_3 at 200G on both): the pair's tests on mlx5_3 are
    judged against its 200G, so only fabric_link_speed fails, on each node; every other
    check's status is the three healthy hosts' one."""
    fleet = lab_fleet(2, name="g1-nic-half", profile="mi308x-nic-half")
    for host in ("lab01", "lab02"):
        extra = prepare(fleet, host)
    extra.pop("numa_balancing")
    _, result = run_g1(fleet, tmp_path / "half", extra | SITE)
    healthy = statuses(fabric_run["result"], "lab01")
    for host in ("lab01", "lab02"):
        got = statuses(result, host)
        changed = {c for c in got if got[c] != healthy[c]}
        assert changed == {"fabric_link_speed"}, {c: (healthy[c], got[c]) for c in changed}
        assert got["fabric_link_speed"] == "FAIL"
        pair = check(result, "fabric_nic_nic_bandwidth", host)["value"]
        assert pair["mlx5_3/1"] == pair["mlx5_0/1"] == 97.4
        at = check(result, "fabric_nic_nic_bandwidth", host)["measurement"]
        port = result["hosts"][host]["measurements"][at]["data"]["ports"]["mlx5_3/1"]
        assert port["speed_mbps"] == 200000 and port["bw_gbps"] == 389.61
