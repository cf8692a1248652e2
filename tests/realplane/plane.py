"""What the realplane tests share: training Jobs on the real plane, the agent as it is deployed (the
cluster role as `trainmedic-cluster`, the brain as `trainmedic-brain`, each with its own
service-account token, over one in-memory bus), waits with deadlines, and a clean plane between tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import time
import urllib.error
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from servers.kubeplane import KubePlane

from trainmedic.agent.bus.memory import MemoryBus
from trainmedic.agent.config import Role, Settings
from trainmedic.agent.run import Agent, build_agent, run_agent
from trainmedic.agent.store import IncidentStatus, IncidentStore
from trainmedic.events import JobRef, KernelBatch, Topic, make_event
from trainmedic.remediations.kube import TAINT_KEY, KubeOps
from trainmedic.remediations.policy import load_policy

ROOT = Path(__file__).resolve().parents[2]
SHIPPED_POLICY = ROOT / "remediations" / "policy.yaml"
TRAINING = "training"
XID79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid=2876, name=python, GPU has fallen off the bus."
RESUME_ARGS = "--resume_from_checkpoint={checkpoint}"
GPU = "nvidia.com/gpu"
# The taint the node lifecycle controller puts on a node whose kubelet stopped posting status.
UNREACHABLE = "node.kubernetes.io/unreachable"
# The training workloads in the namespace: batch/v1 Jobs, Volcano Jobs, Kubeflow PyTorchJobs (the
# CRDs are installed on the plane, tests/cluster/crds/).
WORKLOAD_COLLECTIONS = (
    f"/apis/batch/v1/namespaces/{TRAINING}/jobs",
    f"/apis/batch.volcano.sh/v1alpha1/namespaces/{TRAINING}/jobs",
    f"/apis/kubeflow.org/v1/namespaces/{TRAINING}/pytorchjobs",
)


async def until(what: str, predicate: Callable[[], Any], timeout: float = 60.0, every: float = 0.2) -> Any:
    """Poll `predicate` (a blocking call is fine: it runs in a thread) until it is truthy."""
    deadline = time.monotonic() + timeout
    while True:
        value = await asyncio.to_thread(predicate)
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        await asyncio.sleep(every)


def write_hf_checkpoints(root: Path, complete: int) -> None:
    done = root / f"checkpoint-{complete}"
    done.mkdir(parents=True)
    (done / "trainer_state.json").write_text(json.dumps({"global_step": complete}))
    (done / "pytorch_model.bin").write_bytes(b"\x01" * 4096)


def job_body(
    name: str,
    *,
    pods: int = 2,
    ckpt: Path | None = None,
    resource: str = GPU,
    finalizers: list[str] | None = None,
    tolerations: list[dict[str, str]] | None = None,
) -> dict[str, Any]:
    """An Indexed batch/v1 Job, one pod per node (each asks for all 8 accelerators of a node)."""
    ann = {"trainmedic.io/resume-args": RESUME_ARGS}
    if ckpt is not None:
        ann["trainmedic.io/checkpoint-dir"] = str(ckpt)
    meta: dict[str, Any] = {"name": name, "namespace": TRAINING, "annotations": ann}
    if finalizers:
        meta["finalizers"] = finalizers
    limits = {resource: "8", "cpu": "1", "memory": "1Gi"}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": meta,
        "spec": {
            "completions": pods,
            "parallelism": pods,
            "completionMode": "Indexed",
            "backoffLimit": 0,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "terminationGracePeriodSeconds": 0,
                    "tolerations": tolerations or [],
                    "containers": [
                        {
                            "name": "trainer",
                            "image": "registry.example/train:1",
                            "command": ["torchrun"],
                            "resources": {"limits": limits, "requests": limits},
                        }
                    ],
                }
            },
        },
    }


def _container(name: str) -> dict[str, Any]:
    limits = {GPU: "8", "cpu": "1", "memory": "1Gi"}
    return {
        "name": name,
        "image": "registry.example/train:1",
        "command": ["torchrun"],
        "resources": {"limits": limits, "requests": limits},
    }


def _pod_template(container: str) -> dict[str, Any]:
    return {
        "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 0, "containers": [_container(container)]}
    }


def _meta(name: str, ckpt: Path | None) -> dict[str, Any]:
    ann = {"trainmedic.io/resume-args": RESUME_ARGS}
    if ckpt is not None:
        ann["trainmedic.io/checkpoint-dir"] = str(ckpt)
    return {"name": name, "namespace": TRAINING, "annotations": ann}


def volcano_job(name: str, ckpt: Path | None = None) -> dict[str, Any]:
    """A Volcano Job of one task, two pods (one per node: each asks for all 8 GPUs of a node), placed
    by Volcano's scheduler. The fields Volcano's admission webhook would default (not run on the
    test plane, tests/servers/operators.py) are given."""
    return {
        "apiVersion": "batch.volcano.sh/v1alpha1",
        "kind": "Job",
        "metadata": _meta(name, ckpt),
        "spec": {
            "schedulerName": "volcano",
            "minAvailable": 2,
            "queue": "default",
            "tasks": [{"name": "worker", "replicas": 2, "template": _pod_template("trainer")}],
        },
    }


def pytorch_job(name: str, ckpt: Path | None = None) -> dict[str, Any]:
    """A PyTorchJob of a Master and a Worker (the operator's container name is `pytorch`)."""
    replica = {"replicas": 1, "restartPolicy": "Never", "template": _pod_template("pytorch")}
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": _meta(name, ckpt),
        "spec": {"pytorchReplicaSpecs": {"Master": dict(replica), "Worker": dict(replica)}},
    }


# The custom workload kinds: how to make one, and its collection in the training namespace.
CUSTOM_KINDS: dict[str, tuple[Callable[..., dict[str, Any]], str]] = {
    "volcano": (volcano_job, f"/apis/batch.volcano.sh/v1alpha1/namespaces/{TRAINING}/jobs"),
    "pytorchjob": (pytorch_job, f"/apis/kubeflow.org/v1/namespaces/{TRAINING}/pytorchjobs"),
}


def get_job(plane: KubePlane, name: str) -> dict[str, Any] | None:
    try:
        return dict(plane.request("GET", f"/apis/batch/v1/namespaces/{TRAINING}/jobs/{name}"))
    except urllib.error.HTTPError as e:
        if e.code == 404:
            return None
        raise


def create_job(plane: KubePlane, body: dict[str, Any]) -> dict[str, Any]:
    return dict(plane.request("POST", f"/apis/batch/v1/namespaces/{TRAINING}/jobs", body))


def job_pods(plane: KubePlane, job: dict[str, Any]) -> list[dict[str, Any]]:
    uid = job["metadata"]["uid"]
    out = plane.request(
        "GET", f"/api/v1/namespaces/{TRAINING}/pods?labelSelector=batch.kubernetes.io/controller-uid={uid}"
    )
    return [p for p in out["items"] if not p["metadata"].get("deletionTimestamp")]


def running_on(plane: KubePlane, job: dict[str, Any], n: int) -> list[str] | None:
    """The nodes of the job's pods once n of them are Running (KWOK reports it), else None."""
    pods = job_pods(plane, job)
    running = [p for p in pods if (p.get("status") or {}).get("phase") == "Running"]
    if len(running) < n:
        return None
    return sorted(p["spec"]["nodeName"] for p in running)


def owned_pods(plane: KubePlane, obj: dict[str, Any]) -> list[dict[str, Any]]:
    """The pods (not being deleted) a workload is the controller of, by its ownerReferences."""
    uid = obj["metadata"]["uid"]
    pods = plane.request("GET", f"/api/v1/namespaces/{TRAINING}/pods")["items"]
    return [
        p
        for p in pods
        if not p["metadata"].get("deletionTimestamp")
        and any(r.get("uid") == uid and r.get("controller") for r in p["metadata"].get("ownerReferences") or [])
    ]


def has_taint(plane: KubePlane, node: str, key: str) -> bool:
    taints = (plane.node(node).get("spec") or {}).get("taints") or []
    return any(t.get("key") == key for t in taints)


def policy_file(tmp: Path, **changes: Any) -> Path:
    data = yaml.safe_load(SHIPPED_POLICY.read_text())
    for path, value in changes.items():
        cur = data
        keys = path.split("__")
        for k in keys[:-1]:
            cur = cur[k]
        cur[keys[-1]] = value
    out = tmp / "policy.yaml"
    out.write_text(yaml.safe_dump(data, allow_unicode=True))
    load_policy(out)
    return out


def settings(tmp: Path, role: str, *, mode: str = "enforce", wait_gone_s: float = 30.0) -> Settings:
    return Settings.model_validate(
        {
            "node_name": f"{role}-0",
            "log_format": "text",
            "kubernetes": {"follow_pod_logs": False},
            "logs": {"enabled": False},
            "api": {"enabled": False},
            "kernel": {"source": "off"},
            "metrics": {"nvml": False},
            "detect": {"window_s": 0.5},
            "remediate": {
                "mode": mode,
                "policy": str(policy_file(tmp, circuit_breaker__max_share=0.5)),
                "store": str(tmp / "trainmedic.db"),
                "scene_dir": str(tmp / "scenes"),
                "wait_gone_s": wait_gone_s,
                "log_lines": 100,
                "stacks": False,
            },
        }
    )


@dataclass
class Agents:
    """The cluster role (watchers) and the brain (rules, responder) as deployed, on one bus."""

    bus: MemoryBus
    cluster: Agent
    brain: Agent
    clients: list[Any]
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    @property
    def responder(self) -> Any:
        return self.brain.responder

    @property
    def store(self) -> IncidentStore:
        return IncidentStore(self.brain.settings.remediate.store)

    def terminal(self) -> list[tuple[str, IncidentStatus]]:
        return list(self.responder.handled.items())

    def healed(self) -> list[tuple[str, IncidentStatus]]:
        """The incidents settled, less those settled observe-only: a later fault of the job seen while
        it was healed (its pods dying of the restart's delete) waits for the replacement and is then
        cancelled as stale, which is not a second outcome of the fault under test."""
        return [(i, st) for i, st in self.terminal() if st is not IncidentStatus.OBSERVED]

    async def stop(self) -> None:
        for a in (self.cluster, self.brain):
            a.stop.set()
        for t in self.tasks:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(t, 30)
        for c in self.clients:
            c.close()

    async def kernel_line(self, node: str, job: dict[str, Any], line: str) -> None:
        """What the node agent on `node` publishes for a kernel message about the job's pod there."""
        meta = job["metadata"]
        ref = JobRef(namespace=meta["namespace"], name=meta["name"], kind=job["kind"], api_version=job["apiVersion"])
        batch = KernelBatch(node=node, job=ref, source="kmsg", lines=[line], times=[time.time()])
        await self.bus.publish(Topic.KERNEL, make_event(batch, producer=f"node/{node}"))


async def start_agents(plane: KubePlane, tmp: Path, *, mode: str = "enforce", wait_gone_s: float = 30.0) -> Agents:
    bus = MemoryBus(partitions=4)
    brain_api = plane.api_client(plane.service_account_token("trainmedic", "trainmedic-brain"))
    cluster_api = plane.api_client(plane.service_account_token("trainmedic", "trainmedic-cluster"))
    cluster = build_agent(settings(tmp, "cluster"), Role.CLUSTER, bus=bus, api_client=cluster_api)
    brain = build_agent(
        settings(tmp, "brain", mode=mode, wait_gone_s=wait_gone_s), Role.BRAIN, bus=bus, api_client=brain_api
    )
    assert brain.responder is not None, brain.disabled
    agents = Agents(bus, cluster, brain, [brain_api, cluster_api])
    agents.tasks = [asyncio.create_task(run_agent(a, drain_timeout_s=10)) for a in (cluster, brain)]
    await asyncio.wait_for(brain.responder.ready.wait(), 30)
    return agents


def admin_ops(plane: KubePlane) -> tuple[KubeOps, Any]:
    api = plane.api_client()
    return KubeOps(api), api


def gone_ok(plane: KubePlane, method: str, path: str, body: Any, *, content_type: str) -> None:
    """A request about an object that may have gone meanwhile (404 is fine)."""
    try:
        plane.request(method, path, body, content_type=content_type)
    except urllib.error.HTTPError as e:
        if e.code != 404:
            raise


def _items(plane: KubePlane, collection: str) -> list[dict[str, Any]]:
    """The objects of a collection; none where it is not served (a plane without the CRDs)."""
    try:
        return list(plane.request("GET", collection)["items"])
    except urllib.error.HTTPError as e:
        if e.code == 404:
            return []
        raise


async def clean(plane: KubePlane) -> None:
    """Back to six healthy, schedulable nodes and no training jobs: KWOK plays every node again, our
    quarantines are released, the jobs and their pods are gone.

    The workloads are deleted in the foreground (as trainmedic's restart deletes them), so a
    workload is gone only once its pods are: Volcano v1.10.0's job controller, when a job is
    deleted while its pods are still there, retries its cache cleanup with a growing delay keyed by
    the job's name, and a late retry then drops the cache entry of a new job of the same name,
    which it never reconciles again (volcano-sh/volcano#3968); the next test reuses the names."""
    ops, api = admin_ops(plane)
    try:
        for n in plane.nodes:
            plane.revive_node(n.name)
            await ops.release_node(n.name)
        for base in WORKLOAD_COLLECTIONS:
            for j in _items(plane, base):
                name = j["metadata"]["name"]
                finalizers = j["metadata"].get("finalizers") or []
                # A test's foreign finalizers go; the garbage collector's own (a deletion in the
                # foreground under way) stays.
                kept = [f for f in finalizers if f == "foregroundDeletion"]
                if finalizers != kept:
                    gone_ok(
                        plane,
                        "PATCH",
                        f"{base}/{name}",
                        {"metadata": {"finalizers": kept or None}},
                        content_type="application/merge-patch+json",
                    )
                with contextlib.suppress(urllib.error.HTTPError):
                    plane.request("DELETE", f"{base}/{name}", {"propagationPolicy": "Foreground"})
        for p in plane.request("GET", f"/api/v1/namespaces/{TRAINING}/pods")["items"]:
            name = p["metadata"]["name"]
            if p["metadata"].get("finalizers"):
                gone_ok(
                    plane,
                    "PATCH",
                    f"/api/v1/namespaces/{TRAINING}/pods/{name}",
                    {"metadata": {"finalizers": None}},
                    content_type="application/merge-patch+json",
                )
            with contextlib.suppress(urllib.error.HTTPError):
                plane.request("DELETE", f"/api/v1/namespaces/{TRAINING}/pods/{name}", {"gracePeriodSeconds": 0})

        left: list[str] = []

        def settled() -> bool:
            pods = plane.request("GET", f"/api/v1/namespaces/{TRAINING}/pods")["items"]
            jobs = [j for base in WORKLOAD_COLLECTIONS for j in _items(plane, base)]
            left[:] = [f"pod {p['metadata']['name']}" for p in pods] + [
                f"{j.get('kind', 'Job')} {j['metadata']['name']}" for j in jobs
            ]
            for n in plane.nodes:
                node = plane.node(n.name)
                if plane.node_ready(n.name) and post_node_addresses(plane, n.name, node):
                    left.append(f"node {n.name}: addresses posted again")
                    continue
                if not plane.node_ready(n.name) or node["spec"].get("taints") or node["spec"].get("unschedulable"):
                    left.append(f"node {n.name}: {node['spec']} {(node.get('status') or {}).get('conditions')}")
            return not left

        try:
            await until("a clean plane", settled, timeout=90)
            if plane.apiserver_restarted_at > _calmed.get(id(plane), 0.0):
                # After an API server restart the node lifecycle controller may still mark a node
                # Unknown from the leases it missed meanwhile (a healthy node, then seen by the next
                # test's agent as lost): wait for every lease renewed since, and for a node grace
                # period of calm. And Volcano v1.10.0's controller manager may not see its PodGroups
                # again (seen here: the scheduler enqueued one, the job controller never synced the
                # job again), so the workload controllers start afresh, as a pod restart would.
                await asyncio.to_thread(_restart_workload_controllers, plane)
                await until("every node lease renewed since the restart", lambda: _leases_fresh(plane), timeout=90)
                await asyncio.sleep(plane.node_grace_s + 2 * plane.node_monitor_period_s)
                await until("a clean plane", settled, timeout=90)
                _calmed[id(plane)] = plane.apiserver_restarted_at
        except AssertionError as e:
            raise AssertionError(f"{e}; still there: {left}") from None
    finally:
        ops.close()
        api.close()


# The API server restart each plane has been calmed after (clean), by id(plane).
_calmed: dict[int, float] = {}
_CORE = frozenset({"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler"})


def _restart_workload_controllers(plane: KubePlane) -> None:
    """Stop and start again every process the plane runs besides its core and its KWOKs."""
    for name, proc in plane.procs.items():
        if name in _CORE or name.startswith("kwok-"):
            continue
        proc.stop()
        proc.start()


def _leases_fresh(plane: KubePlane) -> bool:
    """Every node's kube-node-lease Lease renewed after the API server's last restart."""
    for n in plane.nodes:
        lease = plane.request("GET", f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{n.name}")
        renew = str((lease.get("spec") or {}).get("renewTime") or "")
        if not renew:
            return False
        when = datetime.datetime.fromisoformat(renew.replace("Z", "+00:00")).timestamp()
        if when <= plane.apiserver_restarted_at:
            return False
    return True


def post_node_addresses(plane: KubePlane, name: str, node: dict[str, Any] | None = None) -> bool:
    """Post the node's address again, as KWOK's `--node-ip` gives it (InternalIP only), when it is
    missing or a Hostname came with it; True when it had to.

    KWOK's stock stages do not post a revived node's addresses again, as a real kubelet does on
    start. The API server reaches a node's kubelet (its logs) by the first address of
    `--kubelet-preferred-address-types`, Hostname before InternalIP by default, and a Hostname
    here is a name no DNS knows."""
    node = plane.node(name) if node is None else node
    addresses = (node.get("status") or {}).get("addresses") or []
    types = [a.get("type") for a in addresses]
    if "InternalIP" in types and "Hostname" not in types:
        return False
    gone_ok(
        plane,
        "PATCH",
        f"/api/v1/nodes/{name}/status",
        {"status": {"addresses": [{"type": "InternalIP", "address": "127.0.0.1"}]}},
        content_type="application/merge-patch+json",
    )
    return True


__all__ = [
    "GPU",
    "TAINT_KEY",
    "TRAINING",
    "UNREACHABLE",
    "XID79",
    "Agents",
    "clean",
    "owned_pods",
    "post_node_addresses",
    "start_agents",
]
