#!/usr/bin/env python3
"""Plot remote_fs.py's results: speed per method, and fxkit's speed-up, against added latency.

    python bench/plot_latency.py docs/remote_latency.json docs/img/remote_latency.png

Needs matplotlib (``pip install matplotlib``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

FIELD_SPEEDUP = 6.2  # the field's NFS vs fast store figure for a 32B model (issue 4)


def plot(results: list[dict], out: str | Path, link: str = "sshfs") -> None:
    """Two panels: median GB/s per method, and fxkit's within-round speed-ups, vs delay."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    delays = [r["delay_ms"] for r in results]
    fig, (speed, gain) = plt.subplots(1, 2, figsize=(10, 4), constrained_layout=True)
    methods = [s["method"] for s in results[0]["report"]["summaries"] if not s["skipped"]]
    for method in methods:
        medians = [
            next(s["gbps_median"] for s in r["report"]["summaries"] if s["method"] == method)
            for r in results
        ]
        speed.plot(delays, medians, marker="o", label=method)
    speed.set(xlabel="added latency per request (ms)", ylabel="GB/s (median, cold)", ylim=(0, None))
    speed.set_title(f"Load speed over {link}")
    speed.legend()
    for other in ("baseline", "prefetch"):
        ratios = [r["fxkit_vs"].get(other) for r in results]
        if any(ratios):
            gain.plot(delays, ratios, marker="o", label=f"fxkit / {other}")
    gain.axhline(FIELD_SPEEDUP, color="grey", linestyle="--", label=f"field: {FIELD_SPEEDUP}x")
    gain.set(xlabel="added latency per request (ms)", ylabel="speed-up (x)", ylim=(0, None))
    gain.set_title("fxkit's speed-up (median of within-round ratios)")
    gain.legend()
    nbytes = results[0]["report"]["nbytes"]
    fig.suptitle(f"Remote storage emulation: {nbytes / 1e9:.1f} GB checkpoint, cold cache")
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    plot(json.loads(Path(sys.argv[1]).read_text()), sys.argv[2])
