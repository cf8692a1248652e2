"""The detector service on the memory bus: findings per job window, diagnoses, commits, DLQ, replays.

Time is looptime's fake loop time: the brain's clock is the loop clock, so a 30 s window closes
without anyone waiting 30 s.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable

import pytest
import pytest_asyncio
from paths import DATA

from trainmedic.agent.brain import Brain, BrainSettings
from trainmedic.agent.bus.memory import MemoryBus
from trainmedic.events import (
    DeadLetter,
    DiagnosisEvent,
    Event,
    JobRef,
    KernelBatch,
    LogBatch,
    PodStatus,
    Topic,
    decode,
    make_event,
)

JOB = JobRef(namespace="train", name="llama-70b")
WATCHDOG = (
    "[rank4]:[E1206 18:44:12.755262105 ProcessGroupNCCL.cpp:607] [Rank 4] Watchdog caught collective operation "
    "timeout: WorkNCCL(SeqNum=7753, OpType=_REDUCE_SCATTER_BASE, NumelIn=544997376, NumelOut=68124672, "
    "Timeout(ms)=600000) ran for 600099 milliseconds before timing out."
)
XID79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid=2876, name=python, GPU has fallen off the bus."
HEALTHY = [f"[rank0]: step {i} loss 2.{i:03d}" for i in range(50)]


def _corpus(label_id: str) -> str:
    for line in (DATA / "real-logs.jsonl").read_text().splitlines():
        row = json.loads(line)
        if row["id"] == label_id:
            return str(row["text"])
    raise KeyError(label_id)


def logs(lines: list[str], *, pod: str = "llama-70b-worker-1", rank: int = 1, node: str = "gpu-node-b") -> LogBatch:
    return LogBatch(node=node, namespace=JOB.namespace, pod=pod, container="trainer", job=JOB, rank=rank, lines=lines)


def kernel(lines: list[str], node: str = "gpu-node-a") -> KernelBatch:
    return KernelBatch(node=node, job=JOB, lines=lines)


class Harness:
    def __init__(self, bus: MemoryBus, window_s: float = 30.0) -> None:
        self.bus = bus
        loop = asyncio.get_running_loop()
        self.clock: Callable[[], float] = loop.time
        self.window_s = window_s
        self.diag_consumer = bus.consumer([Topic.DIAGNOSES], "observer")
        self.dlq_consumer = bus.consumer([Topic.DLQ], "dlq-observer")

    def brain(self, group: str = "trainmedic-brain") -> Brain:
        return Brain(
            self.bus,
            settings=BrainSettings(group=group, window_s=self.window_s, tick_s=0.5),
            clock=self.clock,
        )

    async def publish(self, topic: Topic, payload: object) -> Event:
        ev = make_event(payload, producer="test", at=self.clock())  # type: ignore[arg-type]
        await self.bus.publish(topic, ev)
        return ev

    async def diagnoses(self, n: int, timeout: float = 120) -> list[DiagnosisEvent]:
        out: list[DiagnosisEvent] = []

        async def collect() -> None:
            while len(out) < n:
                for r in await self.diag_consumer.getmany(timeout_ms=100):
                    p = decode(r.value).payload
                    assert isinstance(p, DiagnosisEvent)
                    out.append(p)

        await asyncio.wait_for(collect(), timeout)
        return out


@pytest_asyncio.fixture
async def harness() -> AsyncIterator[Harness]:
    h = Harness(MemoryBus(partitions=4))
    await h.diag_consumer.start()
    await h.dlq_consumer.start()
    yield h


async def _run(brain: Brain) -> tuple[asyncio.Task[None], asyncio.Event]:
    stop = asyncio.Event()
    task = asyncio.create_task(brain.run(stop))
    await brain.ready.wait()
    return task, stop


@pytest.mark.looptime
@pytest.mark.asyncio
async def test_peer_timeout_is_superseded_by_the_xid_that_caused_it(harness: Harness) -> None:
    brain = harness.brain()
    task, stop = await _run(brain)
    await harness.publish(Topic.LOGS, logs([*HEALTHY, WATCHDOG]))
    first = (await harness.diagnoses(1))[0]
    assert first.revision == 1 and not first.final
    assert first.diagnosis.root_cause is not None
    assert first.diagnosis.root_cause.fault_class == "hang"
    await harness.publish(Topic.KERNEL, kernel([XID79]))
    second = (await harness.diagnoses(1))[0]
    assert second.diagnosis_id == first.diagnosis_id
    assert second.revision == 2
    rc = second.diagnosis.root_cause
    assert rc is not None
    assert (rc.fault_class, rc.code, rc.node) == ("device_error", "xid:79", "gpu-node-a")
    # The window closes: a final revision with the same root cause.
    final = (await harness.diagnoses(1))[0]
    assert final.final and final.revision == 3 and final.diagnosis_id == first.diagnosis_id
    assert final.diagnosis.root_cause is not None and final.diagnosis.root_cause.code == "xid:79"
    assert len(final.evidence) == 2
    stop.set()
    await task


@pytest.mark.looptime
@pytest.mark.asyncio
async def test_offsets_are_committed_only_after_the_final_diagnosis(harness: Harness) -> None:
    brain = harness.brain()
    task, stop = await _run(brain)
    ev = await harness.publish(Topic.LOGS, logs([WATCHDOG]))
    await harness.diagnoses(1)
    group = harness.bus._groups["trainmedic-brain"]
    tps = [tp for tp in group.committed if tp[0] == Topic.LOGS]
    # The record with the finding is held by its open window: its partition is not committed past it.
    held = [(tp, off) for tp, off in group.committed.items() if tp[0] == Topic.LOGS and off > 0]
    assert held == [], (ev.key, tps)
    await harness.diagnoses(1)  # final
    await asyncio.sleep(1)
    assert sum(off for tp, off in group.committed.items() if tp[0] == Topic.LOGS) == 1
    stop.set()
    await task


@pytest.mark.looptime
@pytest.mark.asyncio
async def test_a_brain_that_dies_mid_window_is_replayed_with_the_same_diagnosis_id(harness: Harness) -> None:
    brain = harness.brain()
    task, _ = await _run(brain)
    await harness.publish(Topic.KERNEL, kernel([XID79]))
    first = (await harness.diagnoses(1))[0]
    task.cancel()  # killed: no final publish, no commit
    await asyncio.gather(task, return_exceptions=True)
    successor = harness.brain()
    task2, stop2 = await _run(successor)
    again = (await harness.diagnoses(1))[0]
    assert again.diagnosis_id == first.diagnosis_id
    assert again.revision == 1
    stop2.set()
    await task2


@pytest.mark.looptime
@pytest.mark.asyncio
async def test_malformed_messages_go_to_the_dlq_while_good_ones_flow(harness: Harness) -> None:
    brain = harness.brain()
    task, stop = await _run(brain)
    await harness.bus.publish_raw(Topic.LOGS, "job:train/llama-70b", b"{not json")
    await harness.bus.publish_raw(Topic.LOGS, "job:train/llama-70b", b'{"v": 99, "key": "x", "payload": {}}')
    await harness.bus.publish_raw(Topic.LOGS, "job:train/llama-70b", b"\x00\xff" * 10)
    await harness.publish(Topic.KERNEL, kernel([XID79]))
    diag = (await harness.diagnoses(1))[0]
    assert diag.diagnosis.root_cause is not None and diag.diagnosis.root_cause.code == "xid:79"
    dead = []
    for _ in range(20):
        dead += await harness.dlq_consumer.getmany(timeout_ms=100)
        if len(dead) >= 3:
            break
    letters = [decode(r.value).payload for r in dead]
    reasons = sorted(p.reason for p in letters if isinstance(p, DeadLetter))
    assert len(reasons) == 3
    assert any("schema version" in r for r in reasons)
    stop.set()
    await task


@pytest.mark.looptime
@pytest.mark.asyncio
async def test_duplicate_events_are_processed_once(harness: Harness) -> None:
    brain = harness.brain()
    task, stop = await _run(brain)
    ev = make_event(kernel([XID79]), producer="test", at=harness.clock())
    for _ in range(3):
        await harness.bus.publish(Topic.KERNEL, ev)
    final = [d for d in await harness.diagnoses(2) if d.final]
    assert len(final) == 1
    assert final[0].diagnosis.findings[0].count == 1
    stop.set()
    await task


@pytest.mark.looptime
@pytest.mark.asyncio
async def test_pod_oom_killed_status_is_a_host_oom(harness: Harness) -> None:
    brain = harness.brain()
    task, stop = await _run(brain)
    status = PodStatus(
        namespace=JOB.namespace,
        pod="llama-70b-worker-0",
        node="gpu-node-c",
        job=JOB,
        rank=0,
        phase="Running",
        containers=[
            {
                "name": "trainer",
                "state": "terminated",
                "reason": "OOMKilled",
                "exit_code": 137,
                "signal": None,
                "restarts": 1,
                "oom_killed": True,
            }
        ],
    )
    await harness.publish(Topic.K8S, status)
    rc = (await harness.diagnoses(1))[0].diagnosis.root_cause
    assert rc is not None
    assert (rc.fault_class, rc.node) == ("host_oom", "gpu-node-c")
    stop.set()
    await task


@pytest.mark.looptime
@pytest.mark.asyncio
async def test_two_brains_split_the_jobs(harness: Harness) -> None:
    a, b = harness.brain(), harness.brain()
    ta, sa = await _run(a)
    tb, sb = await _run(b)
    jobs = [JobRef(namespace="train", name=f"job-{i}") for i in range(16)]
    for j in jobs:
        await harness.publish(Topic.KERNEL, KernelBatch(node=f"node-{j.name}", job=j, lines=[XID79]))
    firsts = [d for d in await harness.diagnoses(32) if not d.final]
    assert sorted(d.job.name for d in firsts if d.job) == sorted(j.name for j in jobs)
    assert a.diagnoses_published > 0 and b.diagnoses_published > 0
    sa.set()
    sb.set()
    await asyncio.gather(ta, tb)


@pytest.mark.looptime
@pytest.mark.asyncio
async def test_healthy_logs_produce_nothing(harness: Harness) -> None:
    brain = harness.brain()
    task, stop = await _run(brain)
    for start in range(0, 2000, 100):
        await harness.publish(Topic.LOGS, logs([f"[rank1]: step {i} loss 1.0" for i in range(start, start + 100)]))
    await asyncio.sleep(5)
    assert brain.processed == 20
    assert brain.diagnoses_published == 0
    group = harness.bus._groups["trainmedic-brain"]
    assert sum(off for tp, off in group.committed.items() if tp[0] == Topic.LOGS) == 20
    stop.set()
    await task


def test_corpus_lines_are_available() -> None:
    assert "Watchdog caught collective operation timeout" in _corpus("nccl_hang-2")
