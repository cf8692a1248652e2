"""`Controllers`: what the job controllers do in the emulated cluster (pods created for a workload,
scheduled on a node that fits or left Pending with the scheduler's reason, a run started).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

from trainmedic.agent.demo.emulator import JOB, NODE, VOLCANO_JOB, Cluster, KubeApiError, rfc3339
from trainmedic.agent.demo.training.checkpoints import _WORKLOADS, ACCELERATORS
from trainmedic.agent.demo.training.run import Incarnation, RankPod, TrainingRun, World, _processes
from trainmedic.agent.jobindex import rank_of

log = logging.getLogger("trainmedic.demo")


# -- controllers, scheduler, kubelet, garbage collector ------------------------------------------------


def _requests(template_spec: Mapping[str, Any]) -> dict[str, int]:
    out: dict[str, int] = {}
    for c in template_spec.get("containers") or []:
        res = (c.get("resources") or {}) if isinstance(c, dict) else {}
        limits = {**(res.get("requests") or {}), **(res.get("limits") or {})}
        for name in ACCELERATORS:
            if name in limits:
                out[name] = out.get(name, 0) + int(str(limits[name]))
    return out


def _tolerated(taint: Mapping[str, Any], tolerations: Iterable[Mapping[str, Any]]) -> bool:
    for t in tolerations:
        if t.get("effect") not in (None, "", taint.get("effect")):
            continue
        if t.get("operator") == "Exists" and (not t.get("key") or t.get("key") == taint.get("key")):
            return True
        if t.get("key") == taint.get("key") and str(t.get("value") or "") == str(taint.get("value") or ""):
            return True
    return False


def _expr_ok(expr: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    key, op, values = expr.get("key"), expr.get("operator"), [str(v) for v in expr.get("values") or []]
    value = labels.get(str(key))
    if op == "In":
        return value is not None and value in values
    if op == "NotIn":
        return value is None or value not in values
    if op == "Exists":
        return value is not None
    if op == "DoesNotExist":
        return value is None
    return False


def _affinity_ok(pod_spec: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    selector = pod_spec.get("nodeSelector") or {}
    if any(labels.get(k) != v for k, v in selector.items()):
        return False
    required = ((pod_spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    terms = required.get("nodeSelectorTerms") or []
    if not terms:
        return True
    return any(all(_expr_ok(e, labels) for e in (term.get("matchExpressions") or [])) for term in terms)


def unschedulable_reason(node: Mapping[str, Any], pod_spec: Mapping[str, Any], needs: Mapping[str, int]) -> str | None:
    """Why the scheduler would not put this pod on this node (None: it fits), in its own words."""
    spec, status = node.get("spec") or {}, node.get("status") or {}
    labels = (node.get("metadata") or {}).get("labels") or {}
    tolerations = pod_spec.get("tolerations") or []
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
    if not ready:
        return "node(s) were not ready"
    if spec.get("unschedulable") and not _tolerated(
        {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}, tolerations
    ):
        return "node(s) were unschedulable"
    for taint in spec.get("taints") or []:
        if taint.get("effect") in ("NoSchedule", "NoExecute") and not _tolerated(taint, tolerations):
            return f"node(s) had untolerated taint {{{taint.get('key')}: {taint.get('value') or ''}}}"
    if not _affinity_ok(pod_spec, labels):
        return "node(s) didn't match Pod's node affinity/selector"
    allocatable = status.get("allocatable") or {}
    for name, n in needs.items():
        if int(str(allocatable.get(name, "0"))) < n:
            return f"Insufficient {name}"
    return None


class Controllers:
    """The workload controllers, scheduler, kubelet and garbage collector of the demo's cluster."""

    def __init__(self, cluster: Cluster, world: World, *, poll_s: float = 0.05) -> None:
        self.cluster = cluster
        self.world = world
        self.poll_s = poll_s
        self.incarnations: dict[str, Incarnation] = {}
        self.history: list[Incarnation] = []

    def current(self, name: str) -> Incarnation | None:
        """The live incarnation of the workload called `name`."""
        return next((i for i in self.incarnations.values() if i.name == name), None)

    async def run(self, stop: asyncio.Event) -> None:
        try:
            while not stop.is_set():
                try:
                    await self.sync()
                except KubeApiError as e:  # the emulator refused one request: try again next round
                    log.warning("demo controllers: %s", e)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.poll_s):
                        await stop.wait()
        finally:
            for inc in list(self.incarnations.values()):
                await self._stop_run(inc)

    async def sync(self) -> None:
        kube = self.cluster.kube
        # kmock walks its whole request record on every request: keep it short (nothing reads it here).
        kube.forget_requests()
        live: dict[str, tuple[str, dict[str, Any]]] = {}
        for res in _WORKLOADS:
            for seen in kube.objects(res):
                meta = seen["metadata"]
                obj = seen
                if not meta.get("uid"):
                    # What the API server stamps on every object it creates (kmock leaves it out).
                    stamp = {"metadata": {"uid": str(uuid.uuid4()), "creationTimestamp": rfc3339()}}
                    kube.store_patch(res, meta.get("namespace"), meta["name"], stamp)
                    obj = next(o for o in kube.objects(res) if o["metadata"]["name"] == meta["name"])
                live[str(obj["metadata"]["uid"])] = (res, obj)
        for uid in [u for u in self.incarnations if u not in live]:
            await self._collect(self.incarnations.pop(uid))
        for uid, (res, obj) in live.items():
            inc = self.incarnations.get(uid)
            if inc is None:
                meta = obj["metadata"]
                inc = Incarnation(res, meta["namespace"], meta["name"], uid, obj, time.time())
                self.incarnations[uid] = inc
                self.history.append(inc)
                await self._create_pods(inc)
            if inc.scheduled_at is None:
                await self._schedule(inc)
            await self._job_status(inc)

    async def _create_pods(self, inc: Incarnation) -> None:
        if inc.resource == JOB:
            pods = await self.cluster.create_job_pods(inc.workload, from_template=True)
        else:
            pods = await self.cluster.create_volcano_pods(inc.workload, from_template=True)
            # The status goes through the subresource (the API server drops one sent with the create).
            with contextlib.suppress(KubeApiError):
                await self.cluster.set_volcano_phase(inc.workload, "Pending", pending=len(pods))
        inc.pods = [RankPod(p, None, rank_of(p) or 0) for p in pods]
        self.world.emit("created", inc, pods=[p.name for p in inc.pods])

    async def _schedule(self, inc: Incarnation) -> None:
        """Gang scheduling: every pod on its own node, or none (and a FailedScheduling event)."""
        nodes = sorted(self.cluster.kube.objects(NODE), key=lambda n: str(n["metadata"]["name"]))
        busy = {n for other in self.incarnations.values() if other is not inc for n in other.nodes}
        chosen: list[str] = []
        reasons: dict[str, int] = {}
        for rp in inc.pods:
            needs = _requests(rp.pod["spec"])
            pick = None
            for node in nodes:
                name = str(node["metadata"]["name"])
                if name in chosen:
                    continue
                why = (
                    "node(s) were fully allocated"
                    if name in busy
                    else unschedulable_reason(node, rp.pod["spec"], needs)
                )
                if why is None:
                    pick = name
                    break
                reasons[why] = reasons.get(why, 0) + 1
            if pick is None:
                text = ", ".join(f"{n} {why}" for why, n in sorted(reasons.items()))
                message = f"0/{len(nodes)} nodes are available: {text}."
                if inc.unschedulable != message:
                    inc.unschedulable = message
                    self.world.emit("unschedulable", inc, message=message)
                    for p in inc.pods:
                        with contextlib.suppress(KeyError, KubeApiError):
                            await self.cluster.pod_event(p.pod, "FailedScheduling", message, type="Warning")
                return
            chosen.append(pick)
        inc.unschedulable = None
        for rp, node_name in zip(inc.pods, chosen, strict=True):
            rp.node = node_name
            await self.cluster.bind(rp.pod, node_name)
            profile = self.world.profiles.get(inc.name)
            self.cluster.set_processes(rp.pod, rp.container, _processes(profile.framework if profile else "hf"))
            await self.cluster.start(rp.pod)
        inc.scheduled_at = time.time()
        if inc.resource == VOLCANO_JOB:
            with contextlib.suppress(KubeApiError):
                await self.cluster.set_volcano_phase(inc.workload, "Running", running=len(inc.pods))
        self.world.emit("scheduled", inc, nodes=list(chosen))
        profile = self.world.profiles.get(inc.name)
        if profile is not None:
            run = TrainingRun(self.cluster, inc, profile, self.world)
            inc.run = run
            inc.task = asyncio.create_task(run.run(), name=f"demo:train:{inc.name}")

    async def _job_status(self, inc: Incarnation) -> None:
        """A failed pod fails the job (backoffLimit 0, Volcano's default policy), as its controller says."""
        if inc.failed_reported or inc.scheduled_at is None:
            return
        failed = [
            p
            for p in inc.pods
            if (st := self.cluster.pods.get((inc.namespace, p.name))) is not None and st.phase == "Failed"
        ]
        if not failed:
            return
        inc.failed_reported = True
        with contextlib.suppress(KubeApiError):
            if inc.resource == JOB:
                await self.cluster.set_job_status(
                    inc.workload,
                    {
                        "failed": len(failed),
                        "conditions": [
                            {
                                "type": "Failed",
                                "status": "True",
                                "reason": "BackoffLimitExceeded",
                                "message": "Job has reached the specified backoff limit",
                                "lastTransitionTime": rfc3339(),
                            }
                        ],
                    },
                )
            else:
                await self.cluster.set_volcano_phase(inc.workload, "Failed", failed=len(failed))

    async def _collect(self, inc: Incarnation) -> None:
        """The workload is gone: its pods go too (the garbage collector), their processes end."""
        await self._stop_run(inc)
        for rp in inc.pods:
            if (inc.namespace, rp.name) in self.cluster.pods:
                with contextlib.suppress(KubeApiError, KeyError):
                    await self.cluster.delete_pod(rp.pod)
        self.world.emit("deleted", inc)

    @staticmethod
    async def _stop_run(inc: Incarnation) -> None:
        if inc.run is not None:
            inc.run.end()
        if inc.task is not None and not inc.task.done():
            inc.task.cancel()
            await asyncio.gather(inc.task, return_exceptions=True)
