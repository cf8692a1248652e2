"""What the k8s watcher renders for an interrupted job (a failed pod, a signal, a restart, a lost or
deleted node, a failed workload) and what the shipped rules make of each line."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from servers.kube import Cluster, EventRecorder

from trainmedic.agent.jobindex import JobIndex
from trainmedic.agent.watchers.k8s import (
    JOBS,
    PYTORCH_JOBS,
    VOLCANO_JOBS,
    ResourceSpec,
    node_status,
    node_status_lines,
    pod_digest,
    pod_status_entries,
    pod_status_lines,
    workload_status,
    workload_status_lines,
)
from trainmedic.detectors.engine import Engine
from trainmedic.events import JobRef, K8sEvent, NodeStatus

from .conftest import StartWatchers

NOW = "2026-11-25T08:00:00Z"
NOW_S = 1_795_593_600.0  # NOW in seconds


def _pod(containers: list[dict[str, Any]], *, status: dict[str, Any] | None = None, **meta: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "llama-1-x2b9q", "namespace": "train", "uid": "u-1", **meta},
        "spec": {"nodeName": "gpu-3", "containers": [{"name": "trainer"}]},
        "status": {"phase": "Running", "containerStatuses": containers, **(status or {})},
    }


def _terminated(exit_code: int, reason: str = "Error", signal: int | None = None, restarts: int = 0) -> dict[str, Any]:
    term: dict[str, Any] = {"exitCode": exit_code, "reason": reason, "startedAt": NOW, "finishedAt": NOW}
    if signal is not None:
        term["signal"] = signal
    return {"name": "trainer", "ready": False, "restartCount": restarts, "state": {"terminated": term}}


RUNNING = {"name": "trainer", "ready": True, "restartCount": 0, "state": {"running": {"startedAt": NOW}}}


def _found(engine: Engine, line: str) -> set[tuple[str, str]]:
    return {(f.fault_class.value, f.code) for f in engine.scan_text(line)}


@pytest.mark.parametrize(
    ("pod", "lines", "found"),
    [
        (
            _pod([_terminated(1)], status={"phase": "Failed"}),
            ["pod_status: container=trainer state=terminated reason=Error exit_code=1 signal=0 restarts=0"],
            {("unknown", "exit_1")},
        ),
        (
            _pod([_terminated(2, restarts=3)]),
            ["pod_status: container=trainer state=terminated reason=Error exit_code=2 signal=0 restarts=3"],
            {("unknown", "exit_2")},
        ),
        (
            _pod([_terminated(137, signal=9)]),
            ["pod_status: container=trainer state=terminated reason=Error exit_code=137 signal=9 restarts=0"],
            {("process_killed", "sigkill")},
        ),
        (
            _pod([_terminated(0, reason="Error", signal=9)]),
            ["pod_status: container=trainer state=terminated reason=Error exit_code=0 signal=9 restarts=0"],
            {("process_killed", "sigkill")},
        ),
        (
            _pod([_terminated(0, reason="Error", signal=15)]),
            ["pod_status: container=trainer state=terminated reason=Error exit_code=0 signal=15 restarts=0"],
            {("process_killed", "sigterm")},
        ),
        (
            _pod([_terminated(137, reason="OOMKilled")]),
            ["pod_status: container=trainer state=terminated reason=OOMKilled exit_code=137 signal=0 restarts=0"],
            {("host_oom", "oom_killed")},
        ),
        (
            _pod(
                [
                    {
                        "name": "trainer",
                        "ready": True,
                        "restartCount": 2,
                        "state": {"running": {"startedAt": NOW}},
                        "lastState": {"terminated": {"exitCode": 3, "reason": "Error", "finishedAt": NOW}},
                    }
                ]
            ),
            ["pod_status: container=trainer state=restarted reason=Error exit_code=3 signal=0 restarts=2"],
            {("unknown", "exit_3")},
        ),
        (
            _pod([RUNNING], status={"reason": "NodeLost"}, deletionTimestamp=NOW),
            ["pod_status: pod=llama-1-x2b9q phase=Running reason=NodeLost terminating=true node=gpu-3"],
            {("node_failure", "node_lost")},
        ),
        (
            _pod(
                [RUNNING],
                status={
                    "conditions": [{"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}]
                },
            ),
            ["pod_status: pod=llama-1-x2b9q phase=Running reason=PreemptionByScheduler terminating=false node=gpu-3"],
            {("process_killed", "preempted")},
        ),
        (_pod([RUNNING]), [], set()),
        (_pod([_terminated(0, reason="Completed")], status={"phase": "Succeeded"}), None, set()),
    ],
    ids=[
        "failed-exit-1",
        "crash-exit-2",
        "exit-137-signal-9",
        "signal-9",
        "signal-15",
        "oomkilled-stays-host-oom",
        "restart-count-up",
        "node-lost-terminating",
        "disruption-target",
        "running",
        "completed",
    ],
)
def test_pod_states_render_lines_the_rules_classify(
    pod: dict[str, Any], lines: list[str] | None, found: set[tuple[str, str]], shipped_engine: Engine
) -> None:
    status = pod_digest(pod).status()
    got = pod_status_lines(status, now=NOW_S, max_age_s=600)
    if lines is not None:
        assert got == lines
    assert set().union(*(_found(shipped_engine, line) for line in got)) == found


@pytest.mark.parametrize(("age_s", "lines"), [(10.0, 1), (3600.0, 0)], ids=["recent", "last-week"])
def test_an_old_termination_gives_no_line(age_s: float, lines: int) -> None:
    status = pod_digest(_pod([_terminated(1)])).status()
    assert len(pod_status_lines(status, now=NOW_S + age_s, max_age_s=600)) == lines
    assert len(pod_status_lines(status)) == 1  # without a clock, as before


def test_a_termination_keeps_its_identity_when_rendered_again() -> None:
    failed = pod_digest(_pod([_terminated(1)], status={"phase": "Failed"})).status()
    gone = failed.model_copy(update={"deleted": True})
    assert [i for i, _ in pod_status_entries(failed)] == [i for i, _ in pod_status_entries(gone)]


def _node(ready: str, reason: str, taints: list[dict[str, str]] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": "gpu-3", "labels": {"nvidia.com/gpu.present": "true"}},
        "spec": {"taints": taints or []},
        "status": {
            "capacity": {"nvidia.com/gpu": "8"},
            "conditions": [{"type": "Ready", "status": ready, "reason": reason}],
        },
    }


UNREACHABLE = [
    {"key": "node.kubernetes.io/unreachable", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"},
]


@pytest.mark.parametrize(
    ("node", "deleted", "line", "found"),
    [
        (
            _node("False", "KubeletNotReady"),
            False,
            "node_status: node=gpu-3 ready=False reason=KubeletNotReady deleted=false taints=-",
            {("node_failure", "node_not_ready")},
        ),
        (
            _node("Unknown", "NodeStatusUnknown", UNREACHABLE),
            False,
            "node_status: node=gpu-3 ready=Unknown reason=NodeStatusUnknown deleted=false "
            "taints=node.kubernetes.io/unreachable:NoSchedule,node.kubernetes.io/unreachable:NoExecute",
            {("node_failure", "kubelet_stopped"), ("node_failure", "node_unreachable")},
        ),
        (
            _node("True", "KubeletReady", [{"key": "node.kubernetes.io/not-ready", "effect": "NoExecute"}]),
            False,
            "node_status: node=gpu-3 ready=True reason=KubeletReady deleted=false "
            "taints=node.kubernetes.io/not-ready:NoExecute",
            {("node_failure", "node_not_ready")},
        ),
        (
            _node("True", "KubeletReady"),
            True,
            "node_status: node=gpu-3 ready=True reason=KubeletReady deleted=true taints=-",
            {("node_failure", "node_deleted")},
        ),
        (
            _node("True", "KubeletReady", [{"key": "trainmedic.io/unhealthy", "value": "xid", "effect": "NoSchedule"}]),
            False,
            None,
            set(),
        ),
    ],
    ids=["not-ready", "unknown-unreachable", "not-ready-taint", "deleted", "healthy-quarantined"],
)
def test_node_states_render_lines_the_rules_classify(
    node: dict[str, Any], deleted: bool, line: str | None, found: set[tuple[str, str]], shipped_engine: Engine
) -> None:
    status = node_status(node, plugin_resources={}).model_copy(update={"deleted": deleted})
    lines = node_status_lines(status)
    assert lines == ([line] if line else [])
    assert set().union(*(_found(shipped_engine, x) for x in lines)) == found
    for x in lines:
        assert {f.node for f in shipped_engine.scan_text(x)} == {"gpu-3"}


@pytest.mark.parametrize(
    ("event_line", "found"),
    [
        (
            "k8s_event: type=Warning reason=NodeNotReady object=Pod/llama-1-x2b9q message=Node is not ready",
            {("node_failure", "node_not_ready")},
        ),
        (
            "k8s_event: type=Normal reason=TaintManagerEviction object=Pod/llama-1-x2b9q "
            "message=Marking for deletion Pod train/llama-1-x2b9q",
            {("node_failure", "node_unreachable")},
        ),
        (
            "k8s_event: type=Normal reason=NodeNotReady object=Node/gpu-3 "
            "message=Node gpu-3 status is now: NodeNotReady",
            set(),
        ),
    ],
    ids=["node-not-ready-on-pod", "taint-manager-eviction", "node-object-event"],
)
def test_node_lifecycle_events(event_line: str, found: set[tuple[str, str]], shipped_engine: Engine) -> None:
    assert _found(shipped_engine, event_line) == found


def _job_failed(reason: str) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "llama", "namespace": "train"},
        "spec": {"parallelism": 2},
        "status": {"conditions": [{"type": "Failed", "status": "True", "reason": reason}]},
    }


@pytest.mark.parametrize(
    ("spec", "obj", "line"),
    [
        (
            JOBS,
            _job_failed("BackoffLimitExceeded"),
            "job_status: kind=Job job=train/llama phase=Failed reason=BackoffLimitExceeded",
        ),
        (
            JOBS,
            _job_failed("DeadlineExceeded"),
            "job_status: kind=Job job=train/llama phase=Failed reason=DeadlineExceeded",
        ),
        (
            VOLCANO_JOBS,
            {
                "metadata": {"name": "qwen", "namespace": "train"},
                "spec": {"minAvailable": 2},
                "status": {"state": {"phase": "Failed", "reason": "PodFailed"}},
            },
            "job_status: kind=Job job=train/qwen phase=Failed reason=PodFailed",
        ),
        (
            PYTORCH_JOBS,
            {
                "metadata": {"name": "bert", "namespace": "train"},
                "spec": {"pytorchReplicaSpecs": {"Master": {"replicas": 1}}},
                "status": {"conditions": [{"type": "Failed", "status": "True", "reason": "PyTorchJobFailed"}]},
            },
            "job_status: kind=PyTorchJob job=train/bert phase=Failed reason=PyTorchJobFailed",
        ),
    ],
    ids=["job-backoff", "job-deadline", "volcano-failed", "pytorchjob-failed"],
)
def test_failed_workloads(spec: ResourceSpec, obj: dict[str, Any], line: str, shipped_engine: Engine) -> None:
    status = workload_status(spec, obj)
    assert workload_status_lines(status) == [line]
    assert _found(shipped_engine, line) == {("unknown", "job_failed")}
    assert workload_status_lines(status.model_copy(update={"deleted": True})) == []
    assert workload_status_lines(status.model_copy(update={"phase": "Running"})) == []


# -- through the watchers against the emulator: a lost node reaches the jobs on it -------------------------


async def _job_on(cluster: Cluster, start_watchers: StartWatchers, node: str) -> dict[str, Any]:
    await cluster.add_node(node, gpus=8)
    await cluster.add_node("gpu-9", gpus=8)
    job = await cluster.create_job("train", "llama", completions=1)
    (pod,) = await cluster.create_job_pods(job)
    await start_watchers(resources=["pods", "events", "nodes"])
    await cluster.bind(pod, node)
    await cluster.start(pod)
    return pod


@pytest.mark.asyncio
async def test_a_lost_node_is_published_once_more_per_job_on_it(
    cluster: Cluster, start_watchers: StartWatchers, recorder: EventRecorder, job_index: JobIndex
) -> None:
    await _job_on(cluster, start_watchers, "gpu-1")
    while not job_index.jobs_on_node("gpu-1"):
        await asyncio.sleep(0.01)
    mark = recorder.mark()
    await cluster.lose_node("gpu-1")
    await recorder.wait_for(lambda p: isinstance(p, NodeStatus) and p.job is not None, since=mark)
    await recorder.wait_for(lambda p: isinstance(p, K8sEvent) and p.reason == "NodeNotReady", since=mark)
    lost = {
        e.key: (e.id, e.payload)
        for _, e in recorder.events[mark:]
        if isinstance(e.payload, NodeStatus) and e.payload.conditions.get("Ready") == "Unknown"
    }
    assert "node:gpu-1" in lost and "job:train/llama" in lost
    assert lost["job:train/llama"][0] == lost["node:gpu-1"][0], "copies of one event"
    assert lost["job:train/llama"][1].job == JobRef(namespace="train", name="llama")
    assert lost["node:gpu-1"][1].reasons["Ready"] == "NodeStatusUnknown"
    not_ready = next(p for p in recorder.payloads(K8sEvent, since=mark) if p.reason == "NodeNotReady")
    assert (not_ready.job, not_ready.node) == (JobRef(namespace="train", name="llama"), "gpu-1")


@pytest.mark.asyncio
async def test_a_deleted_node_reaches_its_jobs_a_healthy_change_does_not(
    cluster: Cluster, start_watchers: StartWatchers, recorder: EventRecorder, job_index: JobIndex
) -> None:
    await _job_on(cluster, start_watchers, "gpu-1")
    while not job_index.jobs_on_node("gpu-1"):
        await asyncio.sleep(0.01)
    mark = recorder.mark()
    await cluster.cordon("gpu-1")
    await recorder.wait_for(lambda p: isinstance(p, NodeStatus) and p.unschedulable, since=mark)
    assert [p for p in recorder.payloads(NodeStatus, since=mark) if p.job is not None] == []
    await cluster.delete("v1/nodes", None, "gpu-1")
    gone = await recorder.wait_for(lambda p: isinstance(p, NodeStatus) and p.deleted and p.job is not None)
    assert node_status_lines(gone) == ["node_status: node=gpu-1 ready=True reason=KubeletReady deleted=true taints=-"]
