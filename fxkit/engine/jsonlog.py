"""``--log-json``: a run's JSON event log, one line per task as it is recorded, then one summary
line per host when the run is over. A listener of the run's
:class:`~fxkit.engine.record.Recorder`, which redacts every text before it comes here.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import IO, Any

from fxkit.engine.record import Listener, PlaybookResult, TaskResult


class JsonLog(Listener):
    """Writes the events to ``stream`` (which its caller opens and closes), flushed one by one."""

    def __init__(self, stream: IO[str]):
        self._stream = stream

    def task(self, host: str, task: TaskResult) -> None:
        self._write({"event": "task", "host": host, **asdict(task)})

    def run_done(self, results: PlaybookResult) -> None:
        for host in results.hosts.values():
            self._write({"event": "summary", **host.summary()})

    def _write(self, event: dict[str, Any]) -> None:
        self._stream.write(json.dumps(event, default=str) + "\n")
        self._stream.flush()
