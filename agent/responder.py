"""The responder: a diagnosis becomes an incident; the scene is saved, the policy decides, the cluster
is changed, safely.

    trainmedic.diagnoses --> incident (store) --> scene bundle --> policy plan --> actions --> trainmedic.incidents

Ownership. The responder is a consumer group over `trainmedic.diagnoses`, whose records are keyed by
job like every input event: the member that owns a job's partition is the only one that acts on the
job. Within a member, one serial worker per key (kopf's model): two incidents of one job never
race, incidents of different jobs run side by side.

Order of work for a final diagnosis with a root cause (earlier revisions only protect the job's pods
with the `trainmedic.io/scene` finalizer, so a failed pod is not cleaned away before its logs are
saved):

1. the incident is opened in the store (its id is the diagnosis id: a replay lands on it);
2. evidence first: the scene bundle (logs of every pod, events, objects, kernel lines, metrics,
   findings, checkpoint listing; stacks for a hang, before anything is killed); the finalizers are
   released once it is complete;
3. the policy decides (mode, budgets, backoff, frequency escalation, circuit breaker) and the plan is
   recorded with its actions, whatever the mode: observe / dry-run stop here, approve waits for a
   person (`trainmedic approve`), enforce goes on;
4. each action runs in order, journalled in the store *before* the cluster changes; its code is
   its own module (remediations/actions/<name>.py, the registry `ACTIONS`): this module keeps the
   per-key queues and the incident's state machine. Restart from
   checkpoint records the replacement body, then `deleting`, deletes the original (uid precondition),
   waits until it is gone, records `creating`, creates the replacement. Killed at any point, the
   agent resumes the journal at start: the replacement is created exactly once (a 409 whose object
   carries this incident's annotation is success), and a workload that was never deleted is not
   touched twice.

Errors carry their meaning in their type (remediations/errors.py, `classify`): temporary (429, 5xx,
connection; a workload still terminating) leaves the action in its journal state, tried again after
its delay (escalated to a person past a deadline, still waiting); blocked (the breaker or a budget
refusing at the moment of acting) skips the remaining changes and ends the incident `blocked`;
a stale plan (the job was resubmitted since) is cancelled and the incident ends `observed`;
permanent (RBAC forbidden, invalid, a workload another controller owns, any error nobody expected)
fails the action and the incident, which pages. Nothing is left `acting` and nothing is silently
dropped: every step lands in the incident's timeline and on `trainmedic.incidents`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import functools
import hashlib
import json
import logging
import os
import re
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from trainmedic.agent.bus.base import Bus, OffsetTracker, Record, TopicPartition
from trainmedic.agent.bus.dlq import decode_record
from trainmedic.agent.store import TERMINAL, ActionRecord, ActionState, Incident, IncidentStatus, IncidentStore
from trainmedic.agent.telemetry import Telemetry
from trainmedic.events import DiagnosisEvent, IncidentEvent, JobRef, Topic, make_event
from trainmedic.models import FaultClass, I18nText, RootCause
from trainmedic.ratelog import RateLimitedLog
from trainmedic.remediations import checkpoints as ckpt
from trainmedic.remediations import workloads as wl
from trainmedic.remediations.actions import ACTIONS, ActionCall, Entry
from trainmedic.remediations.actions.quarantine_node import pool_nodes
from trainmedic.remediations.actions.restart_from_checkpoint import identity, lineage_restarts
from trainmedic.remediations.errors import (
    ActionBlocked,
    FatalActionError,
    PermanentActionError,
    StalePlan,
    TemporaryActionError,
    classify,
)
from trainmedic.remediations.kube import KubeError, KubeOps, PermanentKubeError, problem_condition
from trainmedic.remediations.policy import RESERVATION_HOLD_S, ActionName, Mode, Plan, Policy, PolicyContext
from trainmedic.remediations.policy_state import PolicyState
from trainmedic.remediations.scene import SceneInputs, SceneSettings, save_scene, warm_redactor
from trainmedic.remediations.stacks import ExecResult, StackSource, exec_in_pod
from trainmedic.timefmt import parse_rfc3339

if TYPE_CHECKING:
    from trainmedic.agent.notify import Notifier

log = logging.getLogger("trainmedic.responder")
P = ParamSpec("P")
T = TypeVar("T")

SCENE_FINALIZER = "trainmedic.io/scene"

# The workload kinds tried when a diagnosis names a job without its kind (a hang found by key).
_KINDS: tuple[tuple[str, str], ...] = (
    ("batch/v1", "Job"),
    ("batch.volcano.sh/v1alpha1", "Job"),
    ("kubeflow.org/v1", "PyTorchJob"),
)

_UNSAFE_NAME = re.compile(r"[^A-Za-z0-9._-]")
_RESTARTS = frozenset({ActionName.RESTART_FROM_CHECKPOINT, ActionName.RAISE_MEMORY_LIMIT})

MetricsRange = Callable[[str, float, float, float], Awaitable[Mapping[str, list[tuple[float, float]]]]]


# Faults of the node itself (its accelerator or the node): a Node condition and Event in act mode.
NODE_LEVEL_FAULTS = frozenset({FaultClass.DEVICE_ERROR.value, FaultClass.NODE_FAILURE.value})


@dataclass
class ResponderSettings:
    """How the responder acts on diagnoses (the `remediate` settings group)."""

    group: str = "trainmedic-responder"
    scene_dir: Path = Path("/var/lib/trainmedic/scenes")
    # Overrides the policy file's mode when set (observe | dry-run | approve | enforce).
    mode: Mode | None = None
    log_lines: int = 10_000
    stacks: bool = True
    stack_timeout_s: float = 20.0
    metrics_window_s: float = 900.0
    metrics_after_s: float = 60.0
    metrics_step_s: float = 15.0
    # Checkpoint paths as the job declares them -> as this agent sees them (shared volume mounts).
    checkpoint_path_map: dict[str, str] = field(default_factory=dict)
    wait_gone_s: float = 120.0
    # Where the full replacement body of a restart waits between the delete and the create (env
    # values included): the agent's own state directory, mode 0600, never the incident store (served
    # by the API, published to the sinks), which keeps the redacted body and a reference to this
    # file. None: `restart-bodies` beside `scene_dir`.
    body_dir: Path | None = None
    # A workload still terminating this long after its delete (a foreign finalizer, a long grace
    # period) is escalated to a person; the responder keeps waiting and creates the replacement
    # once it is gone (the journal keeps the body).
    gone_deadline_s: float = 3600.0
    approval_poll_s: float = 2.0
    # Between writing a node's circuit-breaker claim and reading the pool's claims back: longer than
    # a write takes to land and than the brains' clocks differ (remediations/actions/quarantine_node.py).
    breaker_settle_s: float = 2.0
    # A node-level fault as a Node condition and an Event on the Node (node-problem-detector style):
    # None when the mode acts (approve, enforce); True in every mode; False never.
    node_conditions: bool | None = None
    # An action that failed temporarily is tried again after this long.
    retry_after_s: float = 10.0
    poll_ms: int = 100
    max_records: int = 100
    # Write report.{en,zh}.{md,html} into the scene directory when an incident settles.
    reports: bool = True
    # Incidents of different jobs handled at once (each job's stay serial); the API client's
    # connection pool is sized to it.
    max_concurrent: int = 16
    # Diagnoses waiting for a turn. Past it, the oldest waiting one is handled observe-only (its
    # incident says why), and past twice as many the responder stops reading until it catches up
    # (the bus holds the rest, bounded): never an unbounded queue.
    max_pending: int = 200
    # Incident ids and final statuses remembered in `handled` (tests, the demo).
    handled_max: int = 10_000


@dataclass
class _Work:
    """One queued piece of a key's work. `degraded`, when set, is why it runs observe-only."""

    run: Callable[[_Work], Awaitable[Any]]
    record: Record | None
    degradable: bool
    seq: int = 0
    degraded: str | None = None


@dataclass
class _KeyWorker:
    queue: asyncio.Queue[_Work]
    task: asyncio.Task[None]


class Responder:
    """Consumes diagnoses and carries incidents through scene, plan and actions."""

    def __init__(
        self,
        bus: Bus,
        kube: KubeOps,
        store: IncidentStore,
        policy: Policy,
        policy_state: PolicyState,
        *,
        settings: ResponderSettings | None = None,
        telemetry: Telemetry | None = None,
        kernel_tail: Mapping[str, Sequence[tuple[float, str]]] | None = None,
        metrics_range: MetricsRange | None = None,
        stack_dumper: Callable[..., Awaitable[Mapping[str, Any]]] | None = None,
        stack_source: StackSource | None = None,
        producer: str = "brain",
        clock: Callable[[], float] = time.time,
        notifier: Notifier | None = None,
    ) -> None:
        self.bus = bus
        self.kube = kube
        self.store = store
        self.policy = policy
        self.policy_state = policy_state
        self.settings = settings or ResponderSettings()
        self.telemetry = telemetry or Telemetry()
        self.kernel_tail = kernel_tail if kernel_tail is not None else {}
        self.metrics_range = metrics_range
        self.stack_dumper = stack_dumper
        # Exec and logs for the dump_stacks action (None: the API server's exec through KubeOps).
        self._stack_source = stack_source
        self.producer = producer
        self.clock = clock
        # Each incident state is queued in the notifier's durable outbox before it is published.
        self.notifier = notifier
        self.tracker = OffsetTracker()
        self._workers: dict[str, _KeyWorker] = {}
        self._assignment: set[TopicPartition] = set()
        self._scheduled: set[str] = set()
        self.ready = asyncio.Event()
        # Completed incident handlings, for tests and the demo: incident id -> final status (the newest
        # `handled_max`).
        self.handled: OrderedDict[str, IncidentStatus] = OrderedDict()
        # Work queued and not started, oldest first (seq -> work); the global bound on work in progress.
        self._waiting: OrderedDict[int, _Work] = OrderedDict()
        self._queued = 0  # every queued item, degraded ones included
        self._seq = 0
        self._slots = asyncio.Semaphore(self.settings.max_concurrent)
        self._policy_thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="trainmedic-policy")
        self._degraded_log = RateLimitedLog(60.0)
        self.degraded = 0
        self.changed = asyncio.Event()

    # -- the consume loop -----------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event | None = None) -> None:
        stop = stop or asyncio.Event()
        consumer = self.bus.consumer([Topic.DIAGNOSES.value], self.settings.group)
        await consumer.start()
        try:
            await asyncio.to_thread(warm_redactor)  # not on the loop with the first scene
            await self.resume()
            self.ready.set()
            last_poll = self.clock()
            while not stop.is_set():
                if self._queued >= 2 * self.settings.max_pending:
                    # Full: what is not read yet waits on the bus (bounded there) until the queue drains.
                    records = []
                    await asyncio.sleep(self.settings.poll_ms / 1000)
                else:
                    records = await consumer.getmany(
                        timeout_ms=self.settings.poll_ms, max_records=self.settings.max_records
                    )
                self._assignment = consumer.assignment()
                for record in records:
                    await self._dispatch(record)
                now = self.clock()
                if now - last_poll >= self.settings.approval_poll_s:
                    last_poll = now
                    await self.poll_store()
                offsets = self.tracker.committable()
                if offsets:
                    await consumer.commit(offsets)
                    self.tracker.committed(offsets)
            await self.drain()
            offsets = self.tracker.committable()
            if offsets:
                await consumer.commit(offsets)
                self.tracker.committed(offsets)
        finally:
            for w in self._workers.values():
                w.task.cancel()
            await asyncio.gather(*(w.task for w in self._workers.values()), return_exceptions=True)
            self._workers.clear()
            await consumer.stop()

    def close(self) -> None:
        """Release the API client and the store (after `run` returned)."""
        self.kube.close()
        self._policy_thread.shutdown(wait=True)
        self.store.close()
        close = getattr(self.policy_state, "close", None)
        if callable(close):
            close()

    async def _dispatch(self, record: Record) -> None:
        self.tracker.track(record)
        event = await decode_record(self.bus, record, self.telemetry)
        if event is None or not isinstance(event.payload, DiagnosisEvent):
            self.tracker.done(record)
            return
        payload, key, tp = event.payload, event.key, record.tp

        def run(work: _Work) -> Awaitable[Incident | None]:
            return self.handle(payload, key=key, tp=tp, degraded=work.degraded)

        self._submit(key, run, record, degradable=True)

    def _submit(
        self, key: str, run: Callable[[_Work], Awaitable[Any]], record: Record | None, *, degradable: bool = False
    ) -> None:
        worker = self._workers.get(key)
        if worker is None or worker.task.done():
            queue: asyncio.Queue[_Work] = asyncio.Queue()
            task = asyncio.create_task(self._work(key, queue), name=f"trainmedic:respond:{key}")
            worker = self._workers[key] = _KeyWorker(queue, task)
        self._seq += 1
        work = _Work(run, record, degradable, seq=self._seq)
        if degradable:
            self._waiting[work.seq] = work
            self._shed()
        self._queued += 1
        worker.queue.put_nowait(work)

    def _shed(self) -> None:
        """Over `max_pending` waiting diagnoses: the oldest are handled observe-only, with the reason."""
        while len(self._waiting) > self.settings.max_pending:
            _, oldest = self._waiting.popitem(last=False)
            oldest.degraded = (
                f"responder over its bounds: more than {self.settings.max_pending} diagnoses waiting "
                f"(remediate.max_pending) with {self.settings.max_concurrent} handled at once "
                "(remediate.max_concurrent); handled observe-only, oldest first"
            )
            self.degraded += 1
            self.telemetry.responder_degraded.inc()

    async def _work(self, key: str, queue: asyncio.Queue[_Work]) -> None:
        """One key's serial worker; exits when idle (kopf's queueing model). At most
        `max_concurrent` workers run work at once."""
        while True:
            try:
                work = await asyncio.wait_for(queue.get(), timeout=30.0)
            except TimeoutError:
                if queue.empty():
                    self._workers.pop(key, None)
                    return
                continue
            try:
                async with self._slots:
                    self._waiting.pop(work.seq, None)
                    await work.run(work)
            except Exception:  # one incident's bug must not stop the others; it is in the log and the store
                log.exception("responding for %s failed", key)
            finally:
                self._waiting.pop(work.seq, None)
                self._queued -= 1
                if work.record is not None:
                    self.tracker.done(work.record)
                queue.task_done()

    def state_sizes(self) -> dict[str, int]:
        """Entries per kind of state held (`trainmedic_state_entries{kind=...}`)."""
        return {
            "responder_workers": len(self._workers),
            "responder_queued": self._queued,
            "responder_waiting": len(self._waiting),
            "responder_scheduled": len(self._scheduled),
            "responder_handled": len(self.handled),
            "responder_offsets_open": self.tracker.open_count(),
        }

    def report(self) -> None:
        for kind, n in self.state_sizes().items():
            self.telemetry.state_entries.labels(kind).set(n)

    async def drain(self) -> None:
        """Wait for every queued diagnosis to be handled (graceful stop, tests)."""
        for w in list(self._workers.values()):
            await w.queue.join()

    def owns(self, incident: Incident) -> bool:
        """True when this member owns the partition the incident's diagnosis came from (or when the
        incident did not come from the bus)."""
        if incident.source_topic is None or incident.source_partition is None:
            return True
        return (incident.source_topic, incident.source_partition) in self._assignment

    # -- store-driven work: resume after a restart, approvals ------------------------------------------

    async def resume(self) -> None:
        """Carry on with incidents a previous run of this agent left half way (the journal): actions
        interrupted (a workload deleted but not yet recreated), or a final diagnosis whose scene or
        plan was not finished (with the memory bus, the diagnosis itself is gone with the process).

        Replacement bodies left on disk by a journal that has ended (a crash between its last step
        and the body's removal) are removed first: env values never outlive the restart."""
        unfinished = await asyncio.to_thread(self.store.unfinished)
        self._drop_bodies({_UNSAFE_NAME.sub("_", i.id)[:200] for i in unfinished}, keep=True)
        for incident in unfinished:
            if self._carrying_on(incident):
                log.info("resuming incident %s (%s): actions were interrupted", incident.id, incident.key)
                await self._execute(incident)
            elif incident.status is IncidentStatus.OPEN and incident.diagnosis.get("final"):
                log.info("resuming incident %s (%s): scene and plan were interrupted", incident.id, incident.key)
                d = DiagnosisEvent.model_validate(incident.diagnosis)
                await self.handle(d, key=incident.key)

    @staticmethod
    def _carrying_on(incident: Incident) -> bool:
        """Acting, or blocked with its journal still under way (escalated while it waits)."""
        if incident.status is IncidentStatus.ACTING:
            return True
        return incident.status is IncidentStatus.BLOCKED and any(
            a.state in (ActionState.RUNNING, ActionState.DELETING, ActionState.CREATING) for a in incident.actions
        )

    async def poll_store(self) -> None:
        """Approved plans (a person ran `trainmedic approve`) and actions waiting for a retry, each run
        on its job's worker so it never races with that job's other work."""
        for incident in await asyncio.to_thread(self.store.carrying_on):
            if not self._carrying_on(incident) or not self.owns(incident):
                continue
            if incident.id in self._scheduled:
                continue
            now = self.clock()
            if any(float((a.result or {}).get("retry_at") or 0.0) > now for a in incident.actions):
                continue  # a temporary failure asked to wait
            self._scheduled.add(incident.id)
            incident_id = incident.id

            def run(_work: _Work, incident_id: str = incident_id) -> Awaitable[None]:
                return self._execute_again(incident_id)

            self._submit(incident.key, run, None)

    async def _execute_again(self, incident_id: str) -> None:
        try:
            incident = await asyncio.to_thread(self.store.get, incident_id)
            if self._carrying_on(incident):
                await self._execute(incident)
        finally:
            self._scheduled.discard(incident_id)

    # -- one diagnosis --------------------------------------------------------------------------------

    async def handle(
        self, d: DiagnosisEvent, *, key: str, tp: TopicPartition | None = None, degraded: str | None = None
    ) -> Incident | None:
        """One diagnosis. `degraded` (the responder is over its bounds): the incident is opened and
        settled observe-only at once, with that reason as a note, no scene and no plan."""
        rc = d.diagnosis.root_cause
        job = d.job
        if rc is None:
            if d.final and job is not None:
                await self._unprotect(job)
            return None
        incident, created = await asyncio.to_thread(
            self.store.open_incident,
            d.diagnosis_id,
            key=key,
            diagnosis=d.model_dump(mode="json"),
            revision=d.revision,
            namespace=job.namespace if job else None,
            job=job.name if job else None,
            job_kind=job.kind if job else None,
            job_api_version=job.api_version if job else None,
            node=rc.node,
            fault_class=rc.fault_class.value,
            code=rc.code,
            chip=rc.chip.value,
            source_topic=tp[0] if tp else None,
            source_partition=tp[1] if tp else None,
        )
        if created:
            # The ops side hears of the incident at once (status open), before the scene and the
            # plan, which may take seconds; every later status follows.
            await self._publish(incident, rc)
        if degraded is not None:
            if d.final and incident.status is IncidentStatus.OPEN:
                return await self._observe_only(incident, d, rc, degraded)
            return incident
        if not d.final:
            # Pods of a job another incident is recreating are that restart's to delete: held for
            # this scene they would hold the restart (its delete waits for them) for nothing new.
            if created and job is not None and await self.restart_under_way(job, incident.id) is None:
                await self._protect(job)
            return incident
        if incident.status is IncidentStatus.OPEN:
            try:
                incident = await self._prepare(incident, d, rc)
            except Exception as exc:  # classified: only a temporary error may leave the incident open
                err = classify(exc)
                if isinstance(err, TemporaryActionError | FatalActionError):
                    raise
                log.error("incident %s: the plan could not be made: %s", incident.id, err)
                await asyncio.to_thread(
                    self.store.set_status, incident.id, IncidentStatus.FAILED, {"error": str(err), "page": True}
                )
                incident = await asyncio.to_thread(self.store.get, incident.id)
                self._finish(incident)
                await self._publish(incident, rc)
                return incident
        if incident.status is IncidentStatus.ACTING:
            incident = await self._execute(incident)
        return incident

    async def _observe_only(self, incident: Incident, d: DiagnosisEvent, rc: RootCause, why: str) -> Incident:
        """Settle an incident observe-only, saying why (the responder was over its bounds)."""
        if d.job is not None:
            await self._unprotect(d.job)
        await asyncio.to_thread(self.store.note, incident.id, "degraded", {"why": why})
        await asyncio.to_thread(
            self.store.set_status, incident.id, IncidentStatus.OBSERVED, {"mode": Mode.OBSERVE.value, "degraded": why}
        )
        incident = await asyncio.to_thread(self.store.get, incident.id)
        # In a storm thousands are shed: one line a minute says how many (each incident notes why).
        if self._degraded_log.ready():
            held = self._degraded_log.take_suppressed()
            log.warning(
                "incident %s for %s: observe-only: %s%s",
                incident.id,
                incident.key,
                why,
                f" ({held} more incident(s) handled observe-only since the last such line)" if held else "",
            )
        self._finish(incident)
        await self._publish(incident, rc)
        return incident

    async def _prepare(self, incident: Incident, d: DiagnosisEvent, rc: RootCause) -> Incident:
        """Scene, then plan. Leaves the incident OBSERVED, AWAITING_APPROVAL, BLOCKED or ACTING."""
        job = d.job
        workload = await self._workload(job) if job is not None else None
        pods = await self._pods(job, workload) if job is not None else []
        if incident.scene_dir is None or not (Path(incident.scene_dir) / "manifest.json").is_file():
            await self._save_scene(incident, d, rc, workload, pods)
        if job is not None:
            await self._unprotect(job, pods)
        incident = await asyncio.to_thread(self.store.get, incident.id)

        stale = _stale(workload, incident.id, d)
        if stale is not None:
            # The evidence is older than the workload's current incarnation (a log or kernel line
            # re-read after an agent restart, about the job trainmedic already recreated).
            await asyncio.to_thread(self.store.note, incident.id, "stale", {"recreated_at": stale})
            await asyncio.to_thread(self.store.set_status, incident.id, IncidentStatus.OBSERVED, {"stale": True})
            incident = await asyncio.to_thread(self.store.get, incident.id)
            log.info(
                "incident %s for %s: its evidence predates the job's recreation at %s; no action",
                incident.id,
                incident.key,
                stale,
            )
            self._finish(incident)
            await self._publish(incident, rc)
            return incident
        ctx = await self._context(incident, rc, workload)
        observed = await asyncio.to_thread(self.store.mark_fault_observed, incident.id)

        def decide() -> Plan:
            # The policy state is SQLite (a durable write per fault): off the loop, in one thread so
            # that decisions stay one at a time, as they were on the loop.
            if observed:
                self.policy.observe_fault(rc, ctx, self.policy_state, incident_id=incident.id)
            plan = self.policy.decide(incident.id, rc, d.diagnosis.findings, ctx, self.policy_state)
            if plan.breaker_open and plan.mode is Mode.ENFORCE:
                self.policy.commit_breaker(ctx, self.policy_state, incident_id=incident.id)
            return plan

        plan = await asyncio.get_running_loop().run_in_executor(self._policy_thread, decide)
        if self.settings.mode is not None:
            plan.mode = self.settings.mode
        planned_for = identity(workload) if workload is not None else None
        actions = [
            (
                a.name.value,
                dict(a.params, identity=planned_for) if a.name in _RESTARTS and planned_for else dict(a.params),
            )
            for a in plan.actions
        ]
        await asyncio.to_thread(self.store.set_plan, incident.id, plan.as_dict(), plan.mode.value, actions)
        incident = await asyncio.to_thread(self.store.get, incident.id)
        status = self._status_for(plan)
        await asyncio.to_thread(self.store.set_status, incident.id, status, {"mode": plan.mode.value})
        incident = await asyncio.to_thread(self.store.get, incident.id)
        log.info(
            "incident %s for %s: %s %s on %s, mode %s, plan %s: %s",
            incident.id,
            incident.key,
            rc.fault_class.value,
            rc.code,
            rc.node or "?",
            plan.mode.value,
            ", ".join(a.name.value for a in plan.actions) or "nothing",
            status.value,
        )
        await self._mark_node(incident, rc, plan)
        if status is not IncidentStatus.ACTING:
            self._finish(incident)
        await self._publish(incident, rc, hints=plan.hints)
        return incident

    async def _mark_node(self, incident: Incident, rc: RootCause, plan: Plan) -> None:
        """A node-level fault becomes the node's Trainmedic*Problem condition and an Event on it, where
        the settings say so. Best effort: the incident goes on when the API refuses (logged, noted)."""
        wanted = self.settings.node_conditions
        if wanted is None:
            wanted = plan.mode in (Mode.APPROVE, Mode.ENFORCE)
        node_level = rc.fault_class.value in NODE_LEVEL_FAULTS or any(
            a.name is ActionName.QUARANTINE_NODE for a in plan.actions
        )
        if not (wanted and node_level and rc.node):
            return
        where = f" ({rc.device})" if rc.device else ""
        message = I18nText(
            en=f"{rc.summary.en}{where}",
            zh=f"{rc.summary.zh}{where}",
        )
        try:
            written = await self.kube.report_node_problem(
                rc.node, incident_id=incident.id, fault_class=rc.fault_class, message=message
            )
        except KubeError as e:
            log.warning("incident %s: node %s condition and event not written: %s", incident.id, rc.node, e)
            await asyncio.to_thread(
                self.store.note, incident.id, "node_condition_failed", {"node": rc.node, "error": str(e)}
            )
            return
        if written:
            await asyncio.to_thread(
                self.store.note,
                incident.id,
                "node_condition",
                {"node": rc.node, "type": problem_condition(rc.fault_class)},
            )

    @staticmethod
    def _status_for(plan: Plan) -> IncidentStatus:
        if plan.mode in (Mode.OBSERVE, Mode.DRY_RUN):
            return IncidentStatus.OBSERVED
        mutating = [a for a in plan.actions if a.name is not ActionName.NOTIFY]
        if plan.blocked is not None and not mutating:
            return IncidentStatus.BLOCKED
        if plan.mode is Mode.APPROVE and mutating:
            return IncidentStatus.AWAITING_APPROVAL
        return IncidentStatus.ACTING

    # -- actions --------------------------------------------------------------------------------------

    async def _execute(self, incident: Incident) -> Incident:
        """Run the incident's remaining actions in order (journalled; safe to call again).

        What a failure means comes from its type (remediations.errors): temporary -> the action
        keeps its journal state and is tried again after its delay; blocked -> the remaining
        changes are skipped and the incident ends `blocked`; permanent (any error nobody expected
        included) -> the action and the incident end `failed`. Either way a person hears of it
        with the incident's status; an incident is never left `acting` by an error."""
        rc = RootCause.model_validate(incident.diagnosis["diagnosis"]["root_cause"])
        failed = False
        retry = False
        blocked: ActionBlocked | None = None
        stale: StalePlan | None = None
        for action in incident.actions:
            if action.state in (ActionState.DONE, ActionState.SKIPPED, ActionState.FAILED):
                failed = failed or action.state is ActionState.FAILED
                continue
            if blocked is not None:
                await self._skip_blocked(incident, action, blocked)
                continue
            try:
                await self._run_action(incident, action, rc)
                self.telemetry.actions.labels(action.name, "done").inc()
            except Exception as exc:  # classified below: every error has a meaning for the incident
                err = classify(exc)
                if isinstance(err, FatalActionError):
                    log.error("incident %s: %s: %s", incident.id, action.name, err)
                    raise err from exc
                if isinstance(err, TemporaryActionError):
                    retry = True
                    self.telemetry.actions.labels(action.name, "retry").inc()
                    delay = err.delay if err.delay is not None else self.settings.retry_after_s
                    current = (await asyncio.to_thread(self.store.get, incident.id)).actions[action.seq]
                    escalated = bool((current.result or {}).get("escalated"))
                    await asyncio.to_thread(
                        self.store.update_action,
                        incident.id,
                        action.seq,
                        ActionState(await self._journal_state(incident, action)),
                        result={
                            "retry": str(err),
                            "retry_at": self.clock() + delay,
                            "escalated": escalated or err.escalate,
                        },
                    )
                    if err.escalate and not escalated:
                        # A person is told (blocked: a person must look) while the journal goes on.
                        await asyncio.to_thread(
                            self.store.note,
                            incident.id,
                            "escalated",
                            {"action": action.name, "why": str(err), "page": True},
                        )
                        await asyncio.to_thread(
                            self.store.set_status,
                            incident.id,
                            IncidentStatus.BLOCKED,
                            {"page": True, "still_waiting": True, "why": str(err)},
                        )
                        await self._publish(await asyncio.to_thread(self.store.get, incident.id), rc)
                    log.warning("incident %s: %s will be retried in %.0f s: %s", incident.id, action.name, delay, err)
                    break
                if isinstance(err, StalePlan):
                    stale = err
                    await asyncio.to_thread(
                        self.store.update_action,
                        incident.id,
                        action.seq,
                        ActionState.SKIPPED,
                        result={"reason": str(err), "stale": True},
                    )
                    log.warning("incident %s: %s", incident.id, err)
                    blocked = ActionBlocked(I18nText(en=str(err), zh="作业在计划制定后已被重新提交或修改：计划作废。"))
                    continue
                if isinstance(err, ActionBlocked):
                    blocked = err
                    self.telemetry.actions.labels(action.name, "blocked").inc()
                    await self._skip_blocked(incident, action, blocked)
                    log.warning("incident %s: %s blocked: %s", incident.id, action.name, err)
                    continue
                failed = True
                self.telemetry.actions.labels(action.name, "failed").inc()
                await asyncio.to_thread(
                    self.store.update_action,
                    incident.id,
                    action.seq,
                    ActionState.FAILED,
                    result={"error": str(err), "stale": isinstance(err, StalePlan)},
                )
                log.error("incident %s: %s failed: %s", incident.id, action.name, err)
                break
        incident = await asyncio.to_thread(self.store.get, incident.id)
        if not retry:
            plan = incident.plan or {}
            status = IncidentStatus.FAILED if failed else IncidentStatus.RESOLVED
            if not failed and (blocked is not None or (plan.get("blocked") and plan.get("page"))):
                status = IncidentStatus.BLOCKED
            if not failed and stale is not None:
                # The plan was for another incarnation of the job: nothing to do, nothing failed.
                await asyncio.to_thread(self.store.note, incident.id, "stale", {"why": str(stale)})
                status = IncidentStatus.OBSERVED
            detail: dict[str, Any] = {"page": True} if status in (IncidentStatus.FAILED, IncidentStatus.BLOCKED) else {}
            if stale is not None:
                detail = {"stale": True, "why": str(stale)}
            elif blocked is not None:
                detail["blocked"] = blocked.why.en
            await asyncio.to_thread(self.store.set_status, incident.id, status, detail)
            incident = await asyncio.to_thread(self.store.get, incident.id)
            self._finish(incident)
            await self._publish(incident, rc)
        return incident

    async def _skip_blocked(self, incident: Incident, action: ActionRecord, blocked: ActionBlocked) -> None:
        """An action after (or at) a refusal of the policy: notifications still go, changes do not."""
        if ActionName(action.name) is ActionName.NOTIFY:
            await asyncio.to_thread(
                self.store.update_action,
                incident.id,
                action.seq,
                ActionState.DONE,
                result={"published": Topic.INCIDENTS.value, "page": True},
            )
            return
        await asyncio.to_thread(
            self.store.update_action,
            incident.id,
            action.seq,
            ActionState.SKIPPED,
            result={"reason": blocked.why.en, "blocked": True},
        )

    async def _journal_state(self, incident: Incident, action: ActionRecord) -> str:
        current = (await asyncio.to_thread(self.store.get, incident.id)).actions[action.seq].state
        return current.value if current is not ActionState.PLANNED else ActionState.RUNNING.value

    async def _run_action(self, incident: Incident, action: ActionRecord, rc: RootCause) -> None:
        """The action's own module runs it (remediations/actions), against this incident's journal."""
        entry = Entry(action.seq, action.name, action.state.value, dict(action.params), action.result)
        journal = _StoreJournal(self.store, incident.id)
        await ACTIONS[action.name].run(ActionCall(journal, entry, rc, _job_of(incident), self))

    # -- the replacement body, kept out of the incident store --

    @property
    def body_dir(self) -> Path:
        return self.settings.body_dir or self.settings.scene_dir.parent / "restart-bodies"

    def save_body(self, incident_id: str, seq: int, body: Mapping[str, Any]) -> dict[str, Any]:
        """Write the full body durably (0600) before the journal says `deleting`; the reference."""
        self.body_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        name = f"{_UNSAFE_NAME.sub('_', incident_id)[:200]}.{seq}.json"
        data = json.dumps(body, ensure_ascii=False, sort_keys=True).encode()
        tmp = self.body_dir / f".{name}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.body_dir / name)
        with contextlib.suppress(OSError):
            dfd = os.open(self.body_dir, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        return {"file": name, "sha256": hashlib.sha256(data).hexdigest()}

    def _drop_bodies(self, names: set[str], *, keep: bool) -> None:
        """Remove the replacement bodies (and half-written ones) of the incidents named (by their
        file-safe id); with `keep`, of every incident but those."""
        try:
            files = list(self.body_dir.iterdir())
        except OSError:
            return
        for f in files:
            stem = f.name.removeprefix(".").removesuffix(".tmp")
            parts = stem.rsplit(".", 2)
            if len(parts) != 3 or parts[2] != "json":
                continue
            if (parts[0] in names) is not keep:
                with contextlib.suppress(OSError):
                    f.unlink()

    def load_body(self, params: Mapping[str, Any]) -> dict[str, Any]:
        ref = params.get("body_ref")
        if not ref:
            return dict(params["body"])  # a journal written before bodies were kept apart
        path = self.body_dir / str(ref["file"])
        try:
            data = path.read_bytes()
        except OSError as e:
            raise PermanentActionError(
                f"the replacement body {path} is unreadable ({e}); the job was deleted: recreate it by hand from "
                "the redacted body in the incident and the scene's objects"
            ) from e
        if hashlib.sha256(data).hexdigest() != ref.get("sha256"):
            raise PermanentActionError(f"the replacement body {path} does not match its journal checksum")
        body: dict[str, Any] = json.loads(data)
        return body

    def drop_body(self, params: Mapping[str, Any]) -> None:
        ref = params.get("body_ref")
        if ref:
            with contextlib.suppress(OSError):
                (self.body_dir / str(ref["file"])).unlink()

    async def find_workload(self, job: JobRef) -> dict[str, Any] | None:
        return await self._workload(job)

    async def restart_under_way(self, job: JobRef, incident_id: str) -> str | None:
        return await asyncio.to_thread(
            self.store.restarting, job.namespace, job.name, besides=incident_id, actions=_RESTARTS
        )

    @property
    def stack_source(self) -> StackSource:
        return self._stack_source or _SceneSource(self)

    async def job_pods(self, job: JobRef) -> list[dict[str, Any]]:
        return await self._pods(job, await self._workload(job))

    async def scene_path(self, incident_id: str) -> Path | None:
        scene = (await asyncio.to_thread(self.store.get, incident_id)).scene_dir
        return Path(scene) if scene else None

    async def policy_context(self, incident_id: str, rc: RootCause) -> PolicyContext:
        return self._ctx_light(await asyncio.to_thread(self.store.get, incident_id), rc)

    async def in_policy(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        fut = asyncio.get_running_loop().run_in_executor(self._policy_thread, functools.partial(fn, *args, **kwargs))
        return await asyncio.shield(fut)

    async def replacement(
        self, incident_id: str, live: dict[str, Any], rc: RootCause
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """The body that replaces `live`, and what went into it (checkpoint, excluded nodes, memory)."""
        spec = wl.resume_spec(live)
        checkpoint = None
        if spec.checkpoint_dir:
            local = self._map_path(spec.checkpoint_dir)
            checkpoint = await asyncio.to_thread(ckpt.latest_complete, local)
            if checkpoint is not None and local != spec.checkpoint_dir:
                checkpoint = dataclasses.replace(checkpoint, path=spec.checkpoint_dir + checkpoint.path[len(local) :])
        exclude = set(await self._bad_nodes(incident_id, rc))
        memory: dict[str, Any] = {}
        for a in self.store.get(incident_id).actions:
            if a.name == ActionName.RAISE_MEMORY_LIMIT.value and a.params.get("max_bytes"):
                memory = {"memory_factor": float(a.params["factor"]), "memory_cap_bytes": int(a.params["max_bytes"])}
            exclude.update(str(n) for n in a.params.get("exclude_nodes") or [])
        body = wl.recreate_body(
            live,
            incident_id=incident_id,
            checkpoint=checkpoint,
            exclude_nodes=sorted(exclude),
            now=self.clock(),
            **memory,
        )
        excluded = _annotation(body, "trainmedic.io/excluded-nodes")
        return body, {
            "checkpoint": checkpoint.path if checkpoint else None,
            "step": checkpoint.step if checkpoint else None,
            "excluded_nodes": excluded.split(",") if excluded else [],
            "memory": memory or None,
        }

    async def _bad_nodes(self, incident_id: str, rc: RootCause) -> list[str]:
        """Nodes the replacement must avoid: the ones this incident quarantined, and every node
        trainmedic holds in quarantine (the taint keeps pods off them too; affinity says it again)."""
        nodes = set()
        for a in self.store.get(incident_id).actions:
            if a.name == ActionName.QUARANTINE_NODE.value and a.state is ActionState.DONE and a.result:
                node = a.result.get("node")
                if node:
                    nodes.add(str(node))
        with contextlib.suppress(KubeError):
            nodes.update(str(n["name"]) for n in await self.kube.quarantined_nodes())
        return sorted(nodes)

    def _map_path(self, path: str) -> str:
        for prefix, local in sorted(self.settings.checkpoint_path_map.items(), key=lambda kv: -len(kv[0])):
            if path == prefix or path.startswith(prefix.rstrip("/") + "/"):
                return local.rstrip("/") + path[len(prefix.rstrip("/")) :]
        return path

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
            spec = wl.resume_spec(workload)
            if spec.checkpoint_dir:
                found = await asyncio.to_thread(ckpt.list_checkpoints, self._map_path(spec.checkpoint_dir))
                listing = ckpt.describe(found)
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

    # -- lookups ----------------------------------------------------------------------------------------

    async def _workload(self, job: JobRef) -> dict[str, Any] | None:
        kinds = [(job.api_version, job.kind)] + [k for k in _KINDS if k != (job.api_version, job.kind)]
        if job.kind == "Pod":
            return None
        for api_version, kind in kinds:
            try:
                obj = await self.kube.get_workload(api_version, kind, job.namespace, job.name)
            except PermanentKubeError:
                continue  # a CRD that is not installed
            if obj is not None:
                return obj
        return None

    async def _pods(self, job: JobRef, workload: Mapping[str, Any] | None) -> list[dict[str, Any]]:
        if workload is None:
            return []
        try:
            return await self.kube.list_job_pods(job.namespace, wl.job_pod_selector(workload))
        except KubeError as e:
            log.warning("cannot list the pods of %s/%s: %s", job.namespace, job.name, e)
            return []

    async def _context(self, incident: Incident, rc: RootCause, workload: Mapping[str, Any] | None) -> PolicyContext:
        try:
            nodes = await pool_nodes(self.kube, self.policy, rc.node)
        except KubeError as e:
            log.warning("cannot list nodes for the circuit breaker: %s", e)
            nodes = []
        pool, pool_size = self.policy.pool_of(rc.node, nodes)
        quarantined = self.policy.pool_quarantined(rc.node, nodes) if nodes else None
        now = self.clock()
        # Claims in flight (a brain about to taint a node) hold their places at plan time too.
        claimed = frozenset(n for _, n in self.policy.pool_claims(rc.node, nodes, since=now - RESERVATION_HOLD_S))
        opt_out = workload is not None and wl.resume_spec(workload).opt_out
        texts = [f.text for f in (incident_findings(incident))]
        return PolicyContext(
            namespace=incident.namespace or "",
            job_key=incident.key,
            node=rc.node,
            device=rc.device,
            pool=pool,
            pool_size=pool_size,
            opt_out=opt_out,
            now=now,
            texts=tuple(texts),
            quarantined=quarantined,
            claimed=claimed - (quarantined or frozenset()),
            lineage_restarts=lineage_restarts(workload),
        )

    def _ctx_light(self, incident: Incident, rc: RootCause) -> PolicyContext:
        plan = incident.plan or {}
        ctx = plan.get("context") or {}
        return PolicyContext(
            namespace=incident.namespace or "",
            job_key=incident.key,
            node=rc.node,
            device=rc.device,
            pool=str(ctx.get("pool", "all")),
            pool_size=int(ctx.get("pool_size") or 1),
            opt_out=False,
            now=self.clock(),
        )

    # -- out --------------------------------------------------------------------------------------------

    def _finish(self, incident: Incident) -> None:
        # The journal is over: no replacement body (env values) stays on disk, whatever the end.
        self._drop_bodies({_UNSAFE_NAME.sub("_", incident.id)[:200]}, keep=False)
        self.handled[incident.id] = incident.status
        self.handled.move_to_end(incident.id)
        while len(self.handled) > self.settings.handled_max:
            self.handled.popitem(last=False)
        self.changed.set()

    async def _publish(self, incident: Incident, rc: RootCause, *, hints: Sequence[I18nText] = ()) -> None:
        job = _job_of(incident)
        payload = IncidentEvent(
            incident_id=incident.id,
            status=incident.status.value,
            job=job,
            node=rc.node,
            root_cause=rc,
            mode=incident.mode,
            scene_dir=incident.scene_dir,
            plan=incident.plan,
            actions=[a.as_dict() for a in incident.actions],
            hints=list(hints),
        )
        event = make_event(payload, producer=self.producer, key=incident.key)
        if self.notifier is not None:
            await self.notifier.enqueue(event)
        await self.bus.publish(Topic.INCIDENTS, event)
        if self.settings.reports and (
            incident.status in TERMINAL or incident.status is IncidentStatus.AWAITING_APPROVAL
        ):
            await self._write_reports(incident.id)

    async def _write_reports(self, incident_id: str) -> None:
        """The incident's reports (both languages, Markdown and HTML) beside its scene; a failure is logged."""
        from trainmedic.agent.reporting import write_reports

        try:
            paths = await asyncio.to_thread(write_reports, self.store, incident_id)
        except Exception as e:  # noqa: BLE001 - a report is never worth failing the incident for
            log.warning("incident %s: the report could not be written: %s", incident_id, e)
            return
        await asyncio.to_thread(
            self.store.note, incident_id, "report", {"files": sorted(str(p) for p in paths.values())}
        )


class _StoreJournal:
    """The incident store as an action's journal (remediations/actions/base.py: Journal)."""

    def __init__(self, store: IncidentStore, incident_id: str) -> None:
        self.store = store
        self.incident_id = incident_id

    async def entries(self) -> list[Entry]:
        actions = (await asyncio.to_thread(self.store.get, self.incident_id)).actions
        return [Entry(a.seq, a.name, a.state.value, dict(a.params), a.result) for a in actions]

    async def update(
        self, seq: int, state: str, *, params: Mapping[str, Any] | None = None, result: Mapping[str, Any] | None = None
    ) -> None:
        # Awaited before the action goes on: the step is on disk before the cluster changes.
        await asyncio.to_thread(
            self.store.update_action, self.incident_id, seq, ActionState(state), params=params, result=result
        )


class _SceneSource:
    """What the scene collector reads, over KubeOps and the agent's metrics."""

    def __init__(self, responder: Responder) -> None:
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


def incident_findings(incident: Incident) -> list[Any]:
    """The findings of the incident's diagnosis, as models (for the policy's hints)."""
    from trainmedic.models import Finding

    raw = ((incident.diagnosis.get("diagnosis") or {}).get("findings")) or []
    return [Finding.model_validate(f) for f in raw]


def _stale(workload: Mapping[str, Any] | None, incident_id: str, d: DiagnosisEvent) -> str | None:
    """When trainmedic recreated `workload` after every piece of the diagnosis's evidence was
    observed, the recreation time (RFC3339); else None."""
    if workload is None or _annotation(workload, "trainmedic.io/incident") in (None, incident_id):
        return None
    try:
        lineage = json.loads(_annotation(workload, "trainmedic.io/lineage") or "[]")
        recreated = str(lineage[-1]["time"])
    except (ValueError, KeyError, IndexError, TypeError):
        return None
    at = parse_rfc3339(recreated)
    if at is None:
        return None
    seen = [f.timestamp for f in d.diagnosis.findings if f.timestamp is not None]
    if seen and max(seen) < at:
        return recreated
    return None


def _annotation(obj: Mapping[str, Any], name: str) -> str | None:
    value = ((obj.get("metadata") or {}).get("annotations") or {}).get(name)
    return str(value) if value is not None else None


def _job_of(incident: Incident) -> JobRef | None:
    if not incident.namespace or not incident.job:
        return None
    return JobRef(
        namespace=incident.namespace,
        name=incident.job,
        kind=incident.job_kind or "Job",
        api_version=incident.job_api_version or "batch/v1",
    )
