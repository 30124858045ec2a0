"""``fxkit bench ...``: benchmarks that compare fxkit with baselines and peers in one run."""

from __future__ import annotations

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
    """
    from fxkit.loader.bench import FIO_SWEEP, METHODS, fio_grid, render, save_json
    from fxkit.loader.bench import bench as run_bench

    console = Console()

    names = list(METHODS) if methods == "all" else [m.strip() for m in methods.split(",")]
    report = run_bench(
        model,
        names,
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
