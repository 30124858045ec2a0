"""The runner: failure policy, unreachable hosts, batches, forks, handlers, tags, check mode,
variable precedence, the report and the JSON log.

The hosts here are in-memory connections (files in a dict) so each scenario can make a host
unreachable or break its link mid-run; the operations are small test operations with the real
``op(ctx, ...) -> Result`` contract. Playbooks, roles and inventories are real files.
"""

from __future__ import annotations

import io
import json
import re
import signal
import textwrap
import threading
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from sync_helpers import SAFETY, Transcript, when

from fxkit.connection import Connection, ConnectOptions, RunResult
from fxkit.engine.console import Reporter, console_recorder
from fxkit.engine.playbook import Playbook
from fxkit.engine.record import Outcome, PlaybookResult, Recorder
from fxkit.engine.role import Host, TagFilter, operation
from fxkit.engine.runner import Runner, RunOptions, interruptible, shielded
from fxkit.errors import ConnectionFailed, PlaybookError, VarError
from fxkit.inventory import Inventory
from fxkit.ops.base import OpContext, Result, changed, failed, ok
from fxkit.rollout import rollout


class MemoryConnection(Connection):
    """A pretend host: files in a dict. Host variables make it unreachable or break its link."""

    def __init__(self, name: str, hostvars: Mapping[str, Any]):
        self.name = name
        self.files: dict[str, bytes] = {}
        self.opens = self.closes = self.commands = 0
        self.unreachable = bool(hostvars.get("test_unreachable", False))
        self.break_after = hostvars.get("test_break_after")
        #: Commands hang until the connection is closed (a slow command on a live link).
        self.hang = bool(hostvars.get("test_hang", False))
        self.running = threading.Event()
        self.closed = threading.Event()

    def open(self) -> None:
        if self.unreachable:
            raise ConnectionFailed("no route to host", where=f"host {self.name}")
        self.opens += 1

    def run(self, command: str, **kwargs: Any) -> RunResult:
        self.commands += 1
        if self.break_after is not None and self.commands > self.break_after:
            raise ConnectionFailed("connection reset by peer", where=f"host {self.name}")
        if self.hang:
            self.running.set()
            self.closed.wait(timeout=SAFETY)
            raise ConnectionFailed("connection closed", where=f"host {self.name}")
        return RunResult(command, 0, "", "")

    def get(self, path: str, *, become: bool = False) -> bytes | None:
        return self.files.get(path)

    def put(self, path: str, data: bytes, *, become: bool = False) -> None:
        self.files[path] = data

    def close(self) -> None:
        self.closes += 1
        self.closed.set()


@dataclass
class Fleet:
    """The connector: makes (and remembers) one MemoryConnection per host."""

    #: Files every host starts with (a host converged by an earlier run).
    seed: dict[str, bytes] = field(default_factory=dict)
    hosts: dict[str, MemoryConnection] = field(default_factory=dict)
    options: list[ConnectOptions] = field(default_factory=list)

    def __call__(self, name: str, hostvars: Mapping[str, Any], options: ConnectOptions):
        self.options.append(options)
        self.hosts[name] = MemoryConnection(name, hostvars)
        self.hosts[name].files.update(self.seed)
        return self.hosts[name]

    def file(self, host: str, path: str) -> str | None:
        data = self.hosts[host].files.get(path)
        return data.decode() if data is not None else None


# -- test operations (the real contract: op(ctx, ...) -> Result) ------------------------------


def put(ctx: OpContext, path: str, value: Any) -> Result:
    """Write str(value) to path; ok when it is already there."""
    want = str(value).encode()
    have = ctx.conn.get(path)
    if have == want:
        return ok()
    diff = f"-{have.decode() if have else ''}\n+{want.decode()}\n" if ctx.diff else None
    if ctx.check:
        return changed(f"would write {path}", diff)
    ctx.conn.put(path, want)
    return changed(f"wrote {value}", diff)


def broken(ctx: OpContext, msg: str) -> Result:
    return failed(msg)


def shell(ctx: OpContext, cmd: str) -> Result:
    ctx.conn.run(cmd)
    return changed(f"ran {cmd}")


def echo(ctx: OpContext, text: str) -> Result:
    """What a command returns: its output in ``data``, also nested."""
    return ok(stdout=text, lines=[text, 7], nested={"out": (text,)})


def count(ctx: OpContext, path: str) -> Result:
    """Add one to the number in path."""
    have = int(ctx.conn.get(path) or b"0")
    ctx.conn.put(path, str(have + 1).encode())
    return changed(str(have + 1))


SYNC: dict[str, Any] = {}


def sync(ctx: OpContext, what: str) -> Result:
    """Wait for (``wait:NAME``) or set (``set:NAME``) a threading.Event, or meet at a barrier."""
    kind, _, name = what.partition(":")
    if kind == "set":
        SYNC[name].set()
    elif kind == "wait":
        if not SYNC[name].wait(timeout=SAFETY):
            return failed(f"{name} was never set: hosts did not run independently")
    else:
        SYNC[name].wait(timeout=SAFETY)
    return ok(what)


OPS = {"put": put, "broken": broken, "shell": shell, "echo": echo, "count": count, "sync": sync}


def host_class(ops: dict[str, Any]) -> type[Host]:
    """A Host class whose operations are the test operations ``ops`` (name -> function)."""
    return type("TestHost", (Host,), {name: operation(op) for name, op in ops.items()})


# -- scenario helpers ---------------------------------------------------------------------------


@dataclass
class Played:
    results: PlaybookResult
    fleet: Fleet
    recorder: Recorder
    output: str
    #: The JSON log: its task events, then its summary events (one per host).
    events: list[dict[str, Any]]
    summaries: list[dict[str, Any]]

    @property
    def code(self) -> int:
        return self.results.exit_code

    def file(self, host: str, path: str) -> str | None:
        return self.fleet.file(host, path)

    def counts(self, host: str) -> dict[str, int]:
        return asdict(self.results.hosts[host].counts)


def write(folder: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


def play(
    tmp_path: Path,
    playbook: str,
    inventory: str,
    files: dict[str, str] | None = None,
    fleet: Fleet | None = None,
    **options: Any,
) -> Played:
    write(tmp_path, {"site.yml": playbook, "hosts.yml": inventory, **(files or {})})
    fleet = fleet or Fleet()
    out, log = Transcript(), io.StringIO()
    SYNC["output"] = out  # what operations wait for (the runner's notes)
    console = Console(file=out, width=200)
    recorder = console_recorder(console, diff=options.get("diff", False), log_json=log)
    runner = Runner(
        Playbook.load(tmp_path / "site.yml"),
        Inventory.load(tmp_path / "hosts.yml"),
        RunOptions(**options),
        recorder,
        connector=fleet,
        host_class=host_class(OPS),
    )
    results = runner.run()
    recorder.recap()
    events = [json.loads(line) for line in log.getvalue().splitlines()]
    tasks = [e for e in events if e["event"] == "task"]
    summaries = [e for e in events if e["event"] == "summary"]
    assert events == tasks + summaries  # the summaries come last
    return Played(results, fleet, recorder, out.getvalue(), tasks, summaries)


THREE = """
all:
  hosts:
    h1: {}
    h2: {broken: true}
    h3: {}
"""

TWO_ROLES = """
- name: two roles
  hosts: all
  roles: [first, second]
- name: later play
  hosts: all
  roles: [third]
"""

ROLES = {
    "roles/first/role.py": """
        def apply(host, v):
            host.put("/a", "a")
            if v.get("broken"):
                host.broken("disk on fire")
            host.put("/b", "b")
        """,
    "roles/second/role.py": """
        def apply(host, v):
            host.put("/c", "c")
        """,
    "roles/third/role.py": """
        def apply(host, v):
            host.put("/d", "d")
        """,
}


def test_a_failing_host_stops_only_itself(tmp_path: Path) -> None:
    out = play(tmp_path, TWO_ROLES, THREE, ROLES)
    assert out.code == 1
    for good in ("h1", "h3"):
        assert [out.file(good, p) for p in ("/a", "/b", "/c", "/d")] == ["a", "b", "c", "d"]
        assert out.counts(good) == dict(ok=0, changed=4, failed=0, skipped=0, unreachable=0)
    assert [out.file("h2", p) for p in ("/a", "/b", "/c", "/d")] == ["a", None, None, None]
    assert out.counts("h2")["failed"] == 1
    assert "disk on fire" in out.output
    assert out.results.hosts_with(Outcome.FAILED) == ["h2"]


def test_ignore_errors_keeps_going(tmp_path: Path) -> None:
    roles = {
        "roles/first/role.py": """
            def apply(host, v):
                result = host.task(ignore_errors=True).broken("not fatal")
                assert result.failed
                host.put("/after", "yes")
            """
    }
    out = play(tmp_path, "- hosts: all\n  roles: [first]\n", "all: {hosts: {h1: {}}}", roles)
    assert out.code == 0
    assert out.file("h1", "/after") == "yes"
    assert out.counts("h1")["failed"] == 1  # counted, but the host goes on


FOUR = "all:\n  hosts:\n    h1: {broken: true}\n    h2: {}\n    h3: {}\n    h4: {}\n"


@pytest.mark.parametrize(("limit", "stops"), [(25, True), (50, False)])
def test_max_fail_percentage_stops_after_the_batch(tmp_path: Path, limit: int, stops: bool) -> None:
    book = f"- hosts: all\n  serial: 2\n  max_fail_percentage: {limit}\n  roles: [first]\n"
    out = play(tmp_path, book, FOUR, ROLES)
    assert out.code == 1
    assert out.file("h2", "/b") == "b"  # same batch as the failed host: it finished
    if stops:  # 1 of 2 = 50% > 25%: the second batch never starts
        assert set(out.fleet.hosts) == {"h1", "h2"}
        assert out.results.hosts_with(Outcome.NOT_RUN) == ["h3", "h4"]
        assert [s["outcome"] for s in out.summaries] == ["failed", "ok", "not_run", "not_run"]
        assert "STOPPED: 1 of 2 hosts failed in batch 1/2 (50% > max_fail_percentage 25%)" in (
            out.output
        )
    else:  # 50% is not more than 50%
        assert out.file("h3", "/b") == out.file("h4", "/b") == "b"


def test_max_fail_percentage_without_serial_stops_the_later_plays(tmp_path: Path) -> None:
    book = TWO_ROLES.replace(
        "  roles: [first, second]\n", "  max_fail_percentage: 20\n  roles: [first, second]\n"
    )
    out = play(tmp_path, book, FOUR, ROLES)
    assert out.file("h2", "/c") == "c"  # the play itself finished on the other hosts
    assert out.file("h2", "/d") is None  # the later play never started
    assert "STOPPED: 1 of 4 hosts failed in the play (25% > max_fail_percentage 20%)" in out.output


def test_every_host_of_a_batch_failing_stops_the_run(tmp_path: Path) -> None:
    inventory = "all:\n  hosts:\n    h1: {broken: true}\n    h2: {}\n"
    out = play(tmp_path, "- hosts: all\n  serial: 1\n  roles: [first]\n", inventory, ROLES)
    assert set(out.fleet.hosts) == {"h1"}
    assert "STOPPED: every host failed in batch 1/2" in out.output


def test_unreachable_on_open(tmp_path: Path) -> None:
    inventory = "all:\n  hosts:\n    h1: {}\n    h2: {test_unreachable: true}\n"
    out = play(tmp_path, TWO_ROLES, inventory, ROLES)
    assert out.code == 1
    assert out.file("h1", "/d") == "d"
    assert out.fleet.hosts["h2"].files == {}
    assert out.counts("h2") == dict(ok=0, changed=0, failed=0, skipped=0, unreachable=1)
    assert out.results.hosts_with(Outcome.UNREACHABLE) == ["h2"]
    [event] = [e for e in out.events if e["host"] == "h2"]
    assert event["status"] == "unreachable" and "no route to host" in event["msg"]


def test_unreachable_mid_run(tmp_path: Path) -> None:
    roles = {
        "roles/first/role.py": """
            def apply(host, v):
                host.shell("one")
                host.shell("two")
                host.put("/never", "x")
            """
    }
    inventory = "all:\n  hosts:\n    h1: {}\n    h2: {test_break_after: 1}\n"
    out = play(tmp_path, "- hosts: all\n  roles: [first]\n", inventory, roles)
    assert out.file("h1", "/never") == "x"
    assert out.file("h2", "/never") is None
    assert out.counts("h2")["unreachable"] == 1 and out.counts("h2")["changed"] == 1
    assert "connection reset by peer" in out.output
    # The event names the operation the link broke in, not "connect".
    [lost] = [e for e in out.events if e["host"] == "h2" and e["status"] == "unreachable"]
    assert (lost["role"], lost["operation"]) == ("first", "shell two")


def test_unreachable_while_a_role_gathers_a_fact(tmp_path: Path) -> None:
    roles = {
        "roles/first/role.py": """
            from fxkit.facts.system import Kernel

            def apply(host, v):
                host.shell("one")
                host.fact(Kernel)
                host.put("/never", "x")
            """
    }
    inventory = "all:\n  hosts:\n    h1: {}\n    h2: {test_break_after: 1}\n"
    out = play(tmp_path, "- hosts: all\n  roles: [first]\n", inventory, roles)
    assert out.file("h1", "/never") == "x"
    assert out.file("h2", "/never") is None
    assert out.results.hosts_with(Outcome.UNREACHABLE) == ["h2"]
    # The event names the role and the fact being gathered, not "connect".
    [lost] = [e for e in out.events if e["host"] == "h2" and e["status"] == "unreachable"]
    assert (lost["role"], lost["operation"]) == ("first", "fact Kernel")
    assert "connection reset by peer" in lost["msg"]


def test_one_connection_per_host_per_run(tmp_path: Path) -> None:
    out = play(tmp_path, TWO_ROLES, "all: {hosts: {h1: {}, h2: {}}}", ROLES)
    for conn in out.fleet.hosts.values():
        assert (conn.opens, conn.closes) == (1, 1)


def test_hosts_run_concurrently_up_to_forks(tmp_path: Path) -> None:
    SYNC["meet"] = threading.Barrier(4, timeout=SAFETY)
    roles = {"roles/first/role.py": "def apply(host, v):\n    host.sync('barrier:meet')\n"}
    hosts = "all:\n  hosts:\n" + "".join(f"    h{i}: {{}}\n" for i in range(4))
    out = play(tmp_path, "- hosts: all\n  roles: [first]\n", hosts, roles, forks=4)
    assert out.code == 0  # a barrier of 4 only opens when all four hosts run at once


def test_forks_bounds_how_many_hosts_run_at_once(tmp_path: Path) -> None:
    active, peak, lock = [0], [0], threading.Lock()
    pair = threading.Barrier(2, timeout=SAFETY)  # two hosts at once, each time

    def busy(ctx: OpContext) -> Result:
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        pair.wait()
        with lock:
            active[0] -= 1
        return ok()

    OPS["busy"] = busy
    try:
        roles = {"roles/first/role.py": "def apply(host, v):\n    host.busy()\n"}
        hosts = "all:\n  hosts:\n" + "".join(f"    h{i}: {{}}\n" for i in range(6))
        out = play(tmp_path, "- hosts: all\n  roles: [first]\n", hosts, roles, forks=2)
    finally:
        del OPS["busy"]
    assert out.code == 0 and out.counts("h5")["ok"] == 1
    assert peak[0] == 2


def test_hosts_do_not_wait_for_each_other_between_roles(tmp_path: Path) -> None:
    SYNC["h1_in_second_role"] = threading.Event()
    roles = {
        "roles/first/role.py": """
            def apply(host, v):
                if host.name == "h2":
                    host.sync("wait:h1_in_second_role")
            """,
        "roles/second/role.py": """
            def apply(host, v):
                if host.name == "h1":
                    host.sync("set:h1_in_second_role")
            """,
    }
    out = play(
        tmp_path,
        "- hosts: all\n  roles: [first, second]\n",
        "all: {hosts: {h1: {}, h2: {}}}",
        roles,
    )
    assert out.code == 0, out.output


HANDLER_ROLE = {
    "roles/first/role.py": """
        def restart(host, v):
            host.count("/restarts")

        def apply(host, v):
            host.notify(restart, when=host.put("/conf", v.value))
            host.notify(restart, when=host.put("/conf2", v.value))
            host.put("/after-notify", "x")
            if v.get("broken"):
                host.broken("failed before the handlers")
        """
}


def test_handlers_run_once_after_the_role_only_on_change(tmp_path: Path) -> None:
    book = "- hosts: all\n  vars: {value: one}\n  roles: [first]\n"
    out = play(tmp_path, book, "all: {hosts: {h1: {}}}", HANDLER_ROLE)
    assert out.file("h1", "/restarts") == "1"  # notified twice, ran once
    ops = [e["operation"] for e in out.events]
    assert ops.index("count /restarts") > ops.index("put /after-notify")  # after the role

    converged = out.fleet.hosts["h1"].files
    rerun = play(tmp_path, book, "all: {hosts: {h1: {}}}", HANDLER_ROLE, Fleet(seed=converged))
    assert rerun.file("h1", "/restarts") == "1"  # nothing changed: the handler did not run
    assert rerun.counts("h1")["changed"] == 0


def test_handlers_do_not_run_when_the_host_failed(tmp_path: Path) -> None:
    out = play(
        tmp_path,
        "- hosts: all\n  vars: {value: v}\n  roles: [first]\n",
        "all: {hosts: {h1: {broken: true}}}",
        HANDLER_ROLE,
    )
    assert out.file("h1", "/restarts") is None


TAGGED_BOOK = """
- hosts: all
  tags: site
  roles:
    - {role: first, tags: [base]}
    - {role: second, tags: [storage]}
"""

TAGGED_ROLES = {
    "roles/first/role.py": """
        def apply(host, v):
            host.put("/base", "x")
            host.task(tags=["slow"]).put("/base-slow", "x")
            host.task(tags=["always"]).put("/base-always", "x")
        """,
    "roles/second/role.py": """
        def apply(host, v):
            host.put("/storage", "x")
            host.task(tags=["slow"]).put("/storage-slow", "x")
        """,
}

ALL_FILES = ["/base", "/base-slow", "/base-always", "/storage", "/storage-slow"]


@pytest.mark.parametrize(
    ("only", "skip", "written"),
    [
        ((), (), ALL_FILES),
        (("site",), (), ALL_FILES),
        (("base",), (), ["/base", "/base-slow", "/base-always"]),
        (("slow",), (), ["/base-slow", "/base-always", "/storage-slow"]),
        ((), ("storage",), ["/base", "/base-slow", "/base-always"]),
        ((), ("slow",), ["/base", "/base-always", "/storage"]),
        (("base",), ("always",), ["/base", "/base-slow"]),
    ],
)
def test_tags_on_plays_roles_and_operations(
    tmp_path: Path, only: tuple[str, ...], skip: tuple[str, ...], written: list[str]
) -> None:
    tags = TagFilter(frozenset(only), frozenset(skip))
    out = play(tmp_path, TAGGED_BOOK, "all: {hosts: {h1: {}}}", TAGGED_ROLES, tags=tags)
    assert sorted(out.fleet.hosts["h1"].files) == sorted(written)
    assert out.counts("h1")["changed"] == len(written)  # tag-skipped operations are not reported


@pytest.mark.parametrize(
    ("only", "written"),
    [
        ((), ["/c"]),
        (("all",), ["/c"]),
        (("wipe",), ["/a", "/b"]),
        (("site",), ["/a", "/b", "/c"]),  # the play's tags are the role's too (as in Ansible)
    ],
)
def test_a_role_tagged_never_runs_only_when_asked_for(
    tmp_path: Path, only: tuple[str, ...], written: list[str]
) -> None:
    book = """
        - hosts: all
          tags: site
          roles:
            - {role: first, tags: [never, wipe]}
            - second
        """
    tags = TagFilter(frozenset(only))
    out = play(tmp_path, textwrap.dedent(book), "all: {hosts: {h1: {}}}", ROLES, tags=tags)
    assert sorted(out.fleet.hosts["h1"].files) == written


def test_check_mode_changes_nothing_and_says_what_would_change(tmp_path: Path) -> None:
    out = play(tmp_path, TWO_ROLES, "all: {hosts: {h1: {}}}", ROLES, check=True, diff=True)
    assert out.fleet.hosts["h1"].files == {}
    assert out.counts("h1")["changed"] == 4
    assert {e["msg"] for e in out.events} == {f"would write /{p}" for p in "abcd"}
    assert "+a" in out.output  # the diff is shown


PRECEDENCE_INVENTORY = """
all:
  vars: {level: inventory all}
  children:
    gpu:
      vars: {level: inventory parent group}
      children:
        rack1:
          vars: {level: inventory child group}
          hosts:
            h1: {level: inventory host}
"""


@pytest.mark.parametrize(
    "level",
    [
        "role defaults",
        "inventory all",
        "inventory parent group",
        "inventory child group",
        "inventory host",
        "play vars",
        "play vars_files",
        "role parameters",
        "extra vars",
    ],
)
def test_variable_precedence_through_the_runner(tmp_path: Path, level: str) -> None:
    """Each level is set, with every level above it removed: the value read is that level's."""
    inventory = PRECEDENCE_INVENTORY
    drop_inventory = [
        "inventory host",
        "inventory child group",
        "inventory parent group",
        "inventory all",
    ]
    for name in drop_inventory:
        if name == level or name not in inventory:
            break
        inventory = inventory.replace(f"{{level: {name}}}", "{}")
    order = ["play vars", "play vars_files", "role parameters", "extra vars"]
    above = order[order.index(level) + 1 :] if level in order else order
    play_vars = "  vars: {level: play vars}\n" if "play vars" not in above else ""
    vars_files = "  vars_files: [more.yml]\n" if "play vars_files" not in above else ""
    params = ", level: role parameters" if "role parameters" not in above else ""
    extra = {"level": "extra vars"} if "extra vars" not in above else {}
    if level == "role defaults":
        inventory = "all: {hosts: {h1: {}}}"
    book = f"- hosts: all\n{play_vars}{vars_files}  roles:\n    - {{role: first{params}}}\n"
    files = {
        "more.yml": "level: play vars_files\n",
        "roles/first/defaults.yml": "level: role defaults\nderived: 'from {{ level }}'\n",
        "roles/first/role.py": """
            def apply(host, v):
                host.put("/level", v.level)
                host.put("/derived", v.derived)
            """,
    }
    out = play(tmp_path, book, inventory, files, extra_vars=extra)
    assert out.file("h1", "/level") == level
    assert out.file("h1", "/derived") == f"from {level}"  # rendered with the winning value


def test_fxkit_variables(tmp_path: Path) -> None:
    files = {
        "roles/first/role.py": """
            def apply(host, v):
                host.put("/m", [v.inventory_hostname, v.group_names, v.role_name])
            """
    }
    inventory = "all:\n  hosts: {h2: {}}\n  children: {gpu: {hosts: {h1: {}}}}\n"
    out = play(tmp_path, "- hosts: all\n  roles: [first]\n", inventory, files)
    assert out.file("h1", "/m") == "['h1', ['gpu'], 'first']"
    # as ansible-core 2.19 (inventory/host.py): every group but 'all', 'ungrouped' included
    assert out.file("h2", "/m") == "['h2', ['ungrouped'], 'first']"


def test_template_errors_fail_the_host_with_file_line_variable(tmp_path: Path) -> None:
    files = {
        "roles/first/role.py": "def apply(host, v):\n    host.template('conf.j2', '/conf')\n",
        "roles/first/templates/conf.j2": "a: 1\nb: {{ rack_id }}\n",
    }
    inventory = "all:\n  hosts:\n    h1: {rack_id: 7}\n    h2: {}\n"
    fleet = Fleet()
    out = play(tmp_path, "- hosts: all\n  roles: [first]\n", inventory, files, fleet)
    assert out.code == 1
    [event] = [e for e in out.events if e["host"] == "h2"]
    assert event["status"] == "failed" and event["role"] == "first"
    assert f"{tmp_path}/roles/first/templates/conf.j2:2" in event["msg"]
    assert "'rack_id'" in event["msg"] and "host h2" in event["msg"]


def test_bad_operation_arguments_point_at_the_role_line(tmp_path: Path) -> None:
    files = {
        "roles/first/role.py": """
            def apply(host, v):
                host.put("/x", valeu="y")
            """
    }
    out = play(tmp_path, "- hosts: all\n  roles: [first]\n", "all: {hosts: {h1: {}}}", files)
    [event] = [e for e in out.events if e["status"] == "failed"]
    assert f"{tmp_path}/roles/first/role.py:3" in event["msg"]  # (line 1 is empty)
    assert "host.put(): unexpected argument 'valeu' (did you mean 'value'?)" in event["msg"]


def test_a_bug_in_role_code_fails_that_host_at_its_line(tmp_path: Path) -> None:
    files = {
        "roles/first/role.py": """
            def apply(host, v):
                if v.get("broken"):
                    1 / 0
                host.put("/ok", 1)
            """
    }
    out = play(tmp_path, "- hosts: all\n  roles: [first]\n", THREE, files)
    assert out.file("h1", "/ok") == out.file("h3", "/ok") == "1"
    assert out.counts("h2")["failed"] == 1
    [event] = [e for e in out.events if e["status"] == "failed"]
    assert event["msg"] == f"{tmp_path}/roles/first/role.py:4: ZeroDivisionError: division by zero"
    assert "Traceback" not in out.output


def test_an_unknown_operation_is_the_role_s_mistake(tmp_path: Path) -> None:
    files = {"roles/first/role.py": "def apply(host, v):\n    host.pur('/x', 1)\n"}
    out = play(tmp_path, "- hosts: all\n  roles: [first]\n", "all: {hosts: {h1: {}}}", files)
    [event] = out.events
    assert event["msg"].startswith(f"{tmp_path}/roles/first/role.py:2: UnknownOperation")
    assert "did you mean host.put?" in event["msg"]
    assert "Traceback" not in out.output


def crash(ctx: OpContext) -> Result:
    raise RuntimeError(f"a bug in an operation, with {SECRET} in its message")


def test_a_bug_below_the_role_keeps_its_traceback(tmp_path: Path) -> None:
    OPS["crash"] = crash
    try:
        files = {"roles/first/role.py": "def apply(host, v):\n    host.crash()\n"}
        book = f"- hosts: all\n  secret_vars: [s]\n  vars: {{s: '{SECRET}'}}\n  roles: [first]\n"
        out = play(tmp_path, book, THREE, files)
    finally:
        del OPS["crash"]
    assert out.code == 1 and out.results.hosts_with(Outcome.FAILED) == ["h1", "h2", "h3"]
    assert "RuntimeError: a bug in an operation" in out.events[0]["msg"]
    assert "Traceback" in out.output and 'raise RuntimeError(f"a bug' in out.output
    assert SECRET not in out.output


def test_a_missing_role_stops_before_any_host_is_touched(tmp_path: Path) -> None:
    fleet = Fleet()
    with pytest.raises(PlaybookError, match="role 'frist' not found") as err:
        play(
            tmp_path,
            "- hosts: all\n  roles: [first, frist]\n",
            "all: {hosts: {h1: {}}}",
            ROLES,
            fleet,
        )
    assert err.value.where == f"{tmp_path / 'site.yml'}:2"
    assert err.value.hint and "did you mean 'first'?" in err.value.hint
    assert fleet.hosts == {}


def test_limit_and_earlier_failures_narrow_the_hosts(tmp_path: Path) -> None:
    out = play(tmp_path, TWO_ROLES, THREE, ROLES, limit="h1:h2")
    assert set(out.fleet.hosts) == {"h1", "h2"}


SECRET = "Tr0ub4dor&3"


def test_secrets_never_reach_output_or_log(tmp_path: Path) -> None:
    files = {
        "roles/first/role.py": """
            def apply(host, v):
                host.put("/conf", "password=" + v.ansible_become_password)
                host.put("/token", v.registry_token)
                host.put("/dhchap", v.dhchap)
                host.echo("token is " + v.registry_token)
                host.broken("login failed for " + v.dhchap)
            """
    }
    inventory = f"all:\n  hosts:\n    h1: {{ansible_become_password: '{SECRET}'}}\n"
    book = (
        "- hosts: all\n  secret_vars: [dhchap]\n"
        "  vars: {registry_token: '{{ ansible_become_password }}-x', dhchap: DHHC-1:00:zzz}\n"
        "  roles: [first]\n"
    )
    out = play(
        tmp_path,
        book,
        inventory,
        files,
        diff=True,
        connect=ConnectOptions(become_password="sudo-pw-42"),
    )
    assert out.file("h1", "/conf") == f"password={SECRET}"  # the host gets the real value
    log = json.dumps(out.events)
    results = json.dumps(out.results.to_json())
    for secret in (SECRET, "DHHC-1:00:zzz", "sudo-pw-42"):
        assert secret not in out.output and secret not in log and secret not in results
    assert "********" in out.output and "********" in log
    [echo] = [t for t in out.results.hosts["h1"].tasks if t.operation.startswith("echo")]
    assert echo.data == {
        "stdout": "token is ********",
        "lines": ["token is ********", 7],
        "nested": {"out": ["token is ********"]},
    }
    assert out.fleet.options[0].become_password == "sudo-pw-42"


def test_json_log_has_one_event_per_operation(tmp_path: Path) -> None:
    out = play(tmp_path, TWO_ROLES, "all: {hosts: {h1: {}}}", ROLES)
    assert [(e["host"], e["play"], e["role"], e["operation"], e["status"]) for e in out.events] == [
        ("h1", "two roles", "first", "put /a", "changed"),
        ("h1", "two roles", "first", "put /b", "changed"),
        ("h1", "two roles", "second", "put /c", "changed"),
        ("h1", "later play", "third", "put /d", "changed"),
    ]
    for event in out.events:
        assert set(event) == {
            "event",
            "host",
            "play",
            "role",
            "operation",
            "status",
            "msg",
            "diff",
            "duration_s",
            "data",
        }
        assert event["event"] == "task" and event["duration_s"] >= 0
    assert out.summaries == [
        {
            "event": "summary",
            "host": "h1",
            "outcome": "ok",
            "ok": 0,
            "changed": 4,
            "failed": 0,
            "skipped": 0,
            "unreachable": 0,
        }
    ]


def test_results_hold_each_host_s_tasks_counts_outcome_and_the_run_s_timing(
    tmp_path: Path,
) -> None:
    inventory = (
        "all:\n  hosts:\n    h1: {}\n    h2: {broken: true}\n    h3: {test_unreachable: true}\n"
    )
    before = datetime.now(UTC)
    out = play(tmp_path, TWO_ROLES, inventory, ROLES)
    results = out.results
    assert list(results.hosts) == ["h1", "h2", "h3"]  # inventory order
    assert [(t.play, t.role, t.operation, t.status) for t in results.hosts["h2"].tasks] == [
        ("two roles", "first", "put /a", "changed"),
        ("two roles", "first", "broken disk on fire", "failed"),
    ]
    assert results.hosts["h2"].tasks[1].msg == "disk on fire"
    assert [t.status for t in results.hosts["h3"].tasks] == ["unreachable"]
    outcomes = {name: host.outcome for name, host in results.hosts.items()}
    assert outcomes == {"h1": Outcome.OK, "h2": Outcome.FAILED, "h3": Outcome.UNREACHABLE}
    assert asdict(results.counts) == dict(ok=0, changed=5, failed=1, skipped=0, unreachable=1)
    assert results.exit_code == 1 and not results.interrupted
    assert results.started and results.ended and before <= results.started <= results.ended
    assert results.duration_s == (results.ended - results.started).total_seconds()
    # The recap, the log's summaries and to_json() all say what the tasks say.
    for summary in out.summaries:
        counts = asdict(results.hosts[summary["host"]].counts)
        assert summary == {"event": "summary", "host": summary["host"],
                           "outcome": str(outcomes[summary["host"]]), **counts}  # fmt: skip
        assert re.search(rf"{summary['host']}\s+" + r"\s+".join(map(str, counts.values())),
                         out.output.replace("│", " "))  # fmt: skip
    data = json.loads(json.dumps(results.to_json()))
    assert data["exit_code"] == 1 and data["counts"]["changed"] == 5
    assert data["hosts"]["h2"]["outcome"] == "failed" and data["hosts"]["h2"]["failed"] == 1
    assert datetime.fromisoformat(data["started"]) == results.started


def test_live_progress_shows_each_busy_host_s_role_and_operation(tmp_path: Path) -> None:
    seen: list[str] = []

    def look(ctx: OpContext) -> Result:
        console = Console(file=io.StringIO(), width=120)
        console.print(reporter.progress())
        seen.append(console.file.getvalue())  # type: ignore[attr-defined]
        return ok()

    write(tmp_path, {"roles/first/role.py": "def apply(host, v):\n    host.look()\n"})
    write(
        tmp_path,
        {"site.yml": "- hosts: all\n  roles: [first]\n", "hosts.yml": "all: {hosts: {h1: {}}}"},
    )
    reporter = Reporter(Console(file=io.StringIO()))
    Runner(
        Playbook.load(tmp_path / "site.yml"),
        Inventory.load(tmp_path / "hosts.yml"),
        RunOptions(),
        Recorder([reporter]),
        connector=Fleet(),
        host_class=host_class({"look": look}),
    ).run()
    assert seen[0].split() == ["h1", "first", "/", "look"]
    console = Console(file=io.StringIO())
    console.print(reporter.progress())
    assert console.file.getvalue().strip() == ""  # done hosts leave the view


def test_a_bad_host_pattern_stops_before_any_host_is_touched(tmp_path: Path) -> None:
    fleet = Fleet()
    book = "- hosts: all\n  roles: [first]\n- hosts: 'a:&&b'\n  roles: [first]\n"
    with pytest.raises(PlaybookError, match="operator without a name") as err:
        play(tmp_path, book, "all: {hosts: {h1: {}}}", ROLES, fleet)
    assert err.value.where == f"{tmp_path / 'site.yml'}:3 (hosts of play 'a:&&b')"
    assert fleet.hosts == {}


#: What the runner prints once it has acted on a first Ctrl-C.
STOPPING = "interrupted: hosts stop after their current operation"


def interrupt(ctx: OpContext) -> Result:
    """Ctrl-C (SIGINT, what a terminal sends) while this operation runs: it ends once the
    runner has acted on it."""
    signal.raise_signal(signal.SIGINT)
    SYNC["output"].wait_for(STOPPING)
    return ok()


def after_recap(out: Played) -> list[str]:
    """The lines printed after the RECAP's table."""
    assert out.output.count("RECAP") == 1
    return out.output.split("RECAP", 1)[1].split("┘", 1)[1].strip().splitlines()


def test_ctrl_c_stops_hosts_before_their_next_operation(tmp_path: Path) -> None:
    OPS["interrupt"] = interrupt
    files = {
        "roles/first/role.py": """
            def apply(host, v):
                host.interrupt()
                host.put("/after", "x")
            """
    }
    fleet = Fleet()
    try:
        out = play(
            tmp_path, "- hosts: all\n  roles: [first]\n", "all: {hosts: {h1: {}}}", files, fleet
        )
    finally:
        del OPS["interrupt"]
    assert fleet.hosts["h1"].files == {}  # the operation after Ctrl-C never ran
    assert (fleet.hosts["h1"].opens, fleet.hosts["h1"].closes) == (1, 1)
    assert out.code == 130 and out.results.interrupted
    assert out.results.hosts["h1"].outcome is Outcome.INTERRUPTED
    assert [(e["operation"], e["status"]) for e in out.events] == [("interrupt", "ok")]
    assert out.counts("h1") == dict(ok=1, changed=0, failed=0, skipped=0, unreachable=0)
    assert [s["outcome"] for s in out.summaries] == ["interrupted"]
    assert after_recap(out) == ["interrupted (Ctrl-C): h1 did not finish"]


def test_a_second_ctrl_c_cuts_off_running_operations_then_the_recap_comes_once(
    tmp_path: Path,
) -> None:
    """Issue 8: after a double Ctrl-C, host threads reported after the recap (their
    connections closed under them: "unreachable"), and the recap missed them."""
    files = {"roles/first/role.py": "def apply(host, v):\n    host.shell('sleep 60')\n"}
    inventory = "all:\n  vars: {test_hang: true}\n  hosts: {h1: {}, h2: {}, h3: {}, h4: {}}\n"
    fleet = Fleet()

    def press_ctrl_c_twice() -> None:
        when(lambda: len(fleet.hosts) >= 2, "two hosts started")
        assert all(c.running.wait(SAFETY) for c in fleet.hosts.values())
        signal.raise_signal(signal.SIGINT)  # hosts stop after their operation: it hangs
        SYNC["output"].wait_for(STOPPING)  # counted and acted on: the next press is another
        signal.raise_signal(signal.SIGINT)  # cut off: their connections close

    presser = threading.Thread(target=press_ctrl_c_twice)
    presser.start()
    out = play(tmp_path, "- hosts: all\n  roles: [first]\n", inventory, files, fleet, forks=2)
    presser.join()
    assert out.code == 130
    assert set(fleet.hosts) == {"h1", "h2"}  # h3 and h4 never started
    outcomes = {name: str(host.outcome) for name, host in out.results.hosts.items()}
    assert outcomes == dict.fromkeys(["h1", "h2", "h3", "h4"], "interrupted")
    assert out.events == []  # the cut-off operations are not "unreachable"
    assert [(s["host"], s["outcome"], s["unreachable"]) for s in out.summaries] == [
        (h, "interrupted", 0) for h in ("h1", "h2", "h3", "h4")
    ]
    assert "cutting off the running operations" in out.output.split("RECAP")[0]
    assert after_recap(out) == ["interrupted (Ctrl-C): h1, h2, h3, h4 did not finish"]


# -- validating variables first, and steps that need hardware -----------------------------------

VALIDATED = {
    "roles/checked/role.py": """
        from fxkit.errors import VarError

        def validate(v):
            if not 1 <= v.mtu <= 9216:
                raise VarError(f"mtu {v.mtu} is out of range", where=f"{v.host}: mtu",
                               hint="use 68 to 9216")

        def validate_all(hosts):
            seen = {}
            for name, v in hosts.items():
                if v.nqn in seen:
                    raise VarError(f"nqn {v.nqn} is used by {seen[v.nqn]} and {name}",
                                   where=f"{name}: nqn")
                seen[v.nqn] = name

        def apply(host, v):
            host.put("/mtu", str(v.mtu))
        """,
}


def test_wrong_variables_of_every_host_are_named_before_any_host_is_touched(
    tmp_path: Path,
) -> None:
    inventory = """
    all:
      hosts:
        h1: {mtu: 9000, nqn: nqn.2024-01.io.fx:a}
        h2: {mtu: 99999, nqn: nqn.2024-01.io.fx:a}
        h3: {mtu: 0, nqn: nqn.2024-01.io.fx:c}
    """
    fleet = Fleet()
    with pytest.raises(VarError) as caught:
        play(tmp_path, "- hosts: all\n  roles: [checked]\n", inventory, VALIDATED, fleet=fleet)
    text = str(caught.value)
    assert "3 wrong variables (nothing was changed)" in text
    assert "h2: mtu: mtu 99999 is out of range" in text
    assert "h3: mtu: mtu 0 is out of range" in text
    assert "h2: nqn: nqn nqn.2024-01.io.fx:a is used by h1 and h2" in text
    assert fleet.hosts == {}  # no host was even connected


def test_one_wrong_variable_keeps_its_own_place_and_hint(tmp_path: Path) -> None:
    inventory = "all: {hosts: {h1: {mtu: 70000, nqn: x}}}"
    with pytest.raises(VarError) as caught:
        play(tmp_path, "- hosts: all\n  roles: [checked]\n", inventory, VALIDATED)
    assert caught.value.where == "h1: mtu"
    assert caught.value.hint == "use 68 to 9216"


NEEDS = {
    "roles/gpu/role.py": """
        def apply(host, v):
            if host.needs(v.get("has_gpu"), "verify GPUs", "no GPU (amd-smi not found)"):
                host.put("/gpu", "seen")
            host.put("/after", "yes")
        """,
}


def test_a_missing_device_is_skipped_with_its_reason_on_lab_hosts_only(tmp_path: Path) -> None:
    inventory = """
    all:
      hosts:
        lab: {fxkit_lab: true}
        ini_lab: {fxkit_lab: "yes"}
        real: {}
        real_gpu: {has_gpu: true}
    """
    out = play(tmp_path, "- hosts: all\n  roles: [gpu]\n", inventory, NEEDS)
    for name in ("lab", "ini_lab"):
        assert out.results.hosts[name].outcome is Outcome.OK
        assert out.counts(name)["skipped"] == 1
        assert out.file(name, "/gpu") is None and out.file(name, "/after") == "yes"
    skips = [e for e in out.events if e["host"] == "lab" and e["status"] == "skipped"]
    assert skips[0]["msg"] == "verify GPUs: no GPU (amd-smi not found)"
    assert out.results.hosts["real"].outcome is Outcome.FAILED
    assert out.file("real", "/after") is None  # a real host stops at the missing device
    failure = next(e for e in out.events if e["host"] == "real" and e["status"] == "failed")
    assert "verify GPUs: no GPU (amd-smi not found)" in failure["msg"]
    assert out.file("real_gpu", "/gpu") == "seen"


def test_errors_before_any_host_is_touched_never_quote_a_secret(tmp_path: Path) -> None:
    """The check of a role's Vars quotes the value it rejects: the error leaves the run masked,
    as everything the run prints."""
    files = {
        "roles/first/role.py": """
            from pydantic import Field

            from fxkit.engine.rolevars import RoleVars

            class Vars(RoleVars):
                registry_auth_key: str = Field("", min_length=64, description="the key")

            def apply(host, v):
                pass
            """
    }
    inventory = f"all:\n  hosts:\n    h1: {{registry_auth_key: '{SECRET}'}}\n"
    fleet = Fleet()
    with pytest.raises(VarError) as err:
        play(tmp_path, "- hosts: all\n  roles: [first]\n", inventory, files, fleet)
    assert SECRET not in str(err.value)
    assert err.value.message.startswith("registry_auth_key is '********': String should have")
    assert err.value.where == f"h1: registry_auth_key ({tmp_path / 'hosts.yml'}:3)"
    assert fleet.hosts == {}


def test_a_rollout_s_plan_never_quotes_a_secret(tmp_path: Path) -> None:
    """fxkit rollout asks the role for its instances before any host is touched: its errors
    are masked too."""
    write(
        tmp_path,
        {
            "site.yml": "- hosts: all\n  roles: [svc]\n",
            "hosts.yml": f"all:\n  hosts:\n    h1: {{registry_auth_key: '{SECRET}'}}\n",
            "roles/svc/role.py": """
                from pydantic import Field

                from fxkit.engine.rolevars import RoleVars
                from fxkit.errors import VarError

                SELECT = "svc_instances"


                class Vars(RoleVars):
                    registry_auth_key: str = Field(description="a secret")
                    svc_instances: list[str] | None = Field(None, description="chosen")


                def instance_specs(v):
                    raise VarError(f"{v.registry_auth_key} is wrong", where=f"{v.host}: key")

                def apply(host, v):
                    pass
                """,
        },
    )
    with pytest.raises(VarError) as err:
        rollout(tmp_path / "site.yml", tmp_path / "hosts.yml", RunOptions(), Recorder())
    assert SECRET not in str(err.value) and err.value.message == "******** is wrong"


def test_interruptible_honours_ctrl_c_where_the_parent_ignored_it() -> None:
    """A job a shell starts in the background inherits SIGINT ignored; inside
    ``interruptible()`` (fxkit rollout's batches) Ctrl-C still raises, and the ignore is put
    back afterwards."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with pytest.raises(KeyboardInterrupt), interruptible():
            signal.raise_signal(signal.SIGINT)
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)


def test_shielded_holds_ctrl_c_until_its_block_is_done() -> None:
    """Inside ``shielded()`` (a rollout's restart of an instance) Ctrl-C does not cut the block:
    it runs to its end, then KeyboardInterrupt is raised; without Ctrl-C nothing is raised."""
    done = []
    with pytest.raises(KeyboardInterrupt), interruptible():
        with shielded():
            signal.raise_signal(signal.SIGINT)
            done.append("after the signal")
        done.append("not reached")
    assert done == ["after the signal"]
    with interruptible(), shielded():
        done.append("quiet")
    assert done == ["after the signal", "quiet"]
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with shielded():  # ignored outside: ignored inside, nothing raised after
            signal.raise_signal(signal.SIGINT)
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)
