"""Soak: `trainmedic run --role all`'s brain and memory bus under sustained load (`make soak`).

    python -m bench.soak [--minutes 3] [--lines-per-s 20000] [--faults-per-s 20] [--bus memory|kafka]
                         [--tracemalloc]

The agent is built exactly as `trainmedic run --role all` builds it (agent/run/build.py `build_agent`:
the memory bus, the brain, the loop-lag monitor; no Kubernetes API, so no watcher and no
responder), and a paced publisher in the same process feeds its bus as the watchers would:

* 100-line batches of healthy training logs of the jobs alive (one step-progress line in ten, the
  rest a trainer's usual chatter), `--lines-per-s` lines a second, encoded as the node's tailer
  would send them (the publisher's own cost is kept small: it shares the process and the loop);
* `--faults-per-s` new job names a second: each starts Running, logs one fault line (an NCCL
  watchdog timeout) in its first batch, is reported Failed (workload and pod) `--fail-after-s`
  later and deleted `--delete-after-s` after that, as a real cluster reports them.

`--bus kafka` runs the same agent and the same paced load through a real Apache Kafka broker
(KRaft, one JVM; tests/servers/kafka.py starts it from the jars `make kafka` caches), the agent's
bus being `bus.kind: kafka` as a production brain has it. The broker's own memory is not the
agent's: the RSS measured is this process's only. Its slope is `soak_rss_slope_mb_per_min`.

`--responder` also runs the responder, as `--role all` builds it, in observe mode against the real
kube-apiserver with six KWOK nodes (`--plane real`, the default: tests/servers/kubeplane.py, in its
own processes, from the binaries `make cluster` caches) or the in-process API emulator (`--plane
emulator`, agent/demo/emulator.py: it takes most of the agent's loop itself, so it measures the
emulator). The soak's jobs have no objects there, so each incident is opened, its scene gathered
from what the API has, and closed `observed`. It adds `soak_incidents_settled_per_s` (incidents
that left `open` during the load, per second of load: at most the diagnoses' rate, not the
responder's ceiling), `soak_incidents`, `soak_incidents_pending_end` (still `open` `--settle-s`
after the load stopped; `soak_incidents_pending_final_end` of them had their final diagnosis) and
`soak_incidents_degraded` (handled observe-only because more than `remediate.max_pending` waited).

`--all` is what `make soak` runs: the memory bus (its figures named `soak_memory_bus_*`), then
Apache Kafka with the responder against the real kube-apiserver (the `soak_*` figures), then the
responder's ceiling with `--all-ceiling` diagnoses; every figure merged into `--results`.

`--ceiling N` measures the responder's ceiling instead, `responder_incidents_per_s`: the agent as
above with nothing published but N final diagnoses at once, about `--ceiling-jobs` one-pod batch
Jobs Running on the KWOK nodes (so each scene has a workload, pods, logs, events and nodes), with
room for all of them (`remediate.max_pending` = N: none is shed); N over the seconds until every
incident has left `open`.

Figures (one JSON object on stdout, and merged into bench/results.json with `--results`):
`soak_minutes`, `soak_bus`, `soak_memory_bus_rss_slope_mb_per_min` (least squares over the RSS
samples after `--warmup-s`; `soak_rss_slope_mb_per_min` with `--bus kafka`), `soak_rss_start_mb`,
`soak_rss_end_mb`, `soak_loop_lag_p99_ms` (the agent's own loop-lag monitor, after the warm-up),
`soak_lines_per_s` (read by the brain), `soak_diagnoses`, `soak_jobs`, `soak_backlog_end` (records
the bus held when the load stopped) and the `trainmedic_state_entries` gauges at the end
(`soak_state_entries`), which must be flat.

`--tracemalloc` takes a snapshot after the warm-up and one at the end and prints the top growing
allocation sites and object types to stderr: where memory goes when the slope is not flat.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import importlib
import json
import logging
import os
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
import tracemalloc
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from trainmedic.agent.config import Role, Settings  # noqa: E402
from trainmedic.agent.run import build_agent, run_agent  # noqa: E402
from trainmedic.agent.telemetry import Telemetry  # noqa: E402
from trainmedic.events import SCHEMA_VERSION, JobRef, PodStatus, Topic, WorkloadStatus, make_event  # noqa: E402

FAULT = (
    "[rank0]:[E1206 18:44:12.755262105 ProcessGroupNCCL.cpp:607] [Rank 0] Watchdog caught collective operation "
    "timeout: WorkNCCL(SeqNum=7753, OpType=ALLREDUCE, NumelIn=544997376, NumelOut=544997376, "
    "Timeout(ms)=600000) ran for 600099 milliseconds before timing out."
)
BATCH = 100
TICK_S = 0.05


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def slope_per_min(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, MB) points, in MB per minute."""
    if len(points) < 2:
        return 0.0
    mx = statistics.fmean(t for t, _ in points)
    my = statistics.fmean(v for _, v in points)
    den = sum((t - mx) ** 2 for t, _ in points)
    return 60.0 * sum((t - mx) * (v - my) for t, v in points) / den if den else 0.0


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


class Publisher:
    """The watchers' side: paced healthy batches, one faulting job per 1/faults-per-s, their end."""

    def __init__(self, agent: Any, args: argparse.Namespace) -> None:
        self.bus = agent.bus
        self.args = args
        self.alive: list[tuple[JobRef, int]] = []  # (job, step)
        self.ending: list[tuple[float, str, JobRef]] = []  # (when, what, job)
        self.jobs = 0
        self.lines = 0
        self.healthy = [
            f"[rank0]: step {{step}} loss 2.{i:03d} lr 3.0e-4 grad_norm 0.9{i} tokens/s 41{i:03d}"
            if i % 10 == 0
            else f"[rank0]:[I1206 18:44:{i % 60:02d}.{i:06d} dataloader.py:{100 + i}] prefetch shard {{step}}-{i} "
            f"queue={i % 7} mem_alloc_gb=61.{i:02d} throughput=41{i:03d} tokens/s"
            for i in range(BATCH)
        ]
        self._seq = 0

    def _pod(self, job: JobRef, phase: str, *, deleted: bool = False, exit_code: int | None = None) -> PodStatus:
        containers: list[dict[str, object]] = []
        if exit_code is not None:
            containers = [{"name": "trainer", "state": "terminated", "exit_code": exit_code, "reason": "Error"}]
        return PodStatus(
            namespace=job.namespace,
            pod=f"{job.name}-worker-0",
            uid=f"uid-{job.name}",
            node=f"gpu-node-{hash(job.name) % 125:03d}",
            job=job,
            rank=0,
            phase=phase,
            deleted=deleted,
            containers=containers,
        )

    async def _send(self, topic: Topic, payload: Any) -> None:
        await self.bus.publish(topic, make_event(payload, producer="soak"))

    async def _batch(self, job: JobRef, step: int, fault: bool) -> None:
        lines = [t.format(step=step + i // 10) for i, t in enumerate(self.healthy)]
        if fault:
            lines[-1] = FAULT
        # The envelope a tailer publishes (trainmedic.events.Event), built as plain JSON.
        self._seq += 1
        key = job.key
        event = {
            "v": SCHEMA_VERSION,
            "id": f"soak{self._seq:028x}",
            "time": time.time(),
            "producer": "soak",
            "key": key,
            "payload": {
                "kind": "log_batch",
                "node": f"gpu-node-{hash(job.name) % 125:03d}",
                "namespace": job.namespace,
                "pod": f"{job.name}-worker-0",
                "container": "trainer",
                "job": {"namespace": job.namespace, "name": job.name},
                "rank": 0,
                "lines": lines,
            },
        }
        await self.bus.publish_raw(Topic.LOGS.value, key, json.dumps(event).encode())
        self.lines += len(lines)

    async def run(self, seconds: float) -> None:
        a = self.args
        loop = asyncio.get_running_loop()
        start = loop.time()
        batches_due = 0.0
        jobs_due = 0.0
        cursor = 0
        tick = 0
        while (now := loop.time()) - start < seconds:
            tick += 1
            jobs_due += a.faults_per_s * TICK_S
            while jobs_due >= 1:
                jobs_due -= 1
                self.jobs += 1
                job = JobRef(namespace="soak", name=f"job-{self.jobs:07d}")
                await self._send(Topic.K8S, self._pod(job, "Running"))
                await self._batch(job, 0, fault=True)
                self.alive.append((job, 1))
                self.ending.append((now + a.fail_after_s, "fail", job))
                self.ending.append((now + a.fail_after_s + a.delete_after_s, "delete", job))
            while self.ending and self.ending[0][0] <= now:
                _, what, job = self.ending.pop(0)
                if what == "fail":
                    self.alive = [(j, s) for j, s in self.alive if j != job]
                    await self._send(Topic.K8S, WorkloadStatus(job=job, phase="Failed", reason="BackoffLimitExceeded"))
                    await self._send(Topic.K8S, self._pod(job, "Failed", exit_code=1))
                else:
                    await self._send(Topic.K8S, WorkloadStatus(job=job, deleted=True))
                    await self._send(Topic.K8S, self._pod(job, "Failed", deleted=True, exit_code=1))
            self.ending.sort(key=lambda e: e[0])
            batches_due += a.lines_per_s / BATCH * TICK_S
            while batches_due >= 1 and self.alive:
                batches_due -= 1
                cursor %= len(self.alive)
                job, step = self.alive[cursor]
                self.alive[cursor] = (job, step + 10)
                cursor += 1
                await self._batch(job, step, fault=False)
            await asyncio.sleep(max(0.0, start + tick * TICK_S - loop.time()))


def _top_growth(before: tracemalloc.Snapshot, after: tracemalloc.Snapshot, n: int) -> list[str]:
    stats = after.compare_to(before, "lineno")
    return [str(s) for s in stats[:n]]


def _types() -> Counter[str]:
    return Counter(type(o).__name__ for o in gc.get_objects())


# Counts beside the incidents by status in `incident_counts`.
NOT_STATUSES = ("degraded", "open_final")


def incident_counts(db: Path) -> Counter[str]:
    """Incidents by status, and how many were handled observe-only for want of room (`degraded`)."""
    if not db.exists():
        return Counter()
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
    try:
        counts = Counter(
            {str(k): int(n) for k, n in con.execute("SELECT status, count(*) FROM incidents GROUP BY status")}
        )
        (degraded,) = con.execute("SELECT count(*) FROM timeline WHERE kind = 'degraded'").fetchone()
        (open_final,) = con.execute(
            "SELECT count(*) FROM incidents WHERE status = 'open' AND json_extract(diagnosis, '$.final')"
        ).fetchone()
    finally:
        con.close()
    counts["degraded"] = int(degraded)
    counts["open_final"] = int(open_final)
    return counts


async def soak(args: argparse.Namespace, bootstrap: str | None = None) -> dict[str, Any]:
    if args.responder and args.plane == "emulator":
        from trainmedic.agent.demo.emulator import KubeEmulator

        async with KubeEmulator() as kube:
            out = await _soak(args, bootstrap, kube.api_client())
            out["soak_responder_plane"] = "emulator"
            return out
    if args.responder:
        plane = _start_plane()
        try:
            out = await _soak(args, bootstrap, plane.api_client())
        finally:
            await asyncio.to_thread(_stop_plane, plane)
        out["soak_responder_plane"] = _plane_name(plane)
        return out
    return await _soak(args, bootstrap, None)


def _test_module(name: str, folder: str = "") -> Any:
    """A module of the tests' own servers and fixtures (tests/, or a folder below it), imported as the
    tests import it."""
    path = str(ROOT / "tests" / folder) if folder else str(ROOT / "tests")
    if path not in sys.path:
        sys.path.insert(0, path)
    return importlib.import_module(name)


def _start_plane() -> Any:
    """tests/servers/kubeplane.py's real control plane (etcd, kube-apiserver, controller manager,
    scheduler, six KWOK nodes), in its own processes, with the soak's namespace."""
    kubeplane: Any = _test_module("servers.kubeplane")
    gone = kubeplane.missing()
    if gone:
        raise SystemExit(f"--plane real: the control plane is not built ({', '.join(gone)}); run `make cluster`")
    plane = kubeplane.KubePlane(Path(tempfile.mkdtemp(prefix="tm-soak-plane-")))
    try:
        plane.start()
        plane.apply([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": CEILING_NS}}])
    except BaseException:
        _stop_plane(plane)
        raise
    return plane


def _stop_plane(plane: Any) -> None:
    plane.stop()
    shutil.rmtree(plane.dir, ignore_errors=True)


def _plane_name(plane: Any) -> str:
    kubeplane: Any = importlib.import_module("servers.kubeplane")
    return f"kube-apiserver {kubeplane.kube_version()} with {len(plane.nodes)} KWOK nodes"


async def _soak(args: argparse.Namespace, bootstrap: str | None, api_client: Any) -> dict[str, Any]:
    bus: dict[str, Any] = {"kind": "memory"} if bootstrap is None else {"kind": "kafka", "bootstrap": bootstrap}
    responder = api_client is not None
    with tempfile.TemporaryDirectory(prefix="tm-soak-") as tmp:
        from trainmedic.agent.config import DetectSettings

        # (detect.job_grace_s is newer than the agent this may measure for a baseline.)
        detect = {"job_grace_s": args.job_grace_s} if "job_grace_s" in DetectSettings.model_fields else {}
        settings = Settings.model_validate(
            {
                "detect": detect,
                "bus": bus,
                "log_format": "text",
                "log_level": "WARNING",
                "kubernetes": {"enabled": responder},
                "logs": {"enabled": False},
                "kernel": {"source": "off"},
                "metrics": {"nvml": False},
                "api": {"enabled": False},
                "remediate": {
                    "enabled": responder,
                    "mode": "observe",
                    "stacks": False,
                    "store": f"{tmp}/tm.db",
                    "scene_dir": f"{tmp}/scenes",
                },
            }
        )
        db = Path(tmp) / "tm.db"
        agent = build_agent(settings, Role.ALL, api_client=api_client)
        if responder and agent.responder is None:
            raise SystemExit(f"--responder: the responder did not start: {agent.disabled.get('responder')}")
        brain = agent.brain
        assert brain is not None
        lag = getattr(agent, "lag", None)
        if lag is None:  # an agent without its own monitor (a baseline): the same measure, from here
            from trainmedic.agent.looplag import LoopLagMonitor

            lag = LoopLagMonitor(Telemetry())
            agent.components["looplag"] = lambda: lag.run(agent.stop)
        runner = asyncio.create_task(run_agent(agent))
        await agent.started.wait()
        await brain.ready.wait()
        pub = Publisher(agent, args)
        samples: list[tuple[float, float]] = []
        t0 = time.monotonic()
        snap: tracemalloc.Snapshot | None = None
        types0: Counter[str] | None = None
        lines_at_warmup = 0
        lag_at_warmup = 0
        t_warm = float(args.warmup_s)

        def lines_read() -> int:
            value = agent.telemetry.registry.get_sample_value("trainmedic_lines_in_total", {"source": "container_log"})
            return int(value or 0)

        async def sample() -> None:
            nonlocal snap, types0, lines_at_warmup, lag_at_warmup, t_warm
            warm = False
            while True:
                await asyncio.sleep(args.sample_s)
                t = time.monotonic() - t0
                samples.append((t, rss_mb()))
                if not warm and t >= args.warmup_s:
                    warm = True
                    if args.tracemalloc:
                        gc.collect()
                        snap = tracemalloc.take_snapshot()
                        types0 = _types()
                    lines_at_warmup = lines_read()
                    lag_at_warmup = lag.taken
                    t_warm = time.monotonic() - t0

        sampler = asyncio.create_task(sample())
        seconds = args.minutes * 60
        await pub.run(seconds)
        sampler.cancel()
        incidents: dict[str, Any] = {}
        if responder:
            during = await asyncio.to_thread(incident_counts, db)
            settled = sum(n for k, n in during.items() if k not in NOT_STATUSES)
            waited = 0.0
            while waited < args.settle_s:  # the brain and the responder go on; the load has stopped
                await asyncio.sleep(1.0)
                waited += 1.0
            after = await asyncio.to_thread(incident_counts, db)
            incidents = {
                "soak_incidents_settled_per_s": round(settled / seconds, 2),
                "soak_incidents": sum(n for k, n in after.items() if k not in NOT_STATUSES),
                "soak_incidents_pending_end": after.get("open", 0),
                # Of those, the ones whose final diagnosis came (the responder is behind on them); the
                # rest still wait for one (the brain's part).
                "soak_incidents_pending_final_end": after.get("open_final", 0),
                "soak_incidents_degraded": after.get("degraded", 0),
                "soak_incidents_by_status": {k: n for k, n in sorted(after.items()) if k not in NOT_STATUSES},
                "soak_settle_s": args.settle_s,
            }
        lines_in = lines_read()
        stats = agent.bus.stats() if hasattr(agent.bus, "stats") else {}
        backlog = {topic: s["records"] for topic, s in stats.items() if s["records"]}
        state = brain.state_sizes() if hasattr(brain, "state_sizes") else {}
        lags = list(lag.samples)[-(lag.taken - lag_at_warmup) :] if lag.taken > lag_at_warmup else []
        if args.tracemalloc and snap is not None and types0 is not None:
            gc.collect()
            end = tracemalloc.take_snapshot()
            print("== top allocation growth after the warm-up ==", file=sys.stderr)
            for line in _top_growth(snap, end, 30):
                print(line, file=sys.stderr)
            grown = _types() - types0
            print("== object types grown ==", file=sys.stderr)
            for name, count in grown.most_common(25):
                print(f"{name}: +{count}", file=sys.stderr)
        agent.stop.set()
        await asyncio.wait_for(runner, 60)
        measured = [p for p in samples if p[0] >= args.warmup_s]
        slope_key = "soak_rss_slope_mb_per_min" if bootstrap else "soak_memory_bus_rss_slope_mb_per_min"
        elapsed = max(1e-9, seconds - t_warm)
        return {
            "soak_minutes": args.minutes,
            "soak_target_lines_per_s": args.lines_per_s,
            "soak_faults_per_s": args.faults_per_s,
            "soak_lines_per_s": round((lines_in - lines_at_warmup) / elapsed),
            "soak_lines_published": pub.lines,
            "soak_lines_read": lines_in,
            "soak_jobs": pub.jobs,
            "soak_diagnoses": brain.diagnoses_published,
            "soak_bus": bus["kind"],
            slope_key: round(slope_per_min(measured), 2),
            "soak_rss_start_mb": round(measured[0][1], 1) if measured else None,
            "soak_rss_end_mb": round(samples[-1][1], 1) if samples else None,
            "soak_loop_lag_p99_ms": round(percentile(lags, 0.99) * 1000, 1),
            "soak_loop_lag_max_ms": round(max(lags, default=0.0) * 1000, 1),
            "soak_backlog_end": backlog,
            "soak_state_entries": state,
            **incidents,
            "soak_load_1m": round(os.getloadavg()[0], 2),
            "soak_cpus": os.cpu_count(),
        }


def _ceiling_job(namespace: str, name: str) -> dict[str, Any]:
    """A one-pod batch/v1 Job (a small CPU request: many fit on the KWOK nodes)."""
    limits = {"cpu": "10m", "memory": "16Mi"}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "backoffLimit": 0,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "terminationGracePeriodSeconds": 0,
                    "containers": [
                        {
                            "name": "trainer",
                            "image": "registry.example/train:1",
                            "command": ["torchrun"],
                            "resources": {"limits": limits, "requests": limits},
                        }
                    ],
                }
            },
        },
    }


async def _ceiling_run(
    args: argparse.Namespace, api_client: Any, jobs: list[tuple[str, str]], tmp: Path
) -> dict[str, Any]:
    """Publish `--ceiling` final diagnoses of `jobs` (name, node) at once on the agent's bus; the rate at
    which the responder settles them (every one leaves `open`), with nothing shed."""
    from trainmedic.events import job_key

    # The responder tests' Xid 79 diagnosis (what the brain publishes for a device error).
    diagnosis = _test_module("respfix", "remediations").diagnosis

    n = args.ceiling
    settings = Settings.model_validate(
        {
            "log_format": "text",
            "log_level": "WARNING",
            "kubernetes": {"enabled": True, "follow_pod_logs": False},
            "logs": {"enabled": False},
            "kernel": {"source": "off"},
            "metrics": {"nvml": False},
            "api": {"enabled": False},
            "remediate": {
                "enabled": True,
                "mode": "observe",
                "stacks": False,
                "store": f"{tmp}/tm.db",
                "scene_dir": f"{tmp}/scenes",
                # The ceiling of full handling: room for every diagnosis, so none is shed.
                "max_pending": max(n, 1),
            },
        }
    )
    agent = build_agent(settings, Role.ALL, api_client=api_client)
    responder = agent.responder
    if responder is None:
        raise SystemExit(f"--ceiling: the responder did not start: {agent.disabled.get('responder')}")
    runner = asyncio.create_task(run_agent(agent))
    await agent.started.wait()
    await responder.ready.wait()
    await asyncio.sleep(2.0)  # the watchers' first lists
    t0 = time.monotonic()
    for i in range(n):
        name, node = jobs[i % len(jobs)]
        d = diagnosis(CEILING_NS, name, node, t=time.time(), n=i)
        await agent.bus.publish(Topic.DIAGNOSES, make_event(d, producer="soak", key=job_key(CEILING_NS, name)))
    deadline = t0 + args.ceiling_timeout_s
    while len(responder.handled) < n and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    elapsed = time.monotonic() - t0
    done = len(responder.handled)
    counts = await asyncio.to_thread(incident_counts, Path(tmp) / "tm.db")
    agent.stop.set()
    await asyncio.wait_for(runner, 60)
    return {
        "responder_incidents_per_s": round(done / elapsed, 2),
        "responder_ceiling_incidents": n,
        "responder_ceiling_settled": done,
        "responder_ceiling_s": round(elapsed, 1),
        "responder_ceiling_jobs": len(jobs),
        "responder_ceiling_by_status": {k: v for k, v in sorted(counts.items()) if k not in NOT_STATUSES},
        "responder_ceiling_degraded": counts.get("degraded", 0),
        "responder_ceiling_max_concurrent": settings.remediate.max_concurrent,
        "responder_ceiling_mode": "observe",
    }


CEILING_NS = "soak"


def ceiling(args: argparse.Namespace) -> dict[str, Any]:
    """`responder_incidents_per_s` against the real kube-apiserver with KWOK nodes (`--plane real`,
    tests/servers/kubeplane.py: etcd, kube-apiserver, controller manager, scheduler, six KWOK nodes, in
    their own processes) or the in-process API emulator (`--plane emulator`, no jobs: every lookup
    answers 404)."""
    with tempfile.TemporaryDirectory(prefix="tm-ceiling-") as tmp:
        if args.plane == "emulator":
            from trainmedic.agent.demo.emulator import KubeEmulator

            async def on_emulator() -> dict[str, Any]:
                async with KubeEmulator() as kube:
                    jobs = [(f"job-{j:04d}", f"gpu-node-{j % 6}") for j in range(args.ceiling_jobs)]
                    return await _ceiling_run(args, kube.api_client(), jobs, Path(tmp))

            out = asyncio.run(on_emulator())
            out["responder_ceiling_plane"] = "emulator"
            return out
        started = time.monotonic()
        plane = _start_plane()
        try:
            names = [f"job-{j:04d}" for j in range(args.ceiling_jobs)]
            for name in names:
                plane.request("POST", f"/apis/batch/v1/namespaces/{CEILING_NS}/jobs", _ceiling_job(CEILING_NS, name))
            where: dict[str, str] = {}
            limit = time.monotonic() + 180
            while len(where) < len(names) and time.monotonic() < limit:
                pods = plane.request("GET", f"/api/v1/namespaces/{CEILING_NS}/pods")["items"]
                for p in pods:
                    if (p.get("status") or {}).get("phase") == "Running":
                        where[p["metadata"]["labels"]["job-name"]] = p["spec"]["nodeName"]
                time.sleep(1.0)
            print(
                f"real plane up and {len(where)} of {len(names)} jobs Running in {time.monotonic() - started:.0f} s",
                file=sys.stderr,
            )
            jobs = [(name, where.get(name, "gpu-1")) for name in names]
            out = asyncio.run(_ceiling_run(args, plane.api_client(), jobs, Path(tmp)))
            out["responder_ceiling_plane"] = _plane_name(plane)
            out["responder_ceiling_jobs_running"] = len(where)
        finally:
            _stop_plane(plane)
        return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=float, default=30.0)
    p.add_argument("--lines-per-s", type=float, default=20_000)
    p.add_argument("--faults-per-s", type=float, default=20)
    p.add_argument("--fail-after-s", type=float, default=40.0)
    p.add_argument("--delete-after-s", type=float, default=20.0)
    p.add_argument("--warmup-s", type=float, default=300.0)
    p.add_argument("--job-grace-s", type=float, default=120.0, help="detect.job_grace_s of the agent")
    p.add_argument("--sample-s", type=float, default=5.0)
    p.add_argument("--bus", choices=("memory", "kafka"), default="memory", help="the agent's bus.kind")
    p.add_argument("--responder", action="store_true", help="run the responder (observe mode, API emulator)")
    p.add_argument("--settle-s", type=float, default=60.0, help="with --responder: wait after the load")
    p.add_argument(
        "--ceiling",
        type=int,
        default=0,
        metavar="N",
        help="instead of the soak: the responder's ceiling, N final diagnoses at once (responder_incidents_per_s)",
    )
    p.add_argument("--ceiling-jobs", type=int, default=50, help="with --ceiling: jobs the diagnoses are about")
    p.add_argument("--ceiling-timeout-s", type=float, default=300.0)
    p.add_argument(
        "--plane",
        choices=("real", "emulator"),
        default="real",
        help="with --responder or --ceiling: the real kube-apiserver with KWOK nodes, or the API emulator",
    )
    p.add_argument("--tracemalloc", action="store_true")
    p.add_argument("--results", type=Path, default=None, help="merge the figures into this JSON file")
    p.add_argument(
        "--all",
        action="store_true",
        help="what `make soak` runs: the memory bus, then Apache Kafka with the responder, then the ceiling",
    )
    p.add_argument("--all-ceiling", type=int, default=400, help="with --all: N of the ceiling run")
    return p.parse_args(argv)


def _with_kafka(args: argparse.Namespace) -> dict[str, Any]:
    """The soak against a real Apache Kafka broker started for it (and stopped after)."""
    kafka: Any = _test_module("servers.kafka")
    KafkaBroker, missing = kafka.KafkaBroker, kafka.missing

    why = missing()
    if why is not None:
        raise SystemExit(f"--bus kafka: {why} (run `make kafka`)")
    with KafkaBroker() as broker:
        return asyncio.run(soak(args, broker.bootstrap))


def _memory_bus_keys(out: dict[str, Any]) -> dict[str, Any]:
    """The memory-bus run's figures under `soak_memory_bus_*`, beside the Kafka run's `soak_*`."""
    named: dict[str, Any] = {}
    for key, value in out.items():
        if key.startswith("soak_memory_bus_") or not key.startswith("soak_"):
            named[key] = value
        else:
            named["soak_memory_bus_" + key.removeprefix("soak_")] = value
    return named


def every_run(args: argparse.Namespace) -> dict[str, Any]:
    """`make soak`: the memory bus, then Apache Kafka with the responder against the real
    kube-apiserver (the `soak_*` figures), then the responder's ceiling (`responder_incidents_per_s`).
    Each part's figures are merged into `--results` as soon as it ends: a later part that fails
    loses only its own."""
    out: dict[str, Any] = {}
    memory = argparse.Namespace(**{**vars(args), "bus": "memory", "responder": False})
    print(f"== soak 1/3: memory bus, {args.minutes:g} minutes ==", file=sys.stderr)
    out.update(_memory_bus_keys(asyncio.run(soak(memory))))
    _merge_results(args.results, out)
    kafka = argparse.Namespace(**{**vars(args), "bus": "kafka", "responder": True})
    print(f"== soak 2/3: Apache Kafka and the responder, {args.minutes:g} minutes ==", file=sys.stderr)
    out.update(_with_kafka(kafka))
    _merge_results(args.results, out)
    print(f"== soak 3/3: the responder's ceiling, {args.all_ceiling} diagnoses ==", file=sys.stderr)
    out.update(ceiling(argparse.Namespace(**{**vars(args), "ceiling": args.all_ceiling})))
    return out


def _merge_results(path: Path | None, out: dict[str, Any]) -> None:
    """Merge `out` into the JSON file at `path` (created if missing)."""
    if path is None:
        return
    results = json.loads(path.read_text()) if path.exists() else {}
    results.update(out)
    path.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.tracemalloc:
        tracemalloc.start(1)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    if args.all:
        out = every_run(args)
    elif args.ceiling > 0:
        out = ceiling(args)
    elif args.bus == "kafka":
        out = _with_kafka(args)
    else:
        out = asyncio.run(soak(args))
    print(json.dumps(out, indent=2))
    _merge_results(args.results, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
