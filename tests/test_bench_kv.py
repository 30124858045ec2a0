"""``fxkit bench kv`` (fxkit/kvbench.py): LMCache's real LocalDiskBackend writes chunks shaped like
a model's KV cache and reads them back cold through ``batched_get_blocking``, beside fio.

The chunk shapes come from the model configs of tests/data/model_configs (sources in its
SOURCES.md) through fxkit estimate's reader. The runs use LMCache as installed (``pip install
'fxkit[kv]'``: lmcache==0.5.6 beside the pinned CPU torch); where it is not installed they skip,
saying how to install it. A small sweep (tens of MB) on pytest's temporary folder.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from fxkit.cli import cli
from fxkit.estimate import collect
from fxkit.kvbench import (
    FioSetting,
    Run,
    Setting,
    bench,
    chunk_shape,
    fio_job,
    implied_ttft,
    missing,
    sweep,
)

CONFIGS = Path(__file__).parent / "data" / "model_configs"
QWEN = CONFIGS / "qwen3-coder-480b-a35b-instruct.json"
EXAMPLE = Path(__file__).parent.parent / "examples" / "estimate" / "qwen3-coder-480b-tp8.yml"
needs_lmcache = pytest.mark.skipif(missing() is not None, reason=str(missing()))


def test_a_chunk_is_one_rank_s_share_of_the_model_s_kv() -> None:
    """Qwen3-Coder-480B at TP8 (the named example): 62 layers, 8 KV heads of 128, bf16; a rank
    keeps one head: [2, 62, 256, 128] x 2 B = 8,126,464 B, the size of the file LMCache 0.5.6
    writes for it. The TP group's chunks together are the estimator's KV per token x 256."""
    values, _ = collect(EXAMPLE)
    chunk = chunk_shape(values, 256)
    assert (chunk.dims, chunk.dtype, chunk.fmt, chunk.tp) == ((2, 62, 256, 128), "bfloat16",
                                                              "KV_2LTD", 8)  # fmt: skip
    assert chunk.nbytes == 8_126_464
    assert chunk.nbytes * chunk.tp == chunk.per_token * 256
    # MLA (DeepSeek-V3): one latent of 512 + a rotary key of 64 per layer, on every rank.
    values, _ = collect(None, CONFIGS / "deepseek-v3.json", sets=("gpu.tensor_parallel=8",))
    mla = chunk_shape(values, 512)
    assert (mla.dims, mla.fmt) == ((1, 61, 512, 576), "KV_MLA_FMT")


def test_the_sweep_adds_the_sharded_layout_only_for_several_folders() -> None:
    assert [s.label for s in sweep([1, 8], [False], 1)] == [
        "threads=1 odirect=off one folder", "threads=8 odirect=off one folder"]  # fmt: skip
    several = sweep([4], [False, True], 2)
    assert [(s.odirect, s.sharded) for s in several] == [
        (False, False), (True, False), (False, True), (True, True)]  # fmt: skip


@needs_lmcache
def test_lmcache_s_backend_writes_shards_and_reads_back_every_byte(tmp_path: Path) -> None:
    """Two workers (GPU processes), two folders: LMCache's by_gpu puts worker 1's files in the
    second folder; every setting reads every chunk back (checked against what was written), cold
    where the filesystem can drop its pages; fio reads the same files; scratch removed."""
    folders = [tmp_path / "a", tmp_path / "b"]
    for folder in folders:
        folder.mkdir()
    values, _ = collect(None, CONFIGS / "mistral-7b-v0.1.json", sets=("gpu.tensor_parallel=2",))
    chunk = chunk_shape(values, 64)  # [2, 32, 64, 512] bf16: 4 MiB
    seen: dict[str, list[int]] = {}

    def files(run: Run) -> None:
        seen[run.label] = [len(list(f.glob("fxkit-bench-kv-*/*.pt"))) for f in folders]

    fio = (FioSetting(4, True), FioSetting(1, False), FioSetting(2, True, 4))
    settings = sweep([1, 4], [False, True], 2)
    report = bench([str(f) for f in folders], chunk, 24 << 20, settings, workers=2, rounds=1,
                   fio=fio, on_run=files)  # fmt: skip
    per_worker = report.chunks_per_worker
    assert per_worker == 3  # 24 MiB over 2 workers of 4 MiB chunks
    lm = [r for r in report.runs if r.method == "lmcache"]
    assert len(lm) == len(settings) and len(report.runs) == len(settings) + len(fio)
    for run in lm:
        assert run.nbytes == 2 * per_worker * chunk.nbytes
        if "odirect=off" in run.label:
            assert run.error is None and run.gbps > 0, run
    assert all(r.error is None and r.nbytes == 2 * per_worker * chunk.nbytes
               for r in report.runs if r.method == "fio")  # fmt: skip
    # After both layouts are written: the first folder holds both workers' one-folder files
    # (worker 0's are the same in both layouts), the second worker 1's sharded ones.
    assert seen["threads=4 odirect=off sharded"] == [2 * per_worker, per_worker]
    for path in (tmp_path / "a").glob("fxkit-bench-kv-*/*.pt"):
        assert path.stat().st_size == chunk.nbytes
    assert not list(tmp_path.glob("*/fxkit-bench-kv-*"))  # removed at the end
    summary = report.summary
    assert summary["best"] in summary["gbps"] and summary["fio_best_gbps"] > 0
    assert summary["x_threads1"] and summary["x_fio_best"]
    assert summary["role_vars"]["vllm_lmcache_disk_io_threads"] in (1, 4)
    cold = summary["cold"]
    assert cold == all(r.resident_before == 0 for r in report.runs)
    assert cold or report.notes  # a filesystem that kept its pages is said so
    ttft = implied_ttft(values, report)
    assert ttft["best"]["reload_s"] > 0 and ttft["context_tokens"] == 131072


@needs_lmcache
def test_the_command_prints_the_table_and_writes_json(tmp_path: Path) -> None:
    out = tmp_path / "kv.json"
    args = ["bench", "kv", str(tmp_path), "--model", str(CONFIGS / "mistral-7b-v0.1.json"),
            "--size", "16 MiB", "--chunk-size", "64", "--threads", "1,2", "--odirect", "off",
            "--rounds", "1", "--json", str(out)]  # fmt: skip
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert "batched_get_blocking" in result.output and "role variables:" in result.output
    data = json.loads(out.read_text())
    assert data["kind"] == "fxkit-bench-kv" and data["lmcache"] == "0.5.6"
    assert set(data["summary"]["gbps"]) == {
        "threads=1 odirect=off one folder", "threads=2 odirect=off one folder"}  # fmt: skip
    assert data["chunk"]["nbytes"] == 2 * 32 * 64 * 128 * 2  # 8 KV heads over the default TP8
    assert data["ttft"]["best"]["gbps"] == data["summary"]["best_gbps"]


def test_bad_input_is_a_clear_error(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["bench", "kv", str(tmp_path), "--threads", "0"])
    assert result.exit_code != 0 and "--threads" in result.output
    result = CliRunner().invoke(cli, ["bench", "kv", str(tmp_path)])  # no model
    assert result.exit_code != 0 and "no model config" in result.output
    assert Setting(8, True, True).label == "threads=8 odirect=on sharded"


@needs_lmcache
def test_read_via_reads_the_written_files_through_another_path(tmp_path: Path) -> None:
    """LMCache writes in the folder and reads through the other path (here a symbolic link to it;
    in docs/BENCHMARKS.md a 1 ms FUSE mount of it); the role variables name the path read."""
    (tmp_path / "disk").mkdir()
    (tmp_path / "via").symlink_to(tmp_path / "disk")
    values, _ = collect(None, CONFIGS / "mistral-7b-v0.1.json", sets=("gpu.tensor_parallel=4",))
    chunk = chunk_shape(values, 32)
    report = bench([str(tmp_path / "disk")], chunk, 8 << 20, sweep([2], [False], 1), rounds=1,
                   fio=(FioSetting(1, False),),
                   read_via=[str(tmp_path / "via")])  # fmt: skip
    assert all(r.error is None and r.nbytes == 8 << 20 for r in report.runs), report.runs
    [scratch] = report.scratch
    assert report.reading == [str(tmp_path / "via" / Path(scratch).name)]
    assert report.through([f"{scratch}/k.pt"]) == [f"{report.reading[0]}/k.pt"]
    with pytest.raises(Exception, match="2 --read-via for 1 folders"):
        bench([str(tmp_path / "disk")], chunk, 8 << 20, [], read_via=["/a", "/b"])


def test_fio_reads_every_file_once_a_whole_file_per_read() -> None:
    job = fio_job("/tmp/links", 5, 8192, FioSetting(2, True))
    assert "directory=/tmp/links\n" in job and "bs=8192\n" in job and "direct=1" in job
    assert "[j0]\nfilename=0:2:4\nsize=24576\n" in job  # 3 files of 8 KiB
    assert "[j1]\nfilename=1:3\nsize=16384\n" in job
    assert "ioengine=psync" in job and "[j2]" not in job
    assert FioSetting(4, False, 8).label == "fio 4 jobs libaio qd8 buffered"
