"""Shape of the labelled real-log corpus (tests/data/corpus/excerpts.jsonl).

Independent of the rule engine: it checks the data only (schema, unique ids, sources, the fixed
thread-hash split and the coverage minimums written in tests/data/corpus/README.md).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from typing import Any

import pytest
from paths import DATA

CORPUS = DATA / "corpus" / "excerpts.jsonl"

FAULT_CLASSES = {
    "accelerator_oom",
    "host_oom",
    "device_error",
    "comm_init",
    "comm_error",
    "hang",
    "node_failure",
    "process_killed",
    "storage_error",
    "app_error",
    "unknown",
}
CHIPS = {"nvidia", "ascend", "cambricon", "generic"}
FIELDS = {"id", "fault_class", "chip", "code", "origin", "text", "source", "thread", "split", "notes"}
ORIGIN_KEYS = {"node", "device", "rank", "host"}

MIN_PER_CLASS = 15
MIN_CLASS = {"comm_init": 40, "device_error": 40}
MIN_FAILURES = 300
MIN_NEGATIVES = 60
MIN_ASCEND = 60


def _load() -> list[dict[str, Any]]:
    rows = []
    with CORPUS.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                row = json.loads(line)
                row["_line"] = n
                rows.append(row)
    return rows


ROWS = _load()


def split_for(thread: str) -> str:
    return "heldout" if int(hashlib.sha1(thread.encode()).hexdigest(), 16) % 5 == 0 else "train"


@pytest.mark.parametrize("row", ROWS, ids=[r["id"] for r in ROWS])
def test_entry_schema(row: dict[str, Any]) -> None:
    keys = set(row) - {"_line"}
    assert keys == FIELDS, f"fields {sorted(keys ^ FIELDS)}"
    assert isinstance(row["id"], str) and re.fullmatch(r"[A-Za-z0-9_.-]+", row["id"])
    assert row["fault_class"] is None or row["fault_class"] in FAULT_CLASSES
    assert row["chip"] in CHIPS
    assert row["code"] is None or (isinstance(row["code"], str) and row["code"].strip())
    origin = row["origin"]
    assert origin is None or (isinstance(origin, dict) and origin and set(origin) <= ORIGIN_KEYS)
    assert isinstance(row["text"], str) and row["text"].strip()
    assert isinstance(row["notes"], str)
    assert row["split"] in ("train", "heldout")


@pytest.mark.parametrize("row", ROWS, ids=[r["id"] for r in ROWS])
def test_entry_source_and_split(row: dict[str, Any]) -> None:
    assert re.match(r"https?://[^\s/]+\.[^\s/]+/\S*$", row["source"]), row["source"]
    thread = row["thread"]
    assert isinstance(thread, str) and thread and " " not in thread
    host_path = re.sub(r"^https?://(www\.)?", "", row["source"])
    assert host_path.startswith(thread), "thread must be a prefix of the source address"
    assert row["split"] == split_for(thread)


def test_ids_unique() -> None:
    dup = [i for i, c in Counter(r["id"] for r in ROWS).items() if c > 1]
    assert not dup, dup


def test_one_split_per_thread() -> None:
    seen: dict[str, set[str]] = {}
    for r in ROWS:
        seen.setdefault(r["thread"], set()).add(r["split"])
    assert all(len(s) == 1 for s in seen.values())


def test_heldout_share_is_roughly_a_fifth() -> None:
    share = sum(r["split"] == "heldout" for r in ROWS) / len(ROWS)
    assert 0.10 <= share <= 0.35, share


def test_class_minimums() -> None:
    counts = Counter(r["fault_class"] for r in ROWS)
    for fc in FAULT_CLASSES - {"unknown"}:
        assert counts[fc] >= MIN_CLASS.get(fc, MIN_PER_CLASS), (fc, counts[fc])


def test_totals() -> None:
    failures = [r for r in ROWS if r["fault_class"] is not None]
    negatives = [r for r in ROWS if r["fault_class"] is None]
    assert len(failures) >= MIN_FAILURES, len(failures)
    assert len(negatives) >= MIN_NEGATIVES, len(negatives)
    assert sum(r["chip"] == "ascend" for r in ROWS) >= MIN_ASCEND


def test_ambiguous_entries_are_few() -> None:
    amb = sum(r["notes"].startswith("AMBIGUOUS") for r in ROWS)
    assert amb <= len(ROWS) // 5, amb
