"""The demo's accelerator metrics: what the nodes' exporters would have scraped, answered as Prometheus.

The demo runs the real metrics watcher (agent/watchers/metrics.py: `PrometheusSource`, its mapping
onto the unified names, its publishing to the bus and its range query for the scene bundle) against
this client instead of an HTTP Prometheus, as it runs the real agent against the Kubernetes emulator.
It answers the two calls the watcher makes (an instant query, a range query) with every series of
every node: the watcher keeps the node a range query is about, as it does with any answer.

Each device reports the series of its vendor's exporter (dcgm-exporter on the GPU nodes, MindCluster
npu-exporter on the NPU nodes, with the `node` label a scrape job's relabelling adds): steady
training values with a small wobble, computed for any time, so a range query has the minutes before
a fault. `fail` changes a device from a time on, the way that fault shows in an exporter:

* `xid`: the GPU fell off the bus: DCGM's last-Xid gauge says 79, nothing else is read from it;
* `oom`: device memory climbs to the total over the minute before, then the process is gone (idle);
* `idle`: the job stopped working on the device (hung, exited): utilisation and power drop to idle;
* `link`: the NPU's RoCE link is down (npu-exporter link and network status 0);
* `lost`: the node is gone: its exporter answers nothing.
"""

from __future__ import annotations

import math
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

FailKind = Literal["xid", "oom", "idle", "link", "lost"]

GPU_SERIES = {
    "DCGM_FI_DEV_GPU_UTIL": ("util", 96.0),
    "DCGM_FI_DEV_FB_USED": ("mem", 61_440.0),
    "DCGM_FI_DEV_FB_TOTAL": ("total", 81_559.0),
    "DCGM_FI_DEV_GPU_TEMP": ("temp", 63.0),
    "DCGM_FI_DEV_POWER_USAGE": ("power", 585.0),
    "DCGM_FI_DEV_XID_ERRORS": ("xid", 0.0),
}
NPU_SERIES = {
    "npu_chip_info_utilization": ("util", 92.0),
    "npu_chip_info_hbm_used_memory": ("mem", 49_152.0),
    "npu_chip_info_hbm_total_memory": ("total", 65_536.0),
    "npu_chip_info_temperature": ("temp", 58.0),
    "npu_chip_info_power": ("power", 310.0),
    "npu_chip_info_health_status": ("health", 1.0),
    "npu_chip_info_link_status": ("link", 1.0),
    "npu_chip_info_network_status": ("link", 1.0),
}
IDLE = {"util": 0.0, "power": 75.0}
OOM_RAMP_S = 60.0


@dataclass(frozen=True)
class _Fault:
    kind: FailKind
    at: float


class DemoMetrics:
    """A `PromClient` (agent/watchers/metrics.py) over the demo's simulated exporters."""

    def __init__(
        self,
        gpu_nodes: Iterable[str],
        npu_nodes: Iterable[str] = (),
        *,
        devices: int = 8,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.clock = clock
        self._devices = [str(d) for d in range(devices)]
        self._nodes: dict[str, Mapping[str, tuple[str, float]]] = {n: GPU_SERIES for n in gpu_nodes}
        self._nodes.update({n: NPU_SERIES for n in npu_nodes})
        self._labels = {n: ("gpu" if series is GPU_SERIES else "id") for n, series in self._nodes.items()}
        self._faults: dict[tuple[str, str], _Fault] = {}
        self._lock = threading.Lock()  # the watcher calls from worker threads

    def fail(self, node: str, kind: FailKind, *, at: float, devices: Iterable[str] | None = None) -> None:
        """From `at` on, the devices (all of the node's when None) show `kind`."""
        with self._lock:
            for d in self._devices if devices is None else devices:
                self._faults[(node, str(d))] = _Fault(kind, at)

    def resume(self, node: str) -> None:
        """The job trains on the node again: its devices that only went idle are busy again."""
        with self._lock:
            for key in [k for k, f in self._faults.items() if k[0] == node and f.kind == "idle"]:
                del self._faults[key]

    # -- the two calls of the watcher -----------------------------------------------------------------

    def custom_query(self, query: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        now = self.clock()
        out = []
        for labels, value in self._samples(now):
            out.append({"metric": labels, "value": [now, _text(value)]})
        return out

    def custom_query_range(
        self, query: str, start_time: datetime, end_time: datetime, step: str, params: dict[str, Any] | None = None
    ) -> list[dict[str, Any]]:
        start, end, every = start_time.timestamp(), min(end_time.timestamp(), self.clock()), float(step)
        if every <= 0:
            raise ValueError(f"step must be > 0, got {step!r}")
        times = [start + k * every for k in range(int((end - start) // every) + 1)]
        series: dict[tuple[tuple[str, str], ...], dict[str, Any]] = {}
        for t in times:
            for labels, value in self._samples(t):
                key = tuple(sorted(labels.items()))
                entry = series.setdefault(key, {"metric": labels, "values": []})
                entry["values"].append([t, _text(value)])
        return list(series.values())

    def close(self) -> None:
        return None

    def values_at(self, node: str, at: float) -> dict[str, float]:
        """One node's values at `at` by "name{device}" (what a scrape then would read)."""
        out: dict[str, float] = {}
        for labels, value in self._samples(at):
            if labels["node"] == node:
                out[f"{labels['__name__']}{{{labels.get('gpu') or labels.get('id') or ''}}}"] = value
        return out

    # -- the values -------------------------------------------------------------------------------------

    def _samples(self, t: float) -> Iterable[tuple[dict[str, str], float]]:
        with self._lock:
            faults = dict(self._faults)
        for node, series in self._nodes.items():
            total = next(base for what, base in series.values() if what == "total")
            for device in self._devices:
                fault = faults.get((node, device))
                if fault is not None and t < fault.at - _lead(fault):
                    fault = None
                for name, (what, base) in series.items():
                    value = _value(node, device, what, base, total, t, fault)
                    if value is not None:
                        yield {"__name__": name, "node": node, self._labels[node]: device}, value


def _lead(fault: _Fault) -> float:
    """How long before its time a fault shows: device memory fills before an OOM."""
    return OOM_RAMP_S if fault.kind == "oom" else 0.0


def _value(
    node: str, device: str, what: str, base: float, total: float, t: float, fault: _Fault | None
) -> float | None:
    wobble = _wobble(node, device, what, t)
    healthy = base if what in ("total", "xid", "health", "link") else base + wobble
    if fault is None:
        return healthy
    kind, after = fault.kind, t >= fault.at
    if kind == "lost" and after:
        return None
    if kind == "xid":
        return 79.0 if what == "xid" else None
    if kind == "oom":
        if not after:
            if what == "mem":
                return base + (total - base) * (1.0 - (fault.at - t) / OOM_RAMP_S)
            return healthy
        return IDLE.get(what, healthy if what != "mem" else base * 0.02)
    if kind == "idle" and after:
        return IDLE.get(what, healthy)
    if kind == "link" and after:
        if what == "link":
            return 0.0
        return IDLE.get(what, healthy)
    return healthy


def _wobble(node: str, device: str, what: str, t: float) -> float:
    """A deterministic few-percent wobble (a training step's rhythm), different on each series."""
    phase = (zlib.crc32(f"{node}/{device}/{what}".encode()) % 1000) / 1000 * 2 * math.pi
    return math.sin(t / 37.0 + phase) * 2.5 + math.sin(t / 7.0 + 2 * phase) * 1.2


def _text(value: float) -> str:
    return f"{value:.6g}"
