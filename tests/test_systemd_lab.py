"""Instances and their rollback where systemd really runs: a Debian container booted by
systemd-nspawn, systemd its PID 1, reached over SSH (tests/systemd_host.py). The lab fleet's
hosts have no init, so this is where fxkit's systemd paths meet systemd itself.

The instance is a small HTTP server run by a template unit (``fxprobe@.service``), answering
``/v1/models`` as vLLM does; its revision is ``FXKIT_REVISION`` in its environment file. Checked
against systemd's own account (``systemctl show``, ``is-enabled``, the process's environ):

- ``instance()`` enables and starts the unit, restarts it on a changed configuration, and
  ``stopped`` stops and disables it;
- a rollback (``fxkit.rollout.rollback``) writes back the environment file and the unit's text
  of the revision the instance ran (from its revision's record) as the instance's own unit file,
  which systemd prefers to the template, and restarts it on that revision, its files and
  process as before; a run kept without its files is refused under systemd, the instance left
  running; a surge copy's environment file (``moved``) gives systemd back every value, quotes
  and dollar signs included.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from systemd_host import SystemdHost

from fxkit.connection import Connection
from fxkit.facts import FactCache
from fxkit.ops.base import OpContext
from fxkit.ops.instances import instance, instance_ready
from fxkit.ops.systemd import unit
from fxkit.rollout.rollback import Previous, capture, keep, load, moved, restore

pytestmark = pytest.mark.lab

TEMPLATE = "fxprobe@.service"
UNIT = "fxprobe@a.service"
OWN = f"/etc/systemd/system/{UNIT}"
FOLDER = "/var/lib/fxkit/revisions/probe"
ENV_FILE = "/etc/fxprobe/a.env"
URL = "http://127.0.0.1:8101/v1/models"
ARGV = ["/usr/bin/python3", "/opt/fxprobe/serve.py"]
SERVER = """import json, os
from http.server import BaseHTTPRequestHandler, HTTPServer
class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"object": "list", "data": [{"id": os.environ["SERVED"]}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body)
HTTPServer(("127.0.0.1", int(os.environ["PORT"])), Handler).serve_forever()
"""


def unit_text(mark: str) -> str:
    return (
        "[Unit]\nDescription=fxkit probe %i\n\n[Service]\nType=simple\n"
        f"EnvironmentFile=/etc/fxprobe/%i.env\nEnvironment=MARK={mark}\n"
        f"ExecStart={' '.join(ARGV)}\n\n[Install]\nWantedBy=multi-user.target\n"
    )


def env_of(revision: str) -> dict[str, str]:
    return {"FXKIT_REVISION": revision, "PORT": "8101", "SERVED": "tiny", "HF_TOKEN": "hf_x9"}


def env_text(env: dict[str, str]) -> str:
    return "".join(f"{k}='{v}'\n" for k, v in env.items())


@pytest.fixture(scope="module")
def host(systemd_lab: SystemdHost) -> SystemdHost:
    with systemd_lab.connect() as conn:
        assert conn.run("mkdir -p /opt/fxprobe /etc/fxprobe").ok
        conn.put("/opt/fxprobe/serve.py", SERVER.encode())
    return systemd_lab


@pytest.fixture
def conn(host: SystemdHost) -> Iterator[Connection]:
    with host.connect() as opened:
        yield opened
        opened.run(
            f"systemctl disable -q --now {UNIT}; rm -rf {OWN} /etc/systemd/system/{TEMPLATE} "
            f"{FOLDER} {ENV_FILE} /var/lib/fxkit/instances; systemctl daemon-reload"
        )


def context(conn: Connection) -> OpContext:
    return OpContext(conn, FactCache(conn))


def shown(conn: Connection, prop: str) -> str:
    return conn.run(f"systemctl show -p {prop} --value {UNIT}").stdout.strip()


def environ(conn: Connection) -> dict[str, str]:
    pid = shown(conn, "MainPID")
    words = conn.run(f"tr '\\0' '\\n' < /proc/{pid}/environ").stdout.splitlines()
    return dict(w.partition("=")[::2] for w in words)


def start(conn: Connection, mark: str, revision: str, own: bool = False) -> None:
    """The unit of ``mark`` (the template, or the instance's own file) and the environment of
    ``revision``; the instance (re)started on them and awaited."""
    ctx = context(conn)
    assert not unit(ctx, UNIT if own else TEMPLATE, unit_text(mark)).failed
    conn.put(ENV_FILE, env_text(env_of(revision)).encode())
    assert conn.run(f"chmod 600 {ENV_FILE}").ok
    assert not instance(ctx, UNIT, ARGV, env_of(revision)).failed
    assert not instance_ready(ctx, UNIT, URL, "tiny", timeout=30, interval=0.2).failed


def test_instance_is_enabled_restarted_on_change_and_disabled_when_stopped(conn: Connection):
    start(conn, "a", "r-aaaaaaaaaaaa")
    assert conn.run(f"systemctl is-enabled {UNIT}").stdout.strip() == "enabled"
    first = shown(conn, "MainPID")
    assert environ(conn)["FXKIT_REVISION"] == "r-aaaaaaaaaaaa"

    start(conn, "a", "r-aaaaaaaaaaaa")  # nothing changed: left running
    assert shown(conn, "MainPID") == first

    start(conn, "a", "r-bbbbbbbbbbbb")
    assert shown(conn, "MainPID") != first
    assert environ(conn)["FXKIT_REVISION"] == "r-bbbbbbbbbbbb"

    stopped = instance(context(conn), UNIT, ARGV, env_of("r-bbbbbbbbbbbb"), state="stopped")
    assert stopped.changed
    assert shown(conn, "ActiveState") == "inactive"
    assert conn.run(f"systemctl is-enabled {UNIT}").stdout.strip() == "disabled"

    # One that died (a failed surge copy): still enabled, so stopping it disables it.
    start(conn, "a", "r-aaaaaaaaaaaa")
    assert conn.run(f"kill -9 {shown(conn, 'MainPID')}").ok
    failed = f"until systemctl is-failed -q {UNIT}; do sleep 0.1; done"
    assert conn.run(f"timeout 10 sh -c '{failed}'").ok
    dead = instance(context(conn), UNIT, ARGV, env_of("r-aaaaaaaaaaaa"), state="stopped")
    assert dead.changed and dead.msg == f"disabled {UNIT} (it was not running)"
    assert conn.run(f"systemctl is-enabled {UNIT}").stdout.strip() == "disabled"
    assert shown(conn, "ActiveState") == "inactive"  # reset-failed: not "failed"
    assert instance(context(conn), UNIT, ARGV, {}, state="stopped").msg == f"{UNIT} is stopped"


def test_rollback_restores_the_unit_and_environment_of_the_revision_it_ran(conn: Connection):
    record = {"revision": "r-aaaaaaaaaaaa", "inputs": {"unit": unit_text("a")}}
    assert conn.run(f"mkdir -p {FOLDER}").ok
    conn.put(f"{FOLDER}/r-aaaaaaaaaaaa.json", json.dumps(record).encode())
    start(conn, "a", "r-aaaaaaaaaaaa")
    before = capture(conn, False, UNIT, FOLDER)
    assert before is not None and before.revision == "r-aaaaaaaaaaaa"
    assert before.argv == ARGV and before.env["MARK"] == "a"
    assert before.files == {ENV_FILE: env_text(env_of("r-aaaaaaaaaaaa")), OWN: unit_text("a")}
    keep(conn, False, FOLDER, "a", before)
    assert load(conn, False, FOLDER, "r-aaaaaaaaaaaa", "a") == before  # files kept for undo

    # The batch: the template rewritten, the instance given the new revision's own unit file
    # and environment file (as roles/vllm_lmcache's switch_instance does), restarted on them.
    assert not unit(context(conn), TEMPLATE, unit_text("b")).failed
    start(conn, "b", "r-bbbbbbbbbbbb", own=True)
    replaced = shown(conn, "MainPID")
    assert environ(conn)["MARK"] == "b" and shown(conn, "FragmentPath") == OWN

    # A run kept by an fxkit that kept no files: refused under systemd, the instance untouched.
    bare = restore(conn, False, UNIT, Previous(before.argv, before.env), URL, "tiny", 30)
    assert bare.failed and "kept no unit text and environment file" in bare.msg
    assert shown(conn, "MainPID") == replaced

    back = restore(conn, False, UNIT, before, URL, "tiny", 30)
    assert not back.failed, back.msg
    now = environ(conn)
    assert shown(conn, "MainPID") != replaced
    assert now["FXKIT_REVISION"] == "r-aaaaaaaaaaaa" and now["MARK"] == "a"
    assert shown(conn, "FragmentPath") == OWN  # pinned: the template says "b"
    assert conn.get(OWN) == unit_text("a").encode()
    assert conn.get(ENV_FILE) == env_text(env_of("r-aaaaaaaaaaaa")).encode()
    modes = conn.run(f"stat -c %a {OWN} {ENV_FILE}").stdout.split()
    assert modes == ["644", "600"]
    assert conn.run(f"systemctl is-enabled {UNIT}").stdout.strip() == "enabled"

    # A copy's files as undo --max-surge makes them (moved()), with a value that needs double
    # quotes and escapes: systemd gives the process that very value.
    odd = 'it\'s "$HOME" `id` \\n\tend'
    env = {**before.env, "HF_TOKEN": odd}
    copy = moved(Previous(before.argv, env, before.files), UNIT, ENV_FILE)
    assert not restore(conn, False, UNIT, copy, URL, "tiny", 30).failed
    assert environ(conn)["HF_TOKEN"] == odd and environ(conn)["FXKIT_REVISION"] == "r-aaaaaaaaaaaa"
