"""The provisioning benchmark: its workload is the same 20 tasks in all three forms, its parsers
read real tool output (tests/data/provbench/, see its README.md), and its summary math is right."""

from __future__ import annotations

import importlib.util
import os
import runpy
import sys
import types
from pathlib import Path
from types import SimpleNamespace

import jinja2
import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
WORKLOAD = REPO / "bench" / "provision"
DATA = Path(__file__).with_name("data") / "provbench"


def _load_bench() -> types.ModuleType:
    spec = importlib.util.spec_from_file_location("bench_provision", REPO / "bench/provision.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


bench = _load_bench()

# -- the workload: 20 tasks, the same in every form ------------------------------------------

ROOT, CONF = "/srv/fxkit-bench", "/etc/fxkit-bench.conf"
EXPECTED = (
    [("directory", f"{ROOT}/d{i}", "0755") for i in range(1, 6)]
    + [("template", f"{ROOT}/d{i}/app.conf", "0644") for i in range(1, 6)]
    + [("line", CONF, f"option_{i} = on") for i in range(1, 6)]
    + [("command", f"touch {ROOT}/done-{i}", f"{ROOT}/done-{i}") for i in range(1, 6)]
)


class RecordingHost:
    """Stands in for fxkit's Host API to list what the role asks for (no host involved)."""

    def __init__(self) -> None:
        self.tasks: list[tuple[str, str, str]] = []

    def directory(self, path: str, mode: str) -> None:
        self.tasks.append(("directory", path, mode))

    def template(self, src: str, dest: str, mode: str) -> None:
        assert (WORKLOAD / "fxkit/roles/provbench/templates" / src).is_file()
        self.tasks.append(("template", dest, mode))

    def line(self, path: str, line: str) -> None:
        self.tasks.append(("line", path, line))

    def command(self, cmd: str, creates: str) -> None:
        self.tasks.append(("command", cmd, creates))


def test_fxkit_role_has_the_20_tasks() -> None:
    role = runpy.run_path(str(WORKLOAD / "fxkit/roles/provbench/role.py"))
    defaults = yaml.safe_load((WORKLOAD / "fxkit/roles/provbench/defaults.yml").read_text())
    host = RecordingHost()
    role["apply"](host, defaults)
    assert host.tasks == EXPECTED


def test_ansible_playbook_has_the_20_tasks() -> None:
    (play,) = yaml.safe_load((WORKLOAD / "ansible/playbook.yml").read_text())
    assert play["gather_facts"] is False
    render = jinja2.Environment(undefined=jinja2.StrictUndefined)
    tasks = []
    for task in play["tasks"]:
        (module, args), *_ = ((k, v) for k, v in task.items() if k.startswith("ansible.builtin."))
        for item in play["vars"]["slots"]:
            arg = {
                k: render.from_string(str(v)).render(**play["vars"], item=item)
                for k, v in args.items()
            }
            kind = module.removeprefix("ansible.builtin.")
            if kind == "file":
                assert arg["state"] == "directory"
                tasks.append(("directory", arg["path"], arg["mode"]))
            elif kind == "template":
                assert (WORKLOAD / "ansible/templates" / arg["src"]).is_file()
                tasks.append(("template", arg["dest"], arg["mode"]))
            elif kind == "lineinfile":
                tasks.append(("line", arg["path"], arg["line"]))
            else:
                tasks.append(("command", arg["cmd"], arg["creates"]))
    assert sorted(tasks, key=EXPECTED.index) == tasks == EXPECTED


def test_pyinfra_deploy_has_the_20_tasks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Run deploy.py with recording stand-ins for the pyinfra modules it imports; on a fresh
    host (the File fact finds nothing) it declares the 20 operations."""
    tasks: list[tuple[str, str, str]] = []
    files = SimpleNamespace(
        directory=lambda name, path, mode: tasks.append(("directory", path, mode)),
        template=lambda name, src, dest, mode: (
            tasks.append(("template", dest, mode))
            if Path(src).is_file()
            else pytest.fail(f"missing template {src}")
        ),
        line=lambda name, path, line: tasks.append(("line", path, line)),
    )
    server = SimpleNamespace(
        shell=lambda name, commands: tasks.append(("command", *commands, commands[0].split()[-1]))
    )
    fake_host = SimpleNamespace(get_fact=lambda fact, path: None)
    modules = {
        "pyinfra": SimpleNamespace(host=fake_host),
        "pyinfra.operations": SimpleNamespace(files=files, server=server),
        "pyinfra.facts.files": SimpleNamespace(File=object()),
    }
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)
    runpy.run_path(str(WORKLOAD / "pyinfra/deploy.py"))
    assert tasks == EXPECTED


def test_templates_render_the_same_file() -> None:
    """fxkit and ansible share one template; pyinfra's spells the variables its own way."""
    fx = (WORKLOAD / "fxkit/roles/provbench/templates/app.conf.j2").read_text()
    assert (WORKLOAD / "ansible/templates/app.conf.j2").read_text() == fx
    pyinfra = (WORKLOAD / "pyinfra/templates/app.conf.j2").read_text()
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    variables = {"inventory_hostname": "lab07", **bench.host_vars(7)}
    host = SimpleNamespace(name="lab07", data=SimpleNamespace(**bench.host_vars(7)))
    rendered = env.from_string(fx).render(variables)
    assert rendered == env.from_string(pyinfra).render(host=host)
    assert "name = lab07\nid = 7\nzone = zone-d\nport = 8007\n" in rendered


# -- reading what the tools did (real output) ------------------------------------------------


def test_parse_ansible_recap() -> None:
    first = bench.parse_ansible((DATA / "ansible-first.txt").read_text())
    assert (first.changed, first.failed, first.changed_hosts) == (8, 0, {"lab01", "lab02"})
    second = bench.parse_ansible((DATA / "ansible-second.txt").read_text())
    assert (second.changed, second.failed, second.changed_hosts) == (0, 0, set())
    lost = bench.parse_ansible((DATA / "ansible-unreachable.txt").read_text())
    assert (lost.failed, lost.changed_hosts) == (1, {"lab01"})


def test_parse_pyinfra_output() -> None:
    first = bench.parse_pyinfra((DATA / "pyinfra-first.txt").read_text())
    assert (first.changed, first.failed, first.changed_hosts) == (40, 0, {"lab01", "lab02"})
    second = bench.parse_pyinfra((DATA / "pyinfra-second.txt").read_text())
    assert (second.changed, second.failed) == (0, 0)
    lost = bench.parse_pyinfra((DATA / "pyinfra-unreachable.txt").read_text())
    assert lost.failed == 1


def test_parse_pyinfra_reads_padded_host_prefixes() -> None:
    """With lab100 in the inventory pyinfra prints ``[lab01]  Success`` (its prefix padded to
    the longest name): every host's changes are read."""
    first = bench.parse_pyinfra((DATA / "pyinfra-first-names.txt").read_text())
    assert (first.changed, first.failed) == (60, 0)
    assert first.changed_hosts == {"lab01", "lab02", "lab100"}


def test_parse_pyinfra_stops_on_a_line_it_misses() -> None:
    """A change in pyinfra's results table that no per-host line shows stops the benchmark."""
    output = (DATA / "pyinfra-first-names.txt").read_text()
    unread = output.replace("    [lab02]  Success\n", "    [lab02]  Succeeded\n", 1)
    with pytest.raises(bench.BenchError, match="table counts 60 changes, its per-host lines 59"):
        bench.parse_pyinfra(unread)
    with pytest.raises(bench.BenchError, match="no results table"):
        bench.parse_pyinfra(output.split("--> Results:")[0])


def test_parse_fxkit_event_log() -> None:
    first = bench.parse_fxkit_events((DATA / "fxkit-first.events.json").read_text())
    assert (first.changed, first.failed, first.changed_hosts) == (40, 0, {"lab01", "lab02"})
    second = bench.parse_fxkit_events((DATA / "fxkit-second.events.json").read_text())
    assert (second.changed, second.failed) == (0, 0)


# -- the summary ------------------------------------------------------------------------------


def _run(tool: str, phase: str, wall: float, round_: int, hosts: int = 32) -> object:
    return bench.Run(tool, hosts, round_, phase, wall, wall / 2, wall / 4, 0, 0)


def test_summary_medians_ratios_and_targets() -> None:
    runs = [
        _run(tool, phase, wall * factor, round_)
        for round_, wall in enumerate((1.0, 3.0, 2.0), 1)
        for tool, factor in (("fxkit", 1), ("pyinfra", 2), ("ansible", 20))
        for phase in ("first", "second")
    ]
    runs[-1] = _run("ansible", "second", 10.0, 3)  # second run: ansible 20, 60, 10 -> median 20
    rows = bench.summarize(runs, ["fxkit", "pyinfra", "ansible"])
    by = {(r["phase"], r["tool"]): r for r in rows}
    assert by["first", "fxkit"]["wall_s_median"] == 2.0
    assert by["first", "ansible"]["vs_fxkit"] == 20.0
    assert by["second", "ansible"]["wall_s_median"] == 20.0
    assert by["first", "fxkit"]["controller_cpu_ms_per_host_task"] == round(1000 / 640, 2)
    assert bench.targets(rows) == {
        "first: faster than pyinfra": True,
        "first: >= 15x faster than ansible-core": True,
        "second: faster than pyinfra": True,
        "second: >= 15x faster than ansible-core": False,
    }


def test_issue26_targets_from_the_summary() -> None:
    """Speed-ups and hosts' CPU against pyinfra at every host count, growth from 64 to 128."""
    walls = {("fxkit", 64): 10.0, ("fxkit", 128): 21.0, ("pyinfra", 64): 25.0,
             ("pyinfra", 128): 40.0}  # fmt: skip
    runs = [_run(tool, phase, wall / (2 if phase == "second" else 1), 1, hosts)
            for (tool, hosts), wall in walls.items() for phase in ("first", "second")]  # fmt: skip
    goals = {g["target"]: (g["measured"], g["met"]) for g in
             bench.limit_targets(bench.summarize(runs, ["fxkit", "pyinfra"]))}  # fmt: skip
    assert goals["64 hosts, first run: >= 2.0x pyinfra"] == (2.5, True)
    assert goals["128 hosts, second run: >= 2.5x pyinfra"] == (1.9, False)
    assert goals["128 hosts, first run: hosts' CPU per task <= 0.6x pyinfra's"] == (0.52, True)
    assert goals["64 hosts, second run: hosts' CPU per task <= 0.6x pyinfra's"] == (0.4, True)
    assert goals["fxkit first run: growth 64 -> 128 hosts <= 2.05x"] == (2.1, False)
    assert len(goals) == 10


# -- the whole benchmark, fxkit only, on a real 2-host lab fleet -------------------------------


@pytest.mark.lab
@pytest.mark.skipif(os.geteuid() != 0, reason="the lab fleet needs root")
def test_benchmark_round_on_lab_fleet(tmp_path: Path) -> None:
    pytest.importorskip("fxkit.engine.runner", reason="needs the runner (fxkit play)")
    output = tmp_path / "provision.json"
    argv = ["--hosts", "2", "--runs", "1", "--tools", "fxkit", "--json", str(output)]
    argv += ["--lab-dir", str(tmp_path / "lab"), "--prefix", "127.89.7"]
    assert bench.main(argv) == 0
    report = yaml.safe_load(output.read_text())
    phases = {(r["phase"], r["changed"]) for r in report["runs"]}
    assert phases == {("first", 40), ("second", 0)}
    assert all(r["controller_cpu_s"] > 0 and r["hosts_cpu_s"] > 0 for r in report["runs"])
    assert not (tmp_path / "lab").exists()  # the fleet is down and its state removed
