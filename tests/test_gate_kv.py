"""``kv_bench`` (fxkit/gate/measures/kv.py) and G2's KV-tier checks, on this machine.

The measure runs the real ``fxkit bench kv`` (this checkout's, ``python -m fxkit``) over a local
connection: LMCache 0.5.6's own LocalDiskBackend writes and reads back a small set of chunks
shaped like Mistral-7B's KV (tests/data/model_configs, sources in its SOURCES.md), beside fio.
The gate test runs G2's two KV checks as gates/g2.yml writes them (the role's defaults, the
gate's variables), without root, on pytest's temporary folder. Where LMCache is not installed
they skip, saying how to install it.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml

from fxkit.connection.local import LocalConnection
from fxkit.engine.variables import HostVars
from fxkit.facts.base import FactCache
from fxkit.gate.measure import MeasuredHost, MeasureError
from fxkit.gate.measures.kv import KvBenchParams, folder_list, kv_argv, kv_bench, parse_kv_report
from fxkit.kvbench import missing

ROOT = Path(__file__).resolve().parent.parent
MISTRAL = ROOT / "tests" / "data" / "model_configs" / "mistral-7b-v0.1.json"
FXKIT = f"{shlex.quote(sys.executable)} -m fxkit"
needs_lmcache = pytest.mark.skipif(missing() is not None, reason=str(missing()))
SMALL = {"size": "16 MiB", "chunk_size": 64, "rounds": 1}


def node() -> MeasuredHost:
    conn = LocalConnection("localhost")
    return MeasuredHost("localhost", conn, FactCache(conn), HostVars("localhost", []), timeout=600,
                 stop=threading.Event())  # fmt: skip


@needs_lmcache
def test_lmcache_reads_the_folder_on_the_node_beside_fio(tmp_path: Path) -> None:
    p = KvBenchParams(folders=str(tmp_path), model=str(MISTRAL), threads="1,2", fxkit=FXKIT,
                      **SMALL)  # fmt: skip
    data = kv_bench(node(), p)
    assert data["lmcache"] == "0.5.6" and data["folders"] == [str(tmp_path)]
    assert data["best_gbps"] > 0 and data["fio_best_gbps"] > 0
    assert data["x_fio_best"] > 0 and data["threads1_gbps"] > 0
    assert data["role_vars"]["vllm_lmcache_disk_io_threads"] in (1, 2)
    assert data["role_vars"]["vllm_lmcache_use_odirect"] is False
    # Mistral-7B at the estimator's default TP8: a rank's one KV head, [2, 32, 64, 128] bf16.
    assert data["chunk_bytes"] == 2 * 32 * 64 * 128 * 2
    assert data["cold"] or data["notes"]  # a filesystem that kept its pages is said so
    assert list(tmp_path.iterdir()) == []  # its scratch folder removed


def test_every_value_reaches_the_shell_quoted() -> None:
    p = KvBenchParams(
        folders="file:///mnt/kv a;x,/mnt/kv2", model="/m/c.json; rm -rf /", odirect=None,
        sets=["gpu.tensor_parallel=8"], fxkit="/opt/v env/bin/fxkit",
    )  # fmt: skip
    argv = kv_argv(p)
    assert argv[:6] == ["/opt/v", "env/bin/fxkit", "bench", "kv", "/mnt/kv a;x", "/mnt/kv2"]
    assert argv[argv.index("--model") + 1] == "/m/c.json; rm -rf /"
    assert argv[argv.index("--odirect") + 1] == "both" and argv[-2:] == ["--json", "-"]
    assert folder_list(["/a", " ", "file:///b"]) == ["/a", "/b"]


def test_a_missing_folder_or_model_or_tool_is_an_error() -> None:
    with pytest.raises(MeasureError, match="no KV folder"):
        kv_argv(KvBenchParams(folders=" , ", model="/m"))
    with pytest.raises(MeasureError, match="no model"):
        kv_argv(KvBenchParams(folders="/kv"))
    with pytest.raises(MeasureError, match="not found"):
        kv_bench(node(), KvBenchParams(folders="/kv", model="/m", fxkit="/nonexistent/fxkit"))


def test_output_that_is_not_a_report_is_an_error() -> None:
    with pytest.raises(MeasureError, match="no JSON report"):
        parse_kv_report("Traceback (most recent call last):\n")
    with pytest.raises(MeasureError, match="not an fxkit bench kv report"):
        parse_kv_report(json.dumps({"kind": "fxkit-bench-load", "summary": {}}))
    failed = {"kind": "fxkit-bench-kv", "summary": {"error": "no LMCache run succeeded",
                                                    "errors": ["disk full"]}}  # fmt: skip
    with pytest.raises(MeasureError, match="disk full"):
        parse_kv_report(json.dumps(failed))


def kv_gate(tmp_path: Path) -> Path:
    """G2 as gates/g2.yml writes it, its KV checks alone, run without root."""
    gate: dict[str, Any] = yaml.safe_load((ROOT / "gates" / "g2.yml").read_text())
    gate["checks"] = [c for c in gate["checks"] if c["id"].startswith("kv_")]
    gate["become"] = False
    path = tmp_path / "g2-kv.yml"
    path.write_text(yaml.safe_dump(gate))
    return path


def gate(tmp_path: Path, *extra: str) -> dict[str, dict[str, Any]]:
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "fxkit", "gate", str(kv_gate(tmp_path)), "-i", "local",
         "--out", str(out), *extra],
        capture_output=True, text=True, timeout=900, cwd=tmp_path, check=False,
    )  # fmt: skip
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    result = json.loads((out / "result.json").read_text())
    return {c["id"]: c for c in result["hosts"]["localhost"]["checks"]}


def test_without_kv_folders_g2_s_kv_checks_skip(tmp_path: Path) -> None:
    checks = gate(tmp_path, "-e", "g2_model=/nonexistent")
    assert {c["status"] for c in checks.values()} == {"SKIP"}


@needs_lmcache
def test_g2_s_kv_checks_read_the_role_s_folder_with_its_settings(tmp_path: Path) -> None:
    kv = tmp_path / "kv"
    kv.mkdir()
    values = {
        "vllm_lmcache_local_disk": [str(kv)], "vllm_lmcache_disk_io_threads": 2,
        "g2_model": "/unused", "g2_kv_model": str(MISTRAL), "g2_kv_tp": 1,
        "g2_kv_size": "16 MiB", "g2_kv_rounds": 1,
        "g2_kv_fxkit": FXKIT, "g2_kv_x_fio_min": 0.01,
    }  # fmt: skip
    checks = gate(tmp_path, "-e", json.dumps(values))
    bandwidth, ratio = checks["kv_read_bandwidth"], checks["kv_read_x_fio"]
    assert bandwidth["status"] == "PASS", bandwidth
    assert bandwidth["value"] > 0 and bandwidth["unit"] == "GB/s"
    assert ratio["status"] == "PASS" and ratio["value"] > 0.01, ratio
