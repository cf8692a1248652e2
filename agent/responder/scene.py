"""The scene, `SceneMixin` of Responder (core.py): the evidence saved before anything is changed
(`_save_scene`: logs, events, objects, nodes, kernel lines, metrics, checkpoint listing, stacks for a
hang; remediations/scene/ writes the bundle), the `trainmedic.io/scene` finalizer that keeps a job's
pods until it is saved (`_protect`, `_unprotect`), and `_SceneSource`, what the scene collector and
the dump_stacks action read over KubeOps and the agent's metrics.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from trainmedic.agent.responder.settings import MetricsRange, ResponderSettings
from trainmedic.agent.store import Incident, IncidentStore
from trainmedic.events import DiagnosisEvent, JobRef
from trainmedic.models import RootCause
from trainmedic.remediations import checkpoints as ckpt
from trainmedic.remediations.kube import KubeError, KubeOps
from trainmedic.remediations.scene import SceneInputs, SceneSettings, save_scene
from trainmedic.remediations.stacks import ExecResult, StackSource, exec_in_pod

log = logging.getLogger("trainmedic.responder")

SCENE_FINALIZER = "trainmedic.io/scene"


class SceneMixin:
    """The scene and the pods kept for it. Responder inherits it; what it uses of the other parts is
    declared below for the type checker only, which checks Responder's own definitions against these
    declarations."""

    if TYPE_CHECKING:
        kube: KubeOps
        store: IncidentStore
        settings: ResponderSettings
        kernel_tail: Mapping[str, Sequence[tuple[float, str]]]
        metrics_range: MetricsRange | None
        clock: Callable[[], float]
        _stack_source: StackSource | None

        async def _workload(self, job: JobRef) -> dict[str, Any] | None: ...

        async def _pods(self, job: JobRef, workload: Mapping[str, Any] | None) -> list[dict[str, Any]]: ...

        async def checkpoints_of(self, workload: Mapping[str, Any], incident_id: str) -> list[ckpt.Checkpoint]: ...

    # -- scene ------------------------------------------------------------------------------------------

    async def _save_scene(
        self,
        incident: Incident,
        d: DiagnosisEvent,
        rc: RootCause,
        workload: dict[str, Any] | None,
        pods: list[dict[str, Any]],
    ) -> None:
        node_names = {str(p.get("spec", {}).get("nodeName")) for p in pods if p.get("spec", {}).get("nodeName")}
        if rc.node:
            node_names.add(rc.node)
        nodes = []
        for n in sorted(node_names):
            with contextlib.suppress(KubeError):
                obj = await self.kube.get_node(n)
                if obj is not None:
                    nodes.append(obj)
        listing: list[dict[str, Any]] = []
        if workload is not None:
            listing = ckpt.describe(await self.checkpoints_of(workload, incident.id))
        kernel = {n: list(self.kernel_tail.get(n, ())) for n in node_names}
        inputs = SceneInputs(
            incident_id=incident.id,
            diagnosis=d,
            workload=workload,
            pods=pods,
            nodes=nodes,
            kernel_lines=kernel,
            checkpoints=listing,
            hang=rc.fault_class.value == "hang",
            now=self.clock(),
        )
        settings = SceneSettings(
            log_lines=self.settings.log_lines,
            stacks=self.settings.stacks,
            stack_timeout_s=self.settings.stack_timeout_s,
            metrics_window_s=self.settings.metrics_window_s,
            metrics_after_s=self.settings.metrics_after_s,
            metrics_step_s=self.settings.metrics_step_s,
        )
        result = await save_scene(self.settings.scene_dir, inputs, _SceneSource(self), settings)
        await asyncio.to_thread(
            self.store.set_scene,
            incident.id,
            str(result.dir),
            {"files": len(result.manifest.get("files", [])), "problems": len(result.manifest.get("problems", []))},
        )

    # -- pods kept until the scene is saved ------------------------------------------------------------

    async def _protect(self, job: JobRef) -> None:
        for p in await self._pods(job, await self._workload(job)):
            meta = p.get("metadata") or {}
            try:
                await self.kube.add_pod_finalizer(meta.get("namespace", job.namespace), meta["name"], SCENE_FINALIZER)
            except KubeError as e:
                log.warning("cannot keep pod %s for the scene: %s", meta.get("name"), e)

    async def _unprotect(self, job: JobRef, pods: list[dict[str, Any]] | None = None) -> None:
        """Remove our finalizer from every pod of the job that carries it (read from the pods, not
        remembered: an agent that restarted between the two still releases them)."""
        if pods is None:
            pods = await self._pods(job, await self._workload(job))
        for p in pods:
            meta = p.get("metadata") or {}
            if SCENE_FINALIZER not in (meta.get("finalizers") or []):
                continue
            ns = meta.get("namespace", job.namespace)
            try:
                await self.kube.remove_pod_finalizer(ns, meta["name"], SCENE_FINALIZER)
            except KubeError as e:
                log.warning("cannot release pod %s/%s (finalizer %s): %s", ns, meta["name"], SCENE_FINALIZER, e)

    # -- the stack source of the dump_stacks action --

    @property
    def stack_source(self) -> StackSource:
        return self._stack_source or _SceneSource(self)


class _SceneSource:
    """What the scene collector reads, over KubeOps and the agent's metrics."""

    def __init__(self, responder: SceneMixin) -> None:
        self._r = responder

    async def pod_log(
        self,
        namespace: str,
        pod: str,
        container: str,
        *,
        tail_lines: int,
        previous: bool = False,
        limit_bytes: int = 8 << 20,
    ) -> str:
        return await self._r.kube.pod_log(
            namespace, pod, container, tail_lines=tail_lines, previous=previous, limit_bytes=limit_bytes
        )

    async def list_events(self, namespace: str, *, involved: set[tuple[str, str]]) -> list[dict[str, Any]]:
        return await self._r.kube.list_events(namespace, involved=involved)

    async def metrics_range(
        self, node: str, start: float, end: float, step: float
    ) -> Mapping[str, list[tuple[float, float]]] | None:
        if self._r.metrics_range is None:
            return None
        return await self._r.metrics_range(node, start, end, step)

    async def exec(
        self, namespace: str, pod: str, container: str, command: list[str], *, timeout_s: float
    ) -> ExecResult:
        return await exec_in_pod(self._r.kube.api, namespace, pod, container, command, timeout_s=timeout_s)
