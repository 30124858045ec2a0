"""The local and the SSH connection report the same outcome the same way: exit statuses, the
error kind (a failed step vs an unreachable host) and the message."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator

import pytest
from sync_helpers import Meeting, run_past_timeout

from fxkit.connection import ConnectOptions, connect
from fxkit.connection.base import TIMEOUT_RC, Connection
from fxkit.errors import ConnectionFailed, FxkitError


@pytest.fixture(params=["local", "ssh"])
def conn(request, tmp_path, monkeypatch) -> Iterator[Connection]:
    if request.param == "local":
        connection = connect("localhost", {}, ConnectOptions())
    else:
        monkeypatch.setenv("HOME", str(tmp_path / "home"))
        fleet = request.getfixturevalue("lab_fleet")(1)
        connection = fleet.connect("lab01")
    with connection:
        yield connection


def _step_error(excinfo: pytest.ExceptionInfo[FxkitError]) -> str:
    """A failed step, not an unreachable host; the message without the host's name."""
    assert not isinstance(excinfo.value, ConnectionFailed), excinfo.value
    return excinfo.value.message


@pytest.mark.parametrize("size", [1, 8_000_000])
def test_writing_where_no_directory_is_a_failed_step(conn: Connection, size: int) -> None:
    # 8 MB: the command fails and ends long before fxkit has sent its stdin (not a lost link).
    with pytest.raises(FxkitError) as info:
        conn.put("/nonexistent/dir/file", b"x" * size)
    assert _step_error(info).startswith(
        "cannot write /nonexistent/dir/file: fxkit: cannot create a temp file in /nonexistent/dir: "
    )


def test_reading_a_directory_is_a_failed_step(conn: Connection) -> None:
    with pytest.raises(FxkitError) as info:
        conn.get("/etc")
    assert _step_error(info).startswith("cannot read /etc: ")
    assert conn.get("/nonexistent-file") is None


def test_a_timeout_is_rc_124_and_the_command_is_killed(conn: Connection) -> None:
    meeting = Meeting(conn)
    result = run_past_timeout(conn, f"echo started; {meeting.reach}; sleep 300", meeting, 0.5)
    assert (result.rc, result.stdout) == (TIMEOUT_RC, "started\n")
    assert result.stderr.endswith("fxkit: timed out after 0.5 s; it was killed")


def test_a_command_killed_by_a_signal_reports_128_plus_its_number(conn: Connection) -> None:
    assert conn.run("sh -c 'kill -9 $$'").rc == 128 + 9
    assert conn.run("sleep 5 & kill -TERM $!; wait $!").rc == 128 + 15


def test_stdin_stdout_and_stderr_are_bytes_for_bytes(conn: Connection) -> None:
    data = os.urandom(100_000)
    result = conn.run("sha256sum; echo err >&2; exit 3", stdin=data)
    assert result.rc == 3 and result.stderr == "err\n"
    path = "/tmp/fxkit-consistency.bin"
    conn.put(path, data)
    assert conn.get(path) == data


@pytest.mark.parametrize("size", [0, 2**20 - 1, 2**20, 3 * 2**20 + 1])
def test_put_at_the_edges_of_the_chunk_size(conn: Connection, size: int) -> None:
    # The host copies exactly the content's bytes (dd, 1 MiB blocks), then reads the sha256 line.
    data = os.urandom(size)
    path = "/tmp/fxkit-consistency-chunks.bin"
    conn.put(path, data)
    assert conn.get(path) == data


def test_stdin_made_while_it_is_sent(conn: Connection) -> None:
    # An upload's stdin: buffers produced one by one (the content, then its sha256 line).
    parts = [b"", os.urandom(3 * 2**20 + 1), b"", memoryview(b"tail\n")]
    result = conn.run("sha256sum", stdin=iter(parts))
    assert result.stdout.split()[0] == hashlib.sha256(b"".join(parts)).hexdigest()
    assert conn.run("wc -c", stdin=iter(())).stdout.strip() == "0"
