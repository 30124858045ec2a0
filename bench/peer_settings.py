#!/usr/bin/env python3
"""The sweep that chose the tuned peers' settings (``runai-tuned``, ``fastsafetensors-tuned`` in
fxkit.loadbench.bench): each candidate is the peer's own documented knobs, run cold (files evicted
and checked before every run) in a fresh process, in interleaved rounds (the order reversed every
other round). Prints every run, then each candidate's median GB/s and its within-round ratio to
the peer's defaults.

    python bench/peer_settings.py MODEL --peer runai --runs 4
    python bench/peer_settings.py MODEL --peer fastsafetensors --runs 4

Run:ai's settings are environment variables (docs/src/env-vars.md of runai-model-streamer, and
vLLM's ``--model-loader-extra-config`` ``concurrency``/``memory_limit``); fastsafetensors' are
arguments of SafeTensorsFileLoader (``max_threads``, ``bbuf_size_kb``) and copy_files_to_device
(``max_copy_block_size``), plus its FASTSAFETENSORS_ODIRECT variable.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path
from typing import Any

from fxkit.loader.files import model_files

from fxkit.loadbench import bench

MIB = 1 << 20
UNLIMITED = {"RUNAI_STREAMER_MEMORY_LIMIT": "-1"}
# label: (environment, options)
CANDIDATES: dict[str, dict[str, tuple[dict[str, str], dict[str, Any]]]] = {
    "runai": {
        "defaults": ({}, {}),
        "MEMORY_LIMIT=-1": (UNLIMITED, {}),
        "unlimited FS_QUEUE_DEPTH=16": ({**UNLIMITED, "RUNAI_STREAMER_FS_QUEUE_DEPTH": "16"}, {}),
        "unlimited FS_QUEUE_DEPTH=256": ({**UNLIMITED, "RUNAI_STREAMER_FS_QUEUE_DEPTH": "256"}, {}),
        "unlimited CONCURRENCY=32": ({**UNLIMITED, "RUNAI_STREAMER_CONCURRENCY": "32"}, {}),
        "unlimited FS_CHUNK=2M": (
            {**UNLIMITED, "RUNAI_STREAMER_FS_CHUNK_BYTESIZE": str(2 * MIB)},
            {},
        ),
        "unlimited FS_CHUNK=16M": (
            {**UNLIMITED, "RUNAI_STREAMER_FS_CHUNK_BYTESIZE": str(16 * MIB)},
            {},
        ),
        "unlimited FS_CHUNK=32M": (
            {**UNLIMITED, "RUNAI_STREAMER_FS_CHUNK_BYTESIZE": str(32 * MIB)},
            {},
        ),
        "unlimited FS_CHUNK=64M": (
            {**UNLIMITED, "RUNAI_STREAMER_FS_CHUNK_BYTESIZE": str(64 * MIB)},
            {},
        ),
        "unlimited sync_buffered CONCURRENCY=32": (
            {
                **UNLIMITED,
                "RUNAI_STREAMER_FS_STRATEGY": "sync_buffered",
                "RUNAI_STREAMER_CONCURRENCY": "32",
            },
            {},
        ),
        "unlimited sync_buffered CHUNK=8M": (
            {
                **UNLIMITED,
                "RUNAI_STREAMER_FS_STRATEGY": "sync_buffered",
                "RUNAI_STREAMER_CHUNK_BYTESIZE": str(8 * MIB),
            },
            {},
        ),
        "unlimited libaio_direct": (
            {**UNLIMITED, "RUNAI_STREAMER_FS_STRATEGY": "libaio_direct"},
            {},
        ),
        "RING_BUFFERS=64": ({"RUNAI_STREAMER_RING_BUFFERS": "64"}, {}),
    },
    "fastsafetensors": {
        "defaults": ({}, {}),
        "copy block 256M": ({}, {"max_copy_block_size": 256 * MIB}),
        "copy block 64M": ({}, {"max_copy_block_size": 64 * MIB}),
        "copy block 16M": ({}, {"max_copy_block_size": 16 * MIB}),
        "64M 4 threads": ({}, {"max_copy_block_size": 64 * MIB, "max_threads": 4}),
        "64M 32 threads": ({}, {"max_copy_block_size": 64 * MIB, "max_threads": 32}),
        "64M bounce 64M": ({}, {"max_copy_block_size": 64 * MIB, "bbuf_size_kb": 64 << 10}),
        "64M bounce 4M": ({}, {"max_copy_block_size": 64 * MIB, "bbuf_size_kb": 4 << 10}),
        "64M ODIRECT=0": ({"FASTSAFETENSORS_ODIRECT": "0"}, {"max_copy_block_size": 64 * MIB}),
    },
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("--peer", choices=sorted(CANDIDATES), required=True)
    parser.add_argument("--runs", type=int, default=4)
    parser.add_argument("--only", help="comma-separated candidate labels (defaults always run)")
    args = parser.parse_args()
    if why := bench.METHODS[args.peer].missing():
        raise SystemExit(f"{args.peer}: {why}")
    files = model_files(args.model).files
    known = CANDIDATES[args.peer]
    chosen = {"defaults", *args.only.split(",")} if args.only else set(known)
    if unknown := chosen - set(known):
        raise SystemExit(f"unknown candidate(s) {sorted(unknown)}; known: {list(known)}")
    candidates = [(label, setting) for label, setting in known.items() if label in chosen]
    runs: list[bench.Run] = []
    for rnd in range(args.runs):
        for label, (env, options) in candidates if rnd % 2 == 0 else candidates[::-1]:
            run = bench.Run(label, rnd)
            if problem := bench._prepare(files, True, (), run):
                raise SystemExit(f"eviction failed: {problem}")
            bench._run_loader(args.peer, args.model, options, run, env)
            if not run.error:
                run.gbps = run.nbytes / run.seconds / bench.GB
            runs.append(run)
            print(run.line(), flush=True)
    for label, _ in candidates:
        speeds = [r.gbps for r in runs if r.method == label and not r.error]
        median = f"{statistics.median(speeds):.2f}" if speeds else "-"
        x = bench.ratio(runs, label, "defaults")
        print(f"{label:36} median {median} GB/s, x defaults {x:.2f}" if x else f"{label:36} -")


if __name__ == "__main__":
    main()
