"""trainmedic.ratelog: one line per interval for a recurring condition, with the count held back."""

from __future__ import annotations

import pytest

from trainmedic.ratelog import RateLimitedLog


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize(
    ("every", "steps", "expected"),
    [(10.0, [0, 1, 2, 9.5, 10, 10.1], [True, False, False, False, True, False]), (0.0, [0, 0, 1], [True, True, True])],
)
def test_first_then_one_per_interval(every: float, steps: list[float], expected: list[bool]) -> None:
    clock = Clock()
    rl = RateLimitedLog(every, clock=clock)
    got = []
    for t in steps:
        clock.now = 1000.0 + t
        got.append(rl.ready())
    assert got == expected


def test_held_back_count_is_taken_once() -> None:
    clock = Clock()
    rl = RateLimitedLog(60.0, clock=clock)
    assert rl.ready()
    for _ in range(5):
        assert not rl.ready()
    clock.now += 60
    assert rl.ready()
    assert rl.take_suppressed() == 5
    assert rl.take_suppressed() == 0
