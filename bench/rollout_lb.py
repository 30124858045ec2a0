#!/usr/bin/env python3
"""A tiny round-robin HTTP load balancer fed by fxkit rollout's hooks, and a closed-loop client.

Standard library only: it runs on a lab host (its python3), where the instances listen (lab
hosts cannot reach each other, nor can the controller reach their instances).

``proxy``: listens on ``--listen``, sends each request to the next backend of ``--backends``
(a file of ``ADDRESS:PORT`` lines, read again whenever it changes: the hooks rewrite it), and
relays the answer; a backend that fails the request fails it for the client (no retry: a
request lost in a rollout counts).

``client``: ``--workers`` loops, each POSTing ``/v1/completions`` to ``--url`` and waiting for
the answer, until ``--stop`` exists; then writes ``--out``: requests sent and failed, the first
failures, and each request (its Unix time, its latency in seconds, whether it succeeded).

    python3 rollout_lb.py proxy --listen 127.0.0.1:9000 --backends /run/lb/backends
    python3 rollout_lb.py client --url http://127.0.0.1:9000 --model tiny --stop /run/lb/stop \\
        --out /run/lb/client.json
"""

from __future__ import annotations

import argparse
import http.client
import itertools
import json
import os
import shlex
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Backends:
    """The backends file, read again when its mtime or size changes."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.seen: tuple[int, int] | None = None
        self.items: list[tuple[str, int]] = []
        self.turn = itertools.count()
        self.lock = threading.Lock()

    def next(self) -> tuple[str, int] | None:
        with self.lock:
            try:
                st = os.stat(self.path)
                stamp = (st.st_mtime_ns, st.st_size)
                if stamp != self.seen:
                    with open(self.path, encoding="utf-8") as f:
                        lines = [ln.strip() for ln in f if ln.strip()]
                    self.items = [(a, int(p)) for a, _, p in (ln.rpartition(":") for ln in lines)]
                    self.seen = stamp
            except (OSError, ValueError):
                self.items = []
            if not self.items:
                return None
            return self.items[next(self.turn) % len(self.items)]


def edit_command(path: str, backend: str, event: str) -> str:
    """The shell command that takes ``backend`` (``ADDRESS:PORT``) out of the backends file
    ``path`` (event ``deregister``) or puts it in (``register``), the file rewritten whole: the
    hooks' edit, run on the balancer's host."""
    q, line = shlex.quote(path), shlex.quote(backend)
    keep = f"grep -vxF -- {line} {q} 2>/dev/null"
    new = f"{{ {keep}; echo {line}; }}" if event == "register" else f"{{ {keep}; true; }}"
    return f"mkdir -p -- $(dirname {q}) && {new} > {q}.tmp && mv -f -- {q}.tmp {q}"


def proxy(listen: str, backends_file: str) -> None:
    backends = Backends(backends_file)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def relay(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            target = backends.next()
            if target is None:
                self.answer(503, b'{"error": "no backend"}')
                return
            conn = http.client.HTTPConnection(*target, timeout=60)
            try:
                conn.request(self.command, self.path, body, {"Content-Type": "application/json"})
                got = conn.getresponse()
                self.answer(got.status, got.read())
            except OSError as exc:
                self.answer(502, json.dumps({"error": f"{target}: {exc}"}).encode())
            finally:
                conn.close()

        def answer(self, status: int, data: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = relay

        def log_message(self, *args: object) -> None:
            pass

    address, _, port = listen.rpartition(":")
    ThreadingHTTPServer((address, int(port)), Handler).serve_forever()


def client(url: str, model: str, workers: int, stop: str, out: str) -> None:
    start = time.monotonic()
    samples: list[tuple[float, float, bool]] = []
    failures: list[str] = []
    lock = threading.Lock()
    body = json.dumps({"model": model, "prompt": "rollout", "max_tokens": 4}).encode()

    def loop() -> None:
        while not os.path.exists(stop):
            wall, sent = time.time(), time.monotonic()
            request = urllib.request.Request(
                f"{url}/v1/completions", body, {"Content-Type": "application/json"}
            )
            try:
                with urllib.request.urlopen(request, timeout=60) as answer:
                    good = json.loads(answer.read())["choices"][0]["text"] != ""
                error = ""
            except (OSError, ValueError, KeyError, IndexError) as exc:
                good = False
                error = str(exc)
            with lock:
                samples.append((round(wall, 4), round(time.monotonic() - sent, 4), good))
                if error and len(failures) < 20:
                    failures.append(f"{sent - start:.2f} s: {error}")

    threads = [threading.Thread(target=loop) for _ in range(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    report = {
        "sent": len(samples),
        "failed": sum(1 for *_, good in samples if not good),
        "failures": failures,
        "samples": samples,
    }
    tmp = f"{out}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(report, f)
    os.replace(tmp, out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    p = sub.add_parser("proxy")
    p.add_argument("--listen", required=True)
    p.add_argument("--backends", required=True)
    c = sub.add_parser("client")
    c.add_argument("--url", required=True)
    c.add_argument("--model", required=True)
    c.add_argument("--workers", type=int, default=4)
    c.add_argument("--stop", required=True)
    c.add_argument("--out", required=True)
    args = parser.parse_args()
    if args.what == "proxy":
        proxy(args.listen, args.backends)
    else:
        client(args.url, args.model, args.workers, args.stop, args.out)


if __name__ == "__main__":
    main()
