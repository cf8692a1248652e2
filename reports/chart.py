"""Accelerator-metrics charts as inline SVG, in pure Python.

A report must be one self-contained file that opens anywhere, offline, years later: no JavaScript
charting library, no image files, no fonts fetched. So a chart is a small SVG document written
directly: one polyline per series (a gap where a value is missing), the fault time marked, time on
the x axis and the value range on the y axis. Every text that reaches the SVG (titles, series
names, labels) is XML-escaped here, so the HTML template can embed the result as it is; the output
is well-formed XML (the tests parse it).

Series are decimated (min and max per bucket, so a spike survives) to a bounded number of points,
which keeps a report of a 64-pod job with 15 minutes of 1 s samples small.

`sparkline` is the Markdown counterpart: a series as a row of block characters.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from xml.sax.saxutils import escape as _xml_escape

__all__ = ["PALETTE", "Series", "decimate", "format_value", "sparkline", "svg_chart"]

# Colour-blind-safe palette (Okabe and Ito); past eight series the dash pattern changes too.
PALETTE: tuple[str, ...] = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#000000")
_DASHES: tuple[str | None, ...] = (None, "6 3", "2 2", "8 3 2 3")
MAX_POINTS = 240
MAX_SERIES = 16
_SPARKS = "▁▂▃▄▅▆▇█"

Point = tuple[float, float | None]


@dataclass(frozen=True)
class Series:
    """One line of a chart: a name (a device) and its (time, value) points; None is a gap."""

    name: str
    points: Sequence[Point] = field(default_factory=tuple)


def _attr(text: str) -> str:
    return _xml_escape(_clean(text), {'"': "&quot;", "'": "&apos;"})


def _text(text: str) -> str:
    return _xml_escape(_clean(text))


_XML_INVALID = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def _clean(text: str) -> str:
    """Characters XML 1.0 cannot carry at all (control characters, lone surrogates, U+FFFE/U+FFFF) are dropped."""
    return _XML_INVALID.sub("", str(text))


# Beyond this a value is not a measurement (and its differences would overflow): drawn as a gap.
_LIMIT = 1e200


def _finite(v: object) -> float | None:
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    try:
        f = float(v)
    except OverflowError:
        return None
    return f if math.isfinite(f) and abs(f) <= _LIMIT else None


def _usable(points: Sequence[Sequence[object]]) -> list[Point]:
    out: list[Point] = []
    for p in points:
        try:
            t = _finite(p[0])
            v = p[1]
        except (IndexError, TypeError, KeyError):
            continue
        if t is None:
            continue
        out.append((t, _finite(v)))
    out.sort(key=lambda p: p[0])
    return out


def decimate(points: Sequence[Point], max_points: int = MAX_POINTS) -> list[Point]:
    """At most about `max_points` points: the first, the last, and per bucket its lowest and highest
    value in time order (gaps are kept as gaps)."""
    pts = list(points)
    if len(pts) <= max_points or max_points < 4:
        return pts
    buckets = max(1, (max_points - 2) // 2)
    inner = pts[1:-1]
    size = len(inner) / buckets
    out: list[Point] = [pts[0]]
    for b in range(buckets):
        chunk = inner[int(b * size) : int((b + 1) * size)]
        if not chunk:
            continue
        values = [p for p in chunk if p[1] is not None]
        if not values:
            out.append(chunk[0])  # a gap stays a gap
            continue
        lo = min(values, key=lambda p: p[1] if p[1] is not None else 0.0)
        hi = max(values, key=lambda p: p[1] if p[1] is not None else 0.0)
        out.extend(sorted({lo, hi}, key=lambda p: p[0]))
    out.append(pts[-1])
    return out


def format_value(v: float | None) -> str:
    """A value for people: integers as integers (with thousands separators), else 3 significant digits."""
    if v is None or not math.isfinite(v):
        return "-"
    if abs(v) >= 1e15:
        return f"{v:.3g}"
    if abs(v) >= 1000 or v == int(v):
        return f"{v:,.0f}"
    return f"{v:.3g}"


def _time_label(t: float, span: float) -> str:
    fmt = "%H:%M:%S" if span < 3600 * 6 else "%m-%d %H:%M"
    try:
        return time.strftime(fmt, time.gmtime(t))
    except (OverflowError, OSError, ValueError):
        return format_value(t)  # not a time a clock can show


def _nice_ticks(lo: float, hi: float, n: int = 4) -> list[float]:
    span = hi - lo
    if not span > 0 or not math.isfinite(span):
        return [lo]
    raw = span / n
    if not raw > 0:
        return [lo]  # a span so small (subnormal) that a fraction of it underflows to zero
    mag = 10.0 ** math.floor(math.log10(raw))
    if not mag > 0:
        return [lo]
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step) * step
    ticks: list[float] = []
    t = first
    while t <= hi + step * 1e-9 and len(ticks) < 12:
        ticks.append(round(t, 10))
        t += step
    return ticks


def _padded(lo: float, hi: float, share: float, flat: float) -> tuple[float, float]:
    """[lo, hi] widened by `share` of its span, or by `flat` when it has none."""
    pad = (hi - lo) * share if hi > lo else flat
    lo, hi = lo - pad, hi + pad
    if not hi - lo > 0:  # rounding ate the pad
        lo, hi = lo - abs(lo) * 1e-6 - flat, hi + abs(hi) * 1e-6 + flat
    return lo, hi


def svg_chart(
    series: Sequence[Series],
    *,
    fault_time: float | None,
    title: str,
    width: int = 640,
    height: int = 200,
    fault_label: str = "fault",
    x_label: str = "UTC",
    y_label: str = "",
    empty_label: str = "no data",
) -> str:
    """An SVG document (no XML declaration, ready to embed in HTML) charting `series`.

    The x axis spans the data and the fault time; the y axis the finite values (padded when flat).
    Series past MAX_SERIES are left out (the legend says how many).
    """
    width = max(200, int(width))
    height = max(120, int(height))
    all_series = [(s.name, decimate(_usable(s.points))) for s in series]
    shown = [(n, p) for n, p in all_series if p][:MAX_SERIES]
    hidden = len([1 for _, p in all_series if p]) - len(shown)
    legend_rows = math.ceil(min(len(shown), MAX_SERIES) / 4) if shown else 0
    top, left, right = 24, 56, 12
    bottom = 34 + 14 * legend_rows
    height = max(height, top + bottom + 60)
    pw, ph = width - left - right, height - top - bottom

    times = [t for _, pts in shown for t, _ in pts]
    if fault_time is not None and _finite(fault_time) is not None:
        times.append(float(fault_time))
    values = [v for _, pts in shown for _, v in pts if v is not None]

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" width="{width}" '
        f'height="{height}" role="img" font-family="sans-serif" font-size="10">',
        f"<title>{_text(title)}</title>",
        f'<rect x="0" y="0" width="{width}" height="{height}" fill="#ffffff"/>',
        f'<text x="{left}" y="14" font-size="12" font-weight="bold" fill="#222222">{_text(title)}</text>',
    ]
    if not times or not values:
        parts.append(
            f'<text x="{width / 2:.1f}" y="{top + ph / 2:.1f}" text-anchor="middle" fill="#666666">'
            f"{_text(empty_label)}</text>"
        )
        parts.append("</svg>")
        return "\n".join(parts)

    # A little room on both sides (the fault mark at the window's edge is not the frame); a single
    # instant or a flat line gets a range around it, relative so that it survives float rounding.
    t0, t1 = _padded(min(times), max(times), 0.03, 30.0)
    v0, v1 = _padded(min(values), max(values), 0.05, abs(min(values)) * 0.1 or 1.0)

    def x(t: float) -> float:
        return left + (t - t0) / (t1 - t0) * pw

    def y(v: float) -> float:
        return top + ph - (v - v0) / (v1 - v0) * ph

    # Frame, grid and y ticks.
    parts.append(
        f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#999999" stroke-width="1"/>'
    )
    for tick in _nice_ticks(v0, v1):
        yy = y(tick)
        parts.append(
            f'<line x1="{left}" y1="{yy:.1f}" x2="{left + pw}" y2="{yy:.1f}" stroke="#e5e5e5" stroke-width="1"/>'
        )
        parts.append(
            f'<text x="{left - 4}" y="{yy + 3:.1f}" text-anchor="end" fill="#444444">{_text(format_value(tick))}</text>'
        )
    if y_label:
        parts.append(
            f'<text x="10" y="{top + ph / 2:.1f}" text-anchor="middle" fill="#444444" '
            f'transform="rotate(-90 10 {top + ph / 2:.1f})">{_text(y_label)}</text>'
        )
    # x ticks: five labels across the span.
    span = t1 - t0
    for i in range(5):
        t = t0 + span * i / 4
        xx = x(t)
        anchor = "start" if i == 0 else "end" if i == 4 else "middle"
        parts.append(f'<line x1="{xx:.1f}" y1="{top + ph}" x2="{xx:.1f}" y2="{top + ph + 3}" stroke="#999999"/>')
        parts.append(
            f'<text x="{xx:.1f}" y="{top + ph + 13}" text-anchor="{anchor}" fill="#444444">'
            f"{_text(_time_label(t, span))}</text>"
        )
    parts.append(f'<text x="{left + pw}" y="{top + ph + 24}" text-anchor="end" fill="#666666">{_text(x_label)}</text>')

    # Lines: one polyline per unbroken run of values.
    for i, (name, pts) in enumerate(shown):
        colour = PALETTE[i % len(PALETTE)]
        dash = _DASHES[(i // len(PALETTE)) % len(_DASHES)]
        dash_attr = f' stroke-dasharray="{dash}"' if dash else ""
        runs: list[list[tuple[float, float]]] = [[]]
        for t, v in pts:
            if v is None:
                if runs[-1]:
                    runs.append([])
                continue
            runs[-1].append((t, v))
        for run in runs:
            if not run:
                continue
            if len(run) == 1:
                t, v = run[0]
                parts.append(f'<circle cx="{x(t):.1f}" cy="{y(v):.1f}" r="1.5" fill="{colour}"/>')
                continue
            coords = " ".join(f"{x(t):.1f},{y(v):.1f}" for t, v in run)
            parts.append(
                f'<polyline fill="none" stroke="{colour}" stroke-width="1.5"{dash_attr} points="{coords}">'
                f"<title>{_text(name)}</title></polyline>"
            )

    # The fault.
    if fault_time is not None and _finite(fault_time) is not None:
        fx = x(float(fault_time))
        parts.append(
            f'<line x1="{fx:.1f}" y1="{top}" x2="{fx:.1f}" y2="{top + ph}" stroke="#D00000" '
            f'stroke-width="1.5" stroke-dasharray="4 3"/>'
        )
        anchor = "end" if fx > left + pw / 2 else "start"
        parts.append(
            f'<text x="{fx:.1f}" y="{top - 5}" text-anchor="{anchor}" fill="#D00000">'
            f"{_text(fault_label)} {_text(_time_label(float(fault_time), 0))}</text>"
        )

    # Legend.
    ly = top + ph + 36
    col = pw / 4
    for i, (name, _) in enumerate(shown):
        lx = left + (i % 4) * col
        yy = ly + (i // 4) * 14
        colour = PALETTE[i % len(PALETTE)]
        parts.append(
            f'<line x1="{lx:.1f}" y1="{yy - 3}" x2="{lx + 14:.1f}" y2="{yy - 3}" stroke="{colour}" stroke-width="2"/>'
        )
        label = name if len(name) <= 28 else name[:27] + "…"
        parts.append(f'<text x="{lx + 18:.1f}" y="{yy}" fill="#222222">{_text(label)}</text>')
    if hidden > 0:
        parts.append(f'<text x="{left + pw}" y="{top - 4}" text-anchor="end" fill="#666666">+{hidden}</text>')
    parts.append("</svg>")
    return "\n".join(parts)


def sparkline(points: Sequence[Point], width: int = 24) -> str:
    """A series as `width` block characters (the mean per bucket; a space where there is no value)."""
    pts = _usable(points)
    values = [v for _, v in pts if v is not None]
    if not values:
        return ""
    lo, hi = min(values), max(values)
    n = min(width, len(pts))
    size = len(pts) / n
    out = []
    for b in range(n):
        chunk = [v for _, v in pts[int(b * size) : int((b + 1) * size)] if v is not None]
        if not chunk:
            out.append(" ")
            continue
        mean = sum(chunk) / len(chunk)
        idx = 0 if hi <= lo else round((mean - lo) / (hi - lo) * (len(_SPARKS) - 1))
        out.append(_SPARKS[idx])
    return "".join(out)
