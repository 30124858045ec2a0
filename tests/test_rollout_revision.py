"""Revisions, drain and hooks without a lab host: the revision id is content-addressed (the
model's digest from a real stage manifest of ``fxkit stage``), the record on the host keeps no
environment value, a drain reads vLLM's ``vllm:num_requests_running`` (the sample of vLLM's
docs/source/design/v1/metrics.md) from a real serve-probe whose requests are in flight, and the
hooks run a real command and POST to a real HTTP server. The runs on lab hosts:
tests/test_rollout_revisions_lab.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pytest
from test_probe import ServeProbe, model  # noqa: F401 (the module's checkpoint fixture)

from fxkit.connection.local import LocalConnection
from fxkit.errors import FxkitError
from fxkit.rollout.drain import (
    Hook,
    Target,
    metrics_url,
    requests_running,
    smoke_command,
    smoke_problem,
    wait_drained,
)
from fxkit.rollout.revision import model_digest, parse_list, record_json, revision_id

INPUTS = {"model": "/srv/m", "flags": [["--served-model-name", "m"]], "env": {"HF_TOKEN": "s3"}}
#: vLLM's gauge as its /metrics writes it (docs/source/design/v1/metrics.md, model_name label).
VLLM_METRICS = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="llama"} 3.0
vllm:num_requests_running{engine="1",model_name="llama"} 1.0
vllm:num_requests_waiting{engine="0",model_name="llama"} 7.0
"""


def staged(tmp_path: Path, content: bytes) -> bytes:
    """The manifest ``fxkit stage`` writes for a folder of one file."""
    src, dest = tmp_path / "src", tmp_path / "dest"
    src.mkdir(parents=True)
    (src / "model.safetensors").write_bytes(content)
    done = subprocess.run(
        [sys.executable, "-m", "fxkit", "stage", str(src), str(dest)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return (dest / ".fxkit-stage.json").read_bytes()


def test_the_revision_is_content_addressed(tmp_path: Path) -> None:
    one = staged(tmp_path / "a", b"weights-1")
    again = staged(tmp_path / "b", b"weights-1")  # other mtimes, the same bytes
    other = staged(tmp_path / "c", b"weights-2")
    assert one != again  # the manifests differ (times), the model does not
    assert model_digest(one) == model_digest(again) != model_digest(other)
    assert model_digest(None) == model_digest(b"not json") == ""
    rev = revision_id(INPUTS, model_digest(one))
    assert rev.startswith("r-") and len(rev) == 14
    assert revision_id(dict(reversed(INPUTS.items())), model_digest(again)) == rev
    assert revision_id(INPUTS, model_digest(other)) != rev
    changed_unit = {**INPUTS, "unit": "[Service]\nNice=5\n"}
    assert revision_id(changed_unit, model_digest(one)) != rev
    secret = {**INPUTS, "env": {"HF_TOKEN": "s4"}}
    assert revision_id(secret, model_digest(one)) != rev


def test_the_record_keeps_no_environment_value() -> None:
    text = record_json("r-000000000001", INPUTS, "ab")
    assert "s3" not in text
    body = json.loads(text)
    assert body["inputs"]["env"]["HF_TOKEN"].startswith("sha256:")
    [kept] = parse_list(f"1700000000\t2\t{text.replace(chr(10), '')}\nnoise\n")
    assert kept.revision == "r-000000000001" and kept.created == 1700000000.0 and kept.runs


def test_requests_running_is_the_sum_of_vllms_gauge() -> None:
    assert requests_running(VLLM_METRICS) == 4.0
    assert requests_running("fxkit_load_seconds 1.0\n") is None
    assert metrics_url("http://10.0.0.1:8001/v1/models") == "http://10.0.0.1:8001/metrics"


def post(port: int, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as answer:
        result: dict[str, Any] = json.loads(answer.read())
        return result


def test_a_drain_waits_for_the_probes_running_requests(model: Path) -> None:  # noqa: F811
    os.environ["PROBE_COMPLETION_SECONDS"] = "1.5"
    try:
        probe = ServeProbe(model, "--served-model-name", "llama")
    finally:
        del os.environ["PROBE_COMPLETION_SECONDS"]
    try:
        probe.wait_ready()
        answers: list[dict[str, Any]] = []
        body = {"model": "llama", "prompt": "hello world", "max_tokens": 3}
        clients = [threading.Thread(target=lambda: answers.append(post(probe.port, body)))]
        clients.append(threading.Thread(target=lambda: answers.append(post(probe.port, body))))
        for client in clients:
            client.start()
        time.sleep(0.5)
        url = f"http://127.0.0.1:{probe.port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as page:
            assert requests_running(page.read().decode()) == 2.0
        with LocalConnection("localhost") as conn:
            drained, seconds = wait_drained(conn, False, url, timeout=30)
        assert drained and 0.5 < seconds < 5
        for client in clients:
            client.join()
        assert [a["choices"][0]["text"] for a in answers] == ["hello hello hello"] * 2
        assert answers[0]["object"] == "text_completion" and answers[0]["model"] == "llama"
        assert answers[0]["usage"] == {"prompt_tokens": 2, "completion_tokens": 3,
                                       "total_tokens": 5}  # fmt: skip
        with LocalConnection("localhost") as conn:  # nothing runs: at once
            drained, seconds = wait_drained(conn, False, url, timeout=30)
        assert drained and seconds < 1
        post(probe.port, {**body, "max_tokens": 1})  # still serving after a drain
        ready_url = f"http://127.0.0.1:{probe.port}/v1/models"
        with LocalConnection("localhost") as conn:
            answer = conn.run(smoke_command(ready_url, "llama", "it's a test")).stdout
            wrong = conn.run(smoke_command(ready_url, "other", "hi")).stdout
        assert smoke_problem(answer, "llama") == "", answer
        assert smoke_problem(answer, "other").endswith("not other's")
        assert smoke_problem(wrong, "other").startswith("not a completion: ")
    finally:
        code, _ = probe.stop()
    assert code == 0


def test_a_command_hook_gets_the_instance(tmp_path: Path) -> None:
    out = tmp_path / "hook.txt"
    script = f'echo "$FXKIT_HOOK_EVENT $0 $1" >> {out}'
    hook = Hook(f"sh -c '{script}' {{address}}:{{port}} {{instance}}")
    target = Target("lab01", "tp4-0", "10.9.0.2", 8000)
    assert hook.run("deregister", target) == ""
    assert hook.run("register", target) == ""
    assert out.read_text() == "deregister 10.9.0.2:8000 tp4-0\nregister 10.9.0.2:8000 tp4-0\n"
    failing = Hook("sh -c 'echo no such backend >&2; exit 3'")
    assert failing.run("deregister", target) == ("deregister hook sh exited 3: no such backend")
    with pytest.raises(FxkitError, match="No closing quotation"):
        Hook("lb-ctl 'remove")


def test_a_url_hook_posts_the_instance() -> None:
    got: list[dict[str, str]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            got.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        hook = Hook(f"http://127.0.0.1:{server.server_port}/backends")
        assert hook.run("register", Target("lab02", "tp4-1", "10.9.0.3", 8001)) == ""
    finally:
        server.shutdown()
    assert got == [{"event": "register", "host": "lab02", "instance": "tp4-1",
                    "address": "10.9.0.3", "port": "8001"}]  # fmt: skip
    down = Hook("http://127.0.0.1:9/nothing")
    assert down.run("register", Target("h", "i", "a", 1)).startswith("register hook http://")
