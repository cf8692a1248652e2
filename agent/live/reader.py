"""`Reader`: a workload found by name, its pods, their logs (the current and the previous instance, a
bounded tail), the events and the nodes read into a `JobScene`, which is classified like a scene
bundle and can be saved as one. `with_ops` opens the read-only operations and a `Reader` over them.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainmedic.agent.jobindex import rank_of
from trainmedic.agent.jobinputs import LogKey, job_inputs, workload_phase
from trainmedic.agent.live.access import (
    CONCURRENCY,
    JSON,
    LOG_BYTES,
    TAIL_LINES,
    LiveError,
    ReadOps,
    T,
    _DaemonCalls,
    api_client,
    forbidden,
    kube_failed,
)
from trainmedic.detectors.diagnose import LogInput, diagnose_inputs
from trainmedic.detectors.engine import Engine
from trainmedic.events import DiagnosisEvent, JobRef, WorkloadStatus
from trainmedic.models import Diagnosis, I18nText, Source
from trainmedic.remediations.kube import (
    JOBS,
    MPI_JOBS,
    PYTORCH_JOBS,
    READ_WORKLOADS,
    VOLCANO_JOBS,
    KubeError,
    KubeForbidden,
    KubeNotFound,
)
from trainmedic.remediations.scene import (
    SceneError,
    SceneInputs,
    SceneResult,
    SceneSettings,
    clean_log_text,
    log_rel,
    pod_containers,
    pod_rank,
    redact_object,
    save_scene,
)
from trainmedic.remediations.stacks import ExecResult
from trainmedic.remediations.workloads import job_pod_selector


async def _bounded(sem: asyncio.Semaphore, aw: Awaitable[T]) -> T:
    async with sem:
        return await aw


@dataclass
class JobScene:
    """What was read about one job: the workload (None for a bare owner), its pods, logs, events, nodes."""

    namespace: str
    name: str
    kind: str
    workload: JSON | None
    pods: list[JSON]
    # (pod, container, previous) -> log text
    logs: dict[LogKey, str] = field(default_factory=dict)
    events: list[JSON] = field(default_factory=list)
    nodes: dict[str, JSON] = field(default_factory=dict)
    # What could not be read and was skipped (a node the user may not get), for stderr.
    skipped: list[str] = field(default_factory=list)
    # The bounds of what is kept, as a saved bundle keeps it (`log_lines`: the reader's tail).
    settings: SceneSettings = field(default_factory=SceneSettings)

    def ranks(self) -> dict[str, int]:
        """Each pod's rank as the agent's job index gives it (RANK env, replica or completion index)."""
        return {_pod_name(p): r for p in self.pods if (r := rank_of(p)) is not None}

    def inputs(self) -> list[LogInput]:
        """The texts to classify, as `diagnose --scene` reads them from the bundle `save` writes: the
        objects and logs redacted and bounded as the bundle keeps them, each log named by its file
        there (agent.jobinputs: one assembly, one order, for both)."""
        settings = self.settings
        ranks = self.ranks()
        raw_pods = {_pod_name(p): p for p in self.pods}
        pods = {name: redact_object(p, settings) for name, p in raw_pods.items()}
        logs: list[tuple[LogKey, LogInput]] = []
        for (pod_name, container, previous), text in self.logs.items():
            if previous and not text:
                continue  # a bundle keeps no empty previous log
            raw = raw_pods[pod_name]
            node = _str((raw.get("spec") or {}).get("nodeName"))
            rank = pod_rank(raw, ranks)
            logs.append(
                (
                    (pod_name, container, previous),
                    LogInput(
                        name=log_rel(node, rank, pod_name, container, previous=previous),
                        text=clean_log_text(text, settings),
                        source=Source.CONTAINER_LOG,
                        node=node,
                        pod=pod_name,
                        namespace=self.namespace,
                        rank=rank if rank is not None else rank_of(pods[pod_name]),
                    ),
                )
            )
        return job_inputs(
            events=[redact_object(e, settings) for e in self.events],
            nodes=[redact_object(n, settings) for n in self.nodes.values()],
            workload=None if self.workload is None else redact_object(self.workload, settings),
            pods=pods.values(),
            logs=logs,
            max_events=settings.max_events,
        )

    def status(self) -> WorkloadStatus | None:
        return None if self.workload is None else workload_phase(self.workload)

    def diagnose(self, engine: Engine) -> Diagnosis:
        return diagnose_inputs(self.inputs(), engine)

    def _owner_api_version(self) -> str | None:
        """The apiVersion of a bare owner (a RayJob, a ReplicaSet) as its pods' ownerReferences say."""
        for pod in self.pods:
            for o in (pod.get("metadata") or {}).get("ownerReferences") or ():
                if isinstance(o, Mapping) and o.get("name") == self.name and o.get("kind") == self.kind:
                    return _str(o.get("apiVersion"))
        return None

    async def save(self, directory: Path, diagnosis: Diagnosis, *, now: float) -> SceneResult:
        """Write the scene bundle the agent writes (remediations/scene/) into `directory`, from what
        was read (nothing is read again, nothing is written to the cluster), so that `diagnose --scene
        directory` gives `diagnosis` again. `directory` must not exist, or be empty."""
        directory = directory.absolute()
        if directory.is_dir() and not any(directory.iterdir()):
            directory.rmdir()
        elif directory.exists():
            raise SceneError(f"{directory} exists and is not empty: choose a new directory")
        api_version = str((self.workload or {}).get("apiVersion") or self._owner_api_version() or "v1")
        event = DiagnosisEvent(
            diagnosis_id=f"live-{self.namespace}-{self.name}-{int(now)}",
            final=True,
            job=JobRef(namespace=self.namespace, name=self.name, kind=self.kind, api_version=api_version),
            window_start=now,
            window_end=now,
            diagnosis=diagnosis,
        )
        inputs = SceneInputs(
            incident_id=directory.name,
            diagnosis=event,
            workload=self.workload,
            pods=sorted(self.pods, key=_pod_name),
            nodes=[self.nodes[n] for n in sorted(self.nodes)],
            now=now,
            ranks=self.ranks(),
        )
        directory.parent.mkdir(parents=True, exist_ok=True)
        return await save_scene(directory.parent, inputs, _ReadAlready(self), self.settings)


class _ReadAlready:
    """The scene source of `diagnose --job --save`: what the live read holds (remediations.scene's
    SceneSource), so the bundle holds exactly what was diagnosed. No metrics source, no exec."""

    def __init__(self, scene: JobScene) -> None:
        self.scene = scene

    async def pod_log(
        self,
        namespace: str,
        pod: str,
        container: str,
        *,
        tail_lines: int,
        previous: bool = False,
        limit_bytes: int = LOG_BYTES,
    ) -> str:
        return self.scene.logs.get((pod, container, previous), "")

    async def list_events(self, namespace: str, *, involved: set[tuple[str, str]]) -> list[JSON]:
        out = []
        for e in self.scene.events:
            meta, inv = e.get("metadata") or {}, e.get("involvedObject") or {}
            if str(meta.get("namespace") or namespace) != namespace:
                continue
            if (str(inv.get("kind")), str(inv.get("name"))) in involved:
                out.append(e)
        return out

    async def metrics_range(self, node: str, start: float, end: float, step: float) -> None:
        return None

    async def exec(
        self, namespace: str, pod: str, container: str, command: list[str], *, timeout_s: float
    ) -> ExecResult:
        return ExecResult(error="diagnose --job runs nothing in pods")


def _str(v: Any) -> str | None:
    return v if isinstance(v, str) and v else None


def _pod_name(pod: Mapping[str, Any]) -> str:
    return str((pod.get("metadata") or {}).get("name") or "?")


def pod_selector(obj: Mapping[str, Any]) -> dict[str, str]:
    """The labels that select a workload's pods (remediations.workloads for the kinds it restarts)."""
    if obj.get("kind") == "MPIJob":
        return {"training.kubeflow.org/job-name": str((obj.get("metadata") or {}).get("name"))}
    return job_pod_selector(obj)


class Reader:
    """The read-only requests of `diagnose --job` and `scan`, at most `concurrency` at once."""

    def __init__(
        self,
        ops: ReadOps,
        *,
        tail_lines: int = TAIL_LINES,
        log_bytes: int = LOG_BYTES,
        concurrency: int = CONCURRENCY,
    ) -> None:
        self.ops = ops
        self.tail_lines = tail_lines
        self.log_bytes = log_bytes
        self.sem = asyncio.Semaphore(concurrency)
        # What could not be read and was left out (a kind the user may not list), for the output.
        self.skipped: list[str] = []

    def scene_settings(self) -> SceneSettings:
        """The bounds a saved bundle of what this reader reads keeps: the reader's own tail and size."""
        base = SceneSettings()
        return SceneSettings(
            log_lines=self.tail_lines, max_file_bytes=max(base.max_file_bytes, self.log_bytes), stacks=False
        )

    async def _gather(self, aws: Iterable[Awaitable[T]]) -> list[T]:
        return list(await asyncio.gather(*(_bounded(self.sem, a) for a in aws)))

    async def find_workload(self, namespace: str, name: str) -> tuple[JSON | None, KubeForbidden | None]:
        """The workload of that name, trying each kind (a CRD that is not installed is skipped; so is a
        kind the user may not read, returned as the second item when no kind has the name)."""
        denied: KubeForbidden | None = None

        async def one(res: Any) -> JSON | None:
            nonlocal denied
            try:
                return await self.ops.read_workload(res, namespace, name)
            except KubeForbidden as exc:
                denied = denied or exc
                return None

        found = await self._gather(one(res) for res in READ_WORKLOADS)
        for obj in found:
            if obj is not None:
                return obj, None
        return None, denied

    async def job(self, namespace: str, name: str) -> JobScene:
        obj, denied = await self.find_workload(namespace, name)
        if obj is not None:
            pods = await self.ops.list_job_pods(namespace, pod_selector(obj))
            kind = str(obj.get("kind") or "Job")
        else:
            pods = [
                p
                for p in await self.ops.list_pods(namespace)
                if _pod_name(p) == name
                or any(
                    isinstance(o, Mapping) and o.get("name") == name
                    for o in (p.get("metadata") or {}).get("ownerReferences") or ()
                )
            ]
            if not pods and denied is not None:
                # It may be a workload of the kind the user may not read.
                raise denied
            if not pods:
                raise LiveError(
                    I18nText(
                        en=f"job {namespace}/{name} not found: no PyTorchJob, MPIJob, Volcano Job, Job, "
                        "pod owner or pod of that name in the namespace",
                        zh=f"未找到作业 {namespace}/{name}：该命名空间中没有此名称的 PyTorchJob、MPIJob、"
                        "Volcano Job、Job、Pod 属主或 Pod",
                    )
                )
            owners = {
                str(o.get("kind"))
                for p in pods
                for o in (p.get("metadata") or {}).get("ownerReferences") or ()
                if isinstance(o, Mapping) and o.get("name") == name
            }
            kind = next(iter(sorted(owners)), "Pod")
        scene = JobScene(namespace, name, kind, obj, pods, settings=self.scene_settings())
        await self.fill(scene)
        return scene

    async def fill(self, scene: JobScene) -> None:
        """Read the logs, events and nodes of the scene's pods."""
        wanted: list[LogKey] = []
        for pod in scene.pods:
            # The logs a bundle keeps (remediations.scene.pod_containers): every container's current
            # instance, and the previous one of a container that restarted.
            for c in pod_containers(pod):
                wanted.append((_pod_name(pod), c["name"], False))
                if c["restarted"]:
                    wanted.append((_pod_name(pod), c["name"], True))
        texts = await self._gather(
            self.ops.pod_log(
                scene.namespace, p, c, tail_lines=self.tail_lines, previous=prev, limit_bytes=self.log_bytes
            )
            for p, c, prev in wanted
        )
        scene.logs = dict(zip(wanted, texts, strict=True))
        involved = {("Pod", _pod_name(p)) for p in scene.pods}
        if scene.workload is not None:
            involved.add((scene.kind, scene.name))
        scene.events = await self.ops.list_events(scene.namespace, involved=involved)
        node_names = sorted({n for p in scene.pods if (n := _str((p.get("spec") or {}).get("nodeName")))})
        if node_names:
            scene.nodes, node_events = await self._nodes(node_names, scene.skipped)
            scene.events.extend(node_events)

    async def _nodes(self, names: Sequence[str], skipped: list[str]) -> tuple[dict[str, JSON], list[JSON]]:
        """The nodes and their events (in `default`, where events about cluster-scoped objects go);
        a user who may not read them gets the diagnosis without them (noted in `skipped`)."""
        nodes: dict[str, JSON] = {}
        try:
            for name, obj in zip(names, await self._gather(self.ops.get_node(n) for n in names), strict=True):
                if obj is not None:
                    nodes[name] = obj
        except KubeForbidden as exc:
            skipped.append(f"nodes ({exc.need})")
        events: list[JSON] = []
        try:
            events = await self.ops.list_events("default", involved={("Node", n) for n in names})
        except KubeForbidden as exc:
            skipped.append(f"node events ({exc.need}, namespace default)")
        return nodes, events

    # -- scan ---------------------------------------------------------------------------------------

    async def workloads(self, namespace: str | None) -> list[JSON]:
        """Every training workload in `namespace` (None: all), CRDs not installed skipped."""

        async def one(res: Any) -> list[JSON]:
            try:
                items = await self.ops.list_workloads(res, namespace)
            except KubeNotFound:
                return []
            except KubeForbidden as exc:
                self.skipped.append(f"{res.kind}.{res.group} ({exc.need}, {exc.scope})")
                return []
            for obj in items:
                # Lists leave kind and apiVersion out of their items.
                obj.setdefault("apiVersion", res.api_version)
                obj.setdefault("kind", res.kind)
            return items

        lists = await self._gather(one(res) for res in (PYTORCH_JOBS, MPI_JOBS, VOLCANO_JOBS, JOBS))
        out = [obj for items in lists for obj in items]
        # A batch/v1 Job a Volcano or Kubeflow controller made is seen through its owner.
        return [o for o in out if not (o.get("kind") == "Job" and _owned_by_workload(o))]


def _owned_by_workload(obj: Mapping[str, Any]) -> bool:
    kinds = {"PyTorchJob", "MPIJob", "Job"}
    return any(
        isinstance(o, Mapping) and o.get("kind") in kinds and o.get("controller") is True
        for o in (obj.get("metadata") or {}).get("ownerReferences") or ()
    )


async def with_ops(
    kubeconfig: str | None,
    context: str | None,
    timeout_s: float,
    body: Any,
) -> Any:
    """Run `body(reader)` with a fresh client; typed errors become LiveError; the whole within `timeout_s`."""
    # Calls run in daemon threads: at the deadline the command ends at once, without waiting for a
    # request the server is still sitting on (asyncio.run would join the default executor's threads).
    asyncio.get_running_loop().set_default_executor(_DaemonCalls())
    api = api_client(kubeconfig, context)
    ops = ReadOps(api, attempts=2, base_delay=0.2, max_delay=1.0, request_timeout=(5.0, 20.0))
    try:
        async with asyncio.timeout(timeout_s):
            return await body(Reader(ops))
    except TimeoutError as exc:
        raise LiveError(
            I18nText(
                en=f"the Kubernetes API did not answer within {timeout_s:g} s (--timeout)",
                zh=f"Kubernetes API 在 {timeout_s:g} 秒内未响应（--timeout）",
            )
        ) from exc
    except KubeForbidden as exc:
        raise forbidden(exc) from exc
    except KubeError as exc:
        raise kube_failed(exc) from exc
    finally:
        ops.close()
        with contextlib.suppress(Exception):
            api.close()
