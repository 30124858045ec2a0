"""``fxkit estimate``: KV-cache sizing, offload break-even, load time and cost of serving a model.

The formulas and every input's default and source are in docs/ESTIMATOR.md. :func:`collect`
gathers the inputs (defaults, an inputs file, measured results, ``--set`` items, in that order);
:func:`fxkit.estimate.summary.estimate` computes; :mod:`fxkit.estimate.render` shows.
"""

from __future__ import annotations

from pathlib import Path

from fxkit.estimate import from_results as _results
from fxkit.estimate import inputs as _inputs
from fxkit.estimate.from_results import Used
from fxkit.estimate.inputs import Inputs


def collect(
    path: Path | None,
    model: Path | None = None,
    results: tuple[Path, ...] = (),
    sets: tuple[str, ...] = (),
) -> tuple[Inputs, list[Used]]:
    """The inputs: defaults, then ``path``'s, then ``results``', then ``sets``; ``model`` (a
    config.json) replaces the inputs file's model.config."""
    values = _inputs.defaults()
    if path is not None:
        _inputs.read_file(path, values)
    if model is not None:
        values.set("model.config", str(model), "--model")
    used = [_results.apply(result, values) for result in results]
    _inputs.apply_sets(sets, values)
    return values, used
