"""``soak``: a workload repeated for a duration while the node's error counters are watched (G4).

    measure: {soak: {run: "fio --name=soak ...", duration: 72h, interval: 5m}}

The workload runs again and again, one command over SSH per iteration (no command is held open
for the whole soak); an iteration that fails (rc != 0, or past ``iteration_timeout``) is counted
and the soak goes on. At the start, every ``interval`` and at the end, each error counter source
is read, one short command each:

- ``nvme``: ``nvme smart-log /dev/nvmeN -o json`` of every controller in /sys/class/nvme
  (``media_errors``, ``num_err_log_entries``);
- ``rdma``: the port counters of /sys/class/infiniband/DEV/ports/N/counters and hw_counters
  (the kernel's ``symbol_error``, ``link_downed``, ``port_rcv_errors``..., the driver's
  ``out_of_sequence``, ``packet_seq_err``...);
- ``gpu``: ``amd-smi metric --ecc --json`` (``total_uncorrectable_count``,
  ``total_deferred_count``, ``total_correctable_count`` per GPU).

The data: ``iterations``, ``workload_errors``, per source ``errors`` (the sum of the watched
counters' increases) and ``deltas`` (each counter that rose), or ``missing`` (why the source
cannot be read: its check is then ERROR with that reason, never PASS), and ``latency``: the
median of the first ``window`` iterations against the last ones, and ``degradation``, their
relative change. The latency is each iteration's wall time (with the SSH round trip, a few ms),
or the number ``latency_pattern``'s first group finds in the workload's output (ms). Ctrl-C stops
the soak before its next iteration; what it has is returned, with ``interrupted: true``.
"""

from __future__ import annotations

import json
import re
import shlex
import statistics
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import field_validator

from fxkit.errors import FxkitError
from fxkit.gate.measure import MeasuredHost, MeasureError, Params, kind, regex

Source = Literal["nvme", "rdma", "gpu"]
#: The key of a source (or a value) that could not be measured: why (see results.judge).
MISSING = "missing"
#: At most this many samples are kept (then every other one is dropped: the whole span stays).
MAX_SAMPLES = 400
#: A workload that fails this many first iterations is a wrong command, not a soak's finding.
FIRST_FAILURES = 3
_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhd]?)")
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}

#: Error counters of /sys/class/infiniband/*/ports/*/counters (the kernel's PMA counters,
#: Documentation/ABI/stable/sysfs-class-infiniband) and hw_counters (mlx5's, bnxt_re's names).
RDMA_ERRORS = (
    "symbol_error",
    "link_error_recovery",
    "link_downed",
    "port_rcv_errors",
    "port_rcv_remote_physical_errors",
    "port_rcv_switch_relay_errors",
    "port_xmit_discards",
    "port_xmit_constraint_errors",
    "port_rcv_constraint_errors",
    "local_link_integrity_errors",
    "excessive_buffer_overrun_errors",
    "VL15_dropped",
    "out_of_sequence",
    "packet_seq_err",
    "implied_nak_seq_err",
    "local_ack_timeout_err",
    "req_cqe_error",
    "resp_cqe_error",
    "req_remote_access_errors",
    "resp_remote_access_errors",
    "rx_icrc_encapsulated",
)
NVME_ERRORS = ("media_errors", "num_err_log_entries")
GPU_ERRORS = ("total_uncorrectable_count", "total_deferred_count", "total_correctable_count")


def seconds(text: str | float) -> float:
    """A duration: ``90s``, ``10m``, ``72h``, ``1h30m``, ``2d``, or a number of seconds."""
    if isinstance(text, int | float) and not isinstance(text, bool):
        value = float(text)
    else:
        spec = str(text).strip().lower()
        parts = _DURATION.findall(spec)
        bare = len(parts) > 1 and any(not unit for _, unit in parts)  # "1h30": 30 what?
        if not spec or bare or "".join(n + u for n, u in parts) != spec:
            raise ValueError(f"{text!r} is not a duration (e.g. 90s, 10m, 72h, 1h30m)")
        value = sum(float(n) * _UNITS[u] for n, u in parts)
    if value <= 0:
        raise ValueError(f"{text!r}: a duration is more than 0 s")
    return value


class SoakParams(Params):
    #: The workload: a command run once per iteration, until ``duration`` is over.
    run: str
    duration: str = "72h"
    #: How often the error counters are read (also at the start and at the end).
    interval: str = "5m"
    #: Seconds one iteration may run (past it: killed, counted as a failure); none: the check's
    #: timeout.
    iteration_timeout: str | None = None
    #: A regex whose first group is the latency (ms) in the workload's output; none: wall time.
    latency_pattern: str | None = None
    #: Iterations at the start and at the end whose latencies are compared.
    window: int = 10
    #: A program the workload needs (checked first: "fio not found" rather than every run failing).
    tool: str | None = None
    sources: tuple[Source, ...] = ("nvme", "rdma", "gpu")
    nvme_counters: tuple[str, ...] = NVME_ERRORS
    rdma_counters: tuple[str, ...] = RDMA_ERRORS
    gpu_counters: tuple[str, ...] = GPU_ERRORS

    @field_validator("duration", "interval", "iteration_timeout")
    @classmethod
    def _duration(cls, value: str | None) -> str | None:
        if value is not None:
            seconds(value)
        return value

    @field_validator("latency_pattern")
    @classmethod
    def _pattern(cls, value: str | None) -> str | None:
        if value is not None and regex(value, "latency_pattern").groups < 1:
            raise ValueError("latency_pattern needs a group: (...) around the number")
        return value

    @field_validator("window")
    @classmethod
    def _window(cls, value: int) -> int:
        if value < 1:
            raise ValueError("window is at least 1 iteration")
        return value


class Missing(Exception):
    """A counter source that cannot be read on this host (the reason)."""


Counters = dict[str, int]


@dataclass
class _Watch:
    """One source's counters: how much each rose from reading to reading (a counter that went
    down was reset: all of its new value counts), and the readings that failed."""

    name: str
    read: Callable[[], Counters]
    last: Counters | None = None
    rises: Counters = field(default_factory=dict)
    missing: str | None = None
    failed_reads: int = 0
    last_failure: str | None = None

    def sample(self) -> None:
        if self.missing is not None:
            return
        try:
            now = self.read()
        except Missing as exc:
            if self.last is None:
                self.missing = str(exc)
            else:
                self.failed_reads, self.last_failure = self.failed_reads + 1, str(exc)
            return
        for key, value in now.items():
            before = (self.last or {}).get(key, value)
            rise = value - before if value >= before else value
            if rise:
                self.rises[key] = self.rises.get(key, 0) + rise
        self.last = now

    def deltas(self) -> Counters:
        """Each counter that rose, by how much."""
        return dict(self.rises)

    def errors(self) -> int:
        return sum(self.rises.values())

    def data(self) -> dict[str, Any]:
        if self.missing is not None:
            return {MISSING: self.missing}
        return {
            "errors": self.errors(),
            "deltas": self.deltas(),
            "counters": len(self.last or {}),
            "failed_reads": self.failed_reads,
            "last_failure": self.last_failure,
        }


@kind("soak", SoakParams)
def soak(node: MeasuredHost, p: SoakParams) -> dict[str, Any]:
    """A workload repeated for a duration: its failures, latency drift and error counters."""
    if p.tool:
        node.require(p.tool)
    duration, interval = seconds(p.duration), seconds(p.interval)
    limit = seconds(p.iteration_timeout) if p.iteration_timeout else node.timeout
    pattern = re.compile(p.latency_pattern) if p.latency_pattern else None
    readers = {
        "nvme": (_nvme_reader, p.nvme_counters),
        "rdma": (_rdma_reader, p.rdma_counters),
        "gpu": (_gpu_reader, p.gpu_counters),
    }
    watches = [_Watch(s, reader(node, names)) for s in p.sources for reader, names in [readers[s]]]
    latency = _Latency(p.window)
    samples: list[dict[str, Any]] = []
    iterations = failures = unparsed = 0
    last_failure: str | None = None
    aborted: str | None = None

    def sample(elapsed: float) -> None:
        for watch in watches:
            watch.sample()
        samples.append(
            {
                "t_s": round(elapsed, 1),
                "iterations": iterations,
                "workload_errors": failures,
                "latency_ms": latency.recent(),
                **{w.name: w.errors() for w in watches if w.missing is None},
            }
        )
        if len(samples) > MAX_SAMPLES:
            samples[:] = samples[::2]

    started = time.monotonic()
    sample(0.0)
    next_sample = interval
    while not node.stop.is_set() and time.monotonic() - started < duration:
        begin = time.monotonic()
        try:
            result = node.run(p.run, timeout=limit)
        except FxkitError as exc:  # the host went away: count it and keep what was measured
            failures, last_failure, aborted = failures + 1, str(exc), str(exc)
            break
        wall_ms = (time.monotonic() - begin) * 1000
        iterations += 1
        if not result.ok:
            failures += 1
            last_failure = f"exit {result.rc}: {(result.stderr or result.stdout).strip()[-300:]}"
            if failures == iterations == FIRST_FAILURES:
                raise MeasureError(
                    f"the workload failed its first {FIRST_FAILURES} iterations ({last_failure}): "
                    "fix the command (g4_workload) before a soak of it"
                )
        else:
            value = _latency(result.stdout, pattern) if pattern else wall_ms
            if value is None:
                unparsed += 1
            else:
                latency.add(value)
        elapsed = time.monotonic() - started
        if elapsed >= next_sample:
            sample(elapsed)
            next_sample = elapsed + interval
    elapsed = time.monotonic() - started
    if aborted is None:
        sample(elapsed)
    return {
        "duration_s": round(elapsed, 1),
        "planned_s": duration,
        "interrupted": node.stop.is_set(),
        "aborted": aborted,
        "iterations": iterations,
        "workload_errors": failures,
        "last_failure": last_failure,
        "latency": latency.data(unparsed, "output" if pattern else "wall"),
        **{w.name: w.data() for w in watches},
        "samples": samples,
    }


class _Latency:
    """The first ``window`` latencies, the last ``window`` and running totals (bounded)."""

    def __init__(self, window: int) -> None:
        self.window = window
        self.first: list[float] = []
        self.last: deque[float] = deque(maxlen=window)
        self.count = 0
        self.total = 0.0
        self.max = 0.0
        self.since_sample: list[float] = []

    def add(self, ms: float) -> None:
        if len(self.first) < self.window:
            self.first.append(ms)
        self.last.append(ms)
        self.count += 1
        self.total += ms
        self.max = max(self.max, ms)
        self.since_sample.append(ms)

    def recent(self) -> float | None:
        """The median latency since the last sample (then forgotten)."""
        value = statistics.median(self.since_sample) if self.since_sample else None
        self.since_sample = []
        return round(value, 3) if value is not None else None

    def data(self, unparsed: int, source: str) -> dict[str, Any]:
        if self.count < 2:
            why = f"{self.count} successful iteration(s) timed: too few to compare the first"
            return {MISSING: f"{why} with the last (a longer duration, or a shorter workload)"}
        # With fewer than 2 x window iterations, the two halves are compared.
        size = min(self.window, self.count // 2)
        first = statistics.median(self.first[:size])
        last = statistics.median(list(self.last)[-size:])
        return {
            "source": source,
            "first_ms": round(first, 3),
            "last_ms": round(last, 3),
            "window": size,
            "degradation": (last - first) / first if first else None,
            "mean_ms": round(self.total / self.count, 3),
            "max_ms": round(self.max, 3),
            "measured": self.count,
            "unparsed": unparsed,
        }


def _latency(out: str, pattern: re.Pattern[str]) -> float | None:
    found = pattern.search(out)
    try:
        return float(found.group(1)) if found else None
    except (TypeError, ValueError):
        return None


# -- the counter sources ------------------------------------------------------------------------


def _nvme_reader(node: MeasuredHost, names: tuple[str, ...]) -> Callable[[], Counters]:
    script = (
        'for c in /sys/class/nvme/nvme*; do [ -e "$c" ] || continue; n=${c##*/}; '
        'echo "== $n"; nvme smart-log "/dev/$n" -o json 2>&1 || echo "== $n failed"; done'
    )

    def read() -> Counters:
        out = _output(node, script, "nvme")
        if not out.strip():
            raise Missing(f"no NVMe controllers on {node.host} (/sys/class/nvme is empty)")
        if not node.run("command -v nvme >/dev/null 2>&1").ok:
            raise Missing(f"nvme not found on {node.host} (install nvme-cli)")
        return parse_nvme_smart_logs(out, names)

    return read


def parse_nvme_smart_logs(out: str, names: tuple[str, ...]) -> Counters:
    """``== nvme0`` then that controller's ``nvme smart-log -o json``, for each controller."""
    counters: Counters = {}
    blocks = re.split(r"^== (\S+)\n", out, flags=re.M)[1:]
    for controller, text in zip(blocks[::2], blocks[1::2], strict=True):
        if text.rstrip().endswith(f"== {controller} failed"):
            raise Missing(f"nvme smart-log /dev/{controller} failed: {text.strip()[-200:]}")
        try:
            log = json.loads(text)
        except json.JSONDecodeError:
            raise Missing(f"nvme smart-log /dev/{controller}: not JSON: {text[:80]!r}") from None
        for name in names:
            if isinstance(log.get(name), int):
                counters[f"{controller}/{name}"] = log[name]
    return counters


def _rdma_reader(node: MeasuredHost, names: tuple[str, ...]) -> Callable[[], Counters]:
    script = (
        'for d in /sys/class/infiniband/*; do [ -e "$d" ] || continue; echo "dev ${d##*/}"; '
        'for f in "$d"/ports/*/counters/* "$d"/ports/*/hw_counters/*; do [ -f "$f" ] && '
        'v=$(cat "$f" 2>/dev/null) && echo "ctr ${d##*/} ${f#"$d"/ports/} $v"; done; done'
    )

    def read() -> Counters:
        out = _output(node, script, "rdma")
        if not out.strip():
            raise Missing(f"no RDMA devices on {node.host} (/sys/class/infiniband is empty)")
        counters = parse_rdma_counters(out, names)
        if not counters:
            raise Missing(
                f"the RDMA devices of {node.host} have none of the error counters watched "
                "under /sys/class/infiniband/*/ports/*/{counters,hw_counters}"
            )
        return counters

    return read


def parse_rdma_counters(out: str, names: tuple[str, ...]) -> Counters:
    """``ctr DEV PORT/counters/NAME VALUE`` lines as ``DEV/PORT/NAME: VALUE`` (those named)."""
    wanted = set(names)
    counters: Counters = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) != 4 or parts[0] != "ctr":
            continue
        dev, path, value = parts[1], parts[2].split("/"), parts[3]
        if len(path) == 3 and path[2] in wanted and value.isdigit():
            counters[f"{dev}/{path[0]}/{path[2]}"] = int(value)
    return counters


def _gpu_reader(node: MeasuredHost, names: tuple[str, ...]) -> Callable[[], Counters]:
    def read() -> Counters:
        if not node.run("command -v amd-smi >/dev/null 2>&1").ok:
            raise Missing(f"amd-smi not found on {node.host} (install ROCm's amd-smi)")
        return parse_amd_smi_ecc(_output(node, "amd-smi metric --ecc --json", "gpu"), names)

    return read


def parse_amd_smi_ecc(out: str, names: tuple[str, ...]) -> Counters:
    """``amd-smi metric --ecc --json``: ``[{"gpu": 0, "ecc": {...}}]`` (ROCm 6) or
    ``{"gpu_data": [...]}`` (ROCm 7) as ``gpuN/NAME: count`` (``N/A`` counts left out)."""
    try:
        data = json.loads(out)
    except json.JSONDecodeError as exc:
        raise Missing(f"amd-smi metric --ecc --json did not print JSON ({exc.msg})") from None
    gpus = data.get("gpu_data") if isinstance(data, dict) else data
    if not isinstance(gpus, list) or not gpus:
        raise Missing("amd-smi metric --ecc --json lists no GPUs")
    counters: Counters = {}
    for gpu in gpus:
        ecc = gpu.get("ecc") if isinstance(gpu, dict) else None
        for name in names:
            value = ecc.get(name) if isinstance(ecc, dict) else None
            if isinstance(value, int) and not isinstance(value, bool):
                counters[f"gpu{gpu.get('gpu')}/{name}"] = value
    if not counters:
        raise Missing("amd-smi reports no ECC counts (N/A: RAS not supported or not enabled)")
    return counters


def _output(node: MeasuredHost, command: str, source: str) -> str:
    result = node.run(f"sh -c {shlex.quote(command)}", timeout=60)
    if not result.ok:
        tail = (result.stderr or result.stdout).strip()[-200:]
        raise Missing(f"reading the {source} counters failed (exit {result.rc}): {tail}")
    return result.stdout
