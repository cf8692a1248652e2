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

import functools
import itertools
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, BinaryIO

import numpy as np

from trainmedic import cache, hsdb
from trainmedic.detectors import views
from trainmedic.detectors.anchors import MIN_ANCHOR_LEN, Anchor, anchor_options
from trainmedic.detectors.localize import localize
from trainmedic.detectors.phase import MAX_LINE as MAX_MARKER_LINE
from trainmedic.detectors.phase import PHASE_SENSITIVE, PhaseMarkers, load_phase_markers
from trainmedic.detectors.schema import Rule
from trainmedic.models import FaultClass, Finding, I18nText, Source

_hs = hsdb.hs

HYPERSCAN_AVAILABLE = _hs is not None

# CSI (colours, cursor), OSC (titles, hyperlinks) and two-byte escapes; never across a newline.
ANSI_RE = re.compile(rb"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b\n]*(?:\x07|\x1b\\)|[@-Z\\-_])")
MAX_TEXT = 2000  # characters of a line kept in a finding
MAX_RECORD_BYTES = 64 << 20  # a record longer than this is classified in pieces
MAX_JSON_LINE = 1 << 20  # JSON lines longer than this are matched raw only
CHUNK_BYTES = 8 << 20  # streamed input is classified in chunks of about this size
MEMO_SIZE = 4096  # distinct candidate lines whose confirm result is remembered per chunk
_NAMED_GROUP = re.compile(r"\(\?P<[A-Za-z_][A-Za-z0-9_]*>")
_WIDE_REPEAT = re.compile(r"(?<!\\)\{(\d+),(?:1[7-9]|[2-9]\d|\d{3,})\}")
_TRAILING_ANY = re.compile(r"(?:\.[*+]\??)+\$?$")


class _LazyRegex:
    """A rule pattern compiled at its first search. The prefilter finds the candidates, so a fresh
    `trainmedic diagnose` of a few lines compiles the patterns it points at, not every rule's."""

    __slots__ = ("_compiled", "flags", "pattern")

    def __init__(self, pattern: str, flags: int) -> None:
        self.pattern = pattern
        self.flags = flags
        self._compiled: re.Pattern[str] | None = None

    @property
    def compiled(self) -> re.Pattern[str]:
        compiled = self._compiled
        if compiled is None:
            compiled = self._compiled = re.compile(self.pattern, self.flags)
        return compiled

    def search(self, string: str) -> re.Match[str] | None:
        return self.compiled.search(string)


@dataclass(frozen=True, slots=True)
class _Pat:
    rule_index: int
    regex: _LazyRegex
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
        unwrap: bool = True,
    ) -> None:
        wanted = set(sources) if sources is not None else None
        # Look for matches split by a terminal's hard wrap (pasted logs). Container logs captured by
        # the runtime are never wrapped, so the pipeline turns this off.
        self.unwrap = unwrap
        self.rules: list[Rule] = [r for r in rules if wanted is None or wanted & set(r.source)]
        self.fast = HYPERSCAN_AVAILABLE if fast is None else fast
        if self.fast and not HYPERSCAN_AVAILABLE:
            raise RuntimeError("fast path requested but the hyperscan module is not installed")
        self._pats: list[_Pat] = []
        self._unless: list[list[_LazyRegex]] = []
        for ri, rule in enumerate(self.rules):
            for p in rule.patterns:
                self._pats.append(_Pat(ri, _LazyRegex(p, re.ASCII), rule.continuation > 0))
            self._unless.append([_LazyRegex(u, re.ASCII) for u in rule.unless])
        self._rule_index = {rule.id: ri for ri, rule in enumerate(self.rules)}
        self._phases: PhaseMarkers = load_phase_markers()
        self._cont_ids = [i for i, p in enumerate(self._pats) if p.continuation]
        self._is_cont = np.array([p.continuation for p in self._pats], dtype=bool)
        # False: every pattern, line by line (a continuation rule's record may be one line long);
        # True: the continuation patterns over the records continued on indented lines.
        self._prefilters = {
            False: self._build_prefilter(list(range(len(self._pats)))),
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
        data = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else bytes(text)
        return _fold(self._scan_chunk(data, file=file, first_line=1, final=True)[0])

    def prefilter_hits(self, data: bytes) -> int:
        """Matches of the single-line patterns' prefilter over `data`, with no line bookkeeping at all:
        the bench's measure of the scanner alone (`hyperscan_raw_mb_per_s`)."""
        pids, _ = self._prefilters[False].scan(data)
        return len(pids)

    def scan_stream(self, stream: BinaryIO, *, file: str | None = None) -> tuple[list[Finding], int]:
        """Classify a file-like object chunk by chunk. Returns (folded findings, lines scanned)."""
        carry = b""
        first_line = 1
        found: list[Finding] = []
        # Read one block ahead, so the last block is classified together with what precedes it (a
        # file shorter than a chunk is one chunk: a traceback's frames stay beside its last line).
        block = stream.read(CHUNK_BYTES)
        while True:
            ahead = stream.read(CHUNK_BYTES) if block else b""
            final = not ahead
            data = carry + block
            block = ahead
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

    # -- the chunk pipeline ---------------------------------------------------------------------------

    def _scan_chunk(
        self, data: bytes, *, file: str | None, first_line: int, final: bool
    ) -> tuple[list[Finding], int, int]:
        """Classify complete records of `data`; returns findings, bytes consumed and lines consumed."""
        whole = final
        if not final:
            cut = _record_boundary(data)
            if cut <= 0:
                if len(data) < MAX_RECORD_BYTES:
                    return [], 0, 0  # no complete record yet: read more first
                cut, whole = len(data), True  # one giant record: classify it as it is
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
        hit_pids, hit_ends = self._prefilters[False].scan(body)
        cont_cands: dict[int, set[int]] = {}
        if self._cont_ids and hit_pids:
            hit_pids, hit_ends, cont_hits = self._split_continuation_hits(hit_pids, hit_ends)
            if cont_hits[0]:
                cont_cands = _by_line(cont_hits, nl)
        cands = _by_line((hit_pids, hit_ends), nl)
        if self._cont_ids:
            self._continued_records(body, nl, cont_cands)

        wrap_cands = self._wrapped_candidates(body, nl) if self.unwrap else {}
        matched_at: set[tuple[str, int]] = set()  # (rule id, line index), only needed for wraps

        # Confirm candidates, folding repeats as we go: a line seen before costs a dict lookup, and
        # a repeat of a finding costs a counter bump. slot = [finding, first, last, count]
        folded: dict[tuple[object, ...], list[Any]] = {}
        memo: dict[bytes, tuple[set[int], list[tuple[tuple[object, ...], Finding]]]] = {}
        order = sorted(cands)
        starts, ends = lines.bounds_many(order)
        for idx, start, end in zip(order, starts, ends, strict=True):
            raw = body[start:end]
            pset = cands[idx]
            hit = memo.get(raw)
            if hit is not None and hit[0] == pset:
                results = hit[1]
            else:
                confirmed = self._confirm_line(raw.decode("utf-8", "replace").rstrip("\r"), pset, file)
                results = [((f.rule_id, f.code, f.node, f.device, f.rank), f) for f in confirmed]
                if len(memo) < MEMO_SIZE:
                    memo[raw] = (pset, results)
            for fkey, f in results:
                slot = folded.get(fkey)
                if slot is None:
                    folded[fkey] = [f, idx, idx, 1]
                else:
                    slot[2] = idx
                    slot[3] += 1
                if wrap_cands:
                    matched_at.add((f.rule_id, idx))
        findings: list[Finding] = [
            f.model_copy(update={"line_no": first_line + a, "last_line_no": first_line + b, "count": n})
            for f, a, b, n in folded.values()
        ]
        for idx in sorted(cont_cands):
            for ri, rule_pids in self._by_rule(cont_cands[idx]).items():
                record = lines.record(idx, self.rules[ri].continuation).decode("utf-8", "replace")
                found = self._confirm_rule(ri, record, record, first_line + idx, file, rule_pids)
                if found is not None:
                    findings.append(found)
        for (first, last), wrap_pids in sorted(wrap_cands.items()):
            for ri, rule_pids in self._by_rule(wrap_pids).items():
                if any((self.rules[ri].id, j) in matched_at for j in range(first, last + 1)):
                    continue  # already found on one physical line
                parts = [lines.get(j).rstrip(b"\r").decode("utf-8", "replace") for j in range(first, last + 1)]
                wtext = "".join(parts)
                joins = list(itertools.accumulate(len(part) for part in parts[:-1]))
                found = self._confirm_rule(ri, wtext, wtext, first_line + first, file, rule_pids, joins)
                if found is not None:
                    found.last_line_no = first_line + last
                    findings.append(found)
        self._classify(findings, lines, first_line, n_lines)
        return findings, consumed, n_lines if whole else len(nl)

    def _classify(self, findings: list[Finding], lines: _Lines, first_line: int, n_lines: int) -> None:
        """Settle each finding's class: the chip catalog's class for rules that extract any vendor
        code (`catalog_class`), then the phase (detectors/phase.py) for phase-sensitive rules."""
        marks: dict[int, FaultClass | None] = {}  # line index -> phase marker, shared by the findings
        ignored = [
            f
            for f in findings
            if f.line_no is not None
            and self.rules[self._rule_index[f.rule_id]].user_frame
            and _ignored_exception(lines, f.line_no - first_line)
        ]
        if ignored:
            findings[:] = [f for f in findings if not any(f is g for g in ignored)]
        for f in findings:
            rule = self.rules[self._rule_index[f.rule_id]]
            if rule.catalog_class:
                from trainmedic import udal  # deferred: a scan without vendor codes never loads the catalogs

                entry = udal.lookup(f.chip, f.code)
                if entry is not None and entry.fault_class is not None:
                    f.fault_class = entry.fault_class
            if rule.user_frame and f.line_no is not None:
                _add_user_frame(f, lines, f.line_no - first_line)
            sensitive = rule.phase if rule.phase is not None else rule.fault_class in PHASE_SENSITIVE
            if not sensitive or f.fault_class not in PHASE_SENSITIVE or f.line_no is None:
                continue
            idx = f.line_no - first_line

            def neighbour(k: int, idx: int = idx) -> FaultClass | None:
                j = idx + k
                if j < 0 or j >= n_lines:
                    return None
                if j not in marks:
                    marks[j] = self._phase_marked(lines.get(j))
                return marks[j]

            resolved = self._phases.resolve(f.fault_class, lines.get(idx), neighbour)
            last = f.last_line_no - first_line if f.last_line_no is not None else idx
            if resolved is not FaultClass.COMM_INIT and idx < last < n_lines:
                # The same message folded from several lines (each rank printing it, interleaved):
                # one occurrence whose traceback frames name an init call settles them all, since
                # the first copy printed may have lost its frames to another rank's output.
                resolved = self._phases.resolve(f.fault_class, lines.get(last), functools.partial(neighbour, idx=last))
            if resolved is not f.fault_class:
                # A rule's priority places its own class (a witness's "connection closed" below the
                # peer's failure in training); once the phase makes it an init failure, the init
                # class's weight applies: the group could not be built at all.
                f.priority = None
            f.fault_class = resolved

    def _wrapped_candidates(self, body: bytes, nl: np.ndarray[Any, Any]) -> dict[tuple[int, int], set[int]]:
        """Candidates that only match once hard-wrapped lines are put back together (detectors/views.py):
        the prefilter runs over the lines on either side of each wrap newline, those newlines removed,
        and the wrapped run of lines around each hit becomes a candidate; `_confirm_rule` keeps only
        matches that cross one of the removed newlines."""
        if len(nl) == 0:
            return {}
        wraps = views.wrap_newlines(np.frombuffer(body, dtype=np.uint8), nl)
        view = views.joined_runs(body, nl, wraps, b"")
        if view is None:
            return {}
        out: dict[tuple[int, int], set[int]] = {}
        hit_pids, hit_ends = self._prefilters[False].scan(view.text)
        if not hit_pids:
            return out
        # The prefilter reports where a match (Hyperscan) or only its literal anchor (re path)
        # ends, so the record may run on past the hit's line as well as start before it.
        for pid, hit in zip(hit_pids, view.line_of(hit_ends), strict=True):
            first, last = views.runs_around(wraps, hit)
            if first < last:
                out.setdefault((first, last), set()).add(pid)
        return out

    @functools.cached_property
    def _marker_gate(self) -> _HyperscanPrefilter | None:
        """On the fast path, Hyperscan answers first whether a neighbour line can carry a phase marker
        at all (most cannot): the markers' alternations cost tens of microseconds a line in `re`.
        Built at the first phase question, so an engine that never meets one never builds it."""
        if not self.fast:
            return None
        return _HyperscanPrefilter(list(enumerate([*self._phases.init_patterns, *self._phases.runtime_patterns])))

    def _phase_marked(self, line: bytes) -> FaultClass | None:
        """The phase marker on a line near a finding (detectors/phase.py), or None."""
        text = _utf8_prefix(line, MAX_MARKER_LINE)
        gate = self._marker_gate
        if gate is not None and not gate.scan(text)[0]:
            return None
        return self._phases.on_line(text)

    def _split_continuation_hits(
        self, pids: list[int], ends: list[int]
    ) -> tuple[list[int], list[int], tuple[list[int], list[int]]]:
        """The line scan's hits of single-line patterns, and those of continuation patterns apart."""
        pid_arr = np.asarray(pids, dtype=np.int64)
        is_cont = self._is_cont[pid_arr]
        if not is_cont.any():
            return pids, ends, ([], [])
        end_arr = np.asarray(ends, dtype=np.int64)
        return (
            pid_arr[~is_cont].tolist(),
            end_arr[~is_cont].tolist(),
            (pid_arr[is_cont].tolist(), end_arr[is_cont].tolist()),
        )

    def _continued_records(self, body: bytes, nl: np.ndarray[Any, Any], cont_cands: dict[int, set[int]]) -> None:
        """Continuation-rule candidates, keyed by the first line of their record. `cont_cands` holds
        the line scan's hits; a hit on a line of a multi-line record is dropped there and found again,
        on the whole record, by the scan of the continued records (detectors/views.py)."""
        links = views.continuation_newlines(np.frombuffer(body, dtype=np.uint8), nl)
        if not links.any():
            return
        for idx in [i for i in cont_cands if (i > 0 and links[i - 1]) or (i < len(links) and links[i])]:
            del cont_cands[idx]
        runs = views.joined_runs(body, nl, links, b" ")
        if runs is None:
            return
        pids, ends = self._prefilters[True].scan(runs.text)
        for pid, idx in zip(pids, runs.line_of(ends), strict=True):
            cont_cands.setdefault(views.run_first(links, idx), set()).add(pid)

    def _by_rule(self, pids: Iterable[int]) -> dict[int, list[int]]:
        """Pattern ids grouped by their rule, in rule order."""
        by_rule: dict[int, list[int]] = {}
        for pid in sorted(pids):
            by_rule.setdefault(self._pats[pid].rule_index, []).append(pid)
        return by_rule

    def _confirm_line(self, line: str, pids: set[int], file: str | None) -> list[Finding]:
        decoded = _json_text(line)
        out = []
        for ri, rule_pids in self._by_rule(pids).items():
            f = self._confirm_rule(ri, line, decoded or line, None, file, rule_pids)
            if f is not None:
                out.append(f)
        return out

    def _confirm_rule(
        self,
        ri: int,
        raw: str,
        display: str,
        line_no: int | None,
        file: str | None,
        pids: list[int],
        joins: list[int] | None = None,
    ) -> Finding | None:
        """The rule's finding on `raw`, or None. With `joins` (the offsets where hard-wrapped lines
        were put back together), only a match that crosses one counts: a match inside one physical
        line is that line's own business, where the rule's `unless` and anchors apply to it alone."""
        rule = self.rules[ri]
        match = None
        for pid in pids:
            if joins is None:
                match = self._pats[pid].regex.search(raw)
            else:
                match = next(
                    (
                        m
                        for m in self._pats[pid].regex.compiled.finditer(raw)
                        if any(m.start() < j < m.end() for j in joins)
                    ),
                    None,
                )
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


# -- normalisation and line bookkeeping ---------------------------------------------------------------


def normalize(data: bytes) -> bytes:
    """ANSI codes removed; valid UTF-8 (invalid bytes replaced) so bytes and text views agree."""
    if b"\x1b" in data:
        data = ANSI_RE.sub(b"", data)
    if not data.isascii() and not _valid_utf8(data):
        data = data.decode("utf-8", "replace").encode("utf-8")
    return data


def _valid_utf8(data: bytes) -> bool:
    """Whether `data` is valid UTF-8, decoding only its non-ASCII bytes.

    A multi-byte character is made of bytes >= 0x80 only, so the text is valid exactly when every
    maximal run of such bytes is: the runs, each ended by a newline, are decoded together."""
    arr = np.frombuffer(data, dtype=np.int8)
    high = np.flatnonzero(arr < 0)
    if len(high) * 4 > len(data):
        runs = data  # mostly non-ASCII: gathering saves nothing
    else:
        gaps = np.flatnonzero(np.diff(high) > 1) + 1
        runs = np.insert(arr[high], gaps, 10).tobytes() if len(gaps) else arr[high].tobytes()
    try:
        runs.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _utf8_prefix(line: bytes, limit: int) -> bytes:
    """At most `limit` bytes of valid UTF-8 `line`, never ending inside a character."""
    if len(line) <= limit:
        return line
    cut = limit
    while cut > 0 and line[cut] & 0xC0 == 0x80:  # the byte at the cut continues a character
        cut -= 1
    return line[:cut]


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


def _by_line(hits: tuple[list[int], list[int]], nl: np.ndarray[Any, Any]) -> dict[int, set[int]]:
    """Prefilter hits (pattern ids, end offsets) grouped by the line each match ends on."""
    pids, ends = hits
    out: dict[int, set[int]] = {}
    if not pids:
        return out
    idxs = np.searchsorted(nl, np.asarray(ends, dtype=np.int64) - 1, side="left").tolist()
    for pid, idx in zip(pids, idxs, strict=True):
        bucket = out.get(idx)
        if bucket is None:
            out[idx] = {pid}
        else:
            bucket.add(pid)
    return out


class _Lines:
    """Random access to the lines of a chunk by index, via the newline offsets."""

    def __init__(self, body: bytes, nl: np.ndarray[Any, Any]) -> None:
        self.body = body
        self.nl = nl

    def bounds(self, idx: int) -> tuple[int, int]:
        start = int(self.nl[idx - 1]) + 1 if idx > 0 else 0
        end = int(self.nl[idx]) if idx < len(self.nl) else len(self.body)
        return start, end

    def bounds_many(self, idxs: list[int]) -> tuple[list[int], list[int]]:
        """Start and end offsets of many lines at once."""
        if not idxs:
            return [], []
        ix = np.asarray(idxs, dtype=np.int64)
        padded = np.concatenate((self.nl, [len(self.body)]))
        ends = padded[ix]
        starts = np.where(ix > 0, padded[np.maximum(ix - 1, 0)] + 1, 0)
        return starts.tolist(), ends.tolist()

    def get(self, idx: int) -> bytes:
        start, end = self.bounds(idx)
        return self.body[start:end]

    def record(self, idx: int, extra: int) -> bytes:
        """Line `idx` plus up to `extra` following indented lines, joined by single spaces."""
        parts = [self.get(idx).rstrip(b"\r")]
        n = len(self.nl) + 1
        for j in range(idx + 1, min(idx + 1 + extra, n)):
            line = self.get(j)
            if line[:1] not in (b" ", b"\t"):
                break
            parts.append(line.strip())
        return b" ".join(parts)


# -- prefilters ----------------------------------------------------------------------------------------


class _Prefilter:
    def scan(self, data: bytes) -> tuple[list[int], list[int]]:
        """Pattern ids and match end offsets: a superset of the lines where each pattern matches."""
        raise NotImplementedError


def _crlf_ends(pattern: str) -> str:
    """`pattern` with each end-of-line anchor `$` (not escaped, not in a class) allowing a carriage
    return before it, for the prefilters: the confirm step matches a line with its CR removed, so a
    CRLF line ends there, while a multi-line `$` (Hyperscan's, re's over a chunk) only matches before
    the LF and would miss the line."""
    out: list[str] = []
    i, in_class = 0, False
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            out.append(pattern[i : i + 2])
            i += 2
            continue
        if in_class:
            if c == "]" and not (out and out[-1] in ("[", "[^")):
                in_class = False
        elif c == "[":
            in_class = True
            if pattern.startswith("[^", i):
                out.append("[^")
                i += 2
                continue
        elif c == "$":
            out.append("\\r?$")
            i += 1
            continue
        out.append(c)
        i += 1
    return "".join(out)


def _chunk_regex(pattern: str) -> re.Pattern[bytes]:
    """`pattern` as a prefilter regex over a whole chunk (bytes, multi-line, CRLF-tolerant ends)."""
    return re.compile(_crlf_ends(pattern).encode("utf-8"), re.ASCII | re.MULTILINE)


def _hs_expression(pattern: str) -> bytes:
    expr = _NAMED_GROUP.sub("(?:", _crlf_ends(pattern))
    # Wide bounded repeats (`[^\n]{0,200}`) cost Hyperscan seconds to compile; unbounded ones
    # match a superset, which is all a prefilter needs.
    expr = _WIDE_REPEAT.sub(lambda m: "{" + m.group(1) + ",}", expr)
    # A trailing `.*` changes nothing about whether a line matches, only how many end offsets
    # Hyperscan reports: drop it so a long matching line costs one callback, not hundreds.
    expr = _TRAILING_ANY.sub("", expr) or expr
    return expr.encode("utf-8")


class _HyperscanPrefilter(_Prefilter):
    def __init__(self, pats: list[tuple[int, str]]) -> None:
        assert _hs is not None
        self.fallback: list[tuple[int, re.Pattern[bytes]]] = []
        base = _hs.HS_FLAG_PREFILTER | _hs.HS_FLAG_MULTILINE | _hs.HS_FLAG_UTF8 | _hs.HS_FLAG_ALLOWEMPTY
        compiled = [(pid, pattern, _hs_expression(pattern)) for pid, pattern in pats]
        self.db = None
        if not compiled:
            return
        # Compiling takes most of a fresh process's start: the database is kept in the on-disk
        # cache (trainmedic/cache.py), keyed by the expressions, their ids and the flags.
        key = cache.make_key("hyperscan", [str(base), *(b"%d\0%s" % (pid, expr) for pid, _, expr in compiled)])
        if self._from_cache(key, pats):
            return
        try:
            self.db = self._compile(compiled, base)
        except _hs.error:
            # Some pattern is not expressible even as a prefilter: find which, scan those with re.
            good = []
            for item in compiled:
                try:
                    self._compile([item], base)
                    good.append(item)
                except _hs.error:
                    pid, pattern, _ = item
                    self.fallback.append((pid, _chunk_regex(pattern)))
            self.db = self._compile(good, base) if good else None
        if cache.cache_dir() is not None:
            blob = hsdb.dump(self.db) if self.db is not None else None
            cache.store("hyperscan", key, (blob, [pid for pid, _ in self.fallback]))

    def _from_cache(self, key: str, pats: list[tuple[int, str]]) -> bool:
        assert _hs is not None
        entry: Any = cache.load("hyperscan", key)
        try:
            blob, fallback_ids = entry
            # A database this CPU or this hyperscan cannot scan is refused: compile afresh.
            db = hsdb.load_block(blob) if blob is not None else None
            by_id = dict(pats)
            fallback = [(pid, _chunk_regex(by_id[pid])) for pid in fallback_ids]
        except Exception:  # noqa: BLE001 - no entry, or one this hyperscan cannot load: compile afresh
            return False
        self.db, self.fallback = db, fallback
        return True

    @staticmethod
    def _compile(items: list[tuple[int, str, bytes]], flags: int) -> Any:
        return hsdb.compile_block([e for _, _, e in items], [i for i, _, _ in items], [flags] * len(items))

    def scan(self, data: bytes) -> tuple[list[int], list[int]]:
        pids: list[int] = []
        ends: list[int] = []
        if self.db is not None and data:
            add_pid, add_end = pids.append, ends.append

            def on_match(pid: int, _start: int, end: int, _flags: int, _ctx: object) -> None:
                add_pid(pid)
                add_end(end)

            self.db.scan(data, match_event_handler=on_match)
        _regex_scan(self.fallback, data, pids, ends)
        return pids, ends


class _AnchorPrefilter(_Prefilter):
    # Characters that re's IGNORECASE folds onto ASCII letters (İ ı ſ K): with these in a chunk,
    # lower-cased literal search is not safe, so case-insensitive patterns fall back to re.
    _FOLDS = (b"\xc4\xb0", b"\xc4\xb1", b"\xc5\xbf", b"\xe2\x84\xaa")

    # Chunks at least this large pick each pattern's anchor set by the chunk's own byte pairs (see
    # _Choices); smaller ones (a live batch of a few lines) keep the static first choice, which costs
    # nothing to pick.
    CHOOSE_MIN_BYTES = 256 << 10

    def __init__(self, pats: list[tuple[int, _LazyRegex]]) -> None:
        self.by_anchor: dict[Anchor, list[int]] = {}
        self.fallback: list[tuple[int, re.Pattern[bytes]]] = []
        self.ci_fallback: list[tuple[int, re.Pattern[bytes]]] = []
        fixed: dict[Anchor, list[int]] = {}
        chooser: list[tuple[int, list[frozenset[Anchor]]]] = []
        for pid, regex in pats:
            options = anchor_options(regex.pattern)
            as_bytes = _chunk_regex(regex.pattern)
            if not options:
                self.fallback.append((pid, as_bytes))
                continue
            anchors = options[0]
            for a in anchors:
                self.by_anchor.setdefault(a, []).append(pid)
            if any(a.ci for a in anchors):
                self.ci_fallback.append((pid, as_bytes))
            exact_options = [o for o in options if not any(a.ci for a in o)]
            if len(exact_options) > 1 and exact_options[0] == anchors:
                chooser.append((pid, exact_options))
            else:
                for a in anchors:
                    fixed.setdefault(a, []).append(pid)
        self._choices = _Choices(fixed, chooser) if chooser else None

    def scan(self, data: bytes) -> tuple[list[int], list[int]]:
        pids: list[int] = []
        ends: list[int] = []
        unsafe_ci = bool(self.ci_fallback) and not data.isascii() and any(f in data for f in self._FOLDS)
        ci_fallback_ids = {pid for pid, _ in self.ci_fallback} if unsafe_ci else set()
        hist: _Bigrams | None = None
        if self._choices is not None and len(data) >= self.CHOOSE_MIN_BYTES:
            hist = _Bigrams(data)
            exact = self._choices.pick(hist.counts)
        else:
            exact = [(a, p) for a, p in self.by_anchor.items() if not a.ci]
        folded = [(a, p) for a, p in self.by_anchor.items() if a.ci and not unsafe_ci]
        _find_literals(data, exact, ci_fallback_ids, pids, ends, hist)
        if folded:
            _find_literals(data.lower(), folded, ci_fallback_ids, pids, ends)
        _regex_scan(self.fallback + (self.ci_fallback if unsafe_ci else []), data, pids, ends)
        return pids, ends


class _Bigrams:
    """A chunk as bytes, its byte pairs and their histogram: computed once per chunk."""

    __slots__ = ("arr", "big", "counts")

    def __init__(self, hay: bytes) -> None:
        self.arr = np.frombuffer(hay, dtype=np.uint8)
        self.big = (self.arr[:-1].astype(np.uint16) << 8) | self.arr[1:]
        self.counts = np.bincount(self.big, minlength=65536)


class _Choices:
    """Per chunk, each pattern's cheapest anchor set among those that are each safe on its own.

    A set's cost is what finding it costs in _find_literals: for each literal, the count of its
    rarest byte pair in the chunk. Vectorised: one gather of every option's pairs, a minimum per
    literal, a sum per option, an argmin per pattern. Ties keep the static first choice."""

    def __init__(self, fixed: dict[Anchor, list[int]], chooser: list[tuple[int, list[frozenset[Anchor]]]]) -> None:
        self.fixed = fixed
        self.pids = [pid for pid, _ in chooser]
        self.options = [[sorted(o, key=lambda a: a.literal) for o in opts] for _, opts in chooser]
        width = max(len(opts) for opts in self.options)
        pairs: list[int] = []
        lit_starts: list[int] = []
        opt_starts: list[int] = []
        cells: list[int] = []
        for row, opts in enumerate(self.options):
            for col, option in enumerate(opts):
                opt_starts.append(len(lit_starts))
                cells.append(row * width + col)
                for anchor in option:
                    lit = anchor.literal
                    lit_starts.append(len(pairs))
                    pairs.extend((lit[i] << 8) | lit[i + 1] for i in range(len(lit) - 1))
        self.width = width
        self.pairs = np.array(pairs, dtype=np.intp)
        self.lit_starts = np.array(lit_starts, dtype=np.intp)
        self.opt_starts = np.array(opt_starts, dtype=np.intp)
        self.cells = np.array(cells, dtype=np.intp)
        self._last: tuple[bytes, list[tuple[Anchor, list[int]]]] | None = None

    def pick(self, counts: np.ndarray) -> list[tuple[Anchor, list[int]]]:
        per_literal = np.minimum.reduceat(counts[self.pairs], self.lit_starts)
        per_option = np.add.reduceat(per_literal, self.opt_starts)
        grid = np.full(len(self.options) * self.width, np.iinfo(np.int64).max, dtype=np.int64)
        grid[self.cells] = per_option
        choice = grid.reshape(len(self.options), self.width).argmin(axis=1)
        key = choice.astype(np.uint8).tobytes()
        if self._last is not None and self._last[0] == key:
            return self._last[1]
        by_anchor = {a: list(p) for a, p in self.fixed.items()}
        for pid, opts, col in zip(self.pids, self.options, choice.tolist(), strict=True):
            for anchor in opts[col]:
                by_anchor.setdefault(anchor, []).append(pid)
        picked = list(by_anchor.items())
        self._last = (key, picked)
        return picked


def _find_literals(
    hay: bytes,
    anchors: list[tuple[Anchor, list[int]]],
    skip: set[int],
    pids: list[int],
    ends: list[int],
    hist: _Bigrams | None = None,
) -> None:
    """Every occurrence of every anchor literal in `hay`, in one vectorised pass.

    Each literal is looked for through its rarest byte pair in this very chunk (a bigram histogram
    picks it): the positions of those pairs are the only places a literal can start, and they are
    verified byte by byte with numpy. This replaces one `bytes.find` pass per literal.
    """
    if not anchors or len(hay) < MIN_ANCHOR_LEN:
        return  # anchors are at least MIN_ANCHOR_LEN bytes long
    if hist is None:
        hist = _Bigrams(hay)
    arr, big, counts = hist.arr, hist.big, hist.counts
    plan: dict[int, list[tuple[int, bytes, list[int]]]] = {}
    for anchor, anchor_pids in anchors:
        lit = anchor.literal
        use = [p for p in anchor_pids if p not in skip]
        if not use:
            continue
        pairs = [(lit[i] << 8) | lit[i + 1] for i in range(len(lit) - 1)]
        offset = min(range(len(pairs)), key=lambda i: int(counts[pairs[i]]))
        if counts[pairs[offset]] == 0:
            continue  # a pair of the literal never occurs: neither does the literal
        plan.setdefault(pairs[offset], []).append((offset, lit, use))
    if not plan:
        return
    lut = np.zeros(65536, dtype=bool)
    lut[list(plan)] = True
    hits = np.flatnonzero(lut[big])
    # Group the hits by pair once (a stable sort keeps each pair's positions ascending), instead of
    # one pass over all hits per pair: with many anchors and a few common pairs that was quadratic.
    values = big[hits]
    order = np.argsort(values, kind="stable")
    sorted_values, sorted_hits = values[order], hits[order]
    uniq, first = np.unique(sorted_values, return_index=True)
    last = np.append(first[1:], len(sorted_values))
    spans = dict(zip(uniq.tolist(), zip(first.tolist(), last.tolist(), strict=True), strict=True))
    n = len(arr)
    for pair, entries in plan.items():
        lo, hi = spans.get(pair, (0, 0))
        at = sorted_hits[lo:hi]
        for offset, lit, use in entries:
            starts = at - offset
            starts = starts[(starts >= 0) & (starts + len(lit) <= n)]
            for j, byte in enumerate(lit):
                if not len(starts):
                    break
                starts = starts[arr[starts + j] == byte]
            if not len(starts):
                continue
            found = (starts + len(lit)).tolist()
            for pid in use:
                pids.extend([pid] * len(found))
                ends.extend(found)


def _regex_scan(pats: list[tuple[int, re.Pattern[bytes]]], data: bytes, pids: list[int], ends: list[int]) -> None:
    """Full regex scan of a chunk, for patterns no prefilter can express; appends to pids/ends."""
    text: str | None = None
    for pid, regex in pats:
        if regex.pattern.isascii():
            for m in regex.finditer(data):
                pids.append(pid)
                ends.append(max(m.end(), m.start() + 1))
            continue
        # A non-ASCII pattern means characters, not bytes: match the text, map offsets back.
        if text is None:
            text = data.decode("utf-8", "replace")
        str_regex = re.compile(regex.pattern.decode("utf-8"), re.ASCII | re.MULTILINE)
        for sm in str_regex.finditer(text):
            pids.append(pid)
            ends.append(len(text[: max(sm.end(), sm.start() + 1)].encode("utf-8")))
