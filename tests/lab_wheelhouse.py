"""A wheelhouse for lab hosts: fxkit with its loader and the serve-probe's server libraries, every
wheel made from this test environment by fxkit.lab.wheelhouse (fxkit's own built from this
checkout), so that no test needs an index.

Lab hosts have no network and see neither this machine's /opt nor the working tree, so roles
that make virtualenvs there install from a controller folder of wheels, copied over
(``vllm_lmcache_wheelhouse``). Packed wheels are kept in ``.cache/lab-wheels/`` (or
``$FXKIT_LAB_WHEEL_CACHE``) between sessions.
"""

from __future__ import annotations

import os
from pathlib import Path

from fxkit.lab import wheelhouse

ROOT = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("FXKIT_LAB_WHEEL_CACHE", ROOT / ".cache/lab-wheels"))
#: What a lab virtualenv holds: fxkit's loader (torch, safetensors, numpy) and what serve-probe
#: serves with.
REQUIREMENTS = ["fxkit[loader,probe]"]


def build(into: Path) -> Path:
    """``into``: a link to the wheel of everything REQUIREMENTS need, fxkit's built anew."""
    wheelhouse.make(REQUIREMENTS, into, CACHE)
    return into
