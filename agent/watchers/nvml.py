"""NVIDIA GPUs read directly through NVML on the node, for clusters without dcgm-exporter.

NVML (nvidia-ml-py, a ctypes binding that loads libnvidia-ml from the driver at run time) answers
without Prometheus in between, and it delivers Xid events as they happen instead of at the next
scrape. Per GPU, every `interval_s` (15 s by default), one `MetricBatch` (origin "nvml") with:

    accelerator_utilization, accelerator_memory_utilization (%), accelerator_memory_used / _total
    (MiB, like DCGM), accelerator_temperature (C), accelerator_power (W), ecc_dbe / ecc_sbe
    (volatile totals), retired_pages_pending, row_remap_pending / row_remap_failure, link_status per
    NVLink (device "<index>/link<N>", 1 active / 0 not), health (1; 0 once NVML says the GPU is lost,
    the state behind Xid 79), xid_errors (the last Xid this source saw, 0 before the first one).

Xid events: a thread waits on an NVML event set registered for nvmlEventTypeXidCriticalError and
hands each event to the loop, which publishes a batch with `xid_errors=<xid>` for that GPU at once.
`xid_errors` keeps DCGM's meaning ("value of the last Xid"), so the metric rules treat both sources
alike; the first poll publishes 0 before the event thread starts, which is the baseline the first
Xid is compared with.

Where NVML cannot work (the wheel missing, no driver: NVMLError_LibraryNotFound, driver not loaded,
no permission, no GPU) `check()` / `run()` raise `SourceUnavailable` with a one-line reason and the
agent runs without this source. Every blocking NVML call runs in a thread. The `nvml` module is a
constructor parameter (default: pynvml), so tests inject a recorded fake without patching anything.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from trainmedic.agent.bus.base import Bus
from trainmedic.agent.jobindex import JobIndex
from trainmedic.agent.telemetry import Telemetry
from trainmedic.agent.watchers.metrics import fan_out
from trainmedic.errors import PermanentError
from trainmedic.events import Event, MetricBatch, MetricSample, Topic

log = logging.getLogger("trainmedic.watchers.nvml")

# NVML's own numbers (nvml.h); stable across driver versions.
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
NVML_TEMPERATURE_GPU = 0
NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_VOLATILE_ECC = 0
NVML_NVLINK_MAX_LINKS = 36
EVENT_TYPE_XID_CRITICAL = 0x8  # nvmlEventTypeXidCriticalError
MIB = 1024 * 1024
XID_VENDOR_NAME = "nvmlEventTypeXidCriticalError"

_UNAVAILABLE_REASONS = {
    NVML_ERROR_LIBRARY_NOT_FOUND: "NVML library (libnvidia-ml.so.1) not found: no NVIDIA driver on this host",
    NVML_ERROR_DRIVER_NOT_LOADED: "the NVIDIA driver is not loaded",
    NVML_ERROR_NO_PERMISSION: "no permission to open the NVIDIA devices",
    NVML_ERROR_FUNCTION_NOT_FOUND: "the NVIDIA driver is too old for this NVML binding",
}


class _GpuLost(Exception):
    """NVML_ERROR_GPU_IS_LOST: the GPU stopped answering; its health is 0."""


class SourceUnavailable(PermanentError):
    """This source cannot run on this host; the message is the one-line reason (permanent)."""


def _import_pynvml() -> Any:
    try:
        import pynvml
    except ImportError as e:
        raise SourceUnavailable(f"nvidia-ml-py (pynvml) is not installed: {e}") from e
    return pynvml


class NvmlSource:
    """NVML device metrics and Xid events of this node's GPUs, published as MetricBatches."""

    def __init__(
        self,
        *,
        bus: Bus,
        node: str,
        job_index: JobIndex | None = None,
        telemetry: Telemetry | None = None,
        producer: str = "",
        interval_s: float = 15.0,
        nvml: Any = None,
        xid_wait_ms: int = 1000,
        max_pending_xids: int = 1000,
    ) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s}")
        self.bus = bus
        self.node = node
        self.job_index = job_index
        self.telemetry = telemetry or Telemetry()
        self.producer = producer
        self.interval_s = interval_s
        self.xid_wait_ms = xid_wait_ms
        self.max_pending_xids = max_pending_xids
        self._nvml_given = nvml
        self._nv: Any = None
        self._handles: list[Any] = []
        self._links: dict[int, list[int]] = {}
        self._unsupported: set[tuple[int, str]] = set()
        self._last_xid: dict[int, int] = {}
        self._lock = threading.Lock()
        self.xid_dropped = 0

    # -- life cycle (blocking; run them in a thread) ----------------------------------------------

    def check(self) -> None:
        """Raise SourceUnavailable (one-line reason) unless NVML works and sees a GPU here."""
        self.start()

    def start(self) -> None:
        """Initialise NVML and find the GPUs and their NVLinks (idempotent)."""
        with self._lock:
            if self._nv is not None:
                return
            nv = self._nvml_given if self._nvml_given is not None else _import_pynvml()
            try:
                nv.nvmlInit()
            except nv.NVMLError as e:
                code = getattr(e, "value", None)
                reason = _UNAVAILABLE_REASONS.get(code) if isinstance(code, int) else None
                raise SourceUnavailable(reason or f"NVML initialisation failed: {e}") from e
            try:
                count = int(nv.nvmlDeviceGetCount())
                handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
            except nv.NVMLError as e:
                _quiet_shutdown(nv)
                raise SourceUnavailable(f"NVML cannot list the GPUs: {e}") from e
            if not handles:
                _quiet_shutdown(nv)
                raise SourceUnavailable("NVML sees no GPU on this node")
            self._links = {i: _probe_links(nv, h) for i, h in enumerate(handles)}
            self._handles = handles
            self._nv = nv
            log.info("nvml: %d GPU(s) on %s", len(handles), self.node)

    def shutdown(self) -> None:
        with self._lock:
            if self._nv is not None:
                _quiet_shutdown(self._nv)
                self._nv = None
                self._handles = []

    # -- reading ----------------------------------------------------------------------------------

    def read(self) -> list[MetricSample]:
        """One sample set of every GPU (blocking)."""
        nv = self._nv
        if nv is None:
            raise RuntimeError("NvmlSource.read() before start()")
        out: list[MetricSample] = []
        for index, handle in enumerate(self._handles):
            out.extend(self._read_device(nv, index, handle))
        return out

    def _query(self, nv: Any, index: int, what: str, fn: Callable[[], Any]) -> Any:
        """One NVML call for GPU `index`; None when unsupported (remembered) or failed (counted)."""
        if (index, what) in self._unsupported:
            return None
        try:
            return fn()
        except nv.NVMLError as e:
            code = getattr(e, "value", None)
            if code == NVML_ERROR_GPU_IS_LOST:
                raise _GpuLost from e
            if code in (NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_INVALID_ARGUMENT, NVML_ERROR_FUNCTION_NOT_FOUND):
                self._unsupported.add((index, what))
            else:
                self.telemetry.watch_errors.labels("nvml", f"nvml_error_{code}").inc()
                log.warning("nvml: GPU %d %s: %s", index, what, e)
            return None

    def _read_device(self, nv: Any, index: int, handle: Any) -> list[MetricSample]:
        dev = str(index)
        out: list[MetricSample] = []

        def add(name: str, vendor: str, value: Any, device: str = dev) -> None:
            if value is not None:
                out.append(MetricSample(name=name, value=float(value), device=device, vendor_name=vendor))

        def q(what: str, fn: Callable[[], Any]) -> Any:
            return self._query(nv, index, what, fn)

        health = 1.0
        try:
            util = q("utilization", lambda: nv.nvmlDeviceGetUtilizationRates(handle))
            if util is not None:
                add("accelerator_utilization", "nvmlDeviceGetUtilizationRates.gpu", util.gpu)
                add("accelerator_memory_utilization", "nvmlDeviceGetUtilizationRates.memory", util.memory)
            mem = q("memory", lambda: nv.nvmlDeviceGetMemoryInfo(handle))
            if mem is not None:
                add("accelerator_memory_used", "nvmlDeviceGetMemoryInfo.used", mem.used / MIB)
                add("accelerator_memory_total", "nvmlDeviceGetMemoryInfo.total", mem.total / MIB)
            temp = q("temperature", lambda: nv.nvmlDeviceGetTemperature(handle, NVML_TEMPERATURE_GPU))
            add("accelerator_temperature", "nvmlDeviceGetTemperature", temp)
            power = q("power", lambda: nv.nvmlDeviceGetPowerUsage(handle))
            add("accelerator_power", "nvmlDeviceGetPowerUsage", None if power is None else power / 1000.0)
            for name, kind, label in (
                ("ecc_dbe", NVML_MEMORY_ERROR_TYPE_UNCORRECTED, "uncorrected"),
                ("ecc_sbe", NVML_MEMORY_ERROR_TYPE_CORRECTED, "corrected"),
            ):
                count = q(name, functools.partial(nv.nvmlDeviceGetTotalEccErrors, handle, kind, NVML_VOLATILE_ECC))
                add(name, f"nvmlDeviceGetTotalEccErrors.{label}.volatile", count)
            pending = q("retired_pages", lambda: nv.nvmlDeviceGetRetiredPagesPendingStatus(handle))
            add("retired_pages_pending", "nvmlDeviceGetRetiredPagesPendingStatus", pending)
            rows = q("remapped_rows", lambda: nv.nvmlDeviceGetRemappedRows(handle))
            if rows is not None:
                add("row_remap_pending", "nvmlDeviceGetRemappedRows.isPending", rows[2])
                add("row_remap_failure", "nvmlDeviceGetRemappedRows.failureOccurred", rows[3])
            for link in self._links.get(index, []):
                state = q(f"nvlink{link}", functools.partial(nv.nvmlDeviceGetNvLinkState, handle, link))
                add("link_status", f"nvmlDeviceGetNvLinkState[{link}]", state, device=f"{dev}/link{link}")
        except _GpuLost:
            health = 0.0
            log.warning("nvml: GPU %d of %s is lost (fallen off the bus?)", index, self.node)
        add("health", "nvml:gpu_reachable", health)
        add("xid_errors", XID_VENDOR_NAME, self._last_xid.get(index, 0))
        return out

    # -- publishing -------------------------------------------------------------------------------

    async def _publish(self, samples: list[MetricSample], at: float) -> list[Event]:
        if not samples:
            return []
        jobs = self.job_index.jobs_on_node(self.node) if self.job_index is not None else []
        payload = MetricBatch(node=self.node, chip="nvidia", origin="nvml", samples=samples)
        events = fan_out(payload, jobs, producer=self.producer, at=at)
        for event in events:
            await self.bus.publish(Topic.METRICS, event)
        return events

    async def poll_once(self) -> list[Event]:
        """Read every GPU (in a thread) and publish one batch; returns the events published."""
        samples = await asyncio.to_thread(self.read)
        return await self._publish(samples, time.time())

    async def publish_xid(self, index: int, xid: int, at: float) -> list[Event]:
        """Publish one Xid event of GPU `index` (-1: NVML could not name the GPU) at once."""
        self._last_xid[index] = xid
        device = str(index) if index >= 0 else None
        sample = MetricSample(name="xid_errors", value=float(xid), device=device, vendor_name=XID_VENDOR_NAME)
        log.warning("nvml: Xid %d on GPU %d of %s", xid, index, self.node)
        return await self._publish([sample], at)

    # -- the loop ---------------------------------------------------------------------------------

    async def run(self) -> None:
        """Poll every interval and publish Xids as they come, until cancelled."""
        await asyncio.to_thread(self.start)
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[int, int, float]] = asyncio.Queue(maxsize=self.max_pending_xids)
        stop = threading.Event()
        thread = threading.Thread(
            target=self.watch_xids, args=(stop, lambda item: loop.call_soon_threadsafe(self._offer, queue, item))
        )
        thread.daemon = True
        thread.name = f"nvml-xid-{self.node}"
        try:
            await self._poll_logged()  # the xid_errors=0 baseline goes out before any event
            thread.start()
            next_poll = loop.time() + self.interval_s
            while True:
                try:
                    index, xid, at = await asyncio.wait_for(queue.get(), max(0.0, next_poll - loop.time()))
                except TimeoutError:
                    await self._poll_logged()
                    next_poll = loop.time() + self.interval_s
                    continue
                await self.publish_xid(index, xid, at)
        finally:
            stop.set()
            if thread.is_alive():
                await asyncio.to_thread(thread.join, self.xid_wait_ms / 1000 + 2)
            await asyncio.to_thread(self.shutdown)

    async def _poll_logged(self) -> None:
        nvml_error: Any = self._nv.NVMLError if self._nv is not None else ()
        try:
            await self.poll_once()
        except nvml_error as e:
            self.telemetry.watch_errors.labels("nvml", "poll").inc()
            log.warning("nvml: poll failed: %s", e)

    def _offer(self, queue: asyncio.Queue[tuple[int, int, float]], item: tuple[int, int, float]) -> None:
        try:
            queue.put_nowait(item)
        except asyncio.QueueFull:
            self.xid_dropped += 1
            self.telemetry.watch_errors.labels("nvml", "xid_dropped").inc()

    def watch_xids(self, stop: threading.Event, emit: Callable[[tuple[int, int, float]], object]) -> None:
        """The event thread: wait for Xid events until `stop`, emit (gpu index, xid, time) for each."""
        nv = self._nv
        if nv is None:
            raise RuntimeError("NvmlSource.watch_xids() before start()")
        try:
            event_set = nv.nvmlEventSetCreate()
        except nv.NVMLError as e:
            log.warning("nvml: no Xid events on %s (event set: %s); polling only", self.node, e)
            return
        try:
            registered = 0
            for index, handle in enumerate(self._handles):
                try:
                    nv.nvmlDeviceRegisterEvents(handle, EVENT_TYPE_XID_CRITICAL, event_set)
                    registered += 1
                except nv.NVMLError as e:
                    log.warning("nvml: GPU %d gives no Xid events: %s", index, e)
            while registered and not stop.is_set():
                try:
                    data = nv.nvmlEventSetWait(event_set, self.xid_wait_ms)
                except nv.NVMLError as e:
                    if getattr(e, "value", None) == NVML_ERROR_TIMEOUT:
                        continue
                    self.telemetry.watch_errors.labels("nvml", "event_wait").inc()
                    log.warning("nvml: waiting for Xid events failed: %s", e)
                    stop.wait(1.0)
                    continue
                if not int(data.eventType) & EVENT_TYPE_XID_CRITICAL:
                    continue
                try:
                    index = int(nv.nvmlDeviceGetIndex(data.device))
                except nv.NVMLError:
                    index = -1
                emit((index, int(data.eventData), time.time()))
        finally:
            try:
                nv.nvmlEventSetFree(event_set)
            except nv.NVMLError as e:
                log.debug("nvml: freeing the event set: %s", e)


def _probe_links(nv: Any, handle: Any) -> list[int]:
    """The NVLink indices this GPU answers for (none on PCIe-only GPUs)."""
    links: list[int] = []
    for link in range(NVML_NVLINK_MAX_LINKS):
        try:
            nv.nvmlDeviceGetNvLinkState(handle, link)
        except nv.NVMLError as e:
            if getattr(e, "value", None) == NVML_ERROR_NOT_SUPPORTED and not links and link == 0:
                return []  # no NVLink at all: skip the other 35 calls
            continue
        links.append(link)
    return links


def _quiet_shutdown(nv: Any) -> None:
    try:
        nv.nvmlShutdown()
    except nv.NVMLError as e:
        log.debug("nvml: shutdown: %s", e)
