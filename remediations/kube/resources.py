"""What the Kubernetes operations address: the names the agent writes on objects, the resources
as the API and RBAC name them (`_Res`; `_What`, one API call described for its error messages),
and small helpers on the API's JSON (names checked before they go into a URL, label selectors, an
object's identity).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from trainmedic.models import FaultClass, I18nText
from trainmedic.remediations.kube.errors import KubeForbidden, PermanentKubeError

JSON = dict[str, Any]
Outcome = Literal["written", "unchanged", "missing"]

# ------------------------------------------------------------------------------------------------
# Names the agent writes (docs/contracts.md: prefix trainmedic.io/)

PREFIX = "trainmedic.io/"
TAINT_KEY = PREFIX + "unhealthy"
TAINT_EFFECT = "NoSchedule"
LABEL_QUARANTINED = PREFIX + "quarantined"
ANN_INCIDENT = PREFIX + "incident"
ANN_QUARANTINED_AT = PREFIX + "quarantined-at"
ANN_QUARANTINE_REASON = PREFIX + "quarantine-reason"
ANN_WAS_UNSCHEDULABLE = PREFIX + "was-unschedulable"
QUARANTINE_ANNOTATIONS = (ANN_INCIDENT, ANN_QUARANTINED_AT, ANN_QUARANTINE_REASON, ANN_WAS_UNSCHEDULABLE)
CONDITION_TYPE = "TrainmedicUnhealthy"
RELEASED_REASON = "Released"
# Node-level findings, as node-problem-detector reports problems: a condition per kind of problem
# (status True, reason the fault class in CamelCase, message in English and Chinese) and an Event on
# the Node. Events about a cluster-scoped object live in the `default` namespace.
PROBLEM_ACCELERATOR = "TrainmedicAcceleratorProblem"
PROBLEM_NODE = "TrainmedicNodeProblem"
PROBLEM_CONDITIONS = (PROBLEM_ACCELERATOR, PROBLEM_NODE)
ACCELERATOR_FAULTS = frozenset({FaultClass.DEVICE_ERROR.value, FaultClass.ACCELERATOR_OOM.value})
NODE_EVENT_NAMESPACE = "default"
EVENT_COMPONENT = "trainmedic"
SCENE_FINALIZER = PREFIX + "scene"
# The default bound of a log read (the end of the log is kept).
LOG_BYTES = 1 << 20

MERGE_PATCH = "application/merge-patch+json"
# Bounded texts: an annotation or a condition message is not a place for a whole log.
REASON_MAX = 1024
_LABEL_VALUE = re.compile(r"^(?:[A-Za-z0-9](?:[A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?)?$")


# ------------------------------------------------------------------------------------------------
# Resources


@dataclass(frozen=True, slots=True)
class _Res:
    """A resource as the API and RBAC name it."""

    api_version: str
    kind: str
    plural: str
    namespaced: bool

    @property
    def group(self) -> str:
        return self.api_version.rpartition("/")[0]

    @property
    def version(self) -> str:
        return self.api_version.rpartition("/")[2]

    @property
    def custom(self) -> bool:
        return self.group not in ("", "batch")


NODES = _Res("v1", "Node", "nodes", namespaced=False)
PODS = _Res("v1", "Pod", "pods", namespaced=True)
EVENTS = _Res("v1", "Event", "events", namespaced=True)
JOBS = _Res("batch/v1", "Job", "jobs", namespaced=True)
VOLCANO_JOBS = _Res("batch.volcano.sh/v1alpha1", "Job", "jobs", namespaced=True)
PYTORCH_JOBS = _Res("kubeflow.org/v1", "PyTorchJob", "pytorchjobs", namespaced=True)
WORKLOADS: dict[tuple[str, str], _Res] = {(r.api_version, r.kind): r for r in (JOBS, VOLCANO_JOBS, PYTORCH_JOBS)}
# Read only (`trainmedic diagnose --job`, `trainmedic scan`): the kinds looked at, restarted or not.
MPI_JOBS = _Res("kubeflow.org/v2beta1", "MPIJob", "mpijobs", namespaced=True)
READ_WORKLOADS: tuple[_Res, ...] = (PYTORCH_JOBS, MPI_JOBS, VOLCANO_JOBS, JOBS)


class KindLike(Protocol):
    """Anything that names a workload kind: remediations.workloads.WorkloadKind, a JobRef."""

    @property
    def api_version(self) -> str: ...

    @property
    def kind(self) -> str: ...


def _workload_res(api_version: str, kind: str) -> _Res:
    res = WORKLOADS.get((api_version, kind))
    if res is None:
        known = ", ".join(f"{a} {k}" for a, k in WORKLOADS)
        raise PermanentKubeError(f"unsupported workload kind {api_version} {kind} (supported: {known})")
    return res


@dataclass(frozen=True, slots=True)
class _What:
    """One API call, described for error messages: verb, resource, subresource, where."""

    verb: str
    res: _Res
    namespace: str | None = None
    name: str | None = None
    sub: str | None = None

    @property
    def rbac_resource(self) -> str:
        return self.res.plural + (f"/{self.sub}" if self.sub else "")

    @property
    def scope(self) -> str:
        return f"namespace {self.namespace}" if self.res.namespaced and self.namespace else "cluster scope"

    @property
    def target(self) -> str:
        kind = self.res.kind if not self.res.group else f"{self.res.kind}.{self.res.group}"
        if self.name is None:
            return f"{self.res.plural} ({self.scope})"
        where = f"{self.namespace}/{self.name}" if self.res.namespaced and self.namespace else self.name
        return f"{kind} {where}" + (f" ({self.sub})" if self.sub else "")

    def forbidden(self, api_message: str) -> KubeForbidden:
        group = f' in apiGroup "{self.res.group}"' if self.res.group else ""
        need = f"{self.rbac_resource}: {self.verb}{group}"
        # deploy/: node rules are in the brain's ClusterRole; what it does to jobs and pods is granted
        # per training namespace by the Role of deploy/training-namespace (trainmedic-remediate).
        if self.res.namespaced and self.namespace:
            role = f"the Role trainmedic-remediate in namespace {self.namespace}"
            role_zh = f"命名空间 {self.namespace} 中的 Role trainmedic-remediate"
        else:
            role, role_zh = "the trainmedic brain's ClusterRole", "trainmedic brain 的 ClusterRole"
        message = f"forbidden: cannot {self.verb} {self.rbac_resource} ({self.scope}): {role} needs {need}"
        if api_message:
            message += f" (API: {api_message})"
        hint = I18nText(
            en=f"Grant {role} the rule {need} (deploy/training-namespace for a training namespace), then retry.",
            zh=f"请为{role_zh}添加权限规则 {need}（训练命名空间见 deploy/training-namespace），然后重试。",
        )
        err = KubeForbidden(message, status=403, hint=hint)
        err.need, err.scope = need, self.scope
        return err


# ------------------------------------------------------------------------------------------------
# Small helpers on the API's JSON (nothing is trusted to have the right type)


def _map(v: Any) -> dict[str, Any]:
    return dict(v) if isinstance(v, Mapping) else {}


def _list(v: Any) -> list[Any]:
    return list(v) if isinstance(v, list) else []


def _meta(obj: Mapping[str, Any]) -> dict[str, Any]:
    return _map(obj.get("metadata"))


def _str_map(v: Any) -> dict[str, str]:
    return {str(k): str(x) for k, x in _map(v).items() if x is not None}


def _with_rv(obj: Mapping[str, Any], patch: JSON) -> JSON:
    """Add the resourceVersion that was read, when the object has one: the API then refuses (409) a
    write over a change it did not see (optimistic concurrency). kmock versions nothing."""
    rv = _meta(obj).get("resourceVersion")
    if isinstance(rv, str) and rv and rv != "...":
        patch.setdefault("metadata", {})["resourceVersion"] = rv
    return patch


def _check_names(**names: str | None) -> None:
    """Names that go into a URL path: a non-empty string without a slash (an empty pod name would
    turn a GET of one pod into a list of all of them)."""
    for what, value in names.items():
        if not isinstance(value, str) or not value or "/" in value or len(value) > 253:
            raise PermanentKubeError(f"invalid {what} name {value!r}: a non-empty name without '/' is required")


def _selector(labels: Mapping[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


def _labels_match(obj: Mapping[str, Any], selector: Mapping[str, str]) -> bool:
    labels = _str_map(_meta(obj).get("labels"))
    return all(labels.get(k) == v for k, v in selector.items())


def _event_time(e: Mapping[str, Any]) -> str:
    for key in ("lastTimestamp", "eventTime", "firstTimestamp"):
        v = e.get(key)
        if isinstance(v, str) and v:
            return v
    v = _meta(e).get("creationTimestamp")
    return v if isinstance(v, str) else ""


def _identify(obj: Mapping[str, Any]) -> tuple[_Res, str, str]:
    """The workload resource, namespace and name of an object; a clear error when it lacks them."""
    if not isinstance(obj, Mapping):
        raise PermanentKubeError(f"expected a Kubernetes object (a mapping), got {type(obj).__name__}")
    api_version, kind = obj.get("apiVersion"), obj.get("kind")
    if not isinstance(api_version, str) or not isinstance(kind, str):
        raise PermanentKubeError("malformed object: apiVersion and kind are required")
    res = _workload_res(api_version, kind)
    meta = _meta(obj)
    name, namespace = meta.get("name"), meta.get("namespace")
    if not isinstance(name, str) or not name:
        raise PermanentKubeError(f"malformed {kind}: metadata.name is required")
    if not isinstance(namespace, str) or not namespace:
        raise PermanentKubeError(f"malformed {kind} {name}: metadata.namespace is required")
    return res, namespace, name
