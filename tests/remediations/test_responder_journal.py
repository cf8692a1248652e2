"""The action journal is written off the event loop's thread, in the order the actions take: each
step is on disk before the action goes on (the crash-resume tests prove the order survives a kill)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from respfix import CrashingStore, FakeKube, diagnosis, harness, job, node, policy

from agent.store import IncidentStatus

pytestmark = pytest.mark.asyncio


def cluster(*, terminating: bool = False) -> FakeKube:
    kube = FakeKube(nodes={f"gpu-{i}": node(f"gpu-{i}") for i in range(4)})
    kube.add(job("train", "llama"))
    if terminating:
        kube.terminating.add(("Job", "train", "llama"))
    return kube


@pytest.mark.parametrize(
    ("actions", "terminating", "steps", "status"),
    [
        ("[quarantine_node]", False, ["running", "done"], IncidentStatus.RESOLVED),
        ("[restart_from_checkpoint]", False, ["deleting", "creating", "done"], IncidentStatus.RESOLVED),
        # The original does not go: the retry is journalled (by the responder's action loop) too.
        ("[restart_from_checkpoint]", True, ["deleting", "deleting"], IncidentStatus.ACTING),
        ("[notify]", False, ["done"], IncidentStatus.RESOLVED),
    ],
    ids=["quarantine", "restart", "restart-retried", "notify"],
)
@pytest.mark.looptime
async def test_every_journal_step_is_written_off_the_loop_thread_in_order(
    tmp_path: Path, actions: str, terminating: bool, steps: list[str], status: IncidentStatus
) -> None:
    h = harness(tmp_path, policy(actions=actions), cluster(terminating=terminating), wait_gone_s=5)
    incident = await h.handle(diagnosis("train", "llama", "gpu-0"))

    assert incident.status is status
    store = h.store
    assert isinstance(store, CrashingStore)
    loop_thread = threading.get_ident()
    assert [state for state, _ in store.writes] == steps
    assert all(thread != loop_thread for _, thread in store.writes)
