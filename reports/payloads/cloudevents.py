"""CloudEvents 1.0 for the ops sinks (one event, or the JSON batch format), the body encoded once, and
its HMAC-SHA256 signature with the receiver's check (`sign`, `signature_headers`, `verify`).
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Mapping, Sequence
from typing import Any

from trainmedic.reports.notice import Notice
from trainmedic.timefmt import rfc3339_ms

LANGS = ("en", "zh", "both")

# -- CloudEvents ------------------------------------------------------------------------------------

SPECVERSION = "1.0"
EVENT_TYPE_PREFIX = "io.trainmedic.incident."
CLOUDEVENT_CONTENT_TYPE = "application/cloudevents+json; charset=utf-8"
CLOUDEVENTS_BATCH_CONTENT_TYPE = "application/cloudevents-batch+json; charset=utf-8"
SIGNATURE_HEADER = "X-Trainmedic-Signature"
TIMESTAMP_HEADER = "X-Trainmedic-Timestamp"
SIGNATURE_VERSION = "v1"
DEFAULT_TOLERANCE_S = 300.0


def encode_body(payload: Any) -> bytes:
    """The bytes to send (and to sign): compact UTF-8 JSON, Chinese kept as UTF-8, not \\u escapes."""
    # A lone surrogate (undecodable log bytes) becomes "?" instead of failing the delivery.
    return json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "replace")


def cloudevent(n: Notice, *, source: str) -> dict[str, Any]:
    """One notice as a CloudEvents 1.0 event in the JSON format (structured mode)."""
    if not source:
        raise ValueError("a CloudEvent needs a non-empty source")
    return {
        "specversion": SPECVERSION,
        "id": n.dedup_key,
        "source": source,
        "type": EVENT_TYPE_PREFIX + ("notification_failed" if n.failed_sink else n.status),
        "subject": n.incident_id,
        "time": rfc3339_ms(n.time),
        "datacontenttype": "application/json",
        "data": n.as_dict(),
    }


def cloudevents_batch(ns: Sequence[Notice], *, source: str) -> list[dict[str, Any]]:
    """Several notices in the CloudEvents JSON batch format (a JSON array of events)."""
    return [cloudevent(n, source=source) for n in ns]


def _check_secret(secret: bytes) -> None:
    if not isinstance(secret, bytes | bytearray) or not secret:
        raise ValueError("the webhook signing secret must be non-empty bytes")


def sign(secret: bytes, timestamp: int, body: bytes) -> str:
    """``v1=`` + hex HMAC-SHA256(secret, f"{timestamp}." + body)."""
    _check_secret(secret)
    mac = hmac.new(bytes(secret), str(int(timestamp)).encode() + b"." + body, hashlib.sha256)
    return f"{SIGNATURE_VERSION}={mac.hexdigest()}"


def signature_headers(secret: bytes, body: bytes, *, timestamp: int) -> dict[str, str]:
    """The two headers a signed request carries."""
    return {TIMESTAMP_HEADER: str(int(timestamp)), SIGNATURE_HEADER: sign(secret, timestamp, body)}


def _header(headers: Mapping[str, str], name: str) -> str | None:
    value = headers.get(name)
    if value is not None:
        return value
    lowered = name.lower()
    for key, v in headers.items():
        if key.lower() == lowered:
            return v
    return None


def verify(
    secret: bytes, headers: Mapping[str, str], body: bytes, *, now: float, tolerance_s: float = DEFAULT_TOLERANCE_S
) -> bool:
    """Whether `body` was signed with `secret` at a time within `tolerance_s` of `now`.

    False for a missing or malformed header, a timestamp outside the window (either side), or no
    matching ``v1=`` signature; the comparison is constant-time.
    """
    _check_secret(secret)
    ts = (_header(headers, TIMESTAMP_HEADER) or "").strip()
    sig = _header(headers, SIGNATURE_HEADER)
    # Unix seconds have 10 digits until 2286; a longer string is not a timestamp (nor worth int()).
    if not ts or not sig or len(ts) > 12 or not ts.isascii() or not ts.isdigit():
        return False
    timestamp = int(ts)
    if abs(now - timestamp) > tolerance_s:
        return False
    expected = sign(secret, timestamp, body).encode()
    ok = False
    for candidate in sig.split(","):
        # Every candidate is compared (no early exit), each in constant time.
        ok |= hmac.compare_digest(expected, candidate.strip().encode("utf-8", "replace"))
    return ok
