"""Loading: byte-identical to safetensors.torch.load_file for every dtype, thread count, chunk size
and I/O mode; the staged (device) pipeline on the CPU; streaming order; memory; page cache."""

from __future__ import annotations

import errno
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from fxkit.loader import LoaderError, iter_tensors, load, make_checkpoint, open_checkpoint
from fxkit.loader.cache import evict, resident_fraction
from fxkit.loader.read import FileReader, readahead_window
from fxkit.loader.sinks import StagedSink
from safetensors.torch import _TYPES as SAFETENSORS_DTYPES
from safetensors.torch import load_file, save_file

# The worktree's disk: /tmp may be a tmpfs (no O_DIRECT, no page cache to drop) in CI.
DISK_ROOT = Path(__file__).resolve().parent.parent / ".cache"


@pytest.fixture
def disk_dir() -> Iterator[Path]:
    DISK_ROOT.mkdir(exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix="loader-tests-", dir=DISK_ROOT))
    yield path
    shutil.rmtree(path)


def raw_bytes(tensor: torch.Tensor) -> bytes:
    return tensor.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def assert_same(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert list(got) == list(want) or sorted(got) == sorted(want)
    for name, tensor in want.items():
        assert got[name].dtype == tensor.dtype, name
        assert got[name].shape == tensor.shape, name
        assert raw_bytes(got[name]) == raw_bytes(tensor), name


def random_tensor(dtype: torch.dtype, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """Random bytes reinterpreted as ``dtype`` (bool: 0/1)."""
    generator = torch.Generator().manual_seed(seed)
    n = 1
    for d in shape:
        n *= d
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=generator).bool()
    size = torch.empty(0, dtype=dtype).element_size()
    data = torch.randint(0, 256, (n * size,), dtype=torch.uint8, generator=generator)
    return data.view(dtype).reshape(shape)


def every_dtype_tensors() -> dict[str, torch.Tensor]:
    """Every dtype safetensors/torch share, in odd shapes, plus 0-d and empty tensors."""
    tensors: dict[str, torch.Tensor] = {}
    for i, dtype in enumerate(sorted(set(SAFETENSORS_DTYPES.values()), key=str)):
        name = str(dtype).removeprefix("torch.")
        tensors[f"{name}.odd"] = random_tensor(dtype, (37, 111), seed=i)
        tensors[f"{name}.scalar"] = random_tensor(dtype, (), seed=100 + i)
        tensors[f"{name}.empty"] = random_tensor(dtype, (0, 5), seed=0)
    return tensors


@pytest.fixture(scope="module")
def every_dtype_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("dtypes") / "all.safetensors"
    save_file(every_dtype_tensors(), path)
    return path


@pytest.fixture(scope="module")
def sharded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Shards of different sizes: many tiny tensors, a 'huge' one, sizes off every boundary."""
    root = tmp_path_factory.mktemp("sharded")
    shards = [
        {f"tiny.{i}": random_tensor(torch.float16, (i % 7 + 1,), seed=i) for i in range(300)},
        {"huge": random_tensor(torch.bfloat16, (1531, 2053), seed=1)},  # ~6 MB, not 4096-aligned
        {
            "odd.f32": random_tensor(torch.float32, (4099,), seed=2),
            "odd.i64": random_tensor(torch.int64, (3, 1001), seed=3),
            "odd.u8": random_tensor(torch.uint8, (12_289,), seed=4),
        },
    ]
    weight_map = {}
    for n, tensors in enumerate(shards):
        name = f"model-{n}.safetensors"
        save_file(tensors, root / name, metadata={"shard": str(n)})
        weight_map.update(dict.fromkeys(tensors, name))
    index = {"metadata": {}, "weight_map": weight_map}
    (root / "model.safetensors.index.json").write_text(json.dumps(index))
    return root


def reference(model: Path) -> dict[str, torch.Tensor]:
    return {
        name: tensor
        for header in open_checkpoint(model).files
        for name, tensor in load_file(header.path).items()
    }


def test_every_dtype_is_byte_identical(every_dtype_file: Path) -> None:
    assert_same(load(every_dtype_file), load_file(every_dtype_file))


def test_f8_e8m0_is_read_where_torch_has_it(tmp_path: Path) -> None:
    """safetensors' torch binding lacks F8_E8M0 here, so the file is written by hand."""
    data = bytes(range(6))
    header = json.dumps({"s": {"dtype": "F8_E8M0", "shape": [2, 3], "data_offsets": [0, 6]}})
    (tmp_path / "e8.safetensors").write_bytes(
        struct.pack("<Q", len(header)) + header.encode() + data
    )
    tensor = load(tmp_path / "e8.safetensors")["s"]
    assert tensor.dtype == torch.float8_e8m0fnu
    assert raw_bytes(tensor) == data


@pytest.mark.parametrize("threads", [1, 2, 3, 8])
@pytest.mark.parametrize("chunk_size", [1, 3 * 4096 + 5, 1 << 20, 1 << 30])
def test_threads_and_chunk_sizes(sharded: Path, threads: int, chunk_size: int) -> None:
    assert_same(load(sharded, threads=threads, chunk_size=chunk_size), reference(sharded))


@pytest.mark.parametrize("direct_io", ["on", "off", "auto"])
@pytest.mark.parametrize("staged", [False, True])
def test_direct_io_and_staged_pipeline_on_disk(
    sharded: Path, direct_io: str, staged: bool, disk_dir: Path
) -> None:
    files = []
    for header in open_checkpoint(sharded).files:
        files.append(disk_dir / header.path.name)
        files[-1].write_bytes(header.path.read_bytes())
    got = dict(
        iter_tensors(files, threads=3, chunk_size=64 << 10, direct_io=direct_io, _staged=staged)
    )
    assert_same(got, reference(sharded))


def test_o_direct_is_really_used_on_a_disk_filesystem(
    every_dtype_file: Path, disk_dir: Path
) -> None:
    copy = disk_dir / "direct.safetensors"
    copy.write_bytes(every_dtype_file.read_bytes())
    reader = FileReader(copy, direct=True)
    try:
        if not reader.direct:
            pytest.skip(f"the filesystem of {disk_dir} refuses O_DIRECT")
        assert_same(load(copy, direct_io="on", chunk_size=4096), load_file(copy))
        assert reader.direct
    finally:
        reader.close()


@pytest.mark.skipif(not Path("/dev/shm").is_dir(), reason="no /dev/shm tmpfs on this host")
def test_o_direct_on_tmpfs_loads_either_way(every_dtype_file: Path) -> None:
    """tmpfs refuses O_DIRECT before Linux 6.6 and accepts it since: both must load."""
    copy = Path("/dev/shm") / f"fxkit-test-{os.getpid()}.safetensors"
    copy.write_bytes(every_dtype_file.read_bytes())
    try:
        assert_same(load(copy, direct_io="on", chunk_size=4096), load_file(copy))
    finally:
        copy.unlink()


def test_o_direct_falls_back_where_the_open_is_refused(
    every_dtype_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Filesystems without O_DIRECT (older tmpfs) fail the open with EINVAL."""
    real_open = os.open

    def refusing_open(path: str, flags: int, *args: int) -> int:
        if flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, *args)

    monkeypatch.setattr(os, "open", refusing_open)
    reader = FileReader(every_dtype_file, direct=True)
    reader.close()
    assert not reader.direct
    want = load_file(every_dtype_file)
    assert_same(load(every_dtype_file, direct_io="on", chunk_size=4096), want)


def test_o_direct_falls_back_where_the_read_is_refused(
    every_dtype_file: Path, monkeypatch: pytest.MonkeyPatch, disk_dir: Path
) -> None:
    """Some filesystems (FUSE) accept the O_DIRECT open and refuse the read with EINVAL."""
    copy = disk_dir / "fuse-like.safetensors"
    copy.write_bytes(every_dtype_file.read_bytes())
    real_preadv = os.preadv
    refused = []

    def preadv(fd: int, buffers: list, offset: int) -> int:
        if direct(fd):
            refused.append(offset)
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_preadv(fd, buffers, offset)

    def direct(fd: int) -> bool:
        text = Path(f"/proc/self/fdinfo/{fd}").read_text()
        return bool(int(text.split("flags:")[1].split()[0], 8) & os.O_DIRECT)

    monkeypatch.setattr(os, "preadv", preadv)
    assert_same(load(copy, direct_io="on", chunk_size=4096), load_file(copy))
    if not FileReader(copy, direct=True).direct:
        pytest.skip("O_DIRECT is refused at open here; the read fallback was not reached")
    assert refused


def test_misaligned_tensors_are_copied_correctly(tmp_path: Path) -> None:
    """An odd header length and offsets leave F32/F64 data misaligned (writers pad; not all)."""
    want = {
        "u8": random_tensor(torch.uint8, (3,), seed=1),
        "f32": random_tensor(torch.float32, (5, 3), seed=2),
        "b": random_tensor(torch.bool, (1,), seed=3),
        "f64": random_tensor(torch.float64, (7,), seed=4),
    }
    header, data = {}, b""
    for name, tensor in want.items():
        blob = raw_bytes(tensor)
        header[name] = {
            "dtype": {torch.uint8: "U8", torch.float32: "F32", torch.bool: "BOOL"}.get(
                tensor.dtype, "F64"
            ),
            "shape": list(tensor.shape),
            "data_offsets": [len(data), len(data) + len(blob)],
        }
        data += blob
    text = json.dumps(header) + " "  # an odd header length
    path = tmp_path / "odd.safetensors"
    path.write_bytes(struct.pack("<Q", len(text)) + text.encode() + data)
    for staged in (False, True):
        assert_same(dict(iter_tensors(path, chunk_size=1, _staged=staged)), want)


def test_cpu_tensors_are_views_of_one_buffer_per_file(sharded: Path) -> None:
    tensors = load(sharded)
    pointers = {t.untyped_storage().data_ptr() for n, t in tensors.items() if n.startswith("tiny")}
    assert len(pointers) == 1


def test_iter_tensors_yields_in_file_order_before_the_file_is_read(
    sharded: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With every read after the first chunk held back, the first tensors still come out."""
    checkpoint = open_checkpoint(sharded)
    order = [t.name for h in checkpoint.files for t in h.tensors]
    release = threading.Event()
    first_block_end = checkpoint.files[0].data_offset // 4096 * 4096 + 4096
    real_read = FileReader.read

    def read(self: FileReader, view: memoryview, offset: int, need: int) -> None:
        if offset >= first_block_end:
            assert release.wait(30)
        real_read(self, view, offset, need)

    monkeypatch.setattr(FileReader, "read", read)
    stream = iter_tensors(checkpoint, threads=2, chunk_size=4096)
    first = next(stream)
    assert first[0] == order[0]
    assert not release.is_set()
    release.set()
    assert [first[0]] + [name for name, _ in stream] == order


def test_staged_sink_recycles_a_bounded_pool(
    sharded: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One staging slot for many chunks: each chunk waits for the slot, bytes still exact."""
    sink = StagedSink("cpu", slots=1, chunk_size=8192)
    monkeypatch.setattr("fxkit.loader.api.make_sink", lambda *a, **k: sink)
    assert_same(load(sharded, threads=4, chunk_size=8192), reference(sharded))
    assert sink.pool.qsize() == 1


def test_dtype_casts_floating_tensors_only(every_dtype_file: Path) -> None:
    tensors = load(every_dtype_file, dtype=torch.float32)
    assert tensors["bfloat16.odd"].dtype == torch.float32
    assert tensors["int32.odd"].dtype == torch.int32
    want = load_file(every_dtype_file)["bfloat16.odd"].float()
    torch.testing.assert_close(tensors["bfloat16.odd"], want, rtol=0, atol=0, equal_nan=True)


def test_file_truncated_after_validation(tmp_path: Path, every_dtype_file: Path) -> None:
    copy = tmp_path / "t.safetensors"
    copy.write_bytes(every_dtype_file.read_bytes())
    checkpoint = open_checkpoint(copy)
    os.truncate(copy, checkpoint.files[0].data_offset + 10)
    for direct_io in ("auto", "on", "off"):
        with pytest.raises(LoaderError, match="truncated"):
            load(checkpoint, direct_io=direct_io)


def test_bad_arguments(every_dtype_file: Path) -> None:
    for kwargs, words in [
        ({"threads": -1}, "threads"),
        ({"chunk_size": -5}, "chunk_size"),
        ({"direct_io": "sometimes"}, "direct_io"),
        ({"device": "floppy"}, "not a torch device"),
        ({"device": "meta"}, "not supported"),
    ]:
        with pytest.raises(LoaderError, match=words):
            load(every_dtype_file, **kwargs)


def test_drop_cache_evicts_the_files(sharded: Path, disk_dir: Path) -> None:
    copy = disk_dir / "drop.safetensors"
    copy.write_bytes(open_checkpoint(sharded).files[1].path.read_bytes())
    with open(copy, "rb") as f:
        os.fsync(f.fileno())
    load(copy, direct_io="off")
    if resident_fraction(copy) < 0.5:
        pytest.skip("this filesystem does not keep read pages in the page cache")
    load(copy, direct_io="off", drop_cache=True)
    assert resident_fraction(copy) < 0.1


def test_sampled_residency_agrees_with_every_page(disk_dir: Path) -> None:
    """The loader asks mincore about 64 windows, not every page: both must tell cached from not."""
    path = disk_dir / "resident.bin"
    path.write_bytes(os.urandom(8 << 20))
    with open(path, "rb") as f:
        os.fsync(f.fileno())
    assert resident_fraction(path, windows=64) == resident_fraction(path) == 1.0
    evict(path)
    if resident_fraction(path) > 0.1:
        pytest.skip("this filesystem keeps pages after POSIX_FADV_DONTNEED")
    assert resident_fraction(path, windows=64) < 0.1


def test_auto_direct_io_follows_the_page_cache(
    sharded: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CPU: fully cached, mapped; otherwise read into the page cache and mapped. With drop_cache
    (as for a device): uncached, O_DIRECT; partly cached, buffered; fully cached, buffered."""
    from fxkit.loader import api

    cached = {"model-0.safetensors": 0.0, "model-1.safetensors": 0.7, "model-2.safetensors": 1.0}
    monkeypatch.setattr(api, "resident_fraction", lambda path, windows: cached[path.name])
    seen = []

    def recording(cls: type) -> type:
        class Recording(cls):
            def __init__(self, path: Path, *args: object, **kwargs: object) -> None:
                super().__init__(path, *args, **kwargs)
                seen.append((path.name, cls.__name__, self.direct))

        return Recording

    monkeypatch.setattr(api, "FileReader", recording(api.FileReader))
    monkeypatch.setattr(api, "MappedFile", recording(api.MappedFile))
    assert_same(load(sharded), reference(sharded))
    assert seen == [
        ("model-0.safetensors", "FileReader", False),
        ("model-0.safetensors", "MappedFile", False),
        ("model-1.safetensors", "FileReader", False),
        ("model-1.safetensors", "MappedFile", False),
        ("model-2.safetensors", "MappedFile", False),
    ]
    seen.clear()
    load(sharded, drop_cache=True)
    assert seen == [
        ("model-0.safetensors", "FileReader", True),
        ("model-1.safetensors", "FileReader", False),
        ("model-2.safetensors", "FileReader", False),
    ]


def test_mapped_tensors_are_private_copies_on_write(tmp_path: Path) -> None:
    path = tmp_path / "m.safetensors"
    save_file({"w": torch.arange(4096, dtype=torch.float32)}, path)
    before = path.read_bytes()
    assert resident_fraction(path) == 1.0, "a file just written is in the page cache"
    tensor = load(path)["w"]
    tensor.add_(1)
    assert path.read_bytes() == before
    assert torch.equal(tensor, torch.arange(4096, dtype=torch.float32) + 1)


def test_make_checkpoint_is_llama_shaped_deterministic_and_loads(tmp_path: Path) -> None:
    a = make_checkpoint(tmp_path / "a", 6_000_000, shards=3, seed=1)
    b = make_checkpoint(tmp_path / "b", 6_000_000, shards=3, seed=1)
    c = make_checkpoint(tmp_path / "c", 6_000_000, shards=3, seed=2)
    names = sorted(p.name for p in a.iterdir())
    assert names[-1] == "model.safetensors.index.json" and len(names) == 4
    for name in names:
        assert (a / name).read_bytes() == (b / name).read_bytes()
    assert (a / names[0]).read_bytes() != (c / names[0]).read_bytes()
    index = json.loads((a / "model.safetensors.index.json").read_text())
    checkpoint = open_checkpoint(a)
    assert index["metadata"]["total_size"] == checkpoint.total_bytes
    assert 0.8 * 6_000_000 < checkpoint.total_bytes < 1.2 * 6_000_000
    tensors = checkpoint.tensors
    for name in ["model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"]:
        assert name in tensors
    for part in ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                 "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj", "input_layernorm"]:  # fmt: skip
        assert f"model.layers.0.{part}.weight" in tensors
    assert tensors["model.layers.0.mlp.up_proj.weight"].dtype == "BF16"
    assert tensors["model.norm.weight"].dtype == "F32"
    loaded = load(a)
    assert_same(loaded, reference(a))
    assert loaded["lm_head.weight"].float().std() > 0.01


def test_make_checkpoint_never_writes_through_a_planted_link(tmp_path: Path) -> None:
    """A symlink at a temporary file's name (``.NAME.tmp`` beside the file) is neither followed
    nor left behind: the temporary files are new ones, made exclusively."""
    outside = tmp_path / "outside"
    outside.write_text("keep me")
    model = tmp_path / "m"
    model.mkdir()
    names = ["model-00001-of-00001.safetensors", "model.safetensors.index.json"]
    for name in names:
        (model / f".{name}.tmp").symlink_to(outside)
    make_checkpoint(model, 100_000, shards=1)
    assert outside.read_text() == "keep me"
    assert sorted(p.name for p in model.iterdir() if not p.is_symlink()) == sorted(names)
    assert load(model).keys() == open_checkpoint(model).tensors.keys()


def test_make_checkpoint_rejects_unknown_layout(tmp_path: Path) -> None:
    with pytest.raises(LoaderError, match="unknown layout"):
        make_checkpoint(tmp_path, 1000, layout="gpt")


RSS_PROBE = """
import re, sys, torch
from fxkit.loader import load, open_checkpoint

def status(field):
    text = open("/proc/self/status").read()
    return int(re.search(field + r":\\s+(\\d+) kB", text).group(1)) * 1024

checkpoint = open_checkpoint(sys.argv[1])
open("/proc/self/clear_refs", "w").write("5")  # restart the peak (VmHWM) from the current RSS
before = status("VmRSS")
tensors = load(checkpoint, threads=4, direct_io=sys.argv[2])
assert sum(t.nbytes for t in tensors.values()) == checkpoint.total_bytes
print(checkpoint.total_bytes, status("VmHWM") - before)
"""


@pytest.fixture(scope="module")
def model_200mb(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    model = make_checkpoint(tmp_path_factory.mktemp("rss") / "m", 200_000_000, shards=2)
    yield model
    shutil.rmtree(model)  # not left behind in pytest's kept temporary directories


@pytest.mark.parametrize("direct_io", ["off", "auto"])
def test_peak_rss_is_the_checkpoint_plus_a_little(model_200mb: Path, direct_io: str) -> None:
    """Read into buffers (off): the checkpoint once, no more. Mapped from the page cache (auto:
    the files were just written): pages are mapped as they are touched, never more than that."""
    model = model_200mb
    result = subprocess.run(
        [sys.executable, "-c", RSS_PROBE, str(model), direct_io],
        capture_output=True,
        text=True,
        check=True,
    )
    total, grown = map(int, result.stdout.split())
    least = 0.9 * total if direct_io == "off" else 0
    assert least <= grown <= total + 48 * 2**20, (
        f"RSS +{grown / 1e6:.0f} MB for {total / 1e6:.0f} MB"
    )


def test_cli_load_and_make_checkpoint(tmp_path: Path) -> None:
    fxkit = [str(Path(sys.executable).parent / "fxkit")]
    made = subprocess.run([*fxkit, "make-checkpoint", str(tmp_path / "m"), "--size", "3MB",
                           "--shards", "2"], capture_output=True, text=True)  # fmt: skip
    assert made.returncode == 0, made.stderr
    assert "2 file(s)" in made.stdout
    loaded = subprocess.run([*fxkit, "load", str(tmp_path / "m"), "--threads", "2",
                             "--chunk-size", "64KiB", "--direct-io", "off"],
                            capture_output=True, text=True)  # fmt: skip
    assert loaded.returncode == 0, loaded.stderr
    assert "GB/s" in loaded.stdout and "tensors" in loaded.stdout
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x05")
    failed = subprocess.run([*fxkit, "load", str(bad)], capture_output=True, text=True)
    assert failed.returncode == 2
    assert "too small" in failed.stderr and "Traceback" not in failed.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA/ROCm device is present")
def test_gpu_without_gpu_is_a_clear_error(sharded: Path) -> None:
    with pytest.raises(LoaderError, match="sees no CUDA/ROCm device"):
        load(sharded, device="cuda:0")


def test_progress_bar_reports_bytes(sharded: Path, capsys: pytest.CaptureFixture) -> None:
    assert_same(load(sharded, progress=True), reference(sharded))
    assert "loading" in capsys.readouterr().out


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA/ROCm device on this host")
def test_gpu_load_matches_cpu(sharded: Path) -> None:
    got = {name: t.cpu() for name, t in iter_tensors(sharded, device="cuda", chunk_size=1 << 20)}
    assert_same(got, reference(sharded))


def test_advised_reads_fill_the_page_cache_without_a_copy(disk_dir: Path) -> None:
    """``advise``: POSIX_FADV_WILLNEED per readahead window (the kernel caps each call at the
    device's window, read from sysfs) brings every asked-for page in, and no page past them."""
    data = disk_dir / "f.bin"
    data.write_bytes(os.urandom(6 << 20))
    window = readahead_window(data.stat().st_dev)
    assert window >= 4096 and window % 4096 == 0
    evict(data)
    reader = FileReader(data, direct=False, advise=True)
    try:
        reader.cache(0, 4 << 20)
    finally:
        reader.close()
    # The kernel queues the reads: wait for them (at most a minute), not for the time they take.
    for _ in range(600):
        if resident_fraction(data) >= 4 / 6:
            break
        time.sleep(0.1)
    assert 4 / 6 <= resident_fraction(data) < 0.7  # 4 of 6 MiB: nothing past them


def test_several_local_ranks_map_an_uncached_file_and_read_nothing_ahead(
    disk_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Several ranks on this node (torchrun's LOCAL_WORLD_SIZE) on a local disk: the default
    maps the file, and the pages are read when touched (as ``load_file`` does), by no pool."""
    tensors = {f"w{i}": torch.arange(i, i + 300_000, dtype=torch.float32) for i in range(3)}
    save_file(tensors, disk_dir / "m.safetensors")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    evict(disk_dir / "m.safetensors")
    got = load(disk_dir, chunk_size=64 << 10)
    assert resident_fraction(disk_dir / "m.safetensors") < 0.5  # nothing read ahead of use
    assert_same(got, tensors)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    evict(disk_dir / "m.safetensors")
    load(disk_dir, chunk_size=64 << 10)
    for _ in range(600):  # one rank: the pool asks for every chunk (the kernel reads them)
        if resident_fraction(disk_dir / "m.safetensors") > 0.9:
            break
        time.sleep(0.1)
    assert resident_fraction(disk_dir / "m.safetensors") > 0.9
