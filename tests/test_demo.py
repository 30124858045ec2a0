"""``fxkit demo`` end to end, small: 2 lab hosts and a 64 MB checkpoint, as ``make demo`` runs it
(the real executable, in a fresh working folder)."""

from __future__ import annotations

import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from fxkit.lab import Fleet, LabError, check_requirements

FXKIT = Path(sys.executable).with_name("fxkit")


def demo(cwd: Path, *args: str, prefix: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(FXKIT), "demo", "--hosts", "2", "--size", "64MB", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "FXKIT_LAB_PREFIX": prefix, "COLUMNS": "160"},
    )


@pytest.mark.lab
def test_demo_provisions_reruns_with_no_change_and_loads(tmp_path: Path) -> None:
    try:
        check_requirements()
    except LabError as exc:
        pytest.skip(f"the lab fleet cannot run here: {exc}")
    pytest.importorskip("fxkit.loader.checkpoint", reason="the loader is not in this build")
    prefix = f"127.{random.randint(100, 250)}.{random.randint(0, 255)}"
    try:
        first = demo(tmp_path, prefix=prefix)
        assert first.returncode == 0, first.stdout + first.stderr
        out = first.stdout
        assert "2 host(s) started" in out
        assert "check mode: nothing was changed" in out and "+role: inference" in out
        assert "second run: 0 changed on 2 hosts" in out
        assert "lab01 (/mnt/models), lab02 (/mnt/models)" in out  # the shared namespace, refused
        assert "refused before any host was touched" in out
        assert "G1 arrival acceptance" in out and "amd-smi not found on lab01" in out
        assert "is not in [ubuntu 22.04, ubuntu 24.04]" in out  # host text, not rich markup
        assert (tmp_path / ".cache/demo-g1/report.html").is_file()
        assert re.search(r"│ fxkit\s+│\s+[\d.]+\s+│", out), out  # the bench table's row
        assert re.search(r"same \d+ tensors, byte for byte; speed-up: [\d.]+x", out)
        assert "stop it with `fxkit lab down`" in out
        assert Fleet(tmp_path / ".lab").status()[1].up  # left running
        assert (tmp_path / ".cache/demo-ckpt/fxkit-demo.json").exists()

        again = demo(tmp_path, "--down", prefix=prefix)  # idempotent: fleet and cache reused
        assert again.returncode == 0, again.stdout + again.stderr
        assert "0 host(s) started" in again.stdout and "generated in" not in again.stdout
        assert "second run: 0 changed on 2 hosts" in again.stdout
        assert "fleet stopped (2 hosts)" in again.stdout
        assert not (tmp_path / ".lab").exists()
    finally:
        Fleet(tmp_path / ".lab").down()  # by PID, when a step above failed


@pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root to drop it"
)
def test_demo_without_root_says_what_is_missing() -> None:
    with tempfile.TemporaryDirectory(prefix="fxkit-nobody-") as home:
        os.chmod(home, 0o777)
        result = subprocess.run(
            ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
             str(FXKIT), "demo", "--dir", f"{home}/lab"],
            capture_output=True, text=True, timeout=60, cwd=home, env={**os.environ, "HOME": home},
        )  # fmt: skip
    assert result.returncode == 2
    assert "lab fleet cannot start" in result.stderr and "needs root" in result.stderr
    assert "Traceback" not in result.stderr
