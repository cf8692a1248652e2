"""The responder keeps up by bounds, not by an unbounded queue: incidents of different jobs run side
by side up to `max_concurrent`; past `max_pending` waiting diagnoses the oldest are handled
observe-only with a note saying why; its state gauges come back to their baseline once idle."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from respfix import FakeKube, diagnosis, harness, node, policy

from trainmedic.agent.bus.memory import MemoryBus
from trainmedic.agent.store import IncidentStatus
from trainmedic.events import Topic, job_key, make_event

pytestmark = pytest.mark.asyncio


class SlowKube(FakeKube):
    """Each workload lookup takes a second of (fake) time; the peak of lookups at once is kept."""

    active: int = 0
    peak: int = 0

    async def get_workload(self, api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        self.active += 1
        self.peak = max(self.peak, self.active)
        try:
            await asyncio.sleep(1.0)
            return await super().get_workload(api_version, kind, namespace, name)
        finally:
            self.active -= 1


@pytest.mark.parametrize(
    ("diagnoses", "max_concurrent", "max_pending"),
    [(6, 1, 2), (12, 4, 4), (5, 2, 10), (40, 16, 8)],
)
@pytest.mark.looptime
async def test_over_its_bounds_the_oldest_are_observed_with_the_reason(
    tmp_path: Path, diagnoses: int, max_concurrent: int, max_pending: int
) -> None:
    kube = SlowKube(nodes={f"gpu-{i}": node(f"gpu-{i}") for i in range(diagnoses)})
    # One partition: the responder reads the diagnoses in the order they were published.
    bus = MemoryBus(partitions=1)
    h = harness(tmp_path, policy(), kube, bus=bus, max_concurrent=max_concurrent, max_pending=max_pending)
    r = h.responder
    stop = asyncio.Event()
    task = asyncio.create_task(r.run(stop))
    await r.ready.wait()
    baseline = r.state_sizes()
    for i in range(diagnoses):
        d = diagnosis("train", f"job-{i}", f"gpu-{i}", n=i)
        await r.bus.publish(Topic.DIAGNOSES, make_event(d, producer="test", key=job_key("train", f"job-{i}")))
    while len(r.handled) < diagnoses:
        await asyncio.sleep(0.5)

    degraded = max(0, diagnoses - max_pending)
    incidents = {i.id: i for i in h.store.recent(limit=1000)}
    observed = [incidents[f"d-train-job-{i}-{i}"] for i in range(degraded)]
    assert all(i.status is IncidentStatus.OBSERVED for i in observed)
    for incident in observed:
        notes = [e for e in h.store.timeline(incident.id) if e["kind"] == "degraded"]
        assert notes and "remediate.max_pending" in notes[0]["detail"]["why"]
    acted = [incidents[f"d-train-job-{i}-{i}"] for i in range(degraded, diagnoses)]
    # Planned and acted on under the policy (its circuit breaker may block some), never degraded.
    assert all(i.status in (IncidentStatus.RESOLVED, IncidentStatus.BLOCKED) for i in acted), [i.status for i in acted]
    assert kube.quarantines and len(kube.quarantines) <= diagnoses - degraded
    assert r.degraded == degraded
    assert 1 <= kube.peak <= max_concurrent
    assert not [i for i in incidents.values() if i.status is IncidentStatus.OPEN]

    await asyncio.sleep(31)  # idle workers exit
    assert r.state_sizes() | {"responder_handled": 0} == baseline | {"responder_handled": 0}
    stop.set()
    await task


@pytest.mark.parametrize("handled_max", [1, 3])
@pytest.mark.looptime
async def test_handled_keeps_only_the_newest(tmp_path: Path, handled_max: int) -> None:
    kube = FakeKube(nodes={f"gpu-{i}": node(f"gpu-{i}") for i in range(5)})
    h = harness(tmp_path, policy(), kube, handled_max=handled_max)
    for i in range(5):
        await h.handle(diagnosis("train", f"job-{i}", f"gpu-{i}", n=i))
    assert list(h.responder.handled) == [f"d-train-job-{i}-{i}" for i in range(5 - handled_max, 5)]


@pytest.mark.parametrize(("jobs", "max_concurrent", "max_pending"), [(30, 2, 5), (60, 4, 10), (20, 16, 200)])
@pytest.mark.looptime
async def test_a_storm_of_jobs_each_diagnosed_twice_leaves_no_incident_open(
    tmp_path: Path, jobs: int, max_concurrent: int, max_pending: int, caplog: pytest.LogCaptureFixture
) -> None:
    """As the brain publishes them under a fault storm: each job's first diagnosis (not final: the
    incident opens, its pods are protected) and, later, its final one, in waves while the slots are
    busy. Past `max_pending` the oldest are settled observe-only with the reason; whatever the
    bounds, every incident leaves `open`."""
    kube = SlowKube(nodes={f"gpu-{i}": node(f"gpu-{i}") for i in range(jobs)})
    bus = MemoryBus(partitions=4)
    h = harness(tmp_path, policy(), kube, bus=bus, max_concurrent=max_concurrent, max_pending=max_pending)
    r = h.responder
    stop = asyncio.Event()
    task = asyncio.create_task(r.run(stop))
    await r.ready.wait()
    for wave in range(0, jobs, 10):
        for i in range(wave, min(jobs, wave + 10)):
            d = diagnosis("train", f"job-{i}", f"gpu-{i}", n=i)
            first = d.model_copy(update={"final": False, "revision": 1})
            await bus.publish(Topic.DIAGNOSES, make_event(first, producer="test", key=job_key("train", f"job-{i}")))
        await asyncio.sleep(0.5)  # the slots are busy with this wave when the finals come
        for i in range(wave, min(jobs, wave + 10)):
            d = diagnosis("train", f"job-{i}", f"gpu-{i}", n=i).model_copy(update={"revision": 2})
            await bus.publish(Topic.DIAGNOSES, make_event(d, producer="test", key=job_key("train", f"job-{i}")))
    while len(r.handled) < jobs:
        await asyncio.sleep(0.5)

    incidents = h.store.recent(limit=1000)
    assert len(incidents) == jobs
    assert [i.id for i in incidents if i.status is IncidentStatus.OPEN] == []
    degraded = [i for i in incidents if any(e["kind"] == "degraded" for e in h.store.timeline(i.id))]
    assert all(i.status is IncidentStatus.OBSERVED for i in degraded)
    if 2 * jobs > max_pending + max_concurrent:
        assert degraded and r.degraded >= len(degraded)
        # The shed incidents are logged a line a minute (each incident notes why), not one line each.
        lines = [rec for rec in caplog.records if "observe-only" in rec.getMessage()]
        assert 1 <= len(lines) < len(degraded)
    else:
        assert degraded == [] and r.degraded == 0
    assert 1 <= kube.peak <= max_concurrent
    stop.set()
    await task
