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


def _best(candidates: list[frozenset[Anchor]]) -> frozenset[Anchor] | None:
    best: frozenset[Anchor] | None = None
    best_score = (-1, 0)
    for cand in candidates:
        if not cand:
            continue
        score = (min(len(a.literal) for a in cand), -len(cand))
        if score > best_score:
            best, best_score = cand, score
    return best


def _seq(items: Any, ci: bool) -> frozenset[Anchor] | None:
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
    return _best(candidates)


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
    try:
        parsed = sre_parse.parse(pattern)
    except (re.error, RecursionError):
        return None
    ci = bool(parsed.state.flags & re.IGNORECASE)
    found = _seq(parsed, ci)
    if found is None or min(len(a.literal) for a in found) < MIN_ANCHOR_LEN:
        return None
    return found
