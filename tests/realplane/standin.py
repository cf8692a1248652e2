"""A TEST STAND-IN for the Volcano job controller and the Kubeflow training-operator on the real plane.

The real controllers (volcano.sh/volcano's vc-controller-manager with its scheduler and admission
webhooks, kubeflow/training-operator) are large Go programs of their own; building and running them
beside the Kubernetes control plane on a test machine is not cheap, so this module does, for the
tests, only the part of their work the tests depend on, the way those controllers do it:

- pods from the templates: a Volcano Job's pod `<job>-<task>-<index>` per task replica, with the
  labels and annotations Volcano v1.10.0 puts on it (`volcano.sh/job-name`, `volcano.sh/task-spec`,
  `volcano.sh/task-index`, `scheduling.k8s.io/group-name`...; pkg/controllers/job/
  job_controller_util.go `createJobPod`); a PyTorchJob's pod `<job>-<type>-<index>` per replica with
  the Training Operator v1.8.1 labels (`training.kubeflow.org/job-name`, `.../replica-type`,
  `.../replica-index`, `.../job-role: master`, `.../operator-name: pytorchjob-controller`) and the
  torch.distributed env it writes (MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK, PET_*); each pod has a
  controller ownerReference to its workload, so the real garbage collector deletes the pods when
  the workload is deleted;
- status, through the status subresource: Volcano's `status.state.phase` (Pending / Running) with
  the pending / running counts and `taskStatusCount`; the PyTorchJob's `Created` and `Running`
  conditions and `replicaStatuses`.

Not done (nothing the tests rely on): gang scheduling (PodGroups: the stock scheduler places the
pods, so the test workloads name `default-scheduler`), Services, job policies, retries, completion.

A pod name still held by an earlier incarnation's pod (being deleted by the garbage collector) is
retried on the next pass, as the real controllers' requeue does.
"""

from __future__ import annotations

import copy
import threading
import time
import urllib.error
from collections.abc import Iterable
from typing import Any

from servers.kubeplane import KubePlane

VOLCANO = ("batch.volcano.sh", "v1alpha1", "jobs", "Job")
PYTORCH = ("kubeflow.org", "v1", "pytorchjobs", "PyTorchJob")
PYTORCH_OPERATOR = "pytorchjob-controller"
PYTORCH_PORT = 23456  # the training-operator's default master port


def _rfc3339(t: float | None = None) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() if t is None else t))


class TrainingControllers:
    """Reconciles Volcano Jobs and PyTorchJobs in `namespaces` every `period` seconds, in a thread."""

    def __init__(self, plane: KubePlane, namespaces: Iterable[str], period: float = 0.3) -> None:
        self.plane = plane
        self.namespaces = list(namespaces)
        self.period = period
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="training-controllers", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.is_set():
            for ns in self.namespaces:
                try:
                    self.reconcile(ns)
                except (OSError, urllib.error.URLError, ValueError, KeyError) as e:
                    # The API server restarting under a watch test, a workload deleted meanwhile.
                    self.errors.append(f"{ns}: {e!r}")
                    del self.errors[:-20]
            self._stop.wait(self.period)

    # -- one pass ----------------------------------------------------------------------------------

    def reconcile(self, namespace: str) -> None:
        pods = self.plane.request("GET", f"/api/v1/namespaces/{namespace}/pods")["items"]
        by_owner: dict[str, list[dict[str, Any]]] = {}
        by_name = {p["metadata"]["name"]: p for p in pods}
        for p in pods:
            for ref in p["metadata"].get("ownerReferences") or []:
                if ref.get("controller"):
                    by_owner.setdefault(ref["uid"], []).append(p)
        for res in (VOLCANO, PYTORCH):
            group, version, plural, _kind = res
            base = f"/apis/{group}/{version}/namespaces/{namespace}/{plural}"
            try:
                items = self.plane.request("GET", base)["items"]
            except urllib.error.HTTPError as e:
                if e.code == 404:  # the CRD is not installed
                    continue
                raise
            for obj in items:
                if obj["metadata"].get("deletionTimestamp"):
                    continue
                wanted = volcano_pods(obj) if res is VOLCANO else pytorch_pods(obj)
                for pod in wanted:
                    if pod["metadata"]["name"] in by_name:
                        continue  # ours already, or an earlier incarnation's still going
                    self._create_pod(namespace, pod)
                owned = by_owner.get(obj["metadata"]["uid"], [])
                status = volcano_status(obj, owned) if res is VOLCANO else pytorch_status(obj, owned)
                if _changed(obj.get("status") or {}, status):
                    self._put_status(f"{base}/{obj['metadata']['name']}/status", obj, status)

    def _create_pod(self, namespace: str, pod: dict[str, Any]) -> None:
        try:
            self.plane.request("POST", f"/api/v1/namespaces/{namespace}/pods", pod)
        except urllib.error.HTTPError as e:
            if e.code != 409:
                raise

    def _put_status(self, path: str, obj: dict[str, Any], status: dict[str, Any]) -> None:
        body = dict(obj, status=status)
        try:
            self.plane.request("PUT", path, body)
        except urllib.error.HTTPError as e:
            if e.code not in (404, 409):  # gone, or changed meanwhile: the next pass sees it
                raise


def _changed(old: dict[str, Any], new: dict[str, Any]) -> bool:
    def strip(s: dict[str, Any]) -> Any:
        out = copy.deepcopy(s)
        out.pop("lastReconcileTime", None)
        if isinstance(out.get("state"), dict):
            out["state"].pop("lastTransitionTime", None)
        for c in out.get("conditions") or []:
            c.pop("lastTransitionTime", None)
            c.pop("lastUpdateTime", None)
        out.pop("startTime", None)
        return out

    return bool(strip(old) != strip(new))


def _owner(obj: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": obj["apiVersion"],
        "kind": obj["kind"],
        "name": obj["metadata"]["name"],
        "uid": obj["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _phases(pods: list[dict[str, Any]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for p in pods:
        if p["metadata"].get("deletionTimestamp"):
            continue
        phase = (p.get("status") or {}).get("phase") or "Pending"
        out[phase] = out.get(phase, 0) + 1
    return out


# -- Volcano ---------------------------------------------------------------------------------------


def volcano_pods(job: dict[str, Any]) -> list[dict[str, Any]]:
    meta, spec = job["metadata"], job["spec"]
    name, ns = meta["name"], meta["namespace"]
    queue = spec.get("queue") or "default"
    version = (job.get("status") or {}).get("version") or 0
    out = []
    for task in spec.get("tasks") or []:
        tname = task.get("name") or "default"
        tmpl = copy.deepcopy(task["template"])
        for ix in range(int(task.get("replicas") or 0)):
            pod_spec = copy.deepcopy(tmpl.get("spec") or {})
            if not pod_spec.get("schedulerName") and spec.get("schedulerName"):
                pod_spec["schedulerName"] = spec["schedulerName"]
            tmeta = tmpl.get("metadata") or {}
            annotations = dict(tmeta.get("annotations") or {})
            annotations.update(
                {
                    "volcano.sh/task-index": str(ix),
                    "volcano.sh/task-spec": tname,
                    "scheduling.k8s.io/group-name": f"{name}-{meta['uid']}",
                    "volcano.sh/job-name": name,
                    "volcano.sh/queue-name": queue,
                    "volcano.sh/job-version": str(version),
                    "volcano.sh/template-uid": f"{name}-{tname}",
                    "volcano.sh/job-retry-count": "0",
                }
            )
            labels = dict(tmeta.get("labels") or {})
            labels.update(
                {
                    "volcano.sh/task-index": str(ix),
                    "volcano.sh/job-name": name,
                    "volcano.sh/task-spec": tname,
                    "volcano.sh/job-namespace": ns,
                    "volcano.sh/queue-name": queue,
                }
            )
            out.append(
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {
                        "name": f"{name}-{tname}-{ix}",
                        "namespace": ns,
                        "labels": labels,
                        "annotations": annotations,
                        "ownerReferences": [_owner(job)],
                    },
                    "spec": pod_spec,
                }
            )
    return out


def volcano_status(job: dict[str, Any], pods: list[dict[str, Any]]) -> dict[str, Any]:
    spec = job["spec"]
    total = sum(int(t.get("replicas") or 0) for t in spec.get("tasks") or [])
    min_available = int(spec.get("minAvailable") or total)
    counts = _phases(pods)
    running = counts.get("Running", 0)
    phase = "Running" if running >= min_available > 0 else "Pending"
    old = job.get("status") or {}
    old_state = old.get("state") or {}
    tasks: dict[str, Any] = {}
    for p in pods:
        if p["metadata"].get("deletionTimestamp"):
            continue
        tname = p["metadata"]["labels"].get("volcano.sh/task-spec", "default")
        pphase = (p.get("status") or {}).get("phase") or "Pending"
        bucket = tasks.setdefault(tname, {"phase": {}})["phase"]
        bucket[pphase] = bucket.get(pphase, 0) + 1
    now = _rfc3339()
    state = {"phase": phase, "lastTransitionTime": old_state.get("lastTransitionTime") or now}
    if old_state.get("phase") != phase:
        state["lastTransitionTime"] = now
    conditions = list(old.get("conditions") or [])
    if not conditions or conditions[-1].get("status") != phase:
        conditions.append({"status": phase, "lastTransitionTime": now})
    return {
        "state": state,
        "minAvailable": min_available,
        "pending": counts.get("Pending", 0),
        "running": running,
        "succeeded": counts.get("Succeeded", 0),
        "failed": counts.get("Failed", 0),
        "taskStatusCount": tasks,
        "version": int(old.get("version") or 0),
        "retryCount": int(old.get("retryCount") or 0),
        "conditions": conditions,
    }


# -- PyTorchJob ------------------------------------------------------------------------------------


def pytorch_pods(job: dict[str, Any]) -> list[dict[str, Any]]:
    meta = job["metadata"]
    name, ns = meta["name"], meta["namespace"]
    replicas = job["spec"].get("pytorchReplicaSpecs") or {}
    world = sum(int(r.get("replicas", 1)) for r in replicas.values())
    has_master = "Master" in replicas
    out = []
    for rtype, rspec in replicas.items():
        rt = rtype.lower()
        tmpl = copy.deepcopy(rspec["template"])
        for ix in range(int(rspec.get("replicas", 1))):
            pod_spec = copy.deepcopy(tmpl.get("spec") or {})
            rank = ix if rtype == "Master" else ix + (1 if has_master else 0)
            master = f"{name}-master-0"
            for c in pod_spec.get("containers") or []:
                # As pkg/controller.v1/pytorch/envvar.go `setPodEnv` (nprocPerNode "auto": 1).
                env = [*(c.get("env") or []), {"name": "PYTHONUNBUFFERED", "value": "1"}]
                if has_master:
                    env += [
                        {"name": "MASTER_PORT", "value": str(PYTORCH_PORT)},
                        {"name": "PET_MASTER_PORT", "value": str(PYTORCH_PORT)},
                        {"name": "MASTER_ADDR", "value": master},
                        {"name": "PET_MASTER_ADDR", "value": master},
                        {"name": "WORLD_SIZE", "value": str(world)},
                        {"name": "RANK", "value": str(rank)},
                        {"name": "PET_NODE_RANK", "value": str(rank)},
                    ]
                env.append({"name": "PET_NNODES", "value": str(world)})
                c["env"] = env
            if rspec.get("restartPolicy"):
                pod_spec["restartPolicy"] = "Never" if rspec["restartPolicy"] == "ExitCode" else rspec["restartPolicy"]
            tmeta = tmpl.get("metadata") or {}
            labels = dict(tmeta.get("labels") or {})
            labels.update(
                {
                    "training.kubeflow.org/operator-name": PYTORCH_OPERATOR,
                    "training.kubeflow.org/job-name": name,
                    "training.kubeflow.org/replica-type": rt,
                    "training.kubeflow.org/replica-index": str(ix),
                }
            )
            if rtype == "Master":
                labels["training.kubeflow.org/job-role"] = "master"
            out.append(
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {
                        "name": f"{name}-{rt}-{ix}",
                        "namespace": ns,
                        "labels": labels,
                        "annotations": dict(tmeta.get("annotations") or {}),
                        "ownerReferences": [_owner(job)],
                    },
                    "spec": pod_spec,
                }
            )
    return out


def pytorch_status(job: dict[str, Any], pods: list[dict[str, Any]]) -> dict[str, Any]:
    replicas = job["spec"].get("pytorchReplicaSpecs") or {}
    old = job.get("status") or {}
    now = _rfc3339()
    rstatus: dict[str, Any] = {}
    all_running = bool(replicas)
    for rtype, rspec in replicas.items():
        mine = [p for p in pods if p["metadata"]["labels"].get("training.kubeflow.org/replica-type") == rtype.lower()]
        counts = _phases(mine)
        rstatus[rtype] = {
            "active": counts.get("Running", 0) + counts.get("Pending", 0),
            "succeeded": counts.get("Succeeded", 0),
            "failed": counts.get("Failed", 0),
            "selector": f"training.kubeflow.org/job-name={job['metadata']['name']},"
            f"training.kubeflow.org/operator-name={PYTORCH_OPERATOR},"
            f"training.kubeflow.org/replica-type={rtype.lower()}",
        }
        if counts.get("Running", 0) < int(rspec.get("replicas", 1)):
            all_running = False
    conditions = [dict(c) for c in old.get("conditions") or []]

    def ensure(ctype: str, reason: str, message: str) -> None:
        for c in conditions:
            if c.get("type") == ctype:
                return
        conditions.append(
            {
                "type": ctype,
                "status": "True",
                "reason": reason,
                "message": message,
                "lastUpdateTime": now,
                "lastTransitionTime": now,
            }
        )

    name = job["metadata"]["name"]
    ensure("Created", "PyTorchJobCreated", f"PyTorchJob {name} is created.")
    if all_running:
        ensure("Running", "PyTorchJobRunning", f"PyTorchJob {job['metadata']['namespace']}/{name} is running.")
    out: dict[str, Any] = {"conditions": conditions, "replicaStatuses": rstatus}
    out["startTime"] = old.get("startTime") or now
    return out
