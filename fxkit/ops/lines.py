"""One line, or one marked block, in a text file; the file is rewritten atomically when it changes.

Each operation reads the file once and writes it once (see :func:`fxkit.ops.files.update_content`).
"""

from __future__ import annotations

import re

from fxkit.ops.base import OpContext, OpError, Result, check_state, ok
from fxkit.ops.files import update_content

DEFAULT_MARKER = "# {mark} FXKIT MANAGED BLOCK"


def read_lines(ctx: OpContext, path: str) -> tuple[bytes | None, list[str]]:
    """The file's bytes (None when missing) and its lines without line ends."""
    old = ctx.get(path)
    return old, (old or b"").decode("utf-8", "surrogateescape").splitlines()


def join_lines(lines: list[str]) -> bytes:
    return "".join(f"{line}\n" for line in lines).encode("utf-8", "surrogateescape")


def _compile(pattern: str, what: str) -> re.Pattern[str]:
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise OpError(f"bad regular expression {what}={pattern!r}: {exc}") from None


def line(
    ctx: OpContext,
    path: str,
    line: str,
    regexp: str | None = None,
    state: str = "present",
    insert_after: str = "EOF",
    backup: bool = False,
) -> Result:
    r"""Ensure ``line`` is in the file (created when missing), or that no line matching is.

    ``regexp`` (re.search) finds the line to replace: the last match is replaced, and with
    ``state="absent"`` every match is removed (without it, lines equal to ``line``). A new line
    goes after the last line matching ``insert_after``, at the end (``EOF``) or the start (``BOF``).

    Example::

        host.line("/etc/security/limits.conf", "*  soft  memlock  unlimited",
                  regexp=r"^[*]\s+soft\s+memlock")
    """
    check_state(state, ("present", "absent"))
    if "\n" in line:
        raise OpError(f"line for {path} contains a newline", hint="use block() for several lines")
    match = _compile(regexp, "regexp").search if regexp else line.__eq__
    old, lines = read_lines(ctx, path)
    if state == "absent":
        if old is None:
            return ok("file absent")
        new = [existing for existing in lines if not match(existing)]
        return _update(ctx, path, old, lines, new, backup)
    found = [i for i, existing in enumerate(lines) if match(existing)]
    new = list(lines)
    if found:
        new[found[-1]] = line
    elif line not in lines:
        new.insert(_insert_at(lines, insert_after), line)
    return _update(ctx, path, old, lines, new, backup)


def _update(
    ctx: OpContext, path: str, old: bytes | None, lines: list[str], new: list[str], backup: bool
) -> Result:
    if old is not None and new == lines:
        return ok("content as wanted")  # (a missing final newline is left alone)
    return update_content(ctx, path, old, join_lines(new), backup=backup)


def _insert_at(lines: list[str], insert_after: str) -> int:
    if insert_after == "EOF":
        return len(lines)
    if insert_after == "BOF":
        return 0
    anchor = _compile(insert_after, "insert_after")
    hits = [i for i, existing in enumerate(lines) if anchor.search(existing)]
    return hits[-1] + 1 if hits else len(lines)


def block(
    ctx: OpContext,
    path: str,
    block: str,
    marker: str = DEFAULT_MARKER,
    state: str = "present",
    backup: bool = False,
) -> Result:
    """Ensure ``block`` sits between the BEGIN and END markers (appended when missing), or that
    the markers and what they enclose are gone. ``marker`` holds ``{mark}``.

    Example::

        host.block("/etc/hosts", "10.0.0.1 fx100-a\\n10.0.0.2 fx100-b")
    """
    check_state(state, ("present", "absent"))
    if "{mark}" not in marker:
        raise OpError(f"block marker {marker!r} has no {{mark}} placeholder")
    begin, end = marker.format(mark="BEGIN"), marker.format(mark="END")
    old, lines = read_lines(ctx, path)
    if old is None and state == "absent":
        return ok("file absent")
    wanted = [begin, *block.splitlines(), end] if state == "present" else []
    start = lines.index(begin) if begin in lines else None
    stop = lines.index(end, start) if start is not None and end in lines[start:] else None
    if start is None or stop is None:
        new = lines + wanted
    else:
        new = lines[:start] + wanted + lines[stop + 1 :]
    return _update(ctx, path, old, lines, new, backup)
