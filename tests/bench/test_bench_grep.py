"""bench/run.py's grep baseline under its time limit: within the limit it gives the timings; past it
the run is stopped and reported (`timed_out_after_s`, `lines_per_s_below`) instead of hanging."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from bench.run import GrepPatterns, run_grep

LINES = 2_000


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    path = tmp_path / "job.log"
    path.write_text("".join(f"step {i} loss 0.5\n" for i in range(LINES)) + "NCCL WARN boom\n", encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("limit_s", "timed_out"),
    [(None, False), (60.0, False), (0.0, True)],
)
def test_grep_limit(corpus: Path, tmp_path: Path, limit_s: float | None, timed_out: bool) -> None:
    pats = GrepPatterns(expressions=["NCCL WARN"], total=1, skipped=[])
    started = time.perf_counter()
    cpu = sorted(os.sched_getaffinity(0))[0]
    res = run_grep(pats, corpus, tmp_path, repeats=2, cpu=cpu, limit_s=limit_s, lines=LINES + 1)
    assert time.perf_counter() - started < 30
    if timed_out:
        assert res["timed_out_after_s"] == limit_s
        assert "wall_s" not in res
        below = res["lines_per_s_below"]
        assert below is None or below > 0
    else:
        assert res["matching_lines"] == 1
        assert len(res["wall_s"]) == 2
        assert "timed_out_after_s" not in res
