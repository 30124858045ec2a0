"""wait_for on this machine (LocalConnection): a real HTTP server in a thread of the test, a
port nobody listens on, files in a temp directory, commands; each probe tool (bash, python3,
curl) run for real. The same over SSH on a lab host: tests/test_ops_lab_wait.py."""

from __future__ import annotations

import json
import shutil
import socket
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from sync_helpers import SAFETY

from fxkit.connection.local import LocalConnection
from fxkit.facts import FactCache
from fxkit.facts.tools import Executables
from fxkit.ops.base import OpContext, OpError, Status
from fxkit.ops.wait import (
    HTTP_TOOLS,
    TCP_TOOLS,
    http_condition,
    json_contains,
    tcp_condition,
    wait_for,
)

#: What vLLM's OpenAI server answers on /v1/models (its shape: object "list", data [model]).
MODELS = {
    "object": "list",
    "data": [{"id": "Qwen/Qwen3-8B", "object": "model", "max_model_len": 32768}],
}


def make_ctx(check: bool = False) -> OpContext:
    conn = LocalConnection("localhost")
    return OpContext(conn, FactCache(conn), check=check)


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        routes = {"/health": (200, b""), "/v1/models": (200, json.dumps(MODELS).encode())}
        code, body = routes.get(self.path, (404, b"not found"))
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Changing(LocalConnection):
    """This machine, where ``change()`` happens right after the first command from :meth:`arm`
    on (wait_for's first probe, which finds the condition false): what wait_for waits for comes
    about while it waits, at a fixed point."""

    def __init__(self) -> None:
        super().__init__("localhost")
        self.change: Callable[[], object] | None = None
        self.commands = 0

    def arm(self, change: Callable[[], object], *tools: str) -> OpContext:
        """A context for wait_for, the Executables fact of ``tools`` already gathered."""
        ctx = OpContext(self, FactCache(self))
        if tools:
            ctx.fact(Executables, *tools)
        self.change, self.commands = change, 0
        return ctx

    def execute(self, command, *, become, timeout, stdin):  # type: ignore[no-untyped-def]
        result = super().execute(command, become=become, timeout=timeout, stdin=stdin)
        self.commands += 1
        if self.change is not None and self.commands == 1:
            self.change()
        return result


def test_http_status_and_json_subset(server: str) -> None:
    ctx = make_ctx()
    health = wait_for(ctx, url=f"{server}/health", timeout=SAFETY)
    assert health.status is Status.OK and health.msg.startswith(
        f"{server}/health to answer HTTP 200: HTTP 200 after "
    )
    models = wait_for(
        ctx, url=f"{server}/v1/models", json={"data": [{"id": "Qwen/Qwen3-8B"}]}, timeout=SAFETY
    )
    assert models.status is Status.OK, models
    wrong = wait_for(
        ctx, url=f"{server}/v1/models", json={"data": [{"id": "other"}]}, timeout=1, interval=0.3
    )
    assert wrong.failed and wrong.msg.startswith("timed out after 1 s waiting for ")
    assert '"id": "Qwen/Qwen3-8B"' in wrong.msg  # what was last seen
    missing = wait_for(ctx, url=f"{server}/nothing", timeout=1, interval=0.3)
    assert missing.failed and missing.msg.endswith("last seen: HTTP 404 not found")
    assert wait_for(ctx, url=f"{server}/nothing", status=404, timeout=SAFETY).status is Status.OK


@pytest.mark.parametrize("tool", HTTP_TOOLS)
def test_each_http_tool_reads_status_and_body(server: str, tool: str) -> None:
    if not shutil.which(tool):
        pytest.skip(f"{tool} is not installed here")
    conn = LocalConnection("localhost")
    condition = http_condition(tool, f"{server}/v1/models", 200, {"object": "list"}, 5)
    assert condition.judge(conn.run(condition.command)) == (True, f"HTTP 200 {json.dumps(MODELS)}")
    condition = http_condition(tool, f"{server}/nothing", 200, None, 5)
    assert condition.judge(conn.run(condition.command)) == (False, "HTTP 404 not found")
    condition = http_condition(tool, f"http://127.0.0.1:{free_port()}/", 200, None, 5)
    done, seen = condition.judge(conn.run(condition.command))
    assert not done and "connect" in seen.lower(), seen


@pytest.mark.parametrize("tool", TCP_TOOLS)
def test_each_tcp_tool_sees_open_and_closed_ports(server: str, tool: str) -> None:
    if not shutil.which(tool):
        pytest.skip(f"{tool} is not installed here")
    conn = LocalConnection("localhost")
    port = int(server.rpartition(":")[2])
    condition = tcp_condition(tool, "127.0.0.1", port, True, 5)
    assert condition.judge(conn.run(condition.command)) == (True, "open")
    closed = tcp_condition(tool, "127.0.0.1", free_port(), True, 5)
    done, seen = closed.judge(conn.run(closed.command))
    assert not done and seen  # the tool's own words (e.g. "Connection refused")


def test_port_opens_while_waiting_and_a_closed_one_times_out() -> None:
    with socket.socket() as listener, socket.socket() as closed:
        for sock in (listener, closed):
            sock.bind(("127.0.0.1", 0))  # bound, not listening: connections are refused
        port = listener.getsockname()[1]
        conn = Changing()
        ctx = conn.arm(listener.listen, *TCP_TOOLS)
        result = wait_for(ctx, port=port, timeout=SAFETY, interval=0.2)
        assert result.status is Status.OK and result.msg.startswith(
            f"TCP 127.0.0.1:{port} to open: open after "
        )
        assert conn.commands == 2  # refused, then open
        refused = wait_for(make_ctx(), port=closed.getsockname()[1], timeout=1, interval=0.2)
        assert refused.failed and "Connection refused" in refused.msg, refused
        listener.close()
        down = wait_for(make_ctx(), port=port, state="stopped", timeout=SAFETY)
        assert down.status is Status.OK and down.msg.startswith(
            f"TCP 127.0.0.1:{port} to close: closed"
        )


def test_file_and_regex_and_absent(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    ctx = make_ctx()
    absent = wait_for(ctx, path=str(log), timeout=1, interval=0.2)
    assert absent.failed and absent.msg == (
        f"timed out after 1 s waiting for {log} to exist; last seen: absent"
    )
    assert wait_for(ctx, path=str(log), state="absent", timeout=1).status is Status.OK
    log.write_text("INFO starting\n")
    conn = Changing()
    ready = wait_for(
        conn.arm(lambda: log.write_text("INFO starting\nINFO Application startup complete.\n")),
        path=str(log), regex="startup complete", timeout=SAFETY, interval=0.2,
    )  # fmt: skip
    assert ready.status is Status.OK and ready.msg.startswith(
        f"{log} to exist with a line matching startup complete: a line matches startup "
    )
    assert conn.commands == 2  # no such line, then the line
    never = wait_for(ctx, path=str(log), regex="^ERROR", timeout=1, interval=0.2)
    assert never.failed and never.msg.endswith("last seen: no line matches ^ERROR")


def test_command_success_and_its_last_output() -> None:
    ok = wait_for(make_ctx(), command="true", timeout=1)
    assert ok.status is Status.OK
    bad = wait_for(make_ctx(), command="echo not yet >&2; exit 3", timeout=1, interval=0.2)
    assert bad.failed and bad.msg.endswith("last seen: rc=3: not yet")


def test_check_mode_probes_once_and_does_not_wait(server: str) -> None:
    start = time.monotonic()
    waiting = wait_for(make_ctx(check=True), url=f"{server}/nothing", timeout=600)
    assert waiting.status is Status.SKIPPED
    assert waiting.msg == (
        f"check mode: would wait up to 600 s for {server}/nothing to answer HTTP 200 "
        "(now: HTTP 404 not found)"
    )
    assert time.monotonic() - start < SAFETY  # not the 10 minutes it would wait
    assert wait_for(make_ctx(check=True), url=f"{server}/health").status is Status.OK


def test_bad_arguments_say_what_to_give() -> None:
    with pytest.raises(OpError, match=r"needs one of port, url, path, command \(got none"):
        wait_for(make_ctx())
    with pytest.raises(OpError, match="got port, path"):
        wait_for(make_ctx(), port=1, path="/x")
    with pytest.raises(OpError, match="bad URL 'file:///etc/shadow'"):
        wait_for(make_ctx(), url="file:///etc/shadow")
    with pytest.raises(OpError, match="bad TCP address"):
        wait_for(make_ctx(), port=70000)
    with pytest.raises(OpError, match="unknown state 'absent'"):
        wait_for(make_ctx(), port=22, state="absent")
    with pytest.raises(OpError, match="regex goes with path"):
        wait_for(make_ctx(), command="true", regex="x")


def test_json_contains() -> None:
    assert json_contains(MODELS, {"data": [{"id": "Qwen/Qwen3-8B"}]})
    assert json_contains(MODELS, {})
    assert not json_contains(MODELS, {"data": [{"id": "Qwen/Qwen3-8B"}, {"id": "other"}]})
    assert not json_contains(MODELS, {"object": "model"})
    assert not json_contains([1, 2], {"a": 1})
    assert json_contains({"status": "ok", "n": 3}, {"n": 3})
