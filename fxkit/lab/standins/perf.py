"""Benchmarks of AMD's acceptance checklist: TransferBench, rocblas-bench, hip-stream
(BabelStream), all_reduce_perf (rccl-tests).

all_reduce_perf prints the profile's recorded real run (``rccl_all_reduce.txt``: two 8 x MI308X
nodes, ROCm 7.2.0), its rows between ``-b`` and ``-e``. The others print the figures of the
profile's ``bench.json`` (illustrative, not measurements: SOURCES.md) in the tools' own formats
(TransferBench.cpp's RunAllToAllBenchmark, RunPeerToPeerBenchmarks and ReportResults;
rocBLAS's CSV result line; BabelStream's "Function MBytes/sec" table). Every figure is scaled
by the host's factor: a few per cent that differ from host to host (from its hostname), times
the profile's ``perf.scale`` (a variant's slow node: 0.7).
"""

from __future__ import annotations

import json
import re
import socket
import zlib
from pathlib import Path
from typing import Any

from .common import Profile, Tool, fail


def factor(p: Profile) -> float:
    """This host's performance: 0.961-1.0 by its hostname, times the profile's perf.scale."""
    spread = zlib.crc32(socket.gethostname().encode()) % 40 / 1000
    return (1 - spread) * float(p.get("perf", {}).get("scale", 1.0))


def _bench(p: Profile) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((p["dir"] / "bench.json").read_text())
    return data


def transferbench(p: Profile, args: list[str], stdin: str, entry: dict[str, Any]) -> int:
    tb, k = _bench(p)["transferbench"], factor(p)
    gpus = len(p["gpus"]["bdfs"])
    if args[:1] == ["a2a"]:
        print(_a2a(tb["a2a_gbps"] * k, gpus))
    elif args[:1] == ["p2p"]:
        print(_p2p(tb, k))
    elif args and Path(args[0]).is_file():
        print(_config(tb["tests"], Path(args[0]), k))
    else:
        fail("TransferBench", "the lab's TransferBench answers a2a, p2p and a config file", 2)
    return 0


def _a2a(bw: float, gpus: int) -> str:
    pairs = gpus * (gpus - 1)
    out = [
        "GPU-GFX All-To-All benchmark:",
        "==========================",
        f"- Copying 268435456 bytes between directly connected pairs of GPUs using 8 CUs "
        f"({pairs} Transfers)",
        "",
        "Summary:",
        "==========================================================",
        "SRC\\DST " + "".join(f" GPU {d:02d}    " for d in range(gpus)) + "    STotal      Actual",
    ]
    for src in range(gpus):
        cells = "".join(f" {'N/A' if src == d else f'{bw:.3f}':>8}  " for d in range(gpus))
        out.append(f"GPU {src:02d}{cells}    {bw * (gpus - 1):8.3f}    {bw:8.3f}")
    total = bw * pairs
    out += [
        "",
        "RTotal"
        + "".join(f" {bw * (gpus - 1):8.3f}  " for _ in range(gpus))
        + f"    {total:8.3f}    {bw:8.3f}    {bw:8.3f}",
        "",
        f"Average   bandwidth (GPU Timed): {bw:8.3f} GB/s",
        f"Aggregate bandwidth (GPU Timed): {total:8.3f} GB/s",
        f"Aggregate bandwidth (CPU Timed): {total * 0.97:8.3f} GB/s",
    ]
    return "\n".join(out)


def _p2p(tb: dict[str, Any], k: float) -> str:
    columns = ["CPU->CPU", "CPU->GPU", "GPU->CPU", "GPU->GPU"]
    out = []
    for name, key in (("UniDir", "p2p_gbps"), ("BiDir", "p2p_bidir_gbps")):
        values = [tb[key][c] for c in columns]
        cells = "".join(f"{'N/A' if v is None else f'{v * k:.2f}':>10}" for v in values)
        out += [
            f"{'Unidirectional' if name == 'UniDir' else 'Bidirectional'} copy peak bandwidth GB/s",
            " " * 25 + "".join(f"  {c}" for c in columns),
            f"Averages (During {name if name == 'UniDir' else ' BiDir'}):{cells}",
            "",
        ]
    return "\n".join(out)


def _config(tests: dict[str, Any], path: Path, k: float) -> str:
    lines = [s for s in path.read_text().splitlines() if s.strip() and not s.startswith("#")]
    out = []
    for number in range(1, len(lines) + 1):
        recorded = tests.get(str(number))
        if recorded is None:
            fail("TransferBench", f"the lab's profile has no figures for test {number} of {path}")
        out.append(f"Test {number}:")
        for index, (src, exe, dst, bw) in enumerate(recorded):
            ms = 268435456 / (bw * k * 1e6)
            out.append(
                f" Executor: {exe[:3]} {exe[3:5]} | {bw * k:7.3f} GB/s | {ms:8.3f} ms | "
                f"   268435456 bytes | {bw * k:<7.3f} GB/s (sum)"
            )
            out.append(
                f"     Transfer {index:02d}  | {bw * k:7.3f} GB/s | {ms:8.3f} ms | "
                f"   268435456 bytes | {src} -> {exe} -> {dst}"
            )
        total = sum(bw * k for *_, bw in recorded)
        out.append(f" Aggregate (CPU)  | {total:7.3f} GB/s | {1:8.3f} ms | Overhead: 0.000 ms")
    return "\n".join(out)


def rocblas_bench(p: Profile, args: list[str], stdin: str, entry: dict[str, Any]) -> int:
    figures = _bench(p)["rocblas_gflops"]
    kind = _arg(args, "--a_type") or ("gemm" if _arg(args, "-f") == "gemm" else "")
    if kind not in figures:
        fail("rocblas-bench", f"the lab's rocblas-bench has no figure for {args}", 2)
    m, n, k = (_arg(args, f"-{x}") for x in "mnk")
    gflops = figures[kind] * factor(p)
    us = 2 * int(m or 1) * int(n or 1) * int(k or 1) / (gflops * 1e3)
    print("rocBLAS info: lab stand-in\nQuery device success: there are 1 devices")
    print(f"Device ID 0 : {p['gpus']['market_name']} {p['gpus']['gfx']}:sramecc+:xnack-\n")
    print("transA,transB,M,N,K,alpha,lda,beta,ldb,ldc,rocblas-Gflops,us")
    ta, tb = _arg(args, "--transposeA") or "N", _arg(args, "--transposeB") or "N"
    lda, ldb, ldc = (_arg(args, f"--ld{x}") or "0" for x in "abc")
    alpha, beta = _arg(args, "--alpha") or "1", _arg(args, "--beta") or "0"
    print(f"{ta},{tb},{m},{n},{k},{alpha},{lda},{beta},{ldb},{ldc},{gflops:.1f},{us:.2f}")
    return 0


def _arg(args: list[str], name: str) -> str | None:
    return args[args.index(name) + 1] if name in args[:-1] else None


def hip_stream(p: Profile, args: list[str], stdin: str, entry: dict[str, Any]) -> int:
    device = int(_arg(args, "--device") or 0)
    if device >= len(p["gpus"]["bdfs"]):
        fail("", f"Invalid device index: {device}")
    size = int(_arg(args, "-s") or 33554432)
    mb = size * 8 / 1e6
    print("BabelStream\nVersion: 4.0\nImplementation: HIP")
    print(f"Running kernels {_arg(args, '-n') or 100} times\nPrecision: double")
    print(f"Array size: {mb:.1f} MB (={mb / 1000:.1f} GB)")
    print(f"Total size: {3 * mb:.1f} MB (={3 * mb / 1000:.1f} GB)")
    print(f"Using HIP device {p['gpus']['market_name']}\nDriver: 60342134")
    print(f"{'Function':<12}{'MBytes/sec':<12}{'Min (sec)':<12}{'Max':<12}{'Average':<12}")
    for name, mbps in _bench(p)["babelstream_mbps"].items():
        bw = mbps * factor(p)
        seconds = (3 if name in ("Add", "Triad") else 2) * mb / bw
        row = [f"{bw:.3f}", f"{seconds:.5f}", f"{seconds * 1.02:.5f}", f"{seconds * 1.01:.5f}"]
        print(f"{name:<12}" + "".join(f"{v:<12}" for v in row))
    return 0


_ROW = re.compile(r"^(\s*)(\d+)(\s+\d+\s+\w+\s+\w+\s+-?\d+)((?:\s+\S+){8})\s*$")


def all_reduce_perf(p: Profile, args: list[str], stdin: str, entry: dict[str, Any]) -> int:
    low, high = (_bytes(_arg(args, x) or d) for x, d in (("-b", "8"), ("-e", "128M")))
    k = factor(p)
    for line in (p["dir"] / "rccl_all_reduce.txt").read_text().splitlines():
        row = _ROW.match(line)
        if row:
            if not low <= int(row[2]) <= high:
                continue
            cells = row[4].split()
            for i in (1, 2, 5, 6):  # algbw, busbw (out of place, in place) scaled; times too
                cells[i] = f"{float(cells[i]) * k:.2f}"
            for i in (0, 4):
                cells[i] = f"{float(cells[i]) / k:.1f}"
            line = f"{row[1]}{row[2]}{row[3]}" + "".join(f"{c:>8}" for c in cells)
        elif line.startswith("# Avg bus bandwidth"):
            value = float(line.split(":")[1])
            line = f"# Avg bus bandwidth    : {value * k:.3f} "
        print(line)
    return 0


def _bytes(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper()
    return int(text[:-1]) * units[text[-1]] if text[-1:] in units else int(text)


TOOLS: dict[str, Tool] = {
    "TransferBench": transferbench,
    "rocblas-bench": rocblas_bench,
    "hip-stream": hip_stream,
    "all_reduce_perf": all_reduce_perf,
}
