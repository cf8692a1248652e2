"""The workloads trainmedic recreates: the annotations it reads and writes, the errors, the supported
kinds (`WorkloadKind`), and the helpers that read a workload's body defensively.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from trainmedic.errors import PermanentError
from trainmedic.models import I18nText

PREFIX = "trainmedic.io/"
# Declared by the workload (read).
ANN_CHECKPOINT_DIR = PREFIX + "checkpoint-dir"
ANN_RESUME_ENV = PREFIX + "resume-env"
ANN_RESUME_ARGS = PREFIX + "resume-args"
ANN_RESUME_CONTAINER = PREFIX + "resume-container"
ANN_REMEDIATE = PREFIX + "remediate"
# Written on the recreated workload.
ANN_INCIDENT = PREFIX + "incident"
ANN_LINEAGE = PREFIX + "lineage"
ANN_RESUMED_FROM = PREFIX + "resumed-from"
ANN_EXCLUDED_NODES = PREFIX + "excluded-nodes"
ANN_RESTARTS = PREFIX + "restarts"
ANN_RESUME_ARGS_APPLIED = PREFIX + "resume-args-applied"

DEFAULT_RESUME_ENV = "TRAINMEDIC_RESUME_FROM"
RESUME_STEP_ENV = "TRAINMEDIC_RESUME_STEP"
HOSTNAME_LABEL = "kubernetes.io/hostname"
LINEAGE_LIMIT = 20
MAX_TEMPLATE_CHARS = 4096

# The labels the Job controller generates on the pod template (and the API server copies onto the
# Job's own labels when it has none); they carry the old uid, or are re-added anyway.
_JOB_UID_LABELS = ("controller-uid", "batch.kubernetes.io/controller-uid")
_JOB_NAME_LABELS = ("job-name", "batch.kubernetes.io/job-name")

_ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
_PLACEHOLDER = re.compile(r"\{(checkpoint|step)\}")
_MAX_DEPTH = 64


# -- errors ----------------------------------------------------------------------------------------


class WorkloadError(PermanentError):
    """A workload that cannot be recreated as asked. Permanent: retrying gives the same answer."""

    def __init__(self, en: str, zh: str) -> None:
        super().__init__(en)
        self.reason = I18nText(en=en, zh=zh)


class UnsupportedWorkload(WorkloadError):
    """Not a kind trainmedic can restart, or controlled by another controller."""


class MalformedWorkload(UnsupportedWorkload):
    """The object lacks what its kind requires (metadata.name, a pod template...)."""


class InvalidResumeConfig(WorkloadError):
    """The workload's resume annotations cannot be applied."""


class InvalidResumeTemplate(InvalidResumeConfig):
    """`trainmedic.io/resume-args` is not a valid template (only {checkpoint} and {step} allowed)."""


class OptedOut(WorkloadError):
    """The workload says `trainmedic.io/remediate: "false"`: notify only, never recreate."""


class QuantityError(WorkloadError):
    """A Kubernetes quantity (e.g. a memory limit) that does not parse or is out of range."""


# -- kinds -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class WorkloadKind:
    """A workload API resource: what the client needs to GET, DELETE and CREATE it."""

    api_version: str
    kind: str
    group: str
    version: str
    plural: str

    def __str__(self) -> str:
        return f"{self.api_version} {self.kind}"


JOB = WorkloadKind("batch/v1", "Job", "batch", "v1", "jobs")
VOLCANO_JOB = WorkloadKind("batch.volcano.sh/v1alpha1", "Job", "batch.volcano.sh", "v1alpha1", "jobs")
PYTORCH_JOB = WorkloadKind("kubeflow.org/v1", "PyTorchJob", "kubeflow.org", "v1", "pytorchjobs")
SUPPORTED: tuple[WorkloadKind, ...] = (JOB, VOLCANO_JOB, PYTORCH_JOB)
_BY_KEY = {(k.api_version, k.kind): k for k in SUPPORTED}
_SUPPORTED_TEXT = ", ".join(str(k) for k in SUPPORTED)


def workload_kind_for(api_version: str, kind: str) -> WorkloadKind:
    """The supported workload kind of (apiVersion, kind), or UnsupportedWorkload naming what is."""
    found = _BY_KEY.get((api_version, kind))
    if found is None:
        what = f"{api_version or '?'} {kind or '?'}"
        raise UnsupportedWorkload(
            f"{what} is not a workload trainmedic can restart from a checkpoint; supported: {_SUPPORTED_TEXT}",
            f"{what} 不是 trainmedic 能从检查点重启的工作负载；支持：{_SUPPORTED_TEXT}",
        )
    return found


def workload_kind(obj: Mapping[str, Any]) -> WorkloadKind:
    """The supported workload kind of a live object (its apiVersion and kind)."""
    if not isinstance(obj, Mapping):
        raise MalformedWorkload(
            f"a workload must be an object, got {type(obj).__name__}",
            f"工作负载必须是对象，实际为 {type(obj).__name__}",
        )
    api_version, kind = obj.get("apiVersion"), obj.get("kind")
    if not isinstance(api_version, str) or not isinstance(kind, str):
        raise MalformedWorkload(
            "the object has no apiVersion/kind (a typed client model? pass "
            "ApiClient.sanitize_for_serialization(obj), or a dynamic client's dict)",
            "对象缺少 apiVersion/kind（请传入 ApiClient.sanitize_for_serialization(obj) 或动态客户端返回的字典）",
        )
    return workload_kind_for(api_version, kind)


# -- small helpers ---------------------------------------------------------------------------------


def _plain(value: Any, where: str, depth: int) -> Any:
    """A deep copy as plain JSON types (dict, list, str, int, float, bool, None)."""
    if depth > _MAX_DEPTH:
        raise MalformedWorkload(f"{where}: nested too deeply", f"{where}：嵌套过深")
    if isinstance(value, Mapping):
        return {str(k): _plain(v, where, depth + 1) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v, where, depth + 1) for v in value]
    if value is None or isinstance(value, str | int | float | bool):
        return value
    raise MalformedWorkload(
        f"{where}: {type(value).__name__} is not JSON (pass plain dicts, e.g. sanitize_for_serialization)",
        f"{where}：{type(value).__name__} 不是 JSON 类型",
    )


def _mapping(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise MalformedWorkload(f"{where} is not an object", f"{where} 不是对象")
    return value


def _child(parent: dict[str, Any], key: str, where: str) -> dict[str, Any]:
    value = parent.get(key)
    if value is None:
        value = parent[key] = {}
    elif not isinstance(value, dict):
        raise MalformedWorkload(f"{where}.{key} is not an object", f"{where}.{key} 不是对象")
    return value


def _annotations(obj: Mapping[str, Any]) -> dict[str, str]:
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    raw = meta.get("annotations") if isinstance(meta, Mapping) else None
    if not isinstance(raw, Mapping):
        return {}
    return {str(k): v for k, v in raw.items() if isinstance(v, str)}


def _name(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata")
    name = meta.get("name") if isinstance(meta, Mapping) else None
    if not isinstance(name, str) or not name:
        raise MalformedWorkload("metadata.name is missing", "缺少 metadata.name")
    return name


def _malformed(obj: Mapping[str, Any], en: str, zh: str) -> MalformedWorkload:
    meta = obj.get("metadata")
    name = meta.get("name") if isinstance(meta, Mapping) else None
    return MalformedWorkload(f"{name or '?'}: {en}", f"{name or '?'}：{zh}")


def _node_names(nodes: Iterable[str]) -> list[str]:
    if isinstance(nodes, str):
        raise ValueError("exclude_nodes must be a sequence of node names, not one string")
    out: set[str] = set()
    for n in nodes:
        if not isinstance(n, str) or not n.strip() or "," in n or any(ch.isspace() for ch in n.strip()):
            raise ValueError(f"{n!r} is not a node name")
        out.add(n.strip())
    return sorted(out)


def _int_or_none(raw: str | None) -> int | None:
    if raw is None or not re.fullmatch(r"[0-9]{1,18}", raw.strip()):
        return None
    return int(raw.strip())
