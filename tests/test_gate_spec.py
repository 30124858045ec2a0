"""Gate files (fxkit.gate.spec): the built-in ones load; every mistake names its file and line."""

from pathlib import Path

import pytest

from fxkit import paths
from fxkit.gate import spec
from fxkit.gate.spec import GateError

GOOD = """\
gate: mine
title: My gate
checks:
  - id: kernel
    title: Kernel
    why: A kernel the driver builds for.
    measure: {command: {run: uname -r}}
    rule: {">=": "5.15"}
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "gate.yml"
    path.write_text(text)
    return path


def test_every_built_in_gate_loads():
    names = sorted(p.stem for p in paths.builtin("gates").glob("*.yml"))
    assert "g1" in names
    for name in names:
        gate = spec.load(name)
        assert gate.name == name and gate.spec.checks
        assert len(gate.sha256) == 64
        for check in gate.spec.checks:
            assert check.why.strip(), f"{gate.where(check.id)}: a check explains itself"


def test_a_gate_file_loads_with_its_check_lines(tmp_path):
    gate = spec.load(write(tmp_path, GOOD))
    assert gate.spec.hosts == "all" and gate.spec.checks[0].severity == "critical"
    assert gate.where("kernel") == f"{tmp_path / 'gate.yml'}:4"


@pytest.mark.parametrize(
    ("old", "new", "line", "message"),
    [
        ("    why:", "    whyy:", 6, "unknown key 'whyy'"),
        ("{command: {run: uname -r}}", "{comand: {run: uname -r}}", 7, "did you mean 'command'"),
        ("{command: {run: uname -r}}", "{command: {rn: uname -r}}", 7, "unknown parameter 'rn'"),
        ('{">=": "5.15"}', '{"=>": "5.15"}', 8, "unknown operator '=>'"),
        ("    title: Kernel\n", "", 4, "missing key 'title'"),
        ("  - id: kernel", "  - id: Kernel-1", 4, "ids and stages are lowercase"),
        ("gate: mine", "gate: mine\nhostz: all", 2, "unknown key 'hostz'"),
        ("run: uname -r}", 'run: uname -r, parse: regex, pattern: "("}', 7, "not a regex"),
        ("run: uname -r}", "run: uname -r, parse: regex}", 7, "parse: regex needs a pattern"),
        ("run: uname -r}", "run: uname -r, parse: regex, pattern: '(\\d+)'}", 7, "named group"),
    ],
)
def test_mistakes_name_file_and_line(tmp_path, old, new, line, message):
    path = write(tmp_path, GOOD.replace(old, new))
    with pytest.raises(GateError, match=message) as info:
        spec.load(path)
    assert info.value.where == f"{path}:{line}"


def test_two_checks_with_one_id(tmp_path):
    checks = GOOD.split("checks:\n")[1]
    path = write(tmp_path, GOOD + checks)
    with pytest.raises(GateError, match="two checks have the id 'kernel'"):
        spec.load(path)


def test_templated_parameters_are_checked_per_host_not_when_read(tmp_path):
    text = GOOD.replace("{run: uname -r}", '{run: "{{ cmd }}", parse: "{{ how }}"}')
    assert spec.load(write(tmp_path, text)).spec.checks[0].measure["command"]["run"] == "{{ cmd }}"


def test_no_such_gate_lists_the_built_in_ones(tmp_path):
    with pytest.raises(GateError, match="no gate file 'g9'") as info:
        spec.load("g9")
    assert "g1" in (info.value.hint or "")


def test_broken_yaml_names_the_line(tmp_path):
    path = write(tmp_path, GOOD + "  - id: [\n")
    with pytest.raises(GateError) as info:
        spec.load(path)
    assert str(path) in str(info.value)


def test_the_kinds_reference_in_the_docs_is_current():
    from fxkit import reference

    doc = reference.GATES_DOC.read_text()
    assert reference.updated_gates(doc) == doc, "run `python -m fxkit.reference`, commit the doc"
