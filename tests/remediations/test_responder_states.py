"""The responder's incident state machine, step by step: which status each mode, each refusal and
each kind of error leaves an incident in, that nothing is left `acting` (a temporary failure past its
deadline pages), and what a person hears."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from respfix import FakeKube, PagesBus, diagnosis, harness, job, node, policy

from trainmedic.agent.outbox import OutboxError
from trainmedic.agent.store import ActionState, IncidentStatus
from trainmedic.errors import PermanentError
from trainmedic.remediations import workloads as wl
from trainmedic.remediations.errors import FatalActionError
from trainmedic.remediations.kube import ConflictError, KubeForbidden, TemporaryKubeError

pytestmark = pytest.mark.asyncio

RESTART = "[restart_from_checkpoint]"


def cluster() -> FakeKube:
    kube = FakeKube(nodes={f"gpu-{i}": node(f"gpu-{i}") for i in range(4)})
    kube.add(job("train", "llama"))
    return kube


@pytest.mark.parametrize(
    ("mode", "status", "changed"),
    [
        ("observe", IncidentStatus.OBSERVED, False),
        ("dry-run", IncidentStatus.OBSERVED, False),
        ("approve", IncidentStatus.AWAITING_APPROVAL, False),
        ("enforce", IncidentStatus.RESOLVED, True),
    ],
)
@pytest.mark.looptime
async def test_each_mode_leaves_the_incident_in_its_status(
    tmp_path: Path, mode: str, status: IncidentStatus, changed: bool
) -> None:
    kube = cluster()
    h = harness(tmp_path, policy(actions=RESTART, mode=mode), kube)
    incident = await h.handle(diagnosis("train", "llama", "gpu-0"))
    assert incident.status is status
    assert bool(kube.created) is changed
    assert h.store.unfinished() == []


@pytest.mark.parametrize(("approve", "status"), [(True, IncidentStatus.RESOLVED), (False, IncidentStatus.REJECTED)])
@pytest.mark.looptime
async def test_an_approval_or_a_rejection_ends_a_waiting_plan(
    tmp_path: Path, approve: bool, status: IncidentStatus
) -> None:
    kube = cluster()
    h = harness(tmp_path, policy(actions=RESTART, mode="approve"), kube)
    incident = await h.handle(diagnosis("train", "llama", "gpu-0"))
    h.store.approve(incident.id, by="sre", approve=approve)
    await h.responder.poll_store()
    await h.responder.drain()
    assert h.store.get(incident.id).status is status
    assert bool(kube.created) is approve


@pytest.mark.parametrize(
    ("error", "status", "state", "page"),
    [
        (KubeForbidden("403: cannot delete jobs"), IncidentStatus.FAILED, ActionState.FAILED, True),
        (
            wl.UnsupportedWorkload("owned by CronJob", "由 CronJob 控制"),
            IncidentStatus.FAILED,
            ActionState.FAILED,
            True,
        ),
        (PermanentError("a permanent error of any layer"), IncidentStatus.FAILED, ActionState.FAILED, True),
        (KeyError("an error nobody expected"), IncidentStatus.FAILED, ActionState.FAILED, True),
        (TemporaryKubeError("503", delay=30.0), IncidentStatus.ACTING, ActionState.DELETING, False),
        (ConflictError("409"), IncidentStatus.ACTING, ActionState.DELETING, False),
    ],
)
@pytest.mark.looptime
async def test_each_kind_of_error_has_its_end(
    tmp_path: Path, error: Exception, status: IncidentStatus, state: ActionState, page: bool
) -> None:
    kube = cluster()
    kube.fail_delete = error
    h = harness(tmp_path, policy(actions=RESTART), kube)
    incident = await h.handle(diagnosis("train", "llama", "gpu-0"))

    assert incident.status is status
    (restart,) = incident.actions
    assert restart.state is state
    assert kube.created == []
    if status is IncidentStatus.FAILED:
        # Failed for good: nothing is left acting, the failure is published with a page.
        assert h.store.unfinished() == []
        assert (restart.result or {})["error"]
        assert h.responder.handled[incident.id] is IncidentStatus.FAILED
        ends = [e for e in h.store.timeline(incident.id) if e["kind"] == "status:failed"]
        assert ends and ends[-1]["detail"]["page"] is True
    else:
        # Temporary: the journal keeps its step and the retry time; the next pass finishes it.
        assert (restart.result or {})["retry_at"] > 0
        assert [i.id for i in h.store.unfinished()] == [incident.id]
        await h.responder._execute_again(incident.id)
        assert h.store.get(incident.id).status is IncidentStatus.RESOLVED
        assert len(kube.created) == 1


@pytest.mark.looptime
async def test_a_fatal_error_stops_the_worker_and_leaves_the_journal_to_resume(tmp_path: Path) -> None:
    kube = cluster()
    kube.fail_delete = OutboxError("the agent's own store is unusable")
    h = harness(tmp_path, policy(actions=RESTART), kube)
    with pytest.raises(FatalActionError):
        await h.handle(diagnosis("train", "llama", "gpu-0"))
    (incident,) = h.store.unfinished()
    assert incident.status is IncidentStatus.ACTING
    await h.responder.resume()
    assert h.store.get(incident.id).status is IncidentStatus.RESOLVED
    assert len(kube.created) == 1


@pytest.mark.looptime
async def test_a_plan_refused_by_the_breaker_ends_blocked_and_pages(tmp_path: Path) -> None:
    kube = cluster()
    kube.nodes["gpu-3"]["spec"]["taints"] = [{"key": "trainmedic.io/unhealthy", "effect": "NoSchedule"}]
    h = harness(
        tmp_path,
        policy("circuit_breaker:\n  max_share: 0.25\n", actions="[quarantine_node, restart_from_checkpoint]"),
        kube,
    )
    incident = await h.handle(diagnosis("train", "llama", "gpu-0"))
    assert incident.status is IncidentStatus.BLOCKED
    assert kube.quarantines == [] and kube.created == []
    assert (incident.plan or {})["page"] is True
    assert h.store.unfinished() == []


class Clock:
    def __init__(self, t: float = 1_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


DEADLINE_S = 600.0


@pytest.mark.parametrize(
    "case",
    ["quarantine-503", "quarantine-409", "restart-waits-on-another-incident"],
)
@pytest.mark.looptime
async def test_an_action_failing_temporarily_past_its_deadline_pages_and_goes_on(tmp_path: Path, case: str) -> None:
    """Temporary failures are retried, but never in silence for ever: past `retry_deadline_s` from
    the first retry the incident turns blocked and pages a person, once, while the action goes on
    being tried, and the incident still ends as it would have once the cause goes."""
    kube = cluster()
    clock = Clock()
    bus = PagesBus()
    waiting_on = None
    if case.startswith("quarantine"):
        kube.fail_quarantine = (
            TemporaryKubeError("patch nodes gpu-0: 503 the server is currently unable to handle the request")
            if case == "quarantine-503"
            else ConflictError("patch nodes gpu-0: conflict (the object has been modified)")
        )
        pol = policy(actions="[quarantine_node]")
    else:
        # Another incident deleted the job and waits for it to go (a finalizer, its own deadline far off).
        kube.terminating.add(("Job", "train", "llama"))
        pol = policy(actions=RESTART)
    h = harness(
        tmp_path, pol, kube, clock=clock, bus=bus, retry_deadline_s=DEADLINE_S, gone_deadline_s=24 * 3600, wait_gone_s=5
    )
    if not case.startswith("quarantine"):
        waiting_on = await h.handle(diagnosis("train", "llama", "gpu-1", n=9))
        assert waiting_on.actions[0].state is ActionState.DELETING
    incident = await h.handle(diagnosis("train", "llama", "gpu-0"))
    assert incident.status is IncidentStatus.ACTING
    assert incident.actions[0].state is ActionState.RUNNING

    def pages() -> list[dict[str, Any]]:
        return [e for e in h.store.timeline(incident.id) if e["kind"] == "escalated"]

    # Within the deadline: retried, nobody paged.
    clock.t += DEADLINE_S - 1
    await h.responder._execute_again(incident.id)
    assert h.store.get(incident.id).status is IncidentStatus.ACTING and pages() == []

    # Past it: blocked, a page (in both languages, naming the setting), the action still tried.
    clock.t += 2
    await h.responder._execute_again(incident.id)
    incident = h.store.get(incident.id)
    assert incident.status is IncidentStatus.BLOCKED
    assert incident.actions[0].state is ActionState.RUNNING
    [page] = pages()
    assert page["detail"]["page"] is True
    ends = [e for e in h.store.timeline(incident.id) if e["kind"] == "status:blocked"]
    assert ends[-1]["detail"]["page"] is True and ends[-1]["detail"]["still_waiting"] is True
    assert bus.incidents[-1].status == "blocked"
    blocked = (bus.incidents[-1].plan or {})["blocked"]
    assert "retry_deadline_s" in blocked["en"] and "retry_deadline_s" in blocked["zh"]
    assert [i.id for i in h.store.unfinished()] == [i.id for i in (waiting_on, incident) if i is not None]

    # Tried again: one page, not one per try.
    clock.t += 60
    await h.responder._execute_again(incident.id)
    assert len(pages()) == 1

    # The cause goes: the action finishes and the incident ends as it would have.
    if case.startswith("quarantine"):
        kube.fail_quarantine = None
        await h.responder._execute_again(incident.id)
        assert h.store.get(incident.id).status is IncidentStatus.RESOLVED
        assert kube.quarantines == ["gpu-0"]
    else:
        assert waiting_on is not None
        kube.terminating.clear()
        del kube.workloads[("Job", "train", "llama")]
        await h.responder._execute_again(waiting_on.id)
        await h.responder._execute_again(incident.id)
        assert h.store.get(waiting_on.id).status is IncidentStatus.RESOLVED
        assert h.store.get(incident.id).status is IncidentStatus.OBSERVED
        assert len(kube.created) == 1
    assert h.store.unfinished() == []
