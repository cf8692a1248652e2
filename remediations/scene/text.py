"""Text cleaning: what a text file of the bundle holds (its last lines within the file cap, long lines
cut, valid UTF-8, secrets redacted), bytes in and bytes out, with no per-line Python work on the
common path (the line scans are numpy passes); and the order of events.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from trainmedic.remediations.scene.model import SceneSettings
from trainmedic.remediations.scene.pods import _map
from trainmedic.remediations.scene.redact import _Redactor, _redactor

# ------------------------------------------------------------------------------------------------
# Text cleaning (bytes in, bytes out; numpy for the line scans)


def _newlines(data: bytes) -> np.ndarray[Any, Any]:
    return np.flatnonzero(np.frombuffer(data, dtype=np.uint8) == 10)


def _keep_tail_lines(data: bytes, n: int) -> bytes:
    if n <= 0:
        return b""
    if data.count(b"\n") < n:
        return data
    nl = _newlines(data)
    # Lines are the text between newlines; a final newline ends the last one.
    full = len(nl) if data.endswith(b"\n") else len(nl) + 1
    if full <= n:
        return data
    cut = int(nl[full - n - 1]) + 1
    return data[cut:]


def _cut_long_lines(data: bytes, limit: int) -> tuple[bytes, int]:
    if len(data) <= limit:
        return data, 0
    nl = _newlines(data)
    starts = np.concatenate(([0], nl + 1))
    ends = np.concatenate((nl, [len(data)]))
    long = np.flatnonzero(ends - starts > limit)
    if not len(long):
        return data, 0
    parts: list[bytes] = []
    pos = 0
    for i in long.tolist():
        s, e = int(starts[i]), int(ends[i])
        parts.append(data[pos : s + limit])
        parts.append(b" [... %d bytes cut]" % (e - s - limit))
        pos = e
    parts.append(data[pos:])
    return b"".join(parts), len(long)


def _clean(data: bytes, settings: SceneSettings, *, tail_lines: int | None) -> tuple[bytes, bool, int]:
    """(text, truncated, lines cut): the last lines within the file cap, long lines cut, valid UTF-8."""
    truncated = False
    if tail_lines is not None:
        kept = _keep_tail_lines(data, tail_lines)
        truncated = len(kept) < len(data)
        data = kept
    if len(data) > settings.max_file_bytes:
        data = data[-settings.max_file_bytes :]
        nl = data.find(b"\n")
        if 0 <= nl < len(data) - 1:
            data = data[nl + 1 :]
        truncated = True
    data, cut = _cut_long_lines(data, settings.max_line_bytes)
    if not data.isascii():
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            data = data.decode("utf-8", "replace").encode("utf-8")
    if b"\x00" in data:
        data = data.replace(b"\x00", "\ufffd".encode())
    return data, truncated, cut


def _prepare_text(
    raw: bytes, settings: SceneSettings, redactor: _Redactor, tail_lines: int | None
) -> tuple[bytes, bool, int, int]:
    """(text, truncated, lines cut, redactions): what a text file of the bundle holds."""
    data, truncated, cut = _clean(raw, settings, tail_lines=tail_lines)
    data, redactions = redactor.redact_bytes(data)
    if len(data) > settings.max_file_bytes:  # the masks made it longer
        data = data[-settings.max_file_bytes :]
        truncated = True
    return data, truncated, cut, redactions


def clean_log_text(text: str, settings: SceneSettings | None = None) -> bytes:
    """A container log as a bundle keeps it (its last `log_lines` within the file cap, long lines cut,
    valid UTF-8, secrets redacted): what `diagnose --job` classifies, so it reads what `--scene` reads."""
    settings = settings or SceneSettings()
    raw = text.encode("utf-8", "replace")
    return _prepare_text(raw, settings, _redactor(), settings.log_lines)[0]


def event_order(e: Mapping[str, Any]) -> tuple[str, str, str]:
    """How events are ordered in a bundle and in a diagnosis: by time, then namespace and name."""
    meta = _map(e.get("metadata"))
    return (_event_key(e), str(meta.get("namespace") or ""), str(meta.get("name") or ""))


def _event_key(e: Mapping[str, Any]) -> str:
    for k in ("lastTimestamp", "eventTime", "firstTimestamp"):
        v = e.get(k)
        if isinstance(v, str) and v:
            return v
    v = _map(e.get("metadata")).get("creationTimestamp")
    return v if isinstance(v, str) else ""


def _count_lines(data: bytes) -> int:
    if not data:
        return 0
    return data.count(b"\n") + (0 if data.endswith(b"\n") else 1)
