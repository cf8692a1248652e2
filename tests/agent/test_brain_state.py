"""The brain's state is bounded by design: what it keeps per job goes `job_grace_s` after the job
ended (however the end is seen), or `idle_s` after the job's last event; every kind of state has a
`trainmedic_state_entries` gauge, and after N jobs come and go every gauge is back at its baseline.

Time is looptime's fake loop time (the brain's clock is the loop clock)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from trainmedic.agent.brain import Brain, BrainSettings
from trainmedic.agent.bus.memory import MemoryBus
from trainmedic.agent.telemetry import Telemetry
from trainmedic.events import (
    JobRef,
    KernelBatch,
    LogBatch,
    PodStatus,
    Topic,
    WorkloadStatus,
    make_event,
)

pytestmark = [pytest.mark.asyncio, pytest.mark.looptime]

WATCHDOG = (
    "[rank0]:[E1206 18:44:12.755262105 ProcessGroupNCCL.cpp:607] [Rank 0] Watchdog caught collective operation "
    "timeout: WorkNCCL(SeqNum=7753, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for "
    "600099 milliseconds before timing out."
)
XID79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid=2876, name=python, GPU has fallen off the bus."
# Kinds bounded by a cap rather than by jobs: the de-dup rings of event ids.
RINGS = {"brain_dedup", "brain_kernel_ids"}


def _pod(job: JobRef, i: int, phase: str, *, deleted: bool = False, exit_code: int | None = None) -> PodStatus:
    containers: list[dict[str, object]] = []
    if exit_code is not None:
        containers = [{"name": "trainer", "state": "terminated", "exit_code": exit_code, "reason": "Error"}]
    return PodStatus(
        namespace=job.namespace,
        pod=f"{job.name}-worker-{i}",
        uid=f"uid-{job.name}-{i}",
        node=f"gpu-node-{i}",
        job=job,
        rank=i,
        phase=phase,
        deleted=deleted,
        containers=containers,
    )


def _logs(job: JobRef, i: int, lines: list[str]) -> LogBatch:
    return LogBatch(
        node=f"gpu-node-{i}",
        namespace=job.namespace,
        pod=f"{job.name}-worker-{i}",
        container="trainer",
        job=job,
        rank=i,
        lines=lines,
    )


class Cluster:
    def __init__(self, bus: MemoryBus, clock: Callable[[], float]) -> None:
        self.bus = bus
        self.clock = clock

    async def send(self, topic: Topic, payload: object) -> None:
        await self.bus.publish(topic, make_event(payload, producer="test", at=self.clock()))  # type: ignore[arg-type]

    async def job_lives_and_fails(self, job: JobRef, ranks: int) -> None:
        for i in range(ranks):
            await self.send(Topic.K8S, _pod(job, i, "Running"))
            await self.send(Topic.LOGS, _logs(job, i, [f"[rank{i}]: step {s} loss 2.0" for s in range(20)]))
            await self.send(Topic.KERNEL, KernelBatch(node=f"gpu-node-{i}", job=job, lines=[XID79]))
        await self.send(Topic.LOGS, _logs(job, 0, [WATCHDOG, "RuntimeError: NCCL error"]))
        for i in range(ranks):
            await self.send(Topic.K8S, _pod(job, i, "Failed", exit_code=1))

    async def end(self, job: JobRef, ranks: int, how: str) -> None:
        if how == "workload failed":
            await self.send(Topic.K8S, WorkloadStatus(job=job, phase="Failed", reason="BackoffLimitExceeded"))
        elif how == "workload deleted":
            await self.send(Topic.K8S, WorkloadStatus(job=job, deleted=True))
        if how in ("pods deleted", "workload deleted"):
            for i in range(ranks):
                await self.send(Topic.K8S, _pod(job, i, "Failed", deleted=True, exit_code=1))


async def _start(brain: Brain) -> tuple[asyncio.Task[None], asyncio.Event]:
    stop = asyncio.Event()
    task = asyncio.create_task(brain.run(stop))
    await brain.ready.wait()
    return task, stop


def _brain(bus: MemoryBus, **settings: float) -> Brain:
    loop = asyncio.get_running_loop()
    return Brain(
        bus,
        settings=BrainSettings(window_s=30.0, tick_s=0.5, sweep_s=5.0, **settings),  # type: ignore[arg-type]
        clock=loop.time,
        telemetry=Telemetry(),
    )


@pytest.mark.parametrize("how", ["workload failed", "workload deleted", "pods deleted"])
@pytest.mark.parametrize(("jobs", "ranks"), [(1, 1), (5, 4)])
async def test_after_jobs_end_every_gauge_is_back_at_its_baseline(how: str, jobs: int, ranks: int) -> None:
    bus = MemoryBus(partitions=4)
    brain = _brain(bus, job_grace_s=120.0)
    task, stop = await _start(brain)
    baseline = brain.state_sizes()
    cluster = Cluster(bus, brain.clock)
    names = [JobRef(namespace="train", name=f"job-{n}") for n in range(jobs)]
    for job in names:
        await cluster.job_lives_and_fails(job, ranks)
    await asyncio.sleep(5)
    during = brain.state_sizes()
    assert during["brain_keys"] == jobs and during["brain_windows"] == jobs
    assert during["hang_jobs"] >= 1 and during["brain_kernel_tail_nodes"] == ranks
    for job in names:
        await cluster.end(job, ranks, how)
    await asyncio.sleep(60)  # the windows have closed; the grace period is not over
    assert brain.state_sizes()["brain_jobs_ended"] == jobs
    assert brain.state_sizes()["brain_keys"] == jobs
    await asyncio.sleep(120)
    after = brain.state_sizes()
    for kind, n in after.items():
        if kind in RINGS:
            continue
        if kind.startswith("brain_kernel_tail"):
            continue  # nodes' state: let go when the node goes silent (next test)
        assert n == baseline[kind], kind
    assert brain.evicted >= jobs
    stop.set()
    await task


@pytest.mark.parametrize("idle_s", [300.0, 900.0])
async def test_a_job_whose_end_is_never_seen_goes_after_idle_s(idle_s: float) -> None:
    bus = MemoryBus(partitions=2)
    brain = _brain(bus, idle_s=idle_s)
    task, stop = await _start(brain)
    cluster = Cluster(bus, brain.clock)
    job = JobRef(namespace="train", name="silent")
    await cluster.send(Topic.LOGS, _logs(job, 0, [WATCHDOG, "RuntimeError: boom"]))
    await cluster.send(Topic.KERNEL, KernelBatch(node="gpu-node-0", job=job, lines=[XID79]))
    await asyncio.sleep(idle_s / 2)
    sizes = brain.state_sizes()
    assert sizes["brain_keys"] == 1 and sizes["brain_kernel_tail_nodes"] == 1
    await asyncio.sleep(idle_s / 2 + 10)
    sizes = brain.state_sizes()
    assert sizes["brain_keys"] == 0 and sizes["hang_jobs"] == 0 and sizes["brain_error_lines_jobs"] == 0
    assert sizes["brain_kernel_tail_nodes"] == 0 and sizes["brain_kernel_tail_lines"] == 0
    stop.set()
    await task


@pytest.mark.parametrize(("dedup_size", "events", "held"), [(10, 25, 5), (10, 27, 7), (10, 4, 4), (100, 30, 30)])
async def test_the_dedup_ring_is_capped(dedup_size: int, events: int, held: int) -> None:
    bus = MemoryBus(partitions=1)
    brain = _brain(bus, dedup_size=dedup_size)
    task, stop = await _start(brain)
    cluster = Cluster(bus, brain.clock)
    job = JobRef(namespace="train", name="chatty")
    for s in range(events):
        await cluster.send(Topic.LOGS, _logs(job, 0, [f"[rank0]: step {s} loss 2.0"]))
    await asyncio.sleep(2)
    assert brain.state_sizes()["brain_dedup"] == held
    stop.set()
    await task


@pytest.mark.parametrize("events", [1, 30, 300])
async def test_the_embedded_bus_needs_no_dedup_ring(events: int) -> None:
    """The `--role all` bus (replays=False) delivers each record to the brain once: nothing is
    remembered per event, however many come, and every event is still read."""
    bus = MemoryBus(partitions=2, replays=False)
    brain = _brain(bus, dedup_size=100)
    task, stop = await _start(brain)
    cluster = Cluster(bus, brain.clock)
    job = JobRef(namespace="train", name="chatty")
    for s in range(events):
        await cluster.send(Topic.LOGS, _logs(job, 0, [f"[rank0]: step {s} loss 2.0"]))
    await asyncio.sleep(2)
    assert brain.processed == events
    assert brain.state_sizes()["brain_dedup"] == 0
    stop.set()
    await task


@pytest.mark.parametrize(
    "kind",
    [
        "brain_windows",
        "brain_keys",
        "brain_jobs_ended",
        "brain_dedup",
        "brain_jobs_running",
        "brain_terminations",
        "brain_error_lines_jobs",
        "brain_exit_codes_jobs",
        "brain_kernel_tail_nodes",
        "hang_jobs",
        "metric_tracks",
    ],
)
async def test_every_kind_of_state_is_on_metrics(kind: str) -> None:
    telemetry = Telemetry()
    bus = MemoryBus(partitions=1)
    brain = Brain(bus, telemetry=telemetry, clock=asyncio.get_running_loop().time)
    telemetry.refreshers.append(brain.report)
    text = telemetry.exposition().decode()
    assert f'trainmedic_state_entries{{kind="{kind}"}}' in text


@pytest.mark.parametrize(("replays", "held_while_open"), [(True, True), (False, False)])
async def test_a_window_holds_its_records_only_where_a_replay_could_use_them(
    replays: bool, held_while_open: bool
) -> None:
    """Over a broker a window holds its records' commit (a crash replays them); over the in-process
    bus of `--role all` (replays=False) it does not, and the bus lets them go at once."""
    bus = MemoryBus(partitions=1, replays=replays)
    brain = _brain(bus)
    task, stop = await _start(brain)
    cluster = Cluster(bus, brain.clock)
    job = JobRef(namespace="train", name="held")
    await cluster.send(Topic.LOGS, _logs(job, 0, [WATCHDOG]))
    await cluster.send(Topic.LOGS, _logs(job, 0, ["[rank0]: step 1 loss 2.0"]))
    await asyncio.sleep(5)
    assert brain.state_sizes()["brain_windows"] == 1
    assert (bus.stats()[Topic.LOGS.value]["records"] == 2) is held_while_open
    assert (brain.state_sizes()["brain_offsets_open"] == 1) is held_while_open
    await asyncio.sleep(60)
    assert bus.stats()[Topic.LOGS.value]["records"] == 0
    stop.set()
    await task
