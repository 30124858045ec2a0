"""The loader of another checkout against this one, side by side with ``load_file``, cold.

Checks that a change of the loader's defaults does not regress a shape it serves: each round
evicts the checkpoint from the page cache, then loads it in a fresh process with
``safetensors.torch.load_file``, with ``loader.load`` of OLD_TREE (a checkout, for example
``git worktree add /tmp/old-loader REV``) and with this checkout's, in an order that rotates by
round; each process times its load alone (imports excluded) and touches every tensor.

    python bench/loader_ab.py CHECKPOINT --old-tree /tmp/old-loader --rounds 6
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
#: One load, timed in the child once torch is imported: argv[1] the tree (or ""), then files.
CHILD = """
import sys, time, torch
from safetensors.torch import load_file
tree, files = sys.argv[1], sys.argv[2:]
if tree:
    sys.path.insert(0, tree)
    import loader
    assert loader.__file__.startswith(tree), loader.__file__
start = time.perf_counter()
tensors = loader.load(files) if tree else {k: v for f in files for k, v in load_file(f).items()}
for t in tensors.values():
    t.sum()
print(time.perf_counter() - start)
"""


def evict(files: list[Path]) -> None:
    for file in files:
        fd = os.open(file, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def load_seconds(tree: str, files: list[Path]) -> float:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, tree, *map(str, files)],
        capture_output=True, text=True, check=True, cwd="/",
    )  # fmt: skip
    return float(done.stdout.split()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint", type=Path)
    parser.add_argument("--old-tree", required=True, help="the other checkout's root")
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    files = sorted(args.checkpoint.glob("*.safetensors"))
    gb = sum(f.stat().st_size for f in files) / 1e9
    trees = {"baseline": "", "old": str(Path(args.old_tree).resolve()), "new": str(HERE)}
    speeds: dict[str, list[float]] = {name: [] for name in trees}
    names = list(trees)
    for round_ in range(args.rounds):
        for name in names[round_ % 3 :] + names[: round_ % 3]:
            evict(files)
            speeds[name].append(round(gb / load_seconds(trees[name], files), 3))
    base = speeds["baseline"]
    ratios = {
        name: round(statistics.median(a / b for a, b in zip(speeds[name], base, strict=True)), 2)
        for name in ("old", "new")
    }
    print(json.dumps({"gb": round(gb, 2), "gb_per_s": speeds, "x_baseline": ratios}, indent=1))


if __name__ == "__main__":
    main()
