"""Upload benchmark: fxkit's atomic, verified file write against scp and sftp, same lab fleet.

One file (random bytes) goes to 1 and to 8 lab hosts at once: fxkit with one connection per
host from one process (threads, as ``fxkit play`` runs hosts), the file mapped as ``host.copy()``
maps it and written with ``put()`` as every file operation writes (the sha256 sent after the
content, the temp file's size and sha256 checked on the host, rename); ``fxkit-copy``: the
operation ``host.copy()`` itself (the host's file stat'ed first, then the same write); scp and
sftp (OpenSSH's, one process per host, the same key and known_hosts); ``ssh-verified``: the
verified copy a user would build from OpenSSH and coreutils, for the verification's own cost:
the file's sha256 (openssl's, SHA-NI where the CPU has it, as fxkit's hashlib) taken on the
controller while ``ssh`` sends it to a remote ``tee`` that writes it and feeds the host's
openssl (both hashes beside the copy, as fxkit's), the two digests compared. Each round runs the
tools in a rotating order; every upload is timed from connecting to the last host done, then
checked (sha256 on every host) and removed (the lab hosts keep /tmp in memory). Reported: the
median seconds, MB/s, and the ratio of fxkit to scp, sftp and ssh-verified.

    .venv/bin/python bench/upload.py --sizes 10M,100M,1G --hosts 1,8 --runs 3

Needs root (the lab fleet).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import resource
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from fxkit.connection import ConnectOptions  # noqa: E402
from fxkit.facts.base import FactCache  # noqa: E402
from fxkit.lab import Fleet  # noqa: E402
from fxkit.ops.base import OpContext  # noqa: E402
from fxkit.ops.transfer import copy, local_file  # noqa: E402

TOOLS = ("fxkit", "fxkit-copy", "scp", "sftp", "ssh-verified")
#: The peers fxkit's tools are reported against, as ratios.
BASES = ("scp", "sftp", "ssh-verified")
DEST = "/tmp/fxkit-upload-bench"
SHA256 = "openssl dgst -sha256 -r"
UNITS = {"K": 2**10, "M": 2**20, "G": 2**30}


def parse_size(text: str) -> int:
    text = text.strip().upper().removesuffix("B")
    return int(float(text[:-1]) * UNITS[text[-1]]) if text[-1] in UNITS else int(text)


def source_file(folder: Path, size: int) -> Path:
    """A file of ``size`` random bytes (made once, kept for later runs)."""
    path = folder / f"upload-{size}.bin"
    if not path.exists() or path.stat().st_size != size:
        folder.mkdir(parents=True, exist_ok=True)
        with open(path, "wb") as f:
            for _ in range(0, size, 2**24):
                f.write(os.urandom(min(2**24, size - f.tell())))
    return path


def upload_fxkit(fleet: Fleet, names: list[str], src: Path) -> None:
    options = ConnectOptions(known_hosts=str(fleet.known_hosts))
    with local_file(src) as data:  # mapped, as host.copy() reads a controller file

        def one(name: str) -> None:
            with fleet.connect(name, options) as conn:
                conn.put(DEST, data)

        _parallel(one, names)


def upload_fxkit_copy(fleet: Fleet, names: list[str], src: Path) -> None:
    options = ConnectOptions(known_hosts=str(fleet.known_hosts))

    def one(name: str) -> None:
        with fleet.connect(name, options) as conn:
            result = copy(OpContext(conn, FactCache(conn)), src, DEST)
            if not result.changed:
                raise RuntimeError(f"{name}: host.copy() did not copy: {result.msg}")

    _parallel(one, names)


def _openssh(fleet: Fleet, name: str, port: str = "-P") -> list[str]:
    """OpenSSH's options for lab host ``name`` (``port``: scp's and sftp's -P, ssh's -p)."""
    hv = fleet.hostvars(name)
    return [
        "-q",
        "-o", "BatchMode=yes",
        "-o", f"UserKnownHostsFile={fleet.known_hosts}",
        "-i", str(hv["ansible_ssh_private_key_file"]),
        port, str(hv["ansible_port"]),
    ]  # fmt: skip


def upload_scp(fleet: Fleet, names: list[str], src: Path) -> None:
    _processes(
        [["scp", *_openssh(fleet, n), str(src), f"root@{fleet.address(n)}:{DEST}"] for n in names]
    )


def upload_sftp(fleet: Fleet, names: list[str], src: Path) -> None:
    commands = []
    for name in names:
        batch = f"put {src} {DEST}\n"
        commands.append(
            (["sftp", *_openssh(fleet, name), "-b", "-", f"root@{fleet.address(name)}"], batch)
        )
    _processes([c for c, _ in commands], [b for _, b in commands])


def upload_ssh_verified(fleet: Fleet, names: list[str], src: Path) -> None:
    """scp's transfer with fxkit's checks, from standard tools: each side hashes in the pass."""
    commands = []
    for name in names:
        remote = shlex.quote(f"tee {DEST} | {SHA256}")
        ssh = shlex.join(["ssh", *_openssh(fleet, name, "-p"), f"root@{fleet.address(name)}"])
        src_ = shlex.quote(str(src))
        script = (
            f"{SHA256} {src_} > {src_}.{name}.sum & "
            f"sent=$({ssh} {remote} < {src_}) && wait $! && read -r local _ < {src_}.{name}.sum "
            f'&& rm -f {src_}.{name}.sum && [ "${{sent%% *}}" = "$local" ] || '
            '{ echo "ssh-verified: the digests differ" >&2; exit 1; }'
        )
        commands.append(["bash", "-c", script])
    _processes(commands)


def _processes(commands: list[list[str]], inputs: list[str] | None = None) -> None:
    procs = [
        subprocess.Popen(c, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
        for c in commands
    ]
    for i, proc in enumerate(procs):
        proc.communicate(inputs[i] if inputs else "")
        if proc.returncode != 0:
            raise RuntimeError(f"{commands[i][0]} failed with rc {proc.returncode}")


def _parallel(work: Callable[[str], None], names: list[str]) -> None:
    with ThreadPoolExecutor(len(names)) as pool:
        for future in [pool.submit(work, n) for n in names]:
            future.result()


UPLOADS = {
    "fxkit": upload_fxkit,
    "fxkit-copy": upload_fxkit_copy,
    "scp": upload_scp,
    "sftp": upload_sftp,
    "ssh-verified": upload_ssh_verified,
}


def check_and_clean(fleet: Fleet, names: list[str], digest: str) -> None:
    """Every host has the whole file (sha256); then it is removed (tmpfs is memory)."""

    def one(name: str) -> None:
        with fleet.connect(name) as conn:
            result = conn.run(f"openssl dgst -sha256 -r {DEST}; rm -f {DEST}")
            if result.stdout.split()[:1] != [digest]:
                raise RuntimeError(f"{name}: wrong content after upload: {result}")

    _parallel(one, names)


def _cpu() -> float:
    """CPU seconds of this process (fxkit runs in it) and of its finished children (scp, sftp
    and the ssh each runs)."""
    own, children = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def run(args: argparse.Namespace) -> dict:
    fleet = Fleet(args.lab_dir, args.prefix)
    rows: dict[tuple[int, int, str], list[tuple[float, float]]] = {}
    try:
        fleet.up(max(args.hosts))
        for round_ in range(args.runs):
            for size in args.sizes:
                src = source_file(args.data_dir, size)
                digest = hashlib.sha256(src.read_bytes()).hexdigest()
                for count in args.hosts:
                    names = [f"lab{i:02d}" for i in range(1, count + 1)]
                    shift = round_ % len(args.tools)
                    for tool in args.tools[shift:] + args.tools[:shift]:
                        cpu, started = _cpu(), time.perf_counter()
                        UPLOADS[tool](fleet, names, src)
                        seconds, cpu = time.perf_counter() - started, _cpu() - cpu
                        check_and_clean(fleet, names, digest)
                        rows.setdefault((size, count, tool), []).append((seconds, cpu))
                        print(
                            f"round {round_ + 1}: {size / 2**20:6.0f} MiB x {count} hosts "
                            f"{tool:10s} {seconds:7.2f} s, controller CPU {cpu:6.2f} s",
                            flush=True,
                        )
    finally:
        fleet.down()
    return report(rows, args)


def report(
    rows: dict[tuple[int, int, str], list[tuple[float, float]]], args: argparse.Namespace
) -> dict:
    results = []
    for (size, count, tool), measured in sorted(rows.items()):
        median = statistics.median(s for s, _ in measured)
        results.append(
            {
                "size_bytes": size,
                "hosts": count,
                "tool": tool,
                "seconds": [s for s, _ in measured],
                "controller_cpu_s": [c for _, c in measured],
                "median_s": median,
                "median_cpu_s": statistics.median(c for _, c in measured),
                "MB_per_s": size * count / median / 1e6,
            }
        )
    medians = {(r["size_bytes"], r["hosts"], r["tool"]): r["median_s"] for r in results}
    for row in results:
        for base in BASES:
            other = medians.get((row["size_bytes"], row["hosts"], base))
            if other:
                row[f"ratio_to_{base}"] = row["median_s"] / other
    return {
        "benchmark": "upload",
        "command": " ".join(sys.argv),
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "load_before": args.load_before,
        },
        "runs": args.runs,
        "results": results,
    }


def table(result: dict) -> str:
    used = [t for t in TOOLS if any(r["tool"] == t for r in result["results"])]
    ours = [t for t in used if t.startswith("fxkit")]
    ratios = [f"{t} / {base}" for t in ours for base in BASES if base in used]
    lines = [
        "| size | hosts | "
        + " | ".join([*(f"{t} s" for t in used), *ratios, f"controller CPU s: {' / '.join(used)}"])
        + " |",
        "|---|---|" + "---|" * (len(used) + len(ratios) + 1),
    ]
    cells: dict[tuple[int, int], dict[str, dict]] = {}
    for row in result["results"]:
        cells.setdefault((row["size_bytes"], row["hosts"]), {})[row["tool"]] = row
    for (size, hosts), tools in sorted(cells.items()):
        seconds = [f"{tools[t]['median_s']:.2f}" if t in tools else "-" for t in used]
        found = [
            tools.get(t, {}).get(f"ratio_to_{base}") for t in ours for base in BASES if base in used
        ]
        label = f"{size / 2**30:g} GiB" if size >= 2**30 else f"{size / 2**20:g} MiB"
        cpu = " / ".join(f"{tools[t]['median_cpu_s']:.2f}" if t in tools else "-" for t in used)
        cols = [label, str(hosts), *seconds, *(f"{r:.2f}x" if r else "-" for r in found), cpu]
        lines.append("| " + " | ".join(cols) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="10M,100M,1G", help="file sizes: 10M,100M,1G")
    parser.add_argument("--hosts", default="1,8", help="host counts: 1,8")
    parser.add_argument("--runs", type=int, default=3, help="rounds (median)")
    parser.add_argument("--tools", default=",".join(TOOLS), help="subset of " + ",".join(TOOLS))
    parser.add_argument("--json", type=Path, default=REPO / "bench" / "results" / "upload.json")
    parser.add_argument("--lab-dir", type=Path, default=REPO / ".cache" / "bench-upload-lab")
    parser.add_argument("--data-dir", type=Path, default=REPO / ".cache" / "bench-upload-data")
    parser.add_argument("--prefix", default="127.89.0", help="the fleet's addresses (127.x.y)")
    args = parser.parse_args(argv)
    args.sizes = [parse_size(s) for s in args.sizes.split(",")]
    args.hosts = [int(h) for h in args.hosts.split(",")]
    args.tools = [t for t in args.tools.split(",") if t]
    args.load_before = os.getloadavg()
    result = run(args)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1) + "\n")
    print(table(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
