"""``fxkit lab``: a fleet of real SSH hosts on this machine."""

import click


@click.group()
def lab() -> None:
    """Start, inspect and stop the lab fleet (being built: see issue "SSH transport")."""
