"""A check's ``requires:``: a figure only the site can give. Unset, null or empty on a host, the
check is ERROR there naming it, and nothing is measured (the command would leave a file); set,
the check runs and is judged. On this machine, over a local connection (no lab needed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fxkit.gate.run import GateOptions, run_gate

GATE = """\
gate: site
title: A figure the site sets
checks:
  - id: memory
    title: Memory
    why: The site's figure.
    measure: {command: {run: "touch MARK; echo 4", parse: number}}
    value: null
    rule: {">=": "{{ site_min_gib }}"}
    requires: [site_min_gib]
  - id: other
    title: Other
    why: Needs nothing.
    measure: {command: {run: "echo 1", parse: number}}
    rule: {"==": 1}
"""


@pytest.mark.parametrize(
    ("extra", "status"),
    [({}, "ERROR"), ({"site_min_gib": None}, "ERROR"), ({"site_min_gib": []}, "ERROR"),
     ({"site_min_gib": 2}, "PASS"), ({"site_min_gib": 8}, "FAIL")],
)  # fmt: skip
def test_an_unset_site_figure_is_an_error_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, extra: dict, status: str
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "gate.yml").write_text(GATE)
    hosts = {"all": {"hosts": {"here": {"ansible_connection": "local"}}}}
    (tmp_path / "hosts.yml").write_text(json.dumps(hosts))
    result = run_gate(tmp_path / "gate.yml", tmp_path / "hosts.yml", GateOptions(extra_vars=extra))
    checks = {c.id: c for c in result.hosts["here"].checks}
    assert checks["memory"].status.value == status
    assert checks["other"].status.value == "PASS"
    if status == "ERROR":
        assert checks["memory"].reason.startswith("site_min_gib not set: a figure only the site")
        assert checks["memory"].measurement is None and not (tmp_path / "MARK").exists()
    else:
        assert (tmp_path / "MARK").exists()
