"""wait_for over SSH on a lab host, against a real server started inside the host
(``python3 -m http.server`` bound to the host's address, stopped by its PID): the port while it
comes up, HTTP status and JSON, a file and a regex in the server's log, a command, the port
closing again; timeouts and check mode."""

from __future__ import annotations

import json
import socket

import pytest
from sync_helpers import SAFETY
from test_ops_lab import sh

from fxkit.connection.base import Connection
from fxkit.facts import FactCache
from fxkit.lab import Fleet
from fxkit.ops.base import OpContext, Status
from fxkit.ops.wait import wait_for

pytestmark = pytest.mark.lab

#: vLLM's answer shape on /v1/models (object "list", data: the served models).
MODELS = {"object": "list", "data": [{"id": "Qwen/Qwen3-8B", "object": "model"}]}


def free_port(address: str) -> int:
    with socket.socket() as s:  # the lab hosts share this machine's network: same free ports
        s.bind((address, 0))
        return int(s.getsockname()[1])


def ctx(conn: Connection, check: bool = False) -> OpContext:
    return OpContext(conn, FactCache(conn), check=check)


def test_wait_for_a_server_coming_up_in_the_host(fleet: Fleet, root: Connection) -> None:
    address = fleet.address("lab01")
    port = free_port(address)
    base = f"http://{address}:{port}"
    sh(root, "mkdir -p /srv/www/v1 && : > /srv/www/health")
    root.put("/srv/www/v1/models", json.dumps(MODELS).encode())

    waiting = wait_for(ctx(root, check=True), port=port, host=address, timeout=30)
    assert waiting.status is Status.SKIPPED
    assert waiting.msg.startswith(f"check mode: would wait up to 30 s for TCP {address}:{port}")
    assert "Connection refused" in waiting.msg

    pid = sh(
        root,
        f"cd /srv/www && (sleep 1; exec python3 -u -m http.server {port} --bind {address}) "
        "> /tmp/http.log 2>&1 < /dev/null & echo $!",
    ).strip()
    try:
        up = wait_for(ctx(root), port=port, host=address, timeout=SAFETY, interval=0.2)
        assert up.status is Status.OK and up.msg.startswith(f"TCP {address}:{port} to open: open")
        logged = wait_for(ctx(root), path="/tmp/http.log", regex="^Serving HTTP on", timeout=SAFETY)
        assert logged.status is Status.OK, logged
        assert wait_for(ctx(root), url=f"{base}/health", timeout=SAFETY).status is Status.OK
        models = wait_for(
            ctx(root), url=f"{base}/v1/models", json={"data": [{"id": "Qwen/Qwen3-8B"}]}
        )
        assert models.status is Status.OK and models.data["seen"].startswith("HTTP 200 {")
        missing = wait_for(ctx(root), url=f"{base}/v2", timeout=1.5, interval=0.5)
        assert missing.failed and "; last seen: HTTP 404 " in missing.msg, missing
        running = wait_for(ctx(root), command=f"kill -0 {pid}", timeout=SAFETY)
        assert running.status is Status.OK
        assert wait_for(ctx(root, check=True), url=f"{base}/health").status is Status.OK
    finally:
        root.run(f"kill {pid}")
    down = wait_for(
        ctx(root), port=port, host=address, state="stopped", timeout=SAFETY, interval=0.2
    )
    assert down.status is Status.OK, down
    gone = wait_for(ctx(root), url=f"{base}/health", timeout=1, interval=0.5)
    assert gone.failed, gone
    last = gone.msg.partition("; last seen: ")[2]  # curl's words, or python3's where no curl
    assert "Failed to connect" in last or "Connection refused" in last, gone
