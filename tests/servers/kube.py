"""The emulated Kubernetes API for tests: agent/demo/emulator.py (kmock's KubernetesEmulator and the
stand-in for the scheduler, kubelet and workload controllers, which `trainmedic demo` runs too),
re-exported under the name the tests and benchmarks import (`servers.kube`), plus what only tests
need: `require_kmock`, a recording bus, and waits with wall-clock deadlines (they also hold under
looptime's fake loop time).
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from trainmedic.agent.bus.memory import MemoryBus
from trainmedic.agent.demo.emulator import *  # noqa: F403 (this module is the tests' name for the emulator)
from trainmedic.agent.demo.emulator import (
    BUILTIN,
    CRDS,
    DEFAULT_STACK,
    EVENT,
    JOB,
    NODE,
    POD,
    PYTORCH_JOB,
    VOLCANO_JOB,
    Cluster,
    ExecHandler,
    ExecReply,
    FakeProcess,
    KubeApiError,
    KubeEmulator,
    PodRef,
    kmock,
    kmock_available,
    rfc3339,
    rfc3339nano,
)
from trainmedic.events import Event, decode

__all__ = [
    "BUILTIN",
    "CRDS",
    "DEFAULT_STACK",
    "EVENT",
    "JOB",
    "NODE",
    "POD",
    "PYTORCH_JOB",
    "VOLCANO_JOB",
    "Cluster",
    "EventRecorder",
    "ExecHandler",
    "ExecReply",
    "FakeProcess",
    "KubeApiError",
    "KubeEmulator",
    "PodRef",
    "kmock",
    "kmock_available",
    "require_kmock",
    "rfc3339",
    "rfc3339nano",
    "wait_event",
    "wait_until",
]


def require_kmock() -> None:
    """For tests: kmock must be importable; under CI it is a failure, elsewhere a reason to skip."""
    if kmock is not None:
        return
    import pytest

    if os.environ.get("CI", "").lower() not in ("", "0", "false"):
        pytest.fail("CI is set but kmock (the Kubernetes emulator) is not importable")
    pytest.skip("kmock is not installed")


class EventRecorder(MemoryBus):
    """A MemoryBus that also keeps every event published, decoded, for assertions.

    `wait_for` has a wall-clock deadline (a timer thread), so it works the same under looptime's
    fake loop time, where an asyncio timeout would fire at once while threads do real I/O.
    """

    def __init__(self) -> None:
        super().__init__(partitions=1)
        self.events: list[tuple[str, Event]] = []
        self._recorded = asyncio.Event()

    async def publish_raw(self, topic: str, key: str | None, value: bytes | None) -> None:
        await super().publish_raw(topic, key, value)
        self.events.append((topic, decode(value)))
        self._recorded.set()

    def payloads(self, kind: type[Any] | None = None, topic: str | None = None, *, since: int = 0) -> list[Any]:
        """Payloads published (from position `since`), optionally of one type and topic."""
        return [
            e.payload
            for t, e in self.events[since:]
            if (topic is None or t == topic) and (kind is None or isinstance(e.payload, kind))
        ]

    def mark(self) -> int:
        """A position: `wait_for(..., since=mark)` only looks at what came after it."""
        return len(self.events)

    async def wait_for(self, predicate: Callable[[Any], bool], *, timeout: float = 10.0, since: int = 0) -> Any:
        """The first payload published at or after `since` that satisfies `predicate`."""
        with _Deadline(timeout) as expired:
            pos = since
            while True:
                while pos < len(self.events):
                    payload = self.events[pos][1].payload
                    pos += 1
                    if predicate(payload):
                        return payload
                self._recorded.clear()
                waiter: asyncio.Future[Any] = asyncio.ensure_future(self._recorded.wait())
                pending: set[asyncio.Future[Any]] = {waiter, expired}
                await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                waiter.cancel()
                if expired.done() and pos >= len(self.events):
                    seen = [type(e.payload).__name__ for _, e in self.events[since:]][-20:]
                    raise AssertionError(f"no matching event within {timeout} s (last seen: {seen})")


class _Deadline:
    """A future that completes after `timeout` wall-clock seconds (a timer thread), whatever the
    loop's clock says: under looptime an asyncio timeout fires at once while threads do real I/O."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.future: asyncio.Future[None] | None = None
        self._timer: threading.Timer | None = None

    def __enter__(self) -> asyncio.Future[None]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        self.future = future

        def expire() -> None:
            if not future.done():
                future.set_result(None)

        self._timer = threading.Timer(self.timeout, loop.call_soon_threadsafe, args=(expire,))
        self._timer.daemon = True
        self._timer.start()
        return future

    def __exit__(self, *exc: object) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if self.future is not None and not self.future.done():
            self.future.cancel()


async def wait_event(event: asyncio.Event, timeout: float = 10.0, what: str = "event") -> None:
    """Wait for an asyncio.Event with a wall-clock deadline."""
    if event.is_set():
        return
    with _Deadline(timeout) as expired:
        waiter: asyncio.Future[Any] = asyncio.ensure_future(event.wait())
        pending: set[asyncio.Future[Any]] = {waiter, expired}
        await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
    if not event.is_set():
        raise AssertionError(f"{what} not set within {timeout} s")


async def wait_until(condition: Callable[[], bool], timeout: float = 10.0, what: str = "condition") -> None:
    """Poll a condition (every 10 ms of loop time) until a wall-clock deadline."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not met within {timeout} s")
        await asyncio.sleep(0.01)
