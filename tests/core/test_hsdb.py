"""The shared Hyperscan wrapper (trainmedic/hsdb.py)."""

from __future__ import annotations

import os

import pytest

from trainmedic import hsdb

pytestmark = pytest.mark.skipif(
    not hsdb.AVAILABLE and os.environ.get("CI") != "true", reason="hyperscan is not installed here"
)


def _hits(db: object, data: bytes) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    db.scan(data, match_event_handler=lambda pid, _s, end, _f, _c: out.append((pid, end)))  # type: ignore[attr-defined]
    return out


@pytest.mark.parametrize(
    ("exprs", "data", "expected"),
    [
        ([b"NCCL"], b"xx NCCL timeout", [(0, 7)]),
        ([b"foo", b"bar"], b"bar foo", [(1, 3), (0, 7)]),
        ([b"^Xid"], b"kernel\nXid 79", [(0, 10)]),  # multiline flag below: ^ at each line
        ([b"absent"], b"nothing here", []),
    ],
)
def test_compiled_and_reloaded_databases_scan_alike(
    exprs: list[bytes], data: bytes, expected: list[tuple[int, int]]
) -> None:
    flags = [hsdb.hs.HS_FLAG_MULTILINE] * len(exprs)
    db = hsdb.compile_block(exprs, range(len(exprs)), flags)
    assert sorted(_hits(db, data)) == sorted(expected)
    again = hsdb.load_block(hsdb.dump(db))
    assert sorted(_hits(again, data)) == sorted(expected)


@pytest.mark.parametrize("blob", [b"", b"not a database", b"\0" * 64])
def test_a_blob_that_is_not_a_database_is_refused(blob: bytes) -> None:
    with pytest.raises(Exception):  # noqa: B017 - the binding's own error type, whatever it is
        hsdb.load_block(blob)


def test_an_expression_hyperscan_cannot_compile_raises_its_error() -> None:
    with pytest.raises(hsdb.hs.error):
        hsdb.compile_block([b"(?<=a)b"], [0], [0])  # lookbehind: not supported
