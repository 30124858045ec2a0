"""``fxkit estimate --from-results`` on a real G1 run of plain lab hosts: the storage bandwidth
fio measured on each host (the median over the hosts) becomes the estimator's store bandwidth;
the checks that are ERROR there (no GPU, no RDMA) give nothing."""

from __future__ import annotations

import json
import statistics
import subprocess
from pathlib import Path

import pytest
from test_gate_g1_lab import FIO, check, run_g1
from test_play_lab import FXKIT

pytestmark = pytest.mark.lab

EXAMPLE = Path(__file__).parents[1] / "examples" / "estimate" / "qwen3-coder-480b-tp8.yml"


def test_a_g1_result_feeds_the_estimator(lab_fleet, tmp_path: Path) -> None:
    fleet = lab_fleet(2, name="estimate")
    _, result = run_g1(fleet, tmp_path / "g1", FIO)
    measured = [check(result, "storage_read_bandwidth", h)["value"] for h in result["hosts"]]
    assert all(v > 0 for v in measured)

    done = subprocess.run(
        [FXKIT, "estimate", str(EXAMPLE), "--from-results", str(tmp_path / "g1" / "result.json"),
         "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    store = out["inputs"]["store.read_bandwidth"]
    assert store["value"] == pytest.approx(statistics.median(measured) * 1e9, rel=1e-6)
    assert "median of 2 hosts" in store["from"]
    used = out["results"][0]
    assert used["kind"] == "gate g1"
    assert {u["input"] for u in used["used"]} >= {"store.read_bandwidth", "store.latency"}
