"""Fixtures of the Kubernetes watcher tests: the kmock emulator on loopback, the cluster stand-in
(tests/servers/kube.py), a recording bus, and a starter for watchers that stops them afterwards."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
import pytest_asyncio
from servers.kube import Cluster, EventRecorder, KubeEmulator, require_kmock, wait_event, wait_until

from trainmedic.agent.jobindex import JobIndex
from trainmedic.agent.telemetry import Telemetry
from trainmedic.agent.watchers.k8s import KubeWatchers, Reflector, WatchSettings
from trainmedic.agent.watchers.podlogs import PodLogFollower, PodLogSettings
from trainmedic.detectors.diagnose import make_engine
from trainmedic.detectors.engine import Engine

# Short timings: the tests exercise the same paths in milliseconds.
FAST = WatchSettings(
    backoff_base_s=0.05,
    backoff_max_s=0.5,
    backoff_jitter=0.0,
    stream_idle_s=5.0,
    connect_timeout_s=2.0,
    request_timeout_s=5.0,
    missing_recheck_s=0.5,
    forbidden_recheck_s=0.5,
)


@pytest.fixture(scope="session")
def shipped_engine() -> Engine:
    """The rule engine over the shipped rules, as the brain builds it."""
    return make_engine()


@pytest_asyncio.fixture
async def kube() -> AsyncIterator[KubeEmulator]:
    require_kmock()
    async with KubeEmulator() as k:
        yield k


@pytest.fixture
def cluster(kube: KubeEmulator) -> Cluster:
    return Cluster(kube)


@pytest.fixture
def recorder() -> EventRecorder:
    return EventRecorder()


@pytest.fixture
def telemetry() -> Telemetry:
    return Telemetry()


@pytest.fixture
def job_index() -> JobIndex:
    return JobIndex()


StartWatchers = Callable[..., Awaitable[KubeWatchers]]
StartFollower = Callable[..., Awaitable[PodLogFollower]]


@pytest_asyncio.fixture
async def start_watchers(
    kube: KubeEmulator, recorder: EventRecorder, telemetry: Telemetry, job_index: JobIndex
) -> AsyncIterator[StartWatchers]:
    """`await start_watchers(**options)`: KubeWatchers running against the emulator, listed and
    watching unless `wait=False` (`open_watches=False`: a test that serves the watches itself);
    cancelled at teardown."""
    tasks: list[asyncio.Task[None]] = []

    async def start(
        *, wait: bool = True, open_watches: bool = True, settings: WatchSettings = FAST, **options: Any
    ) -> KubeWatchers:
        w = KubeWatchers(
            kube.api_client(),
            bus=recorder,
            job_index=job_index,
            telemetry=telemetry,
            producer="cluster/test",
            settings=settings,
            **options,
        )
        tasks.append(asyncio.create_task(w.run(), name="watchers-under-test"))
        if wait:
            await wait_event(w.ready, what="watchers ready")
            if open_watches:
                await _watches_open(kube, w.reflectors)
        return w

    yield start
    for t in tasks:
        t.cancel()
    for t in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            await t


@pytest_asyncio.fixture
async def start_follower(
    kube: KubeEmulator, recorder: EventRecorder, telemetry: Telemetry
) -> AsyncIterator[StartFollower]:
    """`await start_follower(**settings)`: a PodLogFollower running against the emulator; cancelled at teardown."""
    tasks: list[asyncio.Task[None]] = []

    async def start(**settings: Any) -> PodLogFollower:
        opts: dict[str, Any] = {
            "settle_s": 0.05,
            "backoff_base_s": 0.05,
            "backoff_max_s": 0.5,
            "stream_idle_s": 5.0,
            "watch": FAST,
        }
        opts.update(settings)
        f = PodLogFollower(
            kube.api_client(),
            bus=recorder,
            telemetry=telemetry,
            producer="cluster/test",
            settings=PodLogSettings(**opts),
        )
        tasks.append(asyncio.create_task(f.run(), name="podlogs-under-test"))
        await wait_event(f.ready, what="follower ready")
        await _watches_open(kube, f.reflectors)
        return f

    yield start
    for t in tasks:
        t.cancel()
    for t in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            await t


async def _watches_open(kube: KubeEmulator, reflectors: list[Reflector]) -> None:
    """Wait until every reflector that lists its resource also watches it at the emulator."""
    wanted: dict[str, int] = {}
    for r in reflectors:
        if r.state in ("watching", "listing"):
            res = f"{r.spec.api_version}/{r.spec.plural}"
            wanted[res] = wanted.get(res, 0) + 1
    await wait_until(
        lambda: all(kube.open_watches(res) >= n for res, n in wanted.items()), what=f"watches open: {wanted}"
    )
