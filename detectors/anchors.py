"""Required-literal extraction: for a regex, a set of literals at least one of which every match contains.

This is what lets the pure-`re` path avoid running every pattern on every line: it searches a
chunk for the anchors with `bytes.find` (C speed), and runs the real regex only on lines that hold
one. A pattern for which no safe anchor set exists falls back to a full regex scan of the chunk.
"""

from __future__ import annotations

import re
import re._parser as sre_parse  # type: ignore[import-not-found]
from dataclasses import dataclass
from re._constants import (  # type: ignore[import-not-found]
    BRANCH,
    LITERAL,
    MAX_REPEAT,
    MIN_REPEAT,
    POSSESSIVE_REPEAT,
    SUBPATTERN,
)
from typing import Any

MIN_ANCHOR_LEN = 3


@dataclass(frozen=True, slots=True)
class Anchor:
    """A literal to look for; `ci` means search the lower-cased chunk for the lower-cased literal."""

    literal: bytes
    ci: bool


def _digits_mostly(literal: bytes) -> bool:
    """A literal of digits with fewer than three other bytes ("3221225477", "0xC0000005", "9999").
    Logs are full of digits (times, counters, ids), so the byte pairs of such a literal occur
    everywhere and finding it costs a check at each: a word of the same pattern is the better way in."""
    other = sum(1 for b in literal if not 48 <= b <= 57)
    return other < 3 and len(literal) - other > other


def _score(cand: frozenset[Anchor]) -> tuple[bool, bool, int, int]:
    shortest = min(len(a.literal) for a in cand)
    return (shortest >= MIN_ANCHOR_LEN, not any(_digits_mostly(a.literal) for a in cand), shortest, -len(cand))


def _best(candidates: list[frozenset[Anchor]]) -> frozenset[Anchor] | None:
    best: frozenset[Anchor] | None = None
    best_score: tuple[bool, bool, int, int] = (False, False, -1, 0)
    for cand in candidates:
        if not cand:
            continue
        score = _score(cand)
        if score > best_score:
            best, best_score = cand, score
    return best


def _seq(items: Any, ci: bool) -> frozenset[Anchor] | None:
    return _best(_candidates(items, ci))


def _candidates(items: Any, ci: bool) -> list[frozenset[Anchor]]:
    """Every anchor set of a sequence of regex items: each is required on its own."""
    candidates: list[frozenset[Anchor]] = []
    run: list[str] = []

    def flush() -> None:
        if run:
            text = "".join(run)
            if ci and not text.isascii():
                run.clear()  # bytes.lower() and str.lower() disagree outside ASCII: no anchor
                return
            lit = (text.lower() if ci else text).encode("utf-8")
            candidates.append(frozenset({Anchor(lit, ci)}))
            run.clear()

    for op, av in items:
        if op is LITERAL:
            run.append(chr(av))
            continue
        if op is BRANCH and run:
            # `re` factors a common prefix out of an alternation ("Error|Exception" parses as
            # "E" + (rror|xception)): the prefix joined to each branch's leading literals is a
            # longer, equally required, anchor set.
            joined = _joined(run, av[1], ci)
            if joined:
                candidates.append(joined)
        flush()
        if op is SUBPATTERN:
            _group, add_flags, del_flags, sub = av
            sub_ci = (ci or bool(add_flags & re.IGNORECASE)) and not (del_flags & re.IGNORECASE)
            found = _seq(sub, sub_ci)
            if found:
                candidates.append(found)
        elif op is BRANCH:
            _, branches = av
            union: set[Anchor] = set()
            for branch in branches:
                found = _seq(branch, ci)
                if not found:
                    union = set()
                    break
                union |= found
            if union:
                candidates.append(frozenset(union))
        elif op in (MAX_REPEAT, MIN_REPEAT, POSSESSIVE_REPEAT):
            lo, _hi, sub = av
            if lo >= 1:
                found = _seq(sub, ci)
                if found:
                    candidates.append(found)
    flush()
    return candidates


def _lead(branch: Any) -> str:
    """The literal characters a branch starts with."""
    out: list[str] = []
    for op, av in branch:
        if op is not LITERAL:
            break
        out.append(chr(av))
    return "".join(out)


def _joined(prefix: list[str], branches: Any, ci: bool) -> frozenset[Anchor] | None:
    texts = ["".join(prefix) + _lead(b) for b in branches]
    if ci and not all(t.isascii() for t in texts):
        return None
    return frozenset(Anchor((t.lower() if ci else t).encode("utf-8"), ci) for t in texts)


def required_anchors(pattern: str) -> frozenset[Anchor] | None:
    """Anchors for `pattern` (any match contains at least one), or None when none is safe."""
    options = anchor_options(pattern)
    return options[0] if options else None


def anchor_options(pattern: str, limit: int = 4) -> list[frozenset[Anchor]]:
    """Up to `limit` different anchor sets for `pattern`, each safe on its own (any match contains
    one of its literals), the one `required_anchors` picks first. Which of them finds the fewest
    places depends on the text: "NCCL INFO " is rare in a training log and on every other line of an
    NCCL debug log, where the " -> " of the same pattern is rare; the engine picks per chunk."""
    try:
        parsed = sre_parse.parse(pattern)
    except (re.error, RecursionError):
        return []
    ci = bool(parsed.state.flags & re.IGNORECASE)
    found: list[frozenset[Anchor]] = []
    for cand in sorted(_candidates(parsed, ci), key=_score, reverse=True):
        if cand and min(len(a.literal) for a in cand) >= MIN_ANCHOR_LEN and cand not in found:
            found.append(cand)
    return found[:limit]
