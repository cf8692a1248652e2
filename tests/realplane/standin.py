"""A TEST STAND-IN for the Volcano job controller on the real plane.

Volcano's own controller (volcano.sh/volcano's vc-controller-manager) does not run beside the test
plane (docs/testing.md, "The real control plane", says why), so this module does, for the tests,
only the part of its work the tests depend on, the way Volcano v1.10.0 does it:

- pods from the templates: a Volcano Job's pod `<job>-<task>-<index>` per task replica, with the
  labels and annotations Volcano v1.10.0 puts on it (`volcano.sh/job-name`, `volcano.sh/task-spec`,
  `volcano.sh/task-index`, `scheduling.k8s.io/group-name`...; pkg/controllers/job/
  job_controller_util.go `createJobPod`), with a controller ownerReference to the job, so the real
  garbage collector deletes the pods when the job is deleted;
- status, through the status subresource: `status.state.phase` (Pending / Running) with the
  pending / running counts and `taskStatusCount`.

Not done (nothing the tests rely on): gang scheduling (PodGroups: the stock scheduler places the
pods, so the test jobs name `default-scheduler`), Services, job policies, retries, completion.

A pod name still held by an earlier incarnation's pod (being deleted by the garbage collector) is
retried on the next pass, as the real controller's requeue does.

PyTorchJobs are reconciled by the real Kubeflow training-operator (tests/servers/operators.py).
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


def _rfc3339(t: float | None = None) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() if t is None else t))


class VolcanoStandin:
    """Reconciles Volcano Jobs in `namespaces` every `period` seconds, in a thread."""

    def __init__(self, plane: KubePlane, namespaces: Iterable[str], period: float = 0.3) -> None:
        self.plane = plane
        self.namespaces = list(namespaces)
        self.period = period
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="volcano-standin", daemon=True)
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
        group, version, plural, _kind = VOLCANO
        base = f"/apis/{group}/{version}/namespaces/{namespace}/{plural}"
        try:
            items = self.plane.request("GET", base)["items"]
        except urllib.error.HTTPError as e:
            if e.code == 404:  # the CRD is not installed
                return
            raise
        for obj in items:
            if obj["metadata"].get("deletionTimestamp"):
                continue
            for pod in volcano_pods(obj):
                if pod["metadata"]["name"] in by_name:
                    continue  # ours already, or an earlier incarnation's still going
                self._create_pod(namespace, pod)
            status = volcano_status(obj, by_owner.get(obj["metadata"]["uid"], []))
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
