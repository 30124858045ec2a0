"""Test doubles of hardware tools on a lab host with a simulated profile (see docs/lab.md,
"Simulated hardware: test doubles"). NOT the real tools: they answer from the profile's data in
the formats the real tools print, keep the little state their configuration commands change,
and log every call.

This package is copied (only inside a lab host's own /usr overlay) to
/usr/local/lib/fxkit-lab/standins/; /usr/local/bin/amd-smi, nvme, mlnx_qos... are links to its
``__main__.py``, and the name a stand-in is called by picks the tool. Each module of the package
declares the tools it answers for in its ``TOOLS``. They run with the host's /usr/bin/python3
and import only the standard library. Every call appends ``{"argv": [...], "stdin": "..."}``
(plus ``"input"`` for ``nvmetcli restore``) to /var/log/fxkit-lab/calls.jsonl; state is in
/var/lib/fxkit-lab/.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
from pathlib import Path
from typing import Any

from .common import Tool, load_profile, log_call, read_stdin


def tools() -> dict[str, Tool]:
    """Every stand-in, by the name it is called by: the ``TOOLS`` of the package's modules."""
    found: dict[str, Tool] = {}
    for module in pkgutil.iter_modules(__path__):
        found.update(getattr(importlib.import_module(f"{__name__}.{module.name}"), "TOOLS", {}))
    return found


def main() -> int:
    tool = Path(sys.argv[0]).name
    stdin = read_stdin()
    entry: dict[str, Any] = {"argv": [tool, *sys.argv[1:]], "stdin": stdin}
    handler = tools().get(tool)
    if handler is None:
        print(f"{tool}: not a tool of the fxkit lab profile", file=sys.stderr)
        return 127
    try:
        return handler(load_profile(), sys.argv[1:], stdin, entry)
    finally:
        log_call(entry)
