"""``fxkit load`` and ``fxkit make-checkpoint``: the model loader's commands.

torch is imported inside the commands, so ``fxkit --help`` stays fast.
"""

import click


@click.command()
def load() -> None:
    """Load a model with the parallel loader (being built: see issue "Parallel safetensors loader")."""
    raise click.ClickException("fxkit load is not built yet")


@click.command("make-checkpoint")
def make_checkpoint() -> None:
    """Generate a sharded safetensors checkpoint (being built)."""
    raise click.ClickException("fxkit make-checkpoint is not built yet")
