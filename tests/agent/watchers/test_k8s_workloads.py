"""Training workloads -> WorkloadStatus (batch/v1 Job, Volcano Job, Kubeflow PyTorchJob), and a
workload API that is not installed (its CRD missing) tolerated."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pytest
from servers.kube import Cluster, EventRecorder, KubeEmulator, require_kmock, wait_event, wait_until

from trainmedic.agent.jobindex import JobIndex
from trainmedic.agent.telemetry import Telemetry
from trainmedic.agent.watchers.k8s import KubeWatchers
from trainmedic.events import JobRef, PodStatus, WorkloadStatus

from .conftest import FAST, StartWatchers

pytestmark = pytest.mark.asyncio


@dataclass
class Case:
    resource: str
    ref: JobRef
    replicas: int
    phases: list[str]
    # Each step moves the workload on (as its controller would); phases[i + 1] is expected after step i.
    create: Callable[[Cluster], Awaitable[dict[str, Any]]]
    steps: list[Callable[[Cluster, dict[str, Any]], Awaitable[None]]]


async def _make_job(c: Cluster) -> dict[str, Any]:
    return await c.create_job("train", "llama", completions=4)


async def _make_vcjob(c: Cluster) -> dict[str, Any]:
    return await c.create_volcano_job("train", "vc", {"master": 1, "worker": 3})


async def _make_pytorchjob(c: Cluster) -> dict[str, Any]:
    return await c.create_pytorchjob("train", "pt", masters=1, workers=3)


CASES = {
    "batch-job": Case(
        "jobs",
        JobRef(namespace="train", name="llama"),
        4,
        ["Pending", "Running", "Failed"],
        _make_job,
        [
            lambda c, j: c.set_job_status(j, {"active": 4}),
            lambda c, j: c.set_job_status(
                j,
                {
                    "active": 0,
                    "failed": 1,
                    "conditions": [
                        {"type": "FailureTarget", "status": "True", "reason": "BackoffLimitExceeded"},
                        {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"},
                    ],
                },
            ),
        ],
    ),
    "volcano": Case(
        "volcanojobs",
        JobRef(namespace="train", name="vc", kind="Job", api_version="batch.volcano.sh/v1alpha1"),
        4,
        ["Pending", "Running", "Aborted"],
        _make_vcjob,
        [
            lambda c, j: c.set_volcano_phase(j, "Running", running=4),
            lambda c, j: c.set_volcano_phase(j, "Aborted"),
        ],
    ),
    "pytorchjob": Case(
        "pytorchjobs",
        JobRef(namespace="train", name="pt", kind="PyTorchJob", api_version="kubeflow.org/v1"),
        4,
        ["Created", "Running", "Failed"],
        _make_pytorchjob,
        [
            lambda c, j: c.set_pytorchjob_condition(j, "Running"),
            lambda c, j: c.set_pytorchjob_condition(j, "Failed", reason="PyTorchJobFailed"),
        ],
    ),
}


@pytest.mark.parametrize("case", list(CASES.values()), ids=list(CASES))
async def test_workload_phase_and_replicas(
    case: Case, cluster: Cluster, start_watchers: StartWatchers, recorder: EventRecorder
) -> None:
    obj = await case.create(cluster)
    await start_watchers(resources=[case.resource])
    (first,) = recorder.payloads(WorkloadStatus)
    assert (first.job, first.phase, first.replicas) == (case.ref, case.phases[0], case.replicas)
    for step, phase in zip(case.steps, case.phases[1:], strict=True):
        mark = recorder.mark()
        await step(cluster, obj)
        st = await recorder.wait_for(lambda p: isinstance(p, WorkloadStatus), since=mark)
        assert (st.job, st.phase) == (case.ref, phase)
    name = case.ref.name
    api = {
        "jobs": "batch/v1/jobs",
        "volcanojobs": "batch.volcano.sh/v1alpha1/jobs",
        "pytorchjobs": "kubeflow.org/v1/pytorchjobs",
    }
    await cluster.delete(api[case.resource], "train", name)
    gone = await recorder.wait_for(lambda p: isinstance(p, WorkloadStatus) and p.deleted)
    assert gone.job == case.ref
    assert recorder.events[-1][1].key == case.ref.key


async def test_unchanged_workload_is_not_republished(
    cluster: Cluster, start_watchers: StartWatchers, recorder: EventRecorder
) -> None:
    job = await cluster.create_job("train", "llama", completions=2)
    await start_watchers(resources=["jobs"])
    mark = recorder.mark()
    await cluster.set_job_status(job, {"startTime": "2025-01-01T00:00:00Z"})  # nothing a WorkloadStatus carries
    await cluster.set_job_status(job, {"active": 2})
    await recorder.wait_for(lambda p: isinstance(p, WorkloadStatus), since=mark)
    assert [p.phase for p in recorder.payloads(WorkloadStatus, since=mark)] == ["Running"]


def _count(telemetry: Telemetry, source: str, kind: str) -> float:
    value = telemetry.registry.get_sample_value("trainmedic_watch_errors_total", {"source": source, "kind": kind})
    return value or 0.0


async def test_missing_crds_are_tolerated_logged_once_and_picked_up_when_installed(
    recorder: EventRecorder, telemetry: Telemetry, caplog: pytest.LogCaptureFixture
) -> None:
    require_kmock()
    caplog.set_level(logging.INFO, logger="trainmedic.watchers.k8s")
    async with KubeEmulator(crds=()) as kube:
        cluster = Cluster(kube)
        await cluster.create_pod("train", "p0", labels={"job-name": "llama"})
        w = KubeWatchers(kube.api_client(), bus=recorder, job_index=JobIndex(), telemetry=telemetry, settings=FAST)
        task = asyncio.create_task(w.run())
        try:
            await wait_event(w.ready, what="watchers ready")
            states = w.states()
            # "listing" while a re-check is under way
            assert states["volcanojobs"] in ("missing", "listing") and states["pytorchjobs"] in ("missing", "listing")
            assert states["pods"] == "watching"
            assert [p.pod for p in recorder.payloads(PodStatus)] == ["p0"]
            # Re-checked slowly, logged once.
            await wait_until(lambda: _count(telemetry, "k8s/volcanojobs", "missing") >= 3, what="three re-checks")
            warnings = [r for r in caplog.records if r.levelno == logging.WARNING and "volcano" in r.getMessage()]
            assert len(warnings) == 1
            assert "batch.volcano.sh" in warnings[0].getMessage()

            kube.install_crd("volcanojobs")
            vc = await cluster.create_volcano_job("train", "vc")
            st = await recorder.wait_for(lambda p: isinstance(p, WorkloadStatus) and p.job.name == "vc")
            assert st.phase == "Pending"
            await wait_until(lambda: w.states()["volcanojobs"] == "watching", what="volcano jobs watched")
            await cluster.set_volcano_phase(vc, "Running")
            await recorder.wait_for(lambda p: isinstance(p, WorkloadStatus) and p.phase == "Running")
            assert w.states()["pytorchjobs"] in ("missing", "listing")
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
