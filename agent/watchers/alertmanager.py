"""Alertmanager webhook notifications -> input events (received by the API: POST /api/v1/alertmanager).

Alertmanager notifications become the input events the brain already understands: each firing alert
is a `K8sEvent` (object kind `Alert`, reason = alertname, message = summary plus the key labels), and
an alert that names a device metric of udal's vocabulary (an Xid code from dcgm-exporter's `xid` /
`err_code` labels, or explicit `trainmedic_metric` / `trainmedic_value` labels) is also a
`MetricBatch`. The metric rules fire on edges (a first sample is a baseline); an alert *is* an edge
(Alertmanager notifies on the transition), so it is sent as the pair (healthy value, alerting value).
Event ids derive from the alert's fingerprint and start time: Alertmanager re-sends a group whenever
it changes, and the brain de-duplicates by id. Resolved alerts are counted and dropped (the fault they
report is history), and trainmedic's own incident alerts (alertname `Trainmedic...`) are ignored, so a
route that sends them back here cannot make a loop.

The API's route (agent/api/app.py) validates the payload (`AlertmanagerWebhook`), converts it here
(`alert_events`), keys the events by job (`attach_jobs`, in the agent's ingest) and hands them on to
their topics (`topic_of`); it answers 5xx when the events cannot be handed on, so Alertmanager retries.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from trainmedic.agent.jobindex import JobIndex
from trainmedic.agent.watchers.metrics import device_of, node_of
from trainmedic.detectors.metric_rules import RULES_BY_METRIC, Kind
from trainmedic.events import Event, K8sEvent, MetricBatch, MetricSample, Topic, event_key
from trainmedic.models import Chip
from trainmedic.udal import METRIC_VOCABULARY
from trainmedic.udal.registry import is_chip, plugin_of_exporter_labels

MAX_ALERTS = 1000
# Alerts trainmedic itself pushes (alertname TrainmedicIncident, ...) are never input.
OWN_ALERT_PREFIX = "Trainmedic"
# Labels that carry the alert's place and identity, copied into the event message.
KEY_LABELS = (
    "severity",
    "namespace",
    "pod",
    "container",
    "node",
    "instance",
    "Hostname",
    "gpu",
    "device",
    "UUID",
    "modelName",
    "xid",
    "err_code",
    "err_msg",
)


class AlertIn(BaseModel):
    """One alert of an Alertmanager notification."""

    model_config = ConfigDict(extra="ignore", strict=True)

    status: Literal["firing", "resolved"]
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    startsAt: str = ""
    endsAt: str = ""
    generatorURL: str = ""
    fingerprint: str = ""


class AlertmanagerWebhook(BaseModel):
    """Alertmanager's webhook notification, payload version 4 (prometheus.io, webhook_config)."""

    model_config = ConfigDict(extra="ignore", strict=True)

    version: Literal["4"]
    groupKey: str = ""
    truncatedAlerts: int = 0
    status: Literal["firing", "resolved"]
    receiver: str = ""
    groupLabels: dict[str, str] = Field(default_factory=dict)
    commonLabels: dict[str, str] = Field(default_factory=dict)
    commonAnnotations: dict[str, str] = Field(default_factory=dict)
    externalURL: str = ""
    alerts: list[AlertIn] = Field(max_length=MAX_ALERTS)


def _alert_identity(alert: AlertIn) -> str:
    ident = alert.fingerprint or json.dumps(alert.labels, sort_keys=True)
    return f"{ident}@{alert.startsAt}"


def _event_id(identity: str, kind: str) -> str:
    return hashlib.sha256(f"alertmanager\x00{identity}\x00{kind}".encode()).hexdigest()[:32]


def _alert_message(alert: AlertIn, common: Mapping[str, str]) -> str:
    ann = {**common, **alert.annotations}
    text = ann.get("summary") or ann.get("description") or ann.get("message") or ""
    if ann.get("description") and ann.get("description") != text:
        text = f"{text} - {ann['description']}" if text else ann["description"]
    keys = " ".join(f"{k}={alert.labels[k]}" for k in KEY_LABELS if alert.labels.get(k))
    return " ".join(p for p in (text.strip(), f"[{keys}]" if keys else "") if p)


def _number(raw: str | None) -> float | None:
    if raw is None:
        return None
    try:
        value = float(raw.strip())
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _chip(labels: Mapping[str, str], has_xid: bool) -> str:
    """The alert's `chip` label when it names a chip plugin; else an Xid (dcgm-exporter) is NVIDIA's;
    else the plugin whose exporter's labels these are (`exporter_labels_match`); else generic."""
    chip = labels.get("chip", "").lower()
    if is_chip(chip):
        return chip
    if has_xid:
        return Chip.NVIDIA.value
    plugin = plugin_of_exporter_labels(labels)
    return plugin.chip.value if plugin is not None else Chip.GENERIC.value


def _xid(alert: AlertIn) -> int | None:
    """The Xid an alert reports: dcgm-exporter's `xid` label (DCGM_EXP_XID_ERRORS_COUNT), or its
    `err_code` label (DCGM_FI_DEV_XID_ERRORS) on an alert about Xids or an NVIDIA GPU."""
    labels = alert.labels
    raw = labels.get("xid") or labels.get("xid_code")
    if raw is None and labels.get("err_code"):
        name = labels.get("alertname", "").lower()
        if "xid" in name or "err_msg" in labels or labels.get("UUID", "").startswith("GPU-"):
            raw = labels["err_code"]
    value = _number(raw)
    if value is None or value <= 0 or not value.is_integer():
        return None
    return int(value)


def _baseline(metric: str, value: float) -> float | None:
    """The healthy value before the alerting one, for the metric rule that watches `metric`."""
    rule = RULES_BY_METRIC.get(metric)
    if rule is None:
        return None
    if rule.kind is Kind.DOWN:
        return 1.0
    if rule.kind is Kind.RISING:
        return value - 1.0
    return 0.0


def _metric_batch(alert: AlertIn, node: str) -> MetricBatch | None:
    labels = alert.labels
    xid = _xid(alert)
    if xid is not None:
        metric, value = "xid_errors", float(xid)
    else:
        metric = labels.get("trainmedic_metric", "")
        raw = _number(labels.get("trainmedic_value") or alert.annotations.get("value"))
        if metric not in METRIC_VOCABULARY or raw is None:
            return None
        value = raw
    device = device_of(labels)
    samples = []
    baseline = _baseline(metric, value)
    if baseline is not None and baseline != value:
        samples.append(MetricSample(name=metric, value=baseline, device=device, vendor_name="alertmanager"))
    samples.append(MetricSample(name=metric, value=value, device=device, vendor_name="alertmanager"))
    return MetricBatch(node=node, chip=_chip(labels, xid is not None), origin="alertmanager", samples=samples)


@dataclass
class AlertConversion:
    events: list[Event] = field(default_factory=list)
    firing: int = 0
    resolved: int = 0
    duplicates: int = 0
    own: int = 0
    # Identities of the firing alerts converted (remembered once the events were handed on).
    identities: list[str] = field(default_factory=list)


def alert_events(
    payload: AlertmanagerWebhook,
    *,
    producer: str = "api",
    now: float | None = None,
    seen: Callable[[str], bool] | None = None,
) -> AlertConversion:
    """The input events for the firing alerts of one notification (see the module docstring)."""
    at = time.time() if now is None else now
    out = AlertConversion()
    for alert in payload.alerts:
        if alert.status != "firing":
            out.resolved += 1
            continue
        out.firing += 1
        labels = alert.labels
        alertname = labels.get("alertname") or payload.commonLabels.get("alertname") or "Alert"
        if alertname.startswith(OWN_ALERT_PREFIX):
            # trainmedic's own incident alerts (its `alertmanager` sink) routed back here: not new input.
            out.own += 1
            continue
        identity = _alert_identity(alert)
        if seen is not None and seen(identity):
            out.duplicates += 1
            continue
        out.identities.append(identity)
        node = node_of(labels)
        k8s = K8sEvent(
            namespace=labels.get("namespace") or None,
            type="Warning",
            reason=alertname,
            message=_alert_message(alert, payload.commonAnnotations),
            object_kind="Alert",
            object_name=labels.get("pod") or node or alertname,
            node=node,
            uid=alert.fingerprint or None,
        )
        out.events.append(
            Event(id=_event_id(identity, "k8s"), time=at, producer=producer, key=event_key(k8s), payload=k8s)
        )
        if node is not None:
            batch = _metric_batch(alert, node)
            if batch is not None:
                out.events.append(
                    Event(
                        id=_event_id(identity, "metric"),
                        time=at,
                        producer=producer,
                        key=event_key(batch),
                        payload=batch,
                    )
                )
    return out


def topic_of(event: Event) -> Topic:
    """The input topic an alert event goes to."""
    return Topic.METRICS if isinstance(event.payload, MetricBatch) else Topic.K8S


def attach_jobs(events: Sequence[Event], job_index: JobIndex) -> list[Event]:
    """Key alert events by job where the agent knows it, as the watchers do: an alert about a pod
    belongs to the pod's job; a node's metric batch is copied to every job on the node (same id)."""
    out: list[Event] = []
    for event in events:
        p = event.payload
        if isinstance(p, K8sEvent) and p.namespace and p.object_name:
            info = job_index.pod(p.namespace, p.object_name)
            if info is not None and info.job is not None:
                job = info.job
                out.append(event.model_copy(update={"key": job.key, "payload": p.model_copy(update={"job": job})}))
                continue
        if isinstance(p, MetricBatch):
            jobs = job_index.jobs_on_node(p.node)
            if jobs:
                out.extend(
                    event.model_copy(update={"key": j.key, "payload": p.model_copy(update={"job": j})}) for j in jobs
                )
                continue
        out.append(event)
    return out
