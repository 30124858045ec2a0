"""What is on a block device (or an image file): ``blkid -p``'s low-level probe, which reads
the device itself rather than a cache, so "nothing found" means no filesystem, partition table
or RAID/LVM signature is there.

``blkid -p`` exits 0 when it found a signature, 2 when it found none, 8 when the result is
ambivalent (several signatures) and 4 on a usage error; it also exits 2, with a message on
stderr, when it cannot read the device. Only "2 and silent" counts as empty here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from shlex import quote

from fxkit.connection.base import RunResult
from fxkit.facts.base import Fact, FactError

#: ``blkid -o export`` prints ``KEY=value`` lines; anything else is one of its messages.
_TAG = re.compile(r"[A-Z_]+=")


@dataclass(frozen=True)
class Signature:
    """``exists``: the path is there; ``empty``: blkid found nothing on it. ``error`` says why
    it could not be probed (blkid missing, unreadable, ambivalent)."""

    exists: bool
    empty: bool = False
    #: The filesystem (``xfs``, ``ext4``) or other signature (``LVM2_member``), if any.
    fstype: str = ""
    uuid: str = ""
    label: str = ""
    #: A partition table (``gpt``, ``dos``).
    pttype: str = ""
    error: str = ""

    @property
    def what(self) -> str:
        """The signature in words, for messages."""
        if self.fstype:
            return f"a {self.fstype} signature (UUID {self.uuid or 'none'})"
        if self.pttype:
            return f"a {self.pttype} partition table"
        return "no signature" if self.empty else "an unknown content"


class BlockSignature(Fact[Signature]):
    """``blkid -p -o export`` of one device, with its exit status and stderr."""

    become = True

    def command(self, device: str) -> str:
        return (
            f"p={quote(device)}; "
            '[ -e "$p" ] || { echo absent; exit 0; }; '
            "command -v blkid >/dev/null 2>&1 || { echo 'blkid not found (util-linux)'; exit 0; }; "
            '[ -r "$p" ] || { echo "$p is not readable"; exit 0; }; '
            'echo probed; out=$(blkid -p -o export -- "$p" 2>&1); rc=$?; '
            'printf \'%s\\nrc=%s\\n\' "$out" "$rc"'
        )

    def parse(self, result: RunResult, device: str) -> Signature:
        lines = result.stdout.splitlines()
        if not result.ok or not lines:
            raise FactError.from_result(f"blkid {device}", result)
        if lines == ["absent"]:
            return Signature(exists=False)
        if lines[0] != "probed":
            return Signature(exists=True, error=lines[0])
        if not lines[-1].startswith("rc="):
            raise FactError.from_result(f"blkid {device}", result)
        rc = lines[-1][3:]
        tags = dict(line.partition("=")[::2] for line in lines[1:-1] if _TAG.match(line))
        stderr = " ".join(line for line in lines[1:-1] if line and not _TAG.match(line))[:300]
        if rc == "0" and not stderr:
            return Signature(
                exists=True,
                fstype=tags.get("TYPE", ""),
                uuid=tags.get("UUID", ""),
                label=tags.get("LABEL", ""),
                pttype=tags.get("PTTYPE", ""),
            )
        if rc == "2" and not stderr:
            return Signature(exists=True, empty=True)
        why = {"8": "blkid found several signatures (ambivalent)"}.get(rc, f"blkid exited {rc}")
        return Signature(exists=True, error=f"{why}: {stderr}" if stderr else why)
