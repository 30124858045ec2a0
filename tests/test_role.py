"""Roles: finding them, loading them (mistakes at file:line), tags, and the Host API on this
machine through the real local connection and operations."""

from __future__ import annotations

import inspect
import io
import json
import textwrap
from pathlib import Path

import pytest

from fxkit import paths, reference
from fxkit.connection.local import LocalConnection
from fxkit.engine.jsonlog import JsonLog
from fxkit.engine.record import Recorder
from fxkit.engine.role import Host, HostFailed, RoleLoader, TagFilter, roles_path
from fxkit.engine.variables import HostVars, Layer
from fxkit.errors import PlaybookError
from fxkit.facts.base import FactCache
from fxkit.facts.system import Kernel
from fxkit.ops import OPERATIONS
from fxkit.ops.base import OpContext, Result, Status


def make_role(folder: Path, name: str, code: str, **files: str) -> Path:
    role = folder / name
    role.mkdir(parents=True)
    (role / "role.py").write_text(textwrap.dedent(code))
    for file_name, text in files.items():
        path = role / file_name.replace("__", "/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return role


def load_error(tmp_path: Path, code: str, **files: str) -> PlaybookError:
    make_role(tmp_path, "r", code, **files)
    with pytest.raises(PlaybookError) as err:
        RoleLoader([tmp_path]).load("r")
    return err.value


def test_a_role_loads_with_defaults_and_templates(tmp_path: Path) -> None:
    folder = make_role(
        tmp_path, "r", "def apply(host, v):\n    pass\n", **{"defaults.yml": "a: 1\n"}
    )
    loader = RoleLoader([tmp_path])
    role = loader.load("r")
    assert (role.name, role.path, role.defaults) == ("r", folder, {"a": 1})
    assert role.templates == folder / "templates"
    assert loader.load("r") is role  # loaded once per run


def test_syntax_error_points_at_the_line(tmp_path: Path) -> None:
    err = load_error(tmp_path, "def apply(host, v):\n    host.file('/x',\n\n")
    assert err.where and err.where.startswith(f"{tmp_path / 'r' / 'role.py'}:")
    assert "syntax error" in err.message


def test_import_time_failure_points_at_the_line(tmp_path: Path) -> None:
    err = load_error(
        tmp_path, "import os\nimport no_such_module_here\n\ndef apply(host, v): pass\n"
    )
    assert err.where == f"{tmp_path / 'r' / 'role.py'}:2"
    assert "ModuleNotFoundError" in err.message


def test_missing_apply(tmp_path: Path) -> None:
    err = load_error(tmp_path, "def aply(host, v):\n    pass\n")
    assert err.where == f"{tmp_path / 'r' / 'role.py'}:1"
    assert "no apply function" in err.message and err.hint and "def apply(host, v)" in err.hint


def test_apply_with_the_wrong_arguments(tmp_path: Path) -> None:
    err = load_error(tmp_path, "\n\ndef apply(host):\n    pass\n")
    assert err.where == f"{tmp_path / 'r' / 'role.py'}:3"


def test_bad_defaults_file(tmp_path: Path) -> None:
    err = load_error(tmp_path, "def apply(host, v): pass\n", **{"defaults.yml": "a: 1\nb: [\n"})
    assert err.where and err.where.startswith(f"{tmp_path / 'r' / 'defaults.yml'}:")
    err = load_error(tmp_path / "2", "def apply(host, v): pass\n", **{"defaults.yml": "- a\n"})
    assert "must be a mapping" in err.message


def test_unknown_role_suggests_a_known_one(tmp_path: Path) -> None:
    make_role(tmp_path, "nvme_target", "def apply(host, v): pass\n")
    with pytest.raises(PlaybookError) as err:
        RoleLoader([tmp_path, paths.builtin("roles")]).load("nvme_targt", "site.yml:7")
    assert err.value.where == "site.yml:7"
    assert err.value.hint and "did you mean 'nvme_target'?" in err.value.hint
    assert "node_base" in err.value.hint  # the built-in roles are listed too


def test_roles_path_order(tmp_path: Path) -> None:
    search = roles_path(tmp_path / "book", ["/a", "/b"])
    assert search == [tmp_path / "book/roles", Path("/a"), Path("/b"), paths.builtin("roles")]
    for folder, marker in ((tmp_path / "low", "low"), (tmp_path / "high", "high")):
        make_role(folder, "same", f"MARK = {marker!r}\ndef apply(host, v): pass\n")
    role = RoleLoader([tmp_path / "high", tmp_path / "low"]).load("same")
    assert role.path == tmp_path / "high" / "same"


def test_builtin_role_is_found() -> None:
    role = RoleLoader(roles_path(None)).load("node_base")
    assert role.defaults["node_base_sysctl"] == {"kernel.numa_balancing": 0}
    assert (role.templates / "node.yaml.j2").is_file()
    assert (role.path / "README.md").is_file()


@pytest.mark.parametrize(
    ("only", "skip", "tags", "selected"),
    [
        ((), (), [], True),
        (("a",), (), [], False),
        (("a",), (), ["a", "b"], True),
        (("all",), (), ["x"], True),
        (("a",), (), ["always"], True),
        ((), ("always",), ["always"], False),
        ((), ("b",), ["a", "b"], False),
        ((), (), ["never"], False),
        (("debug",), (), ["never", "debug"], True),
    ],
)
def test_tag_filter(only: tuple, skip: tuple, tags: list[str], selected: bool) -> None:
    assert TagFilter(frozenset(only), frozenset(skip)).selects(tags) is selected


# -- the Host API on this machine -----------------------------------------------------------


@pytest.fixture
def host_api(tmp_path: Path):
    def make(code: str = "def apply(host, v): pass\n", check: bool = False, **templates: str):
        files = {f"templates__{name}": text for name, text in templates.items()}
        folder = make_role(tmp_path / "roles", "r", code, **files)
        role = RoleLoader([folder.parent]).load("r")
        conn = LocalConnection("localhost")
        ctx = OpContext(conn, FactCache(conn), check=check, diff=True)
        v = HostVars("localhost", [Layer("play vars", {"dir": str(tmp_path), "who": "gpu01"})])
        log = io.StringIO()
        host = Host(ctx, v, role=role, play="p", recorder=Recorder([JsonLog(log)]))
        host.events = lambda: [json.loads(line) for line in log.getvalue().splitlines()]
        return host

    return make


def test_the_host_api_and_the_operations_agree() -> None:
    """Every operation is a typed method of Host with the operation's own signature (after ctx)
    and its docstring, with an example. (An operation may have a parameter called ``name``:
    task keywords go to host.task() and cannot collide with it.)"""
    methods = Host.operations()
    assert set(methods) == set(OPERATIONS)
    for name, op in OPERATIONS.items():
        method = methods[name]
        assert method.op is op and method.__doc__ == op.__doc__, name
        params = list(inspect.signature(op).parameters.values())
        assert params[0].name == "ctx" and params[0].annotation in (OpContext, "OpContext"), name
        assert list(method.signature.parameters.values()) == params[1:], name
        assert op.__doc__ and "host." in op.__doc__, f"{name}'s docstring has no example"


def test_a_bound_operation_shows_its_own_signature(host_api) -> None:
    host = host_api()
    assert str(inspect.signature(host.directory)) == str(Host.operations()["directory"].signature)
    assert host.directory.__doc__ == OPERATIONS["directory"].__doc__


def test_a_misspelt_operation_names_the_right_one(host_api) -> None:
    with pytest.raises(AttributeError, match=r"did you mean host\.directory"):
        host_api().diretory("/x")


def test_task_keywords_apply_to_the_calls_made_through_the_view(host_api, tmp_path: Path) -> None:
    host = host_api()
    with host.task("make the folder", tags=["setup"]) as setup:
        assert setup.directory(f"{tmp_path}/d").changed
    lenient = host.task(ignore_errors=True)
    assert lenient.command("exit 3").failed  # reported, and the host goes on
    with pytest.raises(HostFailed):
        host.command("exit 3")  # the view's keywords did not leak into the host
    names = [e["operation"] for e in host.events()]
    assert names == ["make the folder", "command exit 3", "command exit 3"]


def test_task_tags_select_with_the_run_s_tag_filter(host_api, tmp_path: Path) -> None:
    host = host_api()
    host._tags = TagFilter(only=frozenset({"nvme"}))
    assert host.task(tags=["nvme"]).directory(f"{tmp_path}/picked").changed
    skipped = host.task(tags="other").directory(f"{tmp_path}/left")
    assert skipped.status is Status.SKIPPED and not (tmp_path / "left").exists()


def test_own_operations_run_through_call(host_api, tmp_path: Path) -> None:
    def stamp(ctx: OpContext, path: str) -> Result:
        """Write a stamp file."""
        return ctx.change(f"touch {path}", would=f"stamp {path}", done=f"stamped {path}")

    host = host_api()
    assert host.call(stamp, f"{tmp_path}/s").changed and (tmp_path / "s").exists()
    assert host.events()[-1]["operation"] == f"stamp {tmp_path}/s"


def test_a_method_of_an_unhashable_object_runs_through_call(host_api, tmp_path: Path) -> None:
    class Stamper:
        """Defines __eq__ without __hash__: its bound methods are unhashable."""

        def __eq__(self, other: object) -> bool:
            return isinstance(other, Stamper)

        def stamp(self, ctx: OpContext, path: str) -> Result:
            return ctx.change(f"touch {path}", would=f"stamp {path}", done=f"stamped {path}")

    host = host_api()
    assert host.call(Stamper().stamp, f"{tmp_path}/s").changed and (tmp_path / "s").exists()
    with pytest.raises(PlaybookError, match="unexpected argument 'nope'"):
        host.call(Stamper().stamp, f"{tmp_path}/s", nope=1)


def test_a_task_keyword_passed_as_an_argument_is_refused_at_the_role_s_line(host_api) -> None:
    with pytest.raises(PlaybookError, match=r"unexpected argument 'ignore_errors'") as err:
        host_api().command("true", ignore_errors=True)  # type: ignore[call-arg]
    assert err.value.where and err.value.where.startswith(__file__)
    assert "host.task" in (err.value.hint or "")


def test_operations_record_results_and_return_them(host_api, tmp_path: Path) -> None:
    host = host_api()
    result = host.directory(f"{tmp_path}/d", mode="0750")
    assert result.changed and result  # truthy when it changed something
    assert not host.directory(f"{tmp_path}/d", mode="0750")
    events = host.events()
    assert [(e["operation"], e["status"], e["role"], e["play"]) for e in events] == [
        (f"directory {tmp_path}/d", "changed", "r", "p"),
        (f"directory {tmp_path}/d", "ok", "r", "p"),
    ]


def test_a_failed_operation_stops_the_host_unless_ignored(host_api, tmp_path: Path) -> None:
    host = host_api()
    with pytest.raises(HostFailed) as err:
        host.command("echo to-stderr >&2; exit 3")
    assert "rc=3" in err.value.result.msg and "to-stderr" in err.value.result.msg
    result = host.task(ignore_errors=True).command("exit 4")
    assert result.failed
    assert [e["status"] for e in host.events()] == ["failed", "failed"]


def test_bad_arguments_an_operation_rejects_fail_that_operation(host_api, tmp_path: Path) -> None:
    host = host_api()
    result = host.task(ignore_errors=True).directory(f"{tmp_path}/d", mode="rwx")
    assert result.failed and "mode" in result.msg


def test_template_renders_with_host_variables_and_writes_a_file(host_api, tmp_path: Path) -> None:
    host = host_api(**{"motd.j2": "node {{ who }}\n"})
    assert host.template("motd.j2", f"{tmp_path}/motd", mode="0644")
    assert (tmp_path / "motd").read_text() == "node gpu01\n"
    assert not host.template("motd.j2", f"{tmp_path}/motd", mode="0644")
    assert host.events()[0]["diff"].endswith("+node gpu01\n")


def test_check_mode_is_visible_and_changes_nothing(host_api, tmp_path: Path) -> None:
    host = host_api(check=True, **{"motd.j2": "x\n"})
    assert host.check
    assert host.template("motd.j2", f"{tmp_path}/motd").changed
    assert not (tmp_path / "motd").exists()


def test_facts_are_gathered_once(host_api) -> None:
    host = host_api()
    kernel = host.fact(Kernel)
    assert kernel and kernel == Path("/proc/sys/kernel/osrelease").read_text().strip()
    assert host.fact(Kernel) is kernel


def test_notify_runs_each_handler_once_and_only_when_asked(host_api, tmp_path: Path) -> None:
    host = host_api()
    calls: list[str] = []

    def reload(h: Host, v: HostVars) -> None:
        calls.append(v.who)

    def never(h: Host, v: HostVars) -> None:
        calls.append("never")

    host.notify(reload)
    host.notify(reload, when=True)
    host.notify(never, when=host.directory(str(tmp_path)))  # ok: no change, no handler
    host.run_handlers()
    assert calls == ["gpu01"]
    host.run_handlers()
    assert calls == ["gpu01"]


def test_fail_stops_the_host_with_a_message(host_api) -> None:
    host = host_api()
    with pytest.raises(HostFailed):
        host.fail("needs 8 GPUs, found 4")
    assert host.events()[0]["msg"] == "needs 8 GPUs, found 4"


def test_the_operations_reference_in_the_docs_is_current() -> None:
    doc = reference.DOC.read_text()
    assert reference.updated(doc) == doc, "run `python -m fxkit.reference` and commit the doc"
