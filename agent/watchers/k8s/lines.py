"""The canonical lines the rules match, rendered from the digests' payloads.

What the rules see: the brain renders pod statuses, core/v1 events, unhealthy nodes and failed
workloads as canonical text lines (stable formats, matched by rules/*.yaml of source pod_status /
k8s_event): `pod_status: container=...` and `pod_status: pod=...` (`pod_status_lines`),
`k8s_event: ...` (`k8s_event_line`), `node_status: node=...` (`node_status_lines`, only for a node
whose Ready is not True, with a node lifecycle taint, or deleted) and `job_status: ...`
(`workload_status_lines`, only for a Failed workload). A node that is unhealthy or deleted is
published once more per job with pods on it (`NodeHandler` in handlers.py), so the node's loss
reaches each job.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from trainmedic.agent.watchers.k8s.digest import MAX_EVENT_MESSAGE, pod_digest
from trainmedic.agent.watchers.k8s.objects import _int, _time_s
from trainmedic.events import K8sEvent, NodeStatus, PodStatus, WorkloadStatus
from trainmedic.models import Source

if TYPE_CHECKING:
    from trainmedic.detectors.diagnose import LogInput


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


def k8s_event_line(e: K8sEvent) -> str:
    """The canonical line of a core/v1 Event:
    `k8s_event: type=<T> reason=<R> object=<Kind>/<name> message=<text>` (newlines flattened)."""
    message = re.sub(r"\s*[\r\n]+\s*", " ", e.message or "").strip()[:MAX_EVENT_MESSAGE]
    return (
        f"k8s_event: type={_token(e.type or 'Normal')} reason={_token(e.reason or 'Unknown')} "
        f"object={_token(e.object_kind or '?')}/{_token(e.object_name or '?')} message={message}"
    )
