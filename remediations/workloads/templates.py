"""What is read from a workload's pod templates (the templates by path, the pods' selector, the
lineage and excluded nodes) and memory quantities: parsed, formatted and a raised limit.
"""

from __future__ import annotations

import json
import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from trainmedic import quantity as shared_quantity
from trainmedic.remediations.workloads.kinds import (
    ANN_EXCLUDED_NODES,
    ANN_LINEAGE,
    ANN_RESUME_CONTAINER,
    JOB,
    VOLCANO_JOB,
    InvalidResumeConfig,
    MalformedWorkload,
    QuantityError,
    _annotations,
    _malformed,
    _mapping,
    _name,
    workload_kind,
)
from trainmedic.remediations.workloads.resume import resume_spec


def excluded_nodes(obj: Mapping[str, Any]) -> list[str]:
    """The nodes an earlier recreation excluded (`trainmedic.io/excluded-nodes`), sorted."""
    raw = _annotations(obj).get(ANN_EXCLUDED_NODES) or ""
    return sorted({n.strip() for n in raw.split(",") if n.strip()})


def lineage(obj: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The earlier incarnations (`trainmedic.io/lineage`), oldest first; an unreadable value counts as none."""
    raw = _annotations(obj).get(ANN_LINEAGE)
    if not raw:
        return []
    try:
        data = json.loads(raw)
    except ValueError:
        return []
    return [dict(e) for e in data if isinstance(e, dict)] if isinstance(data, list) else []


def job_pod_selector(obj: Mapping[str, Any]) -> dict[str, str]:
    """Labels that select the workload's pods, across incarnations (no uid in them).

    batch/v1 Job: the job-name label its controller sets (`batch.kubernetes.io/job-name` where the
    template shows the cluster sets it, else the legacy `job-name` every version sets), or the
    user's own matchLabels with manualSelector; Volcano: `volcano.sh/job-name`; PyTorchJob:
    `training.kubeflow.org/job-name`.
    """
    kind = workload_kind(obj)
    name = _name(obj)
    if kind is JOB:
        spec = _mapping(obj.get("spec"), "spec")
        if spec.get("manualSelector") is True:
            selector = _mapping(spec.get("selector"), "spec.selector")
            labels = _mapping(selector.get("matchLabels"), "spec.selector.matchLabels")
            if labels:
                return {str(k): str(v) for k, v in labels.items()}
        template = _mapping(spec.get("template"), "spec.template")
        tlabels = _mapping(_mapping(template.get("metadata"), "spec.template.metadata").get("labels"), "labels")
        key = "batch.kubernetes.io/job-name" if "batch.kubernetes.io/job-name" in tlabels else "job-name"
        return {key: name}
    if kind is VOLCANO_JOB:
        return {"volcano.sh/job-name": name}
    return {"training.kubeflow.org/job-name": name}


# -- pod templates ---------------------------------------------------------------------------------


def pod_templates_by_path(obj: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The pod templates of a workload, by their path in the object (in spec order); the dicts are
    the object's own, so changing them changes the object."""
    kind = workload_kind(obj)
    spec = _mapping(obj.get("spec"), "spec")
    out: dict[str, dict[str, Any]] = {}
    if kind is JOB:
        out["spec.template"] = _template(spec.get("template"), "spec.template")
    elif kind is VOLCANO_JOB:
        tasks = spec.get("tasks")
        if not isinstance(tasks, list) or not tasks:
            raise _malformed(obj, "spec.tasks is missing or empty", "spec.tasks 缺失或为空")
        for i, task in enumerate(tasks):
            path = f"spec.tasks[{i}]"
            out[path + ".template"] = _template(_mapping(task, path).get("template"), path + ".template")
    else:
        replicas = spec.get("pytorchReplicaSpecs")
        if not isinstance(replicas, dict) or not replicas:
            raise _malformed(obj, "spec.pytorchReplicaSpecs is missing or empty", "spec.pytorchReplicaSpecs 缺失或为空")
        for rtype, rspec in replicas.items():
            path = f"spec.pytorchReplicaSpecs.{rtype}"
            out[path + ".template"] = _template(_mapping(rspec, path).get("template"), path + ".template")
    return out


def pod_templates(obj: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The pod template dicts of a workload (Job: spec.template; Volcano: each task's; PyTorchJob:
    each replica spec's), mutable in place."""
    return list(pod_templates_by_path(obj).values())


def _template(value: Any, path: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise MalformedWorkload(f"{path} is missing or not an object", f"{path} 缺失或不是对象")
    spec = value.get("spec")
    if not isinstance(spec, dict) or not isinstance(spec.get("containers"), list) or not spec["containers"]:
        raise MalformedWorkload(f"{path}.spec.containers is missing or empty", f"{path}.spec.containers 缺失或为空")
    for i, c in enumerate(spec["containers"]):
        if not isinstance(c, dict) or not isinstance(c.get("name"), str):
            raise MalformedWorkload(
                f"{path}.spec.containers[{i}] is not a container with a name",
                f"{path}.spec.containers[{i}] 不是带名称的容器",
            )
    return value


# -- memory ----------------------------------------------------------------------------------------

_BINARY = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
MAX_BYTES = 2**63 - 1
MI = 1024**2


def parse_quantity(text: str) -> Fraction:
    """A Kubernetes quantity (resource.Quantity) as an exact number (the grammar and the reader are
    trainmedic.quantity's: "1E" is an exa and "1e3" an exponent, "m" is milli). Raises QuantityError."""
    try:
        return shared_quantity.parse_quantity(text)
    except shared_quantity.BadQuantity as e:
        if e.reason == "type":
            raise QuantityError(f"quantity {text!r} is not a string", f"数量 {text!r} 不是字符串") from None
        if e.reason == "exponent":
            raise QuantityError(f"{e.shown!r}: exponent out of range", f"{e.shown!r}：指数超出范围") from None
        raise QuantityError(
            f"{e.shown!r} is not a Kubernetes quantity", f"{e.shown!r} 不是合法的 Kubernetes 数量"
        ) from None


def memory_bytes(text: str) -> int:
    """A memory quantity in whole bytes (rounded up, as the kubelet does), 0 <= bytes < 2**63."""
    value = parse_quantity(text)
    if value < 0:
        raise QuantityError(f"{text!r}: memory cannot be negative", f"{text!r}：内存不能为负")
    n = math.ceil(value)
    if n > MAX_BYTES:
        raise QuantityError(f"{text!r}: more than 2^63-1 bytes", f"{text!r}：超过 2^63-1 字节")
    return n


def format_quantity(n: int) -> str:
    """Bytes as a Kubernetes quantity: the largest binary suffix that is exact (24Gi, 1536Mi), else plain."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise QuantityError(f"{n!r} is not a byte count", f"{n!r} 不是字节数")
    for suffix, power in sorted(_BINARY.items(), key=lambda kv: -kv[1]):
        unit = 1024**power
        if n and n % unit == 0:
            return f"{n // unit}{suffix}"
    return str(n)


@dataclass(frozen=True)
class MemoryChange:
    """One container's memory limit (and request) before and after raise_memory.

    `old` is None when the container has no memory limit: nothing to raise (reported, not changed).
    `new` equals `old` when the limit is already at or above the cap.
    """

    container: str
    template_path: str
    old: str | None
    new: str | None
    capped: bool
    old_request: str | None = None
    new_request: str | None = None

    @property
    def changed(self) -> bool:
        return self.new is not None and self.new != self.old

    def as_dict(self) -> dict[str, Any]:
        return {
            "container": self.container,
            "template_path": self.template_path,
            "old": self.old,
            "new": self.new,
            "capped": self.capped,
            "old_request": self.old_request,
            "new_request": self.new_request,
        }


def raise_memory(
    obj: dict[str, Any],
    *,
    factor: float,
    cap_bytes: int,
    containers: Collection[str] | None = None,
) -> list[MemoryChange]:
    """Raise the memory limit of the selected containers of a workload body, in place.

    Selected: `containers` if given, else what `trainmedic.io/resume-container` names, else every
    container (never initContainers unless named). The limit becomes limit x factor, rounded up to
    a whole Mi, at most `cap_bytes` and never lower than before; the request follows when it equals
    the old limit (the pod keeps its QoS class) or would exceed the new one. A container without a
    memory limit is left alone and reported (old None).
    """
    if isinstance(factor, bool) or not isinstance(factor, int | float) or not math.isfinite(factor) or factor <= 1:
        raise ValueError(f"memory factor must be a finite number above 1, got {factor!r}")
    if isinstance(cap_bytes, bool) or not isinstance(cap_bytes, int) or not 0 < cap_bytes <= MAX_BYTES:
        raise ValueError(f"memory cap must be a positive byte count below 2^63, got {cap_bytes!r}")
    ratio = Fraction(repr(float(factor)))  # 1.1 means 11/10, not the binary float just above it
    names = tuple(containers) if containers is not None else resume_spec(obj).containers
    changes: list[MemoryChange] = []
    for path, cname, field_name, c in _select(obj, names, "the containers asked for" if containers else None):
        where = f"{path}.spec.{field_name}[{cname}].resources"
        resources = _mapping(c.get("resources"), where)
        limits = _mapping(resources.get("limits"), where + ".limits")
        requests = _mapping(resources.get("requests"), where + ".requests")
        old_limit = limits.get("memory")
        old_request = requests.get("memory")
        if old_limit is None:
            changes.append(MemoryChange(cname, path, None, None, False, _opt_str(old_request), _opt_str(old_request)))
            continue
        old_bytes = _memory_at(old_limit, where + ".limits.memory")
        raised = math.ceil(old_bytes * ratio / MI) * MI
        capped = raised > cap_bytes
        new_bytes = max(old_bytes, min(raised, cap_bytes))
        new_limit = str(old_limit) if new_bytes == old_bytes else format_quantity(new_bytes)
        new_request = _opt_str(old_request)
        if new_bytes != old_bytes:
            c["resources"] = resources
            resources["limits"] = dict(limits, memory=new_limit)
            if old_request is not None:
                req_bytes = _memory_at(old_request, where + ".requests.memory")
                if req_bytes == old_bytes or req_bytes > new_bytes:
                    new_request = new_limit
                    resources["requests"] = dict(requests, memory=new_limit)
        changes.append(MemoryChange(cname, path, str(old_limit), new_limit, capped, _opt_str(old_request), new_request))
    return changes


def _memory_at(value: Any, where: str) -> int:
    try:
        return memory_bytes(str(value))
    except QuantityError as exc:
        raise MalformedWorkload(f"{where}: {exc}", f"{where}：{exc.reason.zh}") from None


def _opt_str(value: Any) -> str | None:
    return None if value is None else str(value)


def _select(
    obj: Mapping[str, Any], names: Sequence[str] | None, source: str | None
) -> list[tuple[str, str, str, dict[str, Any]]]:
    """(template path, container name, field, container) of the selected containers: every
    container, or those named (initContainers included when named)."""
    templates = pod_templates_by_path(obj)
    out: list[tuple[str, str, str, dict[str, Any]]] = []
    seen: set[str] = set()
    for path, tmpl in templates.items():
        pod_spec = tmpl["spec"]
        fields = ("containers",) if names is None else ("initContainers", "containers")
        for field_name in fields:
            items = pod_spec.get(field_name) or []
            if not isinstance(items, list):
                raise MalformedWorkload(f"{path}.spec.{field_name} is not a list", f"{path}.spec.{field_name} 不是列表")
            for c in items:
                if not isinstance(c, dict) or not isinstance(c.get("name"), str):
                    continue
                seen.add(c["name"])
                if names is None or c["name"] in names:
                    out.append((path, c["name"], field_name, c))
    if names is not None:
        missing = [n for n in names if n not in seen]
        if missing:
            what = source or ANN_RESUME_CONTAINER
            raise InvalidResumeConfig(
                f"{what}: no pod template has a container named {', '.join(missing)} (has: {', '.join(sorted(seen))})",
                f"{what}：没有任何 Pod 模板包含名为 {', '.join(missing)} 的容器（现有：{', '.join(sorted(seen))}）",
            )
    return out
