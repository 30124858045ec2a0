"""The fleet phase of a gate run: measurements across hosts, after each host's own.

A kind registered with :func:`fxkit.gate.measure.fleet_kind` (node pairs for ``ib_write_bw``
and ``ibv_rc_pingpong``, storage reads paced across the fleet) is measured once for all the
hosts whose check names it, with every host's connection at hand, when every host has made its
own measurements (nothing else runs on the hosts then). Checks with the same ``measure:`` share
one fleet measurement, as a host's checks share theirs. Each host gets its part of it as a
measurement of its own, and its checks are judged on it, in the gate file's order.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fxkit.errors import FxkitError
from fxkit.gate.measure import KINDS, MeasuredHost, MeasureError, Params
from fxkit.gate.spec import CheckSpec
from fxkit.gate.verdicts import (
    CheckResult,
    GateResult,
    HostChecks,
    Measurement,
    baseline_value,
    judge,
    skipped,
)


@dataclass(frozen=True)
class HostFleetCheck:
    """One host's check on a fleet measurement, rendered."""

    host: str
    check: CheckSpec
    skip: str | None
    kind: str
    params: Params
    rule: dict[str, Any]
    where: str


def is_fleet(kind: str) -> bool:
    return KINDS[kind].fleet


def measure_fleet(
    checks: list[HostFleetCheck],
    hosts: dict[str, HostChecks],
    nodes: dict[str, MeasuredHost],
    *,
    order: list[str],
    stop: threading.Event,
    baseline: GateResult | None = None,
    report: Callable[[str, CheckResult], None] | None = None,
) -> None:
    """Measure ``checks`` (every host's fleet checks) and judge them into ``hosts``; ``nodes``:
    the hosts still connected; ``order``: the gate's check ids, the order results keep."""
    groups: dict[str, list[HostFleetCheck]] = {}
    for item in checks:
        if item.skip is not None:
            _add(hosts, item, skipped(item.check, item.skip, item.where), report)
            continue
        key = json.dumps([item.kind, item.check.measure], sort_keys=True, default=str)
        groups.setdefault(key, []).append(item)
    for members in groups.values():
        _measure_group(members, hosts, nodes, stop, baseline, report)
    rank = {check_id: index for index, check_id in enumerate(order)}
    for host in hosts.values():
        host.checks.sort(key=lambda c: rank.get(c.id, len(rank)))


def _measure_group(
    members: list[HostFleetCheck],
    hosts: dict[str, HostChecks],
    nodes: dict[str, MeasuredHost],
    stop: threading.Event,
    baseline: GateResult | None,
    report: Callable[[str, CheckResult], None] | None,
) -> None:
    kind = members[0].kind
    params = {m.host: m.params for m in members}  # a host's checks of a group share params
    live = {h: nodes[h] for h in params if h in nodes and hosts[h].unreachable is None}
    timeout = max(m.check.timeout for m in members)
    for node in live.values():
        node.timeout = timeout
    started = time.monotonic()
    data: dict[str, Any] = {}
    if live and not stop.is_set():
        try:
            data = KINDS[kind].measure(live, {h: params[h] for h in live})
        except (MeasureError, FxkitError) as exc:
            data = {h: MeasureError(str(exc)) for h in live}
    elapsed = round(time.monotonic() - started, 3)
    index: dict[str, int] = {}
    for host_name, host_params in params.items():
        host = hosts[host_name]
        measurement = Measurement(kind, host_params.model_dump(mode="json"))
        value = data.get(host_name)
        if host.unreachable is not None:
            measurement.error = f"unreachable: {host.unreachable}"
        elif stop.is_set() and value is None:
            measurement.error = "interrupted (Ctrl-C) before it ran"
        elif isinstance(value, MeasureError) or value is None:
            measurement.error = str(value or f"{kind} did not measure {host_name}")
        else:
            measurement.data = value
        measurement.duration_s = elapsed
        index[host_name] = len(host.measurements)
        host.measurements.append(measurement)
    for item in members:
        host = hosts[item.host]
        at = index[item.host]
        base = baseline_value(baseline, item.host, item.check)
        checked = judge(item.check, item.rule, host.measurements[at], at, base, item.where)
        _add(hosts, item, checked, report)


def _add(
    hosts: dict[str, HostChecks],
    item: HostFleetCheck,
    checked: CheckResult,
    report: Callable[[str, CheckResult], None] | None,
) -> None:
    hosts[item.host].checks.append(checked)
    if report:
        report(item.host, checked)
