"""restart_from_checkpoint (and raise_memory_limit, which is the same restart with more memory):
recreate the job from its last complete checkpoint, bad nodes excluded; exactly once.

Preconditions, checked before anything is deleted: no other incident is recreating the job (it
deleted the job and has not created the replacement: this one waits, then finds that replacement
and is cancelled as stale); the incident names a workload and it exists;
it is the incarnation the plan was made for (uid, creationTimestamp, generation: else StalePlan);
the restart budgets (rate, backoff, the lineage's lifetime cap) still allow it (else ActionBlocked).

Journal: the full replacement body is kept apart (the runtime's `save_body`: never env values in
the journal) and the redacted body, its reference, the original's uid and kind recorded as the
state turns `deleting`; the delete is sent (again, after a crash: the uid precondition never
touches another incarnation), its end awaited (a workload still terminating is waited for, never
given up: TemporaryActionError, escalated past `gone_deadline_s`), `creating` recorded, the
replacement created. A create that finds our own object (a crash after it landed) is success.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Mapping
from typing import Any, NoReturn

from trainmedic.events import JobRef
from trainmedic.remediations import workloads as wl
from trainmedic.remediations.actions.base import ActionCall, ActionDef
from trainmedic.remediations.errors import ActionBlocked, PermanentActionError, StalePlan, TemporaryActionError
from trainmedic.remediations.kube import ConflictError, PermanentKubeError
from trainmedic.remediations.policy import RestartSpec
from trainmedic.remediations.scene import redact_object

log = logging.getLogger("trainmedic.responder")

ANN_INCIDENT = "trainmedic.io/incident"


def annotation(obj: Mapping[str, Any], name: str) -> str | None:
    value = ((obj.get("metadata") or {}).get("annotations") or {}).get(name)
    return str(value) if value is not None else None


def identity(obj: Mapping[str, Any]) -> dict[str, Any]:
    """Which incarnation of a workload this is: a resubmitted job has another uid and creation time, an
    edited one another generation."""
    meta = obj.get("metadata") or {}
    return {k: meta.get(k) for k in ("uid", "creationTimestamp", "generation")}


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
    raise TemporaryActionError(
        f"{params['kind']} {job.namespace}/{job.name} is still terminating {waited:.0f} s after its delete "
        "(a finalizer or a long grace period holds it); its replacement is created once it is gone",
        delay=rt.settings.retry_after_s,
        escalate=waited >= rt.settings.gone_deadline_s,
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
        planned_for = params.get("identity")
        now_is = identity(live)
        if planned_for and planned_for != now_is:
            changed = ", ".join(
                f"{k} {planned_for.get(k)} -> {now_is.get(k)}" for k in now_is if planned_for.get(k) != now_is.get(k)
            )
            raise StalePlan(
                f"{live.get('kind')} {job.namespace}/{job.name} is not the job this plan was made for "
                f"({changed}): it was resubmitted or changed since; the plan is cancelled as stale and the "
                "job left as it is"
            )
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
    if state == "deleting":
        # Again after a crash (the journal said deleting, the delete may not have been sent):
        # idempotent, and the uid precondition never touches another incarnation.
        await rt.kube.delete_workload(
            {
                "apiVersion": params["api_version"],
                "kind": params["kind"],
                "metadata": {"namespace": job.namespace, "name": job.name, "uid": params.get("uid")},
            },
            propagation="Foreground",
        )
        gone = await rt.kube.wait_gone(
            params["api_version"],
            params["kind"],
            job.namespace,
            job.name,
            uid=params.get("uid"),
            timeout_s=rt.settings.wait_gone_s,
        )
        if not gone:
            _still_terminating(call, params, job)
        await call.journal.update(call.seq, "creating")
        resumed = False
    else:
        resumed = True  # the journal said creating: this call carries on after a crash
    try:
        # Our own create may have landed before a crash: then the body is not needed again.
        mine = (
            await rt.kube.get_workload(params["api_version"], params["kind"], job.namespace, job.name)
            if resumed
            else None
        )
        if mine is not None and annotation(mine, ANN_INCIDENT) == call.incident_id:
            created = mine
        else:
            full = await asyncio.to_thread(rt.load_body, params)
            created = await rt.kube.create_workload(full)
    except ConflictError:
        existing = await rt.kube.get_workload(params["api_version"], params["kind"], job.namespace, job.name)
        if existing is None:
            raise TemporaryActionError(
                f"{params['kind']} {job.namespace}/{job.name}: the create met an object that is gone now"
            ) from None
        if annotation(existing, ANN_INCIDENT) == call.incident_id:
            created = existing  # our own journalled create landed before: success
        elif (existing.get("metadata") or {}).get("uid") == params.get("uid"):
            # The original is still there (terminating): back to waiting for it to go.
            await call.journal.update(call.seq, "deleting")
            _still_terminating(call, params, job)
        else:
            raise PermanentKubeError(
                f"{params['kind']} {job.namespace}/{job.name} was recreated by someone else meanwhile; left as it is"
            ) from None
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


ACTION = ActionDef(
    name="restart_from_checkpoint",
    spec=(RestartSpec,),
    parameters=("job_key", "exclude_nodes", "identity"),
    preconditions=(
        "no other incident is recreating the workload (deleted, its replacement not created yet)",
        "the workload exists",
        "it is the incarnation the plan was made for",
        "the restart budgets (rate, backoff, lifetime cap) allow it",
    ),
    run=run,
)

__all__ = ["ACTION", "annotation", "identity", "lineage_restarts", "restart_result", "run"]
