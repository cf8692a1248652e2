"""What each ops sink receives for one or more notices: built as dicts, never as JSON text.

Pure functions over `Notice` (reports/notice.py): no clock (times are arguments), no I/O. The
outbox (agent/outbox.py) sends them; whatever it sends, it encodes once with `encode_body` and
signs exactly those bytes.

* CloudEvents 1.0, structured content mode (`application/cloudevents+json`), one event per notice,
  or the JSON batch format (`application/cloudevents-batch+json`) for several. `id` is the
  notice's dedup key (`<incident>/<status>`), so a receiver drops the duplicates that
  at-least-once delivery can produce by (`source`, `id`), as the spec asks of consumers.
* The signature: HMAC-SHA256 with a shared secret over ``f"{timestamp}."`` + body, sent as
  ``X-Trainmedic-Signature: v1=<hex>`` with ``X-Trainmedic-Timestamp: <unix seconds>``. The
  timestamp is inside the MAC, so a captured request cannot be replayed later than the receiver's
  window (300 s by default) and the body cannot be changed; inside the window, replays are the
  duplicates the CloudEvent `id` already removes. Several comma-separated ``v1=`` values are
  accepted (secret rotation). A receiver needs no trainmedic code to check it:

```python
import hashlib
import hmac
import time


def verify(secret: bytes, headers: dict[str, str], body: bytes, tolerance_s: float = 300) -> bool:
    ts = headers.get("X-Trainmedic-Timestamp", "")
    sig = headers.get("X-Trainmedic-Signature", "")
    if not ts.isdigit() or abs(time.time() - int(ts)) > tolerance_s:
        return False  # missing, malformed or outside the replay window
    mac = hmac.new(secret, ts.encode() + b"." + body, hashlib.sha256).hexdigest()
    return any(hmac.compare_digest("v1=" + mac, s.strip()) for s in sig.split(","))
```

* Alertmanager `POST /api/v2/alerts` (postableAlerts): one alert per incident. Its labels identify
  the alert, so they never change over the incident's life (the `severity` label is the fault's
  own, `Notice.base_severity`); status and texts are annotations. A resolved or rejected incident
  is sent with `endsAt`; a firing one without, and Alertmanager ends it after its
  `resolve_timeout` unless it is sent again.
* Chat robots (Feishu / Lark, DingTalk, WeCom, Slack): one message for 1..N notices; N > 1 is a
  digest (counts by severity, fault class and status, the first `DIGEST_ITEMS` incidents, then
  "... and M more"), which is how a 500-node outage stays a handful of messages. `lang` is "en",
  "zh" or "both". Every message carries the word "trainmedic", so a robot's keyword security can
  use it. Each robot's size limit is met by cutting the longest field with a marker, never by
  cutting a JSON document or a UTF-8 character in half. Log-derived text cannot mention or ping
  anyone (`<@user>`, `<at id=all>`, `<!channel>` are defused); other Markdown in it is kept.
  Where the notice has them (`api.public_url`, docs/console.md), a message links to the incident's
  console page and, for a plan awaiting approval, to its signed approve link; both sit on the
  reference line, which stays whole when the other lines are cut to fit.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
import urllib.parse
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from trainmedic.reports.notice import (
    ACTION_STATE_TEXT,
    FAULT_TEXT,
    SEVERITY_RANK,
    SEVERITY_TEXT,
    STATUS_TEXT,
    Notice,
    clean_text,
    label,
)
from trainmedic.timefmt import rfc3339_ms

LANGS = ("en", "zh", "both")

# -- CloudEvents ------------------------------------------------------------------------------------

SPECVERSION = "1.0"
EVENT_TYPE_PREFIX = "io.trainmedic.incident."
CLOUDEVENT_CONTENT_TYPE = "application/cloudevents+json; charset=utf-8"
CLOUDEVENTS_BATCH_CONTENT_TYPE = "application/cloudevents-batch+json; charset=utf-8"
SIGNATURE_HEADER = "X-Trainmedic-Signature"
TIMESTAMP_HEADER = "X-Trainmedic-Timestamp"
SIGNATURE_VERSION = "v1"
DEFAULT_TOLERANCE_S = 300.0


def encode_body(payload: Any) -> bytes:
    """The bytes to send (and to sign): compact UTF-8 JSON, Chinese kept as UTF-8, not \\u escapes."""
    # A lone surrogate (undecodable log bytes) becomes "?" instead of failing the delivery.
    return json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "replace")


def cloudevent(n: Notice, *, source: str) -> dict[str, Any]:
    """One notice as a CloudEvents 1.0 event in the JSON format (structured mode)."""
    if not source:
        raise ValueError("a CloudEvent needs a non-empty source")
    return {
        "specversion": SPECVERSION,
        "id": n.dedup_key,
        "source": source,
        "type": EVENT_TYPE_PREFIX + ("notification_failed" if n.failed_sink else n.status),
        "subject": n.incident_id,
        "time": rfc3339_ms(n.time),
        "datacontenttype": "application/json",
        "data": n.as_dict(),
    }


def cloudevents_batch(ns: Sequence[Notice], *, source: str) -> list[dict[str, Any]]:
    """Several notices in the CloudEvents JSON batch format (a JSON array of events)."""
    return [cloudevent(n, source=source) for n in ns]


def _check_secret(secret: bytes) -> None:
    if not isinstance(secret, bytes | bytearray) or not secret:
        raise ValueError("the webhook signing secret must be non-empty bytes")


def sign(secret: bytes, timestamp: int, body: bytes) -> str:
    """``v1=`` + hex HMAC-SHA256(secret, f"{timestamp}." + body)."""
    _check_secret(secret)
    mac = hmac.new(bytes(secret), str(int(timestamp)).encode() + b"." + body, hashlib.sha256)
    return f"{SIGNATURE_VERSION}={mac.hexdigest()}"


def signature_headers(secret: bytes, body: bytes, *, timestamp: int) -> dict[str, str]:
    """The two headers a signed request carries."""
    return {TIMESTAMP_HEADER: str(int(timestamp)), SIGNATURE_HEADER: sign(secret, timestamp, body)}


def _header(headers: Mapping[str, str], name: str) -> str | None:
    value = headers.get(name)
    if value is not None:
        return value
    lowered = name.lower()
    for key, v in headers.items():
        if key.lower() == lowered:
            return v
    return None


def verify(
    secret: bytes, headers: Mapping[str, str], body: bytes, *, now: float, tolerance_s: float = DEFAULT_TOLERANCE_S
) -> bool:
    """Whether `body` was signed with `secret` at a time within `tolerance_s` of `now`.

    False for a missing or malformed header, a timestamp outside the window (either side), or no
    matching ``v1=`` signature; the comparison is constant-time.
    """
    _check_secret(secret)
    ts = (_header(headers, TIMESTAMP_HEADER) or "").strip()
    sig = _header(headers, SIGNATURE_HEADER)
    # Unix seconds have 10 digits until 2286; a longer string is not a timestamp (nor worth int()).
    if not ts or not sig or len(ts) > 12 or not ts.isascii() or not ts.isdigit():
        return False
    timestamp = int(ts)
    if abs(now - timestamp) > tolerance_s:
        return False
    expected = sign(secret, timestamp, body).encode()
    ok = False
    for candidate in sig.split(","):
        # Every candidate is compared (no early exit), each in constant time.
        ok |= hmac.compare_digest(expected, candidate.strip().encode("utf-8", "replace"))
    return ok


# -- Alertmanager -----------------------------------------------------------------------------------

ALERTNAME = "TrainmedicIncident"
# The alert of a notice another sink could not deliver for good (labelled with that sink).
ALERTNAME_SINK_FAILED = "TrainmedicNotificationFailed"
MAX_LABEL_CHARS = 256


def _latest_per_incident(ns: Sequence[Notice]) -> list[Notice]:
    """The newest notice of each incident, in the order incidents first appear."""
    latest: dict[tuple[str, str | None], tuple[float, int, Notice]] = {}
    for i, n in enumerate(ns):
        # A sink's failure to deliver a notice is a page of its own, beside the incident's state.
        key = (n.incident_id, n.failed_sink)
        seen = latest.get(key)
        if seen is None or (n.time, i) >= seen[:2]:
            latest[key] = (n.time, i, n)
    first = {(n.incident_id, n.failed_sink): i for i, n in reversed(list(enumerate(ns)))}
    return [v[2] for v in sorted(latest.values(), key=lambda v: first[(v[2].incident_id, v[2].failed_sink)])]


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


# -- chat robots ------------------------------------------------------------------------------------

DIGEST_ITEMS = 10
# WeCom group robot: markdown content at most 4096 bytes of UTF-8.
WECOM_MAX_BYTES = 4096
# Slack: a section block's text at most 3000 characters, a header's plain text at most 150.
SLACK_SECTION_MAX_CHARS = 3000
SLACK_HEADER_MAX_CHARS = 150
# Feishu custom bots take request bodies up to 20 KB, DingTalk names no figure for markdown: both
# kept to 8000 bytes of text, under 20 KB even if a sender escapes every Chinese character (\\uXXXX).
FEISHU_MAX_BYTES = 8000
DINGTALK_MAX_BYTES = 8000
# How much of one field a message shows (the report has it all).
CHAT_FIELD_CHARS = 600
# Names (node, job, code, ...) and report links longer than these are cut, or left out (links).
CHAT_NAME_CHARS = 80
MAX_URL_CHARS = 512
MAX_ACTIONS = 8
DIGEST_SUMMARY_CHARS = 160

TRUNCATED = {"en": "…(truncated)", "zh": "…（已截断）"}
_EMOJI = {"critical": "🔴", "warning": "🟠", "info": "🟢"}

_L: dict[str, dict[str, str]] = {
    "en": {
        "summary": "Summary",
        "status": "Status",
        "job": "Job",
        "where": "Where",
        "fault": "Fault",
        "vendor": "Vendor says",
        "blocked": "Why blocked",
        "todo": "What to do",
        "advice": "Advice",
        "actions": "Actions",
        "mode": "Mode",
        "incident": "Incident",
        "report": "Report",
        "console": "Open in console",
        "approve": "Approve the plan",
        "reject": "Reject the plan",
        "node": "node",
        "device": "device",
        "rank": "rank",
        "updates": "{n} incidents",
        "affected": "{nodes} nodes and {jobs} jobs affected",
        "by_class": "By fault class",
        "by_status": "By status",
        "more": "… and {m} more",
        "scene": "Scene",
    },
    "zh": {
        "summary": "摘要",
        "status": "状态",
        "job": "作业",
        "where": "位置",
        "fault": "故障",
        "vendor": "厂商建议",
        "blocked": "阻止原因",
        "todo": "建议操作",
        "advice": "补充建议",
        "actions": "处置动作",
        "mode": "模式",
        "incident": "事件",
        "report": "报告",
        "console": "在控制台查看",
        "approve": "批准处置方案",
        "reject": "驳回处置方案",
        "node": "节点",
        "device": "设备",
        "rank": "rank",
        "updates": "{n} 个事件",
        "affected": "涉及 {nodes} 个节点、{jobs} 个作业",
        "by_class": "按故障类型",
        "by_status": "按状态",
        "more": "……另有 {m} 条",
        "scene": "现场",
    },
}

# `<` that would open a mention or a tag in a chat Markdown (`<@user>`, `<at id=all>`, `<!here>`,
# `<font>`): a zero-width space after it keeps the text as it reads and stops the markup.
_MARKUP_OPEN = re.compile(r"<(?=[@!/A-Za-z#])")
_ZWSP = "\u200b"
_PARTIAL_ENTITY = re.compile(r"&[a-z]{0,4}$")


@dataclass(frozen=True)
class _Dialect:
    """How one chat's Markdown writes bold, links and user text, and how its size is measured."""

    bold: Callable[[str], str]
    link: Callable[[str, str], str]
    escape: Callable[[str], str]
    measure: Callable[[str], int]
    line_sep: str = "\n"


def _utf8_len(s: str) -> int:
    return len(s.encode("utf-8", "replace"))


def _md_escape(s: str) -> str:
    return _MARKUP_OPEN.sub("<" + _ZWSP, s)


def _md_link(text: str, url: str) -> str:
    return f"[{text}]({url.replace(')', '%29').replace(' ', '%20')})"


def _slack_escape(s: str) -> str:
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _slack_link(text: str, url: str) -> str:
    safe = url.replace("|", "%7C").replace(">", "%3E").replace("<", "%3C").replace(" ", "%20")
    return f"<{safe}|{_slack_escape(text)}>"


_MD = _Dialect(bold=lambda s: f"**{s}**", link=_md_link, escape=_md_escape, measure=_utf8_len)
_DINGTALK = _Dialect(bold=lambda s: f"**{s}**", link=_md_link, escape=_md_escape, measure=_utf8_len, line_sep="\n\n")
_SLACK = _Dialect(bold=lambda s: f"*{s}*", link=_slack_link, escape=_slack_escape, measure=len)


def _prepare(ns: Sequence[Notice], lang: str) -> tuple[list[str], list[Notice]]:
    """The languages to write, and the notices to show: the latest of each incident (a digest of
    500 incidents that each went open -> acting -> resolved counts 500 resolved incidents)."""
    if lang not in LANGS:
        raise ValueError(f"unknown language {lang!r}: use one of {', '.join(LANGS)}")
    if not ns:
        raise ValueError("no notices to put in a message")
    return (["en", "zh"] if lang == "both" else [lang]), [_for_chat(n) for n in _latest_per_incident(ns)]


def _short(value: str | None, limit: int = CHAT_NAME_CHARS) -> str | None:
    return clean_text(value, limit) or None if value else None


def _for_chat(n: Notice) -> Notice:
    """Names bounded for a chat line (a 3000-character node name must not push out the rest)."""

    def fits(url: str | None) -> str | None:
        return url if url and len(url) <= MAX_URL_CHARS else None

    return replace(
        n,
        incident_id=_short(n.incident_id, 2 * CHAT_NAME_CHARS) or "?",
        code=_short(n.code),
        chip=_short(n.chip),
        vendor_action=_short(n.vendor_action),
        action=_short(n.action),
        node=_short(n.node),
        device=_short(n.device),
        namespace=_short(n.namespace),
        job=_short(n.job),
        job_kind=_short(n.job_kind),
        mode=_short(n.mode),
        report_url=fits(n.report_url),
        incident_url=fits(n.incident_url),
        approve_url=fits(n.approve_url),
        reject_url=fits(n.reject_url),
    )


def _cut(text: str, budget: int, measure: Callable[[str], int], marker: str) -> str:
    """`text` cut to at most `budget` (as `measure` counts) with `marker` at the end when cut."""
    if measure(text) <= budget:
        return text
    room = budget - measure(marker)
    if room <= 0:
        return marker if measure(marker) <= budget else ""
    # By characters (Slack) or by UTF-8 bytes without splitting a character (the others).
    cut = text[:room] if measure is len else text.encode("utf-8", "replace")[:room].decode("utf-8", "ignore")
    # Never leave half an entity (`&am`) behind.
    return _PARTIAL_ENTITY.sub("", cut) + marker


def _field(text: str | None, limit: int = CHAT_FIELD_CHARS) -> str | None:
    return clean_text(text, limit) if text else None


def _code(code: str) -> str:
    return "`" + code.replace("`", "'") + "`"


def _where(n: Notice, lang: str) -> str:
    words = _L[lang]
    parts = []
    if n.node:
        parts.append(f"{words['node']} {n.node}")
    if n.device:
        parts.append(f"{words['device']} {n.device}")
    if n.rank is not None:
        parts.append(f"{words['rank']} {n.rank}")
    return " · ".join(parts)


def _job(n: Notice) -> str | None:
    if not n.job:
        return None
    name = f"{n.namespace}/{n.job}" if n.namespace else n.job
    return f"{name} ({n.job_kind})" if n.job_kind else name


def _when(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _action_line(a: Mapping[str, Any], lang: str) -> str:
    name = clean_text(str(a.get("name") or "?"), CHAT_NAME_CHARS)
    text = f"{name}: {label(ACTION_STATE_TEXT, str(a.get('state')), lang)}"
    result = a.get("result") or {}
    detail = None
    for key in ("error", "reason", "retry", "resumed_from", "workload", "node"):
        value = result.get(key)
        if value:
            detail = f"{key}: {value}" if key in ("resumed_from", "workload", "node") else str(value)
            break
    return f"{text} ({clean_text(detail, 200)})" if detail else text


def _title(ns: Sequence[Notice], lang: str) -> str:
    if len(ns) == 1:
        n = ns[0]
        what = label(FAULT_TEXT, n.fault_class, lang) if n.fault_class else n.incident_id
        code = f" ({n.code})" if n.code and lang == "en" else f"（{n.code}）" if n.code else ""
        place = n.node or _job(n)
        if lang == "en":
            at = f" on {place}" if place else ""
            failed = f"sink {n.failed_sink} failed permanently · " if n.failed_sink else ""
            return (
                f"[{label(SEVERITY_TEXT, n.severity, 'en')}] {failed}{label(STATUS_TEXT, n.status, 'en')}: "
                f"{what}{code}{at}"
            )
        at = f" · {place}" if place else ""
        failed = f"通知渠道 {n.failed_sink} 永久投递失败 · " if n.failed_sink else ""
        return (
            f"【{label(SEVERITY_TEXT, n.severity, 'zh')}】{failed}{label(STATUS_TEXT, n.status, 'zh')}："
            f"{what}{code}{at}"
        )
    sev = _top_severity(ns)
    count = _L[lang]["updates"].format(n=len(ns))
    if lang == "en":
        return f"[{label(SEVERITY_TEXT, sev, 'en')}] trainmedic: {count}"
    return f"【{label(SEVERITY_TEXT, sev, 'zh')}】trainmedic：{count}"


def _top_severity(ns: Sequence[Notice]) -> str:
    return max((n.severity for n in ns), key=lambda s: SEVERITY_RANK.get(s, 1))


def _titles(ns: Sequence[Notice], langs: list[str]) -> str:
    return " / ".join(_title(ns, lang) for lang in langs)


def _single_lines(n: Notice, lang: str, d: _Dialect) -> list[str]:
    w = _L[lang]
    colon = ": " if lang == "en" else "："
    rows: list[tuple[str, str | None]] = []
    esc = d.escape

    def text(name: str) -> str | None:
        value = _field(n.text(name, lang))
        return esc(value) if value else None

    rows.append((w["summary"], text("summary")))
    status = f"{label(STATUS_TEXT, n.status, lang)} · {label(SEVERITY_TEXT, n.severity, lang)}"
    rows.append((w["status"], status))
    job = _job(n)
    rows.append((w["job"], esc(job) if job else None))
    where = _where(n, lang)
    rows.append((w["where"], esc(where) if where else None))
    if n.fault_class or n.code:
        fault = label(FAULT_TEXT, n.fault_class, lang) if n.fault_class else "-"
        extra = ", ".join(x for x in (_code(n.code) if n.code else None, n.chip) if x)
        rows.append((w["fault"], f"{fault} ({extra})" if extra else fault))
    if n.vendor_action or n.action:
        rows.append((w["vendor"], esc(f"{n.vendor_action or '-'} → {n.action or '-'}")))
    rows.append((w["blocked"], text("blocked")))
    rows.append((w["todo"], text("hint")))
    if n.advice:
        advice = " ".join(_field(a.get(lang) or a.get("en"), CHAT_FIELD_CHARS // 2) or "" for a in n.advice[:3])
        rows.append((w["advice"], esc(advice.strip()) or None))
    if n.actions:
        shown = [_action_line(a, lang) for a in n.actions[:MAX_ACTIONS]]
        if len(n.actions) > MAX_ACTIONS:
            shown.append(f"+{len(n.actions) - MAX_ACTIONS}")
        rows.append((w["actions"], esc("; ".join(shown))))
    if n.mode:
        rows.append((w["mode"], esc(n.mode)))
    ref = f"{esc(n.incident_id)} · {_when(n.time)}"
    if n.incident_url:
        ref += " · " + d.link(w["console"], n.incident_url)
    if n.report_url:
        ref += " · " + d.link(w["report"], n.report_url)
    if n.status == "awaiting_approval":
        # On the reference line, which stays whole when the other lines are cut to fit.
        if n.approve_url:
            ref += " · " + d.link(w["approve"], n.approve_url)
        if n.reject_url:
            ref += " · " + d.link(w["reject"], n.reject_url)
    rows.append((w["incident"], ref))
    return [f"{d.bold(k)}{colon}{v}" for k, v in rows if v]


def _fit_single(lines: list[str], budget: int, d: _Dialect, lang: str) -> str:
    """Cut the long lines to one common length so the whole fits; the last line (the reference) stays.

    Short lines keep their text; the longest ones lose the most and end with the marker.
    """
    marker = TRUNCATED[lang]
    sep = d.line_sep
    if d.measure(sep.join(lines)) <= budget or len(lines) < 2:
        return _cut(sep.join(lines), budget, d.measure, marker)
    body, last = lines[:-1], lines[-1]
    sizes = [d.measure(x) for x in body]
    room = budget - d.measure(last) - d.measure(sep) * len(body)
    floor = d.measure(marker) + 24
    lo, hi = floor, max(sizes)
    # The largest common cap `c` with sum(min(size, c)) <= room (binary search; sizes are bounded).
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if sum(min(sz, mid) for sz in sizes) <= room:
            lo = mid
        else:
            hi = mid - 1
    cut = [x if sz <= lo else _cut(x, lo, d.measure, marker) for x, sz in zip(body, sizes, strict=True)]
    return _cut(sep.join([*cut, last]), budget, d.measure, marker)


def _digest_item(i: int, n: Notice, lang: str, d: _Dialect) -> str:
    sev = label(SEVERITY_TEXT, n.severity, lang)
    what = n.fault_class or "-"
    code = f" {_code(n.code)}" if n.code else ""
    colon = ": " if lang == "en" else "："
    parts = [f"{i}. [{sev}] {label(STATUS_TEXT, n.status, lang)}{colon}{what}{code}"]
    job, where = _job(n), n.node
    if job:
        parts.append(d.escape(job))
    if where:
        parts.append(d.escape(where))
    summary = _field(n.text("summary", lang), DIGEST_SUMMARY_CHARS)
    line = " · ".join(parts)
    if summary:
        line += " — " + d.escape(summary)
    if n.incident_url:
        line += " " + d.link(_L[lang]["console"], n.incident_url)
    elif n.report_url:
        line += " " + d.link(_L[lang]["report"], n.report_url)
    return line


def _ordered(ns: Sequence[Notice]) -> list[Notice]:
    return sorted(ns, key=lambda n: (-SEVERITY_RANK.get(n.severity, 1), n.time, n.incident_id, n.status))


def _counts(values: list[str], lang: str, table: Mapping[str, Mapping[str, str]] | None = None) -> str:
    counts = Counter(values)
    ordered = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    return " · ".join(f"{label(table, k, lang) if table else k} {v}" for k, v in ordered)


def _digest(ns: Sequence[Notice], lang: str, d: _Dialect, budget: int) -> str:
    w = _L[lang]
    colon = ": " if lang == "en" else "："
    by_sev = Counter(n.severity for n in ns)
    sev = " · ".join(
        f"{label(SEVERITY_TEXT, s, lang)} {by_sev[s]}" for s in ("critical", "warning", "info") if by_sev[s]
    )
    nodes = len({n.node for n in ns if n.node})
    jobs = len({(n.namespace, n.job) for n in ns if n.job})
    head = [
        f"{d.bold(w['updates'].format(n=len(ns)))} · {sev}",
        d.bold(w["affected"].format(nodes=nodes, jobs=jobs)),
        f"{d.bold(w['by_class'])}{colon}{_counts([n.fault_class or '-' for n in ns], lang)}",
        f"{d.bold(w['by_status'])}{colon}{_counts([n.status for n in ns], lang, STATUS_TEXT)}",
    ]
    items = [_digest_item(i + 1, n, lang, d) for i, n in enumerate(_ordered(ns))]
    sep = d.line_sep
    shown: list[str] = []
    limit = min(len(items), DIGEST_ITEMS)
    for k in range(limit + 1):
        rest = len(items) - k
        tail = [w["more"].format(m=rest)] if rest else []
        text = sep.join(head + items[:k] + tail)
        if d.measure(text) > budget and k > 0:
            break
        shown = items[:k]
    rest = len(items) - len(shown)
    tail = [w["more"].format(m=rest)] if rest else []
    return _cut(sep.join(head + shown + tail), budget, d.measure, TRUNCATED[lang])


def _bodies(ns: Sequence[Notice], langs: list[str], d: _Dialect, budget: int | None) -> list[str]:
    """One body per language, each within its share of `budget`."""
    share = None if budget is None else max(1, budget // len(langs))
    out = []
    for lang in langs:
        b = share if share is not None else 1 << 30
        if len(ns) == 1:
            out.append(_fit_single(_single_lines(ns[0], lang, d), b, d, lang))
        else:
            out.append(_digest(ns, lang, d, b))
    return out


_BOTH_SEP = "\n\n---\n\n"


def notice_text(ns: Sequence[Notice], *, lang: str, max_bytes: int | None = None) -> tuple[str, str]:
    """(title, Markdown body) for 1..N notices, the text the Markdown robots share.

    The body uses `**bold**` and `[text](url)`, one field per line; with lang "both", the English
    part, a rule, then the Chinese part. `max_bytes` bounds the body (UTF-8).
    """
    langs, ns = _prepare(ns, lang)
    budget = None if max_bytes is None else max_bytes - _utf8_len(_BOTH_SEP) * (len(langs) - 1)
    return _titles(ns, langs), _BOTH_SEP.join(_bodies(ns, langs, _MD, budget))


def _footer_ids(ns: Sequence[Notice]) -> str:
    ids = [n.incident_id for n in _ordered(ns)]
    more = f" +{len(ids) - 3}" if len(ids) > 3 else ""
    return ", ".join(ids[:3]) + more


def _footer(ns: Sequence[Notice]) -> str:
    return f"trainmedic · {_md_escape(_footer_ids(ns))}"


# -- Feishu / Lark

_FEISHU_TEMPLATE = {"critical": "red", "warning": "orange"}


def feishu_sign(secret: str, timestamp: int) -> str:
    """Feishu custom-bot signature: HMAC-SHA256 keyed with f"{timestamp}\\n{secret}" over nothing, base64."""
    key = f"{int(timestamp)}\n{secret}".encode()
    return base64.b64encode(hmac.new(key, b"", hashlib.sha256).digest()).decode("ascii")


def feishu_message(ns: Sequence[Notice], *, lang: str, secret: str | None, timestamp: int) -> dict[str, Any]:
    """An interactive card (header coloured by severity); `timestamp` and `sign` when `secret`."""
    langs, ns = _prepare(ns, lang)
    sev = _top_severity(ns)
    firing = any(n.firing for n in ns)
    template = _FEISHU_TEMPLATE.get(sev, "green" if not firing else "blue")
    title = _EMOJI.get(sev, "") + " " + _titles(ns, langs)
    footer = _footer(ns)
    budget = FEISHU_MAX_BYTES - _utf8_len(title) - _utf8_len(footer)
    elements: list[dict[str, Any]] = []
    for i, body in enumerate(_bodies(ns, langs, _MD, budget)):
        if i:
            elements.append({"tag": "hr"})
        elements.append({"tag": "div", "text": {"tag": "lark_md", "content": body}})
    elements.append({"tag": "note", "elements": [{"tag": "plain_text", "content": footer}]})
    message: dict[str, Any] = {
        "msg_type": "interactive",
        "card": {
            "config": {"wide_screen_mode": True},
            "header": {"template": template, "title": {"tag": "plain_text", "content": title}},
            "elements": elements,
        },
    }
    if secret:
        message = {"timestamp": str(int(timestamp)), "sign": feishu_sign(secret, timestamp), **message}
    return message


# -- DingTalk


def dingtalk_sign(secret: str, timestamp_ms: int) -> str:
    """DingTalk custom-robot signature (before URL encoding): HMAC-SHA256 keyed with the secret
    over f"{timestamp_ms}\\n{secret}", base64."""
    data = f"{int(timestamp_ms)}\n{secret}".encode()
    return base64.b64encode(hmac.new(secret.encode(), data, hashlib.sha256).digest()).decode("ascii")


def dingtalk_signed_url(url: str, secret: str, timestamp_ms: int) -> str:
    """The robot URL with `&timestamp=...&sign=...` (the signature URL-encoded) appended."""
    if not secret:
        raise ValueError("a DingTalk signing secret must be non-empty")
    sign_q = urllib.parse.quote_plus(dingtalk_sign(secret, timestamp_ms))
    sep = "&" if urllib.parse.urlsplit(url).query else ("" if url.endswith("?") else "?")
    return f"{url}{sep}timestamp={int(timestamp_ms)}&sign={sign_q}"


def dingtalk_message(ns: Sequence[Notice], *, lang: str) -> dict[str, Any]:
    """msgtype markdown: `title` (the notification preview) and `text`."""
    langs, ns = _prepare(ns, lang)
    title = _titles(ns, langs)
    head = f"#### {_EMOJI.get(_top_severity(ns), '')} {title}"
    footer = f"###### {_footer(ns)}"
    sep = "\n\n"
    budget = DINGTALK_MAX_BYTES - _utf8_len(head) - _utf8_len(footer) - 2 * _utf8_len(sep)
    budget -= _utf8_len(_BOTH_SEP) * (len(langs) - 1)
    text = sep.join([head, _BOTH_SEP.join(_bodies(ns, langs, _DINGTALK, budget)), footer])
    return {"msgtype": "markdown", "markdown": {"title": clean_text(title, 100), "text": text}}


# -- WeCom

_WECOM_COLOUR = {"critical": "warning", "warning": "comment"}


def wecom_message(ns: Sequence[Notice], *, lang: str) -> dict[str, Any]:
    """msgtype markdown; `content` at most WECOM_MAX_BYTES of UTF-8."""
    langs, ns = _prepare(ns, lang)
    sev = _top_severity(ns)
    colour = _WECOM_COLOUR.get(sev, "info")
    head = f'**<font color="{colour}">{_EMOJI.get(sev, "")} {_md_escape(_titles(ns, langs))}</font>**'
    footer = f'<font color="comment">{_footer(ns)}</font>'
    sep = "\n"
    budget = WECOM_MAX_BYTES - _utf8_len(head) - _utf8_len(footer) - 2 * _utf8_len(sep)
    budget -= _utf8_len(_BOTH_SEP) * (len(langs) - 1)
    content = sep.join([head, _BOTH_SEP.join(_bodies(ns, langs, _MD, budget)), footer])
    # The parts are budgeted; this is the guarantee.
    content = _cut(content, WECOM_MAX_BYTES, _utf8_len, TRUNCATED[langs[-1]])
    return {"msgtype": "markdown", "markdown": {"content": content}}


# -- Slack


def slack_message(ns: Sequence[Notice], *, lang: str) -> dict[str, Any]:
    """Incoming-webhook message: `text` (the notification fallback) and Block Kit `blocks`:
    a header, one mrkdwn section per language (each at most 3000 characters), a context line."""
    langs, ns = _prepare(ns, lang)
    sev = _top_severity(ns)
    title = _cut(f"{_EMOJI.get(sev, '')} {_titles(ns, langs)}", SLACK_HEADER_MAX_CHARS, len, "…")
    blocks: list[dict[str, Any]] = [{"type": "header", "text": {"type": "plain_text", "text": title, "emoji": True}}]
    bodies = []
    for body in (_bodies(ns, [lg], _SLACK, SLACK_SECTION_MAX_CHARS)[0] for lg in langs):
        bodies.append(body)
        blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": body}})
    footer = "trainmedic · " + _slack_escape(_footer_ids(ns))
    blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": footer}]})
    fallback = _slack_escape(_titles(ns, langs))
    if len(ns) == 1:
        summary = _field(ns[0].text("summary", langs[0]), DIGEST_SUMMARY_CHARS)
        if summary:
            fallback += " — " + _slack_escape(summary)
    return {"text": _cut(fallback, SLACK_SECTION_MAX_CHARS, len, "…"), "blocks": blocks}
