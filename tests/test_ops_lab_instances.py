"""Service instances on a real lab host (no systemd there: PID 1 is sshd, so the instance runs
directly, in a session of its own): check mode starts nothing, a start records its digest, a
second run leaves the running process alone, a changed environment restarts it (the old
process gone), readiness is awaited over HTTP with the load time read from the server's log,
a server that dies is reported at once with its log's tail, and ``stopped`` ends it.

The stand-in server is Python's http.server answering /v1/models as vLLM does
(vllm/entrypoints/openai/protocol.py ModelList) and logging vLLM 0.20.1's own load line
(vllm/v1/worker/gpu_model_runner.py: "Model loading took %s GiB memory and %.6f seconds").
"""

from __future__ import annotations

import json
import os

import pytest
from test_ops_lab import sh

from fxkit.connection.base import Connection
from fxkit.facts import FactCache
from fxkit.ops.base import OpContext, Result, Status
from fxkit.ops.instances import PATH, InstanceReady, instance, instance_ready, load_seconds

pytestmark = pytest.mark.lab

UNIT = "fxlab@a0.service"
SERVER = """
import http.server, json, os, sys, time
time.sleep(float(os.environ.get("DELAY", "0")))
print("Model loading took 1.25 GiB memory and 0.731000 seconds", file=sys.stderr, flush=True)
if os.environ.get("CRASH"):
    sys.exit("RuntimeError: no safetensors files in " + os.environ["CRASH"])
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"object": "list", "data": [{"id": os.environ["MODEL"]}]}).encode()
        self.send_response(200 if self.path == "/v1/models" else 404)
        self.end_headers()
        self.wfile.write(body)
http.server.HTTPServer(("127.0.0.1", int(os.environ["PORT"])), H).serve_forever()
"""
ARGV = ["python3", "-c", SERVER]


def ctx_of(conn: Connection, check: bool = False) -> OpContext:
    return OpContext(conn, FactCache(conn), check=check, diff=True)


def run(
    conn: Connection, env: dict[str, str], state: str = "started", check: bool = False
) -> Result:
    return instance(ctx_of(conn, check), UNIT, ARGV, env, state=state)


def pid_alive(conn: Connection, pid: int) -> bool:
    return conn.run(f"test -d /proc/{pid} && ! grep -q '^State:.*Z' /proc/{pid}/status").ok


def test_an_instance_starts_once_restarts_on_change_and_is_awaited(root: Connection) -> None:
    env = {"MODEL": "m1", "PORT": "18001"}
    preview = run(root, env, check=True)
    assert preview.changed and preview.msg == (
        f"would start {UNIT} directly (no systemd on this host) (stopped)"
    )
    assert not root.run(f"test -e /var/lib/fxkit/instances/{UNIT}.json").ok

    started = run(root, env)
    assert started.changed and started.data["backend"] == "direct", started
    pid = started.data["pid"]
    assert pid_alive(root, pid)
    record = json.loads(sh(root, f"cat /var/lib/fxkit/instances/{UNIT}.json"))
    assert record["pid"] == pid and record["backend"] == "direct"
    # Exactly the environment given (and systemd's PATH), nothing of the SSH session's.
    environ = sh(root, f"tr '\\0' '\\n' < /proc/{pid}/environ").split()
    assert sorted(environ) == sorted(["MODEL=m1", "PORT=18001", f"PATH={PATH}"])

    ready = instance_ready(ctx_of(root), UNIT, "http://127.0.0.1:18001/v1/models", "m1", 30)
    assert ready.status is Status.OK, ready
    assert 0 < ready.data["time_to_ready_s"] < 30
    assert ready.data["load_s"] == 0.731 and ready.data["load_source"] == "log"
    report = InstanceReady.read(ready.data)  # as the rollout reads it
    assert report is not None and (report.unit, report.backend) == (UNIT, "direct")
    assert report.time_to_ready_s == ready.data["time_to_ready_s"]

    again = run(root, env)
    assert again.status is Status.OK and again.data["pid"] == pid, again
    assert again.msg == f"{UNIT} runs as configured directly (no systemd on this host)"

    env2 = {**env, "MODEL": "m2"}
    preview = run(root, env2, check=True)
    assert preview.msg.startswith(f"would restart {UNIT}") and "configuration changed" in (
        preview.msg
    )
    assert pid_alive(root, pid)
    restarted = run(root, env2)
    assert restarted.changed and restarted.data["pid"] != pid
    assert not pid_alive(root, pid)
    ready = instance_ready(ctx_of(root), UNIT, "http://127.0.0.1:18001/v1/models", "m2", 30)
    assert ready.status is Status.OK, ready

    stopped = run(root, env2, state="stopped")
    assert stopped.changed and not pid_alive(root, restarted.data["pid"])
    assert run(root, env2, state="stopped").status is Status.OK


def test_a_server_that_dies_fails_at_once_with_its_log(root: Connection) -> None:
    env = {"MODEL": "m1", "PORT": "18002", "CRASH": "/models/missing"}
    assert run(root, env).changed
    ready = instance_ready(ctx_of(root), UNIT, "http://127.0.0.1:18002/v1/models", "m1", 120)
    assert ready.failed
    assert ready.msg.startswith(f"{UNIT} stopped before it was ready")
    assert "RuntimeError: no safetensors files in /models/missing" in ready.msg
    run(root, env, state="stopped")


def test_readiness_times_out_naming_what_it_saw(root: Connection) -> None:
    env = {"MODEL": "m1", "PORT": "18003", "DELAY": "30"}
    assert run(root, env).changed
    ready = instance_ready(ctx_of(root), UNIT, "http://127.0.0.1:18003/v1/models", "m1", 2)
    assert ready.failed and ready.msg.startswith(f"{UNIT} was not ready after 2 s")
    assert run(root, env, state="stopped").changed


#: A stand-in for setsid (which starts a direct instance): it stops its parent, the shell of
#: the operation's command, records the command line of every process on the host while that
#: shell cannot go away, lets the shell go on, then runs the real setsid.
SNOOP = """#!/bin/sh
kill -s STOP $PPID
trap 'kill -s CONT $PPID' EXIT
for f in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < "$f"; echo; done > /tmp/fxkit-cmdlines
kill -s CONT $PPID
exec /usr/bin/setsid.real "$@"
"""


def test_the_environment_is_in_no_process_s_command_line(root: Connection) -> None:
    """A secret in the environment (HF_TOKEN) is never in argv, where any user's ps sees it:
    not in the command sent to the host, nor in any process it starts."""
    token = f"hf_{os.urandom(8).hex()}"
    unit, env = "fxlab@secret.service", {"MODEL": "m1", "PORT": "18004", "HF_TOKEN": token}
    sh(root, "mv /usr/bin/setsid /usr/bin/setsid.real")
    try:
        root.put("/usr/bin/setsid", SNOOP.encode())
        sh(root, "chmod 0755 /usr/bin/setsid; rm -f /tmp/fxkit-cmdlines")
        started = instance(ctx_of(root), unit, ARGV, env)
        assert started.changed and started.data["backend"] == "direct", started
        seen = sh(root, "cat /tmp/fxkit-cmdlines")
    finally:
        sh(root, "mv -f /usr/bin/setsid.real /usr/bin/setsid")
    try:
        assert f"{unit}.json" in seen  # the operation's shell was there, held
        assert token not in seen
        now = sh(root, "cat /proc/[0-9]*/cmdline | tr '\\0' ' '")
        assert "http.server" in now and token not in now
        pid = started.data["pid"]
        assert f"HF_TOKEN={token}" in sh(root, f"tr '\\0' '\\n' < /proc/{pid}/environ")
        # The environment file and the record (its digest): root's alone; the file goes with
        # the instance.
        for path in (
            f"/var/lib/fxkit/instances/{unit}.env",
            f"/var/lib/fxkit/instances/{unit}.json",
        ):
            assert sh(root, f"stat -c '%a %U' {path}").split() == ["600", "root"]
    finally:
        assert instance(ctx_of(root), unit, ARGV, env, state="stopped").changed
    assert not root.run(f"test -e /var/lib/fxkit/instances/{unit}.env").ok


def test_load_lines_of_vllm_and_the_probe() -> None:
    # vLLM 0.20.1: gpu_model_runner.py, gpu/model_runner.py and default_loader.py.
    assert (
        load_seconds("INFO Model loading took 60.1 GiB memory and 41.123456 seconds") == 41.123456
    )
    assert load_seconds("INFO Model loading took 60.1 GiB and 12.5 seconds") == 12.5
    assert load_seconds("INFO Loading weights took 30.25 seconds") == 30.25
    assert (
        load_seconds("fxkit serve-probe: loaded 9 tensors, 1024 bytes in 0.512 s (fxkit)") == 0.512
    )
    assert load_seconds("nothing here") is None
