"""Which job and rank a pod belongs to, and which jobs run on a node.

Watchers attach the job to what they publish (the job is the partition key, see
trainmedic/events.py). The node role knows the pods of its own node (a pod watch with a field
selector on spec.nodeName); the cluster role knows all pods.

The job of a pod, first match wins:
1. the controller ownerReference when it is a training workload: batch/v1 Job,
   batch.volcano.sh Job, kubeflow.org PyTorchJob (or another kubeflow.org job kind);
2. the labels those controllers set: `training.kubeflow.org/job-name` (the kind from
   `training.kubeflow.org/operator-name`, PyTorchJob when absent), `volcano.sh/job-name`,
   `batch.kubernetes.io/job-name`, the legacy `job-name`;
3. none: the pod stands alone (`job_of` returns None).

The rank, first match wins:
1. an explicit `RANK` env value in the pod spec: the Kubeflow training-operator and Volcano's
   pytorch plugin write the rank they give the process there, master offset included (a Volcano
   job's `task-index` restarts at 0 in every task, so master-0 and worker-0 would both be 0);
2. `batch.kubernetes.io/job-completion-index` (Indexed Job), `volcano.sh/task-index`, Kubeflow
   `training.kubeflow.org/replica-index` (+1 for workers, as the PyTorchJob controller numbers
   RANK when the job has a Master replica; not for elastic pods, `PET_*` env, which have none; the
   annotation `trainmedic.io/has-master: "false"` turns it off), the legacy `replica-index`.
The StatefulSet-style ordinal at the end of the pod name is NOT used (too often wrong).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from trainmedic.events import JobRef

# Controller kinds that are training workloads, by API group.
_WORKLOAD_GROUPS = {
    "batch": {"Job"},
    "batch.volcano.sh": {"Job"},
    "kubeflow.org": {"PyTorchJob", "TFJob", "MPIJob", "XGBoostJob", "PaddleJob", "JAXJob", "MXJob"},
}
_JOB_NAME_LABELS = (
    ("training.kubeflow.org/job-name", "PyTorchJob", "kubeflow.org/v1"),
    ("volcano.sh/job-name", "Job", "batch.volcano.sh/v1alpha1"),
    ("batch.kubernetes.io/job-name", "Job", "batch/v1"),
    ("job-name", "Job", "batch/v1"),
)
# training.kubeflow.org/operator-name -> kind, for pods without an ownerReference.
_KUBEFLOW_OPERATORS = {
    "pytorchjob-controller": "PyTorchJob",
    "tfjob-controller": "TFJob",
    "mpijob-controller": "MPIJob",
    "xgboostjob-controller": "XGBoostJob",
    "paddlejob-controller": "PaddleJob",
    "jaxjob-controller": "JAXJob",
    "mxjob-controller": "MXJob",
}
_INDEX_KEYS = (
    "batch.kubernetes.io/job-completion-index",
    "volcano.sh/task-index",
    "training.kubeflow.org/replica-index",
    "replica-index",
)


@dataclass(frozen=True, slots=True)
class PodInfo:
    namespace: str
    name: str
    uid: str | None
    node: str | None
    job: JobRef | None
    rank: int | None


def _get(obj: Any, *path: str) -> Any:
    cur: Any = obj
    for p in path:
        if not isinstance(cur, Mapping):
            return None
        cur = cur.get(p)
    return cur


def _map(v: Any) -> Mapping[str, Any]:
    return v if isinstance(v, Mapping) else {}


def _env(pod: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    out: list[Mapping[str, Any]] = []
    containers = _get(pod, "spec", "containers")
    for container in containers if isinstance(containers, list) else ():
        env = _map(container).get("env")
        out.extend(e for e in (env if isinstance(env, list) else ()) if isinstance(e, Mapping))
    return out


def job_of(pod: Mapping[str, Any]) -> JobRef | None:
    """The training job that owns a pod (a pod as the API's JSON: metadata, spec, status)."""
    meta = _map(pod.get("metadata"))
    ns = str(meta.get("namespace") or "default")
    refs = meta.get("ownerReferences")
    for ref in refs if isinstance(refs, list) else ():
        if not isinstance(ref, Mapping) or ref.get("controller") is False:
            continue
        api_version = str(ref.get("apiVersion") or "")
        group = api_version.split("/", maxsplit=1)[0] if "/" in api_version else ""
        kind = str(ref.get("kind") or "")
        if kind in _WORKLOAD_GROUPS.get(group, ()) and ref.get("name"):
            return JobRef(namespace=ns, name=str(ref["name"]), kind=kind, api_version=api_version)
    labels = _map(meta.get("labels"))
    for label, default_kind, api_version in _JOB_NAME_LABELS:
        name = labels.get(label)
        if name:
            kind = default_kind
            if label == "training.kubeflow.org/job-name":
                operator = str(labels.get("training.kubeflow.org/operator-name", ""))
                kind = _KUBEFLOW_OPERATORS.get(operator, default_kind)
            return JobRef(namespace=ns, name=str(name), kind=kind, api_version=api_version)
    return None


def rank_of(pod: Mapping[str, Any]) -> int | None:
    meta = _map(pod.get("metadata"))
    labels = _map(meta.get("labels"))
    annotations = _map(meta.get("annotations"))
    env = _env(pod)
    for e in env:
        if e.get("name") == "RANK" and str(e.get("value", "")).isdigit():
            return int(str(e["value"]))
    for key in _INDEX_KEYS:
        raw = labels.get(key, annotations.get(key))
        if raw is None:
            continue
        try:
            idx = int(str(raw))
        except ValueError:
            continue
        if idx < 0:
            continue
        if key == "training.kubeflow.org/replica-index":
            rtype = str(labels.get("training.kubeflow.org/replica-type", "")).lower()
            elastic = any(str(e.get("name", "")).startswith("PET_") for e in env)
            if (
                rtype == "worker"
                and not elastic
                and str(annotations.get("trainmedic.io/has-master", "true")) != "false"
            ):
                return idx + 1
        return idx
    return None


def pod_info(pod: Mapping[str, Any]) -> PodInfo:
    meta = _map(pod.get("metadata"))
    uid, node = meta.get("uid"), _get(pod, "spec", "nodeName")
    return PodInfo(
        namespace=str(meta.get("namespace") or "default"),
        name=str(meta.get("name") or ""),
        uid=uid if isinstance(uid, str) and uid else None,
        node=node if isinstance(node, str) and node else None,
        job=job_of(pod),
        rank=rank_of(pod),
    )


class JobIndex:
    """Pods by (namespace, name) and by uid, jobs by node. Fed by a pod watch; read by the sources."""

    def __init__(self) -> None:
        self._pods: dict[tuple[str, str], PodInfo] = {}
        self._by_uid: dict[str, PodInfo] = {}

    def __len__(self) -> int:
        return len(self._pods)

    def update_pod(self, pod: Mapping[str, Any]) -> PodInfo:
        info = pod_info(pod)
        old = self._pods.get((info.namespace, info.name))
        if old is not None and old.uid and old.uid != info.uid:
            self._by_uid.pop(old.uid, None)
        self._pods[(info.namespace, info.name)] = info
        if info.uid:
            self._by_uid[info.uid] = info
        return info

    def remove_pod(self, namespace: str, name: str) -> None:
        info = self._pods.pop((namespace, name), None)
        if info is not None and info.uid:
            self._by_uid.pop(info.uid, None)

    def pod(self, namespace: str, name: str) -> PodInfo | None:
        return self._pods.get((namespace, name))

    def pod_by_uid(self, uid: str) -> PodInfo | None:
        return self._by_uid.get(uid)

    def pods_of_job(self, job: JobRef) -> list[PodInfo]:
        return [p for p in self._pods.values() if p.job == job]

    def jobs_on_node(self, node: str) -> list[JobRef]:
        seen: dict[str, JobRef] = {}
        for p in self._pods.values():
            if p.node == node and p.job is not None:
                seen.setdefault(p.job.key, p.job)
        return list(seen.values())
