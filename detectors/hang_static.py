"""Silences in a finished log: `trainmedic diagnose` on a log whose own timestamps show that the
steps stopped long before the log ends.

The live detector (detectors/hang.py) sees time pass; a log file only has the times its lines
print. Each marker line (progress, checkpoint, evaluation, banner) that carries its own timestamp
is replayed through a `HangDetector` at that time, and the detector is checked once, at the time of
the log's last timestamped line (the end of the log, or the error the job died with). A `hang`
finding `no_progress` comes out when the steps had a known cadence and the silence after the last
one outlasts the detector's deadline, computed with STATIC_FLOOR_S and STATIC_FACTOR: a longer floor and factor
than live detection (120 s, 10 intervals), because a log also ends for benign reasons (a final
save or upload with no marker, the teardown after the last step) and nothing can re-arm a static
finding.

Timestamps read: ISO 8601 / Python logging (`2026-01-01 10:00:00,123`, `2026-01-01T10:00:00.123Z`,
`[2026-01-01 10:00:00]`, the CRI log prefix) and `MM/DD/YYYY HH:MM:SS` (LLaMA-Factory), within the
first 120 characters of the line; all read as UTC (one log uses one zone). Marker lines without a
timestamp of their own (tqdm bars, HF Trainer's loss dicts on stdout) are skipped: their time is
not known. Each file is one job; stdin is not read twice.
"""

from __future__ import annotations

import calendar
import gzip
import io
import re
from collections.abc import Iterable, Iterator, Sequence
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from trainmedic.detectors.hang_state import seconds_text
from trainmedic.models import Finding, I18nText

if TYPE_CHECKING:
    from trainmedic.detectors.hang import HangSettings

# STATIC_SETTINGS (HangSettings): a longer floor and factor than live detection. The hang detector
# is imported only for a log long enough to show a stall (`diagnose` of a few lines starts faster).
STATIC_FLOOR_S = 120.0
STATIC_FACTOR = 10.0
BATCH_LINES = 4096
TIME_HEAD_CHARS = 120
# The end of the log: the last timestamp within this many lines of a batch's end.
_TAIL_LINES = 256

_ISO = re.compile(r"(\d{4})-(\d{2})-(\d{2})[T ](\d{2}):(\d{2}):(\d{2})(?:[.,](\d{1,9}))?")
_US = re.compile(r"\b(\d{2})/(\d{2})/(\d{4}) (\d{2}):(\d{2}):(\d{2})\b")


def line_time(line: str) -> float | None:
    """The timestamp a log line starts with (within its first 120 characters), as Unix seconds."""
    head = line[:TIME_HEAD_CHARS]
    frac = None
    m = _ISO.search(head)
    if m is not None:
        year, month, day, hour, minute, second = (int(m.group(i)) for i in range(1, 7))
        frac = m.group(7)
    else:
        m = _US.search(head)
        if m is None:
            return None
        month, day, year, hour, minute, second = (int(m.group(i)) for i in range(1, 7))
    if not (1 <= month <= 12 and 1 <= day <= 31 and hour <= 23 and minute <= 59 and second <= 60):
        return None
    value = float(calendar.timegm((year, month, day, hour, minute, second, 0, 0, 0)))
    if frac:
        value += int(frac) / 10 ** len(frac)
    return value


# The fewest lines that can show a cadence of steps and a silence after it.
MIN_LINES = 3


def silence_findings(lines: Iterable[str], *, file: str, settings: HangSettings | None = None) -> list[Finding]:
    """The `hang` finding of one log whose steps stopped long before its last timestamp (or none)."""
    it = iter(lines)
    first = list(islice(it, BATCH_LINES))
    # Two steps and a silence after them take three timestamped lines: a short log with fewer is
    # answered without loading the markers.
    if len(first) < MIN_LINES or (
        len(first) < BATCH_LINES and sum(line_time(ln) is not None for ln in first) < MIN_LINES
    ):
        return []
    from trainmedic.detectors.hang import HangDetector, HangSettings, MarkerKind

    det = HangDetector(settings=settings or HangSettings(floor_s=STATIC_FLOOR_S, factor=STATIC_FACTOR))
    matcher = det.markers.matcher
    job = f"file:{file}"
    started = False
    end: float | None = None
    last_step_no: int | None = None
    line_no = 0
    batch = first
    while batch:
        batch = [ln.rstrip("\r\n") for ln in batch]
        seen: set[int] = set()
        for index, _piece, hits in matcher.hits(batch):
            if index in seen or index < 0:
                continue
            seen.add(index)
            line = batch[index]
            t = line_time(line)
            if t is None:
                continue
            if not started:
                det.observe_job(job, True, t)
                started = True
            det.observe_lines(job, None, Path(file).name, None, t, [line])
            if any(h[0] is MarkerKind.PROGRESS for h in hits):
                last_step_no = line_no + index + 1
        for line in reversed(batch[-_TAIL_LINES:]):
            t = line_time(line)
            if t is not None:
                end = t if end is None else max(end, t)
                break
        line_no += len(batch)
        batch = list(islice(it, BATCH_LINES))
    if not started or end is None:
        return []
    out: list[Finding] = []
    for f in det.check(end):
        if f.groups.get("scope") != "job" or "interval_s" not in f.groups:
            continue  # only a silence after steps of a known cadence
        silence, interval = f.groups["silence_s"], seconds_text(float(f.groups["interval_s"]))
        message = I18nText(
            en=f"The log's own timestamps show no training progress for {silence} s before it ends "
            f"(a step every {interval} s before that, last step {f.groups.get('last_step') or 'unknown'}): "
            "the job looks hung",
            zh=f"日志时间戳显示训练在日志结束前已 {silence} 秒无进展（此前每 {interval} 秒一步），任务疑似卡死",
        )
        out.append(f.model_copy(update={"file": file, "line_no": last_step_no, "message": message}))
    return out


def _read_lines(name: str) -> Iterator[str]:
    with open(name, "rb") as raw:
        gzipped = raw.read(2) == b"\x1f\x8b"
        raw.seek(0)
        fh: BinaryIO = gzip.GzipFile(fileobj=raw) if gzipped else raw  # type: ignore[assignment]
        with io.TextIOWrapper(fh, encoding="utf-8", errors="replace", newline="\n") as text:
            yield from text


def silence_findings_in(names: Sequence[str]) -> list[Finding]:
    """`silence_findings` of each named file (stdin, `-`, was read once already and is skipped).
    A file that cannot be read again contributes nothing (the engine reported it already)."""
    out: list[Finding] = []
    for name in names:
        if name == "-":
            continue
        try:
            out.extend(silence_findings(_read_lines(name), file=name))
        except (OSError, EOFError, gzip.BadGzipFile):
            continue
    return out
