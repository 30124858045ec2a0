#!/usr/bin/env python3
"""Every loader benchmark of docs/BENCHMARKS.md in one command (``make bench-load``).

Generates the checkpoints (git-ignored, under .cache/bench/), then runs, each in interleaved
rounds: local disk cold, local disk hot, N ranks loading at once (cold, 1 GB), and the remote
storage emulation over the added latencies (remote_fs.py; needs root). Reports (JSON) go to
docs/bench/, the plot to docs/img/remote_latency.png. The checkpoints are deleted at the end
unless --keep.

    python bench/load.py [--size 6GB] [--remote-size 1GB] [--runs 5] [--remote-runs 3]
                         [--ranks 2,4,8] [--ranks-runs 3] [--ranks-option share=true]
                         [--skip cold,hot,ranks,remote]
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import remote_fs
import yaml
from fxkit.loader import LoadOptions, make_checkpoint
from plot_latency import plot
from rich.console import Console

from fxkit.cli.loader import parse_size
from fxkit.loadbench import bench, bench_ranks

ROOT = Path(__file__).resolve().parent.parent


def checkpoint(name: str, nbytes: int, console: Console, shards: int | None = None) -> Path:
    """A generated Llama-style checkpoint of about ``nbytes``, made once."""
    path = ROOT / ".cache" / "bench" / name
    if not (path / "model.safetensors.index.json").exists():
        console.print(f"generating {path} ({nbytes / 1e9:.1f} GB)")
        shutil.rmtree(path, ignore_errors=True)
        make_checkpoint(path, nbytes, shards=shards)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=parse_size, default="6GB", help="local-disk checkpoint")
    parser.add_argument(
        "--remote-size", type=parse_size, default="1GB", help="checkpoint over sshfs and at N ranks"
    )
    parser.add_argument("--runs", type=int, default=5, help="rounds, local disk")
    parser.add_argument("--remote-runs", type=int, default=3, help="rounds per latency")
    parser.add_argument("--latencies", default="0,0.5,1,2")
    parser.add_argument("--ranks", default="2,4,8", help="processes at once, each N")
    parser.add_argument("--ranks-runs", type=int, default=3, help="rounds per N")
    parser.add_argument(
        "--ranks-option", action="append", default=[], metavar="KEY=VALUE",
        help="fxkit's options at N ranks (as fxkit bench load -o), e.g. share=true",
    )  # fmt: skip
    parser.add_argument("--skip", default="", help="comma-separated: cold,hot,ranks,remote")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "bench")
    parser.add_argument("--keep", action="store_true", help="keep the generated checkpoints")
    args = parser.parse_args()
    skip = set(args.skip.split(","))
    ranks_options = {
        k: yaml.safe_load(v) for k, _, v in (o.partition("=") for o in args.ranks_option)
    }
    LoadOptions.from_mapping(ranks_options, where="--ranks-option")
    console = Console()
    args.out.mkdir(parents=True, exist_ok=True)
    try:
        local = checkpoint(f"llama-{args.size // 10**9}gb", args.size, console)
        for mode in ("cold", "hot"):
            if mode in skip:
                continue
            console.rule(f"local disk, {mode}")
            report = bench.bench(
                local,
                runs=args.runs,
                cold=mode == "cold",
                on_run=lambda r: console.print(r.line(), highlight=False),
            )
            bench.render(report, console)
            bench.save_json(report, args.out / f"local_{mode}.json")
        # 1 GB in 4 shards: the peers keep a copy per rank, 8 of them fit in memory.
        small = f"llama-{args.remote_size / 10**9:g}gb"
        if "ranks" not in skip:
            console.rule("N ranks at once, local disk, cold")
            at_ranks = bench_ranks.bench_ranks(
                checkpoint(small, args.remote_size, console, shards=4),
                ranks=[int(n) for n in args.ranks.split(",")],
                runs=args.ranks_runs,
                fxkit_options=ranks_options,
                on_run=lambda r: console.print(r.line(), highlight=False),
            )
            bench_ranks.render(at_ranks, console)
            bench.save_json(at_ranks, args.out / "local_ranks.json")
        if "remote" not in skip:
            console.rule("remote storage emulation")
            # 4 shards, as real checkpoints are sharded (sshfs serves one file per connection).
            remote = checkpoint(small, args.remote_size, console, shards=4)
            # sshfs: a real network file system, CPU-bound here; fuse: the latency alone.
            for transport, stem, link in (
                ("sshfs", "remote_latency", "sshfs"),
                ("fuse", "remote_latency_fuse", "a FUSE passthrough with delay"),
            ):
                options = SimpleNamespace(
                    model=str(remote),
                    latencies=[float(x) for x in args.latencies.split(",")],
                    runs=args.remote_runs,
                    methods=["baseline", "prefetch", "fxkit"],
                    fxkit_options={},
                    transport=transport,
                )
                results = remote_fs.run(options, console)
                console.print(remote_fs.table(results, results[0]["report"]["nbytes"]))
                (args.out / f"{stem}.json").write_text(json.dumps(results, indent=2) + "\n")
                plot(results, ROOT / "docs" / "img" / f"{stem}.png", link)
    finally:
        if not args.keep:
            shutil.rmtree(ROOT / ".cache" / "bench", ignore_errors=True)


if __name__ == "__main__":
    main()
