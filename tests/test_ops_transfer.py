"""copy and download through LocalConnection on temp directories (download: curl's file://)."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import pytest

from fxkit.connection.base import Stdin, buffers
from fxkit.connection.local import LocalConnection
from fxkit.errors import ConnectionFailed
from fxkit.facts.base import FactCache
from fxkit.ops.base import OpContext, OpError, Status
from fxkit.ops.files import write_command
from fxkit.ops.transfer import check_sha256, copy, download, known_stream


def make_ctx(check: bool = False, diff: bool = False) -> OpContext:
    conn = LocalConnection("localhost")
    return OpContext(conn, FactCache(conn), check=check, diff=diff)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def leftovers(directory: Path) -> list[str]:
    return [p.name for p in directory.iterdir() if ".fxkit." in p.name]


def test_copy_is_verified_and_idempotent(tmp_path: Path) -> None:
    src, dest = tmp_path / "artifact.bin", tmp_path / "host" / "artifact.bin"
    data = os.urandom(3 << 20)
    src.write_bytes(data)
    dest.parent.mkdir()

    preview = copy(make_ctx(check=True, diff=True), str(src), str(dest), sha256=sha(data))
    assert preview.msg == f"would create {dest}" and not dest.exists()
    assert preview.diff == f"{dest}: absent -> sha256 {sha(data)} ({len(data)} bytes from {src})\n"
    applied = copy(make_ctx(), str(src), str(dest), mode="0640", sha256=sha(data))
    assert applied.changed and dest.read_bytes() == data
    assert dest.stat().st_mode & 0o777 == 0o640
    assert copy(make_ctx(), str(src), str(dest), mode="0640").status is Status.OK
    # Same content, other mode: only the attribute changes.
    mode = copy(make_ctx(diff=True), str(src), str(dest), mode="0600")
    assert mode.msg == f"changed mode 0640 -> 0600 of {dest}" and dest.read_bytes() == data
    # New content: the diff names both digests.
    v2 = b"v2\n"
    src.write_bytes(v2)
    update = copy(make_ctx(diff=True), str(src), str(dest))
    assert update.diff == f"{dest}: sha256 {sha(data)} -> sha256 {sha(v2)} (3 bytes from {src})\n"
    assert dest.read_bytes() == b"v2\n" and dest.stat().st_mode & 0o777 == 0o600
    assert leftovers(dest.parent) == []


def test_a_link_lost_mid_copy_is_reported_as_such(tmp_path: Path) -> None:
    class LostMidUpload(LocalConnection):
        """The link drops after two chunks of an upload, as an SSH send fails: the error's
        traceback still holds views of the controller's (mapped) file."""

        def execute(self, command, *, become, timeout, stdin):  # type: ignore[no-untyped-def]
            if stdin is not None and not isinstance(stdin, bytes):
                sent = [view for _, view in zip(range(2), buffers(stdin), strict=False)]
                raise ConnectionFailed(f"connection lost after {len(sent)} chunks")
            return super().execute(command, become=become, timeout=timeout, stdin=stdin)

    src, dest = tmp_path / "big.bin", tmp_path / "dest.bin"
    src.write_bytes(os.urandom(5 << 20))
    conn = LostMidUpload("localhost")
    with pytest.raises(ConnectionFailed, match="lost after 2 chunks"):
        copy(OpContext(conn, FactCache(conn)), str(src), str(dest))
    assert not dest.exists() and leftovers(tmp_path) == []


def test_copy_refuses_a_controller_file_with_another_digest(tmp_path: Path) -> None:
    src, dest = tmp_path / "a", tmp_path / "b"
    src.write_bytes(b"tampered")
    result = copy(make_ctx(), str(src), str(dest), sha256="sha256:" + sha(b"original").upper())
    assert result.failed and not dest.exists()
    assert result.msg == (
        f"{src} on the controller has sha256 {sha(b'tampered')}, not the expected "
        f"{sha(b'original')}: nothing copied to {dest}; fetch the artifact again or fix the digest"
    )


def test_copy_of_an_empty_file_and_bad_input(tmp_path: Path) -> None:
    src, dest = tmp_path / "empty", tmp_path / "copied"
    src.write_bytes(b"")
    assert copy(make_ctx(), str(src), str(dest)).changed and dest.read_bytes() == b""
    assert copy(make_ctx(), str(src), str(dest)).status is Status.OK
    with pytest.raises(OpError, match=f"cannot read {tmp_path}/none on the controller"):
        copy(make_ctx(), str(tmp_path / "none"), str(dest))
    with pytest.raises(OpError, match="is not a regular file"):
        copy(make_ctx(), str(tmp_path), str(dest))
    missing = copy(make_ctx(), str(src), str(tmp_path / "no" / "dir" / "f"))
    assert missing.failed and f"{tmp_path}/no/dir is not a directory on the host" in missing.msg
    on_dir = copy(make_ctx(), str(src), str(tmp_path))
    assert on_dir.failed and "is a directory, not a file" in on_dir.msg
    with pytest.raises(OpError, match="bad sha256"):
        check_sha256("abc")


@pytest.fixture
def curl() -> None:
    if shutil.which("curl") is None:
        pytest.skip("needs curl on this machine")


@pytest.mark.usefixtures("curl")
def test_download_verifies_before_the_rename(tmp_path: Path) -> None:
    served, dest = tmp_path / "served.bin", tmp_path / "dl" / "artifact.bin"
    data = os.urandom(1 << 20)
    served.write_bytes(data)
    dest.parent.mkdir()
    url = served.as_uri()

    preview = download(make_ctx(check=True, diff=True), url, str(dest), sha256=sha(data))
    assert preview.msg == f"would download {url} to {dest}" and not dest.exists()
    assert preview.diff == f"{dest}: absent -> sha256 {sha(data)} ({url})\n"
    assert download(make_ctx(), url, str(dest), sha(data), mode="0600").changed
    assert dest.read_bytes() == data and dest.stat().st_mode & 0o777 == 0o600
    assert download(make_ctx(), url, str(dest), sha(data), mode="0600").status is Status.OK

    # The source changed, the digest did not: refused, the old file stays, no temp file.
    served.write_bytes(b"other")
    wrong = download(make_ctx(), url, str(dest), sha256="0" * 64)
    assert wrong.failed and dest.read_bytes() == data
    assert (
        f"fxkit: {url} has sha256 {sha(b'other')}, not the expected {'0' * 64}: "
        f"{dest} is unchanged" in wrong.msg
    )
    gone = download(make_ctx(), (tmp_path / "none").as_uri(), str(tmp_path / "dl" / "x"), "0" * 64)
    assert gone.failed and "curl: (37)" in gone.msg and not (tmp_path / "dl" / "x").exists()
    assert leftovers(dest.parent) == []
    with pytest.raises(OpError, match="bad URL"):
        download(make_ctx(), "mirror/x", str(dest), sha(data))


class Recording(LocalConnection):
    """Keeps the sha256 line every write's stdin ended with."""

    def __init__(self) -> None:
        super().__init__("localhost")
        self.sent: list[bytes] = []

    def execute(
        self, command: str, *, become: bool, timeout: float | None, stdin: Stdin
    ) -> tuple[int, bytes, bytes]:
        if stdin is not None:
            chunks = [bytes(c) for c in buffers(stdin)]
            self.sent.append(chunks[-1])
            stdin = b"".join(chunks)
        return super().execute(command, become=become, timeout=timeout, stdin=stdin)


def test_copy_hashes_the_source_once_and_sends_that_digest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src, dest = tmp_path / "artifact.bin", tmp_path / "artifact.copy"
    data = os.urandom(3 << 20)
    src.write_bytes(data)
    hashed: list[int] = []  # bytes the controller hashed, per call
    starts: list[bytes] = []  # the first bytes each hash saw: which file it was
    real = hashlib.sha256

    class Counting:
        def __init__(self, content: bytes = b"") -> None:
            self.real = real()
            self.first = True
            self.update(content)

        def update(self, content: bytes) -> None:
            hashed.append(len(content))
            if self.first and len(content):
                starts.append(bytes(content[:16]))
                self.first = False
            self.real.update(content)

        def hexdigest(self) -> str:
            return self.real.hexdigest()

    digest, reversed_digest = sha(data), sha(data[::-1])
    monkeypatch.setattr(hashlib, "sha256", Counting)  # the controller's every sha256
    for expected in (None, digest):  # absent: hashed in the stream; a digest to meet
        hashed.clear()
        dest.unlink(missing_ok=True)
        conn = Recording()
        assert copy(OpContext(conn, FactCache(conn)), str(src), str(dest), sha256=expected).changed
        assert dest.read_bytes() == data and conn.sent == [f"{digest}\n".encode()]
        assert sum(hashed) == len(data), expected  # once: in the stream or up front, not both
    src.write_bytes(data[::-1])  # the host's file exists: compared first, then passed through
    hashed.clear()
    starts.clear()
    conn = Recording()
    assert copy(OpContext(conn, FactCache(conn)), str(src), str(dest)).changed
    # The source once, and only the source: the host's own file is hashed where it lies
    # (Connection.inspect: the host-side helper; here fxkit's process, by the same code).
    assert dest.read_bytes() == data[::-1] and sum(hashed) == len(data)
    assert starts == [data[::-1][:16]]
    assert conn.sent == [f"{reversed_digest}\n".encode()]


def test_a_passed_digest_that_is_wrong_is_refused_by_the_host(tmp_path: Path) -> None:
    dest = tmp_path / "target"
    dest.write_bytes(b"old\n")
    conn = LocalConnection("localhost")
    command = write_command(str(dest), b"new\n")
    stream = known_stream(b"new\n", sha(b"other"))
    rc, _, err = conn.execute(command, become=False, timeout=None, stdin=stream)
    assert rc != 0 and b"corrupted" in err and dest.read_bytes() == b"old\n"
    assert leftovers(tmp_path) == []
