"""restart_from_checkpoint (and raise_memory_limit, which is the same restart with more memory):
recreate the job from its last complete checkpoint, bad nodes excluded; exactly once.

Preconditions, checked before anything is deleted: no other incident is recreating the job (it
deleted the job and has not created the replacement: this one waits, then finds that replacement
and is cancelled as stale); the incident names a workload and it exists; it is the incarnation the
plan was made for (uid, creationTimestamp, generation; a job that was absent when the plan was made
is one submitted since), and nobody else is deleting it (a `deletionTimestamp` set by someone else:
restarting it would bring back a job its owner is removing), else StalePlan; the restart budgets
(rate, backoff, the lineage's lifetime cap) still allow it (else ActionBlocked).

Journal: the full replacement body is kept apart (the runtime's `save_body`: never env values in
the journal) and the redacted body, its reference, the original's uid and kind recorded as the
state turns `deleting`; the delete is sent (again, after a crash: the uid precondition never
touches another incarnation), its end awaited (a workload still terminating is waited for, never
given up: TemporaryActionError, escalated past `gone_deadline_s`), `creating` recorded, the
replacement created. A create that finds our own object (a crash after it landed) is success.

Past the delete, the journal is never ended by an error: the job is gone and the saved body is the
only full copy of its spec. An error that would be permanent anywhere else (the create refused by
a ResourceQuota or an admission webhook, 422 Invalid, 401/403, the body unreadable) is held: the
incident is blocked and pages a person with the body's path and what failed, and the create is
tried again with backoff until it lands or a person recreates the job by hand (a job of the same
name that is not the original is then found and left as it is: the action ends). A delete refused
while the original is still there, untouched, deleted nothing: that failure ends the action as
before the delete.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Mapping
from typing import Any, NoReturn

from trainmedic.events import JobRef
from trainmedic.models import I18nText
from trainmedic.remediations import workloads as wl
from trainmedic.remediations.actions.base import ActionCall, ActionDef
from trainmedic.remediations.errors import (
    ActionBlocked,
    FatalActionError,
    PermanentActionError,
    StalePlan,
    TemporaryActionError,
    classify,
)
from trainmedic.remediations.kube import ConflictError
from trainmedic.remediations.policy import RestartSpec
from trainmedic.remediations.scene import redact_object

log = logging.getLogger("trainmedic.responder")

ANN_INCIDENT = "trainmedic.io/incident"
# What a plan records as `identity` when the workload was not there when it was made.
ABSENT = {"absent": True}


class _Ended(PermanentActionError):
    """Past the delete, an end that leaves nothing for the journal to carry: the original was never
    deleted after all, or someone else recreated the job (it exists, and is left as it is)."""


def annotation(obj: Mapping[str, Any], name: str) -> str | None:
    value = ((obj.get("metadata") or {}).get("annotations") or {}).get(name)
    return str(value) if value is not None else None


def identity(obj: Mapping[str, Any] | None) -> dict[str, Any]:
    """Which incarnation of a workload this is: a resubmitted job has another uid and creation time, an
    edited one another generation. None (no workload when the plan was made): `ABSENT`."""
    if obj is None:
        return dict(ABSENT)
    meta = obj.get("metadata") or {}
    return {k: meta.get(k) for k in ("uid", "creationTimestamp", "generation")}


def terminating(obj: Mapping[str, Any] | None) -> str | None:
    """The workload's deletionTimestamp: set once someone asked for it to be deleted (it lingers while
    finalizers or a foreground cascade run)."""
    if obj is None:
        return None
    value = (obj.get("metadata") or {}).get("deletionTimestamp")
    return str(value) if value else None


def lineage_restarts(workload: Mapping[str, Any] | None) -> int:
    """How many times trainmedic recreated the workload's lineage (its trainmedic.io/restarts)."""
    if workload is None:
        return 0
    try:
        return max(0, int(annotation(workload, "trainmedic.io/restarts") or 0))
    except ValueError:
        return len(wl.lineage(workload))


def restart_result(obj: Mapping[str, Any]) -> dict[str, Any]:
    meta = obj.get("metadata") or {}
    return {
        "workload": f"{obj.get('kind')}/{meta.get('namespace')}/{meta.get('name')}",
        "uid": meta.get("uid"),
        "resumed_from": annotation(obj, "trainmedic.io/resumed-from"),
        "excluded_nodes": [n for n in (annotation(obj, "trainmedic.io/excluded-nodes") or "").split(",") if n],
        "restarts": annotation(obj, "trainmedic.io/restarts"),
    }


def _still_terminating(call: ActionCall, params: Mapping[str, Any], job: JobRef) -> NoReturn:
    """The deleted original has not gone yet: wait on (the journal keeps the replacement body), and
    past `gone_deadline_s` tell a person, still waiting."""
    rt = call.runtime
    since = float(params.get("deleting_since") or rt.clock())
    waited = rt.clock() - since
    what = f"{params['kind']} {job.namespace}/{job.name}"
    raise TemporaryActionError(
        f"{what} is still terminating {waited:.0f} s after its delete "
        "(a finalizer or a long grace period holds it); its replacement is created once it is gone",
        delay=rt.settings.retry_after_s,
        escalate=waited >= rt.settings.gone_deadline_s,
        why=I18nText(
            en=f"{what} is still terminating {waited:.0f} s after its delete (a finalizer or a long grace period "
            "holds it); trainmedic keeps waiting and creates its replacement once it is gone.",
            zh=f"{what} 删除后 {waited:.0f} 秒仍未结束（被 finalizer 或较长的优雅终止期阻塞）；"
            "trainmedic 继续等待，旧作业消失后即创建替换作业。",
        ),
    )


def _held(call: ActionCall, params: Mapping[str, Any], job: JobRef, err: Exception) -> TemporaryActionError:
    """A permanent error past the delete, held: a person is paged now with the body's path and what
    failed, and the journal is tried again with backoff (never ended, the body never dropped)."""
    path = call.runtime.body_path(params)
    where = str(path) if path is not None else "the incident's journal (redacted) and its scene's objects/"
    what = f"{params.get('kind') or job.kind} {job.namespace}/{job.name}"
    return TemporaryActionError(
        f"{what} was deleted and its replacement could not be created: {err}; its full spec is kept in {where}, "
        "and the create is tried again with backoff until it lands or the job is recreated by hand",
        escalate=True,
        backoff=True,
        why=I18nText(
            en=f"{what} was deleted and its replacement could not be created: {err}. Its full spec is kept in "
            f"{where}; trainmedic tries again with backoff. Fix the cause (a ResourceQuota, an admission "
            "webhook, RBAC, the body) or recreate the job from that file by hand.",
            zh=f"{what} 已被删除，替换作业无法创建：{err}。完整的作业定义保存在 {where}；trainmedic 会按退避"
            "间隔继续重试。请排除原因（ResourceQuota、准入 webhook、RBAC、作业定义），或用该文件手动重建作业。",
        ),
    )


async def run(call: ActionCall) -> None:
    rt, rc, job = call.runtime, call.rc, call.job
    params = dict(call.entry.params)
    if job is None:
        await call.journal.update(call.seq, "skipped", result={"reason": "the incident has no workload"})
        return
    if call.entry.name == "raise_memory_limit" and any(
        e.name == "restart_from_checkpoint" and e.seq != call.seq for e in (await call.journal.entries())
    ):
        await call.journal.update(call.seq, "skipped", result={"reason": "applied by the restart action"})
        return
    state = await call.state()
    if state in ("planned", "running") or params.get("body") is None:
        other = await rt.restart_under_way(job, call.incident_id)
        if other is not None:
            # Another incident deleted the job and has not created its replacement yet (a second
            # fault seen while the first was healed; its pods dying of that delete): this plan waits
            # for that replacement rather than find nothing, or race it with a second one.
            if params.get("waited_for") != other:
                params["waited_for"] = other
                await call.journal.update(call.seq, state, params=params)
            raise TemporaryActionError(
                f"{job.namespace}/{job.name} is being recreated by incident {other} (deleted, its replacement "
                "not created yet): this incident waits for it, then looks again",
                delay=rt.settings.retry_after_s,
            )
        live = await rt.find_workload(job)
        waited_for = params.get("waited_for")
        if waited_for and live is not None and annotation(live, ANN_INCIDENT) == waited_for:
            raise StalePlan(
                f"{live.get('kind')} {job.namespace}/{job.name} was recreated by incident {waited_for} while this "
                "plan waited: the plan is cancelled as stale and the new job left as it is"
            )
        if live is None:
            # Nothing to restart and nobody restarted it: the incident fails and a person hears of it.
            raise PermanentActionError(
                f"workload {job.namespace}/{job.name} not found; nothing was deleted and nothing recreated"
            )
        if annotation(live, ANN_INCIDENT) == call.incident_id:
            await call.journal.update(call.seq, "done", result=restart_result(live))
            rt.drop_body(params)
            return
        _check_incarnation(params, live, job)
        ctx = dataclasses.replace(
            await rt.policy_context(call.incident_id, rc), lineage_restarts=lineage_restarts(live)
        )
        refused = await rt.in_policy(rt.policy.restart_refused, ctx, rt.policy_state, call.incident_id)
        if refused is not None:
            raise ActionBlocked(refused)
        try:
            body, resume = await rt.replacement(call.incident_id, live, rc)
            ref = await asyncio.to_thread(rt.save_body, call.incident_id, call.seq, body)
        except BaseException:
            await rt.in_policy(rt.policy.release_restart, ctx, rt.policy_state, call.incident_id)  # nothing deleted
            raise
        params.update(
            body=redact_object(body),
            body_ref=ref,
            uid=live["metadata"].get("uid"),
            api_version=live.get("apiVersion"),
            kind=live.get("kind"),
            **resume,
        )
        params["deleting_since"] = rt.clock()
        await call.journal.update(call.seq, "deleting", params=params)
        state = "deleting"
    try:
        created = await _replace(call, params, job, state)
    except (_Ended, TemporaryActionError, FatalActionError):
        raise
    except Exception as exc:  # past the delete: a permanent error is held, never the end of the journal
        err = classify(exc)
        if isinstance(err, TemporaryActionError | FatalActionError):
            raise
        log.error("incident %s: %s/%s: the replacement is held: %s", call.incident_id, job.namespace, job.name, err)
        raise _held(call, params, job, err) from exc
    ctx = await rt.policy_context(call.incident_id, rc)
    await rt.in_policy(rt.policy.commit_restart, ctx, rt.policy_state, incident_id=call.incident_id)
    await call.journal.update(call.seq, "done", result=restart_result(created))
    rt.drop_body(params)
    log.info(
        "incident %s: %s %s/%s recreated from %s, excluding %s",
        call.incident_id,
        params["kind"],
        job.namespace,
        job.name,
        params.get("checkpoint") or "no checkpoint",
        ", ".join(params.get("excluded_nodes") or []) or "no node",
    )


def _check_incarnation(params: Mapping[str, Any], live: Mapping[str, Any], job: JobRef) -> None:
    """StalePlan unless `live` is the incarnation the plan was made for and nobody else is deleting it."""
    what = f"{live.get('kind')} {job.namespace}/{job.name}"
    planned_for = params.get("identity")
    if planned_for == ABSENT:
        raise StalePlan(
            f"{what} was not there when this plan was made (deleted, or not submitted yet): it was submitted "
            "since; the plan is cancelled as stale and the job left as it is",
            why=I18nText(
                en=f"{what} did not exist when the plan was made; it was submitted since: the plan is cancelled "
                "and the new job left as it is.",
                zh=f"制定计划时 {what} 不存在，之后才被提交：计划作废，新作业保持不变。",
            ),
        )
    now_is = identity(live)
    if planned_for and planned_for != now_is:
        changed = ", ".join(
            f"{k} {planned_for.get(k)} -> {now_is.get(k)}" for k in now_is if planned_for.get(k) != now_is.get(k)
        )
        raise StalePlan(
            f"{what} is not the job this plan was made for "
            f"({changed}): it was resubmitted or changed since; the plan is cancelled as stale and the "
            "job left as it is"
        )
    deleting = terminating(live)
    if deleting is not None:
        raise StalePlan(
            f"{what} is being deleted by someone else (deletionTimestamp {deleting}): it is not recreated; "
            "the plan is cancelled as stale",
            why=I18nText(
                en=f"{what} is being deleted by someone else (since {deleting}): it is not recreated, the plan "
                "is cancelled.",
                zh=f"{what} 正在被他人删除（自 {deleting} 起）：不会重建，计划作废。",
            ),
        )


async def _replace(call: ActionCall, params: dict[str, Any], job: JobRef, state: str) -> dict[str, Any]:
    """Delete (state `deleting`), wait until gone, record `creating`, create; the created object."""
    rt = call.runtime
    api_version, kind = str(params["api_version"]), str(params["kind"])
    if state == "deleting":
        # Again after a crash (the journal said deleting, the delete may not have been sent):
        # idempotent, and the uid precondition never touches another incarnation.
        try:
            await rt.kube.delete_workload(
                {
                    "apiVersion": api_version,
                    "kind": kind,
                    "metadata": {"namespace": job.namespace, "name": job.name, "uid": params.get("uid")},
                },
                propagation="Foreground",
            )
        except Exception as exc:
            if not isinstance(classify(exc), PermanentActionError):
                raise
            current = await rt.kube.get_workload(api_version, kind, job.namespace, job.name)
            untouched = (
                current is not None
                and (current.get("metadata") or {}).get("uid") == params.get("uid")
                and terminating(current) is None
            )
            if untouched:
                # Refused, and the original is there untouched: nothing was deleted. The journal
                # steps back before the delete, and the action fails as any refusal before it would.
                await call.journal.update(call.seq, "running")
                raise _Ended(str(classify(exc))) from exc
            # Refused now, but an earlier delete landed (sent before a crash): carry on from it.
            log.info(
                "incident %s: the delete of %s %s/%s was refused (%s) but an earlier one landed; carrying on",
                call.incident_id,
                kind,
                job.namespace,
                job.name,
                exc,
            )
        gone = await rt.kube.wait_gone(
            api_version, kind, job.namespace, job.name, uid=params.get("uid"), timeout_s=rt.settings.wait_gone_s
        )
        if not gone:
            _still_terminating(call, params, job)
        await call.journal.update(call.seq, "creating")
        existing = None
    else:
        # The journal said creating: this call carries on after a crash, or after a held create. Our
        # own create may have landed (the body is not needed again), or a person recreated the job.
        existing = await rt.kube.get_workload(api_version, kind, job.namespace, job.name)
    if existing is None:
        full = await asyncio.to_thread(rt.load_body, params)
        try:
            return await rt.kube.create_workload(full)
        except ConflictError:
            existing = await rt.kube.get_workload(api_version, kind, job.namespace, job.name)
            if existing is None:
                raise TemporaryActionError(
                    f"{kind} {job.namespace}/{job.name}: the create met an object that is gone now"
                ) from None
    if annotation(existing, ANN_INCIDENT) == call.incident_id:
        return existing  # our own journalled create landed before: success
    if (existing.get("metadata") or {}).get("uid") == params.get("uid"):
        # The original is still there (terminating): back to waiting for it to go.
        await call.journal.update(call.seq, "deleting")
        _still_terminating(call, params, job)
    # The job exists and is not ours (recreated by hand, or by its owner): nothing is left to bring
    # back; the journal ends (left as it is).
    await call.journal.update(call.seq, "running")
    raise _Ended(f"{kind} {job.namespace}/{job.name} was recreated by someone else meanwhile; left as it is")


ACTION = ActionDef(
    name="restart_from_checkpoint",
    spec=(RestartSpec,),
    parameters=("job_key", "exclude_nodes", "identity"),
    preconditions=(
        "no other incident is recreating the workload (deleted, its replacement not created yet)",
        "the workload exists",
        "it is the incarnation the plan was made for (a job absent at plan time is one submitted since)",
        "nobody else is deleting it (no deletionTimestamp)",
        "the restart budgets (rate, backoff, lifetime cap) allow it",
    ),
    run=run,
)

__all__ = ["ABSENT", "ACTION", "annotation", "identity", "lineage_restarts", "restart_result", "run", "terminating"]
