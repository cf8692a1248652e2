"""A plan's actions run in order, `ExecuteMixin` of Responder (core.py): `_execute` walks the
incident's remaining actions (journalled, safe to call again) and gives each failure its meaning from
its type (remediations/errors.py): temporary keeps the journal state and is tried again after its
delay (escalated to a person past its deadline: the action's own, or `retry_deadline_s` from its
first retry), blocked skips the remaining changes and ends the incident `blocked`, a stale plan is
cancelled and the incident ends `observed`, permanent fails the action and the incident. An
incident is never left `acting` by an error.

Past a restart's delete (its journal says `deleting` or `creating`) nothing ends the journal: the
job is gone and the replacement body is the only full copy of its spec. Any error but a temporary
or fatal one is then held: the incident is blocked and pages, the action is tried again with
backoff, and the body stays (remediations/actions/restart_from_checkpoint.py does the same with
the body's path in the page; this is the net under it).
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
        keeps its journal state and is tried again after its delay (past its deadline a person is
        paged, `_retry_later`); blocked -> the remaining changes are skipped and the incident ends
        `blocked`; permanent (any error nobody expected included) -> the action and the incident
        end `failed`, except past a restart's delete, where it is held as a temporary error that
        pages at once. Either way a person hears of it with the incident's status; an incident is
        never left `acting` by an error."""
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
                if not isinstance(err, TemporaryActionError) and await self._past_delete(incident, action):
                    err = _held(action.name, err)
                if isinstance(err, TemporaryActionError):
                    retry = True
                    self.telemetry.actions.labels(action.name, "retry").inc()
                    await self._retry_later(incident, action, err, rc)
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
                    blocked = ActionBlocked(
                        err.why or I18nText(en=str(err), zh="作业在计划制定后已被重新提交或修改：计划作废。")
                    )
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

    async def _past_delete(self, incident: Incident, action: ActionRecord) -> bool:
        """Whether the action's journal is past a delete (`deleting`, `creating`): the job may be gone
        and only the journal's body can bring it back."""
        current = (await asyncio.to_thread(self.store.get, incident.id)).actions[action.seq].state
        return current in (ActionState.DELETING, ActionState.CREATING)

    async def _retry_later(
        self, incident: Incident, action: ActionRecord, err: TemporaryActionError, rc: RootCause
    ) -> None:
        """Keep the action's journal state and say when it is tried again. The tries are counted from
        the first retry: past the action's own deadline (`err.escalate`), or past `retry_deadline_s`
        when it has none, a person is paged (the incident turns `blocked`) while the tries go on; once
        per journal state, so a restart that pages while the old job terminates pages again when its
        replacement is refused."""
        current = (await asyncio.to_thread(self.store.get, incident.id)).actions[action.seq]
        state = current.state if current.state is not ActionState.PLANNED else ActionState.RUNNING
        prev = current.result or {}
        now = self.clock()
        since = float(prev.get("retrying_since") or now)
        delay = err.delay if err.delay is not None else self.settings.retry_after_s
        backoff_tries = int(prev.get("backoff_tries") or 0) + 1 if err.backoff else 0
        if err.backoff:
            delay = min(
                max(delay, self.settings.retry_after_s) * 2 ** min(backoff_tries - 1, 20), self.settings.retry_max_s
            )
        overdue = now - since >= self.settings.retry_deadline_s
        escalate = err.escalate if err.escalate is not None else overdue
        why = err.why
        if why is None:
            why = (
                I18nText(
                    en=f"{action.name} has failed temporarily for {now - since:.0f} s, past its deadline "
                    f"(remediate.retry_deadline_s, {self.settings.retry_deadline_s:.0f} s); it is still "
                    f"being tried: {err}",
                    zh=f"操作 {action.name} 已连续暂时失败 {now - since:.0f} 秒，超过期限"
                    f"（remediate.retry_deadline_s，{self.settings.retry_deadline_s:.0f} 秒），仍在重试：{err}",
                )
                if err.escalate is None
                else I18nText(en=str(err), zh=f"操作 {action.name} 仍在等待，已超过期限：{err}")
            )
        was = prev.get("escalated_in") or (state.value if prev.get("escalated") else None)
        result: dict[str, Any] = {
            "retry": str(err),
            "retry_at": now + delay,
            "retrying_since": since,
            "attempts": int(prev.get("attempts") or 0) + 1,
            "escalated": bool(prev.get("escalated")) or escalate,
        }
        if backoff_tries:
            result["backoff_tries"] = backoff_tries
        if escalate:
            result.update(why=why.model_dump(), escalated_in=state.value)
        elif prev.get("escalated"):
            result.update({k: prev[k] for k in ("why", "escalated_in") if k in prev})
        await asyncio.to_thread(self.store.update_action, incident.id, action.seq, state, result=result)
        if escalate and was != state.value:
            # A person is told (blocked: a person must look) while the journal goes on.
            await asyncio.to_thread(
                self.store.note,
                incident.id,
                "escalated",
                {"action": action.name, "state": state.value, "why": why.en, "why_zh": why.zh, "page": True},
            )
            await asyncio.to_thread(
                self.store.set_status,
                incident.id,
                IncidentStatus.BLOCKED,
                {"page": True, "still_waiting": True, "why": why.en, "blocked": why.model_dump()},
            )
            await self._publish(await asyncio.to_thread(self.store.get, incident.id), rc)
        log.warning("incident %s: %s will be retried in %.0f s: %s", incident.id, action.name, delay, err)

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


def _held(name: str, err: Exception) -> TemporaryActionError:
    """An error that would end the action, from an action past its delete: held instead (paged now,
    tried again with backoff, the journal and its body kept)."""
    return TemporaryActionError(
        f"{name} failed after the workload was deleted ({err}); the journal and its replacement body are "
        "kept and the action is tried again: fix the cause, or recreate the workload by hand",
        escalate=True,
        backoff=True,
        why=I18nText(
            en=f"The workload was deleted and {name} could not go on: {err}. Its replacement body is kept and "
            "trainmedic keeps trying; fix the cause, or recreate the workload by hand.",
            zh=f"作业已被删除，{name} 无法继续：{err}。替换用的作业定义已保留，trainmedic 会继续重试；"
            "请排除原因，或手动重建作业。",
        ),
    )
