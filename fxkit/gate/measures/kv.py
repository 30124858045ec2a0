"""``kv_bench``: the KV tier's cold read through LMCache's own disk backend, on the node.

    measure: {kv_bench: {folders: /mnt/fx/lmcache, model: /mnt/models/Qwen3/config.json,
                         threads: 4, odirect: false, fxkit: /opt/fxkit/venvs/default/bin/fxkit}}

Runs ``fxkit bench kv FOLDERS --json -`` on the host (docs/kv-tier.md): LMCache's
``LocalDiskBackend`` writes chunks shaped like the model's KV, evicts them and reads them back
through ``batched_get_blocking`` at the given ``disk_io_threads`` and ``use_odirect`` (the role's
settings), beside fio reading the same files. ``fxkit`` must start an fxkit that imports LMCache:
the role's venv (roles/vllm_lmcache installs both there). Gives ``best_gbps`` (GB/s, decimal,
all workers together), ``fio_best_gbps``, ``x_fio_best`` (their ratio, median over rounds),
``threads1_gbps`` and ``x_threads1`` where threads 1 was swept, ``cold`` and the settings.
"""

from __future__ import annotations

import json
import shlex
from typing import Any

from pydantic import Field

from fxkit.gate.measure import MeasuredHost, MeasureError, Params, kind


class KvBenchParams(Params):
    #: The KV folder(s) on the node: a list, or LMCache's comma-joined ``local_disk``.
    folders: list[str] | str
    #: The model's config.json on the node (its KV shape); or ``inputs``.
    model: str = ""
    #: fxkit estimate's inputs file on the node (model, TP size, context).
    inputs: str = ""
    #: Estimator inputs ``KEY=VALUE`` (``gpu.tensor_parallel=8``).
    sets: list[str] = Field(default_factory=list)
    #: ``disk_io_threads`` to read with: one number or several (``1,4``).
    threads: int | str = 4
    #: ``use_odirect``; null: both.
    odirect: bool | None = False
    chunk_size: int = Field(default=256, gt=0)
    #: KV bytes written, all workers together.
    size: str = "4 GiB"
    #: GPU workers reading at once, each its own LMCache engine.
    workers: int = Field(default=1, gt=0)
    rounds: int = Field(default=3, gt=0)
    #: How fxkit is started on the host, in an environment with LMCache.
    fxkit: str = "fxkit"


def folder_list(folders: list[str] | str) -> list[str]:
    """The folders as a list (a string is LMCache's comma-joined form; ``file://`` dropped)."""
    items = folders.split(",") if isinstance(folders, str) else folders
    return [f.strip().removeprefix("file://") for f in items if f.strip()]


def kv_argv(p: KvBenchParams) -> list[str]:
    """``fxkit bench kv``'s command line for ``p``, JSON on stdout."""
    folders = folder_list(p.folders)
    if not folders:
        raise MeasureError("no KV folder to measure (the role's vllm_lmcache_local_disk is empty)")
    if not p.model and not p.inputs:
        raise MeasureError("no model to shape the KV chunks (give model: a config.json, or inputs)")
    argv = [*shlex.split(p.fxkit), "bench", "kv", *folders]
    argv += ["--inputs", p.inputs] if p.inputs else []
    argv += ["--model", p.model] if p.model else []
    for item in p.sets:
        argv += ["--set", item]
    odirect = "both" if p.odirect is None else ("on" if p.odirect else "off")
    argv += ["--threads", str(p.threads), "--odirect", odirect, "--chunk-size", str(p.chunk_size)]
    argv += ["--size", p.size, "--workers", str(p.workers), "--rounds", str(p.rounds)]
    return [*argv, "--json", "-"]


@kind("kv_bench", KvBenchParams)
def kv_bench(node: MeasuredHost, p: KvBenchParams) -> dict[str, Any]:
    """LMCache's cold read of the KV folder(s) (``fxkit bench kv``): GB/s and ratio to fio."""
    argv = kv_argv(p)
    node.require(argv[0])
    return parse_kv_report(node.output(" ".join(shlex.quote(a) for a in argv)))


def parse_kv_report(text: str) -> dict[str, Any]:
    """``fxkit bench kv --json``'s report as the figures a check judges."""
    try:
        report = json.loads(text[text.find("{") :])
        summary = report["summary"]
        kind_ = report["kind"]
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise MeasureError(
            f"fxkit bench kv printed no JSON report ({exc}): {text[:120]!r}"
        ) from None
    if kind_ != "fxkit-bench-kv":
        raise MeasureError(f"not an fxkit bench kv report (kind {kind_!r})")
    if "error" in summary:
        raise MeasureError(f"fxkit bench kv: {summary['error']}: {summary.get('errors')}")
    figures = ("best_gbps", "fio_best_gbps", "x_fio_best", "threads1_gbps", "x_threads1")
    return {
        **{key: summary.get(key) for key in figures},
        "best": summary["best"],
        "cold": summary.get("cold"),
        "role_vars": summary.get("role_vars", {}),
        "lmcache": report.get("lmcache"),
        "folders": report.get("folders"),
        "filesystems": report.get("filesystems"),
        "chunk_bytes": report.get("chunk", {}).get("nbytes"),
        "notes": report.get("notes", []),
    }
