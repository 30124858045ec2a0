"""One attribute file of sysfs or configfs: whether it exists, its mode, its content."""

from __future__ import annotations

import re
from dataclasses import dataclass
from shlex import quote

from fxkit.connection.base import RunResult
from fxkit.facts.base import Fact, FactError

#: ``none [mq-deadline] kyber``: a choice list with the selected word in brackets.
_WORD = r"[^\s\[\]]+"
_CHOICES = re.compile(rf"(?:{_WORD}\s+)*\[({_WORD})\](?:\s+{_WORD})*")


def normalize_attribute(text: str) -> str:
    """What an attribute file says, as compared with a wanted value: surrounding whitespace
    (the trailing newline) dropped, and of a choice list (``none [mq-deadline] kyber``, as
    /sys/block/*/queue/scheduler prints it) only the selected word."""
    text = text.strip()
    choice = _CHOICES.fullmatch(text)
    return choice.group(1) if choice else text


@dataclass(frozen=True)
class AttributeInfo:
    exists: bool
    mode: int = 0
    #: ``test -w`` as the reading user (false on a read-only mount, or without permission).
    writable: bool = False
    #: The file's text, None when reading it failed (a write-only attribute, EIO, ...).
    text: str | None = None
    #: Why it could not be read.
    error: str = ""

    @property
    def value(self) -> str | None:
        return None if self.text is None else normalize_attribute(self.text)


class Attribute(Fact[AttributeInfo]):
    """``stat`` mode, ``test -w`` and ``cat`` of one attribute file, in one command."""

    def command(self, path: str) -> str:
        return (
            f'p={quote(path)}; [ -e "$p" ] || {{ echo absent; exit 0; }}; '
            '[ -w "$p" ] && w=w || w=-; printf \'%s|%s\\n\' "$(stat -L -c %a -- "$p")" "$w"; '
            'cat -- "$p" || exit 3'
        )

    def parse(self, result: RunResult, path: str) -> AttributeInfo:
        head, _, text = result.stdout.partition("\n")
        if result.ok and head == "absent":
            return AttributeInfo(exists=False)
        mode, sep, writable = head.partition("|")
        if result.rc not in (0, 3) or not sep or not mode.isdigit():
            raise FactError.from_result(f"attribute {path}", result)
        return AttributeInfo(
            exists=True,
            mode=int(mode, 8),
            writable=writable == "w",
            text=text if result.ok else None,
            error=result.stderr.strip()[-200:],
        )
