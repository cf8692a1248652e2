"""Volcano Jobs and Kubeflow PyTorchJobs healed on the real control plane.

Their CRDs are the ones the projects publish (tests/cluster/crds/, installed by conftest.py); the
API server validates, defaults and stores the objects, serves their status subresource and the real
garbage collector removes their pods when they are deleted. Their own controllers run on the plane
(tests/servers/operators.py): a PyTorchJob's pods, their Services and its status are the real
Kubeflow training-operator's work; a Volcano Job's PodGroup, pods and status are Volcano's job
controller's, and its scheduler binds the pods. The agent runs as deployed (its ServiceAccounts,
the shipped RBAC).

Xid 79 on the node of a workload's first pod, or that node lost (its KWOK stops; the real node
lifecycle controller taints it unreachable): the scene is saved, the node quarantined (the real
schedulers then keep the replacement's pods off it), the workload deleted and recreated from its
checkpoint under the same name, and its new pods run on healthy KWOK nodes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import urllib.error
from pathlib import Path
from typing import Any

import pytest
from servers.kube import EventRecorder
from servers.kubeplane import KubePlane

from trainmedic.agent.jobindex import JobIndex
from trainmedic.agent.store import IncidentStatus
from trainmedic.agent.telemetry import Telemetry
from trainmedic.agent.watchers.k8s import KubeWatchers
from trainmedic.events import JobRef, WorkloadStatus

from .plane import (
    CUSTOM_KINDS,
    TAINT_KEY,
    TRAINING,
    UNREACHABLE,
    XID79,
    has_taint,
    owned_pods,
    start_agents,
    until,
    write_hf_checkpoints,
)

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(300)]


def get(plane: KubePlane, collection: str, name: str) -> dict[str, Any] | None:
    try:
        return dict(plane.request("GET", f"{collection}/{name}"))
    except urllib.error.HTTPError as e:
        if e.code == 404:
            return None
        raise


def running_on(plane: KubePlane, obj: dict[str, Any], n: int) -> list[str] | None:
    running = [p for p in owned_pods(plane, obj) if (p.get("status") or {}).get("phase") == "Running"]
    return sorted(p["spec"]["nodeName"] for p in running) if len(running) >= n else None


def first_pod_node(plane: KubePlane, obj: dict[str, Any]) -> str:
    """The node of rank 0: Volcano's task index 0, the PyTorchJob's master."""
    for p in owned_pods(plane, obj):
        labels = p["metadata"]["labels"]
        if labels.get("volcano.sh/task-index") == "0" or labels.get("training.kubeflow.org/job-role") == "master":
            return str(p["spec"]["nodeName"])
    raise AssertionError("no pod of rank 0")


def reported_running(obj: dict[str, Any]) -> bool:
    """What the workload's controller reported, in each kind's own status shape."""
    status = obj.get("status") or {}
    if obj["kind"] == "PyTorchJob":
        return any(c.get("type") == "Running" and c.get("status") == "True" for c in status.get("conditions") or [])
    return bool((status.get("state") or {}).get("phase") == "Running")


@pytest.mark.parametrize("fault", ["xid79", "node_lost"])
@pytest.mark.parametrize("kind", list(CUSTOM_KINDS))
async def test_a_failed_node_recreates_the_workload_from_its_checkpoint_on_healthy_nodes(
    fresh: KubePlane, controller: Any, tmp_path: Path, kind: str, fault: str
) -> None:
    plane = fresh
    make, collection = CUSTOM_KINDS[kind]
    # A name of its own per fault: Volcano v1.10.0 may drop a new job from its cache when an earlier
    # job of the same name was deleted not long before (volcano-sh/volcano#3968; tests/realplane/plane.py
    # `clean`), and the xid79 test's own restart deletes one.
    name = f"llm-{fault.replace('_', '')}"
    ckpt = tmp_path / "ckpt"
    write_hf_checkpoints(ckpt, 1000)
    agents = await start_agents(plane, tmp_path)
    try:
        obj = dict(plane.request("POST", collection, make(name, ckpt)))
        old_uid = str(obj["metadata"]["uid"])
        await until("the workload's pods Running", lambda: running_on(plane, obj, 2), timeout=90)
        await until("the workload reported Running", lambda: reported_running(get(plane, collection, name) or obj))
        bad = first_pod_node(plane, obj)
        if fault == "xid79":
            await agents.kernel_line(bad, obj, XID79)
        else:
            plane.lose_node(bad)
            # The real node lifecycle controller notices the silent node and taints it.
            await until("the node tainted unreachable", lambda: has_taint(plane, bad, UNREACHABLE))
        [(incident_id, status)] = await until("the incident handled", agents.healed, timeout=120)
        assert status is IncidentStatus.RESOLVED

        def replacement() -> dict[str, Any] | None:
            cur = get(plane, collection, name)
            return cur if cur is not None and cur["metadata"]["uid"] != old_uid else None

        new: dict[str, Any] = await until("the replacement", replacement)
        nodes = await until("the replacement's pods Running", lambda: running_on(plane, new, 2), timeout=90)
        await until("the replacement reported Running", lambda: reported_running(get(plane, collection, name) or new))
        pods = owned_pods(plane, new)
    finally:
        await agents.stop()
    assert not controller.errors, controller.errors

    store = agents.store
    incident = store.get(incident_id)
    store.close()
    if fault == "xid79":
        assert (incident.code, incident.node) == ("xid:79", bad)
    else:
        assert (incident.fault_class, incident.node) == ("node_failure", bad)
    # The scene: the workload as it was, its pods and their logs, the checkpoint listing.
    manifest = json.loads((tmp_path / "scenes" / incident_id / "manifest.json").read_text())
    paths = {f["path"] for f in manifest["files"]}
    assert "objects/workload.yaml" in paths and "checkpoints.json" in paths
    assert {p["name"] for p in manifest["pods"]} >= {f"{name}-{'worker' if kind == 'volcano' else 'master'}-0"}
    # The node is quarantined, and the real scheduler (the stock one, or Volcano's) placed the new pods elsewhere.
    assert has_taint(plane, bad, TAINT_KEY)
    assert bad not in nodes and len(set(nodes)) == 2
    ann = new["metadata"]["annotations"]
    checkpoint = str(ckpt / "checkpoint-1000")
    assert ann["trainmedic.io/incident"] == incident_id
    assert ann["trainmedic.io/resumed-from"] == checkpoint
    assert json.loads(ann["trainmedic.io/lineage"])[-1]["uid"] == old_uid
    # Each new pod, made from the recreated templates, resumes from the checkpoint and avoids the node.
    assert len(pods) == 2
    for p in pods:
        [c] = p["spec"]["containers"]
        env = {e["name"]: e.get("value") for e in c.get("env") or []}
        assert env["TRAINMEDIC_RESUME_FROM"] == checkpoint and env["TRAINMEDIC_RESUME_STEP"] == "1000"
        assert c["args"] == [f"--resume_from_checkpoint={checkpoint}"]
        [term] = p["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
            "nodeSelectorTerms"
        ]
        assert {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": [bad]} in term["matchExpressions"]
        if kind == "pytorchjob":
            # The replacement is the operator's again: its env (the demo emulator writes the same,
            # tests/watchers/test_demo_standin.py) besides trainmedic's, one rank per replica.
            rank = "0" if p["metadata"]["labels"]["training.kubeflow.org/replica-type"] == "master" else "1"
            assert env.items() >= pytorch_env(name, rank, world=2).items()


def pytorch_env(job: str, rank: str, *, world: int) -> dict[str, str]:
    """What training-operator v1.8.1 writes into a container of a PyTorchJob with a Master."""
    master = f"{job}-master-0"
    return {
        "PYTHONUNBUFFERED": "1",
        "MASTER_PORT": "23456",
        "PET_MASTER_PORT": "23456",
        "MASTER_ADDR": master,
        "PET_MASTER_ADDR": master,
        "WORLD_SIZE": str(world),
        "RANK": rank,
        "PET_NODE_RANK": rank,
        "PET_NPROC_PER_NODE": "auto",
        "PET_NNODES": str(world),
    }


@pytest.mark.parametrize("kind", list(CUSTOM_KINDS))
async def test_the_cluster_watcher_reports_volcano_jobs_and_pytorchjobs(
    fresh: KubePlane, controller: Any, kind: str
) -> None:
    """As the cluster ServiceAccount: the workload's status in its own shape (Volcano's
    status.state.phase, the PyTorchJob's conditions) becomes a WorkloadStatus, its pods are indexed
    under it with their ranks, and its deletion is reported."""
    plane = fresh
    make, collection = CUSTOM_KINDS[kind]
    api = plane.api_client(plane.service_account_token("trainmedic", "trainmedic-cluster"))
    bus, index = EventRecorder(), JobIndex()
    w = KubeWatchers(api, bus=bus, job_index=index, telemetry=Telemetry(), producer="cluster/test")
    task = asyncio.create_task(w.run())
    try:
        await asyncio.wait_for(w.ready.wait(), 30)
        obj = dict(plane.request("POST", collection, make("watched")))
        ref = JobRef(namespace=TRAINING, name="watched", kind=obj["kind"], api_version=obj["apiVersion"])

        def running(s: Any) -> bool:
            return isinstance(s, WorkloadStatus) and s.job == ref and s.phase == "Running" and not s.deleted

        status = await bus.wait_for(running, timeout=90)
        assert status.replicas == 2
        assert status.annotations["trainmedic.io/resume-args"] == "--resume_from_checkpoint={checkpoint}"
        # (the real training-operator reports Running once the master runs: a worker may still be
        # unbound then, its node indexed when the scheduler binds it)
        pods = await until(
            "both pods indexed on their nodes",
            lambda: (
                len(index.pods_of_job(ref)) == 2
                and all(p.node for p in index.pods_of_job(ref))
                and index.pods_of_job(ref)
            ),
        )
        assert sorted(p.rank for p in pods) == [0, 1]
        assert {p.node for p in pods} == {n for n in running_on(plane, obj, 2) or []}
        mark = bus.mark()
        plane.request("DELETE", f"{collection}/watched", {"propagationPolicy": "Background"})
        await bus.wait_for(lambda s: isinstance(s, WorkloadStatus) and s.job == ref and s.deleted, since=mark)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        api.close()


@pytest.mark.parametrize("kind", list(CUSTOM_KINDS))
async def test_a_custom_workload_held_by_a_finalizer_is_replaced_only_once_gone(
    fresh: KubePlane, controller: Any, tmp_path: Path, kind: str
) -> None:
    """A foreign finalizer on the Volcano Job / PyTorchJob keeps it (deletionTimestamp set) after
    trainmedic's delete: no replacement until it is really gone, then one."""
    plane = fresh
    make, collection = CUSTOM_KINDS[kind]
    ckpt = tmp_path / "ckpt"
    write_hf_checkpoints(ckpt, 500)
    body = make("held", ckpt)
    body["metadata"]["finalizers"] = ["example.com/archive-logs"]
    agents = await start_agents(plane, tmp_path, wait_gone_s=60)
    try:
        obj = dict(plane.request("POST", collection, body))
        old_uid = str(obj["metadata"]["uid"])
        await until("the workload's pods Running", lambda: running_on(plane, obj, 2), timeout=90)
        await agents.kernel_line(first_pod_node(plane, obj), obj, XID79)

        def deleting() -> bool:
            cur = get(plane, collection, "held")
            return cur is not None and bool(cur["metadata"].get("deletionTimestamp"))

        await until("the old workload being deleted", deleting)
        await asyncio.sleep(4)
        cur = get(plane, collection, "held")
        assert cur is not None and cur["metadata"]["uid"] == old_uid
        assert agents.terminal() == []
        plane.request(
            "PATCH",
            f"{collection}/held",
            {"metadata": {"finalizers": None}},
            content_type="application/merge-patch+json",
        )
        [(_, status)] = await until("the incident handled", agents.healed, timeout=90)
        assert status is IncidentStatus.RESOLVED

        def replacement() -> dict[str, Any] | None:
            cur = get(plane, collection, "held")
            return cur if cur is not None and cur["metadata"]["uid"] != old_uid else None

        new: dict[str, Any] = await until("the replacement", replacement)
        await until("the replacement's pods Running", lambda: running_on(plane, new, 2), timeout=90)
    finally:
        await agents.stop()
