"""A plan's actions run in order, `ExecuteMixin` of Responder (core.py): `_execute` walks the
incident's remaining actions (journalled, safe to call again) and gives each failure its meaning from
its type (remediations/errors.py): temporary keeps the journal state and is tried again after its
delay (escalated to a person past a deadline), blocked skips the remaining changes and ends the
incident `blocked`, a stale plan is cancelled and the incident ends `observed`, permanent fails the
action and the incident. An incident is never left `acting` by an error.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from trainmedic.agent.responder.settings import ResponderSettings
from trainmedic.agent.store import ActionRecord, ActionState, Incident, IncidentStatus, IncidentStore
from trainmedic.agent.telemetry import Telemetry
from trainmedic.events import Topic
from trainmedic.models import I18nText, RootCause
from trainmedic.remediations.errors import (
    ActionBlocked,
    FatalActionError,
    StalePlan,
    TemporaryActionError,
    classify,
)
from trainmedic.remediations.policy import ActionName

log = logging.getLogger("trainmedic.responder")


class ExecuteMixin:
    """The running of an incident's actions. Responder inherits it; what it uses of the other parts
    is declared below for the type checker only, which checks Responder's own definitions against
    these declarations."""

    if TYPE_CHECKING:
        store: IncidentStore
        settings: ResponderSettings
        telemetry: Telemetry
        clock: Callable[[], float]

        async def _run_action(self, incident: Incident, action: ActionRecord, rc: RootCause) -> None: ...

        def _finish(self, incident: Incident) -> None: ...

        async def _publish(self, incident: Incident, rc: RootCause, *, hints: Sequence[I18nText] = ()) -> None: ...

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
