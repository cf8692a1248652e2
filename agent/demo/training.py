"""The emulated cluster's moving parts: controllers, scheduler, kubelet, training processes, node logs.

`KubeEmulator` + `Cluster` (emulator.py) serve the Kubernetes API and act as the kubelet when asked;
this module is what asks, as a cluster's own components would, so the real agent sees a cluster
that behaves like one:

* `Controllers`: the batch/v1 Job and Volcano Job controllers (pods from the workload's pod
  template, labelled and owned as those controllers do, uids stamped as the API server stamps
  them), the scheduler (nodes with the accelerators the pods request, Ready, not cordoned, no
  untolerated NoSchedule taint, node affinity and nodeSelector honoured, gang-scheduled) and the
  garbage collector (a deleted workload's pods go with it);
* `TrainingRun`: the processes of one incarnation of a job: start-up lines, the resume from the
  checkpoint its pod's env names (`TRAINMEDIC_RESUME_FROM` / `TRAINMEDIC_RESUME_STEP`, which
  trainmedic's recreation sets), a progress line per step, checkpoints written to the shared volume
  file by file in the framework's order (commit marker last), so a crash mid-save leaves what a real
  one leaves;
* `NodeKernelLogs`: each node's /var/log/kern.log, followed by the node agent's real kernel source.

Everything runs on the caller's event loop; nothing sleeps longer than a poll interval.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import logging
import struct
import time
import uuid
import zipfile
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from trainmedic.agent.bus.base import Bus
from trainmedic.agent.demo.emulator import JOB, NODE, VOLCANO_JOB, Cluster, FakeProcess, KubeApiError, rfc3339
from trainmedic.agent.demo.logs import HFTrainerLog, MegatronLog, hang_stack, kern_log_line
from trainmedic.agent.jobindex import JobIndex, rank_of
from trainmedic.agent.telemetry import Telemetry

__all__ = [
    "ACCELERATORS",
    "Controllers",
    "Incarnation",
    "JobProfile",
    "NodeKernelLogs",
    "RankPod",
    "TrainingRun",
    "World",
    "unschedulable_reason",
    "write_hf_checkpoint",
    "write_megatron_checkpoint",
]

log = logging.getLogger("trainmedic.demo")

# Extended resources of the device plugins: NVIDIA k8s-device-plugin, Huawei ascend-device-plugin,
# Cambricon's.
ACCELERATORS = ("nvidia.com/gpu", "huawei.com/Ascend910", "cambricon.com/mlu")
RESUME_FROM_ENV = "TRAINMEDIC_RESUME_FROM"
RESUME_STEP_ENV = "TRAINMEDIC_RESUME_STEP"
MEGATRON_TRACKER = "latest_checkpointed_iteration.txt"
_WORKLOADS = (JOB, VOLCANO_JOB)


# -- checkpoints as the frameworks write them ---------------------------------------------------------


def _torch_save(path: Path, payload: bytes, *, cut: bool = False) -> None:
    """A zip-format torch.save file (PyTorch >= 1.6: archive/data.pkl, byteorder, data/<n>, version).
    `cut`: only the first half reached the disk (no end-of-central-directory record)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", b"\x80\x02}q\x00.")  # an empty dict, pickle protocol 2
        z.writestr("archive/byteorder", "little")
        z.writestr("archive/data/0", payload)
        z.writestr("archive/version", "3\n")
    data = buf.getvalue()
    path.write_bytes(data[: len(data) // 2] if cut else data)


def _safetensors(path: Path, n_bytes: int = 512) -> None:
    """A well-formed safetensors file: 8-byte header length, JSON header, then the tensor bytes."""
    header = {
        "__metadata__": {"format": "pt"},
        "model.embed_tokens.weight": {"dtype": "BF16", "shape": [n_bytes // 32, 16], "data_offsets": [0, n_bytes]},
    }
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(n_bytes))


def write_hf_checkpoint(
    root: Path, step: int, *, max_steps: int, save_steps: int, processes: int = 16, cut: bool = False
) -> Path:
    """`checkpoint-<step>/` as `Trainer._save_checkpoint` writes it: model, optimizer, scheduler, rng
    states, and trainer_state.json last. `cut`: the save stops inside optimizer.pt."""
    d = root / f"checkpoint-{step}"
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}))
    (d / "generation_config.json").write_text(json.dumps({"bos_token_id": 128000, "eos_token_id": 128009}))
    _safetensors(d / "model.safetensors")
    _torch_save(d / "training_args.bin", b"\x00" * 64)
    _torch_save(d / "optimizer.pt", b"\x01" * 4096, cut=cut)
    if cut:
        return d
    _torch_save(d / "scheduler.pt", b"\x02" * 64)
    for r in range(processes):
        _torch_save(d / f"rng_state_{r}.pth", b"\x03" * 32)
    state = {
        "best_metric": None,
        "best_model_checkpoint": None,
        "epoch": round(step * 3 / max_steps, 4),
        "eval_steps": 500,
        "global_step": step,
        "is_hyper_param_search": False,
        "is_local_process_zero": True,
        "is_world_process_zero": True,
        "log_history": [{"epoch": round(s * 3 / max_steps, 4), "step": s} for s in range(1, step + 1)][-50:],
        "logging_steps": 1,
        "max_steps": max_steps,
        "num_train_epochs": 3,
        "save_steps": save_steps,
        "total_flos": 1.2e15 * step,
        "train_batch_size": 4,
        "trial_name": None,
        "trial_params": None,
    }
    (d / "trainer_state.json").write_text(json.dumps(state, indent=2))
    return d


def write_megatron_checkpoint(root: Path, step: int, *, tp: int, cut: bool = False) -> Path:
    """`iter_<step:07d>/mp_rank_<tp>/model_optim_rng.pt` for each tensor-parallel rank, then rank 0
    writes `latest_checkpointed_iteration.txt` after the barrier. `cut`: half the ranks wrote."""
    d = root / f"iter_{step:07d}"
    ranks = range(tp // 2) if cut else range(tp)
    for r in ranks:
        sub = d / f"mp_rank_{r:02d}"
        sub.mkdir(parents=True, exist_ok=True)
        _torch_save(sub / "model_optim_rng.pt", b"\x04" * 2048, cut=cut and r == ranks[-1])
    if not cut:
        (root / MEGATRON_TRACKER).write_text(str(step))
    return d


# -- the world the controllers and processes share ----------------------------------------------------


@dataclass(frozen=True)
class JobProfile:
    """What a workload's training does (the demo's train.py)."""

    framework: Literal["hf", "megatron"]
    checkpoint_dir: str  # as the job sees it (its annotation)
    step_s: float = 0.04
    save_every: int = 10
    init_s: float = 0.15
    accelerators: int = 8
    tp: int = 8


@dataclass
class RankPod:
    """One pod of an incarnation: its object, node and rank (one 8-accelerator pod per node)."""

    pod: dict[str, Any]
    node: str | None = None
    rank: int = 0

    @property
    def name(self) -> str:
        return str(self.pod["metadata"]["name"])

    @property
    def container(self) -> str:
        return str(self.pod["spec"]["containers"][0]["name"])

    def env(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for e in self.pod["spec"]["containers"][0].get("env") or []:
            if isinstance(e, dict) and "value" in e:
                out[str(e["name"])] = str(e["value"])
        return out


@dataclass
class Incarnation:
    """One workload object (one uid) and what the controllers made of it."""

    resource: str
    namespace: str
    name: str
    uid: str
    workload: dict[str, Any]
    created_at: float
    pods: list[RankPod] = field(default_factory=list)
    scheduled_at: float | None = None
    unschedulable: str | None = None
    run: TrainingRun | None = None
    task: asyncio.Task[None] | None = None
    failed_reported: bool = False

    @property
    def nodes(self) -> list[str]:
        return [p.node for p in self.pods if p.node]


EventHook = Callable[[str, "Incarnation", Mapping[str, Any]], None]
CollectiveCheck = Callable[["TrainingRun"], Awaitable[bool]]


@dataclass
class World:
    """What the demo's controllers and training processes share: the shared checkpoint volume (job
    path prefix -> local directory), each workload's profile, the fault hooks and a progress hook."""

    mounts: dict[str, Path]
    profiles: dict[str, JobProfile] = field(default_factory=dict)
    # Called before each collective (the first one builds the communicator): False = it failed.
    collective_check: CollectiveCheck | None = None
    on_event: EventHook | None = None

    def local(self, job_path: str) -> Path:
        for prefix, local in sorted(self.mounts.items(), key=lambda kv: -len(kv[0])):
            if job_path == prefix or job_path.startswith(prefix.rstrip("/") + "/"):
                return local / job_path[len(prefix.rstrip("/")) :].lstrip("/")
        raise ValueError(f"{job_path} is on no volume of the demo cluster")

    def emit(self, what: str, inc: Incarnation, **detail: Any) -> None:
        if self.on_event is not None:
            self.on_event(what, inc, detail)


# -- the training processes of one incarnation ---------------------------------------------------------


class TrainingRun:
    """The job's processes: one per pod (torchrun with 8 workers), rank 0 reporting progress."""

    def __init__(self, cluster: Cluster, inc: Incarnation, profile: JobProfile, world: World) -> None:
        self.cluster = cluster
        self.inc = inc
        self.profile = profile
        self.world = world
        self.ranks = sorted(inc.pods, key=lambda p: p.rank)
        self.hf = HFTrainerLog()
        self.megatron = MegatronLog(tp=profile.tp)
        env = self.ranks[0].env() if self.ranks else {}
        self.resumed_from: str | None = env.get(RESUME_FROM_ENV) or None
        step = env.get(RESUME_STEP_ENV, "")
        self.resumed_step: int | None = int(step) if step.isdigit() else None
        self.step = self.resumed_step or 0
        self.state: Literal["starting", "training", "paused", "ended"] = "starting"
        self.saved: list[int] = []
        self.last_progress_at: float | None = None
        self.first_step_at: float | None = None
        self.steps_done = 0
        self.changed = asyncio.Event()
        self._save_fault: Callable[[TrainingRun], Awaitable[None]] | None = None

    # -- what the demo's scenarios use ---------------------------------------------------------------

    def log(self, rank: RankPod, *lines: str) -> None:
        """Lines printed by a rank's processes (ignored once its container is gone)."""
        with contextlib.suppress(KeyError, RuntimeError):
            self.cluster.write_log(rank.pod, rank.container, *lines)

    async def exit(self, rank: RankPod, exit_code: int, *, reason: str = "Error") -> None:
        """The rank's container ends (the kubelet reports it terminated)."""
        with contextlib.suppress(KeyError, RuntimeError, KubeApiError):
            await self.cluster.terminate(rank.pod, rank.container, reason=reason, exit_code=exit_code)

    def pause(self) -> float | None:
        """Stop making progress, processes still alive (a hang). Returns when the last step was logged."""
        if self.state in ("starting", "training"):
            self.state = "paused"
        self.changed.set()
        return self.last_progress_at

    @property
    def training(self) -> bool:
        return self.state == "training"

    def end(self) -> None:
        self.state = "ended"
        self.changed.set()

    def fail_during_next_save(self, action: Callable[[TrainingRun], Awaitable[None]]) -> None:
        """At the next checkpoint, the save is cut short and `action` runs (the fault)."""
        self._save_fault = action

    async def wait(self, predicate: Callable[[TrainingRun], bool], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while not predicate(self):
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self.changed.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(min(left, 0.25)):
                    await self.changed.wait()
        return True

    # -- the processes -----------------------------------------------------------------------------------

    def _root(self) -> Path:
        return self.world.local(self.profile.checkpoint_dir)

    async def run(self) -> None:
        try:
            await self._run()
        finally:
            if self.state != "paused":
                self.state = "ended"
            self.changed.set()

    async def _run(self) -> None:
        now = time.time()
        world_size = len(self.ranks)
        for r in self.ranks:
            if self.profile.framework == "hf":
                self.log(r, *self.hf.nccl_init(r.name, r.rank, now))
        lead = self.ranks[0]
        if self.profile.framework == "hf":
            if self.resumed_from:
                self.log(lead, *self.hf.resume(self.resumed_from, self.step, now))
            else:
                self.log(lead, *self.hf.banner(world_size * 8, now))
        else:
            self.log(lead, *self.megatron.banner(world_size * 8, now))
            if self.resumed_from:
                self.log(lead, *self.megatron.resume(self.profile.checkpoint_dir, self.step))
        if self.resumed_from:
            self.world.emit("resuming", self.inc, checkpoint=self.resumed_from, step=self.step)
        await asyncio.sleep(self.profile.init_s)
        while self.state in ("starting", "training"):
            check = self.world.collective_check
            if check is not None and not await check(self):
                self.state = "ended"
                return
            if self.state == "starting":
                self.state = "training"
            await asyncio.sleep(self.profile.step_s)
            if not self.training:  # paused or ended meanwhile
                break
            self.step += 1
            self.steps_done += 1
            t = time.time()
            if self.profile.framework == "hf":
                self.log(lead, self.hf.step(self.step))
            else:
                self.log(lead, self.megatron.step(self.step, self.profile.step_s * 1000 + 3.1 * (self.step % 7)))
            self.last_progress_at = t
            if self.first_step_at is None:
                self.first_step_at = t
                if self.resumed_from:
                    self.world.emit("resumed", self.inc, checkpoint=self.resumed_from, step=self.step)
            self.changed.set()
            if self.step % self.profile.save_every == 0 and not await self._save():
                return
        # Paused (a hang): the processes live on, silent, until their pods go.
        while self.state == "paused":
            self.changed.clear()
            await self.changed.wait()

    async def _save(self) -> bool:
        """Write the checkpoint of this step; False when the save was cut short by a fault."""
        root = self._root()
        job_root = self.profile.checkpoint_dir.rstrip("/")
        lead = self.ranks[0]
        now = time.time()
        fault, self._save_fault = self._save_fault, None
        cut = fault is not None
        if self.profile.framework == "hf":
            path = f"{job_root}/checkpoint-{self.step}"
            self.log(lead, *self.hf.saving(path, now))
            await asyncio.to_thread(
                write_hf_checkpoint,
                root,
                self.step,
                max_steps=self.hf.total_steps,
                save_steps=self.profile.save_every,
                processes=len(self.ranks) * 8,
                cut=cut,
            )
            if not cut:
                self.log(lead, *self.hf.saved(path, time.time()))
        else:
            self.log(lead, *self.megatron.saving(job_root, self.step))
            await asyncio.to_thread(write_megatron_checkpoint, root, self.step, tp=self.profile.tp, cut=cut)
            if not cut:
                self.log(lead, *self.megatron.saved(job_root, self.step))
        if fault is not None:
            self.state = "ended"
            self.changed.set()
            await fault(self)
            return False
        self.saved.append(self.step)
        self.changed.set()
        return True


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


def _processes(framework: str) -> list[FakeProcess]:
    """What /proc shows in a training container: torchrun (pid 1) and its 8 workers, which registered
    faulthandler for SIGUSR1 (so a stack dump does not kill them)."""
    script = "/app/src/llamafactory/launcher.py" if framework == "hf" else "/app/MindSpeed-LLM/pretrain_gpt.py"
    launcher = FakeProcess(
        1,
        f"/usr/bin/python3 /usr/local/bin/torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d {script}",
        handles_sigusr1=False,
    )
    workers = [
        FakeProcess(57 + i, f"/usr/bin/python3 -u {script} --local-rank={i}", stack=hang_stack(script))
        for i in range(8)
    ]
    return [launcher, *workers]


# -- the nodes' kernel logs ----------------------------------------------------------------------------


class NodeKernelLogs:
    """Each emulated node's /var/log/kern.log (rsyslog format), in a directory of the demo's."""

    def __init__(self, root: Path, nodes: Sequence[str]) -> None:
        self.root = root
        self.nodes = list(nodes)
        self.booted = {n: time.time() - 86_400 - 1_000 * i for i, n in enumerate(self.nodes)}
        for n in self.nodes:
            self.path(n).parent.mkdir(parents=True, exist_ok=True)
            self.path(n).touch()

    def path(self, node: str) -> Path:
        return self.root / node / "kern.log"

    def write(self, node: str, *messages: str) -> None:
        now = time.time()
        with self.path(node).open("a", encoding="utf-8") as f:
            for m in messages:
                f.write(kern_log_line(node, now, now - self.booted[node], m) + "\n")

    def sources(
        self, *, bus: Bus, job_index: JobIndex, telemetry: Telemetry, poll_interval: float = 0.1
    ) -> dict[str, Callable[[], Awaitable[None]]]:
        """The node agent's kernel source for each node (agent/watchers/kernel.py), as components."""
        from trainmedic.agent.watchers.kernel import KernelFileSource

        out: dict[str, Callable[[], Awaitable[None]]] = {}
        for n in self.nodes:
            src = KernelFileSource(
                self.path(n),
                bus=bus,
                node=n,
                job_index=job_index,
                telemetry=telemetry,
                producer=f"node/{n}",
                start_at="end",
                poll_interval=poll_interval,
            )
            out[f"node-agent/{n}/kernel"] = src.run
        return out
