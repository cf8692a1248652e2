"""Self-healing figures on the emulated cluster (`make bench` merges them into its JSON).

    python -m bench.remediation [--iterations 30] [--pods 64] [--lines 10000] [--repeats 3]

The Kubernetes API is kmock's emulator with the cluster stand-in of tests/servers/kube.py (the
scheduler, kubelet and Job controller a test needs, pods/log included), served on loopback by the
same process, so its own work is inside every figure.

* `diagnosis_to_reschedule_p50_ms` / `_p99_ms`: the real agent (`build_agent`, role all, memory
  bus, SQLite incident store, the shipped policy in enforce mode with the circuit breaker at 100 %
  and generous budgets) gets a final Xid 79 diagnosis on `trainmedic.diagnoses`, produced by the
  real engine and correlator from a kernel line and the other rank's NCCL watchdog line. Measured
  from the publish to the moment the emulated API server receives the POST that recreates the Job
  (a kmock catcher on batch/v1 Job creates records time.perf_counter() once the emulator has
  stored the object, then lets the emulator answer). On the way: the incident is opened, the
  scene bundle saved (evidence first: both pods' logs, events, objects, checkpoint listing; 10,000
  lines per container as shipped), the policy decides, the node is quarantined, the replacement
  body is built from the last complete checkpoint, the Job is deleted and its disappearance
  awaited, the replacement created. Each iteration has a fresh 2-pod Indexed Job on 2 fresh
  nodes, an HF Trainer checkpoint directory (one complete checkpoint, one cut short) and a unique
  diagnosis id; the phases come from the incident's timeline in the store
  (`diagnosis_to_reschedule_phases_p50_ms`). One warm-up incident first (`_first_ms`).
* `scene_bundle_64_pods_s`: `save_scene` for a 64-pod job (one pod per node), 10,000 realistic
  training log lines per pod (a few holding secrets to redact, the watchdog line on every rank but
  the faulty one), with the job, pod and node objects, the namespace's events, kernel lines of every
  node, accelerator metrics and the checkpoint listing, read through `KubeOps` over HTTP from the
  emulator (the realistic path); `scene_bundle_64_pods_local_s` is the same bundle from an
  in-memory source holding the very same texts, which separates API time from the writing
  (cleaning, redaction, hashing, fsync). Median of `--repeats` runs each, durable writes as the
  responder does them.
* `diagnosis_to_webhook_p50_ms` / `_p99_ms`: in the same runs as the reschedule figure, the agent
  has one CloudEvents sink (HMAC-signed, `burst` raised so that no notice waits for a digest)
  pointing at a real HTTP receiver on loopback
  (tests/servers/receiver.py, same process); from the diagnosis publish to the arrival of the
  incident's first webhook (status `open`, sent before the scene is saved). `_resolved_webhook_`
  is the same to the `resolved` webhook, after the Job was recreated.
* `report_render_ms`: `report_context` + `render_report` of the 64-pod incident whose scene bundle
  the scene figure saved (evidence lines read from its 10,000-line logs, the metrics chart of its
  nodes): the slowest of Markdown / HTML x English / Chinese, median of 5 each, warm.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
for _p in (ROOT, ROOT / "tests"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

from trainmedic.agent.bus.memory import MemoryBus  # noqa: E402
from trainmedic.agent.config import Role, Settings  # noqa: E402
from trainmedic.agent.run import Agent, build_agent, run_agent  # noqa: E402
from trainmedic.agent.store import IncidentStatus  # noqa: E402
from trainmedic.detectors.diagnose import LogInput, diagnose_inputs, make_engine  # noqa: E402
from trainmedic.detectors.engine import Engine  # noqa: E402
from trainmedic.events import DiagnosisEvent, JobRef, Topic, make_event  # noqa: E402
from trainmedic.models import Source  # noqa: E402
from trainmedic.remediations import checkpoints as ckpt  # noqa: E402
from trainmedic.remediations import workloads as wl  # noqa: E402
from trainmedic.remediations.kube import KubeOps  # noqa: E402
from trainmedic.remediations.scene import SceneInputs, SceneSettings, save_scene  # noqa: E402
from trainmedic.remediations.stacks import ExecResult  # noqa: E402

# The goals the remediation core is held to (the figures it had before its actions were split out).
GOAL_DIAGNOSIS_TO_RESCHEDULE_P99_MS = 200
GOAL_SCENE_BUNDLE_64_PODS_S = 1.5
GOAL_DIAGNOSIS_TO_WEBHOOK_P99_MS = 200.0

SHIPPED_POLICY = ROOT / "remediations" / "policy.yaml"
NAMESPACE = "train"
POOL_LABEL = {"node.kubernetes.io/instance-type": "h100x8"}
JOBS = "batch/v1/jobs"
ANN_INCIDENT = "trainmedic.io/incident"
XID79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid=2876, name=python, GPU has fallen off the bus."
WATCHDOG = (
    "[rank{r}]:[E1206 18:44:12.755262105 ProcessGroupNCCL.cpp:607] [Rank {r}] Watchdog caught collective "
    "operation timeout: WorkNCCL(SeqNum=7753, OpType=ALLREDUCE, NumelIn=544997376, NumelOut=544997376, "
    "Timeout(ms)=600000) ran for 600099 milliseconds before timing out."
)
# Lines a training job really prints that carry credentials (the scene redacts them).
SECRET_LINES = (
    "wandb: Appending key for api.wandb.ai to your netrc file: /root/.netrc "
    "(api_key=7c2b1f0e9d8a7b6c5d4e3f2a1b0c9d8e7f6a5b4c)",
    "Downloading from https://trainer:s3cr3t-pa55@minio.internal:9000/datasets/pile/shard-00017.jsonl",
    "huggingface_hub: login with token hf_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789 (write)",
    "requests: sending Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ0cmFpbmVyIn0.c2lnbmF0dXJlLXZhbHVl",
)
# How the phases of one restart are read from the incident's timeline (kind of the event ending each).
PHASES = (
    ("dispatch", "detected"),
    ("scene", "scene_saved"),
    ("plan", "status:acting"),
    ("quarantine", "action:quarantine_node:done"),
    ("replacement", "action:restart_from_checkpoint:deleting"),
    ("delete_wait", "action:restart_from_checkpoint:creating"),
)


def _log(msg: str) -> None:
    print(f"[bench.remediation] {msg}", file=sys.stderr, flush=True)


def percentile(values: Sequence[float], q: float) -> float:
    """The value at the nearest position to the `q` percentile (0..100) of a non-empty sample, as
    bench/pipeline.py computes it (with 30 samples, p99 is the largest)."""
    ordered = sorted(values)
    idx = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[idx]


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 1)


def training_lines(n: int, *, rank: int, seed: int, faulty: bool) -> list[str]:
    """`n` lines of a rank's log: the benchmark's realistic training mix (Megatron, DeepSpeed, HF
    Trainer, NCCL INFO, tqdm, ...), a credential every 2,500 lines, and on a healthy rank of a job
    whose peer lost its GPU, the NCCL watchdog timeout at the end."""
    from bench.corpus import benign_lines

    lines = benign_lines(n, seed)
    for k, i in enumerate(range(min(1250, n // 2), n, 2500)):
        lines[i] = SECRET_LINES[(k + rank) % len(SECRET_LINES)]
    if not faulty and n:
        lines[-1] = WATCHDOG.format(r=rank)
    return lines


def write_hf_checkpoints(root: Path, complete: int, half_written: int | None = None) -> None:
    """checkpoint-<complete> as the HF Trainer leaves it; checkpoint-<half_written> cut short at the crash."""
    done = root / f"checkpoint-{complete}"
    done.mkdir(parents=True)
    (done / "trainer_state.json").write_text(json.dumps({"global_step": complete}))
    (done / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (done / "model.safetensors").write_bytes(b"\x01" * 65536)
    (done / "optimizer.pt").write_bytes(b"\x02" * 16384)
    if half_written is not None:
        cut = root / f"checkpoint-{half_written}"
        cut.mkdir()
        (cut / "optimizer.pt").write_bytes(b"\x02" * 4096)


def xid79_diagnosis(
    engine: Engine, *, diagnosis_id: str, job: JobRef, bad_node: str, healthy: Mapping[str, tuple[str, int]], now: float
) -> DiagnosisEvent:
    """A final diagnosis as the brain publishes it: the real engine and correlator over the Xid 79
    kernel line of `bad_node` and the watchdog line of every healthy rank (pod -> (node, rank))."""
    inputs = [LogInput(name=f"kmsg:{bad_node}", text=XID79.encode(), source=Source.KERNEL, node=bad_node)]
    for pod, (node, rank) in healthy.items():
        inputs.append(
            LogInput(
                name=f"{job.namespace}/{pod}/trainer",
                text=WATCHDOG.format(r=rank).encode(),
                source=Source.CONTAINER_LOG,
                node=node,
                pod=pod,
                namespace=job.namespace,
                rank=rank,
            )
        )
    diagnosis = diagnose_inputs(inputs, engine)
    rc = diagnosis.root_cause
    if rc is None or rc.code != "xid:79" or rc.node != bad_node:
        raise RuntimeError(f"the correlator did not find Xid 79 on {bad_node}: {rc}")
    return DiagnosisEvent(
        diagnosis_id=diagnosis_id,
        revision=1,
        final=True,
        job=job,
        node=bad_node,
        window_start=now - 30.0,
        window_end=now,
        diagnosis=diagnosis,
    )


def job_body(name: str, *, pods: int, checkpoint_dir: Path) -> dict[str, Any]:
    """An Indexed batch/v1 Job as a team submits it, declaring its checkpoints for the agent."""
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": NAMESPACE,
            "uid": str(uuid.uuid4()),
            "creationTimestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "labels": {"app": "llama-sft", "team": "foundation"},
            "annotations": {
                "trainmedic.io/checkpoint-dir": str(checkpoint_dir),
                "trainmedic.io/resume-args": "--resume_from_checkpoint={checkpoint}",
            },
        },
        "spec": {
            "completions": pods,
            "parallelism": pods,
            "completionMode": "Indexed",
            "backoffLimit": 0,
            "template": {
                "metadata": {"labels": {"app": "llama-sft"}},
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [
                        {
                            "name": "trainer",
                            "image": "registry.example/train:1",
                            "command": ["torchrun", "--nproc_per_node=8", "train.py"],
                            "args": ["--model_name_or_path=/models/llama-3-8b", "--bf16"],
                            "env": [
                                {"name": "NCCL_DEBUG", "value": "INFO"},
                                {"name": "WANDB_API_KEY", "value": "7c2b1f0e9d8a7b6c5d4e3f2a1b0c9d8e7f6a5b4c"},
                            ],
                            "resources": {"limits": {"nvidia.com/gpu": "8", "memory": "512Gi"}},
                        }
                    ],
                },
            },
        },
        "status": {},
    }


# -- diagnosis to reschedule --------------------------------------------------------------------------


@dataclass
class _Creates:
    """When the emulated API server received each Job create, by the incident it carries."""

    at: dict[str, float] = field(default_factory=dict)

    def record(self, request: Any) -> None:
        """A kmock reaction that only records. By then the emulator has stored the object (it does so
        before any reaction); NotImplementedError tells kmock "matched, nothing to answer": the
        emulator's own answer follows and this reaction stays armed (a reaction returning None would
        fall through as well, but only once: kmock disables it after that)."""
        t = time.perf_counter()
        data = request.data if isinstance(request.data, dict) else {}
        annotations = (data.get("metadata") or {}).get("annotations") or {}
        incident = annotations.get(ANN_INCIDENT) if isinstance(annotations, dict) else None
        if isinstance(incident, str):
            self.at.setdefault(incident, t)
        raise NotImplementedError


def forget_requests(kube: Any) -> None:
    """Between iterations: without it the figures would measure kmock's request history (see
    KubeEmulator.forget_requests) rather than the agent."""
    kube.forget_requests()


def _policy_file(path: Path) -> Path:
    """The shipped policy, acting: enforce, the breaker at 100 % of the pool, generous budgets."""
    data = yaml.safe_load(SHIPPED_POLICY.read_text(encoding="utf-8"))
    data["mode"] = "enforce"
    data["circuit_breaker"]["max_share"] = 1.0
    data["budgets"]["restarts"]["max"] = 1000
    data["budgets"]["backoff"]["base"] = "1s"
    data["budgets"]["backoff"]["max"] = "1s"
    path.write_text(yaml.safe_dump(data, allow_unicode=True), encoding="utf-8")
    return path


def _settings(tmp: Path, policy: Path, hook: str | None = None) -> Settings:
    return Settings.model_validate(
        {
            # One message per notice: the rate limit (digests beyond `burst` a minute) is not what
            # this figure measures; 31 incidents make 93 notices.
            "notify": {
                "sinks": [{"kind": "cloudevents", "url": hook, "secret": "bench-secret", "burst": 10_000}]
                if hook
                else []
            },
            "node_name": "bench-brain",
            "log_format": "text",
            "log_level": "WARNING",
            "logs": {"enabled": False},
            "api": {"port": 0},
            "kernel": {"source": "off"},
            "metrics": {"nvml": False},
            "remediate": {
                "mode": "enforce",
                "policy": str(policy),
                "store": str(tmp / "trainmedic.db"),
                "scene_dir": str(tmp / "scenes"),
            },
        }
    )


async def _until(what: str, predicate: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        await asyncio.sleep(0.005)


def _phases(timeline: list[dict[str, Any]], published: float, created: float) -> dict[str, float]:
    """Seconds spent in each phase (wall-clock times of the store's timeline), `create` up to the
    POST reaching the API server."""
    firsts: dict[str, float] = {}
    for e in timeline:
        firsts.setdefault(str(e["kind"]), float(e["t"]))
    out: dict[str, float] = {}
    prev = published
    for phase, kind in PHASES:
        t = firsts.get(kind)
        if t is None:
            raise RuntimeError(f"the incident's timeline has no {kind!r}: {sorted(firsts)}")
        out[phase] = t - prev
        prev = t
    out["create"] = created - prev
    return out


async def measure_reschedule(iterations: int, tmp: Path, *, log_lines: int = 40) -> dict[str, Any]:
    """The diagnosis-to-reschedule figures over `iterations` incidents (see the module docstring)."""
    from servers.kube import Cluster, KubeEmulator, kmock
    from servers.receiver import Receiver

    engine = make_engine(unwrap=False)
    policy = _policy_file(tmp / "policy.yaml")
    run_id = uuid.uuid4().hex[:8]
    latencies: list[float] = []
    hooks: list[float] = []
    resolved_hooks: list[float] = []
    first = float("nan")
    phases: list[dict[str, float]] = []
    async with KubeEmulator() as kube, Receiver() as rx:
        settings = _settings(tmp, policy, hook=f"{rx.url}/hook")

        def arrival(dedup_key: str) -> float | None:
            for r in rx.accepted:
                if r.header("x-trainmedic-dedup-key") == dedup_key:
                    return float(r.time)
            return None

        cluster = Cluster(kube)
        creates = _Creates()
        kube.handler[kmock.action.CREATE, kmock.resource(JOBS)] << creates.record
        agent: Agent = build_agent(settings, Role.ALL, bus=MemoryBus(partitions=4), api_client=kube.api_client())
        if agent.responder is None:
            raise RuntimeError(f"the responder is off: {agent.disabled}")
        task = asyncio.create_task(run_agent(agent, drain_timeout_s=10))
        try:
            await asyncio.wait_for(agent.responder.ready.wait(), 30)
            # Incident 0 warms up (first use of the redactor, the checkpoint reader, connection
            # pools): reported on its own, not in the sample.
            for i in range(iterations + 1):
                name = f"llama-{i:03d}"
                nodes = [f"gpu-{i:03d}-a", f"gpu-{i:03d}-b"]
                for n in nodes:
                    await cluster.add_node(n, gpus=8, labels=POOL_LABEL)
                ckpt_dir = tmp / "ckpt" / name
                write_hf_checkpoints(ckpt_dir, 1000, half_written=1500)
                job = await cluster.create(JOBS, job_body(name, pods=2, checkpoint_dir=ckpt_dir))
                pods = await cluster.create_job_pods(job)
                for rank, (pod, node) in enumerate(zip(pods, nodes, strict=True)):
                    await cluster.bind(pod, node)
                    await cluster.start(pod)
                    cluster.write_log(pod, "trainer", *training_lines(log_lines, rank=rank, seed=i, faulty=rank == 1))
                ref = JobRef(namespace=NAMESPACE, name=name)
                diagnosis_id = f"bench-{run_id}-{i:03d}"
                healthy = {pods[0]["metadata"]["name"]: (nodes[0], 0)}
                event = xid79_diagnosis(
                    engine, diagnosis_id=diagnosis_id, job=ref, bad_node=nodes[1], healthy=healthy, now=time.time()
                )
                await asyncio.sleep(0.2)  # the watchers take in the new objects before the clock starts
                wall0, t0 = time.time(), time.perf_counter()
                await agent.bus.publish(Topic.DIAGNOSES, make_event(event, producer="bench", key=ref.key))
                await _until(f"the Job {name} recreated", lambda d=diagnosis_id: d in creates.at, 30)
                latency = creates.at[diagnosis_id] - t0
                await _until(
                    f"incident {diagnosis_id} handled", lambda d=diagnosis_id: d in agent.responder.handled, 30
                )
                status = agent.responder.handled[diagnosis_id]
                if status is not IncidentStatus.RESOLVED:
                    raise RuntimeError(f"incident {diagnosis_id} ended {status.value}, not resolved")
                timeline = await asyncio.to_thread(agent.responder.store.timeline, diagnosis_id)
                opened, resolved = f"{diagnosis_id}/open", f"{diagnosis_id}/resolved"
                await _until(f"the webhooks of {diagnosis_id}", lambda r=resolved: arrival(r) is not None, 30)
                if i == 0:
                    first = latency
                else:
                    phases.append(_phases(timeline, wall0, wall0 + latency))
                    latencies.append(latency)
                    hooks.append(float(arrival(opened) or "nan") - wall0)
                    resolved_hooks.append(float(arrival(resolved) or "nan") - wall0)
                # What the garbage collector does once the Job is gone (outside the measured path).
                for pod in pods:
                    await cluster.delete_pod(pod)
                forget_requests(kube)
        finally:
            agent.stop.set()
            await asyncio.wait_for(task, 60)
    ms = [x * 1000 for x in latencies]
    names = [p for p, _ in PHASES] + ["create"]
    result: dict[str, Any] = {
        "diagnosis_to_reschedule_p50_ms": round(statistics.median(ms), 1),
        "diagnosis_to_reschedule_p99_ms": round(percentile(ms, 99), 1),
        "diagnosis_to_reschedule_max_ms": round(max(ms), 1),
        "diagnosis_to_reschedule_samples": len(ms),
        "diagnosis_to_reschedule_first_ms": _ms(first),
        "diagnosis_to_reschedule_phases_p50_ms": {n: _ms(statistics.median(p[n] for p in phases)) for n in names},
        "diagnosis_to_reschedule_phases_p99_ms": {n: _ms(percentile([p[n] for p in phases], 99)) for n in names},
        "diagnosis_to_reschedule_runs_ms": [round(x, 1) for x in ms],
        "diagnosis_to_reschedule_scene_log_lines": settings.remediate.log_lines,
        "diagnosis_to_webhook_p50_ms": round(statistics.median(h * 1000 for h in hooks), 1),
        "diagnosis_to_webhook_p99_ms": round(percentile([h * 1000 for h in hooks], 99), 1),
        "diagnosis_to_resolved_webhook_p50_ms": round(statistics.median(h * 1000 for h in resolved_hooks), 1),
        "diagnosis_to_resolved_webhook_p99_ms": round(percentile([h * 1000 for h in resolved_hooks], 99), 1),
    }
    return result


# -- scene bundle -------------------------------------------------------------------------------------


Series = Mapping[str, Mapping[str, list[tuple[float, float]]]]


class _MemoryMetrics:
    """Accelerator metrics from memory (the emulator has no Prometheus); no exec (not a hang)."""

    def __init__(self, metrics: Series) -> None:
        self.metrics = metrics

    async def metrics_range(
        self, node: str, start: float, end: float, step: float
    ) -> Mapping[str, list[tuple[float, float]]] | None:
        return self.metrics.get(node)

    async def exec(
        self, namespace: str, pod: str, container: str, command: list[str], *, timeout_s: float
    ) -> ExecResult:
        return ExecResult(error="no exec: the fault is not a hang")


class ApiSceneSource(_MemoryMetrics):
    """The responder's scene source: logs and events through KubeOps, over HTTP to the API server."""

    def __init__(self, ops: KubeOps, metrics: Series) -> None:
        super().__init__(metrics)
        self.ops = ops

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
        return await self.ops.pod_log(
            namespace, pod, container, tail_lines=tail_lines, previous=previous, limit_bytes=limit_bytes
        )

    async def list_events(self, namespace: str, *, involved: set[tuple[str, str]]) -> list[dict[str, Any]]:
        return await self.ops.list_events(namespace, involved=involved)


class LocalSceneSource(_MemoryMetrics):
    """The same answers from memory: what the bundle costs without the API."""

    def __init__(
        self, logs: Mapping[tuple[str, str, bool], str], events: list[dict[str, Any]], metrics: Series
    ) -> None:
        super().__init__(metrics)
        self.logs = logs
        self.events = events

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
        return self.logs.get((pod, container, previous), "")

    async def list_events(self, namespace: str, *, involved: set[tuple[str, str]]) -> list[dict[str, Any]]:
        out = []
        for e in self.events:
            obj = e.get("involvedObject") or {}
            if (obj.get("kind"), obj.get("name")) in involved:
                out.append(e)
        return out


def _metrics(nodes: Sequence[str], now: float, window_s: float = 900.0, step: float = 15.0) -> Series:
    """DCGM series per node (8 GPUs: utilisation, memory used, temperature, power) over the window."""
    out: dict[str, dict[str, list[tuple[float, float]]]] = {}
    points = int(window_s // step)
    for n, node in enumerate(nodes):
        series: dict[str, list[tuple[float, float]]] = {}
        for gpu in range(8):
            for metric, base in (
                ("DCGM_FI_DEV_GPU_UTIL", 97.0),
                ("DCGM_FI_DEV_FB_USED", 71_234.0),
                ("DCGM_FI_DEV_GPU_TEMP", 64.0),
                ("DCGM_FI_DEV_POWER_USAGE", 612.5),
            ):
                series[f'{metric}{{gpu="{gpu}"}}'] = [
                    (now - window_s + k * step, base + ((k + gpu + n) % 7) * 0.5) for k in range(points)
                ]
        out[node] = series
    return out


def _kernel_lines(
    nodes: Sequence[str], bad: str, now: float, per_node: int = 200
) -> dict[str, list[tuple[float, str]]]:
    out: dict[str, list[tuple[float, str]]] = {}
    for node in nodes:
        lines = [
            (
                now - 300 + k,
                f"[{1_000_000 + k}.{k:06d}] mlx5_core 0000:{(k % 8) * 16 + 12:02x}:00.0: "
                f"mlx5_fw_tracer_handle_traces: FW trace {k}",
            )
            for k in range(per_node)
        ]
        if node == bad:
            lines.append((now - 31, XID79))
        out[node] = lines
    return out


async def measure_scene(pods: int, lines: int, repeats: int, tmp: Path) -> dict[str, Any]:
    """save_scene for a `pods`-pod job with `lines` lines per pod, from the API and from memory."""
    from servers.kube import Cluster, KubeEmulator

    engine = make_engine(unwrap=False)
    now = time.time()
    name = "llama-70b"
    nodes = [f"gpu-{k:03d}" for k in range(pods)]
    bad = nodes[pods // 2]
    ckpt_dir = tmp / "scene-ckpt"
    for step in (500, 1000):
        write_hf_checkpoints(ckpt_dir, step)
    write_hf_checkpoints(ckpt_dir, 1500, half_written=2000)
    settings = SceneSettings()
    api_s: list[float] = []
    local_s: list[float] = []
    result: dict[str, Any] = {}
    async with KubeEmulator() as kube:
        cluster = Cluster(kube)
        t_setup = time.perf_counter()
        for n in nodes:
            await cluster.add_node(n, gpus=8, labels=POOL_LABEL)
        created = await cluster.create(JOBS, job_body(name, pods=pods, checkpoint_dir=ckpt_dir))
        pod_objs = await cluster.create_job_pods(created)
        healthy: dict[str, tuple[str, int]] = {}
        for rank, (pod, node) in enumerate(zip(pod_objs, nodes, strict=True)):
            await cluster.bind(pod, node)
            await cluster.start(pod)
            cluster.write_log(pod, "trainer", *training_lines(lines, rank=rank, seed=rank, faulty=node == bad))
            if node != bad:
                healthy[pod["metadata"]["name"]] = (node, rank)
            forget_requests(kube)
        setup_s = time.perf_counter() - t_setup

        ops = KubeOps(kube.api_client())
        try:
            # What the responder reads before the scene: the workload, its pods, their nodes.
            workload = await ops.get_workload("batch/v1", "Job", NAMESPACE, name)
            if workload is None:
                raise RuntimeError(f"the Job {NAMESPACE}/{name} is not in the emulator")
            pod_list = await ops.list_job_pods(NAMESPACE, wl.job_pod_selector(workload))
            node_objs = [n for n in [await ops.get_node(x) for x in nodes] if n is not None]
            listing = ckpt.describe(ckpt.list_checkpoints(ckpt_dir))
            kernel = _kernel_lines(nodes, bad, now)
            metrics = _metrics(nodes, now)
            ref = JobRef(namespace=NAMESPACE, name=name)
            api_source = ApiSceneSource(ops, metrics)
            # The very texts the API answers, for the in-memory run.
            logs = {
                (p["metadata"]["name"], "trainer", False): await ops.pod_log(
                    NAMESPACE, p["metadata"]["name"], "trainer", tail_lines=settings.log_lines
                )
                for p in pod_list
            }
            events = await ops.list_events(NAMESPACE)
            local_source = LocalSceneSource(logs, events, metrics)
            log_bytes = sum(len(t.encode()) for t in logs.values())

            def inputs(run: str) -> SceneInputs:
                d = xid79_diagnosis(engine, diagnosis_id=run, job=ref, bad_node=bad, healthy=healthy, now=now)
                return SceneInputs(
                    incident_id=run,
                    diagnosis=d,
                    workload=workload,
                    pods=pod_list,
                    nodes=node_objs,
                    kernel_lines=kernel,
                    checkpoints=listing,
                    now=now,
                )

            manifest: dict[str, Any] = {}
            for r in range(repeats):
                for label, source, sink in (("api", api_source, api_s), ("local", local_source, local_s)):
                    run = f"scene-{label}-{r}"
                    scene_inputs = inputs(run)
                    forget_requests(kube)
                    t0 = time.perf_counter()
                    res = await save_scene(tmp / "scenes", scene_inputs, source, settings)
                    sink.append(time.perf_counter() - t0)
                    manifest = res.manifest
                    if res.problems:
                        raise RuntimeError(f"the {label} scene has problems: {res.problems}")
            report_ms = await asyncio.to_thread(_measure_report, tmp, inputs(f"scene-api-{repeats - 1}"), result)
        finally:
            ops.close()
    files = manifest.get("files") or []
    result.update(
        {
            "report_render_ms": round(max(report_ms.values()), 1),
            "report_render_by_format_ms": {k: round(v, 1) for k, v in report_ms.items()},
            f"scene_bundle_{pods}_pods_s": round(statistics.median(api_s), 3),
            f"scene_bundle_{pods}_pods_local_s": round(statistics.median(local_s), 3),
            "scene_bundle_runs_s": [round(s, 3) for s in api_s],
            "scene_bundle_local_runs_s": [round(s, 3) for s in local_s],
            "scene_bundle_pods": pods,
            "scene_bundle_lines_per_pod": lines,
            "scene_bundle_log_mb": round(log_bytes / 1e6, 1),
            "scene_bundle_files": len(files),
            "scene_bundle_mb": round(sum(int(f.get("bytes") or 0) for f in files) / 1e6, 1),
            "scene_bundle_redactions": sum(int(f.get("redactions") or 0) for f in files),
            "scene_bundle_setup_s": round(setup_s, 1),
        }
    )
    return result


def _measure_report(tmp: Path, inputs: SceneInputs, out: dict[str, Any], repeats: int = 5) -> dict[str, float]:
    """`report_context` + `render_report` of the 64-pod incident whose scene was just saved: median
    of `repeats` per format and language (ms), the first (cold: templates compiled) apart."""
    from trainmedic.agent.reporting import render_incident
    from trainmedic.agent.store import IncidentStore

    d = inputs.diagnosis
    rc = d.diagnosis.root_cause
    if rc is None or d.job is None:
        raise RuntimeError("the scene's diagnosis has no root cause")
    store = IncidentStore(tmp / "report.db")
    try:
        iid = inputs.incident_id
        store.open_incident(
            iid,
            key=d.job.key,
            diagnosis=d.model_dump(mode="json"),
            revision=d.revision,
            namespace=d.job.namespace,
            job=d.job.name,
            node=rc.node,
            fault_class=rc.fault_class.value,
            code=rc.code,
            chip=rc.chip.value,
        )
        store.set_scene(iid, str(tmp / "scenes" / iid))
        store.set_plan(
            iid,
            {"rule": "device-error-node", "mode": "enforce"},
            "enforce",
            [("quarantine_node", {"node": rc.node}), ("restart_from_checkpoint", {})],
        )
        t0 = time.perf_counter()
        render_incident(store, iid, fmt="html", lang="en")
        out["report_render_first_ms"] = _ms(time.perf_counter() - t0)
        figures: dict[str, float] = {}
        for fmt in ("md", "html"):
            for lang in ("en", "zh"):
                runs = []
                for _ in range(repeats):
                    t0 = time.perf_counter()
                    text = render_incident(store, iid, fmt=fmt, lang=lang)
                    runs.append((time.perf_counter() - t0) * 1000)
                figures[f"{fmt}.{lang}"] = statistics.median(runs)
                out[f"report_{fmt}_{lang}_kb"] = round(len(text.encode()) / 1000, 1)
        return figures
    finally:
        store.close()


# -- entry points ---------------------------------------------------------------------------------------


def run_remediation(*, iterations: int = 30, pods: int = 64, lines: int = 10_000, repeats: int = 3) -> dict[str, Any]:
    """Both figures as a dict (merged into make bench's JSON)."""
    from servers.kube import kmock_available

    if not kmock_available():
        return {"remediation_error": "kmock (the Kubernetes API emulator) is not installed"}
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="tm-bench-remediation-") as tmp:
        d = Path(tmp)
        (d / "reschedule").mkdir()
        (d / "scene").mkdir()
        _log(f"diagnosis to reschedule: {iterations} incidents through the real agent against kmock")
        out = asyncio.run(measure_reschedule(iterations, d / "reschedule"))
        _log(
            f"diagnosis to reschedule: p50 {out['diagnosis_to_reschedule_p50_ms']} ms, "
            f"p99 {out['diagnosis_to_reschedule_p99_ms']} ms; phases p50 {out['diagnosis_to_reschedule_phases_p50_ms']}"
        )
        _log(f"scene bundle: {pods} pods x {lines:,} lines, {repeats} runs from the API and from memory")
        out.update(asyncio.run(measure_scene(pods, lines, repeats, d / "scene")))
        _log(
            f"scene bundle: {out[f'scene_bundle_{pods}_pods_s']} s through the API, "
            f"{out[f'scene_bundle_{pods}_pods_local_s']} s from memory"
        )
    out["remediation_bench_s"] = round(time.perf_counter() - started, 1)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Self-healing figures on the emulated cluster, as one JSON object.")
    ap.add_argument("--iterations", type=int, default=30, help="incidents for diagnosis_to_reschedule (default 30)")
    ap.add_argument("--pods", type=int, default=64, help="pods of the scene-bundle job (default 64)")
    ap.add_argument("--lines", type=int, default=10_000, help="log lines per pod in the scene bundle (default 10,000)")
    ap.add_argument("--repeats", type=int, default=3, help="scene-bundle runs per source (median reported)")
    args = ap.parse_args(argv)
    if min(args.iterations, args.pods, args.lines, args.repeats) < 1:
        ap.error("--iterations, --pods, --lines and --repeats must be at least 1")
    if args.pods < 2:
        ap.error("--pods must be at least 2 (a faulty rank and a healthy one)")
    result = run_remediation(iterations=args.iterations, pods=args.pods, lines=args.lines, repeats=args.repeats)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
