#!/usr/bin/env python3
"""Does a load's speed depend on the load before it? Runs of ``fxkit bench load --ranks``'s
harness in a given sequence, grouped by the method that ran just before.

Each step of ``--sequence`` is a method of the harness (``baseline`` or ``fxkit``, or any other
of ``RANK_METHODS``), run cold at ``--ranks`` ranks exactly as in the benchmark; ``--settle``
waits that long after the eviction, before the go (on a VM whose balloon reports free memory to
the host, memory freed more than about 2 s earlier has been handed back). The report is the
seconds of each method grouped by its predecessor (docs/BENCHMARKS.md, "Several local ranks:
what the order is not"), and, where the kernel counts it, the free memory the VM handed back to
its host in each run, from the start of its ranks to the end (fxkit.loadbench.balloon).

    python bench/order_probe.py .cache/bench/llama-1gb --sequence baseline,fxkit,fxkit,baseline \
        --repeat 3 [--ranks 1] [--settle 4] [-o direct_io=on] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from fxkit.loadbench import balloon
from fxkit.loadbench.bench_ranks import RankRun, block_device, run_node


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", type=Path)
    parser.add_argument("--sequence", default="baseline,fxkit,fxkit,baseline,fxkit")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--ranks", type=int, default=1)
    parser.add_argument("--settle", type=float, default=0.0)
    parser.add_argument(
        "-o",
        dest="options",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an fxkit.loader option for the fxkit runs (JSON values)",
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    options = {k: json.loads(v) for k, _, v in (o.partition("=") for o in args.options)}
    disk = block_device(args.checkpoint)
    by_prior: dict[str, list[float]] = {}
    handed_back: dict[str, list[int]] = {}
    before = "nothing"
    for step in args.sequence.split(",") * args.repeat:
        run = RankRun(step, 0, ranks=args.ranks)
        opts = options if step == "fxkit" else {}
        run_node(step, args.checkpoint, opts, args.ranks, run, disk, settle=args.settle)
        if run.error:
            raise SystemExit(f"{step}: {run.error}")
        key = f"{step} after {before}"
        by_prior.setdefault(key, []).append(round(run.seconds, 3))
        back = ""
        if run.handed_back is not None:
            handed_back.setdefault(key, []).append(run.handed_back >> 20)
            back = f", {run.handed_back >> 20} MiB handed back to the VM's host"
        print(f"{step:<10} after {before:<10} {run.seconds:.3f} s{back}", flush=True)
        before = step
    print()
    for key, seconds in sorted(by_prior.items()):
        print(f"{key:<28} median {statistics.median(seconds):.3f} s  {sorted(seconds)}")
    if args.json:
        about = {"ranks": args.ranks, "settle": args.settle, "options": options}
        about["free_page_reporting"] = balloon.reporting()
        runs = {"seconds": by_prior, "handed_back_mib": handed_back}
        args.json.write_text(json.dumps({**about, **runs}, indent=1) + "\n")


if __name__ == "__main__":
    main()
