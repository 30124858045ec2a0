"""Bulk streams from one host spread over several SSH connections.

paramiko moves every packet of a connection (decryption, MAC check, window updates) on that
connection's one transport thread; channels of one connection share it. A bulk read through one
connection tops out at what that thread does: 0.5-0.7x OpenSSH's scp of the same files here
(docs/BENCHMARKS.md, "Model staging"). :class:`Streams` opens a stream on the connection with
the fewest streams open, and a further connection to the same host (host keys checked as for
the first) while every one has a stream, up to ``size`` connections. A further connection the
host refuses (sshd's MaxStartups, a per-user limit) is given up: its stream and all after it go
over the connections already open.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fxkit.errors import ConnectionFailed

if TYPE_CHECKING:
    import paramiko

    from fxkit.connection.ssh import SSHConnection


@dataclass
class _Slot:
    conn: SSHConnection
    streams: int = 0


class Streams:
    """Streams (:meth:`SSHConnection.stream`) over at most ``size`` connections: ``first`` and
    the ones ``more`` makes (each opened when first used). Closing closes the ones it made."""

    def __init__(self, first: SSHConnection, more: Callable[[], SSHConnection], size: int):
        self.more, self.size = more, max(1, size)
        self._slots = [_Slot(first)]
        self._lock = threading.Lock()

    def _pick(self) -> _Slot:
        with self._lock:
            slot = min(self._slots, key=lambda s: s.streams)
            if slot.streams and len(self._slots) < self.size:
                slot = _Slot(self.more())  # resolved only: it connects on its first stream
                self._slots.append(slot)
            slot.streams += 1
            return slot

    @contextmanager
    def stream(self, command: str, window: int = 16 << 20) -> Iterator[paramiko.Channel]:
        """An exec channel running ``command`` (see :meth:`SSHConnection.stream`), closed when
        the block ends."""
        slot = self._pick()
        try:
            try:
                chan = slot.conn.stream(command, window)
            except ConnectionFailed:
                if slot is self._slots[0]:
                    raise
                slot = self._give_up(slot)
                chan = slot.conn.stream(command, window)
            try:
                yield chan
            finally:
                chan.close()
        finally:
            with self._lock:
                slot.streams -= 1

    def _give_up(self, refused: _Slot) -> _Slot:
        """Drop a further connection that did not open; the slot to use instead."""
        refused.conn.close()
        with self._lock:
            if refused in self._slots:  # another stream on it may have dropped it already
                self._slots.remove(refused)
            self.size = len(self._slots)
            slot = min(self._slots, key=lambda s: s.streams)
            slot.streams += 1
            return slot

    @property
    def connections(self) -> int:
        """How many connections the streams were spread over so far."""
        return len(self._slots)

    def close(self) -> None:
        """Close the connections this made (the first is its owner's to close)."""
        with self._lock:
            made, self._slots = self._slots[1:], self._slots[:1]
        for slot in made:
            slot.conn.close()
