"""PrometheusSource: vendor exporters -> a real Prometheus -> unified MetricBatches on the bus.

The exporters are real HTTP endpoints in dcgm-exporter / npu-exporter / mlu-exporter style
(tests/servers/exporter.py) and Prometheus is the Debian binary scraping them every second
(tests/servers/prometheus.py), started once for the module. Error paths use a real HTTP endpoint that
answers like a broken Prometheus; backoff timing uses fake loop time (looptime).
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import datetime
from typing import Any

import pytest
import pytest_asyncio
from servers.exporter import Exporter, ascend_node, cambricon_node, dcgm_labels, nvidia_node
from servers.loops import no_stray_event_loop  # noqa: F401 - autouse: closes looptime's stray loops
from servers.prometheus import PrometheusServer, Target, free_port, require_prometheus

from trainmedic.agent.bus.memory import MemoryBus
from trainmedic.agent.jobindex import JobIndex
from trainmedic.agent.telemetry import Telemetry
from trainmedic.agent.watchers.metrics import (
    PrometheusQueryError,
    PrometheusSource,
    device_of,
    node_of,
    usable_value,
)
from trainmedic.detectors.metric_rules import MetricRules
from trainmedic.events import Event, MetricBatch, Topic, decode
from trainmedic.models import Action, FaultClass
from trainmedic.udal import METRIC_VOCABULARY, get_plugin
from trainmedic.udal.nvidia import NvidiaPlugin

GPU_NODE = "gpu-node-1"
NPU_NODE = "npu-node-1"
MLU_NODE = "mlu-node-1"


def errors(telemetry: Telemetry, kind: str) -> float:
    value = telemetry.registry.get_sample_value("trainmedic_watch_errors_total", {"source": "prometheus", "kind": kind})
    return value or 0.0


class Cluster:
    """One exporter per node and the Prometheus that scrapes them."""

    def __init__(self, nvidia: Exporter, ascend: Exporter, cambricon: Exporter, prom: PrometheusServer) -> None:
        self.nvidia = nvidia
        self.ascend = ascend
        self.cambricon = cambricon
        self.prom = prom


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    binary = require_prometheus()
    with Exporter() as nv, Exporter() as npu, Exporter() as mlu:
        nvidia_node(nv, GPU_NODE)
        ascend_node(npu)
        cambricon_node(mlu, MLU_NODE)
        targets = [
            Target(nv.address),
            # npu-exporter names no node: the scrape job's target label does (as Kubernetes SD relabelling would).
            Target(npu.address, {"kubernetes_node": NPU_NODE}),
            Target(mlu.address),
        ]
        with PrometheusServer(binary, tmp_path_factory.mktemp("prometheus"), targets) as prom:
            prom.wait_scraped()
            yield Cluster(nv, npu, mlu, prom)


@pytest_asyncio.fixture
async def bus() -> AsyncIterator[MemoryBus]:
    b = MemoryBus()
    await b.start()
    yield b
    await b.stop()


async def read_events(bus: MemoryBus, group: str = "test", want: int = 1, timeout: float = 10.0) -> list[Event]:
    """What the bus holds on trainmedic.metrics, read as a consumer would."""
    consumer = bus.consumer([Topic.METRICS], group)
    await consumer.start()
    out: list[Event] = []
    try:
        deadline = asyncio.get_running_loop().time() + timeout
        while len(out) < want and asyncio.get_running_loop().time() < deadline:
            for record in await consumer.getmany(timeout_ms=100):
                out.append(decode(record.value))
    finally:
        await consumer.stop()
    return out


def by_node(events: list[Event]) -> dict[str, MetricBatch]:
    out: dict[str, MetricBatch] = {}
    for e in events:
        assert isinstance(e.payload, MetricBatch)
        out[e.payload.node] = e.payload
    return out


# -- against the real Prometheus -------------------------------------------------------------------


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("node", "chip", "name", "device", "value", "vendor"),
    [
        (GPU_NODE, "nvidia", "accelerator_utilization", "1", 88.0, "DCGM_FI_DEV_GPU_UTIL"),
        (GPU_NODE, "nvidia", "accelerator_memory_used", "0", 61_000.0, "DCGM_FI_DEV_FB_USED"),
        (GPU_NODE, "nvidia", "xid_errors", "0", 0.0, "DCGM_FI_DEV_XID_ERRORS"),
        (NPU_NODE, "ascend", "accelerator_utilization", "1", 46.0, "npu_chip_info_utilization"),
        (NPU_NODE, "ascend", "health", "0", 1.0, "npu_chip_info_health_status"),
        (MLU_NODE, "cambricon", "accelerator_utilization", "0", 66.0, "mlu_utilization"),
        (MLU_NODE, "cambricon", "link_status", "1/link1", 1.0, "mlu_mlulink_status"),
    ],
)
async def test_publishes_one_unified_batch_per_node(
    cluster: Cluster, bus: MemoryBus, node: str, chip: str, name: str, device: str, value: float, vendor: str
) -> None:
    source = PrometheusSource(cluster.prom.url, bus=bus, producer="cluster/test")
    published = await source.poll_once()
    events = await read_events(bus, want=len(published))
    assert sorted(e.id for e in events) == sorted(e.id for e in published)
    batches = by_node(events)
    assert set(batches) == {GPU_NODE, NPU_NODE, MLU_NODE}
    batch = batches[node]
    assert (batch.chip, batch.origin, batch.job) == (chip, "prometheus", None)
    assert {e.key for e in events if isinstance(e.payload, MetricBatch) and e.payload.node == node} == {f"node:{node}"}
    assert {s.name for s in batch.samples} <= METRIC_VOCABULARY
    hits = [s for s in batch.samples if (s.name, s.device) == (name, device)]
    assert [(s.value, s.vendor_name) for s in hits] == [(value, vendor)]


@pytest.mark.asyncio
async def test_drops_unmapped_series_and_dcgm_blanks(cluster: Cluster, bus: MemoryBus) -> None:
    source = PrometheusSource(cluster.prom.url, bus=bus)
    batches = by_node(await source.poll_once())
    vendors = {s.vendor_name for b in batches.values() for s in b.samples}
    assert "DCGM_FI_DEV_MEM_CLOCK" not in vendors  # exported, but no plugin maps it
    assert "DCGM_FI_DEV_MEMORY_TEMP" not in vendors  # only the blank sentinel was exported
    assert not any(s.name == "machine_npu_nums" for b in batches.values() for s in b.samples)


def pod(name: str, job: str, node: str, rank: int) -> dict[str, Any]:
    return {
        "metadata": {
            "namespace": "train",
            "name": name,
            "uid": f"uid-{name}",
            "labels": {"batch.kubernetes.io/job-completion-index": str(rank)},
            "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": job, "controller": True}],
        },
        "spec": {"nodeName": node},
    }


@pytest.mark.asyncio
async def test_fans_out_one_copy_per_job_on_the_node(cluster: Cluster, bus: MemoryBus) -> None:
    jobs = JobIndex()
    jobs.update_pod(pod("llama-0", "llama", GPU_NODE, 0))
    jobs.update_pod(pod("bert-0", "bert", GPU_NODE, 0))
    jobs.update_pod(pod("llama-1", "llama", "elsewhere", 1))
    source = PrometheusSource(cluster.prom.url, bus=bus, job_index=jobs)
    events = await source.poll_once()
    gpu = [e for e in events if isinstance(e.payload, MetricBatch) and e.payload.node == GPU_NODE]
    assert sorted(e.key for e in gpu) == ["job:train/bert", "job:train/llama"]
    assert len({e.id for e in gpu}) == 1  # one observation: consumers de-duplicate by id
    assert sorted(e.payload.job.name for e in gpu if isinstance(e.payload, MetricBatch) and e.payload.job) == [
        "bert",
        "llama",
    ]
    others = [e for e in events if e not in gpu]
    assert {e.key for e in others} == {f"node:{NPU_NODE}", f"node:{MLU_NODE}"}


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("node", "key", "other_chip_name"),
    [
        (GPU_NODE, "accelerator_utilization{0}", "link_status{0/link0}"),
        (NPU_NODE, "health{1}", "xid_errors{0}"),
        (MLU_NODE, "link_status{0/link1}", "network_status{0}"),
    ],
)
async def test_range_query_returns_a_nodes_window(
    cluster: Cluster, bus: MemoryBus, node: str, key: str, other_chip_name: str
) -> None:
    source = PrometheusSource(cluster.prom.url, bus=bus)
    end = time.time()
    series = await source.range_query(node, end - 60, end, 1.0)
    assert key in series
    points = series[key]
    assert points and all(end - 62 <= t <= end + 1 for t, _ in points)
    assert [t for t, _ in points] == sorted(t for t, _ in points)
    assert other_chip_name not in series  # only this node's devices
    assert all(name.split("{")[0] in METRIC_VOCABULARY for name in series)


@pytest.mark.asyncio
async def test_xid_79_on_the_exporter_becomes_a_device_error_finding(cluster: Cluster, bus: MemoryBus) -> None:
    """dcgm-exporter Xid gauge -> Prometheus -> PrometheusSource -> bus -> metric rules -> finding."""
    source = PrometheusSource(cluster.prom.url, bus=bus)
    rules = MetricRules()
    consumer = bus.consumer([Topic.METRICS], "brain")
    await consumer.start()

    async def observe() -> list[Any]:
        await source.poll_once()
        found = []
        for record in await consumer.getmany(timeout_ms=200):
            event = decode(record.value)
            p = event.payload
            assert isinstance(p, MetricBatch)
            found += rules.observe(node=p.node, chip=p.chip, job_key=None, samples=p.samples, t=event.time)
        return found

    labels = dcgm_labels(1, GPU_NODE)
    try:
        assert await observe() == []  # baseline: Xid 0 everywhere
        cluster.nvidia.set("DCGM_FI_DEV_XID_ERRORS", labels, 79)
        await asyncio.to_thread(
            cluster.prom.wait_for,
            'DCGM_FI_DEV_XID_ERRORS{gpu="1"}',
            lambda r: bool(r) and r[0]["value"][1] == "79",
        )
        findings = await observe()
        assert len(findings) == 1
        f = findings[0]
        assert (f.rule_id, f.code, f.fault_class) == ("metric.xid", "xid:79", FaultClass.DEVICE_ERROR)
        assert (f.node, f.device, f.vendor_action, f.action) == (GPU_NODE, "1", "RESTART_BM", Action.REBOOT_NODE)
        assert await observe() == []  # the gauge stays at 79: no second finding
    finally:
        cluster.nvidia.set("DCGM_FI_DEV_XID_ERRORS", labels, 0)
        await consumer.stop()


@pytest.mark.asyncio
async def test_prometheus_down_is_counted_and_the_source_recovers(cluster: Cluster, bus: MemoryBus) -> None:
    """Stops the module's Prometheus while the loop runs, then starts it again on the same port."""
    telemetry = Telemetry()
    source = PrometheusSource(
        cluster.prom.url, bus=bus, telemetry=telemetry, interval_s=0.2, backoff_base_s=0.05, max_backoff_s=0.2
    )
    cluster.prom.stop()
    task = asyncio.create_task(source.run())
    try:
        while errors(telemetry, "unreachable") < 3:
            assert not task.done(), task
            await asyncio.sleep(0.05)
        assert source.failures >= 3
        await asyncio.to_thread(cluster.prom.start)
        events = await read_events(bus, want=3)
        assert {e.payload.node for e in events if isinstance(e.payload, MetricBatch)} >= {GPU_NODE, NPU_NODE}
        assert source.failures == 0
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, timeout=5)
        if not cluster.prom.running:
            cluster.prom.start()


# -- a broken Prometheus API (a real HTTP endpoint answering badly) ----------------------------------


@pytest.fixture
def broken_api() -> Iterator[Exporter]:
    with Exporter() as endpoint:
        yield endpoint


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("status", "body", "kind"),
    [
        (503, "Service Unavailable", "http_5xx"),
        (500, '{"status":"error","error":"internal"}', "http_5xx"),
        (400, '{"status":"error","errorType":"bad_data","error":"parse error"}', "http_4xx"),
        (200, "<html><body>proxy login</body></html>", "bad_response"),
        (200, '{"status":"success","data":{}}', "bad_response"),
        (200, '{"status":"success","data":{"resultType":"vector","result":{"not":"a list"}}}', "bad_response"),
        (200, b"\xff\xfe\x00binary\x00", "bad_response"),
    ],
    ids=["503", "500", "400", "html", "no-result", "result-not-list", "binary"],
)
async def test_bad_answers_are_counted_errors(
    broken_api: Exporter, bus: MemoryBus, status: int, body: str | bytes, kind: str
) -> None:
    broken_api.respond("/api/v1/query", status, body)
    telemetry = Telemetry()
    source = PrometheusSource(broken_api.url, bus=bus, telemetry=telemetry)
    with pytest.raises(PrometheusQueryError) as info:
        await source.poll_once()
    assert info.value.kind == kind
    assert errors(telemetry, kind) == 1
    assert len(str(info.value)) < 500  # a huge error page does not end up in the log line
    assert bus.published == 0


@pytest.mark.asyncio
async def test_unreachable_prometheus_is_a_counted_error(bus: MemoryBus) -> None:
    telemetry = Telemetry()
    source = PrometheusSource(f"http://127.0.0.1:{free_port()}", bus=bus, telemetry=telemetry)
    with pytest.raises(PrometheusQueryError) as info:
        await source.poll_once()
    assert info.value.kind == "unreachable"
    assert errors(telemetry, "unreachable") == 1


@pytest.mark.asyncio
async def test_malformed_series_are_skipped_and_counted(broken_api: Exporter, bus: MemoryBus) -> None:
    good = {"metric": {"__name__": "DCGM_FI_DEV_GPU_UTIL", "gpu": "0", "Hostname": "n1"}, "value": [1.0, "50"]}
    body = {
        "status": "success",
        "data": {
            "resultType": "vector",
            "result": [
                good,
                {"metric": "not labels", "value": [1, "1"]},
                {"metric": {"__name__": "DCGM_FI_DEV_GPU_UTIL", "gpu": "1", "Hostname": "n1"}, "value": "x"},
                {"metric": {"__name__": "DCGM_FI_DEV_GPU_UTIL", "gpu": "2", "Hostname": "n1"}, "value": [1, "NaN"]},
                {"metric": {"__name__": "DCGM_FI_DEV_GPU_UTIL", "gpu": "3"}, "value": [1, "7"]},  # no node at all
                42,
            ],
        },
    }
    broken_api.respond("/api/v1/query", 200, json.dumps(body))
    telemetry = Telemetry()
    source = PrometheusSource(broken_api.url, bus=bus, telemetry=telemetry)
    events = await source.poll_once()
    assert len(events) == 1
    batch = events[0].payload
    assert isinstance(batch, MetricBatch)
    assert [(s.name, s.device, s.value) for s in batch.samples] == [("accelerator_utilization", "0", 50.0)]
    assert errors(telemetry, "bad_series") == 3


# -- the loop's timing (fake time) ------------------------------------------------------------------


class ScriptedClient:
    """A PromClient that fails `failures` times, then answers an empty vector; records call times."""

    def __init__(self, failures: int = 0, clock: Callable[[], float] = time.monotonic) -> None:
        self.failures = failures
        self.clock = clock
        self.calls: list[float] = []

    def custom_query(self, query: str, params: dict[str, Any] | None = None) -> Any:
        self.calls.append(self.clock())
        if len(self.calls) <= self.failures:
            import requests

            raise requests.exceptions.ConnectionError("connection refused")
        return []

    def custom_query_range(
        self, query: str, start_time: datetime, end_time: datetime, step: str, params: dict[str, Any] | None = None
    ) -> Any:
        return []


class NoJitter(random.Random):
    def random(self) -> float:
        return 1.0


@pytest.mark.asyncio
@pytest.mark.looptime
async def test_backoff_doubles_until_success_then_polls_every_interval(bus: MemoryBus) -> None:
    loop = asyncio.get_running_loop()
    client = ScriptedClient(failures=4, clock=loop.time)
    telemetry = Telemetry()
    source = PrometheusSource(
        "http://prometheus.invalid",
        bus=bus,
        telemetry=telemetry,
        client=client,
        interval_s=15,
        backoff_base_s=1,
        max_backoff_s=4,
        rng=NoJitter(),
    )
    start = loop.time()
    task = asyncio.create_task(source.run())
    await asyncio.sleep(40)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    offsets = [round(t - start, 3) for t in client.calls]
    # Failures at 0, 1, 3, 7 (delays 1, 2, 4), capped at 4: 11 succeeds; then every 15 s.
    assert offsets == [0, 1, 3, 7, 11, 26]
    assert errors(telemetry, "unreachable") == 4
    assert source.failures == 0


@pytest.mark.parametrize("failures", [1, 2, 5, 12, 100])
def test_backoff_is_jittered_within_half_to_full_and_capped(failures: int) -> None:
    source = PrometheusSource(
        "http://x.invalid",
        bus=MemoryBus(),
        client=ScriptedClient(),
        backoff_base_s=1,
        max_backoff_s=60,
        rng=random.Random(failures),
    )
    raw = min(60.0, 2.0 ** (failures - 1))
    delays = [source.backoff(failures) for _ in range(50)]
    assert all(raw * 0.5 <= d <= raw for d in delays)
    assert len(set(delays)) > 1


@pytest.mark.asyncio
@pytest.mark.looptime
async def test_cancel_stops_the_loop_while_it_sleeps(bus: MemoryBus) -> None:
    client = ScriptedClient(clock=asyncio.get_running_loop().time)
    source = PrometheusSource("http://x.invalid", bus=bus, client=client, interval_s=3600)
    task = asyncio.create_task(source.run())
    await asyncio.sleep(1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert len(client.calls) == 1


# -- label mapping ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("labels", "expected"),
    [
        ({"node": "n1", "Hostname": "pod-abc", "instance": "10.0.0.1:9400"}, "n1"),
        ({"kubernetes_node": "n2", "instance": "10.0.0.1:8082"}, "n2"),
        ({"Hostname": "gpu-7", "instance": "10.0.0.1:9400"}, "gpu-7"),
        ({"instance": "10.0.0.9:9400"}, "10.0.0.9"),
        ({"instance": "[fd00::5]:9400"}, "fd00::5"),
        ({"instance": "node-without-port"}, "node-without-port"),
        ({"node": "", "instance": "h:1"}, "h"),
        ({}, None),
    ],
)
def test_node_of(labels: dict[str, str], expected: str | None) -> None:
    assert node_of(labels) == expected


@pytest.mark.parametrize(
    ("labels", "expected"),
    [
        ({"gpu": "3", "UUID": "GPU-x", "device": "nvidia3"}, "3"),
        ({"id": "5", "vdie_id": "64036E64"}, "5"),
        ({"mlu": "2", "uuid": "MLU-x"}, "2"),
        ({"mlu": "2", "link": "7"}, "2/link7"),
        ({"UUID": "GPU-only"}, "GPU-only"),
        ({"device": "nvidia0"}, None),
    ],
)
def test_device_of(labels: dict[str, str], expected: str | None) -> None:
    assert device_of(labels) == expected


@pytest.mark.parametrize(
    ("value", "usable"),
    [(0.0, True), (-1.0, True), (87.5, True), (9223372036854775794.0, False), (float("nan"), False)],
)
def test_usable_value(value: float, usable: bool) -> None:
    assert usable_value(value) is usable


def test_every_real_plugin_is_queried_in_one_instant_query() -> None:
    source = PrometheusSource("http://x.invalid", bus=MemoryBus(), client=ScriptedClient())
    for chip in ("nvidia", "ascend", "cambricon"):
        for vendor in get_plugin(chip).metric_names:
            assert vendor in source.query
    assert "fake_" not in source.query


def test_plugins_claiming_one_metric_are_refused() -> None:
    class Clone(NvidiaPlugin):
        name = "clone"

    with pytest.raises(ValueError, match="claimed by plugins"):
        PrometheusSource(
            "http://x.invalid", bus=MemoryBus(), plugins=[NvidiaPlugin(), Clone()], client=ScriptedClient()
        )


@pytest.mark.parametrize(
    ("chip", "vendor", "unified"),
    [
        ("nvidia", "DCGM_FI_DEV_XID_ERRORS", "xid_errors"),  # a gauge: the last Xid, not a count
        ("nvidia", "DCGM_FI_DEV_RETIRED_PENDING", "retired_pages_pending"),
        ("ascend", "npu_chip_info_hbm_ecc_double_bit_error_cnt", "ecc_dbe"),
        ("ascend", "npu_chip_info_network_status", "network_status"),
        ("ascend", "npu_chip_info_aicore_current_freq", "accelerator_clock"),
        ("cambricon", "mlu_last_xid_error", "xid_errors"),  # the last xid, like DCGM's gauge
        ("cambricon", "mlu_xid_error_count", None),  # a counter per xid label: not the same meaning
        ("cambricon", "mlu_remapped_pending_rows", "row_remap_pending"),
    ],
)
def test_vendor_names_map_by_meaning(chip: str, vendor: str, unified: str | None) -> None:
    assert get_plugin(chip).unified_metric(vendor) == unified


@pytest.mark.asyncio
async def test_a_registered_chips_exporter_series_are_published_under_its_name(
    cluster: Cluster, bus: MemoryBus
) -> None:
    """A chip trainmedic does not ship (tests/zetachip.py): its exporter's series, scraped by the real
    Prometheus, are queried and published as that chip once its plugin is registered."""
    from trainmedic.udal import registry

    labels = {"npu": "2", "node": "zeta-node-1"}
    cluster.cambricon.set("zeta_npu_utilization", labels, 64)
    registry.register("zeta", "zetachip:ZetaPlugin")
    try:
        await asyncio.to_thread(cluster.prom.wait_for, 'zeta_npu_utilization{npu="2"}', bool)
        batches = by_node(await PrometheusSource(cluster.prom.url, bus=bus).poll_once())
        batch = batches["zeta-node-1"]
        assert (batch.chip, batch.origin) == ("zeta", "prometheus")
        assert [(s.name, s.device, s.value, s.vendor_name) for s in batch.samples] == [
            ("accelerator_utilization", "2", 64.0, "zeta_npu_utilization")
        ]
        assert {b.chip for n, b in batches.items() if n != "zeta-node-1"} == {"nvidia", "ascend", "cambricon"}
    finally:
        registry.unregister("zeta")
        cluster.cambricon.remove("zeta_npu_utilization")
    batches = by_node(await PrometheusSource(cluster.prom.url, bus=bus).poll_once())
    assert "zeta-node-1" not in batches  # without the plugin, its series are nobody's
