"""The replacement of a workload: its body (`build_recreation`, `recreate_body`) with the original's
identity, the excluded nodes, the resume settings applied and nothing another controller owns.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from trainmedic.remediations.workloads.kinds import (
    _JOB_NAME_LABELS,
    _JOB_UID_LABELS,
    ANN_EXCLUDED_NODES,
    ANN_INCIDENT,
    ANN_LINEAGE,
    ANN_REMEDIATE,
    ANN_RESTARTS,
    ANN_RESUME_ARGS_APPLIED,
    ANN_RESUME_ENV,
    ANN_RESUMED_FROM,
    HOSTNAME_LABEL,
    JOB,
    LINEAGE_LIMIT,
    RESUME_STEP_ENV,
    InvalidResumeConfig,
    MalformedWorkload,
    OptedOut,
    UnsupportedWorkload,
    WorkloadKind,
    _annotations,
    _child,
    _int_or_none,
    _mapping,
    _name,
    _node_names,
    _plain,
    workload_kind,
)
from trainmedic.remediations.workloads.resume import (
    CheckpointRef,
    ResumeSpec,
    _env_problem,
    render_resume_args,
    resume_spec,
)
from trainmedic.remediations.workloads.templates import (
    MemoryChange,
    _select,
    excluded_nodes,
    lineage,
    pod_templates_by_path,
    raise_memory,
)
from trainmedic.timefmt import rfc3339

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
