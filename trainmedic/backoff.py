"""How long to wait before trying again: one backoff for every retry loop, and a server's Retry-After.

`Backoff` (and `backoff_delay`, its arithmetic) is exponential backoff with jitter: the n-th wait
after consecutive failures is `min(cap, base * 2**n)` times a uniform draw from `jitter` (a
`(low, high)` factor range). Each caller keeps its own numbers: the default (0.8, 1.2) is a +-20 %
spread; (0.5, 1.0) is the upper half of full jitter and (0.0, 1.0) is full jitter (AWS Architecture
Blog, "Exponential Backoff And Jitter"). `reset()` starts again at `base` after a success.

`parse_retry_after` reads the HTTP `Retry-After` field (RFC 9110 section 10.2.3): delta-seconds or
an HTTP-date, as seconds from `now`, never negative, at most `cap`; None when it is absent or
unreadable (the caller's own backoff then decides).
"""

from __future__ import annotations

import asyncio
import email.utils
import math
import random
from collections.abc import Awaitable, Callable
from datetime import UTC
from typing import NoReturn, TypeVar

T = TypeVar("T")

SPREAD = (0.8, 1.2)
"""The jitter most loops use: +-20 % around the exponential delay."""

_MAX_DOUBLINGS = 64


def backoff_delay(
    doublings: int,
    *,
    base: float,
    cap: float,
    jitter: tuple[float, float] = SPREAD,
    rng: random.Random | None = None,
) -> float:
    """`min(cap, base * 2**doublings)` (doublings below 0 count as 0, above 64 as 64) times a uniform
    draw from `jitter`; `rng` (the `random` module when None) makes the draw."""
    raw = min(cap, base * 2.0 ** min(max(doublings, 0), _MAX_DOUBLINGS))
    low, high = jitter
    return raw * (rng.uniform(low, high) if rng is not None else random.uniform(low, high))  # noqa: S311 (jitter)


class Backoff:
    """The waits of one retry loop: `next()` after each failure, `reset()` after a success.

    `failures` counts the waits since the last reset; `current` is the next wait before jitter (for
    log lines that say how long the loop will wait)."""

    def __init__(
        self,
        base: float,
        cap: float,
        *,
        jitter: tuple[float, float] = SPREAD,
        rng: random.Random | None = None,
    ) -> None:
        if not (base > 0 and cap > 0 and 0 <= jitter[0] <= jitter[1]):
            raise ValueError(
                f"backoff needs base > 0, cap > 0 and 0 <= jitter low <= high, not {base}, {cap}, {jitter}"
            )
        self.base = base
        self.cap = cap
        self.jitter = jitter
        self.rng = rng
        self.failures = 0

    @property
    def current(self) -> float:
        return min(self.cap, self.base * 2.0 ** min(self.failures, _MAX_DOUBLINGS))

    def next(self) -> float:
        """The wait after one more failure (jittered); the one after it is twice as long, up to `cap`."""
        delay = backoff_delay(self.failures, base=self.base, cap=self.cap, jitter=self.jitter, rng=self.rng)
        self.failures += 1
        return delay

    def reset(self) -> None:
        self.failures = 0


async def retry_until_done(
    op: Callable[[], Awaitable[T]], backoff: Backoff, on_failure: Callable[[Exception, float], None]
) -> T:
    """`op()` until it returns, waiting `backoff.next()` after each failure; `on_failure(error,
    wait before jitter)` is told first (inside the `except`, so it may log the traceback).
    Cancellation is never retried."""
    while True:
        try:
            return await op()
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 (any failure is retried: the caller keeps its data)
            on_failure(e, backoff.current)
            await asyncio.sleep(backoff.next())


async def poll_forever(
    poll: Callable[[], Awaitable[bool]], *, idle_s: float, backoff: Backoff, on_failure: Callable[[float], None]
) -> NoReturn:
    """Call `poll()` until cancelled: at once again while it returns True (more is waiting), after
    `idle_s` when it returns False, after `backoff.next()` when it raises (`on_failure(wait before
    jitter)` is told first, inside the `except`); a poll that works resets the backoff."""
    while True:
        try:
            more = await poll()
            backoff.reset()
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 (a source's failure never ends its loop)
            on_failure(backoff.current)
            await asyncio.sleep(backoff.next())
            continue
        if not more:
            await asyncio.sleep(idle_s)


def parse_retry_after(value: object, *, now: float, cap: float = math.inf) -> float | None:
    """Retry-After as seconds from `now`: delta-seconds or an HTTP-date, within [0, cap]; None when
    absent, not finite, or not readable. An HTTP-date without a zone (`-0000`) is read as UTC."""
    if value is None:
        return None
    text = str(value).strip()
    if not text:
        return None
    try:
        seconds = float(text)
    except ValueError:
        pass
    else:
        return min(max(seconds, 0.0), cap) if math.isfinite(seconds) else None
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    try:
        delta = when.timestamp() - now
    except (OverflowError, OSError, ValueError):
        return None
    return min(max(delta, 0.0), cap)
