"""NvmlSource: the unavailable path on this host, and the mapping and Xid path through an injected fake.

No GPU here: `FakeNvml` implements the few pynvml functions the source calls, with values shaped as
pynvml returns them (a struct with .gpu/.memory, bytes, milliwatts, NVMLError with .value), and is
passed as the `nvml` constructor argument. On a host with a driver, the first test reads the real GPUs.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
import pytest_asyncio
from servers.loops import no_stray_event_loop  # noqa: F401 - autouse: closes looptime's stray loops

from trainmedic.agent.bus.memory import MemoryBus
from trainmedic.agent.jobindex import JobIndex
from trainmedic.agent.telemetry import Telemetry
from trainmedic.agent.watchers.nvml import NvmlSource, SourceUnavailable
from trainmedic.detectors.metric_rules import MetricRules
from trainmedic.events import Event, MetricBatch, Topic, decode
from trainmedic.models import Action, FaultClass
from trainmedic.udal import METRIC_VOCABULARY

GIB = 1024**3
NODE = "gpu-node-3"


class FakeNVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


@dataclass
class FakeGpu:
    util: int = 93
    mem_util: int = 41
    used: int = 61 * GIB
    total: int = 80 * GIB
    temp: int = 66
    power_mw: int = 512_345
    dbe: int = 0
    sbe: int = 4
    retired_pending: int = 0
    remapped: tuple[int, int, int, int] = (2, 0, 0, 0)  # corrected, uncorrected, pending, failure
    links: dict[int, int] | None = field(default_factory=lambda: {0: 1, 1: 1, 2: 0, 3: 1})
    lost: bool = False
    unsupported: set[str] = field(default_factory=set)


@dataclass(frozen=True)
class Handle:
    index: int


class FakeNvml:
    NVMLError = FakeNVMLError

    def __init__(self, gpus: list[FakeGpu], *, init_error: int | None = None) -> None:
        self.gpus = gpus
        self.init_error = init_error
        self.calls: Counter[str] = Counter()
        self.events: queue.Queue[SimpleNamespace] = queue.Queue()
        self.registered: list[int] = []
        self.initialized = 0
        self.event_set_freed = threading.Event()

    def _gpu(self, handle: Handle, what: str) -> FakeGpu:
        self.calls[what] += 1
        gpu = self.gpus[handle.index]
        if gpu.lost:
            raise FakeNVMLError(15)  # NVML_ERROR_GPU_IS_LOST
        if what in gpu.unsupported:
            raise FakeNVMLError(3)  # NVML_ERROR_NOT_SUPPORTED
        return gpu

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise FakeNVMLError(self.init_error)
        self.initialized += 1

    def nvmlShutdown(self) -> None:
        self.initialized -= 1

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Handle:
        return Handle(index)

    def nvmlDeviceGetIndex(self, handle: Handle) -> int:
        return handle.index

    def nvmlDeviceGetUtilizationRates(self, handle: Handle) -> SimpleNamespace:
        g = self._gpu(handle, "utilization")
        return SimpleNamespace(gpu=g.util, memory=g.mem_util)

    def nvmlDeviceGetMemoryInfo(self, handle: Handle) -> SimpleNamespace:
        g = self._gpu(handle, "memory")
        return SimpleNamespace(total=g.total, free=g.total - g.used, used=g.used)

    def nvmlDeviceGetTemperature(self, handle: Handle, sensor: int) -> int:
        assert sensor == 0  # NVML_TEMPERATURE_GPU
        return self._gpu(handle, "temperature").temp

    def nvmlDeviceGetPowerUsage(self, handle: Handle) -> int:
        return self._gpu(handle, "power").power_mw

    def nvmlDeviceGetTotalEccErrors(self, handle: Handle, error_type: int, counter_type: int) -> int:
        assert counter_type == 0  # NVML_VOLATILE_ECC
        g = self._gpu(handle, "ecc")
        return g.dbe if error_type == 1 else g.sbe

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: Handle) -> int:
        return self._gpu(handle, "retired").retired_pending

    def nvmlDeviceGetRemappedRows(self, handle: Handle) -> tuple[int, int, int, int]:
        return self._gpu(handle, "remapped").remapped

    def nvmlDeviceGetNvLinkState(self, handle: Handle, link: int) -> int:
        g = self._gpu(handle, "nvlink")
        if g.links is None:
            raise FakeNVMLError(3)
        if link not in g.links:
            raise FakeNVMLError(2)  # NVML_ERROR_INVALID_ARGUMENT
        return g.links[link]

    def nvmlEventSetCreate(self) -> object:
        return object()

    def nvmlDeviceRegisterEvents(self, handle: Handle, event_types: int, event_set: object) -> None:
        assert event_types == 0x8  # nvmlEventTypeXidCriticalError
        self.registered.append(handle.index)

    def nvmlEventSetWait(self, event_set: object, timeout_ms: int) -> SimpleNamespace:
        try:
            return self.events.get(timeout=timeout_ms / 1000)
        except queue.Empty:
            raise FakeNVMLError(10) from None  # NVML_ERROR_TIMEOUT

    def nvmlEventSetFree(self, event_set: object) -> None:
        self.event_set_freed.set()

    def emit_xid(self, index: int, xid: int) -> None:
        self.events.put(SimpleNamespace(device=Handle(index), eventType=0x8, eventData=xid))


@pytest_asyncio.fixture
async def bus() -> AsyncIterator[MemoryBus]:
    b = MemoryBus()
    await b.start()
    yield b
    await b.stop()


def samples_of(source: NvmlSource) -> dict[tuple[str, str | None], float]:
    return {(s.name, s.device): s.value for s in source.read()}


# -- where NVML cannot work ------------------------------------------------------------------------


def test_real_nvml_here_is_either_unavailable_with_a_reason_or_reads_the_gpus() -> None:
    source = NvmlSource(bus=MemoryBus(), node=NODE)
    try:
        source.check()
    except SourceUnavailable as e:
        reason = str(e)
        assert reason and "\n" not in reason
        assert "libnvidia-ml" in reason or "driver" in reason or "GPU" in reason
        return
    try:  # a host with a driver and GPUs (the accelerator machine)
        read = samples_of(source)
        assert read[("health", "0")] == 1.0
        assert {name for name, _ in read} <= METRIC_VOCABULARY
    finally:
        source.shutdown()


@pytest.mark.parametrize(
    ("code", "words"),
    [
        (12, "libnvidia-ml.so.1"),
        (9, "driver is not loaded"),
        (4, "no permission"),
        (13, "too old"),
        (999, "NVML initialisation failed"),
    ],
)
def test_init_failures_give_a_one_line_reason(code: int, words: str) -> None:
    source = NvmlSource(bus=MemoryBus(), node=NODE, nvml=FakeNvml([FakeGpu()], init_error=code))
    with pytest.raises(SourceUnavailable, match=words) as info:
        source.check()
    assert "\n" not in str(info.value)


def test_no_gpu_is_unavailable_and_shuts_nvml_down() -> None:
    fake = FakeNvml([])
    with pytest.raises(SourceUnavailable, match="no GPU"):
        NvmlSource(bus=MemoryBus(), node=NODE, nvml=fake).check()
    assert fake.initialized == 0


# -- mapping ---------------------------------------------------------------------------------------


def test_read_maps_nvml_onto_the_unified_vocabulary() -> None:
    fake = FakeNvml([FakeGpu(), FakeGpu(util=5, links=None, dbe=2)])
    source = NvmlSource(bus=MemoryBus(), node=NODE, nvml=fake)
    source.check()
    read = samples_of(source)
    assert {name for name, _ in read} <= METRIC_VOCABULARY
    assert {k: v for k, v in read.items() if k[1] == "0"} == {
        ("accelerator_utilization", "0"): 93,
        ("accelerator_memory_utilization", "0"): 41,
        ("accelerator_memory_used", "0"): 61 * 1024,  # MiB, as DCGM reports framebuffer memory
        ("accelerator_memory_total", "0"): 80 * 1024,
        ("accelerator_temperature", "0"): 66,
        ("accelerator_power", "0"): 512.345,  # W from mW
        ("ecc_dbe", "0"): 0,
        ("ecc_sbe", "0"): 4,
        ("retired_pages_pending", "0"): 0,
        ("row_remap_pending", "0"): 0,
        ("row_remap_failure", "0"): 0,
        ("health", "0"): 1,
        ("xid_errors", "0"): 0,
    }
    assert {k: v for k, v in read.items() if k[0] == "link_status"} == {
        ("link_status", "0/link0"): 1,
        ("link_status", "0/link1"): 1,
        ("link_status", "0/link2"): 0,
        ("link_status", "0/link3"): 1,
    }
    assert (read[("accelerator_utilization", "1")], read[("ecc_dbe", "1")]) == (5, 2)


def test_a_gpu_without_nvlink_is_probed_once() -> None:
    fake = FakeNvml([FakeGpu(links=None)])
    source = NvmlSource(bus=MemoryBus(), node=NODE, nvml=fake)
    source.check()
    source.read()
    source.read()
    assert fake.calls["nvlink"] == 1


def test_an_unsupported_query_is_not_asked_again() -> None:
    fake = FakeNvml([FakeGpu(unsupported={"ecc", "remapped"})])
    source = NvmlSource(bus=MemoryBus(), node=NODE, nvml=fake)
    source.check()
    first, second = samples_of(source), samples_of(source)
    assert first == second
    assert ("ecc_dbe", "0") not in first and ("row_remap_failure", "0") not in first
    assert (fake.calls["ecc"], fake.calls["remapped"]) == (2, 1)  # dbe and sbe once each, then remembered


def test_a_lost_gpu_turns_unhealthy_and_the_health_rule_fires() -> None:
    fake = FakeNvml([FakeGpu(), FakeGpu()])
    source = NvmlSource(bus=MemoryBus(), node=NODE, nvml=fake)
    source.check()
    rules = MetricRules()
    assert rules.observe(node=NODE, chip="nvidia", job_key=None, samples=source.read(), t=1.0) == []
    fake.gpus[1].lost = True
    read = source.read()
    lost = sorted((s.name, s.value) for s in read if s.device == "1")
    assert lost == [("health", 0.0), ("xid_errors", 0.0)]
    (finding,) = rules.observe(node=NODE, chip="nvidia", job_key=None, samples=read, t=16.0)
    assert (finding.rule_id, finding.device, finding.fault_class) == ("metric.health", "1", FaultClass.DEVICE_ERROR)


# -- publishing and Xid events ---------------------------------------------------------------------


async def next_events(consumer: Any, want: int, timeout: float = 10.0) -> list[Event]:
    out: list[Event] = []
    deadline = asyncio.get_running_loop().time() + timeout
    while len(out) < want and asyncio.get_running_loop().time() < deadline:
        out += [decode(r.value) for r in await consumer.getmany(timeout_ms=50)]
    assert len(out) >= want, out
    return out


@pytest.mark.asyncio
async def test_xid_event_is_published_at_once_and_becomes_a_finding(bus: MemoryBus) -> None:
    fake = FakeNvml([FakeGpu(), FakeGpu()])
    source = NvmlSource(bus=bus, node=NODE, nvml=fake, interval_s=3600, xid_wait_ms=20, producer="node/test")
    source.check()
    consumer = bus.consumer([Topic.METRICS], "brain")
    await consumer.start()
    rules = MetricRules()
    task = asyncio.create_task(source.run())
    try:
        (first,) = await next_events(consumer, 1)  # the first poll: the xid_errors=0 baseline
        assert isinstance(first.payload, MetricBatch)
        assert (first.payload.origin, first.payload.chip, first.key) == ("nvml", "nvidia", f"node:{NODE}")
        assert rules.observe(node=NODE, chip="nvidia", job_key=None, samples=first.payload.samples, t=first.time) == []
        while fake.registered != [0, 1]:
            await asyncio.sleep(0.01)
        fake.emit_xid(1, 79)
        (xid,) = await next_events(consumer, 1)
        assert isinstance(xid.payload, MetricBatch)
        assert [(s.name, s.device, s.value) for s in xid.payload.samples] == [("xid_errors", "1", 79.0)]
        (finding,) = rules.observe(node=NODE, chip="nvidia", job_key=None, samples=xid.payload.samples, t=xid.time)
        assert (finding.code, finding.device, finding.action) == ("xid:79", "1", Action.REBOOT_NODE)
        # Later polls carry the last Xid: the gauge semantics of DCGM, so no second finding.
        again = await source.poll_once()
        assert isinstance(again[0].payload, MetricBatch)
        assert rules.observe(node=NODE, chip="nvidia", job_key=None, samples=again[0].payload.samples, t=99e9) == []
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, timeout=5)
        await consumer.stop()
    assert fake.event_set_freed.is_set()
    assert fake.initialized == 0


@pytest.mark.asyncio
async def test_batches_are_fanned_out_to_the_jobs_on_the_node(bus: MemoryBus) -> None:
    jobs = JobIndex()
    for name, job in (("a-0", "a"), ("b-0", "b")):
        jobs.update_pod(
            {
                "metadata": {"namespace": "ml", "name": name, "labels": {"job-name": job}},
                "spec": {"nodeName": NODE},
            }
        )
    source = NvmlSource(bus=bus, node=NODE, job_index=jobs, nvml=FakeNvml([FakeGpu()]))
    source.check()
    events = await source.poll_once()
    assert sorted(e.key for e in events) == ["job:ml/a", "job:ml/b"]
    assert len({e.id for e in events}) == 1


def test_a_full_xid_queue_drops_and_counts() -> None:
    telemetry = Telemetry()
    source = NvmlSource(bus=MemoryBus(), node=NODE, telemetry=telemetry, nvml=FakeNvml([FakeGpu()]))
    q: asyncio.Queue[tuple[int, int, float]] = asyncio.Queue(maxsize=1)
    for xid in (13, 31, 43):
        source._offer(q, (0, xid, 1.0))
    assert q.qsize() == 1 and source.xid_dropped == 2
    dropped = telemetry.registry.get_sample_value(
        "trainmedic_watch_errors_total", {"source": "nvml", "kind": "xid_dropped"}
    )
    assert dropped == 2
