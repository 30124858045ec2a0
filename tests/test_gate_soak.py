"""The soak measurement (G4): durations, the counter parsers, and the driver on this machine.

Parser inputs: ``nvme smart-log -o json`` in nvme-cli's key set (json_smart_log in nvme-cli's
nvme-print-json.c; the values a real drive's log had, as quoted in a public NVMe exporter's test);
``amd-smi metric --ecc --json`` with the ``ecc`` keys amd-smi's CLI writes
(ROCm/amdsmi amdsmi_cli/amdsmi_commands.py at 7ac597a8: ``total_correctable_count``,
``total_uncorrectable_count``, ``total_deferred_count``, ``cache_*``, ``N/A`` when unsupported),
in ROCm 6's list and ROCm 7's ``{"gpu_data": [...]}`` envelopes (both as ROCm/cvs parses them);
RDMA counters under the kernel's names (Documentation/ABI/stable/sysfs-class-infiniband,
drivers/infiniband/core/sysfs.c) in the lines the soak's sampling script prints.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from fxkit.connection.local import LocalConnection
from fxkit.engine.variables import HostVars
from fxkit.facts.base import FactCache
from fxkit.gate.measure import MeasuredHost, MeasureError
from fxkit.gate.measures import soak as soak_kind
from fxkit.gate.measures.soak import (
    GPU_ERRORS,
    NVME_ERRORS,
    RDMA_ERRORS,
    Missing,
    SoakParams,
    _Watch,
    parse_amd_smi_ecc,
    parse_nvme_smart_logs,
    parse_rdma_counters,
    seconds,
)

SMART_LOG = {
    "critical_warning": 0,
    "temperature": 301,
    "avail_spare": 100,
    "spare_thresh": 5,
    "percent_used": 15,
    "data_units_read": 499296134,
    "data_units_written": 1474968593,
    "host_read_commands": 9347931143,
    "host_write_commands": 51493840602,
    "controller_busy_time": 1974546,
    "power_cycles": 290,
    "power_on_hours": 38313,
    "unsafe_shutdowns": 139,
    "media_errors": 0,
    "num_err_log_entries": 17,
    "warning_temp_time": 0,
    "critical_comp_time": 0,
}


def ecc(correctable: int | str, uncorrectable: int | str, deferred: int | str = 0) -> dict:
    return {
        "total_correctable_count": correctable,
        "total_uncorrectable_count": uncorrectable,
        "total_deferred_count": deferred,
        "cache_correctable_count": 0,
        "cache_uncorrectable_count": 0,
    }


@pytest.mark.parametrize(
    ("text", "expected"),
    [("90s", 90), ("10m", 600), ("72h", 259200), ("1h30m", 5400), ("2d", 172800), ("45", 45),
     ("1.5h", 5400), (20, 20)],
)  # fmt: skip
def test_durations(text: str | int, expected: float) -> None:
    assert seconds(text) == expected


@pytest.mark.parametrize("text", ["", "72 hours", "h", "10x", "-5m", "0s", "1h 30"])
def test_a_wrong_duration_is_refused_by_name(text: str) -> None:
    with pytest.raises(ValueError, match="duration"):
        seconds(text)


def test_soak_parameters_are_checked() -> None:
    with pytest.raises(ValueError, match="duration"):
        SoakParams(run="true", duration="3 days")
    with pytest.raises(ValueError, match="group"):
        SoakParams(run="true", latency_pattern=r"lat=\d+")
    assert SoakParams(run="true").duration == "72h"


def test_nvme_smart_logs_of_two_controllers() -> None:
    second = {**SMART_LOG, "media_errors": 2, "num_err_log_entries": 20}
    out = f"== nvme0\n{json.dumps(SMART_LOG, indent=2)}\n== nvme1\n{json.dumps(second)}\n"
    assert parse_nvme_smart_logs(out, NVME_ERRORS) == {
        "nvme0/media_errors": 0,
        "nvme0/num_err_log_entries": 17,
        "nvme1/media_errors": 2,
        "nvme1/num_err_log_entries": 20,
    }
    with pytest.raises(Missing, match="nvme smart-log /dev/nvme1 failed"):
        parse_nvme_smart_logs(
            f"== nvme0\n{json.dumps(SMART_LOG)}\n== nvme1\nPermission denied\n== nvme1 failed\n",
            NVME_ERRORS,
        )


def test_rdma_counters_watched_by_name() -> None:
    out = "\n".join(
        [
            "dev mlx5_0",
            "ctr mlx5_0 1/counters/symbol_error 0",
            "ctr mlx5_0 1/counters/link_downed 1",
            "ctr mlx5_0 1/counters/port_xmit_data 88812773",  # data, not an error
            "ctr mlx5_0 1/hw_counters/out_of_sequence 4",
            "ctr mlx5_0 1/hw_counters/np_cnp_sent 12",  # congestion, not an error
            "dev mlx5_1",
            "ctr mlx5_1 1/counters/port_rcv_errors 0",
        ]
    )
    assert parse_rdma_counters(out, RDMA_ERRORS) == {
        "mlx5_0/1/symbol_error": 0,
        "mlx5_0/1/link_downed": 1,
        "mlx5_0/1/out_of_sequence": 4,
        "mlx5_1/1/port_rcv_errors": 0,
    }


def test_amd_smi_ecc_in_both_envelopes() -> None:
    rocm6 = [{"gpu": 0, "ecc": ecc(3, 0)}, {"gpu": 1, "ecc": ecc(0, 1, 2)}]
    rocm7 = {"gpu_data": rocm6}
    for data in (rocm6, rocm7):
        counters = parse_amd_smi_ecc(json.dumps(data), GPU_ERRORS)
        assert counters["gpu0/total_correctable_count"] == 3
        assert counters["gpu1/total_uncorrectable_count"] == 1
        assert counters["gpu1/total_deferred_count"] == 2
        assert len(counters) == 6
    unsupported = [{"gpu": 0, "ecc": ecc("N/A", "N/A", "N/A")}]
    with pytest.raises(Missing, match="N/A"):
        parse_amd_smi_ecc(json.dumps(unsupported), GPU_ERRORS)


def test_counter_deltas_count_rises_and_resets() -> None:
    readings = iter(
        [{"a": 5, "b": 7, "c": 0}, {"a": 5, "b": 9, "c": 0}, {"a": 5, "b": 2, "c": 1}, {"b": 4}]
    )
    watch = _Watch("rdma", lambda: next(readings))
    watch.sample()
    watch.sample()
    assert watch.errors() == 2 and watch.deltas() == {"b": 2}
    watch.sample()  # b went down: the counter was reset, its 2 are new
    assert watch.deltas() == {"b": 4, "c": 1}
    watch.sample()
    assert watch.deltas() == {"b": 6, "c": 1} and watch.data()["counters"] == 1


def test_a_source_that_fails_later_keeps_its_counts() -> None:
    readings = iter([{"a": 1}, Missing("amd-smi: timed out"), {"a": 3}])

    def read() -> dict[str, int]:
        value = next(readings)
        if isinstance(value, Exception):
            raise value
        return value

    watch = _Watch("gpu", read)
    for _ in range(3):
        watch.sample()
    assert watch.data()["errors"] == 2 and watch.data()["failed_reads"] == 1
    assert watch.data()["last_failure"] == "amd-smi: timed out"


def test_a_source_absent_at_the_start_is_missing_with_the_reason() -> None:
    def absent() -> dict[str, int]:
        raise Missing("no RDMA devices on gpu01 (/sys/class/infiniband is empty)")

    watch = _Watch("rdma", absent)
    watch.sample()
    assert watch.data() == {"missing": "no RDMA devices on gpu01 (/sys/class/infiniband is empty)"}


# -- the driver, on this machine over a local connection ---------------------------------------


class Workload(LocalConnection):
    """This machine, on the soak's own clock (patched in by :func:`soak_clock`): each command
    takes ``step`` seconds of it, so a soak's counts do not depend on how loaded the machine is;
    ``then(n)`` runs after the n-th command (what happens meanwhile, e.g. Ctrl-C)."""

    def __init__(self, step: float, then: Callable[[int], object] = lambda n: None):
        super().__init__("localhost")
        self.step, self.then = step, then
        self.now, self.runs = 0.0, 0

    def monotonic(self) -> float:
        return self.now

    def execute(self, command, *, become, timeout, stdin):  # type: ignore[no-untyped-def]
        result = super().execute(command, become=become, timeout=timeout, stdin=stdin)
        self.now, self.runs = self.now + self.step, self.runs + 1
        self.then(self.runs)
        return result


@pytest.fixture
def soak_clock(monkeypatch: pytest.MonkeyPatch) -> Callable[..., Workload]:
    """``soak_clock(step, then)``: a :class:`Workload` whose clock the soak reads."""

    def make(step: float, then: Callable[[int], object] = lambda n: None) -> Workload:
        workload = Workload(step, then)
        monkeypatch.setattr(soak_kind, "time", workload)
        return workload

    return make


def node(conn: LocalConnection | None = None, stop: threading.Event | None = None) -> MeasuredHost:
    conn = conn or LocalConnection("localhost")
    return MeasuredHost("localhost", conn, FactCache(conn), HostVars("localhost", []), timeout=30,
                 stop=stop or threading.Event())  # fmt: skip


def measure(p: MeasuredHost, **params: object) -> dict:
    data: dict = soak_kind.soak(p, SoakParams(**params))  # type: ignore[arg-type]
    return data


def test_the_soak_counts_failed_iterations_and_goes_on(tmp_path: Path, soak_clock) -> None:
    count = tmp_path / "n"
    # every third iteration fails
    work = (
        f"n=$(($(cat {count} 2>/dev/null || echo 0) + 1)); echo $n > {count}; [ $((n % 3)) -ne 0 ]"
    )
    data = measure(
        node(soak_clock(0.25)), run=work, duration="2s", interval="1s", sources=()
    )  # fmt: skip
    assert data["iterations"] == int(count.read_text()) == 8  # 2 s, 0.25 s each
    assert data["workload_errors"] == 2
    assert data["last_failure"].startswith("exit 1")
    assert data["latency"]["source"] == "wall" and data["latency"]["measured"] == 6
    assert data["latency"]["first_ms"] == 250.0
    assert data["duration_s"] == 2.0 and not data["interrupted"]
    # at the start, every second, and at the end
    assert [(s["t_s"], s["iterations"]) for s in data["samples"]] == [
        (0, 0), (1.0, 4), (2.0, 8), (2.0, 8)
    ]  # fmt: skip


def test_latency_from_the_workloads_output_and_its_degradation(tmp_path: Path, soak_clock) -> None:
    count = tmp_path / "n"
    # the workload prints a latency that grows from 10 ms by 1 ms an iteration
    work = (f"n=$(($(cat {count} 2>/dev/null || echo 0) + 1)); echo $n > {count}; "
            "echo \"lat: $((9 + n)).0 ms\"")  # fmt: skip
    data = measure(
        node(soak_clock(0.25)), run=work, duration="1.5s", interval="1s", sources=(),
        latency_pattern=r"lat: ([\d.]+) ms", window=3,
    )  # fmt: skip
    assert data["iterations"] == int(count.read_text()) == 6
    latency = data["latency"]
    assert latency["source"] == "output" and latency["first_ms"] == 11.0  # 10, 11, 12
    assert latency["last_ms"] == 14.0  # 13, 14, 15
    assert latency["degradation"] == pytest.approx(3 / 11)


def test_ctrl_c_stops_the_soak_with_what_it_has(soak_clock) -> None:
    stop = threading.Event()
    # Ctrl-C in the middle of the third iteration: it ends, and no other starts.
    workload = soak_clock(1, then=lambda n: n == 3 and stop.set())
    data = measure(node(workload, stop), run="true", duration="1h", interval="10m", sources=())
    assert data["interrupted"] and data["iterations"] == 3 and data["duration_s"] == 3
    assert data["samples"][-1]["iterations"] == 3


def test_counters_absent_here_are_missing_with_the_reason() -> None:
    if Path("/sys/class/infiniband").exists() or Path("/sys/class/nvme").exists():
        pytest.skip("this machine has RDMA or NVMe devices")
    data = measure(node(), run="true", duration="0.3s", interval="1s")
    assert "(/sys/class/infiniband is empty)" in data["rdma"]["missing"]
    assert "(/sys/class/nvme is empty)" in data["nvme"]["missing"]
    assert "amd-smi not found" in data["gpu"]["missing"]


def test_a_workload_that_never_works_is_an_error_not_a_soak() -> None:
    with pytest.raises(MeasureError, match=r"failed its first 3 iterations \(exit 2: nope"):
        measure(node(), run="echo nope >&2; exit 2", duration="1h", sources=())


def test_a_missing_tool_is_an_error_before_the_soak() -> None:
    with pytest.raises(MeasureError, match="fio-that-is-not-here not found"):
        measure(node(), run="true", duration="1h", tool="fio-that-is-not-here")


def test_samples_stay_bounded(monkeypatch: pytest.MonkeyPatch, soak_clock) -> None:
    monkeypatch.setattr(soak_kind, "MAX_SAMPLES", 8)
    # 16 iterations, each followed by a sample: more than 8, halved (every other one kept)
    data = measure(
        node(soak_clock(1 / 16)), run="true", duration="1s", interval="0.01s", sources=()
    )  # fmt: skip
    assert data["iterations"] == 16 and 4 <= len(data["samples"]) <= 9
    assert (
        data["samples"][0]["t_s"] == 0 and data["samples"][-1]["iterations"] == data["iterations"]
    )
