"""bench/remediation.py at a tiny size: both measurements run end to end against the emulated
cluster and give the JSON shape `make bench` merges (numbers, positive). Timings are not asserted:
they belong to the benchmark, not to the test."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from servers.kube import require_kmock

from bench.remediation import percentile, run_remediation

PODS = 4


@pytest.fixture(scope="module")
def figures() -> dict[str, Any]:
    require_kmock()
    return run_remediation(iterations=3, pods=PODS, lines=300, repeats=1)


def _positive(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value > 0


@pytest.mark.parametrize(
    "key",
    [
        "diagnosis_to_reschedule_p50_ms",
        "diagnosis_to_reschedule_p99_ms",
        "diagnosis_to_reschedule_max_ms",
        "diagnosis_to_reschedule_first_ms",
        f"scene_bundle_{PODS}_pods_s",
        f"scene_bundle_{PODS}_pods_local_s",
        "scene_bundle_log_mb",
        "scene_bundle_files",
        "scene_bundle_redactions",
        "diagnosis_to_webhook_p50_ms",
        "diagnosis_to_webhook_p99_ms",
        "diagnosis_to_resolved_webhook_p99_ms",
        "report_render_ms",
        "report_render_first_ms",
        "report_html_zh_kb",
    ],
)
def test_figure_is_a_positive_number(figures: dict[str, Any], key: str) -> None:
    assert _positive(figures[key]), (key, figures[key])


def test_samples_and_phases(figures: dict[str, Any]) -> None:
    assert figures["diagnosis_to_reschedule_samples"] == 3
    assert len(figures["diagnosis_to_reschedule_runs_ms"]) == 3
    assert all(_positive(x) for x in figures["diagnosis_to_reschedule_runs_ms"])
    assert figures["diagnosis_to_reschedule_p50_ms"] <= figures["diagnosis_to_reschedule_p99_ms"]
    for stat in ("p50", "p99"):
        phases = figures[f"diagnosis_to_reschedule_phases_{stat}_ms"]
        assert list(phases) == ["dispatch", "scene", "plan", "quarantine", "replacement", "delete_wait", "create"]
        assert all(_positive(v) for v in phases.values()), phases
    assert figures["diagnosis_to_reschedule_scene_log_lines"] == 10_000
    assert len(figures["scene_bundle_runs_s"]) == len(figures["scene_bundle_local_runs_s"]) == 1
    assert json.loads(json.dumps(figures)) == figures


@pytest.mark.parametrize(
    ("values", "q", "expected"),
    [([5.0], 99, 5.0), ([3.0, 1.0, 2.0], 50, 2.0), ([float(x) for x in range(1, 101)], 99, 99.0)],
)
def test_percentile_takes_the_nearest_position(values: list[float], q: float, expected: float) -> None:
    assert percentile(values, q) == expected
