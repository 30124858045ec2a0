"""Which byte ranges to read, in which chunks, into which place of a file's buffer.

A file's buffer covers its data region widened to block boundaries (``ALIGN``), so that every read
can be an O_DIRECT read: aligned file offset, aligned length, aligned destination. The unaligned
head (the end of the JSON header) and tail (past the end of file, where the read comes back short)
are simply read along and never looked at; a tensor lives at ``head + begin`` in the buffer.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from .format import FileHeader, TensorInfo

ALIGN = 4096
DEFAULT_CHUNK = 32 * 2**20


def align_down(value: int, align: int = ALIGN) -> int:
    return value - value % align


def align_up(value: int, align: int = ALIGN) -> int:
    return align_down(value + align - 1, align)


@dataclass(frozen=True)
class Chunk:
    """One read: ``length`` bytes from ``file_offset`` into the buffer at ``buffer_offset``."""

    file_offset: int
    buffer_offset: int
    length: int


@dataclass(frozen=True)
class FilePlan:
    """How one file is read: its buffer's size, where its data starts in it, and the chunks."""

    header: FileHeader
    buffer_size: int
    head: int
    chunk_size: int
    chunks: list[Chunk]

    @property
    def start(self) -> int:
        """File offset of the buffer's first byte."""
        return self.header.data_offset - self.head

    def needed_end(self, chunk: Chunk) -> int:
        """How many bytes of ``chunk`` must arrive: all but what lies past the end of file."""
        return min(chunk.length, self.header.file_size - (self.start + chunk.buffer_offset))

    def holding(self, tensors: Iterable[TensorInfo]) -> list[int]:
        """The indices of the chunks that hold a byte of ``tensors``, in order."""
        wanted: set[int] = set()
        for t in tensors:
            if t.nbytes:
                first, last = self.head + t.begin, self.head + t.end - 1
                wanted.update(range(first // self.chunk_size, last // self.chunk_size + 1))
        return sorted(wanted)


def normalise_chunk_size(chunk_size: int | None) -> int:
    """A chunk size rounded up to whole blocks (at least one)."""
    if chunk_size is None:
        return DEFAULT_CHUNK
    if chunk_size <= 0:
        raise ValueError(f"chunk_size must be positive, got {chunk_size}")
    return align_up(chunk_size)


def plan_file(header: FileHeader, chunk_size: int, whole_file: bool = False) -> FilePlan:
    """Split a file's (block-widened) data region into chunks of ``chunk_size`` bytes.

    ``whole_file`` makes the buffer start at the file's first byte (for a mapped file).
    """
    start = 0 if whole_file else align_down(header.data_offset)
    end = align_up(header.file_size) if header.data_size else start
    chunks = [
        Chunk(offset, offset - start, min(chunk_size, end - offset))
        for offset in range(start, end, chunk_size)
    ]
    return FilePlan(header, end - start, header.data_offset - start, chunk_size, chunks)
