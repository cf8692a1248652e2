"""The text of a chat robot's message: one notice in full, or a digest of many, in each robot's
markup (`_Dialect`) and within its size limits, in one language or both.
"""

from __future__ import annotations

import re
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
from trainmedic.reports.payloads.cloudevents import LANGS


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
