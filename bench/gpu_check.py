#!/usr/bin/env python3
"""Prove the loader's GPU path: exact bytes on the device, and host-to-device GB/s against peers.

Generates a checkpoint (Llama-style bf16/f32 shards, plus one small file with every other dtype
torch has: fp8, f16, f64, integers, bool, scalars, empty tensors) or takes ``--path``; loads it
with ``fxkit.loader.load(path, device=...)`` (the pinned-staging path on CUDA/ROCm) and compares
every tensor's dtype, shape and bytes, on the device, with ``safetensors.torch.load_file(...)``
moved there. Then times, cold (files evicted from the page cache) and warm, in rotated rounds:
fxkit, ``load_file`` + ``.to(device)``, and fastsafetensors on the device when it is importable.
Exits 1 on any mismatch, 2 when there is no CUDA/ROCm device (``--device cpu``: a dry run).

    python bench/gpu_check.py --size 2GB --json out.json
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from fxkit.loader import cache, load, make_checkpoint, open_checkpoint
from fxkit.loader.files import model_files
from rich.console import Console
from rich.table import Table
from safetensors.torch import load_file, save_file

from fxkit.cli.loader import parse_size

Tensors = dict[str, torch.Tensor]
NO_DEVICE = 2
MODES = ("cold", "warm")


def dtype_tensors() -> Tensors:
    """One tensor per dtype beyond bf16/f32, with awkward shapes: fp8 (incl. -0), scalars, empty."""
    g = torch.Generator().manual_seed(1)
    base = torch.randn(4099, generator=g)
    tensors: Tensors = {
        "dtypes.bool": torch.rand(513, generator=g) > 0.5,
        "dtypes.u8": torch.randint(0, 256, (3, 5, 7), generator=g, dtype=torch.uint8),
        "dtypes.i8": torch.randint(-128, 128, (1001,), generator=g, dtype=torch.int8),
        "dtypes.i16": torch.randint(-(2**15), 2**15, (77, 3), generator=g, dtype=torch.int16),
        "dtypes.i32": torch.randint(-(2**31), 2**31 - 1, (999,), generator=g, dtype=torch.int32),
        "dtypes.i64": torch.randint(-(2**62), 2**62, (65,), generator=g, dtype=torch.int64),
        "dtypes.f16": base.half(),
        "dtypes.f64": base[:1023].double(),
        "dtypes.scalar_f32": torch.tensor(3.25),
        "dtypes.empty_bf16": torch.empty(0, 16, dtype=torch.bfloat16),
    }
    for name in ("float8_e4m3fn", "float8_e5m2"):
        if hasattr(torch, name):
            values = torch.cat([base, torch.tensor([-0.0, 0.0])])
            tensors[f"dtypes.{name}"] = values.to(getattr(torch, name))
    return tensors


def generate(directory: Path, size: int) -> list[Path]:
    """A checkpoint of about ``size`` bytes and the extra dtypes file; its files in load order."""
    make_checkpoint(directory, size)
    extra = directory / "dtypes.safetensors"
    save_file(dtype_tensors(), str(extra), {"format": "pt"})
    return [*model_files(directory).files, extra]


def resolve_device(name: str) -> torch.device:
    """The device to load to, with its index (``cuda`` -> ``cuda:0``); exits 2 without a GPU."""
    device = torch.device(name)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "no CUDA/ROCm support"
            if getattr(torch.version, "hip", None):
                build = f"ROCm {torch.version.hip}"
            print(
                f"gpu_check: no CUDA/ROCm device: torch {torch.__version__} ({build}) sees none; "
                "run it on a machine with a GPU, or pass --device cpu for a dry run",
                file=sys.stderr,
            )
            sys.exit(NO_DEVICE)
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
    return device


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def compare(expected: Tensors, got: Tensors, device: torch.device) -> list[str]:
    """Every difference between two loads: names, device, dtype, shape, bytes (on the device)."""
    problems = [f"{name}: missing" for name in expected.keys() - got.keys()]
    problems += [f"{name}: not in the checkpoint" for name in got.keys() - expected.keys()]
    for name in sorted(expected.keys() & got.keys()):
        want, have = expected[name], got[name]
        if have.device != device:
            problems.append(f"{name}: on {have.device}, not {device}")
        elif have.dtype != want.dtype:
            problems.append(f"{name}: dtype {have.dtype}, expected {want.dtype}")
        elif have.shape != want.shape:
            problems.append(f"{name}: shape {tuple(have.shape)}, expected {tuple(want.shape)}")
        else:
            a = want.contiguous().reshape(-1).view(torch.uint8)
            b = have.contiguous().reshape(-1).view(torch.uint8)
            if not torch.equal(a, b):
                first = int((a != b).nonzero()[0])
                problems.append(f"{name}: bytes differ (first at byte {first})")
    return problems


def _baseline(files: list[Path], device: torch.device) -> Tensors:
    out: Tensors = {}
    for file in files:
        out.update((k, v.to(device)) for k, v in load_file(file).items())
    return out


def _fxkit(files: list[Path], device: torch.device) -> Tensors:
    return load([str(f) for f in files], device=device)


def _fastsafetensors(files: list[Path], device: torch.device) -> Tensors:
    fastsafe_open = importlib.import_module("fastsafetensors").fastsafe_open  # no type stubs
    # Tensors keep their buffers after the context closes (fastsafetensors >= 0.5).
    with fastsafe_open([str(f) for f in files], device=str(device), nogds=True) as st:
        names = st.keys()  # a method of fastsafe_open, not a dict
        return {name: st.get_tensor(name) for name in names}


def methods() -> dict[str, Callable[[list[Path], torch.device], Tensors]]:
    found: dict[str, Callable[[list[Path], torch.device], Tensors]] = {
        "fxkit": _fxkit,
        "load_file+to": _baseline,
    }
    if importlib.util.find_spec("fastsafetensors") is not None:
        found["fastsafetensors"] = _fastsafetensors
    return found


def prepare(files: list[Path], mode: str) -> int:
    """Evict (cold) or read in (warm) the files; the bytes that did not go, or did not stay."""
    left = cache.evict_all(files) if mode == "cold" else cache.warm(files)
    return sum(left.values())


def timed_run(
    method: str, files: list[Path], device: torch.device, expected: Tensors, mode: str
) -> dict[str, Any]:
    """One timed load (until the device has every byte), then its comparison with ``expected``."""
    run: dict[str, Any] = {"method": method, "mode": mode, "unsettled_bytes": prepare(files, mode)}
    try:
        sync(device)
        start = time.perf_counter()
        got = methods()[method](files, device)
        sync(device)
        run["seconds"] = time.perf_counter() - start
    except Exception as exc:  # a peer that cannot load this checkpoint is reported, not fatal
        run["error"] = f"{type(exc).__name__}: {exc}"
        return run
    run["mismatches"] = compare(expected, got, device)
    del got
    return run


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({platform.processor() or platform.machine()}, dry run)"


def summarise(runs: list[dict[str, Any]], nbytes: int) -> dict[str, dict[str, Any]]:
    """Per mode and method: median GB/s, and fxkit's median ratio against it within rounds."""
    summary: dict[str, dict[str, Any]] = {}
    for mode in MODES:
        timed = [r for r in runs if r["mode"] == mode and "seconds" in r]
        for r in timed:
            r["gbps"] = nbytes / r["seconds"] / 1e9
        summary[mode] = {}
        for method in dict.fromkeys(r["method"] for r in runs if r["mode"] == mode):
            mine = [r for r in timed if r["method"] == method]
            ratios = [
                r["seconds"] / f["seconds"]
                for r in mine
                for f in timed
                if f["method"] == "fxkit" and f["round"] == r["round"]
            ]
            summary[mode][method] = {
                "gbps": statistics.median(r["gbps"] for r in mine) if mine else None,
                "fxkit_x": statistics.median(ratios) if ratios else None,
                "runs": len(mine),
                "errors": sorted(
                    {r["error"] for r in runs if r["method"] == method and "error" in r}
                ),
            }
    return summary


def render(report: dict[str, Any], console: Console) -> None:
    table = Table(title=f"host-to-device load, {report['device_name']}, {report['gb']:.2f} GB")
    for column in ("mode", "method", "GB/s (median)", "fxkit is", "runs", "notes"):
        table.add_column(column)
    for mode, rows in report["summary"].items():
        for method, s in rows.items():
            gbps = f"{s['gbps']:.2f}" if s["gbps"] is not None else "-"
            ratio = f"{s['fxkit_x']:.2f}x" if s["fxkit_x"] is not None and method != "fxkit" else ""
            table.add_row(mode, method, gbps, ratio, str(s["runs"]), "; ".join(s["errors"])[:80])
    console.print(table)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--path", type=Path, help="an existing checkpoint (default: generate one)")
    parser.add_argument("--size", type=parse_size, default="512MB", help="generated checkpoint")
    parser.add_argument("--device", default="cuda", help="cuda, cuda:N (ROCm too), or cpu")
    parser.add_argument("--runs", type=int, default=3, help="rounds per mode (cold, warm)")
    parser.add_argument("--json", type=Path, help="write the full report here")
    args = parser.parse_args(argv)
    device = resolve_device(args.device)
    console = Console()
    workdir = Path(tempfile.mkdtemp(prefix="fxkit-gpu-check-")) if args.path is None else None
    try:
        files = generate(workdir, args.size) if workdir else model_files(args.path).files
        checkpoint = open_checkpoint([str(f) for f in files])
        nbytes = checkpoint.total_bytes
        console.print(f"{len(files)} files, {nbytes / 1e9:.2f} GB, on {device_name(device)}")
        expected = _baseline(files, device)  # the reference: load_file, moved to the device
        if device.type == "cpu":  # there, still load_file's mmap: it would pin the page cache
            expected = {name: tensor.clone() for name, tensor in expected.items()}
        sync(device)
        names = list(methods())
        smallest = [min(files, key=lambda f: f.stat().st_size)]
        for method in names:  # one-time setup (CUDA libraries, pinned pools) stays off the clock
            timed_run(method, smallest, device, {}, "warm")
        runs: list[dict[str, Any]] = []
        for mode in MODES:
            for round_ in range(args.runs):
                for method in names[round_ % len(names) :] + names[: round_ % len(names)]:
                    run = timed_run(method, files, device, expected, mode)
                    run["round"] = round_
                    runs.append(run)
                    result = run.get("error") or f"{nbytes / run['seconds'] / 1e9:.2f} GB/s"
                    console.print(
                        f"{mode} round {round_ + 1} {method:<16} {result}", highlight=False
                    )
        mismatches = {r["method"]: r["mismatches"] for r in runs if r.get("mismatches")}
        report = {
            "device": str(device),
            "device_name": device_name(device),
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "hip": getattr(torch.version, "hip", None),
            "checkpoint": str(args.path or workdir),
            "files": len(files),
            "tensors": len(expected),
            "dtypes": sorted({str(t.dtype) for t in expected.values()}),
            "bytes": nbytes,
            "gb": nbytes / 1e9,
            "runs": runs,
            "summary": summarise(runs, nbytes),
            "mismatches": mismatches,
            "ok": not mismatches and not any("error" in r for r in runs if r["method"] == "fxkit"),
        }
    finally:
        if workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    render(report, console)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    for method, problems in mismatches.items():
        console.print(f"[red]{method}: {len(problems)} mismatches[/], first: {problems[:5]}")
    if device.type == "cpu":
        console.print(
            "dry run: on the CPU, load_file + .to() is an untouched mmap; no timing holds"
        )
    if report["ok"]:
        console.print(f"every tensor identical: {len(expected)} tensors, {report['dtypes']}")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
