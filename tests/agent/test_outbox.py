"""The durable outbox (agent/outbox.py): one row per (sink, notice), committed before enqueue returns,
UNIQUE by dedup key, in the incident store's own file, surviving reopen, held in order on retries."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from trainmedic.agent.outbox import ItemState, Outbox, OutboxError
from trainmedic.agent.store import IncidentStore
from trainmedic.remediations.policy_state import SqlitePolicyState
from trainmedic.reports.notice import Notice


def notice(incident: str = "inc-1", status: str = "acting", **over: object) -> Notice:
    data: dict[str, object] = {
        "incident_id": incident,
        "status": status,
        "time": 1_700_000_000.0,
        "fault_class": "device_error",
        "code": "xid:79",
        "chip": "nvidia",
        "node": "gpu-node-a",
        "namespace": "train",
        "job": "llama",
        "summary": {"en": "GPU has fallen off the bus", "zh": "GPU 掉卡"},
        "actions": [{"name": "quarantine_node", "state": "done", "result": {"node": "gpu-node-a"}}],
    }
    data.update(over)
    return Notice.from_dict(data)


class Clock:
    def __init__(self, t: float = 1_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "trainmedic.db"


@pytest.fixture
def outbox(db: Path, clock: Clock) -> Iterator[Outbox]:
    with Outbox(db, clock=clock) as ob:
        yield ob


def test_enqueue_is_unique_per_sink_and_dedup_key(outbox: Outbox) -> None:
    assert outbox.enqueue("ce", notice())
    assert not outbox.enqueue("ce", notice())  # a replayed incident event
    assert outbox.enqueue("feishu", notice())  # the same notice for another sink
    assert outbox.enqueue("ce", notice(status="resolved"))  # the next state of the incident
    assert outbox.depth("ce") == 2
    assert outbox.depth() == 3
    assert outbox.enqueue_many(["ce", "feishu", "slack"], notice()) == ["slack"]


def test_enqueue_is_committed_before_it_returns(outbox: Outbox, db: Path) -> None:
    outbox.enqueue("ce", notice())
    # Another connection (another process: the CLI, the next agent) sees it at once.
    with sqlite3.connect(db) as other:
        rows = other.execute("SELECT sink, dedup_key, state FROM outbox").fetchall()
    assert rows == [("ce", "inc-1/acting", "pending")]


def test_a_duplicate_stays_out_after_delivery_and_reopen(db: Path, clock: Clock) -> None:
    with Outbox(db, clock=clock) as ob:
        ob.enqueue("ce", notice())
        (item,) = ob.due("ce", now=clock(), limit=10)
        ob.delivered([item.id], now=clock(), detail={"http": 200})
    with Outbox(db, clock=clock) as again:
        assert not again.enqueue("ce", notice())
        assert again.due("ce", now=clock() + 1e6, limit=10) == []
        (done,) = again.items("ce")
    assert done.state is ItemState.DELIVERED
    assert done.attempts == 1
    assert done.detail == {"http": 200}


def test_the_notice_comes_back_as_it_went_in(outbox: Outbox, clock: Clock) -> None:
    n = notice(report_url="https://trainmedic.example/api/v1/incidents/inc-1/report", rank=3, device="GPU-7")
    outbox.enqueue("ce", n)
    (item,) = outbox.due("ce", now=clock(), limit=1)
    assert item.notice == n
    assert (item.sink, item.dedup_key, item.incident_id, item.status) == ("ce", "inc-1/acting", "inc-1", "acting")
    assert item.attempts == 0


def test_due_is_oldest_first_per_sink_and_limited(outbox: Outbox, clock: Clock) -> None:
    for i in range(5):
        outbox.enqueue("ce", notice(f"inc-{i}"))
        outbox.enqueue("slack", notice(f"inc-{i}"))
    got = outbox.due("ce", now=clock(), limit=3)
    assert [i.incident_id for i in got] == ["inc-0", "inc-1", "inc-2"]
    assert {i.sink for i in got} == {"ce"}


def test_retry_later_holds_the_whole_sink_in_order(outbox: Outbox, clock: Clock) -> None:
    outbox.enqueue("ce", notice("inc-1", "acting"))
    outbox.enqueue("ce", notice("inc-2", "acting"))
    outbox.enqueue("slack", notice("inc-1", "acting"))
    first = outbox.due("ce", now=clock(), limit=1)
    outbox.retry_later([first[0].id], error="HTTP 503: busy", next_at=clock() + 30)
    # Nothing of that sink goes before the held item, not even what is queued later ...
    outbox.enqueue("ce", notice("inc-1", "resolved"))
    assert outbox.due("ce", now=clock() + 29, limit=10) == []
    assert outbox.next_due("ce") == pytest.approx(clock() + 30)
    # ... while another sink is not held.
    assert len(outbox.due("slack", now=clock(), limit=10)) == 1
    again = outbox.due("ce", now=clock() + 30, limit=10)
    assert [i.dedup_key for i in again] == ["inc-1/acting", "inc-2/acting", "inc-1/resolved"]
    assert again[0].attempts == 1
    assert again[0].last_error == "HTTP 503: busy"


def test_dead_items_keep_their_reason_and_leave_the_queue(outbox: Outbox, clock: Clock) -> None:
    outbox.enqueue("ce", notice())
    (item,) = outbox.due("ce", now=clock(), limit=1)
    outbox.dead([item.id], error="HTTP 400: " + "x" * 5000)
    assert outbox.depth("ce") == 0
    (dead,) = outbox.items(state=ItemState.DEAD)
    assert dead.last_error is not None
    assert dead.last_error.startswith("HTTP 400")
    assert len(dead.last_error) <= 1000
    # A finished item is never set back to pending or delivered.
    outbox.delivered([item.id], now=clock())
    outbox.retry_later([item.id], error="late", next_at=clock())
    assert outbox.items()[0].state is ItemState.DEAD


def test_an_unreadable_row_is_set_dead_without_blocking_the_rest(outbox: Outbox, db: Path, clock: Clock) -> None:
    outbox.enqueue("ce", notice("inc-1"))
    outbox.enqueue("ce", notice("inc-2"))
    with sqlite3.connect(db) as other:
        other.execute("UPDATE outbox SET notice = '{not json' WHERE incident_id = 'inc-1'")
    got = outbox.due("ce", now=clock(), limit=10)
    assert [i.incident_id for i in got] == ["inc-2"]
    assert outbox.depth("ce") == 1


def test_prune_forgets_finished_rows_only(outbox: Outbox, clock: Clock) -> None:
    outbox.enqueue("ce", notice("inc-1"))
    outbox.enqueue("ce", notice("inc-2"))
    outbox.enqueue("ce", notice("inc-3"))
    a, b, _ = outbox.due("ce", now=clock(), limit=10)
    outbox.delivered([a.id], now=clock())
    outbox.dead([b.id], error="no", now=clock())
    assert outbox.prune(clock() + 1) == 2
    assert [i.incident_id for i in outbox.items()] == ["inc-3"]


def test_old_finished_rows_are_pruned_when_the_file_is_opened(db: Path, clock: Clock) -> None:
    with Outbox(db, clock=clock) as ob:
        ob.enqueue("ce", notice())
        (item,) = ob.due("ce", now=clock(), limit=1)
        ob.delivered([item.id], now=clock())
    clock.t += 31 * 86400
    with Outbox(db, clock=clock) as ob:
        assert ob.items() == []
        assert ob.enqueue("ce", notice())


def test_shares_the_incident_store_file_with_its_own_version_table(db: Path, clock: Clock) -> None:
    store = IncidentStore(db)
    state = SqlitePolicyState(db)
    with Outbox(db, clock=clock) as ob:
        assert ob.schema_version == 1
        assert ob.enqueue("ce", notice())
    assert store.schema_version >= 1
    with sqlite3.connect(db) as conn:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
    assert {"outbox", "outbox_schema_version", "incidents", "incident_schema_version"} <= tables
    assert mode == "wal"
    store.close()
    state.close()


def test_a_newer_schema_is_refused(db: Path) -> None:
    Outbox(db).close()
    with sqlite3.connect(db) as conn:
        conn.execute("INSERT INTO outbox_schema_version (version) VALUES (99)")
    with pytest.raises(OutboxError, match="schema version 99"):
        Outbox(db)


def test_a_file_that_is_not_sqlite_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "not.db"
    bad.write_bytes(b"this is not a database" * 100)
    with pytest.raises(OutboxError, match="not a usable SQLite file"):
        Outbox(bad)


def test_a_path_that_cannot_be_created_is_refused(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(OutboxError, match="cannot open"):
        Outbox(tmp_path / "file" / "sub" / "trainmedic.db")
