"""How late the event loop runs what is due: `trainmedic_event_loop_lag_seconds`.

Every `interval_s` a sleeper asks to wake up; the time it wakes up after its deadline is the lag
any other callback on the loop would have suffered then (a synchronous step of a tailer, the brain
or the responder that held the loop). Each sample goes to the histogram
`trainmedic_event_loop_lag_seconds` and the gauge `trainmedic_event_loop_lag_last_seconds`; a lag
over `warn_s` logs a warning (at most once per `warn_every_s`, with how many were over since).

The loop's own clock is used, so under looptime (tests) a step that advances fake time while it
holds the loop reads as lag like a real one would.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque

from agent.telemetry import Telemetry

log = logging.getLogger("trainmedic.looplag")


class LoopLagMonitor:
    def __init__(
        self,
        telemetry: Telemetry,
        *,
        interval_s: float = 0.25,
        warn_s: float = 1.0,
        warn_every_s: float = 60.0,
        keep: int = 16384,
    ) -> None:
        self.telemetry = telemetry
        self.interval_s = interval_s
        self.warn_s = warn_s
        self.warn_every_s = warn_every_s
        # The newest samples (seconds), for the soak benchmark's percentiles and for tests.
        self.samples: deque[float] = deque(maxlen=keep)
        self.taken = 0  # samples measured so far
        self.over = 0  # samples over warn_s since the last warning
        self._last_warning: float | None = None

    def record(self, lag: float, now: float) -> None:
        """One measured lag (seconds) at loop time `now`."""
        lag = max(0.0, lag)
        self.samples.append(lag)
        self.taken += 1
        self.telemetry.loop_lag.observe(lag)
        self.telemetry.loop_lag_last.set(lag)
        if lag <= self.warn_s:
            return
        self.over += 1
        if self._last_warning is None or now - self._last_warning >= self.warn_every_s:
            log.warning(
                "event loop lag %.2f s (over %.1f s %d time(s) since the last warning): "
                "a synchronous step held the loop",
                lag,
                self.warn_s,
                self.over,
            )
            self._last_warning = now
            self.over = 0

    async def run(self, stop: asyncio.Event | None = None) -> None:
        """Measure until cancelled or `stop` is set."""
        loop = asyncio.get_running_loop()
        stop = stop or asyncio.Event()
        while not stop.is_set():
            deadline = loop.time() + self.interval_s
            await asyncio.sleep(self.interval_s)
            now = loop.time()
            self.record(now - deadline, now)
