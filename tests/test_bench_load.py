"""The loader benchmark's harness: eviction (checked against mincore and fincore), every byte
materialised by every method, the fio sweep (real fio runs, and a real fio JSON output), the tuned
peers' settings, the targets, the report's shape and the CLI."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from fxkit.loader import cache
from fxkit.loader.errors import LoaderError
from fxkit.loader.files import model_files
from safetensors.torch import save_file

from fxkit.cli import cli
from fxkit.loadbench import bench

PAGE = cache.PAGE_SIZE
DATA = Path(__file__).with_name("data") / "fio"
needs_fio = pytest.mark.skipif(shutil.which("fio") is None, reason="fio is not installed")


def _shard(seed: int, n: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        f"layers.{seed}.{i}.weight": torch.randint(-9, 9, (n * (i + 1) + 3, 129), generator=g).to(
            (torch.bfloat16, torch.float32, torch.int8)[i % 3]
        )
        for i in range(4)
    }


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    """Three shards of odd sizes (not multiples of a page) with an index, ~10 MB in all (enough
    for fio's millisecond clock)."""
    root = tmp_path_factory.mktemp("model")
    weight_map = {}
    for s, n in enumerate((2800, 5200, 3604)):
        name = f"model-{s + 1:05d}-of-00003.safetensors"
        tensors = _shard(s, n)
        save_file(tensors, root / name)
        weight_map.update(dict.fromkeys(tensors, name))
    (root / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return root


def _expected_touch(files: list[Path]) -> tuple[int, int]:
    """The touch sum and tensor count, from the files' own bytes (no torch, no safetensors)."""
    total = count = 0
    for f in files:
        raw = f.read_bytes()
        (n,) = struct.unpack("<Q", raw[:8])
        header = json.loads(raw[8 : 8 + n])
        header.pop("__metadata__", None)
        for info in header.values():
            begin, end = info["data_offsets"]
            span = raw[8 + n + begin : 8 + n + end]
            total += sum(span[::PAGE]) + (span[-1] if span else 0)
            count += 1
    return total, count


def test_eviction_is_verified_with_mincore_and_fincore(tmp_path: Path) -> None:
    f = tmp_path / "data"
    f.write_bytes(bytes(range(256)) * (3 * PAGE + 17))
    size = f.stat().st_size
    assert cache.warm([f]) == {}
    assert cache.resident_bytes(f) == size
    assert cache.evict_all([f]) == {}
    assert cache.resident_bytes(f) == 0
    if fincore := shutil.which("fincore"):  # util-linux asks the kernel its own way
        out = subprocess.run(
            [fincore, "--bytes", "--noheadings", "--output", "RES", str(f)],
            capture_output=True,
            text=True,
            check=True,
        )
        assert int(out.stdout.strip()) == 0
    with open(f, "rb") as fh:
        fh.seek(PAGE)
        fh.read(10)
    assert 0 < cache.resident_bytes(f) < size  # one page read back, readahead aside


def test_an_untouched_mmap_is_not_a_load_but_a_touched_one_is(tmp_path: Path) -> None:
    files = [tmp_path / "big.safetensors"]
    save_file({"w": torch.ones(12 << 20)}, files[0])  # 48 MiB: readahead alone cannot cover it
    probe = (
        "import sys; from safetensors.torch import load_file; from fxkit.loadbench import bench;"
        "ts = [t for f in sys.argv[2:] for t in load_file(f).values()];"
        "[bench.touch(t) for t in ts] if sys.argv[1] == 'touch' else None"
    )
    for mode, full in (("no", False), ("touch", True)):
        assert cache.evict_all(files) == {}
        subprocess.run([sys.executable, "-c", probe, mode, *map(str, files)], check=True)
        resident = sum(cache.resident_bytes(f) for f in files)
        total = sum(f.stat().st_size for f in files)
        assert (resident == total) if full else (resident < total / 2), (mode, resident, total)


@pytest.mark.parametrize(
    "tensor",
    [
        torch.tensor(7, dtype=torch.int32),
        torch.empty(0, 5),
        torch.tensor([True, False, True]),
        torch.arange(3 * PAGE + 5, dtype=torch.int16),
        torch.arange(40, dtype=torch.float64).reshape(5, 8),
    ],
    ids=["0-d", "empty", "bool", "odd-size", "2-d"],
)
def test_touch_reads_one_byte_per_page_and_the_last(tensor: torch.Tensor) -> None:
    raw = tensor.numpy().tobytes()
    assert bench.touch(tensor) == sum(raw[::PAGE]) + (raw[-1] if raw else 0)


def test_every_method_materialises_every_byte(model: Path) -> None:
    """Cold, one round: every loader that can run here (peers at their defaults and tuned)
    returns every tensor with the same bytes; every fio setting reads every byte."""
    files = model_files(model).files
    expected, count = _expected_touch(list(files))
    report = bench.bench(model, runs=1, cold=True)
    assert report.eviction_failures == []
    assert {"baseline", "prefetch", "fxkit"} <= {r.method for r in report.runs}
    for run in report.runs:
        assert run.error is None, (run.series, run.error)
        assert run.gbps > 0
        if run.method in ("fio", "fio-best"):
            assert run.nbytes == report.nbytes
            continue
        assert run.resident_before == 0
        assert (run.checksum, run.tensors) == (expected, count), run.method
        assert run.peak_rss >= run.rss_before > 0
    for summary in report.summaries:
        assert summary.skipped or summary.checksum_ok in (True, None), summary
    missing = [s.method for s in report.summaries if s.skipped]
    assert set(missing) <= {"fio", *(m for m in bench.METHODS if bench.METHODS[m].peer)}
    if "fio" not in missing:
        fio = [r for r in report.runs if r.method == "fio"]
        assert [r.setting for r in fio] == [f.label for f in bench.FIO_SWEEP]
        (best,) = [r for r in report.runs if r.method == "fio-best"]
        assert (
            best.gbps == max(r.gbps for r in fio)
            and best.setting in report.summary("fio-best").about
        )
        assert report.targets["fio-best"]["target"] == 0.9
    peers = {
        s.method: s.gbps_median
        for s in report.summaries
        if s.method in bench.METHODS and bench.METHODS[s.method].peer and s.gbps_median
    }
    if peers:
        target = report.targets[bench.BEST_PEER]
        assert target["against"] == max(peers, key=peers.get) and target["target"] == 1.2
        assert target["ratio"] == bench.ratio(report.runs, "fxkit", target["against"])
    assert report.targets["prefetch"]["target"] == 1.0


def test_report_json_has_rounds_interleaved_and_rotated(model: Path, tmp_path: Path) -> None:
    report = bench.bench(model, methods=["baseline", "prefetch"], runs=2, cold=False)
    out = tmp_path / "report.json"
    bench.save_json(report, out)
    data = json.loads(out.read_text())
    assert {"model", "files", "nbytes", "cold", "rounds", "machine", "summaries", "runs"} <= set(
        data
    )
    assert data["files"] == 3 and data["cold"] is False and data["rounds"] == 2
    assert {"nproc", "mem_bytes", "kernel", "filesystem"} <= set(data["machine"])
    order = [(r["round"], r["method"]) for r in data["runs"]]
    assert order == [(0, "baseline"), (0, "prefetch"), (1, "prefetch"), (1, "baseline")]
    base, pre = data["summaries"]
    assert base["method"] == "baseline" and base["vs_baseline"] == 1.0
    assert pre["gbps_min"] <= pre["gbps_median"] <= pre["gbps_max"]
    assert all(r["resident_before"] == data["nbytes"] for r in data["runs"])  # hot: all cached
    assert list(tmp_path.iterdir()) == [out]  # written atomically, no temp file left


def _job_ranges(job: str) -> dict[str, list[tuple[int, int]]]:
    """Each file's ``(offset, size)`` reads in a fio job file."""
    reads: dict[str, list[tuple[int, int]]] = {}
    for section in job.split("\n[")[1:]:
        keys = dict(line.split("=", 1) for line in section.splitlines()[1:] if "=" in line)
        reads.setdefault(keys["filename"], []).append((int(keys["offset"]), int(keys["size"])))
    return reads


@pytest.mark.parametrize("setting", bench.fio_grid(), ids=lambda s: s.label)
def test_every_fio_setting_covers_every_byte_once(model: Path, setting: bench.FioSetting) -> None:
    files = model_files(model).files
    reads = _job_ranges(bench.fio_job(files, setting))
    for f in files:
        spans = sorted(reads[str(f)])
        ends = [o + n for o, n in spans]
        assert [o for o, _ in spans] == [0, *ends[:-1]] and ends[-1] == f.stat().st_size


@needs_fio
@pytest.mark.parametrize("layout", bench.FIO_LAYOUTS)
def test_fio_reads_exactly_the_checkpoint_once_in_every_layout(model: Path, layout: str) -> None:
    """Real fio, cold: its io_bytes are the checkpoint's bytes, neither more nor fewer."""
    files = model_files(model).files
    for setting in (bench.FioSetting(layout, 4, 1 << 20), bench.FioSetting(layout, 16, 16 << 20)):
        run = bench.Run("fio", 0, setting.label)
        assert cache.evict_all(files) == {}
        bench._run_fio(files, setting, run)
        assert run.error is None, run.error
        assert run.nbytes == sum(f.stat().st_size for f in files) and run.seconds > 0


def test_fio_json_captured_from_fio_on_this_machine() -> None:
    """tests/data/fio/serial-qd4-1M.json: ``fio --output-format=json`` (fio 3.33, this VM's
    ext4 on /dev/vda) on the job file next to it, which ``fio_job`` wrote for two files of
    3,000,123 and 5,242,881 bytes (the serial layout: a stonewall group per file)."""
    out = (DATA / "serial-qd4-1M.json").read_text()
    jobs = json.loads(out)["jobs"]
    nbytes, seconds = bench.fio_read(out)
    assert nbytes == 3_000_123 + 5_242_881
    groups: dict[int, int] = {}
    for job in jobs:  # a group's time is its slowest job's; groups run one after another
        groups[job["groupid"]] = max(groups.get(job["groupid"], 0), job["read"]["runtime"])
    assert len(groups) == 2 and seconds == sum(groups.values()) / 1000 > 0
    with pytest.raises(LoaderError, match="fio read nothing"):
        bench.fio_read(
            json.dumps(
                {"jobs": [{"error": 5, "groupid": 0, "read": {"io_bytes": 0, "runtime": 0}}]}
            )
        )


def test_tuned_peers_name_their_settings_and_get_them_in_their_process_only(
    model: Path,
) -> None:
    tuned = bench.METHODS["runai-tuned"]
    assert tuned.env and all(f"{k}={v}" in tuned.about for k, v in tuned.env.items())
    fst = bench.METHODS["fastsafetensors-tuned"]
    assert fst.options and all(f"{k}={v}" in fst.about for k, v in fst.options.items())
    assert not bench.METHODS["runai"].env and not bench.METHODS["fastsafetensors"].options
    for name in tuned.env:
        assert name not in bench.METHODS["runai"].environ() or name in os.environ
        assert tuned.environ()[name] == tuned.env[name]
    # measure() refuses to run a tuned peer whose process lacks its settings
    env = {k: v for k, v in os.environ.items() if k not in tuned.env}
    probe = (
        "import sys; from fxkit.loadbench import bench; "
        "bench.measure('runai-tuned', sys.argv[1], {})"
    )
    proc = subprocess.run(
        [sys.executable, "-c", probe, str(model)], env=env, capture_output=True, text=True
    )
    assert proc.returncode != 0 and "RUNAI_STREAMER_MEMORY_LIMIT" in proc.stderr
    if why := tuned.missing():
        pytest.skip(f"runai-tuned cannot run here: {why}")
    before = {k: os.environ.get(k) for k in tuned.env}
    run = bench.Run("runai-tuned", 0)
    bench._run_loader("runai-tuned", model, {}, run)  # its process got them, or measure() refused
    assert run.error is None and run.tensors
    assert {k: os.environ.get(k) for k in tuned.env} == before  # and the harness did not


def test_checkpoint_errors_name_the_path(tmp_path: Path) -> None:
    with pytest.raises(LoaderError, match="no such file"):
        bench.bench(tmp_path / "nope", runs=1)
    with pytest.raises(LoaderError, match=r"no \*\.safetensors files"):
        bench.bench(tmp_path, runs=1)
    (tmp_path / "model.safetensors.index.json").write_text('{"weight_map": {"a": "gone.st"}}')
    with pytest.raises(LoaderError, match=r"gone\.st"):
        bench.bench(tmp_path, runs=1)
    with pytest.raises(LoaderError, match="unknown method"):
        bench.bench(tmp_path.parent, methods=["nfs"])


def test_cli_bench_load_prints_the_table_and_writes_json(model: Path, tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    result = CliRunner().invoke(
        cli,
        ["bench", "load", str(model), "-m", "baseline,prefetch", "-n", "1", "--json", str(out)],
        env={"COLUMNS": "200"},
    )
    assert result.exit_code == 0, result.output
    assert "x baseline" in result.output and "machine:" in result.output
    assert [s["method"] for s in json.loads(out.read_text())["summaries"]] == [
        "baseline",
        "prefetch",
    ]


class _Unfinished:
    """A report whose JSON fails half-way (as a full disk or Ctrl-C would)."""

    def to_json(self) -> str:
        raise KeyboardInterrupt


def test_a_report_that_fails_to_write_leaves_the_old_one_and_no_temp_file(tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    out.write_text("{}\n")
    with pytest.raises(KeyboardInterrupt):
        bench.save_json(_Unfinished(), out)
    assert list(tmp_path.iterdir()) == [out] and out.read_text() == "{}\n"
