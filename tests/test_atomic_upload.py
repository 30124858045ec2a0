"""No partial file, ever: a write that breaks off leaves the old file whole (connection.atomic).

The lab test kills a real ``fxkit play`` with SIGKILL while it uploads 100 MB to three lab hosts,
at three moments (it stops itself once a tenth, half or nine tenths of the file went to one host:
tests/upload_paused.py); every host must then have the old file, whole, and no temp file, and
the next run installs the new one.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from sync_helpers import stopped, when

from fxkit.connection.atomic import ONE_PASS_FROM, OPENSSL_FROM, TEMP_MARK
from fxkit.connection.base import buffers
from fxkit.connection.local import LocalConnection
from fxkit.errors import FxkitError
from fxkit.facts.base import FactCache
from fxkit.ops.base import OpContext
from fxkit.ops.files import file

REPO = Path(__file__).resolve().parents[1]
PAUSED = Path(__file__).with_name("upload_paused.py")


class DroppedLink(LocalConnection):
    """A local connection whose link drops after ``keep`` bytes of a command's stdin (the
    content, then its sha256 line): the command gets end-of-file early, as the host does when
    fxkit dies mid-upload."""

    def __init__(self, keep: int):
        super().__init__("localhost")
        self.keep = keep

    def execute(self, command, *, become, timeout, stdin):  # type: ignore[no-untyped-def]
        if stdin is not None:
            stdin = b"".join(buffers(stdin))[: self.keep]
        return super().execute(command, become=become, timeout=timeout, stdin=stdin)


def _temps(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if TEMP_MARK in p.name)


@pytest.mark.parametrize("keep", [0, 1, 500_000, 999_999])
def test_a_write_that_breaks_off_leaves_the_old_file(tmp_path: Path, keep: int) -> None:
    target = tmp_path / "app.bin"
    target.write_bytes(b"old content\n")
    conn = DroppedLink(keep)
    result = file(OpContext(conn, FactCache(conn)), str(target), content=b"n" * 10**6)
    error = result.msg
    assert result.failed
    assert f"broke off after {keep} of 1000000 bytes" in error and "unchanged" in error
    assert target.read_bytes() == b"old content\n"
    assert _temps(tmp_path) == []  # the writing shell removed its temp file
    with pytest.raises(FxkitError, match=r"cannot write .* broke off"):
        conn.put(str(target), b"n" * (keep + 10))
    assert target.read_bytes() == b"old content\n"


@pytest.mark.parametrize("keep", [10**6, 10**6 + 64])
def test_content_without_its_whole_sha256_line_is_not_installed(tmp_path: Path, keep: int) -> None:
    # All the content arrived; the link dropped before (or in) the sha256 line that follows it.
    target = tmp_path / "app.bin"
    target.write_bytes(b"old content\n")
    with pytest.raises(FxkitError, match="broke off after 1000000 of 1000000 bytes"):
        DroppedLink(keep).put(str(target), b"n" * 10**6)
    assert target.read_bytes() == b"old content\n" and _temps(tmp_path) == []


#: Content hashed on the host by coreutils, by openssl where installed (OPENSSL_FROM), and
#: while it is written by python3 (ONE_PASS_FROM).
SIZES = pytest.mark.parametrize(
    "content",
    [b"new content", b"n" * (OPENSSL_FROM + 5), b"n" * (ONE_PASS_FROM + 5)],
    ids=["small", "openssl-sized", "one-pass"],
)


@pytest.mark.parametrize("keep", [0, ONE_PASS_FROM // 2, ONE_PASS_FROM + 5, ONE_PASS_FROM + 40])
def test_a_one_pass_write_that_breaks_off_leaves_the_old_file(tmp_path: Path, keep: int) -> None:
    assert LocalConnection("localhost").run("command -v python3").ok  # the writer's path
    target = tmp_path / "big.bin"
    target.write_bytes(b"old content\n")
    size = ONE_PASS_FROM + 5
    with pytest.raises(FxkitError, match=f"broke off after {min(keep, size)} of {size} bytes"):
        DroppedLink(keep).put(str(target), b"n" * size)
    assert target.read_bytes() == b"old content\n" and _temps(tmp_path) == []


def test_without_python3_the_host_copies_then_hashes(tmp_path: Path, monkeypatch) -> None:
    """A host without python3 gets dd and the hash after it: the same file, the same checks."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for folder in ("/usr/local/bin", "/usr/bin", "/bin"):
        for tool in Path(folder).iterdir():
            if not tool.name.startswith("python") and not (bin_dir / tool.name).exists():
                (bin_dir / tool.name).symlink_to(tool)
    monkeypatch.setenv("PATH", str(bin_dir))
    conn = LocalConnection("localhost")
    assert conn.run("command -v python3 || echo none").stdout == "none\n"
    target, content = tmp_path / "big.bin", os.urandom(ONE_PASS_FROM + 5)
    conn.put(str(target), content)
    assert target.read_bytes() == content and _temps(tmp_path) == []
    with pytest.raises(FxkitError, match=f"broke off after 1000 of {len(content)} bytes"):
        DroppedLink(1000).put(str(target), content[::-1])
    assert target.read_bytes() == content and _temps(tmp_path) == []


def test_the_one_pass_writer_is_the_hosts_python(tmp_path: Path, monkeypatch) -> None:
    """The inventory's interpreter (``Connection.python``, from ansible_python_interpreter)
    writes and hashes a big file, not whatever python3 is first on PATH; one that is not there
    gets dd and the hash after it."""
    real = shutil.which("python3")
    assert real is not None

    def logging_python(name: str) -> Path:
        wrapper = tmp_path / name
        wrapper.write_text(f'#!/bin/sh\necho "$*" >> {wrapper}.log\nexec {real} "$@"\n')
        wrapper.chmod(0o755)
        return wrapper

    on_path = tmp_path / "bin"
    on_path.mkdir()
    logging_python("bin/python3")
    monkeypatch.setenv("PATH", f"{on_path}:{os.environ['PATH']}")
    chosen = logging_python("chosen-python")
    content = os.urandom(ONE_PASS_FROM + 5)
    conn = LocalConnection("localhost")
    conn.python = str(chosen)
    conn.put(str(tmp_path / "a.bin"), content)
    assert (tmp_path / "a.bin").read_bytes() == content
    assert Path(f"{chosen}.log").read_text().startswith("-I -S -c import hashlib")
    conn.python = str(tmp_path / "absent" / "python3")
    conn.put(str(tmp_path / "b.bin"), content)
    assert (tmp_path / "b.bin").read_bytes() == content and _temps(tmp_path) == []
    assert not (on_path / "python3.log").exists()  # PATH's python3 never ran


@SIZES
@pytest.mark.parametrize("where", [0, 10, -2], ids=["content", "content-end", "sha256-line"])
def test_corrupted_content_is_not_installed(tmp_path: Path, where: int, content: bytes) -> None:
    class Corrupting(LocalConnection):
        def execute(self, command, *, become, timeout, stdin):  # type: ignore[no-untyped-def]
            flipped = bytearray(b"".join(buffers(stdin)))
            flipped[where] ^= 1
            return super().execute(command, become=become, timeout=timeout, stdin=bytes(flipped))

    target = tmp_path / "f"
    target.write_bytes(b"old")
    with pytest.raises(FxkitError, match="corrupted"):
        Corrupting("localhost").put(str(target), content)
    assert target.read_bytes() == b"old" and _temps(tmp_path) == []
    LocalConnection("localhost").put(str(target), content)
    assert target.read_bytes() == content and _temps(tmp_path) == []


def test_temp_files_of_dead_writers_are_removed_by_the_next_write(tmp_path: Path) -> None:
    target = tmp_path / "f"
    dead = subprocess.run(["sh", "-c", "echo $$"], capture_output=True, text=True).stdout.strip()
    stale = tmp_path / f".f{TEMP_MARK}{dead}.AbCdEf"  # a writer killed with SIGKILL
    live = tmp_path / f".f{TEMP_MARK}{os.getpid()}.XyZ123"  # a writer still at work
    other = tmp_path / f".g{TEMP_MARK}{dead}.AbCdEf"  # another file's
    for path in (stale, live, other):
        path.write_bytes(b"partial")
    LocalConnection("localhost").put(str(target), b"whole\n")
    assert target.read_bytes() == b"whole\n"
    assert _temps(tmp_path) == sorted([live.name, other.name])


# -- a real fxkit killed mid-upload ------------------------------------------------------------

ROLE = """
from pathlib import Path

def apply(host, v):
    host.file("/srv/big.bin", content=Path(v.payload).read_bytes(), mode="0644")
"""
HOSTS = ["lab01", "lab02", "lab03"]
SIZE = 100 * 2**20


def _sums(fleet, names: list[str]) -> dict[str, str]:
    sums = {}
    for name in names:
        with fleet.connect(name) as conn:
            result = conn.run("sha256sum /srv/big.bin; ls -a /srv")
            sums[name] = result.stdout
    return sums


@pytest.mark.lab
def test_sigkill_during_a_100mb_upload_leaves_the_old_file(lab_fleet, tmp_path: Path) -> None:
    fleet = lab_fleet(3)
    old, new = os.urandom(2**20), os.urandom(SIZE)
    old_sum, new_sum = hashlib.sha256(old).hexdigest(), hashlib.sha256(new).hexdigest()
    payload = tmp_path / "payload.bin"
    payload.write_bytes(new)
    role = tmp_path / "roles" / "big" / "role.py"
    role.parent.mkdir(parents=True)
    role.write_text(ROLE)
    playbook = tmp_path / "play.yml"
    playbook.write_text(
        f"- hosts: {','.join(HOSTS)}\n  roles: [big]\n  vars:\n    payload: {payload}\n"
    )
    command = [sys.executable, "-m", "fxkit", "play", str(playbook), "-i", str(fleet.inventory)]
    for name in HOSTS:
        with fleet.connect(name) as conn:
            conn.put("/srv/big.bin", old)
            assert conn.run(f"rm -f /srv/.big.bin{TEMP_MARK}*").ok
    for fraction in (0.1, 0.5, 0.9):
        pause_at = str(int(fraction * SIZE))  # bytes of one host's upload (the first there)
        paused = [sys.executable, str(PAUSED), pause_at, *command[3:]]
        proc = subprocess.Popen(paused, cwd=REPO, stdout=subprocess.DEVNULL)
        try:
            stopped(proc)
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        # The hosts' shells see their input end and remove their temp files.
        when(lambda: TEMP_MARK not in "".join(_sums(fleet, HOSTS).values()), "temp files gone")
        for name, listing in _sums(fleet, HOSTS).items():
            # No host had the whole file yet: each kept the old one, whole.
            assert listing.split()[0] == old_sum, f"{name} has a partial file after SIGKILL"
            assert TEMP_MARK not in listing, f"{name} kept its temp file: {listing}"
        for name in HOSTS:  # back to the old file for the next kill
            with fleet.connect(name) as conn:
                conn.put("/srv/big.bin", old)
    finished = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert finished.returncode == 0, finished.stdout + finished.stderr
    for name, listing in _sums(fleet, HOSTS).items():
        assert listing.split()[0] == new_sum and TEMP_MARK not in listing, name
