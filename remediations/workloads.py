"""Workload adapters: the body that recreates a training workload so it resumes from a checkpoint
on healthy nodes.

Restarting a training job in place rarely helps: its pods land on the same broken node and start
from step 0. The restart action therefore deletes the workload and creates it again from the body
built here, a pure function of the live object (camelCase dicts, as a dynamic GET or
`ApiClient.sanitize_for_serialization` gives them; no API calls):

* identity kept: same apiVersion, kind, name, namespace, labels and the user's annotations, so
  dashboards, quotas and the user's own tooling still find it; what the API server or a controller
  set (uid, resourceVersion, managedFields, status, a batch/v1 Job's generated selector and labels)
  is dropped, or the create would be refused or would select the old pods;
* healthy nodes only: every pod template gets a required node affinity
  `kubernetes.io/hostname NotIn [...]`, added to every nodeSelectorTerm (terms are ORed) and
  replacing the one an earlier restart added, so repeated restarts never stack;
* resume: the checkpoint path and step go into env (`trainmedic.io/resume-env`, default
  `TRAINMEDIC_RESUME_FROM`, and `TRAINMEDIC_RESUME_STEP`) and, when the workload declares
  `trainmedic.io/resume-args`, into the container args; the args appended last time are recorded
  in `trainmedic.io/resume-args-applied` and replaced, not stacked;
* the history travels with the workload: `trainmedic.io/lineage` (bounded), the incident, the
  checkpoint resumed from, the nodes excluded and the restart count.

Supported: batch/v1 Job (Indexed too), Volcano batch.volcano.sh/v1alpha1 Job (gang settings kept),
Kubeflow kubeflow.org/v1 PyTorchJob (elastic too). A workload controlled by another controller
(a CronJob's Job, a pipeline's PyTorchJob) is refused: that controller would fight the recreation.

Build the body before deleting anything: every refusal happens here, while the job still exists.

Errors (all permanent: the same input gives the same answer; each carries `reason`, an I18nText):

    WorkloadError
    ├── UnsupportedWorkload        a kind we cannot restart, or one owned by another controller
    │   └── MalformedWorkload      the object lacks what the kind requires (no name, no template)
    ├── InvalidResumeConfig        the resume annotations cannot be applied (bad env name, no such container)
    │   └── InvalidResumeTemplate  trainmedic.io/resume-args is not a valid template
    ├── OptedOut                   trainmedic.io/remediate: "false"
    └── QuantityError              a Kubernetes quantity that does not parse
"""

from __future__ import annotations

import json
import math
import re
import shlex
import time
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Protocol

from trainmedic import quantity as shared_quantity
from trainmedic.errors import PermanentError
from trainmedic.models import I18nText
from trainmedic.timefmt import rfc3339

__all__ = [
    "ANN_CHECKPOINT_DIR",
    "ANN_EXCLUDED_NODES",
    "ANN_INCIDENT",
    "ANN_LINEAGE",
    "ANN_REMEDIATE",
    "ANN_RESTARTS",
    "ANN_RESUMED_FROM",
    "ANN_RESUME_ARGS",
    "ANN_RESUME_ARGS_APPLIED",
    "ANN_RESUME_CONTAINER",
    "ANN_RESUME_ENV",
    "DEFAULT_RESUME_ENV",
    "HOSTNAME_LABEL",
    "JOB",
    "LINEAGE_LIMIT",
    "PYTORCH_JOB",
    "RESUME_STEP_ENV",
    "SUPPORTED",
    "VOLCANO_JOB",
    "CheckpointRef",
    "InvalidResumeConfig",
    "InvalidResumeTemplate",
    "MalformedWorkload",
    "MemoryChange",
    "OptedOut",
    "QuantityError",
    "Recreation",
    "ResumeSpec",
    "UnsupportedWorkload",
    "WorkloadError",
    "WorkloadKind",
    "build_recreation",
    "excluded_nodes",
    "format_quantity",
    "job_pod_selector",
    "lineage",
    "memory_bytes",
    "parse_quantity",
    "pod_templates",
    "pod_templates_by_path",
    "raise_memory",
    "recreate_body",
    "render_resume_args",
    "resume_spec",
    "workload_kind",
    "workload_kind_for",
]

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


# -- reading the workload's declarations -----------------------------------------------------------


class CheckpointRef(Protocol):
    """What a restart needs of a checkpoint (remediations.checkpoints.Checkpoint has it)."""

    @property
    def path(self) -> str: ...

    @property
    def step(self) -> int | None: ...


@dataclass(frozen=True)
class ResumeSpec:
    """What a workload declares about resuming (its `trainmedic.io/*` annotations).

    Reading never fails: an annotation that cannot be used is listed in `problems` (and a value of
    `trainmedic.io/remediate` that is neither true nor false counts as an opt-out: first, do no
    harm); `recreate_body` refuses what cannot be applied.
    """

    checkpoint_dir: str | None
    env: str = DEFAULT_RESUME_ENV
    args: str | None = None
    container: str | None = None
    opt_out: bool = False
    problems: tuple[str, ...] = ()

    @property
    def containers(self) -> tuple[str, ...] | None:
        """The container names `trainmedic.io/resume-container` selects (a comma list), or None: all."""
        if self.container is None:
            return None
        names = tuple(n.strip() for n in self.container.split(",") if n.strip())
        return names or None


_TRUE = {"true", "yes", "on", "1", "enabled"}
_FALSE = {"false", "no", "off", "0", "disabled"}


def resume_spec(obj: Mapping[str, Any]) -> ResumeSpec:
    """The resume declarations of a workload (see ResumeSpec); never raises on annotation content."""
    ann = _annotations(obj)
    problems: list[str] = []

    def text(key: str) -> str | None:
        value = ann.get(key)
        if value is None:
            return None
        value = value.strip()
        return value or None

    env = text(ANN_RESUME_ENV) or DEFAULT_RESUME_ENV
    env_problem = _env_problem(env)
    if env_problem is not None:
        problems.append(env_problem)
    args = text(ANN_RESUME_ARGS)
    if args is not None:
        problems.extend(_template_problems(args))
    opt_out = False
    remediate = text(ANN_REMEDIATE)
    if remediate is not None:
        low = remediate.lower()
        if low in _FALSE:
            opt_out = True
        elif low not in _TRUE:
            opt_out = True
            problems.append(f'{ANN_REMEDIATE}: {remediate!r} is neither "true" nor "false"; taken as an opt-out')
    return ResumeSpec(
        checkpoint_dir=text(ANN_CHECKPOINT_DIR),
        env=env,
        args=args,
        container=text(ANN_RESUME_CONTAINER),
        opt_out=opt_out,
        problems=tuple(problems),
    )


def _env_problem(env: str) -> str | None:
    if not _ENV_NAME.match(env):
        return f"{ANN_RESUME_ENV}: {env!r} is not a valid environment variable name"
    if env == RESUME_STEP_ENV:
        return f"{ANN_RESUME_ENV}: {env!r} is where trainmedic puts the step; choose another name"
    return None


def _template_problems(template: str) -> list[str]:
    if len(template) > MAX_TEMPLATE_CHARS:
        return [f"{ANN_RESUME_ARGS}: longer than {MAX_TEMPLATE_CHARS} characters"]
    rest = _PLACEHOLDER.sub("", template)
    stray = re.search(r"\{[^{}]*\}?|\}", rest)
    if stray is not None:
        return [
            f"{ANN_RESUME_ARGS}: {stray.group(0)!r} is not allowed; the only placeholders are "
            "{checkpoint} and {step}, and braces cannot appear otherwise"
        ]
    try:
        shlex.split(template)
    except ValueError as exc:
        return [f"{ANN_RESUME_ARGS}: cannot be split into arguments ({exc})"]
    return []


def render_resume_args(template: str, checkpoint: str, step: int | None) -> list[str]:
    """The args a resume template stands for.

    The template is split shell-style first and the placeholders filled per argument, so a path with
    spaces stays one argument. Only `{checkpoint}` and `{step}` are allowed; any other brace is an
    InvalidResumeTemplate (a typo such as `{ckpt}` must not reach the trainer as a literal).
    """
    problems = _template_problems(template)
    if problems:
        raise InvalidResumeTemplate(
            problems[0], f"{ANN_RESUME_ARGS} 模板无效：只允许 {{checkpoint}} 与 {{step}} 占位符（{problems[0]}）"
        )
    if step is None and "{step}" in template:
        msg = f"{ANN_RESUME_ARGS} uses {{step}} but the checkpoint {checkpoint} has no known step"
        raise InvalidResumeTemplate(msg, f"{ANN_RESUME_ARGS} 使用了 {{step}}，但检查点 {checkpoint} 的步数未知")
    values = {"checkpoint": checkpoint, "step": "" if step is None else str(step)}
    return [_PLACEHOLDER.sub(lambda m: values[m.group(1)], token) for token in shlex.split(template)]


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


# -- the recreation --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Recreation:
    """What build_recreation produced: the body to create and what was changed in it."""

    kind: WorkloadKind
    body: dict[str, Any]
    excluded_nodes: list[str]
    resume_args: list[str] | None
    memory_changes: list[MemoryChange] = field(default_factory=list)


def recreate_body(
    obj: Mapping[str, Any],
    *,
    incident_id: str,
    checkpoint: CheckpointRef | None,
    exclude_nodes: Sequence[str],
    now: float | None = None,
    memory_factor: float | None = None,
    memory_cap_bytes: int | None = None,
) -> dict[str, Any]:
    """The body that recreates `obj` (see build_recreation, which also says what changed)."""
    return build_recreation(
        obj,
        incident_id=incident_id,
        checkpoint=checkpoint,
        exclude_nodes=exclude_nodes,
        now=now,
        memory_factor=memory_factor,
        memory_cap_bytes=memory_cap_bytes,
    ).body


def build_recreation(
    obj: Mapping[str, Any],
    *,
    incident_id: str,
    checkpoint: CheckpointRef | None,
    exclude_nodes: Sequence[str],
    now: float | None = None,
    memory_factor: float | None = None,
    memory_cap_bytes: int | None = None,
) -> Recreation:
    """Build the body that recreates the live workload `obj`, resuming from `checkpoint`, off `exclude_nodes`.

    `checkpoint.path` must be the path as the pods see it (map a prefix before calling when the
    brain mounts the checkpoint volume elsewhere). With `checkpoint` None (no complete checkpoint)
    the containers are left as they were (env, args: an earlier resume point stays), the nodes are
    still excluded and the lineage records checkpoint null. `exclude_nodes` are node names, matched
    through the `kubernetes.io/hostname` label, which equals the node name on kubelet defaults.

    Resume args go to `args`: Kubernetes passes args after `command` (or the image ENTRYPOINT) and
    they replace the image CMD, so appending to args (creating it when only `command` is set) is
    what extends the trainer's command line. A container with neither command nor args gets args
    that replace its image CMD: resume-args suits images whose ENTRYPOINT is the trainer; others
    read the env instead.

    Tolerations are left as they are (none is added for trainmedic's taint): the required affinity
    keeps the pods off the excluded nodes whatever they tolerate.
    """
    kind = workload_kind(obj)
    src = _plain(obj, "object", 0)
    meta = _mapping(src.get("metadata"), "metadata")
    name = _name(src)
    if not isinstance(incident_id, str) or not incident_id.strip():
        raise ValueError("incident_id must be a non-empty string")
    spec_decl = resume_spec(src)
    if spec_decl.opt_out:
        raise OptedOut(
            f"{kind} {meta.get('namespace', '')}/{name} opted out of remediation ({ANN_REMEDIATE})",
            f"{kind} {meta.get('namespace', '')}/{name} 已声明不接受自动修复（{ANN_REMEDIATE}）",
        )
    _refuse_foreign_controller(src, kind)
    if (memory_factor is None) != (memory_cap_bytes is None):
        raise ValueError("memory_factor and memory_cap_bytes go together")
    new_nodes = _node_names(exclude_nodes)
    t = time.time() if now is None else now

    annotations = dict(_annotations(src))
    body: dict[str, Any] = {
        "apiVersion": kind.api_version,
        "kind": kind.kind,
        "metadata": _identity(meta, kind, name),
        "spec": _mapping(src.get("spec"), "spec"),
    }
    manual = kind is JOB and body["spec"].get("manualSelector") is True
    if kind is JOB and not manual:
        body["spec"].pop("selector", None)
    templates = pod_templates_by_path(body)
    for tmpl in templates.values():
        tmeta = tmpl.get("metadata")
        if isinstance(tmeta, dict):
            tmeta.pop("creationTimestamp", None)
            labels = tmeta.get("labels")
            if kind is JOB and not manual and isinstance(labels, dict):
                for key in (*_JOB_UID_LABELS, *_JOB_NAME_LABELS):
                    labels.pop(key, None)
                if not labels:
                    tmeta.pop("labels")
            if not tmeta:
                tmpl.pop("metadata")

    previous_nodes = set(excluded_nodes(src))
    all_nodes = sorted(previous_nodes | set(new_nodes))
    if all_nodes:
        for path, tmpl in templates.items():
            _exclude(tmpl["spec"], all_nodes, previous_nodes, path)

    resume_args: list[str] | None = None
    if checkpoint is not None:
        resume_args = _apply_resume(body, spec_decl, checkpoint, annotations)
        annotations[ANN_RESUMED_FROM] = checkpoint.path

    memory_changes: list[MemoryChange] = []
    if memory_factor is not None and memory_cap_bytes is not None:
        memory_changes = raise_memory(body, factor=memory_factor, cap_bytes=memory_cap_bytes)

    history = lineage(src)
    restarts = _int_or_none(annotations.get(ANN_RESTARTS))
    before = restarts if restarts is not None else len(history)
    entry: dict[str, Any] = {
        "uid": meta.get("uid"),
        "incident": incident_id,
        "time": rfc3339(t),
        "checkpoint": None if checkpoint is None else checkpoint.path,
        "step": None if checkpoint is None else checkpoint.step,
        "excluded_nodes": new_nodes,
    }
    if memory_factor is not None:
        entry["memory"] = [c.as_dict() for c in memory_changes if c.changed]
    history = [*history, entry][-LINEAGE_LIMIT:]
    annotations[ANN_INCIDENT] = incident_id
    annotations[ANN_LINEAGE] = json.dumps(history, separators=(",", ":"), ensure_ascii=False)
    annotations[ANN_RESTARTS] = str(before + 1)
    if all_nodes:
        annotations[ANN_EXCLUDED_NODES] = ",".join(all_nodes)
    body["metadata"]["annotations"] = annotations
    return Recreation(kind, body, all_nodes, resume_args, memory_changes)


def _identity(meta: Mapping[str, Any], kind: WorkloadKind, name: str) -> dict[str, Any]:
    """The metadata a create may carry: name, namespace, labels, annotations (set later) and owner
    references that do not control the workload (kept: garbage collection still applies)."""
    out: dict[str, Any] = {"name": name}
    namespace = meta.get("namespace")
    if isinstance(namespace, str) and namespace:
        out["namespace"] = namespace
    labels = dict(_mapping(meta.get("labels"), "metadata.labels"))
    if kind is JOB:
        # Copied by the API server from the template's generated labels: the old uid, the name.
        uid = meta.get("uid")
        for key in _JOB_UID_LABELS:
            if uid is not None and labels.get(key) == uid:
                labels.pop(key)
        for key in _JOB_NAME_LABELS:
            if labels.get(key) == name:
                labels.pop(key)
    if labels:
        out["labels"] = labels
    owners = meta.get("ownerReferences") or []
    if isinstance(owners, list):
        kept = [o for o in owners if isinstance(o, dict) and o.get("controller") is not True]
        if kept:
            out["ownerReferences"] = kept
    return out


def _refuse_foreign_controller(obj: Mapping[str, Any], kind: WorkloadKind) -> None:
    meta = _mapping(obj.get("metadata"), "metadata")
    for owner in meta.get("ownerReferences") or []:
        if isinstance(owner, dict) and owner.get("controller") is True:
            who = f"{owner.get('kind', '?')} {owner.get('name', '?')}"
            raise UnsupportedWorkload(
                f"{kind} {meta.get('namespace', '')}/{meta.get('name')} is controlled by {who}; recreating it "
                "would fight that controller (restart the owner instead)",
                f"{kind} {meta.get('namespace', '')}/{meta.get('name')} 由 {who} 控制；重建会与该控制器冲突"
                "（请重启其所有者）",
            )


def _exclude(pod_spec: dict[str, Any], nodes: list[str], previous: set[str], path: str) -> None:
    """Add `hostname NotIn nodes` to every required nodeSelectorTerm, replacing the one added before."""
    where = path + ".spec.affinity"
    affinity = _child(pod_spec, "affinity", path + ".spec")
    node_affinity = _child(affinity, "nodeAffinity", where)
    required = _child(node_affinity, "requiredDuringSchedulingIgnoredDuringExecution", where + ".nodeAffinity")
    terms = required.get("nodeSelectorTerms")
    ours = {"key": HOSTNAME_LABEL, "operator": "NotIn", "values": list(nodes)}
    if not terms:
        required["nodeSelectorTerms"] = [{"matchExpressions": [ours]}]
        return
    if not isinstance(terms, list):
        raise MalformedWorkload(f"{where}: nodeSelectorTerms is not a list", f"{where}：nodeSelectorTerms 不是列表")
    for i, term in enumerate(terms):
        if term is None:
            continue
        if not isinstance(term, dict):
            raise MalformedWorkload(
                f"{where}: nodeSelectorTerms[{i}] is not an object", f"{where}：nodeSelectorTerms[{i}] 不是对象"
            )
        exprs = term.get("matchExpressions") or []
        if not exprs and not term.get("matchFields"):
            continue  # an empty term matches no node; adding to it would widen the placement
        if not isinstance(exprs, list):
            raise MalformedWorkload(
                f"{where}: nodeSelectorTerms[{i}].matchExpressions is not a list",
                f"{where}：nodeSelectorTerms[{i}].matchExpressions 不是列表",
            )
        term["matchExpressions"] = [e for e in exprs if not _is_ours(e, previous)] + [dict(ours)]


def _is_ours(expr: Any, previous: set[str]) -> bool:
    """An expression an earlier recreation added: hostname NotIn a subset of what it excluded."""
    if not isinstance(expr, dict) or expr.get("key") != HOSTNAME_LABEL or expr.get("operator") != "NotIn":
        return False
    values = expr.get("values")
    return isinstance(values, list) and bool(values) and {str(v) for v in values} <= previous


def _apply_resume(
    body: dict[str, Any], decl: ResumeSpec, checkpoint: CheckpointRef, annotations: dict[str, str]
) -> list[str] | None:
    """Point the selected containers at the checkpoint (env, and args when a template is declared)."""
    path, step = checkpoint.path, checkpoint.step
    if not isinstance(path, str) or not path:
        raise ValueError("checkpoint.path must be a non-empty string")
    if step is not None and (isinstance(step, bool) or not isinstance(step, int)):
        raise ValueError(f"checkpoint.step must be an int or None, got {step!r}")
    bad_env = _env_problem(decl.env)
    if bad_env is not None:
        raise InvalidResumeConfig(bad_env, f"{ANN_RESUME_ENV} 无效：{bad_env}")
    rendered = render_resume_args(decl.args, path, step) if decl.args is not None else None
    applied_before = _applied_args(annotations.get(ANN_RESUME_ARGS_APPLIED))
    applied: dict[str, list[str]] = {}
    for tpath, cname, field_name, c in _select(body, decl.containers, None):
        env = c.get("env") or []
        if not isinstance(env, list):
            raise MalformedWorkload(
                f"{tpath}.spec.{field_name}[{cname}].env is not a list",
                f"{tpath}.spec.{field_name}[{cname}].env 不是列表",
            )
        env = _set_env(env, decl.env, path)
        env = _set_env(env, RESUME_STEP_ENV, None if step is None else str(step))
        c["env"] = env
        key = f"{tpath}.spec.{field_name}[{cname}]"
        args = c.get("args") or []
        if not isinstance(args, list):
            raise MalformedWorkload(f"{key}.args is not a list", f"{key}.args 不是列表")
        args = _remove_run(list(args), applied_before.get(key))
        if rendered:
            args += rendered
            applied[key] = list(rendered)
        if args:
            c["args"] = args
        else:
            c.pop("args", None)
    if applied:
        annotations[ANN_RESUME_ARGS_APPLIED] = json.dumps(applied, separators=(",", ":"), ensure_ascii=False)
    else:
        annotations.pop(ANN_RESUME_ARGS_APPLIED, None)
    return rendered


def _set_env(env: list[Any], name: str, value: str | None) -> list[Any]:
    """Set NAME=value in place of the first entry of that name (value or valueFrom), dropping the
    others; appended when absent; value None removes it."""
    out: list[Any] = []
    placed = value is None
    for e in env:
        if isinstance(e, dict) and e.get("name") == name:
            if not placed:
                out.append({"name": name, "value": value})
                placed = True
            continue
        out.append(e)
    if not placed:
        out.append({"name": name, "value": value})
    return out


def _remove_run(args: list[Any], run: list[str] | None) -> list[Any]:
    """Remove the last occurrence of `run` (the args appended by the previous recreation)."""
    if not run or len(run) > len(args):
        return args
    for start in range(len(args) - len(run), -1, -1):
        if args[start : start + len(run)] == run:
            return args[:start] + args[start + len(run) :]
    return args


def _applied_args(raw: str | None) -> dict[str, list[str]]:
    if not raw:
        return {}
    try:
        data = json.loads(raw)
    except ValueError:
        return {}
    if not isinstance(data, dict):
        return {}
    return {
        str(k): [str(a) for a in v]
        for k, v in data.items()
        if isinstance(v, list) and all(isinstance(a, str) for a in v)
    }


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
