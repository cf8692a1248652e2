"""RFC 3339 times: the one formatter and the one parser every part of trainmedic uses.

- `rfc3339(t)`: a Kubernetes metav1.Time, seconds precision, UTC with `Z` (object stamps, scene
  manifests, lineage, policy messages);
- `rfc3339_ms(t)`: milliseconds, UTC with `Z` (CloudEvents `time`, Alertmanager);
- `rfc3339_local(t)`: seconds, the local offset (the CLI's tables);
- `rfc3339nano(ns)`: Go's RFC3339Nano as the kubelet stamps log lines (fraction's zeros trimmed);
- `parse_rfc3339_ns(text)` / `parse_rfc3339(value)`: RFC 3339 / RFC3339Nano back to nanoseconds /
  seconds since the epoch, None for anything else (never raises).
"""

from __future__ import annotations

import calendar
import re
import time
from datetime import UTC, datetime
from typing import Any

_RFC3339 = re.compile(r"^(\d{4})-(\d{2})-(\d{2})[Tt ](\d{2}):(\d{2}):(\d{2})(?:\.(\d+))?(Z|z|[+-]\d{2}:?\d{2})$")


def rfc3339(t: float | None = None) -> str:
    """Unix seconds (now when None) as a metav1.Time: seconds precision (floored), UTC, `Z`."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() if t is None else t))


def rfc3339_ms(t: float) -> str:
    """Unix seconds as RFC 3339 in UTC with milliseconds (CloudEvents `time`, Alertmanager)."""
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def rfc3339_local(t: float) -> str:
    """Unix seconds as RFC 3339 to the second in local time with its offset (`Z` where that is UTC)."""
    return datetime.fromtimestamp(t).astimezone().isoformat(timespec="seconds").replace("+00:00", "Z")


def rfc3339nano(ns: int) -> str:
    """Go's RFC3339Nano as the kubelet stamps log lines: trailing zeros of the fraction trimmed."""
    secs, frac = divmod(ns, 1_000_000_000)
    base = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(secs))
    digits = f"{frac:09d}".rstrip("0")
    return f"{base}.{digits}Z" if digits else f"{base}Z"


def parse_rfc3339_ns(text: str) -> int | None:
    """Nanoseconds since the epoch of an RFC 3339 / RFC3339Nano time (kubelet log stamps, object times)."""
    m = _RFC3339.match(text)
    if m is None:
        return None
    year, month, day, hh, mm, ss = (int(g) for g in m.group(1, 2, 3, 4, 5, 6))
    try:
        secs = calendar.timegm((year, month, day, hh, mm, ss, 0, 0, 0))
    except (ValueError, OverflowError):
        return None
    if not (1 <= month <= 12 and 1 <= day <= 31 and hh < 24 and mm < 60 and ss <= 60):
        return None
    frac = m.group(7) or ""
    nanos = int((frac + "000000000")[:9])
    zone = m.group(8)
    if zone not in ("Z", "z"):
        sign = 1 if zone[0] == "+" else -1
        digits = zone[1:].replace(":", "")
        secs -= sign * (int(digits[:2]) * 3600 + int(digits[2:]) * 60)
    return secs * 1_000_000_000 + nanos


def parse_rfc3339(value: Any) -> float | None:
    """Unix seconds of an RFC 3339 time (correctly rounded from its nanoseconds); None when `value`
    is not a string or not such a time."""
    ns = parse_rfc3339_ns(value) if isinstance(value, str) and value else None
    return ns / 1_000_000_000 if ns is not None else None
