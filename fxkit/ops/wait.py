"""Waiting for a condition on a host: a TCP port, an HTTP endpoint, a file, a command.

The host probes it (the endpoint as the host sees it, e.g. a server bound to 127.0.0.1 there),
the controller polls until the condition holds or the timeout passes; a timeout fails with what
the last probe saw.

Check mode probes once and does not wait: the condition holding is ``ok``; otherwise the result
is ``skipped`` ("check mode: would wait ..."), because what it waits for is often what the run
would have started (a service check mode did not start), so waiting, or failing, would only
report on changes that check mode does not make.
"""

from __future__ import annotations

import json as jsonlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from shlex import quote
from typing import Any

from fxkit.connection.base import RunResult
from fxkit.facts.tools import Executables
from fxkit.ops.base import OpContext, OpError, Result, check_state, failed, ok, skipped
from fxkit.ops.files import check_path

#: The longest one probe may take (capped by what is left of the timeout).
PROBE_TIMEOUT = 10.0

_PY_TCP = (
    "import socket,sys\n"
    "try: socket.create_connection((sys.argv[1], int(sys.argv[2])), float(sys.argv[3])).close()\n"
    "except OSError as e: sys.exit(str(e))"
)
_PY_HTTP = (
    "import sys,urllib.request as u,urllib.error as e\n"
    "try: r=u.urlopen(sys.argv[1],timeout=float(sys.argv[2])); c,b=r.status,r.read()\n"
    "except e.HTTPError as x: c,b=x.code,x.read()\n"
    "except Exception as x: sys.stderr.write(str(x)); c,b=0,b''\n"
    "sys.stdout.write(b.decode(errors='replace')+'\\n'+str(c))"
)


@dataclass(frozen=True)
class Condition:
    """What is awaited (``what``), the host's command testing it, and ``judge``: the command's
    result -> whether the condition holds and what was seen."""

    what: str
    command: str
    judge: Callable[[RunResult], tuple[bool, str]]


def wait_for(
    ctx: OpContext,
    port: int | None = None,
    host: str = "127.0.0.1",
    url: str | None = None,
    status: int = 200,
    json: Any = None,
    path: str | None = None,
    regex: str | None = None,
    command: str | None = None,
    state: str | None = None,
    timeout: float = 300.0,
    interval: float = 1.0,
) -> Result:
    """Wait until one condition holds on the host, at most ``timeout`` seconds, probing every
    ``interval`` seconds:

    - ``port``: a TCP connection to ``host:port`` succeeds (``state="stopped"``: it is refused);
    - ``url``: an HTTP(S) GET answers ``status`` and, when given, a body whose JSON contains
      ``json`` (dicts: these keys with matching values; lists: each item matches one item);
    - ``path``: the file exists (``state="absent"``: it does not), with a line matching
      ``regex`` (an extended regular expression, as ``grep -E``) when given;
    - ``command``: the command (``sh -c``) exits 0.

    In check mode it probes once and does not wait (see the module's docstring).

    Example::

        host.wait_for(url="http://127.0.0.1:8000/health", timeout=900)
        host.wait_for(url="http://127.0.0.1:8000/v1/models", json={"data": [{"id": model}]})
    """
    if timeout <= 0 or interval <= 0:
        raise OpError(f"bad timeout {timeout!r} or interval {interval!r}", hint="seconds > 0")
    condition = _condition(ctx, port, host, url, status, json, path, regex, command, state, timeout)
    if isinstance(condition, Result):
        return condition
    start = time.monotonic()
    deadline = start + timeout
    while True:
        left = deadline - time.monotonic()
        result = ctx.read(condition.command, timeout=max(1.0, min(PROBE_TIMEOUT, left)) + 5)
        done, seen = condition.judge(result)
        elapsed = time.monotonic() - start
        if done:
            return ok(f"{condition.what}: {seen} after {elapsed:.1f} s", seen=seen)
        if ctx.check:
            return skipped(
                f"check mode: would wait up to {timeout:g} s for {condition.what} (now: {seen})",
                seen=seen,
            )
        left = deadline - time.monotonic()
        if left <= 0:
            return failed(
                f"timed out after {timeout:g} s waiting for {condition.what}; last seen: {seen}",
                seen=seen,
            )
        time.sleep(min(interval, left))


def _condition(
    ctx: OpContext,
    port: int | None,
    host: str,
    url: str | None,
    status: int,
    json: Any,
    path: str | None,
    regex: str | None,
    command: str | None,
    state: str | None,
    timeout: float,
) -> Condition | Result:
    """The condition asked for (a failed Result when the host has no tool)."""
    given = [
        k
        for k, v in {"port": port, "url": url, "path": path, "command": command}.items()
        if v is not None
    ]
    if len(given) != 1:
        raise OpError(
            f"wait_for needs one of port, url, path, command (got {', '.join(given) or 'none'})",
            hint="e.g. host.wait_for(port=8000) or host.wait_for(url='http://127.0.0.1:8000/health')",
        )
    kind = given[0]
    if (regex is not None and kind != "path") or (json is not None and kind != "url"):
        raise OpError("regex goes with path, json with url")
    check_state(state, _STATES.get(kind, (None,)))
    seconds = max(1.0, min(PROBE_TIMEOUT, timeout))
    if command is not None:
        return Condition(f"`{command}` to succeed", f"sh -c {quote(command)}", _command_judge)
    if path is not None:
        return file_condition(path, regex, state != "absent")
    if port is not None:
        check_address(host, port)
        tools = ctx.fact(Executables, *TCP_TOOLS)
        if not tools:
            return failed(
                f"cannot probe TCP {host}:{port}: the host has none of {', '.join(TCP_TOOLS)}"
            )
        return tcp_condition(tools[0], host, port, state != "stopped", seconds)
    assert url is not None
    check_url(url)
    tools = ctx.fact(Executables, *HTTP_TOOLS)
    if not tools:
        return failed(f"cannot probe {url}: the host has none of {', '.join(HTTP_TOOLS)}")
    return http_condition(tools[0], url, status, json, seconds)


#: The commands that probe a TCP port, the first the host has is used; the same for HTTP.
TCP_TOOLS = ("bash", "python3", "nc")
HTTP_TOOLS = ("curl", "python3")
_STATES = {"port": (None, "started", "stopped"), "path": (None, "present", "absent")}


def check_address(host: str, port: int) -> None:
    if not isinstance(port, int) or not 0 < port < 65536 or not host or "/" in host:
        raise OpError(f"bad TCP address {host!r}:{port!r}", hint="a host or address, port 1-65535")


def check_url(url: str) -> None:
    if not url.startswith(("http://", "https://")) or any(c.isspace() for c in url):
        raise OpError(f"bad URL {url!r}", hint="an http:// or https:// URL")


def tcp_condition(tool: str, host: str, port: int, up: bool, seconds: float) -> Condition:
    """A connection to ``host:port`` with ``tool`` (one of :data:`TCP_TOOLS`)."""
    h, p = quote(host), str(port)
    commands = {
        "bash": f"timeout {seconds:g} bash -c 'exec 3<>\"/dev/tcp/$0/$1\"' {h} {p}",
        "python3": f"python3 -c {quote(_PY_TCP)} {h} {p} {seconds:g}",
        "nc": f"nc -z -w {max(1, int(seconds))} {h} {p}",
    }

    def judge(result: RunResult) -> tuple[bool, str]:
        # Why it is closed matters only while waiting for it to open.
        seen = "open" if result.ok else (_tail(result) if up else "") or "closed"
        return result.ok == up, seen

    what = f"TCP {host}:{port} to {'open' if up else 'close'}"
    return Condition(what, f"{commands[tool]} 2>&1", judge)


def http_condition(tool: str, url: str, status: int, json: Any, seconds: float) -> Condition:
    """A GET of ``url`` with ``tool`` (one of :data:`HTTP_TOOLS`); it prints the body, then the
    status on a line of its own (0: no answer)."""
    if tool == "curl":
        command = f"curl -sS -L --max-time {seconds:g} -w '\\n%{{http_code}}' -- {quote(url)}"
    else:
        command = f"python3 -c {quote(_PY_HTTP)} {quote(url)} {seconds:g}"

    def judge(result: RunResult) -> tuple[bool, str]:
        body, _, code = result.stdout.rpartition("\n")
        if not code.strip().isdigit() or int(code) == 0:
            return False, _tail(result) or "no answer"
        seen = f"HTTP {int(code)}"
        if int(code) != status:
            return False, f"{seen} {body.strip()[:200]}".rstrip()
        if json is None:
            return True, seen
        try:
            answer = jsonlib.loads(body)
        except ValueError:
            return False, f"{seen}, not JSON: {body.strip()[:200]}"
        return json_contains(answer, json), f"{seen} {jsonlib.dumps(answer)[:300]}"

    expect = f"HTTP {status}" + (f" with JSON containing {jsonlib.dumps(json)}" if json else "")
    return Condition(f"{url} to answer {expect}", command, judge)


def file_condition(path: str, regex: str | None, present: bool) -> Condition:
    """``path`` exists (with a line matching ``regex``) or is absent."""
    check_path(path)
    q = quote(path)
    test = (
        f"grep -Eq -e {quote(regex)} -- {q} && echo match || echo nomatch"
        if regex
        else "echo present"
    )
    command = f"if [ -e {q} ]; then {test}; else echo absent; fi"
    wanted = ("match" if regex else "present") if present else "absent"
    seen_as = {"match": f"a line matches {regex}", "nomatch": f"no line matches {regex}"}

    def judge(result: RunResult) -> tuple[bool, str]:
        word = result.stdout.strip()
        return word == wanted, seen_as.get(word, word or _tail(result))

    what = f"{path} to {'exist' if present else 'be absent'}"
    return Condition(
        what + (f" with a line matching {regex}" if regex and present else ""), command, judge
    )


def _command_judge(result: RunResult) -> tuple[bool, str]:
    return result.ok, f"rc={result.rc}" + (f": {_tail(result)}" if _tail(result) else "")


def _tail(result: RunResult) -> str:
    return (result.stderr.strip() or result.stdout.strip())[-300:]


def json_contains(actual: Any, expected: Any) -> bool:
    """Whether ``actual`` contains ``expected``: a dict's keys with matching values (others may
    be there), a list with an item matching each expected item, any other value equal."""
    if isinstance(expected, dict):
        return isinstance(actual, dict) and all(
            k in actual and json_contains(actual[k], v) for k, v in expected.items()
        )
    if isinstance(expected, list):
        return isinstance(actual, list) and all(
            any(json_contains(a, e) for a in actual) for e in expected
        )
    return bool(actual == expected)
