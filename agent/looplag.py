"""How late the event loop runs what is due: `trainmedic_event_loop_lag_seconds`.

Every `interval_s` a sleeper asks to wake up; the time it wakes up after its deadline is the lag
any other callback on the loop would have suffered then (a synchronous step of a tailer, the brain
or the responder that held the loop). Each sample goes to the histogram
`trainmedic_event_loop_lag_seconds` and the gauge `trainmedic_event_loop_lag_last_seconds`; a lag
over `warn_s` logs a warning (at most once per `warn_every_s`, with how many were over since).

The loop's own clock is used, so under looptime (tests) a step that advances fake time while it
holds the loop reads as lag like a real one would.

The lag says that the loop was held, not by what. While `run` measures, a watchdog thread also
watches the sleeper's real-time heartbeat: when the loop has not come back for `warn_s` past its
interval, the thread takes the loop thread's stack at that moment, which is the code holding the
loop (or, in a frame of the selector, a loop starved of the CPU or the GIL), and logs it once per
stall, at most once per `warn_every_s` (`stalls` counts them, `last_stall` keeps the last stack).
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
import time
import traceback
from collections import deque

from trainmedic.agent.telemetry import Telemetry

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
        # The stall watchdog: the loop thread, its last heartbeat (real monotonic time), what it saw.
        self._loop_thread: int | None = None
        self._beat = time.monotonic()
        self._in_stall = False
        self._last_stall_log: float | None = None
        self.stalls = 0
        self.last_stall: list[str] = []

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

    def check_stall(self, now: float) -> bool:
        """From the watchdog thread (real monotonic `now`): when the loop is held past its interval
        plus `warn_s`, take the loop thread's stack, once per stall. True when one was taken."""
        held = now - self._beat - self.interval_s
        if held <= self.warn_s:
            self._in_stall = False
            return False
        if self._in_stall or self._loop_thread is None:
            return False
        self._in_stall = True
        frame = sys._current_frames().get(self._loop_thread)
        if frame is None:
            return False
        self.stalls += 1
        self.last_stall = [line.rstrip() for line in traceback.format_stack(frame)[-12:]]
        if self._last_stall_log is None or now - self._last_stall_log >= self.warn_every_s:
            self._last_stall_log = now
            log.warning(
                "event loop held for over %.1f s (stall %d); the loop thread is at:\n%s",
                held,
                self.stalls,
                "\n".join(self.last_stall),
            )
        return True

    def _watch(self, done: threading.Event) -> None:
        poll = max(0.05, min(self.interval_s, self.warn_s) / 4)
        while not done.wait(poll):
            self.check_stall(time.monotonic())

    async def run(self, stop: asyncio.Event | None = None) -> None:
        """Measure until cancelled or `stop` is set."""
        loop = asyncio.get_running_loop()
        stop = stop or asyncio.Event()
        self._loop_thread = threading.get_ident()
        self._beat = time.monotonic()
        done = threading.Event()
        watchdog = threading.Thread(target=self._watch, args=(done,), name="trainmedic-loop-watchdog", daemon=True)
        watchdog.start()
        try:
            while not stop.is_set():
                deadline = loop.time() + self.interval_s
                await asyncio.sleep(self.interval_s)
                self._beat = time.monotonic()
                now = loop.time()
                self.record(now - deadline, now)
        finally:
            done.set()
