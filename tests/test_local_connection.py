"""LocalConnection against real processes and files."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from fxkit.connection.base import TIMEOUT_RC
from fxkit.connection.local import LocalConnection
from fxkit.errors import FxkitError


@pytest.fixture
def conn() -> LocalConnection:
    with LocalConnection("localhost") as c:
        yield c


def test_run_captures_output_and_rc(conn: LocalConnection) -> None:
    result = conn.run("echo out; echo err >&2; exit 3")
    assert (result.rc, result.stdout, result.stderr) == (3, "out\n", "err\n")
    assert not result.ok


def test_run_passes_stdin_bytes(conn: LocalConnection) -> None:
    assert conn.run("wc -c", stdin=b"\x00\x01abc").stdout.strip() == "5"


def test_timeout_kills_the_whole_process_group(conn: LocalConnection, tmp_path: Path) -> None:
    marker = tmp_path / "late"
    start = time.monotonic()
    result = conn.run(f"(sleep 2; touch {marker}) & sleep 5", timeout=0.5)
    assert result.rc == TIMEOUT_RC and "timed out after 0.5 s; it was killed" in result.stderr
    assert time.monotonic() - start < 2
    time.sleep(2.2)
    assert not marker.exists()


def test_get_and_put(conn: LocalConnection, tmp_path: Path) -> None:
    path = str(tmp_path / "f")
    assert conn.get(path) is None
    conn.put(path, b"\xffbinary\n")
    assert conn.get(path) == b"\xffbinary\n"


def test_become_as_root_runs_directly(conn: LocalConnection) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root: as another user become goes through sudo")
    assert conn.run("id -u", become=True).stdout.strip() == "0"


def test_get_of_a_directory_is_a_clear_error(conn: LocalConnection, tmp_path: Path) -> None:
    with pytest.raises(FxkitError, match=r"cannot read .*: Is a directory"):
        conn.get(str(tmp_path))
