"""Draining an instance before it is replaced, and the user's load-balancer hooks.

Before an instance that changes revision is stopped, the deregister hook runs (the user's load
balancer stops sending it requests), then fxkit waits until the instance has no request
running: vLLM's ``/metrics`` gauge ``vllm:num_requests_running`` (vLLM's
docs/source/design/v1/metrics.md; serve-probe exposes the same) reads 0, or the drain timeout
passes. Once the new instance is ready (and, with a smoke prompt, has answered one completion
request of the right shape: :func:`smoke_problem`), the register hook runs.

A hook is a command run on the controller or a URL fxkit POSTs to. The command's words may
hold ``{host}``, ``{instance}``, ``{address}`` and ``{port}``; it also gets them as
``FXKIT_HOOK_HOST``, ``FXKIT_HOOK_INSTANCE``, ``FXKIT_HOOK_ADDRESS``, ``FXKIT_HOOK_PORT`` and
``FXKIT_HOOK_EVENT`` (``register`` or ``deregister``). The URL gets those as a JSON object.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from shlex import quote

from fxkit.connection import Connection
from fxkit.errors import FxkitError

#: One sample of the gauge (any labels): its value.
RUNNING = re.compile(r"^vllm:num_requests_running(?:\{[^}]*\})?\s+(\S+)", re.M)
#: Seconds a hook may take.
HOOK_TIMEOUT = 30.0


@dataclass(frozen=True)
class Target:
    """The instance a hook is about, as the load balancer knows it."""

    host: str
    instance: str
    address: str
    port: int

    def fields(self, event: str) -> dict[str, str]:
        return {
            "event": event,
            "host": self.host,
            "instance": self.instance,
            "address": self.address,
            "port": str(self.port),
        }


@dataclass(frozen=True)
class Hook:
    """A command (``shlex``-split words) or an ``http(s)://`` URL to POST to."""

    spec: str

    def __post_init__(self) -> None:
        if not self.spec.strip():
            raise FxkitError("an empty hook", hint="a command, or an http:// URL to POST to")
        if not self.is_url:
            try:
                shlex.split(self.spec)
            except ValueError as exc:
                raise FxkitError(
                    f"hook {self.spec!r}: {exc}", hint="quote it as sh would"
                ) from None

    @property
    def is_url(self) -> bool:
        return self.spec.startswith(("http://", "https://"))

    def run(self, event: str, target: Target) -> str:
        """Run the hook for ``target``; "" when it succeeded, else what went wrong."""
        fields = target.fields(event)
        if self.is_url:
            request = urllib.request.Request(
                self.spec,
                data=json.dumps(fields).encode(),
                headers={"Content-Type": "application/json"},
                method="POST",
            )
            try:
                with urllib.request.urlopen(request, timeout=HOOK_TIMEOUT) as answer:
                    answer.read()
            except OSError as exc:
                return f"{event} hook {self.spec}: {exc}"
            return ""
        words = [word.format(**fields) for word in shlex.split(self.spec)]
        env = {**os.environ, **{f"FXKIT_HOOK_{k.upper()}": v for k, v in fields.items()}}
        try:
            done = subprocess.run(
                words, env=env, capture_output=True, text=True, timeout=HOOK_TIMEOUT, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"{event} hook {words[0]}: {exc}"
        if done.returncode != 0:
            return f"{event} hook {words[0]} exited {done.returncode}: {done.stderr.strip()[-300:]}"
        return ""


def requests_running(text: str) -> float | None:
    """The sum of ``vllm:num_requests_running`` in Prometheus text; None when it has none."""
    values = [float(v) for v in RUNNING.findall(text)]
    return sum(values) if values else None


def metrics_url(ready_url: str) -> str:
    """An instance's ``/metrics`` beside its ``/v1/models``."""
    return ready_url.rsplit("/v1/models", 1)[0] + "/metrics"


def wait_drained(
    conn: Connection, become: bool, url: str, timeout: float, interval: float = 0.2
) -> tuple[bool, float]:
    """Wait on the host until ``url`` (the instance's /metrics) says no request runs, or it
    does not answer (it serves nothing then), or ``timeout`` passes: (drained, seconds)."""
    q = quote(url)
    fetch = (
        f"curl -fsS -m 5 {q} 2>/dev/null || python3 -c 'import sys, urllib.request as u; "
        f"print(u.urlopen(sys.argv[1], timeout=5).read().decode())' {q} 2>/dev/null"
    )
    start = time.monotonic()
    while True:
        out = conn.run(fetch, become=become)
        running = requests_running(out.stdout) if out.ok else 0.0
        waited = time.monotonic() - start
        if running is None or running <= 0:
            return True, round(waited, 3)
        if waited >= timeout:
            return False, round(waited, 3)
        time.sleep(interval)


def smoke_command(ready_url: str, served_name: str, prompt: str) -> str:
    """POSTs one completion request to the instance (run on its host); prints the answer."""
    url = quote(ready_url.rsplit("/v1/models", 1)[0] + "/v1/completions")
    body = quote(json.dumps({"model": served_name, "prompt": prompt, "max_tokens": 1}))
    return (
        f"curl -fsS -m 30 -H 'Content-Type: application/json' -d {body} {url} 2>&1 || "
        "python3 -c 'import sys, urllib.request as u; print(u.urlopen(u.Request(sys.argv[1], "
        'sys.argv[2].encode(), {"Content-Type": "application/json"}), timeout=30)'
        f".read().decode())' {url} {body}"
    )


def smoke_problem(answer: str, served_name: str) -> str:
    """What is wrong with a completion answer ("" when it has the shape of vLLM's
    ``CompletionResponse``: ``object`` text_completion, ``model``, ``choices[0].text``)."""
    try:
        data = json.loads(answer)
        choice = data["choices"][0]
    except (ValueError, KeyError, IndexError, TypeError):
        return f"not a completion: {answer.strip()[-300:]!r}"
    if data.get("object") != "text_completion" or data.get("model") != served_name:
        return f"object {data.get('object')!r}, model {data.get('model')!r}: not {served_name}'s"
    if not isinstance(choice.get("text"), str):
        return "choices[0].text is not a string"
    return ""
