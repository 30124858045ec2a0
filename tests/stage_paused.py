"""``fxkit stage`` that stops itself (SIGSTOP) once the partial it writes holds ``BYTES`` bytes.

    python tests/stage_paused.py BYTES stage SRC DEST ...

The tests of an interrupted copy signal it while it is stopped there: a fixed point inside the
copy instead of a race between the copy and a test polling the partial's size (which a loaded
machine loses: the copy ends before the poll sees it). The pause is the process's own, so the
test only waits for the stopped state in /proc and then does what it tests.

Once continued, the paused writer holds on until the process has taken what the test sent:
SIGUSR1 (go on: a plain continue) or Ctrl-C (SIGINT), and then until the copy has seen its stop.
Otherwise a loaded machine could let the copy finish the file before the main thread runs the
signal's handler, and a Ctrl-C would find nothing left to interrupt.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from types import FrameType

import fxkit.staging
from fxkit.cli import main

_write = fxkit.staging._pwrite_all
_pause_at = int(sys.argv.pop(1))
_paused = False
_go, _interrupted = threading.Event(), threading.Event()


def _pwrite_then_pause(fd: int, data: memoryview, offset: int) -> None:
    global _paused
    _write(fd, data, offset)
    if not _paused and offset + len(data) >= _pause_at:
        _paused = True
        os.kill(os.getpid(), signal.SIGSTOP)
        copy = sys._getframe(1).f_locals["self"]  # the copy this write is part of
        while not (_go.wait(0.05) or _interrupted.is_set()):
            pass
        if _interrupted.is_set():
            copy.stop.wait(60)  # the main thread took the Ctrl-C and stops the copy


def _on_sigint(signum: int, frame: FrameType | None) -> None:
    _interrupted.set()
    raise KeyboardInterrupt  # as Python's own handler does


fxkit.staging._pwrite_all = _pwrite_then_pause
# Ctrl-C as a terminal delivers it, also under a parent that ignores SIGINT (a job started with
# '&' by a shell without job control inherits SIG_IGN, and Python then keeps ignoring it).
signal.signal(signal.SIGINT, _on_sigint)
signal.signal(signal.SIGUSR1, lambda signum, frame: _go.set())
sys.argv[0] = "fxkit"
main()
