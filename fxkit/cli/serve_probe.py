"""``fxkit serve-probe``: load a checkpoint, then answer vLLM's health, models and metrics routes.

The flags that ``vllm serve`` also has are spelled as vLLM spells them, so one instance command
line drives either.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import click

from fxkit.cli.loader import load_options
from fxkit.serve_probe import LOAD_FORMATS


@click.command("serve-probe")
@click.argument("model")
@click.option("--port", type=click.IntRange(0, 65535), required=True, help="Port to listen on.")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--served-model-name", help="The name /v1/models lists [default: MODEL].")
@click.option(
    "--load-format", type=click.Choice(LOAD_FORMATS), default="fxkit", show_default=True,
    help="fxkit's loader, or safetensors.torch.load_file per file (the baseline; the loader "
    "options below apply to fxkit only).",
)  # fmt: skip
@partial(load_options, share=True)
def serve_probe(
    model: str,
    port: int,
    host: str,
    served_model_name: str | None,
    load_format: str,
    **options: Any,
) -> None:
    """Load MODEL (a model directory or safetensors file) into memory, then serve /health,
    /v1/models and /metrics on --host:--port until SIGTERM, as `vllm serve` would.

    A model that cannot be loaded exits with status 2 before the port is ever bound.
    """
    from fxkit.loader import LoadOptions
    from fxkit.serve_probe import serve_probe as serve

    serve(model, host, port, served_model_name or model, load_format, LoadOptions(**options))
