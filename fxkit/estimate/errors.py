"""The estimator's error: a bad input, config.json or results file, at file:line or key."""

from __future__ import annotations

from fxkit.errors import FxkitError


class EstimateError(FxkitError):
    """An estimator input is wrong: ``where`` names the file:line, config key or ``--set`` item."""
