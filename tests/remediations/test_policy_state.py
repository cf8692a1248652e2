"""The policy's memory: the same behaviour in memory and in SQLite; the SQLite file survives a
reopen, is shared safely between two instances and two processes, migrates, and prunes old events."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from paths import ROOT

from trainmedic.remediations.policy_state import (
    MIGRATIONS,
    RETENTION_S,
    MemoryPolicyState,
    PolicyState,
    PolicyStateError,
    SqlitePolicyState,
)

NOW = 1_700_000_000.0


@pytest.fixture(params=["memory", "sqlite"])
def state(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[MemoryPolicyState | SqlitePolicyState]:
    if request.param == "memory":
        yield MemoryPolicyState()
    else:
        with SqlitePolicyState(tmp_path / "state.db", now=NOW) as s:
            yield s


def test_both_implement_the_protocol(state: PolicyState) -> None:
    assert isinstance(state, PolicyState)


@pytest.mark.parametrize(
    ("since", "count"),
    [(float("-inf"), 4), (NOW - 100, 4), (NOW - 50, 3), (NOW - 49.5, 2), (NOW, 1), (NOW + 1, 0)],
)
def test_count_and_times_since(state: PolicyState, since: float, count: int) -> None:
    for t in (NOW - 100, NOW, NOW - 50, NOW - 10):  # out of order on purpose
        state.record("restart", "job:train/a", t)
    state.record("restart", "job:train/b", NOW)
    state.record("quarantine", "job:train/a", NOW)
    assert state.count("restart", "job:train/a", since) == count
    times = state.times("restart", "job:train/a", since)
    assert times == sorted(times) and len(times) == count
    assert all(t >= since for t in times)


def test_unknown_key_is_empty(state: PolicyState) -> None:
    assert state.count("restart", "job:nowhere/x", float("-inf")) == 0
    assert state.times("restart", "job:nowhere/x", float("-inf")) == []


@pytest.mark.parametrize("key", ["job:ns/naïve", "node:a'b", 'pool:x"; DROP TABLE policy_events; --', ""])
def test_awkward_keys_round_trip(state: PolicyState, key: str) -> None:
    state.record("k", key, NOW)
    assert state.times("k", key, NOW) == [NOW]


def test_prune(state: MemoryPolicyState | SqlitePolicyState) -> None:
    for t in (1.0, 2.0, 3.0):
        state.record("fault", "esc", t)
    assert state.prune(2.5) == 2
    assert state.times("fault", "esc", 0) == [3.0]


def test_concurrent_threads(state: PolicyState) -> None:
    def work(i: int) -> None:
        for j in range(50):
            state.record("restart", f"job:t/{i % 2}", NOW + j)
            state.count("restart", f"job:t/{i % 2}", NOW)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert state.count("restart", "job:t/0", NOW) == 100
    assert state.count("restart", "job:t/1", NOW) == 100


# --- SQLite specifics -------------------------------------------------------------------------


def test_sqlite_survives_reopen(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "state.db"
    with SqlitePolicyState(path, now=NOW) as s:
        s.record("restart", "job:train/a", NOW)
    with SqlitePolicyState(path, now=NOW + 10) as s:
        assert s.times("restart", "job:train/a", 0) == [NOW]
        assert s.schema_version == len(MIGRATIONS)


def test_two_instances_on_one_file_see_each_other(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    with SqlitePolicyState(path, now=NOW) as a, SqlitePolicyState(path, now=NOW) as b:
        a.record("quarantine", "pool:h100", NOW)
        b.record("quarantine", "pool:h100", NOW + 1)
        assert a.count("quarantine", "pool:h100", NOW) == 2
        assert b.times("quarantine", "pool:h100", NOW) == [NOW, NOW + 1]


def test_another_process_writes_while_one_is_open(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    with SqlitePolicyState(path, now=NOW) as mine:
        mine.record("restart", "job:train/a", NOW)
        script = (
            "import sys\n"
            "from trainmedic.remediations.policy_state import SqlitePolicyState\n"
            "with SqlitePolicyState(sys.argv[1], now=float(sys.argv[2])) as s:\n"
            "    assert s.count('restart', 'job:train/a', 0) == 1\n"
            "    for i in range(20):\n"
            "        s.record('restart', 'job:train/a', float(sys.argv[2]) + i + 1)\n"
        )
        root = ROOT
        done = subprocess.run(
            [sys.executable, "-c", script, str(path), str(NOW)],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        assert mine.count("restart", "job:train/a", 0) == 21


def test_sqlite_uses_wal(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    SqlitePolicyState(path, now=NOW).close()
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        indexes = {r[1] for r in conn.execute("PRAGMA index_list(policy_events)")}
    conn.close()
    assert "policy_events_kind_key_t" in indexes


def test_old_events_are_pruned_on_open(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    with SqlitePolicyState(path, now=NOW) as s:
        s.record("fault", "esc", NOW - RETENTION_S - 1)
        s.record("fault", "esc", NOW - RETENTION_S + 1)
    with SqlitePolicyState(path, now=NOW) as s:
        assert s.times("fault", "esc", float("-inf")) == [NOW - RETENTION_S + 1]


def test_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    SqlitePolicyState(path, now=NOW).close()
    with sqlite3.connect(path) as conn:
        conn.execute("INSERT INTO schema_version (version) VALUES (?)", (len(MIGRATIONS) + 1,))
    conn.close()
    with pytest.raises(PolicyStateError, match="newer than this trainmedic knows"):
        SqlitePolicyState(path, now=NOW)


@pytest.mark.parametrize(
    "content",
    [pytest.param(b"this is not a database, just text\n" * 100, id="text"), pytest.param(b"\0" * 4096, id="zeros")],
)
def test_garbage_file_is_a_clear_error(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "state.db"
    path.write_bytes(content)
    with pytest.raises(PolicyStateError, match=r"state\.db"):
        SqlitePolicyState(path, now=NOW)


def test_unopenable_path_is_a_clear_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(PolicyStateError, match="cannot open"):
        SqlitePolicyState(blocker / "state.db", now=NOW)


@pytest.mark.parametrize(
    ("held", "reserved", "member", "ok"),
    [
        (set(), [], "a", True),
        ({"x"}, ["y"], "a", False),  # two places taken of two
        ({"x"}, [], "a", True),
        ({"x"}, ["y"], "y", True),  # already holds a place
        ({"x", "y"}, [], "x", True),  # already tainted
        ({"y"}, ["y"], "a", True),  # a reservation now visible on the node counts once
    ],
)
def test_reserve_counts_held_and_reserved_members_once(
    state: PolicyState, held: set[str], reserved: list[str], member: str, ok: bool
) -> None:
    for m in reserved:
        assert state.reserve("pool:p", m, limit=10, held=set(), t=NOW, since=NOW - 60)
    assert state.reserve("pool:p", member, limit=2, held=held, t=NOW, since=NOW - 60) is ok
    assert (member in state.reserved("pool:p", NOW - 60) | held) is ok


def test_release_gives_the_place_back_and_old_reservations_expire(state: PolicyState) -> None:
    assert state.reserve("pool:p", "a", limit=1, held=set(), t=NOW, since=NOW - 60)
    assert not state.reserve("pool:p", "b", limit=1, held=set(), t=NOW, since=NOW - 60)
    state.release("pool:p", "a")
    assert state.reserve("pool:p", "b", limit=1, held=set(), t=NOW, since=NOW - 60)
    assert state.reserve("pool:p", "c", limit=1, held=set(), t=NOW + 120, since=NOW + 60)
