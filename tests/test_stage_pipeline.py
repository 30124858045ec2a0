"""The copy's pipeline on real files: the source read ahead on a thread of its own while the last
chunk is hashed and written (``_ReadAhead``), and the writes of whole blocks with O_DIRECT where
the store takes them, through the page cache where it does not (``Stager._write``)."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import blake3
import pytest

from fxkit.staging import (
    Destination,
    LocalSource,
    Manifest,
    StageError,
    Stager,
    _ReadAhead,
    _Writer,
    stage,
)

CHUNK = 1 << 20
#: Sizes around the edges of a chunk and of O_DIRECT's 4 KiB grid.
SIZES = {
    "empty": 0,
    "under-a-page": 100,
    "one-page": 4096,
    "one-chunk": CHUNK,
    "chunks-and-a-page-and-a-bit": 3 * CHUNK + 4096 + 5,
    "chunk-and-a-bit": CHUNK + 1,
}


def test_files_of_every_size_are_copied_and_hashed_whole(tmp_path: Path) -> None:
    src, dest = tmp_path / "src", tmp_path / "dest"
    src.mkdir()
    for name, size in SIZES.items():
        (src / name).write_bytes(os.urandom(size))
    with LocalSource(src) as source:
        result = stage(source, dest, chunk=CHUNK, jobs=2)
    assert result.copied == len(SIZES)
    records = json.loads((dest / ".fxkit-stage.json").read_text())["files"]
    for name in SIZES:
        data = (src / name).read_bytes()
        assert (dest / name).read_bytes() == data, name
        assert records[name]["digest"] == blake3.blake3(data).hexdigest(), name


class _Failing:
    """A source that gives ``good`` chunks, then fails as a disk does (EIO)."""

    def __init__(self, good: int):
        self.left = good

    def readinto(self, buffer: memoryview) -> int:
        if not self.left:
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        self.left -= 1
        buffer[:] = b"x" * len(buffer)
        return len(buffer)


def test_a_read_error_is_raised_where_its_chunk_would_come() -> None:
    ahead = _ReadAhead(_Failing(good=2), 4096, "src/model.bin")
    got: list[int] = []
    with pytest.raises(StageError, match="cannot read: Input/output error"), ahead as chunks:
        got.extend(len(c) for c in chunks)
    assert got == [4096, 4096]
    assert not any(thread.is_alive() for thread in ahead.threads)


def test_leaving_early_stops_the_reads() -> None:
    ahead = _ReadAhead(_Failing(good=1000), 4096, "src/model.bin")
    with ahead as chunks:
        assert len(next(chunks)) == 4096
    assert not any(thread.is_alive() for thread in ahead.threads)


def test_a_write_o_direct_refuses_goes_through_the_page_cache(tmp_path: Path) -> None:
    """A buffer off the page grid (O_DIRECT wants it aligned): the kernel refuses the O_DIRECT
    write with EINVAL; the bytes are written buffered, and so is every later chunk."""
    (tmp_path / "src").mkdir()
    with (
        LocalSource(tmp_path / "src") as source,
        Destination(tmp_path / "dest", create=True) as dest,
    ):
        stager = Stager(source, Manifest(dest))
        fd = dest.open_partial("model.bin")
        data = os.urandom(3 * 4096 + 7)
        with _Writer(fd) as writer:
            assert writer.direct is not None, "this file system takes O_DIRECT writes"
            stager._write(writer, memoryview(bytearray(b"\0" + data))[1:], 0)
            assert writer.direct is None
            stager._write(writer, memoryview(data), len(data))
        os.close(fd)
    assert (tmp_path / "dest" / ".model.bin.fxkit-partial").read_bytes() == data + data
