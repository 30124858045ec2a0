"""Header validation and model resolution: the reference reader's rules, on hand-built bytes."""

from __future__ import annotations

import json
import struct
import tracemalloc
from pathlib import Path

import pytest
from fxkit.loader import LoaderError, load, open_checkpoint
from fxkit.loader.errors import (
    DuplicateTensor,
    HeaderTooLarge,
    HeaderTooSmall,
    InvalidHeader,
    InvalidHeaderDeserialization,
    InvalidHeaderLength,
    InvalidHeaderStart,
    InvalidOffset,
    MetadataIncompleteBuffer,
    TensorInvalidInfo,
    UnknownDtype,
    ValidationOverflow,
)
from fxkit.loader.files import INDEX_NAME
from fxkit.loader.format import MAX_HEADER_SIZE, read_header
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st


def raw(header: dict | bytes, data: bytes = b"", size: int | None = None) -> bytes:
    """A safetensors file's bytes: size field (``size`` overrides the true one), header, data."""
    body = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(body) if size is None else size) + body + data


def entry(dtype: str, shape: list, begin: int, end: int) -> dict:
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


VALID = {
    "__metadata__": {"format": "pt"},
    "a": entry("F32", [2, 2], 0, 16),
    "b": entry("I16", [3], 16, 22),
}


def write(tmp_path: Path, content: bytes, name: str = "m.safetensors") -> Path:
    path = tmp_path / name
    path.write_bytes(content)
    return path


def test_valid_file_parses(tmp_path: Path) -> None:
    header = read_header(write(tmp_path, raw(VALID, bytes(22))))
    assert [t.name for t in header.tensors] == ["a", "b"]
    assert header.metadata == {"format": "pt"}
    assert header.data_size == 22


# (name, error class (safetensors' SafeTensorError variant), file bytes, words the message must
# contain, tensor the message must name or None)
MALFORMED = [
    ("too small", HeaderTooSmall, b"\x01\x00\x00", "too small", None),
    (
        "header too large",
        HeaderTooLarge,
        raw(b"{}", size=MAX_HEADER_SIZE + 1),
        "exceeds the limit",
        None,
    ),
    ("header size 2^63", HeaderTooLarge, raw(b"{}", size=2**63), "exceeds the limit", None),
    ("header size u64 max", HeaderTooLarge, raw(b"{}", size=2**64 - 1), "exceeds the limit", None),
    (
        "header past EOF",
        InvalidHeaderLength,
        raw(b"{}", size=1000),
        "past the end of the file",
        None,
    ),
    ("not UTF-8", InvalidHeader, raw(b'{"\xff\xfe": 1}'), "not valid UTF-8", None),
    ("bad JSON", InvalidHeaderDeserialization, raw(b'{"a": '), "not valid JSON", None),
    ("not an object", InvalidHeaderStart, raw(b"[1, 2]"), "does not start with '{'", None),
    (
        "deep nesting",
        InvalidHeaderDeserialization,
        raw(b'{"a":' + b"[" * 100_000 + b"]" * 100_000 + b"}"),
        "JSON",
        None,
    ),
    (
        "duplicate key",
        InvalidHeaderDeserialization,
        raw(b'{"a": 1, "a": 2}'),
        "duplicate key",
        None,
    ),
    (
        "unknown dtype",
        UnknownDtype,
        raw({"t": entry("F128", [1], 0, 16)}, bytes(16)),
        "unknown dtype",
        "t",
    ),
    (
        "extra field",
        InvalidHeaderDeserialization,
        raw({"t": {**entry("U8", [1], 0, 1), "x": 1}}, b"\0"),
        "exactly",
        "t",
    ),
    (
        "negative dim",
        InvalidHeaderDeserialization,
        raw({"t": entry("U8", [-1], 0, 1)}, b"\0"),
        "shape must be",
        "t",
    ),
    (
        "bool dim",
        InvalidHeaderDeserialization,
        raw({"t": entry("U8", [True], 0, 1)}, b"\0"),
        "shape must be",
        "t",
    ),
    (
        "float dim",
        InvalidHeaderDeserialization,
        raw({"t": entry("U8", [1.0], 0, 1)}, b"\0"),
        "shape must be",
        "t",
    ),
    (
        "offsets not pair",
        InvalidHeaderDeserialization,
        raw({"t": {**entry("U8", [1], 0, 1), "data_offsets": [0]}}, b"\0"),
        "data_offsets must be",
        "t",
    ),
    (
        "end before begin",
        InvalidOffset,
        raw({"t": entry("U8", [0], 4, 2)}, bytes(4)),
        "before begin",
        "t",
    ),
    (
        "size mismatch",
        TensorInvalidInfo,
        raw({"t": entry("F32", [3], 0, 8)}, bytes(8)),
        "span 8",
        "t",
    ),
    (
        "overflow",
        ValidationOverflow,
        raw({"t": entry("F32", [2**40, 2**40], 0, 4)}, bytes(4)),
        "overflows",
        "t",
    ),
    (
        "sub-byte remainder",
        TensorInvalidInfo,
        raw({"t": entry("F4", [3], 0, 1)}, b"\0"),
        "whole bytes",
        "t",
    ),
    (
        "gap",
        InvalidOffset,
        raw({"a": entry("U8", [2], 0, 2), "b": entry("U8", [2], 3, 5)}, bytes(5)),
        "a gap",
        "b",
    ),
    (
        "overlap",
        InvalidOffset,
        raw({"a": entry("U8", [2], 0, 2), "b": entry("U8", [2], 1, 3)}, bytes(3)),
        "an overlap",
        "b",
    ),
    ("first not at 0", InvalidOffset, raw({"a": entry("U8", [2], 1, 3)}, bytes(3)), "a gap", "a"),
    (
        "past the end",
        MetadataIncompleteBuffer,
        raw({"a": entry("U8", [8], 0, 8)}, bytes(4)),
        "past the end",
        "a",
    ),
    (
        "huge offsets",
        MetadataIncompleteBuffer,
        raw({"a": entry("U8", [2**58], 0, 2**58)}, bytes(4)),
        "past the end",
        "a",
    ),
    (
        "trailing bytes",
        MetadataIncompleteBuffer,
        raw({"a": entry("U8", [2], 0, 2)}, bytes(3)),
        "1 trailing bytes",
        None,
    ),
    (
        "metadata not strings",
        InvalidHeaderDeserialization,
        raw({"__metadata__": {"k": 1}}),
        "__metadata__",
        None,
    ),
    (
        "metadata not object",
        InvalidHeaderDeserialization,
        raw({"__metadata__": "x"}),
        "__metadata__",
        None,
    ),
]


@pytest.mark.parametrize(
    ("error", "content", "words", "tensor"),
    [pytest.param(e, c, w, t, id=name) for name, e, c, w, t in MALFORMED],
)
def test_malformed_file_is_refused_with_file_and_tensor(
    tmp_path: Path, error: type[LoaderError], content: bytes, words: str, tensor: str | None
) -> None:
    path = write(tmp_path, content)
    with pytest.raises(error, match=words) as caught:
        open_checkpoint(path)
    assert str(path) in str(caught.value)
    if tensor is not None:
        assert f"tensor {tensor!r}" in str(caught.value)


def test_malicious_sizes_fail_fast_without_allocating(tmp_path: Path) -> None:
    """A header claiming 2^62-byte tensors and an 8 EiB header are refused before any allocation."""
    files = [
        write(tmp_path, raw(b"{}", size=2**63), "a.safetensors"),
        write(tmp_path, raw({"a": entry("F64", [2**31, 2**28], 0, 2**62)}, bytes(8)), "b.st"),
    ]
    tracemalloc.start()
    for path, error in zip(files, [HeaderTooLarge, ValidationOverflow], strict=True):
        with pytest.raises(error):
            load(path)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 1_000_000


def test_dtype_without_torch_equivalent_fails_at_load_not_at_open(tmp_path: Path) -> None:
    path = write(tmp_path, raw({"w": entry("F4", [4], 0, 2)}, bytes(2)))
    assert open_checkpoint(path).tensors["w"].dtype == "F4"
    with pytest.raises(LoaderError, match="'w': dtype F4 has no torch equivalent"):
        load(path)


def test_empty_and_metadata_only_files_are_valid(tmp_path: Path) -> None:
    path = write(tmp_path, raw({"__metadata__": {"k": "v"}}))
    assert load(path) == {}
    assert open_checkpoint(path).metadata == {"k": "v"}


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_random_corruptions_raise_only_loader_errors(tmp_path: Path, data: st.DataObject) -> None:
    """Flipped, inserted, deleted bytes, a rewritten size field: a clean load or LoaderError."""
    content = bytearray(raw(VALID, bytes(range(22))))
    for _ in range(data.draw(st.integers(1, 4))):
        kind = data.draw(st.sampled_from(["flip", "insert", "delete", "size", "truncate"]))
        at = data.draw(st.integers(0, max(len(content) - 1, 0)))
        if kind == "flip" and content:
            content[at] = data.draw(st.integers(0, 255))
        elif kind == "insert":
            content[at:at] = data.draw(st.binary(min_size=1, max_size=8))
        elif kind == "delete" and len(content) > 1:
            del content[at]
        elif kind == "size":
            content[0:8] = struct.pack("<Q", data.draw(st.integers(0, 2**64 - 1)))
        elif kind == "truncate":
            del content[at:]
    path = write(tmp_path, bytes(content))
    tracemalloc.start()
    try:
        tensors = load(path, chunk_size=4096)
    except LoaderError as exc:
        assert str(path) in str(exc)
    else:
        assert sum(t.nbytes for t in tensors.values()) <= len(content)
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert peak < 10_000_000


# --- models: files, lists, directories, index.json ---------------------------------------------


def shard(tmp_path: Path, name: str, tensors: dict[str, int]) -> Path:
    """A shard of U8 tensors of the given sizes."""
    header, position = {}, 0
    for tensor, size in tensors.items():
        header[tensor] = entry("U8", [size], position, position + size)
        position += size
    return write(tmp_path, raw(header, bytes(position)), name)


def index(tmp_path: Path, weight_map: dict | object) -> None:
    (tmp_path / INDEX_NAME).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


def test_directory_without_index_loads_every_shard(tmp_path: Path) -> None:
    shard(tmp_path, "b.safetensors", {"y": 3})
    shard(tmp_path, "a.safetensors", {"x": 2})
    assert list(load(tmp_path)) == ["x", "y"]


def test_list_of_files(tmp_path: Path) -> None:
    files = [shard(tmp_path, "a.safetensors", {"x": 2}), shard(tmp_path, "b.safetensors", {"y": 3})]
    assert list(load(list(reversed(files)))) == ["y", "x"]


def test_directory_with_index_reads_only_indexed_files(tmp_path: Path) -> None:
    shard(tmp_path, "a.safetensors", {"x": 2})
    shard(tmp_path, "consolidated.safetensors", {"x": 2})
    index(tmp_path, {"x": "a.safetensors"})
    assert [h.path.name for h in open_checkpoint(tmp_path).files] == ["a.safetensors"]


@pytest.mark.parametrize(
    ("weight_map", "words"),
    [
        ({"x": "a.safetensors", "y": "missing.safetensors"}, "'missing.safetensors', which"),
        ({"x": "a.safetensors", "z": "a.safetensors"}, "lists 'z' in 'a.safetensors', but no file"),
        ({"x": "a.safetensors", "y": "a.safetensors", "w": "b.safetensors"}, "but it is in 'b"),
        ({"x": "../a.safetensors"}, "must be a relative path inside"),
        (["x"], "weight_map must be"),
        ({"x": 3}, "weight_map must be"),
        ({}, "weight_map is empty"),
    ],
)
def test_index_rules(tmp_path: Path, weight_map: object, words: str) -> None:
    shard(tmp_path, "a.safetensors", {"x": 2})
    shard(tmp_path, "b.safetensors", {"y": 2, "w": 1})
    index(tmp_path, weight_map)
    with pytest.raises(LoaderError, match=words) as caught:
        open_checkpoint(tmp_path)
    assert INDEX_NAME in str(caught.value)


def test_unreadable_index(tmp_path: Path) -> None:
    (tmp_path / INDEX_NAME).write_text("{not json")
    with pytest.raises(LoaderError, match="cannot read the index"):
        open_checkpoint(tmp_path)


def test_duplicate_tensor_across_shards(tmp_path: Path) -> None:
    shard(tmp_path, "a.safetensors", {"x": 2})
    shard(tmp_path, "b.safetensors", {"x": 2})
    also_in = r"b.safetensors: tensor 'x': also in .*a.safetensors"
    with pytest.raises(DuplicateTensor, match=also_in):
        open_checkpoint(tmp_path)


def test_missing_inputs(tmp_path: Path) -> None:
    with pytest.raises(LoaderError, match="no such file"):
        open_checkpoint(tmp_path / "nothing")
    with pytest.raises(LoaderError, match=r"no \*.safetensors"):
        open_checkpoint(tmp_path)
    with pytest.raises(LoaderError, match="no files given"):
        open_checkpoint([])
