"""Writing a file on this machine whole: the old file or the new one, never half of either."""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
from pathlib import Path


def write_whole(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a new temporary file beside it (made exclusively, so a
    link planted there is never followed), renamed over it; on any failure the temporary file
    goes and ``path`` is as it was. The file gets the mode a plain write would give it: the old
    file's, else 0666 less the umask."""
    try:
        mode = path.stat().st_mode & 0o7777
    except FileNotFoundError:
        mode = 0o666 & ~_umask()
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def _umask() -> int:
    """This process's umask, read without setting it (os.umask would, for every thread)."""
    with contextlib.suppress(OSError):
        found = re.search(r"^Umask:\s*([0-7]+)$", Path("/proc/self/status").read_text(), re.M)
        if found:
            return int(found[1], 8)
    return 0o022
