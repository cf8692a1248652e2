"""The API's objects as plain JSON: accessors that trust nothing to have the right type, the
watched resources (`ResourceSpec`, `resource_spec`), an object's cache key (`object_key`) and
label selectors applied client-side.

Lists and watch events are parsed as plain JSON, never turned into the client's model classes.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from trainmedic.timefmt import parse_rfc3339_ns

# ------------------------------------------------------------------------------------------------
# Small parsing helpers (objects are the API's JSON: nothing is trusted to have the right type; `_get`
# and `_map` are the pod index's, agent/jobindex.py)


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
# The watched resources


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


def object_key(obj: Mapping[str, Any]) -> str | None:
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping) or not _str(meta.get("name")):
        return None
    ns = _str(meta.get("namespace"))
    return f"{ns}/{meta['name']}" if ns else str(meta["name"])


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
