"""How long to wait before trying again: a server's Retry-After, read once for every client.

`parse_retry_after` reads the HTTP `Retry-After` field (RFC 9110 section 10.2.3): delta-seconds or
an HTTP-date, as seconds from `now`, never negative, at most `cap`; None when it is absent or
unreadable (the caller's own backoff then decides).
"""

from __future__ import annotations

import email.utils
import math
from datetime import UTC


def parse_retry_after(value: object, *, now: float, cap: float = math.inf) -> float | None:
    """Retry-After as seconds from `now`: delta-seconds or an HTTP-date, within [0, cap]; None when
    absent, not finite, or not readable. An HTTP-date without a zone (`-0000`) is read as UTC."""
    if value is None:
        return None
    text = str(value).strip()
    if not text:
        return None
    try:
        seconds = float(text)
    except ValueError:
        pass
    else:
        return min(max(seconds, 0.0), cap) if math.isfinite(seconds) else None
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    try:
        delta = when.timestamp() - now
    except (OverflowError, OSError, ValueError):
        return None
    return min(max(delta, 0.0), cap)
