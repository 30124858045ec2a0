"""The loader on network and FUSE storage: detected by statfs, its request time measured; read
with O_DIRECT by default where requests are slow, by the local rule where they are not.

A real FUSE mount: bench/latency_fuse/latency_fuse.c (the remote benchmark's passthrough),
compiled against libfuse3 and mounted over a temporary model, 1 ms per request (slow: the
passthrough sleeps that long, so no request can answer faster) or none added.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from fxkit.loader import fstype, load
from fxkit.loader.cache import evict, resident_fraction
from fxkit.loader.fstype import (
    REMOTE,
    SLOW_REQUEST_MS,
    fs_magic,
    remote_fs,
    request_ms,
    slow_storage,
)
from safetensors.torch import load_file, save_file

ROOT = Path(__file__).resolve().parent.parent


def test_a_local_directory_is_not_remote(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"x")
    assert fs_magic(tmp_path / "f") not in REMOTE
    assert remote_fs(tmp_path / "f") is None
    assert remote_fs(tmp_path / "missing") is None
    assert slow_storage(tmp_path / "f") is None


def test_request_time_is_measured_on_readable_files_only(tmp_path: Path) -> None:
    (tmp_path / "empty").write_bytes(b"")
    (tmp_path / "data").write_bytes(bytes(1 << 20))
    assert request_ms(tmp_path / "missing") is None
    ms = request_ms(tmp_path / "data")  # None where the filesystem refuses O_DIRECT (tmpfs)
    assert ms is None or ms > 0
    fstype._LATENCY.clear()  # the empty file is on the same device: asked again
    assert request_ms(tmp_path / "empty") is None


@pytest.fixture
def fuse_model(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[tuple[Path, Path]]:
    """(the model on local disk, the same model through a FUSE mount with the delay per request
    in ms given as the fixture's parameter, 1 ms by default)."""
    if os.geteuid() != 0 or not shutil.which("fusermount3"):
        pytest.skip("needs root and fusermount3 (a FUSE mount)")
    if shutil.which("cc") is None or not Path("/usr/include/fuse3/fuse.h").exists():
        pytest.skip("needs cc and libfuse3-dev (scripts/install-system-deps.sh)")
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import remote_fs as bench_remote
    finally:
        sys.path.remove(str(ROOT / "bench"))
    model = tmp_path / "model"
    model.mkdir()
    tensors = {f"w{i}": torch.arange(i, i + 400_000, dtype=torch.float32) for i in range(3)}
    save_file(tensors, model / "m.safetensors")
    program = bench_remote.build_latency_fuse(tmp_path)
    delay = getattr(request, "param", 1.0)
    # A new mount may reuse an unmounted one's device number: forget what was measured.
    fstype._BY_DEVICE.clear()
    fstype._LATENCY.clear()
    with bench_remote.latency_fuse_mount(program, model, tmp_path / "mnt", delay) as mnt:
        yield model, mnt


def test_default_load_over_slow_fuse_reads_with_o_direct(fuse_model: tuple[Path, Path]) -> None:
    model, mnt = fuse_model
    file = mnt / "m.safetensors"
    assert remote_fs(file) == "fuse"
    ms = request_ms(file)
    assert ms is not None and ms >= 1.0  # the passthrough's delay is a floor
    assert slow_storage(file) == "fuse"
    want = load_file(model / "m.safetensors")
    evict(file)
    got = load(mnt, threads=4, chunk_size=256 << 10)
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
    # O_DIRECT bypasses the client's page cache (only the header's page, read to plan, is
    # there); the buffered option fills it.
    assert resident_fraction(file) < 0.01
    load(mnt, threads=4, direct_io="off")
    assert resident_fraction(file) > 0.9


def test_several_local_ranks_over_fuse_read_through_the_page_cache(
    fuse_model: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With several ranks on the node (torchrun's LOCAL_WORLD_SIZE), the node reads once: the
    default reads into the shared page cache instead of each rank's private O_DIRECT buffers."""
    model, mnt = fuse_model
    file = mnt / "m.safetensors"
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    evict(file)
    got = load(mnt, threads=4, chunk_size=256 << 10)
    want = load_file(model / "m.safetensors")
    assert all(torch.equal(got[k], want[k]) for k in want)
    assert resident_fraction(file) > 0.9


@pytest.mark.parametrize("fuse_model", [0.0], indirect=True)
def test_default_load_over_fast_fuse_takes_the_local_rule(fuse_model: tuple[Path, Path]) -> None:
    """FUSE with no added delay answers like a local disk: the default reads through the page
    cache and maps the file (the local rule), as on ext4."""
    model, mnt = fuse_model
    file = mnt / "m.safetensors"
    assert remote_fs(file) == "fuse"
    ms = request_ms(file)
    assert ms is not None
    if ms >= SLOW_REQUEST_MS:
        pytest.skip(f"the machine is too busy: a request with no added delay took {ms:.3f} ms")
    assert slow_storage(file) is None
    evict(file)
    got = load(mnt, threads=4, chunk_size=256 << 10)
    want = load_file(model / "m.safetensors")
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
    assert resident_fraction(file) > 0.9
