#!/usr/bin/env python3
"""Expert parallelism under vLLM: what a rank reads, with vLLM's own loader and with fxkit's.

Generates a MoE checkpoint (git-ignored, under .cache/bench/vllm-ep/), then loads it as each of
8 EP ranks would (vLLM's linear placement: a rank owns 1/8 of the experts), each run cold (the
files evicted from the page cache first) in a fresh process, methods interleaved and rotated by
round. Every method runs vLLM's real ``DefaultModelLoader.load_weights`` from the vLLM sdist
(tests/vllm_source.py: vLLM's own loader source with its GPU-bound imports stubbed), with vLLM's
real ``_init_ep_weight_filter`` computing the rank's experts:

- ``vllm-ep``: ``--load-format auto``: vLLM's ``safetensors_weights_iterator`` skipping the
  experts the rank does not own (``safe_open``: an mmap; only the pages of kept tensors fault in);
- ``fxkit-ep``: ``--load-format fxkit``: the plugin, reading the byte ranges of kept tensors;
- ``fxkit-all``: ``--load-format fxkit`` with EP off: every rank reads every expert.

Bytes read are the process's storage reads (``read_bytes`` in /proc/self/io: mmap faults and
O_DIRECT reads alike); every yielded tensor is touched at every page (fxkit.loader.touch).

    python bench/vllm_ep.py [--experts 64] [--layers 8] [--expert-mib 2] [--rounds 3]
        [--vllm 0.20.1] [--extra '{"chunk_size": 8388608}'] [-o docs/bench/vllm_ep.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
import types
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # tests/vllm_source.py runs vLLM's real loader source

RANKS = 8
METHODS = ("vllm-ep", "fxkit-ep", "fxkit-all")


def read_bytes() -> int:
    return int(Path("/proc/self/io").read_text().split("read_bytes: ")[1].split()[0])


def generate(root: Path, experts: int, layers: int, expert_mib: int) -> list[Path]:
    """A MoE in vLLM's naming: per layer attention and a router, and per expert gate, up and down
    projections (bf16), one shard per two layers, with an index."""
    import torch
    from safetensors.torch import save_file

    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text("{}")
    g = torch.Generator().manual_seed(0)
    rows = expert_mib * (1 << 20) // 2 // 1024  # bf16 rows of 1024
    shards, weight_map = [], {}
    for first in range(0, layers, 2):
        tensors = {}
        for layer in range(first, min(first + 2, layers)):
            p = f"model.layers.{layer}."
            tensors[p + "self_attn.qkv_proj.weight"] = torch.randn(3072, 1024, generator=g)
            tensors[p + "mlp.gate.weight"] = torch.randn(experts, 1024, generator=g)
            for e in range(experts):
                for proj in ("gate_proj", "up_proj", "down_proj"):
                    tensors[p + f"mlp.experts.{e}.{proj}.weight"] = torch.randn(
                        rows, 1024, generator=g
                    ).to(torch.bfloat16)
        name = f"model-{first // 2 + 1:05d}-of-{(layers + 1) // 2:05d}.safetensors"
        save_file(tensors, root / name)
        weight_map.update(dict.fromkeys(tensors, name))
        shards.append(root / name)
    index = {"metadata": {}, "weight_map": weight_map}
    (root / "model.safetensors.index.json").write_text(json.dumps(index))
    return shards


def warm_up(path: Path) -> None:
    """Pay the one-time costs of this process before the clock (torch's lazy imports on a first
    ``frombuffer``, say), for every method alike: a vLLM process has paid them when it loads."""
    import torch
    from fxkit.loader import iter_tensors
    from safetensors import safe_open
    from safetensors.torch import save_file

    if not path.exists():
        save_file({"experts.0.w.weight": torch.ones(4096), "dense": torch.ones(8)}, path)
    for share in (False, True):
        list(iter_tensors(path, keep=lambda name: name == "dense", share=share))
    with safe_open(path, framework="pt") as f:
        [f.get_tensor(k) for k in f.keys()]  # noqa: SIM118 (as vLLM does)


def worker(
    method: str, rank: int, model: str, experts: int, version: str, extra: dict[str, Any]
) -> dict[str, Any]:
    """One rank's load in this process: vLLM's real load_weights, timed from its call."""
    import torch
    import vllm_source
    from fxkit.loader import touch, vllm_plugin

    class Model(torch.nn.Module):
        def load_weights(self, weights: Any) -> set[str]:
            self.tensors = self.nbytes = self.sum = 0
            for _, tensor in weights:
                self.tensors += 1
                self.nbytes += tensor.numel() * tensor.element_size()
                self.sum += touch(tensor)
            return set()

    warm_up(Path(model).parent / "warm-up.safetensors")
    workdir = ROOT / ".cache/bench/vllm-src"
    with vllm_source.running(version, workdir) as vllm:
        vllm_plugin.register()
        vllm.parallel.set(ep_size=1 if method == "fxkit-all" else RANKS, ep_rank=rank)
        fmt = "auto" if method == "vllm-ep" else vllm_plugin.LOAD_FORMAT
        cls = vllm.registered.get(fmt, vllm.DefaultModelLoader)
        extra = extra if fmt == vllm_plugin.LOAD_FORMAT else {}
        config = vllm.LoadConfig(
            load_format=fmt, use_tqdm_on_load=False, model_loader_extra_config=extra
        )
        loader = cls(config)
        model_config = types.SimpleNamespace(
            model=model, revision=None, quantization=None, is_moe=True,
            get_num_experts=lambda: experts, multimodal_config=None,
        )  # fmt: skip
        target = Model()
        before, start = read_bytes(), time.perf_counter()
        loader.load_weights(target, model_config)
        seconds = time.perf_counter() - start
        read = read_bytes() - before
    return {
        "method": method,
        "rank": rank,
        "seconds": seconds,
        "read_bytes": read,
        "tensors": target.tensors,
        "tensor_bytes": target.nbytes,
        "sum": target.sum,
    }


def run_one(method: str, rank: int, args: argparse.Namespace, files: list[Path]) -> dict:
    from fxkit.loader import cache

    left = cache.evict_all(files)
    command = [sys.executable, __file__, "--worker", method, str(rank), str(args.model)]
    command += ["--experts", str(args.experts), "--vllm", args.vllm, "--extra", args.extra]
    out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    result = json.loads(out.splitlines()[-1])
    result["resident_before"] = sum(left.values())
    return result


def summarise(runs: list[dict], files: list[Path]) -> dict[str, Any]:
    total = sum(f.stat().st_size for f in files)
    out: dict[str, Any] = {"checkpoint_bytes": total, "methods": {}}
    for method in METHODS:
        mine = [r for r in runs if r["method"] == method]
        per_round: dict[int, list[dict]] = {}
        for r in mine:
            per_round.setdefault(r["round"], []).append(r)
        rank_sums = [sum(r["seconds"] for r in rs) for rs in per_round.values()]
        out["methods"][method] = {
            "median_rank_seconds": statistics.median(r["seconds"] for r in mine),
            "median_8_ranks_seconds": statistics.median(rank_sums),
            "read_bytes_per_rank": statistics.median(r["read_bytes"] for r in mine),
            "read_bytes_8_ranks": statistics.median(
                sum(r["read_bytes"] for r in rs) for rs in per_round.values()
            ),
            "tensor_bytes_per_rank": statistics.median(r["tensor_bytes"] for r in mine),
        }
    sums = {(r["round"], r["rank"], r["method"]): r["sum"] for r in runs}
    for (rnd, rank, method), value in sums.items():
        if method == "fxkit-ep":
            assert value == sums[(rnd, rank, "vllm-ep")], "fxkit's tensors differ from vLLM's"
    ratios = {}
    for other in ("vllm-ep", "fxkit-all"):
        per = []
        for rnd in {r["round"] for r in runs}:
            t = {m: sum(r["seconds"] for r in runs if r["round"] == rnd and r["method"] == m)
                 for m in ("fxkit-ep", other)}  # fmt: skip
            per.append(t[other] / t["fxkit-ep"])
        ratios[f"{other} / fxkit-ep (time, 8 ranks)"] = statistics.median(per)
    out["ratios"] = ratios
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worker", nargs=3, metavar=("METHOD", "RANK", "MODEL"))
    parser.add_argument("--experts", type=int, default=64)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--expert-mib", type=int, default=1, help="MiB per expert projection")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--vllm", default="0.20.1", help="the vLLM sdist whose loader runs")
    parser.add_argument("--extra", default="{}", help="fxkit's --model-loader-extra-config (JSON)")
    parser.add_argument("--model", type=Path, default=ROOT / ".cache/bench/vllm-ep/model")
    parser.add_argument("-o", "--output", type=Path, default=ROOT / "docs/bench/vllm_ep.json")
    args = parser.parse_args()
    if args.worker:
        method, rank, model = args.worker
        extra = json.loads(args.extra)
        print(json.dumps(worker(method, int(rank), model, args.experts, args.vllm, extra)))
        return
    files = sorted(args.model.glob("*.safetensors"))
    if not files:
        files = generate(args.model, args.experts, args.layers, args.expert_mib)
    runs = []
    for rnd in range(args.rounds):
        order = METHODS[rnd % 3 :] + METHODS[: rnd % 3]
        for rank in range(RANKS):
            for method in order:
                result = run_one(method, rank, args, files)
                result["round"] = rnd
                runs.append(result)
                print(json.dumps(result), flush=True)
    report = {
        "vllm": args.vllm,
        "ranks": RANKS,
        "experts": args.experts,
        "extra_config": json.loads(args.extra),
        "runs": runs,
    }
    report["summary"] = summarise(runs, files)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report["summary"], indent=1))


if __name__ == "__main__":
    main()
