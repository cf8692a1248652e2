"""Findings of the rule engine (detectors/engine.py): a confirmed match made into a finding
(`build_finding`: its code, message and hint filled from the groups, its place, its timestamp, its
text clipped), the traceback around it read (an ignored exception, the user's frame), the decoded text
of a JSON line (`_json_text`), and repeats folded into one finding with a count (`_fold`)."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from typing import Any

from trainmedic.detectors.lines import _Lines
from trainmedic.detectors.localize import localize
from trainmedic.detectors.schema import Rule
from trainmedic.models import Finding, I18nText

MAX_TEXT = 2000  # characters of a line kept in a finding
MAX_JSON_LINE = 1 << 20  # JSON lines longer than this are matched raw only


def build_finding(rule: Rule, match: re.Match[str], text: str, line_no: int | None, file: str | None) -> Finding:
    groups = {k: v for k, v in match.groupdict().items() if v is not None}
    values: dict[str, str] = {**rule.defaults, **groups}
    code = _fill(rule.code, values)
    values["code"] = code
    loc = localize(text, groups)
    ts = _timestamp(groups.get("ts"))
    return Finding(
        rule_id=rule.id,
        fault_class=rule.fault_class,
        chip=rule.chip,
        code=code,
        source=rule.source[0],
        severity=rule.severity,
        line_no=line_no,
        last_line_no=line_no,
        text=_clip(text, match.start(), match.end()),
        file=file,
        node=loc.node,
        device=loc.device,
        rank=loc.rank,
        timestamp=ts,
        action=rule.action,
        vendor_action=rule.vendor_action,
        message=rule.message.model_copy(
            update={"en": _fill(rule.message.en, values), "zh": _fill(rule.message.zh, values)}
        ),
        hint=rule.hint.model_copy(update={"en": _fill(rule.hint.en, values), "zh": _fill(rule.hint.zh, values)}),
        groups=groups,
        priority=rule.priority,
    )


_FRAME = re.compile(rb'File "(?P<file>[^"]{1,300})", line (?P<line>\d{1,7}), in (?P<func>[\w<>.]{1,100})')
_LIBRARY = re.compile(rb"/(?:site|dist)-packages/|/lib/python\d[\d.]*/|^<frozen ")
FRAME_LOOKBACK = 60


_TRACEBACK_HEAD = re.compile(rb"Traceback \(most recent call last\):")
_IGNORED_HEAD = re.compile(rb"\bException ignored in\b")


def _ignored_exception(lines: _Lines, idx: int) -> bool:
    """Whether the exception printed at line `idx` closes a traceback that Python's unraisable hook
    printed (sys.unraisablehook: "Exception ignored in: <object>", then the traceback): an exception
    raised in a destructor or a finalizer, reported and ignored; the program carried on. An exception
    whose outermost frame is a `__del__` is one even when the header was cut off: Python cannot
    propagate it out of a destructor."""
    for j in range(idx - 1, max(idx - FRAME_LOOKBACK, 0) - 1, -1):
        line = lines.get(j)[:1024]
        if _TRACEBACK_HEAD.search(line) is None:
            continue
        # The hook's header is the line before the traceback (or, with output of several processes
        # interleaved, one of the few before it).
        if any(_IGNORED_HEAD.search(lines.get(k)[:1024]) for k in range(max(j - 2, 0), j + 1)):
            return True
        for k in range(j + 1, idx):
            frame = _FRAME.search(lines.get(k)[:1024])
            if frame is not None:
                return frame.group("func") == b"__del__"
        return False
    return False


def _add_user_frame(f: Finding, lines: _Lines, idx: int) -> None:
    """Append "raised at FILE:LINE in FUNC" for the innermost traceback frame above line `idx` that is
    the user's code (not an installed library), or the innermost frame when all are libraries."""
    innermost: re.Match[bytes] | None = None
    for j in range(idx - 1, max(idx - FRAME_LOOKBACK, 0) - 1, -1):
        m = _FRAME.search(lines.get(j)[:1024])
        if m is None:
            continue
        innermost = innermost or m
        if not _LIBRARY.search(m.group("file")):
            innermost = m
            break
    if innermost is None or f.message is None:
        return
    where = f"{innermost.group('file').decode('utf-8', 'replace')}:{int(innermost.group('line'))}"
    func = innermost.group("func").decode("utf-8", "replace")
    f.groups["frame"] = f"{where} in {func}"
    f.message = I18nText(
        en=f"{f.message.en.rstrip('.')} (raised at {where} in {func})",
        zh=f"{f.message.zh.rstrip('。')}（抛出位置：{where}，函数 {func}）",
    )


_TS_FORMATS = ("%Y-%m-%d_%H:%M:%S", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M:%S")


def _timestamp(value: str | None) -> float | None:
    """A rule's `ts` group as epoch seconds (UTC assumed: only compared within one job's logs)."""
    if not value:
        return None
    for fmt in _TS_FORMATS:
        try:
            return datetime.strptime(value[:19], fmt).replace(tzinfo=UTC).timestamp()
        except ValueError:
            continue
    return None


class _SafeDict(dict[str, str]):
    def __missing__(self, key: str) -> str:
        return "?"


def _fill(template: str, values: dict[str, str]) -> str:
    try:
        return template.format_map(_SafeDict(values))
    except (ValueError, IndexError, AttributeError):
        return template


def _clip(text: str, start: int, end: int) -> str:
    if len(text) <= MAX_TEXT:
        return text
    half = (MAX_TEXT - (end - start)) // 2
    lo = max(0, start - max(half, 0))
    return ("…" if lo else "") + text[lo : lo + MAX_TEXT] + ("…" if lo + MAX_TEXT < len(text) else "")


def _json_text(line: str) -> str | None:
    """Decoded string values of a JSON line (docker `log`, torch elastic `message`), else None."""
    s = line.lstrip()
    if not s.startswith("{") or len(s) > MAX_JSON_LINE:
        return None
    try:
        obj = json.loads(s)
    except (ValueError, RecursionError):
        return None
    parts: list[str] = []
    _strings(obj, parts, 0)
    return "\n".join(parts) if parts else None


def _strings(obj: Any, out: list[str], depth: int) -> None:
    if depth > 8:
        return
    if isinstance(obj, str):
        out.append(obj)
    elif isinstance(obj, dict):
        for v in obj.values():
            _strings(v, out, depth + 1)
    elif isinstance(obj, list):
        for v in obj:
            _strings(v, out, depth + 1)


def _fold(findings: list[Finding]) -> list[Finding]:
    """One finding per (rule, code, file, node, device, rank), with a count and the last line seen."""
    folded: dict[tuple[object, ...], Finding] = {}
    for f in findings:
        key = (f.rule_id, f.code, f.file, f.node, f.device, f.rank)
        first = folded.get(key)
        if first is None:
            folded[key] = f
        else:
            first.count += f.count
            first.last_line_no = f.last_line_no
    return list(folded.values())
