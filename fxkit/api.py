"""fxkit for Python: what the ``fxkit`` commands do, as calls. Each job below has its names
here; the rest of fxkit is its inside.

Run a playbook (``fxkit play``), on an inventory's hosts (files or built-in names)::

    from fxkit.api import RunOptions, console_recorder, run_playbook

    options = RunOptions(check=True, diff=True, limit="gpu01", extra_vars={"node_role": "x"})
    results = run_playbook("site", "inventory/mi308x.yml", options, console_recorder(diff=True))
    results.exit_code, results.hosts["gpu01"].outcome, results.to_json()

:func:`console_recorder` prints the run as ``fxkit play`` does (and writes its JSON log to an
open file, ``log_json=``); ``Recorder()`` records it without a word, and ``Recorder([mine])``
tells a :class:`Listener` of your own, every secret masked.

Run an acceptance gate (``fxkit gate g1``); the reports go to ``reports``, if given::

    from fxkit.api import GateOptions, run_gate

    result = run_gate("g1", "inventory/mi308x.yml", GateOptions(limit="rack1"), reports="g1-rack1")
    result.verdict, result.summary

Roll serving instances out in batches (``fxkit rollout``)::

    from fxkit.api import RunOptions, console_recorder, rollout

    report = rollout("rollout", "inventory/mi308x.yml", RunOptions(), console_recorder(),
                     serial=["25%"], canary=True)
    [(i.key, i.status, i.time_to_ready_s) for i in report.instances]

Stage a model onto the fast store (``fxkit stage``), from a folder or ``[user@]host:/path``::

    from fxkit.api import open_source, stage

    with open_source("nfs01:/models/llama") as source:
        summary = stage(source, "/mnt/fast/llama", verify=True)

Load it (``fxkit load``; needs the ``loader`` extra: torch, safetensors, numpy)::

    from fxkit.api import load, open_checkpoint

    checkpoint = open_checkpoint("/mnt/fast/llama")  # headers checked, no tensor read
    tensors = load(checkpoint, "cuda:0", threads=16)  # {name: tensor}

A mistake in the files or the arguments raises :class:`FxkitError` (``where``: file:line,
host or variable; ``hint``: what to do), before any host is touched.

Write a role of your own (docs/HOWTO-ROLE.md): its variables declared once, typed, and the Host
API its ``apply`` calls::

    from pydantic import Field

    from fxkit.api import AbsolutePath, Host, RoleVars, Whole

    class Vars(RoleVars):
        motd_file: AbsolutePath = Field("/etc/motd", description="where the banner goes")
        motd_width: Whole = Field(80, ge=20, description="its width")

    def apply(host: Host, v: Vars) -> None:
        host.template("motd.j2", v.motd_file, mode="0644")
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from fxkit.engine.console import console_recorder
from fxkit.engine.record import Listener, Outcome, PlaybookResult, Recorder
from fxkit.engine.role import Host
from fxkit.engine.rolevars import (
    AbsolutePath,
    InterfaceName,
    IpAddress,
    Nqn,
    Number,
    RoleKeys,
    RoleVars,
    Size,
    Text,
    Whole,
    pattern,
)
from fxkit.engine.runner import RunOptions, run_playbook
from fxkit.engine.serving import ServingRole, SimpleInstance
from fxkit.errors import FxkitError, VarError
from fxkit.gate.run import GateOptions, GateRun, run_gate
from fxkit.gate.verdicts import CheckStatus, GateResult
from fxkit.ops.base import Status
from fxkit.rollout import InstanceStatus, Rollout, rollout
from fxkit.staging import Summary, open_source, stage

if TYPE_CHECKING:
    from fxkit.loader import LoadOptions, iter_tensors, load, make_checkpoint, open_checkpoint

__all__ = [
    "AbsolutePath",
    "CheckStatus",
    "FxkitError",
    "GateOptions",
    "GateResult",
    "GateRun",
    "Host",
    "InstanceStatus",
    "InterfaceName",
    "IpAddress",
    "Listener",
    "LoadOptions",
    "Nqn",
    "Number",
    "Outcome",
    "PlaybookResult",
    "Recorder",
    "RoleKeys",
    "RoleVars",
    "Rollout",
    "RunOptions",
    "ServingRole",
    "SimpleInstance",
    "Size",
    "Status",
    "Summary",
    "Text",
    "VarError",
    "Whole",
    "console_recorder",
    "iter_tensors",
    "load",
    "make_checkpoint",
    "open_checkpoint",
    "open_source",
    "pattern",
    "rollout",
    "run_gate",
    "run_playbook",
    "stage",
]

#: The loader's names, imported on first use: it needs torch (the ``loader`` extra).
_LOADER = {"LoadOptions", "iter_tensors", "load", "make_checkpoint", "open_checkpoint"}


def __getattr__(name: str) -> Any:
    if name not in _LOADER:
        raise AttributeError(f"module 'fxkit.api' has no attribute {name!r}")
    return getattr(importlib.import_module("fxkit.loader"), name)
