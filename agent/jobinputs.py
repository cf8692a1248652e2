"""The texts one job's evidence is classified from, attributed as the brain attributes them live.

One assembly for `diagnose --scene DIR` (a saved bundle) and `diagnose --job` (the cluster now), so
the same evidence gives the same diagnosis, finding for finding: kernel lines node by node, core/v1
events and the nodes' and workload's status as the canonical lines the watchers publish (grouped by
node, events in the bundle's order), each pod's status, then the container logs (by pod, container,
the previous instance first) named as the bundle names them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from trainmedic.agent.watchers.k8s import (
    PYTORCH_JOBS,
    RESOURCES,
    k8s_event,
    k8s_event_line,
    node_status,
    node_status_lines,
    pod_status_input,
    workload_status,
    workload_status_lines,
)
from trainmedic.detectors.diagnose import LogInput
from trainmedic.events import WorkloadStatus
from trainmedic.models import Source
from trainmedic.remediations.scene import SceneSettings, event_order

# (pod, container, previous) of a container log.
LogKey = tuple[str, str, bool]


def workload_phase(obj: Mapping[str, Any]) -> WorkloadStatus:
    """The workload's phase and reason as the watchers read it (an MPIJob's conditions as a PyTorchJob's)."""
    api_version, kind = str(obj.get("apiVersion") or ""), str(obj.get("kind") or "")
    if kind == "MPIJob":
        w = workload_status(PYTORCH_JOBS, obj)
        return w.model_copy(update={"job": w.job.model_copy(update={"kind": kind, "api_version": api_version})})
    spec = RESOURCES["volcanojobs"] if api_version.startswith("batch.volcano.sh/") else RESOURCES["jobs"]
    if kind == "PyTorchJob":
        spec = PYTORCH_JOBS
    return workload_status(spec, obj)


def _name(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata")
    return str(meta.get("name") or "") if isinstance(meta, Mapping) else ""


def job_inputs(
    *,
    events: Iterable[Mapping[str, Any]],
    nodes: Iterable[Mapping[str, Any]] = (),
    workload: Mapping[str, Any] | None = None,
    pods: Iterable[Mapping[str, Any]] = (),
    logs: Iterable[tuple[LogKey, LogInput]] = (),
    kernel: Sequence[LogInput] = (),
    max_events: int = SceneSettings().max_events,
) -> list[LogInput]:
    """The attributed inputs of one job, in one order whoever read the evidence (see the module
    docstring). Events are deduplicated by (namespace, name) and the newest `max_events` kept, as a
    bundle keeps them."""
    unique: dict[tuple[str, str], Mapping[str, Any]] = {}
    for i, obj in enumerate(events):
        meta = obj.get("metadata")
        meta = meta if isinstance(meta, Mapping) else {}
        unique[(str(meta.get("namespace") or ""), str(meta.get("name") or f"#{i}"))] = obj
    ordered = sorted(unique.values(), key=event_order)[-max_events:] if max_events > 0 else []
    by_node: dict[str | None, list[str]] = {}
    for obj in ordered:
        ev = k8s_event(obj)
        by_node.setdefault(ev.node, []).append(k8s_event_line(ev))
    for obj in sorted(nodes, key=_name):
        lines = node_status_lines(node_status(obj))
        if lines:
            by_node.setdefault(_name(obj) or None, []).extend(lines)
    if workload is not None:
        wlines = workload_status_lines(workload_phase(workload))
        if wlines:
            by_node.setdefault(None, []).extend(wlines)
    inputs = list(kernel)
    for node, lines in by_node.items():
        inputs.append(LogInput(name="events", text="\n".join(lines).encode(), source=Source.K8S_EVENT, node=node))
    for pod in sorted(pods, key=_name):
        pod_input = pod_status_input(pod)
        if pod_input is not None:
            inputs.append(pod_input)
    inputs.extend(item for _, item in sorted(logs, key=lambda kv: (kv[0][0], kv[0][1], not kv[0][2])))
    return inputs
