"""The shared Retry-After reader and backoff (trainmedic/backoff.py)."""

from __future__ import annotations

import math

import pytest

from trainmedic.backoff import parse_retry_after

NOW = 1445412420.0  # Wed, 21 Oct 2015 07:27:00 GMT


@pytest.mark.parametrize(
    ("value", "cap", "expected"),
    [
        ("30", math.inf, 30.0),
        (" 30 ", math.inf, 30.0),
        ("0", math.inf, 0.0),
        ("1.5", math.inf, 1.5),
        ("-5", math.inf, 0.0),  # never negative
        ("600", 180.0, 180.0),  # capped
        (7, math.inf, 7.0),  # a header library that hands over a number
        # HTTP-date: IMF-fixdate, RFC 850 and asctime forms, relative to now.
        ("Wed, 21 Oct 2015 07:28:00 GMT", math.inf, 60.0),
        ("Wednesday, 21-Oct-15 07:28:00 GMT", math.inf, 60.0),
        ("Wed Oct 21 07:28:00 2015", math.inf, 60.0),
        ("Wed, 21 Oct 2015 07:28:00 -0000", math.inf, 60.0),  # no zone: UTC
        ("Wed, 21 Oct 2015 09:28:00 +0200", math.inf, 60.0),
        ("Wed, 21 Oct 2015 08:27:00 GMT", 300.0, 300.0),  # capped
        ("Thu, 01 Jan 1970 00:00:00 GMT", math.inf, 0.0),  # in the past: at once
        # Absent or unreadable: the caller's backoff decides.
        (None, math.inf, None),
        ("", math.inf, None),
        ("   ", math.inf, None),
        ("soon", math.inf, None),
        ("inf", math.inf, None),
        ("nan", math.inf, None),
        ("Wed, 32 Oct 2015 07:28:00 GMT", math.inf, None),
        ("Wed, 21 Oct 99999 07:28:00 GMT", math.inf, None),
    ],
)
def test_retry_after_is_seconds_or_an_http_date(value: object, cap: float, expected: float | None) -> None:
    assert parse_retry_after(value, now=NOW, cap=cap) == expected
