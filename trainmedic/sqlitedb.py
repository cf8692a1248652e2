"""The durable SQLite setup shared by the incident store, the notification outbox and the policy state.

Both keep what the agent has acknowledged: WAL with `synchronous=FULL` (a committed transaction
survives a crash or power loss), autocommit mode with explicit `BEGIN IMMEDIATE` transactions (the
write lock is taken first, so a writer never fails half way on a lock upgrade), and a busy timeout
so the CLI and the agent can share the file.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Literal


def open_durable(
    path: str,
    *,
    busy_timeout_s: float = 10.0,
    synchronous: Literal["FULL", "NORMAL"] = "FULL",
    foreign_keys: bool = False,
) -> sqlite3.Connection:
    """A connection to `path` (":memory:" for a throwaway one), its folder created. sqlite3.Error
    and OSError are the caller's to turn into its own error type. `synchronous="NORMAL"` (WAL:
    durable across a crash of the process, not of the machine) is for state that may lose its last
    transactions to a power loss; `foreign_keys` turns their enforcement on."""
    if path != ":memory:":
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(path, timeout=busy_timeout_s, check_same_thread=False, isolation_level=None)
    try:
        db.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")
        db.execute("PRAGMA journal_mode=WAL")
        db.execute(f"PRAGMA synchronous={synchronous}")
        if foreign_keys:
            db.execute("PRAGMA foreign_keys=ON")
    except sqlite3.Error:
        db.close()
        raise
    return db


@contextmanager
def immediate(
    db: sqlite3.Connection, lock: threading.RLock, error: Callable[[str], Exception]
) -> Iterator[sqlite3.Connection]:
    """One write transaction: committed when the block ends, rolled back when it raises. A failure
    to begin or to commit is raised as `error(reason)`."""
    with lock:
        try:
            db.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as e:
            raise error(str(e)) from e
        try:
            yield db
        except BaseException:
            db.execute("ROLLBACK")
            raise
        try:
            db.execute("COMMIT")
        except sqlite3.Error as e:
            raise error(f"commit failed: {e}") from e


def migrate(db: sqlite3.Connection, table: str, migrations: Sequence[str], newer: Callable[[int], Exception]) -> int:
    """Bring a file's schema up to date, inside the caller's write transaction: `table` keeps the
    versions applied; migration N (1-based; `;`-separated statements) is applied when the file is at
    N-1. A file at a version above len(migrations) raises `newer(version)`. Returns the version found."""
    if not table.isidentifier():
        raise ValueError(f"{table!r} is not a table name")
    db.execute(f"CREATE TABLE IF NOT EXISTS {table} (version INTEGER NOT NULL)")
    row = db.execute(f"SELECT MAX(version) FROM {table}").fetchone()  # noqa: S608 - an identifier, checked
    have = int(row[0]) if row and row[0] is not None else 0
    if have > len(migrations):
        raise newer(have)
    for version in range(have + 1, len(migrations) + 1):
        for statement in migrations[version - 1].split(";"):
            if statement.strip():
                db.execute(statement)
        db.execute(f"INSERT INTO {table} (version) VALUES (?)", (version,))  # noqa: S608 - checked above
    return have
