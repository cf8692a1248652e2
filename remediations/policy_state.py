"""What the policy remembers between incidents: restarts, quarantines, fault occurrences.

Budgets, backoff, escalation and the circuit breaker are all questions about recent history
("how many restarts of this job in the last hour?"), so the policy keeps one kind of record: an
event `(kind, key, t)`. The policy itself stays pure; the state is passed in.

`MemoryPolicyState` is for tests and the embedded single-process mode. `SqlitePolicyState` keeps
the history in a SQLite file (WAL journal) so it survives restarts of the agent and two processes
(e.g. an old and a new brain during a rollout) can open the same file and see each other's
records. Events older than the retention (30 days, more than any policy window may span) are
pruned when the file is opened.
"""

from __future__ import annotations

import bisect
import sqlite3
import threading
import time
from collections import defaultdict
from collections.abc import Collection
from pathlib import Path
from typing import Protocol, runtime_checkable

from trainmedic.errors import TrainmedicError
from trainmedic.sqlitedb import migrate, open_durable

RETENTION_S = 30 * 86400.0

# Each entry moves the schema one version up; applied in order, never edited once released.
MIGRATIONS: list[str] = [
    """
    CREATE TABLE policy_events (
        kind TEXT NOT NULL,
        key TEXT NOT NULL,
        t REAL NOT NULL
    );
    CREATE INDEX policy_events_kind_key_t ON policy_events (kind, key, t);
    CREATE INDEX policy_events_t ON policy_events (t);
    """,
    """
    CREATE TABLE reservations (
        key TEXT NOT NULL,
        member TEXT NOT NULL,
        t REAL NOT NULL,
        PRIMARY KEY (key, member)
    );
    """,
]


class PolicyStateError(TrainmedicError):
    """The policy state file cannot be used (unreadable, not SQLite, from a newer version)."""


@runtime_checkable
class PolicyState(Protocol):
    """Recent history the policy consults. Times are seconds (epoch or any one monotonic clock)."""

    def record(self, kind: str, key: str, t: float) -> None: ...

    def count(self, kind: str, key: str, since: float) -> int:
        """How many `(kind, key)` events happened at `t >= since`."""
        ...

    def times(self, kind: str, key: str, since: float) -> list[float]:
        """The times of the `(kind, key)` events at `t >= since`, oldest first."""
        ...

    def reserve(self, key: str, member: str, *, limit: int, held: Collection[str], t: float, since: float) -> bool:
        """Atomically take a place for `member` under `key`: the places taken are `held` (what the
        cluster shows) together with the reservations made at `t >= since`, counted by member. True
        when `member` already has a place or one is left below `limit` (and is now taken)."""
        ...

    def reserved(self, key: str, since: float) -> set[str]:
        """The members holding a reservation under `key` made at `t >= since`."""
        ...

    def release(self, key: str, member: str) -> None:
        """Give `member`'s place under `key` back (the action it was reserved for did not happen)."""
        ...


class MemoryPolicyState:
    """In-process history (tests, the embedded mode). Thread-safe."""

    def __init__(self) -> None:
        self._events: defaultdict[tuple[str, str], list[float]] = defaultdict(list)
        self._reservations: defaultdict[str, dict[str, float]] = defaultdict(dict)
        self._lock = threading.Lock()

    def reserve(self, key: str, member: str, *, limit: int, held: Collection[str], t: float, since: float) -> bool:
        with self._lock:
            mine = self._reservations[key]
            taken = set(held) | {m for m, at in mine.items() if at >= since}
            if member not in taken and len(taken) >= limit:
                return False
            mine[member] = max(float(t), mine.get(member, float(t)))
            return True

    def reserved(self, key: str, since: float) -> set[str]:
        with self._lock:
            return {m for m, at in self._reservations.get(key, {}).items() if at >= since}

    def release(self, key: str, member: str) -> None:
        with self._lock:
            self._reservations.get(key, {}).pop(member, None)

    def record(self, kind: str, key: str, t: float) -> None:
        with self._lock:
            bisect.insort(self._events[(kind, key)], float(t))

    def count(self, kind: str, key: str, since: float) -> int:
        return len(self.times(kind, key, since))

    def times(self, kind: str, key: str, since: float) -> list[float]:
        with self._lock:
            events = self._events.get((kind, key), [])
            return events[bisect.bisect_left(events, since) :]

    def prune(self, before: float) -> int:
        """Forget events older than `before`; returns how many were dropped."""
        dropped = 0
        with self._lock:
            for k in list(self._events):
                events = self._events[k]
                cut = bisect.bisect_left(events, before)
                dropped += cut
                if cut == len(events):
                    del self._events[k]
                else:
                    del events[:cut]
        return dropped


class SqlitePolicyState:
    """History in a SQLite file: survives restarts, shared safely between processes.

    One connection per instance, usable from any thread (guarded by a lock); WAL journal and a
    busy timeout let a second process read and write the same file concurrently.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        now: float | None = None,
        retention_s: float = RETENTION_S,
        busy_timeout_s: float = 10.0,
    ) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        try:
            self._conn = open_durable(str(self.path), busy_timeout_s=busy_timeout_s, synchronous="NORMAL")
        except (OSError, sqlite3.OperationalError) as exc:
            raise PolicyStateError(f"{self.path}: cannot open the policy state: {exc}") from exc
        except sqlite3.DatabaseError as exc:
            raise PolicyStateError(f"{self.path}: not a usable policy state file: {exc}") from exc
        try:
            self._migrate()
            cutoff = (time.time() if now is None else now) - retention_s
            with self._lock:
                self._conn.execute("DELETE FROM policy_events WHERE t < ?", (cutoff,))
                self._conn.execute("DELETE FROM reservations WHERE t < ?", (cutoff,))
        except PolicyStateError:
            self._conn.close()
            raise
        except sqlite3.DatabaseError as exc:
            self._conn.close()
            raise PolicyStateError(f"{self.path}: not a usable policy state file: {exc}") from exc

    def _migrate(self) -> None:
        with self._lock:
            # BEGIN IMMEDIATE takes the write lock first, so two processes opening a new file at
            # once cannot both apply the same migration.
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                migrate(self._conn, "schema_version", MIGRATIONS, self._newer)
                self._conn.execute("COMMIT")
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise

    def _newer(self, current: int) -> PolicyStateError:
        return PolicyStateError(
            f"{self.path}: schema version {current} is newer than this trainmedic knows "
            f"({len(MIGRATIONS)}); upgrade trainmedic or use another file"
        )

    @property
    def schema_version(self) -> int:
        with self._lock:
            row = self._conn.execute("SELECT max(version) FROM schema_version").fetchone()
        return int(row[0]) if row and row[0] is not None else 0

    def record(self, kind: str, key: str, t: float) -> None:
        with self._lock:
            self._conn.execute("INSERT INTO policy_events (kind, key, t) VALUES (?, ?, ?)", (kind, key, float(t)))

    def count(self, kind: str, key: str, since: float) -> int:
        with self._lock:
            row = self._conn.execute(
                "SELECT count(*) FROM policy_events WHERE kind = ? AND key = ? AND t >= ?", (kind, key, since)
            ).fetchone()
        return int(row[0])

    def times(self, kind: str, key: str, since: float) -> list[float]:
        with self._lock:
            rows = self._conn.execute(
                "SELECT t FROM policy_events WHERE kind = ? AND key = ? AND t >= ? ORDER BY t", (kind, key, since)
            ).fetchall()
        return [float(r[0]) for r in rows]

    def prune(self, before: float) -> int:
        with self._lock:
            cur = self._conn.execute("DELETE FROM policy_events WHERE t < ?", (before,))
        return int(cur.rowcount)

    def reserve(self, key: str, member: str, *, limit: int, held: Collection[str], t: float, since: float) -> bool:
        with self._lock:
            # BEGIN IMMEDIATE: the count and the insert happen under the file's write lock, so two
            # processes sharing the file cannot both take the last place.
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                rows = self._conn.execute(
                    "SELECT member FROM reservations WHERE key = ? AND t >= ?", (key, since)
                ).fetchall()
                taken = set(held) | {str(r[0]) for r in rows}
                ok = member in taken or len(taken) < limit
                if ok:
                    self._conn.execute(
                        "INSERT INTO reservations (key, member, t) VALUES (?, ?, ?) "
                        "ON CONFLICT (key, member) DO UPDATE SET t = max(t, excluded.t)",
                        (key, member, float(t)),
                    )
                self._conn.execute("COMMIT")
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
        return ok

    def reserved(self, key: str, since: float) -> set[str]:
        with self._lock:
            rows = self._conn.execute(
                "SELECT member FROM reservations WHERE key = ? AND t >= ?", (key, since)
            ).fetchall()
        return {str(r[0]) for r in rows}

    def release(self, key: str, member: str) -> None:
        with self._lock:
            self._conn.execute("DELETE FROM reservations WHERE key = ? AND member = ?", (key, member))

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def __enter__(self) -> SqlitePolicyState:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["MIGRATIONS", "RETENTION_S", "MemoryPolicyState", "PolicyState", "PolicyStateError", "SqlitePolicyState"]
