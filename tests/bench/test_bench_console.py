"""bench/console.py: the console figures come from real pages over a seeded store (a small run here;
`make bench` runs 10,000 incidents)."""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import pytest

from bench.console import run_console, seed
from trainmedic.agent.store import IncidentStore


@pytest.fixture(scope="module")
def figures() -> dict[str, Any]:
    return run_console(incidents=300, requests=10)


@pytest.mark.parametrize("name", ["list", "incident"])
def test_figures_are_reported(figures: dict[str, Any], name: str) -> None:
    p50, p99 = figures[f"console_{name}_p50_ms"], figures[f"console_{name}_p99_ms"]
    assert 0 < p50 <= p99
    assert figures["goals_console"][f"console_{name}_p99_ms"] == 100.0
    assert figures["console_incidents"] == 300


def test_the_seeded_store_is_what_the_store_reads(tmp_path: Path) -> None:
    ids = seed(tmp_path / "s.db", 120, now=time.time(), rng=random.Random(1))
    store = IncidentStore(tmp_path / "s.db")
    try:
        total, rows = store.search(limit=50)
        assert total == 120 and len(rows) == 50 and rows[0].id == ids[-1]
        incident = store.get(ids[0])
        assert len(incident.actions) == 2 and len(store.timeline(ids[0])) == 6
        assert rows[0].summary_en is not None and rows[0].summary_zh is not None
    finally:
        store.close()
