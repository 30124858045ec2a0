"""bench/ready.py runs end to end: real probes on a small checkpoint, one round, a JSON report
whose numbers hang together (no timing is asserted: speed belongs to docs/BENCHMARKS.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from fxkit.loader import make_checkpoint

from fxkit.loadbench.bench import filesystem

READY = Path(__file__).resolve().parent.parent / "bench" / "ready.py"


def test_ready_bench_reports_every_fleet(tmp_path: Path) -> None:
    model = make_checkpoint(tmp_path / "llama", 4 << 20, shards=2)
    if filesystem(model).startswith("tmpfs"):
        pytest.skip("a tmpfs cannot evict its pages: the cold runs need a disk-backed folder")
    report_path = tmp_path / "ready.json"
    argv = [sys.executable, str(READY), str(model), "--instances", "1,2", "--rounds", "1"]
    done = subprocess.run(
        [*argv, "--json", str(report_path)], capture_output=True, text=True, timeout=300,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads(report_path.read_text())
    assert [(r["instances"], r["method"]) for r in report["runs"]] == [
        (1, "baseline"), (1, "fxkit"), (2, "baseline"), (2, "fxkit"),
    ]  # fmt: skip
    for run in report["runs"]:
        assert len(run["ready_s"]) == len(run["load_s"]) == run["instances"]
        # every instance is ready after its own load, and the fleet when its last one is
        assert all(s + load <= ready for s, load, ready in zip(
            run["startup_s"], run["load_s"], run["ready_s"], strict=True
        ))  # fmt: skip
        assert max(run["ready_s"]) <= run["fleet_s"]
    baseline = next(r for r in report["summary"] if r["method"] == "baseline")
    assert baseline["x_baseline"] == baseline["load_x_baseline"] == 1.0
    assert "target: fxkit fleet time to ready" not in done.stdout  # no N = 4 here
