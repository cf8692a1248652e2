"""The shared SQLite setup (trainmedic/sqlitedb.py): every opener gets WAL, a busy timeout and the
durability it asks for."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path
from typing import Literal

import pytest

from trainmedic.sqlitedb import immediate, migrate, open_durable


def _pragma(db: sqlite3.Connection, name: str) -> object:
    return db.execute(f"PRAGMA {name}").fetchone()[0]


@pytest.mark.parametrize(
    ("synchronous", "foreign_keys", "want_sync"),
    [("FULL", False, 2), ("NORMAL", False, 1), ("FULL", True, 2), ("NORMAL", True, 1)],
)
def test_open_durable_sets_the_pragmas(
    tmp_path: Path, synchronous: Literal["FULL", "NORMAL"], foreign_keys: bool, want_sync: int
) -> None:
    db = open_durable(
        str(tmp_path / "a" / "b" / "x.db"), busy_timeout_s=2.5, synchronous=synchronous, foreign_keys=foreign_keys
    )
    try:
        assert (tmp_path / "a" / "b").is_dir()  # the folder is created
        assert _pragma(db, "journal_mode") == "wal"
        assert _pragma(db, "synchronous") == want_sync
        assert _pragma(db, "busy_timeout") == 2500
        assert _pragma(db, "foreign_keys") == int(foreign_keys)
        assert db.isolation_level is None  # autocommit: transactions are explicit
    finally:
        db.close()


def test_memory_database_needs_no_folder() -> None:
    db = open_durable(":memory:")
    try:
        assert _pragma(db, "synchronous") == 2
    finally:
        db.close()


@pytest.mark.parametrize(
    "content",
    [pytest.param(b"this is not a database\n" * 200, id="text"), pytest.param(b"\0" * 4096, id="zeros")],
)
def test_a_file_that_is_not_a_database_raises_sqlite_error(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "x.db"
    path.write_bytes(content)
    with pytest.raises(sqlite3.DatabaseError):
        open_durable(str(path))


def test_an_unreachable_folder_raises_os_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(OSError):
        open_durable(str(tmp_path / "file" / "x.db"))


def test_two_openers_of_one_file_share_it(tmp_path: Path) -> None:
    path = str(tmp_path / "x.db")
    a = open_durable(path)
    b = open_durable(path, synchronous="NORMAL")
    try:
        lock = threading.RLock()
        with immediate(a, lock, RuntimeError) as db:
            db.execute("CREATE TABLE t (v INTEGER)")
            db.execute("INSERT INTO t VALUES (1)")
        assert b.execute("SELECT v FROM t").fetchall() == [(1,)]
    finally:
        a.close()
        b.close()


def test_immediate_rolls_back_when_the_block_raises(tmp_path: Path) -> None:
    db = open_durable(str(tmp_path / "x.db"))
    lock = threading.RLock()
    try:
        with immediate(db, lock, RuntimeError) as d:
            d.execute("CREATE TABLE t (v INTEGER)")
        with pytest.raises(KeyError), immediate(db, lock, RuntimeError) as d:
            d.execute("INSERT INTO t VALUES (1)")
            raise KeyError("boom")
        assert db.execute("SELECT count(*) FROM t").fetchone() == (0,)
    finally:
        db.close()


_MIGRATIONS = ("CREATE TABLE a (x INTEGER); CREATE INDEX a_x ON a (x)", "ALTER TABLE a ADD COLUMN y TEXT")


class _Newer(Exception):
    pass


@pytest.mark.parametrize(("applied", "want_columns"), [(0, ["x", "y"]), (1, ["x", "y"]), (2, ["x", "y"])])
def test_migrate_applies_what_the_file_lacks(tmp_path: Path, applied: int, want_columns: list[str]) -> None:
    db = open_durable(str(tmp_path / "x.db"))
    lock = threading.RLock()
    try:
        if applied:
            with immediate(db, lock, RuntimeError) as d:
                assert migrate(d, "v", _MIGRATIONS[:applied], _Newer) == 0
        with immediate(db, lock, RuntimeError) as d:
            found = migrate(d, "v", _MIGRATIONS, _Newer)
        assert found == applied
        assert [r[1] for r in db.execute("PRAGMA table_info(a)")] == want_columns
        assert [r[0] for r in db.execute("SELECT version FROM v ORDER BY version")] == [1, 2]
    finally:
        db.close()


def test_migrate_refuses_a_newer_file(tmp_path: Path) -> None:
    db = open_durable(str(tmp_path / "x.db"))
    lock = threading.RLock()
    try:
        with immediate(db, lock, RuntimeError) as d:
            migrate(d, "v", _MIGRATIONS, _Newer)
        with pytest.raises(_Newer, match=r"^2$"), immediate(db, lock, RuntimeError) as d:
            migrate(d, "v", _MIGRATIONS[:1], lambda have: _Newer(str(have)))
    finally:
        db.close()


@pytest.mark.parametrize("table", ["v; DROP TABLE a", "1v", "", "v v"])
def test_migrate_takes_only_a_plain_table_name(table: str) -> None:
    db = open_durable(":memory:")
    try:
        with pytest.raises(ValueError, match="not a table name"):
            migrate(db, table, _MIGRATIONS, _Newer)
    finally:
        db.close()
