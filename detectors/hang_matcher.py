"""The progress-marker matcher: finds progress, checkpoint, evaluation and run markers in batches
of log lines (Hyperscan or one `re` keyword trie, then the gated marker regexes)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from trainmedic import cache, hsdb
from trainmedic.detectors.anchors import required_anchors
from trainmedic.detectors.hang_regex import _accelerate, _Fast, _trie_pattern
from trainmedic.detectors.hang_schema import (
    _ANSI,
    _END_KINDS,
    MAX_LINE_CHARS,
    Marker,
    MarkerHit,
    MarkerKind,
    _int_group,
    _number,
)

_hs = hsdb.hs

# Keyword hits beyond which the fast scan hands over to the re path, per batch plus per line (a
# pathological line repeating a keyword would otherwise cost one Python callback per repetition;
# a tqdm line holds a bar's keyword once per update).
MAX_FAST_MATCHES = 4096
MAX_FAST_MATCHES_PER_LINE = 128

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


def _keyword_database(exprs: list[bytes], ids: list[int]) -> Any:
    """The Hyperscan database of the keyword literals: compiled once, then loaded from the on-disk
    cache (trainmedic/cache.py) keyed by the expressions and their ids."""
    assert _hs is not None
    key = cache.make_key("hs-markers", [b"%d\0%s" % (i, e) for i, e in zip(ids, exprs, strict=True)])
    blob: Any = cache.load("hs-markers", key)
    if isinstance(blob, bytes):
        try:
            return hsdb.load_block(blob)
        except Exception:  # noqa: BLE001, S110 - an entry this hyperscan cannot load: compile afresh
            pass
    db = hsdb.compile_block(exprs, ids, [0] * len(exprs))
    if cache.cache_dir() is not None:
        cache.store("hs-markers", key, hsdb.dump(db))
    return db


class ProgressMatcher:
    """Finds progress/checkpoint/evaluation markers in log lines.

    Most lines hold no marker. A batch is joined and scanned once for the marker keywords: with
    Hyperscan (the `fast` extra) as one literal set at GB/s, else with one `re` trie of the
    keywords. Only the few lines holding a keyword are looked at, and only with the regexes of the
    markers those keywords gate, in the faster form `_accelerate` gives them. Both paths give the
    same result, and the same as `match_line` on every line that holds a keyword
    (tests/detectors/test_hang.py checks them against each other on random input).

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
            # Longest first; ties in a fixed order, so the keyword database's cache key is stable.
            sorted({k for m in self.markers for k in m.keywords}, key=lambda k: (-len(k), k))
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
            exprs = [re.escape(words[i]).encode("utf-8") for i in self._minimal]
            self._hs_db = _keyword_database(exprs, list(self._minimal))

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
