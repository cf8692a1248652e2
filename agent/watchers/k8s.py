"""Kubernetes watchers: pods, core/v1 events, nodes and training workloads, by list + watch.

Each resource (and namespace) runs one `Reflector`, the pattern of client-go's reflector and kopf's
watcher: list (paginated), then watch from the list's resourceVersion; every event updates a small
local cache and publishes on `trainmedic.k8s` only when something meaningful changed, never on a
bare resourceVersion bump (a pod's probe timestamps, a node's heartbeat). After a watch ends the
reflector resumes from the last resourceVersion it saw; on 410 Gone it relists and diffs the list
against its cache: deletions are published for objects that disappeared, changes for objects that
changed (`Telemetry.watch_relists`).

The cache holds digests, not objects: for a pod, the fields a `PodStatus` carries (about 3 KB with
its labels and its JobIndex entry, against 5-30 KB for the JSON object and several times that as
Python dicts; tests/watchers/test_k8s_digest.py measures it). Lists and
watch events are parsed as plain JSON, never turned into the client's model classes.

What the rules see: the brain renders pod statuses, core/v1 events, unhealthy nodes and failed
workloads as canonical text lines (stable formats, matched by rules/*.yaml of source pod_status /
k8s_event): `pod_status: container=...` and `pod_status: pod=...` (`pod_status_lines`),
`k8s_event: ...` (`k8s_event_line`), `node_status: node=...` (`node_status_lines`, only for a node
whose Ready is not True, with a node lifecycle taint, or deleted) and `job_status: ...`
(`workload_status_lines`, only for a Failed workload). A node that is unhealthy or deleted is
published once more per job with pods on it (`NodeHandler`), so the node's loss reaches each job.

Errors carry their retry semantics (kopf-style):

    WatchError (TrainmedicError; each below is also on a branch of trainmedic.errors' one tree)
    +-- ResourceGone            410: the resourceVersion expired -> relist and diff, at once
    |                           (TemporaryError, delay 0)
    +-- TemporaryWatchError     429, 5xx, connection refused/reset, broken stream -> back off with
    |                           jitter (Retry-After honoured: its `delay`), then resume (TemporaryError)
    +-- PermanentWatchError     (PermanentError) 400/401/403/422: credentials, RBAC, a bad selector -> logged as a
        |                       configuration error naming the resource and verb, re-checked slowly
        |                       (a 401/403 after a list that worked is first retried at the backoff
        |                       pace a few times: a restarting API server refuses until its caches fill)
        +-- MissingResource     404: the API is not served (Volcano / Kubeflow CRD not installed)
                                -> logged once, re-checked slowly, never fatal

Threads: the official client is synchronous, so nothing of it runs on the event loop. A list page
goes through `loop.run_in_executor` with `CALLS`, an executor that gives each call its own daemon
thread: a hung API server cannot pin the default executor's few workers (which the file and
Prometheus sources share), and a call stuck at shutdown does not keep the interpreter alive. A
stream (a watch, a followed log) lives for minutes, so each is read by its own daemon thread
(`LineStream`); closing the stream shuts its socket down, so cancellation is prompt.

Servers that do not version objects (kmock's emulator in the tests: no resourceVersion, a watch's
timeoutSeconds ignored) are handled without special cases: a stream idle for `stream_idle_s` is
recycled by the client-side read timeout, and without a resourceVersion the reflector watches
without one and relists on every resume, de-duplicating by content (the digests).
"""

from __future__ import annotations

import abc
import asyncio
import concurrent.futures
import contextlib
import http.client
import json
import logging
import random
import re
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any, Generic, Literal, ParamSpec, TypeVar

import urllib3.exceptions
import urllib3.util
from kubernetes import client as kclient
from kubernetes.client.exceptions import ApiException

from trainmedic.agent.bus.base import Bus
from trainmedic.agent.jobindex import JobIndex, PodInfo, pod_info
from trainmedic.agent.telemetry import Telemetry
from trainmedic.backoff import Backoff, backoff_delay
from trainmedic.errors import PermanentError, TemporaryError, TrainmedicError
from trainmedic.events import (
    JobRef,
    K8sEvent,
    NodeStatus,
    Payload,
    PodStatus,
    Topic,
    WorkloadStatus,
    make_event,
)
from trainmedic.models import Source
from trainmedic.quantity import parse_quantity
from trainmedic.remediations.kube import api_message, own_client, retry_after
from trainmedic.timefmt import parse_rfc3339_ns
from trainmedic.udal.registry import detect_chip, load_plugins, plugin_of_resource

if TYPE_CHECKING:
    from trainmedic.detectors.diagnose import LogInput

log = logging.getLogger("trainmedic.watchers.k8s")

T = TypeVar("T")

# ------------------------------------------------------------------------------------------------
# Errors with retry semantics


class WatchError(TrainmedicError):
    """A list or watch failed; the subclass says what the reflector does next."""

    kind: str = "error"


class ResourceGone(WatchError, TemporaryError):
    """410 Gone: the resourceVersion is too old. Relist and diff (at once)."""

    kind = "gone"

    def __init__(self, message: str) -> None:
        TemporaryError.__init__(self, message, delay=0.0)


class TemporaryWatchError(WatchError, TemporaryError):
    """Worth retrying after a delay (the server's Retry-After when it sent one)."""

    def __init__(self, message: str, *, retry_after: float | None = None, kind: str = "temporary") -> None:
        TemporaryError.__init__(self, message, delay=retry_after)
        self.kind = kind

    @property
    def retry_after(self) -> float | None:
        return self.delay


class PermanentWatchError(WatchError, PermanentError):
    """A configuration problem (credentials, RBAC, selector): retrying soon will not help."""

    def __init__(self, message: str, *, kind: str = "permanent") -> None:
        super().__init__(message)
        self.kind = kind


class MissingResource(PermanentWatchError):
    """The API server does not serve this resource (a CRD that is not installed)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, kind="missing")


def classify(exc: BaseException, *, resource: str, verb: str, retry_after_max: float = 300.0) -> WatchError | None:
    """The WatchError an exception raised by a list or watch stands for; None for a programming error."""
    if isinstance(exc, WatchError):
        return exc
    where = f"{verb} {resource}"
    if isinstance(exc, ApiException):
        status = int(exc.status or 0)
        message = api_message(exc, limit=300)
        if status == 410:
            return ResourceGone(f"{where}: 410 Gone ({message})")
        if status == 404:
            return MissingResource(f"{where}: the API server does not serve {resource} (404: {message})")
        if status in (401, 403):
            what = "Unauthorized" if status == 401 else "Forbidden"
            return PermanentWatchError(
                f"{where}: {status} {what}: {message}. The agent's credentials or RBAC do not allow "
                f"'{verb}' on '{resource}' (check the service account and its ClusterRole)",
                kind="forbidden" if status == 403 else "unauthorized",
            )
        if status in (400, 422):
            return PermanentWatchError(
                f"{where}: {status} Bad Request: {message} (check the label and field selectors)",
                kind="bad_request",
            )
        return TemporaryWatchError(
            f"{where}: {status or 'transport'} {message}",
            retry_after=retry_after(exc.headers, retry_after_max) if status in (429, 503) or status >= 500 else None,
            kind=f"api_{status}",
        )
    if isinstance(exc, urllib3.exceptions.HTTPError | OSError | http.client.HTTPException):
        return TemporaryWatchError(f"{where}: connection error: {exc}", kind="connection")
    if isinstance(exc, ValueError):
        return TemporaryWatchError(f"{where}: malformed response: {exc}", kind="malformed")
    return None


# ------------------------------------------------------------------------------------------------
# Small parsing helpers (objects are the API's JSON: nothing is trusted to have the right type)


def _get(obj: Any, *path: str) -> Any:
    cur = obj
    for p in path:
        if not isinstance(cur, Mapping):
            return None
        cur = cur.get(p)
    return cur


def _map(v: Any) -> Mapping[str, Any]:
    return v if isinstance(v, Mapping) else {}


def _str(v: Any) -> str | None:
    return v if isinstance(v, str) and v else None


def _int(v: Any) -> int | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, str):
        with contextlib.suppress(ValueError):
            return int(v.strip())
    return None


def _str_map(v: Any, *, limit: int = 256, value_max: int = 1024) -> dict[str, str]:
    if not isinstance(v, Mapping):
        return {}
    out: dict[str, str] = {}
    for k, val in v.items():
        if len(out) >= limit:
            break
        if isinstance(k, str) and isinstance(val, str | int | float | bool):
            out[k] = str(val)[:value_max]
    return out


def _time_s(v: Any) -> float | None:
    ns = parse_rfc3339_ns(v) if isinstance(v, str) else None
    return ns / 1e9 if ns is not None else None


# ------------------------------------------------------------------------------------------------
# Pod digests and the canonical lines the rules match


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


def _token(v: object) -> str:
    """A value as one whitespace-free token of a canonical line."""
    text = "" if v is None else str(v)
    return re.sub(r"\s+", "_", text.strip()) or "-"


def pod_status_entries(
    p: PodStatus, *, now: float | None = None, max_age_s: float | None = None
) -> list[tuple[str, str]]:
    """The canonical lines of a pod status, each with the identity of what it reports (the same
    termination rendered again by a later change of the pod has the same identity, so a consumer
    can take it once). These are the lines of `pod_status_lines`.

    With `now` and `max_age_s`, a termination that ended more than `max_age_s` before `now` (a
    failed pod of last week, listed again at start-up) gives no line, nor does the restart line.
    """
    who = p.uid or f"{p.namespace}/{p.pod}"
    out: list[tuple[str, str]] = []
    for c in p.containers:
        name = _token(c.get("name"))
        restarts = _int(c.get("restarts")) or 0
        state = c.get("state")
        if state == "terminated":
            if _stale(c.get("finished_at"), now, max_age_s):
                continue
            exit_code = _int(c.get("exit_code"))
            signal = _int(c.get("signal")) or 0
            line = (
                f"pod_status: container={name} state=terminated reason={_token(c.get('reason') or 'Unknown')} "
                f"exit_code={exit_code if exit_code is not None else -1} signal={signal} restarts={restarts}"
            )
            out.append((f"{who}/{name}/{c.get('finished_at') or restarts}", line))
        elif state == "waiting" and c.get("reason"):
            line = f"pod_status: container={name} state=waiting reason={_token(c.get('reason'))} restarts={restarts}"
            out.append((f"{who}/{name}/waiting/{_token(c.get('reason'))}/{restarts}", line))
        elif state == "running" and now is not None and restarts > 0 and "last_exit_code" in c:
            if _stale(c.get("last_finished_at"), now, max_age_s if max_age_s is not None else 0.0):
                continue
            exit_code = _int(c.get("last_exit_code"))
            line = (
                f"pod_status: container={name} state=restarted reason={_token(c.get('last_reason') or 'Unknown')} "
                f"exit_code={exit_code if exit_code is not None else -1} signal={_int(c.get('last_signal')) or 0} "
                f"restarts={restarts}"
            )
            # The same run's end as the terminated line a watcher may have seen before the restart.
            out.append((f"{who}/{name}/{c.get('last_finished_at') or restarts - 1}", line))
    if p.reason:
        line = (
            f"pod_status: pod={_token(p.pod)} phase={_token(p.phase or 'Unknown')} reason={_token(p.reason)} "
            f"terminating={'true' if p.terminating else 'false'} node={_token(p.node)}"
        )
        out.append((f"{who}/pod/{_token(p.reason)}", line))
    return out


def _stale(finished_at: object, now: float | None, max_age_s: float | None) -> bool:
    if now is None or max_age_s is None or not isinstance(finished_at, str):
        return False
    t = _time_s(finished_at)
    return t is not None and now - t > max_age_s


def pod_status_lines(p: PodStatus, *, now: float | None = None, max_age_s: float | None = None) -> list[str]:
    """The canonical lines the rule engine scans for a pod status (rules/host_oom.yaml,
    rules/process_killed.yaml, rules/k8s_workload.yaml match them). Formats (stable):

    * one line per terminated container (also a container waiting to restart after a termination,
      whose last termination is what explains it):
      `pod_status: container=<name> state=terminated reason=<R> exit_code=<n> signal=<n> restarts=<n>`
      (signal 0 when the runtime reported none, exit_code -1 when it reported no code);
    * one per waiting container with a reason:
      `pod_status: container=<name> state=waiting reason=<R> restarts=<n>`;
    * with `now` (the brain passes the event's time): one per running container that was restarted,
      its previous run's end (lastState), recent within `max_age_s`:
      `pod_status: container=<name> state=restarted reason=<R> exit_code=<n> signal=<n> restarts=<n>`;
    * one for the pod itself when it has a reason (NodeLost, Evicted, DeletionByTaintManager, ...):
      `pod_status: pod=<name> phase=<P> reason=<R> terminating=<true|false> node=<node or ->`.
    """
    return [line for _, line in pod_status_entries(p, now=now, max_age_s=max_age_s)]


# Node lifecycle taints (the node controller's), rendered in node_status lines.
NODE_LIFECYCLE_TAINTS = (
    "node.kubernetes.io/unreachable",
    "node.kubernetes.io/not-ready",
    "node.kubernetes.io/out-of-service",
    "node.kubernetes.io/network-unavailable",
)


def pod_status_input(pod: Mapping[str, Any]) -> LogInput | None:
    """A pod object's status as one attributed diagnose input (its canonical lines, its pod,
    namespace, node and rank), or None when the status says nothing the rules read."""
    from trainmedic.detectors.diagnose import LogInput

    status = pod_digest(pod).status()
    lines = pod_status_lines(status)
    if not lines:
        return None
    return LogInput(
        name=f"pod/{status.namespace}/{status.pod}",
        text="\n".join(lines).encode(),
        source=Source.POD_STATUS,
        node=status.node,
        pod=status.pod,
        namespace=status.namespace,
        rank=status.rank,
    )


def node_unhealthy(n: NodeStatus) -> bool:
    """Ready is not True, a node lifecycle taint is on it, or it is gone."""
    ready = n.conditions.get("Ready")
    return (
        n.deleted
        or (ready is not None and ready != "True")
        or any(t.split("=", 1)[0].split(":", 1)[0] in NODE_LIFECYCLE_TAINTS for t in n.taints)
    )


def node_status_lines(n: NodeStatus) -> list[str]:
    """The canonical line of a node that is unhealthy or gone (none for a healthy one):
    `node_status: node=<name> ready=<True|False|Unknown|-> reason=<Ready's reason or -> deleted=<true|false>
    taints=<key:Effect,...|->` (only the node lifecycle taints, in the node's order: what trainmedic's
    own quarantine changes, a cordon and its taint, does not change the line)."""
    if not node_unhealthy(n):
        return []
    taints = [t for t in n.taints if t.split("=", 1)[0].split(":", 1)[0] in NODE_LIFECYCLE_TAINTS]
    return [
        f"node_status: node={_token(n.node)} ready={_token(n.conditions.get('Ready'))} "
        f"reason={_token(n.reasons.get('Ready'))} deleted={'true' if n.deleted else 'false'} "
        f"taints={_token(','.join(taints))}"
    ]


def workload_status_lines(w: WorkloadStatus) -> list[str]:
    """The canonical line of a training workload that failed (none otherwise):
    `job_status: kind=<Kind> job=<namespace>/<name> phase=Failed reason=<R or ->`."""
    if w.deleted or w.phase != "Failed":
        return []
    return [
        f"job_status: kind={_token(w.job.kind)} job={_token(w.job.namespace)}/{_token(w.job.name)} "
        f"phase={_token(w.phase)} reason={_token(w.reason)}"
    ]


MAX_EVENT_MESSAGE = 4096


def k8s_event_line(e: K8sEvent) -> str:
    """The canonical line of a core/v1 Event:
    `k8s_event: type=<T> reason=<R> object=<Kind>/<name> message=<text>` (newlines flattened)."""
    message = re.sub(r"\s*[\r\n]+\s*", " ", e.message or "").strip()[:MAX_EVENT_MESSAGE]
    return (
        f"k8s_event: type={_token(e.type or 'Normal')} reason={_token(e.reason or 'Unknown')} "
        f"object={_token(e.object_kind or '?')}/{_token(e.object_name or '?')} message={message}"
    )


# ------------------------------------------------------------------------------------------------
# Events, nodes and workloads as payloads


def k8s_event(obj: Mapping[str, Any], jobs: JobIndex | None = None) -> K8sEvent:
    """A core/v1 Event (or events.k8s.io/v1 Event) as a K8sEvent; the job from the index for a pod."""
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
        uid = _str(inv.get("uid"))
        info = (jobs.pod_by_uid(uid) if uid else None) or (
            jobs.pod(_str(inv.get("namespace")) or namespace or "default", name) if name else None
        )
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


@dataclass(frozen=True)
class ResourceSpec:
    """One watched API resource and the client methods that list/watch it."""

    name: str
    kind: str
    group: str
    version: str
    plural: str
    namespaced: bool = True
    # Served by a CRD (CustomObjectsApi); 404 means "not installed here", tolerated.
    custom: bool = False
    # CoreV1Api / BatchV1Api method names for the built-in resources.
    list_all: str = ""
    list_namespaced: str = ""

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version


PODS = ResourceSpec(
    "pods", "Pod", "", "v1", "pods", list_all="list_pod_for_all_namespaces", list_namespaced="list_namespaced_pod"
)
EVENTS = ResourceSpec(
    "events",
    "Event",
    "",
    "v1",
    "events",
    list_all="list_event_for_all_namespaces",
    list_namespaced="list_namespaced_event",
)
NODES = ResourceSpec("nodes", "Node", "", "v1", "nodes", namespaced=False, list_all="list_node")
JOBS = ResourceSpec(
    "jobs", "Job", "batch", "v1", "jobs", list_all="list_job_for_all_namespaces", list_namespaced="list_namespaced_job"
)
VOLCANO_JOBS = ResourceSpec("volcanojobs", "Job", "batch.volcano.sh", "v1alpha1", "jobs", custom=True)
PYTORCH_JOBS = ResourceSpec("pytorchjobs", "PyTorchJob", "kubeflow.org", "v1", "pytorchjobs", custom=True)

RESOURCES: dict[str, ResourceSpec] = {s.name: s for s in (PODS, EVENTS, NODES, JOBS, VOLCANO_JOBS, PYTORCH_JOBS)}
_ALIASES = {
    "vcjobs": "volcanojobs",
    "volcano": "volcanojobs",
    "pytorchjob": "pytorchjobs",
    "event": "events",
    "pod": "pods",
    "node": "nodes",
    "job": "jobs",
}
WORKLOAD_RESOURCES = ("jobs", "volcanojobs", "pytorchjobs")


def resource_spec(name: str) -> ResourceSpec:
    key = _ALIASES.get(name.strip().lower(), name.strip().lower())
    if key not in RESOURCES:
        raise ValueError(f"unknown resource {name!r} (known: {', '.join(RESOURCES)})")
    return RESOURCES[key]


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


# ------------------------------------------------------------------------------------------------
# Label selectors, applied client-side as well (a server that ignores them must not flood the cache)

_SET_EXPR = re.compile(r"^\s*([\w./-]+)\s+(in|notin)\s+\(([^)]*)\)\s*$")


@dataclass(frozen=True, slots=True)
class _Requirement:
    key: str
    op: Literal["in", "notin", "exists", "absent"]
    values: frozenset[str] = frozenset()

    def __call__(self, labels: Mapping[str, str]) -> bool:
        if self.op == "exists":
            return self.key in labels
        if self.op == "absent":
            return self.key not in labels
        present = labels.get(self.key) in self.values
        return present if self.op == "in" else not present


@dataclass(frozen=True, slots=True)
class LabelSelector:
    """A Kubernetes label selector: k=v, k==v, k!=v, k, !k, k in (a,b), k notin (a,b)."""

    requirements: tuple[_Requirement, ...] = ()

    @classmethod
    def parse(cls, selector: str | None) -> LabelSelector:
        reqs: list[_Requirement] = []
        for raw in re.split(r",(?![^()]*\))", selector or ""):
            part = raw.strip()
            if not part:
                continue
            m = _SET_EXPR.match(part)
            if m is not None:
                values = frozenset(v.strip() for v in m.group(3).split(",") if v.strip())
                reqs.append(_Requirement(m.group(1), "in" if m.group(2) == "in" else "notin", values))
            elif "!=" in part:
                key, value = (x.strip() for x in part.split("!=", 1))
                reqs.append(_Requirement(key, "notin", frozenset({value})))
            elif "=" in part:
                key, value = (x.strip() for x in part.replace("==", "=").split("=", 1))
                reqs.append(_Requirement(key, "in", frozenset({value})))
            elif part.startswith("!"):
                reqs.append(_Requirement(part[1:].strip(), "absent"))
            else:
                reqs.append(_Requirement(part, "exists"))
        return cls(tuple(reqs))

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(r(labels) for r in self.requirements)


# ------------------------------------------------------------------------------------------------
# Blocking calls and streams in daemon threads

P = ParamSpec("P")


class DaemonThreadExecutor(concurrent.futures.Executor):
    """Runs each call in a new daemon thread (calls are rare: one per list page)."""

    def __init__(self, name: str = "trainmedic-k8s-call") -> None:
        self._name = name

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> concurrent.futures.Future[T]:
        future: concurrent.futures.Future[T] = concurrent.futures.Future()

        def run() -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                result = fn(*args, **kwargs)
            except BaseException as e:  # noqa: BLE001 - handed to the awaiting coroutine
                future.set_exception(e)
            else:
                future.set_result(result)

        threading.Thread(target=run, name=self._name, daemon=True).start()
        return future


CALLS = DaemonThreadExecutor()


def shutdown_response(resp: Any) -> None:
    """Unblock a thread reading this urllib3 response: shut its socket down (close follows in the reader)."""
    sock = getattr(getattr(resp, "connection", None), "sock", None)
    if sock is None:
        return
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


@dataclass
class _End:
    reason: Literal["eof", "timeout", "closed"]


class LineStream(Generic[T]):
    """A streaming HTTP response (a watch, a followed log) read line by line in a daemon thread.

    `open_` performs the request (in the thread) and returns the urllib3 response. Lines are parsed
    in the thread by `parse` (None skips a line) and handed to the event loop in batches, at most
    `max_pending` batches ahead of the consumer (back-pressure). A line longer than `max_line` is
    truncated (`truncate=True`, logs) or set aside through `bad_line` (watch events). `close()` (also
    on leaving `async with`) shuts the socket down, so the thread ends at once.
    """

    def __init__(
        self,
        open_: Callable[[], Any],
        parse: Callable[[bytes], T | None],
        *,
        name: str,
        max_line: int = 1 << 20,
        truncate: bool = False,
        bad_line: Callable[[bytes, Exception], None] | None = None,
        max_pending: int = 16,
    ) -> None:
        self._open = open_
        self._parse = parse
        self.name = name
        self._max_line = max_line
        self._truncate = truncate
        self._bad_line = bad_line
        self._slots = threading.Semaphore(max_pending)
        self._queue: asyncio.Queue[list[T] | BaseException | _End] = asyncio.Queue()
        self._lock = threading.Lock()
        self._resp: Any = None
        self._stopped = False
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.ended: str | None = None

    async def __aenter__(self) -> LineStream[T]:
        self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._run, name=f"trainmedic-stream:{self.name}", daemon=True)
        self._thread.start()

    def close(self) -> None:
        with self._lock:
            self._stopped = True
            if self._resp is not None:
                shutdown_response(self._resp)

    @property
    def thread(self) -> threading.Thread | None:
        return self._thread

    async def next_batch(self, timeout: float | None = None) -> list[T] | None:
        """The next batch of parsed lines; None when `timeout` passed first. Raises StopAsyncIteration
        at the end of the stream and the thread's error (the request's ApiException, a broken
        connection) when it failed."""
        if self.ended is not None:
            raise StopAsyncIteration
        try:
            # asyncio.timeout, not wait_for (which can swallow a cancellation on 3.11, see podlogs).
            async with asyncio.timeout(timeout):
                item = await self._queue.get()
        except TimeoutError:
            return None
        self._slots.release()
        if isinstance(item, _End):
            self.ended = item.reason
            raise StopAsyncIteration
        if isinstance(item, BaseException):
            self.ended = "error"
            raise item
        return item

    def __aiter__(self) -> LineStream[T]:
        return self

    async def __anext__(self) -> list[T]:
        while True:
            batch = await self.next_batch()
            if batch:
                return batch

    # -- the thread --------------------------------------------------------------------------------

    def _post(self, item: list[T] | BaseException | _End) -> bool:
        while not self._slots.acquire(timeout=0.25):
            if self._stopped:
                return False
        loop = self._loop
        if loop is None:
            return False
        try:
            loop.call_soon_threadsafe(self._queue.put_nowait, item)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            self._stopped = True
            return False
        return True

    def _emit(self, raw: bytes, out: list[T]) -> None:
        if len(raw) > self._max_line:
            if not self._truncate:
                if self._bad_line is not None:
                    self._bad_line(raw[:200], ValueError(f"line longer than {self._max_line} bytes"))
                return
            raw = raw[: self._max_line] + b" [truncated]"
        try:
            parsed = self._parse(raw)
        except Exception as e:  # noqa: BLE001 - one bad line is set aside, the stream goes on
            if self._bad_line is not None:
                self._bad_line(raw, e)
            return
        if parsed is not None:
            out.append(parsed)

    def _run(self) -> None:
        try:
            resp = self._open()
        except BaseException as e:  # noqa: BLE001 - handed over to the consumer, which classifies it
            self._post(e)
            return
        with self._lock:
            self._resp = resp
            stopped = self._stopped
        end: _End | BaseException = _End("closed")
        try:
            if not stopped:
                end = self._read(resp)
        finally:
            with self._lock:
                self._resp = None
            with contextlib.suppress(Exception):
                resp.close()
                resp.release_conn()
        if not self._stopped:
            self._post(end)

    def _read(self, resp: Any) -> _End | BaseException:
        buf = bytearray()
        skipping = False
        try:
            for chunk in resp.stream(amt=None, decode_content=True):
                if self._stopped:
                    return _End("closed")
                out: list[T] = []
                start = 0
                data = bytes(chunk)
                while True:
                    nl = data.find(b"\n", start)
                    if nl < 0:
                        break
                    if skipping:
                        skipping = False
                        buf.clear()
                    else:
                        buf += data[start:nl]
                        self._emit(bytes(buf), out)
                        buf.clear()
                    start = nl + 1
                if not skipping:
                    buf += data[start:]
                    if len(buf) > self._max_line:
                        # No newline in sight: cut (or set aside) now, skip the rest up to the newline.
                        self._emit(bytes(buf), out)
                        buf.clear()
                        skipping = True
                if out and not self._post(out):
                    return _End("closed")
        except urllib3.exceptions.ReadTimeoutError:
            return _End("timeout")
        except Exception as e:  # noqa: BLE001 - handed over to the consumer
            return _End("closed") if self._stopped else e
        if buf and not skipping:
            tail: list[T] = []
            self._emit(bytes(buf), tail)
            if tail:
                self._post(tail)
        return _End("eof")


# ------------------------------------------------------------------------------------------------
# The reflector


@dataclass(frozen=True)
class WatchSettings:
    """Timing and size knobs of the reflectors. The defaults suit a real cluster; tests shorten them."""

    # timeoutSeconds of a watch; each watch draws a value in [1x, 2x) (as client-go does) so many
    # reflectors do not reconnect in lockstep.
    watch_timeout_s: float = 300.0
    # A stream that delivers nothing for this long is closed and re-opened (a server that ignores
    # timeoutSeconds, a half-dead connection). Bookmarks keep a healthy quiet watch alive.
    stream_idle_s: float = 330.0
    connect_timeout_s: float = 10.0
    # The read timeout of one list page.
    request_timeout_s: float = 60.0
    page_size: int = 500
    # Backoff after temporary errors: base * 2^attempt, capped, times a random factor in 1 +/- jitter.
    backoff_base_s: float = 0.5
    backoff_max_s: float = 30.0
    backoff_jitter: float = 0.2
    retry_after_max_s: float = 300.0
    # How often a missing resource (CRD not installed) or a forbidden one (RBAC) is re-checked.
    missing_recheck_s: float = 300.0
    forbidden_recheck_s: float = 300.0
    # A watch that listed fine before and is then refused (401/403) is retried at the backoff pace
    # this many times before it counts as a configuration error: an API server that is starting
    # (or restarting) refuses requests until its authenticator and authorizer caches are filled.
    refused_retries: int = 5
    # Events older than this when first seen (the list at start-up replays up to an hour) are recorded
    # for de-duplication but not published.
    event_max_age_s: float = 600.0
    # Event uids remembered for de-duplication (uid + count).
    event_dedup_size: int = 50_000
    # A watch event line longer than this is set aside.
    max_event_bytes: int = 32 << 20


class Handler(abc.ABC):
    """What a reflector feeds: a cache keyed by "namespace/name" (or "name") that publishes changes."""

    @abc.abstractmethod
    def key(self, obj: Mapping[str, Any]) -> str | None: ...

    @abc.abstractmethod
    def keys(self, namespace: str | None) -> list[str]:
        """Cached keys (of one namespace, or all): the relist diff removes those not listed again."""

    def has(self, key: str) -> bool:
        return key in self.keys(None)

    @abc.abstractmethod
    async def apply(self, obj: Mapping[str, Any]) -> None:
        """An object as listed, added or modified."""

    @abc.abstractmethod
    async def remove(self, key: str, obj: Mapping[str, Any] | None) -> None:
        """An object deleted (its last state when the watch said so; None when a relist found it gone)."""


def object_key(obj: Mapping[str, Any]) -> str | None:
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping) or not _str(meta.get("name")):
        return None
    ns = _str(meta.get("namespace"))
    return f"{ns}/{meta['name']}" if ns else str(meta["name"])


def _rv_of(obj: Any) -> str | None:
    return _str(_get(obj, "metadata", "resourceVersion"))


# The watchers' client: the same retry policy as KubeOps (HTTP statuses are left to the reflectors).
watch_client = own_client


def list_function(api: Any, spec: ResourceSpec, namespace: str | None) -> Callable[..., Any]:
    """The client method that lists (and, with watch=True, watches) a resource."""
    if spec.custom:
        co = kclient.CustomObjectsApi(api)
        if namespace is not None:
            return partial(co.list_namespaced_custom_object, spec.group, spec.version, namespace, spec.plural)
        return partial(co.list_cluster_custom_object, spec.group, spec.version, spec.plural)
    typed = kclient.CoreV1Api(api) if spec.group == "" else kclient.BatchV1Api(api)
    if namespace is not None and spec.namespaced:
        return partial(getattr(typed, spec.list_namespaced), namespace)
    return getattr(typed, spec.list_all)  # type: ignore[no-any-return]


State = Literal["starting", "listing", "watching", "backoff", "missing", "forbidden"]


class Reflector:
    """List + watch of one resource (in one namespace, or all) into a Handler; runs until cancelled."""

    def __init__(
        self,
        spec: ResourceSpec,
        handler: Handler,
        *,
        api: Any,
        telemetry: Telemetry,
        settings: WatchSettings | None = None,
        namespace: str | None = None,
        label_selector: str | None = None,
        node_name: str | None = None,
        on_synced: Callable[[Reflector], None] | None = None,
        source: str = "k8s",
    ) -> None:
        self.spec = spec
        self.handler = handler
        self.telemetry = telemetry
        self.settings = settings or WatchSettings()
        self.namespace = namespace if spec.namespaced else None
        self.label_selector = label_selector or None
        self.node_name = node_name or None
        self.field_selector = f"spec.nodeName={node_name}" if node_name else None
        self.name = spec.name if self.namespace is None else f"{spec.name}[{self.namespace}]"
        self.source = f"{source}/{spec.name}"
        self.state: State = "starting"
        self.synced = False
        self.relists = 0
        self._on_synced = on_synced
        self._list_fn = list_function(api, spec, self.namespace)
        self._labels = LabelSelector.parse(self.label_selector)
        self._rv: str | None = None
        self._missing_logged = False
        self._listed = False  # a list has succeeded: the credentials and RBAC were fine then
        self._refused = 0  # refusals (401/403) since the last successful list
        self._transient = False  # the last error was a refusal retried as transient
        self.stream: LineStream[dict[str, Any]] | None = None

    # -- helpers -----------------------------------------------------------------------------------

    def _count(self, kind: str) -> None:
        self.telemetry.watch_errors.labels(source=self.source, kind=kind).inc()

    def _mark_synced(self) -> None:
        if not self.synced:
            self.synced = True
            if self._on_synced is not None:
                self._on_synced(self)

    def _selected(self, obj: Mapping[str, Any]) -> bool:
        if self.node_name is not None and _get(obj, "spec", "nodeName") != self.node_name:
            return False
        if self.label_selector is not None:
            return self._labels.matches(_str_map(_get(obj, "metadata", "labels")))
        return True

    def _query(self) -> dict[str, Any]:
        q: dict[str, Any] = {}
        if self.label_selector:
            q["label_selector"] = self.label_selector
        if self.field_selector:
            q["field_selector"] = self.field_selector
        return q

    def backoff(self, attempt: int) -> float:
        s = self.settings
        jitter = (1 - s.backoff_jitter, 1 + s.backoff_jitter)
        return backoff_delay(min(attempt, 30), base=s.backoff_base_s, cap=s.backoff_max_s, jitter=jitter)

    # -- the loop ----------------------------------------------------------------------------------

    async def run(self) -> None:
        attempt = 0
        need_list = True
        loop = asyncio.get_running_loop()
        while True:
            verb = "list" if need_list else "watch"
            try:
                if need_list:
                    self.state = "listing"
                    await self._list()
                    need_list = False
                    attempt = 0
                    self._listed, self._refused = True, 0
                    self._mark_synced()
                verb = "watch"
                self.state = "watching"
                started = loop.time()
                got = await self._watch()
                self._refused = 0  # the watch was accepted
                if self._rv is None:
                    # The server does not version objects: a bare re-watch could miss deletions.
                    need_list = True
                if not got and loop.time() - started < 1.0:
                    # A stream that ends at once with nothing in it: do not spin.
                    self.state = "backoff"
                    await asyncio.sleep(self.backoff(attempt))
                    attempt += 1
                else:
                    attempt = 0
            except Exception as exc:
                err = classify(exc, resource=self._what(), verb=verb, retry_after_max=self.settings.retry_after_max_s)
                if err is None:
                    raise
                need_list = need_list or self._rv is None
                attempt = await self._handle_error(err, attempt)
                # A refusal retried as transient keeps the resourceVersion: the watch resumes from it
                # (a restarted API server is not made to list everything again for nothing).
                if isinstance(err, ResourceGone) or (isinstance(err, PermanentWatchError) and not self._transient):
                    need_list = True

    def _what(self) -> str:
        res = self.spec.plural if not self.spec.group else f"{self.spec.plural}.{self.spec.group}"
        return res if self.namespace is None else f"{res} in namespace {self.namespace}"

    async def _handle_error(self, err: WatchError, attempt: int) -> int:
        s = self.settings
        self._transient = False
        if isinstance(err, ResourceGone):
            self.relists += 1
            self.telemetry.watch_relists.labels(resource=self.spec.name).inc()
            self._rv = None
            log.info("%s: %s; relisting", self.name, err)
            return attempt
        if isinstance(err, MissingResource):
            self._count("missing")
            self.state = "missing"
            if not self._missing_logged:
                self._missing_logged = True
                log.warning("%s; not watched, re-checked every %g s", err, s.missing_recheck_s)
            else:
                log.debug("%s: still not served", self.name)
            self._mark_synced()
            await asyncio.sleep(s.missing_recheck_s)
            return 0
        if isinstance(err, PermanentWatchError):
            self._count(err.kind)
            self.state = "forbidden"
            if self._listed and err.kind in ("unauthorized", "forbidden") and self._refused < s.refused_retries:
                # It worked before: most likely an API server still filling its caches after a
                # restart, which refuses everyone for a few seconds. Retry soon before giving up.
                self._refused += 1
                self._transient = True
                delay = self.backoff(self._refused - 1)
                log.warning("%s: %s; it was allowed before, retrying in %.1f s", self.name, err, delay)
                await asyncio.sleep(delay)
                return attempt
            log.error("configuration error: %s; retrying in %g s", err, s.forbidden_recheck_s)
            self._mark_synced()
            await asyncio.sleep(s.forbidden_recheck_s)
            return 0
        assert isinstance(err, TemporaryWatchError)
        self._count(err.kind)
        self.state = "backoff"
        delay = err.retry_after if err.retry_after is not None else self.backoff(attempt)
        log.warning("%s: %s; retrying in %.1f s", self.name, err, delay)
        await asyncio.sleep(delay)
        return attempt + 1

    async def _list(self) -> None:
        seen: set[str] = set()
        cont: str | None = None
        list_rv: str | None = None
        versioned = True
        while True:
            items, page_rv, cont = await asyncio.get_running_loop().run_in_executor(CALLS, self._list_page, cont)
            if list_rv is None:
                list_rv = page_rv
            for obj in items:
                if not isinstance(obj, Mapping):
                    self._count("bad_object")
                    continue
                versioned = versioned and _rv_of(obj) is not None
                key = self.handler.key(obj)
                if key is None or not self._selected(obj):
                    continue
                seen.add(key)
                await self._apply(obj)
            if not cont:
                break
        if self._missing_logged:
            log.info("%s is served now; watching it", self._what())
            self._missing_logged = False
        gone = [k for k in self.handler.keys(self.namespace) if k not in seen]
        for key in gone:
            await self._remove(key, None)
        # Objects without a resourceVersion: the server does not version them (watch without one).
        self._rv = list_rv if versioned else None

    def _list_page(self, cont: str | None) -> tuple[list[Any], str | None, str | None]:
        s = self.settings
        kw: dict[str, Any] = dict(self._query(), limit=s.page_size)
        if cont:
            kw["_continue"] = cont
        resp = self._list_fn(_preload_content=False, _request_timeout=(s.connect_timeout_s, s.request_timeout_s), **kw)
        try:
            data = resp.data
        finally:
            with contextlib.suppress(Exception):
                resp.release_conn()
        doc = json.loads(data)
        if not isinstance(doc, dict):
            raise ValueError("the list response is not a JSON object")
        items = doc.get("items") or []
        if not isinstance(items, list):
            raise ValueError("the list response has no items array")
        meta = _map(doc.get("metadata"))
        return items, _str(meta.get("resourceVersion")), _str(meta.get("continue"))

    def _open_watch(self) -> Any:
        s = self.settings
        kw: dict[str, Any] = dict(
            self._query(),
            watch=True,
            allow_watch_bookmarks=True,
            timeout_seconds=int(s.watch_timeout_s * random.uniform(1.0, 2.0)),  # noqa: S311 (spread)
        )
        if self._rv is not None:
            kw["resource_version"] = self._rv
        return self._list_fn(_preload_content=False, _request_timeout=(s.connect_timeout_s, s.stream_idle_s), **kw)

    def _bad_line(self, raw: bytes, exc: Exception) -> None:
        self._count("malformed")
        log.warning("%s: watch event set aside (%s): %r", self.name, exc, raw[:200])

    async def _watch(self) -> bool:
        got = False
        stream: LineStream[dict[str, Any]] = LineStream(
            self._open_watch,
            _parse_watch_line,
            name=self.name,
            max_line=self.settings.max_event_bytes,
            bad_line=self._bad_line,
        )
        self.stream = stream
        try:
            async with stream:
                async for batch in stream:
                    for ev in batch:
                        got = True
                        await self._on_event(ev)
        finally:
            self.stream = None
        if stream.ended == "timeout":
            log.debug("%s: stream idle for %.0f s; re-watching", self.name, self.settings.stream_idle_s)
        return got

    async def _on_event(self, ev: dict[str, Any]) -> None:
        typ = ev.get("type")
        obj = ev.get("object")
        if typ == "ERROR":
            code = _int(_get(obj, "code")) or 500
            message = _str(_get(obj, "message")) or _str(_get(obj, "reason")) or "watch error"
            err = ApiException(status=code, reason=message)
            raise err
        if not isinstance(obj, Mapping):
            self._count("malformed")
            log.warning("%s: watch event without an object set aside: %r", self.name, str(ev)[:200])
            return
        if typ == "BOOKMARK":
            self._rv = _rv_of(obj) or self._rv
            return
        key = self.handler.key(obj)
        if key is None:
            self._count("bad_object")
            return
        if typ in ("ADDED", "MODIFIED"):
            if self._selected(obj):
                await self._apply(obj)
            elif self.handler.has(key):
                # It no longer matches the selectors: for this watch it is gone.
                await self._remove(key, obj)
        elif typ == "DELETED":
            await self._remove(key, obj)
        else:
            log.debug("%s: unknown watch event type %r", self.name, typ)
            return
        self._rv = _rv_of(obj)

    async def _apply(self, obj: Mapping[str, Any]) -> None:
        try:
            await self.handler.apply(obj)
        except (ValueError, TypeError, KeyError, AttributeError) as e:
            self._count("bad_object")
            log.warning("%s: object %s set aside: %s", self.name, object_key(obj), e)

    async def _remove(self, key: str, obj: Mapping[str, Any] | None) -> None:
        try:
            await self.handler.remove(key, obj)
        except (ValueError, TypeError, KeyError, AttributeError) as e:
            self._count("bad_object")
            log.warning("%s: deletion of %s set aside: %s", self.name, key, e)


def _parse_watch_line(raw: bytes) -> dict[str, Any] | None:
    if not raw.strip():
        return None
    ev = json.loads(raw)
    if not isinstance(ev, dict) or not isinstance(ev.get("type"), str):
        raise ValueError("not a watch event (an object with a type)")
    return ev


# ------------------------------------------------------------------------------------------------
# Handlers


class Publisher:
    """Publishes payloads on trainmedic.k8s (keyed by job, else node, else pod) and counts them."""

    def __init__(self, bus: Bus, telemetry: Telemetry, producer: str, topic: Topic = Topic.K8S) -> None:
        self.bus = bus
        self.telemetry = telemetry
        self.producer = producer
        self.topic = topic

    async def publish(self, payload: Payload) -> None:
        await self.bus.publish(self.topic, make_event(payload, producer=self.producer))
        self.telemetry.events_out.labels(topic=self.topic.value).inc()


PodListener = Callable[[PodStatus], None]


class PodHandler(Handler):
    """Pods -> JobIndex + PodStatus on meaningful changes."""

    def __init__(
        self, publisher: Publisher, jobs: JobIndex, *, only_job_pods: bool = False, publish: bool = True
    ) -> None:
        self.publisher = publisher
        self.jobs = jobs
        self.only_job_pods = only_job_pods
        # The node role only keeps its JobIndex warm; the cluster role publishes pod statuses.
        self.publish = publish
        self.cache: dict[str, PodDigest] = {}
        self.listeners: list[PodListener] = []

    def key(self, obj: Mapping[str, Any]) -> str | None:
        key = object_key(obj)
        if key is not None and "/" not in key:
            key = f"default/{key}"
        return key

    def keys(self, namespace: str | None) -> list[str]:
        if namespace is None:
            return list(self.cache)
        prefix = f"{namespace}/"
        return [k for k in self.cache if k.startswith(prefix)]

    def has(self, key: str) -> bool:
        return key in self.cache

    async def _emit(self, status: PodStatus) -> None:
        if (self.only_job_pods and status.job is None) or not self.publish:
            return
        await self.publisher.publish(status)
        for listener in self.listeners:
            listener(status)

    async def apply(self, obj: Mapping[str, Any]) -> None:
        key = self.key(obj)
        if key is None:
            return
        info = self.jobs.update_pod(obj)
        digest = pod_digest(obj, info)
        old = self.cache.get(key)
        if old is not None and old.meaningful() == digest.meaningful():
            self.cache[key] = digest
            return
        await self._emit(digest.status())
        self.cache[key] = digest

    async def remove(self, key: str, obj: Mapping[str, Any] | None) -> None:
        old = self.cache.get(key)
        digest = pod_digest(obj) if obj is not None else old
        ns, _, name = key.partition("/")
        current = self.jobs.pod(ns, name)
        if obj is None or current is None or current.uid == _str(_get(obj, "metadata", "uid")):
            self.jobs.remove_pod(ns, name)
        if digest is not None:
            await self._emit(digest.status(deleted=True))
        self.cache.pop(key, None)


class EventHandler(Handler):
    """core/v1 Events -> K8sEvent, de-duplicated by uid + count; old events recorded, not published,
    and so are events from before the agent started about pods that are gone."""

    def __init__(self, publisher: Publisher, jobs: JobIndex, settings: WatchSettings) -> None:
        self.publisher = publisher
        self.jobs = jobs
        self.settings = settings
        self.seen: OrderedDict[str, int] = OrderedDict()
        self.started = time.time()

    def key(self, obj: Mapping[str, Any]) -> str | None:
        return _str(_get(obj, "metadata", "uid")) or object_key(obj)

    def _history(self, obj: Mapping[str, Any], when: float | None) -> bool:
        """An event from before this agent started about a pod the index does not hold: the pod is
        gone, and so is what the event said (a NodeNotReady the node lifecycle controller recorded on
        a pod since deleted, replayed by the first list after a restart). Recorded, not published."""
        # Event times have whole seconds (lastTimestamp): one second of slack.
        if when is None or when >= self.started - 1.0:
            return False
        inv = _map(obj.get("involvedObject")) or _map(obj.get("regarding"))
        if _str(inv.get("kind")) != "Pod":
            return False
        uid, name = _str(inv.get("uid")), _str(inv.get("name"))
        namespace = _str(inv.get("namespace")) or _str(_get(obj, "metadata", "namespace")) or "default"
        known = (self.jobs.pod_by_uid(uid) if uid else None) or (self.jobs.pod(namespace, name) if name else None)
        return known is None

    def keys(self, namespace: str | None) -> list[str]:
        return []  # events that disappear expired (TTL): nothing to publish

    def has(self, key: str) -> bool:
        return False

    async def apply(self, obj: Mapping[str, Any]) -> None:
        key = self.key(obj)
        if key is None:
            return
        count = _int(obj.get("count")) or _int(_get(obj, "series", "count")) or 1
        if self.seen.get(key, 0) >= count:
            return
        when = event_time(obj)
        fresh = when is None or time.time() - when <= self.settings.event_max_age_s
        if fresh and not self._history(obj, when):
            await self.publisher.publish(k8s_event(obj, self.jobs))
        self.seen[key] = count
        self.seen.move_to_end(key)
        while len(self.seen) > self.settings.event_dedup_size:
            self.seen.popitem(last=False)

    async def remove(self, key: str, obj: Mapping[str, Any] | None) -> None:
        return None


class NodeHandler(Handler):
    """Nodes -> NodeStatus when conditions, taints, schedulability, accelerators or labels change.

    A node that is unhealthy (Ready not True, a node lifecycle taint) or deleted is also published
    once per job with pods on it (`JobIndex.jobs_on_node`): copies of the one event (same id), each
    with its `job` and keyed by it, as kernel lines are, so the brain that owns each job sees it.
    """

    def __init__(self, publisher: Publisher, jobs: JobIndex | None = None) -> None:
        self.publisher = publisher
        self.jobs = jobs
        self.cache: dict[str, NodeStatus] = {}
        self._resources = _plugin_resources()

    async def _publish(self, status: NodeStatus) -> None:
        event = make_event(status, producer=self.publisher.producer)
        await self.publisher.bus.publish(self.publisher.topic, event)
        self.publisher.telemetry.events_out.labels(topic=self.publisher.topic.value).inc()
        if self.jobs is None or not node_unhealthy(status):
            return
        for job in self.jobs.jobs_on_node(status.node):
            copy = event.model_copy(update={"key": job.key, "payload": status.model_copy(update={"job": job})})
            await self.publisher.bus.publish(self.publisher.topic, copy)
            self.publisher.telemetry.events_out.labels(topic=self.publisher.topic.value).inc()

    def key(self, obj: Mapping[str, Any]) -> str | None:
        return _str(_get(obj, "metadata", "name"))

    def keys(self, namespace: str | None) -> list[str]:
        return list(self.cache)

    def has(self, key: str) -> bool:
        return key in self.cache

    async def apply(self, obj: Mapping[str, Any]) -> None:
        status = node_status(obj, plugin_resources=self._resources)
        if self.cache.get(status.node) == status:
            return
        await self._publish(status)
        self.cache[status.node] = status

    async def remove(self, key: str, obj: Mapping[str, Any] | None) -> None:
        old = self.cache.get(key)
        status = node_status(obj, plugin_resources=self._resources) if obj is not None else old
        if status is not None:
            await self._publish(status.model_copy(update={"deleted": True}))
        self.cache.pop(key, None)


class WorkloadHandler(Handler):
    """Jobs / Volcano Jobs / PyTorchJobs -> WorkloadStatus on change."""

    def __init__(self, publisher: Publisher, spec: ResourceSpec) -> None:
        self.publisher = publisher
        self.spec = spec
        self.cache: dict[str, WorkloadStatus] = {}

    def key(self, obj: Mapping[str, Any]) -> str | None:
        return object_key(obj)

    def keys(self, namespace: str | None) -> list[str]:
        if namespace is None:
            return list(self.cache)
        return [k for k in self.cache if k.startswith(f"{namespace}/")]

    def has(self, key: str) -> bool:
        return key in self.cache

    async def apply(self, obj: Mapping[str, Any]) -> None:
        key = self.key(obj)
        if key is None:
            return
        status = workload_status(self.spec, obj)
        if self.cache.get(key) == status:
            return
        await self.publisher.publish(status)
        self.cache[key] = status

    async def remove(self, key: str, obj: Mapping[str, Any] | None) -> None:
        old = self.cache.get(key)
        status = workload_status(self.spec, obj, deleted=True) if obj is not None else old
        if status is not None:
            await self.publisher.publish(status.model_copy(update={"deleted": True}))
        self.cache.pop(key, None)


# ------------------------------------------------------------------------------------------------
# The set of watchers of one agent


async def guarded(name: str, run: Callable[[], Any], telemetry: Telemetry, source: str) -> None:
    """Run a long-lived coroutine until cancelled; log, count and restart it (with backoff) if it fails."""
    backoff = Backoff(1.0, 60.0)
    while True:
        try:
            await run()
            log.warning("%s returned; restarting", name)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("%s failed; restarting in %.0f s", name, backoff.current)
            telemetry.watch_errors.labels(source=source, kind="crash").inc()
        await asyncio.sleep(backoff.next())


@dataclass
class _Sync:
    pending: set[str] = field(default_factory=set)
    pods_pending: set[str] = field(default_factory=set)


class KubeWatchers:
    """The list+watch loops of one agent over one Bus, JobIndex and Telemetry.

    `run()` runs until cancelled. `ready` is set once every loop has finished its first list (or
    found its resource missing or forbidden), i.e. once the JobIndex is warm.

    Options: `namespaces` (empty: all), `label_selector` (pods only), `node_name` (the node role:
    only the pods bound to this node, a field selector), `resources` (names among pods, events,
    nodes, jobs, volcanojobs, pytorchjobs; None: pods, events, nodes, plus the workloads when
    `workloads`), `only_job_pods` (publish PodStatus only for pods of a job; the index has them all), `publish_pods`
    (False: only feed the JobIndex, as the node role does; the cluster role publishes pod statuses).

    The events loops start once the pods are listed (or after `events_wait_s`): an event about a
    pod is keyed by the pod's job, which the JobIndex must know by then.
    """

    events_wait_s: float = 30.0

    def __init__(
        self,
        api: Any,
        *,
        bus: Bus,
        job_index: JobIndex,
        telemetry: Telemetry,
        producer: str = "",
        namespaces: Sequence[str] = (),
        label_selector: str | None = None,
        node_name: str | None = None,
        resources: Iterable[str] | None = None,
        workloads: bool = True,
        only_job_pods: bool = False,
        publish_pods: bool = True,
        settings: WatchSettings | None = None,
    ) -> None:
        self.api = watch_client(api)
        self.bus = bus
        self.job_index = job_index
        self.telemetry = telemetry
        self.producer = producer
        self.settings = settings or WatchSettings()
        self.namespaces: tuple[str | None, ...] = tuple(dict.fromkeys(namespaces)) or (None,)
        self.label_selector = label_selector
        self.node_name = node_name
        if resources is None:
            names = ["pods", "events", "nodes", *(WORKLOAD_RESOURCES if workloads else ())]
        else:
            names = [resource_spec(r).name for r in resources]
        self.resources = tuple(dict.fromkeys(names))
        self.ready = asyncio.Event()
        self.publisher = Publisher(bus, telemetry, producer)
        self.pods = PodHandler(self.publisher, job_index, only_job_pods=only_job_pods, publish=publish_pods)
        self.events = EventHandler(self.publisher, job_index, self.settings)
        self.nodes = NodeHandler(self.publisher, job_index)
        self.workloads: dict[str, WorkloadHandler] = {}
        self.reflectors: list[Reflector] = []
        self._sync = _Sync()
        for name in self.resources:
            spec = RESOURCES[name]
            handler: Handler
            if spec is PODS:
                handler = self.pods
            elif spec is EVENTS:
                handler = self.events
            elif spec is NODES:
                handler = self.nodes
            else:
                handler = self.workloads.setdefault(name, WorkloadHandler(self.publisher, spec))
            for ns in self.namespaces if spec.namespaced else (None,):
                r = Reflector(
                    spec,
                    handler,
                    api=self.api,
                    telemetry=telemetry,
                    settings=self.settings,
                    namespace=ns,
                    label_selector=label_selector if spec is PODS else None,
                    node_name=node_name if spec is PODS else None,
                    on_synced=self._synced,
                )
                self.reflectors.append(r)
                self._sync.pending.add(r.name)
                if spec is PODS:
                    self._sync.pods_pending.add(r.name)
        self._pods_listed = asyncio.Event()
        if not self._sync.pods_pending:
            self._pods_listed.set()

    def add_pod_listener(self, listener: PodListener) -> None:
        """Called with every PodStatus published (after the bus accepted it)."""
        self.pods.listeners.append(listener)

    def _synced(self, r: Reflector) -> None:
        self._sync.pending.discard(r.name)
        self._sync.pods_pending.discard(r.name)
        if not self._sync.pods_pending:
            self._pods_listed.set()
        if not self._sync.pending:
            self.ready.set()

    async def _run_reflector(self, r: Reflector) -> None:
        if r.spec is EVENTS:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.events_wait_s):
                    await self._pods_listed.wait()
        await guarded(f"watch {r.name}", r.run, self.telemetry, r.source)

    def states(self) -> dict[str, str]:
        """Each loop's state: starting, listing, watching, backoff, missing or forbidden."""
        return {r.name: r.state for r in self.reflectors}

    async def run(self) -> None:
        if not self.reflectors:
            self.ready.set()
        tasks = [asyncio.create_task(self._run_reflector(r), name=f"k8s:{r.name}") for r in self.reflectors]
        try:
            await asyncio.gather(*tasks)
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
