"""bench/breaker.py: 32 of 64 nodes failing within a second under `max_share: 0.1` quarantine exactly
floor(0.1 x 64) = 6, with one brain and with two brains that share only the cluster."""

from __future__ import annotations

from typing import Any

import pytest

from bench.breaker import run_breaker


@pytest.fixture(scope="module")
def figures() -> dict[str, Any]:
    return run_breaker()


@pytest.mark.parametrize("key", ["breaker_concurrent_faults", "breaker_concurrent_faults_two_brains"])
def test_exactly_the_share_is_quarantined(figures: dict[str, Any], key: str) -> None:
    assert figures[key] == 6
    assert figures["goals_breaker"][key] == 6
