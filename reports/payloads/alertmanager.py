"""Notices as alerts of Alertmanager's API (v2): the latest state of each incident, its labels and
annotations.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from trainmedic.reports.notice import SEVERITY_TEXT, STATUS_TEXT, Notice, clean_text, label
from trainmedic.reports.payloads.chat import _L, _latest_per_incident, _where
from trainmedic.timefmt import rfc3339_ms

# -- Alertmanager -----------------------------------------------------------------------------------

ALERTNAME = "TrainmedicIncident"
# The alert of a notice another sink could not deliver for good (labelled with that sink).
ALERTNAME_SINK_FAILED = "TrainmedicNotificationFailed"
MAX_LABEL_CHARS = 256


def _description(n: Notice, lang: str) -> str:
    colon = ": " if lang == "en" else "："
    parts = [f"{label(STATUS_TEXT, n.status, lang)} ({label(SEVERITY_TEXT, n.severity, lang)})"]
    where = _where(n, lang)
    if where:
        parts.append(where)
    if n.vendor_action or n.action:
        parts.append(f"{_L[lang]['vendor']}{colon}{n.vendor_action or '-'} → {n.action or '-'}")
    blocked = n.text("blocked", lang)
    if blocked:
        parts.append(f"{_L[lang]['blocked']}{colon}{blocked}")
    return "; ".join(parts) if lang == "en" else "；".join(parts)


def alertmanager_alerts(ns: Sequence[Notice], *, generator_url: str | None = None, now: float) -> list[dict[str, Any]]:
    """postableAlerts for Alertmanager's `/api/v2/alerts`: one per incident, its latest state.

    Labels: alertname, incident, fault_class, code, chip, node, namespace, job, severity (only
    those with a value: Alertmanager label values are non-empty strings). `endsAt` (= `now`, never
    before `startsAt`) only when the incident is resolved or rejected.
    """
    alerts: list[dict[str, Any]] = []
    for n in _latest_per_incident(ns):
        raw_labels: dict[str, str | None] = {
            "alertname": ALERTNAME_SINK_FAILED if n.failed_sink else ALERTNAME,
            "incident": n.incident_id,
            "failed_sink": n.failed_sink,
            "fault_class": n.fault_class,
            "code": n.code,
            "chip": n.chip,
            "node": n.node,
            "namespace": n.namespace,
            "job": n.job,
            "severity": n.base_severity,
        }
        labels = {k: clean_text(v, MAX_LABEL_CHARS) for k, v in raw_labels.items() if v}
        labels = {k: v for k, v in labels.items() if v}
        raw_annotations: dict[str, str | None] = {
            "summary": n.text("summary", "en"),
            "summary_zh": n.text("summary", "zh"),
            "description": _description(n, "en"),
            "description_zh": _description(n, "zh"),
            "hint": n.text("hint", "en"),
            "hint_zh": n.text("hint", "zh"),
            "status": n.status,
            "notice_severity": n.severity,
            "report_url": n.report_url,
        }
        alert: dict[str, Any] = {
            "labels": labels,
            "annotations": {k: v for k, v in raw_annotations.items() if v},
            "startsAt": rfc3339_ms(n.time),
        }
        if not n.firing:
            alert["endsAt"] = rfc3339_ms(max(now, n.time))
        url = generator_url or n.report_url
        if url:
            alert["generatorURL"] = url
        alerts.append(alert)
    return alerts
