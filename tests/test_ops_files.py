"""files.directory and files.file through LocalConnection on temp directories."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from fxkit.connection.local import LocalConnection
from fxkit.facts.base import FactCache
from fxkit.ops.base import OpContext, OpError, Status
from fxkit.ops.files import directory, file
from fxkit.ops.files import link as link_op


def make_ctx(check: bool = False, diff: bool = False) -> OpContext:
    conn = LocalConnection("localhost")
    return OpContext(conn, FactCache(conn), check=check, diff=diff)


def mode_of(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def unchanged_stat(path: Path) -> tuple[int, ...]:
    """What a write would change (inode, mode, owner, size, mtime, ctime); reading moves atime."""
    st = path.stat()
    return (st.st_ino, st.st_mode, st.st_uid, st.st_gid, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def test_file_create_update_idempotent(tmp_path: Path) -> None:
    path = tmp_path / "etc" / "app.conf"
    path.parent.mkdir()
    result = file(make_ctx(), str(path), "a=1\n", mode="0640")
    assert result.status is Status.CHANGED and result.msg == f"created {path}"
    assert path.read_text() == "a=1\n" and mode_of(path) == 0o640
    assert file(make_ctx(), str(path), "a=1\n", mode=0o640).status is Status.OK
    result = file(make_ctx(diff=True), str(path), "a=2\n")
    assert result.changed and "-a=1\n+a=2\n" in result.diff
    assert mode_of(path) == 0o640  # kept from the old file
    assert not [p for p in path.parent.iterdir() if "fxkit" in p.name]  # no temp file left


def test_file_check_mode_changes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_text("old\n")
    os.chmod(path, 0o600)
    before = unchanged_stat(path)
    result = file(make_ctx(check=True, diff=True), str(path), "new\n", mode="0644")
    assert result.changed and result.msg == f"would update {path}"
    assert "mode: 0600 -> 0644" in result.diff and "+new" in result.diff
    assert path.read_text() == "old\n" and unchanged_stat(path) == before
    created = file(make_ctx(check=True), str(tmp_path / "g"), "x")
    assert created.msg.startswith("would create") and not (tmp_path / "g").exists()


def test_file_attributes_only(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_text("keep")
    os.chmod(path, 0o600)
    result = file(make_ctx(diff=True), str(path), mode="0755", owner="root", group=0)
    assert result.changed and result.diff == "mode: 0600 -> 0755\n"
    assert mode_of(path) == 0o755 and path.read_text() == "keep"
    assert file(make_ctx(), str(path), mode="755", owner=0, group="root").status is Status.OK
    missing = file(make_ctx(), str(tmp_path / "none"), mode="0644")
    assert missing.failed and "does not exist" in missing.msg


def test_file_backup_and_absent(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_text("v1\n")
    result = file(make_ctx(), str(path), "v2\n", backup=True)
    backup = Path(result.data["backup"])
    assert backup.read_text() == "v1\n" and backup.name.startswith("f.") and backup.name[-1] == "~"
    assert file(make_ctx(check=True), str(path), state="absent").msg == f"would remove {path}"
    assert path.exists()
    assert file(make_ctx(), str(path), state="absent").changed and not path.exists()
    assert file(make_ctx(), str(path), state="absent").status is Status.OK


def test_file_binary_content_and_secret(tmp_path: Path) -> None:
    path = tmp_path / "blob"
    data = bytes(range(256))
    assert file(make_ctx(), str(path), data).changed and path.read_bytes() == data
    assert file(make_ctx(), str(path), data).status is Status.OK
    result = file(make_ctx(diff=True), str(path), b"token=abc\n", secret=True)
    assert "abc" not in result.diff and "hidden" in result.diff


def test_file_on_directory_fails_clearly(tmp_path: Path) -> None:
    result = file(make_ctx(), str(tmp_path), "x")
    assert result.failed and "is a directory" in result.msg


def test_directory_lifecycle(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b"
    result = directory(make_ctx(check=True, diff=True), str(path), mode="0750")
    assert result.msg == f"would create {path}" and result.diff == "state: absent -> directory\n"
    assert not path.exists()
    assert directory(make_ctx(), str(path), mode="0750").changed
    assert path.is_dir() and mode_of(path) == 0o750
    assert directory(make_ctx(), str(path), mode="0750").status is Status.OK
    result = directory(make_ctx(diff=True), str(path), mode="0700")
    assert result.msg == f"changed mode 0750 -> 0700 of {path}"
    assert result.diff == "mode: 0750 -> 0700\n"
    (path / "inside").write_text("x")
    assert directory(make_ctx(), str(path), state="absent").changed and not path.exists()
    assert directory(make_ctx(), str(path), state="absent").status is Status.OK


def test_bad_arguments_raise_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(OpError, match="bad file mode"):
        file(make_ctx(), str(tmp_path / "f"), "x", mode="rw-r--r--")
    with pytest.raises(OpError, match="unknown state"):
        directory(make_ctx(), str(tmp_path), state="gone")


def test_shell_metacharacters_are_data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Paths and contents full of shell syntax are written literally; nothing is executed."""
    monkeypatch.chdir(tmp_path)  # a relative `touch canary` would land here
    canary = tmp_path / "canary"
    evil = [
        "; touch canary",
        "$(touch canary)",
        "`touch canary`",
        "' ; touch canary; '",
        '" ; touch canary; "',
        "a\nb; touch canary",
        "-rf",
    ]
    for i, name in enumerate(evil):
        path = tmp_path / f"d{i}" / name
        assert directory(make_ctx(), str(path.parent)).changed
        content = f"{name}\n$HOME {name} $(touch {canary})\n"
        assert file(make_ctx(), str(path), content, mode="0600").changed
        assert path.read_text() == content
        assert file(make_ctx(), str(path), content, mode="0600").status is Status.OK
    assert not canary.exists()


class CountingConnection(LocalConnection):
    """Counts the commands (a process on the host each) and the reads without one (stat, get,
    inspect: requests to the host-side helper over SSH)."""

    def __init__(self) -> None:
        super().__init__("localhost")
        self.commands = 0
        self.reads = 0

    def run(self, command: str, **kwargs):  # type: ignore[no-untyped-def]
        self.commands += 1
        return super().run(command, **kwargs)

    def get(self, path: str, **kwargs):  # type: ignore[no-untyped-def]
        self.reads += 1
        return super().get(path, **kwargs)

    def stat(self, path: str, **kwargs):  # type: ignore[no-untyped-def]
        self.reads += 1
        return super().stat(path, **kwargs)

    def inspect(self, path: str, **kwargs):  # type: ignore[no-untyped-def]
        self.reads += 1
        return super().inspect(path, **kwargs)


@pytest.mark.parametrize(
    ("existing", "content", "mode", "commands"),
    [
        (None, "new\n", "0600", 1),  # stat without a command, then write with mode
        ("same\n", "same\n", None, 0),  # stat and content read and hashed here
        ("old\n", "new\n", "0600", 1),  # write + mode + rename in one command
        ("same\n", None, "0600", 1),  # chmod
    ],
)
def test_file_commands(
    tmp_path: Path, existing: str | None, content: str | None, mode: str | None, commands: int
) -> None:
    path = tmp_path / "f"
    if existing is not None:
        path.write_text(existing)
        path.chmod(0o644)
    conn = CountingConnection()
    file(OpContext(conn, FactCache(conn)), str(path), content, mode=mode)
    assert conn.commands == commands
    assert conn.reads >= 1  # the file's state is always read first
    assert path.read_text() == (content or existing)
    assert path.stat().st_mode & 0o777 == int(mode or "644", 8)


def test_paths_are_checked(tmp_path: Path) -> None:
    with pytest.raises(OpError, match="refusing to remove /"):
        directory(make_ctx(), "//", state="absent")
    with pytest.raises(OpError, match="bad path"):
        file(make_ctx(), "", "x")


def test_link_creates_relinks_at_once_and_refuses_a_directory(tmp_path: Path) -> None:
    (tmp_path / "v-1").mkdir()
    (tmp_path / "v-2").mkdir()
    link = tmp_path / "current"
    would = link_op(make_ctx(check=True, diff=True), str(link), "v-1")
    assert would.status is Status.CHANGED and would.msg == f"would link {link} -> v-1"
    assert would.diff == "link: absent -> v-1\n" and not link.is_symlink()
    made = link_op(make_ctx(), str(link), "v-1")
    assert made.status is Status.CHANGED and os.readlink(link) == "v-1"
    assert link_op(make_ctx(), str(link), "v-1").status is Status.OK
    moved = link_op(make_ctx(diff=True), str(link), "v-2")
    assert moved.status is Status.CHANGED and moved.diff == "link: v-1 -> v-2\n"
    assert os.readlink(link) == "v-2" and sorted(os.listdir(tmp_path)) == ["current", "v-1", "v-2"]
    refused = link_op(make_ctx(), str(tmp_path / "v-1"), "v-2")
    assert refused.failed and "is a directory, not a link" in refused.msg
    assert (tmp_path / "v-1").is_dir() and not (tmp_path / "v-1").is_symlink()
    with pytest.raises(OpError, match="bad link target"):
        link_op(make_ctx(), str(link), "")
