"""The shared Retry-After reader and backoff (trainmedic/backoff.py)."""

from __future__ import annotations

import asyncio
import math
import random

import pytest

from trainmedic.backoff import SPREAD, Backoff, backoff_delay, parse_retry_after, poll_forever, retry_until_done

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


class _Fixed(random.Random):
    """A draw that is always `r`: the bounds of the jitter are reached exactly."""

    def __init__(self, r: float) -> None:
        super().__init__(0)
        self.r = r

    def random(self) -> float:
        return self.r


@pytest.mark.parametrize(
    ("doublings", "base", "cap", "raw"),
    [
        (0, 1.0, 30.0, 1.0),
        (1, 1.0, 30.0, 2.0),
        (4, 1.0, 30.0, 16.0),
        (5, 1.0, 30.0, 30.0),  # capped
        (-3, 0.5, 30.0, 0.5),  # below 0 counts as 0
        (10_000, 0.2, 15.0, 15.0),  # no overflow however many failures
        (3, 0.2, 0.1, 0.1),  # a cap below base wins
    ],
)
@pytest.mark.parametrize(
    ("jitter", "r", "factor"),
    [
        (SPREAD, 0.0, 0.8),
        (SPREAD, 1.0, 1.2),
        ((0.5, 1.0), 0.0, 0.5),  # the upper half of full jitter
        ((0.0, 1.0), 0.5, 0.5),  # full jitter
        ((1.0, 1.0), 0.3, 1.0),  # none
    ],
)
def test_backoff_delay_is_capped_exponential_times_the_jitter(
    doublings: int, base: float, cap: float, raw: float, jitter: tuple[float, float], r: float, factor: float
) -> None:
    got = backoff_delay(doublings, base=base, cap=cap, jitter=jitter, rng=_Fixed(r))
    assert got == pytest.approx(raw * factor, rel=1e-12)


@pytest.mark.parametrize(
    ("jitter", "low", "high"), [(SPREAD, 0.8, 1.2), ((0.5, 1.0), 0.5, 1.0), ((0.0, 1.0), 0.0, 1.0)]
)
def test_jitter_spreads_over_its_whole_range(jitter: tuple[float, float], low: float, high: float) -> None:
    rng = random.Random(7)
    draws = [backoff_delay(2, base=1.0, cap=60.0, jitter=jitter, rng=rng) / 4.0 for _ in range(500)]
    assert low <= min(draws) and max(draws) <= high
    assert min(draws) < low + (high - low) * 0.1 and max(draws) > high - (high - low) * 0.1


def test_without_rng_the_random_module_draws() -> None:
    random.seed(3)
    first = [backoff_delay(1, base=1.0, cap=10.0) for _ in range(5)]
    random.seed(3)
    assert [backoff_delay(1, base=1.0, cap=10.0) for _ in range(5)] == first
    assert all(1.6 <= d <= 2.4 for d in first)


def test_backoff_doubles_to_its_cap_and_resets() -> None:
    b = Backoff(0.5, 3.0, jitter=(1.0, 1.0))
    assert b.current == 0.5
    assert [b.next() for _ in range(6)] == [0.5, 1.0, 2.0, 3.0, 3.0, 3.0]
    assert (b.failures, b.current) == (6, 3.0)
    b.reset()
    assert (b.failures, b.current) == (0, 0.5)
    assert b.next() == 0.5


def test_backoff_current_is_the_next_wait_before_jitter() -> None:
    b = Backoff(1.0, 60.0, rng=_Fixed(1.0))
    for want in (1.0, 2.0, 4.0):
        assert b.current == want
        assert b.next() == pytest.approx(want * 1.2)


def test_backoff_survives_very_many_failures() -> None:
    b = Backoff(1.0, 60.0, jitter=(1.0, 1.0))
    b.failures = 10**6
    assert b.next() == 60.0


@pytest.mark.parametrize(
    ("base", "cap", "jitter"),
    [(0.0, 1.0, SPREAD), (-1.0, 1.0, SPREAD), (1.0, 0.0, SPREAD), (1.0, 2.0, (1.2, 0.8)), (1.0, 2.0, (-0.1, 1.0))],
)
def test_backoff_refuses_nonsense(base: float, cap: float, jitter: tuple[float, float]) -> None:
    with pytest.raises(ValueError, match="backoff needs"):
        Backoff(base, cap, jitter=jitter)


@pytest.mark.parametrize("failures", [0, 1, 4, 7])
@pytest.mark.looptime
@pytest.mark.asyncio
async def test_retry_until_done_waits_the_backoff_between_tries(failures: int) -> None:
    loop = asyncio.get_running_loop()
    tries: list[float] = []
    told: list[tuple[str, float]] = []

    async def op() -> str:
        tries.append(loop.time())
        if len(tries) <= failures:
            raise ConnectionError(f"down {len(tries)}")
        return "sent"

    start = loop.time()
    got = await retry_until_done(op, Backoff(0.5, 4.0, jitter=(1.0, 1.0)), lambda e, d: told.append((str(e), d)))
    assert got == "sent"
    waits = [0.5, 1.0, 2.0, 4.0, 4.0, 4.0, 4.0][:failures]
    assert told == [(f"down {i + 1}", w) for i, w in enumerate(waits)]
    assert [t - start for t in tries] == pytest.approx([sum(waits[:i]) for i in range(failures + 1)])


@pytest.mark.looptime
@pytest.mark.asyncio
async def test_retry_until_done_is_cancellable_while_waiting() -> None:
    async def op() -> None:
        raise OSError("never")

    task = asyncio.ensure_future(retry_until_done(op, Backoff(1.0, 60.0), lambda e, d: None))
    await asyncio.sleep(30.0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


@pytest.mark.looptime
@pytest.mark.asyncio
async def test_poll_forever_backs_off_on_failures_and_resets_on_success() -> None:
    loop = asyncio.get_running_loop()
    # Each answer: True (more waiting: again at once), False (idle), or an error (back off).
    script: list[bool | Exception] = [True, False, OSError("a"), OSError("b"), True, OSError("c"), False]
    seen: list[float] = []
    told: list[float] = []
    done = asyncio.Event()

    async def poll() -> bool:
        seen.append(loop.time())
        if not script:
            done.set()
            await asyncio.Event().wait()
        step = script.pop(0)
        if isinstance(step, Exception):
            raise step
        return step

    def failed(delay: float) -> None:
        told.append(delay)

    start = loop.time()
    task = asyncio.ensure_future(
        poll_forever(poll, idle_s=10.0, backoff=Backoff(1.0, 30.0, jitter=(1.0, 1.0)), on_failure=failed)
    )
    await done.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert told == [1.0, 2.0, 1.0]  # the success between "b" and "c" reset the backoff
    assert [t - start for t in seen] == pytest.approx([0.0, 0.0, 10.0, 11.0, 13.0, 13.0, 14.0, 24.0])
