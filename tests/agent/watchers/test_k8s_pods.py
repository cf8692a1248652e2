"""Pods -> JobIndex + PodStatus, through the watchers against the kmock emulator; the test plays the
workload controllers, the scheduler and the kubelet (tests/servers/kube.py)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from servers.kube import Cluster, EventRecorder, KubeEmulator

from trainmedic.agent.jobindex import JobIndex
from trainmedic.agent.watchers.k8s import pod_status_lines
from trainmedic.events import JobRef, PodStatus, Topic

from .conftest import StartWatchers

pytestmark = pytest.mark.asyncio

Built = tuple[list[dict[str, Any]], JobRef | None, list[int | None]]


async def indexed_job(c: Cluster) -> Built:
    job = await c.create_job("train", "llama", completions=2)
    return await c.create_job_pods(job), JobRef(namespace="train", name="llama"), [0, 1]


async def volcano_job(c: Cluster) -> Built:
    vc = await c.create_volcano_job("train", "vc", {"master": 1, "worker": 2})
    ref = JobRef(namespace="train", name="vc", kind="Job", api_version="batch.volcano.sh/v1alpha1")
    return await c.create_volcano_pods(vc), ref, [0, 1, 2]


async def pytorch_job(c: Cluster) -> Built:
    pj = await c.create_pytorchjob("train", "pt", masters=1, workers=2)
    ref = JobRef(namespace="train", name="pt", kind="PyTorchJob", api_version="kubeflow.org/v1")
    return await c.create_pytorchjob_pods(pj), ref, [0, 1, 2]


async def pytorch_job_labels_only(c: Cluster) -> Built:
    # No RANK env in the spec: the replica-type/replica-index labels give master 0, workers 1..n.
    pj = await c.create_pytorchjob("train", "pt2", masters=1, workers=2)
    ref = JobRef(namespace="train", name="pt2", kind="PyTorchJob", api_version="kubeflow.org/v1")
    return await c.create_pytorchjob_pods(pj, rank_env=False), ref, [0, 1, 2]


async def bare_pod(c: Cluster) -> Built:
    return [await c.create_pod("train", "notebook")], None, [None]


BUILDERS: dict[str, Callable[[Cluster], Awaitable[Built]]] = {
    "indexed-job": indexed_job,
    "volcano": volcano_job,
    "pytorchjob": pytorch_job,
    "pytorchjob-labels": pytorch_job_labels_only,
    "bare-pod": bare_pod,
}


def running(name: str) -> Callable[[Any], bool]:
    return lambda p: isinstance(p, PodStatus) and p.pod == name and p.phase == "Running"


@pytest.mark.parametrize("build", list(BUILDERS.values()), ids=list(BUILDERS))
async def test_pod_status_carries_job_rank_and_node(
    build: Callable[[Cluster], Awaitable[Built]],
    cluster: Cluster,
    start_watchers: StartWatchers,
    recorder: EventRecorder,
    job_index: JobIndex,
) -> None:
    await cluster.add_node("gpu-1", gpus=8)
    pods, job, ranks = await build(cluster)
    await start_watchers()
    for pod in pods:
        await cluster.bind(pod, "gpu-1")
        await cluster.start(pod)
    for pod, rank in zip(pods, ranks, strict=True):
        name = pod["metadata"]["name"]
        st = await recorder.wait_for(running(name))
        assert (st.job, st.rank, st.node, st.uid) == (job, rank, "gpu-1", pod["metadata"]["uid"])
        assert st.containers[0]["state"] == "running"
        info = job_index.pod("train", name)
        assert info is not None and (info.job, info.rank, info.node) == (job, rank, "gpu-1")
    keys = {e.key for t, e in recorder.events if t == Topic.K8S and isinstance(e.payload, PodStatus)}
    # A job's pods are keyed by the job; a bare pod by its node once bound (event_key).
    assert keys == ({job.key} if job else {"pod:train/notebook", "node:gpu-1"})
    assert job_index.jobs_on_node("gpu-1") == ([job] if job else [])


async def test_oomkilled_then_crashloop_surfaces_the_oom(
    cluster: Cluster, start_watchers: StartWatchers, recorder: EventRecorder
) -> None:
    job = await cluster.create_job("train", "llama", completions=1)
    (pod,) = await cluster.create_job_pods(job)
    name = pod["metadata"]["name"]
    await start_watchers()
    await cluster.bind(pod, "gpu-1")
    await cluster.start(pod)
    await recorder.wait_for(running(name))
    await cluster.terminate(pod, "trainer", reason="OOMKilled", exit_code=137, restart=True)
    st = await recorder.wait_for(
        lambda p: (
            isinstance(p, PodStatus)
            and p.pod == name
            and bool(p.containers)
            and p.containers[0]["reason"] == "OOMKilled"
        )
    )
    (c,) = st.containers
    assert c["state"] == "terminated" and c["waiting_reason"] == "CrashLoopBackOff"
    assert (c["reason"], c["exit_code"], c["oom_killed"], c["restarts"]) == ("OOMKilled", 137, True, 0)
    assert pod_status_lines(st) == [
        "pod_status: container=trainer state=terminated reason=OOMKilled exit_code=137 signal=0 restarts=0"
    ]
    mark = recorder.mark()
    await cluster.restart(pod)
    again = await recorder.wait_for(lambda p: isinstance(p, PodStatus) and p.pod == name, since=mark)
    assert (again.containers[0]["state"], again.containers[0]["restarts"]) == ("running", 1)
    assert pod_status_lines(again) == []


async def test_updates_that_change_nothing_meaningful_are_not_published(
    cluster: Cluster, start_watchers: StartWatchers, recorder: EventRecorder
) -> None:
    job = await cluster.create_job("train", "llama", completions=1)
    (pod,) = await cluster.create_job_pods(job)
    name = pod["metadata"]["name"]
    await start_watchers()
    await cluster.bind(pod, "gpu-1")
    await cluster.start(pod)
    await recorder.wait_for(running(name))
    mark = recorder.mark()
    await cluster.touch_pod(pod)  # probe timestamps
    await cluster.label_pod(pod, {"experiment": "lr-sweep-3"})  # labels only
    await cluster.touch_pod(pod)
    # The next meaningful change of the same pod comes through the same watch, in order: anything
    # published for the updates above would be seen before it.
    await cluster.terminate(pod, "trainer", reason="Error", exit_code=1)
    failed = await recorder.wait_for(lambda p: isinstance(p, PodStatus) and p.phase == "Failed", since=mark)
    assert [p.phase for p in recorder.payloads(PodStatus, since=mark)] == ["Failed"]
    assert failed.labels["experiment"] == "lr-sweep-3"


async def test_deleted_pod_is_published_and_leaves_the_index(
    cluster: Cluster, start_watchers: StartWatchers, recorder: EventRecorder, job_index: JobIndex
) -> None:
    job = await cluster.create_job("train", "llama", completions=1)
    (pod,) = await cluster.create_job_pods(job)
    name = pod["metadata"]["name"]
    await start_watchers()
    assert job_index.pod("train", name) is not None
    await cluster.delete_pod(pod)
    gone = await recorder.wait_for(lambda p: isinstance(p, PodStatus) and p.deleted)
    assert (gone.pod, gone.job) == (name, JobRef(namespace="train", name="llama"))
    assert job_index.pod("train", name) is None
    assert job_index.pod_by_uid(pod["metadata"]["uid"]) is None


async def test_node_role_sees_only_the_pods_of_its_node(
    kube: KubeEmulator, cluster: Cluster, start_watchers: StartWatchers, recorder: EventRecorder, job_index: JobIndex
) -> None:
    job = await cluster.create_job("train", "llama", completions=2)
    here, there = await cluster.create_job_pods(job)
    await cluster.bind(here, "gpu-1")
    await cluster.bind(there, "gpu-2")
    await start_watchers(node_name="gpu-1", resources=["pods"])
    await cluster.start(there)
    await cluster.start(here)
    await recorder.wait_for(running(here["metadata"]["name"]))
    assert {p.pod for p in recorder.payloads(PodStatus)} == {here["metadata"]["name"]}
    assert [p.name for p in job_index.pods_of_job(JobRef(namespace="train", name="llama"))] == [
        here["metadata"]["name"]
    ]
    (listing,) = kube.requests("v1/pods", action="list")
    assert listing.params["fieldSelector"] == "spec.nodeName=gpu-1"


async def test_label_selector_scopes_the_pods_and_a_pod_leaving_it_is_gone(
    cluster: Cluster, start_watchers: StartWatchers, recorder: EventRecorder
) -> None:
    ours = await cluster.create_pod("train", "ours", labels={"team": "llm"})
    await cluster.create_pod("train", "theirs", labels={"team": "vision"})
    await start_watchers(label_selector="team in (llm, speech)", resources=["pods"])
    assert {p.pod for p in recorder.payloads(PodStatus)} == {"ours"}
    await cluster.label_pod(ours, {"team": "vision"})
    gone = await recorder.wait_for(lambda p: isinstance(p, PodStatus) and p.deleted)
    assert gone.pod == "ours"


async def test_namespaces_are_watched_one_by_one(
    kube: KubeEmulator, cluster: Cluster, start_watchers: StartWatchers, recorder: EventRecorder
) -> None:
    await cluster.create_pod("team-a", "a1")
    await cluster.create_pod("team-b", "b1")
    await cluster.create_pod("other", "o1")
    w = await start_watchers(namespaces=["team-a", "team-b"], resources=["pods", "events"])
    assert sorted(w.states()) == ["events[team-a]", "events[team-b]", "pods[team-a]", "pods[team-b]"]
    assert {p.pod for p in recorder.payloads(PodStatus)} == {"a1", "b1"}
    paths = {r.url.path for r in kube.requests("v1/pods", action="list")}
    assert paths == {"/api/v1/namespaces/team-a/pods", "/api/v1/namespaces/team-b/pods"}


async def test_only_job_pods_are_published_when_asked(
    cluster: Cluster, start_watchers: StartWatchers, recorder: EventRecorder, job_index: JobIndex
) -> None:
    job = await cluster.create_job("train", "llama", completions=1)
    (pod,) = await cluster.create_job_pods(job)
    await cluster.create_pod("train", "notebook")
    await start_watchers(resources=["pods"], only_job_pods=True)
    assert [p.pod for p in recorder.payloads(PodStatus)] == [pod["metadata"]["name"]]
    assert job_index.pod("train", "notebook") is not None  # indexed all the same
