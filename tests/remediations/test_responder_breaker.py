"""The circuit breaker under concurrent faults: the check and the reservation are one atomic step,
and the count of quarantined nodes is the cluster's own (nodes carrying trainmedic's taint)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

import pytest
from respfix import POOL_LABEL, FakeKube, Harness, diagnosis, harness, node, policy

from trainmedic.agent.store import IncidentStatus
from trainmedic.remediations.policy import CLAIM_ANNOTATION, RESERVATION_HOLD_S, format_claim
from trainmedic.remediations.policy_state import MemoryPolicyState

pytestmark = pytest.mark.asyncio


@pytest.mark.parametrize(
    ("pool_size", "failing", "share", "expected"),
    [(64, 32, 0.1, 6), (8, 4, 0.125, 1), (10, 10, 0.3, 3)],
)
@pytest.mark.looptime
async def test_faults_at_once_quarantine_no_more_than_the_share(
    tmp_path: Path, pool_size: int, failing: int, share: float, expected: int
) -> None:
    kube = FakeKube(nodes={f"gpu-{i}": node(f"gpu-{i}") for i in range(pool_size)})
    h = harness(tmp_path, policy(f"circuit_breaker:\n  max_share: {share}\n"), kube)
    await asyncio.gather(*(h.handle(diagnosis("train", f"job-{i}", f"gpu-{i}")) for i in range(failing)))

    assert len(kube.quarantines) == expected
    tainted = [n for n in kube.nodes.values() if n["spec"].get("taints")]
    assert len(tainted) == expected
    statuses = [i.status for i in h.store.recent(limit=1000)]
    assert statuses.count(IncidentStatus.RESOLVED) == expected
    assert statuses.count(IncidentStatus.BLOCKED) == failing - expected


@pytest.mark.looptime
async def test_nodes_tainted_by_another_brain_count(tmp_path: Path) -> None:
    kube = FakeKube(nodes={f"gpu-{i}": node(f"gpu-{i}") for i in range(10)})
    kube.nodes["gpu-9"]["spec"]["taints"] = [{"key": "trainmedic.io/unhealthy", "effect": "NoSchedule"}]
    h = harness(tmp_path, policy("circuit_breaker:\n  max_share: 0.1\n"), kube)
    incident = await h.handle(diagnosis("train", "job-0", "gpu-0"))
    assert incident.status is IncidentStatus.BLOCKED
    assert kube.quarantines == []
    assert "Circuit breaker open" in (incident.plan or {}).get("blocked", {}).get("en", "")


@pytest.mark.looptime
async def test_an_approved_plan_is_checked_again_when_it_runs(tmp_path: Path) -> None:
    kube = FakeKube(nodes={f"gpu-{i}": node(f"gpu-{i}") for i in range(10)})
    h = harness(tmp_path, policy("circuit_breaker:\n  max_share: 0.1\n", mode="approve"), kube)
    first, second = await _two_plans_approved_then_run(h)
    assert first.status is second.status is IncidentStatus.AWAITING_APPROVAL
    assert kube.quarantines == ["gpu-0"]
    assert h.store.get(second.id).status is IncidentStatus.BLOCKED


async def _two_plans_approved_then_run(h: Harness, planned: Callable[[], None] = lambda: None) -> tuple[Any, Any]:
    """Two quarantine plans on gpu-0 and gpu-1 made in approve mode (`planned` runs once both are
    planned), both approved, then run in that order; returns the two incidents as planned."""
    first = await h.handle(diagnosis("train", "job-0", "gpu-0"))
    second = await h.handle(diagnosis("train", "job-1", "gpu-1"))
    planned()
    for i in (first, second):
        h.store.approve(i.id, by="sre")
    await h.responder._execute_again(first.id)
    await h.responder._execute_again(second.id)
    return first, second


class ThreadRecordingState(MemoryPolicyState):
    """The in-memory policy state, noting the thread of every write."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[tuple[str, str]] = []

    def reserve(self, key: str, member: str, *, limit: int, held: Collection[str], t: float, since: float) -> bool:
        self.writes.append(("reserve", threading.current_thread().name))
        return super().reserve(key, member, limit=limit, held=held, t=t, since=since)

    def release(self, key: str, member: str) -> None:
        self.writes.append(("release", threading.current_thread().name))
        super().release(key, member)

    def record(self, kind: str, key: str, t: float) -> None:
        self.writes.append((f"record {kind}", threading.current_thread().name))
        super().record(kind, key, t)


@pytest.mark.looptime
async def test_the_actions_policy_steps_run_off_the_loop_in_the_policy_thread(tmp_path: Path) -> None:
    """The actions' reservations, their commits and a refusal at run time write the policy state
    (SQLite in production) from the policy thread, never on the event loop."""
    kube = FakeKube(nodes={f"gpu-{i}": node(f"gpu-{i}") for i in range(10)})
    state = ThreadRecordingState()
    planned: list[int] = []
    h = harness(tmp_path, policy("circuit_breaker:\n  max_share: 0.1\n", mode="approve"), kube, state=state)
    _first, second = await _two_plans_approved_then_run(h, planned=lambda: planned.append(len(state.writes)))

    assert kube.quarantines == ["gpu-0"]
    assert h.store.get(second.id).status is IncidentStatus.BLOCKED
    at_run_time = state.writes[planned[0] :]
    assert [kind for kind, _ in at_run_time].count("reserve") == 2
    loop_thread = threading.current_thread().name
    assert [w for w in state.writes if w[1] == loop_thread] == []
    assert {name for _, name in state.writes} == {"trainmedic-policy_0"}


def brains(tmp_path: Path, kube: FakeKube, count: int, share: float, mode: str = "enforce") -> list[Harness]:
    """`count` brains that share nothing but the cluster (each its own store and policy state)."""
    out = []
    for b in range(count):
        (tmp_path / f"brain-{b}").mkdir()
        out.append(
            harness(tmp_path / f"brain-{b}", policy(f"circuit_breaker:\n  max_share: {share}\n", mode=mode), kube)
        )
    return out


@pytest.mark.parametrize("count", [2, 3])
@pytest.mark.parametrize(
    ("pool_size", "failing", "share", "expected"),
    [(64, 32, 0.1, 6), (8, 4, 0.125, 1), (10, 10, 0.3, 3)],
)
@pytest.mark.looptime
async def test_brains_sharing_only_the_cluster_take_no_more_than_the_share_between_them(
    tmp_path: Path, count: int, pool_size: int, failing: int, share: float, expected: int
) -> None:
    kube = FakeKube(nodes={f"gpu-{i}": node(f"gpu-{i}") for i in range(pool_size)})
    hs = brains(tmp_path, kube, count, share)
    await asyncio.gather(*(hs[i % count].handle(diagnosis("train", f"job-{i}", f"gpu-{i}")) for i in range(failing)))

    assert len(kube.quarantines) == expected
    statuses = [i.status for h in hs for i in h.store.recent(limit=1000)]
    assert statuses.count(IncidentStatus.RESOLVED) == expected
    assert statuses.count(IncidentStatus.BLOCKED) == failing - expected
    # No claim is left behind: the tainted nodes count by their taint, the others backed off.
    assert [n for n, o in kube.nodes.items() if CLAIM_ANNOTATION in o["metadata"]["annotations"]] == []


@pytest.mark.parametrize(("age_s", "blocked"), [(1.0, True), (RESERVATION_HOLD_S + 60, False)])
@pytest.mark.looptime
async def test_a_claim_of_another_brain_counts_until_it_expires(tmp_path: Path, age_s: float, blocked: bool) -> None:
    """Another brain claimed gpu-9 (it is about to taint it): a late-approved plan for gpu-0 counts that
    claim when it runs; a claim older than the reservation hold (its brain died) does not."""
    kube = FakeKube(nodes={f"gpu-{i}": node(f"gpu-{i}") for i in range(10)})
    (h,) = brains(tmp_path, kube, 1, 0.1, mode="approve")
    incident = await h.handle(diagnosis("train", "job-0", "gpu-0"))
    assert incident.status is IncidentStatus.AWAITING_APPROVAL
    kube.nodes["gpu-9"]["metadata"]["annotations"][CLAIM_ANNOTATION] = format_claim(time.time() - age_s, "other")
    h.store.approve(incident.id, by="sre")
    await h.responder._execute_again(incident.id)
    assert h.store.get(incident.id).status is (IncidentStatus.BLOCKED if blocked else IncidentStatus.RESOLVED)
    assert kube.quarantines == ([] if blocked else ["gpu-0"])
    assert CLAIM_ANNOTATION not in kube.nodes["gpu-0"]["metadata"]["annotations"]


@pytest.mark.looptime
async def test_a_pool_that_may_go_whole_writes_no_claims(tmp_path: Path) -> None:
    kube = FakeKube(nodes={f"gpu-{i}": node(f"gpu-{i}") for i in range(4)})
    (h,) = brains(tmp_path, kube, 1, 1.0)
    await asyncio.gather(*(h.handle(diagnosis("train", f"job-{i}", f"gpu-{i}")) for i in range(4)))
    assert len(kube.quarantines) == 4
    assert kube.claims_written == 0


@pytest.mark.parametrize(
    ("age_s", "status"),
    [(1.0, IncidentStatus.BLOCKED), (RESERVATION_HOLD_S + 60, IncidentStatus.AWAITING_APPROVAL)],
)
@pytest.mark.looptime
async def test_the_plan_counts_a_claim_in_flight(tmp_path: Path, age_s: float, status: IncidentStatus) -> None:
    """Another brain claimed gpu-9 and is about to taint it: the plan for gpu-0 is made with that place
    taken (the breaker is open at plan time, nobody is asked to approve a plan that cannot run); a claim
    older than the reservation hold (its brain died) is not counted."""
    kube = FakeKube(nodes={f"gpu-{i}": node(f"gpu-{i}") for i in range(10)})
    kube.nodes["gpu-9"]["metadata"]["annotations"][CLAIM_ANNOTATION] = format_claim(time.time() - age_s, "other")
    (h,) = brains(tmp_path, kube, 1, 0.1, mode="approve")
    incident = await h.handle(diagnosis("train", "job-0", "gpu-0"))
    assert incident.status is status
    blocked = (incident.plan or {}).get("blocked") or {}
    if status is IncidentStatus.BLOCKED:
        assert "Circuit breaker open" in blocked.get("en", "") and "1 of 10 nodes" in blocked.get("en", "")
    else:
        assert not blocked
    assert kube.quarantines == []


@pytest.mark.looptime
async def test_the_breaker_reads_only_the_failing_nodes_pool(tmp_path: Path) -> None:
    """With pools labelled, each incident lists only its pool's nodes (by the pool label), and the
    share is counted within that pool: the other pool's taints do not count."""
    nodes = {f"h-{i}": node(f"h-{i}", pool="h100") for i in range(10)}
    nodes |= {f"a-{i}": node(f"a-{i}", pool="a100") for i in range(10)}
    nodes["a-9"]["spec"]["taints"] = [{"key": "trainmedic.io/unhealthy", "effect": "NoSchedule"}]
    kube = FakeKube(nodes=nodes)
    h = harness(tmp_path, policy("circuit_breaker:\n  max_share: 0.1\n"), kube)
    incident = await h.handle(diagnosis("train", "job-0", "h-0"))

    assert incident.status is IncidentStatus.RESOLVED
    assert kube.quarantines == ["h-0"]
    assert kube.node_lists and all(sel == {POOL_LABEL: "h100"} for sel in kube.node_lists)


@pytest.mark.looptime
async def test_a_node_outside_any_pool_is_weighed_against_all_nodes(tmp_path: Path) -> None:
    nodes = {f"gpu-{i}": node(f"gpu-{i}") for i in range(10)}
    del nodes["gpu-0"]["metadata"]["labels"][POOL_LABEL]
    kube = FakeKube(nodes=nodes)
    h = harness(tmp_path, policy("circuit_breaker:\n  max_share: 0.1\n"), kube)
    incident = await h.handle(diagnosis("train", "job-0", "gpu-0"))

    assert kube.quarantines == ["gpu-0"]
    assert incident.status is IncidentStatus.RESOLVED
    assert kube.node_lists and all(sel == {} for sel in kube.node_lists)
