#!/usr/bin/env python3
"""What memory an evicted checkpoint gives back, by the load that read it: the free blocks of
2 MiB and more (/proc/buddyinfo, zone Normal, orders 9 and up) that evicting it adds.

Each load runs in its own process, touches every page and ends; then the checkpoint is
evicted, with /proc/buddyinfo read just before and after (docs/BENCHMARKS.md, "Several local
ranks: what the order is not").

    python bench/free_blocks.py .cache/bench/llama-1gb --loads load_file,fxkit,prefetch
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

from fxkit.loader import evict_all, model_files

#: One load, touched: argv[1] the model, argv[2] how, then its files.
LOAD = """
import sys
import fxkit.loader as L
from fxkit.loader.cache import touch
from safetensors.torch import load_file
model, how, files = sys.argv[1], sys.argv[2], sys.argv[3:]
if how == "fxkit":
    tensors = L.load(model)
else:
    for f in files if how == "prefetch" else ():
        open(f, "rb").read()  # buffered reads bring the files in, then load_file maps them
    tensors = {k: v for f in files for k, v in load_file(f).items()}
sum(touch(t) for t in tensors.values())
"""
HUGE_ORDER = 9  # 2 MiB blocks with 4 KiB pages


def free_blocks() -> list[int]:
    """Free blocks per order in zone Normal (summed over the nodes)."""
    rows = [
        [int(n) for n in line.split()[4:]]
        for line in Path("/proc/buddyinfo").read_text().splitlines()
        if line.split()[3] == "Normal"
    ]
    return [sum(column) for column in zip(*rows, strict=True)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint")
    parser.add_argument("--loads", default="load_file,fxkit,prefetch")
    args = parser.parse_args()
    files = [str(f) for f in model_files(args.checkpoint).files]
    for how in args.loads.split(","):
        evict_all(files)
        subprocess.run([sys.executable, "-c", LOAD, args.checkpoint, how, *files], check=True)
        time.sleep(0.5)
        before = free_blocks()
        evict_all(files)
        gained = [b - a for a, b in zip(before, free_blocks(), strict=True)]
        big = sum(n << (order + 12) for order, n in enumerate(gained) if order >= HUGE_ORDER)
        print(f"{how:<10} blocks gained by order: {gained}; in 2 MiB or more: {big / 1e6:.0f} MB")


if __name__ == "__main__":
    main()
