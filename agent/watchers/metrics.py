"""Accelerator metrics from the cluster's Prometheus, published per node in the unified vocabulary.

Clusters already scrape the vendors' exporters (NVIDIA dcgm-exporter, Ascend npu-exporter, Cambricon
mlu-exporter). Reading them back from Prometheus gives the cluster role every node's devices from one
place, with no privileges on the nodes. Each poll (every `interval_s`, 15 s by default) is ONE instant
query, `{__name__=~"<every vendor name of every chip plugin>"}`; each series is mapped by its chip
plugin (udal) onto the unified names and grouped by node and device:

* node: the first non-empty of the labels `node`, `kubernetes_node`, `nodeName`, `node_name`,
  `Hostname`, `hostname` (mlu-exporter sets `node`, dcgm-exporter `Hostname`, Kubernetes service
  discovery relabelling usually `node` or `kubernetes_node`; npu-exporter sets none), else the host
  part of `instance`. Relabel the scrape job to add `node` where the exporter has no node label.
* device: the chip plugin's device-index labels (`exporter_device_labels`: dcgm-exporter `gpu`,
  npu-exporter `id`, mlu-exporter `mlu`), else `minor_number`, else the identity labels `UUID` /
  `uuid` / `vdie_id`; a series with a `link` label is device `<device>/link<N>`.

One `MetricBatch` per (node, chip) goes to `trainmedic.metrics`: once per training job on that node
(JobIndex.jobs_on_node), keyed by the job and with the same event id on every copy, or keyed by the
node when no job runs there. DCGM "blank" sentinels (>= 0x7ffffffffffffff0) and NaN are dropped.

Failures (Prometheus unreachable, timeouts, HTTP 4xx/5xx, a body that is not the API's JSON) are
logged, counted in `trainmedic_watch_errors{source="prometheus", kind=...}` and retried with
exponential backoff and jitter; the loop never dies of them and stops promptly when cancelled.

`range_query` returns a node's series over a window (the scene bundle keeps the minutes before a
fault as evidence).
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import re
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from trainmedic.agent.bus.base import Bus
from trainmedic.agent.jobindex import JobIndex
from trainmedic.agent.telemetry import Telemetry
from trainmedic.agent.urlsafe import redact_urls, safe_url
from trainmedic.backoff import backoff_delay
from trainmedic.errors import TemporaryError
from trainmedic.events import Event, JobRef, MetricBatch, MetricSample, Topic, make_event
from trainmedic.models import Chip
from trainmedic.udal.base import ChipPlugin
from trainmedic.udal.registry import exporter_device_labels, load_plugins

log = logging.getLogger("trainmedic.watchers.metrics")

NODE_LABELS: tuple[str, ...] = ("node", "kubernetes_node", "nodeName", "node_name", "Hostname", "hostname")
# After the chip plugins' own device-index labels: chip-neutral and identity labels.
FALLBACK_DEVICE_LABELS: tuple[str, ...] = ("minor_number", "UUID", "uuid", "vdie_id")
LINK_LABELS: tuple[str, ...] = ("link",)
# DCGM marks "no value" with blank sentinels near the int64 maximum (DCGM_INT64_BLANK and above).
DCGM_BLANK = float(0x7FFFFFFFFFFFFFF0)
# Prometheus refuses range queries of more than 11,000 points per series.
MAX_RANGE_POINTS = 11_000

_METRIC_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_STATUS = re.compile(r"HTTP Status Code (\d{3})")


class PrometheusQueryError(TemporaryError):
    """A query that did not give a usable answer; temporary, retried after `kind`-counted backoff
    (no `delay` of its own: the source's backoff decides).

    kind: unreachable | timeout | http_4xx | http_5xx | bad_response
    """

    def __init__(self, kind: str, reason: str) -> None:
        super().__init__(f"{kind}: {reason}")
        self.kind = kind
        self.reason = reason


class PromClient(Protocol):
    """The part of prometheus_api_client.PrometheusConnect this source uses (blocking calls)."""

    def custom_query(self, query: str, params: dict[str, Any] | None = None) -> Any: ...

    def custom_query_range(
        self, query: str, start_time: datetime, end_time: datetime, step: str, params: dict[str, Any] | None = None
    ) -> Any: ...


def default_client(url: str, timeout_s: float) -> PromClient:
    """A PrometheusConnect without its own retries (this source backs off itself)."""
    from prometheus_api_client import PrometheusConnect
    from urllib3.util import Retry

    client: PromClient = PrometheusConnect(url=url, retry=Retry(total=0, redirect=2), timeout=timeout_s)
    return client


@dataclass(frozen=True, slots=True)
class Series:
    """One vendor series mapped onto the unified vocabulary."""

    chip: str
    node: str
    device: str | None
    name: str
    vendor_name: str
    value: float


def node_of(labels: Mapping[str, str], node_labels: Sequence[str] = NODE_LABELS) -> str | None:
    """The node a series belongs to: a node label, else the host part of `instance`."""
    for key in node_labels:
        value = labels.get(key)
        if value:
            return value
    instance = labels.get("instance", "")
    if not instance:
        return None
    if instance.startswith("["):  # [::1]:9400
        return instance[1:].split("]", 1)[0] or None
    host, sep, port = instance.rpartition(":")
    return (host if sep and port.isdigit() else instance) or None


def default_device_labels(plugin: ChipPlugin | None = None) -> tuple[str, ...]:
    """The labels naming a series' device, first found wins: the plugin's device-index labels (every
    plugin's when none is given), then FALLBACK_DEVICE_LABELS."""
    own = plugin.exporter_device_labels if plugin is not None else exporter_device_labels()
    return tuple(dict.fromkeys((*own, *FALLBACK_DEVICE_LABELS)))


def device_of(labels: Mapping[str, str], device_labels: Sequence[str] | None = None) -> str | None:
    if device_labels is None:
        device_labels = default_device_labels()
    device = next((labels[k] for k in device_labels if labels.get(k)), None)
    link = next((labels[k] for k in LINK_LABELS if labels.get(k)), None)
    if link is not None:
        return f"{device if device is not None else ''}/link{link}"
    return device


def usable_value(value: float) -> bool:
    return math.isfinite(value) and abs(value) < DCGM_BLANK


def _promql_string(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def fan_out(payload: MetricBatch, jobs: Sequence[JobRef], *, producer: str, at: float) -> list[Event]:
    """The events for one node-level batch: one per job on the node (same id), else one per node."""
    event = make_event(payload, producer=producer, at=at)
    if not jobs:
        return [event]
    return [
        event.model_copy(update={"key": job.key, "payload": payload.model_copy(update={"job": job})}) for job in jobs
    ]


def chunked(samples: Sequence[MetricSample], size: int) -> Iterator[list[MetricSample]]:
    for i in range(0, len(samples), max(1, size)):
        yield list(samples[i : i + max(1, size)])


class PrometheusSource:
    """Polls Prometheus for the vendors' device metrics and publishes them per node.

    `plugins` defaults to every chip (every loaded plugin whose chip is not generic: nvidia, ascend,
    cambricon and any installed one); pass the fake plugin in tests. `device_labels` defaults to
    each series' plugin's (`default_device_labels`). `client` defaults to a PrometheusConnect on
    `url`; its calls block and run in a thread.
    """

    def __init__(
        self,
        url: str,
        *,
        bus: Bus,
        job_index: JobIndex | None = None,
        telemetry: Telemetry | None = None,
        producer: str = "",
        interval_s: float = 15.0,
        plugins: Sequence[ChipPlugin] | None = None,
        client: PromClient | None = None,
        timeout_s: float = 10.0,
        backoff_base_s: float = 1.0,
        max_backoff_s: float = 60.0,
        node_labels: Sequence[str] = NODE_LABELS,
        device_labels: Sequence[str] | None = None,
        max_series: int = 200_000,
        max_samples_per_batch: int = 2_000,
        rng: random.Random | None = None,
    ) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s}")
        self.url = url
        # What logs and errors show: metrics.prometheus_url is where Prometheus credentials go
        # (user:password@, a token in the query), and no log line may print them.
        self.safe_url = safe_url(url)
        self.bus = bus
        self.job_index = job_index
        self.telemetry = telemetry or Telemetry()
        self.producer = producer
        self.interval_s = interval_s
        self.backoff_base_s = backoff_base_s
        self.max_backoff_s = max_backoff_s
        self.node_labels = tuple(node_labels)
        self.device_labels = tuple(device_labels) if device_labels is not None else None
        self.max_series = max_series
        self.max_samples_per_batch = max_samples_per_batch
        self.failures = 0
        self._rng = rng or random.Random()  # noqa: S311 - backoff jitter, not cryptography
        chosen = (
            list(plugins) if plugins is not None else [p for p in load_plugins().values() if p.chip != Chip.GENERIC]
        )
        self._by_vendor: dict[str, tuple[ChipPlugin, str]] = {}
        for plugin in chosen:
            for vendor, unified in plugin.metric_names.items():
                if not _METRIC_NAME.match(vendor):
                    raise ValueError(f"plugin {plugin.name}: {vendor!r} is not a Prometheus metric name")
                other = self._by_vendor.get(vendor)
                if other is not None and other[0].name != plugin.name:
                    raise ValueError(f"metric {vendor} is claimed by plugins {other[0].name} and {plugin.name}")
                self._by_vendor[vendor] = (plugin, unified)
        if not self._by_vendor:
            raise ValueError("no chip plugin maps any metric: nothing to query")
        self._device_labels = {p.name: default_device_labels(p) for p in chosen}
        self._regex = "|".join(sorted(self._by_vendor))
        self._client = client if client is not None else default_client(url, timeout_s)

    @property
    def query(self) -> str:
        """The instant query of one poll."""
        return f'{{__name__=~"{self._regex}"}}'

    # -- the loop ---------------------------------------------------------------------------------

    async def run(self) -> None:
        """Poll until cancelled; failures back off (exponential, jittered) and never end the loop."""
        while True:
            try:
                await self.poll_once()
            except PrometheusQueryError as e:
                self.failures += 1
                delay = self.backoff(self.failures)
                log.warning(
                    "prometheus %s: %s (failure %d in a row, retrying in %.1fs)",
                    self.safe_url,
                    e,
                    self.failures,
                    delay,
                )
                await asyncio.sleep(delay)
                continue
            if self.failures:
                log.info("prometheus %s answers again after %d failed polls", self.safe_url, self.failures)
            self.failures = 0
            await asyncio.sleep(self.interval_s)

    def backoff(self, failures: int) -> float:
        """The delay after `failures` consecutive failures: base * 2^(n-1), capped, times U(0.5, 1)."""
        return backoff_delay(
            failures - 1, base=self.backoff_base_s, cap=self.max_backoff_s, jitter=(0.5, 1.0), rng=self._rng
        )

    async def poll_once(self) -> list[Event]:
        """One query, mapped and published; returns the events published."""
        result = await self._call("query", self._client.custom_query, self.query)
        at = time.time()
        series = self.parse_vector(result)
        events: list[Event] = []
        for (node, chip), samples in self.group(series).items():
            jobs = self.job_index.jobs_on_node(node) if self.job_index is not None else []
            for chunk in chunked(samples, self.max_samples_per_batch):
                payload = MetricBatch(node=node, chip=chip, origin="prometheus", samples=chunk)
                for event in fan_out(payload, jobs, producer=self.producer, at=at):
                    await self.bus.publish(Topic.METRICS, event)
                    events.append(event)
        return events

    # -- mapping ----------------------------------------------------------------------------------

    def _map(self, labels: Mapping[str, str]) -> tuple[ChipPlugin, str, str, str | None] | None:
        vendor = labels.get("__name__", "")
        hit = self._by_vendor.get(vendor)
        if hit is None:
            return None
        node = node_of(labels, self.node_labels)
        if node is None:
            return None
        return hit[0], hit[1], node, device_of(labels, self.device_labels or self._device_labels[hit[0].name])

    def _not_a_list(self, result: object) -> PrometheusQueryError:
        self._count("bad_response")
        return PrometheusQueryError("bad_response", f"data.result is {type(result).__name__}, not a list")

    def parse_vector(self, result: object) -> list[Series]:
        """The usable series of an instant-query result; malformed items are counted and skipped."""
        if not isinstance(result, list):
            raise self._not_a_list(result)
        if len(result) > self.max_series:
            log.warning("prometheus returned %d series; reading the first %d", len(result), self.max_series)
            self._count("too_many_series")
            result = result[: self.max_series]
        out: list[Series] = []
        bad = 0
        for item in result:
            try:
                labels = _labels(item["metric"])
                _, raw = item["value"]
                value = float(raw)
            except (KeyError, TypeError, ValueError):
                bad += 1
                continue
            mapped = self._map(labels)
            if mapped is None or not usable_value(value):
                continue
            plugin, unified, node, device = mapped
            out.append(Series(plugin.name, node, device, unified, labels["__name__"], value))
        if bad:
            self._count("bad_series", bad)
            log.warning("prometheus: %d malformed series skipped", bad)
        return out

    @staticmethod
    def group(series: Iterable[Series]) -> dict[tuple[str, str], list[MetricSample]]:
        """Samples by (node, chip), sorted by device and name; one sample per (name, device)."""
        groups: dict[tuple[str, str], dict[tuple[str, str | None], MetricSample]] = {}
        for s in series:
            bucket = groups.setdefault((s.node, s.chip), {})
            # MIG instances and duplicate scrape jobs repeat a (name, device): keep the first.
            bucket.setdefault(
                (s.name, s.device), MetricSample(name=s.name, value=s.value, device=s.device, vendor_name=s.vendor_name)
            )
        return {
            key: [bucket[k] for k in sorted(bucket, key=lambda k: (k[1] or "", k[0]))] for key, bucket in groups.items()
        }

    # -- range query (scene bundle) ---------------------------------------------------------------

    async def range_query(
        self, node: str, start: float, end: float, step: float
    ) -> dict[str, list[tuple[float, float]]]:
        """A node's device series over [start, end], keyed "name{device}" (unified names), oldest first.

        The step grows when the window would exceed Prometheus' 11,000 points per series. Raises
        PrometheusQueryError (counted) when Prometheus does not answer usably.
        """
        if end < start:
            raise ValueError(f"end {end} is before start {start}")
        step = max(step, (end - start) / MAX_RANGE_POINTS, 0.001)
        name = f'__name__=~"{self._regex}"'
        parts = [f"{{{name},{label}={_promql_string(node)}}}" for label in self.node_labels]
        parts.append(f"{{{name},instance=~{_promql_string(re.escape(node) + '(:[0-9]+)?')}}}")
        query = " or ".join(parts)
        result = await self._call(
            "range",
            self._client.custom_query_range,
            query,
            # The client rounds to whole seconds: widen outwards so the last scrape is inside.
            datetime.fromtimestamp(math.floor(start), tz=UTC),
            datetime.fromtimestamp(math.ceil(end), tz=UTC),
            f"{step:g}",
        )
        if not isinstance(result, list):
            raise self._not_a_list(result)
        out: dict[str, list[tuple[float, float]]] = {}
        for item in result:
            try:
                labels = _labels(item["metric"])
                values = [(float(t), float(v)) for t, v in item["values"]]
            except (KeyError, TypeError, ValueError):
                self._count("bad_series")
                continue
            mapped = self._map(labels)
            if mapped is None or mapped[2] != node:
                continue
            _, unified, _, device = mapped
            points = out.setdefault(f"{unified}{{{device or ''}}}", [])
            points.extend((t, v) for t, v in values if usable_value(v))
        for points in out.values():
            points.sort()
        return {k: v for k, v in out.items() if v}

    # -- plumbing ---------------------------------------------------------------------------------

    async def _call(self, what: str, fn: Any, *args: Any) -> Any:
        """Run a blocking client call in a thread; every failure becomes a counted PrometheusQueryError."""
        import requests
        from prometheus_api_client.exceptions import PrometheusApiClientException

        try:
            return await asyncio.to_thread(fn, *args)
        except requests.exceptions.JSONDecodeError as e:
            # Not JSON: a proxy's error page, a wrong URL, binary garbage.
            error = PrometheusQueryError("bad_response", f"{what} query: the answer is not JSON ({_short(e)})")
        except requests.exceptions.Timeout as e:
            error = PrometheusQueryError("timeout", f"{what} query timed out: {_short(e)}")
        except requests.exceptions.ConnectionError as e:
            error = PrometheusQueryError("unreachable", f"cannot connect to {self.safe_url}: {_short(e)}")
        except requests.exceptions.RequestException as e:
            error = PrometheusQueryError("unreachable", f"{what} query failed: {_short(e)}")
        except PrometheusApiClientException as e:
            status = _STATUS.search(str(e))
            code = int(status.group(1)) if status else 0
            kind = "http_5xx" if code >= 500 else "http_4xx" if code >= 400 else "bad_response"
            error = PrometheusQueryError(kind, f"{what} query answered {_short(e)}")
        except (KeyError, TypeError, ValueError) as e:
            # JSON, but without data.result.
            error = PrometheusQueryError("bad_response", f"{what} query: not a Prometheus API answer ({_short(e)})")
        self._count(error.kind)
        raise error

    def _count(self, kind: str, n: int = 1) -> None:
        self.telemetry.watch_errors.labels("prometheus", kind).inc(n)

    def close(self) -> None:
        close = getattr(self._client, "close", None)
        if callable(close):
            close()


def _labels(raw: object) -> dict[str, str]:
    if not isinstance(raw, dict):
        raise TypeError("metric labels are not an object")
    return {str(k): str(v) for k, v in raw.items()}


def _short(e: BaseException, limit: int = 300) -> str:
    """An exception's text for a log line: one line, bounded, its URLs made safe."""
    text = redact_urls(str(e).replace("\n", " "))
    return text if len(text) <= limit else text[:limit] + "..."
