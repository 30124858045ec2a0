"""``command``: any command's output, parsed as JSON, a number, lines or text.

    measure: {command: {run: "cat /sys/class/net/ens6np0/mtu", parse: number}}
    measure: {command: {run: "amd-smi version --json", parse: json}}
    measure: {command: {run: "uname -r"}}                       # text, stripped

A command that exits non-zero, or whose output does not parse, is an ERROR naming the command;
``tool:`` names the program to look for first ("amd-smi not found" rather than exit 127).
"""

from __future__ import annotations

import json
import re
from typing import Any, Literal

from pydantic import model_validator

from fxkit.gate.measure import MeasuredHost, MeasureError, Params, kind, regex


class CommandParams(Params):
    run: str
    parse: Literal["text", "number", "json", "lines", "regex"] = "text"
    #: For ``parse: regex``: a pattern whose named groups are the values (numbers when they are).
    pattern: str | None = None
    #: A program that must be on the host (default: none checked; the command's own error).
    tool: str | None = None

    @model_validator(mode="after")
    def _pattern(self) -> CommandParams:
        if self.parse == "regex" and not self.pattern:
            raise ValueError("parse: regex needs a pattern: with named groups")
        if self.pattern is not None and not regex(self.pattern, "pattern").groupindex:
            raise ValueError("pattern needs a named group: (?P<name>...) around each value")
        return self


@kind("command", CommandParams)
def command(node: MeasuredHost, p: CommandParams) -> Any:
    """A command's output: text, a number, lines, JSON, or a regex's named groups."""
    if p.tool:
        node.require(p.tool)
    out = node.output(p.run)
    return parse_output(out, p.parse, p.pattern, p.run)


def parse_output(out: str, how: str, pattern: str | None, command: str) -> Any:
    text = out.strip()
    if how == "text":
        return text
    if how == "lines":
        return [line.strip() for line in text.splitlines() if line.strip()]
    if how == "number":
        return number(text, command)
    if how == "json":
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise MeasureError(
                f"`{command}` did not print JSON ({exc.msg}): {text[:80]!r}"
            ) from None
    assert pattern is not None  # CommandParams requires one for parse: regex
    found = re.search(pattern, out, re.M)
    if not found:
        raise MeasureError(f"`{command}`: no match for {pattern!r} in: {text[-200:]!r}")
    return {k: _maybe_number(v) for k, v in found.groupdict().items()}


def number(text: str, what: str) -> float | int:
    try:
        value = float(text)
    except ValueError:
        raise MeasureError(f"`{what}` did not print a number: {text[:80]!r}") from None
    return int(value) if value.is_integer() and "." not in text else value


def _maybe_number(text: str | None) -> Any:
    if text is None:
        return None
    try:
        return number(text, "")
    except MeasureError:
        return text
