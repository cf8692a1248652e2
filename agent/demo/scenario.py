"""The demo's faults, from a healthy job to the healed one, with the real agent in the middle.

Each fault gets a fresh emulated cluster (3 NVIDIA + 3 Ascend nodes, 8 accelerators each), a fresh
agent (`build_agent`, role all: the Kubernetes watchers and pod-log follower, the memory bus, the
brain's detectors and correlator, the responder with its scene, policy and actions, the notifier)
and a fresh work directory (incident store, scenes, the shared checkpoint volume, reports). The
node agents are the real kernel-log source, one per node, reading that node's kern.log.

    xid   Job on NVIDIA, HF Trainer: a GPU falls off the bus (Xid 79) while checkpoint-30 is being
          written -> quarantine the node, resume from checkpoint-20 (the last complete) elsewhere
    oom   Job on NVIDIA: CUDA out of memory -> no restart (it would fail the same way): the team is
          told, with framework-aware hints
    hccl  Volcano Job on Ascend, MindSpeed-LLM (Megatron): one node's RoCE link is down, HCCL cannot
          build its links (EI0006) -> restart; the same node fails again and again -> the 3rd time
          the policy's frequency rule isolates it, and the job resumes on the other nodes
    hang  Job on NVIDIA: the steps stop, no error line -> hang detector, stacks of every rank taken
          before anything is killed, resume from the last checkpoint
    node-lost  Job on NVIDIA: a node stops heartbeating; the node lifecycle controller (a stand-in
          here) sets its Ready condition Unknown and taints it unreachable, the peer's collective
          times out -> quarantine the node, resume from the last checkpoint elsewhere
    app-error  Job on NVIDIA: a rank raises KeyError in the data collator -> the owner is told,
          with the exception; no restart (it would fail the same way)

The agent's settings are the demo's only concessions to time: a diagnosis window of 0.5 s, a hang
floor of 1.5 s (in the hang fault; 60 s in the others) and a 0.2 s backoff between restarts, where a
cluster would use 30 s, 5 min and 1 min. Everything else is the shipped policy in enforce mode, with
its budgets and circuit breaker.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from trainmedic.agent.bus.memory import MemoryBus
from trainmedic.agent.config import Role, Settings
from trainmedic.agent.demo.emulator import JOB, NODE, VOLCANO_JOB, Cluster, KubeEmulator
from trainmedic.agent.demo.logs import (
    cuda_oom_lines,
    hccl_ei0006_lines,
    key_error_lines,
    nccl_watchdog_lines,
    torchrun_peer_stop_lines,
    xid79_message,
)
from trainmedic.agent.demo.metrics import DemoMetrics, FailKind
from trainmedic.agent.demo.output import Progress, duration
from trainmedic.agent.demo.receiver import WebhookReceiver
from trainmedic.agent.demo.training import Controllers, Incarnation, JobProfile, NodeKernelLogs, TrainingRun, World
from trainmedic.agent.store import Incident, IncidentStatus, IncidentStore

__all__ = ["FAULTS", "SCENARIOS", "DemoCluster", "FaultResult", "Inspect", "Scenario", "run_fault"]

log = logging.getLogger("trainmedic.demo")

FAULTS = ("xid", "oom", "hccl", "hang", "node-lost", "app-error")
NAMESPACE = "train"
MOUNT = "/mnt/ckpt"  # where the jobs mount the shared checkpoint volume
GPU_NODES = ("gpu-1", "gpu-2", "gpu-3")
NPU_NODES = ("npu-1", "npu-2", "npu-3")
# The demo's time scale (a cluster's defaults: 30 s, 300 s, 1m, 1 s).
WINDOW_S = 1.0  # detect.window_s: how long a diagnosis window gathers evidence (a loaded machine follows logs late)
HANG_FLOOR_S = 1.5  # detect.hang_floor_s in the hang fault: the shortest silence that can be a hang
QUIET_FLOOR_S = 60.0  # ... in the others, where a pause of the demo's own process must not look like one
BACKOFF = "0.2s"  # the policy's first backoff between two restarts of one job
TICK_S = 0.1  # how often the brain closes windows and checks for hangs
METRICS_INTERVAL_S = 1.0  # metrics.interval_s: how often the watcher reads the exporters
DEMO_METRICS_URL = "demo://exporters"  # what the watcher's messages call the demo's metrics


# -- what one fault's run produced ----------------------------------------------------------------------


@dataclass
class FaultResult:
    """One fault, from injection to healing; `as_json` is the object `--json` prints."""

    fault: str
    ok: bool = False
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    fault_class: str | None = None
    code: str | None = None
    chip: str | None = None
    node: str | None = None
    incident_id: str | None = None
    incidents: list[str] = field(default_factory=list)
    status: str | None = None
    actions: list[str] = field(default_factory=list)
    scene_dir: str | None = None
    quarantined_nodes: list[str] = field(default_factory=list)
    checkpoint: str | None = None
    rescheduled_job: str | None = None
    excluded_nodes: list[str] = field(default_factory=list)
    rescheduled_to: list[str] = field(default_factory=list)
    resumed_step: int | None = None
    healed: bool | None = None
    hints: list[str] = field(default_factory=list)
    webhooks_delivered: int = 0
    webhooks_verified: int | None = None
    report_html: str | None = None
    reports: dict[str, str] = field(default_factory=dict)
    detect_ms: float | None = None
    recover_ms: float | None = None
    workdir: str | None = None

    def as_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        for k in ("detect_ms", "recover_ms"):
            if out[k] is not None:
                out[k] = round(out[k], 1)
        return out


# -- the agent's store, watched for progress ------------------------------------------------------------


class IncidentWatch:
    """Follows the incident store's timeline of one job and prints each stage as it is recorded."""

    def __init__(self, store: IncidentStore, job: str, progress: Progress) -> None:
        self.store = store
        self.job = job
        self.progress = progress
        self.order: list[str] = []
        self.seen: dict[str, int] = {}
        self.first_detected: float | None = None
        self.shown: dict[str, tuple[str | None, str | None, str | None]] = {}

    def incidents(self) -> list[Incident]:
        return [self.store.get(i) for i in self.order]

    def terminal(self) -> list[Incident]:
        return [i for i in self.incidents() if i.status not in (IncidentStatus.OPEN, IncidentStatus.ACTING)]

    def poll(self) -> None:
        for inc in sorted(self.store.recent(limit=50), key=lambda i: i.created):
            if inc.job != self.job:
                continue
            if inc.id not in self.seen:
                self.seen[inc.id] = 0
                self.order.append(inc.id)
            timeline = self.store.timeline(inc.id)
            for entry in timeline[self.seen[inc.id] :]:
                self._stage(inc.id, entry)
            self.seen[inc.id] = len(timeline)

    def _stage(self, incident_id: str, entry: Mapping[str, Any]) -> None:
        p, kind, d, at = self.progress, str(entry["kind"]), entry.get("detail") or {}, float(entry["t"])
        inc = self.store.get(incident_id)
        short = incident_id[:8]
        if kind == "detected":
            if self.first_detected is None:
                self.first_detected = at
            p.line("detected", at=at, fault_class=inc.fault_class, code=inc.code, node=inc.node or "?", id=short)
            self.shown[incident_id] = (inc.fault_class, inc.code, inc.node)
        elif kind == "diagnosis_revised":
            shown = (inc.fault_class, inc.code, inc.node)
            if self.shown.get(incident_id) != shown:  # a new revision with the same root cause: nothing to say
                p.line("revised", at=at, fault_class=inc.fault_class, code=inc.code, node=inc.node or "?")
        elif kind == "scene_saved":
            p.line("scene", at=at, dir=d.get("scene_dir"), files=d.get("files", "?"))
        elif kind == "planned":
            plan = inc.plan or {}
            p.line("planned", at=at, mode=d.get("mode"), actions=", ".join(d.get("actions") or []) or "-")
            if plan.get("escalated"):
                why = next(
                    (a.get("reason") for a in plan.get("actions") or [] if a.get("name") == "quarantine_node"), None
                )
                p.line("escalated", at=at, why=p.i18n(why) or plan.get("escalation"))
            if plan.get("blocked"):
                p.line("blocked", at=at, why=p.i18n(plan.get("blocked")))
            for h in plan.get("hints") or []:
                p.line("hint", at=at, hint=p.i18n(h))
        elif kind == "action:quarantine_node:done":
            p.line("quarantined", at=at, node=d.get("node"))
        elif kind in ("action:restart_from_checkpoint:done", "action:raise_memory_limit:done") and d.get("workload"):
            p.line(
                "recreated",
                at=at,
                workload=d.get("workload"),
                checkpoint=_short_ckpt(d.get("resumed_from")),
                excluded=", ".join(d.get("excluded_nodes") or []) or "-",
            )
        elif kind == "action:notify:done":
            p.line("notify_action", at=at, topic=d.get("published", "trainmedic.incidents"))
        elif kind.startswith("status:") and kind not in ("status:acting", "status:open"):
            p.line("status", at=at, id=short, status=kind.split(":", 1)[1])
        elif kind == "notified":
            p.line("webhook", at=at, sink=d.get("sink"), status=d.get("status"), http=d.get("http", "?"))
        elif kind == "notify_failed":
            p.line("webhook_failed", at=at, sink=d.get("sink"), error=d.get("error") or d.get("http") or "?")


def _short_ckpt(path: Any) -> str:
    if not path:
        return "-"
    return str(path).rstrip("/").rsplit("/", 1)[-1]


# -- the scenarios --------------------------------------------------------------------------------------


@dataclass
class DemoCluster:
    """Everything one fault's run holds: the emulator, the controllers, the agent, the paths."""

    kube: KubeEmulator
    cluster: Cluster
    world: World
    controllers: Controllers
    kernels: NodeKernelLogs
    agent: Any
    store: IncidentStore
    progress: Progress
    workdir: Path
    t0: float | None = None
    first: Incarnation | None = None
    # The nodes' exporters as the metrics watcher reads them (agent/demo/metrics.py).
    metrics: DemoMetrics | None = None

    def devices_fail(self, node: str | None, kind: FailKind, *, at: float, devices: list[str] | None = None) -> None:
        if self.metrics is not None and node:
            self.metrics.fail(node, kind, at=at, devices=devices)


@dataclass(frozen=True)
class Scenario:
    """One fault: its job, how it is injected, and what the policy is expected to do about it."""

    fault: str
    title: tuple[str, str]
    job: str
    resource: str
    profile: JobProfile
    fault_class: str
    quarantine: bool
    restart: bool
    incidents: int = 1
    hang_floor_s: float = QUIET_FLOOR_S
    # (cluster, the running training) -> the description of what was injected (en, zh)
    inject: Callable[[DemoCluster, TrainingRun], Awaitable[tuple[str, str]]] | None = None
    ready: Callable[[TrainingRun], bool] = lambda run: len(run.saved) >= 2


async def _inject_xid(dc: DemoCluster, run: TrainingRun) -> tuple[str, str]:
    """Xid 79 on the second node while the next checkpoint is written: the save never completes."""
    bad = run.ranks[1]
    cut: list[int] = []
    done = asyncio.Event()

    async def fault(r: TrainingRun) -> None:
        cut.append(r.step)
        dc.t0 = time.time()
        dc.progress.t0 = dc.t0
        dc.kernels.write(bad.node or "?", xid79_message("0000:3b:00", 57))
        dc.devices_fail(bad.node, "xid", at=dc.t0, devices=["0"])
        dc.devices_fail(r.ranks[0].node, "idle", at=dc.t0)
        await asyncio.sleep(0.05)
        # The peer's collective never completes; its watchdog aborts the process (time compressed).
        r.log(r.ranks[0], *nccl_watchdog_lines(0, time.time(), 7753))
        await r.exit(r.ranks[0], 134)
        await r.exit(bad, 1)
        done.set()

    run.fail_during_next_save(fault)
    async with asyncio.timeout(10):
        await done.wait()
    return (
        f"Xid 79 on {bad.node} (GPU 0000:3b:00 has fallen off the bus) while checkpoint-{cut[0]} was being written",
        f"{bad.node} 上出现 Xid 79（GPU 0000:3b:00 掉卡），此时正在写 checkpoint-{cut[0]}",
    )


async def _inject_oom(dc: DemoCluster, run: TrainingRun) -> tuple[str, str]:
    lead, peer = run.ranks[0], run.ranks[1]
    dc.t0 = time.time()
    dc.progress.t0 = dc.t0
    # Device memory filled over the last minute; the process is gone after.
    dc.devices_fail(lead.node, "oom", at=dc.t0, devices=["0"])
    dc.devices_fail(peer.node, "idle", at=dc.t0)
    run.end()
    step = run.step + 1
    run.log(lead, *cuda_oom_lines(0, lead.name, time.time()))
    await run.exit(lead, 1)
    run.log(peer, *torchrun_peer_stop_lines(57))
    await run.exit(peer, 1)
    return (
        f"CUDA out of memory on rank 0 ({lead.node}) at step {step}",
        f"rank 0（{lead.node}）在第 {step} 步显存不足（CUDA OOM）",
    )


def _hccl_link_down(broken: str) -> Callable[[TrainingRun], Awaitable[bool]]:
    """A node whose RoCE link is down: any job with a rank there fails its next collective."""

    async def check(run: TrainingRun) -> bool:
        bad = next((r for r in run.ranks if r.node == broken), None)
        if bad is None:
            return True
        pid = 1_292_363 + bad.rank
        run.log(bad, *hccl_ei0006_lines(bad.rank * 8, 0, pid, time.time()))
        await run.exit(bad, 1)
        for other in run.ranks:
            if other is not bad:
                await run.exit(other, 1)
        return False

    return check


async def _inject_hccl(dc: DemoCluster, run: TrainingRun) -> tuple[str, str]:
    broken = run.ranks[1].node or "?"
    dc.t0 = time.time()
    dc.progress.t0 = dc.t0
    dc.devices_fail(broken, "link", at=dc.t0)
    dc.world.collective_check = _hccl_link_down(broken)
    return (
        f"the RoCE link of {broken} goes down: HCCL cannot build its links (EI0006), on every restart there",
        f"{broken} 的 RoCE 链路中断：HCCL 无法建链（EI0006），在该节点上每次重启都会失败",
    )


async def _inject_hang(dc: DemoCluster, run: TrainingRun) -> tuple[str, str]:
    last = run.pause()
    dc.t0 = last if last is not None else time.time()
    dc.progress.t0 = dc.t0
    for r in run.ranks:
        dc.devices_fail(r.node, "idle", at=dc.t0)
    return (
        f"every rank blocks in all_reduce after step {run.step}: no more steps, no error line, the pods keep running",
        f"第 {run.step} 步之后所有 rank 卡在 all_reduce：不再有进展，没有任何报错，Pod 仍在运行",
    )


async def _inject_node_lost(dc: DemoCluster, run: TrainingRun) -> tuple[str, str]:
    """The second node stops heartbeating: its rank is gone with it (no line, no exit: its pod stays
    Running in the API); the node lifecycle controller marks the node; the peer's collective times out."""
    lost, peer = run.ranks[1], run.ranks[0]
    node = lost.node or "?"
    dc.t0 = time.time()
    dc.progress.t0 = dc.t0
    dc.devices_fail(node, "lost", at=dc.t0)
    dc.devices_fail(peer.node, "idle", at=dc.t0)
    run.end()
    await dc.cluster.lose_node(node)
    await asyncio.sleep(0.05)
    run.log(peer, *nccl_watchdog_lines(0, time.time(), 7753))
    await run.exit(peer, 1)
    return (
        f"{node} stops answering: Ready goes Unknown, tainted unreachable; the rank there is lost",
        f"{node} 失联：Ready 变为 Unknown，被打上 unreachable 污点；该节点上的 rank 丢失",
    )


async def _inject_app_error(dc: DemoCluster, run: TrainingRun) -> tuple[str, str]:
    """Rank 8 (the second pod) raises KeyError in the data collator; torchrun stops the peer."""
    bad, peer = run.ranks[1], run.ranks[0]
    dc.t0 = time.time()
    dc.progress.t0 = dc.t0
    for r in (bad, peer):
        dc.devices_fail(r.node, "idle", at=dc.t0)
    run.end()
    step = run.step + 1
    run.log(bad, *key_error_lines(8, bad.node or "?", time.time()))
    await run.exit(bad, 1)
    run.log(peer, *torchrun_peer_stop_lines(57))
    await run.exit(peer, 1)
    return (
        f"rank 8 ({bad.node}) raises KeyError: 'labels' in the data collator at step {step}",
        f"rank 8（{bad.node}）在第 {step} 步的数据整理函数中抛出 KeyError: 'labels'",
    )


def _hf(job: str) -> JobProfile:
    return JobProfile("hf", f"{MOUNT}/{job}")


SCENARIOS: dict[str, Scenario] = {
    "xid": Scenario(
        "xid",
        ("an NVIDIA GPU falls off the bus (Xid 79) in a 16-GPU fine-tune", "16 卡微调中一块 NVIDIA GPU 掉卡（Xid 79）"),
        "llama3-8b-sft",
        JOB,
        _hf("llama3-8b-sft"),
        "device_error",
        quarantine=True,
        restart=True,
        inject=_inject_xid,
    ),
    "oom": Scenario(
        "oom",
        ("CUDA out of memory in a 16-GPU fine-tune", "16 卡微调中 CUDA 显存不足"),
        "llama3-70b-lora",
        JOB,
        _hf("llama3-70b-lora"),
        "accelerator_oom",
        quarantine=False,
        restart=False,
        inject=_inject_oom,
        ready=lambda run: len(run.saved) >= 1 and run.step % run.profile.save_every >= 3,
    ),
    "hccl": Scenario(
        "hccl",
        (
            "HCCL link failures on one Ascend node (EI0006) in a 16-NPU pre-training",
            "16 卡昇腾预训练中单个节点 HCCL 建链失败（EI0006）",
        ),
        "qwen2-72b-pretrain",
        VOLCANO_JOB,
        JobProfile("megatron", f"{MOUNT}/qwen2-72b-pretrain"),
        "comm_init",
        quarantine=True,
        restart=True,
        incidents=3,
        inject=_inject_hccl,
        ready=lambda run: len(run.saved) >= 2 and run.step % run.profile.save_every >= 3,
    ),
    "hang": Scenario(
        "hang",
        ("a 16-GPU fine-tune hangs without an error line", "16 卡微调静默卡死（没有任何报错）"),
        "llama3-8b-dpo",
        JOB,
        _hf("llama3-8b-dpo"),
        "hang",
        quarantine=False,
        restart=True,
        hang_floor_s=HANG_FLOOR_S,
        inject=_inject_hang,
        ready=lambda run: len(run.saved) >= 1 and run.step % run.profile.save_every >= 5,
    ),
    "node-lost": Scenario(
        "node-lost",
        ("a GPU node stops answering in a 16-GPU pre-training", "16 卡预训练中一个 GPU 节点失联"),
        "llama3-8b-pt",
        JOB,
        _hf("llama3-8b-pt"),
        "node_failure",
        quarantine=True,
        restart=True,
        inject=_inject_node_lost,
        ready=lambda run: len(run.saved) >= 1 and run.step % run.profile.save_every >= 3,
    ),
    "app-error": Scenario(
        "app-error",
        ("a rank raises a Python exception in a 16-GPU fine-tune", "16 卡微调中一个 rank 抛出 Python 异常"),
        "qwen2-7b-sft",
        JOB,
        _hf("qwen2-7b-sft"),
        "app_error",
        quarantine=False,
        restart=False,
        inject=_inject_app_error,
        ready=lambda run: len(run.saved) >= 1 and run.step % run.profile.save_every >= 3,
    ),
}


# -- the cluster, the workloads, the agent's settings -----------------------------------------------------


async def add_nodes(cluster: Cluster) -> None:
    """Nodes as the device plugins and feature discovery label them."""
    for n in GPU_NODES:
        await cluster.add_node(
            n,
            gpus=8,
            labels={
                "node.kubernetes.io/instance-type": "h100x8",
                "nvidia.com/gpu.present": "true",
                "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
                "nvidia.com/gpu.count": "8",
            },
        )
    for n in NPU_NODES:
        await cluster.add_node(
            n,
            ascend=8,
            labels={
                "node.kubernetes.io/instance-type": "atlas-800t-a2",
                "accelerator": "huawei-Ascend910",
                "accelerator-type": "module-910b-8",
            },
        )


def _annotations(profile: JobProfile) -> dict[str, str]:
    args = "--resume_from_checkpoint {checkpoint}" if profile.framework == "hf" else "--ckpt-step {step}"
    return {"trainmedic.io/checkpoint-dir": profile.checkpoint_dir, "trainmedic.io/resume-args": args}


def _volume() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    return (
        [{"name": "ckpt", "persistentVolumeClaim": {"claimName": "ckpt-shared"}}],
        [{"name": "ckpt", "mountPath": MOUNT}],
    )


def job_body(cluster: Cluster, sc: Scenario) -> dict[str, Any]:
    """An Indexed batch/v1 Job, 2 pods x 8 GPUs, LLaMA-Factory under torchrun."""
    volumes, mounts = _volume()
    container = {
        "name": "trainer",
        "image": "registry.example.com/llamafactory:0.9.1-cu124",
        "command": ["torchrun", "--nnodes=2", "--nproc-per-node=8", "--rdzv-backend=c10d", "src/train.py"],
        "args": [f"examples/train_full/{sc.job}.yaml"],
        "env": [{"name": "NCCL_DEBUG", "value": "INFO"}],
        "resources": {"limits": {"nvidia.com/gpu": "8"}, "requests": {"nvidia.com/gpu": "8"}},
        "volumeMounts": mounts,
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": cluster._meta(sc.job, NAMESPACE, annotations=_annotations(sc.profile)),
        "spec": {
            "completions": 2,
            "parallelism": 2,
            "completionMode": "Indexed",
            "backoffLimit": 0,
            "template": {
                "metadata": {"labels": {"app": sc.job}},
                "spec": {
                    "restartPolicy": "Never",
                    "nodeSelector": {"nvidia.com/gpu.present": "true"},
                    "containers": [container],
                    "volumes": volumes,
                },
            },
        },
    }


def volcano_body(cluster: Cluster, sc: Scenario) -> dict[str, Any]:
    """A Volcano Job (master + worker, 8 NPUs each, gang-scheduled), MindSpeed-LLM under torchrun."""
    volumes, mounts = _volume()

    def template() -> dict[str, Any]:
        return {
            "spec": {
                "restartPolicy": "OnFailure",
                "nodeSelector": {"accelerator": "huawei-Ascend910"},
                "containers": [
                    {
                        "name": "mindspeed",
                        "image": "registry.example.com/mindspeed-llm:2.0.0-a2",
                        "command": ["torchrun", "--nnodes=2", "--nproc-per-node=8", "pretrain_gpt.py"],
                        "args": ["--tensor-model-parallel-size", "8", "--load", sc.profile.checkpoint_dir],
                        "resources": {
                            "limits": {"huawei.com/Ascend910": "8"},
                            "requests": {"huawei.com/Ascend910": "8"},
                        },
                        "volumeMounts": mounts,
                    }
                ],
                "volumes": volumes,
            }
        }

    return {
        "apiVersion": "batch.volcano.sh/v1alpha1",
        "kind": "Job",
        "metadata": cluster._meta(sc.job, NAMESPACE, annotations=_annotations(sc.profile)),
        "spec": {
            "minAvailable": 2,
            "schedulerName": "volcano",
            "queue": "default",
            "plugins": {"pytorch": ["--master=master", "--worker=worker", "--port=23456"]},
            "tasks": [
                {"name": "master", "replicas": 1, "template": template()},
                {"name": "worker", "replicas": 1, "template": template()},
            ],
        },
    }


def demo_policy(path: Path) -> Path:
    """The shipped policy in enforce mode, with a 0.2 s backoff between restarts instead of 1 min."""
    from trainmedic.remediations.policy import POLICY_FILE, load_policy

    data = yaml.safe_load(POLICY_FILE.read_text(encoding="utf-8"))
    data["mode"] = "enforce"
    data["budgets"]["backoff"] = {"base": BACKOFF, "factor": 2, "max": "5s"}
    path.write_text(yaml.safe_dump(data, allow_unicode=True, sort_keys=False), encoding="utf-8")
    load_policy(path)  # refuses a broken file with every problem listed
    return path


def demo_settings(
    workdir: Path, *, receiver_url: str | None, secret: str | None, hang_floor_s: float = QUIET_FLOOR_S
) -> tuple[Settings, str | None]:
    """The agent's settings for one fault, and why webhooks are off (None: they are on)."""
    data: dict[str, Any] = {
        "node_name": "trainmedic-demo",
        "log_format": "text",
        "log_level": "WARNING",
        # Container logs come through the API (no /var/log/pods here); kernel lines from the nodes'
        # kern.log files, each followed by its node agent; device metrics from the nodes' simulated
        # exporters through the metrics watcher (agent/demo/metrics.py); no NVML.
        "kubernetes": {"follow_pod_logs": True},
        "logs": {"enabled": False},
        "kernel": {"source": "off"},
        "metrics": {"nvml": False, "prometheus_url": DEMO_METRICS_URL, "interval_s": METRICS_INTERVAL_S},
        "detect": {"window_s": WINDOW_S, "hang_floor_s": hang_floor_s, "tick_s": TICK_S},
        "remediate": {
            "mode": "enforce",
            "policy": str(demo_policy(workdir / "policy.yaml")),
            "store": str(workdir / "trainmedic.db"),
            "scene_dir": str(workdir / "scenes"),
            "checkpoint_path_map": {MOUNT: str(workdir / "shared-volume")},
            "wait_gone_s": 10,
            "log_lines": 2000,
            # The demo's minutes: the last two before the fault, a sample every two seconds.
            "metrics_window_s": 120,
            "metrics_step_s": 2,
        },
    }
    fields = Settings.model_fields
    if "api" in fields:
        data["api"] = {"enabled": False}
    why_off: str | None = None
    if "notify" not in fields:
        why_off = "no notify settings"
    elif receiver_url is None:
        why_off = "no receiver"
    else:
        sink: dict[str, Any] = {"kind": "cloudevents", "name": "demo-receiver", "url": receiver_url}
        if secret is not None:
            sink["secret"] = secret
        data["notify"] = {"sinks": [sink], "source": "trainmedic-demo", "retry_initial_s": 0.2, "retry_max_s": 2}
    try:
        return Settings.model_validate(data), why_off
    except ValueError as e:
        if "notify" not in data:
            raise
        data.pop("notify")
        return Settings.model_validate(data), f"notify settings refused: {str(e).splitlines()[0]}"


Inspect = Callable[[DemoCluster, FaultResult], None]


# -- one fault -----------------------------------------------------------------------------------------


async def run_fault(
    fault: str,
    workdir: Path,
    progress: Progress,
    *,
    receiver: WebhookReceiver | None = None,
    timeout_s: float = 45.0,
    inspect: Inspect | None = None,
) -> FaultResult:
    """Run one fault end to end; never raises for what went wrong in the run (see `problems`).
    `inspect` sees the cluster and the result once the run is over, before the cluster goes."""
    sc = SCENARIOS[fault]
    result = FaultResult(fault=fault, workdir=str(workdir))
    workdir.mkdir(parents=True, exist_ok=True)
    progress.t0 = None
    progress.heading("header", fault=fault, title=sc.title[1] if progress.lang == "zh" else sc.title[0])
    try:
        await asyncio.wait_for(_run(sc, workdir, progress, receiver, result, inspect), timeout_s)
    except TimeoutError:
        result.problems.append(f"not done within {timeout_s:g} s")
    except Exception as e:  # the demo reports what broke, as a problem of this fault, not a traceback
        log.debug("demo %s failed", fault, exc_info=True)
        result.problems.append(f"{type(e).__name__}: {e}")
    result.ok = not result.problems
    conclude(result, progress)
    return result


async def _run(
    sc: Scenario,
    workdir: Path,
    progress: Progress,
    receiver: WebhookReceiver | None,
    result: FaultResult,
    inspect: Inspect | None,
) -> None:
    from trainmedic.agent.run import build_agent, run_agent

    secret = secrets.token_hex(16)
    if receiver is not None:
        receiver.secret = secret.encode()
    mark = receiver.mark() if receiver is not None else 0
    settings, webhooks_off = demo_settings(
        workdir,
        receiver_url=receiver.url if receiver is not None else None,
        secret=secret,
        hang_floor_s=sc.hang_floor_s,
    )
    shared = workdir / "shared-volume"
    shared.mkdir(parents=True, exist_ok=True)
    async with KubeEmulator() as kube:
        cluster = Cluster(kube)
        await add_nodes(cluster)
        world = World(mounts={MOUNT: shared}, profiles={sc.job: sc.profile})
        controllers = Controllers(cluster, world)
        kernels = NodeKernelLogs(workdir / "nodes", [*GPU_NODES, *NPU_NODES])
        metrics = DemoMetrics(GPU_NODES, NPU_NODES)
        agent = build_agent(
            settings, Role.ALL, bus=MemoryBus(partitions=4), api_client=kube.api_client(), prom_client=metrics
        )
        if agent.responder is None:
            raise RuntimeError(f"the responder is off: {agent.disabled.get('responder', 'unknown reason')}")
        agent.components.update(
            kernels.sources(bus=agent.bus, job_index=agent.job_index, telemetry=agent.telemetry, poll_interval=0.05)
        )
        progress.line("cluster", gpu=len(GPU_NODES), npu=len(NPU_NODES))
        if webhooks_off is None and receiver is not None:
            progress.line("webhook_sink", url=receiver.url)
        else:
            result.warnings.append(f"webhooks off: {webhooks_off}")
            progress.line("no_notify", why=webhooks_off)
        stop = asyncio.Event()
        agent_task = asyncio.create_task(run_agent(agent, drain_timeout_s=10), name="demo:agent")
        controllers_task = asyncio.create_task(controllers.run(stop), name="demo:controllers")
        store = IncidentStore(settings.remediate.store)
        dc = DemoCluster(kube, cluster, world, controllers, kernels, agent, store, progress, workdir, metrics=metrics)
        watch = IncidentWatch(store, sc.job, progress)
        world.on_event = _world_events(dc, sc)
        watcher = asyncio.create_task(_poll(watch, stop), name="demo:watch")
        try:
            async with asyncio.timeout(15):
                await agent.responder.ready.wait()
                if agent.brain is not None:
                    await agent.brain.ready.wait()  # its vendor catalogs are loaded by then
            run = await _start_job(dc, sc)
            what = await sc.inject(dc, run) if sc.inject is not None else ("", "")
            progress.line("injected", at=dc.t0, what=what[1] if progress.lang == "zh" else what[0])
            expected_ckpt = _expected_checkpoint(sc, run)
            await _until_done(dc, sc, watch)
            watch.poll()
            await _flush_notifications(agent)
            watch.poll()
            _collect(dc, sc, watch, result, expected_ckpt)
            if receiver is not None and webhooks_off is None:
                got = receiver.since(mark)
                result.webhooks_delivered = len(got)
                checked = [d.verified for d in got if d.verified is not None]
                result.webhooks_verified = sum(1 for v in checked if v) if checked else None
                progress.line("webhooks_total", n=len(got))
            await read_reports(store, progress, result)
            if inspect is not None:
                inspect(dc, result)
        finally:
            stop.set()
            await asyncio.gather(watcher, controllers_task, return_exceptions=True)
            agent.stop.set()
            await _stop_agent(agent_task)
            store.close()


async def _stop_agent(task: asyncio.Task[None]) -> None:
    """Wait for the agent's graceful stop (it drains and commits), then cancel it after 15 s."""
    done, _ = await asyncio.wait({task}, timeout=15)
    if not done:
        busy = sorted(t.get_name() for t in asyncio.all_tasks() if t.get_name().startswith(("trainmedic:", "podlog")))
        log.warning("demo: the agent did not stop within 15 s (still running: %s); cancelled", busy)
        task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def _poll(watch: IncidentWatch, stop: asyncio.Event) -> None:
    while not stop.is_set():
        try:
            watch.poll()
        except Exception:  # a read racing the agent's write: the next round sees it
            log.debug("incident watch", exc_info=True)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(0.05):
                await stop.wait()


def _world_events(dc: DemoCluster, sc: Scenario) -> Callable[[str, Incarnation, Mapping[str, Any]], None]:
    def on_event(what: str, inc: Incarnation, detail: Mapping[str, Any]) -> None:
        if inc.name != sc.job:
            return
        p = dc.progress
        if what == "scheduled":
            nodes = ", ".join(detail.get("nodes") or [])
            if dc.first is None or dc.first is inc:
                kind = f"{inc.workload.get('kind')} ({inc.workload.get('apiVersion')})"
                p.line("job_running", job=f"{kind} {inc.namespace}/{inc.name}", nodes=nodes)
            else:
                p.line("rescheduled", nodes=nodes)
            if dc.metrics is not None:
                for node in detail.get("nodes") or []:
                    dc.metrics.resume(node)
        elif what == "unschedulable":
            p.line("pending", message=detail.get("message"))
        elif what == "resumed":
            p.line(
                "resumed",
                checkpoint=_short_ckpt(detail.get("checkpoint")),
                step=detail.get("step"),
                nodes=", ".join(inc.nodes),
            )

    return on_event


async def _start_job(dc: DemoCluster, sc: Scenario) -> TrainingRun:
    """Create the workload and wait until it trains, has checkpoints and is watched by the agent."""
    body = job_body(dc.cluster, sc) if sc.resource == JOB else volcano_body(dc.cluster, sc)
    await dc.cluster.create(sc.resource, body)
    deadline = time.monotonic() + 20
    inc = None
    while inc is None or inc.run is None:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the job {sc.job} did not start")
        await asyncio.sleep(0.02)
        inc = dc.controllers.current(sc.job)
    dc.first = inc
    run = inc.run
    if not await run.wait(sc.ready, 20):
        raise RuntimeError(f"the job {sc.job} made no progress")
    # The agent must see the pods: their logs followed, and their nodes indexed (kernel lines fan
    # out to the jobs on a node).
    while not all(
        dc.cluster.open_log_streams(r.pod) > 0
        and any(j.name == sc.job for j in dc.agent.job_index.jobs_on_node(r.node or ""))
        for r in run.ranks
    ):
        if time.monotonic() > deadline:
            raise RuntimeError("the agent did not start following the job's pods")
        await asyncio.sleep(0.02)
    if not await run.wait(sc.ready, 20):
        raise RuntimeError(f"the job {sc.job} made no progress")
    dc.progress.line("training", step=run.step, checkpoints=", ".join(_ckpt_name(sc, s) for s in run.saved))
    return run


def _ckpt_name(sc: Scenario, step: int) -> str:
    return f"checkpoint-{step}" if sc.profile.framework == "hf" else f"iter_{step:07d}"


def _expected_checkpoint(sc: Scenario, run: TrainingRun) -> str | None:
    if not run.saved:
        return None
    return f"{sc.profile.checkpoint_dir}/{_ckpt_name(sc, run.saved[-1])}"


async def _until_done(dc: DemoCluster, sc: Scenario, watch: IncidentWatch) -> None:
    """Until the scenario's incidents are finished and, where the policy restarts, training resumed."""
    while True:
        watch.poll()
        finished = watch.terminal()
        if len(finished) >= sc.incidents:
            last = finished[-1]
            if last.status in (IncidentStatus.FAILED, IncidentStatus.BLOCKED, IncidentStatus.REJECTED):
                return
            if not any(a.name == "restart_from_checkpoint" for a in last.actions):
                return  # nothing will resume: the result says so
            if not sc.restart or _resumed(dc, sc, min_steps=3):
                return
        await asyncio.sleep(0.05)


def _resumed(dc: DemoCluster, sc: Scenario, *, min_steps: int) -> bool:
    inc = dc.controllers.current(sc.job)
    if inc is None or inc is dc.first or inc.run is None:
        return False
    return inc.run.resumed_from is not None and inc.run.steps_done >= min_steps


async def _flush_notifications(agent: Any) -> None:
    notifier = getattr(agent, "notifier", None)
    if notifier is None or not hasattr(notifier, "flush"):
        return
    try:
        await notifier.flush(5.0)
    except Exception:  # undelivered notices stay in the outbox; the receiver's count says so
        log.warning("demo: flushing notifications failed", exc_info=True)


def collect_incident(watch: IncidentWatch, progress: Progress, r: FaultResult) -> Incident | None:
    """The result's incident fields, read from the store (the last incident of the fault's job), and
    the restart's outcome; None (and a problem noted) when no incident was opened."""
    incidents = watch.incidents()
    if not incidents:
        r.problems.append("no incident was opened")
        return None
    last = incidents[-1]
    r.incidents = [i.id for i in incidents]
    r.incident_id = last.id
    r.fault_class, r.code, r.chip, r.node = last.fault_class, last.code, last.chip, last.node
    r.status = last.status.value
    r.scene_dir = last.scene_dir
    r.actions = [f"{a.name}:{a.state.value}" for a in last.actions]
    r.hints = [progress.i18n(h) for h in (last.plan or {}).get("hints") or []]
    restart = next((a for a in last.actions if a.name == "restart_from_checkpoint"), None)
    if restart is not None and restart.result:
        r.rescheduled_job = restart.result.get("workload")
        r.checkpoint = restart.result.get("resumed_from")
        r.excluded_nodes = list(restart.result.get("excluded_nodes") or [])
    return last


def _collect(dc: DemoCluster, sc: Scenario, watch: IncidentWatch, r: FaultResult, expected: str | None) -> None:
    """The result fields, read from the store and the cluster (never from what the demo intended)."""
    last = collect_incident(watch, dc.progress, r)
    if last is None:
        return
    if watch.first_detected is not None and dc.t0 is not None:
        r.detect_ms = max(0.0, (watch.first_detected - dc.t0) * 1000)
    r.quarantined_nodes = sorted(
        str(n["metadata"]["name"])
        for n in dc.kube.objects(NODE)
        if any(t.get("key") == "trainmedic.io/unhealthy" for t in (n.get("spec") or {}).get("taints") or [])
    )
    inc = dc.controllers.current(sc.job)
    if inc is not None and inc is not dc.first:
        r.rescheduled_to = inc.nodes
        if inc.run is not None and inc.run.first_step_at is not None and dc.t0 is not None:
            r.resumed_step = inc.run.step - inc.run.steps_done + 1
            r.recover_ms = (inc.run.first_step_at - dc.t0) * 1000
    r.healed = _resumed(dc, sc, min_steps=1) if sc.restart else None
    # What the demo expects of the shipped policy for this fault.
    if last.fault_class != sc.fault_class:
        r.problems.append(f"diagnosed {last.fault_class} {last.code}, expected {sc.fault_class}")
    if len(r.incidents) < sc.incidents:
        r.problems.append(f"{len(r.incidents)} incident(s), expected {sc.incidents}")
    if last.status is not IncidentStatus.RESOLVED:
        r.problems.append(f"incident {last.id[:8]} ended {last.status.value}")
    if sc.quarantine and (last.node or "?") not in r.quarantined_nodes:
        r.problems.append(f"node {last.node} was not quarantined")
    if sc.restart:
        if not r.healed:
            r.problems.append("the job did not resume training")
        if expected is not None and r.checkpoint != expected:
            r.problems.append(f"resumed from {r.checkpoint}, expected the last complete checkpoint {expected}")
        if set(r.rescheduled_to) & set(r.quarantined_nodes):
            r.problems.append(f"the job runs on a quarantined node: {r.rescheduled_to}")
    elif any(a.name == "restart_from_checkpoint" for a in last.actions):
        r.problems.append("the job was restarted; the policy only notifies for this fault")


async def read_reports(store: IncidentStore, progress: Progress, r: FaultResult) -> None:
    """The reports the responder wrote beside the scene when the incident settled (its timeline's
    `report` entry names the files); the demo only reads them back."""
    if r.incident_id is None:
        return
    files: list[str] = []
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(10):
            while not files:
                for e in await asyncio.to_thread(store.timeline, r.incident_id):
                    if e["kind"] == "report":
                        files = [str(f) for f in (e.get("detail") or {}).get("files") or []]
                if not files:
                    await asyncio.sleep(0.05)
    if not files:
        r.warnings.append("no report was written for the incident")
        progress.line("no_report", why="no report in the incident's timeline")
        return
    # report.<lang>.<fmt> -> "<lang>.<fmt>", as write_reports names them.
    r.reports = {Path(f).name.removeprefix("report."): f for f in files}
    html = [k for k in r.reports if k.endswith(".html")]
    pick = next((k for k in html if k.startswith(progress.lang)), None) or (html[0] if html else None)
    r.report_html = r.reports[pick] if pick is not None else None
    if r.report_html:
        progress.line("report", path=r.report_html)


def conclude(r: FaultResult, progress: Progress) -> None:
    """The outcome line of a fault, and its warnings."""
    if not r.ok:
        progress.result("failed", problems="; ".join(r.problems))
    elif r.healed:
        progress.result("healed", detect=duration(r.detect_ms), recover=duration(r.recover_ms))
    else:
        progress.result("notified_only", detect=duration(r.detect_ms))
    for w in r.warnings:
        progress.result("warning", what=w)
