"""The rules a gate's checks apply to measured values.

A rule is a mapping with one operator: ``{">=": 8}``, ``{"<=": 0.5}``, ``{"==": "ACTIVE"}``,
``{"!=": 0}``, ``{"in": ["22.04", "24.04"]}``, ``{"contains": ["iommu=pt"]}``,
``{"between": [0.29, 0.40]}``, ``{"within": {"of": 196, "tolerance": "5%"}}`` (a tolerance of a
baseline value: a fraction of it when written with ``%``, else absolute) and
``{"change": {"min": "-100%", "max": "-25%"}}`` (the relative change ``(value - base) / base``
against the same check, or the check ``of:``, in a baseline run). Comparisons of two version
strings (``6.8.0-45-generic`` against ``5.15``) compare their numbers in order.

A value that is a mapping (one value per GPU, per port...) passes when every item passes; the
reason names the items that do not. A number that is not finite (nan, inf; or text reading as
one, as result.json keeps them) cannot be judged: measured, in the rule or in the baseline, it
is a :class:`RuleError` (the check is ERROR).

A number judged by a numeric rule also gets the rule's :class:`Bounds` (the band of values that
pass, the threshold, the baseline's value), computed here with the verdict: the reports draw
them, and never apply a rule again.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

OPERATORS = ("==", "!=", ">=", ">", "<=", "<", "in", "contains", "between", "within", "change")
_VERSION = re.compile(r"v?\d+(\.\d+)+([.+~-].*)?")
#: The start of a threshold left unset (a platform profile's ``null``: fxkit.gate.platforms):
#: a rule with one cannot be judged, and says which variable to set.
UNSET = "unset: "


class RuleError(ValueError):
    """The rule cannot be applied: a wrong operand, or a value of the wrong kind."""


@dataclass(frozen=True)
class Bounds:
    """A numeric rule's thresholds for one number: the band of values that pass (``low`` to
    ``high``, either open: None), the threshold line, and the baseline's value (``change``)."""

    low: float | None = None
    high: float | None = None
    line: float | None = None
    base: float | None = None


@dataclass(frozen=True)
class Verdict:
    passed: bool
    #: Why: the value against the rule, in words (the failing items for per-item values).
    reason: str
    #: For ``change``: the relative change measured (a fraction), else None.
    change: float | None = None
    #: The rule's thresholds, for a number judged by a numeric rule; else None.
    bounds: Bounds | None = None
    #: For a per-item value: each item's own verdict, by item.
    items: dict[str, Verdict] = field(default_factory=dict)


def split(rule: Mapping[str, Any]) -> tuple[str, Any]:
    """The operator and operand of a rule (one key, a known operator)."""
    if len(rule) != 1:
        raise RuleError(f"a rule has exactly one operator, not {len(rule)}: {dict(rule)}")
    op, operand = next(iter(rule.items()))
    if op not in OPERATORS:
        raise RuleError(f"unknown operator {op!r}; use one of: {', '.join(OPERATORS)}")
    return op, operand


def describe(rule: Mapping[str, Any]) -> str:
    """The rule in a few characters: ``>= 8``, ``in [22.04, 24.04]``, ``change <= -25%``."""
    op, operand = split(rule)
    if op == "within":
        return f"within {operand.get('tolerance')} of {_text(operand.get('of'))}"
    if op == "change":
        lo, hi = operand.get("min"), operand.get("max")
        of = f" vs {operand['of']}" if operand.get("of") else " vs baseline"
        if lo is not None and hi is not None:
            return f"change {lo}..{hi}{of}"
        return f"change {'>= ' + str(lo) if lo is not None else '<= ' + str(hi)}{of}"
    if op == "between":
        return f"between {_text(operand[0])} and {_text(operand[1])}"
    return f"{op} {_text(operand)}"


def evaluate(rule: Mapping[str, Any], value: Any, baseline: Any = None) -> Verdict:
    """Apply ``rule`` to ``value`` (``baseline``: the baseline run's value, for ``change``)."""
    op, operand = split(rule)
    unset = _unset(operand)
    if unset:
        raise RuleError(f"threshold {unset}: give the site's figure (inventory or -e)")
    if isinstance(value, Mapping):
        if not value:
            raise RuleError("the measurement has no items to check")
        base = baseline if isinstance(baseline, Mapping) else {}
        items = {}
        for item, item_value in value.items():
            try:
                items[str(item)] = _one(op, operand, item_value, base.get(item, baseline))
            except RuleError as exc:
                raise RuleError(f"{item}: {exc}") from None
        failed = [f"{item}: {v.reason}" for item, v in items.items() if not v.passed]
        if failed:
            return Verdict(False, "; ".join(failed), items=items)
        return Verdict(True, f"all {len(value)} {describe(rule)}", items=items)
    return _one(op, operand, value, baseline)


def _one(op: str, operand: Any, value: Any, baseline: Any) -> Verdict:
    if value is None:
        raise RuleError("there is no value to check")
    for what, given in (("the measured value", value), ("the rule's value", operand)):
        _finite(given, what)
    _finite(baseline, "the baseline value")
    if op == "change":
        return _change(operand, value, baseline)
    if op == "contains":
        return _has(value, operand)
    passed = _TESTS[op](value, operand)
    word = "" if passed else "not "
    reason = f"{_text(value)} is {word}{describe({op: operand})}"
    return Verdict(passed, reason, bounds=_bounds(op, operand, value))


def _unset(operand: Any) -> str | None:
    """The first unset threshold in a rule's operand (:data:`UNSET`), if any."""
    if isinstance(operand, str):
        return operand if operand.startswith(UNSET) else None
    if isinstance(operand, Mapping):
        operand = list(operand.values())
    if isinstance(operand, list | tuple):
        return next((found for item in operand if (found := _unset(item))), None)
    return None


def _change(operand: Any, value: Any, baseline: Any) -> Verdict:
    if not isinstance(operand, Mapping) or not ({"min", "max"} & operand.keys()):
        raise RuleError("change takes {min: X%, max: Y%} (either or both)")
    if baseline is None:
        raise RuleError("no baseline value to compare with (pass --baseline RESULTS.json)")
    base, now = _number(baseline), _number(value)
    if base == 0:
        raise RuleError("the baseline value is 0: a relative change is undefined")
    change = (now - base) / base
    lo, hi = operand.get("min"), operand.get("max")
    passed = (lo is None or change >= fraction(lo)) and (hi is None or change <= fraction(hi))
    bound = describe({"change": operand})
    word = "" if passed else "not "
    reason = f"{_text(now)} vs {_text(base)}: {change:+.1%}, {word}{bound}"
    verdict = Verdict(passed, reason, change)
    if not _numeric(value):
        return verdict
    low = None if lo is None else base * (1 + fraction(lo))
    high = None if hi is None else base * (1 + fraction(hi))
    return replace(verdict, bounds=_finite_bounds(Bounds(low, high, base=base)))


def _bounds(op: str, operand: Any, value: Any) -> Bounds | None:
    """The thresholds ``op`` puts on ``value`` (a rule that applied to it), as numbers; None when
    the value, or the rule, is not a number (``in``, ``contains``, a version)."""
    if not _numeric(value):
        return None
    try:
        if op in (">=", ">"):
            return _finite_bounds(Bounds(low=fraction(operand), line=fraction(operand)))
        if op in ("<=", "<"):
            return _finite_bounds(Bounds(high=fraction(operand), line=fraction(operand)))
        if op == "==":
            return _finite_bounds(Bounds(line=fraction(operand)))
        if op == "between":
            return _finite_bounds(Bounds(fraction(operand[0]), fraction(operand[1])))
        if op == "within":
            of, allowed = _tolerance(operand)
            return _finite_bounds(Bounds(of - allowed, of + allowed, line=of))
    except RuleError:
        return None
    return None


def _numeric(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _finite_bounds(bounds: Bounds) -> Bounds | None:
    """``bounds``, unless a number of it is not finite (a threshold too large for a float)."""
    numbers = (bounds.low, bounds.high, bounds.line, bounds.base)
    return bounds if all(n is None or math.isfinite(n) for n in numbers) else None


def fraction(value: Any) -> float:
    """``"25%"`` -> 0.25; numbers as they are."""
    if isinstance(value, str) and value.strip().endswith("%"):
        return _number(value.strip()[:-1]) / 100
    return _number(value)


def _number(value: Any) -> float:
    if isinstance(value, bool):
        raise RuleError(f"{value!r} is not a number")
    if isinstance(value, int | float):
        return float(value)
    try:
        return float(str(value).strip())
    except ValueError:
        raise RuleError(f"{value!r} is not a number") from None


def _finite(value: Any, what: str) -> None:
    """:class:`RuleError` when ``value``, or an item of it, is a number that is not finite."""
    if isinstance(value, Mapping):
        value = list(value.values())
    if isinstance(value, list | tuple):
        for item in value:
            _finite(item, what)
        return
    if isinstance(value, float | str):
        try:
            number = float(value)
        except ValueError:
            return
        if not math.isfinite(number):
            raise RuleError(f"{what} {_text(value)} is not a finite number: it cannot be judged")


def _version(value: Any) -> tuple[int, ...] | None:
    if isinstance(value, str) and _VERSION.fullmatch(value.strip()):
        return tuple(int(n) for n in re.findall(r"\d+", value.strip().split("-")[0]))
    return None


def _order(value: Any, operand: Any) -> tuple[Any, Any]:
    """Both as numbers, or both as version tuples."""
    a, b = _version(value), _version(operand)
    if a is not None and b is None and isinstance(operand, int | float):
        b = _version(f"{operand}.0" if isinstance(operand, int) else str(operand))
    if a is not None and b is not None:
        return a, b
    if isinstance(value, str) and isinstance(operand, str) and (a or b):
        raise RuleError(f"cannot compare {value!r} with version {operand!r}")
    return _number(value), _number(operand)


def _equal(value: Any, operand: Any) -> bool:
    numeric = (int, float)
    if any(isinstance(x, numeric) and not isinstance(x, bool) for x in (value, operand)):
        try:
            return _number(value) == _number(operand)
        except RuleError:
            return False
    if isinstance(value, list | tuple) and isinstance(operand, list | tuple):
        return list(value) == list(operand)
    return str(value) == str(operand)


def _member(value: Any, operand: Any) -> bool:
    if not isinstance(operand, list | tuple):
        raise RuleError(f"'in' takes a list, not {operand!r}")
    return any(_equal(value, choice) for choice in operand)


def _contains(value: Any, operand: Any) -> bool:
    wanted = operand if isinstance(operand, list | tuple) else [operand]
    if isinstance(value, str):
        return all(str(w) in value for w in wanted)
    if isinstance(value, list | tuple):
        return all(any(_equal(v, w) for v in value) for w in wanted)
    raise RuleError(f"'contains' needs a list or text to look in, not {value!r}")


def _has(value: Any, operand: Any) -> Verdict:
    """``contains``, saying which of the wanted items are missing."""
    wanted = operand if isinstance(operand, list | tuple) else [operand]
    lacking = [w for w in wanted if not _contains(value, [w])]
    if lacking:
        return Verdict(False, f"lacks {_text(lacking)}")
    return Verdict(True, f"has {_text(list(wanted))}")


def _between(value: Any, operand: Any) -> bool:
    if not isinstance(operand, list | tuple) or len(operand) != 2:
        raise RuleError(f"'between' takes [low, high], not {operand!r}")
    now, low = _order(value, operand[0])
    high = _order(value, operand[1])[1]
    return bool(low <= now <= high)


def _within(value: Any, operand: Any) -> bool:
    of, allowed = _tolerance(operand)
    return abs(_number(value) - of) <= allowed


def _tolerance(operand: Any) -> tuple[float, float]:
    """A ``within`` rule's value and the distance from it allowed, as numbers."""
    if not isinstance(operand, Mapping) or "of" not in operand or "tolerance" not in operand:
        raise RuleError("within takes {of: VALUE, tolerance: N or N%}")
    of, tolerance = _number(operand["of"]), operand["tolerance"]
    text = str(tolerance).strip()
    return of, abs(of) * fraction(text) if text.endswith("%") else _number(tolerance)


def _compare(test: Callable[[Any, Any], bool]) -> Callable[[Any, Any], bool]:
    def apply(value: Any, operand: Any) -> bool:
        a, b = _order(value, operand)
        return test(a, b)

    return apply


_TESTS: dict[str, Callable[[Any, Any], bool]] = {
    "==": _equal,
    "!=": lambda value, operand: not _equal(value, operand),
    ">=": _compare(lambda a, b: a >= b),
    ">": _compare(lambda a, b: a > b),
    "<=": _compare(lambda a, b: a <= b),
    "<": _compare(lambda a, b: a < b),
    "in": _member,
    "contains": _contains,
    "between": _between,
    "within": _within,
}


def _text(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_text(v) for v in value) + "]"
    return str(value)
