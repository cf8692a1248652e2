"""Making the marker regexes cheap to run, without changing what they match (used by
detectors/hang_matcher.py; see the comment below for the three rewrites)."""

from __future__ import annotations

import re
import re._compiler as sre_compile  # type: ignore[import-not-found]
import re._parser as sre_parse  # type: ignore[import-not-found]
from collections.abc import Iterable
from dataclasses import dataclass
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
from typing import Any

from trainmedic.detectors.hang_schema import Marker

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
