"""Idempotent operations, by name: what a role's Host API exposes (``host.file(...)``)."""

from __future__ import annotations

from fxkit.ops.base import OpContext, Operation, OpError, Result, Status
from fxkit.ops.commands import command
from fxkit.ops.files import directory, file
from fxkit.ops.lines import block, line

#: Every operation by the name a role calls it with.
OPERATIONS: dict[str, Operation] = {
    "directory": directory,
    "file": file,
    "line": line,
    "block": block,
    "command": command,
}

__all__ = ["OPERATIONS", "OpContext", "OpError", "Operation", "Result", "Status"]
