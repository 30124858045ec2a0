"""lines.line and lines.block through LocalConnection on temp files."""

from __future__ import annotations

from pathlib import Path

import pytest

from fxkit.connection.local import LocalConnection
from fxkit.facts.base import FactCache
from fxkit.ops.base import OpContext, OpError, Status
from fxkit.ops.lines import block, line


def make_ctx(check: bool = False, diff: bool = False) -> OpContext:
    conn = LocalConnection("localhost")
    return OpContext(conn, FactCache(conn), check=check, diff=diff)


def test_line_replaces_last_regexp_match_and_is_idempotent(tmp_path: Path) -> None:
    path = tmp_path / "sshd_config"
    path.write_text("#PermitRootLogin yes\nPort 22\nPermitRootLogin yes\n")
    args = (str(path), "PermitRootLogin no", r"^PermitRootLogin\s")
    result = line(make_ctx(diff=True), *args)
    assert result.changed and "-PermitRootLogin yes\n+PermitRootLogin no\n" in result.diff
    assert path.read_text() == "#PermitRootLogin yes\nPort 22\nPermitRootLogin no\n"
    assert line(make_ctx(), *args).status is Status.OK


def test_line_inserts_after_anchor_eof_bof(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_text("[a]\nx=1\n[b]\n")
    assert line(make_ctx(), str(path), "y=2", insert_after=r"^x=").changed
    assert line(make_ctx(), str(path), "# top", insert_after="BOF").changed
    assert line(make_ctx(), str(path), "z=3").changed
    assert path.read_text() == "# top\n[a]\nx=1\ny=2\n[b]\nz=3\n"
    assert line(make_ctx(), str(path), "y=2", insert_after=r"^x=").status is Status.OK


def test_line_creates_missing_file_and_check_mode(tmp_path: Path) -> None:
    path = tmp_path / "new.conf"
    result = line(make_ctx(check=True, diff=True), str(path), "k=v")
    assert result.msg == f"would create {path}" and "+k=v" in result.diff
    assert not path.exists()
    assert line(make_ctx(), str(path), "k=v").changed and path.read_text() == "k=v\n"


def test_line_absent(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_text("keep\nswap /x\nkeep2\nswap /y\n")
    result = line(make_ctx(check=True), str(path), "", regexp=r"^swap", state="absent")
    assert result.changed and path.read_text().count("swap") == 2
    assert line(make_ctx(), str(path), "", regexp=r"^swap", state="absent").changed
    assert path.read_text() == "keep\nkeep2\n"
    assert line(make_ctx(), str(path), "keep", state="absent").changed
    assert path.read_text() == "keep2\n"
    assert line(make_ctx(), str(path), "keep", state="absent").status is Status.OK
    assert line(make_ctx(), str(tmp_path / "none"), "x", state="absent").status is Status.OK


def test_line_keeps_mode_and_missing_final_newline(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_text("a")
    path.chmod(0o600)
    assert line(make_ctx(), str(path), "a").status is Status.OK
    assert line(make_ctx(), str(path), "b").changed
    assert path.read_text() == "a\nb\n" and (path.stat().st_mode & 0o777) == 0o600


def test_line_bad_input(tmp_path: Path) -> None:
    with pytest.raises(OpError, match="newline"):
        line(make_ctx(), str(tmp_path / "f"), "a\nb")
    with pytest.raises(OpError, match="bad regular expression"):
        line(make_ctx(), str(tmp_path / "f"), "a", regexp="(")


def test_block_insert_replace_remove(tmp_path: Path) -> None:
    path = tmp_path / "hosts"
    path.write_text("127.0.0.1 localhost\n")
    result = block(make_ctx(diff=True), str(path), "10.0.0.1 n1\n10.0.0.2 n2\n")
    assert result.changed and "+# BEGIN FXKIT MANAGED BLOCK" in result.diff
    text = path.read_text()
    assert text == (
        "127.0.0.1 localhost\n# BEGIN FXKIT MANAGED BLOCK\n10.0.0.1 n1\n10.0.0.2 n2\n"
        "# END FXKIT MANAGED BLOCK\n"
    )
    assert block(make_ctx(), str(path), "10.0.0.1 n1\n10.0.0.2 n2").status is Status.OK
    path.write_text(text + "tail\n")
    result = block(make_ctx(check=True, diff=True), str(path), "10.0.0.3 n3")
    assert result.changed and "-10.0.0.1 n1" in result.diff and "tail" in path.read_text()
    assert block(make_ctx(), str(path), "10.0.0.3 n3").changed
    assert path.read_text().endswith("10.0.0.3 n3\n# END FXKIT MANAGED BLOCK\ntail\n")
    assert block(make_ctx(), str(path), "", state="absent").changed
    assert path.read_text() == "127.0.0.1 localhost\ntail\n"
    assert block(make_ctx(), str(path), "", state="absent").status is Status.OK


def test_block_custom_marker_needs_mark(tmp_path: Path) -> None:
    path = tmp_path / "f"
    assert block(make_ctx(), str(path), "x", marker="// {mark} ours").changed
    assert path.read_text() == "// BEGIN ours\nx\n// END ours\n"
    with pytest.raises(OpError, match="mark"):
        block(make_ctx(), str(path), "x", marker="# ours")


def test_lines_with_shell_metacharacters_are_data(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # a relative `touch canary` would land here
    canary = tmp_path / "canary"
    path = tmp_path / "x; touch canary $(touch canary) `touch canary`"
    for text in (f"$(touch {canary})", f"`touch {canary}`", f"'\"; touch {canary}"):
        assert line(make_ctx(), str(path), text).changed
        assert block(make_ctx(), str(path), text, marker="# {mark} " + text).changed
    assert f"$(touch {canary})" in path.read_text()
    assert not canary.exists()
