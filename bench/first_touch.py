#!/usr/bin/env python3
"""First write to fresh memory, by kind of buffer: what a cold load pays before any byte is read.

A loader that reads into new host buffers faults every page in once (the kernel zeroes it; on a
VM the host may have to back it too). This measures GB/s of that first write, interleaved:
fxkit's ``host_buffer`` (anonymous mapping with MADV_HUGEPAGE), a plain anonymous mapping
(4 KiB pages) and ``torch.empty``; and the second write to the same memory for comparison.

    python bench/first_touch.py [--gib 2] [--rounds 3]
"""

from __future__ import annotations

import argparse
import mmap
import statistics
import time

import torch
from fxkit.loader.read import host_buffer


def _anonymous(size: int) -> torch.Tensor:
    return torch.frombuffer(mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE), dtype=torch.uint8)


def _empty(size: int) -> torch.Tensor:
    return torch.empty(size, dtype=torch.uint8)


KINDS = {"host_buffer (THP)": host_buffer, "mmap 4 KiB": _anonymous, "torch.empty": _empty}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gib", type=float, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    size = int(args.gib * 2**30)
    first: dict[str, list[float]] = {k: [] for k in KINDS}
    second: dict[str, list[float]] = {k: [] for k in KINDS}
    for rnd in range(args.rounds):
        names = list(KINDS)[rnd % len(KINDS) :] + list(KINDS)[: rnd % len(KINDS)]
        for name in names:
            start = time.perf_counter()
            buffer = KINDS[name](size)
            buffer.fill_(1)
            first[name].append(size / (time.perf_counter() - start) / 1e9)
            start = time.perf_counter()
            buffer.fill_(2)
            second[name].append(size / (time.perf_counter() - start) / 1e9)
            del buffer
    print(f"{args.gib:g} GiB, {args.rounds} interleaved rounds, GB/s median [min-max]")
    for name in KINDS:
        f, s = first[name], second[name]
        print(
            f"{name:<18} first write {statistics.median(f):6.2f} [{min(f):.2f}-{max(f):.2f}]"
            f"   second write {statistics.median(s):6.2f}"
        )


if __name__ == "__main__":
    main()
