#!/usr/bin/env python3
"""A TCP relay that holds every byte from client to server back by a fixed delay (netem's job).

Each chunk read from the client is stamped on arrival and written to the server ``delay`` later,
in order, so requests keep flowing (pipelining is kept, throughput is not capped) while every
request reaches the server ``delay`` late, exactly as on a link with that much extra latency.
The server-to-client direction is relayed at once with splice(2) (no copy through Python).
Used by remote_fs.py on kernels without sch_netem; stop it with SIGTERM.

    python bench/delay_proxy.py --listen 10.213.0.2:22 --to 127.0.0.1:22 --delay-ms 1
"""

from __future__ import annotations

import argparse
import contextlib
import os
import queue
import signal
import socket
import threading
import time

CHUNK = 1 << 16
SPLICE = 1 << 20


def _delayed(src: socket.socket, dst: socket.socket, delay: float) -> None:
    """Relay src to dst, each chunk ``delay`` seconds after it arrived."""
    pending: queue.SimpleQueue[tuple[float, bytes] | None] = queue.SimpleQueue()

    def writer() -> None:
        with contextlib.suppress(OSError):
            while (item := pending.get()) is not None:
                due, data = item
                if (wait := due - time.monotonic()) > 0:
                    time.sleep(wait)
                dst.sendall(data)
            dst.shutdown(socket.SHUT_WR)

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    with contextlib.suppress(OSError):
        while data := src.recv(CHUNK):
            pending.put((time.monotonic() + delay, data))
    pending.put(None)
    thread.join()


def _spliced(src: socket.socket, dst: socket.socket) -> None:
    """Relay src to dst through a pipe with splice(2), the bytes never entering Python."""
    r, w = os.pipe()
    try:
        with contextlib.suppress(OSError):
            while n := os.splice(src.fileno(), w, SPLICE):
                while n:
                    n -= os.splice(r, dst.fileno(), n)
            dst.shutdown(socket.SHUT_WR)
    finally:
        os.close(r)
        os.close(w)


def _serve(client: socket.socket, upstream: tuple[str, int], delay: float) -> None:
    with client, socket.create_connection(upstream) as server:
        for s in (client, server):
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        back = threading.Thread(target=_spliced, args=(server, client), daemon=True)
        back.start()
        _delayed(client, server, delay)
        back.join()


def _addr(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--listen", type=_addr, required=True, metavar="ADDR:PORT")
    parser.add_argument("--to", type=_addr, required=True, metavar="ADDR:PORT")
    parser.add_argument("--delay-ms", type=float, required=True)
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    with socket.create_server(args.listen, backlog=64) as listener:
        print("ready", flush=True)
        while True:
            client, _ = listener.accept()
            threading.Thread(
                target=_serve, args=(client, args.to, args.delay_ms / 1000), daemon=True
            ).start()


if __name__ == "__main__":
    main()
