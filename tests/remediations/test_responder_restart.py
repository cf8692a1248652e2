"""Restart from checkpoint on the journal: a deleted job always gets its replacement (a refusal past
the delete holds the journal and its body, and pages), the plan acts only on the job it was made for
(not one submitted since, nor one someone else is deleting), and the lifetime cap of a lineage."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from respfix import Crash, FakeKube, Harness, PagesBus, diagnosis, harness, job, node, pod, policy

from trainmedic.agent.store import ActionState, IncidentStatus
from trainmedic.remediations.kube import KubeForbidden, KubeInvalid, PermanentKubeError

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


# Answers a create (or a delete sent again) may get once the job is deleted that no retry of the
# same request fixes by itself; a person (or time) must change something first.
REFUSALS = [
    pytest.param(
        KubeForbidden(
            "create jobs train/llama: forbidden: exceeded quota: gpu-quota, requested: nvidia.com/gpu=8, "
            "used: nvidia.com/gpu=60, limited: nvidia.com/gpu=64"
        ),
        id="quota-403",
    ),
    pytest.param(
        KubeForbidden(
            'create jobs train/llama: admission webhook "validate.kyverno.svc-fail" denied the request: '
            "image registry not allowed"
        ),
        id="webhook-403",
    ),
    pytest.param(KubeInvalid("create jobs train/llama: invalid (422): spec.template: Invalid value"), id="invalid-422"),
    pytest.param(
        PermanentKubeError(
            "unauthorized: create jobs train/llama: the API server rejected the agent's credentials", status=401
        ),
        id="unauthorized-401",
    ),
]


def escalations(h: Harness, incident_id: str) -> list[dict[str, Any]]:
    return [e for e in h.store.timeline(incident_id) if e["kind"] == "escalated"]


@pytest.mark.parametrize("end", ["cleared", "by_hand"])
@pytest.mark.parametrize("error", REFUSALS)
@pytest.mark.looptime
async def test_a_create_refused_after_the_delete_holds_the_journal_and_its_body(
    tmp_path: Path, error: Exception, end: str
) -> None:
    """The job is deleted, then its replacement is refused: the incident is blocked and pages with the
    saved body's path and the error, the journal stays at creating and is tried again with backoff,
    and the body (the only full copy of the job's spec) stays until the job exists again."""
    kube = cluster("llama")
    kube.fail_create = error
    clock = Clock()
    bus = PagesBus()
    h = harness(tmp_path, policy(actions=RESTART), kube, clock=clock, bus=bus)
    incident = await h.handle(diagnosis("train", "llama", "gpu-0"))

    assert ("Job", "train", "llama") not in kube.workloads and len(kube.deleted) == 1
    assert incident.status is IncidentStatus.BLOCKED
    (restart,) = incident.actions
    assert restart.state is ActionState.CREATING
    body = tmp_path / "restart-bodies" / restart.params["body_ref"]["file"]
    assert body.is_file()
    assert [i.id for i in h.store.unfinished()] == [incident.id]
    [page] = escalations(h, incident.id)
    assert page["detail"]["page"] is True and str(body) in page["detail"]["why"]
    # What the sinks page a person with says where the spec is and what failed, in both languages.
    assert bus.incidents[-1].status == "blocked"
    blocked = (bus.incidents[-1].plan or {})["blocked"]
    for lang in ("en", "zh"):
        assert str(body) in blocked[lang] and str(error) in blocked[lang]

    # Tried again later, with backoff: still held, still one page, the body still there.
    first_delay = (restart.result or {})["retry_at"] - clock.t
    clock.t += 3600
    await h.responder._execute_again(incident.id)
    again = h.store.get(incident.id)
    assert again.status is IncidentStatus.BLOCKED and again.actions[0].state is ActionState.CREATING
    assert (again.actions[0].result or {})["retry_at"] - clock.t == 2 * first_delay
    assert body.is_file() and len(escalations(h, incident.id)) == 1 and kube.created == []

    clock.t += 3600
    if end == "cleared":
        # The quota is raised, the webhook fixed, the token renewed: exactly one create, from the body.
        kube.fail_create = None
        await h.responder._execute_again(incident.id)
        incident = h.store.get(incident.id)
        assert incident.status is IncidentStatus.RESOLVED
        [created] = kube.created
        assert created["metadata"]["annotations"]["trainmedic.io/incident"] == incident.id
        assert created["spec"]["template"]["spec"]["containers"][0]["env"][0]["value"] == "wandb-secret-value"
    else:
        # A person recreated the job from the file: it is left as it is and the journal ends.
        kube.add(json.loads(body.read_text()) | {"metadata": {"namespace": "train", "name": "llama"}})
        await h.responder._execute_again(incident.id)
        incident = h.store.get(incident.id)
        assert incident.status is IncidentStatus.FAILED
        assert "recreated by someone else" in (incident.actions[0].result or {})["error"]
        assert kube.created == []
    assert h.store.unfinished() == []
    assert not body.exists()


@pytest.mark.looptime
async def test_an_unreadable_body_after_the_delete_is_held_until_it_can_be_read(tmp_path: Path) -> None:
    """The agent dies between the delete and the create and its saved body is damaged meanwhile: the
    resumed journal pages and waits (the job is gone, nothing else holds its spec), and creates the
    job once the file is whole again."""
    kube = cluster("llama")
    kube.crash_at = "before_create"
    h = harness(tmp_path, policy(actions=RESTART), kube)
    with pytest.raises(Crash):
        await h.handle(diagnosis("train", "llama", "gpu-0"))
    h.store.close()
    [body] = (tmp_path / "restart-bodies").glob("*.json")
    whole = body.read_bytes()
    body.write_bytes(whole[: len(whole) // 2])

    clock = Clock()
    bus = PagesBus()
    again = harness(tmp_path, policy(actions=RESTART), kube, clock=clock, bus=bus)
    await again.responder.resume()
    (incident,) = again.store.recent()
    assert incident.status is IncidentStatus.BLOCKED
    assert incident.actions[0].state is ActionState.CREATING
    assert body.is_file() and kube.created == []
    assert "does not match its journal checksum" in (bus.incidents[-1].plan or {})["blocked"]["en"]

    body.write_bytes(whole)
    clock.t += 60
    await again.responder._execute_again(incident.id)
    incident = again.store.get(incident.id)
    assert incident.status is IncidentStatus.RESOLVED
    assert len(kube.created) == 1 and not body.exists()


@pytest.mark.parametrize(
    "error",
    [
        pytest.param(KubeForbidden("delete jobs train/llama: forbidden"), id="forbidden-403"),
        pytest.param(PermanentKubeError("unauthorized: delete jobs train/llama", status=401), id="unauthorized-401"),
    ],
)
@pytest.mark.looptime
async def test_a_delete_refused_on_resume_after_an_earlier_delete_landed_carries_on(
    tmp_path: Path, error: Exception
) -> None:
    """Killed right after its delete landed; the resumed delete is refused (a token rotated, a Role
    edited): the original is gone all the same, so the journal carries on and creates the job."""
    kube = cluster("llama")
    kube.crash_at = "after_delete"
    h = harness(tmp_path, policy(actions=RESTART), kube)
    with pytest.raises(Crash):
        await h.handle(diagnosis("train", "llama", "gpu-0"))
    h.store.close()
    kube.fail_delete = error

    again = harness(tmp_path, policy(actions=RESTART), kube)
    await again.responder.resume()
    (incident,) = again.store.recent()
    assert incident.status is IncidentStatus.RESOLVED, incident.actions[0].result
    assert len(kube.created) == 1 and len(kube.deleted) == 1


@pytest.mark.parametrize("submitted", ["by_hand", "by_another_incident"])
@pytest.mark.looptime
async def test_a_late_approval_of_a_plan_made_without_the_job_leaves_the_job_submitted_since(
    tmp_path: Path, submitted: str
) -> None:
    """No job when the diagnosis was handled (deleted, or between another restart's delete and its
    create); one appears before somebody approves: it is not the job the plan was made for."""
    kube = cluster()
    h = harness(tmp_path, policy(actions=RESTART, mode="approve"), kube)
    incident = await h.handle(diagnosis("train", "llama", "gpu-0"))
    assert incident.status is IncidentStatus.AWAITING_APPROVAL
    annotations = {"trainmedic.io/incident": "d-train-llama-other"} if submitted == "by_another_incident" else {}
    kube.add(job("train", "llama", **annotations))
    h.store.approve(incident.id, by="sre")
    await h.responder._execute_again(incident.id)

    incident = h.store.get(incident.id)
    assert kube.deleted == [] and kube.created == []
    assert incident.status is IncidentStatus.OBSERVED
    assert "was not there when this plan was made" in (incident.actions[0].result or {})["reason"]
    assert any(e["kind"] == "stale" for e in h.store.timeline(incident.id))
    # The plan said so: no workload when it was made.
    assert incident.actions[0].params["identity"] == {"absent": True}


@pytest.mark.parametrize(
    ("mode", "deleted_when"),
    [("enforce", "before_the_diagnosis"), ("approve", "before_the_approval")],
)
@pytest.mark.looptime
async def test_a_job_someone_else_is_deleting_is_never_recreated(tmp_path: Path, mode: str, deleted_when: str) -> None:
    """A user deletes the job with a foreground cascade: its pods die first, and their deaths are
    the diagnosis. Recreating it would undo the user's delete: nothing is deleted or created."""
    kube = cluster("llama")
    key = ("Job", "train", "llama")

    def user_deletes() -> None:
        kube.workloads[key]["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:30Z"
        kube.terminating.add(key)

    if deleted_when == "before_the_diagnosis":
        user_deletes()
    h = harness(tmp_path, policy(actions=RESTART, mode=mode), kube, wait_gone_s=5)
    incident = await h.handle(diagnosis("train", "llama", "gpu-0"))
    if deleted_when == "before_the_approval":
        assert incident.status is IncidentStatus.AWAITING_APPROVAL
        user_deletes()
        h.store.approve(incident.id, by="sre")
        await h.responder._execute_again(incident.id)
    # The user's delete completes; whatever trainmedic still carries on with runs once more.
    kube.terminating.clear()
    del kube.workloads[key]
    await h.responder.poll_store()
    await h.responder.drain()

    incident = h.store.get(incident.id)
    assert kube.deleted == [] and kube.created == []
    assert incident.status is IncidentStatus.OBSERVED
    assert h.store.unfinished() == []
    if deleted_when == "before_the_diagnosis":
        assert incident.plan is None
        [note] = [e for e in h.store.timeline(incident.id) if e["kind"] == "terminating"]
        assert note["detail"]["why"]["en"] and note["detail"]["why"]["zh"]
    else:
        assert "being deleted by someone else" in (incident.actions[0].result or {})["reason"]
