"""`make bench`'s real-plane figures (bench/realplane.py): one run of each, with the keys the JSON
promises and positive values; null figures with a reason where the plane is not built. No timing
assertion: speed is what `make bench` reports."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from servers.kubeplane import require_plane

from bench.realplane import FIGURES, run_realplane


@pytest.mark.timeout(300)
def test_the_bench_measures_each_figure_once_on_the_real_plane() -> None:
    require_plane()
    out = run_realplane(repetitions=1, churn=200, scale_nodes=10, scale_pods=40)
    assert "realplane_error" not in out, out["realplane_error"]
    assert "scale_error" not in out, out["scale_error"]
    assert (out["scale_nodes"], out["scale_pods"]) == (10, 40)
    json.dumps(out)  # goes into bench/results.json as is
    for key in FIGURES:
        assert isinstance(out[key], float) and out[key] > 0, (key, out[key])
    assert out["real_fault_to_pods_running_n"] == 1
    [run] = out["real_fault_to_pods_running_runs_s"]
    assert run == out["real_fault_to_pods_running_p50_s"] == out["real_fault_to_pods_running_p99_s"]
    settings = out["real_node_lost_settings"]
    assert settings["node_monitor_grace_period_s"] > 0 and settings["node_lease_duration_s"] > 0


def test_without_the_binaries_the_figures_are_null_with_the_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # an empty cache: nothing built there
    out = run_realplane(repetitions=1)
    assert all(out[key] is None for key in FIGURES)
    assert "make cluster" in out["realplane_error"] and str(tmp_path) in out["realplane_error"]
