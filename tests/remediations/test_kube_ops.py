"""KubeOps against the emulated API: workloads of the three kinds (get, delete with a uid
precondition, wait until gone, create), pods (job selectors, bounded logs, finalizers), events, and
API failures served by the emulator itself (kmock reactions): 403 naming the RBAC rule, 404, 409,
422, 429 with Retry-After, 5xx, garbled answers, connection refused. Retry delays are asserted in
looptime's fake loop time."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import pytest_asyncio
from kubefix import (  # noqa: F401
    ATTEMPTS,
    JOBS,
    NODES,
    PODS,
    PYTORCH_JOBS,
    VOLCANO_JOBS,
    cluster_fixture,
    forbidden_body,
    inject,
    kube_fixture,
    ops_fixture,
    seen,
)
from servers.kube import Cluster, ExecReply, KubeEmulator

from trainmedic.events import JobRef
from trainmedic.remediations.kube import (
    ANN_INCIDENT,
    LOG_BYTES,
    SCENE_FINALIZER,
    ConflictError,
    KubeError,
    KubeForbidden,
    KubeInvalid,
    KubeNotFound,
    KubeOps,
    PermanentKubeError,
    TemporaryKubeError,
)
from trainmedic.remediations.workloads import JOB, PYTORCH_JOB, VOLCANO_JOB, WorkloadKind

pytestmark = pytest.mark.asyncio

NS = "train"

Op = Callable[[KubeOps], Awaitable[Any]]

# (kind, kmock resource, the Cluster stand-in's factory for it)
KINDS = [
    pytest.param(JOB, JOBS, "create_job", id="batch-job"),
    pytest.param(VOLCANO_JOB, VOLCANO_JOBS, "create_volcano_job", id="volcano-job"),
    pytest.param(PYTORCH_JOB, PYTORCH_JOBS, "create_pytorchjob", id="pytorchjob"),
]


async def _make(cluster: Cluster, factory: str, name: str = "llama") -> dict[str, Any]:
    obj: dict[str, Any] = await getattr(cluster, factory)(NS, name)
    return obj


def _stored(kube: KubeEmulator, resource: str, name: str = "llama") -> dict[str, Any] | None:
    found = [o for o in kube.objects(resource) if o["metadata"]["name"] == name]
    return found[0] if found else None


# ------------------------------------------------------------------------------------------------
# Workloads


@pytest.mark.parametrize(("kind", "resource", "factory"), KINDS)
async def test_get_workload_returns_the_api_json(
    kind: WorkloadKind, resource: str, factory: str, kube: KubeEmulator, cluster: Cluster, ops: KubeOps
) -> None:
    await _make(cluster, factory)
    got = await ops.get_workload(kind.api_version, kind.kind, NS, "llama")
    assert got == _stored(kube, resource)
    assert got is not None and got["apiVersion"] == kind.api_version  # camelCase, as the API speaks
    assert await ops.get(kind, NS, "llama") == got
    assert (
        await ops.get(JobRef(namespace=NS, name="llama", kind=kind.kind, api_version=kind.api_version), NS, "llama")
        == got
    )
    assert await ops.get_workload(kind.api_version, kind.kind, NS, "nope") is None


@pytest.mark.parametrize(("kind", "resource", "factory"), KINDS)
async def test_delete_then_wait_gone(
    kind: WorkloadKind, resource: str, factory: str, kube: KubeEmulator, cluster: Cluster, ops: KubeOps
) -> None:
    obj = await _make(cluster, factory)
    uid = obj["metadata"]["uid"]
    assert await ops.delete_workload(obj) is True
    (delete,) = seen(kube, "delete", resource)
    assert delete.data == {"propagationPolicy": "Background", "preconditions": {"uid": uid}}
    assert await ops.wait_gone(kind.api_version, kind.kind, NS, "llama", uid=uid, timeout_s=5) is True
    assert _stored(kube, resource) is None
    assert await ops.delete_workload(obj) is False  # already gone: nothing to do


@pytest.mark.parametrize(("kind", "resource", "factory"), KINDS)
async def test_delete_never_removes_a_newer_incarnation(
    kind: WorkloadKind, resource: str, factory: str, kube: KubeEmulator, cluster: Cluster, ops: KubeOps
) -> None:
    old = await _make(cluster, factory)
    kube.store_delete(resource, NS, "llama")
    new = await _make(cluster, factory)  # the same name, a new uid (what a restart creates)
    assert new["metadata"]["uid"] != old["metadata"]["uid"]
    # kmock ignores delete preconditions, so the uid is compared before deleting; the precondition is
    # still sent for a real API server to enforce against a race.
    assert await ops.delete_workload(old) is False
    assert seen(kube, "delete", resource) == []
    stored = _stored(kube, resource)
    assert stored is not None and stored["metadata"]["uid"] == new["metadata"]["uid"]
    # Present with another uid counts as gone for the old incarnation.
    assert await ops.wait_gone(kind.api_version, kind.kind, NS, "llama", uid=old["metadata"]["uid"], timeout_s=5)


async def test_a_failed_uid_precondition_at_the_server_deletes_nothing(
    kube: KubeEmulator, cluster: Cluster, ops: KubeOps
) -> None:
    obj = await cluster.create_job(NS, "llama")
    inject(
        kube,
        "delete",
        JOBS,
        (409, b'{"kind":"Status","code":409,"message":"Precondition failed: UID in precondition"}'),
    )
    assert await ops.delete_workload(obj) is False


@pytest.mark.looptime
async def test_wait_gone_gives_up_at_its_timeout(cluster: Cluster, ops: KubeOps) -> None:
    obj = await cluster.create_job(NS, "llama")
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    gone = await ops.wait_gone("batch/v1", "Job", NS, "llama", uid=obj["metadata"]["uid"], timeout_s=30, poll_s=2)
    assert gone is False
    assert loop.time() - t0 == pytest.approx(30.0, abs=0.05)


@pytest.mark.parametrize(("kind", "resource", "factory"), KINDS)
async def test_create_workload_and_conflict(
    kind: WorkloadKind, resource: str, factory: str, kube: KubeEmulator, cluster: Cluster, ops: KubeOps
) -> None:
    old = await _make(cluster, factory)
    kube.store_delete(resource, NS, "llama")
    # The old object as read, server fields included: they are dropped from the create.
    body = dict(old, metadata={**old["metadata"], "annotations": {ANN_INCIDENT: "inc-1"}, "resourceVersion": "7"})
    created = await ops.create_workload(body)
    assert created["metadata"]["name"] == "llama"
    stored = _stored(kube, resource)
    assert stored is not None
    assert set(stored["metadata"]) == {"name", "namespace", "annotations"}
    assert stored["spec"] == old["spec"]
    with pytest.raises(ConflictError, match="conflict"):
        await ops.create_workload(body)


@pytest.mark.looptime
@pytest.mark.parametrize("ours", [True, False], ids=["our-incident", "someone-else"])
async def test_a_create_whose_answer_was_lost_returns_what_it_created(
    ours: bool, kube: KubeEmulator, ops: KubeOps
) -> None:
    body = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "llama", "namespace": NS, "annotations": {ANN_INCIDENT: "inc-1"} if ours else {}},
        "spec": {"template": {"spec": {"containers": [{"name": "trainer", "image": "train:1"}]}}},
    }
    inject(kube, "create", JOBS, 503)  # kmock creates it, then answers 503: the answer is lost
    if ours:
        created = await ops.create_workload(body)
        assert created["metadata"]["annotations"] == {ANN_INCIDENT: "inc-1"}
    else:
        with pytest.raises(ConflictError):
            await ops.create_workload(body)
    assert len(seen(kube, "create", JOBS)) == 2


async def test_an_invalid_create_carries_the_api_message(kube: KubeEmulator, ops: KubeOps) -> None:
    message = b'Job.batch \\"llama\\" is invalid: spec.template.spec.containers: Required value'
    inject(kube, "create", JOBS, (422, b'{"kind":"Status","code":422,"message":"' + message + b'"}'))
    body = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "llama", "namespace": NS}, "spec": {}}
    with pytest.raises(KubeInvalid, match=r"create Job.batch train/llama: invalid \(422\): .*Required value"):
        await ops.create_workload(body)
    assert len(seen(kube, "create", JOBS)) == 1  # permanent: not retried


async def test_a_crd_that_is_not_installed_is_named(kube: KubeEmulator, ops: KubeOps) -> None:
    # What a real API server answers for a resource it does not serve (kmock serves anything created).
    not_served = (
        b'{"kind":"Status","code":404,"reason":"NotFound","message":"the server could not find the requested resource"}'
    )
    inject(kube, "create", PYTORCH_JOBS, (404, not_served))
    body = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": "x", "namespace": NS}}
    with pytest.raises(
        KubeNotFound, match=r"create PyTorchJob.kubeflow.org train/x: not found \(is its CRD installed\?\)"
    ):
        await ops.create_workload(body)


@pytest.mark.parametrize(
    ("obj", "message"),
    [
        (
            {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "x", "namespace": NS}},
            "unsupported workload kind apps/v1 Deployment",
        ),
        ({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"namespace": NS}}, "metadata.name is required"),
        ({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "x"}}, "metadata.namespace is required"),
        ({"kind": "Job", "metadata": {"name": "x", "namespace": NS}}, "apiVersion and kind are required"),
        ({"apiVersion": "batch/v1", "kind": "Job", "metadata": "nonsense"}, "metadata.name is required"),
        ("not an object", "expected a Kubernetes object"),
    ],
    ids=["unsupported-kind", "no-name", "no-namespace", "no-api-version", "metadata-not-a-map", "not-a-mapping"],
)
@pytest.mark.parametrize("op", ["create", "delete"])
async def test_malformed_objects_get_a_clear_error(
    obj: Any, message: str, op: str, kube: KubeEmulator, ops: KubeOps
) -> None:
    with pytest.raises(PermanentKubeError, match=message):
        await (ops.create_workload(obj) if op == "create" else ops.delete_workload(obj))
    assert kube.requests() == []


@pytest.mark.parametrize(
    "op",
    [
        lambda o: o.get_node(""),
        lambda o: o.get_pod(NS, ""),
        lambda o: o.get_workload("batch/v1", "Job", "", "x"),
        lambda o: o.get_workload("batch/v1", "Job", NS, "a/b"),
        lambda o: o.pod_log(NS, "p0", ""),
        lambda o: o.add_pod_finalizer(NS, ""),
        lambda o: o.list_events(""),
        lambda o: o.quarantine_node("", incident_id="inc-1", fault_class="hang", reason="r"),
        lambda o: o.release_node(""),
        lambda o: o.get("deployment", NS, "x"),
    ],
    ids=[
        "node", "pod", "namespace", "slash", "container", "finalizer-pod", "events-namespace", "quarantine",
        "release", "unknown-kind",
    ],
)  # fmt: skip
async def test_names_that_cannot_be_in_a_url_are_refused(op: Op, kube: KubeEmulator, ops: KubeOps) -> None:
    with pytest.raises(PermanentKubeError, match=r"invalid .* name|unknown kind"):
        await op(ops)
    assert kube.requests() == []


# ------------------------------------------------------------------------------------------------
# Pods, logs, finalizers, events, nodes


async def test_list_job_pods_filters_by_the_selector_the_emulator_ignores(
    kube: KubeEmulator, cluster: Cluster, ops: KubeOps
) -> None:
    mine = await cluster.create_job_pods(await cluster.create_job(NS, "llama"))
    await cluster.create_job_pods(await cluster.create_job(NS, "other"))
    pods = await ops.list_job_pods(NS, {"batch.kubernetes.io/job-name": "llama"})
    assert sorted(p["metadata"]["name"] for p in pods) == sorted(p["metadata"]["name"] for p in mine)
    (request,) = seen(kube, "list", PODS)
    assert request.params["labelSelector"] == "batch.kubernetes.io/job-name=llama"
    with pytest.raises(PermanentKubeError, match="empty selector"):
        await ops.list_job_pods(NS, {})


@pytest_asyncio.fixture
async def crashed_pod(cluster: Cluster) -> dict[str, Any]:
    """A pod whose container ran once (lines 1-5), crashed, and runs again (lines a-c)."""
    pod = await cluster.create_pod(NS, "llama-0", containers=("trainer", "sidecar"))
    await cluster.bind(pod, "gpu-1")
    await cluster.start(pod, ["trainer"], events=False)
    cluster.write_log(pod, "trainer", *(f"line-{i}" for i in range(1, 6)))
    await cluster.terminate(pod, "trainer", reason="Error", exit_code=1, restart=True)
    await cluster.restart(pod, "trainer")
    cluster.write_log(pod, "trainer", "a", "b", "c")
    return pod


@pytest.mark.parametrize(
    ("previous", "tail_lines", "limit_bytes", "expected"),
    [
        (False, 100, 1 << 20, "a\nb\nc\n"),
        (False, 2, 1 << 20, "b\nc\n"),
        (True, 100, 1 << 20, "line-1\nline-2\nline-3\nline-4\nline-5\n"),
        (True, 3, 1 << 20, "line-3\nline-4\nline-5\n"),
        (True, 100, 10, "line-5\n"),  # the last 10 bytes, from the first whole line in them
        (True, 100, 14, "line-4\nline-5\n"),  # exactly two whole lines
        (True, 100, 3, "-5\n"),  # the end of one line longer than the limit
        (True, 0, 1 << 20, ""),
    ],
    ids=[
        "current",
        "current-tail",
        "previous",
        "previous-tail",
        "byte-limit-mid-line",
        "byte-limit-at-line",
        "byte-limit-in-one-line",
        "zero-lines",
    ],
)
async def test_pod_log(
    previous: bool,
    tail_lines: int,
    limit_bytes: int,
    expected: str,
    crashed_pod: dict[str, Any],
    cluster: Cluster,
    ops: KubeOps,
) -> None:
    text = await ops.pod_log(
        NS, "llama-0", "trainer", tail_lines=tail_lines, previous=previous, limit_bytes=limit_bytes
    )
    assert text == expected
    request = cluster.log_requests[-1]
    assert (request["container"], request["tailLines"], request["previous"]) == (
        "trainer",
        str(tail_lines),
        str(previous).lower(),
    )


@pytest.mark.parametrize(
    ("container", "previous"),
    [("sidecar", False), ("sidecar", True)],
    ids=["waiting-to-start", "no-previous-instance"],
)
async def test_a_log_that_does_not_exist_is_empty(
    container: str, previous: bool, crashed_pod: dict[str, Any], ops: KubeOps
) -> None:
    assert await ops.pod_log(NS, "llama-0", container, tail_lines=10, previous=previous) == ""


async def test_the_previous_log_of_a_container_that_never_restarted_is_empty(cluster: Cluster, ops: KubeOps) -> None:
    pod = await cluster.create_pod(NS, "p0")
    await cluster.bind(pod, "gpu-1")
    await cluster.start(pod, events=False)
    cluster.write_log(pod, "trainer", "hello")
    assert await ops.pod_log(NS, "p0", "trainer", tail_lines=10, previous=True) == ""
    assert await ops.pod_log(NS, "p0", "trainer", tail_lines=10) == "hello\n"


@pytest.mark.parametrize(
    ("pod", "container", "error", "match"),
    [
        ("gone-0", "trainer", KubeNotFound, "Pod train/gone-0 \\(log\\): not found"),
        ("llama-0", "nope", KubeInvalid, "container nope is not valid"),
    ],
    ids=["pod-gone", "unknown-container"],
)
async def test_pod_log_errors(
    pod: str, container: str, error: type[KubeError], match: str, crashed_pod: dict[str, Any], ops: KubeOps
) -> None:
    with pytest.raises(error, match=match):
        await ops.pod_log(NS, pod, container, tail_lines=10)


async def test_a_log_read_is_bounded_by_default(cluster: Cluster, ops: KubeOps) -> None:
    pod = await cluster.create_pod(NS, "p0")
    await cluster.bind(pod, "gpu-1")
    await cluster.start(pod, events=False)
    line = "x" * 1023
    cluster.write_log(pod, "trainer", *([line] * (LOG_BYTES // 1024 + 10)), "last")
    text = await ops.pod_log(NS, "p0", "trainer", tail_lines=100_000, limit_bytes=None)
    assert len(text.encode()) <= LOG_BYTES
    assert text.endswith(f"{line}\nlast\n") and text.startswith(line)


async def test_exec_runs_a_command_in_a_container(cluster: Cluster, ops: KubeOps) -> None:
    pod = await cluster.create_pod(NS, "p0")
    await cluster.bind(pod, "gpu-1")
    await cluster.start(pod, events=False)
    cluster.on_exec(pod, lambda container, argv: ExecReply(stdout=f"{container}: {' '.join(argv)}\n"))
    result = await ops.exec(NS, "p0", "trainer", ["echo", "hi"], timeout_s=10)
    assert result.ok and result.stdout == "trainer: echo hi\n"


async def test_pod_finalizers_are_idempotent_and_keep_others(
    kube: KubeEmulator, cluster: Cluster, ops: KubeOps
) -> None:
    await cluster.create_pod(NS, "p0")
    kube.store_patch(PODS, NS, "p0", {"metadata": {"finalizers": ["example.com/keep"]}})
    assert await ops.add_pod_finalizer(NS, "p0", SCENE_FINALIZER) is True
    assert await ops.add_pod_finalizer(NS, "p0", SCENE_FINALIZER) is False
    assert _stored(kube, PODS, "p0")["metadata"]["finalizers"] == ["example.com/keep", SCENE_FINALIZER]  # type: ignore[index]
    assert await ops.remove_pod_finalizer(NS, "p0") is True
    assert await ops.remove_pod_finalizer(NS, "p0") is False
    assert _stored(kube, PODS, "p0")["metadata"]["finalizers"] == ["example.com/keep"]  # type: ignore[index]


async def test_a_finalizer_holds_a_deleted_pod_until_removed(
    kube: KubeEmulator, cluster: Cluster, ops: KubeOps
) -> None:
    pod = await cluster.create_pod(NS, "p0")
    assert await ops.add_finalizer(pod) is True
    await kube.call("DELETE", f"/api/v1/namespaces/{NS}/pods/p0")
    held = _stored(kube, PODS, "p0")
    assert held is not None and held["metadata"]["deletionTimestamp"]
    # Being deleted: the API accepts no new finalizer, and we do not try.
    assert await ops.add_pod_finalizer(NS, "p0", "example.com/late") is False
    assert await ops.remove_finalizer(pod) is True
    assert _stored(kube, PODS, "p0") is None  # released: gone
    assert await ops.remove_finalizer(pod) is False  # a pod already gone is fine
    assert await ops.add_finalizer(pod) is False


async def test_list_events_about_some_objects(kube: KubeEmulator, cluster: Cluster, ops: KubeOps) -> None:
    for name in ("a", "b", "c"):
        await cluster.create_pod(NS, name)
    await cluster.event(NS, kind="Pod", name="a", reason="BackOff", message="one", at=1_700_000_002)
    await cluster.event(NS, kind="Pod", name="b", reason="Killing", message="two", at=1_700_000_001)
    await cluster.event(NS, kind="Pod", name="c", reason="Pulled", message="three", at=1_700_000_000)
    await cluster.event(NS, kind="Job", name="a", reason="Created", message="four", at=1_700_000_003)

    only_a = await ops.list_events(NS, involved={("Pod", "a")})
    assert [e["message"] for e in only_a] == ["one"]
    assert (
        seen(kube, "list", "v1/events")[-1].params["fieldSelector"] == "involvedObject.kind=Pod,involvedObject.name=a"
    )
    two = await ops.list_events(NS, involved={("Pod", "a"), ("Pod", "b")})
    assert [e["message"] for e in two] == ["two", "one"]  # oldest first
    everything = await ops.list_events(NS)
    assert [e["message"] for e in everything] == ["three", "two", "one", "four"]


async def test_nodes(cluster: Cluster, ops: KubeOps) -> None:
    await cluster.add_node("gpu-1", gpus=8)
    await cluster.add_node("gpu-2", gpus=8, labels={"pool": "a100"})
    node = await ops.get("node", None, "gpu-1")
    assert node is not None and node["status"]["capacity"]["nvidia.com/gpu"] == "8"
    assert await ops.get_node("gpu-9") is None
    assert [n["metadata"]["name"] for n in await ops.list_nodes()] == ["gpu-1", "gpu-2"]
    assert [n["metadata"]["name"] for n in await ops.list_nodes(label_selector={"pool": "a100"})] == ["gpu-2"]


# ------------------------------------------------------------------------------------------------
# API errors


async def _world(cluster: Cluster) -> None:
    await cluster.add_node("gpu-1", gpus=8)
    await cluster.create_pod(NS, "p0", labels={"job-name": "llama"})
    await cluster.create_pytorchjob(NS, "llama")


def _quarantine(o: KubeOps) -> Awaitable[Any]:
    return o.quarantine_node("gpu-1", incident_id="inc-1", fault_class="device_error", reason="Xid 79")


async def _delete_pytorchjob(o: KubeOps) -> Any:
    obj = await o.get_workload("kubeflow.org/v1", "PyTorchJob", NS, "llama")
    assert obj is not None
    return await o.delete_workload(obj)


FORBIDDEN = [
    pytest.param(
        lambda o: o.get_node("gpu-1"),
        ("fetch", NODES, None),
        "forbidden: cannot get nodes (cluster scope): the trainmedic brain's ClusterRole needs nodes: get",
        id="get-nodes",
    ),
    pytest.param(
        _quarantine,
        ("update", NODES, None),
        "forbidden: cannot patch nodes (cluster scope): the trainmedic brain's ClusterRole needs nodes: patch",
        id="patch-nodes",
    ),
    pytest.param(
        _quarantine,
        ("update", NODES, "status"),
        "forbidden: cannot patch nodes/status (cluster scope): "
        "the trainmedic brain's ClusterRole needs nodes/status: patch",
        id="patch-nodes-status",
    ),
    pytest.param(
        _delete_pytorchjob,
        ("delete", PYTORCH_JOBS, None),
        "forbidden: cannot delete pytorchjobs (namespace train): "
        'the Role trainmedic-remediate in namespace train needs pytorchjobs: delete in apiGroup "kubeflow.org"',
        id="delete-pytorchjobs",
    ),
    pytest.param(
        lambda o: o.list_job_pods(NS, {"job-name": "llama"}),
        ("list", PODS, None),
        "forbidden: cannot list pods (namespace train): "
        "the Role trainmedic-remediate in namespace train needs pods: list",
        id="list-pods",
    ),
    pytest.param(
        lambda o: o.add_pod_finalizer(NS, "p0"),
        ("update", PODS, None),
        "forbidden: cannot patch pods (namespace train): "
        "the Role trainmedic-remediate in namespace train needs pods: patch",
        id="patch-pods",
    ),
]


@pytest.mark.parametrize(("op", "where", "message"), FORBIDDEN)
async def test_forbidden_names_the_missing_rbac_rule(
    op: Op, where: tuple[str, str, str | None], message: str, kube: KubeEmulator, cluster: Cluster, ops: KubeOps
) -> None:
    await _world(cluster)
    action, resource, sub = where
    inject(kube, action, resource, (403, forbidden_body("x", resource)), subresource=sub, forever=True)
    before = len(seen(kube, action, resource, sub))
    with pytest.raises(KubeForbidden) as err:
        await op(ops)
    text = str(err.value)
    assert text.startswith(message)
    assert "(API: " in text and "is forbidden" in text  # the API's own words follow
    assert err.value.status == 403 and err.value.hint is not None
    role = "ClusterRole" if "cluster scope" in message else "Role trainmedic-remediate"
    assert role in err.value.hint.en and role in err.value.hint.zh
    assert len(seen(kube, action, resource, sub)) == before + 1  # permanent: not retried


async def test_unauthorized_is_permanent(kube: KubeEmulator, cluster: Cluster, ops: KubeOps) -> None:
    await _world(cluster)
    inject(kube, "fetch", NODES, 401)
    with pytest.raises(PermanentKubeError, match="unauthorized: get Node gpu-1"):
        await ops.get_node("gpu-1")
    assert len(seen(kube, "fetch", NODES)) == 1


@pytest.mark.looptime
@pytest.mark.parametrize(
    ("responses", "expected_s"),
    [
        ([(429, {"Retry-After": "7"})], 7.0),
        ([(429, {"Retry-After": "Thu, 01 Jan 1970 00:00:00 GMT"})], 0.0),  # a date in the past: at once
        ([429], 1.0),
        ([503, 503], 1.0 + 2.0),
        ([(503, {"Retry-After": "3"}), 500], 3.0 + 2.0),
        ([502, 504, 500], 1.0 + 2.0 + 4.0),
        ([(200, b"<html>502 Bad Gateway</html>")], 1.0),
    ],
    ids=["429-retry-after", "429-retry-after-date", "429-backoff", "503-twice", "503-retry-after-then-500",
         "5xx-thrice", "garbled-200"],
)  # fmt: skip
async def test_temporary_errors_are_retried_then_succeed(
    responses: list[Any], expected_s: float, kube: KubeEmulator, cluster: Cluster, ops: KubeOps
) -> None:
    await _world(cluster)
    inject(kube, "fetch", NODES, *responses)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    node = await ops.get_node("gpu-1")
    assert loop.time() - t0 == pytest.approx(expected_s, abs=0.05)
    assert node is not None and node["metadata"]["name"] == "gpu-1"
    assert len(seen(kube, "fetch", NODES)) == len(responses) + 1


@pytest.mark.looptime
@pytest.mark.parametrize(
    ("op", "where", "response", "expected_s", "delay"),
    [
        (lambda o: o.get_node("gpu-1"), ("fetch", NODES), 503, 1.0 + 2.0 + 4.0, 8.0),
        (lambda o: o.list_nodes(), ("list", NODES), 500, 1.0 + 2.0 + 4.0, 8.0),
        (
            lambda o: o.get_workload("kubeflow.org/v1", "PyTorchJob", NS, "llama"),
            ("fetch", PYTORCH_JOBS),
            (429, {"Retry-After": "600"}),
            3 * 60.0,  # Retry-After is capped (retry_after_max)
            60.0,
        ),
    ],
    ids=["get-503", "list-500", "429-retry-after-capped"],
)
async def test_temporary_errors_that_persist_are_raised_after_the_attempts(
    op: Op,
    where: tuple[str, str],
    response: Any,
    expected_s: float,
    delay: float,
    kube: KubeEmulator,
    cluster: Cluster,
    ops: KubeOps,
) -> None:
    await _world(cluster)
    inject(kube, *where, response, forever=True)
    before = len(seen(kube, *where))
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    with pytest.raises(TemporaryKubeError, match=f"gave up after {ATTEMPTS} attempts") as err:
        await op(ops)
    assert loop.time() - t0 == pytest.approx(expected_s, abs=0.05)
    assert err.value.delay == pytest.approx(delay)
    assert len(seen(kube, *where)) == before + ATTEMPTS


@pytest.mark.looptime
async def test_connection_refused_is_temporary_and_recovers_after_resume(
    kube: KubeEmulator, cluster: Cluster, ops: KubeOps
) -> None:
    await _world(cluster)
    await kube.pause()
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    with pytest.raises(TemporaryKubeError, match="connection error") as err:
        await ops.get_node("gpu-1")
    assert loop.time() - t0 == pytest.approx(1.0 + 2.0 + 4.0, abs=0.05)
    assert err.value.status is None
    await kube.resume()
    node = await ops.get_node("gpu-1")
    assert node is not None


@pytest.mark.looptime
async def test_a_server_back_during_the_backoff_is_used_at_the_next_attempt(
    kube: KubeEmulator, cluster: Cluster, ops: KubeOps
) -> None:
    await _world(cluster)
    await kube.pause()

    async def back_later() -> None:
        await asyncio.sleep(1.5)
        await kube.resume()

    loop = asyncio.get_running_loop()
    t0 = loop.time()
    task = asyncio.create_task(back_later())
    node = await ops.get_node("gpu-1")  # refused at 0 and 1 s; served at 3 s
    await task
    assert node is not None
    assert loop.time() - t0 == pytest.approx(3.0, abs=0.05)


@pytest.mark.parametrize(
    ("configured", "wanted", "pool"),
    [(4, 16, 16), (64, 16, 64), (4, None, 4), (10, 200, 200)],
    ids=["grown-to-the-bound", "never-shrunk", "left-alone", "a-large-bound"],
)
async def test_the_connection_pool_is_sized_to_the_calls_made_at_once(
    kube: KubeEmulator, configured: int, wanted: int | None, pool: int
) -> None:
    ops = KubeOps(kube.api_client(pool_maxsize=configured), pool_maxsize=wanted)
    try:
        assert ops.api.configuration.connection_pool_maxsize == pool
        assert ops.api.rest_client.pool_manager.connection_pool_kw["maxsize"] == pool
    finally:
        ops.close()
