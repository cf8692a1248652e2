"""Real PyTorch runs recorded on this machine (tests/data/pytorch/, made by its generate.py: torchrun
with gloo on CPU, a rank raising, killed, stalled, OOM-killed under a memory cgroup, out of shared
memory, failing at rendezvous, crashing, healthy): `diagnose` of each run's collected logs names the
class its expected.json states and, where one rank started it, that rank."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from paths import DATA

from trainmedic.detectors.diagnose import diagnose_paths
from trainmedic.detectors.engine import Engine

RUNS = DATA / "pytorch"
# Runs a static read of the text cannot judge, and why (each is covered elsewhere).
BEYOND_TEXT = {
    "stalled_all_ranks_tqdm": (
        "the log ends at the last step with no later clock: the silence is the live hang detector's to see "
        "(tests/detectors/test_hang*.py), not diagnose's"
    ),
}


def _runs() -> list[Any]:
    return [
        pytest.param(d, json.loads((d / "expected.json").read_text(encoding="utf-8")), id=d.name)
        for d in sorted(RUNS.iterdir())
        if (d / "expected.json").is_file()
    ]


@pytest.mark.parametrize(("run", "expected"), _runs())
@pytest.mark.parametrize("path", ["fast", "re"])
def test_a_recorded_run_is_diagnosed_as_it_happened(
    run: Path, expected: dict[str, Any], path: str, fast_engine: Engine, re_engine: Engine
) -> None:
    if run.name in BEYOND_TEXT:
        pytest.skip(BEYOND_TEXT[run.name])
    if expected.get("notes", "").startswith("filled in after the run"):
        pytest.fail(f"{run.name}/expected.json was never filled in")
    engine = fast_engine if path == "fast" else re_engine
    rc = diagnose_paths([str(run)], engine).root_cause
    if expected["fault_class"] is None:
        assert rc is None, f"a healthy run gave {rc and (rc.fault_class, rc.code)}"
        return
    assert rc is not None
    assert rc.fault_class.value == expected["fault_class"], rc.summary.en
    if expected.get("origin_rank") is not None:
        assert rc.rank == expected["origin_rank"], rc.summary.en


def test_there_are_recorded_runs() -> None:
    assert len(_runs()) >= 10
