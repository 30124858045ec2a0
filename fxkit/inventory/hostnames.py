"""Host names as inventories write them: ``name:port``, ``[ipv6]:port``, ranges ``node[01:08]``.

The grammar is Ansible's (``ansible.parsing.utils.addresses``): a port follows a host name or an
IPv4 address after ``:``, and an IPv6 address only inside brackets (``[2001:db8::12]:2222``);
a bare IPv6 address (``2001:db8::12``) has no port. Text that is none of these is kept as it is.
"""

from __future__ import annotations

import re
import string

_NUMERIC_RANGE = r"\[[0-9]+:[0-9]+(?::[0-9]+)?\]"
_HEX_RANGE = r"\[[0-9a-f]+:[0-9a-f]+(?::[0-9]+)?\]"
_ALNUM_RANGE = r"\[(?:[a-z]:[a-z]|[0-9]+:[0-9]+)(?::[0-9]+)?\]"
_V4 = rf"(?:[01]?[0-9]{{1,2}}|2[0-4][0-9]|25[0-5]|{_NUMERIC_RANGE})"
_V6 = rf"(?:[0-9a-f]{{1,4}}|{_HEX_RANGE})"
_LABEL = rf"(?:\w|{_ALNUM_RANGE})(?:[\w-]|{_ALNUM_RANGE})*(?<![_-])"

_BRACKETED_PORT = re.compile(r"\[(.+)\]:([0-9]+)")
_HOST_PORT = re.compile(r"((?:[^:\[\]]|\[[^\]]*\])*):([0-9]+)")
_IPV4 = re.compile(rf"(?:{_V4}\.){{3}}{_V4}", re.I)
_IPV6 = re.compile(
    "|".join(
        [
            rf"(?:{_V6}:){{7}}{_V6}",
            rf"(?:{_V6}:){{1,6}}:",
            *(rf"(?:{_V6}:){{{n}}}(?::{_V6}){{1,{7 - n}}}" for n in range(1, 7)),
            rf":(?::{_V6}){{1,6}}",
            rf"{_V6}?::",
            rf"(?:0:){{6}}(?:{_V4}\.){{3}}{_V4}",
            rf"::(?:ffff:)?(?:{_V4}\.){{3}}{_V4}",
            rf"(?:0:){{5}}ffff:(?:{_V4}\.){{3}}{_V4}",
        ]
    ),
    re.I,
)
_HOSTNAME = re.compile(rf"{_LABEL}(?:\.{_LABEL})*", re.I)


def parse_address(text: str, allow_ranges: bool = True) -> tuple[str, int | None]:
    """``gpu01:2222`` -> ``("gpu01", 2222)``, ``[2001:db8::12]:22`` -> ``("2001:db8::12", 22)``.

    Raises ``ValueError`` when ``text`` is not a host name, IPv4 or IPv6 address (with ranges
    only when ``allow_ranges``), with an optional port."""
    port = None
    for form in (_BRACKETED_PORT, _HOST_PORT):  # as Ansible: the second may strip a second port
        match = form.fullmatch(text)
        if match:
            text, port = match[1], int(match[2])
    if not any(form.fullmatch(text) for form in (_IPV4, _IPV6, _HOSTNAME)):
        raise ValueError(f"not a host name or address: {text!r}")
    if not allow_ranges and "[" in text:
        raise ValueError(f"a range in {text!r}")
    return text, port


def split_port(pattern: str) -> tuple[str, int | None]:
    """The host name (or range) and port an inventory line gives; unparsable text is kept."""
    try:
        return parse_address(pattern)
    except ValueError:
        return pattern, None


def expand(name: str) -> list[str]:
    """Expand every ``[a:b]`` / ``[a:b:step]`` range in ``name`` as Ansible does: numbers (a
    leading zero sets the width, and both ends must then have it), or letters (``[a:f]``,
    ``[A:F]``; ``a``-``z`` come before ``A``-``Z``). Raises ``ValueError`` for a bad range."""
    if "[" not in name:
        return [name]
    head, sep, rest = name.partition("[")
    body, sep, tail = rest.partition("]")
    if not sep:
        raise ValueError("a range needs a closing ']'")
    bounds = body.split(":")
    if len(bounds) not in (2, 3):
        raise ValueError(f"[{body}] is not a range: write [begin:end] or [begin:end:step]")
    start, end = bounds[0] or "0", bounds[1]
    if not end:
        raise ValueError(f"range [{body}] has no end")
    try:
        step = int(bounds[2]) if len(bounds) == 3 else 1
    except ValueError:
        raise ValueError(f"the step of range [{body}] is not a number") from None
    if step < 1:
        raise ValueError(f"the step of range [{body}] must be at least 1")
    width = len(start) if start[0] == "0" and len(start) > 1 else 0
    if width and len(end) != width:
        raise ValueError(f"range [{body}]: begin and end must have the same width")
    letters = string.ascii_letters
    if len(start) == len(end) == 1 and start in letters and end in letters:
        first, last = letters.index(start), letters.index(end)
        items = list(letters[first : last + 1 : step])
    elif start.isdigit() and end.isdigit():
        first, last = int(start), int(end)
        items = [str(i).zfill(width) for i in range(first, last + 1, step)]
    else:
        raise ValueError(f"range [{body}] needs two numbers or two letters")
    if first > last:
        raise ValueError(f"range [{body}] runs backwards")
    return [host for item in items for host in expand(f"{head}{item}{tail}")]
