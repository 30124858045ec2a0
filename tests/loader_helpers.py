"""Helpers of the loader's file tests: a FIFO, and a call that must not hang on one."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sync_helpers import SAFETY

#: A safety net: far more than a refusal takes, also on a loaded machine; a hang never returns.
WAIT = SAFETY


def returns_at_once(call: Callable[[], Any], fifo: Path | None = None) -> Any:
    """``call()``, which must return (or raise) within WAIT seconds.

    A call stuck opening ``fifo`` (open(2) of a FIFO waits for a writer) is released by opening
    the FIFO for writing, so that a failing test ends instead of hanging the run.
    """
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = call()
        except BaseException as exc:  # handed to the test below
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(WAIT)
    if thread.is_alive():
        if fifo is not None:
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        thread.join(WAIT)
        pytest.fail(f"still waiting after {WAIT} s (on {fifo})")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def make_fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path
