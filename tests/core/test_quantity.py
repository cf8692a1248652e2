"""The shared Kubernetes quantity reader (trainmedic/quantity.py)."""

from __future__ import annotations

from fractions import Fraction

import pytest

from trainmedic.quantity import BadQuantity, parse_quantity


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0", Fraction(0)),
        ("1024", Fraction(1024)),
        ("1Ki", Fraction(1024)),
        ("1Mi", Fraction(1024**2)),
        ("1.5Gi", Fraction(3 * 1024**3, 2)),
        ("2Ti", Fraction(2 * 1024**4)),
        ("1Pi", Fraction(1024**5)),
        ("1Ei", Fraction(1024**6)),
        ("250m", Fraction(1, 4)),  # milli, not mega
        ("100n", Fraction(1, 10**7)),
        ("3u", Fraction(3, 10**6)),
        ("1k", Fraction(1000)),
        ("64G", Fraction(64 * 10**9)),
        ("1M", Fraction(10**6)),
        ("1T", Fraction(10**12)),
        ("1P", Fraction(10**15)),
        ("1E", Fraction(10**18)),  # an exa
        ("1e3", Fraction(1000)),  # an exponent
        ("129e6", Fraction(129 * 10**6)),
        ("1E3", Fraction(1000)),
        ("5e-1", Fraction(1, 2)),
        ("1e+2", Fraction(100)),
        ("1e64", Fraction(10**64)),
        ("-2Mi", Fraction(-2 * 1024**2)),
        ("+.5k", Fraction(500)),
        ("5.", Fraction(5)),
        ("  3Gi\n", Fraction(3 * 1024**3)),
        ("0.1", Fraction(1, 10)),  # exact, not a binary float
        ("12345678901234567890123456789012345678Ei", Fraction(12345678901234567890123456789012345678 * 1024**6)),
    ],
)
def test_quantities_read_exactly(text: str, expected: Fraction) -> None:
    assert parse_quantity(text) == expected


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (1024, "type"),
        (None, "type"),
        (1.5, "type"),
        ("", "syntax"),
        ("Gi", "syntax"),
        ("1GB", "syntax"),
        ("1gi", "syntax"),
        ("1ki", "syntax"),  # binary suffixes are capitalised except the i
        ("1K", "syntax"),  # decimal kilo is lower case
        ("1e3Mi", "syntax"),  # the client's reader takes this; the API server does not
        ("1.5.2", "syntax"),
        ("1_000", "syntax"),
        ("NaN", "syntax"),
        ("Infinity", "syntax"),
        ("1 Gi", "syntax"),
        ("--1", "syntax"),
        ("1" * 65, "syntax"),  # longer than any real quantity
        ("1e65", "exponent"),
        ("1e-65", "exponent"),
    ],
)
def test_what_is_not_a_quantity_is_refused(value: object, reason: str) -> None:
    with pytest.raises(BadQuantity) as info:
        parse_quantity(value)
    assert info.value.reason == reason
    assert isinstance(info.value, ValueError)
    assert len(info.value.shown) <= 67
