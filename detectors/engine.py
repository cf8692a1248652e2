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

Where each part lives:

    engine.py     Engine: the chunk pipeline (steps 1 to 4), the continued records and the hard wraps
                  (with detectors/views.py), the confirm step, the finding's class and phase
    prefilter.py  step 2: the Hyperscan prefilter and the anchor prefilter of the `re` path
    lines.py      step 1 (normalize), where a streamed chunk may be cut, prefilter hits grouped by
                  line, the lines of a chunk by index
    findings.py   a confirmed match made into a finding (build_finding), the traceback around it read,
                  a JSON line's decoded text, step 4 (the fold)

This module re-exports what other modules and the tests import from `trainmedic.detectors.engine`.
"""

from __future__ import annotations

import functools
import itertools
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, BinaryIO

import numpy as np

from trainmedic import hsdb
from trainmedic.detectors import views
from trainmedic.detectors.findings import (
    MAX_JSON_LINE,
    MAX_TEXT,
    _add_user_frame,
    _fold,
    _ignored_exception,
    _json_text,
    build_finding,
)
from trainmedic.detectors.lines import ANSI_RE, _by_line, _Lines, _record_boundary, _utf8_prefix, _valid_utf8, normalize
from trainmedic.detectors.phase import MAX_LINE as MAX_MARKER_LINE
from trainmedic.detectors.phase import PHASE_SENSITIVE, PhaseMarkers, load_phase_markers
from trainmedic.detectors.prefilter import _AnchorPrefilter, _Bigrams, _Choices, _HyperscanPrefilter, _Prefilter
from trainmedic.detectors.schema import Rule
from trainmedic.models import FaultClass, Finding, Source

# What other modules and the tests import from here, the prefilters' and the line helpers' private
# names included.
__all__ = [
    "ANSI_RE",
    "CHUNK_BYTES",
    "HYPERSCAN_AVAILABLE",
    "MAX_JSON_LINE",
    "MAX_RECORD_BYTES",
    "MAX_TEXT",
    "MEMO_SIZE",
    "Engine",
    "_AnchorPrefilter",
    "_Bigrams",
    "_Choices",
    "_HyperscanPrefilter",
    "_utf8_prefix",
    "_valid_utf8",
    "build_finding",
    "has_hyperscan",
    "normalize",
]

_hs = hsdb.hs

HYPERSCAN_AVAILABLE = _hs is not None

MAX_RECORD_BYTES = 64 << 20  # a record longer than this is classified in pieces
CHUNK_BYTES = 8 << 20  # streamed input is classified in chunks of about this size
MEMO_SIZE = 4096  # distinct candidate lines whose confirm result is remembered per chunk


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
