"""The shared RFC 3339 formatter and parser (trainmedic/timefmt.py)."""

from __future__ import annotations

import time

import pytest

from trainmedic.timefmt import parse_rfc3339, parse_rfc3339_ns, rfc3339, rfc3339_local, rfc3339_ms, rfc3339nano


@pytest.mark.parametrize(
    ("t", "expected"),
    [
        (0, "1970-01-01T00:00:00Z"),
        (1_700_000_000, "2023-11-14T22:13:20Z"),
        (1_700_000_000.999, "2023-11-14T22:13:20Z"),  # seconds precision: the fraction is dropped
        (951_782_400, "2000-02-29T00:00:00Z"),
    ],
)
def test_rfc3339_seconds_utc(t: float, expected: str) -> None:
    assert rfc3339(t) == expected


def test_rfc3339_now_is_the_current_second() -> None:
    before = int(time.time())
    got = parse_rfc3339(rfc3339())
    assert got is not None
    assert before <= got <= time.time()


@pytest.mark.parametrize(
    ("t", "expected"),
    [
        (0, "1970-01-01T00:00:00.000Z"),
        (1_700_000_000.5, "2023-11-14T22:13:20.500Z"),
        (1_700_000_000.0125, "2023-11-14T22:13:20.012Z"),
    ],
)
def test_rfc3339_ms(t: float, expected: str) -> None:
    assert rfc3339_ms(t) == expected


@pytest.mark.parametrize(
    ("tz", "expected"),
    [
        ("UTC0", "2023-11-14T22:13:20Z"),
        ("CST-8", "2023-11-15T06:13:20+08:00"),
        ("EST5", "2023-11-14T17:13:20-05:00"),
    ],
)
def test_rfc3339_local_carries_the_offset(monkeypatch: pytest.MonkeyPatch, tz: str, expected: str) -> None:
    monkeypatch.setenv("TZ", tz)
    time.tzset()
    try:
        assert rfc3339_local(1_700_000_000) == expected
    finally:
        monkeypatch.undo()
        time.tzset()


@pytest.mark.parametrize(
    ("ns", "expected"),
    [
        (0, "1970-01-01T00:00:00Z"),
        (1_700_000_000_000_000_000, "2023-11-14T22:13:20Z"),
        (1_700_000_000_120_000_000, "2023-11-14T22:13:20.12Z"),
        (1_700_000_000_000_000_001, "2023-11-14T22:13:20.000000001Z"),
    ],
)
def test_rfc3339nano_trims_the_fraction(ns: int, expected: str) -> None:
    assert rfc3339nano(ns) == expected
    assert parse_rfc3339_ns(expected) == ns


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2023-11-14T22:13:20Z", 1_700_000_000.0),
        ("2023-11-14T22:13:20z", 1_700_000_000.0),
        ("2023-11-14t22:13:20Z", 1_700_000_000.0),
        ("2023-11-14 22:13:20Z", 1_700_000_000.0),
        ("2023-11-14T22:13:20.5Z", 1_700_000_000.5),
        ("2023-11-14T22:13:20.123456Z", 1_700_000_000.123456),
        ("2023-11-14T22:13:20.123456789Z", 1_700_000_000.123456789),
        ("2023-11-15T06:13:20+08:00", 1_700_000_000.0),
        ("2023-11-14T17:13:20-05:00", 1_700_000_000.0),
        ("2023-11-14T17:13:20-0500", 1_700_000_000.0),
        ("2023-11-14T22:13:20.250+00:00", 1_700_000_000.25),
        # Not RFC 3339: no zone, a date alone, out-of-range fields, not text.
        ("2023-11-14T22:13:20", None),
        ("2023-11-14", None),
        ("2023-13-14T22:13:20Z", None),
        ("2023-11-14T24:00:00Z", None),
        ("2023-11-14T22:61:00Z", None),
        ("", None),
        ("yesterday", None),
        (None, None),
        (1_700_000_000, None),
    ],
)
def test_parse_rfc3339(text: object, expected: float | None) -> None:
    assert parse_rfc3339(text) == expected


@pytest.mark.parametrize("t", [0, 1, 1_700_000_000, 4_102_444_800])
def test_format_then_parse_round_trips(t: int) -> None:
    assert parse_rfc3339(rfc3339(t)) == t
    assert parse_rfc3339(rfc3339_ms(t + 0.25)) == t + 0.25
    assert parse_rfc3339(rfc3339_local(t)) == t
