"""agent/authlimit.py: wrong tokens per client address, with a window, a cap and eviction."""

from __future__ import annotations

import pytest

from trainmedic.agent.authlimit import AuthFailures, client_address


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize("limit", [1, 3, 10])
def test_an_address_is_refused_after_limit_failures_until_the_oldest_leaves_the_window(limit: int) -> None:
    clock = Clock()
    f = AuthFailures(limit=limit, window_s=60.0, clock=clock)
    for _ in range(limit):
        assert f.retry_after("10.0.0.1") is None
        f.failed("10.0.0.1")
        clock.now += 1
    wait = f.retry_after("10.0.0.1")
    assert wait is not None
    assert wait == pytest.approx(60.0 - limit)
    assert f.retry_after("10.0.0.2") is None  # another address is not affected
    clock.now += wait
    assert f.retry_after("10.0.0.1") is None


def test_failures_spread_wider_than_the_window_never_throttle() -> None:
    clock = Clock()
    f = AuthFailures(limit=3, window_s=60.0, clock=clock)
    for _ in range(20):
        assert f.retry_after("a") is None
        f.failed("a")
        clock.now += 30.1


def test_idle_addresses_are_dropped_and_the_map_is_capped() -> None:
    clock = Clock()
    f = AuthFailures(limit=3, window_s=60.0, max_clients=100, clock=clock)
    for i in range(250):
        f.failed(f"10.0.{i // 256}.{i % 256}")
    assert len(f) == 100  # the least recently failing went first
    assert f.retry_after("10.0.0.0") is None
    clock.now += 61
    f.failed("10.9.9.9")
    assert len(f) == 1


@pytest.mark.parametrize(("client", "want"), [(("10.1.2.3", 5555), "10.1.2.3"), (None, "unknown"), ((), "unknown")])
def test_client_address(client: object, want: str) -> None:
    assert client_address(client) == want
