"""One log line per interval for a recurring condition, with how many were held back in between.

A storm (a Kafka broker gone, thousands of incidents shed at once) must not flood the log with one
line per occurrence: the first is logged, then at most one per `every` seconds, each saying how
many occurrences it stands for.
"""

from __future__ import annotations

import time
from collections.abc import Callable


class RateLimitedLog:
    def __init__(self, every: float = 10.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.every = every
        self.clock = clock
        self.last = -float("inf")
        self.suppressed = 0

    def ready(self) -> bool:
        """Whether to log this occurrence now (else it is counted as held back)."""
        now = self.clock()
        if now - self.last >= self.every:
            self.last = now
            return True
        self.suppressed += 1
        return False

    def take_suppressed(self) -> int:
        """How many occurrences were held back since the last line logged; resets the count."""
        n, self.suppressed = self.suppressed, 0
        return n
