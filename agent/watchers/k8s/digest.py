"""Digests: what an API object says, reduced to what diagnosis uses, and the payloads built from
them (`PodDigest` -> `PodStatus`, `node_status`, `workload_status`, `k8s_event`).

The reflectors' caches hold digests, not objects: for a pod, the fields a `PodStatus` carries
(about 3 KB with its labels and its JobIndex entry, against 5-30 KB for the JSON object and several
times that as Python dicts; tests/agent/watchers/test_k8s_digest.py measures it).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from trainmedic.agent.jobindex import JobIndex, PodInfo, _get, _map, pod_info
from trainmedic.agent.watchers.k8s.objects import (
    PYTORCH_JOBS,
    VOLCANO_JOBS,
    ResourceSpec,
    _int,
    _str,
    _str_map,
    _time_s,
)
from trainmedic.events import JobRef, K8sEvent, NodeStatus, PodStatus, WorkloadStatus
from trainmedic.quantity import parse_quantity
from trainmedic.udal.registry import detect_chip, load_plugins, plugin_of_resource

# ------------------------------------------------------------------------------------------------
# Pod digests


@dataclass(frozen=True, slots=True)
class ContainerDigest:
    """What a container status says, reduced to what diagnosis uses."""

    name: str
    init: bool
    ready: bool
    restarts: int
    # waiting | running | terminated; "terminated" also when the container waits to restart after a
    # termination (CrashLoopBackOff): the last termination (lastState) is what explains it.
    state: str
    reason: str | None
    exit_code: int | None
    signal: int | None
    started_at: str | None
    finished_at: str | None
    # The waiting reason (CrashLoopBackOff, ImagePullBackOff) when the container is waiting.
    waiting_reason: str | None
    # A running container that was restarted: its previous run's end (lastState.terminated), which
    # a watcher that missed the terminated state between the two runs only sees here.
    last_reason: str | None = None
    last_exit_code: int | None = None
    last_signal: int | None = None
    last_finished_at: str | None = None

    def as_dict(self) -> dict[str, object]:
        out: dict[str, object] = {
            "name": self.name,
            "ready": self.ready,
            "restarts": self.restarts,
            "state": self.state,
            "reason": self.reason,
            "exit_code": self.exit_code,
            "signal": self.signal,
            "oom_killed": self.reason == "OOMKilled",
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "init": self.init,
            "waiting_reason": self.waiting_reason,
        }
        if self.last_exit_code is not None or self.last_reason is not None:
            out.update(
                last_reason=self.last_reason,
                last_exit_code=self.last_exit_code,
                last_signal=self.last_signal,
                last_finished_at=self.last_finished_at,
            )
        return out


def container_digest(cs: Mapping[str, Any], *, init: bool = False) -> ContainerDigest:
    """One entry of status.containerStatuses (or initContainerStatuses)."""
    state = _map(cs.get("state"))
    last = _get(cs, "lastState", "terminated")
    term: Mapping[str, Any] | None = None
    waiting_reason = None
    started_at = None
    if isinstance(state.get("terminated"), Mapping):
        kind, term = "terminated", state["terminated"]
    elif isinstance(state.get("running"), Mapping):
        kind, started_at = "running", _str(state["running"].get("startedAt"))
    else:
        waiting_reason = _str(_get(state, "waiting", "reason"))
        if isinstance(last, Mapping):
            kind, term = "terminated", last
        else:
            kind = "waiting"
    reason = waiting_reason if kind == "waiting" else None
    exit_code = signal = None
    finished_at = None
    previous: dict[str, Any] = {}
    if kind == "running" and isinstance(last, Mapping):
        previous = {
            "last_reason": _str(last.get("reason")),
            "last_exit_code": _int(last.get("exitCode")),
            "last_signal": _int(last.get("signal")),
            "last_finished_at": _str(last.get("finishedAt")),
        }
    if term is not None:
        reason = _str(term.get("reason"))
        exit_code = _int(term.get("exitCode"))
        signal = _int(term.get("signal"))
        started_at = _str(term.get("startedAt"))
        finished_at = _str(term.get("finishedAt"))
    return ContainerDigest(
        name=str(cs.get("name") or "?"),
        init=init,
        ready=cs.get("ready") is True,
        restarts=_int(cs.get("restartCount")) or 0,
        state=kind,
        reason=reason,
        exit_code=exit_code,
        signal=signal,
        started_at=started_at,
        finished_at=finished_at,
        waiting_reason=waiting_reason,
        **previous,
    )


def container_digests(pod: Mapping[str, Any]) -> tuple[ContainerDigest, ...]:
    out: list[ContainerDigest] = []
    for init, key in ((True, "initContainerStatuses"), (False, "containerStatuses")):
        statuses = _get(pod, "status", key)
        if isinstance(statuses, list):
            out.extend(container_digest(cs, init=init) for cs in statuses if isinstance(cs, Mapping))
    return tuple(out)


@dataclass(frozen=True, slots=True)
class PodDigest:
    """The cached form of a pod: what a PodStatus carries, nothing else."""

    namespace: str
    name: str
    uid: str | None
    node: str | None
    phase: str | None
    job: JobRef | None
    rank: int | None
    containers: tuple[ContainerDigest, ...]
    labels: tuple[tuple[str, str], ...]
    reason: str | None = None
    terminating: bool = False

    def meaningful(self) -> tuple[object, ...]:
        """What a change must touch to be published (labels and timestamps of probes are not)."""
        return (self.uid, self.node, self.phase, self.job, self.rank, self.containers, self.reason, self.terminating)

    def status(self, *, deleted: bool = False) -> PodStatus:
        return PodStatus(
            namespace=self.namespace,
            pod=self.name,
            uid=self.uid,
            node=self.node,
            job=self.job,
            rank=self.rank,
            phase=self.phase,
            reason=self.reason,
            terminating=self.terminating,
            deleted=deleted,
            containers=[c.as_dict() for c in self.containers],
            labels=dict(self.labels),
        )


def pod_digest(pod: Mapping[str, Any], info: PodInfo | None = None) -> PodDigest:
    info = info or pod_info(pod)
    labels = _str_map(_get(pod, "metadata", "labels"), limit=64, value_max=256)
    return PodDigest(
        namespace=info.namespace,
        name=info.name,
        uid=info.uid if isinstance(info.uid, str) else None,
        node=info.node if isinstance(info.node, str) else None,
        phase=_str(_get(pod, "status", "phase")),
        job=info.job,
        rank=info.rank,
        containers=container_digests(pod),
        labels=tuple(sorted(labels.items())),
        reason=pod_reason(pod),
        terminating=_get(pod, "metadata", "deletionTimestamp") is not None,
    )


def pod_reason(pod: Mapping[str, Any]) -> str | None:
    """The pod's own reason (status.reason: NodeLost, Evicted, ...), else that of a true
    DisruptionTarget condition (DeletionByTaintManager, PreemptionByScheduler, TerminationByKubelet)."""
    reason = _str(_get(pod, "status", "reason"))
    if reason is not None:
        return reason[:128]
    for c in _get(pod, "status", "conditions") or ():
        if isinstance(c, Mapping) and c.get("type") == "DisruptionTarget" and c.get("status") == "True":
            r = _str(c.get("reason"))
            if r is not None:
                return r[:128]
    return None


# ------------------------------------------------------------------------------------------------
# Events, nodes and workloads as payloads

MAX_EVENT_MESSAGE = 4096


def event_pod(obj: Mapping[str, Any], jobs: JobIndex) -> PodInfo | None:
    """The indexed pod a Pod event is about: by the involved object's uid, or by its name where the
    event carries no uid or the pod of that name has none. Not the pod of that name where the uids
    differ: that event was recorded on an earlier pod of the name (a workload recreated under its
    name has pods of the names its earlier incarnation had)."""
    inv = _map(obj.get("involvedObject")) or _map(obj.get("regarding"))
    if _str(inv.get("kind")) != "Pod":
        return None
    uid, name = _str(inv.get("uid")), _str(inv.get("name"))
    if uid is not None:
        known = jobs.pod_by_uid(uid)
        if known is not None:
            return known
    if name is None:
        return None
    namespace = _str(inv.get("namespace")) or _str(_get(obj, "metadata", "namespace")) or "default"
    info = jobs.pod(namespace, name)
    if info is not None and uid is not None and info.uid is not None and info.uid != uid:
        return None
    return info


def k8s_event(obj: Mapping[str, Any], jobs: JobIndex | None = None) -> K8sEvent:
    """A core/v1 Event (or events.k8s.io/v1 Event) as a K8sEvent; the job from the index for a pod
    (`event_pod`)."""
    meta = _map(obj.get("metadata"))
    inv = _map(obj.get("involvedObject")) or _map(obj.get("regarding"))
    kind, name = _str(inv.get("kind")), _str(inv.get("name"))
    namespace = _str(meta.get("namespace")) or _str(inv.get("namespace"))
    node = _str(_get(obj, "source", "host")) or _str(_get(obj, "deprecatedSource", "host"))
    if node is None and kind == "Node":
        node = name
    if node is None and obj.get("reportingComponent") == "kubelet":
        node = _str(obj.get("reportingInstance"))
    job = None
    if kind == "Pod" and jobs is not None:
        info = event_pod(obj, jobs)
        if info is not None:
            job = info.job
            node = node or info.node
    count = _int(obj.get("count")) or _int(_get(obj, "series", "count")) or 1
    message = obj.get("message") if isinstance(obj.get("message"), str) else obj.get("note")
    return K8sEvent(
        namespace=namespace,
        type=_str(obj.get("type")),
        reason=_str(obj.get("reason")),
        message=(message if isinstance(message, str) else "")[:MAX_EVENT_MESSAGE],
        object_kind=kind,
        object_name=name,
        node=node,
        job=job,
        count=count,
        uid=_str(meta.get("uid")),
    )


def event_time(obj: Mapping[str, Any]) -> float | None:
    """When an Event last happened (lastTimestamp, series.lastObservedTime, eventTime, ...)."""
    for path in (
        ("lastTimestamp",),
        ("series", "lastObservedTime"),
        ("eventTime",),
        ("firstTimestamp",),
        ("metadata", "creationTimestamp"),
    ):
        t = _time_s(_get(obj, *path))
        if t is not None:
            return t
    return None


def _plugin_resources() -> dict[str, str]:
    """Resource name -> chip for the chip plugins' exact `resource_names` (computed once by a watcher)."""
    out: dict[str, str] = {}
    with contextlib.suppress(Exception):  # a broken third-party plugin must not stop node watching
        for plugin in load_plugins().values():
            for res in plugin.resource_names:
                out[res] = plugin.chip.value
    return out


def _resource_chip(res: str, plugin_resources: Mapping[str, str]) -> str | None:
    """The chip of an extended resource: `plugin_resources` first, else the chip plugin that claims
    it by name or prefix (udal.registry.plugin_of_resource); None for any other resource."""
    chip = plugin_resources.get(res)
    if chip is None:
        with contextlib.suppress(Exception):  # a broken third-party plugin must not stop node watching
            plugin = plugin_of_resource(res)
            chip = plugin.chip.value if plugin is not None else None
    return chip


def is_accelerator_resource(name: str, plugin_resources: Mapping[str, str] | None = None) -> bool:
    """A resource name of an accelerator: one a chip plugin declares (its `resource_names` and
    `resource_prefixes`: NVIDIA GPUs and MIG slices, Huawei Ascend NPUs, Cambricon MLUs, ...)."""
    plugin_resources = _plugin_resources() if plugin_resources is None else plugin_resources
    return _resource_chip(name, plugin_resources) is not None


def _quantity(v: Any) -> int | None:
    if isinstance(v, int) and not isinstance(v, bool):
        return v
    if isinstance(v, str):
        with contextlib.suppress(ValueError):
            return int(parse_quantity(v))
    return None


def node_status(obj: Mapping[str, Any], *, plugin_resources: Mapping[str, str] | None = None) -> NodeStatus:
    """A node's conditions ({type: status}), taints ("key=value:Effect"), accelerators and chip."""
    plugin_resources = _plugin_resources() if plugin_resources is None else plugin_resources
    labels = _str_map(_get(obj, "metadata", "labels"))
    conditions: dict[str, str] = {}
    reasons: dict[str, str] = {}
    for c in _get(obj, "status", "conditions") or ():
        if isinstance(c, Mapping) and _str(c.get("type")):
            conditions[str(c["type"])] = str(c.get("status") or "Unknown")
            if _str(c.get("reason")):
                reasons[str(c["type"])] = str(c["reason"])[:128]
    taints: list[str] = []
    for t in _get(obj, "spec", "taints") or ():
        if isinstance(t, Mapping) and _str(t.get("key")):
            value = _str(t.get("value"))
            taints.append(
                f"{t['key']}={value}:{t.get('effect') or ''}" if value else f"{t['key']}:{t.get('effect') or ''}"
            )
    accelerators: dict[str, int] = {}
    capacity = _get(obj, "status", "capacity")
    if isinstance(capacity, Mapping):
        for res, qty in capacity.items():
            if isinstance(res, str) and _resource_chip(res, plugin_resources) is not None:
                n = _quantity(qty)
                if n is not None:
                    accelerators[res] = n
    chip = None
    with contextlib.suppress(Exception):
        plugin = detect_chip(labels)
        chip = plugin.chip.value if plugin is not None else None
    if chip is None:
        for res, n in accelerators.items():
            if n <= 0:
                continue
            chip = _resource_chip(res, plugin_resources)
            if chip:
                break
    return NodeStatus(
        node=str(_get(obj, "metadata", "name") or "?"),
        unschedulable=_get(obj, "spec", "unschedulable") is True,
        conditions=conditions,
        reasons=reasons,
        taints=taints,
        accelerators=accelerators,
        chip=chip,
        labels=labels,
    )


_DROP_ANNOTATIONS = ("kubectl.kubernetes.io/last-applied-configuration",)


def workload_status(spec: ResourceSpec, obj: Mapping[str, Any], *, deleted: bool = False) -> WorkloadStatus:
    """A training workload's phase (as its controller reports it), replicas and annotations."""
    meta = _map(obj.get("metadata"))
    job = JobRef(
        namespace=_str(meta.get("namespace")) or "default",
        name=_str(meta.get("name")) or "?",
        kind=spec.kind,
        api_version=spec.api_version,
    )
    status = _map(obj.get("status"))
    wspec = _map(obj.get("spec"))
    conds = [c for c in status.get("conditions") or () if isinstance(c, Mapping)]
    true_types = [str(c.get("type")) for c in conds if c.get("status") == "True" and _str(c.get("type"))]
    phase: str | None
    replicas: int | None
    if spec is VOLCANO_JOBS:
        phase = _str(_get(status, "state", "phase"))
        tasks = [t for t in wspec.get("tasks") or () if isinstance(t, Mapping)]
        replicas = sum(_int(t.get("replicas")) or 0 for t in tasks) if tasks else _int(wspec.get("minAvailable"))
    elif spec is PYTORCH_JOBS:
        if "Succeeded" in true_types:
            phase = "Succeeded"
        elif "Failed" in true_types:
            phase = "Failed"
        else:
            phase = true_types[-1] if true_types else None
        specs = wspec.get("pytorchReplicaSpecs")
        replicas = (
            sum(
                _int(r.get("replicas")) or (1 if "replicas" not in r else 0)
                for r in specs.values()
                if isinstance(r, Mapping)
            )
            if isinstance(specs, Mapping)
            else None
        )
    else:
        if "Complete" in true_types or "SuccessCriteriaMet" in true_types:
            phase = "Succeeded"
        elif "Failed" in true_types or "FailureTarget" in true_types:
            phase = "Failed"
        elif "Suspended" in true_types:
            phase = "Suspended"
        elif (_int(status.get("active")) or 0) > 0:
            phase = "Running"
        else:
            phase = "Pending"
        replicas = _int(wspec.get("parallelism")) or _int(wspec.get("completions")) or 1
    reason: str | None = None
    if spec is VOLCANO_JOBS:
        reason = _str(_get(status, "state", "reason"))
    elif phase == "Failed":
        failed = next(
            (c for c in conds if c.get("type") in ("Failed", "FailureTarget") and c.get("status") == "True"), None
        )
        reason = _str(failed.get("reason")) if failed is not None else None
    annotations = {k: v for k, v in _str_map(meta.get("annotations"), limit=64).items() if k not in _DROP_ANNOTATIONS}
    return WorkloadStatus(
        job=job,
        deleted=deleted,
        phase=phase,
        reason=reason[:128] if reason else None,
        replicas=replicas,
        annotations=annotations,
    )
