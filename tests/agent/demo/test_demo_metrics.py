"""The demo's simulated exporters (agent/demo/metrics.py) read by the real metrics watcher: every
series maps onto the unified names, a range query has the minutes before the fault, and each fault
shows the way its device would show it."""

from __future__ import annotations

import asyncio

import pytest

from trainmedic.agent.bus.memory import MemoryBus
from trainmedic.agent.demo.metrics import DemoMetrics
from trainmedic.agent.watchers.metrics import PrometheusSource
from trainmedic.events import MetricBatch

T = 1_800_000_000.0


def source(client: DemoMetrics) -> PrometheusSource:
    return PrometheusSource("demo://exporters", bus=MemoryBus(partitions=1), client=client)


def test_the_watcher_maps_every_simulated_series() -> None:
    client = DemoMetrics(["gpu-1"], ["npu-1"], devices=2, clock=lambda: T)
    events = asyncio.run(source(client).poll_once())
    batches = [e.payload for e in events if isinstance(e.payload, MetricBatch)]
    by_node = {b.node: {(s.name, s.device) for s in b.samples} for b in batches}
    assert {"accelerator_utilization", "accelerator_memory_used", "xid_errors"} <= {n for n, _ in by_node["gpu-1"]}
    assert {"accelerator_utilization", "link_status", "health"} <= {n for n, _ in by_node["npu-1"]}
    assert {d for _, d in by_node["gpu-1"]} == {"0", "1"}


def test_a_range_query_has_the_minutes_before_and_only_its_node() -> None:
    client = DemoMetrics(["gpu-1", "gpu-2"], devices=1, clock=lambda: T)
    series = asyncio.run(source(client).range_query("gpu-2", T - 120, T, 2))
    points = series["accelerator_utilization{0}"]
    assert len(points) == 61 and points[0][0] == T - 120 and points[-1][0] == T
    assert min(v for _, v in points) > 90 and len({v for _, v in points}) > 10, "busy, not flat"


@pytest.mark.parametrize(
    ("kind", "name", "before", "after"),
    [
        ("oom", "DCGM_FI_DEV_FB_USED{0}", lambda v: 0.9 * 81_559 < v < 81_559, lambda v: v < 5_000),
        ("xid", "DCGM_FI_DEV_XID_ERRORS{0}", lambda v: v == 0, lambda v: v == 79),
        ("idle", "DCGM_FI_DEV_GPU_UTIL{0}", lambda v: v > 90, lambda v: v == 0),
    ],
)
def test_a_fault_shows_as_its_device_would(kind: str, name: str, before: object, after: object) -> None:
    client = DemoMetrics(["gpu-1"], devices=1, clock=lambda: T)
    client.fail("gpu-1", kind, at=T)  # type: ignore[arg-type]
    assert before(client.values_at("gpu-1", T - 5)[name])  # type: ignore[operator]
    assert after(client.values_at("gpu-1", T + 5)[name])  # type: ignore[operator]
    if kind == "xid":
        # The GPU fell off the bus: nothing else is read from it.
        assert set(client.values_at("gpu-1", T + 5)) == {name}


def test_a_lost_node_answers_nothing_and_an_idle_one_resumes() -> None:
    client = DemoMetrics(["gpu-1", "gpu-2"], ["npu-1"], devices=1, clock=lambda: T)
    client.fail("gpu-1", "lost", at=T)
    client.fail("gpu-2", "idle", at=T)
    client.fail("npu-1", "link", at=T)
    assert client.values_at("gpu-1", T + 1) == {}
    assert client.values_at("npu-1", T + 1)["npu_chip_info_link_status{0}"] == 0
    client.resume("gpu-2")
    assert client.values_at("gpu-2", T + 1)["DCGM_FI_DEV_GPU_UTIL{0}"] > 90
