"""The shipped RBAC (deploy/, applied as is) against the real authorizer: every operation the agent
performs is allowed to the service account that performs it, and what lies outside the roles
(secrets, exec or deletes outside the training namespace, writes by the read-only cluster role) is
denied, with a message that names the rule missing."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
import pytest_asyncio
from kubernetes import client as kclient
from kubernetes.client.exceptions import ApiException
from servers.kube import EventRecorder
from servers.kubeplane import KubePlane

from trainmedic.agent.jobindex import JobIndex
from trainmedic.agent.telemetry import Telemetry
from trainmedic.agent.watchers.k8s import KubeWatchers
from trainmedic.remediations.kube import KubeForbidden, KubeOps

from .plane import CUSTOM_KINDS, TRAINING, clean, create_job, job_body, owned_pods, running_on, until

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(300)]


@pytest_asyncio.fixture
async def brain(plane: KubePlane) -> AsyncIterator[KubeOps]:
    """KubeOps as the brain's ServiceAccount (trainmedic/trainmedic-brain), with a job running."""
    await clean(plane)
    api = plane.api_client(plane.service_account_token("trainmedic", "trainmedic-brain"))
    ops = KubeOps(api)
    try:
        yield ops
    finally:
        ops.close()
        api.close()
        await clean(plane)


async def test_everything_the_brain_does_is_allowed(plane: KubePlane, brain: KubeOps) -> None:
    job = create_job(plane, job_body("rbac", pods=1))
    [node] = await until("the pod Running", lambda: running_on(plane, job, 1))
    ops = brain
    # Nodes: read, quarantine (spec, labels, annotations, the status condition), release.
    assert await ops.get_node(node) is not None
    assert {n["metadata"]["name"] for n in await ops.list_nodes()} >= {node}
    await ops.quarantine_node(node, incident_id="inc-rbac", fault_class="gpu_hw", reason="rbac test")
    assert await ops.release_node(node, incident_id="inc-rbac")
    # Pods of the job: read, list by selector, hold with a finalizer and release, events.
    found = await ops.get_workload("batch/v1", "Job", TRAINING, "rbac")
    assert found is not None
    [pod] = await ops.list_job_pods(TRAINING, {"batch.kubernetes.io/controller-uid": found["metadata"]["uid"]})
    name = pod["metadata"]["name"]
    assert await ops.get_pod(TRAINING, name) is not None
    assert await ops.add_pod_finalizer(TRAINING, name)
    assert await ops.remove_pod_finalizer(TRAINING, name)
    await ops.list_events(TRAINING)
    # The restart: delete this incarnation, wait for it to go, create the replacement.
    assert await ops.delete_workload(found)
    assert await ops.wait_gone("batch/v1", "Job", TRAINING, "rbac", uid=found["metadata"]["uid"], timeout_s=30)
    created = await ops.create_workload(job_body("rbac", pods=1))
    assert created["metadata"]["uid"] != found["metadata"]["uid"]


@pytest.mark.parametrize("kind", list(CUSTOM_KINDS))
async def test_the_brain_may_restart_volcano_jobs_and_pytorchjobs(
    plane: KubePlane, brain: KubeOps, controller: Any, kind: str
) -> None:
    """The restart of a custom workload, as the brain: read it, delete this incarnation, wait for it
    (and, the deletion being in the foreground, the pods its controller made) to go, create the
    replacement (the CRDs as published, served by the real API server)."""
    make, collection = CUSTOM_KINDS[kind]
    body = make("rbac-" + kind)
    api_version, kind_name, name = body["apiVersion"], body["kind"], body["metadata"]["name"]
    obj = plane.request("POST", collection, body)
    await until("the pods its controller made", lambda: len(owned_pods(plane, obj)) == 2)
    ops = brain
    found = await ops.get_workload(api_version, kind_name, TRAINING, name)
    assert found is not None and found["kind"] == kind_name
    assert await ops.delete_workload(found, propagation="Foreground")
    assert await ops.wait_gone(api_version, kind_name, TRAINING, name, uid=found["metadata"]["uid"], timeout_s=60)
    assert owned_pods(plane, found) == []
    created = await ops.create_workload(make(name))
    assert created["metadata"]["uid"] != found["metadata"]["uid"]


@pytest.mark.parametrize("kind", list(CUSTOM_KINDS))
@pytest.mark.parametrize("verb", ["get", "delete", "create"])
async def test_volcano_jobs_and_pytorchjobs_outside_the_training_namespace_are_denied(
    brain: KubeOps, kind: str, verb: str
) -> None:
    make, _ = CUSTOM_KINDS[kind]
    body = make("x")
    body["metadata"]["namespace"] = "default"
    plural = "jobs" if kind == "volcano" else "pytorchjobs"
    with pytest.raises(KubeForbidden) as caught:
        if verb == "get":
            await brain.get_workload(body["apiVersion"], body["kind"], "default", "x")
        elif verb == "delete":
            await brain.delete_workload(body)
        else:
            await brain.create_workload(body)
    message = str(caught.value)
    assert f"{plural}: {verb}" in message and "Role" in message


@pytest.mark.parametrize("kind", list(CUSTOM_KINDS))
@pytest.mark.parametrize("verb", ["list", "patch", "update", "deletecollection"])
async def test_the_brain_has_no_other_verb_on_volcano_jobs_and_pytorchjobs(
    plane: KubePlane, brain: KubeOps, kind: str, verb: str
) -> None:
    """get, delete and create in the training namespace are all the restart uses; the real
    authorizer refuses the rest."""
    make, _ = CUSTOM_KINDS[kind]
    body = make("other-verbs")
    group, _, version = body["apiVersion"].partition("/")
    plural = "jobs" if kind == "volcano" else "pytorchjobs"
    api = plane.api_client(plane.service_account_token("trainmedic", "trainmedic-brain"))
    custom = kclient.CustomObjectsApi(api)
    calls = {
        "list": lambda: custom.list_namespaced_custom_object(group, version, TRAINING, plural),
        "patch": lambda: custom.patch_namespaced_custom_object(group, version, TRAINING, plural, "x", {}),
        "update": lambda: custom.replace_namespaced_custom_object(group, version, TRAINING, plural, "x", body),
        "deletecollection": lambda: custom.delete_collection_namespaced_custom_object(group, version, TRAINING, plural),
    }
    try:
        with pytest.raises(ApiException) as caught:
            await asyncio.to_thread(calls[verb])
    finally:
        api.close()
    assert caught.value.status == 403, caught.value.body
    message = json.loads(caught.value.body or "{}").get("message", "")
    assert f'cannot {verb} resource "{plural}" in API group "{group}"' in message, message


Call = Callable[[KubeOps], Awaitable[Any]]


@pytest.mark.parametrize(
    ("call", "needs"),
    [
        (lambda ops: ops.get_workload("batch/v1", "Job", "default", "x"), "jobs: get"),
        (
            lambda ops: ops.delete_workload(
                {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"namespace": "default", "name": "x"}}
            ),
            "jobs: delete",
        ),
        (
            lambda ops: ops.create_workload(job_body("x") | {"metadata": {"name": "x", "namespace": "kube-system"}}),
            "jobs: create",
        ),
        (lambda ops: ops.get_pod("kube-system", "x"), "pods: get"),
        (lambda ops: ops.list_events("default"), "events: list"),
    ],
    ids=["get-job-elsewhere", "delete-job-elsewhere", "create-job-elsewhere", "get-pod-elsewhere", "events-elsewhere"],
)
async def test_outside_the_training_namespace_the_brain_is_denied(brain: KubeOps, call: Call, needs: str) -> None:
    with pytest.raises(KubeForbidden) as caught:
        await call(brain)
    message = str(caught.value)
    assert needs in message and "Role" in message


async def test_secrets_and_exec_outside_the_namespace_are_denied(plane: KubePlane, brain: KubeOps) -> None:
    token = plane.service_account_token("trainmedic", "trainmedic-brain")
    api = plane.api_client(token)
    try:
        core = kclient.CoreV1Api(api)
        for read in (
            lambda: core.read_namespaced_secret("x", TRAINING),
            core.list_secret_for_all_namespaces,
            lambda: core.list_namespaced_secret("trainmedic"),
        ):
            with pytest.raises(ApiException) as caught:
                await asyncio.to_thread(read)
            assert caught.value.status == 403 and "secrets" in str(caught.value.body)
    finally:
        api.close()
    result = await brain.exec("kube-system", "x", "c", ["true"], timeout_s=10)
    assert result.status == 403 and result.exit_code is None


@pytest.mark.parametrize(
    "call",
    [
        lambda ops: ops.quarantine_node("gpu-1", incident_id="inc-x", fault_class="gpu_hw", reason="x"),
        lambda ops: ops.get_workload("batch/v1", "Job", TRAINING, "x"),
        lambda ops: ops.add_pod_finalizer(TRAINING, "x"),
        lambda ops: ops.get_workload("batch.volcano.sh/v1alpha1", "Job", TRAINING, "x"),
        lambda ops: ops.delete_workload(CUSTOM_KINDS["pytorchjob"][0]("x")),
    ],
    ids=["quarantine", "get-job", "hold-pod", "get-volcano-job", "delete-pytorchjob"],
)
async def test_the_cluster_role_only_reads(plane: KubePlane, call: Call) -> None:
    api = plane.api_client(plane.service_account_token("trainmedic", "trainmedic-cluster"))
    ops = KubeOps(api)
    try:
        with pytest.raises(KubeForbidden):
            await call(ops)
    finally:
        ops.close()
        api.close()


async def test_the_cluster_role_watches_everything_it_needs(plane: KubePlane) -> None:
    api = plane.api_client(plane.service_account_token("trainmedic", "trainmedic-cluster"))
    w = KubeWatchers(api, bus=EventRecorder(), job_index=JobIndex(), telemetry=Telemetry(), producer="cluster/test")
    task = asyncio.create_task(w.run())
    try:
        await asyncio.wait_for(w.ready.wait(), 30)
        states = w.states()
        # The Volcano and Kubeflow CRDs are installed: those are watched too, never forbidden.
        assert not [n for n, s in states.items() if s in ("forbidden", "missing")], states
        watched = ("pods", "events", "nodes", "jobs", "volcanojobs", "pytorchjobs")
        assert {s for n, s in states.items() if n in watched} <= {"listing", "watching"}, states
        assert set(watched) <= set(states), states
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        api.close()


async def test_the_checkpoint_reader_pod_is_valid_allowed_and_always_deleted(plane: KubePlane, brain: KubeOps) -> None:
    """The reader pod as the brain builds it from a job's template passes the real API server's
    validation and the shipped Role; a reader that never finishes (here: its claim does not exist,
    so it is never scheduled) ends in CheckpointReadError and the pod is deleted all the same."""
    from trainmedic.remediations import checkpoint_reader as cr

    body = job_body("reader", pods=1, ckpt=None)
    body["metadata"]["annotations"]["trainmedic.io/checkpoint-dir"] = "/mnt/ckpt/reader"
    spec = body["spec"]["template"]["spec"]
    spec["securityContext"] = {"runAsUser": 1000, "runAsGroup": 1000, "fsGroup": 1000}
    spec["volumes"] = [{"name": "ckpt", "persistentVolumeClaim": {"claimName": "no-such-claim"}}]
    spec["containers"][0]["volumeMounts"] = [{"name": "ckpt", "mountPath": "/mnt/ckpt"}]
    with pytest.raises(cr.CheckpointReadError, match="did not finish"):
        await cr.read_checkpoints(
            brain, body, "/mnt/ckpt/reader", image="trainmedic:0", incident_id="inc-reader", timeout_s=3, poll_s=0.5
        )
    left = plane.request("GET", f"/api/v1/namespaces/{TRAINING}/pods?labelSelector={cr.READER_LABEL}%3Dtrue")
    assert [p for p in left["items"] if not p["metadata"].get("deletionTimestamp")] == []
    # ... and nowhere but in a training namespace
    body["metadata"]["namespace"] = "default"
    with pytest.raises(KubeForbidden):
        await cr.read_checkpoints(
            brain, body, "/mnt/ckpt/reader", image="trainmedic:0", incident_id="inc-x", timeout_s=1
        )
