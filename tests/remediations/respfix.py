"""A responder over an in-memory cluster, for tests of the responder's own logic (breaker, journal,
errors, budgets) where the API server's behaviour is not what is under test (KubeOps itself is
proven on kmock and the real control plane).

`FakeKube` speaks the part of KubeOps the responder uses. Every call yields to the loop first, as a
real API round trip does, so incidents handled side by side interleave at each call. Its knobs
(`terminating`, `fail_delete`, `fail_create`, `fail_quarantine`) play the cluster's slow or odd
moments. `PagesBus` keeps what the responder published on `trainmedic.incidents` (what the sinks
page people with).
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainmedic.agent.bus.memory import MemoryBus
from trainmedic.agent.responder import Responder, ResponderSettings
from trainmedic.agent.store import ActionState, IncidentStore
from trainmedic.events import DiagnosisEvent, Event, IncidentEvent, JobRef, Topic, job_key
from trainmedic.models import Chip, Diagnosis, FaultClass, Finding, I18nText, RootCause, Severity
from trainmedic.remediations.kube import TAINT_EFFECT, TAINT_KEY, ConflictError, QuarantineResult
from trainmedic.remediations.policy import Policy, parse_policy
from trainmedic.remediations.policy_state import MemoryPolicyState

POOL_LABEL = "node.kubernetes.io/instance-type"


def node(name: str, pool: str = "h100") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {POOL_LABEL: pool}, "annotations": {}},
        "spec": {},
    }


def job(namespace: str, name: str, **annotations: str) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"namespace": namespace, "name": name, "annotations": dict(annotations), "labels": {}},
        "spec": {
            "template": {
                "metadata": {"labels": {}},
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [
                        {
                            "name": "train",
                            "image": "trainer:1",
                            "args": ["--hf_token", "hf_secretvalue"],
                            "env": [{"name": "WANDB_API_KEY", "value": "wandb-secret-value"}],
                        }
                    ],
                },
            }
        },
    }


class Crash(BaseException):
    """The agent dies here (not an error any handler catches)."""


@dataclass
class FakeKube:
    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    workloads: dict[tuple[str, str, str], dict[str, Any]] = field(default_factory=dict)
    # Workloads whose deletion never completes (a foreign finalizer): (kind, namespace, name).
    terminating: set[tuple[str, str, str]] = field(default_factory=set)
    created: list[dict[str, Any]] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    quarantines: list[str] = field(default_factory=list)
    # The jobs' pods (most tests have none).
    pods: list[dict[str, Any]] = field(default_factory=list)
    # Finalizers added to pods: (namespace, pod, finalizer).
    finalizers_added: list[tuple[str, str, str]] = field(default_factory=list)
    # Circuit-breaker claims written (trainmedic.io/breaker-claim).
    claims_written: int = 0
    # The label selector of every node list (empty: all nodes).
    node_lists: list[dict[str, str]] = field(default_factory=list)
    # An error the API (or a layer under it) answers the next delete with, once.
    fail_delete: Exception | None = None
    # An error every create is answered with while set (a ResourceQuota, an admission webhook, ...).
    fail_create: Exception | None = None
    # An error every quarantine (cordon, taint) is answered with while set (an API answering 5xx).
    fail_quarantine: Exception | None = None
    # Node problems reported (node-problem-detector style): (node, fault class, incident).
    problems: list[tuple[str, str, str]] = field(default_factory=list)
    # Where the agent dies once: before_delete, after_delete, before_create, after_create.
    crash_at: str | None = None
    api: Any = None
    # Pods trainmedic runs itself (the checkpoint reader) by name, and what a reader prints given its
    # pod body: (log, exit code); None: such a pod never starts (it stays Pending).
    run_pods: dict[str, dict[str, Any]] = field(default_factory=dict)
    reader: Callable[[dict[str, Any]], tuple[str, int]] | None = None
    pods_created: list[dict[str, Any]] = field(default_factory=list)
    pods_deleted: list[str] = field(default_factory=list)
    _gen: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    async def _rtt(self) -> None:
        await asyncio.sleep(0)

    def close(self) -> None:
        return None

    def add(self, obj: dict[str, Any]) -> dict[str, Any]:
        meta = obj.setdefault("metadata", {})
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("creationTimestamp", f"2026-01-01T00:00:{next(self._gen) % 60:02d}Z")
        meta.setdefault("generation", 1)
        self.workloads[(obj["kind"], meta["namespace"], meta["name"])] = obj
        return obj

    # -- nodes --

    async def list_nodes(self, *, label_selector: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
        await self._rtt()
        self.node_lists.append(dict(label_selector or {}))
        want = (label_selector or {}).items()
        return [copy.deepcopy(n) for n in self.nodes.values() if want <= (n["metadata"].get("labels") or {}).items()]

    async def get_node(self, name: str) -> dict[str, Any] | None:
        await self._rtt()
        n = self.nodes.get(name)
        return copy.deepcopy(n) if n else None

    async def annotate_node(self, name: str, key: str, value: str | None) -> None:
        await self._rtt()
        ann = self.nodes[name]["metadata"].setdefault("annotations", {})
        if value is None:
            ann.pop(key, None)
        else:
            ann[key] = value
        self.claims_written += value is not None

    async def quarantine_node(self, name: str, *, incident_id: str, fault_class: Any, reason: str) -> QuarantineResult:
        await self._rtt()
        if self.fail_quarantine is not None:
            raise self.fail_quarantine
        n = self.nodes[name]
        taints = n["spec"].setdefault("taints", [])
        changed = not any(t["key"] == TAINT_KEY for t in taints)
        if changed:
            taints.append({"key": TAINT_KEY, "value": str(fault_class), "effect": TAINT_EFFECT})
            n["spec"]["unschedulable"] = True
            self.quarantines.append(name)
        return QuarantineResult(name, changed, None, incident_id)

    async def report_node_problem(self, node: str, *, incident_id: str, fault_class: Any, message: I18nText) -> bool:
        await self._rtt()
        if node not in self.nodes:
            return False
        entry = (node, str(fault_class), incident_id)
        if entry in self.problems:
            return False
        self.problems.append(entry)
        return True

    async def quarantined_nodes(self) -> list[dict[str, Any]]:
        await self._rtt()
        return [
            {"name": n["metadata"]["name"]}
            for n in self.nodes.values()
            if any(t["key"] == TAINT_KEY for t in n["spec"].get("taints") or [])
        ]

    # -- workloads --

    async def get_workload(self, api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        await self._rtt()
        obj = self.workloads.get((kind, namespace, name))
        return copy.deepcopy(obj) if obj else None

    def _crash(self, where: str) -> None:
        if self.crash_at == where:
            self.crash_at = None
            raise Crash(where)

    async def delete_workload(self, obj: Mapping[str, Any], *, propagation: str = "Background") -> bool:
        await self._rtt()
        self._crash("before_delete")
        if self.fail_delete is not None:
            err, self.fail_delete = self.fail_delete, None
            raise err
        meta = obj["metadata"]
        key = (str(obj["kind"]), meta["namespace"], meta["name"])
        current = self.workloads.get(key)
        if current is None or current["metadata"]["uid"] != meta.get("uid"):
            return False
        self.deleted.append(meta["uid"])
        if key in self.terminating:
            current["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
        else:
            del self.workloads[key]
        self._crash("after_delete")
        return True

    async def wait_gone(
        self, api_version: str, kind: str, namespace: str, name: str, *, uid: str | None = None, timeout_s: float
    ) -> bool:
        await asyncio.sleep(timeout_s if (kind, namespace, name) in self.terminating else 0)
        current = self.workloads.get((kind, namespace, name))
        return current is None or (uid is not None and current["metadata"]["uid"] != uid)

    async def create_workload(self, body: Mapping[str, Any]) -> dict[str, Any]:
        await self._rtt()
        self._crash("before_create")
        if self.fail_create is not None:
            raise self.fail_create
        meta = body["metadata"]
        key = (str(body["kind"]), meta["namespace"], meta["name"])
        if key in self.workloads:
            raise ConflictError(f"{key} already exists")
        obj = copy.deepcopy(dict(body))
        for f in ("uid", "creationTimestamp", "generation", "resourceVersion", "deletionTimestamp"):
            obj["metadata"].pop(f, None)
        self.add(obj)
        self.created.append(obj)
        self._crash("after_create")
        return copy.deepcopy(obj)

    # -- pods, logs, events (pods: only those a test adds) --

    async def list_job_pods(self, namespace: str, selector: Mapping[str, str]) -> list[dict[str, Any]]:
        await self._rtt()
        return [
            copy.deepcopy(p)
            for p in self.pods
            if p["metadata"]["namespace"] == namespace
            and all(p["metadata"].get("labels", {}).get(k) == v for k, v in selector.items())
        ]

    async def pod_log(self, namespace: str, pod: str, *args: Any, **kwargs: Any) -> str:
        run = self.run_pods.get(pod)
        return str(run.get("log", "")) if run else ""

    async def create_pod(self, namespace: str, body: Mapping[str, Any]) -> dict[str, Any]:
        await self._rtt()
        obj = copy.deepcopy(dict(body))
        self.pods_created.append(copy.deepcopy(obj))
        status: dict[str, Any] = {"phase": "Pending"}
        log = ""
        if self.reader is not None:
            log, code = self.reader(obj)
            term = {"exitCode": code, "reason": "Completed" if code == 0 else "Error"}
            status = {
                "phase": "Succeeded" if code == 0 else "Failed",
                "containerStatuses": [{"name": "reader", "state": {"terminated": term}}],
            }
        obj["status"] = status
        self.run_pods[obj["metadata"]["name"]] = {"pod": obj, "log": log}
        return obj

    async def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        await self._rtt()
        run = self.run_pods.get(name)
        return copy.deepcopy(run["pod"]) if run else None

    async def delete_pod(self, namespace: str, name: str) -> bool:
        await self._rtt()
        self.pods_deleted.append(name)
        return self.run_pods.pop(name, None) is not None

    async def list_events(self, namespace: str, *, involved: Any = None) -> list[dict[str, Any]]:
        await self._rtt()
        return []

    async def add_pod_finalizer(self, namespace: str, name: str, finalizer: str) -> bool:
        self.finalizers_added.append((namespace, name, finalizer))
        return True

    async def remove_pod_finalizer(self, *args: Any) -> bool:
        return True


class PagesBus(MemoryBus):
    """A memory bus that keeps every incident state the responder published (what the sinks send)."""

    def __init__(self) -> None:
        super().__init__()
        self.incidents: list[IncidentEvent] = []

    async def publish(self, topic: str, event: Event) -> None:
        if topic == Topic.INCIDENTS and isinstance(event.payload, IncidentEvent):
            self.incidents.append(event.payload)
        await super().publish(topic, event)


class CrashingStore(IncidentStore):
    """The incident store of an agent that dies (SIGKILL) right before or right after the journal
    records one state of an action: `crash_at` = ("before" | "after", state)."""

    crash_at: tuple[str, str] | None = None
    # Every journal write as (state, thread it ran in): the responder writes it off the loop's thread.
    writes: list[tuple[str, int]]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.writes = []

    def update_action(
        self,
        incident_id: str,
        seq: int,
        state: ActionState,
        *,
        params: Mapping[str, Any] | None = None,
        result: Mapping[str, Any] | None = None,
    ) -> None:
        self.writes.append((state.value, threading.get_ident()))
        where = self.crash_at
        if where == ("before", state.value):
            self.crash_at = None
            raise Crash(f"before journalling {state.value}")
        super().update_action(incident_id, seq, state, params=params, result=result)
        if where == ("after", state.value):
            self.crash_at = None
            raise Crash(f"after journalling {state.value}")


def policy(extra: str = "", *, actions: str = "[quarantine_node]", mode: str = "enforce") -> Policy:
    return parse_policy(
        f"version: 1\nmode: {mode}\n{extra}"
        "rules:\n"
        "  - id: xid-79\n"
        "    match: {fault_class: device_error}\n"
        f"    actions: {actions}\n"
    )


def diagnosis(namespace: str, name: str, node_name: str, *, t: float = 1000.0, n: int = 0) -> DiagnosisEvent:
    rc = RootCause(
        fault_class=FaultClass.DEVICE_ERROR,
        chip=Chip.NVIDIA,
        code="xid:79",
        node=node_name,
        device="0",
        summary=I18nText(en="GPU has fallen off the bus", zh="GPU 掉卡"),
        rule_id="nvidia.xid.79",
        severity=Severity.CRITICAL,
    )
    finding = Finding.model_validate(
        {
            "rule_id": "nvidia.xid.79",
            "fault_class": "device_error",
            "chip": "nvidia",
            "code": "xid:79",
            "source": "kernel",
            "line_no": 1,
            "text": "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.",
            "node": node_name,
            "timestamp": t - 1,
            "severity": "critical",
        }
    )
    return DiagnosisEvent(
        diagnosis_id=f"d-{namespace}-{name}-{n}",
        final=True,
        job=JobRef(namespace=namespace, name=name),
        node=node_name,
        window_start=t - 5,
        window_end=t,
        diagnosis=Diagnosis(root_cause=rc, findings=[finding]),
    )


@dataclass
class Harness:
    kube: FakeKube
    store: IncidentStore
    responder: Responder
    state: MemoryPolicyState

    async def handle(self, d: DiagnosisEvent) -> Any:
        assert d.job is not None
        return await self.responder.handle(d, key=job_key(d.job.namespace, d.job.name))


def pod(namespace: str, job_name: str, name: str, phase: str = "Running") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"namespace": namespace, "name": name, "labels": {"job-name": job_name}},
        "spec": {"containers": [{"name": "train", "image": "trainer:1"}], "nodeName": "gpu-0"},
        "status": {"phase": phase},
    }


def harness(
    tmp: Path,
    pol: Policy,
    kube: FakeKube | None = None,
    *,
    clock: Callable[[], float] | None = None,
    stack_source: Any = None,
    crash_journal: tuple[str, str] | None = None,
    bus: MemoryBus | None = None,
    state: MemoryPolicyState | None = None,
    **settings: Any,
) -> Harness:
    kube = kube or FakeKube()
    store = CrashingStore(tmp / "incidents.db")
    store.crash_at = crash_journal
    state = state or MemoryPolicyState()
    responder = Responder(
        bus or MemoryBus(),
        kube,  # type: ignore[arg-type]
        store,
        pol,
        state,
        settings=ResponderSettings(scene_dir=tmp / "scenes", reports=False, stacks=False, **settings),
        clock=clock or time.time,
        stack_source=stack_source,
    )
    return Harness(kube, store, responder, state)
