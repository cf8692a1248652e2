"""Views of a chunk beyond its single lines: records continued on indented lines, and lines a
terminal hard-wrapped. Each view holds only the lines concerned, joined, so the prefilter's second
pass costs what those lines weigh, not another pass over the chunk.

Continuations: a line followed by indented lines (`kubectl describe`, a traceback's frames, a
kernel register dump) is one record; the newline before each indented line becomes a space.

Hard wraps: logs pasted into an issue from a terminal, a log viewer or a mail client are often hard-wrapped: a
newline in the middle of a record, so a rule's pattern no longer fits on one physical line. The
engine (detectors/engine.py) scans, besides the lines themselves, the runs of lines joined across
such newlines. Container logs captured by the runtime are never wrapped, so the pipeline turns
this view off.

A newline is taken for a wrap when the line before it is long (>= WRAP_MIN_LEN bytes) and the line
after it does not start a record of its own. What starts a record is decided from structure, not
from any one log format: blank or indented (a continuation, handled elsewhere), an opening bracket
(`[`, `(`, `{`, `<`: log prefixes), the same first three bytes as the line before (a repeated
timestamp or host prefix), a `Name: ` / `host:` / `key:1` head (a Python exception, a key-value
dump, a host prefix), a date, a clock time, a syslog or glog stamp, a log level word, or a
`/path:line:` head (Python warnings). Everything the view finds is confirmed against the full
pattern, and only a match that crosses a removed newline counts (Engine._confirm_rule).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

WRAP_MIN_LEN = 60  # a line shorter than this is not taken for a terminal-wrapped one
MAX_WRAPPED_LINES = 3  # physical lines put back together on each side of a hit
MAX_KEY = 100  # bytes of a `key:` head
MAX_PATH = 300  # bytes of a `/path:` head

_Arr = np.ndarray[Any, Any]


def _table(chars: bytes) -> _Arr:
    t = np.zeros(256, dtype=bool)
    t[np.frombuffer(chars, dtype=np.uint8)] = True
    return t


_DIGITS = b"0123456789"
_LETTERS = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
_NOT_WRAP_START = _table(b" \t\r\n[({<")
_KEY_FIRST = _table(_LETTERS + b"_")
_KEY_BODY = _table(_LETTERS + _DIGITS + b"_.-")
_DIGIT = _table(_DIGITS)
_AFTER_KEY = _table(b" \t" + _DIGITS)
_PATH_BODY = ~_table(b" \t\r\n:")
_GLOG = _table(b"IWEF")
_MONTHS = (b"Jan ", b"Feb ", b"Mar ", b"Apr ", b"May ", b"Jun ", b"Jul ", b"Aug ", b"Sep ", b"Oct ", b"Nov ", b"Dec ")
_LEVELS = (b"INFO", b"WARN", b"ERROR", b"DEBUG", b"TRACE", b"FATAL", b"CRITICAL", b"NOTICE")
# Shapes over the first bytes of a line ("d" a digit, "L" a glog level letter): a date, a clock time,
# a glog stamp (I0101 12:00:00).
_SHAPES = (b"dddd-dd-dd", b"dd:dd:dd", b"Ldddd dd:")
HEAD = 12  # bytes of a line's start compared against the shapes and words above


def wrap_newlines(arr: _Arr, nl: _Arr) -> _Arr:
    """For each newline (offsets `nl` into `arr`), whether it is taken for a hard wrap."""
    n = len(arr)
    wrap = np.zeros(len(nl), dtype=bool)
    if len(nl) == 0 or n == 0:
        return wrap
    starts = np.concatenate(([0], nl + 1))
    lengths = np.concatenate((nl, [n])) - starts
    # The cheap tests first (a long line, a non-empty one after it), the byte gathers only for the
    # newlines that pass them: most lines of a log are short or followed by a record of their own.
    cand = np.flatnonzero((lengths[:-1] >= WRAP_MIN_LEN) & (lengths[1:] > 0) & (nl + 1 < n))
    cand = cand[~_NOT_WRAP_START[arr[nl[cand] + 1]]]
    # The same first three bytes as the line before: a repeated timestamp, host name or prefix.
    last = n - 1
    here, there = starts[cand], starts[cand + 1]
    same_start = np.ones(len(cand), dtype=bool)
    for k in range(3):
        same_start &= arr[np.minimum(here + k, last)] == arr[np.minimum(there + k, last)]
    cand = cand[~same_start]
    if len(cand):
        wrap[cand[~record_starts(arr, nl[cand] + 1)]] = True
    return wrap


def record_starts(arr: _Arr, offsets: _Arr) -> _Arr:
    """Whether the line at each offset opens a record of its own (see the module's docstring)."""
    s = np.asarray(offsets, dtype=np.int64)
    # The first HEAD bytes of every line at once (0 past the end of `arr`).
    head = _windows(arr, s, HEAD)
    first = head[:, 0]
    found = np.zeros(len(s), dtype=bool)
    # Shapes and words by a digit map of the heads and their first four bytes as one number; the
    # byte walks of `_headed` then run only over the lines still undecided.
    digit = _DIGIT[head]
    for shape in _SHAPES:
        found |= _fits(head, digit, shape)
    quad = np.ascontiguousarray(head[:, :4]).view("<u4").ravel()
    found |= np.isin(quad, _MONTH_QUADS)
    maybe = np.flatnonzero(np.isin(quad, _LEVEL_QUADS))
    for word in _LEVELS:
        sub = head[maybe]
        found[maybe] |= _fits(sub, digit[maybe], word) & ~_KEY_BODY[sub[:, len(word)]]
    key = np.flatnonzero(_KEY_FIRST[first] & ~found)
    found[key] |= _headed(arr, s[key], _KEY_BODY, MAX_KEY, _AFTER_KEY)
    path = np.flatnonzero((first == ord("/")) & ~found)
    found[path] |= _headed(arr, s[path], _PATH_BODY, MAX_PATH, _DIGIT, window=128)
    return found


def _quads(words: tuple[bytes, ...]) -> _Arr:
    return np.frombuffer(b"".join(w[:4] for w in words), dtype="<u4")


_MONTH_QUADS = _quads(_MONTHS)
_LEVEL_QUADS = _quads(_LEVELS)


def _fits(head: _Arr, digit: _Arr, shape: bytes) -> _Arr:
    """Lines whose first bytes are `shape`: "d" stands for any digit, "L" for a glog level letter."""
    hit = np.ones(len(head), dtype=bool)
    for k, c in enumerate(shape):
        hit &= digit[:, k] if c == ord("d") else _GLOG[head[:, k]] if c == ord("L") else head[:, k] == c
    return hit


def _windows(arr: _Arr, s: _Arr, width: int) -> _Arr:
    """The `width` bytes from each offset in `s`, one row each (0 past the end of `arr`)."""
    n = len(arr)
    if n >= width:
        rows = sliding_window_view(arr, width)[np.minimum(s, n - width)]
        tail = np.flatnonzero(s > n - width)
    else:
        rows = np.zeros((len(s), width), dtype=arr.dtype)
        tail = np.arange(len(s))
    if len(tail):
        # The last lines of the chunk: gathered byte by byte, zero-padded.
        pos = s[tail, None] + np.arange(width)
        part = arr[np.minimum(pos, n - 1)] if n else np.zeros(pos.shape, dtype=arr.dtype)
        part[pos >= n] = 0
        rows[tail] = part
    return rows


def _headed(arr: _Arr, s: _Arr, body: _Arr, limit: int, after_colon: _Arr, window: int = 16) -> _Arr:
    """Lines (starting at offsets `s`, their first byte already checked) that run on through `body`
    bytes (at most `limit`), then have a colon followed by an `after_colon` byte. The first `window`
    bytes of every line are read at once; the lines that run on past them are walked a byte at a
    time."""
    n = len(arr)
    found = np.zeros(len(s), dtype=bool)
    if not len(s):
        return found
    width = min(window, limit) + 1  # the byte after a colon at the window's last place included
    rows = _windows(arr, s, width)
    stop = ~body[rows[:, 1 : width - 1]]
    has = stop.any(axis=1)
    at = stop.argmax(axis=1) + 1  # the first byte, from the second on, that is not a body byte
    idx = np.flatnonzero(has)
    j = at[idx]
    # A colon there, not at the end of the data, followed by an accepted byte.
    colon = (rows[idx, j] == ord(":")) & (s[idx] + j + 1 < n)
    found[idx[colon]] = after_colon[rows[idx[colon], j[colon] + 1]]
    open_ = np.flatnonzero(~has)
    k = width - 1
    while len(open_) and k <= limit:
        pos = s[open_] + k
        ok = pos + 1 < n
        open_, pos = open_[ok], pos[ok]
        b = arr[pos]
        colon = b == ord(":")
        found[open_[colon]] = after_colon[arr[pos[colon] + 1]]
        keep = body[b] & ~colon
        open_ = open_[keep]
        k += 1
    return found


def continuation_newlines(arr: _Arr, nl: _Arr) -> _Arr:
    """For each newline, whether the line after it is indented (continues the record before it)."""
    if len(nl) == 0:
        return np.zeros(0, dtype=bool)
    nxt = arr[np.minimum(nl + 1, len(arr) - 1)]
    cont: _Arr = (nl + 1 < len(arr)) & ((nxt == ord(" ")) | (nxt == ord("\t")))
    return cont


@dataclass(frozen=True, slots=True)
class Runs:
    """Runs of lines linked across some of their newlines, each run one line of `text`."""

    text: bytes
    lines: _Arr  # line index of each segment, in order
    seg_starts: _Arr  # offset in `text` where each segment starts

    def line_of(self, ends: list[int]) -> list[int]:
        """Line index of the byte before each end offset in `text` (a prefilter's match ends)."""
        j = np.asarray(ends, dtype=np.int64) - 1
        seg = np.searchsorted(self.seg_starts, j, side="right") - 1
        result: list[int] = self.lines[np.maximum(seg, 0)].tolist()
        return result


def joined_runs(body: bytes, nl: _Arr, link: _Arr, sep: bytes) -> Runs | None:
    """Only the lines on either side of a `link` newline, each such newline replaced by `sep`; None
    when no newline links."""
    cut = np.flatnonzero(link)
    if len(cut) == 0:
        return None
    involved = np.zeros(len(nl) + 1, dtype=bool)
    involved[cut] = True
    involved[cut + 1] = True
    lines = np.flatnonzero(involved)
    starts = np.concatenate(([0], nl + 1))[lines]
    ends = np.concatenate((nl, [len(body)]))[lines]
    joined_on = np.zeros(len(lines), dtype=bool)
    inner = lines < len(link)
    joined_on[inner] = link[lines[inner]]
    # A run's last line keeps its newline (when it has one); inside a run, `sep` stands for it.
    keep_nl = ~joined_on & (ends < len(body))
    stop = ends + keep_nl
    # Each run is one slice of `body` whose inner newlines are exactly its links.
    run_ends = np.flatnonzero(~joined_on)
    run_starts = np.concatenate(([0], run_ends[:-1] + 1))
    text = b"".join(
        [
            body[a:b].replace(b"\n", sep) + (b"\n" if k else b"")
            for a, b, k in zip(
                starts[run_starts].tolist(), ends[run_ends].tolist(), keep_nl[run_ends].tolist(), strict=True
            )
        ]
    )
    sizes = stop - starts + np.where(joined_on, len(sep), 0)
    seg_starts = np.concatenate(([0], np.cumsum(sizes)[:-1]))
    return Runs(text, lines, seg_starts)


def runs_around(wrap: _Arr, hit: int) -> tuple[int, int]:
    """The lines joined with line `hit` across wrap newlines, at most MAX_WRAPPED_LINES - 1 each way."""
    first = last = hit
    while first > 0 and wrap[first - 1] and hit - first < MAX_WRAPPED_LINES - 1:
        first -= 1
    while last < len(wrap) and wrap[last] and last - hit < MAX_WRAPPED_LINES - 1:
        last += 1
    return first, last


def run_first(link: _Arr, idx: int) -> int:
    """The first line of the run that line `idx` belongs to."""
    while idx > 0 and link[idx - 1]:
        idx -= 1
    return idx
