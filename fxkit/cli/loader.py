"""``fxkit load`` and ``fxkit make-checkpoint``: the model loader's commands.

torch is imported inside the commands, so ``fxkit --help`` stays fast.
"""

from __future__ import annotations

import dataclasses
import re
import signal
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

import click
from rich.console import Console

UNITS = {"": 1, "B": 1, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}


def parse_size(text: str) -> int:
    """``2GB``, ``1.5G``, ``32MiB``, ``4096`` -> bytes (decimal units; ``i`` makes them binary)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(i?)B?\s*", text, re.IGNORECASE)
    if not match:
        raise ValueError(f"not a size: {text!r} (examples: 2GB, 512MiB, 4096)")
    number, unit, binary = match.groups()
    unit = unit.upper()
    scale = 1024 ** "KMGT".index(unit) * 1024 if binary and unit else UNITS[unit]
    return int(float(number) * scale)


class Size(click.ParamType):
    name = "size"

    def convert(
        self, value: str | int, param: click.Parameter | None, ctx: click.Context | None
    ) -> int:
        if isinstance(value, int):
            return value
        try:
            return parse_size(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


def load_options(command: Callable[..., None], **defaults: Any) -> Callable[..., None]:
    """A click option for each of the loader's options (the fields of fxkit.loader.LoadOptions,
    with their ``help`` and ``choices``); ``defaults`` overrides theirs (``fxkit serve-probe``
    shares reads by default)."""
    from fxkit.loader import LoadOptions

    for option in reversed(dataclasses.fields(LoadOptions)):
        flag = "--" + option.name.replace("_", "-")
        help_text = option.metadata["help"]
        default = defaults.get(option.name, option.default)
        if isinstance(default, bool):
            names = f"{flag}/--no-{flag[2:]}" if default else flag
            decorator = click.option(names, is_flag=True, default=default, help=help_text)
        elif choices := option.metadata.get("choices"):
            decorator = click.option(
                flag, type=click.Choice(choices), default=default,
                show_default=True, help=help_text,
            )  # fmt: skip
        elif isinstance(default, float):
            decorator = click.option(
                flag, type=click.FloatRange(min=0, min_open=True), default=default,
                show_default=True, help=help_text,
            )  # fmt: skip
        elif option.name == "chunk_size":
            shown = f"{default >> 20}MiB"
            decorator = click.option(
                flag, type=Size(), default=default, show_default=shown, help=help_text
            )
        else:
            decorator = click.option(
                flag, type=click.IntRange(min=1), default=default, show_default=True,
                help=help_text,
            )  # fmt: skip
        command = decorator(command)
    return command


def _terminated(signum: int, frame: FrameType | None) -> None:
    """SIGTERM: exit (128 + signal) through the loader's clean-up, which removes its share state."""
    raise SystemExit(128 + signum)


@click.command()
@click.argument("model", type=click.Path(exists=True))
@click.option("--device", default="cpu", show_default=True, help="cpu, cuda or cuda:N (ROCm too).")
@load_options
def load(model: str, device: str, **options: Any) -> None:
    """Load MODEL (a safetensors file or model directory) and report the speed."""
    import torch

    from fxkit.loader import LoadOptions, open_checkpoint
    from fxkit.loader import load as load_model

    signal.signal(signal.SIGTERM, _terminated)
    checkpoint = open_checkpoint(model)
    started = time.perf_counter()
    tensors = load_model(checkpoint, device, options=LoadOptions(**options))
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - started
    gigabytes = checkpoint.total_bytes / 1e9
    Console().print(
        f"loaded [bold]{len(tensors)}[/] tensors, [bold]{gigabytes:.2f}[/] GB from "
        f"{len(checkpoint.files)} file(s) to {device} in [bold]{seconds:.2f}[/] s: "
        f"[bold green]{gigabytes / seconds:.2f} GB/s[/]",
        highlight=False,
    )


@click.command("make-checkpoint")
@click.argument("directory", type=click.Path(file_okay=False))
@click.option("--size", type=Size(), default="2GB", show_default=True, help="Total tensor bytes.")
@click.option("--layout", type=click.Choice(["llama"]), default="llama", show_default=True)
@click.option("--shards", type=click.IntRange(min=1), help="Files [default: about 1.5 GB each].")
@click.option("--seed", type=int, default=0, show_default=True)
def make_checkpoint(directory: str, size: int, layout: str, shards: int | None, seed: int) -> None:
    """Write a synthetic Llama-style sharded checkpoint (bf16 weights, fp32 norms, index.json)."""
    from fxkit.loader import make_checkpoint as make
    from fxkit.loader import open_checkpoint

    started = time.perf_counter()
    make(directory, size, layout=layout, shards=shards, seed=seed)
    checkpoint = open_checkpoint(directory)
    Console().print(
        f"wrote {len(checkpoint)} tensors, {checkpoint.total_bytes / 1e9:.2f} GB in "
        f"{len(checkpoint.files)} file(s) to {directory} in {time.perf_counter() - started:.1f} s",
        highlight=False,
    )
