"""Bounds on serve-probe's HTTP connections, so that slow or idle clients cannot starve /health.

uvicorn (0.54, h11) bounds a keep-alive connection's idle time (``timeout_keep_alive``, reset by
any byte) and the size of a request's head (``h11_max_incomplete_event_size``), but neither the
time a client may take to send that head nor how many connections it may hold. 1100 clients
trickling a request one byte at a time took every file descriptor; asyncio then failed each
``accept`` (and logged each failure) and /health went unanswered for 75 s or more. uvicorn's
``limit_concurrency`` does not help: past its limit it answers 503 to every request, /health
included.

:class:`GuardedH11Protocol` adds the two bounds. A request's head must arrive within
``header_timeout`` of the connection or of the previous response, or the connection closes;
past ``max_connections`` open connections, the one that has waited longest for a request closes.
A connection whose request is being served is never closed. :func:`max_connections` keeps the
count below the descriptor limit, so ``accept`` never runs out of descriptors.
"""

from __future__ import annotations

import asyncio
import itertools
import resource
from typing import Any

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

#: Seconds a client has to send a request's head (line and headers).
HEADER_TIMEOUT = 10.0
#: Seconds an idle keep-alive connection stays open (uvicorn's default).
KEEP_ALIVE = 5
#: Bytes a request's head may have (h11's default).
MAX_HEAD = 16 * 1024
#: Connections open at once, at the most.
MAX_CONNECTIONS = 1024
#: The listen backlog, which is also how many connections asyncio accepts in one go.
ACCEPT_BATCH = 128
#: Descriptors the process keeps for itself (standard streams, the event loop, /proc reads).
RESERVED_FDS = 64

_TURNS = itertools.count()  # the order in which connections began to wait for a request


def max_connections() -> int:
    """:data:`MAX_CONNECTIONS`, or fewer where the descriptor limit would come first: it must
    hold them, two accept batches (accepted before older connections are closed) and the
    process's own descriptors."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return MAX_CONNECTIONS
    return max(1, min(MAX_CONNECTIONS, soft - 2 * ACCEPT_BATCH - RESERVED_FDS))


class GuardedConfig(uvicorn.Config):
    """uvicorn's config for :class:`GuardedH11Protocol`, with its two bounds."""

    def __init__(
        self,
        app: Any,
        *,
        max_connections: int,
        header_timeout: float = HEADER_TIMEOUT,
        **options: Any,
    ) -> None:
        super().__init__(
            app,
            http=GuardedH11Protocol,
            backlog=ACCEPT_BATCH,
            timeout_keep_alive=KEEP_ALIVE,
            h11_max_incomplete_event_size=MAX_HEAD,
            **options,
        )
        self.max_connections = max_connections
        self.header_timeout = header_timeout


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline for each request's head and a cap on connections
    (:class:`GuardedConfig`)."""

    config: GuardedConfig

    def __init__(self, config: GuardedConfig, **kwargs: Any) -> None:
        super().__init__(config, **kwargs)
        self.deadline: asyncio.TimerHandle | None = None
        self.turn = 0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._wait_for_request()
        if len(self.connections) > self.config.max_connections:
            waiting = (
                c
                for c in self.connections
                if isinstance(c, GuardedH11Protocol) and c.deadline is not None
            )
            oldest = min(waiting, key=lambda c: c.turn)  # this one at least waits
            oldest._stop_waiting()
            oldest.transport.close()

    def handle_events(self) -> None:
        super().handle_events()
        if self.cycle is not None and not self.cycle.response_complete:  # a request is in
            self._stop_waiting()

    def on_response_complete(self) -> None:
        self._wait_for_request()  # before uvicorn reads a pipelined request
        super().on_response_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_waiting()
        super().connection_lost(exc)

    def _wait_for_request(self) -> None:
        self._stop_waiting()
        self.turn = next(_TURNS)
        self.deadline = self.loop.call_later(self.config.header_timeout, self.transport.close)

    def _stop_waiting(self) -> None:
        if self.deadline is not None:
            self.deadline.cancel()
            self.deadline = None
