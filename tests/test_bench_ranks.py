"""``fxkit bench load --ranks N``: the disk counters (the kernel's own files and lsblk), the barrier
and the node time with real rank processes on a tiny real checkpoint, a failing rank, the CLI."""

from __future__ import annotations

import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from fxkit.loader.errors import LoaderError
from fxkit.loader.files import model_files
from safetensors.torch import save_file

from fxkit.cli import cli
from fxkit.loadbench import balloon, bench, bench_ranks
from fxkit.loadbench.bench_ranks import RankMethod, RankRun

# /proc/diskstats of this machine (Linux 6.18: 20 fields, with discards and flushes) and of a
# Linux 4.18 host (14 fields); the 6th field is the sectors read.
DISKSTATS = """\
   7       0 loop0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0
 254       0 vda 399567 166066 247821748 6067887 216537 1970012 142148568 1102702 0 259068 7262977 1393310 12 115135760 91869 8190 517
 259       0 nvme0n1 120 0 9472 18 0 0 0 0 0 40 18
 259       1 nvme0n1p1 60 0 4136 9 0 0 0 0 0 20 9
"""  # noqa: E501


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two real shards, ~1.5 MB, with an index; on the test's own file system."""
    root = tmp_path_factory.mktemp("ranks_model")
    weight_map = {}
    for s in range(2):
        g = torch.Generator().manual_seed(s)
        tensors = {f"layers.{s}.{i}.weight": torch.randn(300 + 77 * i, 257, generator=g)
                   for i in range(3)}  # fmt: skip
        save_file(tensors, root / f"model-{s + 1:05d}-of-00002.safetensors")
        weight_map.update(dict.fromkeys(tensors, f"model-{s + 1:05d}-of-00002.safetensors"))
    (root / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return root


def _expected(model: Path) -> tuple[int, int]:
    """The touch checksum and tensor count of the checkpoint, from safetensors in this process."""
    from safetensors.torch import load_file

    tensors = [t for f in model_files(model).files for t in load_file(f).values()]
    return sum(bench.touch(t) for t in tensors), len(tensors)


def test_diskstats_lines_of_two_kernels() -> None:
    assert bench_ranks.sectors_read("vda", DISKSTATS) == 247821748
    assert bench_ranks.sectors_read("nvme0n1", DISKSTATS) == 9472
    with pytest.raises(LoaderError, match="sda is not in /proc/diskstats"):
        bench_ranks.sectors_read("sda", DISKSTATS)


def test_device_of_a_file_matches_lsblk_and_sysfs(tmp_path: Path) -> None:
    disk = bench_ranks.block_device(tmp_path)
    if disk is None:
        pytest.skip(f"the test's file system has no block device: {bench.filesystem(tmp_path)}")
    dev = tmp_path.stat().st_dev
    if lsblk := shutil.which("lsblk"):  # util-linux names the disk its own way
        out = subprocess.run(
            [lsblk, "-rno", "MAJ:MIN,NAME,PKNAME"], capture_output=True, text=True, check=True
        ).stdout
        rows = {row[0]: row[1:] for row in map(str.split, out.splitlines())}
        names = rows[f"{os.major(dev)}:{os.minor(dev)}"]
        assert disk == names[-1]  # the parent disk of a partition, else the device itself
    # The kernel's two views of one counter: /sys/block/DISK/stat's 3rd field, /proc/diskstats.
    first = int(Path(f"/sys/block/{disk}/stat").read_text().split()[2])
    middle = bench_ranks.sectors_read(disk)
    last = int(Path(f"/sys/block/{disk}/stat").read_text().split()[2])
    assert first <= middle <= last


def test_a_partition_resolves_to_its_disk_and_tmpfs_to_none() -> None:
    assert bench_ranks.block_device(Path("/dev/shm")) is None  # tmpfs: an anonymous st_dev
    assert bench_ranks.block_device(Path("/proc")) is None
    partitions = sorted(p for p in Path("/sys/class/block").iterdir() if (p / "partition").exists())
    if not partitions:
        pytest.skip("no partition on this machine to resolve")
    major, minor = (int(n) for n in (partitions[0] / "dev").read_text().split(":"))
    assert bench_ranks.disk_of(major, minor) == partitions[0].resolve().parent.name


def test_ranks_wait_for_go_and_the_node_time_covers_them(model: Path) -> None:
    """Two real rank processes: ready after their imports, silent until go, then one answer each,
    both ends after the go; the node time (go to the later end) covers each rank's seconds."""
    argv = [sys.executable, "-m", "fxkit.loadbench.bench_ranks", "baseline", str(model), "{}", "2"]
    spec = bench_ranks.RANK_METHODS["baseline"]
    ranks = [bench_ranks._Rank([*argv, "-", str(r)], bench_ranks._rank_env(spec, r, 2))
             for r in range(2)]  # fmt: skip
    try:
        assert bench_ranks._collect(ranks, time.monotonic() + 120) == ["ready", "ready"]
        assert select.select([rank.fd for rank in ranks], [], [], 1.0)[0] == []  # at the barrier
        assert all(rank.proc.poll() is None for rank in ranks)
        go = time.monotonic()
        for rank in ranks:
            rank.go()
        answers = bench_ranks._collect(ranks, time.monotonic() + 120)
    finally:
        for rank in ranks:
            rank.close()
    assert not isinstance(answers, str), answers
    results = [json.loads(a) for a in answers]
    checksum, count = _expected(model)
    assert [(r["checksum"], r["tensors"]) for r in results] == [(checksum, count)] * 2
    node = max(r["end"] for r in results) - go
    assert all(0 < r["seconds"] <= r["end"] - go <= node < 60 for r in results)
    assert all(r["peak_rss"] >= r["rss_before"] > 0 and r["read_bytes"] >= 0 for r in results)


def test_a_failing_rank_is_the_runs_error_with_its_last_stderr_line(model: Path) -> None:
    run = RankRun("fxkit", 0, ranks=2)
    bench_ranks.run_node("fxkit", model, {"threads": 0}, 2, run, timeout=120)
    assert run.error is not None and re.match(r"rank [01]: ", run.error), run.error
    assert "threads" in run.error and "Traceback" not in run.error
    assert run.per_rank == [] and run.gbps == 0


def test_a_killed_rank_ends_the_run_at_once(model: Path) -> None:
    """A rank that dies while its process group waits: reported, the others not waited for."""
    spec = bench_ranks.RANK_METHODS["fastsafetensors"]
    if why := spec.missing():
        pytest.skip(why)
    store = model.parent / "store-killed"
    argv = [sys.executable, "-m", "fxkit.loadbench.bench_ranks", spec.name, str(model), "{}", "2"]
    ranks = [bench_ranks._Rank([*argv, str(store), str(r)], bench_ranks._rank_env(spec, r, 2))
             for r in range(2)]  # fmt: skip
    try:
        assert bench_ranks._collect(ranks, time.monotonic() + 120) == ["ready", "ready"]
        os.kill(ranks[1].proc.pid, signal.SIGKILL)  # our own child
        for rank in ranks:
            rank.go()
        start = time.monotonic()
        failure = bench_ranks._collect(ranks, time.monotonic() + 120)
        assert isinstance(failure, str) and failure.startswith("rank ")
        assert time.monotonic() - start < 60
    finally:
        for rank in ranks:
            rank.close()


def test_cli_ranks_2_json_every_method(model: Path, tmp_path: Path) -> None:
    """Every method at 2 ranks, one round: the same bytes as the baseline in every rank."""
    out = tmp_path / "ranks.json"
    args = ["--ranks", "2", "-n", "1", "-o", "threads=2", "--json", str(out)]
    result = CliRunner().invoke(cli, ["bench", "load", str(model), *args], env={"COLUMNS": "220"})
    assert result.exit_code == 0, result.output
    assert "RSS sum GiB" in result.output and "N=2 target fxkit >= 1.3x baseline" in result.output
    data = json.loads(out.read_text())
    assert data["ranks"] == [2] and data["rounds"] == 1 and data["options"] == {"threads": 2}
    assert data["disk"] == bench_ranks.block_device(model)
    assert [s["method"] for s in data["summaries"]] == list(bench_ranks.RANK_METHODS)
    checksum, count = _expected(model)
    for s in data["summaries"]:
        if s["skipped"]:
            continue
        assert s["errors"] == [] and s["checksum_ok"] is True, s
        assert s["rss_sum"] >= s["rss_per_rank"] > 0
        assert s["seconds_min"] <= s["seconds_median"] <= s["seconds_max"]
    for run in data["runs"]:
        assert run["ranks"] == 2 and len(run["per_rank"]) == 2
        assert {(p["checksum"], p["tensors"]) for p in run["per_rank"]} == {(checksum, count)}
        assert run["resident_before"] == 0  # evicted once all were ready, mincore-verified
        assert max(p["seconds"] for p in run["per_rank"]) <= run["seconds"]
        assert run["gbps"] == pytest.approx(data["nbytes"] / run["seconds"] / 1e9)
        assert run["read_bytes"] == sum(p["read_bytes"] for p in run["per_rank"])
        assert (run["disk_bytes"] is None) == (data["disk"] is None)
        counted = balloon.reported_bytes() is not None  # this VM's kernel counts what it reports
        assert (run["handed_back"] is not None) == counted and (run["handed_back"] or 0) >= 0
    assert data["machine"]["free_page_reporting"] == balloon.reporting()
    assert ("handed back GiB" in result.output) == (balloon.reported_bytes() is not None)
    assert {"baseline", "prefetch", "runai", "fastsafetensors"} >= set(data["targets"]["2"]) - {
        "disk"
    }


def test_cli_ranks_bad_input(model: Path) -> None:
    runner = CliRunner()
    for args, message in (
        (["--ranks", "0"], "whole numbers >= 1"),
        (["--ranks", "two"], "whole numbers >= 1"),
        (["--ranks", "2", "--hot"], "--ranks runs cold only"),
    ):
        result = runner.invoke(cli, ["bench", "load", str(model), *args])
        assert result.exit_code != 0 and message in result.output, (args, result.output)
        assert "Traceback" not in result.output
    # a LoaderError, which fxkit's entry point prints as one line (fxkit.cli.main)
    result = runner.invoke(cli, ["bench", "load", str(model), "--ranks", "2", "-m", "fio"])
    assert isinstance(result.exception, LoaderError)
    assert "no multi-rank method fio; at N ranks: baseline, prefetch" in str(result.exception)


def test_a_method_that_cannot_run_is_skipped_with_its_reason(
    model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    absent = RankMethod("absent", "not installed", "no_such_package_fxkit", bench_ranks._prefetch)
    later = RankMethod("later", "an option not there yet", "fxkit.loader.options:no_such_thing",
                       bench_ranks._prefetch)  # fmt: skip
    for m in (absent, later):
        monkeypatch.setitem(bench_ranks.RANK_METHODS, m.name, m)
    report = bench_ranks.bench_ranks(model, ranks=[2], methods=["absent", "later"], runs=1)
    assert report.runs == []
    assert [(s.method, s.skipped) for s in report.summaries] == [
        ("absent", "Python package no_such_package_fxkit is not installed"),
        ("later", "fxkit.loader.options has no no_such_thing (yet)"),
    ]


def test_files_behind_a_mount_are_evicted_too(model: Path, tmp_path: Path) -> None:
    """``also_evict`` (the server's copies behind a network mount): cold before every run."""
    from fxkit.loader import cache

    behind = tmp_path / "server"
    shutil.copytree(model, behind)
    files = model_files(behind).files
    assert not cache.warm(files)
    report = bench_ranks.bench_ranks(
        model, [2], ["baseline"], runs=1, also_evict=files, timeout=120
    )
    assert not report.eviction_failures and all(not r.error for r in report.runs)
    assert sum(cache.resident_bytes(f) for f in files) == 0


def test_the_order_probe_groups_runs_by_their_predecessor(model: Path, tmp_path: Path) -> None:
    """bench/order_probe.py: real runs of the harness in sequence, each filed under the method
    run just before it; ``--settle`` waits after the eviction, outside the node time."""
    out = tmp_path / "order.json"
    probe = Path(__file__).resolve().parent.parent / "bench" / "order_probe.py"
    argv = [sys.executable, str(probe), str(model), "--sequence", "baseline,fxkit",
            "--repeat", "2", "--settle", "0.5", "-o", "threads=2", "--json", str(out)]  # fmt: skip
    start = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
    wall = time.monotonic() - start
    assert done.returncode == 0, done.stderr
    data = json.loads(out.read_text())
    assert data["ranks"] == 1 and data["settle"] == 0.5 and data["options"] == {"threads": 2}
    seconds = data["seconds"]
    assert sorted(seconds) == ["baseline after fxkit", "baseline after nothing",
                               "fxkit after baseline"]  # fmt: skip
    assert [len(seconds[k]) for k in sorted(seconds)] == [1, 1, 2]
    runs = [s for values in seconds.values() for s in values]
    assert all(s > 0 for s in runs) and wall > 4 * 0.5 + sum(runs)
    assert "fxkit after baseline" in done.stdout and "median" in done.stdout
    assert data["free_page_reporting"] == balloon.reporting()
    if balloon.reported_bytes() is not None:  # one figure per run, in MiB
        assert {k: len(v) for k, v in data["handed_back_mib"].items()} == {
            k: len(v) for k, v in seconds.items()
        }
        assert "MiB handed back" in done.stdout
    else:
        assert data["handed_back_mib"] == {}
