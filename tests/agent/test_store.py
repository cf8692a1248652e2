"""The incident store: a real SQLite file, reopened, shared by two connections, refusing newer schemas."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from trainmedic.agent.store import ActionState, IncidentStatus, IncidentStore, StoreError


def _open(store: IncidentStore, iid: str = "inc-0001", revision: int = 1) -> None:
    store.open_incident(
        iid,
        key="job:train/llama",
        diagnosis={"diagnosis": {"root_cause": None}, "revision": revision},
        revision=revision,
        namespace="train",
        job="llama",
        fault_class="device_error",
        code="xid:79",
        node="gpu-2",
    )


def test_incident_survives_reopen(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    store = IncidentStore(path)
    _open(store)
    store.set_plan(
        "inc-0001", {"mode": "enforce"}, "enforce", [("quarantine_node", {}), ("restart_from_checkpoint", {})]
    )
    store.set_status("inc-0001", IncidentStatus.ACTING)
    store.update_action("inc-0001", 1, ActionState.DELETING, params={"body": {"kind": "Job"}})
    store.close()

    again = IncidentStore(path)
    inc = again.get("inc-0001")
    assert inc.status is IncidentStatus.ACTING
    assert [a.state for a in inc.actions] == [ActionState.PLANNED, ActionState.DELETING]
    assert inc.actions[1].params == {"body": {"kind": "Job"}}
    assert [i.id for i in again.unfinished()] == ["inc-0001"]
    kinds = [e["kind"] for e in again.timeline("inc-0001")]
    assert kinds == ["detected", "planned", "status:acting", "action:restart_from_checkpoint:deleting"]


def test_replayed_diagnosis_lands_on_the_same_incident(tmp_path: Path) -> None:
    store = IncidentStore(tmp_path / "s.db")
    _open(store, revision=2)
    inc, created = store.open_incident(
        "inc-0001", key="job:train/llama", diagnosis={"revision": 1}, revision=1, fault_class="hang"
    )
    assert not created
    assert inc.revision == 2 and inc.fault_class == "device_error"  # an older revision does not overwrite


def test_plan_is_recorded_once(tmp_path: Path) -> None:
    store = IncidentStore(tmp_path / "s.db")
    _open(store)
    store.set_plan("inc-0001", {"n": 1}, "enforce", [("notify", {})])
    store.set_plan("inc-0001", {"n": 2}, "enforce", [("quarantine_node", {}), ("notify", {})])
    inc = store.get("inc-0001")
    assert inc.plan == {"n": 1} and [a.name for a in inc.actions] == ["notify"]


@pytest.mark.parametrize("approve", [True, False])
def test_approval_from_a_second_connection(tmp_path: Path, approve: bool) -> None:
    """The CLI approves through its own connection while the agent holds the file open."""
    agent = IncidentStore(tmp_path / "s.db")
    _open(agent)
    agent.set_plan("inc-0001", {}, "approve", [("quarantine_node", {})])
    agent.set_status("inc-0001", IncidentStatus.AWAITING_APPROVAL)
    cli = IncidentStore(tmp_path / "s.db")
    cli.approve("inc-0", by="alice", approve=approve, comment="ok")  # a unique id prefix is enough
    inc = agent.get("inc-0001")
    assert inc.status is (IncidentStatus.ACTING if approve else IncidentStatus.REJECTED)
    assert inc.approval is not None and inc.approval["by"] == "alice"
    with pytest.raises(StoreError, match="not awaiting approval"):
        cli.approve("inc-0001", by="bob")


def test_unknown_incident_and_action(tmp_path: Path) -> None:
    store = IncidentStore(tmp_path / "s.db")
    with pytest.raises(StoreError, match="no incident"):
        store.get("nope")
    _open(store)
    with pytest.raises(StoreError, match="no action 3"):
        store.update_action("inc-0001", 3, ActionState.DONE)


def test_fault_observed_once(tmp_path: Path) -> None:
    store = IncidentStore(tmp_path / "s.db")
    _open(store)
    assert store.mark_fault_observed("inc-0001")
    assert not store.mark_fault_observed("inc-0001")


def test_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    IncidentStore(path).close()
    db = sqlite3.connect(path)
    db.execute("INSERT INTO incident_schema_version (version) VALUES (99)")
    db.commit()
    db.close()
    with pytest.raises(StoreError, match="schema version 99"):
        IncidentStore(path)


def test_not_a_database(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    path.write_bytes(b"\x00garbage" * 1000)
    with pytest.raises(StoreError, match=r"s\.db"):
        IncidentStore(path)


@pytest.mark.parametrize("prefix", ["____", "%%%%", "a1b_", "a1b%", "_1b2", "A1B2"])
def test_an_id_prefix_is_matched_literally(tmp_path: Path, prefix: str) -> None:
    """`_` and `%` are not wildcards: `____` must not find (and let anyone approve) an incident."""
    store = IncidentStore(tmp_path / "s.db")
    store.open_incident("a1b2c3d4", key="job:t/a", diagnosis={}, revision=1)
    store.set_status("a1b2c3d4", IncidentStatus.AWAITING_APPROVAL)
    assert store.find(prefix) is None
    with pytest.raises(StoreError):
        store.approve(prefix, by="mallory")
    assert store.get("a1b2c3d4").status is IncidentStatus.AWAITING_APPROVAL
    assert store.find("a1b2").id == "a1b2c3d4"  # type: ignore[union-attr]
    store.close()


@pytest.mark.parametrize(
    ("status", "action_state", "carried_on"),
    [
        (IncidentStatus.OPEN, None, False),
        (IncidentStatus.OBSERVED, None, False),
        (IncidentStatus.AWAITING_APPROVAL, ActionState.PLANNED, False),
        (IncidentStatus.ACTING, ActionState.PLANNED, True),
        (IncidentStatus.ACTING, ActionState.DELETING, True),
        (IncidentStatus.BLOCKED, ActionState.CREATING, True),
        (IncidentStatus.BLOCKED, ActionState.SKIPPED, False),
        (IncidentStatus.RESOLVED, ActionState.DONE, False),
    ],
)
def test_carrying_on_lists_the_incidents_whose_actions_go_on_not_the_open_ones(
    tmp_path: Path, status: IncidentStatus, action_state: ActionState | None, carried_on: bool
) -> None:
    store = IncidentStore(tmp_path / "s.db")
    _open(store, "inc-0001")
    _open(store, "inc-open")  # open beside it: a restart's `unfinished` lists it, the poll does not
    if action_state is not None:
        store.set_plan("inc-0001", {"mode": "enforce"}, "enforce", [("quarantine_node", {})])
        if action_state is not ActionState.PLANNED:
            store.update_action("inc-0001", 0, action_state)
    if status is not IncidentStatus.OPEN:
        store.set_status("inc-0001", status)
    assert [i.id for i in store.carrying_on()] == (["inc-0001"] if carried_on else [])
    assert "inc-open" in [i.id for i in store.unfinished()]
