"""Normalisation and line bookkeeping of the rule engine (detectors/engine.py): input made valid
UTF-8 without ANSI codes (`normalize`), where a chunk may be cut (`_record_boundary`), prefilter hits
grouped by line (`_by_line`) and the lines of a chunk by index (`_Lines`)."""

from __future__ import annotations

import re
from typing import Any

import numpy as np

# CSI (colours, cursor), OSC (titles, hyperlinks) and two-byte escapes; never across a newline.
ANSI_RE = re.compile(rb"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b\n]*(?:\x07|\x1b\\)|[@-Z\\-_])")


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
