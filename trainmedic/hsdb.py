"""Hyperscan block-mode databases: the one wrapper of the optional `hyperscan` binding.

The rule engine's prefilter, the hang detector's keyword matcher and scene redaction compile with it;
the first two keep compiled databases in the on-disk cache (trainmedic/cache.py) and load them back
with `load_block`, which refuses a database this CPU or this hyperscan cannot scan.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["AVAILABLE", "compile_block", "dump", "hs", "load_block"]

hs: Any
try:
    import hyperscan as hs
except ImportError:  # pragma: no cover - exercised where hyperscan is absent
    hs = None

AVAILABLE = hs is not None


def compile_block(expressions: Sequence[bytes], ids: Sequence[int], flags: Sequence[int]) -> Any:
    """A block-mode database of `expressions` (reported by `ids`, compiled with `flags`). Raises
    hyperscan.error for an expression hyperscan cannot compile."""
    assert hs is not None, "hyperscan is not installed"
    db = hs.Database(mode=hs.HS_MODE_BLOCK)
    db.compile(expressions=list(expressions), ids=list(ids), elements=len(expressions), flags=list(flags))
    return db


def dump(db: Any) -> bytes:
    """The serialized database, for the on-disk cache."""
    assert hs is not None, "hyperscan is not installed"
    blob: bytes = hs.dumpb(db)
    return blob


def load_block(blob: bytes) -> Any:
    """A block-mode database from `dump`'s bytes, with its scratch, proven to scan here. Raises
    (any exception) when this hyperscan or this CPU cannot use it: a cache folder shared between
    machines may hold one built for another CPU, which is refused only at scan time."""
    assert hs is not None, "hyperscan is not installed"
    db = hs.loadb(blob, hs.HS_MODE_BLOCK)
    db.scratch = hs.Scratch(db)  # loadb leaves it without one; compile makes its own
    db.scan(b"\n", match_event_handler=lambda *_: None)
    return db
