"""A check is judged once: its status and its rule's thresholds as numbers (its bounds, each
item's for per-item values) are kept in the results and in result.json, and every report (HTML,
Markdown, JUnit, the terminal's table) shows what the results keep, never applying a rule
again. A result.json written before bounds were kept still loads, and re-evaluates with them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rich.console import Console

from fxkit.gate import html, junit, markdown, rules, spec
from fxkit.gate.report import table
from fxkit.gate.rules import Bounds
from fxkit.gate.run import rule_renderer
from fxkit.gate.spec import CheckSpec
from fxkit.gate.verdicts import (
    CheckResult,
    CheckStatus,
    GateResult,
    HostChecks,
    ItemCheck,
    Measurement,
    judge,
    load_results,
    reevaluate,
    skipped,
)

OLD = Path(__file__).parent / "data" / "gate" / "before-strict-json"


def check_spec(**kw) -> CheckSpec:
    base = {"id": "c", "title": "C", "why": "w", "measure": {"command": "true"}, "rule": {">=": 8}}
    return CheckSpec.model_validate({**base, **kw})


def judged(rule, value, baseline=None, severity="critical") -> CheckResult:
    measured = Measurement("command", {}, data={"v": value})
    return judge(check_spec(value="v", severity=severity), rule, measured, 0, baseline)


@pytest.mark.parametrize(
    ("rule", "value", "baseline", "bounds"),
    [
        ({">=": 8}, 9, None, Bounds(low=8, line=8)),
        ({">": "8"}, 9.5, None, Bounds(low=8, line=8)),
        ({"<": 0.5}, 0.1, None, Bounds(high=0.5, line=0.5)),
        ({"==": 8}, 8, None, Bounds(line=8)),
        ({"between": [0.25, 0.5]}, 0.3, None, Bounds(0.25, 0.5)),
        ({"within": {"of": 200, "tolerance": "5%"}}, 191, None, Bounds(190, 210, line=200)),
        ({"within": {"of": 200, "tolerance": 20}}, 230, None, Bounds(180, 220, line=200)),
        ({"change": {"min": "-50%", "max": "25%"}}, 700, 1000, Bounds(500, 1250, base=1000)),
        ({"change": {"max": "-25%"}}, 800, 1000, Bounds(high=750, base=1000)),
    ],
)
def test_a_number_judged_by_a_numeric_rule_keeps_its_bounds(rule, value, baseline, bounds):
    assert judged(rule, value, baseline).bounds == bounds


@pytest.mark.parametrize(
    ("rule", "value"),
    [
        ({"in": ["22.04", "24.04"]}, "24.04"),
        ({"contains": "iommu=pt"}, "ro iommu=pt"),
        ({">=": "5.15"}, "6.8.0-60-generic"),  # a version, not a number
        ({"!=": 0}, 3),  # no band, no line
        ({"==": "ACTIVE"}, "ACTIVE"),
        ({">=": 8}, "9"),  # text: judged as a number, not drawn as one
    ],
)
def test_other_rules_and_values_have_no_bounds(rule, value):
    result = judged(rule, value)
    assert result.status is CheckStatus.PASS and result.bounds is None


def test_a_per_item_value_keeps_each_items_status_and_bounds():
    result = judged(
        {"change": {"max": "-25%"}},
        {"gpu0": 700, "gpu1": 900},
        baseline={"gpu0": 1000, "gpu1": 1100},
        severity="warning",
    )
    assert result.status is CheckStatus.WARN and result.bounds is None
    assert result.items == {
        "gpu0": ItemCheck(CheckStatus.PASS, Bounds(high=750, base=1000)),
        "gpu1": ItemCheck(CheckStatus.WARN, Bounds(high=825, base=1100)),
    }


def a_result() -> GateResult:
    """Checks of every status on one host, judged by the real rules."""
    measured = Measurement("command", {}, data={"n": 8, "gpus": {"0": 192.0, "1": 180.0}})
    within = {"within": {"of": 192, "tolerance": 2}}
    checks = [
        judge(check_spec(id="n", value="n"), {">=": 8}, measured, 0),
        judge(check_spec(id="gpus", value="gpus"), within, measured, 0),
        judge(check_spec(id="w", value="n", severity="warning"), {"<": 4}, measured, 0),
        judge(check_spec(id="missing", value="m"), {">=": 8}, measured, 0),
        skipped(check_spec(id="s"), "when: false is false on this host", "g.yml:9"),
    ]
    result = GateResult("g", "G", "g.yml", "0" * 64, "2026-01-01T00:00:00Z")
    result.hosts["h1"] = HostChecks("h1", checks, [measured])
    return result


def test_every_status_and_the_bounds_round_trip_through_result_json(tmp_path):
    result = a_result()
    assert [c.status for c in result.hosts["h1"].checks] == [
        CheckStatus.PASS, CheckStatus.FAIL, CheckStatus.WARN, CheckStatus.ERROR, CheckStatus.SKIP
    ]  # fmt: skip
    result.save(tmp_path / "result.json")
    data = json.loads((tmp_path / "result.json").read_text())
    assert [c["status"] for c in data["hosts"]["h1"]["checks"]] == [
        "PASS", "FAIL", "WARN", "ERROR", "SKIP"
    ]  # fmt: skip
    assert data["verdict"] == "FAIL" and data["hosts"]["h1"]["verdict"] == "FAIL"
    assert data["summary"] == {"PASS": 1, "FAIL": 1, "WARN": 1, "ERROR": 1, "SKIP": 1}
    assert data["hosts"]["h1"]["checks"][1]["items"]["1"] == {
        "status": "FAIL",
        "bounds": {"low": 190.0, "high": 194.0, "line": 192.0, "base": None},
    }
    loaded = load_results(tmp_path / "result.json")
    assert loaded.hosts == result.hosts
    for got in loaded.hosts["h1"].checks:
        assert type(got.status) is CheckStatus
        assert all(type(item.status) is CheckStatus for item in got.items.values())
    assert loaded.verdict is CheckStatus.FAIL


def test_an_old_result_file_loads_without_bounds_and_re_evaluates_with_them():
    old = load_results(OLD / "result.json")
    checks = old.hosts["localhost"].checks
    assert [c.status for c in checks] == [CheckStatus.PASS] * 3
    assert all(c.bounds is None and c.items == {} for c in checks)
    gate = spec.load(OLD / "gate.yml")
    again = reevaluate(old, gate, rule_renderer(gate, {}))
    cpus = again.hosts["localhost"].check("cpus")
    assert cpus is not None and cpus.status is CheckStatus.PASS
    assert cpus.bounds == Bounds(low=1, line=1)


def test_a_status_no_fxkit_writes_is_a_broken_results_file(tmp_path):
    path = tmp_path / "result.json"
    data = json.loads((OLD / "result.json").read_text())
    data["hosts"]["localhost"]["checks"][0]["status"] = "MAYBE"
    path.write_text(json.dumps(data))
    with pytest.raises(spec.GateError, match=r"broken entry \('MAYBE' is not a valid"):
        load_results(path)


def stored_differently() -> GateResult:
    """Results whose stored verdicts and bounds are not what their rules would give now: a
    report that judged again would show ``>= 8`` passing, and no bar for ``mem``."""
    result = GateResult("g", "G", "g.yml", "0" * 64, "2026-01-01T00:00:00Z")
    common = {"title": "T", "severity": "critical", "expected": ">= 8", "rule": {">=": 8}}
    cpus = CheckResult(
        id="cpus", status=CheckStatus.FAIL, reason="kept", value=50, bounds=Bounds(140, line=140),
        **common,
    )  # fmt: skip
    gpus = CheckResult(
        id="gpus", status=CheckStatus.FAIL, reason="kept", value={"0": 50, "1": 50},
        items={"0": ItemCheck(CheckStatus.PASS, Bounds(low=8, line=8)),
               "1": ItemCheck(CheckStatus.FAIL, Bounds(low=60, line=60))},
        **common,
    )  # fmt: skip
    mem = CheckResult(id="mem", status=CheckStatus.PASS, reason="kept", value=50, **common)
    result.hosts["h1"] = HostChecks("h1", [cpus, gpus, mem])
    return result


def test_reports_show_the_stored_verdicts_and_bounds_and_never_judge_again(monkeypatch):
    def judging(*args, **kwargs):
        raise AssertionError("a report applied a rule")

    monkeypatch.setattr(rules, "evaluate", judging)
    result = stored_differently()
    page = html.render(result)
    assert "<title>h1: 50 (FAIL)</title>" in page  # stored FAIL, though 50 >= 8
    assert "<title>h1 · 0: 50 (PASS)</title>" in page
    assert "<title>h1 · 1: 50 (FAIL)</title>" in page
    assert ">150</text>" in page  # the axis reaches past the stored 140 (8 would end it at 50)
    assert "<title>h1: 50 (PASS)</title>" not in page  # mem has no stored bounds: no bar
    text = markdown.render(result)
    assert "| **FAIL** | `cpus` T | h1 | kept | - |" in text  # among the failures
    assert "| h1 | **FAIL** | 50 | >= 8 | kept |" in text  # in the check's own table
    assert '<failure message="kept" type="FAIL">' in junit.render(result)
    console = Console(width=200, record=True)
    console.print(table(result))
    assert "│ h1   │ cpus  │ FAIL   │ 50" in console.export_text()
