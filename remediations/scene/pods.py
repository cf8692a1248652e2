"""The API objects a scene reads (the API's JSON: camelCase dicts): small accessors, the pods and
their containers, ranks, and where each container's log goes in the bundle (`log_rel`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from trainmedic.remediations.scene.model import SceneInputs

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


# ------------------------------------------------------------------------------------------------
# Small accessors of API objects


def _map(v: Any) -> Mapping[str, Any]:
    return v if isinstance(v, Mapping) else {}


def _list(v: Any) -> list[Any]:
    return v if isinstance(v, list) else []


def _name(obj: Mapping[str, Any]) -> str | None:
    name = _map(obj.get("metadata")).get("name")
    return str(name) if isinstance(name, str) and name else None


def _safe(name: str) -> str:
    """A file name from an object name (Kubernetes names are safe already; input is not trusted)."""
    safe = _UNSAFE.sub("_", name)[:200]
    return safe if safe not in ("", ".", "..") else "_"


@dataclass
class _PodInfo:
    namespace: str
    name: str
    file: str
    node: str | None
    rank: int | None
    uid: str | None
    containers: list[dict[str, Any]]


def log_rel(node: str | None, rank: int | None, pod: str, container: str, *, previous: bool) -> str:
    """Where a container's log goes: `layout/<node>/rank<R>_<pod>_<container>[.previous].log`, the
    collected layout `diagnose --logs` reads (detectors/layout.py: one folder per node, the rank in
    the name), so the bundle diagnosed as a directory places its findings as `--scene` does. A pod
    with no node goes under `layout/_unscheduled/`; one with no rank has no `rank<R>_`. The name a
    live `diagnose --job` gives the same log, so both report the same `file`."""
    folder = _safe(node) if node else "_unscheduled"
    prefix = f"rank{rank}_" if rank is not None else ""
    return f"layout/{folder}/{prefix}{_safe(pod)}_{_safe(container)}{'.previous' if previous else ''}.log"


def _log_rel(p: _PodInfo, c: Mapping[str, Any], *, previous: bool) -> str:
    node = _safe(p.node) if p.node else "_unscheduled"
    rank = f"rank{p.rank}_" if p.rank is not None else ""
    return f"layout/{node}/{rank}{p.file}_{c['file']}{'.previous' if previous else ''}.log"


def pod_containers(pod: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The containers whose logs a bundle keeps, init containers first: name, restarts, and whether a
    previous instance's log is worth reading (it restarted, or its last state is a termination)."""
    spec, status = _map(pod.get("spec")), _map(pod.get("status"))
    statuses = {
        str(_map(s).get("name")): _map(s)
        for s in [*_list(status.get("initContainerStatuses")), *_list(status.get("containerStatuses"))]
    }
    names: list[str] = []
    for key in ("initContainers", "containers"):
        names += [str(_map(c).get("name")) for c in _list(spec.get(key)) if _map(c).get("name")]
    names += [n for n in statuses if n not in names]
    out = []
    for c in names:
        s = statuses.get(c, {})
        restarts = s.get("restartCount")
        restarted = (isinstance(restarts, int) and restarts > 0) or "terminated" in _map(s.get("lastState"))
        out.append(
            {
                "name": c,
                "file": _safe(c),
                "restarts": restarts if isinstance(restarts, int) else 0,
                "restarted": restarted,
            }
        )
    return out


def pod_rank(pod: Mapping[str, Any], ranks: Mapping[str, int] | None = None) -> int | None:
    """A pod's rank as a bundle records it: the job index's (`ranks`), else its RANK env."""
    rank = (ranks or {}).get(str(_name(pod)))
    return rank if isinstance(rank, int) else _rank_env(pod)


def _rank_env(pod: Mapping[str, Any]) -> int | None:
    for c in _list(_map(pod.get("spec")).get("containers")):
        for item in _list(_map(c).get("env")):
            e = _map(item)
            if e.get("name") == "RANK" and str(e.get("value", "")).isdigit():
                return int(str(e["value"]))
    return None


def _pod_infos(inputs: SceneInputs) -> list[_PodInfo]:
    out: list[_PodInfo] = []
    used: set[str] = set()
    for pod in inputs.pods:
        if not isinstance(pod, Mapping) or _name(pod) is None:
            continue
        meta, spec = _map(pod.get("metadata")), _map(pod.get("spec"))
        name = str(meta["name"])
        file = _safe(name)
        while file in used:
            file += "_"
        used.add(file)
        containers = pod_containers(pod)
        node = spec.get("nodeName")
        uid = meta.get("uid")
        out.append(
            _PodInfo(
                namespace=str(meta.get("namespace") or "default"),
                name=name,
                file=file,
                node=str(node) if isinstance(node, str) and node else None,
                rank=pod_rank(pod, inputs.ranks),
                uid=str(uid) if isinstance(uid, str) else None,
                containers=containers,
            )
        )
    return out
