"""Data files never run code, through the real ``fxkit`` executable.

A template reaching Python's internals (``lipsum.__globals__``) from a gate file's rule, a gate's
``vars:``, an inventory variable or ``-e`` is refused (Jinja2's sandbox) with an error naming
where it is, before any host is touched. ``fxkit gate evaluate`` treats a result.json as data:
the values kept in it are never rendered again, its ``gate_file`` is shown, never opened, unless
``--gate`` names it, and what it writes is strict JSON. No test here reaches a host: the gates'
one host is an address where nothing listens, and every run stops before connecting.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fxkit import paths

FXKIT = Path(sys.executable).with_name("fxkit")
OLD = Path(__file__).parent / "data" / "gate" / "before-strict-json"
#: A host where nothing listens: any attempt to reach it would be an ERROR, not a refusal.
NOWHERE = "all:\n  hosts:\n    h1: {ansible_host: 127.0.0.1, ansible_port: 9, %s}\n"

GATE = """\
gate: data
title: Data gate
hosts: all
vars:
  thr: 1
checks:
  - id: cpus
    title: CPUs
    why: A threshold from a variable.
    measure: {command: {run: nproc, parse: number}}
    rule: {">=": "{{ thr }}"}
"""


def fxkit(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(FXKIT), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "300"},
    )


def payload(marker: Path) -> str:
    """A template that, rendered outside a sandbox, runs ``touch MARKER``."""
    return f"{{{{ lipsum.__globals__['os'].popen('touch {marker}').read() }}}}"


def strict_json(path: Path) -> Any:
    """The file parsed as strict JSON (RFC 8259: no NaN, Infinity)."""

    def refuse(constant: str) -> None:
        raise ValueError(f"{path}: {constant} is not JSON")

    return json.loads(path.read_text(), parse_constant=refuse)


@pytest.mark.parametrize("place", ["rule", "gate vars", "inventory", "-e"])
def test_a_gate_template_runs_no_code(tmp_path: Path, place: str) -> None:
    marker = tmp_path / "marker"
    attack = json.dumps(payload(marker))
    gate, host_vars, args = GATE, "x: 1", []
    if place == "rule":
        gate = GATE.replace('"{{ thr }}"', attack)
    elif place == "gate vars":
        gate = GATE.replace("thr: 1", f"thr: {attack}")
    elif place == "inventory":
        host_vars = f"thr: {attack}"
    else:
        args = ["-e", json.dumps({"thr": payload(marker)})]
    (tmp_path / "gate.yml").write_text(gate)
    (tmp_path / "hosts.yml").write_text(NOWHERE % host_vars)

    proc = fxkit("gate", "./gate.yml", "-i", "hosts.yml", "--out", "out", *args, cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert not marker.exists()
    assert not (tmp_path / "out").exists()  # refused before the run: no host, no report
    assert "Traceback" not in proc.stdout + proc.stderr
    assert "gate.yml:7: " in proc.stderr  # the check's line
    assert "SecurityError for host h1" in proc.stderr and "unsafe" in proc.stderr
    if place != "rule":
        source = {
            "gate vars": "gate data vars",
            "inventory": "hosts.yml:3",
            "-e": "-e #1 on the command line",
        }[place]
        assert f"variable 'thr' ({source}), line 1" in proc.stderr


def test_a_broken_connection_variable_stops_the_gate_before_any_host(tmp_path: Path) -> None:
    (tmp_path / "gate.yml").write_text(GATE)
    hosts = "all:\n  hosts:\n    h1: {ansible_port: '{{ 1 / 0 }}'}\n    h2: {ansible_port: 9}\n"
    (tmp_path / "hosts.yml").write_text(
        hosts.replace("{ansible", "{ansible_host: 127.0.0.1, ansible")
    )
    proc = fxkit("gate", "./gate.yml", "-i", "hosts.yml", "--out", "out", cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "variable 'ansible_port' (hosts.yml:3), line 1: ZeroDivisionError" in proc.stderr
    assert "unreachable" not in proc.stdout  # h2 was not tried either
    assert not (tmp_path / "out").exists() and "Traceback" not in proc.stderr


PLAY_ROLE = "def apply(host, v):\n    host.command('true', only_if=f'test {v.thr} = 1')\n"


@pytest.mark.parametrize(
    ("place", "name", "value", "error"),
    [
        ("inventory", "thr", "PAYLOAD", "SecurityError"),
        ("-e", "thr", "PAYLOAD", "SecurityError"),
        ("inventory", "thr", "{{ 1 / 0 }}", "ZeroDivisionError"),
        ("-e", "thr", "{{ [1, 'a'] | sum }}", "TypeError"),
        ("inventory", "ansible_become", "{{ none | join(',') }}", "TypeError"),
    ],
)
def test_a_play_variable_runs_no_code_and_its_error_is_one_clear_line(
    tmp_path: Path, place: str, name: str, value: str, error: str
) -> None:
    marker = tmp_path / "marker"
    value = value.replace("PAYLOAD", payload(marker))
    (tmp_path / "roles" / "r").mkdir(parents=True)
    (tmp_path / "roles" / "r" / "role.py").write_text(PLAY_ROLE)
    (tmp_path / "book.yml").write_text("- hosts: all\n  roles: [r]\n")
    host_vars = {"ansible_connection": "local", "thr": 1}
    args = ["-e", json.dumps({name: value})] if place == "-e" else []
    if place == "inventory":
        host_vars[name] = value
    (tmp_path / "hosts.yml").write_text(json.dumps({"all": {"hosts": {"h1": host_vars}}}))

    proc = fxkit("play", "book.yml", "-i", "hosts.yml", *args, cwd=tmp_path)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 1, output
    assert not marker.exists()
    assert "Traceback" not in output
    source = "-e #1 on the command line" if place == "-e" else "hosts.yml:1"  # JSON: one line
    assert f"variable '{name}' ({source}), line 1: {error} for host h1" in output


def old_result(tmp_path: Path, **changes: Any) -> Path:
    """The result file an older fxkit wrote (tests/data/gate/before-strict-json), changed."""
    data = json.loads((OLD / "result.json").read_text())
    for key, value in changes.items():
        if key == "vars":
            data["hosts"]["localhost"]["vars"].update(value)
        else:
            data[key] = value
    path = tmp_path / "result.json"
    path.write_text(json.dumps(data))
    return path


def test_an_old_result_file_re_evaluates_as_data_into_strict_json(tmp_path: Path) -> None:
    results = old_result(tmp_path)
    proc = fxkit("gate", "evaluate", str(results), "--gate", str(OLD / "gate.yml"), cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr  # the NaN is an ERROR now
    (folder,) = tmp_path.glob("reevaluated-*")
    result = strict_json(folder / "result.json")
    checks = {c["id"]: c for c in result["hosts"]["localhost"]["checks"]}
    assert checks["cpus"]["status"] == "PASS"
    assert checks["cpus"]["bounds"] == {"low": 1, "high": None, "line": 1, "base": None}
    # The kept value is text holding braces: compared as it is, not rendered to 42.
    assert checks["label"]["status"] == "PASS"
    assert checks["label"]["rule"] == {"==": "{{ 7 * 6 }}"}
    assert checks["ratio"]["status"] == "ERROR" and checks["ratio"]["value"] == "NaN"
    assert "not a finite number" in checks["ratio"]["reason"]
    assert result["hosts"]["localhost"]["measurements"][1]["data"] == "NaN"


def test_evaluate_never_renders_a_value_kept_in_the_results(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    results = old_result(tmp_path, vars={"label": payload(marker)})
    out = tmp_path / "out"
    proc = fxkit(
        "gate", "evaluate", str(results), "--gate", str(OLD / "gate.yml"), "-o", "out", cwd=tmp_path
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert not marker.exists()
    label = strict_json(out / "result.json")["hosts"]["localhost"]["checks"][2]
    assert label["rule"] == {"==": payload(marker)} and label["status"] == "FAIL"


def test_the_gate_file_a_result_names_is_shown_never_opened(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    named = tmp_path / "named.yml"  # what a tampered result points at
    named.write_text(
        (OLD / "gate.yml")
        .read_text()
        .replace("min_cpus: 1", f"min_cpus: {json.dumps(payload(marker))}")
    )
    results = old_result(tmp_path, gate_file=str(named))

    proc = fxkit("gate", "evaluate", str(results), cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"made with the gate file {named}" in proc.stderr
    assert f"--gate {named}" in proc.stderr and "Traceback" not in proc.stderr
    assert not list(tmp_path.glob("reevaluated-*")) and not marker.exists()

    proc = fxkit("gate", "evaluate", str(results), "--gate", str(OLD / "gate.yml"), cwd=tmp_path)
    assert proc.returncode == 1 and not marker.exists()


def test_a_built_in_gate_named_by_a_result_is_used_without_gate(tmp_path: Path) -> None:
    builtin = paths.builtin("gates") / "g1.yml"
    results = old_result(tmp_path, gate="g1", gate_file=str(builtin), hosts={})
    proc = fxkit("gate", "evaluate", str(results), "-o", "out", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert strict_json(tmp_path / "out" / "result.json")["gate_file"] == str(builtin)
