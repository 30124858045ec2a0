"""commands.command: guards, check mode, changed_when, failures."""

from __future__ import annotations

from pathlib import Path

import pytest

from fxkit.connection.local import LocalConnection
from fxkit.facts.base import FactCache
from fxkit.ops.base import OpContext, OpError, Status
from fxkit.ops.commands import command


def make_ctx(check: bool = False) -> OpContext:
    conn = LocalConnection("localhost")
    return OpContext(conn, FactCache(conn), check=check)


class CountingConnection(LocalConnection):
    def __init__(self) -> None:
        super().__init__("localhost")
        self.commands: list[str] = []

    def run(self, command: str, **kwargs):  # type: ignore[no-untyped-def]
        self.commands.append(command)
        return super().run(command, **kwargs)


def test_bare_command_reports_changed_with_output() -> None:
    result = command(make_ctx(), "echo hi; echo warn >&2")
    assert result.status is Status.CHANGED
    assert result.data == {"rc": 0, "stdout": "hi\n", "stderr": "warn\n"}


def test_creates_guard_runs_once_in_one_round_trip(tmp_path: Path) -> None:
    target = tmp_path / "done"
    conn = CountingConnection()
    ctx = OpContext(conn, FactCache(conn))
    assert command(ctx, f"echo x >> {target}", creates=str(target)).changed
    assert len(conn.commands) == 1
    result = command(ctx, f"echo x >> {target}", creates=str(target))
    assert result.status is Status.OK and result.msg == f"{target} exists"
    # The guard was looked up without a command (os.stat here, SFTP over SSH).
    assert target.read_text() == "x\n" and len(conn.commands) == 1


def test_guards_without_a_stat_still_hold(tmp_path: Path) -> None:
    """Where the connection cannot stat (become through sudo), the guard runs on the host."""

    class NoStat(CountingConnection):
        def stat(self, path: str, **kwargs):  # type: ignore[no-untyped-def]
            raise NotImplementedError

    target = tmp_path / "done"
    conn = NoStat()
    ctx = OpContext(conn, FactCache(conn))
    assert command(ctx, f"echo x >> {target}", creates=str(target)).changed
    assert command(ctx, f"echo x >> {target}", creates=str(target)).msg == f"{target} exists"
    assert target.read_text() == "x\n" and len(conn.commands) == 2


def test_removes_guard(tmp_path: Path) -> None:
    target = tmp_path / "old"
    assert command(make_ctx(), "true", removes=str(target)).status is Status.OK
    target.write_text("")
    assert command(make_ctx(), f"rm {target}", removes=str(target)).changed
    assert not target.exists()


def test_check_mode_runs_nothing(tmp_path: Path) -> None:
    target = tmp_path / "t"
    result = command(make_ctx(check=True), f"touch {target}")
    assert result.changed and result.msg == f"would run: touch {target}" and not target.exists()
    guarded = command(make_ctx(check=True), f"touch {target}", creates=str(tmp_path))
    assert guarded.status is Status.OK


def test_changed_when_bool_and_callable() -> None:
    assert command(make_ctx(), "true", changed_when=False).status is Status.OK
    result = command(make_ctx(), "echo same", changed_when=lambda r: "changed" in r.stdout)
    assert result.status is Status.OK
    result = command(make_ctx(), "echo changed", changed_when=lambda r: "changed" in r.stdout)
    assert result.changed


def test_failure_reports_rc_and_stderr_tail() -> None:
    result = command(make_ctx(), "echo boom >&2; exit 7")
    assert result.failed and "rc=7" in result.msg and "boom" in result.msg
    assert result.data["rc"] == 7


def test_chdir_and_env_values_are_quoted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # a relative `touch canary` would land here
    canary = tmp_path / "canary"
    weird = tmp_path / "dir; touch canary"
    weird.mkdir()
    value = f"$(touch {canary}) `touch {canary}` ' \" \n;"
    result = command(make_ctx(), 'pwd; printf %s "$V"', chdir=str(weird), env={"V": value})
    assert result.data["stdout"] == f"{weird}\n{value}"
    assert not canary.exists() and not (weird / "canary").exists()
    with pytest.raises(OpError, match="environment variable name"):
        command(make_ctx(), "true", env={"A;B": "x"})


def test_guard_paths_are_quoted(tmp_path: Path) -> None:
    canary = tmp_path / "canary"
    result = command(make_ctx(), "true", creates=f"{tmp_path}/x $(touch {canary})")
    assert result.changed and not canary.exists()


@pytest.mark.parametrize(
    ("guard", "holds", "reason"),
    [
        ("unless", "true", "unless: `true` succeeded"),
        ("unless", "false", None),
        ("only_if", "false", "only_if: `false` failed"),
        ("only_if", "true", None),
    ],
)
@pytest.mark.parametrize("check", [False, True])
def test_unless_and_only_if_take_a_command(
    tmp_path: Path, guard: str, holds: str, reason: str | None, check: bool
) -> None:
    target = tmp_path / "ran"
    result = command(make_ctx(check=check), f"touch {target}", **{guard: holds})
    if reason:
        assert result.status is Status.OK and result.msg == reason
        assert not target.exists()
    else:
        assert result.changed and target.exists() is not check


def test_guards_run_in_the_command_s_round_trip_and_the_first_that_holds_says_why(
    tmp_path: Path,
) -> None:
    conn = CountingConnection()
    ctx = OpContext(conn, FactCache(conn))
    marker = tmp_path / "marker"
    result = command(ctx, "echo never", only_if=f"test -e {marker}", creates=str(tmp_path))
    assert result.status is Status.OK and result.msg == f"{tmp_path} exists"
    assert conn.commands == []  # creates holds: seen without a command
    result = command(ctx, "echo never", only_if=f"test -e {marker}", creates=str(marker))
    assert result.status is Status.OK and result.msg == f"only_if: `test -e {marker}` failed"
    assert len(conn.commands) == 1  # creates and only_if ran with the command, in one trip


def test_a_guard_s_own_output_does_not_fool_the_token(tmp_path: Path) -> None:
    result = command(make_ctx(), "echo FXKIT-GUARD-0 unless", unless="echo FXKIT-GUARD-0; false")
    assert result.changed and result.data["stdout"] == "FXKIT-GUARD-0 unless\n"
