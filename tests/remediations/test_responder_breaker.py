"""The circuit breaker under concurrent faults: the check and the reservation are one atomic step,
and the count of quarantined nodes is the cluster's own (nodes carrying trainmedic's taint)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from respfix import FakeKube, diagnosis, harness, node, policy

from agent.store import IncidentStatus

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
    first = await h.handle(diagnosis("train", "job-0", "gpu-0"))
    second = await h.handle(diagnosis("train", "job-1", "gpu-1"))
    assert first.status is second.status is IncidentStatus.AWAITING_APPROVAL
    for i in (first, second):
        h.store.approve(i.id, by="sre")
    await h.responder._execute_again(first.id)
    await h.responder._execute_again(second.id)
    assert kube.quarantines == ["gpu-0"]
    assert h.store.get(second.id).status is IncidentStatus.BLOCKED
