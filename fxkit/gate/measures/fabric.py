"""The backend fabric, as AMD validates it (system-acceptance-docs, docs/network/):

    measure: {rdma_ports: {backend: "{{ roce_nic_interfaces }}", gid_index: 3}}
    measure: {ib_write_bw: {backend: [...], gpus: {mlx5_0: 0}}}        # GPU to NIC, per NIC
    measure: {ib_write_bw_pairs: {backend: [...], address: 10.0.0.1}}  # NIC to NIC, node pairs
    measure: {ib_write_bw_pairs: {..., use_rocm: true}}                # GPU to GPU, node pairs
    measure: {rc_pingpong_pairs: {backend: [...], address: 10.0.0.1}}  # ibv_rc_pingpong, pairs
    measure: {rccl_pairs: {address: 10.0.0.1, gpus: 8}}                # RCCL across two nodes

**Backend ports** are the declared ones (roce_nic's ``roce_nic_interfaces``: netdev names, or
``{name, device}``); a front-end or bonded port (``mlx5_bond_0``) is then not counted. With no
declaration, every RDMA port is, but bonds and ports whose link is disabled (``physical_state
DISABLED``). A declared port that ``rdma link`` does not show is ``MISSING``.

- ``rdma_ports``: per backend port, its state, link layer, MTUs, link speed (Mb/s,
  ``/sys/class/net/IF/speed``) and the GID at ``gid_index`` with its type (sysfs).
- ``ib_write_bw``: AMD's GPU to NIC test on each backend NIC in turn, a loopback: ``ib_write_bw
  -x GID -a -b -F -d NIC --report_gbits`` as server, the same with ``--use_rocm=GPU`` (the GPU
  adjacent to the NIC) against 127.0.0.1 as client. Per port: the best average Gb/s of any
  message size and its percent of the port's line rate.
- ``ib_write_bw_pairs`` and ``rc_pingpong_pairs`` are measured across the fleet
  (:func:`plan_pairs`): the nodes in pairs, each pair once, every node in one; in a pair the
  i-th backend NIC of one node tests against the i-th of the other, all NICs of the pair at once
  (as AMD's CVS runs them, cvs/lib/ibperf_lib.py), so no NIC is ever in two tests at once.
  Bidirectional bandwidth is the lower of both sides' reports, against twice the slower port's
  line rate. With ``use_rocm``, each side's buffers are in the GPU adjacent to its NIC (AMD's
  "GPU to GPU through the Switch").
- ``rccl_pairs``: rccl-tests' all_reduce_perf over the same node pairs, launched by mpirun from
  the pair's first node with one GPU per rank (docs/network/validation.md, "RCCL Multi-Node
  Test": AMD's figure is for a two node cluster); both nodes get the pair's result.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from shlex import quote
from typing import Any, NamedTuple

from pydantic import Field

from fxkit.facts.rdma import RdmaLink
from fxkit.gate.measure import MeasuredHost, MeasureError, Params, fleet_kind, kind
from fxkit.gate.measures.bench import (
    RcclParams,
    all_reduce_argv,
    all_reduce_result,
    parse_ib_write_bw,
)
from fxkit.gate.measures.facts import rdma

#: Where a client reaches a server on its own node.
LOOPBACK = "127.0.0.1"
#: Seconds a pair's client waits for its servers to listen (CVS: 5, AMD's example: 1).
CLIENT_DELAY = 1


class Backend(NamedTuple):
    """A backend port: ``name`` as ``rdma link`` shows it (``mlx5_0/1``)."""

    name: str
    device: str
    netdev: str | None
    state: str


class BackendParams(Params):
    #: The declared backend ports: roce_nic_interfaces (netdev names or {name, device}).
    backend: tuple[str | dict[str, Any], ...] = ()
    #: The RoCE v2 GID index the tests use (roce_nic_gid_index; AMD and CVS use 3).
    gid_index: int = Field(default=3, ge=0, le=255)


def backend_ports(node: MeasuredHost, declared: tuple[str | dict[str, Any], ...]) -> list[Backend]:
    """The node's backend ports, in the declared order (else ``rdma link``'s)."""
    links = node.fact(RdmaLink)
    if not links.ports:
        raise MeasureError(f"no RDMA devices on {node.host}: {links.missing}")
    if not declared:
        return [
            Backend(p.name, p.device, p.netdev, p.state)
            for p in links.ports
            if "bond" not in p.device and p.physical_state != "DISABLED"
        ]
    found = []
    for entry in declared:
        name, device = (entry, None) if isinstance(entry, str) else (entry.get("name"), None)
        if isinstance(entry, dict):
            device = entry.get("device")
        port = links.by_device(device) if device else links.by_netdev(str(name))
        if port is None:
            label = f"{device or name} (declared)"
            found.append(Backend(label, str(device or name), str(name), "MISSING"))
        else:
            found.append(Backend(port.name, port.device, port.netdev, port.state))
    return found


def _sysfs(node: MeasuredHost, ports: list[Backend], gid_index: int) -> dict[str, list[str]]:
    """Per port: its netdev's speed (Mb/s), the GID at ``gid_index`` and its type."""
    script = "; ".join(
        f"printf '%s|%s|%s|%s\\n' {quote(p.name)} "
        f'"$(cat /sys/class/net/{quote(p.netdev or "-")}/speed 2>/dev/null)" '
        f'"$(cat {ib}/gids/{gid_index} 2>/dev/null)" '
        f'"$(cat {ib}/gid_attrs/types/{gid_index} 2>/dev/null)"'
        for p in ports
        for ib in [f"/sys/class/infiniband/{quote(p.device)}/ports/1"]
    )
    out = node.output(script or "true")
    return {line.split("|")[0]: line.split("|")[1:] for line in out.splitlines() if "|" in line}


@kind("rdma_ports", BackendParams)
def rdma_ports(node: MeasuredHost, p: BackendParams) -> dict[str, Any]:
    """The backend RDMA ports: state, link layer, MTUs, link speed, the GID at gid_index."""
    ports = backend_ports(node, p.backend)
    every = rdma(node)["ports"]
    extra = _sysfs(node, ports, p.gid_index)
    data: dict[str, Any] = {}
    for port in ports:
        speed, gid, gid_type = extra.get(port.name, ["", "", ""])
        zero = not gid or set(gid.replace(":", "")) == {"0"}
        data[port.name] = {
            **every.get(port.name, {"state": port.state, "netdev": port.netdev}),
            "speed_mbps": int(speed) if speed.lstrip("-").isdigit() else None,
            "gid": gid or None,
            "gid_type": None if zero else (gid_type or None),
        }
    others = sorted(set(every) - set(data))
    return {
        "count": len(data),
        "active": sum(1 for port in data.values() if port["state"] == "ACTIVE"),
        "backend": "declared" if p.backend else "every RDMA port but bonds and disabled ones",
        "not_counted": others,
        "gid_index": p.gid_index,
        "ports": data,
    }


def _speed(node: MeasuredHost, ports: list[Backend]) -> dict[str, int | None]:
    return {
        name: int(v[0]) if v[0].isdigit() else None for name, v in _sysfs(node, ports, 0).items()
    }


def _command(device: str, gid: int, port: int, *, rocm: int | None, qps: int, to: str) -> str:
    argv: list[Any] = ["ib_write_bw", "-x", gid, "-a", "-b", "-F", "-d", device, "-q", qps]
    argv += ["-p", port, "--report_gbits"]
    if rocm is not None:
        argv.append(f"--use_rocm={rocm}")
    return " ".join(quote(str(a)) for a in [*argv, *([to] if to else [])])


def _best(text: str) -> float:
    """The best average Gb/s of any message size ("at some point during the test")."""
    return max(row["bw_average"] for row in parse_ib_write_bw(text)["rows"])


# -- GPU to NIC (one node) ----------------------------------------------------------------------


class AdjacentGpus(Params):
    #: The GPU adjacent to each backend NIC (device or netdev -> GPU index); default: the i-th
    #: backend port's GPU is GPU i (one NIC per GPU, in the order they are declared).
    gpus: dict[str, int] = Field(default={})

    def adjacent(self, port: Backend, index: int) -> int:
        """The GPU adjacent to ``port``, the ``index``-th backend port."""
        return self.gpus.get(port.device, self.gpus.get(port.netdev or "", index))


class GpuNicParams(BackendParams, AdjacentGpus):
    qps: int = Field(default=1, gt=0)
    port: int = Field(default=18515, gt=0, lt=65536)
    #: Seconds each side may run (``timeout``); -a runs every message size from 2 B to 8 MiB.
    limit: int = Field(default=300, gt=0)


@kind("ib_write_bw", GpuNicParams)
def gpu_nic(node: MeasuredHost, p: GpuNicParams) -> dict[str, Any]:
    """AMD's GPU to NIC ib_write_bw loopback on each backend NIC: best Gb/s, % of line rate."""
    node.require("ib_write_bw")
    ports = backend_ports(node, p.backend)
    speeds = _speed(node, ports)
    data: dict[str, Any] = {}
    for index, port in enumerate(ports):
        gpu = p.adjacent(port, index)
        server = _command(port.device, p.gid_index, p.port, rocm=None, qps=p.qps, to="")
        client = _command(port.device, p.gid_index, p.port, rocm=gpu, qps=p.qps, to=LOOPBACK)
        script = (
            f"timeout {p.limit} {server} >/dev/null 2>&1 & server=$!; sleep {CLIENT_DELAY}; "
            f"timeout {p.limit} {client}; rc=$?; wait $server; exit $rc"
        )
        result = node.run(script, timeout=p.limit + 30)
        entry: dict[str, Any] = {"device": port.device, "gpu": gpu}
        entry["speed_mbps"] = speeds.get(port.name)
        try:
            if not result.ok:
                tail = (result.stderr or result.stdout).strip()[-300:]
                raise MeasureError(f"ib_write_bw on {port.device} exited {result.rc}: {tail}")
            entry["bw_gbps"] = _best(result.stdout)
        except MeasureError as exc:  # this NIC fails its check; the others are still measured
            entry |= {"bw_gbps": 0.0, "error": str(exc)}
        entry["line_rate_pct"] = _percent(entry["bw_gbps"], entry["speed_mbps"], 1)
        data[port.name] = entry
    return {"ports": data}


def _percent(gbps: float, speed_mbps: int | None, directions: int) -> float | None:
    """``gbps`` in percent of ``directions`` times the link's line rate."""
    return round(100 * gbps / (directions * speed_mbps / 1000), 2) if speed_mbps else None


# -- node pairs -------------------------------------------------------------------------------


def plan_pairs(hosts: list[str]) -> list[list[tuple[str, str]]]:
    """Rounds of (server, client) node pairs: neighbours pair up; with an odd count the last
    node pairs, in a round of its own, with the first. Every node is in a pair, no pair is
    tested twice, and no node (so no NIC) is in two pairs of a round."""
    rounds = [[(hosts[i], hosts[i + 1]) for i in range(0, len(hosts) - 1, 2)]]
    if len(hosts) % 2 and len(hosts) > 1:
        rounds.append([(hosts[-1], hosts[0])])
    return rounds if len(hosts) > 1 else []


class PairParams(BackendParams):
    #: How the other node of a pair reaches this one when it is the server (its address).
    address: str
    #: The first TCP port; the i-th NIC pair uses port + i.
    port: int = Field(default=18515, gt=0, lt=65536)
    limit: int = Field(default=300, gt=0)


class BwPairParams(PairParams, AdjacentGpus):
    qps: int = Field(default=1, gt=0)
    #: GPU to GPU: each side's buffers in the GPU adjacent to its NIC (``--use_rocm``).
    use_rocm: bool = False


_MARK = re.compile(r"^@@fxkit (\d+) (\d+)$", re.M)


def _parallel(commands: list[str], limit: int, delay: int = 0) -> str:
    """A script running ``commands`` at once, then printing each one's output after a line
    ``@@fxkit INDEX RC``."""
    runs = " ".join(
        f'( timeout {limit} {c} >"$d/{i}" 2>&1; echo $? >"$d/{i}.rc" ) &'
        for i, c in enumerate(commands)
    )
    show = "; ".join(
        f'echo "@@fxkit {i} $(cat "$d/{i}.rc")"; cat "$d/{i}"' for i in range(len(commands))
    )
    return f'sleep {delay}; d=$(mktemp -d); {runs} wait; {show}; rm -rf "$d"'


def _outputs(text: str, count: int) -> list[tuple[int, str]]:
    parts = _MARK.split(text)
    found = {int(parts[i]): (int(parts[i + 1]), parts[i + 2]) for i in range(1, len(parts), 3)}
    return [found.get(i, (-1, "no output")) for i in range(count)]


class _Side(NamedTuple):
    host: str
    node: MeasuredHost
    params: PairParams
    ports: list[Backend]
    speeds: dict[str, int | None]


def _pairs(
    nodes: dict[str, MeasuredHost],
    params: Mapping[str, PairParams],
    tool: str,
    command: Any,
    judge: Any,
) -> dict[str, Any]:
    """Run ``tool`` on every pair of :func:`plan_pairs`; ``command(side, port, i, to)`` is the
    argv of one NIC's side, ``judge(server_out, client_out, server, client, i)`` one test's
    result for both ports."""
    out: dict[str, Any] = {}
    sides: dict[str, _Side] = {}
    for host, node in nodes.items():
        try:
            node.require(tool)
            ports = backend_ports(node, params[host].backend)
            sides[host] = _Side(host, node, params[host], ports, _speed(node, ports))
        except MeasureError as exc:
            out[host] = exc
    rounds = plan_pairs(list(sides))
    if not rounds:
        for host in sides:
            out[host] = MeasureError(f"{tool} between nodes needs a second node to pair with")
        return out
    results: dict[str, dict[str, list[dict[str, Any]]]] = {h: {} for h in sides}
    for round_number, pairs in enumerate(rounds, 1):
        if any(side.node.stop.is_set() for side in sides.values()):  # Ctrl-C: no more rounds
            return {
                **out,
                **{h: MeasureError("interrupted (Ctrl-C) between rounds") for h in sides},
            }
        with ThreadPoolExecutor(max_workers=2 * len(pairs)) as pool:
            runs = [
                (
                    s,
                    c,
                    pool.submit(_side, sides[s], command, ""),
                    pool.submit(_side, sides[c], command, sides[s].params.address),
                )
                for s, c in pairs
            ]
            for s, c, server, client in runs:
                for i, (a, b) in enumerate(zip(sides[s].ports, sides[c].ports, strict=False)):
                    test = judge(server.result()[i], client.result()[i], sides[s], sides[c], i)
                    test["round"] = round_number
                    results[s].setdefault(a.name, []).append(
                        {**test, "peer": c, "peer_port": b.name, "role": "server"}
                    )
                    results[c].setdefault(b.name, []).append(
                        {**test, "peer": s, "peer_port": a.name, "role": "client"}
                    )
    for host, tested in results.items():
        out[host] = {"rounds": len(rounds), "ports": {n: _worst(t) for n, t in tested.items()}}
        unpaired = [p.name for p in sides[host].ports if p.name not in tested]
        for name in unpaired:  # more backend ports than the peer has: not tested
            out[host]["ports"][name] = {
                "error": "the paired node has no port to test against",
                "line_rate_pct": 0.0,
                "connected": False,
                "tests": [],
            }
    return out


def _side(side: _Side, command: Any, to: str) -> list[tuple[int, str]]:
    argv = [command(side, port, i, to) for i, port in enumerate(side.ports)]
    delay = CLIENT_DELAY if to else 0
    result = side.node.run(
        _parallel(argv, side.params.limit, delay), timeout=side.params.limit + 60
    )
    return _outputs(result.stdout, len(argv))


def _worst(tests: list[dict[str, Any]]) -> dict[str, Any]:
    """A port's result: its worst test, with every test listed."""
    worst = min(tests, key=lambda t: (t.get("connected", True), t.get("line_rate_pct") or 0))
    return {**worst, "tests": tests}


def _bw_command(side: _Side, port: Backend, i: int, to: str) -> str:
    p = side.params
    assert isinstance(p, BwPairParams)
    rocm = p.adjacent(port, i) if p.use_rocm else None
    return _command(port.device, p.gid_index, p.port + i, rocm=rocm, qps=p.qps, to=to)


def _bw_judge(
    server: tuple[int, str], client: tuple[int, str], s: _Side, c: _Side, i: int
) -> dict[str, Any]:
    speeds = [s.speeds.get(s.ports[i].name), c.speeds.get(c.ports[i].name)]
    slower = min((x for x in speeds if x), default=None)
    test: dict[str, Any] = {"speed_mbps": slower}
    try:
        reports = []
        for (rc, text), name in ((server, "server"), (client, "client")):
            if rc != 0:
                raise MeasureError(f"the {name} exited {rc}: {text.strip()[-300:]}")
            reports.append(_best(text))
        test |= {"server_gbps": reports[0], "client_gbps": reports[1], "bw_gbps": min(reports)}
    except MeasureError as exc:
        test |= {"bw_gbps": 0.0, "error": str(exc)}
    test["line_rate_pct"] = _percent(test["bw_gbps"], slower, 2)
    return test


@fleet_kind("ib_write_bw_pairs", BwPairParams)
def ib_write_bw_pairs(nodes: dict[str, MeasuredHost], params: dict[str, BwPairParams]) -> Any:
    """AMD's NIC to NIC ib_write_bw -b across node pairs: per port, the lower side's Gb/s."""
    return _pairs(nodes, params, "ib_write_bw", _bw_command, _bw_judge)


def _pp_command(side: _Side, port: Backend, i: int, to: str) -> str:
    p = side.params
    argv = ["ibv_rc_pingpong", "-d", port.device, "-g", p.gid_index, "-p", p.port + i]
    return " ".join(quote(str(a)) for a in [*argv, *([to] if to else [])])


_PP_DONE = re.compile(r"^(\d+) bytes in ([\d.]+) seconds = ([\d.]+) Mbit/sec$", re.M)
_PP_LOCAL = re.compile(r"local address:\s+LID \S+ QPN \S+ PSN \S+ GID (\S+)")


def _pp_judge(
    server: tuple[int, str], client: tuple[int, str], s: _Side, c: _Side, i: int
) -> dict[str, Any]:
    """A pingpong test passes when both sides exchanged their messages (rc 0, the ``bytes in
    ... Mbit/sec`` line), as CVS's preflight reads it (cvs/lib/preflight/rdma_connectivity.py)."""
    problems = [
        f"{name}: exit {rc}: {text.strip()[-200:]}"
        for (rc, text), name in ((server, "server"), (client, "client"))
        if rc != 0 or not _PP_DONE.search(text)
    ]
    gids = [m[1] if (m := _PP_LOCAL.search(text)) else None for _, text in (server, client)]
    return {
        "connected": not problems,
        "gids": gids,
        **({"error": "; ".join(problems)} if problems else {}),
    }


@fleet_kind("rc_pingpong_pairs", PairParams)
def rc_pingpong_pairs(nodes: dict[str, MeasuredHost], params: dict[str, PairParams]) -> Any:
    """ibv_rc_pingpong between node pairs on every backend NIC: connected or not."""
    return _pairs(nodes, params, "ibv_rc_pingpong", _pp_command, _pp_judge)


# -- RCCL across two nodes ----------------------------------------------------------------------


class RcclPairParams(RcclParams):
    #: How the other node of a pair reaches this one (mpirun's -H).
    address: str
    #: Open MPI's launcher (a ROCm-aware build: rccl-benchmarking.md), and its options before the
    #: program (``[-x, NCCL_IB_HCA=mlx5_0, --mca, pml, ucx]``).
    mpirun: str = "mpirun"
    mpi_args: tuple[str, ...] = ()
    limit: int = Field(default=1800, gt=0)


class _RcclSide(NamedTuple):
    host: str
    node: MeasuredHost
    params: RcclPairParams


def _rccl_pair(a: _RcclSide, b: _RcclSide) -> dict[str, Any]:
    """all_reduce_perf on the nodes of a pair, one rank per GPU, launched from ``a``."""
    p = a.params
    argv = [p.mpirun, "-np", p.gpus + b.params.gpus]
    argv += ["-H", f"{p.address}:{p.gpus},{b.params.address}:{b.params.gpus}", *p.mpi_args]
    command = " ".join(quote(str(x)) for x in [*argv, *all_reduce_argv(p, 1)])
    result = a.node.run(f"timeout {p.limit} {command}", timeout=p.limit + 30)
    if not result.ok:
        tail = (result.stderr or result.stdout).strip()[-300:]
        raise MeasureError(f"mpirun on {a.host} with {b.host} exited {result.rc}: {tail}")
    return all_reduce_result(result.stdout, p)


@fleet_kind("rccl_pairs", RcclPairParams)
def rccl_pairs(nodes: dict[str, MeasuredHost], params: dict[str, RcclPairParams]) -> Any:
    """rccl-tests all_reduce_perf across node pairs under mpirun: each pair's bus bandwidth."""
    out: dict[str, Any] = {}
    sides: dict[str, _RcclSide] = {}
    for host, node in nodes.items():
        try:
            node.require(params[host].mpirun)
            node.require(params[host].binary)
            sides[host] = _RcclSide(host, node, params[host])
        except MeasureError as exc:
            out[host] = exc
    rounds = plan_pairs(list(sides))
    if not rounds:
        return {**out, **{h: MeasureError("RCCL between nodes needs a second node") for h in sides}}
    tests: dict[str, list[dict[str, Any] | MeasureError]] = {h: [] for h in sides}
    for number, pairs in enumerate(rounds, 1):
        if any(side.node.stop.is_set() for side in sides.values()):
            return {
                **out,
                **{h: MeasureError("interrupted (Ctrl-C) between rounds") for h in sides},
            }
        with ThreadPoolExecutor(max_workers=len(pairs)) as pool:
            runs = [(s, c, pool.submit(_rccl_pair, sides[s], sides[c])) for s, c in pairs]
            for s, c, run in runs:
                try:
                    result: dict[str, Any] | MeasureError = run.result()
                except MeasureError as exc:
                    result = exc
                for host, peer in ((s, c), (c, s)):
                    tests[host].append(
                        result
                        if isinstance(result, MeasureError)
                        else {**result, "peer": peer, "launcher": s, "round": number}
                    )
    for host, done in tests.items():  # a node in two pairs (an odd count): its worse one
        errors = [t for t in done if isinstance(t, MeasureError)]
        results = [t for t in done if not isinstance(t, MeasureError)]
        out[host] = errors[0] if errors else min(results, key=lambda t: t["in_place_busbw_gbps"])
    return out
