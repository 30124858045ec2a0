"""Storage read bandwidth, measured as the fabric allows (fio, as the ``fio`` kind runs it):

    measure: {fio_paced: {target: /mnt/models/.fxkit-g1.fio, at_once: 1}}
    measure: {fio_fleet: {target: /mnt/models/.fxkit-g1.fio, line_rate_gbps: 12.5}}

- ``fio_paced``: each node's read bandwidth with at most ``at_once`` nodes reading at a time
  (1: each alone; the count of the storage targets' ports: one node per port). Four nodes
  reading 5 GB/s each at once exceed one 100GbE port, and would fail a per-node minimum the
  port, not the node, cannot carry.
- ``fio_fleet``: every node at once; each node's data carries the fleet's sum
  (``aggregate_gbps``) and its percent of the targets' combined line rate.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

from pydantic import Field

from fxkit.gate.measure import MeasuredHost, MeasureError, fleet_kind
from fxkit.gate.measures.bench import FioParams, fio


class PacedParams(FioParams):
    #: Nodes reading at the same time (the gate's setting: g1_storage_nodes_at_once).
    at_once: int = Field(default=1, gt=0)


class FleetParams(FioParams):
    #: The storage targets' ports, combined, in GB/s (one 100GbE port: 12.5).
    line_rate_gbps: float = Field(gt=0)


def _read(nodes: dict[str, MeasuredHost], params: dict[str, Any]) -> dict[str, Any]:
    """fio on every node of ``nodes`` at once: each node's data, or its MeasureError."""

    def one(host: str) -> Any:
        try:
            return fio(nodes[host], params[host])
        except MeasureError as exc:
            return exc

    with ThreadPoolExecutor(max_workers=max(1, len(nodes))) as pool:
        return dict(zip(nodes, pool.map(one, nodes), strict=True))


@fleet_kind("fio_paced", PacedParams)
def fio_paced(nodes: dict[str, MeasuredHost], params: dict[str, PacedParams]) -> Any:
    """fio read on each node, at most at_once nodes at a time: GB/s per node."""
    hosts = list(nodes)
    at_once = min(p.at_once for p in params.values())
    out: dict[str, Any] = {}
    for wave, start in enumerate(range(0, len(hosts), at_once), 1):
        group = hosts[start : start + at_once]
        if any(node.stop.is_set() for node in nodes.values()):  # Ctrl-C: no more waves
            return {**out, **{h: MeasureError("interrupted (Ctrl-C)") for h in hosts[start:]}}
        read = _read({h: nodes[h] for h in group}, params)
        for host, data in read.items():
            out[host] = (
                data
                if isinstance(data, MeasureError)
                else {**data, "at_once": at_once, "wave": wave, "read_with": group}
            )
    return out


@fleet_kind("fio_fleet", FleetParams)
def fio_fleet(nodes: dict[str, MeasuredHost], params: dict[str, FleetParams]) -> Any:
    """fio read on every node at once: the fleet's GB/s against the targets' line rate."""
    read = _read(nodes, params)
    failed = sorted(h for h, d in read.items() if isinstance(d, MeasureError))
    if failed:
        reason = f"fio failed on {', '.join(failed)}: the fleet's sum is not known"
        return {
            h: d if isinstance(d, MeasureError) else MeasureError(reason) for h, d in read.items()
        }
    total = round(sum(d["read_gbps"] for d in read.values()), 4)
    line = min(p.line_rate_gbps for p in params.values())
    return {
        host: {
            **data,
            "aggregate_gbps": total,
            "nodes": len(read),
            "line_rate_gbps": line,
            "aggregate_line_rate_pct": round(100 * total / line, 2),
        }
        for host, data in read.items()
    }
