"""``fxkit bench ...``: benchmarks that compare fxkit with baselines and peers in one run."""

from __future__ import annotations

from pathlib import Path

import click
import yaml
from rich.console import Console


@click.group()
def bench() -> None:
    """Benchmarks that compare fxkit with baselines and peers in one run."""


def _options(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> dict:
    """``-o KEY=VALUE`` items as the loader's options (checked by LoadOptions)."""
    from fxkit.loader import LoaderError, LoadOptions

    options = {}
    for item in values:
        key, sep, text = item.partition("=")
        if not sep or not key.isidentifier():
            raise click.BadParameter(f"{item!r} is not KEY=VALUE (e.g. threads=8)")
        options[key] = yaml.safe_load(text)
    try:
        LoadOptions.from_mapping(options, where="--fxkit-option")
    except LoaderError as exc:
        raise click.BadParameter(str(exc)) from None
    return options


def _ranks(ctx: click.Context, param: click.Parameter, value: str) -> list[int]:
    """``--ranks 2,4,8`` as whole numbers >= 1."""
    try:
        ranks = [int(n) for n in value.split(",")]
    except ValueError:
        ranks = []
    if not ranks or min(ranks) < 1:
        raise click.BadParameter(f"{value!r} is not a list of whole numbers >= 1 (e.g. 2,4,8)")
    return ranks


@bench.command("load")
@click.argument("model", type=click.Path(exists=True))
@click.option(
    "--cold/--hot",
    default=True,
    show_default=True,
    help="Evict the files from the page cache before every run (verified), or warm them.",
)
@click.option(
    "--runs",
    "-n",
    default=5,
    show_default=True,
    type=click.IntRange(1),
    help="Interleaved rounds; every method runs once per round.",
)
@click.option(
    "--methods",
    "-m",
    default="all",
    show_default=True,
    help="Comma-separated methods (listed above); those not installed are skipped.",
)
@click.option(
    "--fxkit-option",
    "-o",
    "fxkit_options",
    multiple=True,
    callback=_options,
    metavar="KEY=VALUE",
    help="Pass to fxkit.loader.load, e.g. -o threads=8 -o direct_io=false "
    "(the options of fxkit load, with underscores).",
)
@click.option(
    "--ranks",
    default="1",
    show_default=True,
    callback=_ranks,
    metavar="N[,N...]",
    help="Processes loading at once per method (cold); 1 = one process per run. "
    "Several: e.g. 2,4,8.",
)
@click.option(
    "--fio-full",
    is_flag=True,
    help="Sweep fio over every layout x depth (1,4,16,32) x block (1,4,16 MiB), "
    "36 settings, instead of the chosen 8.",
)
@click.option(
    "--json",
    "json_path",
    type=click.Path(dir_okay=False, writable=True),
    help="Also write the full report (every run) as JSON.",
)
def load(
    model: str,
    cold: bool,
    runs: int,
    methods: str,
    fxkit_options: dict,
    ranks: list[int],
    fio_full: bool,
    json_path: str | None,
) -> None:
    """Load MODEL with fxkit and with the baselines and peers, side by side, interleaved.

    \b
    baseline               safetensors.torch.load_file per shard (mmap), every page touched
    prefetch               vLLM's path for network file systems: 8 threads read the files
                           into the page cache in 16 MiB pieces, then load_file
    fxkit                  fxkit.loader.load
    fio                    fio reads of the same files, a sweep of job layouts, depths and
                           block sizes, each cold; the round's fastest is fio-best, the
                           storage limit
    runai                  Run:ai Model Streamer at its defaults (when installed)
    runai-tuned            Run:ai Model Streamer with its documented settings tuned here
    fastsafetensors        fastsafetensors on CPU, nogds, at its defaults (when installed)
    fastsafetensors-tuned  fastsafetensors on CPU, nogds, its knobs tuned here

    \b
    With --ranks N, N processes load MODEL at once per method, cold; the node's time (go to
    the last rank's end), the bytes read from the disk and every rank's RSS are reported:
    baseline               N x load_file; the page cache is shared
    prefetch               vLLM's prefetch per rank (its files[rank::N] read ahead), then
                           load_file
    fxkit                  N x fxkit.loader.load with the -o options
    runai                  Run:ai's distributed streaming (torch.distributed, gloo)
    fastsafetensors        fastsafetensors' process-group loading (gloo)
    """
    from fxkit.loadbench.bench import FIO_SWEEP, METHODS, fio_grid, render, save_json
    from fxkit.loadbench.bench import bench as run_bench

    console = Console()
    if ranks != [1]:
        _load_ranks(model, ranks, runs, methods, cold, fxkit_options, json_path, console)
        return

    report = run_bench(
        model,
        _names(methods, METHODS),
        runs,
        cold,
        fxkit_options,
        on_run=lambda run: console.print(run.line(), highlight=False),
        fio=fio_grid() if fio_full else FIO_SWEEP,
    )
    render(report, console)
    if json_path:
        save_json(report, json_path)
        console.print(f"report: {json_path}")


def _names(methods: str, known: dict) -> list[str]:
    """``--methods``: ``all`` (every known one) or a comma-separated list."""
    return list(known) if methods == "all" else [m.strip() for m in methods.split(",")]


def _load_ranks(
    model: str,
    ranks: list[int],
    runs: int,
    methods: str,
    cold: bool,
    fxkit_options: dict,
    json_path: str | None,
    console: Console,
) -> None:
    """``fxkit bench load --ranks N``: fxkit/loadbench/bench_ranks.py."""
    from fxkit.loadbench.bench import save_json
    from fxkit.loadbench.bench_ranks import RANK_METHODS, bench_ranks, render

    if not cold:
        raise click.BadParameter("--ranks runs cold only", param_hint="--hot")
    report = bench_ranks(
        model,
        ranks,
        _names(methods, RANK_METHODS),
        runs,
        fxkit_options,
        on_run=lambda run: console.print(run.line(), highlight=False),
    )
    render(report, console)
    if json_path:
        save_json(report, json_path)
        console.print(f"report: {json_path}")


@bench.command("kv")
@click.argument("folders", nargs=-1, required=True, type=click.Path(exists=True, file_okay=False))
@click.option(
    "--inputs",
    "inputs_file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="fxkit estimate's inputs (e.g. examples/estimate/qwen3-coder-480b-tp8.yml): the model, "
    "its TP size and the context of the implied TTFT.",
)
@click.option(
    "--model",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="A Hugging Face config.json (replaces the inputs file's model.config).",
)
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE", help="An estimator input.")
@click.option("--chunk-size", default=256, show_default=True, type=click.IntRange(1))
@click.option(
    "--size", default="512 MiB", show_default=True, help="KV bytes written, all workers together."
)
@click.option("--threads", default="1,2,4,8,16,32", show_default=True, callback=_ranks)
@click.option("--odirect", type=click.Choice(["both", "on", "off"]), default="both")
@click.option(
    "--workers",
    default=1,
    show_default=True,
    type=click.IntRange(1),
    help="GPU workers reading at once (the TP size on a node), each its own LMCache engine.",
)
@click.option("--rounds", "-n", default=3, show_default=True, type=click.IntRange(1))
@click.option(
    "--read-via",
    multiple=True,
    type=click.Path(exists=True, file_okay=False),
    help="A mount of each FOLDER (e.g. a remote filesystem) to read the chunks through; LMCache "
    "writes them in FOLDER.",
)
@click.option(
    "--json",
    "json_path",
    type=click.Path(dir_okay=False, writable=True, allow_dash=True),
    help="Also write the report as JSON (-: to stdout, the table to stderr; a gate reads it).",
)
def kv(
    folders: tuple[str, ...], inputs_file: Path | None, model: Path | None,
    sets: tuple[str, ...], chunk_size: int, size: str, threads: list[int], odirect: str,
    workers: int, rounds: int, read_via: tuple[str, ...], json_path: str | None,
) -> None:  # fmt: skip
    """LMCache's disk tier on FOLDERS (several: one per mount, LMCache's by_gpu sharding).

    LMCache's own LocalDiskBackend writes chunks shaped like the model's KV, then reads them
    back cold through batched_get_blocking at each disk_io_threads x use_odirect (x one folder
    or all), beside fio reading the same files (docs/kv-tier.md).
    """
    from fxkit.estimate import collect
    from fxkit.estimate.errors import EstimateError
    from fxkit.estimate.units import parse
    from fxkit.kvbench import KVBenchError, bench, chunk_shape, implied_ttft, sweep
    from fxkit.kvbench_render import render, render_line, save

    console = Console(stderr=json_path == "-")
    try:
        values, _ = collect(inputs_file, model, (), sets)
        chunk = chunk_shape(values, chunk_size)
        total = int(parse(size, "bytes"))
        modes = {"both": [False, True], "on": [True], "off": [False]}[odirect]
        report = bench(
            folders, chunk, total, sweep(threads, modes, len(folders)), workers=workers,
            rounds=rounds, read_via=read_via,
            on_run=lambda run: console.print(render_line(run), highlight=False),
        )  # fmt: skip
        ttft = implied_ttft(values, report)
    except (KVBenchError, EstimateError) as exc:
        raise click.ClickException(str(exc)) from None
    render(report, ttft, console)
    if json_path:
        save(report, ttft, json_path)
        console.print(f"report: {json_path}")
