"""Units of the estimator's inputs: decimal and binary prefixes exactly, bits and bytes apart,
and a clear error for anything else."""

from __future__ import annotations

import pytest

from fxkit.estimate.units import UnitError, parse, parse_price


@pytest.mark.parametrize(
    ("text", "kind", "expected"),
    [
        ("192 GiB", "bytes", 192 * 2**30),
        ("1.2 TB", "bytes", 1.2e12),
        ("512 MB", "bytes", 512e6),
        ("1 KiB", "bytes", 1024),
        ("8 Gb", "bytes", 1e9),  # bits
        ("4096", "bytes", 4096),
        ("5 GB/s", "bandwidth", 5e9),
        ("5.23 GB/s", "bandwidth", 5.23e9),
        ("100 Gb/s", "bandwidth", 12.5e9),  # one 100GbE port
        ("100 Gbit/s", "bandwidth", 12.5e9),
        ("400 Gbps", "bandwidth", 50e9),
        ("1 GiB/s", "bandwidth", 2**30),
        ("0.3 ms", "time", 0.3e-3),
        ("100 us", "time", 100e-6),
        ("100 µs", "time", 100e-6),
        ("300 ns", "time", 300e-9),
        ("2 min", "time", 120),
        ("1.5", "time", 1.5),
        ("174.364 TFLOP/s", "flops", 174.364e12),
        ("1.3 PFLOPS", "flops", 1.3e15),
        ("90%", "fraction", 0.9),
        ("0.9", "fraction", 0.9),
        ("128Ki", "tokens", 131072),
        ("32k", "tokens", 32000),
        ("1Mi", "tokens", 2**20),
        ("131072", "tokens", 131072),
        (16, "count", 16),
    ],
)
def test_quantities_in_base_units(text: str | int, kind: str, expected: float) -> None:
    assert parse(text, kind) == pytest.approx(expected, rel=1e-12)


def test_prices_are_per_decimal_tb_unless_binary() -> None:
    assert parse_price("2014 CNY/TB") == (pytest.approx(2014e-12), "CNY")
    assert parse_price("2014 CNY/TiB")[0] == pytest.approx(2014 / 2**40)
    assert parse_price(14000) == (pytest.approx(14000e-12), None)
    assert parse_price("14000") == (pytest.approx(14000e-12), None)


@pytest.mark.parametrize(
    ("text", "kind", "says"),
    [
        ("5 GB", "bandwidth", "not a bandwidth unit"),
        ("5 gb/s", "bandwidth", "not a bandwidth unit"),
        ("192 GiBs", "bytes", "not a size unit"),
        ("3 weeks", "time", "not a time unit"),
        ("1.5", "tokens", "not a whole number"),
        ("90 percent", "fraction", "not a fraction"),
        ("1e999 GB", "bytes", "finite number"),
        (10**400, "count", "finite number"),
        ("1e308 Pi", "tokens", "finite number"),
        ("-1 GB", "bytes", ">= 0"),
        ("fast", "bandwidth", "not a number with a unit"),
        ("1 TiFLOP/s", "flops", "not a FLOP/s unit"),
        (True, "count", "not a quantity"),
    ],
)
def test_wrong_units_say_what_was_expected(text: str | bool, kind: str, says: str) -> None:
    with pytest.raises(UnitError, match=says):
        parse(text, kind)
