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

The parts: agent/demo/stage.py (the demo's settings, `DemoCluster`, `FaultResult` and the incident
watch), agent/demo/faults.py (`Scenario`, each fault's injection, `SCENARIOS`), agent/demo/setup.py
(the nodes, the jobs' bodies, the demo's policy and settings); this module runs a fault
(`run_fault`) and re-exports the names importers use.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from trainmedic.agent.bus.memory import MemoryBus
from trainmedic.agent.config import Role
from trainmedic.agent.demo.emulator import JOB, NODE, Cluster, KubeEmulator
from trainmedic.agent.demo.faults import SCENARIOS, Scenario
from trainmedic.agent.demo.metrics import DemoMetrics
from trainmedic.agent.demo.output import Progress, duration
from trainmedic.agent.demo.receiver import WebhookReceiver
from trainmedic.agent.demo.setup import add_nodes, demo_settings, job_body, volcano_body
from trainmedic.agent.demo.stage import (
    FAULTS,
    GPU_NODES,
    MOUNT,
    NPU_NODES,
    DemoCluster,
    FaultResult,
    IncidentWatch,
    _short_ckpt,
)
from trainmedic.agent.demo.training import Controllers, Incarnation, NodeKernelLogs, TrainingRun, World
from trainmedic.agent.store import Incident, IncidentStatus, IncidentStore

__all__ = [
    "FAULTS",
    "MOUNT",
    "SCENARIOS",
    "DemoCluster",
    "FaultResult",
    "IncidentWatch",
    "Inspect",
    "Scenario",
    "demo_settings",
    "job_body",
    "run_fault",
    "volcano_body",
]

log = logging.getLogger("trainmedic.demo")


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
