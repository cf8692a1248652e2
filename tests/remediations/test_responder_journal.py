"""The action journal is written off the event loop's thread, in the order the actions take: each
step is on disk before the action goes on (the crash-resume tests prove the order survives a kill)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from respfix import CrashingStore, FakeKube, diagnosis, harness, job, node, policy

from trainmedic.agent.bus.memory import MemoryBus
from trainmedic.agent.responder import Responder, ResponderSettings
from trainmedic.agent.store import IncidentStatus, IncidentStore
from trainmedic.events import job_key
from trainmedic.remediations.policy_state import MemoryPolicyState

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


# Every write an incident's handling makes to the incident store and the policy state (SQLite, a
# durable commit each in production).
STORE_WRITES = ("open_incident", "set_status", "set_scene", "mark_fault_observed", "set_plan", "update_action", "note")
POLICY_WRITES = ("record", "reserve", "release")


def _recording(base: type, name: str) -> Any:
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        self.threads.append((name, threading.get_ident()))
        return getattr(base, name)(self, *args, **kwargs)

    return method


class ThreadStore(IncidentStore):
    threads: list[tuple[str, int]]


class ThreadPolicyState(MemoryPolicyState):
    threads: list[tuple[str, int]]


for _name in STORE_WRITES:
    setattr(ThreadStore, _name, _recording(IncidentStore, _name))
for _name in POLICY_WRITES:
    setattr(ThreadPolicyState, _name, _recording(MemoryPolicyState, _name))


@pytest.mark.parametrize(
    ("mode", "node_conditions", "status"),
    [
        ("observe", False, IncidentStatus.OBSERVED),
        ("observe", True, IncidentStatus.OBSERVED),
        ("dry-run", True, IncidentStatus.OBSERVED),
    ],
)
@pytest.mark.looptime
async def test_no_store_or_policy_write_of_an_incidents_scene_and_plan_runs_on_the_loop_thread(
    tmp_path: Path, mode: str, node_conditions: bool, status: IncidentStatus
) -> None:
    """What every incident goes through (open, scene, the policy's decision, plan, status, the node's
    condition noted); the actions' own policy reservations are not covered here."""
    store = ThreadStore(tmp_path / "incidents.db")
    store.threads = []
    state = ThreadPolicyState()
    state.threads = []
    responder = Responder(
        MemoryBus(),
        cluster(),  # type: ignore[arg-type]
        store,
        policy(mode=mode),
        state,
        settings=ResponderSettings(
            scene_dir=tmp_path / "scenes", reports=False, stacks=False, node_conditions=node_conditions
        ),
    )
    incident = await responder.handle(diagnosis("train", "llama", "gpu-0"), key=job_key("train", "llama"))
    responder.close()

    assert incident is not None and incident.status is status
    written = {name for name, _ in store.threads}
    assert {"open_incident", "set_scene", "set_plan", "set_status", "mark_fault_observed"} <= written
    assert ("note" in written) is node_conditions
    assert "record" in {name for name, _ in state.threads}  # the fault, observed by the policy
    loop_thread = threading.get_ident()
    on_loop = [name for name, thread in store.threads + state.threads if thread == loop_thread]
    assert on_loop == []
