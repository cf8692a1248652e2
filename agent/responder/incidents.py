"""The incident state machine, `IncidentMixin` of Responder (core.py): store-driven work (resuming
the journal a previous run left half way, approved plans and retries, each on its job's worker), one
diagnosis from open to scene, policy and plan (`handle`, `_prepare`, observe-only when the responder
is over its bounds, the evidence predates the job's recreation, or someone else is deleting the
job), the node condition of a node-level fault, and the way out (`_finish`, `_publish` on
`trainmedic.incidents`, the reports).
The helpers on incidents and objects used by the other parts (`incident_findings`, `_job_of`,
`_annotation`) live here too.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainmedic.agent.bus.base import Bus, Record, TopicPartition
from trainmedic.agent.responder.settings import _RESTARTS, _UNSAFE_NAME, ResponderSettings
from trainmedic.agent.store import TERMINAL, ActionState, Incident, IncidentStatus, IncidentStore
from trainmedic.events import DiagnosisEvent, IncidentEvent, JobRef, Topic, make_event
from trainmedic.models import FaultClass, I18nText, RootCause
from trainmedic.ratelog import RateLimitedLog
from trainmedic.remediations.actions.restart_from_checkpoint import identity, terminating
from trainmedic.remediations.errors import FatalActionError, TemporaryActionError, classify
from trainmedic.remediations.kube import KubeError, KubeOps, problem_condition
from trainmedic.remediations.policy import ActionName, Mode, Plan, Policy, PolicyContext
from trainmedic.remediations.policy_state import PolicyState
from trainmedic.timefmt import parse_rfc3339

if TYPE_CHECKING:
    from trainmedic.agent.notify import Notifier
    from trainmedic.agent.responder.core import _Work

log = logging.getLogger("trainmedic.responder")

# Faults of the node itself (its accelerator or the node): a Node condition and Event in act mode.
NODE_LEVEL_FAULTS = frozenset({FaultClass.DEVICE_ERROR.value, FaultClass.NODE_FAILURE.value})


class IncidentMixin:
    """The incident state machine of Responder: resume, approvals and retries, one diagnosis, the
    way out. Responder inherits it; what it uses of the other parts is declared below for the type
    checker only, which checks Responder's own definitions against these declarations."""

    if TYPE_CHECKING:
        bus: Bus
        kube: KubeOps
        store: IncidentStore
        policy: Policy
        policy_state: PolicyState
        settings: ResponderSettings
        producer: str
        clock: Callable[[], float]
        notifier: Notifier | None
        handled: OrderedDict[str, IncidentStatus]
        changed: asyncio.Event
        _scheduled: set[str]
        _policy_thread: concurrent.futures.ThreadPoolExecutor
        _degraded_log: RateLimitedLog

        def owns(self, incident: Incident) -> bool: ...

        def _submit(
            self, key: str, run: Callable[[_Work], Awaitable[Any]], record: Record | None, *, degradable: bool = False
        ) -> None: ...

        async def _execute(self, incident: Incident) -> Incident: ...

        async def _save_scene(
            self,
            incident: Incident,
            d: DiagnosisEvent,
            rc: RootCause,
            workload: dict[str, Any] | None,
            pods: list[dict[str, Any]],
        ) -> None: ...

        async def _protect(self, job: JobRef) -> None: ...

        async def _unprotect(self, job: JobRef, pods: list[dict[str, Any]] | None = None) -> None: ...

        def _drop_bodies(self, names: set[str], *, keep: bool) -> None: ...

        async def restart_under_way(self, job: JobRef, incident_id: str) -> str | None: ...

        async def _workload(self, job: JobRef) -> dict[str, Any] | None: ...

        async def _pods(self, job: JobRef, workload: Mapping[str, Any] | None) -> list[dict[str, Any]]: ...

        async def _context(
            self, incident: Incident, rc: RootCause, workload: Mapping[str, Any] | None
        ) -> PolicyContext: ...

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
        """Scene, then plan. Leaves the incident OBSERVED, AWAITING_APPROVAL, BLOCKED or ACTING. A
        workload someone else is deleting (`deletionTimestamp`, no restart of ours under way) is
        observed only, with no plan."""
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
        deleting = terminating(workload)
        if deleting is not None and job is not None and await self.restart_under_way(job, incident.id) is None:
            # Someone else is deleting the workload (a foreground cascade: its pods die first, and
            # their deaths are this diagnosis): observe only. A restart would bring back a job its
            # owner is removing.
            return await self._settle_terminating(incident, rc, job, deleting)
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
        # The incarnation a restart is planned for, or that there was none (ABSENT): a job that appears
        # before a late approval is one submitted since, never one to delete.
        planned_for = identity(workload)
        actions = [
            (a.name.value, dict(a.params, identity=planned_for) if a.name in _RESTARTS else dict(a.params))
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

    async def _settle_terminating(self, incident: Incident, rc: RootCause, job: JobRef, deleting: str) -> Incident:
        """The workload is being deleted by someone else (no restart of ours is deleting it): the
        incident is observed, with the reason, and nothing is planned."""
        what = f"{job.namespace}/{job.name}"
        why = I18nText(
            en=f"{what} is being deleted by someone else (deletionTimestamp {deleting}): observed only, nothing is "
            "restarted",
            zh=f"{what} 正在被他人删除（deletionTimestamp {deleting}）：仅记录，不重启。",
        )
        await asyncio.to_thread(
            self.store.note, incident.id, "terminating", {"deletion_timestamp": deleting, "why": why.model_dump()}
        )
        await asyncio.to_thread(
            self.store.set_status, incident.id, IncidentStatus.OBSERVED, {"terminating": True, "why": why.en}
        )
        incident = await asyncio.to_thread(self.store.get, incident.id)
        log.info("incident %s for %s: %s", incident.id, incident.key, why.en)
        self._finish(incident)
        await self._publish(incident, rc)
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

    # -- out --------------------------------------------------------------------------------------------

    def _finish(self, incident: Incident) -> None:
        # The journal is over: no replacement body (env values) stays on disk, whatever the end. Never
        # while a restart is past its delete (deleting, creating): its body is then the only full copy
        # of the deleted job's spec (resume() keeps it too, the incident being unfinished).
        if not any(a.state in (ActionState.DELETING, ActionState.CREATING) for a in incident.actions):
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
            # While a person is paged for an action that goes on, the page says why.
            plan=incident.shown_plan(),
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
