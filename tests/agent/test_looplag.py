"""The event-loop lag metric: `trainmedic_event_loop_lag_seconds` (histogram), its last value, and
a warning (rate-limited) when the lag passes 1 s. Time is looptime's: an idle loop wakes the
sleeper exactly on time, so its lag is 0."""

from __future__ import annotations

import asyncio
import logging
import threading
import time

import pytest

from trainmedic.agent.looplag import LoopLagMonitor
from trainmedic.agent.telemetry import Telemetry


def _count(t: Telemetry, le: str) -> float:
    for metric in t.registry.collect():
        for s in metric.samples:
            if s.name == "trainmedic_event_loop_lag_seconds_bucket" and s.labels["le"] == le:
                return s.value
    raise AssertionError(le)


@pytest.mark.parametrize(
    ("lags", "under_50ms", "warnings"),
    [
        ([0.0, 0.001, 0.02], 3, 0),
        ([0.2, 0.0, 1.5], 1, 1),
        ([2.0, 3.0, 4.0], 0, 1),  # one warning per warn_every_s, however many are over
        ([-0.5, 0.04], 2, 0),  # a sleeper woken early is no lag
    ],
)
def test_each_sample_is_observed_and_long_ones_warn(
    lags: list[float], under_50ms: int, warnings: int, caplog: pytest.LogCaptureFixture
) -> None:
    t = Telemetry()
    m = LoopLagMonitor(t, warn_s=1.0, warn_every_s=60.0)
    with caplog.at_level(logging.WARNING, logger="trainmedic.looplag"):
        for i, lag in enumerate(lags):
            m.record(lag, now=float(i))
    assert _count(t, "0.05") == under_50ms
    assert _count(t, "+Inf") == len(lags)
    assert len([r for r in caplog.records if "event loop lag" in r.getMessage()]) == warnings
    assert list(m.samples) == [max(0.0, x) for x in lags]
    text = t.exposition().decode()
    assert "trainmedic_event_loop_lag_seconds_bucket" in text
    assert f"trainmedic_event_loop_lag_last_seconds {max(0.0, lags[-1])}" in text


@pytest.mark.parametrize("warn_every_s", [10.0, 60.0])
def test_warnings_are_rate_limited(warn_every_s: float, caplog: pytest.LogCaptureFixture) -> None:
    m = LoopLagMonitor(Telemetry(), warn_s=1.0, warn_every_s=warn_every_s)
    with caplog.at_level(logging.WARNING, logger="trainmedic.looplag"):
        for second in range(120):
            m.record(2.0, now=float(second))
    assert len(caplog.records) == int(120 // warn_every_s)


@pytest.mark.parametrize(("interval_s", "seconds"), [(0.25, 10.0), (1.0, 30.0)])
@pytest.mark.looptime
@pytest.mark.asyncio
async def test_an_idle_loop_measures_no_lag(interval_s: float, seconds: float) -> None:
    t = Telemetry()
    m = LoopLagMonitor(t, interval_s=interval_s)
    stop = asyncio.Event()
    task = asyncio.create_task(m.run(stop))
    await asyncio.sleep(seconds + interval_s / 2)
    stop.set()
    await task
    assert len(m.samples) == int(seconds / interval_s) + 1
    assert max(m.samples) == pytest.approx(0.0, abs=1e-6)


def _hold_the_loop(seconds: float) -> None:
    time.sleep(seconds)  # a synchronous step on the loop: what the watchdog must name


@pytest.mark.asyncio
async def test_a_held_loop_is_reported_with_the_stack_that_holds_it(caplog: pytest.LogCaptureFixture) -> None:
    """Real time (no looptime): the loop is held by a synchronous call far past warn_s; the watchdog
    thread names that call, once for the stall."""
    m = LoopLagMonitor(Telemetry(), interval_s=0.05, warn_s=0.2, warn_every_s=60.0)
    stop = asyncio.Event()
    with caplog.at_level(logging.WARNING, logger="trainmedic.looplag"):
        task = asyncio.create_task(m.run(stop))
        await asyncio.sleep(0.2)
        _hold_the_loop(2.0)
        await asyncio.sleep(0.2)
        stop.set()
        await task
    assert m.stalls == 1
    assert any("_hold_the_loop" in line for line in m.last_stall)
    warned = [r.getMessage() for r in caplog.records if "event loop held" in r.getMessage()]
    assert len(warned) == 1 and "_hold_the_loop" in warned[0]


def test_one_report_per_stall_and_a_new_one_after_the_loop_came_back() -> None:
    m = LoopLagMonitor(Telemetry(), interval_s=0.25, warn_s=1.0, warn_every_s=0.0)
    m._loop_thread = threading.get_ident()  # this thread plays the loop
    m._beat = 100.0
    assert not m.check_stall(100.5)  # within interval + warn_s
    assert m.check_stall(102.0)
    assert not m.check_stall(103.0)  # the same stall
    m._beat = 103.0  # the loop came back
    assert not m.check_stall(103.1)
    assert m.check_stall(105.0)
    assert m.stalls == 2
    assert any("test_one_report_per_stall" in line for line in m.last_stall)
