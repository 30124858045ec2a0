"""The remote storage emulation end to end: a real netns, sshd, relay and sshfs mount, torn down."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

ROOT = Path(__file__).resolve().parent.parent
NEEDS = ("ip", "sshfs", "fusermount3", "ssh-keygen", "unshare", "/usr/sbin/sshd")

pytestmark = [
    pytest.mark.lab,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (network namespace, FUSE mount)"),
    pytest.mark.skipif(
        any(shutil.which(c) is None for c in NEEDS), reason=f"needs {', '.join(NEEDS)}"
    ),
]


def test_remote_fs_measures_added_latency_and_leaves_nothing_behind(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    for s in range(2):
        save_file(
            {f"w{s}": torch.arange(300_000 + s, dtype=torch.float32)}, model / f"m{s}.safetensors"
        )
    out = tmp_path / "remote.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "remote_fs.py"), str(model), "--latencies", "0,3",
         "--runs", "1", "--methods", "baseline", "--json", str(out)],
        capture_output=True, text=True, timeout=300, check=False, env=in_tmp(tmp_path),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    results = json.loads(out.read_text())
    assert [r["delay_ms"] for r in results] == [0.0, 3.0]
    # The relay adds the delay to every request: a round trip grows by about 3 ms.
    assert results[1]["rtt_ms"] - results[0]["rtt_ms"] > 2.5
    for r in results:
        (run,) = r["report"]["runs"]
        assert run["error"] is None and run["resident_before"] == 0
        assert r["report"]["machine"]["filesystem"].startswith("fuse.sshfs")
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert "fxbench-" not in netns
    assert str(tmp_path) not in Path("/proc/self/mounts").read_text()  # its mount is gone


def in_tmp(tmp_path: Path) -> dict[str, str]:
    """The benchmark's environment with its work folder (and mount) under ``tmp_path``: what it
    leaves is told apart from another test run's on this machine."""
    return {**os.environ, "TMPDIR": str(tmp_path)}


@pytest.mark.skipif(
    shutil.which("cc") is None or not Path("/usr/include/fuse3/fuse.h").exists(),
    reason="needs cc and libfuse3-dev (scripts/install-system-deps.sh)",
)
def test_fuse_transport_delays_every_request_and_serves_the_same_bytes(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    save_file({"w": torch.arange(500_000, dtype=torch.float32)}, model / "m.safetensors")
    out = tmp_path / "fuse.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "remote_fs.py"), str(model), "--transport", "fuse",
         "--latencies", "0,3", "--runs", "1", "--methods", "baseline,fxkit", "--json", str(out)],
        capture_output=True, text=True, timeout=300, check=False, env=in_tmp(tmp_path),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    results = json.loads(out.read_text())
    assert results[1]["rtt_ms"] - results[0]["rtt_ms"] > 2.5
    for r in results:
        summaries = {s["method"]: s for s in r["report"]["summaries"]}
        assert summaries["fxkit"]["checksum_ok"], "fxkit read other bytes through the mount"
        assert r["report"]["machine"]["filesystem"].startswith("fuse")
    assert str(tmp_path) not in Path("/proc/self/mounts").read_text()  # its mount is gone
