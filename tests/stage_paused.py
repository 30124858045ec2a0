"""``fxkit stage`` that stops itself (SIGSTOP) once the partial it writes holds ``BYTES`` bytes.

    python tests/stage_paused.py BYTES stage SRC DEST ...

The tests of an interrupted copy signal it while it is stopped there: a fixed point inside the
copy instead of a race between the copy and a test polling the partial's size (which a loaded
machine loses: the copy ends before the poll sees it). The pause is the process's own, so the
test only waits for the stopped state in /proc and then does what it tests.
"""

from __future__ import annotations

import os
import signal
import sys

import fxkit.staging
from fxkit.cli import main

_write = fxkit.staging._pwrite_all
_pause_at = int(sys.argv.pop(1))
_paused = False


def _pwrite_then_pause(fd: int, data: memoryview, offset: int) -> None:
    global _paused
    _write(fd, data, offset)
    if not _paused and offset + len(data) >= _pause_at:
        _paused = True
        os.kill(os.getpid(), signal.SIGSTOP)


fxkit.staging._pwrite_all = _pwrite_then_pause
# Ctrl-C as a terminal delivers it, also under a parent that ignores SIGINT (a job started with
# '&' by a shell without job control inherits SIG_IGN, and Python then keeps ignoring it).
signal.signal(signal.SIGINT, signal.default_int_handler)
sys.argv[0] = "fxkit"
main()
