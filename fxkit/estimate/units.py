"""Quantities with units: ``1.2 TB``, ``5 GB/s``, ``0.3 ms``, ``192 GiB``, ``344 TFLOP/s``.

Every value is turned into one base unit per kind (bytes, bytes per second, seconds, FLOP/s,
money per byte, a fraction, a count). Prefixes are exact: ``k M G T P`` are powers of 1000,
``Ki Mi Gi Ti Pi`` powers of 1024; ``B`` is a byte and ``b`` (or ``bit``) a bit, so ``100 Gb/s``
is 12.5 GB/s.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable

from fxkit.yamlfile import short

DECIMAL = {"": 1, "k": 10**3, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15}
BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50}
TIME = {
    "ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "min": 60.0, "h": 3600.0,
}  # fmt: skip

_NUMBER = r"(?P<number>[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?)"
_QUANTITY = re.compile(rf"{_NUMBER}\s*(?P<unit>.*)", re.DOTALL)
_PREFIX = r"(?P<prefix>Ki|Mi|Gi|Ti|Pi|k|K|M|G|T|P|)"
_BYTES = re.compile(rf"{_PREFIX}(?P<base>B|b|bit)")
_RATE = re.compile(rf"{_PREFIX}(?:(?P<base>B|b|bit)/s|(?P<bps>bps))")
_FLOPS = re.compile(rf"{_PREFIX}(?:FLOP/s|FLOPS|flop/s)")
_PRICE = re.compile(rf"(?P<currency>[A-Z]{{3}})\s*/\s*{_PREFIX}B")
_TOKENS = re.compile(rf"{_PREFIX}")

EXAMPLES = {
    "bytes": "192 GiB, 1.2 TB, 512 MB",
    "bandwidth": "5 GB/s, 12.5 GB/s, 100 Gb/s, 980 MB/s",
    "time": "0.3 ms, 100 us, 1.5 s",
    "flops": "174 TFLOP/s, 1.3 PFLOP/s",
    "price": "2014 CNY/TB",
    "fraction": "0.9, 90%",
    "tokens": "131072, 128Ki, 32k",
    "count": "16",
    "number": "74.9",
}


class UnitError(ValueError):
    """A value that is not a quantity of the kind asked for; the message gives examples."""


def _scale(prefix: str) -> int:
    return BINARY[prefix] if prefix in BINARY else DECIMAL[prefix]


def _split(text: str, kind: str) -> tuple[float, str]:
    match = _QUANTITY.fullmatch(text.strip())
    if not match:
        raise UnitError(f"{short(text)} is not a number with a unit (e.g. {EXAMPLES[kind]})")
    return float(match["number"]), match["unit"]


def _bytes(number: float, unit: str) -> float:
    if not unit:
        return number
    match = _BYTES.fullmatch(unit)
    if not match:
        raise UnitError(f"{short(unit)} is not a size unit")
    bits = match["base"] != "B"
    return number * _scale(match["prefix"]) / (8 if bits else 1)


def _bandwidth(number: float, unit: str) -> float:
    match = _RATE.fullmatch(unit)
    if not match:
        raise UnitError(f"{short(unit)} is not a bandwidth unit")
    bits = match["bps"] is not None or match["base"] != "B"
    return number * _scale(match["prefix"]) / (8 if bits else 1)


def _time(number: float, unit: str) -> float:
    if unit not in TIME:
        raise UnitError(f"{short(unit)} is not a time unit ({', '.join(TIME)})")
    return number * TIME[unit]


def _flops(number: float, unit: str) -> float:
    match = _FLOPS.fullmatch(unit)
    if not match or match["prefix"] in BINARY:
        raise UnitError(f"{short(unit)} is not a FLOP/s unit")
    return number * _scale(match["prefix"])


def _fraction(number: float, unit: str) -> float:
    if unit not in ("", "%"):
        raise UnitError(f"{short(unit)} is not a fraction (write 0.9 or 90%)")
    return number / 100 if unit == "%" else number


def _tokens(number: float, unit: str) -> float:
    match = _TOKENS.fullmatch(unit)
    if not match:
        raise UnitError(f"{short(unit)} is not a token count suffix (k = 1000, Ki = 1024)")
    return _whole(number * _scale(match["prefix"]))


def _count(number: float, unit: str) -> float:
    if unit:
        raise UnitError(f"{short(unit)}: a count has no unit")
    return _whole(number)


def _number(number: float, unit: str) -> float:
    if unit:
        raise UnitError(f"{short(unit)}: a plain number has no unit")
    return number


def _whole(value: float) -> float:
    if math.isfinite(value) and value != int(value):
        raise UnitError(f"{value} is not a whole number")
    return value


_PARSERS: dict[str, Callable[[float, str], float]] = {
    "bytes": _bytes,
    "bandwidth": _bandwidth,
    "time": _time,
    "flops": _flops,
    "fraction": _fraction,
    "tokens": _tokens,
    "count": _count,
    "number": _number,
}


def parse(value: object, kind: str) -> float:
    """``value`` (a YAML number or a string with a unit) in the base unit of ``kind``.

    Numbers without a unit are taken in the base unit (bytes, B/s, seconds, FLOP/s). Raises
    :class:`UnitError` saying what was expected. Prices: :func:`parse_price`.
    """
    number, unit = _quantity(value, kind)
    if kind in ("bandwidth", "time", "flops") and not unit:
        result = number
    else:
        try:
            result = _PARSERS[kind](number, unit)
        except UnitError as exc:
            raise UnitError(f"{exc} (e.g. {EXAMPLES[kind]})") from None
    return _finite(value, result)


def parse_price(value: object) -> tuple[float, str | None]:
    """A price per capacity (``2014 CNY/TB``) as (money per byte, currency or None); a number
    without a unit is per decimal TB."""
    number, unit = _quantity(value, "price")
    if not unit:
        return _finite(value, number / 10**12), None
    match = _PRICE.fullmatch(unit)
    if not match:
        raise UnitError(f"{short(unit)} is not a price unit (e.g. {EXAMPLES['price']})")
    return _finite(value, number / _scale(match["prefix"])), match["currency"]


def _quantity(value: object, kind: str) -> tuple[float, str]:
    """``value`` as a number and its unit (empty for a YAML number)."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise UnitError(f"{short(value)} is not a quantity (e.g. {EXAMPLES[kind]})")
    if isinstance(value, str):
        return _split(value, kind)
    try:
        return float(value), ""
    except OverflowError:  # an integer beyond a float
        raise UnitError(f"{short(value)} must be a finite number >= 0") from None


def _finite(value: object, result: float) -> float:
    if not math.isfinite(result) or result < 0:
        raise UnitError(f"{short(value)} must be a finite number >= 0")
    return result
