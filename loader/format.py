"""The safetensors format: header parsing and strict validation, without reading tensor data.

Rules follow the reference reader (huggingface/safetensors): an 8-byte little-endian header size
of at most 100,000,000; a UTF-8 JSON object header that lies inside the file; known dtypes; each
tensor's byte span equal to its element count times its dtype size; offsets that, sorted, tile the
data region without gaps or overlaps and end exactly at the end of the file; ``__metadata__`` a
map of strings. Nothing is allocated from header numbers before they are checked against the file.
"""

from __future__ import annotations

import json
import math
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import (
    DuplicateTensor,
    HeaderTooLarge,
    HeaderTooSmall,
    InvalidHeader,
    InvalidHeaderDeserialization,
    InvalidHeaderLength,
    InvalidHeaderStart,
    InvalidOffset,
    LoaderError,
    MetadataIncompleteBuffer,
    TensorInvalidInfo,
    UnknownDtype,
    ValidationOverflow,
)
from .files import ModelPath, model_files, open_regular

MAX_HEADER_SIZE = 100_000_000
U64_MAX = 2**64 - 1

#: safetensors dtype -> (bits per element, torch dtype name or None where torch has none).
DTYPES: dict[str, tuple[int, str | None]] = {
    "BOOL": (8, "bool"),
    "U8": (8, "uint8"),
    "I8": (8, "int8"),
    "I16": (16, "int16"),
    "U16": (16, "uint16"),
    "F16": (16, "float16"),
    "BF16": (16, "bfloat16"),
    "I32": (32, "int32"),
    "U32": (32, "uint32"),
    "F32": (32, "float32"),
    "F64": (64, "float64"),
    "I64": (64, "int64"),
    "U64": (64, "uint64"),
    "C64": (64, "complex64"),
    "F8_E5M2": (8, "float8_e5m2"),
    "F8_E4M3": (8, "float8_e4m3fn"),
    "F8_E8M0": (8, "float8_e8m0fnu"),
    "F8_E4M3FNUZ": (8, "float8_e4m3fnuz"),
    "F8_E5M2FNUZ": (8, "float8_e5m2fnuz"),
    "F4": (4, None),
    "F6_E2M3": (6, None),
    "F6_E3M2": (6, None),
}


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of a file: its dtype, shape and byte span relative to the data region."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.begin


@dataclass
class FileHeader:
    """A validated safetensors file: where its data region lies and which tensors it holds."""

    path: Path
    data_offset: int
    data_size: int
    tensors: list[TensorInfo]
    metadata: dict[str, str] = field(default_factory=dict)

    @property
    def file_size(self) -> int:
        return self.data_offset + self.data_size


def _fail(
    error: type[LoaderError], path: Path, what: str, tensor: str | None = None
) -> LoaderError:
    where = f"{path}" if tensor is None else f"{path}: tensor {tensor!r}"
    return error(f"{where}: {what}")


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise ValueError(f"duplicate key {key!r}")
        result[key] = value
    return result


def _natural(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= U64_MAX


def _tensor_info(path: Path, name: str, entry: Any) -> TensorInfo:
    if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
        raise _fail(
            InvalidHeaderDeserialization,
            path,
            "entry must be an object with exactly dtype, shape, data_offsets",
            name,
        )
    dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    if dtype not in DTYPES:
        raise _fail(
            UnknownDtype, path, f"unknown dtype {dtype!r} (known: {', '.join(DTYPES)})", name
        )
    if not isinstance(shape, list) or not all(_natural(d) for d in shape):
        what = f"shape must be a list of non-negative integers, got {shape!r}"
        raise _fail(InvalidHeaderDeserialization, path, what, name)
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(map(_natural, offsets))):
        what = f"data_offsets must be [begin, end] integers, got {offsets!r}"
        raise _fail(InvalidHeaderDeserialization, path, what, name)
    begin, end = offsets
    if end < begin:
        raise _fail(InvalidOffset, path, f"data_offsets end {end} is before begin {begin}", name)
    elements = math.prod(shape)
    bits = DTYPES[dtype][0]
    if elements > U64_MAX or elements * bits > U64_MAX:
        raise _fail(
            ValidationOverflow, path, f"shape {shape} overflows 64-bit element arithmetic", name
        )
    if elements * bits % 8:
        raise _fail(
            TensorInvalidInfo, path, f"{elements} elements of {dtype} do not fill whole bytes", name
        )
    if elements * bits // 8 != end - begin:
        raise _fail(
            TensorInvalidInfo,
            path,
            f"shape {shape} x {dtype} is {elements * bits // 8} bytes "
            f"but data_offsets span {end - begin}",
            name,
        )
    return TensorInfo(name, dtype, tuple(shape), begin, end)


def _metadata(path: Path, value: Any) -> dict[str, str]:
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise _fail(
            InvalidHeaderDeserialization,
            path,
            "__metadata__ must be an object of strings to strings",
        )
    return value


def parse_header(path: Path, raw: bytes, file_size: int) -> FileHeader:
    """Validate the JSON header ``raw`` of a file of ``file_size`` bytes."""
    if not raw.startswith(b"{"):
        raise _fail(
            InvalidHeaderStart, path, "header does not start with '{' (not a safetensors file?)"
        )
    try:
        doc = json.loads(raw.decode("utf-8"), object_pairs_hook=_no_duplicate_keys)
    except UnicodeDecodeError as exc:
        raise _fail(
            InvalidHeader, path, f"header is not valid UTF-8 ({exc.reason} at byte {exc.start})"
        ) from None
    except (ValueError, RecursionError) as exc:
        raise _fail(
            InvalidHeaderDeserialization, path, f"header is not valid JSON: {exc}"
        ) from None
    if not isinstance(doc, dict):
        raise _fail(InvalidHeaderDeserialization, path, "header must be a JSON object")
    metadata = _metadata(path, doc.pop("__metadata__", {}))
    tensors = sorted(
        (_tensor_info(path, name, entry) for name, entry in doc.items()),
        key=lambda t: (t.begin, t.end),
    )
    data_offset = 8 + len(raw)
    data_size = file_size - data_offset
    position = 0
    for tensor in tensors:
        if tensor.begin != position:
            gap = "a gap" if tensor.begin > position else "an overlap"
            raise _fail(
                InvalidOffset,
                path,
                f"data_offsets begin {tensor.begin} leaves {gap} (expected {position})",
                tensor.name,
            )
        position = tensor.end
    if position > data_size:
        last = tensors[-1].name
        raise _fail(
            MetadataIncompleteBuffer,
            path,
            f"data ends at {position}, past the end of the file ({data_size})",
            last,
        )
    if position != data_size:
        raise _fail(
            MetadataIncompleteBuffer,
            path,
            f"{data_size - position} trailing bytes after the last tensor",
        )
    return FileHeader(path, data_offset, data_size, tensors, metadata)


def read_header(path: Path | str) -> FileHeader:
    """Read and validate the header of one safetensors file."""
    path = Path(path)
    try:
        with open(open_regular(path), "rb") as f:
            # Only the header: no readahead past it, which would also leave readahead marks that
            # make a later reader of the file fetch far more than it asks for (see ``keep``).
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_RANDOM)
            file_size = os.fstat(f.fileno()).st_size
            if file_size < 8:
                raise _fail(
                    HeaderTooSmall,
                    path,
                    f"file is {file_size} bytes, too small for a safetensors header",
                )
            (size,) = struct.unpack("<Q", f.read(8))
            if size > MAX_HEADER_SIZE:
                raise _fail(
                    HeaderTooLarge,
                    path,
                    f"header size {size} exceeds the limit of {MAX_HEADER_SIZE}",
                )
            if 8 + size > file_size:
                raise _fail(
                    InvalidHeaderLength,
                    path,
                    f"header of {size} bytes runs past the end of the file",
                )
            raw = f.read(size)
    except OSError as exc:
        raise _fail(LoaderError, path, f"cannot read: {exc.strerror or exc}") from None
    if len(raw) != size:
        raise _fail(InvalidHeaderLength, path, "file shrank while reading its header")
    return parse_header(path, raw, file_size)


@dataclass
class Checkpoint:
    """A validated model: its files' headers, in load order, and every tensor's location."""

    files: list[FileHeader]
    locations: dict[str, FileHeader]

    @property
    def tensors(self) -> dict[str, TensorInfo]:
        return {t.name: t for header in self.files for t in header.tensors}

    @property
    def metadata(self) -> dict[str, str]:
        """``__metadata__`` of the files, merged in file order."""
        merged: dict[str, str] = {}
        for header in self.files:
            merged.update(header.metadata)
        return merged

    @property
    def total_bytes(self) -> int:
        return sum(h.data_size for h in self.files)

    def __len__(self) -> int:
        return len(self.locations)


def open_checkpoint(path: ModelPath) -> Checkpoint:
    """Validate a model's headers (and its index, when there is one) without reading tensor data.

    Its files are found by :func:`fxkit.loader.files.model_files` (and its rule on symlinks).
    """
    model = model_files(path)
    headers = [read_header(f) for f in model.files]
    locations: dict[str, FileHeader] = {}
    for header in headers:
        for tensor in header.tensors:
            if tensor.name in locations:
                raise _fail(
                    DuplicateTensor,
                    header.path,
                    f"also in {locations[tensor.name].path} (duplicate)",
                    tensor.name,
                )
            locations[tensor.name] = header
    if model.index is not None and model.weight_map is not None:
        header_of = dict(zip(model.files, headers, strict=True))
        for name, file in model.weight_map.items():
            found = locations.get(name)
            if found is None or found is not header_of[file]:
                where = f"it is in {model.shown(found.path)!r}" if found else "no file holds it"
                raise _fail(
                    LoaderError,
                    model.index,
                    f"lists {name!r} in {model.shown(file)!r}, but {where}",
                )
    return Checkpoint(headers, locations)
