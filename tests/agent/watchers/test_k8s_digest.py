"""The pure parts of the watchers: container digests, node/workload payloads, times, selectors, error
classification, and what one cached pod costs in memory."""

from __future__ import annotations

import copy
import gc
import json
import tracemalloc
from typing import Any

import pytest
import urllib3.exceptions
from kubernetes.client.exceptions import ApiException

from trainmedic.agent.jobindex import JobIndex
from trainmedic.agent.watchers.k8s import (
    PYTORCH_JOBS,
    LabelSelector,
    MissingResource,
    PermanentWatchError,
    PodDigest,
    ResourceGone,
    TemporaryWatchError,
    classify,
    container_digest,
    k8s_event,
    node_status,
    pod_digest,
    workload_status,
)
from trainmedic.timefmt import parse_rfc3339_ns


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        (
            {
                "name": "c",
                "ready": True,
                "restartCount": 0,
                "state": {"running": {"startedAt": "2025-01-01T00:00:00Z"}},
            },
            ("running", None, None, 0, "2025-01-01T00:00:00Z", None),
        ),
        (
            {
                "name": "c",
                "restartCount": 3,
                "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                "lastState": {
                    "terminated": {"reason": "OOMKilled", "exitCode": 137, "finishedAt": "2025-01-01T00:01:00Z"}
                },
            },
            ("terminated", "OOMKilled", 137, 3, None, "2025-01-01T00:01:00Z"),
        ),
        (
            {"name": "c", "restartCount": 0, "state": {"waiting": {"reason": "ContainerCreating"}}},
            ("waiting", "ContainerCreating", None, 0, None, None),
        ),
        (
            {"name": "c", "restartCount": 0, "state": {"terminated": {"reason": "Error", "exitCode": 1, "signal": 15}}},
            ("terminated", "Error", 1, 0, None, None),
        ),
        (
            {"name": "c", "restartCount": "many", "state": ["nonsense"], "lastState": "x"},
            ("waiting", None, None, 0, None, None),
        ),
    ],
    ids=["running", "crashloop-after-oom", "creating", "terminated", "malformed"],
)
def test_container_digest(status: dict[str, Any], expected: tuple[Any, ...]) -> None:
    d = container_digest(status)
    assert (d.state, d.reason, d.exit_code, d.restarts, d.started_at, d.finished_at) == expected


def test_init_containers_come_first_and_are_marked() -> None:
    pod = {
        "metadata": {"name": "p", "namespace": "n"},
        "status": {
            "initContainerStatuses": [
                {"name": "fetch", "state": {"terminated": {"reason": "Completed", "exitCode": 0}}}
            ],
            "containerStatuses": [{"name": "trainer", "state": {"running": {}}}],
        },
    }
    d = pod_digest(pod)
    assert [(c.name, c.init) for c in d.containers] == [("fetch", True), ("trainer", False)]
    assert d.status().containers[0]["init"] is True


@pytest.mark.parametrize(
    ("obj", "expected"),
    [
        ({"metadata": {"name": "p"}}, ("default", "p", None, None)),
        ({"metadata": {"name": "p", "namespace": "n", "uid": 7}, "spec": {"nodeName": ["x"]}}, ("n", "p", None, None)),
        ({"metadata": {"name": "p", "namespace": "n", "labels": "not-a-map"}, "status": "bad"}, ("n", "p", None, None)),
    ],
    ids=["no-namespace", "wrong-types", "not-maps"],
)
def test_pod_digest_survives_malformed_pods(obj: dict[str, Any], expected: tuple[Any, ...]) -> None:
    d = pod_digest(obj)
    assert (d.namespace, d.name, d.uid, d.node) == expected


def test_node_status_taints_without_value_and_unknown_condition() -> None:
    node = {
        "metadata": {"name": "n1", "labels": {"ai.accelerator/chip-type": "ascend"}},
        "spec": {"unschedulable": True, "taints": [{"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"}]},
        "status": {
            "conditions": [{"type": "Ready"}],
            "capacity": {"huawei.com/Ascend910": "8", "nvidia.com/gpu": "n/a"},
        },
    }
    st = node_status(node)
    assert st.taints == ["node.kubernetes.io/unreachable:NoExecute"]
    assert (st.unschedulable, st.conditions, st.accelerators, st.chip) == (
        True,
        {"Ready": "Unknown"},
        {"huawei.com/Ascend910": 8},
        "ascend",
    )


def test_pytorchjob_phase_prefers_the_terminal_condition() -> None:
    pj = {
        "metadata": {
            "name": "pt",
            "namespace": "n",
            "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{}", "team": "a"},
        },
        "spec": {"pytorchReplicaSpecs": {"Master": {"replicas": 1}, "Worker": {}}},
        "status": {
            "conditions": [
                {"type": "Created", "status": "True"},
                {"type": "Succeeded", "status": "True"},
                {"type": "Running", "status": "True"},
            ]
        },
    }
    st = workload_status(PYTORCH_JOBS, pj)
    assert (st.phase, st.replicas, st.annotations) == ("Succeeded", 2, {"team": "a"})


def test_event_of_a_pod_not_indexed_has_no_job() -> None:
    ev = k8s_event({"involvedObject": {"kind": "Pod", "name": "x", "namespace": "n"}, "reason": "Failed"}, JobIndex())
    assert (ev.job, ev.namespace, ev.count, ev.node) == (None, "n", 1, None)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2024-01-02T03:04:05Z", 1704164645_000000000),
        ("2024-01-02T03:04:05.000000001Z", 1704164645_000000001),
        ("2024-01-02T03:04:05.1234567891234Z", 1704164645_123456789),
        ("2024-01-02T05:04:05+02:00", 1704164645_000000000),
        ("2024-01-02 03:04:05z", 1704164645_000000000),
        ("2024-13-02T03:04:05Z", None),
        ("2024-01-02T03:04:05", None),
        ("yesterday", None),
    ],
)
def test_parse_rfc3339_ns(text: str, expected: int | None) -> None:
    assert parse_rfc3339_ns(text) == expected


@pytest.mark.parametrize(
    ("selector", "labels", "matches"),
    [
        ("team=llm", {"team": "llm"}, True),
        ("team==llm,tier!=batch", {"team": "llm", "tier": "prod"}, True),
        ("team=llm,tier!=batch", {"team": "llm", "tier": "batch"}, False),
        ("team in (llm, speech)", {"team": "speech"}, True),
        ("team notin (llm, speech),gpu", {"team": "cv", "gpu": ""}, True),
        ("!spot", {"spot": "true"}, False),
        ("", {}, True),
    ],
)
def test_label_selector(selector: str, labels: dict[str, str], matches: bool) -> None:
    assert LabelSelector.parse(selector).matches(labels) is matches


def _api_exc(status: int, headers: dict[str, str] | None = None, body: str | None = None) -> ApiException:
    e = ApiException(status=status, reason="reason")
    e.headers = headers
    e.body = body
    return e


@pytest.mark.parametrize(
    ("exc", "kind", "retry_after"),
    [
        (_api_exc(410), ResourceGone, None),
        (_api_exc(404), MissingResource, None),
        (_api_exc(403, body='{"message": "pods is forbidden"}'), PermanentWatchError, None),
        (_api_exc(401), PermanentWatchError, None),
        (_api_exc(400), PermanentWatchError, None),
        (_api_exc(429, {"Retry-After": "7"}), TemporaryWatchError, 7.0),
        (_api_exc(503, {"Retry-After": "99999"}), TemporaryWatchError, 300.0),
        (_api_exc(500), TemporaryWatchError, None),
        (_api_exc(429, {"Retry-After": "soon"}), TemporaryWatchError, None),
        (urllib3.exceptions.ProtocolError("Connection broken"), TemporaryWatchError, None),
        (ConnectionRefusedError(111, "refused"), TemporaryWatchError, None),
        (ValueError("Expecting value"), TemporaryWatchError, None),
    ],
    ids=[
        "410",
        "404",
        "403",
        "401",
        "400",
        "429",
        "503-capped",
        "500",
        "429-bad-header",
        "protocol",
        "refused",
        "json",
    ],
)
def test_classify(exc: Exception, kind: type, retry_after: float | None) -> None:
    err = classify(exc, resource="pods", verb="list")
    assert isinstance(err, kind)
    assert getattr(err, "retry_after", None) == retry_after


def test_classify_leaves_programming_errors_alone() -> None:
    assert classify(RuntimeError("bug"), resource="pods", verb="list") is None


def test_forbidden_message_names_the_resource_and_verb() -> None:
    err = classify(
        _api_exc(403, body='{"message": "pods is forbidden: User x cannot watch"}'), resource="pods", verb="watch"
    )
    assert isinstance(err, PermanentWatchError) and err.kind == "forbidden"
    assert "'watch' on 'pods'" in str(err) and "pods is forbidden" in str(err)


# A pod as a real API server returns it (~5 KB of JSON, managedFields trimmed): what each cached pod costs is measured
# against this, after the JSON object itself is gone (only the digest and the index entry stay).
POD_TEMPLATE: dict[str, Any] = {
    "metadata": {
        "name": "llama-70b-{i}-abcde",
        "generateName": "llama-70b-{i}-",
        "namespace": "train",
        "uid": "5d0a6ab4-0000-4000-8000-{i:012d}",
        "resourceVersion": "{i}123456",
        "creationTimestamp": "2025-01-01T00:00:00Z",
        "labels": {
            "batch.kubernetes.io/controller-uid": "0c8e7c8a-2d5b-4f32-9d0a-2b5a2c6f0001",
            "batch.kubernetes.io/job-name": "llama-70b",
            "controller-uid": "0c8e7c8a-2d5b-4f32-9d0a-2b5a2c6f0001",
            "job-name": "llama-70b",
            "batch.kubernetes.io/job-completion-index": "{i}",
            "app.kubernetes.io/part-of": "training-platform",
        },
        "annotations": {"batch.kubernetes.io/job-completion-index": "{i}", "prometheus.io/scrape": "true"},
        "ownerReferences": [
            {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "name": "llama-70b",
                "uid": "0c8e7c8a-2d5b-4f32-9d0a-2b5a2c6f0001",
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ],
        "managedFields": [
            {"manager": "kube-controller-manager", "operation": "Update", "fieldsV1": {"f:metadata": {"f:labels": {}}}},
            {"manager": "kubelet", "operation": "Update", "subresource": "status", "fieldsV1": {"f:status": {}}},
        ],
    },
    "spec": {
        "nodeName": "gpu-node-{n}",
        "restartPolicy": "Never",
        "containers": [
            {
                "name": "trainer",
                "image": "registry.example/llm/train:2025.01",
                "command": ["torchrun", "--nnodes=128", "--nproc-per-node=8", "train.py", "--config=/etc/cfg/70b.yaml"],
                "env": [{"name": f"VAR_{k}", "value": "x" * 40} for k in range(20)],
                "resources": {"limits": {"nvidia.com/gpu": "8", "memory": "1600Gi"}, "requests": {"cpu": "90"}},
                "volumeMounts": [{"name": f"vol{k}", "mountPath": f"/mnt/{k}"} for k in range(6)],
            }
        ],
        "volumes": [{"name": f"vol{k}", "persistentVolumeClaim": {"claimName": f"pvc-{k}"}} for k in range(6)],
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    },
    "status": {
        "phase": "Running",
        "hostIP": "10.0.0.{n}",
        "podIP": "10.244.{n}.10",
        "startTime": "2025-01-01T00:00:05Z",
        "conditions": [
            {"type": t, "status": "True", "lastTransitionTime": "2025-01-01T00:00:10Z"}
            for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")
        ],
        "containerStatuses": [
            {
                "name": "trainer",
                "ready": True,
                "restartCount": 1,
                "started": True,
                "image": "registry.example/llm/train:2025.01",
                "imageID": "registry.example/llm/train@sha256:" + "0" * 64,
                "containerID": "containerd://" + "a" * 64,
                "state": {"running": {"startedAt": "2025-01-01T00:00:10Z"}},
                "lastState": {
                    "terminated": {
                        "exitCode": 137,
                        "reason": "OOMKilled",
                        "startedAt": "2025-01-01T00:00:06Z",
                        "finishedAt": "2025-01-01T00:00:09Z",
                        "containerID": "containerd://" + "b" * 64,
                    }
                },
            }
        ],
    },
}


def _pod_json(i: int) -> bytes:
    text = json.dumps(POD_TEMPLATE)
    return text.replace("{i}", str(i)).replace("{i:012d}", f"{i:012d}").replace("{n}", str(i % 128)).encode()


def test_a_cached_pod_costs_a_few_kilobytes() -> None:
    n = 1000
    raw = [_pod_json(i) for i in range(n)]
    assert len(raw[0]) > 4000
    jobs = JobIndex()
    cache: dict[str, PodDigest] = {}
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for data in raw:
            pod = json.loads(data)  # as the reflector parses it; dropped right after
            info = jobs.update_pod(pod)
            cache[f"{info.namespace}/{info.name}"] = pod_digest(pod, info)
            del pod
        gc.collect()
        per_pod = (tracemalloc.get_traced_memory()[0] - before) / n
    finally:
        tracemalloc.stop()
    assert len(cache) == len(jobs) == n
    # The digest + the JobIndex entry, against ~5 KB of JSON (and several times that as dicts).
    assert per_pod < 6000, f"{per_pod:.0f} bytes per cached pod"
    print(f"memory per cached pod: {per_pod:.0f} bytes")


def test_digest_equality_ignores_labels_but_not_containers() -> None:
    pod = json.loads(_pod_json(1))
    a = pod_digest(pod)
    relabelled = copy.deepcopy(pod)
    relabelled["metadata"]["labels"]["new"] = "x"
    assert pod_digest(relabelled).meaningful() == a.meaningful()
    restarted = copy.deepcopy(pod)
    restarted["status"]["containerStatuses"][0]["restartCount"] = 2
    assert pod_digest(restarted).meaningful() != a.meaningful()
