"""`trainmedic scan`: the training workloads that failed or are restarting, the failing training pods no
workload owns, and the nodes with problems, each with its diagnosis or reason.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from typing import Any

from trainmedic.agent.jobinputs import workload_phase
from trainmedic.agent.live.access import _RESTARTING, _STANDARD_BAD, _UNREACHABLE, JSON, LiveError
from trainmedic.agent.live.reader import JobScene, Reader, _bounded, _pod_name, _str
from trainmedic.agent.watchers.k8s import is_accelerator_resource, node_status
from trainmedic.detectors.engine import Engine
from trainmedic.models import Diagnosis
from trainmedic.remediations.kube import ANN_QUARANTINE_REASON, TAINT_KEY, KubeError, KubeForbidden


def unhealthy_workload(obj: Mapping[str, Any]) -> str | None:
    """Why a workload is listed by `scan` ("Failed", "Restarting", "BackoffLimitExceeded"), or None."""
    w = workload_phase(obj)
    if w.phase == "Failed":
        return f"Failed{f' ({w.reason})' if w.reason else ''}"
    if w.phase in _RESTARTING:
        return w.phase
    status = obj.get("status") or {}
    if obj.get("kind") == "Job" and str(obj.get("apiVersion")) == "batch/v1" and int(status.get("failed") or 0) > 0:
        return f"Restarting ({int(status['failed'])} failed pods)"
    return None


def node_problems(obj: Mapping[str, Any], lang: str = "en") -> list[str]:
    """What is wrong with a node: Ready not True, an unreachable / not-ready taint, trainmedic's
    quarantine (with its reason), a pressure condition, any other condition (an accelerator's, a
    node-problem-detector's) that is True."""
    n = node_status(obj)
    out: list[str] = []
    ready = n.conditions.get("Ready")
    if ready is not None and ready != "True":
        reason = n.reasons.get("Ready")
        word = "未就绪" if lang == "zh" else "NotReady"
        out.append(f"{word} (Ready={ready}{f', {reason}' if reason else ''})")
    for t in n.taints:
        key = t.split("=", 1)[0].split(":", 1)[0]
        if key in _UNREACHABLE:
            out.append(f"{'污点' if lang == 'zh' else 'taint'} {t}")
        elif key == TAINT_KEY:
            why = ((obj.get("metadata") or {}).get("annotations") or {}).get(ANN_QUARANTINE_REASON)
            word = "已被 trainmedic 隔离" if lang == "zh" else "quarantined by trainmedic"
            out.append(f"{word}{f': {why}' if why else ''}")
    for c in (obj.get("status") or {}).get("conditions") or ():
        if not isinstance(c, Mapping):
            continue
        ctype, status = str(c.get("type") or ""), str(c.get("status") or "")
        if ctype == "Ready":
            continue
        bad = _STANDARD_BAD.get(ctype, "True")
        if status == bad:
            detail = _str(c.get("reason")) or ""
            message = (_str(c.get("message")) or "").splitlines()[0][:160] if _str(c.get("message")) else ""
            out.append(
                f"{ctype}={status}" + (f" ({detail}: {message})" if message else f" ({detail})" if detail else "")
            )
    return out


# Owners whose pods `scan` sees through the workload (PyTorchJob, MPIJob, batch/v1 or Volcano Job).
_WORKLOAD_OWNER_KINDS = frozenset({"Job", "PyTorchJob", "MPIJob"})
# Env a distributed-training launcher sets in every worker (torchrun, the Kubeflow and Volcano
# operators, MPI and HCCL launchers): a pod that carries them runs a training process.
_TRAINING_ENV = frozenset({"WORLD_SIZE", "MASTER_ADDR", "RANK_TABLE_FILE", "OMPI_COMM_WORLD_SIZE"})


def _containers(pod: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    spec = pod.get("spec") or {}
    return [c for c in [*(spec.get("initContainers") or ()), *(spec.get("containers") or ())] if isinstance(c, Mapping)]


def training_pod(pod: Mapping[str, Any], plugin_resources: Mapping[str, str] | None = None) -> bool:
    """A pod that requests an accelerator (a device plugin's resource in requests or limits), or
    whose containers carry a distributed-training launcher's env (WORLD_SIZE, MASTER_ADDR, ...)."""
    for c in _containers(pod):
        resources = c.get("resources") or {}
        for key in ("requests", "limits"):
            if any(is_accelerator_resource(str(r), plugin_resources) for r in resources.get(key) or {}):
                return True
        if any(isinstance(e, Mapping) and e.get("name") in _TRAINING_ENV for e in c.get("env") or ()):
            return True
    return False


def pod_trouble(pod: Mapping[str, Any]) -> str | None:
    """Why `scan` lists a pod: it Failed, a container is in CrashLoopBackOff, or a container restarted
    after a failure (its last run ended with a non-zero exit code); None otherwise."""
    status = pod.get("status") or {}
    statuses = [
        cs
        for cs in [*(status.get("initContainerStatuses") or ()), *(status.get("containerStatuses") or ())]
        if isinstance(cs, Mapping)
    ]
    restarts = sum(int(cs.get("restartCount") or 0) for cs in statuses)
    if status.get("phase") == "Failed":
        reason = _str(status.get("reason"))
        for cs in statuses:
            term = (cs.get("state") or {}).get("terminated") or {}
            if int(term.get("exitCode") or 0) != 0:
                reason = reason or f"{term.get('reason') or 'Error'}, exit code {int(term['exitCode'])}"
                break
        return f"Failed{f' ({reason})' if reason else ''}"
    for cs in statuses:
        waiting = (cs.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") == "CrashLoopBackOff":
            return f"CrashLoopBackOff ({_restarts(restarts)})" if restarts else "CrashLoopBackOff"
    for cs in statuses:
        last = (cs.get("lastState") or {}).get("terminated") or {}
        if int(cs.get("restartCount") or 0) > 0 and int(last.get("exitCode") or 0) != 0:
            return f"Restarting ({_restarts(restarts)}, last exit code {int(last['exitCode'])})"
    return None


def _restarts(n: int) -> str:
    return f"{n} restart{'' if n == 1 else 's'}"


def _controller(pod: Mapping[str, Any]) -> Mapping[str, Any] | None:
    owners = [o for o in (pod.get("metadata") or {}).get("ownerReferences") or () if isinstance(o, Mapping)]
    return next((o for o in owners if o.get("controller") is True), owners[0] if owners else None)


def loose_training_pods(pods: Iterable[JSON], plugin_resources: Mapping[str, str] | None = None) -> list[JSON]:
    """The failing training pods (`training_pod` and `pod_trouble`) that no training workload owns
    (bare pods, or pods of a ReplicaSet, StatefulSet, RayJob, ...), one entry per owner: kind,
    api_version, namespace, name (the owner's, or the pod's when it has none), state, and the pods."""
    groups: dict[tuple[str, str, str], JSON] = {}
    for pod in pods:
        owner = _controller(pod)
        if owner is not None and owner.get("kind") in _WORKLOAD_OWNER_KINDS:
            continue
        trouble = pod_trouble(pod)
        if trouble is None or not training_pod(pod, plugin_resources):
            continue
        meta = pod.get("metadata") or {}
        ns = str(meta.get("namespace") or "default")
        if owner is None:
            kind, api_version, name = "Pod", "v1", _pod_name(pod)
        else:
            kind, api_version, name = str(owner.get("kind")), str(owner.get("apiVersion")), str(owner.get("name"))
        entry = groups.setdefault(
            (ns, kind, name),
            {"kind": kind, "api_version": api_version, "namespace": ns, "name": name, "state": trouble, "pods": []},
        )
        entry["pods"].append(pod)
    return list(groups.values())


def one_line(diagnosis: Diagnosis, lang: str) -> str:
    """A diagnosis in one line: the fault class and the root cause's summary (which names the place)."""
    rc = diagnosis.root_cause
    if rc is None:
        return "未发现已知故障" if lang == "zh" else "no known fault found"
    return f"{rc.fault_class.value}: {rc.summary.get(lang)}"


async def scan(reader: Reader, namespace: str | None, engine: Engine, lang: str) -> JSON:
    """`trainmedic scan`: the unhealthy workloads (each diagnosed as `diagnose --job` would) and nodes."""
    workloads = [w for w in await reader.workloads(namespace) if unhealthy_workload(w) is not None]
    nodes: list[JSON] = []
    skipped = reader.skipped
    try:
        nodes = await reader.ops.list_nodes()
    except KubeForbidden as exc:
        skipped.append(f"nodes ({exc.need}, {exc.scope})")
    loose: list[JSON] = []
    try:
        loose = loose_training_pods(await reader.ops.list_all_pods(namespace))
    except KubeForbidden as exc:
        skipped.append(f"pods ({exc.need}, {exc.scope})")

    async def diagnose_pods(group: JSON) -> JSON:
        pods: list[JSON] = group.pop("pods")
        entry: JSON = dict(group, phase=str((pods[0].get("status") or {}).get("phase") or "Unknown"))
        job = JobScene(group["namespace"], group["name"], group["kind"], None, pods, settings=reader.scene_settings())
        try:
            await reader.fill(job)
        except KubeError as exc:
            entry.update(pods=len(pods), root_cause=None, summary=str(exc).splitlines()[0])
            return entry
        skipped.extend(s for s in job.skipped if s not in skipped)
        d = job.diagnose(engine)
        entry.update(
            pods=len(pods),
            root_cause=d.root_cause.contract_dict(lang) if d.root_cause else None,
            summary=one_line(d, lang),
        )
        return entry

    async def diagnose_one(obj: JSON) -> JSON:
        meta = obj.get("metadata") or {}
        ns, name = str(meta.get("namespace") or "default"), str(meta.get("name") or "?")
        w = workload_phase(obj)
        entry: JSON = {
            "kind": str(obj.get("kind")),
            "api_version": str(obj.get("apiVersion")),
            "namespace": ns,
            "name": name,
            "phase": w.phase,
            "state": unhealthy_workload(obj),
        }
        try:
            job = await reader.job(ns, name)
        except (KubeError, LiveError) as exc:
            entry.update(pods=None, root_cause=None, summary=str(exc).splitlines()[0])
            return entry
        skipped.extend(s for s in job.skipped if s not in skipped)
        d = job.diagnose(engine)
        entry.update(
            pods=len(job.pods),
            root_cause=d.root_cause.contract_dict(lang) if d.root_cause else None,
            summary=one_line(d, lang),
        )
        return entry

    # Each job's own reads are bounded by the reader's semaphore; a few jobs at once.
    job_sem = asyncio.Semaphore(4)
    entries = await asyncio.gather(
        *(_bounded(job_sem, diagnose_one(w)) for w in workloads),
        *(_bounded(job_sem, diagnose_pods(g)) for g in loose),
    )
    bad_nodes = []
    for obj in nodes:
        problems = node_problems(obj, lang)
        if problems:
            name = str((obj.get("metadata") or {}).get("name"))
            bad_nodes.append({"node": name, "problems": problems, "summary": "; ".join(problems)})
    return {
        "workloads": sorted(entries, key=lambda e: (e["namespace"], e["name"], e["kind"])),
        "nodes": sorted(bad_nodes, key=lambda n: n["node"]),
        "skipped": skipped,
    }
