"""The fleet view (fxkit.gate.outliers): per numeric check, the fleet's median and the values that
pass but lie far on the worse side of it. Each host's check is judged by fxkit's own rules
(:func:`~fxkit.gate.verdicts.judge` on a measurement holding the value), as a run judges it."""

from __future__ import annotations

from typing import Any

import pytest

from fxkit.errors import FxkitError
from fxkit.gate import outliers
from fxkit.gate.spec import CheckSpec
from fxkit.gate.verdicts import GateResult, HostChecks, Measurement, judge

SETTINGS = outliers.settings({})


def results(values: list[Any], rule: dict[str, Any], value: str | None = None) -> GateResult:
    """A run of one check ``bw`` on hosts h1.., host i measuring ``values[i]``."""
    spec = CheckSpec.model_validate(
        {"id": "bw", "title": "BW", "why": "w", "measure": {"command": "true"}, "rule": rule}
        | ({"value": value} if value else {})
    )
    result = GateResult("g", "G", "g.yml", "0" * 64, "2026-01-01T00:00:00Z")
    for i, data in enumerate(values, 1):
        measurement = Measurement("command", {}, data)
        host = HostChecks(f"h{i}", [judge(spec, rule, measurement, 0)], [measurement])
        result.hosts[host.name] = host
    return result


def flagged(result: GateResult, found: dict[str, float] = SETTINGS) -> list[tuple[Any, ...]]:
    view = outliers.view(result, found)
    return [(o.host, o.item) for o in view["bw"].outliers] if "bw" in view else []


def test_a_node_30_percent_below_the_others_that_passes_is_flagged():
    result = results([100, 101, 99, 100, 70], {">=": 10})
    view = outliers.view(result, SETTINGS)["bw"]
    assert (view.median, view.mad, view.count, view.worse) == (100, 1, 5, "below")
    [outlier] = view.outliers
    assert (outlier.host, outlier.value, outlier.deviation) == ("h5", 70, pytest.approx(-0.3))
    assert outlier.score == pytest.approx(-30 / 1.4826)
    assert outlier.why.startswith("30% below the fleet median 100 (flagged beyond 5%)")


def test_a_value_that_fails_is_a_failure_not_an_outlier():
    assert flagged(results([100, 101, 99, 100, 5], {">=": 10})) == []
    assert outliers.view(results([100, 101, 99, 100, 5], {">=": 10}), SETTINGS)["bw"].median == 100


def test_identical_values_use_the_fraction_alone():
    same = results([100, 100, 100, 100, 96], {">=": 10})
    assert outliers.view(same, SETTINGS)["bw"].mad == 0
    assert flagged(same) == []  # 4 % is within 5 %, and a MAD of 0 gives no z-score
    tighter = outliers.settings({"fleet_outlier_fraction": "3%"})
    assert flagged(same, tighter) == [("h5", None)]
    assert outliers.view(same, tighter)["bw"].outliers[0].score is None


def test_a_maximum_makes_higher_values_worse():
    latency = results([10.0, 10.2, 9.9, 10.1, 14.0, 7.0], {"<=": 50})
    view = outliers.view(latency, SETTINGS)["bw"]
    assert view.worse == "above"
    assert [(o.host, o.why.split(" (")[0]) for o in view.outliers] == [
        ("h5", "39% above the fleet median 10.1")
    ]  # h6, 31 % faster, is not worse


def test_each_item_of_per_item_values_is_a_value_of_the_fleet():
    gpus = [{str(g): 48.0 + g / 10 for g in range(8)} for _ in range(3)]
    gpus[1]["3"] = 33.5
    result = results(gpus, {">=": 32.9}, value="*")
    view = outliers.view(result, SETTINGS)["bw"]
    assert view.count == 24 and flagged(result) == [("h2", "3")]


def test_a_fleet_of_two_has_a_median_and_no_outliers_and_equality_rules_none():
    pair = results([100, 70], {">=": 10})
    assert outliers.view(pair, SETTINGS)["bw"].median == 85 and flagged(pair) == []
    assert outliers.view(results([8, 8, 8, 7], {"==": 8}), SETTINGS) == {}


def test_the_settings_are_numbers_above_zero():
    assert outliers.settings({"fleet_outlier_fraction": "10%"}, {"fleet_outlier_mad_k": 5}) == {
        "fleet_outlier_fraction": 0.1,
        "fleet_outlier_mad_k": 5.0,
    }
    for bad in (0, -1, True, "fast", "nan"):
        with pytest.raises(FxkitError, match=r"fleet_outlier_mad_k: .* is not a number above 0"):
            outliers.settings({"fleet_outlier_mad_k": bad})
