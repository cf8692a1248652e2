"""Self-healing on the real control plane: the agent as deployed (cluster and brain service accounts,
the shipped RBAC), the real scheduler, Job controller and node lifecycle controller, KWOK nodes.

- Xid 79 on a node: the node is quarantined and the real scheduler keeps new pods off it; the Job
  is deleted and recreated from its checkpoint, and the Job controller's pods run on healthy nodes.
- A node lost (KWOK stops its heartbeat): the node lifecycle controller marks it unreachable, the
  watchers report it, and the job is brought back elsewhere (`node_failure`).
- A slow deletion (a foreign finalizer on the Job): the replacement waits until the old Job is gone.
- A late approval after a person resubmitted the job: the plan is stale and nothing is touched.
"""

from __future__ import annotations

import asyncio
import functools
import json
from pathlib import Path
from typing import Any

import pytest
from servers.kubeplane import KubePlane

from trainmedic.agent.store import IncidentStatus

from .plane import (
    TAINT_KEY,
    TRAINING,
    UNREACHABLE,
    XID79,
    create_job,
    get_job,
    has_taint,
    job_body,
    job_pods,
    running_on,
    start_agents,
    until,
    write_hf_checkpoints,
)

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(300)]


async def running_job(plane: KubePlane, name: str, ckpt: Path | None, **kw: Any) -> tuple[dict[str, Any], list[str]]:
    job = create_job(plane, job_body(name, ckpt=ckpt, **kw))
    nodes = await until("the job's pods Running", lambda: running_on(plane, job, 2))
    return job, nodes


async def replaced(plane: KubePlane, name: str, old_uid: str) -> dict[str, Any]:
    def new_job() -> dict[str, Any] | None:
        j = get_job(plane, name)
        return j if j is not None and j["metadata"]["uid"] != old_uid else None

    found: dict[str, Any] = await until("the replacement job", new_job)
    return found


def pod_node(plane: KubePlane, job: dict[str, Any], index: int) -> str:
    for p in job_pods(plane, job):
        if p["metadata"]["annotations"].get("batch.kubernetes.io/job-completion-index") == str(index):
            return str(p["spec"]["nodeName"])
    raise AssertionError(f"no pod of index {index}")


@pytest.mark.parametrize("fault", ["xid79", "node_lost"])
async def test_a_failed_node_is_avoided_and_the_job_resumes_elsewhere(
    fresh: KubePlane, tmp_path: Path, fault: str
) -> None:
    plane = fresh
    ckpt = tmp_path / "ckpt"
    write_hf_checkpoints(ckpt, 1000)
    agents = await start_agents(plane, tmp_path)
    try:
        job, _nodes = await running_job(plane, "llama", ckpt)
        old_uid = str(job["metadata"]["uid"])
        bad = pod_node(plane, job, 0)
        if fault == "xid79":
            await agents.kernel_line(bad, job, XID79)
        else:
            plane.lose_node(bad)
            # The real node lifecycle controller notices the silent node and taints it.
            await until("the node tainted unreachable", lambda: has_taint(plane, bad, UNREACHABLE))
        [(incident_id, status)] = await until("the incident handled", agents.healed, timeout=120)
        assert status is IncidentStatus.RESOLVED
        new = await replaced(plane, "llama", old_uid)
        nodes = await until("the replacement's pods Running", lambda: running_on(plane, new, 2))
    finally:
        await agents.stop()

    store = agents.store
    incident = store.get(incident_id)
    store.close()
    if fault == "xid79":
        assert (incident.code, incident.node) == ("xid:79", bad)
    else:
        assert (incident.fault_class, incident.node) == ("node_failure", bad)
    # The node is quarantined with our taint, and the real scheduler put the new pods elsewhere.
    assert has_taint(plane, bad, TAINT_KEY)
    assert bad not in nodes and len(set(nodes)) == 2
    ann = new["metadata"]["annotations"]
    assert ann["trainmedic.io/incident"] == incident_id
    assert ann["trainmedic.io/resumed-from"] == str(ckpt / "checkpoint-1000")
    assert json.loads(ann["trainmedic.io/lineage"])[-1]["uid"] == old_uid


async def test_the_real_scheduler_keeps_new_pods_off_a_quarantined_node(fresh: KubePlane, tmp_path: Path) -> None:
    from trainmedic.remediations.kube import KubeOps

    plane = fresh
    api = plane.api_client(plane.service_account_token("trainmedic", "trainmedic-brain"))
    ops = KubeOps(api)
    try:
        await ops.quarantine_node("gpu-1", incident_id="inc-taint", fault_class="gpu_hw", reason="test")
    finally:
        ops.close()
        api.close()
    # Four GPU nodes, one quarantined: three Jobs of one 8-GPU pod each land on the other three.
    jobs = [create_job(plane, job_body(f"fill-{i}", pods=1)) for i in range(3)]
    placed = [await until("a pod placed", functools.partial(running_on, plane, j, 1)) for j in jobs]
    assert sorted(n for [n] in placed) == ["gpu-2", "gpu-3", "gpu-4"]
    # A fourth does not fit: the cordon keeps it off gpu-1, and so does our taint for a pod that
    # tolerates the cordon (as DaemonSet pods do).
    cordon = {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"}
    plain = create_job(plane, job_body("fourth", pods=1))
    tolerant = create_job(plane, job_body("tolerant", pods=1, tolerations=[cordon]))

    def unschedulable(job: dict[str, Any]) -> str | None:
        for p in job_pods(plane, job):
            for c in (p.get("status") or {}).get("conditions") or []:
                if c.get("type") == "PodScheduled" and c.get("reason") == "Unschedulable":
                    return str(c.get("message"))
        return None

    message = await until("the fourth pod unschedulable", functools.partial(unschedulable, plain))
    assert "1 node(s) were unschedulable" in message and "Insufficient nvidia.com/gpu" in message
    message = await until("the tolerant pod unschedulable", functools.partial(unschedulable, tolerant))
    assert "1 node(s) had untolerated taint(s)" in message and has_taint(plane, "gpu-1", TAINT_KEY)


async def test_a_slow_deletion_is_waited_for_before_the_replacement(fresh: KubePlane, tmp_path: Path) -> None:
    plane = fresh
    ckpt = tmp_path / "ckpt"
    write_hf_checkpoints(ckpt, 500)
    hold = "example.com/archive-logs"
    agents = await start_agents(plane, tmp_path, wait_gone_s=60)
    try:
        job, _ = await running_job(plane, "slow", ckpt, finalizers=[hold])
        old_uid = str(job["metadata"]["uid"])
        await agents.kernel_line(pod_node(plane, job, 0), job, XID79)

        def deleting() -> bool:
            j = get_job(plane, "slow")
            return j is not None and bool(j["metadata"].get("deletionTimestamp"))

        await until("the old job being deleted", deleting)
        await asyncio.sleep(4)
        # Still the old Job, held by its finalizer: no replacement behind its back, nothing finished.
        cur = get_job(plane, "slow")
        assert cur is not None and cur["metadata"]["uid"] == old_uid
        assert agents.terminal() == []
        plane.request(
            "PATCH",
            f"/apis/batch/v1/namespaces/{TRAINING}/jobs/slow",
            {"metadata": {"finalizers": None}},
            content_type="application/merge-patch+json",
        )
        new = await replaced(plane, "slow", old_uid)
        [(_, status)] = await until("the incident handled", agents.healed, timeout=60)
        assert status is IncidentStatus.RESOLVED
        await until("the replacement's pods Running", lambda: running_on(plane, new, 2))
    finally:
        await agents.stop()


async def test_a_late_approval_after_a_manual_resubmit_touches_nothing(fresh: KubePlane, tmp_path: Path) -> None:
    plane = fresh
    ckpt = tmp_path / "ckpt"
    write_hf_checkpoints(ckpt, 700)
    agents = await start_agents(plane, tmp_path, mode="approve")
    try:
        job, _ = await running_job(plane, "resub", ckpt)
        bad = pod_node(plane, job, 0)
        await agents.kernel_line(bad, job, XID79)

        def awaiting() -> str | None:
            store = agents.store
            try:
                found = store.recent(status=IncidentStatus.AWAITING_APPROVAL.value)
            finally:
                store.close()
            return found[0].id if found else None

        incident_id = await until("the plan awaiting approval", awaiting)
        # A person resubmits the job meanwhile (delete, create under the same name: a new uid).
        plane.request("DELETE", f"/apis/batch/v1/namespaces/{TRAINING}/jobs/resub", {"propagationPolicy": "Background"})
        await until("the old job gone", lambda: get_job(plane, "resub") is None)
        mine = create_job(plane, job_body("resub", ckpt=ckpt))
        store = agents.store
        store.approve(incident_id, by="alice")  # what `trainmedic approve` does
        store.close()

        def decided() -> list[tuple[str, IncidentStatus]]:
            return [(i, st) for i, st in agents.terminal() if st is not IncidentStatus.AWAITING_APPROVAL]

        [(_, status)] = await until("the approval handled", decided, timeout=60)
        await asyncio.sleep(1)
    finally:
        await agents.stop()
    # The restart was cancelled as stale: the job the person resubmitted is left as it is.
    assert status is IncidentStatus.OBSERVED
    cur = get_job(plane, "resub")
    assert cur is not None and cur["metadata"]["uid"] == mine["metadata"]["uid"]
    assert "trainmedic.io/incident" not in (cur["metadata"].get("annotations") or {})
    # The Xid was the node's: keeping new work off it was approved and still holds.
    assert has_taint(plane, bad, TAINT_KEY)
