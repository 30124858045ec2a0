"""LocalConnection against real processes and files."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from sync_helpers import Meeting, run_past_timeout

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
    meeting = Meeting(conn)
    pid = tmp_path / "pid"
    # A child in the background, then the timeout: it runs out once both are under way.
    command = f"sleep 300 & echo $! > {pid}; {meeting.reach}; sleep 300"
    result = run_past_timeout(conn, command, meeting, timeout=0.5)
    assert result.rc == TIMEOUT_RC and "timed out after 0.5 s; it was killed" in result.stderr
    # The run returned at the end of the output, once the child had closed it too: it is gone
    # (or a zombie an instant before it is reaped), not sleeping on.
    state = Path(f"/proc/{pid.read_text().strip()}/stat")
    assert not state.exists() or state.read_text().split(") ")[1][0] in "ZX"


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
