"""Setting bad messages aside: decode a record, or park it on `trainmedic.dlq` and go on.

A consumer must never crash, hang or silently skip on input it cannot use (docs/architecture.md,
"Nothing lost"). `decode_record` turns a record into an `Event` or, when it is malformed, oversized,
of an unknown schema version or empty, publishes a `DeadLetter` describing it (the first 4 KiB as
text, so a person can see what it was) keyed like the original, counts it in `trainmedic_dlq{reason}`
and returns None; the caller then treats the record as processed and commits past it.
"""

from __future__ import annotations

import logging

from trainmedic.agent.bus.base import Bus, Record
from trainmedic.agent.telemetry import Telemetry
from trainmedic.events import SCHEMA_VERSION, DeadLetter, Event, EventError, Topic, decode, make_event

log = logging.getLogger("trainmedic.bus")

HEAD_BYTES = 4096


def reason_label(reason: str) -> str:
    """The short, bounded label a DLQ reason is counted under."""
    r = reason.lower()
    if r.startswith("oversized"):
        return "oversized"
    if "schema version" in r:
        return "unknown_schema"
    if r.startswith("empty"):
        return "empty"
    if r.startswith("malformed"):
        return "malformed"
    return "refused"


async def set_aside(bus: Bus, record: Record, reason: str, telemetry: Telemetry | None = None) -> None:
    """Publish a `DeadLetter` for this record on the DLQ topic, count it and log one line."""
    value = record.value or b""
    label = reason_label(reason)
    if telemetry is not None:
        telemetry.dlq.labels(reason=label).inc()
    log.warning(
        "set aside %s[%d]@%d (key %s, %d bytes) on %s: %s",
        record.topic,
        record.partition,
        record.offset,
        record.key,
        len(value),
        Topic.DLQ.value,
        reason,
    )
    letter = DeadLetter(
        reason=reason,
        topic=record.topic,
        partition=record.partition,
        offset=record.offset,
        key=record.key,
        head=value[:HEAD_BYTES].decode("utf-8", errors="replace"),
        size=len(value),
    )
    await bus.publish(Topic.DLQ, make_event(letter, producer="dlq", key=record.key or "dlq"))


async def decode_record(bus: Bus, record: Record, telemetry: Telemetry | None = None) -> Event | None:
    """The record's event, or None after setting it aside on the DLQ."""
    try:
        event = decode(record.value)
    except EventError as e:
        await set_aside(bus, record, e.reason, telemetry)
        return None
    if event.v != SCHEMA_VERSION:
        # A future version whose body still parses as this one: its meaning may differ, do not guess.
        reason = f"unknown schema version {event.v!r} (this agent reads v{SCHEMA_VERSION})"
        await set_aside(bus, record, reason, telemetry)
        return None
    return event
