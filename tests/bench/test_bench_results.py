"""bench/results.json holds the figures of two commands: `make bench` (bench/run.py) rewrites its own
and keeps the ones `make soak` (bench/soak.py) merged in; the soak names its memory-bus run's figures
apart from the Kafka run's."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from paths import ROOT

from bench.run import with_soak_figures
from bench.soak import _memory_bus_keys, parse_args


def test_a_bench_run_keeps_the_last_soak_figures(tmp_path: Path) -> None:
    path = tmp_path / "results.json"
    path.write_text(
        json.dumps(
            {
                "classify_fast_lines_per_s": 1,
                "stale_figure": 2,
                "soak_rss_slope_mb_per_min": 0.8,
                "soak_memory_bus_rss_slope_mb_per_min": 0.1,
                "responder_incidents_per_s": 21.9,
            }
        )
    )
    out = with_soak_figures({"classify_fast_lines_per_s": 5}, path)
    assert out == {
        "classify_fast_lines_per_s": 5,
        "soak_rss_slope_mb_per_min": 0.8,
        "soak_memory_bus_rss_slope_mb_per_min": 0.1,
        "responder_incidents_per_s": 21.9,
    }


def test_a_figure_the_run_made_wins_over_the_file(tmp_path: Path) -> None:
    path = tmp_path / "results.json"
    path.write_text(json.dumps({"responder_incidents_per_s": 1.0}))
    assert with_soak_figures({"responder_incidents_per_s": 2.0}, path) == {"responder_incidents_per_s": 2.0}


@pytest.mark.parametrize("text", [None, "", "not json", "[1, 2]"])
def test_no_file_or_a_broken_one_leaves_the_run_as_it_is(tmp_path: Path, text: str | None) -> None:
    path = tmp_path / "results.json"
    if text is not None:
        path.write_text(text)
    assert with_soak_figures({"a": 1}, path) == {"a": 1}


def test_the_memory_bus_run_is_named_apart() -> None:
    run: dict[str, Any] = {
        "soak_memory_bus_rss_slope_mb_per_min": 0.07,
        "soak_rss_end_mb": 103.0,
        "soak_loop_lag_p99_ms": 5.0,
        "soak_bus": "memory",
    }
    assert _memory_bus_keys(run) == {
        "soak_memory_bus_rss_slope_mb_per_min": 0.07,
        "soak_memory_bus_rss_end_mb": 103.0,
        "soak_memory_bus_loop_lag_p99_ms": 5.0,
        "soak_memory_bus_bus": "memory",
    }


def test_make_soak_runs_every_part_for_30_minutes() -> None:
    args = parse_args(["--all"])
    assert args.all and args.minutes == 30.0 and args.all_ceiling == 400
    make = (ROOT / "Makefile").read_text()
    assert "-m bench.soak --all --results bench/results.json" in make
