"""``fxkit play``: run a playbook against an inventory."""

import click


@click.command()
def play() -> None:
    """Run a playbook (being built: see issue "Engine core")."""
    raise click.ClickException("fxkit play is not built yet")
