"""Every interruption becomes a diagnosis: a pod that failed with only an exit code, a node that went
NotReady under a job, a failed workload; a real cause found in the logs still wins, and an `unknown`
diagnosis carries the ranks' last error lines and the exit codes.

Time is looptime's fake loop time (the brain's clock is the loop clock)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from trainmedic.agent.brain import Brain, BrainSettings
from trainmedic.agent.bus.memory import MemoryBus
from trainmedic.events import (
    DiagnosisEvent,
    Event,
    JobRef,
    K8sEvent,
    LogBatch,
    NodeStatus,
    Payload,
    PodStatus,
    Topic,
    WorkloadStatus,
    decode,
    make_event,
)

JOB = JobRef(namespace="train", name="llama-70b")
WINDOW_S = 30.0
CUDA_OOM = (
    "[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.96 GiB. GPU 0 has a total capacity "
    "of 79.11 GiB of which 1.02 GiB is free."
)
ERROR_LINES = ["[rank1]: Traceback (most recent call last):", "[rank1]: ERROR loader: giving up after 3 tries"]


def failed_pod(exit_code: int = 1, *, pod: str = "llama-70b-worker-1", deleted: bool = False) -> PodStatus:
    return PodStatus(
        namespace=JOB.namespace,
        pod=pod,
        uid=f"uid-{pod}",
        node="gpu-node-b",
        job=JOB,
        rank=1,
        phase="Failed",
        deleted=deleted,
        containers=[
            {"name": "trainer", "state": "terminated", "reason": "Error", "exit_code": exit_code, "restarts": 0}
        ],
    )


def lost_node(node: str = "gpu-node-b") -> NodeStatus:
    return NodeStatus(
        node=node,
        job=JOB,
        conditions={"Ready": "Unknown"},
        reasons={"Ready": "NodeStatusUnknown"},
        taints=["node.kubernetes.io/unreachable:NoSchedule", "node.kubernetes.io/unreachable:NoExecute"],
    )


def logs(lines: list[str]) -> LogBatch:
    return LogBatch(
        node="gpu-node-b",
        namespace=JOB.namespace,
        pod="llama-70b-worker-1",
        container="trainer",
        job=JOB,
        rank=1,
        lines=lines,
    )


class Harness:
    def __init__(self, bus: MemoryBus) -> None:
        self.bus = bus
        self.clock = asyncio.get_running_loop().time
        self.diag = bus.consumer([Topic.DIAGNOSES], "observer")
        self.stop: asyncio.Event | None = None
        self.task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        brain = Brain(self.bus, settings=BrainSettings(window_s=WINDOW_S, tick_s=0.5), clock=self.clock)
        self.stop = asyncio.Event()
        self.task = asyncio.create_task(brain.run(self.stop))
        await brain.ready.wait()

    async def publish(self, payload: Payload) -> Event:
        topic = Topic.LOGS if isinstance(payload, LogBatch) else Topic.K8S
        ev = make_event(payload, producer="test", at=self.clock())
        await self.bus.publish(topic, ev)
        return ev

    async def final(self, timeout: float = 300) -> DiagnosisEvent:
        async def wait() -> DiagnosisEvent:
            while True:
                for r in await self.diag.getmany(timeout_ms=100):
                    p = decode(r.value).payload
                    assert isinstance(p, DiagnosisEvent)
                    if p.final:
                        return p

        return await asyncio.wait_for(wait(), timeout)

    async def finals(self, seconds: float) -> list[DiagnosisEvent]:
        out: list[DiagnosisEvent] = []
        end = self.clock() + seconds
        while self.clock() < end:
            for r in await self.diag.getmany(timeout_ms=100):
                p = decode(r.value).payload
                assert isinstance(p, DiagnosisEvent)
                if p.final:
                    out.append(p)
        return out


@pytest_asyncio.fixture
async def harness() -> AsyncIterator[Harness]:
    h = Harness(MemoryBus(partitions=4))
    await h.diag.start()
    yield h
    if h.stop is not None:
        h.stop.set()
        assert h.task is not None
        await h.task


@pytest.mark.looptime
@pytest.mark.asyncio
async def test_a_pod_that_failed_with_only_an_exit_code_is_unknown_with_its_evidence(harness: Harness) -> None:
    await harness.start()
    await harness.publish(logs(["[rank1]: step 3 loss 2.1", *ERROR_LINES]))
    await harness.publish(failed_pod(3))
    d = await harness.final()
    rc = d.diagnosis.root_cause
    assert rc is not None and (rc.fault_class.value, rc.code) == ("unknown", "exit_3")
    assert d.job == JOB
    assert d.exit_codes == {"llama-70b-worker-1/trainer": 3}
    assert d.error_lines == {"rank 1": ERROR_LINES}


@pytest.mark.looptime
@pytest.mark.asyncio
async def test_a_failed_workload_alone_is_unknown(harness: Harness) -> None:
    await harness.start()
    await harness.publish(WorkloadStatus(job=JOB, phase="Failed", reason="BackoffLimitExceeded"))
    d = await harness.final()
    rc = d.diagnosis.root_cause
    assert rc is not None and (rc.fault_class.value, rc.code) == ("unknown", "job_failed")


@pytest.mark.looptime
@pytest.mark.asyncio
async def test_a_node_gone_not_ready_under_the_job_is_a_node_failure_naming_the_node(harness: Harness) -> None:
    await harness.start()
    await harness.publish(lost_node())
    d = await harness.final()
    rc = d.diagnosis.root_cause
    assert rc is not None and rc.fault_class.value == "node_failure"
    assert rc.code in ("kubelet_stopped", "node_unreachable")
    assert rc.node == "gpu-node-b" and d.job == JOB
    assert d.error_lines == {} and d.exit_codes == {}, "evidence lines are for unknown diagnoses"


@pytest.mark.looptime
@pytest.mark.asyncio
async def test_a_node_without_a_job_is_no_interruption(harness: Harness) -> None:
    await harness.start()
    await harness.publish(lost_node().model_copy(update={"job": None}))
    assert await harness.finals(3 * WINDOW_S) == []


@pytest.mark.looptime
@pytest.mark.asyncio
async def test_the_same_node_state_is_told_once(harness: Harness) -> None:
    await harness.start()
    await harness.publish(lost_node())
    await harness.final()
    # trainmedic's own quarantine changes the node (cordon, taint): the line is the same.
    await harness.publish(lost_node().model_copy(update={"unschedulable": True}))
    assert await harness.finals(3 * WINDOW_S) == []


@pytest.mark.parametrize("log_first", [True, False], ids=["log-first", "pod-first"])
@pytest.mark.looptime
@pytest.mark.asyncio
async def test_a_cuda_oom_line_outranks_the_pods_exit_code(harness: Harness, log_first: bool) -> None:
    await harness.start()
    if log_first:
        await harness.publish(logs([CUDA_OOM]))
        await asyncio.sleep(2)
        await harness.publish(failed_pod(1))
    else:
        await harness.publish(failed_pod(1))
        await asyncio.sleep(2)
        await harness.publish(logs([CUDA_OOM]))
    d = await harness.final()
    rc = d.diagnosis.root_cause
    assert rc is not None and rc.fault_class.value == "accelerator_oom"
    assert d.error_lines == {} and d.exit_codes == {}


@pytest.mark.looptime
@pytest.mark.asyncio
async def test_an_unknown_window_waits_for_the_line_that_explains_it(harness: Harness) -> None:
    """The window is due at 30 s, but an exit code came at 29 s: it stays open (settle_s) and the
    CUDA OOM line shipped at 31 s settles it."""
    await harness.start()
    await harness.publish(WorkloadStatus(job=JOB, phase="Failed", reason="BackoffLimitExceeded"))
    await asyncio.sleep(WINDOW_S - 1)
    await harness.publish(failed_pod(1))
    await asyncio.sleep(2)
    await harness.publish(logs([CUDA_OOM]))
    d = await harness.final()
    rc = d.diagnosis.root_cause
    assert rc is not None and rc.fault_class.value == "accelerator_oom"
    assert await harness.finals(3 * WINDOW_S) == []


@pytest.mark.looptime
@pytest.mark.asyncio
async def test_a_termination_rendered_again_is_taken_once(harness: Harness) -> None:
    await harness.start()
    await harness.publish(failed_pod(1))
    await harness.final()
    # The pod deleted later (the job restarted): the same termination, no second diagnosis.
    await harness.publish(failed_pod(1, deleted=True))
    assert await harness.finals(3 * WINDOW_S) == []


def test_the_scene_keeps_the_evidence_of_an_unknown_diagnosis() -> None:
    from trainmedic.models import Diagnosis
    from trainmedic.remediations.scene import _findings_doc

    d = DiagnosisEvent(
        diagnosis_id="d1",
        job=JOB,
        window_start=0.0,
        window_end=1.0,
        diagnosis=Diagnosis(root_cause=None, findings=[]),
        error_lines={"rank 1": ERROR_LINES},
        exit_codes={"llama-70b-worker-1/trainer": 3},
    )
    doc = _findings_doc(d, [], {})
    assert doc["error_lines"] == {"rank 1": ERROR_LINES}
    assert doc["exit_codes"] == {"llama-70b-worker-1/trainer": 3}


def evicted(node: str = "gpu-node-b") -> K8sEvent:
    return K8sEvent(
        namespace=JOB.namespace,
        type="Normal",
        reason="TaintManagerEviction",
        message="Marking for deletion Pod train/llama-70b-worker-1",
        object_kind="Pod",
        object_name="llama-70b-worker-1",
        node=node,
        job=JOB,
    )


@pytest.mark.looptime
@pytest.mark.asyncio
async def test_a_job_is_told_once_about_the_loss_of_a_node_until_it_is_healthy(harness: Harness) -> None:
    await harness.start()
    await harness.publish(lost_node())
    await harness.final()
    # Minutes later the taint manager evicts the old pods: the same loss, no second incident.
    await asyncio.sleep(300)
    await harness.publish(evicted())
    assert await harness.finals(3 * WINDOW_S) == []
    # The node is back (its node-keyed status), then lost again: a new diagnosis.
    await harness.publish(NodeStatus(node="gpu-node-b", conditions={"Ready": "True"}))
    await asyncio.sleep(1)
    await harness.publish(lost_node())
    d = await harness.final()
    assert d.diagnosis.root_cause is not None and d.diagnosis.root_cause.fault_class.value == "node_failure"
