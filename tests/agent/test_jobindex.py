"""Pod -> job and rank (agent/jobindex.py), over the controllers and label sets seen in clusters."""

from __future__ import annotations

from typing import Any

import pytest

from trainmedic.agent.jobindex import JobIndex, job_of, pod_info, rank_of
from trainmedic.events import JobRef


def pod(
    *,
    name: str = "p",
    namespace: str | None = "train",
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    owner: tuple[str, str, str] | None = None,
    controller: bool | None = True,
    env: dict[str, Any] | None = None,
    node: str | None = None,
    uid: str | None = None,
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if namespace is not None:
        meta["namespace"] = namespace
    if uid:
        meta["uid"] = uid
    if labels:
        meta["labels"] = labels
    if annotations:
        meta["annotations"] = annotations
    if owner:
        ref: dict[str, Any] = {"apiVersion": owner[0], "kind": owner[1], "name": owner[2], "uid": "u"}
        if controller is not None:
            ref["controller"] = controller
        meta["ownerReferences"] = [ref]
    container: dict[str, Any] = {"name": "c"}
    if env:
        container["env"] = [{"name": k, **(v if isinstance(v, dict) else {"value": v})} for k, v in env.items()]
    spec: dict[str, Any] = {"containers": [container]}
    if node:
        spec["nodeName"] = node
    return {"metadata": meta, "spec": spec}


BATCH = JobRef(namespace="train", name="llama")
VOLCANO = JobRef(namespace="train", name="vc", kind="Job", api_version="batch.volcano.sh/v1alpha1")
PYTORCH = JobRef(namespace="train", name="pt", kind="PyTorchJob", api_version="kubeflow.org/v1")


@pytest.mark.parametrize(
    ("p", "expected"),
    [
        (pod(owner=("batch/v1", "Job", "llama")), BATCH),
        (pod(owner=("batch.volcano.sh/v1alpha1", "Job", "vc")), VOLCANO),
        (pod(owner=("kubeflow.org/v1", "PyTorchJob", "pt")), PYTORCH),
        (
            pod(owner=("kubeflow.org/v1", "TFJob", "tf")),
            JobRef(namespace="train", name="tf", kind="TFJob", api_version="kubeflow.org/v1"),
        ),
        (
            pod(owner=("kubeflow.org/v2beta1", "MPIJob", "mpi")),
            JobRef(namespace="train", name="mpi", kind="MPIJob", api_version="kubeflow.org/v2beta1"),
        ),
        (pod(owner=("batch/v1", "Job", "llama"), controller=None), BATCH),
        (pod(owner=("apps/v1", "ReplicaSet", "web-5d9f")), None),
        (pod(owner=("batch/v1", "Job", "other"), controller=False, labels={"job-name": "llama"}), BATCH),
        (pod(labels={"training.kubeflow.org/job-name": "pt"}), PYTORCH),
        (
            pod(
                labels={
                    "training.kubeflow.org/job-name": "tf",
                    "training.kubeflow.org/operator-name": "tfjob-controller",
                }
            ),
            JobRef(namespace="train", name="tf", kind="TFJob", api_version="kubeflow.org/v1"),
        ),
        (pod(labels={"volcano.sh/job-name": "vc"}), VOLCANO),
        (pod(labels={"batch.kubernetes.io/job-name": "llama"}), BATCH),
        (pod(labels={"job-name": "llama"}), BATCH),
        (pod(namespace=None, labels={"job-name": "llama"}), JobRef(namespace="default", name="llama")),
        (pod(labels={"app": "notebook"}), None),
        ({"metadata": {"name": "x", "labels": "broken", "ownerReferences": "broken"}}, None),
        ({}, None),
    ],
    ids=[
        "batch-owner",
        "volcano-owner",
        "pytorchjob-owner",
        "tfjob-owner",
        "mpijob-v2-owner",
        "owner-without-controller-field",
        "replicaset-owner",
        "non-controller-owner-then-label",
        "kubeflow-label",
        "kubeflow-label-tfjob-operator",
        "volcano-label",
        "batch-label",
        "legacy-job-name-label",
        "default-namespace",
        "bare",
        "malformed",
        "empty",
    ],
)
def test_job_of(p: dict[str, Any], expected: JobRef | None) -> None:
    assert job_of(p) == expected


KF = "training.kubeflow.org"


@pytest.mark.parametrize(
    ("p", "expected"),
    [
        (pod(labels={"batch.kubernetes.io/job-completion-index": "3"}), 3),
        (pod(annotations={"batch.kubernetes.io/job-completion-index": "5"}), 5),
        (pod(annotations={"volcano.sh/task-index": "2"}), 2),
        (pod(annotations={"volcano.sh/task-index": "0"}, env={"RANK": "1"}), 1),
        (pod(labels={f"{KF}/replica-type": "master", f"{KF}/replica-index": "0"}), 0),
        (pod(labels={f"{KF}/replica-type": "worker", f"{KF}/replica-index": "0"}), 1),
        (pod(labels={f"{KF}/replica-type": "worker", f"{KF}/replica-index": "2"}), 3),
        (
            pod(
                labels={f"{KF}/replica-type": "worker", f"{KF}/replica-index": "2"},
                annotations={"trainmedic.io/has-master": "false"},
            ),
            2,
        ),
        (pod(labels={f"{KF}/replica-type": "worker", f"{KF}/replica-index": "2"}, env={"PET_NNODES": "4"}), 2),
        (pod(labels={f"{KF}/replica-type": "worker", f"{KF}/replica-index": "2"}, env={"RANK": "3"}), 3),
        (pod(labels={"replica-type": "worker", "replica-index": "4"}), 4),
        (pod(env={"RANK": "7"}), 7),
        (pod(env={"RANK": {"valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['rank']"}}}}), None),
        (pod(env={"RANK": "abc"}), None),
        (pod(labels={"batch.kubernetes.io/job-completion-index": "x", "replica-index": "1"}), 1),
        (pod(labels={"batch.kubernetes.io/job-completion-index": "-1"}), None),
        (pod(labels={"statefulset.kubernetes.io/pod-name": "trainer-3"}, name="trainer-3"), None),
        ({"metadata": {"labels": ["x"]}, "spec": {"containers": ["bad", {"env": "bad"}]}}, None),
    ],
    ids=[
        "indexed-job-label",
        "indexed-job-annotation",
        "volcano-task-index",
        "volcano-pytorch-plugin-rank",
        "kubeflow-master",
        "kubeflow-worker-0",
        "kubeflow-worker-2",
        "kubeflow-no-master",
        "kubeflow-elastic",
        "kubeflow-rank-env",
        "legacy-replica-index",
        "rank-env",
        "rank-env-from-field",
        "rank-env-not-a-number",
        "bad-index-falls-through",
        "negative-index",
        "statefulset-ordinal-not-used",
        "malformed",
    ],
)
def test_rank_of(p: dict[str, Any], expected: int | None) -> None:
    assert rank_of(p) == expected


def test_pod_info_ignores_wrongly_typed_fields() -> None:
    info = pod_info({"metadata": {"name": "p", "uid": 5}, "spec": {"nodeName": ["n"]}})
    assert (info.namespace, info.name, info.uid, info.node, info.job, info.rank) == (
        "default",
        "p",
        None,
        None,
        None,
        None,
    )


def test_index_by_name_uid_job_and_node() -> None:
    idx = JobIndex()
    a = idx.update_pod(pod(name="a", uid="ua", node="n1", labels={"job-name": "llama"}))
    idx.update_pod(pod(name="b", uid="ub", node="n1", labels={"job-name": "llama"}))
    idx.update_pod(pod(name="c", uid="uc", node="n2", labels={"volcano.sh/job-name": "vc"}))
    idx.update_pod(pod(name="d", uid="ud", node="n1"))
    assert len(idx) == 4
    assert idx.pod("train", "a") == a and idx.pod_by_uid("ua") == a
    assert sorted(p.name for p in idx.pods_of_job(BATCH)) == ["a", "b"]
    assert idx.jobs_on_node("n1") == [BATCH]
    assert idx.jobs_on_node("n2") == [VOLCANO]
    idx.remove_pod("train", "a")
    assert idx.pod("train", "a") is None and idx.pod_by_uid("ua") is None
    idx.remove_pod("train", "missing")  # no error


def test_a_pod_recreated_under_the_same_name_replaces_the_old_uid() -> None:
    idx = JobIndex()
    idx.update_pod(pod(name="w-0", uid="old", labels={"job-name": "llama"}))
    idx.update_pod(pod(name="w-0", uid="new", labels={"job-name": "llama"}))
    assert idx.pod_by_uid("old") is None
    new = idx.pod_by_uid("new")
    assert new is not None and new.name == "w-0"
