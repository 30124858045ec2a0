"""``fxkit bench ...``: benchmarks that compare fxkit with baselines and peers in one run."""

import click


@click.group()
def bench() -> None:
    """Benchmarks that compare fxkit with baselines and peers in one run."""
