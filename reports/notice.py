"""One notification-worthy state of one incident, in the words every sink shares.

The responder publishes an `IncidentEvent` after each step (scene saved, planned, acted, resolved).
The ops integration turns each into a `Notice`: a flat, JSON-ready, immutable record that the
durable outbox can store and replay, and that every payload builder (reports/payloads.py) reads.
Building it is pure: no clock, no I/O, so a notice rebuilt from the outbox after a restart is the
same notice, with the same `dedup_key`.

Severity (`Notice.severity`) says how soon a person should look, from the status first and the
fault class second:

============================================  ==========  ====================================
status                                        severity    why
============================================  ==========  ====================================
resolved, rejected                            info        nothing left to do (fixed, or a
                                                          person has already decided)
blocked, failed, awaiting_approval            critical    the agent cannot go on alone
open, acting, observed (and unknown ones)     by class    see below
============================================  ==========  ====================================

by fault class: device_error, hang, comm_init, comm_error -> critical (the job is down or stuck
and a node or fabric may be bad); accelerator_oom, host_oom -> warning (the job's own sizing; the
hardware is fine). A root cause with no known class falls back to the rule's own severity
(critical/error -> critical, warning -> warning, info -> info); no root cause at all -> warning.

`fault_severity` is the class part alone. It does not move while an incident goes from open to
resolved, which is what a label that identifies an alert (Alertmanager's `severity`) needs.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from trainmedic.events import Event, IncidentEvent
from trainmedic.models import I18nText, RootCause

SEVERITIES = ("critical", "warning", "info")
SEVERITY_RANK = {"info": 0, "warning": 1, "critical": 2}

# Statuses after which the alert is over (Alertmanager endsAt; chat colour green).
NOT_FIRING = frozenset({"resolved", "rejected"})
# Statuses where a person must act now, whatever the fault.
NEEDS_PERSON = frozenset({"blocked", "failed", "awaiting_approval"})

FAULT_SEVERITY = {
    "device_error": "critical",
    "hang": "critical",
    "comm_init": "critical",
    "comm_error": "critical",
    "accelerator_oom": "warning",
    "host_oom": "warning",
    "node_failure": "critical",
    "process_killed": "warning",
    "storage_error": "warning",
    "app_error": "warning",
    "unknown": "warning",
}
_RULE_SEVERITY = {"critical": "critical", "error": "critical", "warning": "warning", "info": "info"}

# Longest text taken from one incident field (summary, hint, an action's result). Root-cause
# texts are log-derived and can be anything; chat messages have hard size limits.
MAX_FIELD_CHARS = 2000

STATUS_TEXT: dict[str, dict[str, str]] = {
    "open": {"en": "Detected", "zh": "已发现"},
    "observed": {"en": "Observed, nothing changed", "zh": "仅观察，未做变更"},
    "awaiting_approval": {"en": "Awaiting approval", "zh": "等待审批"},
    "rejected": {"en": "Remediation rejected", "zh": "处置已被拒绝"},
    "acting": {"en": "Remediating", "zh": "正在处置"},
    "resolved": {"en": "Resolved", "zh": "已恢复"},
    "blocked": {"en": "Blocked: a person must act", "zh": "已阻止，需要人工处理"},
    "failed": {"en": "Remediation failed", "zh": "处置失败"},
}
SEVERITY_TEXT: dict[str, dict[str, str]] = {
    "critical": {"en": "CRITICAL", "zh": "严重"},
    "warning": {"en": "WARNING", "zh": "警告"},
    "info": {"en": "INFO", "zh": "通知"},
}
FAULT_TEXT: dict[str, dict[str, str]] = {
    "accelerator_oom": {"en": "accelerator out of memory", "zh": "加速卡显存不足"},
    "host_oom": {"en": "host out of memory", "zh": "主机内存不足"},
    "device_error": {"en": "accelerator device error", "zh": "加速卡设备故障"},
    "comm_init": {"en": "collective communication init failed", "zh": "集合通信初始化失败"},
    "comm_error": {"en": "collective communication error", "zh": "集合通信错误"},
    "hang": {"en": "training hang", "zh": "训练挂起"},
    "node_failure": {"en": "node lost or unhealthy", "zh": "节点失联或异常"},
    "process_killed": {"en": "training process killed", "zh": "训练进程被终止"},
    "storage_error": {"en": "storage error", "zh": "存储故障"},
    "app_error": {"en": "training program error", "zh": "训练程序错误"},
    "unknown": {"en": "training interrupted, cause unknown", "zh": "训练中断，原因未知"},
}
ACTION_STATE_TEXT: dict[str, dict[str, str]] = {
    "planned": {"en": "planned", "zh": "待执行"},
    "running": {"en": "running", "zh": "执行中"},
    "deleting": {"en": "deleting", "zh": "删除中"},
    "creating": {"en": "creating", "zh": "创建中"},
    "done": {"en": "done", "zh": "完成"},
    "skipped": {"en": "skipped", "zh": "跳过"},
    "failed": {"en": "failed", "zh": "失败"},
}

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f\u2028\u2029]")
_SURROGATE = re.compile(r"[\ud800-\udfff]")


class NoticeError(ValueError):
    """An event or stored record that cannot become a notice (the reason is the message)."""


def label(table: Mapping[str, Mapping[str, str]], key: str | None, lang: str) -> str:
    """The `lang` text of `key` in one of the tables above; the key itself when unknown."""
    if key is None:
        return "-"
    entry = table.get(key)
    return entry.get(lang, entry["en"]) if entry else key


def clean_text(text: str, limit: int = MAX_FIELD_CHARS) -> str:
    """Log-derived text made safe to show: control characters out, length bounded."""
    text = _CONTROL.sub(" ", text.replace("\r\n", "\n")).strip()
    text = _SURROGATE.sub("\ufffd", text)  # undecodable log bytes must not break UTF-8 encoding later
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def fault_severity(fault_class: str | None, rule_severity: str | None = None) -> str:
    """The severity of the fault itself, independent of where the incident stands."""
    if fault_class in FAULT_SEVERITY:
        return FAULT_SEVERITY[fault_class]
    return _RULE_SEVERITY.get(rule_severity or "", "warning")


def severity_for(status: str, fault_class: str | None, rule_severity: str | None = None) -> str:
    """The module docstring's table."""
    if status in NOT_FIRING:
        return "info"
    if status in NEEDS_PERSON:
        return "critical"
    return fault_severity(fault_class, rule_severity)


def _i18n(text: I18nText) -> dict[str, str]:
    return {"en": clean_text(text.en), "zh": clean_text(text.zh)}


def _i18n_from(value: Any) -> dict[str, str] | None:
    if not isinstance(value, Mapping):
        return None
    en, zh = value.get("en"), value.get("zh")
    if not isinstance(en, str) or not isinstance(zh, str) or not en or not zh:
        return None
    return {"en": clean_text(en), "zh": clean_text(zh)}


def _action_view(raw: Mapping[str, Any]) -> dict[str, Any]:
    result = raw.get("result")
    return {
        "name": str(raw.get("name") or "?"),
        "state": str(raw.get("state") or "?"),
        "result": dict(result) if isinstance(result, Mapping) else None,
    }


def _opt_str(value: Any) -> str | None:
    return None if value is None or value == "" else str(value)


def _opt_int(value: Any) -> int | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


@dataclass(frozen=True)
class Notice:
    """One notification-worthy state of one incident (see the module docstring for severity)."""

    incident_id: str
    # agent.store.IncidentStatus values: open, observed, awaiting_approval, rejected, acting,
    # resolved, blocked, failed.
    status: str
    # Unix seconds of the change (the IncidentEvent's time).
    time: float
    severity: str
    fault_class: str | None
    code: str | None
    chip: str | None
    vendor_action: str | None
    action: str | None
    node: str | None
    device: str | None
    rank: int | None
    namespace: str | None
    job: str | None
    job_kind: str | None
    # {"en": ..., "zh": ...}
    summary: dict[str, str]
    hint: dict[str, str] | None
    # The policy mode the plan ran in (observe, dry-run, approve, enforce).
    mode: str | None
    # name, state, result of each action as the incident store records them.
    actions: tuple[dict[str, Any], ...]
    scene_dir: str | None
    report_url: str | None = None
    # Why the plan is blocked (budget, backoff, circuit breaker, ...), when it is.
    blocked: dict[str, str] | None = None
    # Framework-aware advice attached to the plan (hints.yaml), in both languages.
    advice: tuple[dict[str, str], ...] = ()
    # The fault's own severity, stable over the incident's life (see `fault_severity`).
    base_severity: str = field(default="warning")
    # The incident's console page (api.public_url), and for a plan awaiting approval signed,
    # single-use, expiring links to the console's approve and reject confirmation pages.
    incident_url: str | None = None
    approve_url: str | None = None
    reject_url: str | None = None
    # Set on the page that says a sink could not deliver this notice for good (`sink_failure`).
    failed_sink: str | None = None

    @property
    def dedup_key(self) -> str:
        """Stable across restarts and replays: one incident reaches one status once (and a sink's
        failure to deliver it is paged once)."""
        base = f"{self.incident_id}/{self.status}"
        return f"{base}/sink-failed:{self.failed_sink}" if self.failed_sink else base

    @property
    def firing(self) -> bool:
        # A notice that never arrived somewhere is for a person to see, whatever the incident's status.
        return self.failed_sink is not None or self.status not in NOT_FIRING

    def sink_failure(self, sink: str, error: str, *, at: float) -> Notice:
        """The page for the other sinks when `sink` failed to deliver this notice for good (a 4xx, a
        robot's permanent error code, or retries given up): critical, the sink and why first, then
        what the incident is."""
        why = clean_text(error, 300) or "-"
        summary = {
            "en": clean_text(f"Notification sink {sink} failed permanently: {why}. {self.summary['en']}"),
            "zh": clean_text(f"通知渠道 {sink} 永久投递失败：{why}。{self.summary['zh']}"),
        }
        # The single-use approve link stays with the sink it was made for; the incident link goes along.
        return replace(
            self, failed_sink=sink, severity="critical", time=at, summary=summary, approve_url=None, reject_url=None
        )

    def text(self, name: str, lang: str) -> str | None:
        """`summary` / `hint` / `blocked` in `lang` ("en" or "zh")."""
        value = getattr(self, name)
        if not value:
            return None
        return str(value.get(lang) or value.get("en") or "") or None

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready (the CloudEvent `data`, and what the outbox stores); `failed_sink` only on a
        sink's failure page."""
        return {
            "incident_id": self.incident_id,
            "status": self.status,
            "time": self.time,
            "severity": self.severity,
            "base_severity": self.base_severity,
            "firing": self.firing,
            "dedup_key": self.dedup_key,
            "fault_class": self.fault_class,
            "code": self.code,
            "chip": self.chip,
            "vendor_action": self.vendor_action,
            "action": self.action,
            "node": self.node,
            "device": self.device,
            "rank": self.rank,
            "namespace": self.namespace,
            "job": self.job,
            "job_kind": self.job_kind,
            "summary": dict(self.summary),
            "hint": dict(self.hint) if self.hint else None,
            "blocked": dict(self.blocked) if self.blocked else None,
            "advice": [dict(a) for a in self.advice],
            "mode": self.mode,
            "actions": [dict(a) for a in self.actions],
            "scene_dir": self.scene_dir,
            "report_url": self.report_url,
            # Only when set: receivers and stored notices without a console stay as they were.
            **({"incident_url": self.incident_url} if self.incident_url else {}),
            **({"approve_url": self.approve_url} if self.approve_url else {}),
            **({"reject_url": self.reject_url} if self.reject_url else {}),
            **({"failed_sink": self.failed_sink} if self.failed_sink else {}),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Notice:
        """The notice back from `as_dict()` (the outbox's stored copy). Raises NoticeError."""
        try:
            incident_id = str(data["incident_id"])
            status = str(data["status"])
            t = float(data["time"])
        except (KeyError, TypeError, ValueError) as e:
            raise NoticeError(f"not a stored notice: {e!r}") from e
        summary = _i18n_from(data.get("summary")) or _fallback_summary(incident_id, status)
        fault_class = _opt_str(data.get("fault_class"))
        base = str(data.get("base_severity") or fault_severity(fault_class))
        severity = str(data.get("severity") or severity_for(status, fault_class))
        actions = data.get("actions") or []
        advice = data.get("advice") or []
        return cls(
            incident_id=incident_id,
            status=status,
            time=t,
            severity=severity if severity in SEVERITY_RANK else "warning",
            fault_class=fault_class,
            code=_opt_str(data.get("code")),
            chip=_opt_str(data.get("chip")),
            vendor_action=_opt_str(data.get("vendor_action")),
            action=_opt_str(data.get("action")),
            node=_opt_str(data.get("node")),
            device=_opt_str(data.get("device")),
            rank=_opt_int(data.get("rank")),
            namespace=_opt_str(data.get("namespace")),
            job=_opt_str(data.get("job")),
            job_kind=_opt_str(data.get("job_kind")),
            summary=summary,
            hint=_i18n_from(data.get("hint")),
            mode=_opt_str(data.get("mode")),
            actions=tuple(_action_view(a) for a in actions if isinstance(a, Mapping)),
            scene_dir=_opt_str(data.get("scene_dir")),
            report_url=_opt_str(data.get("report_url")),
            blocked=_i18n_from(data.get("blocked")),
            advice=tuple(a for a in (_i18n_from(x) for x in advice) if a),
            base_severity=base if base in SEVERITY_RANK else "warning",
            incident_url=_opt_str(data.get("incident_url")),
            approve_url=_opt_str(data.get("approve_url")),
            reject_url=_opt_str(data.get("reject_url")),
            failed_sink=_opt_str(data.get("failed_sink")),
        )

    @classmethod
    def from_incident_event(
        cls,
        event: Event,
        *,
        report_url: str | None = None,
        incident_url: str | None = None,
        approve_url: str | None = None,
        reject_url: str | None = None,
    ) -> Notice:
        """The notice of one `IncidentEvent` envelope; `event.time` is the change time."""
        p = event.payload
        if not isinstance(p, IncidentEvent):
            raise NoticeError(f"event {event.id} carries a {p.kind!r} payload, not an incident")
        rc: RootCause | None = p.root_cause
        plan = p.plan if isinstance(p.plan, Mapping) else {}
        fault_class = rc.fault_class.value if rc else _opt_str(plan.get("fault_class"))
        rule_severity = rc.severity.value if rc else None
        advice = [_i18n(x) for x in p.hints] or [h for h in (_i18n_from(x) for x in plan.get("hints") or []) if h]
        return cls(
            incident_id=p.incident_id,
            status=p.status,
            time=event.time,
            severity=severity_for(p.status, fault_class, rule_severity),
            fault_class=fault_class,
            code=rc.code if rc else _opt_str(plan.get("code")),
            chip=rc.chip.value if rc else None,
            vendor_action=rc.vendor_action if rc else None,
            action=rc.action.value if rc and rc.action else None,
            node=p.node or (rc.node if rc else None),
            device=rc.device if rc else None,
            rank=rc.rank if rc else None,
            namespace=p.job.namespace if p.job else None,
            job=p.job.name if p.job else None,
            job_kind=p.job.kind if p.job else None,
            summary=_i18n(rc.summary) if rc else _fallback_summary(p.incident_id, p.status),
            hint=_i18n(rc.hint) if rc and rc.hint else None,
            mode=p.mode,
            actions=tuple(_action_view(a) for a in p.actions),
            scene_dir=p.scene_dir,
            report_url=report_url,
            blocked=_i18n_from(plan.get("blocked")),
            advice=tuple(advice),
            base_severity=fault_severity(fault_class, rule_severity),
            incident_url=incident_url,
            approve_url=approve_url if p.status == "awaiting_approval" else None,
            reject_url=reject_url if p.status == "awaiting_approval" else None,
        )


def _fallback_summary(incident_id: str, status: str) -> dict[str, str]:
    return {
        "en": f"Incident {incident_id}: {label(STATUS_TEXT, status, 'en')}",
        "zh": f"事件 {incident_id}：{label(STATUS_TEXT, status, 'zh')}",
    }
