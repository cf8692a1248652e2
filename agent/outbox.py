"""The durable outbox of incident notifications: one SQLite row per (sink, notice), committed before
anyone is told the notice was queued.

Why a table and not a queue in memory: a webhook receiver can be down for hours and the agent can be
restarted meanwhile; what the responder handed over must still reach the ops system. The outbox
lives in the incident store's own file (one file to back up, one WAL), in its own tables with its
own version table `outbox_schema_version`, like the policy state.

Delivery is at least once. A row stays `pending` until its delivery is committed as `delivered`, so
an item that was being sent when the process died is sent again by the next process. Repeats are
bounded by the dedup key (`Notice.dedup_key`, "<incident>/<status>"), which is UNIQUE per sink: an
incident event seen twice (an agent restart, a bus replay) is queued once, and the key travels with
the message (CloudEvent `id`, header `X-Trainmedic-Dedup-Key`) so receivers can drop the rare repeat.

Rows end `delivered` or `dead` (a permanent error, or given up after retrying long enough); both are
kept for `retention_s` so that late duplicates are still recognised, then pruned when a file is
opened. Durability as in the incident store: WAL, `synchronous=FULL`, one short `BEGIN IMMEDIATE`
transaction per call with a busy timeout, so a second process (the CLI) may open the file too.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from trainmedic.errors import FatalError
from trainmedic.reports.notice import Notice, NoticeError
from trainmedic.sqlitedb import immediate, migrate, open_durable

# Delivered and dead rows are kept this long (late duplicates of a notice are still dropped).
RETENTION_S = 30 * 86400.0
# A recorded error is cut to this many characters (a receiver's body can be anything).
MAX_ERROR_CHARS = 1000

# Each entry moves the schema one version up; applied in order, never edited once released.
MIGRATIONS: tuple[str, ...] = (
    # 1: the outbox
    """
    CREATE TABLE outbox (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        sink TEXT NOT NULL,
        dedup_key TEXT NOT NULL,
        incident_id TEXT NOT NULL,
        status TEXT NOT NULL,
        notice TEXT NOT NULL,
        state TEXT NOT NULL,
        created REAL NOT NULL,
        next_at REAL NOT NULL,
        attempts INTEGER NOT NULL DEFAULT 0,
        last_error TEXT,
        finished REAL,
        detail TEXT,
        UNIQUE (sink, dedup_key)
    );
    CREATE INDEX outbox_due ON outbox (sink, state, next_at);
    CREATE INDEX outbox_finished ON outbox (state, finished);
    """,
)


class OutboxError(FatalError):
    """The outbox cannot be used (unreadable file, newer schema, a failed write)."""


class ItemState(StrEnum):
    PENDING = "pending"
    DELIVERED = "delivered"
    DEAD = "dead"


@dataclass(frozen=True)
class OutboxItem:
    """One notice for one sink, as the outbox holds it."""

    id: int
    sink: str
    dedup_key: str
    incident_id: str
    status: str
    notice: Notice
    state: ItemState
    created: float
    next_at: float
    # Delivery attempts made so far (the attempt being made now is attempts + 1).
    attempts: int
    last_error: str | None = None
    finished: float | None = None
    detail: dict[str, Any] | None = None


_COLUMNS = (
    "id, sink, dedup_key, incident_id, status, notice, state, created, next_at, attempts, last_error, finished, detail"
)


class Outbox:
    """Notifications waiting for (or done with) delivery, in a SQLite file (`:memory:` for tests)."""

    def __init__(
        self,
        path: str | Path,
        *,
        clock: Callable[[], float] = time.time,
        retention_s: float = RETENTION_S,
        busy_timeout_s: float = 10.0,
    ) -> None:
        self.path = str(path)
        self.clock = clock
        self._lock = threading.RLock()
        try:
            self._db = open_durable(self.path, busy_timeout_s=busy_timeout_s)
        except (OSError, sqlite3.Error) as e:
            raise OutboxError(f"outbox {self.path}: cannot open it, or not a usable SQLite file: {e}") from e
        try:
            self._migrate()
            self.prune(self.clock() - retention_s)
        except OutboxError:
            self._db.close()
            raise
        except sqlite3.Error as e:
            self._db.close()
            raise OutboxError(f"outbox {self.path}: not a usable SQLite file: {e}") from e

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __enter__(self) -> Outbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- plumbing -------------------------------------------------------------------------------------

    def _tx(self) -> AbstractContextManager[sqlite3.Connection]:
        return immediate(self._db, self._lock, lambda why: OutboxError(f"outbox {self.path}: {why}"))

    def _read(self, sql: str, args: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with self._lock:
            try:
                return self._db.execute(sql, tuple(args)).fetchall()
            except sqlite3.Error as e:
                raise OutboxError(f"outbox {self.path}: {e}") from e

    def _migrate(self) -> None:
        def newer(have: int) -> OutboxError:
            return OutboxError(
                f"outbox {self.path} has schema version {have}; this agent knows up to {len(MIGRATIONS)} "
                "(it was written by a newer trainmedic)"
            )

        with self._tx() as db:
            migrate(db, "outbox_schema_version", MIGRATIONS, newer)

    @property
    def schema_version(self) -> int:
        return int(self._read("SELECT MAX(version) FROM outbox_schema_version")[0][0] or 0)

    # -- queueing -------------------------------------------------------------------------------------

    def enqueue(self, sink: str, notice: Notice) -> bool:
        """Queue `notice` for `sink`, due now. False when (sink, dedup_key) was already queued or delivered."""
        return bool(self.enqueue_many([sink], notice))

    def enqueue_many(self, sinks: Iterable[str], notice: Notice) -> list[str]:
        """Queue `notice` for each of `sinks` in one transaction; the sinks it was new for."""
        now = self.clock()
        body = json.dumps(notice.as_dict(), ensure_ascii=False, separators=(",", ":"), default=str)
        added = []
        with self._tx() as db:
            for sink in sinks:
                # Never due before what already waits for this sink (a held sink keeps its order).
                held = db.execute(
                    "SELECT MAX(next_at) FROM outbox WHERE sink = ? AND state = ?", (sink, ItemState.PENDING.value)
                ).fetchone()[0]
                cur = db.execute(
                    "INSERT OR IGNORE INTO outbox (sink, dedup_key, incident_id, status, notice, state, created, "
                    "next_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        sink,
                        notice.dedup_key,
                        notice.incident_id,
                        notice.status,
                        body,
                        ItemState.PENDING.value,
                        now,
                        max(now, float(held)) if held is not None else now,
                    ),
                )
                if cur.rowcount == 1:
                    added.append(sink)
        return added

    # -- delivery -------------------------------------------------------------------------------------

    def due(self, sink: str, *, now: float, limit: int) -> list[OutboxItem]:
        """Pending items of `sink` due at `now`, oldest first. A row whose stored notice cannot be read
        is set dead (with the reason) instead of blocking the ones behind it."""
        rows = self._read(
            f"SELECT {_COLUMNS} FROM outbox WHERE sink = ? AND state = ? AND next_at <= ? ORDER BY id LIMIT ?",  # noqa: S608
            (sink, ItemState.PENDING.value, now, limit),
        )
        items, broken = [], []
        for row in rows:
            try:
                items.append(_item(row))
            except NoticeError as e:
                broken.append((int(row[0]), str(e)))
        for item_id, why in broken:
            self.dead([item_id], error=f"unreadable stored notice: {why}")
        return items

    def next_due(self, sink: str) -> float | None:
        """When the earliest pending item of `sink` is due (None: nothing pending)."""
        row = self._read(
            "SELECT MIN(next_at) FROM outbox WHERE sink = ? AND state = ?", (sink, ItemState.PENDING.value)
        )[0]
        return None if row[0] is None else float(row[0])

    def latest_delivered(self, sink: str, *, since: float, limit: int) -> list[OutboxItem]:
        """Per incident, its latest notice for `sink` when that one was delivered at or after `since` (a
        later notice still pending or delivered hides it). What Alertmanager is re-sent to keep firing."""
        rows = self._read(
            f"SELECT {_COLUMNS} FROM outbox AS o WHERE sink = ? AND state = ? AND finished >= ? AND id = ("  # noqa: S608
            "SELECT MAX(id) FROM outbox AS p WHERE p.sink = o.sink AND p.incident_id = o.incident_id "
            "AND p.state != ?) ORDER BY id LIMIT ?",
            (sink, ItemState.DELIVERED.value, since, ItemState.DEAD.value, limit),
        )
        return _readable_items(rows)

    def delivered(self, ids: Iterable[int], *, now: float, detail: Mapping[str, Any] | None = None) -> None:
        """The items reached their sink (committed before the delivery is reported anywhere else)."""
        blob = json.dumps(dict(detail or {}), ensure_ascii=False, default=str)
        self._finish(ids, ItemState.DELIVERED, now=now, error=None, detail=blob)

    def retry_later(self, ids: Iterable[int], *, error: str, next_at: float) -> None:
        """An attempt failed temporarily: try again at `next_at`. The items' sinks are held until then
        as a whole (nothing queued behind them goes first), and that survives a restart: notices reach
        a sink in the order they were queued, so an older "firing" never overtakes a "resolved"."""
        ids = list(ids)
        with self._tx() as db:
            db.executemany(
                "UPDATE outbox SET attempts = attempts + 1, last_error = ?, next_at = ? WHERE id = ? AND state = ?",
                [(_cut(error), next_at, i, ItemState.PENDING.value) for i in ids],
            )
            sinks = {row[0] for i in ids for row in db.execute("SELECT sink FROM outbox WHERE id = ?", (i,))}
            db.executemany(
                "UPDATE outbox SET next_at = ? WHERE sink = ? AND state = ? AND next_at < ?",
                [(next_at, sink, ItemState.PENDING.value, next_at) for sink in sorted(sinks)],
            )

    def dead(self, ids: Iterable[int], *, error: str, now: float | None = None) -> None:
        """The items will not be delivered (a permanent error, or given up); `error` says why."""
        self._finish(ids, ItemState.DEAD, now=self.clock() if now is None else now, error=_cut(error), detail=None)

    def _finish(
        self, ids: Iterable[int], state: ItemState, *, now: float, error: str | None, detail: str | None
    ) -> None:
        with self._tx() as db:
            db.executemany(
                "UPDATE outbox SET state = ?, attempts = attempts + 1, finished = ?, last_error = COALESCE(?, "
                "last_error), detail = ? WHERE id = ? AND state = ?",
                [(state.value, now, error, detail, i, ItemState.PENDING.value) for i in ids],
            )

    # -- inspection -----------------------------------------------------------------------------------

    def depth(self, sink: str | None = None) -> int:
        """Pending items (of one sink, or of all)."""
        if sink is None:
            row = self._read("SELECT COUNT(*) FROM outbox WHERE state = ?", (ItemState.PENDING.value,))[0]
        else:
            row = self._read(
                "SELECT COUNT(*) FROM outbox WHERE sink = ? AND state = ?", (sink, ItemState.PENDING.value)
            )[0]
        return int(row[0])

    def counts(self, sink: str | None = None) -> dict[str, int]:
        """How many items are in each state (of one sink, or of all)."""
        if sink is None:
            rows = self._read("SELECT state, COUNT(*) FROM outbox GROUP BY state")
        else:
            rows = self._read("SELECT state, COUNT(*) FROM outbox WHERE sink = ? GROUP BY state", (sink,))
        out = {s.value: 0 for s in ItemState}
        out.update({str(r[0]): int(r[1]) for r in rows})
        return out

    def sinks_pending(self) -> dict[str, int]:
        """Pending items per sink name (including sinks no longer configured)."""
        rows = self._read("SELECT sink, COUNT(*) FROM outbox WHERE state = ? GROUP BY sink", (ItemState.PENDING.value,))
        return {str(r[0]): int(r[1]) for r in rows}

    def items(
        self, sink: str | None = None, *, state: ItemState | None = None, incident_id: str | None = None
    ) -> list[OutboxItem]:
        """Every item matching the filters, oldest first (tests, the API, the demo)."""
        where, args = [], []
        for column, value in (("sink", sink), ("state", state.value if state else None), ("incident_id", incident_id)):
            if value is not None:
                where.append(f"{column} = ?")
                args.append(value)
        clause = f" WHERE {' AND '.join(where)}" if where else ""
        rows = self._read(f"SELECT {_COLUMNS} FROM outbox{clause} ORDER BY id", args)  # noqa: S608
        return _readable_items(rows)

    def prune(self, before: float) -> int:
        """Forget delivered and dead items finished before `before`; how many were dropped."""
        with self._tx() as db:
            cur = db.execute(
                "DELETE FROM outbox WHERE state IN (?, ?) AND finished < ?",
                (ItemState.DELIVERED.value, ItemState.DEAD.value, before),
            )
            return int(cur.rowcount)


def _cut(text: str) -> str:
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 1] + "…"


def _readable_items(rows: Iterable[tuple[Any, ...]]) -> list[OutboxItem]:
    """The rows as items, passing over those whose notice cannot be read."""
    out = []
    for row in rows:
        try:
            out.append(_item(row))
        except NoticeError:
            continue
    return out


def _item(row: tuple[Any, ...]) -> OutboxItem:
    (iid, sink, key, incident_id, status, notice, state, created, next_at, attempts, error, finished, detail) = row
    try:
        data = json.loads(notice)
    except ValueError as e:
        raise NoticeError(f"not JSON: {e}") from e
    if not isinstance(data, dict):
        raise NoticeError("not a JSON object")
    parsed: Any = None
    if detail:
        try:
            parsed = json.loads(detail)
        except ValueError:
            parsed = None
    return OutboxItem(
        id=int(iid),
        sink=str(sink),
        dedup_key=str(key),
        incident_id=str(incident_id),
        status=str(status),
        notice=Notice.from_dict(data),
        state=ItemState(state),
        created=float(created),
        next_at=float(next_at),
        attempts=int(attempts),
        last_error=error,
        finished=finished,
        detail=parsed if isinstance(parsed, dict) else None,
    )


__all__ = ["MIGRATIONS", "RETENTION_S", "ItemState", "Outbox", "OutboxError", "OutboxItem"]
