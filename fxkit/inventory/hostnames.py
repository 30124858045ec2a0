"""Host names as inventories write them: ranges (``node[01:08]``) and an optional ``:port``."""

from __future__ import annotations

import re
import string

# [start:end] or [start:end:stride]; start may be empty (= 0), as in Ansible.
_RANGE = re.compile(r"\[([a-z]*|[0-9]*):([a-z]+|[0-9]+)(?::([0-9]+))?\]")
_BRACKETS = re.compile(r"\[[^\]]*\]")


def split_port(name: str) -> tuple[str, int | None]:
    """``gpu01:2222`` -> ``("gpu01", 2222)``; a name without a port (or an IPv6 address) is kept."""
    head, sep, port = name.rpartition(":")
    if sep and head and port.isdigit() and ":" not in _BRACKETS.sub("", head):
        return head, int(port)
    return name, None


def expand(name: str) -> list[str]:
    """Expand every ``[a:b]`` / ``[a:b:step]`` range in ``name`` (numeric, zero padding kept, or
    one-letter alphabetic), as Ansible does. Raises ``ValueError`` for a backwards range."""
    match = _RANGE.search(name)
    if match is None:
        return [name]
    head, tail = name[: match.start()], name[match.end() :]
    start, end, step = match[1] or "0", match[2], int(match[3] or 1)
    if start.isdigit() != end.isdigit():
        raise ValueError(f"range [{match[1]}:{end}] mixes letters and numbers")
    if start.isdigit():
        first, last = int(start), int(end)
        width = len(start) if start.startswith("0") and len(start) > 1 else 0
        items = [str(i).zfill(width) for i in range(first, last + 1, step)]
    else:
        if len(start) != 1 or len(end) != 1:
            raise ValueError(f"alphabetic range [{start}:{end}] must use single letters")
        letters = string.ascii_lowercase
        first, last = letters.index(start), letters.index(end)
        items = list(letters[first : last + 1 : step])
    if first > last:
        raise ValueError(f"range [{start}:{end}] runs backwards")
    return [f"{head}{item}{rest}" for item in items for rest in expand(tail)]
