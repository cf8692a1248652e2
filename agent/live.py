"""Read-only diagnosis of the live cluster on the current kubeconfig: `trainmedic diagnose --job` and
`trainmedic scan`.

`diagnose --job [NAMESPACE/]NAME` finds the workload (PyTorchJob, MPIJob, Volcano Job, batch/v1 Job,
or any other owner of pods: the pods whose ownerReferences name it, or the pod of that name), reads
its pods' container logs (the current and the previous instance, a bounded tail of each), the events
of the workload, of its pods and of their nodes, the nodes' status, and classifies them with the same
engine and attribution as `diagnose --scene`: a log's findings take its pod, namespace, node
(pod.spec.nodeName) and rank (RANK env, the replica or completion index). What is classified is what
a scene bundle keeps (redacted, bounded, each log named by its file there: agent/jobinputs.py), and
`--save DIR` writes that bundle (remediations/scene/, the agent's own layout) from what was read,
so `diagnose --scene DIR` gives the same JSON.

`scan [-n NS | -A]` lists the training workloads that failed or are restarting, each with the
diagnosis `diagnose --job` gives it; the failing training pods no training workload owns (bare pods,
pods of a ReplicaSet, StatefulSet, RayJob, ...: see `loose_training_pods`), one entry per owner with
its diagnosis; and the nodes with problems (NotReady or unreachable,
trainmedic's quarantine taint, an accelerator or node-problem-detector condition), each with a
one-line reason.

Only GET and LIST requests are made (nothing is written); every request has a (connect, read)
timeout, at most `concurrency` run at once, and the whole command a deadline.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
from collections.abc import Awaitable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from trainmedic.agent.jobindex import rank_of
from trainmedic.agent.jobinputs import LogKey, job_inputs, workload_phase
from trainmedic.agent.watchers.k8s import (
    DaemonThreadExecutor,
    is_accelerator_resource,
    node_status,
)
from trainmedic.detectors.diagnose import LogInput, diagnose_inputs
from trainmedic.detectors.engine import Engine
from trainmedic.errors import TrainmedicError
from trainmedic.events import DiagnosisEvent, JobRef, WorkloadStatus
from trainmedic.models import Diagnosis, I18nText, Source
from trainmedic.remediations.kube import (
    ANN_QUARANTINE_REASON,
    JOBS,
    MPI_JOBS,
    PODS,
    PYTORCH_JOBS,
    READ_WORKLOADS,
    TAINT_KEY,
    VOLCANO_JOBS,
    KubeError,
    KubeForbidden,
    KubeNotFound,
    KubeOps,
    _check_names,
    _Res,
    _What,
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

T = TypeVar("T")
JSON = dict[str, Any]

TAIL_LINES = 2000
LOG_BYTES = 1 << 20
CONCURRENCY = 8
# Conditions every kubelet reports; their "bad" status.
_STANDARD_BAD = {
    "MemoryPressure": "True",
    "DiskPressure": "True",
    "PIDPressure": "True",
    "NetworkUnavailable": "True",
}
_UNREACHABLE = ("node.kubernetes.io/unreachable", "node.kubernetes.io/not-ready")
_RESTARTING = frozenset({"Restarting", "Aborting", "Aborted", "Terminating"})


class LiveError(TrainmedicError):
    """What the CLI prints when the cluster cannot be asked: a message in both languages."""

    def __init__(self, text: I18nText) -> None:
        super().__init__(text.en)
        self.text = text


def no_kubeconfig(detail: str) -> LiveError:
    return LiveError(
        I18nText(
            en=f"no Kubernetes configuration: {detail} (set KUBECONFIG, pass --kubeconfig FILE, or run in a pod)",
            zh=f"未找到 Kubernetes 配置：{detail}（请设置 KUBECONFIG、使用 --kubeconfig FILE，或在 Pod 中运行）",
        )
    )


def forbidden(err: KubeForbidden) -> LiveError:
    need = err.need or "?"
    scope = err.scope or "?"
    return LiveError(
        I18nText(
            en=f"forbidden: the current kubeconfig user lacks the RBAC permission {need} ({scope}); "
            "ask for it (read only: get, list) and retry",
            zh=f"权限不足：当前 kubeconfig 用户缺少 RBAC 权限 {need}（{scope}）；请申请该权限（只读：get、list）后重试",
        )
    )


def kube_failed(err: KubeError) -> LiveError:
    first = str(err).splitlines()[0] if str(err) else type(err).__name__
    return LiveError(I18nText(en=f"the Kubernetes API failed: {first}", zh=f"Kubernetes API 请求失败：{first}"))


def api_client(kubeconfig: str | None, context: str | None = None) -> Any:
    """An ApiClient from `kubeconfig` (else KUBECONFIG / ~/.kube/config, else the in-cluster service
    account), with the kubeconfig's TLS settings, certificates, tokens and exec plugins."""
    from kubernetes import client
    from kubernetes import config as kube_config

    config: Any = kube_config  # the client's loaders are untyped
    cfg = client.Configuration()
    try:
        config.load_kube_config(config_file=kubeconfig, context=context, client_configuration=cfg)
    except (config.ConfigException, OSError, TypeError, ValueError) as exc:
        if kubeconfig or context:
            raise no_kubeconfig(f"{kubeconfig or 'kubeconfig'}: {exc}") from exc
        try:
            config.load_incluster_config(client_configuration=cfg)
        except config.ConfigException as exc2:
            raise no_kubeconfig(str(exc)) from exc2
    return client.ApiClient(cfg)


def parse_job(ref: str, namespace: str | None) -> tuple[str, str]:
    """`NAMESPACE/NAME` or `NAME` (in `namespace`, else "default")."""
    ns, sep, name = ref.partition("/")
    if not sep:
        ns, name = namespace or "default", ref
    if not ns or not name or "/" in name:
        raise LiveError(
            I18nText(
                en=f"--job {ref!r}: expected NAMESPACE/NAME or NAME",
                zh=f"--job {ref!r}：应为 NAMESPACE/NAME 或 NAME",
            )
        )
    return ns, name


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


class _DaemonCalls(concurrent.futures.ThreadPoolExecutor):
    """The loop's default executor (asyncio accepts only a ThreadPoolExecutor) running each call in a
    daemon thread of its own (agent.watchers.k8s.DaemonThreadExecutor), which neither the loop's
    shutdown nor the interpreter's exit waits for."""

    def __init__(self) -> None:
        super().__init__(max_workers=1)
        self._calls = DaemonThreadExecutor("trainmedic-live")

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> concurrent.futures.Future[Any]:
        return self._calls.submit(fn, *args, **kwargs)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        super().shutdown(wait=False, cancel_futures=cancel_futures)


class ReadOps(KubeOps):
    """The reads a person's `diagnose --job` and `scan` make with their own kubeconfig (every kind
    of READ_WORKLOADS, pods of a namespace). They live here, not in KubeOps: remediations/kube/
    holds exactly the daemon's calls, which the deploy tests read to prove its RBAC is minimal."""

    async def read_workload(self, res: _Res, namespace: str, name: str) -> JSON | None:
        """A workload of any kind in READ_WORKLOADS (MPIJob too), or None when absent or its CRD is not
        installed."""
        _check_names(namespace=namespace, name=name)
        what = _What("get", res, namespace, name)
        if res is JOBS:
            return await self._get(what, self.batch.read_namespaced_job, name, namespace)
        return await self._get(
            what, self.custom.get_namespaced_custom_object, res.group, res.version, namespace, res.plural, name
        )

    async def list_workloads(self, res: _Res, namespace: str | None) -> list[JSON]:
        """Every workload of a kind in a namespace (None: all namespaces). KubeNotFound: the CRD is not
        installed."""
        if namespace:
            _check_names(namespace=namespace)
        what = _What("list", res, namespace)
        if res is JOBS:
            if namespace:
                return await self._list(what, self.batch.list_namespaced_job, namespace)
            return await self._list(what, self.batch.list_job_for_all_namespaces)
        if namespace:
            return await self._list(
                what, self.custom.list_namespaced_custom_object, res.group, res.version, namespace, res.plural
            )
        return await self._list(what, self.custom.list_cluster_custom_object, res.group, res.version, res.plural)

    async def list_pods(self, namespace: str) -> list[JSON]:
        """Every pod of a namespace."""
        _check_names(namespace=namespace)
        return await self._list(_What("list", PODS, namespace), self.core.list_namespaced_pod, namespace)

    async def list_all_pods(self, namespace: str | None) -> list[JSON]:
        """Every pod of a namespace, or of every namespace (None)."""
        if namespace:
            return await self.list_pods(namespace)
        return await self._list(_What("list", PODS, None), self.core.list_pod_for_all_namespaces)


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
