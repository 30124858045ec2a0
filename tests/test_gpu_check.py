"""bench/gpu_check.py on a machine without a GPU: the clear refusal (exit 2), the CPU dry run of
the whole script on a generated checkpoint, and the byte-for-byte comparison it relies on."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "bench" / "gpu_check.py"


def _load_script() -> types.ModuleType:
    spec = importlib.util.spec_from_file_location("bench_gpu_check", SCRIPT)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


gpu_check = _load_script()
CPU = torch.device("cpu")


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=300
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA/ROCm device")
def test_no_device_exits_2_with_a_clear_message() -> None:
    result = _run("--size", "8MB")
    assert result.returncode == 2, result.stderr
    assert "no CUDA/ROCm device" in result.stderr
    assert "--device cpu" in result.stderr
    assert "Traceback" not in result.stderr


def test_cpu_dry_run_compares_every_tensor_and_writes_json(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    result = _run("--device", "cpu", "--size", "16MB", "--runs", "1", "--json", str(out))
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(out.read_text())
    assert report["ok"] and report["mismatches"] == {}
    # The generated checkpoint: Llama shards (bf16, f32) plus the dtypes file.
    assert {"torch.bfloat16", "torch.float32", "torch.float8_e4m3fn", "torch.float8_e5m2"} <= set(
        report["dtypes"]
    )
    assert {"torch.bool", "torch.int64", "torch.float64"} <= set(report["dtypes"])
    assert report["tensors"] > len(gpu_check.dtype_tensors())
    methods = {r["method"] for r in report["runs"]}
    assert {"fxkit", "load_file+to"} <= methods
    for run in report["runs"]:
        if run["method"] in ("fxkit", "load_file+to"):
            assert "error" not in run and run["mismatches"] == [] and run["seconds"] > 0
            assert run["unsettled_bytes"] == 0  # cold evicted, warm stayed in the page cache
    for mode in ("cold", "warm"):
        assert report["summary"][mode]["fxkit"]["gbps"] > 0
    assert "every tensor identical" in result.stdout


def test_takes_an_existing_checkpoint(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    save_file(gpu_check.dtype_tensors(), str(tmp_path / "model.safetensors"))
    result = _run("--device", "cpu", "--path", str(tmp_path), "--runs", "1")
    assert result.returncode == 0, result.stdout + result.stderr
    assert (tmp_path / "model.safetensors").exists()  # a given checkpoint is never deleted


def test_compare_finds_equal_loads_equal() -> None:
    tensors = gpu_check.dtype_tensors()
    copy = {k: v.clone() for k, v in tensors.items()}
    assert gpu_check.compare(tensors, copy, CPU) == []


def test_compare_is_bytewise_not_by_value() -> None:
    """-0.0 equals 0.0 by value, in fp8 too: only a comparison of bytes sees the difference."""
    fp8 = torch.float8_e4m3fn
    expected = {"w": torch.tensor([0.0, 1.0]).to(fp8), "n": torch.tensor([float("nan")])}
    got = {"w": torch.tensor([-0.0, 1.0]).to(fp8), "n": torch.tensor([float("nan")])}
    assert gpu_check.compare(expected, got, CPU) == ["w: bytes differ (first at byte 0)"]


def test_compare_reports_dtype_shape_names_and_device() -> None:
    expected = {
        "a": torch.zeros(4, dtype=torch.bfloat16),
        "b": torch.zeros(2, 3),
        "c": torch.zeros(1),
    }
    got = {
        "a": torch.zeros(4, dtype=torch.float16),
        "b": torch.zeros(3, 2),
        "d": torch.zeros(1),
    }
    problems = gpu_check.compare(expected, got, CPU)
    assert sorted(problems) == [
        "a: dtype torch.float16, expected torch.bfloat16",
        "b: shape (3, 2), expected (2, 3)",
        "c: missing",
        "d: not in the checkpoint",
    ]
    meta = {"a": torch.zeros(4, dtype=torch.bfloat16, device="meta")}
    assert gpu_check.compare({"a": expected["a"]}, meta, CPU) == ["a: on meta, not cpu"]
