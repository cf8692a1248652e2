"""Hang detection without an explicit error line: a running job that stops making progress.

Most hangs print nothing: an NCCL/HCCL collective waits forever (the watchdog may be off, or its
timeout is 30 minutes away), a rank is stuck in a storage write, a data loader deadlocks. What is
visible is the absence of the lines a healthy job prints at a steady pace. This module learns that
pace per job and reports the silence that outlasts it.

The rule (all times are passed in; no wall clock, no asyncio, so tests replay days in seconds):

* **Progress** is a line matching a `progress` marker of detectors/progress.yaml (a training step
  or a log interval: tqdm bars, Megatron "iteration N/T |", DeepSpeed "step=N", ...). Checkpoint
  and evaluation markers, and the end-of-training marker, come from the same file.
* **Interval**: the median of the last `interval_samples` progress-to-progress gaps of each log
  stream (pooled over ranks). A gap that contains a checkpoint or evaluation marker, an evaluation
  bar or any other non-step progress is not sampled. It is the interval between progress *reports*,
  which equals the step time when every step is logged and `log_interval x step` otherwise.
* **Whole-job hang**: the job's most recent sign of progress (a progress line of any rank, or a
  checkpoint/evaluation marker) is older than `base = max(factor x interval, floor_s)`. Collective
  communication blocks every rank within one step of the others, so a real hang silences all of
  them; the bound is measured from the newest progress, which never fires while any rank moves.
  The finding is localised to the rank whose last progress is the oldest (the likeliest culprit).
* **Stalled rank**: a rank that has reported progress regularly (`min_reports` times) and is
  silent while another rank made progress after this rank's own deadline (`last + base`). Ranks
  that printed a bar once (weight loading) and never again are forgotten, not reported. Only ranks
  with a known rank number take part (pod names change when a pod is replaced).
* **Checkpoint and evaluation**: while a phase is open (its start marker seen, no end marker yet,
  no progress past the step where it began) the deadline becomes
  `max(phase start + max(phase_factor x interval, phase_floor_s, learned_margin x longest
  observed phase of that kind), newest progress + base)`. A save line without an end line
  ("Saving model checkpoint to X", the usual case) counts as a phase until the next progress line.
  A phase seen only at its end (Megatron's "validation loss at iteration N", nanoGPT's eval line,
  veRL's "val-core/" metrics) is recognised afterwards: its duration is learned, and once three
  such phases came at a regular step period, a silence that starts at a step where the next one is
  due gets the phase deadline too. Earlier occurrences of end-only phases must fit the base bound.
* **Utilisation**: when the job's accelerator utilisation was sampled at the end of the silence
  (the last `util_window_s` seconds, leaving out the first interval after the last progress, when
  the step in flight may still have been computing; at least two samples per device), a hang also
  requires every device series to be flat (population std-dev <= `flat_stddev` percentage
  points). Flat is not idle: a spinning NCCL kernel shows a steady 100 %. A device whose
  utilisation clearly varies is doing work without logging (a long unlogged evaluation): no
  finding until it goes flat. With no samples, log silence alone decides. A single stalled rank is
  judged on its log alone (which device a rank drives is not known; its node's others keep busy).
* **Before the first progress line** (start-up: image pull done, model and data loading) and
  **after the end-of-training marker** (final save, upload, shutdown), and for jobs whose log
  format has no known marker at all, any log line is a sign of life and the bound is
  `max(startup_floor_s, floor_s)` of complete silence. The same long bound applies while the
  interval is not known yet (fewer than `min_interval_samples` gaps).
* Only running jobs are checked (`observe_job`); a job that is no longer running is forgotten. A
  rank whose pod changes (the pod was replaced) restarts the job's state in start-up mode.
* A finding fires once per stall and re-arms when progress resumes.

Limits: a checkpoint save or an evaluation that prints nothing at all (PyTorch Lightning's
ModelCheckpoint without verbose, a bare torch.save in a custom loop) is covered by `floor_s` only;
raise the floor or add a marker. Per-line times (`times=`) make the interval exact; without them a
batch's lines share the batch time, which only makes the interval (and the bound) larger.

Errors:

    RuleLoadError (trainmedic.errors)   progress.yaml is unusable: every problem with file:line
"""

from __future__ import annotations

import functools
import logging
import math
import re
import re._compiler as sre_compile  # type: ignore[import-not-found]
import re._parser as sre_parse  # type: ignore[import-not-found]
import statistics
from collections import OrderedDict, deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum, StrEnum
from pathlib import Path
from re._constants import (  # type: ignore[import-not-found]
    AT,
    AT_BEGINNING,
    AT_BEGINNING_STRING,
    AT_BOUNDARY,
    AT_NON_BOUNDARY,
    BRANCH,
    IN,
    LITERAL,
    MAX_REPEAT,
    MIN_REPEAT,
    POSSESSIVE_REPEAT,
    SUBPATTERN,
)
from typing import Annotated, Any

import numpy as np
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from detectors.anchors import required_anchors
from trainmedic.datafile import format_error, node_line, parse_yaml, short_text
from trainmedic.errors import Problem, RuleLoadError
from trainmedic.models import Chip, FaultClass, Finding, I18nText, Severity, Source

_hs: Any
try:
    import hyperscan as _hs
except ImportError:  # pragma: no cover - exercised on hosts without the wheel
    _hs = None

log = logging.getLogger("trainmedic.detectors.hang")

MARKERS_FILE = Path(__file__).with_name("progress.yaml")
MAX_MARKER_FILE_BYTES = 1024 * 1024
# Only the tail of a longer line is matched (a tqdm stream without newlines grows to 16 KiB chunks
# in CRI logs; its newest update is at the end).
MAX_LINE_CHARS = 65536
# Keyword hits beyond which the fast scan hands over to the re path, per batch plus per line (a
# pathological line repeating a keyword would otherwise cost one Python callback per repetition;
# a tqdm line holds a bar's keyword once per update).
MAX_FAST_MATCHES = 4096
MAX_FAST_MATCHES_PER_LINE = 128
# A step that counts within an epoch is ordered as epoch * EPOCH_SCALE + step.
EPOCH_SCALE = 1_000_000_000
MAX_EVIDENCE_CHARS = 400

RULE_ID = "hang.no_progress"
CODE = "no_progress"

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_ALLOWED_GROUPS = frozenset({"step", "total", "epoch"})


# ------------------------------------------------------------------------------------------------
# The marker file
# ------------------------------------------------------------------------------------------------


class MarkerKind(StrEnum):
    PROGRESS = "progress"
    CHECKPOINT_START = "checkpoint_start"
    CHECKPOINT_END = "checkpoint_end"
    EVAL_START = "eval_start"
    EVAL_END = "eval_end"
    DONE = "done"
    # A run's banner: a (re)started run is loading; its cadence is learned anew.
    START = "start"
    # An epoch finished (the data loader restarts next): the pause that follows gets the epoch slack.
    EPOCH_END = "epoch_end"


_END_KINDS = frozenset({MarkerKind.CHECKPOINT_END, MarkerKind.EVAL_END})


def _check_pattern(pattern: str) -> str:
    try:
        rx = re.compile(pattern)
    except re.error as exc:
        raise ValueError(f"invalid regex {pattern!r}: {exc}") from None
    extra = set(rx.groupindex) - _ALLOWED_GROUPS
    if extra:
        raise ValueError(f"named groups {sorted(extra)} are not allowed (only step, total, epoch)")
    if rx.search("") is not None:
        raise ValueError("pattern matches an empty line")
    return pattern


class MarkerExample(BaseModel):
    """A line the marker must match, with the step (and epoch) it must extract when given."""

    model_config = ConfigDict(extra="forbid")

    line: str = Field(min_length=1)
    step: int | None = None
    epoch: int | None = None


class Marker(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(pattern=r"^[a-z0-9][a-z0-9_.-]*$", max_length=80)
    kind: MarkerKind
    framework: str = Field(min_length=1)
    # Where the wording comes from: the framework's file and function.
    source: str = Field(min_length=10)
    # Literal substrings; the pattern is only tried on lines holding one of them.
    keywords: list[Annotated[str, Field(min_length=2, pattern=r"^[^\n]+$")]] = Field(min_length=1)
    # Optional second gate: one of these must be in the line as well (cheap literal checks that
    # spare the regex on lines that only share a common keyword such as "step").
    requires: list[Annotated[str, Field(min_length=1)]] = Field(default_factory=list)
    pattern: Annotated[str, AfterValidator(_check_pattern)]
    examples: list[MarkerExample] = Field(min_length=1)
    no_match: list[str] = Field(default_factory=list)


class _MarkerFileHeader(BaseModel):
    model_config = ConfigDict(extra="forbid")

    version: int = Field(default=1, ge=1, le=1)
    markers: list[Any] = Field(default_factory=list)


@dataclass(frozen=True, slots=True)
class MarkerHit:
    """One marker found in one line."""

    marker_id: str
    kind: MarkerKind
    # Offset in the (ANSI-stripped) line, to order several markers of one line.
    pos: int
    step: int | None = None
    epoch: int | None = None
    total: int | None = None

    @property
    def position(self) -> int | None:
        """The step as an ordered number (epoch-relative steps folded into one scale)."""
        return _position(self.step, self.epoch)

    @property
    def step_text(self) -> str:
        return _step_text(self.step, self.epoch, self.total)


def _int_group(m: re.Match[str], name: str) -> int | None:
    if name not in m.re.groupindex:
        return None
    value = m.group(name)
    if value is None or len(value) > 18:
        return None
    return int(value)


def _number(m: re.Match[str], group: int) -> int | None:
    value = m.group(group)
    if value is None or len(value) > 18:
        return None
    return int(value)


def _position(step: int | None, epoch: int | None) -> int | None:
    if step is None:
        return None
    return step if epoch is None else epoch * EPOCH_SCALE + step


def _step_text(step: int | None, epoch: int | None, total: int | None) -> str:
    if step is None:
        return ""
    text = str(step) if total is None else f"{step}/{total}"
    return text if epoch is None else f"epoch {epoch} step {text}"


# -- making the marker regexes cheap to run, without changing what they match --------------------
#
# `re` skips ahead to a literal prefix (or a set of first characters) fast, but most marker patterns
# start with `\b` or `(?:^|...)`, or are case-insensitive, so a search tries the pattern at every
# offset; for a progress line, whose last match counts, that is the whole line twice. Three
# rewrites help, all exact:
#
# * `\bL...` (L a literal) becomes `L(?<=\bL)...`: the same matches, and `re` skips ahead to L.
# * `(?:^|[\r\]]|#015)...` becomes `^...`, tried at offset 0 only, and `(?:\r|\]|#015)...`, which
#   `re` skips ahead through by its first characters.
# * Otherwise, when every match holds one of a few literals within a few characters of its start
#   (`(?i)\b(?:global_)?(?:step|iter)...`: "global", "step", "iter"), the search starts just before
#   the first one, and a line without any has no match. Case-insensitive literals are compared on
#   the lower-cased line, which is exact for an ASCII line only; other lines are searched in full.
#
# `Pattern.search(line, pos)` and `Pattern.match(line, pos)` see the whole line (assertions and
# look-behinds look before `pos`), so starting later only skips offsets where no match can start.
# Rewritten regexes are compiled from edited parse trees (re._parser and re._compiler, which
# detectors/anchors.py reads too) and checked against the pattern on the marker's own examples.

_MAX_REACH = 64
_AT_START = (AT_BEGINNING, AT_BEGINNING_STRING)


def _min_width(sub: Any) -> int:
    return int(sub.getwidth()[0])


def _first_literals(items: list[Any], i: int) -> set[str] | None:
    """Literals one of which every match of `items[i:]` starts with (after zero-width assertions)."""
    n = len(items)
    while i < n:
        op, av = items[i]
        if op is AT:
            i += 1
            continue
        if op is LITERAL:
            run: list[str] = []
            while i < n and items[i][0] is LITERAL:
                run.append(chr(items[i][1]))
                i += 1
            return {"".join(run)}
        if op is BRANCH:
            out: set[str] = set()
            for alt in av[1]:
                found = _first_literals(list(alt), 0) if _min_width(alt) > 0 else None
                if found is None:
                    return None
                out |= found
            return out
        if op is SUBPATTERN:
            _group, add_flags, del_flags, sub = av
            if add_flags or del_flags or _min_width(sub) == 0:
                return None
            return _first_literals(list(sub), 0)
        if op in (MAX_REPEAT, MIN_REPEAT, POSSESSIVE_REPEAT):
            lo, _hi, body = av
            first = _first_literals(list(body), 0) if _min_width(body) > 0 else None
            if first is None or lo >= 1:
                return first
            rest = _first_literals(items, i + 1)
            return None if rest is None else first | rest
        return None
    return None


def _start_literals(parsed: Any) -> tuple[tuple[str, ...], int] | None:
    """(literals, reach): every match holds one of the literals at most `reach` characters after its
    start. None when no such set is known."""
    items = list(parsed)
    reach = 0
    for i in range(len(items)):
        found = _first_literals(items, i)
        if found is not None:
            # A literal that extends another one adds nothing: where it occurs, so does the shorter.
            kept = sorted(w for w in found if not any(o != w and w.startswith(o) for o in found))
            return tuple(kept), reach
        hi = sre_parse.SubPattern(parsed.state, [items[i]]).getwidth()[1]
        if hi >= sre_parse.MAXREPEAT:
            return None
        reach += hi
        if reach > _MAX_REACH:
            return None
    return None


def _literal_lead(parsed: Any) -> Any | None:
    """`\\bL rest` as `L(?<=\\bL) rest`: a parse tree that `re` compiles with a literal prefix."""
    items = list(parsed)
    if len(items) < 2 or items[0][0] is not AT or items[0][1] not in (AT_BOUNDARY, AT_NON_BOUNDARY):
        return None
    k = 1
    while k < len(items) and items[k][0] is LITERAL:
        k += 1
    if k == 1:
        return None
    lead = re.escape("".join(chr(av) for _, av in items[1:k]))
    assertion = r"\b" if items[0][1] is AT_BOUNDARY else r"\B"
    head = sre_parse.parse(f"{lead}(?<={assertion}{lead})", parsed.state.flags)
    return sre_parse.SubPattern(parsed.state, list(head) + items[k:])


def _agree(a: re.Pattern[str], b: re.Pattern[str], samples: Iterable[str]) -> bool:
    for s in samples:
        if [(m.span(), m.groups()) for m in a.finditer(s)] != [(m.span(), m.groups()) for m in b.finditer(s)]:
            return False
    return True


def _split_start(parsed: Any) -> tuple[Any, Any] | None:
    """`(?:^|[\\r\\]]|#015)rest` as `^rest`, tried at offset 0 only, and `(?:\\r|\\]|#015)rest`,
    which `re` searches by its first characters (parse trees), or None."""
    if parsed.state.flags & re.MULTILINE or parsed.getwidth()[0] == 0:
        return None
    items = list(parsed)
    if not items or items[0][0] is not BRANCH:
        return None
    alts = [list(alt) for alt in items[0][1][1]]
    k = 0
    while k < len(alts) and alts[k][:1] and alts[k][0][0] is AT and alts[k][0][1] in _AT_START:
        k += 1
    if k == 0 or k == len(alts):
        return None  # the start-only alternatives must come first: they are tried first at offset 0
    rest = items[1:]
    main: list[list[Any]] = []
    if len(alts) == k + 1 and alts[k][:1] and alts[k][0][0] in (LITERAL, IN):
        main.append(alts[k])  # one other alternative: `re` skips to its first character set
    else:
        for alt in alts[k:]:
            if alt[:1] and alt[0][0] is LITERAL:
                main.append(alt)
            elif alt[:1] and alt[0][0] is IN and all(op is LITERAL for op, _ in alt[0][1]):
                main.extend([(LITERAL, ch), *alt[1:]] for _, ch in alt[0][1])
            else:
                return None
    state = parsed.state

    def tree(branches: list[list[Any]]) -> Any:
        if len(branches) == 1:
            return sre_parse.SubPattern(state, [*branches[0], *rest])
        return sre_parse.SubPattern(
            state, [(BRANCH, (None, [sre_parse.SubPattern(state, b) for b in branches])), *rest]
        )

    return tree(alts[:k]), tree(main)


def _split_finditer(head: re.Pattern[str], main: re.Pattern[str], text: str) -> list[re.Match[str]] | None:
    found: list[re.Match[str]] = []
    m = head.match(text) or main.search(text)
    while m is not None:
        found.append(m)
        if m.end() == m.start():
            return None
        m = main.search(text, m.end())
    return found


@dataclass(frozen=True, slots=True)
class _Fast:
    """How a marker regex is run: see the comment above."""

    rx: re.Pattern[str]
    # The regex starts with a literal or a few characters: `re` skips ahead to them by itself.
    prefixed: bool = False
    # Tried at offset 0 before `rx` is searched (the start-only alternatives `rx` was split from).
    head: re.Pattern[str] | None = None
    starts: tuple[str, ...] = ()
    folded: bool = False
    reach: int = 0


def _accelerate(marker: Marker, rx: re.Pattern[str]) -> _Fast:
    """The fastest exact way to run `rx` (a rewrite is also checked against `rx` on the marker's
    own examples before it is used)."""
    try:
        parsed = sre_parse.parse(marker.pattern)
    except (re.error, RecursionError):  # pragma: no cover - the loader compiled it already
        return _Fast(rx)
    folded = bool(parsed.state.flags & re.IGNORECASE)
    if not folded:
        items = list(parsed)
        if items and items[0][0] is LITERAL:
            return _Fast(rx, prefixed=True)
        tree = _literal_lead(parsed)
        if tree is not None:
            try:
                fast_rx: re.Pattern[str] = sre_compile.compile(tree, 0)
            except (re.error, RecursionError, TypeError, ValueError):  # pragma: no cover
                fast_rx = rx
            samples = [ex.line for ex in marker.examples] + marker.no_match
            if fast_rx is not rx and fast_rx.groupindex == rx.groupindex and _agree(rx, fast_rx, samples):
                return _Fast(fast_rx, prefixed=True)
        split = _split_start(parsed)
        if split is not None:
            try:
                head, main = (sre_compile.compile(t, 0) for t in split)
            except (re.error, RecursionError, TypeError, ValueError):  # pragma: no cover
                head = main = rx
            samples = [ex.line for ex in marker.examples] + marker.no_match
            if main is not rx and all(
                [(m.span(), m.groups()) for m in rx.finditer(s)]
                == [(m.span(), m.groups()) for m in _split_finditer(head, main, s) or ()]
                for s in samples
            ):
                return _Fast(main, prefixed=True, head=head)
    starts = _start_literals(parsed)
    if starts is None or not starts[0]:
        return _Fast(rx)
    literals, reach = starts
    if folded:
        if not all(w.isascii() for w in literals):
            return _Fast(rx)
        literals = tuple(sorted({w.lower() for w in literals}))
    return _Fast(rx, starts=literals, folded=folded, reach=reach)


def _trie_pattern(words: Iterable[str]) -> str:
    """One regex for a set of literals, as a trie: at each offset it matches the longest one."""
    root: dict[str, Any] = {}
    for word in words:
        node = root
        for ch in word:
            node = node.setdefault(ch, {})
        node[""] = {}

    def emit(node: dict[str, Any]) -> str:
        alts = [re.escape(ch) + emit(sub) for ch, sub in sorted(node.items()) if ch]
        if not alts:
            return ""
        body = alts[0] if len(alts) == 1 else "(?:" + "|".join(alts) + ")"
        if "" in node:
            return f"(?:{body})?"
        return body

    return emit(root)


_KIND_BIT = {kind: 1 << i for i, kind in enumerate(MarkerKind)}

# A marker found in a line: (kind, offset in the ANSI-stripped line, step, epoch, total, marker index).
RawHit = tuple[MarkerKind, int, int | None, int | None, int | None, int]

_CACHE_LIMIT = 4096
_TRIE_LIMIT = 256
# Keyword tries narrowed per line (see ProgressMatcher._mask_of) before `in` checks take over.
_MAX_TRIE_SWITCHES = 3
# Keyword masks are reduced with numpy int64 when every keyword has a bit there.
_NUMPY_MASK_BITS = 62
# Keyword occurrences in a batch from which numpy maps them to lines (below, a plain loop does).
_NUMPY_FROM = 64


@dataclass(frozen=True, slots=True)
class _Compiled:
    """A marker ready to match: its regex, required literals and group numbers (0: none)."""

    index: int
    kind: MarkerKind
    kind_bit: int
    progress: bool
    rx: re.Pattern[str]
    # The pattern as written (for finditer's rules after an empty match).
    orig: re.Pattern[str]
    requires: tuple[str, ...]
    # See _accelerate: the regex starts with a literal, or one of `starts` occurs at most `reach`
    # characters after a match's start (lower case and compared case-insensitively if `folded`).
    prefixed: bool
    head: re.Pattern[str] | None
    starts: tuple[str, ...]
    folded: bool
    reach: int
    # Or, when neither is known: every match contains one of these (detectors.anchors).
    literals: tuple[str, ...]
    step_group: int
    epoch_group: int
    total_group: int

    def _search(self, line: str, lowered: str | None, pos: int) -> re.Match[str] | None:
        """`rx.search(line, pos)`, trying the regex only where a match can start."""
        rx = self.rx
        if not self.starts:
            for word in self.literals:
                if line.find(word, pos) >= 0:
                    break
            else:
                if self.literals:
                    return None
            return rx.search(line, pos)
        hay = line
        if self.folded:
            if lowered is None:
                return rx.search(line, pos)  # not ASCII: folded literals cannot be compared
            hay = lowered
        # A match starting at j holds a start literal at some q in [j, j + reach]: no match starts
        # before the first occurrence less `reach`, and none at all without one.
        q = -1
        for word in self.starts:
            x = hay.find(word, pos)
            if x >= 0 and (q < 0 or x < q):
                q = x
        if q < 0:
            return None
        return rx.search(line, q - self.reach if q - self.reach > pos else pos)

    def find(self, line: str) -> re.Match[str] | None:
        """What `match_line` finds: the first match, or for progress the last one (a tqdm line
        holds many updates), by the same search / finditer, only skipping what cannot match."""
        rx = self.rx
        prefixed = self.prefixed
        lowered = line.lower() if self.folded and line.isascii() else None
        if not prefixed:
            m = self._search(line, lowered, 0)
        elif self.head is None or (m := self.head.match(line)) is None:
            m = rx.search(line)
        if m is None or not self.progress:
            return m
        # The rest of finditer's chain: each next match is searched for where the last one ended.
        while True:
            end = m.end()
            if end == m.start():
                break
            after = rx.search(line, end) if prefixed else self._search(line, lowered, end)
            if after is None:
                return m
            if after.end() == after.start():
                break
            m = after
        # An empty match: finditer's own rules decide what follows it.
        end = m.end() if m.end() > m.start() else 0
        for m in self.orig.finditer(line, end) if end else self.orig.finditer(line):  # noqa: B007
            pass
        return m


# A marker to try on a line, with the longer keywords one of which must be in the line for it to
# be gated there (None: a scanned keyword gates it).
_Step = tuple[_Compiled, tuple[str, ...] | None]


class ProgressMatcher:
    """Finds progress/checkpoint/evaluation markers in log lines.

    Most lines hold no marker. A batch is joined and scanned once for the marker keywords: with
    Hyperscan (the `fast` extra) as one literal set at GB/s, else with one `re` trie of the
    keywords. Only the few lines holding a keyword are looked at, and only with the regexes of the
    markers those keywords gate, in the faster form `_accelerate` gives them. Both paths give the
    same result, and the same as `match_line` on every line that holds a keyword
    (tests/test_hang.py checks them against each other on random input).

    Only the *minimal* keywords (those containing no other keyword) are scanned for: a line holding
    "iteration" holds "iter", so "iteration" is checked with `in` on the lines where "iter" was
    found, when the marker it gates is tried. That halves the scan's callbacks on Megatron and
    DeepSpeed logs.
    """

    def __init__(self, markers: Sequence[Marker], *, fast: bool | None = None) -> None:
        self.markers: tuple[Marker, ...] = tuple(markers)
        # The straightforward per-line matcher (`match_line`) runs the patterns as written.
        self._compiled: list[tuple[Marker, re.Pattern[str], tuple[str, ...]]] = [
            (m, re.compile(m.pattern), tuple(m.requires)) for m in self.markers
        ]
        self.keywords: tuple[str, ...] = tuple(
            sorted({k for m in self.markers for k in m.keywords}, key=len, reverse=True)
        )
        if any("\n" in k for k in self.keywords):
            raise ValueError("a marker keyword must not contain a newline")
        kw_index = {k: i for i, k in enumerate(self.keywords)}
        # keyword id -> the markers it gates (indices in file order)
        self._gates: list[list[int]] = [[] for _ in self.keywords]
        for mi, marker in enumerate(self.markers):
            for k in marker.keywords:
                self._gates[kw_index[k]].append(mi)
        self._specs: tuple[_Compiled, ...] = tuple(
            _compile_marker(mi, marker, rx, requires) for mi, (marker, rx, requires) in enumerate(self._compiled)
        )
        # Minimal keywords are scanned for; a longer keyword is found through the ones it contains.
        words = self.keywords
        self._minimal: tuple[int, ...] = tuple(
            i for i, k in enumerate(words) if not any(j != i and o in k for j, o in enumerate(words))
        )
        self._bit_of: dict[str, int] = {words[i]: 1 << i for i in self._minimal}
        self._kw_shift = max(1, (len(words) - 1).bit_length())
        # Memos: minimal keyword set (bit mask) -> the markers to try / a trie of the other keywords.
        self._plans: dict[int, tuple[_Step, ...]] = {}
        self._tries: dict[int, re.Pattern[str] | None] = {}

        if fast and _hs is None:
            raise RuntimeError("fast path requested but the hyperscan module is not installed")
        self.fast = bool(words) and (_hs is not None if fast is None else fast)
        self._prefilter: re.Pattern[str] | None = (
            re.compile(_trie_pattern(words[i] for i in self._minimal)) if words else None
        )
        self._hs_db: Any = None
        if self.fast:
            db = _hs.Database(mode=_hs.HS_MODE_BLOCK)
            exprs = [re.escape(words[i]).encode("utf-8") for i in self._minimal]
            db.compile(expressions=exprs, ids=list(self._minimal), elements=len(exprs), flags=[0] * len(exprs))
            self._hs_db = db

    # -- the straightforward per-line path ------------------------------------------------------

    def match_line(self, line: str, keyword_ids: Iterable[int] | None = None) -> list[MarkerHit]:
        """The markers of one line: the first marker of each kind in file order, ends first.

        `keyword_ids` are the keywords already known to be in the line; by default they are looked
        up here. This is the reference the batch path (`scan`, `hits`) is tested against.
        """
        if len(line) > MAX_LINE_CHARS:
            line = line[-MAX_LINE_CHARS:]
        if "\x1b" in line:
            line = _ANSI.sub("", line)
        if keyword_ids is None:
            keyword_ids = [i for i, k in enumerate(self.keywords) if k in line]
        gates = self._gates
        todo = sorted({mi for ki in keyword_ids for mi in gates[ki]})
        hits: list[MarkerHit] = []
        kinds: set[MarkerKind] = set()
        for mi in todo:
            marker, rx, requires = self._compiled[mi]
            if marker.kind in kinds:
                continue
            if requires:
                for word in requires:
                    if word in line:
                        break
                else:
                    continue
            m: re.Match[str] | None = None
            if marker.kind is MarkerKind.PROGRESS:
                # A tqdm line holds many updates: the newest (last) one counts.
                for m in rx.finditer(line):  # noqa: B007
                    pass
            else:
                m = rx.search(line)
            if m is None:
                continue
            kinds.add(marker.kind)
            hits.append(
                MarkerHit(
                    marker_id=marker.id,
                    kind=marker.kind,
                    pos=m.start(),
                    step=_int_group(m, "step"),
                    epoch=_int_group(m, "epoch"),
                    total=_int_group(m, "total"),
                )
            )
        if len(hits) > 1:
            hits.sort(key=lambda h: (h.kind not in _END_KINDS, h.pos))
        return hits

    def has_keyword(self, line: str) -> bool:
        """Whether the raw line holds a keyword: the batch path only looks at such lines."""
        return any(k in line for k in self.keywords)

    # -- the batch path -------------------------------------------------------------------------

    def scan(self, lines: Sequence[str]) -> list[tuple[int, str, list[MarkerHit]]]:
        """(index, line, hits) for each line of the batch that holds a marker."""
        out: list[tuple[int, str, list[MarkerHit]]] = []
        for index, line, hits in self.hits(lines):
            out.append((index, line, [self._marker_hit(h) for h in hits]))
        return out

    def hits(self, lines: Sequence[str], *, with_index: bool = True) -> list[tuple[int, str, list[RawHit]]]:
        """`scan` in compact form, the hits as tuples. Without `with_index` an index may be -1.

        The index is the line's position in `lines`; a line holding newlines is matched piece by
        piece, each piece reported with the index of the line it came from.
        """
        if self._prefilter is None or not lines:
            return []
        text = lines[0] if len(lines) == 1 else "\n".join(lines)
        if self._hs_db is not None:
            data = text.encode("utf-8", "surrogatepass")
            found = self._scan_fast(data, len(lines))
            if found is not None:
                return self._hits_fast(lines, data, found) if found else []
            # A keyword repeated thousands of times: the re path skips to the next line instead.
        return self._hits_re(lines, text, with_index)

    def _scan_fast(self, data: bytes, lines: int = 1) -> list[int] | None:
        """Every keyword occurrence as `end << shift | keyword id`; None when the scan gave up."""
        found: list[int] = []
        add = found.append
        shift = self._kw_shift
        limit = MAX_FAST_MATCHES + MAX_FAST_MATCHES_PER_LINE * lines

        def on_match(kid: int, _start: int, end: int, _flags: int, _ctx: object) -> bool:
            add(end << shift | kid)
            return len(found) >= limit

        try:
            self._hs_db.scan(data, match_event_handler=on_match)
        except _hs.ScanTerminated:
            return None
        return found

    def _hits_fast(self, lines: Sequence[str], data: bytes, found: list[int]) -> list[tuple[int, str, list[RawHit]]]:
        rows, masks, newlines = (self._rows_numpy if len(found) >= _NUMPY_FROM else self._rows_plain)(data, found)
        confirm = self._confirm
        out: list[tuple[int, str, list[RawHit]]] = []
        if newlines == len(lines) - 1:
            # No line holds a newline: physical lines are the batch's lines.
            for row, mask in zip(rows, masks, strict=True):
                line = lines[row]
                line_hits = confirm(line, mask)
                if line_hits:
                    out.append((row, line, line_hits))
            return out
        owner = [i for i, line in enumerate(lines) for _ in range(line.count("\n") + 1)]
        ends: list[int] = np.flatnonzero(np.frombuffer(data, dtype=np.uint8) == 10).tolist()
        for row, mask in zip(rows, masks, strict=True):
            start = ends[row - 1] + 1 if row else 0
            stop = ends[row] if row < len(ends) else len(data)
            line = data[start:stop].decode("utf-8", "surrogatepass")
            line_hits = confirm(line, mask)
            if line_hits:
                out.append((owner[row], line, line_hits))
        return out

    def _rows_numpy(self, data: bytes, found: list[int]) -> tuple[list[int], list[int], int]:
        """(physical line of each line holding a keyword, its keyword mask, newlines in `data`), in a
        few vectorised steps: newline offsets, a binary search per occurrence, an OR per line."""
        shift = self._kw_shift
        nl = np.flatnonzero(np.frombuffer(data, dtype=np.uint8) == 10)
        values = np.array(found, dtype=np.int64)
        values.sort()
        kids = values & ((1 << shift) - 1)
        # A keyword holds no newline: the newlines before its last byte number its line.
        rows = np.searchsorted(nl, (values >> shift) - 1)
        first = np.flatnonzero(np.diff(rows, prepend=-1))
        row_list: list[int] = rows[first].tolist()
        if len(self.keywords) <= _NUMPY_MASK_BITS:
            masks: list[int] = np.bitwise_or.reduceat(np.left_shift(1, kids), first).tolist()
        else:
            masks = [0] * len(row_list)
            at = -1
            last_row = -1
            for row, kid in zip(rows.tolist(), kids.tolist(), strict=True):
                if row != last_row:
                    at += 1
                    last_row = row
                masks[at] |= 1 << kid
        return row_list, masks, len(nl)

    def _rows_plain(self, data: bytes, found: list[int]) -> tuple[list[int], list[int], int]:
        """`_rows_numpy` for a few occurrences (a small batch), where numpy's fixed costs dominate."""
        found.sort()
        shift = self._kw_shift
        low = (1 << shift) - 1
        count, find, rfind = data.count, data.find, data.rfind
        rows: list[int] = []
        masks: list[int] = []
        index = counted = 0
        end = -1
        for value in found:
            at = value >> shift
            if at > end:  # the keyword ends past the current line: a new line
                start = rfind(b"\n", 0, at) + 1
                index += count(b"\n", counted, start)
                counted = start
                end = find(b"\n", at)
                if end < 0:
                    end = len(data)
                rows.append(index)
                masks.append(1 << (value & low))
            else:
                masks[-1] |= 1 << (value & low)
        return rows, masks, index + count(b"\n", counted)

    def _hits_re(self, lines: Sequence[str], text: str, with_index: bool) -> list[tuple[int, str, list[RawHit]]]:
        assert self._prefilter is not None
        search = self._prefilter.search
        confirm = self._confirm
        size = len(text)
        out: list[tuple[int, str, list[RawHit]]] = []
        index = 0 if with_index else -1
        counted = 0
        m = search(text)
        while m is not None:
            start = text.rfind("\n", 0, m.start()) + 1
            end = text.find("\n", m.end())
            if end < 0:
                end = size
            line = text[start:end]
            # (A longer line is matched by its tail, whose keywords _confirm looks up itself.)
            mask = self._mask_of(line, m.start() - start) if end - start <= MAX_LINE_CHARS else 0
            line_hits = confirm(line, mask)
            if line_hits:
                if with_index:
                    index += text.count("\n", counted, start)
                    counted = start
                out.append((index, line, line_hits))
            m = search(text, end + 1)
        if with_index and out and index + text.count("\n", counted) != len(lines) - 1:
            # Some line holds newlines: map physical lines back to the batch's lines.
            owner = [i for i, line in enumerate(lines) for _ in range(line.count("\n") + 1)]
            out = [(owner[i], line, line_hits) for i, line, line_hits in out]
        return out

    def _confirm(self, line: str, mask: int) -> list[RawHit]:
        """The hits of one line whose raw text holds the minimal keywords of `mask`."""
        text = line
        if len(text) > MAX_LINE_CHARS or "\x1b" in text:
            # Matched as match_line does: the tail, without colours, and its own keywords.
            if len(text) > MAX_LINE_CHARS:
                text = text[-MAX_LINE_CHARS:]
            if "\x1b" in text:
                text = _ANSI.sub("", text)
            mask = self._mask_of(text, 0)
        plan = self._plans.get(mask)
        if plan is None:
            plan = self._plan(mask)
        hits: list[RawHit] = []
        kinds = 0
        for spec, longer in plan:
            if kinds & spec.kind_bit:
                continue
            if longer is not None:
                for word in longer:
                    if word in text:
                        break
                else:
                    continue
            if spec.requires:
                for word in spec.requires:
                    if word in text:
                        break
                else:
                    continue
            m = spec.find(text)
            if m is None:
                continue
            kinds |= spec.kind_bit
            g = spec.step_group
            step = _number(m, g) if g else None
            g = spec.epoch_group
            epoch = _number(m, g) if g else None
            g = spec.total_group
            total = _number(m, g) if g else None
            hits.append((spec.kind, m.start(), step, epoch, total, spec.index))
        if len(hits) > 1:
            hits.sort(key=lambda h: (h[0] not in _END_KINDS, h[1]))
        return hits

    def _mask_of(self, line: str, pos: int) -> int:
        """The minimal keywords of a line whose first keyword starts at `pos` (or later)."""
        assert self._prefilter is not None
        rx = self._prefilter
        bit_of = self._bit_of
        mask = 0
        # Every offset where a keyword starts (a minimal keyword is never a prefix of another, and
        # occurrences may overlap). Once a keyword repeats (a tqdm line repeats its bar's), only the
        # keywords not found yet are looked for: at most one search per keyword of the line. A line
        # that keeps repeating new ones (garbage) is checked keyword by keyword instead.
        switches = 0
        m = rx.search(line, pos)
        while m is not None:
            bit = bit_of[m.group()]
            if not mask & bit:
                mask |= bit
            elif switches == _MAX_TRIE_SWITCHES:
                for word, other in bit_of.items():
                    if not mask & other and line.find(word, m.start()) >= 0:
                        mask |= other
                return mask
            else:
                switches += 1
                others = self._others(mask)
                if others is None:
                    return mask
                rx = others
            m = rx.search(line, m.start() + 1)
        return mask

    def _others(self, mask: int) -> re.Pattern[str] | None:
        """The keyword trie without the keywords of `mask` (None: no keyword is left)."""
        rx = self._tries.get(mask)
        if rx is None and mask not in self._tries:
            words = [w for w, bit in self._bit_of.items() if not mask & bit]
            rx = re.compile(_trie_pattern(words)) if words else None
            if len(self._tries) >= _TRIE_LIMIT:
                self._tries.clear()
            self._tries[mask] = rx
        return rx

    def _plan(self, mask: int) -> tuple[_Step, ...]:
        """The markers gated by the keywords of a line whose minimal keywords are `mask`."""
        present = [self.keywords[i] for i in _bits(mask)]
        steps: list[_Step] = []
        for spec, marker in zip(self._specs, self.markers, strict=True):
            if any(k in present for k in marker.keywords):
                steps.append((spec, None))
                continue
            # A longer keyword can only be in the line if one it contains was found.
            longer = tuple(k for k in marker.keywords if any(p in k for p in present))
            if longer:
                steps.append((spec, longer))
        plan = tuple(steps)
        if len(self._plans) >= _CACHE_LIMIT:
            self._plans.clear()
        self._plans[mask] = plan
        return plan

    def _marker_hit(self, hit: RawHit) -> MarkerHit:
        kind, pos, step, epoch, total, index = hit
        return MarkerHit(marker_id=self.markers[index].id, kind=kind, pos=pos, step=step, epoch=epoch, total=total)


def _compile_marker(index: int, marker: Marker, rx: re.Pattern[str], requires: tuple[str, ...]) -> _Compiled:
    try:
        fast = _accelerate(marker, rx)
        anchors = frozenset() if fast.prefixed or fast.starts else required_anchors(marker.pattern) or frozenset()
    except RecursionError:  # a deeply nested pattern: run it as written
        fast, anchors = _Fast(rx), frozenset()
    return _Compiled(
        index=index,
        kind=marker.kind,
        kind_bit=_KIND_BIT[marker.kind],
        progress=marker.kind is MarkerKind.PROGRESS,
        rx=fast.rx,
        orig=rx,
        requires=requires,
        prefixed=fast.prefixed,
        head=fast.head,
        starts=fast.starts,
        folded=fast.folded,
        reach=fast.reach,
        # Case-insensitive anchors cannot be checked with `in`: then none are used.
        literals=() if any(a.ci for a in anchors) else tuple(sorted(a.literal.decode("utf-8") for a in anchors)),
        step_group=fast.rx.groupindex.get("step", 0),
        epoch_group=fast.rx.groupindex.get("epoch", 0),
        total_group=fast.rx.groupindex.get("total", 0),
    )


def _bits(mask: int) -> Iterator[int]:
    i = 0
    while mask:
        if mask & 1:
            yield i
        mask >>= 1
        i += 1


@dataclass(frozen=True)
class ProgressMarkers:
    """Validated markers, where each came from, and the matcher built from them."""

    markers: tuple[Marker, ...]
    origins: dict[str, tuple[str, int | None]]
    matcher: ProgressMatcher


def parse_markers(text: str, name: str) -> tuple[list[tuple[Marker, int | None]], list[Problem]]:
    """Parse marker-file text. Returns the valid markers (with their line) and every problem found."""
    problems: list[Problem] = []
    root, data, problem = parse_yaml(text, name)
    if problem is not None:
        return [], [problem]
    if not isinstance(data, dict):
        return [], [Problem(name, 1, "a marker file is a mapping with `version` and `markers`")]
    try:
        header = _MarkerFileHeader.model_validate(data)
    except ValidationError as exc:
        return [], [Problem(name, node_line(root, e["loc"]), format_error(e)) for e in exc.errors()]
    if not header.markers:
        return [], [Problem(name, node_line(root, ["markers"]), "no markers")]

    good: list[tuple[Marker, int | None]] = []
    seen: dict[str, int | None] = {}
    for i, item in enumerate(header.markers):
        line = node_line(root, ["markers", i])
        marker_id = item.get("id") if isinstance(item, dict) else None
        try:
            marker = Marker.model_validate(item)
        except ValidationError as exc:
            for err in exc.errors():
                problems.append(
                    Problem(
                        name,
                        node_line(root, ["markers", i, *err["loc"]]),
                        format_error(err),
                        str(marker_id) if marker_id else None,
                    )
                )
            continue
        if marker.id in seen:
            problems.append(Problem(name, line, f"duplicate id, first defined at line {seen[marker.id]}", marker.id))
            continue
        seen[marker.id] = line
        good.append((marker, line))

    # Every example is run through the real matcher built from the whole file, so a marker shadowed
    # by an earlier one of the same kind is caught here, not in production.
    matcher = ProgressMatcher([m for m, _ in good])
    for marker, line in good:
        for ex in marker.examples:
            hit = next((h for h in _match_all(matcher, ex.line) if h.marker_id == marker.id), None)
            if hit is None:
                taken = [h.marker_id for h in _match_all(matcher, ex.line) if h.kind is marker.kind]
                why = f" (taken by {taken[0]})" if taken else ""
                problems.append(Problem(name, line, f"example does not match{why}: {short_text(ex.line)}", marker.id))
                continue
            if ex.step is not None and hit.step != ex.step:
                problems.append(
                    Problem(
                        name,
                        line,
                        f"example gives step {hit.step}, expected {ex.step}: {short_text(ex.line)}",
                        marker.id,
                    )
                )
            if ex.epoch is not None and hit.epoch != ex.epoch:
                problems.append(
                    Problem(
                        name,
                        line,
                        f"example gives epoch {hit.epoch}, expected {ex.epoch}: {short_text(ex.line)}",
                        marker.id,
                    )
                )
        for neg in marker.no_match:
            if any(h.marker_id == marker.id for h in _match_all(matcher, neg)):
                problems.append(Problem(name, line, f"no_match example matches: {short_text(neg)}", marker.id))
    return good, problems


def _match_all(matcher: ProgressMatcher, text: str) -> list[MarkerHit]:
    """Hits of a (possibly multi-line) example through the batch path the detector uses."""
    return [h for _, _, hits in matcher.scan(text.split("\n")) for h in hits]


def load_markers(path: Path | None = None) -> ProgressMarkers:
    """Load and validate a marker file (the shipped detectors/progress.yaml by default).

    Raises RuleLoadError carrying every problem, each with file and line.
    """
    path = path or MARKERS_FILE
    name = str(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise RuleLoadError([Problem(name, None, f"cannot read: {exc.strerror or exc}")]) from None
    if len(raw) > MAX_MARKER_FILE_BYTES:
        raise RuleLoadError([Problem(name, None, f"file is {len(raw)} bytes, over the {MAX_MARKER_FILE_BYTES} limit")])
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RuleLoadError([Problem(name, None, f"not UTF-8: {exc}")]) from None
    good, problems = parse_markers(text, name)
    if problems or not good:
        raise RuleLoadError(problems or [Problem(name, None, "no markers")])
    markers = tuple(m for m, _ in good)
    return ProgressMarkers(
        markers=markers,
        origins={m.id: (name, line) for m, line in good},
        matcher=ProgressMatcher(markers),
    )


@functools.cache
def shipped_markers() -> ProgressMarkers:
    """The shipped marker file, loaded and validated once per process."""
    return load_markers()


# ------------------------------------------------------------------------------------------------
# Settings
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class HangSettings:
    """Tuning of the hang detector. All durations in seconds."""

    # A silence must outlast max(factor x interval, floor_s) to be a hang (the interval is the
    # `interval_quantile` of the recent step gaps). With a step every 2 s: 20 s.
    floor_s: float = 20.0
    factor: float = 4.0
    interval_quantile: float = 0.9
    # Complete log silence tolerated before the first progress line, after the end-of-training
    # marker, for jobs without any known marker, and while the interval is not learned yet.
    startup_floor_s: float = 1800.0
    # Progress gaps needed before the interval is trusted, and how many recent gaps the median uses.
    min_interval_samples: int = 3
    interval_samples: int = 64
    # Deadline of an open checkpoint or evaluation phase, from its start:
    # max(phase_factor x interval, phase_floor_s, learned_margin x longest observed phase).
    phase_factor: float = 20.0
    phase_floor_s: float = 900.0
    learned_margin: float = 1.5
    # Phase durations remembered per kind (the longest of them is used).
    learned_phases: int = 8
    # Progress reports a rank needs before it can be reported as a lone stalled rank, and the
    # shortest lag behind the other ranks that can make it one (log shipping lags between nodes).
    min_reports: int = 3
    rank_floor_s: float = 60.0
    # Slack after the last step of an epoch (the data loader restarts its workers, reshuffles, ...):
    # max(base, epoch_floor_s, learned_margin x longest boundary pause seen).
    epoch_floor_s: float = 180.0
    # Frameworks whose evaluation prints only its result (Megatron, nanoGPT): until the period of
    # those evaluations is learned, a silence that begins at a multiple of `round_steps` (evaluation
    # intervals are round numbers) gets the phase deadline.
    round_steps: int = 100
    # Utilisation: the window (end of the silence) and the std-dev (percentage points) below which
    # a device series counts as flat; at least two samples per series are needed to judge.
    util_window_s: float = 120.0
    flat_stddev: float = 5.0
    util_samples: int = 512
    # State of a job that is not (or no longer) known to run is dropped after this much silence.
    stale_s: float = 3600.0

    def __post_init__(self) -> None:
        for name in (
            "floor_s",
            "factor",
            "startup_floor_s",
            "phase_factor",
            "phase_floor_s",
            "util_window_s",
            "rank_floor_s",
            "epoch_floor_s",
        ):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"HangSettings.{name} must be a positive number, got {value!r}")
        if self.learned_margin < 1 or not math.isfinite(self.learned_margin):
            raise ValueError(f"HangSettings.learned_margin must be >= 1, got {self.learned_margin!r}")
        if not (0.5 <= self.interval_quantile <= 1.0):
            raise ValueError(f"HangSettings.interval_quantile must be in [0.5, 1], got {self.interval_quantile!r}")
        if self.flat_stddev < 0 or not math.isfinite(self.flat_stddev):
            raise ValueError(f"HangSettings.flat_stddev must be >= 0, got {self.flat_stddev!r}")
        for name in (
            "min_interval_samples",
            "interval_samples",
            "learned_phases",
            "min_reports",
            "util_samples",
            "round_steps",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"HangSettings.{name} must be >= 1")
        if self.interval_samples < self.min_interval_samples:
            raise ValueError("HangSettings.interval_samples must be >= min_interval_samples")
        if self.stale_s <= 0:
            raise ValueError("HangSettings.stale_s must be positive")


# ------------------------------------------------------------------------------------------------
# Per-job state
# ------------------------------------------------------------------------------------------------


class _Mode(Enum):
    STARTUP = "startup"
    TRAINING = "training"
    DONE = "done"


_CHECKPOINT = "checkpoint"
_EVAL = "eval"
# Pseudo-phases: the pause after an epoch's last step, and unexplained pauses that recur at a
# regular step period (learned like end-only phases).
_EPOCH = "epoch"
_STALL = "stall"
_PHASE_OF = {
    MarkerKind.CHECKPOINT_START: _CHECKPOINT,
    MarkerKind.CHECKPOINT_END: _CHECKPOINT,
    MarkerKind.EVAL_START: _EVAL,
    MarkerKind.EVAL_END: _EVAL,
}


@dataclass(slots=True)
class _Stream:
    """One log stream of the job (one rank's container)."""

    rank: int | None
    pod: str | None
    node: str | None
    last_activity: float
    # Last sign of progress (steps, evaluation bars); the lone-rank check uses it.
    last_progress: float | None = None
    # Last real training step, the start of the next interval sample.
    last_step_t: float | None = None
    # Something other than a plain step happened since last_step_t: the next gap is not sampled.
    tainted: bool = False
    reports: int = 0


@dataclass(slots=True)
class _Phase:
    kind: str
    start: float
    # Progress beyond this step ends the phase: the job's step when the phase began, or the step the
    # marker names when it is later (the marker of one rank can arrive before another rank's
    # progress line of that same step).
    baseline: int | None
    opener: str
    # The step the marker names (or the baseline): an end marker naming it is the same phase.
    step: int | None


@dataclass(slots=True)
class _Job:
    key: str
    since: float
    running: bool = False
    mode: _Mode = _Mode.STARTUP
    chip: Chip = Chip.GENERIC
    last_activity: float = -math.inf
    streams: dict[str, _Stream] = field(default_factory=dict)
    # Streams that reported progress, oldest progress first (move_to_end on each report).
    order: OrderedDict[str, None] = field(default_factory=OrderedDict)
    # Newest sign of progress of any stream, or checkpoint/evaluation marker (training mode).
    anchor: float | None = None
    max_step: int | None = None
    # (step, epoch, total) of max_step, formatted only when a finding shows it.
    max_step_parts: tuple[int | None, int | None, int | None] | None = None
    train_total: int | None = None
    odd_streak: int = 0
    odd_since: float = 0.0
    intervals: deque[float] = field(default_factory=deque)
    median: float | None = None
    median_dirty: bool = False
    phase: _Phase | None = None
    phase_mark: float = -math.inf
    durations: dict[str, deque[float]] = field(default_factory=dict)
    phase_steps: dict[str, deque[int]] = field(default_factory=dict)
    last_phase_step: dict[str, int] = field(default_factory=dict)
    # The last step of an epoch (epoch-relative counters), learned when the epoch number moves on.
    epoch_last: int | None = None
    # Progress comes from a framework whose evaluations show only at their end.
    end_only: bool = False
    # The step after which an epoch_end marker came.
    epoch_end_step: int | None = None
    fired: bool = False
    lone_reported: set[str] = field(default_factory=set)
    util: dict[tuple[str | None, str | None], deque[tuple[float, float]]] = field(default_factory=dict)
    evidence: str = ""

    def reset_progress(self, t: float) -> None:
        """A restart: back to start-up; keep what was learned about the pace and the phases."""
        self.mode = _Mode.STARTUP
        self.streams.clear()
        self.order.clear()
        self.anchor = None
        self.max_step = None
        self.max_step_parts = None
        self.train_total = None
        self.odd_streak = 0
        self.phase = None
        self.fired = False
        self.lone_reported.clear()
        self.since = t
        self.last_activity = t


def _quantile(ordered: Sequence[float], q: float) -> float:
    """The q-quantile of sorted values, linearly interpolated (numpy's default method)."""
    at = (len(ordered) - 1) * q
    lo = math.floor(at)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (at - lo)


def _stream_key(rank: int | None, pod: str | None, node: str | None) -> str:
    if rank is not None:
        return f"rank:{rank}"
    if pod:
        return f"pod:{pod}"
    return f"node:{node}" if node else "-"


def _finite(x: float) -> bool:
    return isinstance(x, int | float) and math.isfinite(x)


def _split_job_key(job_key: str) -> tuple[str | None, str | None]:
    if job_key.startswith("job:") and "/" in job_key:
        ns, _, name = job_key[4:].partition("/")
        return ns or None, name or None
    return None, None


def _fold_progress(
    job: _Job, stream: _Stream, step: int | None, epoch: int | None, total: int | None, line: str
) -> bool:
    """`HangDetector._on_progress` for a progress line that follows, at the same time, one counted as
    a step (of the same stream, with nothing in between): of all it does, only this is left to do
    when the step moves forward (the mode, phase, anchor, order, interval and last step time are
    already what it would set). False, with nothing changed, when the general path is needed."""
    if step is not None:
        position = step if epoch is None else epoch * EPOCH_SCALE + step
        max_step = job.max_step
        if max_step is not None and position < max_step:
            return False
        train_total = job.train_total
        if train_total is None:
            if total is not None:
                job.train_total = total
        elif total is not None and total != train_total:
            return False
        job.odd_streak = 0
        if max_step is None or position > max_step:
            job.max_step = position
            job.max_step_parts = (step, epoch, total)
    job.evidence = line
    stream.reports += 1
    return True


# ------------------------------------------------------------------------------------------------
# The detector
# ------------------------------------------------------------------------------------------------


class HangDetector:
    """Stateful no-progress detector, one state per job. Not thread-safe; time is always passed in.

    `floor_s` and `factor` override the same fields of `settings`. Observations are O(1) per call
    (plus a C-level keyword scan of the lines); `check` is O(jobs), amortised O(1) per job.

    A batch goes through `ProgressMatcher.hits` and each hit through the state update in line
    order; a progress line that follows a counted step at the same time only moves the step on
    (`_fold_progress`). `reference=True` instead matches each line on its own with `match_line` and
    applies every hit in full: slower, the straightforward path the tests hold the batch path to.
    """

    def __init__(
        self,
        floor_s: float | None = None,
        factor: float | None = None,
        *,
        settings: HangSettings | None = None,
        markers: ProgressMarkers | None = None,
        reference: bool = False,
    ) -> None:
        base = settings or HangSettings()
        self.settings = replace(
            base,
            floor_s=base.floor_s if floor_s is None else floor_s,
            factor=base.factor if factor is None else factor,
        )
        self.markers = markers or shipped_markers()
        self._matcher = self.markers.matcher
        markers_ = self.markers.markers
        with_start = {m.framework for m in markers_ if m.kind is MarkerKind.EVAL_START}
        end_only = {m.framework for m in markers_ if m.kind is MarkerKind.EVAL_END} - with_start
        # Progress markers of frameworks whose evaluations show only at their end.
        self._end_only = frozenset(
            i for i, m in enumerate(markers_) if m.kind is MarkerKind.PROGRESS and m.framework in end_only
        )
        self.reference = reference
        self._jobs: dict[str, _Job] = {}
        # Counters for the pipeline's telemetry.
        self.stats: dict[str, int] = {
            "lines": 0,
            "marker_lines": 0,
            "util_samples": 0,
            "rejected": 0,
            "findings": 0,
        }

    # -- observations ---------------------------------------------------------------------------

    def observe_job(self, job_key: str, running: bool, t: float, *, chip: Chip | str | None = None) -> None:
        """Pod/workload status. Only running jobs can hang; a job that stopped is forgotten."""
        if not _finite(t):
            self._reject("non-finite time in observe_job")
            return
        if not running:
            self._jobs.pop(job_key, None)
            return
        job = self._job(job_key, t)
        if not job.running:
            job.running = True
            job.since = t
        self._set_chip(job, chip)

    def observe_lines(
        self,
        job_key: str,
        rank: int | None,
        pod: str | None,
        node: str | None,
        t: float,
        lines: Sequence[str],
        *,
        times: Sequence[float] | None = None,
    ) -> None:
        """One batch of one container's log lines (a LogBatch). `times`, when given, holds per-line times."""
        if not lines:
            return
        if not _finite(t):
            self._reject("non-finite time in observe_lines")
            return
        job = self._job(job_key, t)
        self.stats["lines"] += len(lines)
        skey = _stream_key(rank, pod, node)
        stream = self._stream(job, skey, rank, pod, node, t)
        stream.last_activity = max(stream.last_activity, t)
        job.last_activity = max(job.last_activity, t)
        if job.mode is not _Mode.TRAINING:
            # Any line is a sign of life before the first step and after the last one.
            job.fired = False
        if self.reference:
            found = self._reference_hits(lines)
        else:
            found = self._matcher.hits(lines, with_index=times is not None)
        if not found:
            return
        self.stats["marker_lines"] += len(found)
        progress = MarkerKind.PROGRESS
        on_progress, on_marker = self._on_progress, self._on_marker
        end_only = self._end_only
        fold = not self.reference
        # The time of the previous hit when it was a progress line counted as a step: a next one at
        # that same time only moves the step on (see _fold_progress).
        stepped: float | None = None
        for index, line, hits in found:
            lt = t
            if times is not None and 0 <= index < len(times) and _finite(times[index]):
                lt = float(times[index])
            for kind, _pos, step, epoch, total, marker in hits:
                if kind is not progress:
                    on_marker(job, skey, lt, kind, step, epoch, line)
                    stepped = None
                elif not (fold and lt == stepped and _fold_progress(job, stream, step, epoch, total, line)):
                    stepped = lt if on_progress(job, skey, stream, lt, step, epoch, total, line) else None
                    if marker in end_only:
                        job.end_only = True

    def _reference_hits(self, lines: Sequence[str]) -> list[tuple[int, str, list[RawHit]]]:
        """The batch's hits line by line: each piece of each line through `match_line`."""
        matcher = self._matcher
        index_of = {m.id: i for i, m in enumerate(matcher.markers)}
        out: list[tuple[int, str, list[RawHit]]] = []
        for index, text in enumerate(lines):
            for piece in text.split("\n"):
                if not matcher.has_keyword(piece):
                    continue  # lines are only looked at when their raw text holds a keyword
                hits = matcher.match_line(piece)
                if hits:
                    out.append(
                        (index, piece, [(h.kind, h.pos, h.step, h.epoch, h.total, index_of[h.marker_id]) for h in hits])
                    )
        return out

    def observe_utilization(
        self,
        job_key: str,
        node: str | None,
        device: str | None,
        t: float,
        value: float,
        *,
        chip: Chip | str | None = None,
    ) -> None:
        """One accelerator utilisation sample (percent, 0-100) of a device the job runs on."""
        if not (_finite(t) and _finite(value)):
            self._reject("non-finite utilisation sample")
            return
        job = self._jobs.get(job_key)
        if job is None:
            job = self._job(job_key, t)
        self._set_chip(job, chip)
        series = job.util.get((node, device))
        if series is None:
            series = job.util[(node, device)] = deque(maxlen=self.settings.util_samples)
        series.append((t, float(value)))
        horizon = t - self.settings.util_window_s
        while series and series[0][0] < horizon:
            series.popleft()
        self.stats["util_samples"] += 1

    def jobs(self) -> list[str]:
        """Keys of the jobs with state (for telemetry and tests)."""
        return list(self._jobs)

    # -- checking -------------------------------------------------------------------------------

    def check(self, now: float) -> list[Finding]:
        """New hang findings at time `now` (each stall fires once; progress re-arms it)."""
        if not _finite(now):
            self._reject("non-finite time in check")
            return []
        out: list[Finding] = []
        stale: list[str] = []
        for key, job in self._jobs.items():
            if not job.running:
                if now - max(job.last_activity, job.since) > self.settings.stale_s:
                    stale.append(key)
                continue
            if job.mode is _Mode.TRAINING and job.anchor is not None:
                out.extend(self._check_training(job, now))
            else:
                finding = self._check_silence(job, now)
                if finding is not None:
                    out.append(finding)
        for key in stale:
            del self._jobs[key]
        self.stats["findings"] += len(out)
        return out

    # -- internals: state -----------------------------------------------------------------------

    def _reject(self, why: str) -> None:
        self.stats["rejected"] += 1
        log.debug("hang detector: input set aside: %s", why)

    def _job(self, job_key: str, t: float) -> _Job:
        job = self._jobs.get(job_key)
        if job is None:
            job = self._jobs[job_key] = _Job(key=job_key, since=t)
            job.intervals = deque(maxlen=self.settings.interval_samples)
        return job

    @staticmethod
    def _set_chip(job: _Job, chip: Chip | str | None) -> None:
        if chip is None:
            return
        try:
            job.chip = Chip(chip)
        except ValueError:
            return

    def _stream(self, job: _Job, skey: str, rank: int | None, pod: str | None, node: str | None, t: float) -> _Stream:
        stream = job.streams.get(skey)
        if stream is not None:
            if rank is not None and pod and stream.pod and pod != stream.pod:
                # The rank runs in a new pod: the job restarted.
                job.reset_progress(t)
                stream = None
            else:
                if node and stream.node != node:
                    stream.node = node
                if pod and not stream.pod:
                    stream.pod = pod
                return stream
        elif rank is None and pod and len(job.streams) == 1 and job.mode is not _Mode.STARTUP:
            (other,) = job.streams.values()
            if other.rank is None and other.pod and other.pod != pod:
                # A single-pod job whose pod was replaced.
                job.reset_progress(t)
        stream = job.streams[skey] = _Stream(rank=rank, pod=pod, node=node, last_activity=t)
        return stream

    def _interval(self, job: _Job) -> float | None:
        if len(job.intervals) < self.settings.min_interval_samples:
            return None
        if job.median_dirty or job.median is None:
            job.median = _quantile(sorted(job.intervals), self.settings.interval_quantile)
            job.median_dirty = False
        return job.median

    def _base_bound(self, interval: float | None) -> float:
        s = self.settings
        if interval is None:
            return max(s.startup_floor_s, s.floor_s)
        return max(s.factor * interval, s.floor_s)

    def _phase_bound(self, job: _Job, kind: str, interval: float | None, base: float) -> float:
        s = self.settings
        learned = job.durations.get(kind)
        if kind == _STALL:
            return max(base, s.learned_margin * max(learned)) if learned else base
        if kind == _EPOCH:
            return max(base, s.epoch_floor_s, s.learned_margin * max(learned) if learned else 0.0)
        bound = max(s.phase_floor_s, base)
        if interval is not None:
            bound = max(bound, s.phase_factor * interval)
        if learned:
            bound = max(bound, s.learned_margin * max(learned))
        return bound

    def _due_phase(self, job: _Job) -> str | None:
        """A phase seen before at a regular step period that is due at the job's current step."""
        if job.max_step is None:
            return None
        for kind, steps in job.phase_steps.items():
            # A period is trusted once seen twice in a row (three phases at regular steps).
            if len(steps) < 3:
                continue
            period = steps[-1] - steps[-2]
            if period <= 0 or steps[-2] - steps[-3] != period:
                continue
            if job.max_step > steps[-1] and (job.max_step - steps[-1]) % period == 0:
                return kind
        return None

    # -- internals: markers ---------------------------------------------------------------------

    def _on_marker(
        self, job: _Job, skey: str, t: float, kind: MarkerKind, step: int | None, epoch: int | None, line: str
    ) -> None:
        """A checkpoint, evaluation, end-of-training or run-start marker."""
        if kind is MarkerKind.START:
            self._restart(job, t)
            return
        if job.mode is not _Mode.TRAINING:
            return  # before the first step and after the last one, markers are only signs of life
        if kind is MarkerKind.EPOCH_END:
            job.epoch_end_step = job.max_step
            job.evidence = line
            job.fired = False
            if job.anchor is None or t > job.anchor:
                job.anchor = t
            return
        if kind is MarkerKind.DONE:
            if job.phase is not None:
                self._close_phase(job, t)
            job.mode = _Mode.DONE
            job.fired = False
            job.lone_reported.clear()
            return
        phase_kind = _PHASE_OF[kind]
        job.evidence = line
        job.fired = False
        start_of_silence = job.anchor
        if job.anchor is None or t > job.anchor:
            job.anchor = t
        job.phase_mark = max(job.phase_mark, t)
        if kind in (MarkerKind.CHECKPOINT_START, MarkerKind.EVAL_START):
            phase = job.phase
            if phase is not None:
                if phase.kind == phase_kind:
                    return  # one phase printing several lines
                self._close_phase(job, t)
            named = _position(step, epoch)
            baseline = job.max_step if named is None or (job.max_step is not None and job.max_step > named) else named
            job.phase = _Phase(
                kind=phase_kind,
                start=t,
                baseline=baseline,
                opener=skey,
                step=named if named is not None else job.max_step,
            )
            self._note_phase_step(job, phase_kind)
            return
        # An end marker.
        if job.phase is not None:
            self._close_phase(job, t)
            return
        named = _position(step, epoch)
        if named is None:
            named = job.max_step
        if named is not None and job.last_phase_step.get(phase_kind) == named:
            return  # the end line of a phase already closed (by progress, or another rank's end line)
        # Seen only at its end: the phase filled the silence since the last progress.
        if start_of_silence is not None and t > start_of_silence:
            self._note_duration(job, phase_kind, t - start_of_silence)
        self._note_phase_step(job, phase_kind)
        if named is not None:
            job.last_phase_step[phase_kind] = named

    def _on_progress(
        self,
        job: _Job,
        skey: str,
        stream: _Stream,
        t: float,
        step: int | None,
        epoch: int | None,
        total: int | None,
        line: str,
    ) -> bool:
        """A progress line; True when it counted as a training step."""
        position = None if step is None else (step if epoch is None else epoch * EPOCH_SCALE + step)
        if job.mode is _Mode.DONE:
            if position is None or job.max_step is None or position <= job.max_step:
                return False  # a final evaluation bar; liveness is already counted
            job.mode = _Mode.TRAINING  # a new training stage continues past the previous end
        elif job.mode is _Mode.STARTUP:
            job.mode = _Mode.TRAINING
        job.evidence = line
        real = True
        phase = job.phase
        if phase is not None:
            other_bar = job.train_total is not None and total is not None and total != job.train_total
            if position is not None and phase.baseline is not None:
                closes = position > phase.baseline and not other_bar
            elif position is not None:
                closes = phase.kind == _CHECKPOINT
            else:
                # No step number: only the stream that opened the phase is ordered with it.
                closes = phase.kind == _CHECKPOINT and phase.opener == skey
            if closes:
                self._close_phase(job, t)
            else:
                real = False
        if real and position is not None:
            other_bar = job.train_total is not None and total is not None and total != job.train_total
            if other_bar or (job.max_step is not None and position < job.max_step):
                # Another bar (an evaluation without a start line) or a step going backwards: a sign
                # of life, not a step, unless it persists: a counter restarted in place after three
                # such lines, a bar of another length after longer than a checkpoint may take.
                if job.odd_streak == 0:
                    job.odd_since = t
                job.odd_streak += 1
                if job.odd_streak >= 3 and (not other_bar or t - job.odd_since >= self.settings.phase_floor_s):
                    job.odd_streak = 0
                    job.train_total = total
                    job.max_step = position
                    job.max_step_parts = (step, epoch, total)
                    stream.tainted = True
                else:
                    real = False
            else:
                job.odd_streak = 0
            if real and job.train_total is None and total is not None:
                job.train_total = total

        if stream.last_progress is None or t > stream.last_progress:
            stream.last_progress = t
        if job.anchor is None or t > job.anchor:
            job.anchor = t
        order = job.order
        order[skey] = None
        order.move_to_end(skey)
        job.fired = False
        if job.lone_reported:
            job.lone_reported.discard(skey)
        if not real:
            stream.tainted = True
            return False
        previous = stream.last_step_t
        if previous is not None and t > previous and not stream.tainted and job.phase_mark < previous:
            gap = t - previous
            if position is not None and job.max_step is not None and position > job.max_step:
                self._note_pause(job, gap, epoch)
            job.intervals.append(gap)
            job.median_dirty = True
        if previous is None or t >= previous:
            stream.last_step_t = t
        stream.tainted = False
        stream.reports += 1
        if epoch is not None and job.max_step_parts is not None:
            last_step, last_epoch, _total = job.max_step_parts
            if last_epoch is not None and last_step is not None and epoch > last_epoch:
                job.epoch_last = last_step  # the epoch moved on: its last step is known
        if position is not None and (job.max_step is None or position > job.max_step):
            job.max_step = position
            job.max_step_parts = (step, epoch, total)
        return True

    @staticmethod
    def _restart(job: _Job, t: float) -> None:
        """A run's banner: the job loads again (start-up bound), its cadence is learned anew."""
        job.mode = _Mode.STARTUP
        job.since = max(job.since, t)
        job.anchor = None
        job.max_step = None
        job.max_step_parts = None
        job.train_total = None
        job.odd_streak = 0
        job.phase = None
        job.phase_mark = max(job.phase_mark, t)
        job.intervals.clear()
        job.median = None
        job.median_dirty = False
        job.phase_steps.clear()
        job.last_phase_step.clear()
        job.epoch_last = None
        job.epoch_end_step = None
        job.fired = False
        job.lone_reported.clear()
        job.order.clear()
        for stream in job.streams.values():
            stream.last_progress = None
            stream.last_step_t = None
            stream.tainted = False
            stream.reports = 0

    def _close_phase(self, job: _Job, t: float) -> None:
        phase = job.phase
        if phase is None:
            return
        job.phase = None
        if phase.step is not None:
            job.last_phase_step[phase.kind] = phase.step
        if t > phase.start:
            self._note_duration(job, phase.kind, t - phase.start)
        job.phase_mark = max(job.phase_mark, t)

    def _note_pause(self, job: _Job, gap: float, epoch: int | None) -> None:
        """A step gap that began at the job's newest step: learn epoch ends and recurring pauses."""
        parts = job.max_step_parts
        if (parts is not None and epoch is not None and parts[1] is not None and epoch > parts[1]) or (
            self._at_epoch_end(job)
        ):
            # The gap after an epoch's last step: the boundary's pause.
            self._note_duration(job, _EPOCH, gap)
            return
        s = self.settings
        if gap * s.learned_margin <= s.floor_s:
            return  # its learned bound would not exceed the floor
        interval = self._interval(job)
        if interval is not None and gap > s.factor * interval:
            # Longer than the cadence explains and no marker in it: if such pauses recur at a
            # regular step period, the next one due is given their learned length.
            self._note_duration(job, _STALL, gap)
            self._note_phase_step(job, _STALL)

    def _round_step(self, job: _Job) -> bool:
        """An end-only evaluation may begin here: its period is not learned yet, the step is round."""
        step = job.max_step
        if step is None or step <= 0 or step % self.settings.round_steps:
            return False
        return len(job.phase_steps.get(_EVAL, ())) < 3

    @staticmethod
    def _at_epoch_end(job: _Job) -> bool:
        """Whether the job's newest step is the last of an epoch (or of its bar)."""
        if job.epoch_end_step is not None and job.epoch_end_step == job.max_step:
            return True
        parts = job.max_step_parts
        if parts is None:
            return False
        step, epoch, total = parts
        if step is None:
            return False
        if total is not None and step >= total:
            return True
        return epoch is not None and job.epoch_last is not None and step >= job.epoch_last

    def _note_duration(self, job: _Job, kind: str, duration: float) -> None:
        durations = job.durations.get(kind)
        if durations is None:
            durations = job.durations[kind] = deque(maxlen=self.settings.learned_phases)
        durations.append(duration)

    @staticmethod
    def _note_phase_step(job: _Job, kind: str) -> None:
        if job.max_step is None:
            return
        steps = job.phase_steps.get(kind)
        if steps is None:
            steps = job.phase_steps[kind] = deque(maxlen=3)
        if not steps or steps[-1] != job.max_step:
            steps.append(job.max_step)

    # -- internals: checks ----------------------------------------------------------------------

    def _check_silence(self, job: _Job, now: float) -> Finding | None:
        """Start-up, after training, or no marker known: any line is a sign of life."""
        if job.fired:
            return None
        anchor = max(job.last_activity, job.since)
        bound = max(self.settings.startup_floor_s, self.settings.floor_s)
        silence = now - anchor
        if silence <= bound:
            return None
        flat, judged = self._utilization_flat(job, now, anchor, 0.0)
        if not flat:
            return None
        job.fired = True
        stream = min(job.streams.values(), key=lambda s: s.last_activity, default=None)
        scope = "done" if job.mode is _Mode.DONE else "startup"
        return self._finding(
            job,
            scope=scope,
            stream=stream,
            stalled=[stream] if stream else [],
            silence=silence,
            bound=bound,
            interval=self._interval(job),
            phase=None,
            judged=judged,
            anchor=anchor,
            now=now,
        )

    def _check_training(self, job: _Job, now: float) -> list[Finding]:
        assert job.anchor is not None
        interval = self._interval(job)
        base = self._base_bound(interval)
        deadline = job.anchor + base
        bound = base
        phase_kind: str | None = None
        phase = job.phase
        if phase is not None:
            phase_deadline = phase.start + self._phase_bound(job, phase.kind, interval, base)
            if phase_deadline > deadline:
                deadline, bound, phase_kind = phase_deadline, phase_deadline - job.anchor, phase.kind
        else:
            due = self._due_phase(job)
            if due is None and self._at_epoch_end(job):
                due = _EPOCH
            elif due is None and job.end_only and self._round_step(job):
                due = _EVAL
            if due is not None:
                due_bound = self._phase_bound(job, due, interval, base)
                if job.anchor + due_bound > deadline:
                    deadline, bound, phase_kind = job.anchor + due_bound, due_bound, due
        if now > deadline:
            if job.fired:
                return []
            flat, judged = self._utilization_flat(job, now, job.anchor, interval or 0.0)
            if not flat:
                return []
            job.fired = True
            ranked = [job.streams[k] for k in job.order if k in job.streams]
            culprit = ranked[0] if ranked else min(job.streams.values(), key=lambda s: s.last_activity, default=None)
            return [
                self._finding(
                    job,
                    scope="job",
                    stream=culprit,
                    stalled=ranked or ([culprit] if culprit else []),
                    silence=now - job.anchor,
                    bound=bound,
                    interval=interval,
                    phase=phase_kind,
                    judged=judged,
                    anchor=job.anchor,
                    now=now,
                )
            ]
        if job.fired or phase is not None or phase_kind is not None or len(job.order) < 2:
            return []
        return self._check_lone(job, now, interval, max(base, self.settings.rank_floor_s))

    def _check_lone(self, job: _Job, now: float, interval: float | None, base: float) -> list[Finding]:
        newest_key = next(reversed(job.order))
        newest_stream = job.streams.get(newest_key)
        if newest_stream is None or newest_stream.last_progress is None:
            return []
        newest = newest_stream.last_progress
        stalled: list[tuple[str, _Stream]] = []
        forget: list[str] = []
        for skey in job.order:
            stream = job.streams.get(skey)
            if stream is None or stream.last_progress is None:
                forget.append(skey)
                continue
            if stream.last_progress + base >= newest:
                break  # this one and every later one moved recently enough
            if stream.reports < self.settings.min_reports or stream.rank is None:
                forget.append(skey)  # not a regular progress reporter (a bar at load time)
                continue
            if skey in job.lone_reported:
                continue
            stalled.append((skey, stream))
        for skey in forget:
            del job.order[skey]
        if not stalled:
            return []
        # Utilisation is not consulted for one rank: which device a rank drives is not known, and
        # its node's other devices keep working.
        confirmed = stalled
        job.lone_reported.update(k for k, _ in confirmed)
        first = confirmed[0][1]
        assert first.last_progress is not None
        return [
            self._finding(
                job,
                scope="rank",
                stream=first,
                stalled=[s for _, s in confirmed],
                silence=now - first.last_progress,
                bound=base,
                interval=interval,
                phase=None,
                judged=False,
                anchor=first.last_progress,
                now=now,
            )
        ]

    def _utilization_flat(self, job: _Job, now: float, since: float, grace: float) -> tuple[bool, bool]:
        """(flat or unknown, judged): every device series with >= 2 samples in the window is flat.

        The window is the end of the silence: at most `util_window_s` long, and it leaves out the
        first `grace` seconds after the last progress, when the step in flight may still have been
        computing (a hang can start anywhere within the step after the last report).
        """
        s = self.settings
        start = max(since + min(grace, (now - since) / 2), now - s.util_window_s)
        judged = False
        for series in job.util.values():
            values = [v for ts, v in series if start <= ts <= now]
            if len(values) < 2:
                continue
            judged = True
            if statistics.pstdev(values) > s.flat_stddev:
                return False, True
        return True, judged

    # -- internals: the finding -----------------------------------------------------------------

    def _finding(
        self,
        job: _Job,
        *,
        scope: str,
        stream: _Stream | None,
        stalled: Sequence[_Stream],
        silence: float,
        bound: float,
        interval: float | None,
        phase: str | None,
        judged: bool,
        anchor: float,
        now: float,
    ) -> Finding:
        namespace, name = _split_job_key(job.key)
        ranks = [s.rank for s in stalled if s.rank is not None]
        who = (
            f"rank {stream.rank}"
            if stream is not None and stream.rank is not None
            else (f"pod {stream.pod}" if stream is not None and stream.pod else "the job")
        )
        message = _message(scope, who, silence, bound, interval, phase)
        groups: dict[str, str] = {
            "scope": scope,
            "silence_s": f"{silence:.0f}",
            "bound_s": f"{bound:.0f}",
            "utilization": "flat" if judged else "no_samples",
        }
        if interval is not None:
            groups["interval_s"] = f"{interval:.1f}"
        if job.max_step_parts is not None:
            groups["last_step"] = _step_text(*job.max_step_parts)
        if ranks:
            groups["ranks"] = ",".join(str(r) for r in sorted(ranks)[:64])
        if phase:
            groups["phase"] = phase
        evidence = job.evidence or f"no progress for {silence:.0f} s (bound {bound:.0f} s)"
        if len(evidence) > MAX_EVIDENCE_CHARS:
            evidence = evidence[-MAX_EVIDENCE_CHARS:]
        return Finding(
            rule_id=RULE_ID,
            fault_class=FaultClass.HANG,
            chip=job.chip,
            code=CODE,
            source=Source.METRIC if judged else Source.CONTAINER_LOG,
            severity=Severity.WARNING if scope == "rank" else Severity.ERROR,
            text=evidence,
            node=stream.node if stream else None,
            rank=stream.rank if stream else None,
            pod=stream.pod if stream else None,
            namespace=namespace,
            job=name,
            timestamp=anchor,
            message=message,
            hint=_HINT,
            groups=groups,
        )


_HINT = I18nText(
    en=(
        "Dump the Python stacks of the stalled ranks (py-spy dump --pid <pid>) to see where they wait; "
        "check the collective-communication library (NCCL/HCCL) for a rank that left or a broken link, "
        "storage for a blocked checkpoint write, and the data loader. Restart from the last checkpoint "
        "if it does not recover."
    ),
    zh=(
        "用 py-spy dump --pid <pid> 抓取卡住 rank 的 Python 调用栈，确认卡在何处；检查集合通信（NCCL/HCCL）"
        "是否有 rank 退出或链路故障、存储是否阻塞了检查点写入、数据加载是否停滞。若无法恢复，从最近的检查点重启。"
    ),
)


def _message(scope: str, who: str, silence: float, bound: float, interval: float | None, phase: str | None) -> I18nText:
    s, b = f"{silence:.0f}", f"{bound:.0f}"
    if scope == "startup":
        return I18nText(
            en=f"No log output for {s} s and no training step yet: the job looks hung at start-up",
            zh=f"任务已 {s} 秒无日志输出且尚未开始训练，疑似在启动阶段卡死",
        )
    if scope == "done":
        return I18nText(
            en=f"No log output for {s} s after training finished: the job looks stuck in its final save or shutdown",
            zh=f"训练结束后已 {s} 秒无日志输出，疑似卡在最终保存或退出阶段",
        )
    pace_en = f" (expected a step every {interval:.0f} s)" if interval is not None else ""
    pace_zh = f"（正常每 {interval:.0f} 秒一步）" if interval is not None else ""
    if scope == "rank":
        return I18nText(
            en=f"{who.capitalize()} has made no progress for {s} s while other ranks continue{pace_en}: "
            "a stalled or straggling rank",
            zh=f"{who} 已 {s} 秒无进展而其他 rank 仍在推进{pace_zh}，该 rank 疑似卡住或掉队",
        )
    if phase == _CHECKPOINT:
        return I18nText(
            en=f"No training progress for {s} s during a checkpoint save that has not finished "
            f"(allowed {b} s): the job looks hung",
            zh=f"训练已 {s} 秒无进展，检查点保存仍未结束（允许 {b} 秒），任务疑似卡死",
        )
    if phase == _EVAL:
        return I18nText(
            en=f"No training progress for {s} s during an evaluation that has not finished "
            f"(allowed {b} s): the job looks hung",
            zh=f"训练已 {s} 秒无进展，评估仍未结束（允许 {b} 秒），任务疑似卡死",
        )
    if phase == _EPOCH:
        return I18nText(
            en=f"No training progress for {s} s after the last step of an epoch (allowed {b} s){pace_en}: "
            "the job looks hung at the epoch boundary (data loader, sampler or evaluation)",
            zh=f"训练在一个 epoch 的最后一步之后已 {s} 秒无进展（允许 {b} 秒）{pace_zh}，"
            "疑似卡在 epoch 切换处（数据加载、采样或评估）",
        )
    return I18nText(
        en=f"No training progress for {s} s{pace_en}: the job looks hung",
        zh=f"训练已 {s} 秒无进展{pace_zh}，任务疑似卡死",
    )
