"""``fxkit serve-probe``: the real service started as a subprocess on a loopback port, asked over
HTTP. /v1/models is checked against vLLM's own ``ModelList``/``ModelCard``/``ModelPermission``
(``vllm/entrypoints/openai/engine/protocol.py`` in vLLM 0.20.1's sdist, the field's version), and
/metrics with prometheus_client's own parser."""

from __future__ import annotations

import ast
import json
import re
import resource
import selectors
import signal
import socket
import subprocess
import sys
import tarfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import uvicorn
from fxkit.loader import make_checkpoint, open_checkpoint
from prometheus_client.parser import text_string_to_metric_families

from fxkit.serve_probe import Loaded, listen, make_app
from fxkit.serve_probe_guard import ACCEPT_BATCH, HEADER_TIMEOUT, GuardedConfig

VLLM = "0.20.1"
PROTOCOL = f"vllm-{VLLM}/vllm/entrypoints/openai/engine/protocol.py"
LINE = re.compile(
    r"fxkit serve-probe: loaded (\d+) tensors, (\d+) bytes in (\d+\.\d{3}) s \((\w+)\)"
)
START = 120.0  # seconds: a probe imports torch, loads and binds within far less


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def port_open(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def get(port: int, path: str) -> tuple[int, str, bytes]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as response:
        return response.status, response.headers["content-type"] or "", response.read()


class ServeProbe:
    """``fxkit serve-probe MODEL --port P ARGS`` in a process of its own, stopped by PID;
    ``soft_fds`` sets its soft limit of open files."""

    def __init__(self, model: Path | str, *args: str, soft_fds: int | None = None) -> None:
        self.port = free_port()
        argv = [sys.executable, "-m", "fxkit", "serve-probe", str(model), "--port", str(self.port)]
        if soft_fds is not None:
            argv = ["sh", "-c", 'ulimit -S -n "$0" && exec "$@"', str(soft_fds), *argv]
        self.proc = subprocess.Popen(
            [*argv, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        self.started = time.time()

    def wait_ready(self) -> None:
        """Until /v1/models answers (fails with the probe's stderr if it exits first)."""
        deadline = time.monotonic() + START
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"probe exited {self.proc.returncode}: {self.proc.stderr.read()}")
            try:
                get(self.port, "/v1/models")
                return
            except OSError:
                time.sleep(0.05)
        pytest.fail(f"probe not ready after {START} s")

    def stop(self) -> tuple[int, str]:
        """SIGTERM; the exit status and stderr."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            _, err = self.proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            _, err = self.proc.communicate()
        return self.proc.returncode, err

    def metrics(self) -> dict[str, tuple[dict[str, str], float]]:
        status, kind, body = get(self.port, "/metrics")
        assert status == 200 and kind.startswith("text/plain")
        return {
            s.name: (s.labels, s.value)
            for family in text_string_to_metric_families(body.decode())
            for s in family.samples
        }


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_checkpoint(tmp_path_factory.mktemp("probe") / "llama", 8 << 20, shards=2)


@pytest.fixture(scope="module")
def probe(model: Path) -> Iterator[ServeProbe]:
    """One probe serving ``model`` as "probe-llama", shared by the read-only tests."""
    running = ServeProbe(model, "--served-model-name", "probe-llama")
    try:
        running.wait_ready()
        yield running
    finally:
        running.stop()


def vllm_fields() -> dict[str, dict[str, ast.expr | None]]:
    """vLLM's ``ModelList``, ``ModelCard``, ``ModelPermission``: {class: {field: default}}."""
    from vllm_source import sdist

    with tarfile.open(sdist(VLLM)) as tar:
        member = tar.extractfile(PROTOCOL)
        assert member is not None
        tree = ast.parse(member.read())
    wanted = ("ModelList", "ModelCard", "ModelPermission")
    return {
        node.name: {
            item.target.id: item.value
            for item in node.body
            if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)
        }
        for node in tree.body
        if isinstance(node, ast.ClassDef) and node.name in wanted
    }


def literal_defaults(fields: dict[str, ast.expr | None]) -> dict[str, object]:
    """The fields whose default is a constant (not a ``Field(default_factory=...)``)."""
    return {
        name: ast.literal_eval(value)
        for name, value in fields.items()
        if isinstance(value, ast.Constant)
    }


def test_models_has_vllm_model_list_shape(probe: ServeProbe, model: Path) -> None:
    vllm = vllm_fields()
    status, kind, body = get(probe.port, "/v1/models")
    assert status == 200 and kind == "application/json"
    listing = json.loads(body)
    assert set(listing) == set(vllm["ModelList"]) and listing["object"] == "list"
    (card,) = listing["data"]
    assert set(card) == set(vllm["ModelCard"])
    # vLLM's constant defaults, but for what its server sets itself (owned_by is ours to name).
    assert {k: card[k] for k in literal_defaults(vllm["ModelCard"]) if k != "owned_by"} == {
        k: v for k, v in literal_defaults(vllm["ModelCard"]).items() if k != "owned_by"
    } | {"root": str(model)}
    assert card["id"] == "probe-llama" and card["owned_by"] == "fxkit"
    assert isinstance(card["created"], int) and abs(card["created"] - time.time()) < 60
    (permission,) = card["permission"]
    assert set(permission) == set(vllm["ModelPermission"])
    assert {k: permission[k] for k in literal_defaults(vllm["ModelPermission"])} == (
        literal_defaults(vllm["ModelPermission"])
    )
    assert permission["id"].startswith("modelperm-")


def test_health_is_200_and_empty(probe: ServeProbe) -> None:
    assert get(probe.port, "/health")[0::2] == (200, b"")


def test_metrics_count_the_checkpoint(probe: ServeProbe, model: Path) -> None:
    checkpoint = open_checkpoint(model)
    metrics = probe.metrics()
    assert metrics["fxkit_load_bytes"][1] == checkpoint.total_bytes
    assert metrics["fxkit_load_tensors"][1] == len(checkpoint)
    assert metrics["fxkit_load_seconds"][1] > 0
    assert metrics["fxkit_load_info"] == ({"format": "fxkit", "model": "probe-llama"}, 1.0)
    assert metrics["process_resident_memory_bytes"][1] > checkpoint.total_bytes


def test_logs_one_load_line_that_agrees_with_metrics(model: Path) -> None:
    probe = ServeProbe(model)
    probe.wait_ready()
    metrics = probe.metrics()
    status, err = probe.stop()
    assert status == 0, err
    (line,) = [m.groups() for m in LINE.finditer(err)]
    tensors, nbytes, seconds, load_format = line
    assert (int(tensors), int(nbytes), load_format) == (
        metrics["fxkit_load_tensors"][1],
        metrics["fxkit_load_bytes"][1],
        "fxkit",
    )
    assert float(seconds) == pytest.approx(metrics["fxkit_load_seconds"][1], abs=1e-3)


def test_baseline_loader_serves_the_same(model: Path) -> None:
    probe = ServeProbe(model, "--load-format", "safetensors")
    try:
        probe.wait_ready()
        metrics = probe.metrics()
        card = json.loads(get(probe.port, "/v1/models")[2])["data"][0]
    finally:
        status, err = probe.stop()
    assert status == 0, err
    assert card["id"] == str(model)  # --served-model-name defaults to MODEL, as in vLLM
    assert metrics["fxkit_load_bytes"][1] == open_checkpoint(model).total_bytes
    assert metrics["fxkit_load_info"][0]["format"] == "safetensors"
    assert "(safetensors)" in err


def test_port_opens_only_after_the_weights_are_in(model: Path) -> None:
    # Small O_DIRECT reads stretch the load (2048 reads) so a port bound early would be seen.
    probe = ServeProbe(
        model, "--no-share", "--direct-io", "on", "--threads", "1", "--chunk-size", "4KiB"
    )
    first = None
    deadline = time.monotonic() + START
    while first is None and probe.proc.poll() is None and time.monotonic() < deadline:
        if port_open(probe.port):
            first = time.time()
        time.sleep(0.002)
    assert first is not None, probe.stop()
    metrics = probe.metrics()
    status, err = probe.stop()
    assert status == 0, err
    assert first >= metrics["fxkit_load_end_time_seconds"][1]


def test_sigterm_stops_it_cleanly(model: Path) -> None:
    own = ServeProbe(model)
    own.wait_ready()
    status, err = own.stop()
    assert status == 0, err
    assert "Traceback" not in err and "Finished server process" in err
    assert not port_open(own.port)


def _corrupt(directory: Path, model: Path) -> Path:
    directory.mkdir()
    good = sorted(model.glob("*.safetensors"))[0]
    (directory / good.name).write_bytes(good.read_bytes()[:-1000])  # tensor data cut short
    return directory


@pytest.mark.parametrize(
    ("case", "says"),
    [
        ("missing", "no such"),
        ("empty", "no *.safetensors files"),
        ("corrupt", "past the end of the file"),
    ],
)
def test_bad_model_exits_2_without_binding(
    tmp_path: Path, model: Path, case: str, says: str
) -> None:
    target = tmp_path / case
    if case == "empty":
        target.mkdir()
    elif case == "corrupt":
        _corrupt(target, model)
    probe = ServeProbe(target)
    seen_open = False
    while probe.proc.poll() is None:
        seen_open = seen_open or port_open(probe.port)
        time.sleep(0.005)
    status, err = probe.stop()
    assert status == 2, err
    assert not seen_open and not port_open(probe.port)
    assert "Traceback" not in err
    (message,) = [line for line in err.splitlines() if line.startswith("error:")]
    assert str(target) in message and says in err.lower()


def test_port_in_use_is_a_clear_error(model: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        argv = [sys.executable, "-m", "fxkit", "serve-probe", str(model), "--port", str(port)]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=START, check=False)
    assert done.returncode == 2, done.stderr
    assert f"cannot listen on 127.0.0.1:{port}" in done.stderr
    assert "Traceback" not in done.stderr


def test_unknown_load_format_is_refused(model: Path) -> None:
    argv = [sys.executable, "-m", "fxkit", "serve-probe", str(model), "--port", "1"]
    done = subprocess.run(
        [*argv, "--load-format", "tensorizer"], capture_output=True, text=True, check=False,
        timeout=START,
    )  # fmt: skip
    assert done.returncode == 2 and "'tensorizer' is not one of" in done.stderr


# -- slow clients ------------------------------------------------------------------------------

#: A request head that never ends, sent one byte at a time.
SLOW_HEAD = b"GET /health HTTP/1.1\r\nHost: probe\r\nX-Slow: " + b"a" * 4000


def connected(port: int, count: int) -> list[socket.socket]:
    """``count`` clients connected to ``port`` (the kernel's handshake done), sending nothing."""
    clients = [socket.socket() for _ in range(count)]
    with selectors.DefaultSelector() as pending:
        for sock in clients:
            sock.setblocking(False)
            sock.connect_ex(("127.0.0.1", port))
            pending.register(sock, selectors.EVENT_WRITE)
        deadline = time.monotonic() + START
        while pending.get_map() and time.monotonic() < deadline:
            for key, _ in pending.select(timeout=1):
                pending.unregister(key.fileobj)
        assert not pending.get_map(), f"{len(pending.get_map())} clients never connected"
    return clients


class Trickle:
    """Clients that send :data:`SLOW_HEAD` one byte each every ``gap`` seconds, from a thread,
    until the server has closed every one of them (or the block ends)."""

    def __init__(self, clients: list[socket.socket], gap: float = 0.2) -> None:
        self.open, self.gap, self.sent = clients, gap, 0
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run)

    def __enter__(self) -> Trickle:
        self.thread.start()
        return self

    def _run(self) -> None:
        while self.open and not self.stopping.wait(self.gap):
            byte = bytes([SLOW_HEAD[self.sent % len(SLOW_HEAD)]])
            self.sent += 1
            still = []
            for sock in self.open:
                try:
                    sock.send(byte)
                    still.append(sock)
                except OSError:  # the server closed it
                    sock.close()
            self.open = still

    def wait_all_closed(self, within: float) -> None:
        self.thread.join(within)
        assert not self.open, f"{len(self.open)} slow clients still open after {within} s"

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        self.thread.join()
        for sock in self.open:
            sock.close()


@contextmanager
def more_open_files(count: int) -> Iterator[int]:
    """This process's soft limit of open files raised for ``count`` more (up to the hard limit);
    how many it allows."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = count + 256
    if hard != resource.RLIM_INFINITY:
        wanted = min(wanted, hard)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, wanted), hard))
    try:
        yield max(soft, wanted) - 256
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


HEALTH_WITHIN = 2.0  # seconds: what a liveness probe waits


def test_health_answers_while_1100_clients_trickle(model: Path) -> None:
    """At the usual default soft limit of 1024 open files, 1100 clients that trickle their
    request heads took them all and /health went unanswered for 75 s or more."""
    probe = ServeProbe(model, soft_fds=1024)
    try:
        probe.wait_ready()
        with (
            more_open_files(1100) as allowed,
            Trickle(connected(probe.port, min(1100, allowed))) as slow,
        ):
            for _ in range(5):
                started = time.monotonic()
                status, _, _ = get(probe.port, "/health")
                assert status == 200 and time.monotonic() - started < HEALTH_WITHIN
            slow.wait_all_closed(within=HEADER_TIMEOUT + 30)  # the server ends them itself
        status, _, _ = get(probe.port, "/health")
        assert status == 200
    finally:
        code, err = probe.stop()
    assert code == 0, err
    assert "Too many open files" not in err and "Traceback" not in err, err[-2000:]


@contextmanager
def guarded_server(max_connections: int, header_timeout: float) -> Iterator[int]:
    """serve-probe's app and guard in a thread of this process, with small bounds; its port."""
    app = make_app(Loaded("m", {}, 0, 0.0, "fxkit", time.time()), "m")
    sock = listen("127.0.0.1", 0, ACCEPT_BATCH)  # connections queue until the server runs
    config = GuardedConfig(
        app, max_connections=max_connections, header_timeout=header_timeout,
        log_level="warning", lifespan="off",
    )  # fmt: skip
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]})
    thread.start()
    try:
        yield sock.getsockname()[1]
    finally:
        server.should_exit = True
        thread.join()
        sock.close()


def ask_health(sock: socket.socket) -> bytes:
    """One /health request on ``sock`` (kept alive); the response's status line."""
    sock.sendall(b"GET /health HTTP/1.1\r\nHost: probe\r\n\r\n")
    response = b""
    while b"\r\n\r\n" not in response:
        chunk = sock.recv(4096)
        assert chunk, "closed before the response"
        response += chunk
    return response.split(b"\r\n")[0]


def closed_by_server(sock: socket.socket, within: float) -> bool:
    """Whether the server closes ``sock`` (an end of file or a reset) within ``within`` s."""
    sock.settimeout(within)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def test_past_the_cap_the_connection_waiting_longest_closes() -> None:
    with guarded_server(max_connections=3, header_timeout=60) as port:
        first, second = (socket.create_connection(("127.0.0.1", port)) for _ in range(2))
        with first, second, socket.create_connection(("127.0.0.1", port)) as served:
            assert ask_health(served) == b"HTTP/1.1 200 OK"  # three open: none closed
            assert not closed_by_server(first, within=0.2)
            with socket.create_connection(("127.0.0.1", port)) as fourth:
                assert ask_health(fourth) == b"HTTP/1.1 200 OK"
                assert closed_by_server(first, within=10)  # the oldest waiting one
                assert ask_health(served) == b"HTTP/1.1 200 OK"  # the others still served
                assert ask_health(fourth) == b"HTTP/1.1 200 OK"


def test_a_request_head_must_arrive_within_the_header_timeout() -> None:
    """A silent client, and a keep-alive client trickling its next request (each byte resets
    uvicorn's keep-alive timer), are closed once the header timeout has passed."""
    with guarded_server(max_connections=16, header_timeout=1.0) as port:
        silent = socket.create_connection(("127.0.0.1", port))
        slow = socket.create_connection(("127.0.0.1", port))
        with silent, slow:
            assert ask_health(slow) == b"HTTP/1.1 200 OK"
            started = time.monotonic()
            with Trickle([slow], gap=0.1) as trickle:
                trickle.wait_all_closed(within=30)
            assert time.monotonic() - started >= 1.0
            assert closed_by_server(silent, within=30)
