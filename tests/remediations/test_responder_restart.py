"""Restart from checkpoint on the journal: a deleted job always gets its replacement, the plan acts
only on the job it was made for, and the lifetime cap of a lineage."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from respfix import Crash, FakeKube, diagnosis, harness, job, node, pod, policy

from trainmedic.agent.store import ActionState, IncidentStatus

pytestmark = pytest.mark.asyncio

RESTART = "[restart_from_checkpoint]"


class Clock:
    def __init__(self, t: float = 1_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def cluster(*jobs: str) -> FakeKube:
    kube = FakeKube(nodes={f"gpu-{i}": node(f"gpu-{i}") for i in range(4)})
    for name in jobs:
        kube.add(job("train", name))
    return kube


@pytest.mark.parametrize("deadline_passes", [False, True])
@pytest.mark.looptime
async def test_a_job_still_terminating_is_waited_for_and_then_replaced(tmp_path: Path, deadline_passes: bool) -> None:
    kube = cluster("llama")
    kube.terminating.add(("Job", "train", "llama"))
    clock = Clock()
    h = harness(tmp_path, policy(actions=RESTART), kube, clock=clock, wait_gone_s=5, gone_deadline_s=600)
    incident = await h.handle(diagnosis("train", "llama", "gpu-0"))

    # The original is still there (a foreign finalizer): nothing failed, the journal waits.
    assert incident.status is IncidentStatus.ACTING
    assert incident.actions[0].state is ActionState.DELETING
    assert incident.actions[0].params["body"]["metadata"]["name"] == "llama"
    assert kube.created == []

    clock.t += 900 if deadline_passes else 60
    await h.responder._execute_again(incident.id)
    incident = h.store.get(incident.id)
    assert kube.created == [] and incident.actions[0].state is ActionState.DELETING
    escalations = [e for e in h.store.timeline(incident.id) if e["kind"] == "escalated"]
    assert len(escalations) == (1 if deadline_passes else 0)
    # Past the deadline a person is paged (blocked: a person must look); the journal still goes on.
    assert incident.status is (IncidentStatus.BLOCKED if deadline_passes else IncidentStatus.ACTING)
    assert [i.id for i in h.store.unfinished()] == [incident.id]

    # The finalizer goes: the next pass creates the replacement, exactly once.
    kube.terminating.clear()
    del kube.workloads[("Job", "train", "llama")]
    clock.t += 60
    await h.responder._execute_again(incident.id)
    incident = h.store.get(incident.id)
    assert incident.status is IncidentStatus.RESOLVED
    assert len(kube.created) == 1
    assert kube.created[0]["metadata"]["annotations"]["trainmedic.io/incident"] == incident.id


@pytest.mark.parametrize("gone_before_second", [False, True])
@pytest.mark.looptime
async def test_a_second_incident_waits_for_the_replacement_another_incident_is_creating(
    tmp_path: Path, gone_before_second: bool
) -> None:
    """A second fault on the job (its pods dying of the first restart's delete) while the first
    incident waits for the original to go: the second neither finds nothing and fails, nor races the
    first with a replacement of its own; it waits, sees the first's replacement, and is cancelled as
    stale. The job is recreated exactly once, by the first."""
    kube = cluster("llama")
    kube.terminating.add(("Job", "train", "llama"))
    clock = Clock()
    h = harness(tmp_path, policy(actions=RESTART), kube, clock=clock, wait_gone_s=5, gone_deadline_s=600)
    first = await h.handle(diagnosis("train", "llama", "gpu-0"))
    assert first.actions[0].state is ActionState.DELETING
    if gone_before_second:
        # The original went between the first's tries: the job does not exist at all now.
        kube.terminating.clear()
        del kube.workloads[("Job", "train", "llama")]

    kube.pods.append(pod("train", "llama", "llama-0"))
    # Its first, provisional diagnosis: the dying pods are the first restart's, not held for a scene.
    await h.handle(diagnosis("train", "llama", "gpu-1", t=1010.0, n=1).model_copy(update={"final": False}))
    assert kube.finalizers_added == []
    second = await h.handle(diagnosis("train", "llama", "gpu-1", t=1010.0, n=1))
    assert second.status is IncidentStatus.ACTING
    assert second.actions[0].state is ActionState.RUNNING
    assert "being recreated by incident " + first.id in (second.actions[0].result or {})["retry"]
    assert kube.created == [] and len(kube.deleted) == 1

    if not gone_before_second:
        kube.terminating.clear()
        del kube.workloads[("Job", "train", "llama")]
    clock.t += 60
    await h.responder._execute_again(first.id)
    assert h.store.get(first.id).status is IncidentStatus.RESOLVED
    await h.responder._execute_again(second.id)
    second = h.store.get(second.id)
    assert second.status is IncidentStatus.OBSERVED
    assert second.actions[0].state is ActionState.SKIPPED
    assert f"recreated by incident {first.id} while this plan waited" in (second.actions[0].result or {})["reason"]
    [created] = kube.created
    assert created["metadata"]["annotations"]["trainmedic.io/incident"] == first.id
    assert len(kube.deleted) == 1


@pytest.mark.looptime
async def test_a_409_from_our_own_journalled_create_is_success(tmp_path: Path) -> None:
    kube = cluster("llama")
    h = harness(tmp_path, policy(actions=RESTART), kube)
    incident = await h.handle(diagnosis("train", "llama", "gpu-0"))
    assert incident.status is IncidentStatus.RESOLVED
    # Killed after the create landed but before DONE was journalled: the journal says creating.
    h.store.update_action(incident.id, 0, ActionState.CREATING)
    h.store.set_status(incident.id, IncidentStatus.ACTING)
    await h.responder._execute_again(incident.id)
    incident = h.store.get(incident.id)
    assert incident.status is IncidentStatus.RESOLVED
    assert incident.actions[0].state is ActionState.DONE
    assert len(kube.created) == 1


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"uid": "resubmitted-uid", "creationTimestamp": "2026-02-02T00:00:00Z"}, "uid"),
        ({"generation": 2}, "generation"),
    ],
)
@pytest.mark.looptime
async def test_a_late_approval_after_a_resubmit_is_cancelled_as_stale(
    tmp_path: Path, change: dict[str, object], named: str
) -> None:
    kube = cluster("llama")
    h = harness(tmp_path, policy(actions=RESTART, mode="approve"), kube)
    incident = await h.handle(diagnosis("train", "llama", "gpu-0"))
    assert incident.status is IncidentStatus.AWAITING_APPROVAL
    # A person resubmits (or edits) the job by hand before somebody approves the old plan.
    kube.workloads[("Job", "train", "llama")]["metadata"].update(change)
    h.store.approve(incident.id, by="sre")
    await h.responder._execute_again(incident.id)

    incident = h.store.get(incident.id)
    assert kube.deleted == [] and kube.created == []
    assert incident.status is IncidentStatus.OBSERVED
    why = (incident.actions[0].result or {})["reason"]
    assert "not the job this plan was made for" in why and named in why
    assert any(e["kind"] == "stale" for e in h.store.timeline(incident.id))


@pytest.mark.looptime
async def test_a_job_failing_every_21_minutes_is_restarted_up_to_the_lifetime_cap(tmp_path: Path) -> None:
    """Shipped budgets (3 per hour, backoff from 1m) never stop a job failing every ~21 min; the
    lifetime cap (budgets.restarts.lifetime_max, 10 by default) does, and a person is paged."""
    kube = cluster("llama")
    clock = Clock()
    h = harness(tmp_path, policy("budgets:\n  restarts: {max: 3, window: 1h}\n", actions=RESTART), kube, clock=clock)
    statuses = []
    for n in range(13):
        incident = await h.handle(diagnosis("train", "llama", "gpu-0", t=clock.t, n=n))
        statuses.append(incident.status)
        clock.t += 21 * 60
    assert len(kube.created) == 10
    assert statuses[:10] == [IncidentStatus.RESOLVED] * 10
    assert statuses[10:] == [IncidentStatus.BLOCKED] * 3
    last = h.store.get(incident.id)
    assert "Lifetime restart cap reached" in (last.plan or {})["blocked"]["en"]
    assert (last.plan or {})["page"] is True


@pytest.mark.parametrize(("restarts", "blocked"), [("9", False), ("10", True), ("25", True)])
@pytest.mark.looptime
async def test_the_lifetime_cap_is_checked_again_when_an_approved_restart_runs(
    tmp_path: Path, restarts: str, blocked: bool
) -> None:
    kube = cluster("llama")
    h = harness(tmp_path, policy(actions=RESTART, mode="approve"), kube)
    incident = await h.handle(diagnosis("train", "llama", "gpu-0"))
    assert incident.status is IncidentStatus.AWAITING_APPROVAL
    # Meanwhile the job's lineage grew (the annotation is what a recreation carries).
    kube.workloads[("Job", "train", "llama")]["metadata"]["annotations"]["trainmedic.io/restarts"] = restarts
    h.store.approve(incident.id, by="sre")
    await h.responder._execute_again(incident.id)
    incident = h.store.get(incident.id)
    assert incident.status is (IncidentStatus.BLOCKED if blocked else IncidentStatus.RESOLVED)
    assert (kube.created == []) is blocked


SECRETS = ("wandb-secret-value", "hf_secretvalue")


@pytest.mark.looptime
async def test_the_journal_and_the_api_never_hold_env_values(tmp_path: Path) -> None:
    kube = cluster("llama")
    h = harness(tmp_path, policy(actions=RESTART), kube)
    incident = await h.handle(diagnosis("train", "llama", "gpu-0"))
    assert incident.status is IncidentStatus.RESOLVED
    # The replacement has the job's real settings ...
    (created,) = kube.created
    container = created["spec"]["template"]["spec"]["containers"][0]
    assert container["env"][0]["value"] == "wandb-secret-value" and "hf_secretvalue" in container["args"]
    # ... the incident (what the API serves and the sinks get) only a redacted body and a reference.
    text = json.dumps(h.store.get(incident.id).as_dict())
    params = h.store.get(incident.id).actions[0].params
    assert params["body_ref"]["file"] and params["body"]["metadata"]["name"] == "llama"
    db = (tmp_path / "incidents.db").read_bytes() + b"".join(
        p.read_bytes() for p in tmp_path.glob("incidents.db-*") if p.is_file()
    )
    for secret in SECRETS:
        assert secret not in text
        assert secret.encode() not in db
    # The full body lived in the agent's own directory only until the create.
    assert list((tmp_path / "restart-bodies").glob("*.json")) == []


# Every step of a restart's journal, and every cluster call between them, as a place to die:
# (where, what) with where "kube" (the cluster call crashes the agent) or "before"/"after" (the
# journal write of that state).
CRASH_POINTS = [
    ("before", "deleting"),  # the full body is saved apart, the journal does not know yet
    ("after", "deleting"),  # journalled, the delete not sent
    ("kube", "before_delete"),
    ("kube", "after_delete"),  # deleted, gone not yet awaited
    ("before", "creating"),  # gone, not journalled
    ("after", "creating"),
    ("kube", "before_create"),
    ("kube", "after_create"),  # created, done not journalled
    ("before", "done"),
    ("after", "done"),  # done journalled, the body not yet removed, the incident still acting
]


@pytest.mark.parametrize(("where", "what"), CRASH_POINTS, ids=[f"{w}-{s}" for w, s in CRASH_POINTS])
@pytest.mark.looptime
async def test_resume_after_a_crash_at_each_journal_step_recreates_exactly_once(
    tmp_path: Path, where: str, what: str
) -> None:
    kube = cluster("llama")
    original = kube.workloads[("Job", "train", "llama")]["metadata"]["uid"]
    if where == "kube":
        kube.crash_at = what
    h = harness(tmp_path, policy(actions=RESTART), kube, crash_journal=None if where == "kube" else (where, what))
    with pytest.raises(Crash):
        await h.handle(diagnosis("train", "llama", "gpu-0"))
    h.store.close()

    # A new agent over the same store and state directory resumes the journal.
    again = harness(tmp_path, policy(actions=RESTART), kube)
    await again.responder.resume()
    (incident,) = again.store.recent()
    assert incident.status is IncidentStatus.RESOLVED, incident.actions[0].result
    assert incident.actions[0].state is ActionState.DONE
    assert len(kube.created) == 1
    assert kube.deleted == [original]
    live = kube.workloads[("Job", "train", "llama")]
    assert live["metadata"]["annotations"]["trainmedic.io/incident"] == incident.id
    assert live["spec"]["template"]["spec"]["containers"][0]["env"][0]["value"] == "wandb-secret-value"
    # Secrets never remain: not in the store, and no replacement body left on disk.
    assert list((tmp_path / "restart-bodies").iterdir()) == []
    db = b"".join(p.read_bytes() for p in tmp_path.glob("incidents.db*") if p.is_file())
    for secret in SECRETS:
        assert secret.encode() not in db


@pytest.mark.parametrize("end", ["stale", "blocked", "gone"])
@pytest.mark.looptime
async def test_a_body_saved_before_a_crash_is_removed_when_the_resumed_plan_ends_otherwise(
    tmp_path: Path, end: str
) -> None:
    """Killed after the full body was written but before the journal said `deleting`; on resume the
    job was resubmitted (stale), its lineage hit the cap (blocked) or it is gone: nothing is deleted
    or created, and the body with its env values does not stay on disk."""
    kube = cluster("llama")
    h = harness(tmp_path, policy(actions=RESTART), kube, crash_journal=("before", "deleting"))
    with pytest.raises(Crash):
        await h.handle(diagnosis("train", "llama", "gpu-0"))
    h.store.close()
    assert len(list((tmp_path / "restart-bodies").glob("*.json"))) == 1
    meta = kube.workloads[("Job", "train", "llama")]["metadata"]
    if end == "stale":
        meta["uid"] = "resubmitted"
    elif end == "blocked":
        meta["annotations"]["trainmedic.io/restarts"] = "10"
    else:
        del kube.workloads[("Job", "train", "llama")]

    again = harness(tmp_path, policy(actions=RESTART), kube)
    await again.responder.resume()
    (incident,) = again.store.recent()
    assert (
        incident.status
        is {
            "stale": IncidentStatus.OBSERVED,
            "blocked": IncidentStatus.BLOCKED,
            "gone": IncidentStatus.FAILED,
        }[end]
    ), incident.actions[0].result
    assert kube.deleted == [] and kube.created == []
    assert list((tmp_path / "restart-bodies").iterdir()) == []
