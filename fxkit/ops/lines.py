"""One line, or one marked block, in a text file; the file is rewritten atomically when it changes.

Each operation reads the file once and writes it once, only if nobody changed it in between (else
it reads and edits it again: see :func:`fxkit.ops.files.edit_file`).
"""

from __future__ import annotations

import re
from collections.abc import Callable

from fxkit.ops.base import OpContext, OpError, Result, check_state, ok
from fxkit.ops.files import Edit, Mode, Owner, edit_file

DEFAULT_MARKER = "# {mark} FXKIT MANAGED BLOCK"

#: An edit of a file's lines (without their line ends; None: the file is missing): the new
#: lines, or a result to return as it is.
LineEdit = Callable[[list[str] | None], list[str] | Result]


def by_lines(edit: LineEdit) -> Edit:
    """``edit`` as an edit of a file's content, for :func:`fxkit.ops.files.edit_file`. A file
    whose lines stay the same is left as it is, a missing final newline too."""

    def apply(old: bytes | None) -> bytes | Result:
        lines = None if old is None else old.decode("utf-8", "surrogateescape").splitlines()
        new = edit(lines)
        if isinstance(new, Result):
            return new
        if old is not None and new == lines:
            return old
        return "".join(f"{line}\n" for line in new).encode("utf-8", "surrogateescape")

    return apply


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
    mode: Mode = None,
    owner: Owner = None,
    group: Owner = None,
    secret: bool = False,
) -> Result:
    r"""Ensure ``line`` is in the file (created when missing), or that no line matching is.

    ``regexp`` (re.search) finds the line to replace: the last match is replaced, and with
    ``state="absent"`` every match is removed (without it, lines equal to ``line``). A new line
    goes after the last line matching ``insert_after``, at the end (``EOF``) or the start (``BOF``).
    ``mode``, ``owner``, ``group``, ``backup`` and ``secret`` as for ``file``: a new file has
    its mode before it holds the line.

    Example::

        host.line("/etc/security/limits.conf", "*  soft  memlock  unlimited",
                  regexp=r"^[*]\s+soft\s+memlock")
    """
    check_state(state, ("present", "absent"))
    if "\n" in line:
        raise OpError(f"line for {path} contains a newline", hint="use block() for several lines")
    match = _compile(regexp, "regexp").search if regexp else line.__eq__

    def edit(lines: list[str] | None) -> list[str] | Result:
        if state == "absent":
            if lines is None:
                return ok("file absent")
            return [existing for existing in lines if not match(existing)]
        new = list(lines or [])
        found = [i for i, existing in enumerate(new) if match(existing)]
        if found:
            new[found[-1]] = line
        elif line not in new:
            new.insert(_insert_at(new, insert_after), line)
        return new

    return edit_file(
        ctx, path, by_lines(edit), mode=mode, owner=owner, group=group, backup=backup, secret=secret
    )


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
    mode: Mode = None,
    owner: Owner = None,
    group: Owner = None,
    secret: bool = False,
) -> Result:
    """Ensure ``block`` sits between the BEGIN and END markers (appended when missing), or that
    the markers and what they enclose are gone. ``marker`` holds ``{mark}``. ``mode``,
    ``owner``, ``group``, ``backup`` and ``secret`` as for ``file``.

    Example::

        host.block("/etc/hosts", "10.0.0.1 fx100-a\\n10.0.0.2 fx100-b")
    """
    check_state(state, ("present", "absent"))
    if "{mark}" not in marker:
        raise OpError(f"block marker {marker!r} has no {{mark}} placeholder")
    begin, end = marker.format(mark="BEGIN"), marker.format(mark="END")
    wanted = [begin, *block.splitlines(), end] if state == "present" else []

    def edit(lines: list[str] | None) -> list[str] | Result:
        if lines is None and state == "absent":
            return ok("file absent")
        lines = lines or []
        start = lines.index(begin) if begin in lines else None
        stop = lines.index(end, start) if start is not None and end in lines[start:] else None
        if start is None or stop is None:
            return lines + wanted
        return lines[:start] + wanted + lines[stop + 1 :]

    return edit_file(
        ctx, path, by_lines(edit), mode=mode, owner=owner, group=group, backup=backup, secret=secret
    )
