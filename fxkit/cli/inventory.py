"""``fxkit inventory``: show an inventory as JSON or as a graph."""

import click


@click.command()
def inventory() -> None:
    """Show an inventory (being built: see issue "Engine core")."""
    raise click.ClickException("fxkit inventory is not built yet")
