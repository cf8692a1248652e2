"""Workload adapters: the recreated body of a batch/v1 Job, a Volcano Job and a PyTorchJob keeps the
workload's identity and gang settings, resumes from the checkpoint, stays off the excluded nodes,
and a second recreation replaces what the first added instead of stacking it. The last tests send
the bodies through the emulated API server with the official client."""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from typing import Any

import pytest
import pytest_asyncio
from hypothesis import given
from hypothesis import strategies as st
from kubernetes.utils import quantity as client_quantity
from servers.kube import Cluster, KubeEmulator, require_kmock

from trainmedic.remediations.workloads import (
    ANN_EXCLUDED_NODES,
    ANN_INCIDENT,
    ANN_LINEAGE,
    ANN_REMEDIATE,
    ANN_RESTARTS,
    ANN_RESUME_ARGS,
    ANN_RESUME_ARGS_APPLIED,
    ANN_RESUME_CONTAINER,
    ANN_RESUME_ENV,
    ANN_RESUMED_FROM,
    DEFAULT_RESUME_ENV,
    HOSTNAME_LABEL,
    JOB,
    LINEAGE_LIMIT,
    PYTORCH_JOB,
    RESUME_STEP_ENV,
    VOLCANO_JOB,
    InvalidResumeConfig,
    InvalidResumeTemplate,
    MalformedWorkload,
    OptedOut,
    QuantityError,
    UnsupportedWorkload,
    WorkloadError,
    build_recreation,
    format_quantity,
    job_pod_selector,
    memory_bytes,
    parse_quantity,
    pod_templates,
    pod_templates_by_path,
    raise_memory,
    recreate_body,
    render_resume_args,
    resume_spec,
    workload_kind,
    workload_kind_for,
)

NOW = 1_767_225_600.0  # 2026-01-01T00:00:00Z
GI = 1024**3
MI = 1024**2
CTRL_UID = "6f1c0d2e-4a5b-4c3d-9e8f-0a1b2c3d4e5f"


@dataclass(frozen=True)
class Ckpt:
    """What the restart needs of remediations.checkpoints.Checkpoint."""

    path: str
    step: int | None


CK100 = Ckpt("/ckpt/llama/checkpoint-100", 100)
CK200 = Ckpt("/ckpt/llama/checkpoint-200", 200)


# -- objects as the API server returns them --------------------------------------------------------


def server_meta(name: str, **extra: Any) -> dict[str, Any]:
    """What the API server adds to every object (and a client GET returns)."""
    meta: dict[str, Any] = {
        "name": name,
        "namespace": "train",
        "uid": CTRL_UID,
        "resourceVersion": "48213",
        "generation": 3,
        "creationTimestamp": "2025-12-31T10:00:00Z",
        "selfLink": f"/apis/x/{name}",
        "managedFields": [{"manager": "kubectl-client-side-apply", "operation": "Update", "apiVersion": "v1"}],
        "finalizers": ["batch.kubernetes.io/job-tracking"],
        "labels": {"team": "llm", "app": name},
        "annotations": {"owner": "alice", ANN_RESUME_ARGS: "--resume_from_checkpoint={checkpoint}"},
    }
    meta.update(extra)
    return meta


def container(name: str = "trainer", **extra: Any) -> dict[str, Any]:
    """The container the Cluster stand-in's controllers write (Cluster._container_spec)."""
    return {"name": name, "image": "registry.example/train:1", "command": ["torchrun", "train.py"], **extra}


def cluster_job() -> dict[str, Any]:
    """Cluster.create_job's Job after the API server and the Job controller touched it."""
    generated = {
        "batch.kubernetes.io/controller-uid": CTRL_UID,
        "batch.kubernetes.io/job-name": "llama",
        "controller-uid": CTRL_UID,
        "job-name": "llama",
    }
    meta = server_meta("llama")
    meta["labels"] = {**meta["labels"], **generated}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": meta,
        "spec": {
            "completions": 2,
            "parallelism": 2,
            "completionMode": "Indexed",
            "backoffLimit": 0,
            "selector": {"matchLabels": {"batch.kubernetes.io/controller-uid": CTRL_UID}},
            "manualSelector": False,
            "suspend": False,
            "template": {
                "metadata": {"creationTimestamp": None, "labels": {**generated, "app": "llama"}},
                "spec": {"restartPolicy": "Never", "containers": [container()]},
            },
        },
        "status": {"active": 2, "startTime": "2025-12-31T10:00:01Z"},
    }


def cluster_vcjob() -> dict[str, Any]:
    """Cluster.create_volcano_job's Volcano Job."""
    return {
        "apiVersion": "batch.volcano.sh/v1alpha1",
        "kind": "Job",
        "metadata": server_meta("vc"),
        "spec": {
            "minAvailable": 3,
            "schedulerName": "volcano",
            "queue": "default",
            "plugins": {"pytorch": ["--master=master", "--worker=worker", "--port=23456"]},
            "tasks": [
                {
                    "name": t,
                    "replicas": n,
                    "template": {"spec": {"restartPolicy": "OnFailure", "containers": [container("pytorch")]}},
                }
                for t, n in (("master", 1), ("worker", 2))
            ],
        },
        "status": {"state": {"phase": "Running"}},
    }


def cluster_pytorchjob() -> dict[str, Any]:
    """Cluster.create_pytorchjob's PyTorchJob."""
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": server_meta("pt"),
        "spec": {
            "pytorchReplicaSpecs": {
                rtype: {
                    "replicas": n,
                    "restartPolicy": "OnFailure",
                    "template": {"spec": {"containers": [container("pytorch")]}},
                }
                for rtype, n in (("Master", 1), ("Worker", 2))
            }
        },
        "status": {"conditions": [{"type": "Created", "status": "True", "reason": "PyTorchJobCreated"}]},
    }


AFFINITY: dict[str, Any] = {
    "nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In", "values": ["H100"]}]},
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["gpu-7", "gpu-8"]}]},
            ]
        },
        "preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 50, "preference": {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}}
        ],
    },
    "podAntiAffinity": {
        "preferredDuringSchedulingIgnoredDuringExecution": [
            {
                "weight": 10,
                "podAffinityTerm": {"topologyKey": HOSTNAME_LABEL, "labelSelector": {"matchLabels": {"app": "x"}}},
            }
        ]
    },
}
TOLERATIONS = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]


def rich_pod_spec(main: str = "trainer") -> dict[str, Any]:
    return {
        "restartPolicy": "Never",
        "affinity": copy.deepcopy(AFFINITY),
        "tolerations": copy.deepcopy(TOLERATIONS),
        "initContainers": [{"name": "fetch", "image": "busybox", "args": ["sync"]}],
        "containers": [
            {
                "name": main,
                "image": "registry.example/train:1",
                "command": ["torchrun"],
                "args": ["--nproc_per_node=8", "train.py", "--bf16"],
                "env": [
                    {"name": "A", "value": "1"},
                    {
                        "name": DEFAULT_RESUME_ENV,
                        "valueFrom": {"configMapKeyRef": {"name": "resume", "key": "path"}},
                    },
                    {"name": "B", "value": "$(A)"},
                    {"name": DEFAULT_RESUME_ENV, "value": "stale-duplicate"},
                ],
                "resources": {"limits": {"memory": "64Gi", "nvidia.com/gpu": "8"}, "requests": {"memory": "64Gi"}},
            },
            {"name": "sidecar", "image": "fluent-bit", "resources": {"limits": {"memory": "256Mi"}}},
        ],
    }


def rich_job() -> dict[str, Any]:
    """An Indexed Job with per-index backoff, a pod failure policy, two ORed node terms, env valueFrom."""
    job = cluster_job()
    job["spec"].update(
        {
            "completions": 4,
            "parallelism": 4,
            "backoffLimitPerIndex": 1,
            "maxFailedIndexes": 2,
            "ttlSecondsAfterFinished": 3600,
            "podFailurePolicy": {
                "rules": [
                    {"action": "FailJob", "onExitCodes": {"containerName": "trainer", "operator": "In", "values": [42]}}
                ]
            },
        }
    )
    job["spec"].pop("backoffLimit")
    job["spec"]["template"]["spec"] = rich_pod_spec()
    return job


def manual_job() -> dict[str, Any]:
    job = cluster_job()
    job["metadata"]["labels"] = {"team": "llm"}
    job["spec"]["manualSelector"] = True
    job["spec"]["selector"] = {"matchLabels": {"run": "llama-7"}}
    job["spec"]["template"]["metadata"] = {"labels": {"run": "llama-7"}}
    return job


def rich_vcjob() -> dict[str, Any]:
    """A Volcano gang job: task minAvailable, policies at both levels, priority class, more plugins."""
    vc = cluster_vcjob()
    vc["spec"].update(
        {
            "minAvailable": 5,
            "priorityClassName": "training-high",
            "maxRetry": 3,
            "queue": "llm",
            "policies": [{"event": "PodEvicted", "action": "RestartJob"}],
            "plugins": {"svc": [], "env": [], "pytorch": ["--master=master", "--worker=worker"]},
        }
    )
    vc["spec"]["tasks"] = [
        {"name": "master", "replicas": 1, "minAvailable": 1, "template": {"spec": rich_pod_spec("pytorch")}},
        {
            "name": "worker",
            "replicas": 4,
            "minAvailable": 4,
            "policies": [{"event": "TaskCompleted", "action": "CompleteJob"}],
            "template": {"spec": rich_pod_spec("pytorch")},
        },
    ]
    return vc


def elastic_pytorchjob() -> dict[str, Any]:
    pj = cluster_pytorchjob()
    pj["spec"]["elasticPolicy"] = {"rdzvBackend": "c10d", "minReplicas": 2, "maxReplicas": 4, "maxRestarts": 3}
    pj["spec"]["nprocPerNode"] = "8"
    pj["spec"]["runPolicy"] = {"cleanPodPolicy": "None", "backoffLimit": 2}
    specs = pj["spec"]["pytorchReplicaSpecs"]
    specs.pop("Master")
    specs["Worker"]["replicas"] = 4
    specs["Worker"]["template"]["spec"] = rich_pod_spec("pytorch")
    return pj


OBJECTS: dict[str, Callable[[], dict[str, Any]]] = {
    "job": cluster_job,
    "job-rich": rich_job,
    "job-manual-selector": manual_job,
    "volcano": cluster_vcjob,
    "volcano-rich": rich_vcjob,
    "pytorchjob": cluster_pytorchjob,
    "pytorchjob-elastic": elastic_pytorchjob,
}
RICH = ["job-rich", "volcano-rich", "pytorchjob-elastic"]
PLAIN = ["job", "volcano", "pytorchjob"]


def recreate(
    obj: dict[str, Any], nodes: list[str] | None = None, ckpt: Ckpt | None = CK100, **kw: Any
) -> dict[str, Any]:
    return recreate_body(obj, incident_id="inc-1", checkpoint=ckpt, exclude_nodes=nodes or ["gpu-3"], now=NOW, **kw)


def live_again(body: dict[str, Any], uid: str) -> dict[str, Any]:
    """A recreated body as the API server would serve it back (a new uid, server fields)."""
    obj = copy.deepcopy(body)
    obj["metadata"].update(uid=uid, resourceVersion="99", creationTimestamp="2026-01-01T00:00:05Z")
    obj["status"] = {}
    return obj


def ours(expr: dict[str, Any]) -> bool:
    return expr.get("key") == HOSTNAME_LABEL and expr.get("operator") == "NotIn"


def main_containers(obj: dict[str, Any]) -> list[dict[str, Any]]:
    return [t["spec"]["containers"][0] for t in pod_templates(obj)]


def env_of(c: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c.get("env") or []}


# -- kinds -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("make", "expected"),
    [(cluster_job, JOB), (cluster_vcjob, VOLCANO_JOB), (cluster_pytorchjob, PYTORCH_JOB)],
    ids=["job", "volcano", "pytorchjob"],
)
def test_workload_kind(make: Callable[[], dict[str, Any]], expected: Any) -> None:
    obj = make()
    assert workload_kind(obj) == expected
    assert workload_kind_for(obj["apiVersion"], obj["kind"]) is expected


def test_kind_resources() -> None:
    assert (JOB.group, JOB.version, JOB.plural) == ("batch", "v1", "jobs")
    assert (VOLCANO_JOB.group, VOLCANO_JOB.version, VOLCANO_JOB.plural) == ("batch.volcano.sh", "v1alpha1", "jobs")
    assert (PYTORCH_JOB.group, PYTORCH_JOB.version, PYTORCH_JOB.plural) == ("kubeflow.org", "v1", "pytorchjobs")


@pytest.mark.parametrize(
    ("api_version", "kind"),
    [
        ("apps/v1", "Deployment"),
        ("apps/v1", "StatefulSet"),
        ("kubeflow.org/v2beta1", "MPIJob"),
        ("kubeflow.org/v1", "TFJob"),
        ("v1", "Pod"),
        ("batch/v1", "CronJob"),
        ("batch/v1beta1", "Job"),
        ("", ""),
    ],
)
def test_unsupported_kind(api_version: str, kind: str) -> None:
    obj = {"apiVersion": api_version, "kind": kind, "metadata": {"name": "x"}, "spec": {}}
    with pytest.raises(UnsupportedWorkload) as err:
        workload_kind(obj)
    assert "supported: batch/v1 Job, batch.volcano.sh/v1alpha1 Job, kubeflow.org/v1 PyTorchJob" in str(err.value)
    assert "支持" in err.value.reason.zh
    with pytest.raises(UnsupportedWorkload):
        recreate(obj)


def test_typed_model_refused_clearly() -> None:
    with pytest.raises(MalformedWorkload, match="sanitize_for_serialization"):
        workload_kind({"api_version": "batch/v1", "metadata": {"name": "x"}})


# -- identity and server fields ---------------------------------------------------------------------


@pytest.mark.parametrize("name", list(OBJECTS))
def test_identity_kept(name: str) -> None:
    obj = OBJECTS[name]()
    body = recreate(obj)
    meta = body["metadata"]
    assert (body["apiVersion"], body["kind"]) == (obj["apiVersion"], obj["kind"])
    assert (meta["name"], meta["namespace"]) == (obj["metadata"]["name"], "train")
    assert {k: v for k, v in meta["labels"].items() if k in ("team", "app")} == {
        k: v for k, v in obj["metadata"]["labels"].items() if k in ("team", "app")
    }
    for key, value in obj["metadata"]["annotations"].items():
        assert meta["annotations"][key] == value


@pytest.mark.parametrize("name", list(OBJECTS))
def test_server_fields_dropped(name: str) -> None:
    obj = OBJECTS[name]()
    before = copy.deepcopy(obj)
    body = recreate(obj)
    assert set(body) == {"apiVersion", "kind", "metadata", "spec"}
    assert set(body["metadata"]) <= {"name", "namespace", "labels", "annotations"}
    for tmpl in pod_templates(body):
        assert "creationTimestamp" not in (tmpl.get("metadata") or {})
    assert obj == before, "the live object is not changed"
    json.dumps(body)  # plain JSON, ready for the client


def test_job_generated_selector_and_labels_dropped() -> None:
    body = recreate(cluster_job())
    assert "selector" not in body["spec"]
    assert body["spec"]["template"]["metadata"] == {"labels": {"app": "llama"}}
    assert body["metadata"]["labels"] == {"team": "llm", "app": "llama"}


def test_job_label_with_another_value_is_the_users() -> None:
    job = cluster_job()
    job["metadata"]["labels"]["job-name"] = "something-else"
    assert recreate(job)["metadata"]["labels"]["job-name"] == "something-else"


def test_manual_selector_kept() -> None:
    body = recreate(manual_job())
    assert body["spec"]["selector"] == {"matchLabels": {"run": "llama-7"}}
    assert body["spec"]["template"]["metadata"]["labels"] == {"run": "llama-7"}


def test_job_spec_kept() -> None:
    job = rich_job()
    spec = recreate(job)["spec"]
    for key in (
        "completionMode",
        "completions",
        "parallelism",
        "backoffLimitPerIndex",
        "maxFailedIndexes",
        "podFailurePolicy",
        "ttlSecondsAfterFinished",
        "suspend",
        "manualSelector",
    ):
        assert spec[key] == job["spec"][key], key


def test_volcano_gang_settings_kept() -> None:
    vc = rich_vcjob()
    spec = recreate(vc)["spec"]
    assert {k: v for k, v in spec.items() if k != "tasks"} == {k: v for k, v in vc["spec"].items() if k != "tasks"}
    for new, old in zip(spec["tasks"], vc["spec"]["tasks"], strict=True):
        assert {k: v for k, v in new.items() if k != "template"} == {k: v for k, v in old.items() if k != "template"}


def test_pytorchjob_elastic_kept() -> None:
    pj = elastic_pytorchjob()
    spec = recreate(pj)["spec"]
    for key in ("elasticPolicy", "nprocPerNode", "runPolicy"):
        assert spec[key] == pj["spec"][key]
    assert set(spec["pytorchReplicaSpecs"]) == {"Worker"}
    assert spec["pytorchReplicaSpecs"]["Worker"]["replicas"] == 4


@pytest.mark.parametrize("name", PLAIN)
def test_owned_by_a_controller_refused(name: str) -> None:
    obj = OBJECTS[name]()
    obj["metadata"]["ownerReferences"] = [
        {"apiVersion": "batch/v1", "kind": "CronJob", "name": "nightly", "uid": "u", "controller": True}
    ]
    with pytest.raises(UnsupportedWorkload, match="controlled by CronJob nightly"):
        recreate(obj)


def test_non_controller_owner_kept() -> None:
    job = cluster_job()
    owner = {"apiVersion": "v1", "kind": "ConfigMap", "name": "run-7", "uid": "u"}
    job["metadata"]["ownerReferences"] = [owner]
    assert recreate(job)["metadata"]["ownerReferences"] == [owner]


# -- node exclusion --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", PLAIN)
def test_exclusion_added_as_a_new_term(name: str) -> None:
    body = recreate(OBJECTS[name](), ["gpu-3", "gpu-1", "gpu-3"])
    for tmpl in pod_templates(body):
        required = tmpl["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert required == {
            "nodeSelectorTerms": [
                {"matchExpressions": [{"key": HOSTNAME_LABEL, "operator": "NotIn", "values": ["gpu-1", "gpu-3"]}]}
            ]
        }
    assert body["metadata"]["annotations"][ANN_EXCLUDED_NODES] == "gpu-1,gpu-3"


@pytest.mark.parametrize("name", RICH)
def test_exclusion_in_every_term(name: str) -> None:
    body = recreate(OBJECTS[name](), ["gpu-3"])
    for tmpl in pod_templates(body):
        affinity = tmpl["spec"]["affinity"]
        terms = affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        assert len(terms) == 2
        assert terms[0]["matchExpressions"] == [
            {"key": "nvidia.com/gpu.product", "operator": "In", "values": ["H100"]},
            {"key": HOSTNAME_LABEL, "operator": "NotIn", "values": ["gpu-3"]},
        ]
        assert (
            terms[1]["matchFields"]
            == AFFINITY["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][1][
                "matchFields"
            ]
        )
        assert terms[1]["matchExpressions"] == [{"key": HOSTNAME_LABEL, "operator": "NotIn", "values": ["gpu-3"]}]
        preferred = affinity["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
        assert preferred == AFFINITY["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
        assert affinity["podAntiAffinity"] == AFFINITY["podAntiAffinity"]


@pytest.mark.parametrize("name", list(OBJECTS))
def test_no_toleration_added(name: str) -> None:
    obj = OBJECTS[name]()
    before = [t["spec"].get("tolerations") for t in pod_templates(obj)]
    after = [t["spec"].get("tolerations") for t in pod_templates(recreate(obj))]
    assert after == before


def test_empty_term_left_empty() -> None:
    """An empty term matches no node; giving it our expression would let pods go anywhere else."""
    job = cluster_job()
    job["spec"]["template"]["spec"]["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{}, {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["a"]}]}]
            }
        }
    }
    terms = recreate(job)["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    assert terms[0] == {}
    assert [e for e in terms[1]["matchExpressions"] if ours(e)] == [
        {"key": HOSTNAME_LABEL, "operator": "NotIn", "values": ["gpu-3"]}
    ]


def test_users_own_hostname_exclusion_kept() -> None:
    job = cluster_job()
    user = {"key": HOSTNAME_LABEL, "operator": "NotIn", "values": ["flaky-9"]}
    job["spec"]["template"]["spec"]["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [user]}]}
        }
    }
    first = recreate(job, ["gpu-3"])
    second = recreate(live_again(first, "uid-2"), ["gpu-4"])
    exprs = second["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"][0]["matchExpressions"]
    assert exprs == [user, {"key": HOSTNAME_LABEL, "operator": "NotIn", "values": ["gpu-3", "gpu-4"]}]


def test_nothing_to_exclude_leaves_affinity_alone() -> None:
    body = recreate_body(cluster_job(), incident_id="i", checkpoint=CK100, exclude_nodes=[], now=NOW)
    assert "affinity" not in body["spec"]["template"]["spec"]
    assert ANN_EXCLUDED_NODES not in body["metadata"]["annotations"]


@pytest.mark.parametrize("nodes", ["gpu-1", ["a,b"], [""], ["has space"], [None]])
def test_bad_node_names(nodes: Any) -> None:
    with pytest.raises(ValueError, match="node name"):
        recreate_body(cluster_job(), incident_id="i", checkpoint=CK100, exclude_nodes=nodes, now=NOW)


# -- resume ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(OBJECTS))
def test_resume_env_and_args(name: str) -> None:
    obj = OBJECTS[name]()
    args_before = [list(c.get("args") or []) for c in main_containers(obj)]
    body = recreate(obj)
    for c, before in zip(main_containers(body), args_before, strict=True):
        env = env_of(c)
        assert env[DEFAULT_RESUME_ENV] == CK100.path
        assert env[RESUME_STEP_ENV] == "100"
        assert c["args"] == [*before, f"--resume_from_checkpoint={CK100.path}"]
    ann = body["metadata"]["annotations"]
    assert ann[ANN_RESUMED_FROM] == CK100.path
    assert ann[ANN_INCIDENT] == "inc-1"
    assert ann[ANN_RESTARTS] == "1"
    applied = json.loads(ann[ANN_RESUME_ARGS_APPLIED])
    containers = sum(len(t["spec"]["containers"]) for t in pod_templates(body))
    assert len(applied) == containers
    assert all(v == [f"--resume_from_checkpoint={CK100.path}"] for v in applied.values())


@pytest.mark.parametrize("name", RICH)
def test_env_replaced_in_place(name: str) -> None:
    """A valueFrom entry of the same name is replaced where it stood ($(A) references keep working);
    a later duplicate is dropped."""
    c = main_containers(recreate(OBJECTS[name]()))[0]
    assert c["env"] == [
        {"name": "A", "value": "1"},
        {"name": DEFAULT_RESUME_ENV, "value": CK100.path},
        {"name": "B", "value": "$(A)"},
        {"name": RESUME_STEP_ENV, "value": "100"},
    ]


@pytest.mark.parametrize("name", RICH)
def test_sidecars_get_resume_and_init_containers_do_not(name: str) -> None:
    body = recreate(OBJECTS[name]())
    for tmpl in pod_templates(body):
        assert tmpl["spec"]["initContainers"] == [{"name": "fetch", "image": "busybox", "args": ["sync"]}]
        assert env_of(tmpl["spec"]["containers"][1])[DEFAULT_RESUME_ENV] == CK100.path


@pytest.mark.parametrize("name", RICH)
def test_resume_container_selects(name: str) -> None:
    obj = OBJECTS[name]()
    main = main_containers(obj)[0]["name"]
    obj["metadata"]["annotations"][ANN_RESUME_CONTAINER] = main
    body = recreate(obj)
    for tmpl in pod_templates(body):
        assert DEFAULT_RESUME_ENV in env_of(tmpl["spec"]["containers"][0])
        assert "env" not in tmpl["spec"]["containers"][1]


@pytest.mark.parametrize("name", RICH)
def test_init_container_named_explicitly(name: str) -> None:
    obj = OBJECTS[name]()
    obj["metadata"]["annotations"][ANN_RESUME_CONTAINER] = "fetch"
    for tmpl in pod_templates(recreate(obj)):
        init = tmpl["spec"]["initContainers"][0]
        assert env_of(init)[DEFAULT_RESUME_ENV] == CK100.path
        assert init["args"] == ["sync", f"--resume_from_checkpoint={CK100.path}"]
        assert "--resume_from_checkpoint" not in " ".join(tmpl["spec"]["containers"][0]["args"])


def test_resume_container_missing() -> None:
    job = cluster_job()
    job["metadata"]["annotations"][ANN_RESUME_CONTAINER] = "nope"
    with pytest.raises(InvalidResumeConfig, match="no pod template has a container named nope"):
        recreate(job)


def test_custom_env_name() -> None:
    job = cluster_job()
    job["metadata"]["annotations"][ANN_RESUME_ENV] = "RESUME_DIR"
    env = env_of(recreate(job)["spec"]["template"]["spec"]["containers"][0])
    assert env["RESUME_DIR"] == CK100.path
    assert DEFAULT_RESUME_ENV not in env


@pytest.mark.parametrize("bad", ["1NAME", "A=B", RESUME_STEP_ENV])
def test_bad_env_name(bad: str) -> None:
    job = cluster_job()
    job["metadata"]["annotations"][ANN_RESUME_ENV] = bad
    assert resume_spec(job).problems
    with pytest.raises(InvalidResumeConfig, match=ANN_RESUME_ENV):
        recreate(job)


def test_command_without_args_gets_args() -> None:
    c = recreate(cluster_job())["spec"]["template"]["spec"]["containers"][0]
    assert c["command"] == ["torchrun", "train.py"]
    assert c["args"] == [f"--resume_from_checkpoint={CK100.path}"]


def test_no_template_means_env_only() -> None:
    job = cluster_job()
    del job["metadata"]["annotations"][ANN_RESUME_ARGS]
    body = recreate(job)
    c = body["spec"]["template"]["spec"]["containers"][0]
    assert "args" not in c
    assert env_of(c)[DEFAULT_RESUME_ENV] == CK100.path
    assert ANN_RESUME_ARGS_APPLIED not in body["metadata"]["annotations"]


@pytest.mark.parametrize("name", RICH + PLAIN)
def test_second_recreation_replaces(name: str) -> None:
    first = recreate(OBJECTS[name](), ["gpu-3"], CK100)
    second = recreate_body(
        live_again(first, "uid-2"),
        incident_id="inc-2",
        checkpoint=CK200,
        exclude_nodes=["gpu-5", "gpu-3"],
        now=NOW + 60,
    )
    for tmpl in pod_templates(second):
        terms = tmpl["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
            "nodeSelectorTerms"
        ]
        for term in terms:
            assert [e for e in term["matchExpressions"] if ours(e)] == [
                {"key": HOSTNAME_LABEL, "operator": "NotIn", "values": ["gpu-3", "gpu-5"]}
            ]
    for c_first, c_second in zip(main_containers(first), main_containers(second), strict=True):
        assert c_second["args"] == [*c_first["args"][:-1], f"--resume_from_checkpoint={CK200.path}"]
        names = [e["name"] for e in c_second["env"]]
        assert names.count(DEFAULT_RESUME_ENV) == names.count(RESUME_STEP_ENV) == 1
        assert env_of(c_second)[DEFAULT_RESUME_ENV] == CK200.path
        assert env_of(c_second)[RESUME_STEP_ENV] == "200"
    ann = second["metadata"]["annotations"]
    assert ann[ANN_RESTARTS] == "2"
    assert ann[ANN_INCIDENT] == "inc-2"
    assert ann[ANN_EXCLUDED_NODES] == "gpu-3,gpu-5"
    assert ann[ANN_RESUMED_FROM] == CK200.path
    assert json.loads(ann[ANN_LINEAGE]) == [
        {
            "uid": CTRL_UID,
            "incident": "inc-1",
            "time": "2026-01-01T00:00:00Z",
            "checkpoint": CK100.path,
            "step": 100,
            "excluded_nodes": ["gpu-3"],
        },
        {
            "uid": "uid-2",
            "incident": "inc-2",
            "time": "2026-01-01T00:01:00Z",
            "checkpoint": CK200.path,
            "step": 200,
            "excluded_nodes": ["gpu-3", "gpu-5"],
        },
    ]


def test_template_dropped_later_removes_our_args() -> None:
    first = recreate(cluster_job())
    again = live_again(first, "uid-2")
    del again["metadata"]["annotations"][ANN_RESUME_ARGS]
    body = recreate(again, ckpt=CK200)
    assert "args" not in body["spec"]["template"]["spec"]["containers"][0]
    assert ANN_RESUME_ARGS_APPLIED not in body["metadata"]["annotations"]


@pytest.mark.parametrize("name", RICH + PLAIN)
def test_no_checkpoint(name: str) -> None:
    """No complete checkpoint: containers untouched, nodes still excluded, lineage says null."""
    obj = OBJECTS[name]()
    before = [copy.deepcopy(c) for t in pod_templates(obj) for c in t["spec"]["containers"]]
    body = recreate(obj, ["gpu-3"], None)
    assert [c for t in pod_templates(body) for c in t["spec"]["containers"]] == before
    for tmpl in pod_templates(body):
        assert tmpl["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    ann = body["metadata"]["annotations"]
    assert ANN_RESUMED_FROM not in ann
    entry = json.loads(ann[ANN_LINEAGE])[-1]
    assert (entry["checkpoint"], entry["step"]) == (None, None)


def test_unknown_step() -> None:
    job = cluster_job()
    del job["metadata"]["annotations"][ANN_RESUME_ARGS]
    first = recreate(job, ckpt=CK100)
    body = recreate(live_again(first, "u2"), ckpt=Ckpt("/ckpt/llama/final", None))
    env = env_of(body["spec"]["template"]["spec"]["containers"][0])
    assert env[DEFAULT_RESUME_ENV] == "/ckpt/llama/final"
    assert RESUME_STEP_ENV not in env, "a stale step would lie"


def test_step_placeholder_needs_a_step() -> None:
    job = cluster_job()
    job["metadata"]["annotations"][ANN_RESUME_ARGS] = "--resume {checkpoint} --step {step}"
    with pytest.raises(InvalidResumeTemplate, match="no known step"):
        recreate(job, ckpt=Ckpt("/ckpt/final", None))


@pytest.mark.parametrize(
    ("template", "path", "expected"),
    [
        ("--resume_from_checkpoint={checkpoint}", "/c/ck-1", ["--resume_from_checkpoint=/c/ck-1"]),
        ("--load {checkpoint} --ckpt-step {step}", "/c/ck-1", ["--load", "/c/ck-1", "--ckpt-step", "7"]),
        ("--load {checkpoint}", "/c/my ckpt/1", ["--load", "/c/my ckpt/1"]),
        ("'--tag=resume {step}'", "/c", ["--tag=resume 7"]),
        ("--x={step}{step}", "/c/{step}", ["--x=77"]),
    ],
)
def test_render(template: str, path: str, expected: list[str]) -> None:
    assert render_resume_args(template, path, 7) == expected


def test_path_with_braces_not_rendered_twice() -> None:
    assert render_resume_args("--load={checkpoint}", "/c/{step}", 7) == ["--load=/c/{step}"]


@pytest.mark.parametrize(
    "template",
    [
        "--resume={ckpt}",
        "--resume={checkpoint",
        "--resume=checkpoint}",
        "--resume={checkpoint:>10}",
        "--resume={{checkpoint}}",
        "--resume={0}",
        "--resume={}",
        "--resume={checkpoint!r}",
        "--resume '{checkpoint}",
        "--x " + "y" * 5000,
    ],
)
def test_bad_template(template: str) -> None:
    with pytest.raises(InvalidResumeTemplate, match="resume-args"):
        render_resume_args(template, "/c", 1)
    job = cluster_job()
    job["metadata"]["annotations"][ANN_RESUME_ARGS] = template
    assert resume_spec(job).problems
    with pytest.raises(InvalidResumeTemplate) as err:
        recreate(job)
    assert err.value.reason.zh


@pytest.mark.parametrize(
    ("annotations", "expected"),
    [
        ({}, {"checkpoint_dir": None, "env": DEFAULT_RESUME_ENV, "args": None, "container": None, "opt_out": False}),
        (
            {
                "trainmedic.io/checkpoint-dir": " /mnt/ckpt/llama ",
                ANN_RESUME_ENV: "RESUME",
                ANN_RESUME_ARGS: "--r={checkpoint}",
                ANN_RESUME_CONTAINER: "trainer",
                ANN_REMEDIATE: "true",
            },
            {
                "checkpoint_dir": "/mnt/ckpt/llama",
                "env": "RESUME",
                "args": "--r={checkpoint}",
                "container": "trainer",
                "opt_out": False,
            },
        ),
        ({ANN_REMEDIATE: "false"}, {"opt_out": True}),
        ({ANN_REMEDIATE: "False"}, {"opt_out": True}),
        ({ANN_REMEDIATE: "no"}, {"opt_out": True}),
        ({ANN_REMEDIATE: "maybe"}, {"opt_out": True}),
        ({ANN_RESUME_ENV: ""}, {"env": DEFAULT_RESUME_ENV}),
    ],
    ids=["defaults", "all-set", "false", "False", "no", "unknown-is-opt-out", "empty-env"],
)
def test_resume_spec(annotations: dict[str, str], expected: dict[str, Any]) -> None:
    obj = cluster_job()
    obj["metadata"]["annotations"] = annotations
    spec = resume_spec(obj)
    assert {k: getattr(spec, k) for k in expected} == expected
    assert bool(spec.problems) == (annotations.get(ANN_REMEDIATE) == "maybe")


def test_resume_spec_container_list() -> None:
    obj = cluster_vcjob()
    obj["metadata"]["annotations"] = {ANN_RESUME_CONTAINER: "pytorch, trainer,"}
    assert resume_spec(obj).containers == ("pytorch", "trainer")


@pytest.mark.parametrize("name", PLAIN)
def test_opted_out_refused(name: str) -> None:
    obj = OBJECTS[name]()
    obj["metadata"]["annotations"][ANN_REMEDIATE] = "false"
    with pytest.raises(OptedOut) as err:
        recreate(obj)
    assert "opted out" in str(err.value)
    assert err.value.reason.zh


# -- lineage ---------------------------------------------------------------------------------------


def test_lineage_bounded() -> None:
    job = cluster_job()
    old: list[dict[str, Any]] = [
        {"uid": f"u{i}", "incident": f"i{i}", "time": "t", "checkpoint": None, "step": None, "excluded_nodes": []}
        for i in range(LINEAGE_LIMIT)
    ]
    job["metadata"]["annotations"][ANN_LINEAGE] = json.dumps(old)
    job["metadata"]["annotations"][ANN_RESTARTS] = "20"
    ann = recreate(job)["metadata"]["annotations"]
    lineage = json.loads(ann[ANN_LINEAGE])
    assert len(lineage) == LINEAGE_LIMIT
    assert lineage[0]["uid"] == "u1"
    assert lineage[-1]["incident"] == "inc-1"
    assert ann[ANN_RESTARTS] == "21"


@pytest.mark.parametrize("raw", ["not json", '{"a": 1}', "[1, 2]", "null"])
def test_unreadable_lineage_starts_over(raw: str) -> None:
    job = cluster_job()
    job["metadata"]["annotations"][ANN_LINEAGE] = raw
    job["metadata"]["annotations"][ANN_RESTARTS] = "x"
    ann = recreate(job)["metadata"]["annotations"]
    assert [e["incident"] for e in json.loads(ann[ANN_LINEAGE])] == ["inc-1"]
    assert ann[ANN_RESTARTS] == "1"


# -- selectors, templates, malformed input ---------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("job", {"batch.kubernetes.io/job-name": "llama"}),
        ("job-manual-selector", {"run": "llama-7"}),
        ("volcano", {"volcano.sh/job-name": "vc"}),
        ("pytorchjob", {"training.kubeflow.org/job-name": "pt"}),
    ],
)
def test_job_pod_selector(name: str, expected: dict[str, str]) -> None:
    assert job_pod_selector(OBJECTS[name]()) == expected


def test_job_pod_selector_legacy_label() -> None:
    """A Job whose template shows no batch.kubernetes.io labels (as written, or an older cluster)."""
    job = cluster_job()
    del job["spec"]["template"]["metadata"]
    assert job_pod_selector(job) == {"job-name": "llama"}


@pytest.mark.parametrize(
    ("name", "paths"),
    [
        ("job", ["spec.template"]),
        ("volcano", ["spec.tasks[0].template", "spec.tasks[1].template"]),
        ("pytorchjob", ["spec.pytorchReplicaSpecs.Master.template", "spec.pytorchReplicaSpecs.Worker.template"]),
    ],
)
def test_pod_templates_are_the_objects_own(name: str, paths: list[str]) -> None:
    obj = OBJECTS[name]()
    by_path = pod_templates_by_path(obj)
    assert list(by_path) == paths
    for tmpl in pod_templates(obj):
        tmpl["spec"]["marker"] = True
    assert all(t["spec"]["marker"] for t in by_path.values())


def _deep(n: int) -> dict[str, Any]:
    d: dict[str, Any] = {}
    for _ in range(n):
        d = {"x": d}
    return d


def _mutate(make: Callable[[], dict[str, Any]], change: Callable[[dict[str, Any]], Any]) -> dict[str, Any]:
    obj = make()
    change(obj)
    return obj


MALFORMED = {
    "no-metadata": lambda: _mutate(cluster_job, lambda o: o.pop("metadata")),
    "no-name": lambda: _mutate(cluster_job, lambda o: o["metadata"].pop("name")),
    "no-spec": lambda: _mutate(cluster_job, lambda o: o.pop("spec")),
    "template-not-object": lambda: _mutate(cluster_job, lambda o: o["spec"].update(template="x")),
    "no-containers": lambda: _mutate(cluster_job, lambda o: o["spec"]["template"]["spec"].update(containers=[])),
    "container-without-name": lambda: _mutate(
        cluster_job, lambda o: o["spec"]["template"]["spec"].update(containers=[{"image": "x"}])
    ),
    "env-not-list": lambda: _mutate(
        cluster_job, lambda o: o["spec"]["template"]["spec"]["containers"][0].update(env="A=1")
    ),
    "args-not-list": lambda: _mutate(
        cluster_job, lambda o: o["spec"]["template"]["spec"]["containers"][0].update(args="--x")
    ),
    "affinity-not-object": lambda: _mutate(cluster_job, lambda o: o["spec"]["template"]["spec"].update(affinity=[1])),
    "terms-not-list": lambda: _mutate(
        cluster_job,
        lambda o: o["spec"]["template"]["spec"].update(
            affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": "x"}}}
        ),
    ),
    "volcano-no-tasks": lambda: _mutate(cluster_vcjob, lambda o: o["spec"].update(tasks=[])),
    "volcano-task-not-object": lambda: _mutate(cluster_vcjob, lambda o: o["spec"].update(tasks=["x"])),
    "pytorch-no-replicas": lambda: _mutate(cluster_pytorchjob, lambda o: o["spec"].pop("pytorchReplicaSpecs")),
    "deeply-nested": lambda: _mutate(cluster_job, lambda o: o["spec"].update(extra=_deep(500))),
    "not-json": lambda: _mutate(cluster_job, lambda o: o["spec"].update(extra=object())),
}


@pytest.mark.parametrize("name", list(MALFORMED))
def test_malformed_gets_a_clear_error(name: str) -> None:
    with pytest.raises(MalformedWorkload) as err:
        recreate(MALFORMED[name]())
    assert str(err.value)
    assert err.value.reason.zh


@pytest.mark.parametrize(
    "obj",
    [None, "job", [], {"apiVersion": "batch/v1", "kind": "Job", "metadata": "x"}],
    ids=["none", "string", "list", "metadata-string"],
)
def test_not_an_object(obj: Any) -> None:
    with pytest.raises(WorkloadError):
        recreate(obj)


def test_incident_id_required() -> None:
    with pytest.raises(ValueError, match="incident_id"):
        recreate_body(cluster_job(), incident_id=" ", checkpoint=None, exclude_nodes=[], now=NOW)


# -- quantities ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("0", 0),
        ("128974848", 128974848),
        ("129e6", 129_000_000),
        ("129E6", 129_000_000),
        ("129M", 129_000_000),
        ("123Mi", 123 * MI),
        ("1.5Gi", 3 * GI // 2),
        ("64Gi", 64 * GI),
        ("2Ti", 2 * 1024**4),
        ("1Ki", 1024),
        ("1k", 1000),
        ("1G", 10**9),
        ("1T", 10**12),
        ("1P", 10**15),
        ("1E", 10**18),
        ("1Ei", 1024**6),
        ("+5", 5),
        (".5Gi", GI // 2),
        ("5.", 5),
        ("1e-3", Fraction(1, 1000)),
        ("100m", Fraction(1, 10)),
        ("-1Mi", -MI),
        (" 2Gi ", 2 * GI),
    ],
)
def test_parse_quantity(text: str, value: Fraction | int) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize(
    "text",
    ["", "Gi", "1 Gi", "1gi", "1KI", "1K", "1Mb", "1.2.3", "1e", "1e3Gi", "--1", "0x10", "1e999", "9" * 100, "1_000"],
)
def test_bad_quantity(text: str) -> None:
    with pytest.raises(QuantityError):
        parse_quantity(text)


@pytest.mark.parametrize(("text", "value"), [("100m", 1), ("1.0000001Ki", 1025), ("8Ei", None), ("-1", None)])
def test_memory_bytes(text: str, value: int | None) -> None:
    if value is None:
        with pytest.raises(QuantityError):
            memory_bytes(text)
    else:
        assert memory_bytes(text) == value


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (0, "0"),
        (1, "1"),
        (1000, "1000"),
        (1024, "1Ki"),
        (1536 * MI, "1536Mi"),
        (24 * GI, "24Gi"),
        (1024**4, "1Ti"),
        (1024**6, "1Ei"),
    ],
)
def test_format_quantity(n: int, text: str) -> None:
    assert format_quantity(n) == text


@given(st.integers(min_value=0, max_value=2**63 - 1))
def test_format_parse_round_trip(n: int) -> None:
    assert parse_quantity(format_quantity(n)) == n


SUFFIXES = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei", "m", "k", "M", "G", "T", "P", "E", "e3", "E-2", "e+4"]


@given(
    sign=st.sampled_from(["", "+", "-"]),
    whole=st.integers(min_value=0, max_value=99_999),
    frac=st.one_of(st.none(), st.integers(min_value=0, max_value=999)),
    suffix=st.sampled_from(SUFFIXES),
)
def test_parse_agrees_with_the_client(sign: str, whole: int, frac: int | None, suffix: str) -> None:
    """The official client's parser (Decimal, exact at these sizes) is the reference on valid input."""
    text = f"{sign}{whole}" + (f".{frac}" if frac is not None else "") + suffix
    client_parse: Any = client_quantity.parse_quantity
    expected = client_parse(text)
    assert isinstance(expected, Decimal)
    assert parse_quantity(text) == Fraction(expected)


# -- memory ----------------------------------------------------------------------------------------


def job_with_resources(resources: dict[str, Any] | None) -> dict[str, Any]:
    job = cluster_job()
    if resources is not None:
        job["spec"]["template"]["spec"]["containers"][0]["resources"] = resources
    return job


@pytest.mark.parametrize(
    ("resources", "factor", "cap", "limit", "req", "capped"),
    [
        ({"limits": {"memory": "16Gi"}, "requests": {"memory": "16Gi"}}, 1.5, 64 * GI, "24Gi", "24Gi", False),
        ({"limits": {"memory": "16Gi"}, "requests": {"memory": "8Gi"}}, 1.5, 64 * GI, "24Gi", "8Gi", False),
        ({"limits": {"memory": "16Gi"}}, 1.1, 64 * GI, "18023Mi", None, False),  # 18022.4Mi rounded up
        ({"limits": {"memory": "10Mi"}}, 1.1, 64 * GI, "11Mi", None, False),  # 1.1 is 11/10, not the float above it
        ({"limits": {"memory": "16G"}}, 2.0, 64 * GI, "30518Mi", None, False),
        ({"limits": {"memory": "48Gi"}, "requests": {"memory": "48Gi"}}, 2.0, 64 * GI, "64Gi", "64Gi", True),
        ({"limits": {"memory": "80Gi"}}, 2.0, 64 * GI, "80Gi", None, True),  # already above the cap: never lowered
        ({"limits": {"memory": "1000M"}}, 1.5, 10**9 + 1, "1000000001", None, True),
    ],
)
def test_raise_memory(
    resources: dict[str, Any], factor: float, cap: int, limit: str, req: str | None, capped: bool
) -> None:
    job = job_with_resources(copy.deepcopy(resources))
    [change] = raise_memory(job, factor=factor, cap_bytes=cap)
    res = job["spec"]["template"]["spec"]["containers"][0]["resources"]
    assert res["limits"]["memory"] == limit
    assert res.get("requests", {}).get("memory") == req
    assert (change.old, change.new, change.capped) == (resources["limits"]["memory"], limit, capped)
    assert change.changed == (limit != resources["limits"]["memory"])
    assert change.template_path == "spec.template"
    assert change.container == "trainer"


def test_raise_memory_without_limit_reported() -> None:
    job = job_with_resources(None)
    [change] = raise_memory(job, factor=2.0, cap_bytes=GI)
    assert (change.old, change.new, change.changed) == (None, None, False)
    assert "resources" not in job["spec"]["template"]["spec"]["containers"][0]


def test_raise_memory_selected_containers() -> None:
    job = rich_job()
    changes = raise_memory(job, factor=2.0, cap_bytes=512 * GI, containers=["sidecar"])
    assert [(c.container, c.new) for c in changes] == [("sidecar", "512Mi")]
    assert job["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["memory"] == "64Gi"
    with pytest.raises(InvalidResumeConfig, match="nope"):
        raise_memory(job, factor=2.0, cap_bytes=GI, containers=["nope"])


@pytest.mark.parametrize(
    ("factor", "cap"),
    [(1.0, GI), (0.5, GI), (float("nan"), GI), (float("inf"), GI), (2.0, 0), (2.0, 2**63), (True, GI)],
)
def test_raise_memory_bad_parameters(factor: float, cap: int) -> None:
    with pytest.raises(ValueError, match="memory"):
        raise_memory(job_with_resources({"limits": {"memory": "1Gi"}}), factor=factor, cap_bytes=cap)


def test_raise_memory_bad_quantity() -> None:
    with pytest.raises(MalformedWorkload, match=r"limits\.memory"):
        raise_memory(job_with_resources({"limits": {"memory": "lots"}}), factor=2.0, cap_bytes=GI)


@pytest.mark.parametrize("name", ["job-rich", "volcano-rich", "pytorchjob-elastic"])
def test_recreation_raises_memory(name: str) -> None:
    result = build_recreation(
        OBJECTS[name](),
        incident_id="inc-1",
        checkpoint=CK100,
        exclude_nodes=["gpu-3"],
        now=NOW,
        memory_factor=1.5,
        memory_cap_bytes=80 * GI,
    )
    main = main_containers(result.body)[0]["name"]
    for c in main_containers(result.body):
        assert c["resources"]["limits"]["memory"] == "80Gi"
        assert c["resources"]["requests"]["memory"] == "80Gi"
    templates = len(pod_templates(result.body))
    assert [(c.container, c.old, c.new, c.capped) for c in result.memory_changes] == [
        (main, "64Gi", "80Gi", True),
        ("sidecar", "256Mi", "384Mi", False),
    ] * templates
    entry = json.loads(result.body["metadata"]["annotations"][ANN_LINEAGE])[-1]
    assert [(m["container"], m["new"]) for m in entry["memory"]] == [(main, "80Gi"), ("sidecar", "384Mi")] * templates


def test_memory_factor_needs_a_cap() -> None:
    with pytest.raises(ValueError, match="go together"):
        recreate(cluster_job(), memory_factor=2.0)


# -- through the emulated API server ---------------------------------------------------------------


@pytest_asyncio.fixture
async def kube() -> AsyncIterator[KubeEmulator]:
    require_kmock()
    async with KubeEmulator() as k:
        yield k


@dataclass
class Api:
    """The official client's calls for one workload kind (blocking: run them in a thread)."""

    get: Callable[[Any, str, str], dict[str, Any]]
    delete: Callable[[Any, str, str], object]
    create: Callable[[Any, str, dict[str, Any]], object]


def _typed_job(api: Any) -> Any:
    from kubernetes import client

    return client.BatchV1Api(api)


def _custom(api: Any) -> Any:
    from kubernetes import client

    return client.CustomObjectsApi(api)


def _custom_api(kind: Any) -> Api:
    return Api(
        get=lambda api, ns, name: _custom(api).get_namespaced_custom_object(
            kind.group, kind.version, ns, kind.plural, name
        ),
        delete=lambda api, ns, name: _custom(api).delete_namespaced_custom_object(
            kind.group, kind.version, ns, kind.plural, name
        ),
        create=lambda api, ns, body: _custom(api).create_namespaced_custom_object(
            kind.group, kind.version, ns, kind.plural, body
        ),
    )


APIS = {
    "job": Api(
        get=lambda api, ns, name: api.sanitize_for_serialization(_typed_job(api).read_namespaced_job(name, ns)),
        delete=lambda api, ns, name: _typed_job(api).delete_namespaced_job(name, ns),
        create=lambda api, ns, body: _typed_job(api).create_namespaced_job(ns, body),
    ),
    "volcano": _custom_api(VOLCANO_JOB),
    "pytorchjob": _custom_api(PYTORCH_JOB),
}


def original_resource(kind: str) -> str:
    return {
        "job": "batch/v1/jobs",
        "volcano": "batch.volcano.sh/v1alpha1/jobs",
        "pytorchjob": "kubeflow.org/v1/pytorchjobs",
    }[kind]


async def _create_original(cluster: Cluster, kind: str) -> dict[str, Any]:
    if kind == "job":
        return await cluster.create_job("train", "llama", completions=2)
    if kind == "volcano":
        return await cluster.create_volcano_job("train", "vc", {"master": 1, "worker": 2})
    return await cluster.create_pytorchjob("train", "pt", masters=1, workers=2)


@pytest.mark.asyncio
@pytest.mark.parametrize("kind", list(APIS))
async def test_recreated_body_accepted_by_the_api(kube: KubeEmulator, kind: str) -> None:
    cluster = Cluster(kube)
    api = kube.api_client()
    calls = APIS[kind]
    original = await _create_original(cluster, kind)
    name = original["metadata"]["name"]
    await cluster.patch(
        original_resource(kind),
        "train",
        name,
        {"metadata": {"annotations": {ANN_RESUME_ARGS: "--resume_from_checkpoint={checkpoint}"}}},
    )

    live = await asyncio.to_thread(calls.get, api, "train", name)
    assert live["metadata"]["uid"] == original["metadata"]["uid"]
    body = recreate_body(live, incident_id="inc-9", checkpoint=CK100, exclude_nodes=["gpu-3"], now=NOW)
    await asyncio.to_thread(calls.delete, api, "train", name)
    await asyncio.to_thread(calls.create, api, "train", body)
    back = await asyncio.to_thread(calls.get, api, "train", name)

    assert back["metadata"]["annotations"][ANN_INCIDENT] == "inc-9"
    assert back["metadata"].get("uid") != original["metadata"]["uid"]
    assert back["spec"] == body["spec"]
    for tmpl in pod_templates(back):
        c = tmpl["spec"]["containers"][0]
        assert env_of(c)[DEFAULT_RESUME_ENV] == CK100.path
        assert c["args"] == [f"--resume_from_checkpoint={CK100.path}"]
        terms = tmpl["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
            "nodeSelectorTerms"
        ]
        assert terms == [{"matchExpressions": [{"key": HOSTNAME_LABEL, "operator": "NotIn", "values": ["gpu-3"]}]}]
