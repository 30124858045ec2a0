"""The rules of gate checks (fxkit.gate.rules) and judging a measurement (fxkit.gate.verdicts)."""

import pytest

from fxkit.gate import rules
from fxkit.gate.spec import CheckSpec
from fxkit.gate.verdicts import Measurement, judge, select, verdict


@pytest.mark.parametrize(
    ("rule", "value", "passed"),
    [
        ({">=": 8}, 8, True),
        ({">=": 8}, 7, False),
        ({">": 1.5}, 1.5, False),
        ({"<=": 0.5}, 0.49, True),
        ({"<": 0}, 0, False),
        ({"==": 8}, "8", True),  # numbers compare as numbers, written either way
        ({"==": "8"}, 8.0, True),
        ({"==": 8}, "eight", False),
        ({"==": "ACTIVE"}, "ACTIVE", True),
        ({"!=": 0}, 3, True),
        ({"in": ["22.04", "24.04"]}, "24.04", True),
        ({"in": ["22.04", "24.04"]}, "20.04", False),
        (
            {"contains": ["iommu=pt", "pci=realloc=off"]},
            ["ro", "pci=realloc=off", "iommu=pt"],
            True,
        ),
        ({"contains": ["iommu=pt"]}, ["ro", "quiet"], False),
        ({"contains": "numa"}, "kernel.numa_balancing", True),
        ({"between": [0.29, 0.40]}, 0.35, True),
        ({"between": [0.29, 0.40]}, 0.41, False),
        ({"within": {"of": 200, "tolerance": "5%"}}, 191, True),
        ({"within": {"of": 200, "tolerance": "5%"}}, 189, False),
        ({"within": {"of": 200, "tolerance": 20}}, 181, True),
    ],
)
def test_operators(rule, value, passed):
    assert rules.evaluate(rule, value).passed is passed


@pytest.mark.parametrize(
    ("value", "operand", "passed"),
    [
        ("6.8.0-60-generic", "5.15", True),
        ("5.4.0-200-generic", "5.15", False),
        ("7.2.2", "7.2", True),
        ("7.10.0", "7.9", True),  # numerically, not as text ("7.10" < "7.9" as text)
        ("7.0.2", "7.2", False),
    ],
)
def test_versions_compare_by_their_numbers(value, operand, passed):
    assert rules.evaluate({">=": operand}, value).passed is passed


def test_per_item_values_name_the_items_that_fail():
    verdict_ = rules.evaluate({"==": "ACTIVE"}, {"mlx5_0/1": "ACTIVE", "mlx5_3/1": "DOWN"})
    assert not verdict_.passed
    assert verdict_.reason == "mlx5_3/1: DOWN is not == ACTIVE"
    assert rules.evaluate({">=": 190}, {"0": 192.0, "1": 192.0}).reason == "all 2 >= 190"


def test_change_against_a_baseline():
    # TTFT 1000 ms in the baseline, 700 ms now: -30 %, inside "at most -25 %".
    reduction = rules.evaluate({"change": {"max": "-25%"}}, 700, baseline=1000)
    assert reduction.passed and reduction.change == pytest.approx(-0.30)
    assert "-30.0%" in reduction.reason
    assert not rules.evaluate({"change": {"max": "-25%"}}, 800, baseline=1000).passed
    band = {"change": {"min": "29%", "max": "40%"}}
    assert rules.evaluate(band, 135, baseline=100).passed
    assert not rules.evaluate(band, 145, baseline=100).passed
    assert not rules.evaluate(band, 120, baseline=100).passed


@pytest.mark.parametrize(
    ("rule", "value", "baseline", "message"),
    [
        ({"change": {"max": "-25%"}}, 700, None, "no baseline value"),
        ({"change": {"max": "-25%"}}, 700, 0, "baseline value is 0"),
        ({">=": 8}, "eight", None, "'eight' is not a number"),
        ({"in": 8}, 8, None, "'in' takes a list"),
        ({"between": [1]}, 1, None, "'between' takes \\[low, high\\]"),
        ({"within": {"of": 1}}, 1, None, "within takes"),
        ({">=": 1}, None, None, "no value"),
        ({">=": 1}, {}, None, "no items"),
    ],
)
def test_rules_that_cannot_apply_say_why(rule, value, baseline, message):
    with pytest.raises(rules.RuleError, match=message):
        rules.evaluate(rule, value, baseline)


def test_a_rule_has_one_known_operator():
    with pytest.raises(rules.RuleError, match="exactly one operator"):
        rules.split({">=": 1, "<=": 2})
    with pytest.raises(rules.RuleError, match="unknown operator '=>'"):
        rules.split({"=>": 1})


def test_describe():
    assert rules.describe({">=": 8}) == ">= 8"
    assert rules.describe({"change": {"max": "-25%"}}) == "change <= -25% vs baseline"
    assert rules.describe({"change": {"min": "29%", "max": "40%"}}) == "change 29%..40% vs baseline"
    assert rules.describe({"within": {"of": 196, "tolerance": "5%"}}) == "within 5% of 196"


def test_select_paths():
    data = {"count": 2, "ports": {"a": {"state": "ACTIVE"}, "b": {"state": "DOWN"}}, "l": [1, 2]}
    assert select(data, "count") == 2
    assert select(data, "ports.*.state") == {"a": "ACTIVE", "b": "DOWN"}
    assert select(data, "l.1") == 2
    assert select(data, None) is data
    with pytest.raises(KeyError, match=r"ports\.c"):
        select(data, "ports.c.state")


def _check(**kw):
    base = {"id": "c", "title": "C", "why": "w", "measure": {"command": "true"}, "rule": {">=": 8}}
    return CheckSpec.model_validate({**base, **kw})


def test_judge_statuses():
    ok = Measurement("command", {}, data={"n": 8})
    assert judge(_check(value="n"), {">=": 8}, ok, 0).status == "PASS"
    assert judge(_check(value="n"), {">=": 9}, ok, 0).status == "FAIL"
    assert judge(_check(value="n", severity="warning"), {">=": 9}, ok, 0).status == "WARN"
    missing = judge(_check(value="m"), {">=": 8}, ok, 0)
    assert (missing.status, missing.reason) == ("ERROR", "the command measurement has no 'm'")
    failed = Measurement("command", {}, error="amd-smi not found on lab01")
    result = judge(_check(), {">=": 8}, failed, 0)
    assert (result.status, result.reason) == ("ERROR", "amd-smi not found on lab01")
    wrong = judge(_check(value="n"), {"in": 8}, ok, 0)
    assert wrong.status == "ERROR" and "takes a list" in wrong.reason


def test_verdicts():
    assert verdict(["PASS", "WARN", "SKIP"]) == "PASS"
    assert verdict(["PASS", "ERROR"]) == "ERROR"
    assert verdict(["ERROR", "FAIL"]) == "FAIL"


def test_a_number_against_a_version_compares_as_a_version():
    # A template renders "5.15" as the number 5.15: against a kernel release it is a version.
    assert rules.evaluate({">=": 5.15}, "6.8.0-60-generic").passed
    assert not rules.evaluate({">=": 7}, "6.8.0").passed
    assert rules.evaluate({">=": 7}, "7.2.2").passed


NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize(
    ("rule", "value", "baseline", "message"),
    [
        ({"!=": 0}, NAN, None, "the measured value nan is not a finite number"),
        ({"==": 0}, NAN, None, "the measured value nan"),
        ({"<=": 5}, -INF, None, "the measured value -inf"),
        ({">=": 1}, INF, None, "the measured value inf"),
        ({"in": [1, 2]}, NAN, None, "the measured value nan"),
        ({"!=": 0}, "NaN", None, "the measured value NaN"),  # as result.json keeps it
        ({"!=": 0}, "Infinity", None, "the measured value Infinity"),
        ({"contains": [1]}, [1, NAN], None, "the measured value nan"),
        ({"!=": 0}, {"gpu0": 1.0, "gpu1": NAN}, None, "gpu1: the measured value nan"),
        ({"!=": NAN}, 3, None, "the rule's value nan is not a finite number"),
        ({"between": [0, INF]}, 3, None, "the rule's value inf"),
        ({"change": {"max": "-25%"}}, 700, NAN, "the baseline value nan"),
        ({"change": {"max": "-25%"}}, NAN, 1000, "the measured value nan"),
    ],
)
def test_a_number_that_is_not_finite_cannot_be_judged(rule, value, baseline, message):
    with pytest.raises(rules.RuleError, match=message):
        rules.evaluate(rule, value, baseline)


def test_a_nan_measurement_is_an_error_not_a_pass():
    measured = Measurement("command", {}, data={"ratio": NAN})
    result = judge(_check(value="ratio"), {"!=": 0}, measured, 0)
    assert result.status == "ERROR" and "not a finite number" in result.reason


def test_text_that_is_not_a_number_still_compares_as_text():
    assert rules.evaluate({"!=": "DOWN"}, "ACTIVE").passed
    assert rules.evaluate({"==": "nano"}, "nano").passed
    assert not rules.evaluate({"==": 8}, "information").passed
