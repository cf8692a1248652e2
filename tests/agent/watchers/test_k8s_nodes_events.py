"""Nodes -> NodeStatus and core/v1 Events -> K8sEvent, through the watchers against the emulator."""

from __future__ import annotations

import time
from typing import Any

import pytest
from servers.kube import Cluster, EventRecorder, KubeEmulator

from trainmedic.agent.watchers.k8s import k8s_event_line
from trainmedic.detectors.engine import Engine
from trainmedic.events import JobRef, K8sEvent, NodeStatus

from .conftest import StartWatchers

pytestmark = pytest.mark.asyncio


@pytest.mark.parametrize(
    ("node", "expected_chip", "expected_accelerators"),
    [
        ({"gpus": 8, "labels": {"nvidia.com/gpu.present": "true"}}, "nvidia", {"nvidia.com/gpu": 8}),
        ({"gpus": 8}, "nvidia", {"nvidia.com/gpu": 8}),
        ({"ascend": 8, "labels": {"accelerator": "huawei-Ascend910"}}, "ascend", {"huawei.com/Ascend910": 8}),
        ({"capacity": {"huawei.com/Ascend310P": "4"}}, "ascend", {"huawei.com/Ascend310P": 4}),
        ({"mlus": 4}, "cambricon", {"cambricon.com/mlu": 4}),
        (
            {"capacity": {"cambricon.com/mlu370.smlu.vmemory": "16"}},
            "cambricon",
            {"cambricon.com/mlu370.smlu.vmemory": 16},
        ),
        ({}, None, {}),
    ],
    ids=["nvidia-labels", "nvidia-capacity", "ascend-labels", "ascend-310p", "cambricon", "cambricon-smlu", "cpu-only"],
)
async def test_node_accelerators_and_chip(
    node: dict[str, Any],
    expected_chip: str | None,
    expected_accelerators: dict[str, int],
    cluster: Cluster,
    start_watchers: StartWatchers,
    recorder: EventRecorder,
) -> None:
    await cluster.add_node("n1", **node)
    await start_watchers(resources=["nodes"])
    (st,) = recorder.payloads(NodeStatus)
    assert (st.node, st.chip, st.accelerators) == ("n1", expected_chip, expected_accelerators)
    assert st.conditions == {
        "Ready": "True",
        "MemoryPressure": "False",
        "DiskPressure": "False",
        "PIDPressure": "False",
    }


async def test_node_conditions_taints_and_cordon_are_published_heartbeats_are_not(
    cluster: Cluster, start_watchers: StartWatchers, recorder: EventRecorder
) -> None:
    await cluster.add_node(
        "gpu-1", gpus=8, taints=[{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]
    )
    await start_watchers(resources=["nodes"])
    (first,) = recorder.payloads(NodeStatus)
    assert first.taints == ["nvidia.com/gpu=present:NoSchedule"] and not first.unschedulable

    mark = recorder.mark()
    await cluster.heartbeat("gpu-1")
    await cluster.heartbeat("gpu-1")
    await cluster.set_node_conditions("gpu-1", {"Ready": "False"}, ready=False)
    down = await recorder.wait_for(lambda p: isinstance(p, NodeStatus), since=mark)
    assert down.conditions["Ready"] == "False"
    assert len(recorder.payloads(NodeStatus, since=mark)) == 1  # the heartbeats came first and were not published

    await cluster.taint(
        "gpu-1",
        [
            {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},
            {"key": "trainmedic.io/quarantine", "effect": "NoExecute"},
        ],
    )
    tainted = await recorder.wait_for(lambda p: isinstance(p, NodeStatus) and len(p.taints) == 2)
    assert tainted.taints[1] == "trainmedic.io/quarantine:NoExecute"
    await cluster.cordon("gpu-1")
    cordoned = await recorder.wait_for(lambda p: isinstance(p, NodeStatus) and p.unschedulable)
    assert cordoned.node == "gpu-1"


async def test_deleted_node_is_published(
    cluster: Cluster, start_watchers: StartWatchers, recorder: EventRecorder
) -> None:
    await cluster.add_node("gpu-1", gpus=8)
    await start_watchers(resources=["nodes"])
    await cluster.delete("v1/nodes", None, "gpu-1")
    gone = await recorder.wait_for(lambda p: isinstance(p, NodeStatus) and p.deleted)
    assert (gone.node, gone.accelerators) == ("gpu-1", {"nvidia.com/gpu": 8})


async def test_pod_events_carry_the_job_and_node(
    cluster: Cluster, start_watchers: StartWatchers, recorder: EventRecorder
) -> None:
    job = await cluster.create_job("train", "llama", completions=1)
    (pod,) = await cluster.create_job_pods(job)
    await start_watchers(resources=["pods", "events"])
    await cluster.bind(pod, "gpu-1")
    await cluster.start(pod)
    await cluster.terminate(pod, "trainer", reason="Error", exit_code=1, restart=True)
    backoff = await recorder.wait_for(lambda p: isinstance(p, K8sEvent) and p.reason == "BackOff")
    assert backoff.job == JobRef(namespace="train", name="llama")
    assert (backoff.type, backoff.object_kind, backoff.object_name, backoff.node) == (
        "Warning",
        "Pod",
        pod["metadata"]["name"],
        "gpu-1",
    )
    reasons = [e.reason for e in recorder.payloads(K8sEvent)]
    assert reasons[:4] == ["Scheduled", "Pulled", "Created", "Started"]
    keys = {e.key for _, e in recorder.events if isinstance(e.payload, K8sEvent)}
    assert keys == {"job:train/llama"}


async def test_node_oom_event_is_keyed_by_node_and_matches_the_rule(
    cluster: Cluster, start_watchers: StartWatchers, recorder: EventRecorder, shipped_engine: Engine
) -> None:
    await start_watchers(resources=["events"])
    await cluster.node_oom("gpu-7", "Memory cgroup out of memory: Killed process 4321 (python)\ntotal-vm:98765432kB")
    ev = await recorder.wait_for(lambda p: isinstance(p, K8sEvent))
    assert (ev.node, ev.job, ev.object_kind) == ("gpu-7", None, "Node")
    assert recorder.events[-1][1].key == "node:gpu-7"
    line = k8s_event_line(ev)
    assert "\n" not in line
    assert "generic.host_oom.pod_oomkilled" in {f.rule_id for f in shipped_engine.scan_text(line)}


async def test_events_are_deduplicated_by_uid_and_count(
    kube: KubeEmulator, cluster: Cluster, start_watchers: StartWatchers, recorder: EventRecorder
) -> None:
    await start_watchers(resources=["events"])
    ev = await cluster.event("train", kind="Pod", name="p", reason="BackOff", message="back-off", type="Warning")
    await recorder.wait_for(lambda p: isinstance(p, K8sEvent) and p.count == 1)
    await cluster.bump_event(ev, 2)
    bumped = await recorder.wait_for(lambda p: isinstance(p, K8sEvent) and p.count == 2)
    assert bumped.uid == ev["metadata"]["uid"]
    # A reconnect lists (and the emulator's new watch replays) every event again: nothing republished.
    mark = recorder.mark()
    await kube.pause()
    await kube.resume()
    await cluster.event("train", kind="Pod", name="p", reason="Killing", message="Stopping container trainer")
    await recorder.wait_for(lambda p: isinstance(p, K8sEvent) and p.reason == "Killing", since=mark, timeout=15)
    assert [e.reason for e in recorder.payloads(K8sEvent, since=mark)] == ["Killing"]


async def test_old_events_from_the_first_list_are_not_published(
    cluster: Cluster, start_watchers: StartWatchers, recorder: EventRecorder
) -> None:
    await cluster.event("train", kind="Pod", name="p", reason="OOMKilling", message="old", at=time.time() - 3600)
    await cluster.event("train", kind="Pod", name="p", reason="Started", message="new")
    await start_watchers(resources=["events"])
    assert [e.message for e in recorder.payloads(K8sEvent)] == ["new"]


async def test_events_listed_at_start_find_the_job_of_their_pod(
    cluster: Cluster, start_watchers: StartWatchers, recorder: EventRecorder
) -> None:
    job = await cluster.create_job("train", "llama", completions=1)
    (pod,) = await cluster.create_job_pods(job)
    await cluster.bind(pod, "gpu-1")  # a Scheduled event before the agent starts
    await start_watchers(resources=["events", "pods"])  # events listed only once the pods are
    (scheduled,) = recorder.payloads(K8sEvent)
    assert (scheduled.reason, scheduled.job) == ("Scheduled", JobRef(namespace="train", name="llama"))


@pytest.mark.parametrize(("pod_there", "published"), [(True, True), (False, False)], ids=["pod-there", "pod-gone"])
async def test_events_from_before_the_start_about_gone_pods_are_history(
    cluster: Cluster, start_watchers: StartWatchers, recorder: EventRecorder, pod_there: bool, published: bool
) -> None:
    """A NodeNotReady the node lifecycle controller recorded on a pod that has since been deleted,
    replayed by the first list after a restart, says nothing about the cluster now."""
    name = "gone-0"
    if pod_there:
        job = await cluster.create_job("train", "llama", completions=1)
        (pod,) = await cluster.create_job_pods(job)
        name = pod["metadata"]["name"]
    await cluster.event(
        "train", kind="Pod", name=name, reason="NodeNotReady", message="Node is not ready", type="Warning",
        at=time.time() - 120,
    )  # fmt: skip
    await start_watchers(resources=["events", "pods"])
    assert [e.reason for e in recorder.payloads(K8sEvent)] == (["NodeNotReady"] if published else [])


@pytest.mark.parametrize("listed", [True, False], ids=["listed-at-start", "live"])
async def test_an_event_about_an_earlier_pod_of_the_same_name_is_not_the_current_pods(
    cluster: Cluster, start_watchers: StartWatchers, recorder: EventRecorder, listed: bool
) -> None:
    """Controllers name pods after their workload (`<job>-worker-0`), so a workload recreated under
    its name has pods of the names its earlier incarnation had. An event recorded on one of those
    earlier pods (its uid) says nothing about the pod of that name now: a NodeNotReady the node
    lifecycle controller recorded on it before it was deleted is not the new pod's node, and is
    history when listed at start."""
    job = await cluster.create_job("train", "llama", completions=1)
    (pod,) = await cluster.create_job_pods(job)
    await cluster.bind(pod, "gpu-1")
    name = pod["metadata"]["name"]
    earlier = "0f0e0d0c-0000-4000-8000-00000000dead"
    assert pod["metadata"]["uid"] != earlier

    async def not_ready() -> None:
        await cluster.event(
            "train", kind="Pod", name=name, involved_uid=earlier, reason="NodeNotReady",
            message="Node is not ready", type="Warning", at=time.time() - (30 if listed else 0),
        )  # fmt: skip

    if listed:
        await not_ready()
        await start_watchers(resources=["events", "pods"])
        assert [e.reason for e in recorder.payloads(K8sEvent)] == ["Scheduled"]
    else:
        await start_watchers(resources=["events", "pods"])
        await not_ready()
        ev = await recorder.wait_for(lambda p: isinstance(p, K8sEvent) and p.reason == "NodeNotReady")
        assert (ev.job, ev.node, ev.object_name) == (None, None, name)
