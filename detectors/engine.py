"""The rule engine: classify log text into findings, fast.

How a chunk of input is classified (both paths share every step but the prefilter):

1. Normalise: strip ANSI colour codes; make the bytes valid UTF-8 (invalid sequences become U+FFFD),
   so the bytes seen by the prefilter and the text seen by the regexes agree.
2. Prefilter, to find candidate lines without running every regex on every line:
   - fast path: one Hyperscan database of every pattern (compiled in prefilter mode, so it reports a
     superset of the real matches) scans the whole chunk at once;
   - `re` path: every pattern's required literals (detectors.anchors) are located with bytes.find;
     patterns without a safe literal are run over the chunk with re.finditer.
   A second, smaller scan covers rules that read multi-line records (`continuation`): there, a newline
   followed by an indented line is seen as a space, so offsets still map 1:1 to the original lines.
3. Confirm: each candidate line is matched with the real regex (re, ASCII semantics). A JSON line
   (torch elastic error file, docker json-file log) also yields its decoded string values for group
   extraction and display; the decision itself is always made on the raw line, so both paths agree.
4. Fold: identical findings (same rule, code and place) become one finding with a count, so 800,000
   repeats of one Xid line cost one object.

The two prefilters only decide which lines are looked at; the confirm step is the only judge. The
test suite checks fast == re == a naive line-by-line reference on random input.
"""

from __future__ import annotations

import bisect
import json
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, BinaryIO

import numpy as np

from detectors.anchors import Anchor, required_anchors
from detectors.localize import localize
from detectors.schema import Rule
from trainmedic.models import Finding, Source

try:
    import hyperscan as _hs
except ImportError:  # pragma: no cover - exercised on hosts without the wheel
    _hs = None

HYPERSCAN_AVAILABLE = _hs is not None

ANSI_RE = re.compile(rb"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)|[@-Z\\-_])")
MAX_TEXT = 2000  # characters of a line kept in a finding
MAX_JSON_LINE = 1 << 20  # JSON lines longer than this are matched raw only
CHUNK_BYTES = 16 << 20  # streamed input is classified in chunks of about this size
_NAMED_GROUP = re.compile(r"\(\?P<[A-Za-z_][A-Za-z0-9_]*>")
_TRAILING_ANY = re.compile(r"(?:\.[*+]\??)+\$?$")


@dataclass(frozen=True, slots=True)
class _Pat:
    rule_index: int
    regex: re.Pattern[str]
    continuation: bool


def has_hyperscan() -> bool:
    return HYPERSCAN_AVAILABLE


class Engine:
    """Compiled rules. `fast=None` uses Hyperscan when installed, else the `re` path."""

    def __init__(
        self,
        rules: Sequence[Rule],
        *,
        fast: bool | None = None,
        sources: Iterable[Source] | None = None,
    ) -> None:
        wanted = set(sources) if sources is not None else None
        self.rules: list[Rule] = [r for r in rules if wanted is None or wanted & set(r.source)]
        self.fast = HYPERSCAN_AVAILABLE if fast is None else fast
        if self.fast and not HYPERSCAN_AVAILABLE:
            raise RuntimeError("fast path requested but the hyperscan module is not installed")
        self._pats: list[_Pat] = []
        self._unless: list[list[re.Pattern[str]]] = []
        for ri, rule in enumerate(self.rules):
            for p in rule.patterns:
                self._pats.append(_Pat(ri, re.compile(p, re.ASCII), rule.continuation > 0))
            self._unless.append([re.compile(u, re.ASCII) for u in rule.unless])
        self._line_ids = [i for i, p in enumerate(self._pats) if not p.continuation]
        self._cont_ids = [i for i, p in enumerate(self._pats) if p.continuation]
        self._prefilters = {
            False: self._build_prefilter(self._line_ids),
            True: self._build_prefilter(self._cont_ids),
        }

    # -- prefilters ---------------------------------------------------------------------------------

    def _build_prefilter(self, ids: list[int]) -> _Prefilter:
        if self.fast:
            return _HyperscanPrefilter([(i, self._pats[i].regex.pattern) for i in ids])
        return _AnchorPrefilter([(i, self._pats[i].regex) for i in ids])

    # -- public API ---------------------------------------------------------------------------------

    def scan_text(self, text: str | bytes, *, file: str | None = None) -> list[Finding]:
        """Classify a whole document held in memory."""
        data = text.encode("utf-8", "surrogateescape") if isinstance(text, str) else bytes(text)
        return _fold(self._scan_chunk(data, file=file, first_line=1, final=True)[0])

    def scan_stream(self, stream: BinaryIO, *, file: str | None = None) -> tuple[list[Finding], int]:
        """Classify a file-like object chunk by chunk. Returns (folded findings, lines scanned)."""
        carry = b""
        first_line = 1
        found: list[Finding] = []
        while True:
            block = stream.read(CHUNK_BYTES)
            final = not block
            data = carry + block
            if not data:
                break
            findings, consumed_bytes, consumed_lines = self._scan_chunk(
                data, file=file, first_line=first_line, final=final
            )
            found.extend(findings)
            carry = data[consumed_bytes:]
            first_line += consumed_lines
            if final:
                break
        return _fold(found), first_line - 1

    def match_line(self, line: str, *, file: str | None = None, line_no: int | None = None) -> list[Finding]:
        """Classify one event line (pipeline use): the same confirm step, no prefilter."""
        out = []
        for ri in range(len(self.rules)):
            f = self._confirm_rule(ri, line, line, line_no, file, [i for i, p in enumerate(self._pats)
                                                                   if p.rule_index == ri])
            if f is not None:
                out.append(f)
        return out

    # -- the chunk pipeline ---------------------------------------------------------------------------

    def _scan_chunk(
        self, data: bytes, *, file: str | None, first_line: int, final: bool
    ) -> tuple[list[Finding], int, int]:
        """Classify complete records of `data`; returns findings, bytes consumed and lines consumed."""
        if not final:
            cut = _record_boundary(data)
            if cut <= 0:  # one record bigger than the chunk: take it whole
                cut = len(data)
            body = data[:cut]
        else:
            body = data
        consumed = len(body)
        body = normalize(body)
        if not body:
            return [], consumed, 0
        nl = np.flatnonzero(np.frombuffer(body, dtype=np.uint8) == 10)
        n_lines = len(nl) + (0 if body.endswith(b"\n") else 1)
        lines = _Lines(body, nl)

        # line index -> pattern ids that may match there
        cands: dict[int, set[int]] = {}
        for pid, end in self._prefilters[False].scan(body):
            cands.setdefault(lines.index_of(end - 1), set()).add(pid)
        cont_cands: dict[int, set[int]] = {}
        if self._cont_ids:
            joined = _join_continuations(body, nl)
            for pid, end in self._prefilters[True].scan(joined):
                start = lines.record_start(lines.index_of(end - 1), joined)
                cont_cands.setdefault(start, set()).add(pid)

        findings: list[Finding] = []
        memo: dict[tuple[bytes, frozenset[int]], list[Finding]] = {}
        for idx in sorted(cands):
            raw = lines.get(idx)
            key = (raw, frozenset(cands[idx]))
            cached = memo.get(key)
            if cached is None:
                cached = self._confirm_line(raw.decode("utf-8", "replace").rstrip("\r"), cands[idx], file)
                if len(memo) < 4096:
                    memo[key] = cached
            line_no = first_line + idx
            findings.extend(f.model_copy(update={"line_no": line_no, "last_line_no": line_no}) for f in cached)
        for idx in sorted(cont_cands):
            by_rule: dict[int, list[int]] = {}
            for pid in cont_cands[idx]:
                by_rule.setdefault(self._pats[pid].rule_index, []).append(pid)
            for ri, pids in by_rule.items():
                text = lines.record(idx, self.rules[ri].continuation).decode("utf-8", "replace")
                f = self._confirm_rule(ri, text, text, first_line + idx, file, pids)
                if f is not None:
                    f.last_line_no = f.line_no
                    findings.append(f)
        return findings, consumed, n_lines if final else len(nl)

    def _confirm_line(self, line: str, pids: set[int], file: str | None) -> list[Finding]:
        by_rule: dict[int, list[int]] = {}
        for pid in sorted(pids):
            by_rule.setdefault(self._pats[pid].rule_index, []).append(pid)
        decoded = _json_text(line)
        out = []
        for ri, rule_pids in by_rule.items():
            f = self._confirm_rule(ri, line, decoded or line, None, file, rule_pids)
            if f is not None:
                out.append(f)
        return out

    def _confirm_rule(
        self, ri: int, raw: str, display: str, line_no: int | None, file: str | None, pids: list[int]
    ) -> Finding | None:
        rule = self.rules[ri]
        match = None
        for pid in pids:
            match = self._pats[pid].regex.search(raw)
            if match is not None:
                break
        if match is None or any(u.search(raw) for u in self._unless[ri]):
            return None
        if display is not raw:
            # Prefer groups from the decoded JSON text (real newlines and quotes), if it matches there too.
            for pid in pids:
                m2 = self._pats[pid].regex.search(display)
                if m2 is not None:
                    match = m2
                    break
            else:
                display = raw
        return build_finding(rule, match, display, line_no, file)


def build_finding(rule: Rule, match: re.Match[str], text: str, line_no: int | None, file: str | None) -> Finding:
    groups = {k: v for k, v in match.groupdict().items() if v is not None}
    values: dict[str, str] = {**rule.defaults, **groups}
    code = _fill(rule.code, values)
    values["code"] = code
    loc = localize(text, groups)
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
        action=rule.action,
        vendor_action=rule.vendor_action,
        message=rule.message.model_copy(
            update={"en": _fill(rule.message.en, values), "zh": _fill(rule.message.zh, values)}
        ),
        hint=rule.hint.model_copy(update={"en": _fill(rule.hint.en, values), "zh": _fill(rule.hint.zh, values)}),
        groups=groups,
        priority=rule.priority,
    )


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
    except ValueError:
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


# -- normalisation and line bookkeeping ---------------------------------------------------------------


def normalize(data: bytes) -> bytes:
    """ANSI codes removed; valid UTF-8 (invalid bytes replaced) so bytes and text views agree."""
    if b"\x1b" in data:
        data = ANSI_RE.sub(b"", data)
    if not data.isascii():
        data = data.decode("utf-8", "replace").encode("utf-8")
    return data


def _record_boundary(data: bytes) -> int:
    """Offset just after the last newline that starts a new (non-indented) record, or -1."""
    pos = len(data)
    for _ in range(64):
        nl = data.rfind(b"\n", 0, pos)
        if nl < 0:
            return -1
        nxt = data[nl + 1 : nl + 2]
        if nxt and nxt not in (b" ", b"\t"):
            return nl + 1
        pos = nl
    return data.rfind(b"\n") + 1


def _join_continuations(body: bytes, nl: np.ndarray[Any, Any]) -> bytes:
    """`body` with each newline that precedes an indented line replaced by a space (same length)."""
    if len(nl) == 0:
        return body
    arr = np.frombuffer(body, dtype=np.uint8)
    nxt_idx = nl[nl + 1 < len(arr)]
    nxt = arr[nxt_idx + 1]
    joins = nxt_idx[(nxt == 32) | (nxt == 9)]
    if len(joins) == 0:
        return body
    out = arr.copy()
    out[joins] = 32
    return out.tobytes()


class _Lines:
    """Random access to the lines of a chunk by index, via the newline offsets."""

    def __init__(self, body: bytes, nl: np.ndarray[Any, Any]) -> None:
        self.body = body
        self.nl = nl
        self._nl_list: list[int] | None = None

    def index_of(self, offset: int) -> int:
        return int(np.searchsorted(self.nl, offset, side="left"))

    def bounds(self, idx: int) -> tuple[int, int]:
        start = int(self.nl[idx - 1]) + 1 if idx > 0 else 0
        end = int(self.nl[idx]) if idx < len(self.nl) else len(self.body)
        return start, end

    def get(self, idx: int) -> bytes:
        start, end = self.bounds(idx)
        return self.body[start:end]

    def record_start(self, idx: int, joined: bytes) -> int:
        """First line of the multi-line record that line `idx` belongs to (in the joined view)."""
        start, _ = self.bounds(idx)
        nl = joined.rfind(b"\n", 0, start)
        if self._nl_list is None:
            self._nl_list = self.nl.tolist()
        return bisect.bisect_left(self._nl_list, nl) + 1 if nl >= 0 else 0

    def record(self, idx: int, extra: int) -> bytes:
        """Line `idx` plus up to `extra` following indented lines, joined by single spaces."""
        parts = [self.get(idx).rstrip(b"\r")]
        n = len(self.nl) + 1
        for j in range(idx + 1, min(idx + 1 + extra, n)):
            line = self.get(j)
            if not line[:1] in (b" ", b"\t"):
                break
            parts.append(line.strip())
        return b" ".join(parts)


# -- prefilters ----------------------------------------------------------------------------------------


class _Prefilter:
    def scan(self, data: bytes) -> Iterator[tuple[int, int]]:
        """(pattern id, end offset) pairs: a superset of the lines where each pattern matches."""
        raise NotImplementedError


def _hs_expression(pattern: str) -> bytes:
    expr = _NAMED_GROUP.sub("(?:", pattern)
    # A trailing `.*` changes nothing about whether a line matches, only how many end offsets
    # Hyperscan reports: drop it so a long matching line costs one callback, not hundreds.
    expr = _TRAILING_ANY.sub("", expr) or expr
    return expr.encode("utf-8")


class _HyperscanPrefilter(_Prefilter):
    def __init__(self, pats: list[tuple[int, str]]) -> None:
        assert _hs is not None
        self.fallback: list[tuple[int, re.Pattern[bytes]]] = []
        exprs: list[bytes] = []
        ids: list[int] = []
        flags: list[int] = []
        base = _hs.HS_FLAG_PREFILTER | _hs.HS_FLAG_MULTILINE | _hs.HS_FLAG_UTF8 | _hs.HS_FLAG_ALLOWEMPTY
        for pid, pattern in pats:
            expr = _hs_expression(pattern)
            db = _hs.Database(mode=_hs.HS_MODE_BLOCK)
            try:
                db.compile(expressions=[expr], ids=[pid], flags=[base])
            except _hs.error:
                # Not expressible even as a prefilter: scan this one with re over the chunk.
                self.fallback.append((pid, re.compile(pattern.encode("utf-8"), re.ASCII | re.MULTILINE)))
                continue
            exprs.append(expr)
            ids.append(pid)
            flags.append(base)
        self.db = None
        if exprs:
            self.db = _hs.Database(mode=_hs.HS_MODE_BLOCK)
            self.db.compile(expressions=exprs, ids=ids, flags=flags)

    def scan(self, data: bytes) -> Iterator[tuple[int, int]]:
        hits: list[tuple[int, int]] = []
        if self.db is not None and data:

            def on_match(pid: int, _start: int, end: int, _flags: int, _ctx: object) -> None:
                hits.append((pid, end))

            self.db.scan(data, match_event_handler=on_match)
        yield from hits
        yield from _regex_scan(self.fallback, data)


class _AnchorPrefilter(_Prefilter):
    # Characters that re's IGNORECASE folds onto ASCII letters (İ ı ſ K): with these in a chunk,
    # lower-cased literal search is not safe, so case-insensitive patterns fall back to re.
    _FOLDS = (b"\xc4\xb0", b"\xc4\xb1", b"\xc5\xbf", b"\xe2\x84\xaa")

    def __init__(self, pats: list[tuple[int, re.Pattern[str]]]) -> None:
        self.by_anchor: dict[Anchor, list[int]] = {}
        self.fallback: list[tuple[int, re.Pattern[bytes]]] = []
        self.ci_fallback: list[tuple[int, re.Pattern[bytes]]] = []
        for pid, regex in pats:
            anchors = required_anchors(regex.pattern)
            as_bytes = re.compile(regex.pattern.encode("utf-8"), re.ASCII | re.MULTILINE)
            if anchors is None:
                self.fallback.append((pid, as_bytes))
                continue
            for a in anchors:
                self.by_anchor.setdefault(a, []).append(pid)
            if any(a.ci for a in anchors):
                self.ci_fallback.append((pid, as_bytes))

    def scan(self, data: bytes) -> Iterator[tuple[int, int]]:
        lowered: bytes | None = None
        unsafe_ci = not data.isascii() and any(f in data for f in self._FOLDS)
        ci_fallback_ids = {pid for pid, _ in self.ci_fallback} if unsafe_ci else set()
        for anchor, pids in self.by_anchor.items():
            if anchor.ci:
                if unsafe_ci:
                    continue
                if lowered is None:
                    lowered = data.lower()
                hay = lowered
            else:
                hay = data
            lit = anchor.literal
            pos = hay.find(lit)
            while pos >= 0:
                end = pos + len(lit)
                for pid in pids:
                    if pid not in ci_fallback_ids:
                        yield pid, end
                # Skip to the next line: one candidate per line per anchor is enough.
                nxt = hay.find(b"\n", end)
                if nxt < 0:
                    break
                pos = hay.find(lit, nxt + 1)
        fallback = self.fallback + (self.ci_fallback if unsafe_ci else [])
        yield from _regex_scan(fallback, data)


def _regex_scan(pats: list[tuple[int, re.Pattern[bytes]]], data: bytes) -> Iterator[tuple[int, int]]:
    """Full regex scan of a chunk, for patterns no prefilter can express."""
    text: str | None = None
    for pid, regex in pats:
        if regex.pattern.isascii():
            for m in regex.finditer(data):
                yield pid, max(m.end(), m.start() + 1)
            continue
        # A non-ASCII pattern means characters, not bytes: match the text, map offsets back.
        if text is None:
            text = data.decode("utf-8", "replace")
        str_regex = re.compile(regex.pattern.decode("utf-8"), re.ASCII | re.MULTILINE)
        for m in str_regex.finditer(text):
            yield pid, len(text[: max(m.end(), m.start() + 1)].encode("utf-8"))
