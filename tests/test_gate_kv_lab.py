"""G2's KV-tier checks on a lab host, over real SSH: the role's KV folder given, the role's venv
is not there (a lab host has no LMCache), so both checks are ERROR naming the command; without
KV folders they SKIP. Their run with LMCache on this machine: tests/test_gate_kv.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from test_gate_g2_g4_lab import gate, results

pytestmark = pytest.mark.lab


def test_g2_kv_checks_on_a_lab_host(lab_fleet: Any, tmp_path: Path) -> None:
    inv = str(lab_fleet(1, name="gates").inventory)
    base = ["-i", inv, "-e", "g2_model=/srv/models/m", "-e", "g2_vllm_result=/var/tmp/none.json"]
    code, out = gate("g2", *base, "--out", str(tmp_path / "none"))
    assert code == 1, out  # the load and vLLM checks are ERROR on a lab host
    checks = results(tmp_path / "none")["lab01"]
    assert {checks[c]["status"] for c in ("kv_read_bandwidth", "kv_read_x_fio")} == {"SKIP"}

    kv = json.dumps({"vllm_lmcache_local_disk": ["/var/tmp"]})
    code, out = gate("g2", *base, "-e", kv, "--out", str(tmp_path / "kv"))
    assert code == 1, out
    checks = results(tmp_path / "kv")["lab01"]
    for check in ("kv_read_bandwidth", "kv_read_x_fio"):
        assert checks[check]["status"] == "ERROR", checks[check]
        assert "/opt/fxkit/venvs/default/bin/fxkit not found on lab01" in checks[check]["reason"]
