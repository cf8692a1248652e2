"""The prefilters of the rule engine (detectors/engine.py): which lines of a chunk may match which
pattern, without running every regex on every line.

- `_HyperscanPrefilter` (the fast path): one Hyperscan database of every pattern, compiled in
  prefilter mode, so it reports a superset of the real matches; kept in the on-disk cache.
- `_AnchorPrefilter` (the `re` path): every pattern's required literals (detectors.anchors), located
  in one vectorised pass through each literal's rarest byte pair in the chunk (`_find_literals`); a
  large chunk picks each pattern's cheapest anchor set by its own byte pairs (`_Bigrams`, `_Choices`).
  Patterns without a safe literal are run over the chunk with re.finditer (`_regex_scan`).

Both report pattern ids and match end offsets; the engine maps them to lines and confirms each
candidate line with the real regex.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import numpy as np

from trainmedic import cache, hsdb
from trainmedic.detectors.anchors import MIN_ANCHOR_LEN, Anchor, anchor_options

if TYPE_CHECKING:
    from trainmedic.detectors.engine import _LazyRegex

_hs = hsdb.hs

_NAMED_GROUP = re.compile(r"\(\?P<[A-Za-z_][A-Za-z0-9_]*>")
_WIDE_REPEAT = re.compile(r"(?<!\\)\{(\d+),(?:1[7-9]|[2-9]\d|\d{3,})\}")
_TRAILING_ANY = re.compile(r"(?:\.[*+]\??)+\$?$")


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
                # the case-folded anchors are found in the lower-cased pass, never in this one
                for a in anchors:
                    if not a.ci:
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
