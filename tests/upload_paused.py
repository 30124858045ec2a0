"""``fxkit play`` that stops itself (SIGSTOP) once one of its uploads has sent ``BYTES`` bytes.

    python tests/upload_paused.py BYTES play PLAYBOOK ...

The test of a SIGKILL in the middle of an upload kills it while it is stopped there: a fixed point
inside the upload (every host has less than the whole file), instead of a race between the upload
and a test polling the file's size on a host, which a loaded machine loses.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator

import fxkit.ops.files
from fxkit.cli import main

_content_stream = fxkit.ops.files.content_stream
_pause_at = int(sys.argv.pop(1))
_paused = False


def _stream_then_pause(data: bytes) -> Iterator[memoryview]:
    global _paused
    sent = 0
    for chunk in _content_stream(data):
        yield chunk
        sent += len(chunk)  # asked for the next one: this one was sent
        if not _paused and sent >= _pause_at:
            _paused = True
            os.kill(os.getpid(), signal.SIGSTOP)


fxkit.ops.files.content_stream = _stream_then_pause
sys.argv[0] = "fxkit"
main()
