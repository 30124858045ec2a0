"""No partial file, ever: a write that breaks off leaves the old file whole (connection.atomic).

The lab test kills a real ``fxkit play`` with SIGKILL while it uploads 100 MB to three lab hosts,
at three moments (a tenth, half and nine tenths of the file on the first host); every host must
then have the old file or the new one, whole, and no temp file once the next run is done.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fxkit.connection.atomic import TEMP_MARK
from fxkit.connection.base import buffers
from fxkit.connection.local import LocalConnection
from fxkit.errors import FxkitError
from fxkit.facts.base import FactCache
from fxkit.ops.base import OpContext
from fxkit.ops.files import file

REPO = Path(__file__).resolve().parents[1]


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


@pytest.mark.parametrize("where", [0, 10, -2], ids=["content", "content-end", "sha256-line"])
def test_corrupted_content_is_not_installed(tmp_path: Path, where: int) -> None:
    class Corrupting(LocalConnection):
        def execute(self, command, *, become, timeout, stdin):  # type: ignore[no-untyped-def]
            flipped = bytearray(b"".join(buffers(stdin)))
            flipped[where] ^= 1
            return super().execute(command, become=become, timeout=timeout, stdin=bytes(flipped))

    target = tmp_path / "f"
    target.write_bytes(b"old")
    with pytest.raises(FxkitError, match="corrupted"):
        Corrupting("localhost").put(str(target), b"new content")
    assert target.read_bytes() == b"old" and _temps(tmp_path) == []


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


def _upload_progress(probe) -> int:
    """Bytes of the new file on the host: in its temp file, or all once it was renamed."""
    out = probe.run(
        f"stat -c %s /srv/.big.bin{TEMP_MARK}* 2>/dev/null; stat -c %s /srv/big.bin"
    ).stdout.split()
    return max(map(int, out), default=0)


@pytest.mark.lab
def test_sigkill_during_a_100mb_upload_leaves_old_or_new_files(lab_fleet, tmp_path: Path) -> None:
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
    outcomes = []
    for fraction in (0.1, 0.5, 0.9):
        proc = subprocess.Popen(command, cwd=REPO, stdout=subprocess.DEVNULL)
        with fleet.connect("lab01") as probe:
            while _upload_progress(probe) < fraction * SIZE and proc.poll() is None:
                time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        # The hosts' shells see their input end and remove their temp files right away.
        deadline = time.monotonic() + 10
        while TEMP_MARK in "".join(_sums(fleet, HOSTS).values()) and time.monotonic() < deadline:
            time.sleep(0.2)
        for name, listing in _sums(fleet, HOSTS).items():
            digest = listing.split()[0]
            assert digest in (old_sum, new_sum), f"{name} has a partial file after SIGKILL"
            outcomes.append("new" if digest == new_sum else "old")
            assert TEMP_MARK not in listing, f"{name} kept its temp file: {listing}"
        for name in HOSTS:  # back to the old file for the next kill
            with fleet.connect(name) as conn:
                conn.put("/srv/big.bin", old)
    assert "old" in outcomes  # the kills did land mid-upload
    finished = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert finished.returncode == 0, finished.stdout + finished.stderr
    for name, listing in _sums(fleet, HOSTS).items():
        assert listing.split()[0] == new_sum and TEMP_MARK not in listing, name
