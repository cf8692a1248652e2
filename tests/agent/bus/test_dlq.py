"""Bad messages are set aside on trainmedic.dlq with their reason, and the good ones around them flow.

Each kind of bad input runs on both buses. On Kafka an oversized message never reaches the broker:
the producer refuses it and sets it aside itself; on the memory bus the consumer does. Either way it
ends up on the DLQ with the same reason label.
"""

from __future__ import annotations

import asyncio
import json
import logging

import pytest

from bus.conftest import log_event, seq_of, started
from trainmedic.agent.bus.base import Bus, Record
from trainmedic.agent.bus.dlq import HEAD_BYTES, decode_record, reason_label, set_aside
from trainmedic.agent.bus.memory import MemoryBus
from trainmedic.agent.telemetry import Telemetry
from trainmedic.events import MAX_MESSAGE_BYTES, DeadLetter, Event, Topic, decode


def _event_json(**changes: object) -> bytes:
    body = json.loads(log_event("job", 0).encode())
    body.update(changes)
    return json.dumps(body).encode()


BAD: dict[str, tuple[bytes | None, str]] = {
    "malformed_json": (b'{"v": 1, "id": "abc", "key": ', "malformed"),
    "wrong_schema_version": (_event_json(v=99), "unknown_schema"),
    "unknown_payload_kind": (_event_json(payload={"kind": "frobnicate", "x": 1}), "malformed"),
    "oversized": (b'{"v": 1, "pad": "' + b"x" * MAX_MESSAGE_BYTES + b'"}', "oversized"),
    "binary_garbage": (bytes(range(256)) * 20, "malformed"),
    "empty_value": (None, "empty"),
    "empty_bytes": (b"", "malformed"),
}


@pytest.mark.parametrize("case", list(BAD))
@pytest.mark.asyncio
async def test_bad_message_is_set_aside_and_good_ones_flow(
    bus: Bus, telemetry: Telemetry, topic: str, group: str, case: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="trainmedic.bus")
    bad, label = BAD[case]
    key = f"job:ns/{case}-{group}"
    consumer = bus.consumer([topic, Topic.DLQ.value], group)
    records: list[Record] = await started(consumer)
    await bus.publish(topic, log_event(f"{case}-{group}", 1).model_copy(update={"key": key}))
    await bus.publish_raw(topic, key, bad)
    await bus.publish(topic, log_event(f"{case}-{group}", 2).model_copy(update={"key": key}))

    good: list[Event] = []
    letters: list[DeadLetter] = []

    async def run() -> None:
        while len(good) < 2 or not letters:
            records.extend(await consumer.getmany(timeout_ms=100))
            while records:
                r = records.pop(0)
                if r.topic == Topic.DLQ:
                    ev = decode(r.value)
                    if ev.key == key:
                        assert isinstance(ev.payload, DeadLetter)
                        letters.append(ev.payload)
                    continue
                decoded = await decode_record(bus, r, telemetry)
                if decoded is not None:
                    good.append(decoded)

    await asyncio.wait_for(run(), 30)
    await consumer.stop()

    assert [seq_of(ev) for ev in good] == [1, 2]
    (letter,) = letters
    assert reason_label(letter.reason) == label, letter.reason
    assert letter.topic == topic
    assert letter.key == key
    assert letter.size == len(bad or b"")
    assert letter.head == (bad or b"")[:HEAD_BYTES].decode("utf-8", errors="replace")
    assert len(letter.head) <= HEAD_BYTES
    assert telemetry.dlq.labels(reason=label)._value.get() == 1
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and r.name == "trainmedic.bus"]
    assert len(warnings) == 1 and letter.reason in warnings[0].getMessage()


@pytest.mark.parametrize(
    ("reason", "label"),
    [
        ("empty message (tombstone)", "empty"),
        ("oversized message: 2000000 bytes > 1000000", "oversized"),
        ("unknown schema version 7 (this agent reads v1)", "unknown_schema"),
        ("malformed event: payload: field required (1 errors)", "malformed"),
        ("duplicate diagnosis from a stale owner", "refused"),
    ],
)
def test_reason_labels_are_bounded(reason: str, label: str) -> None:
    assert reason_label(reason) == label


@pytest.mark.asyncio
async def test_set_aside_a_decoded_event_refused_later(telemetry: Telemetry) -> None:
    bus = MemoryBus(partitions=2)
    dlq = bus.consumer([Topic.DLQ.value], "dlq-reader")
    await dlq.start()
    value = log_event("job", 3).encode()
    record = Record(Topic.LOGS.value, 1, 41, "job:ns/job", value)
    await set_aside(bus, record, "window closed for a job owned elsewhere", telemetry)
    (out,) = await dlq.getmany(timeout_ms=100)
    ev = decode(out.value)
    assert ev.key == "job:ns/job"
    assert isinstance(ev.payload, DeadLetter)
    assert (ev.payload.topic, ev.payload.partition, ev.payload.offset) == (Topic.LOGS.value, 1, 41)
    assert ev.payload.reason == "window closed for a job owned elsewhere"
    assert telemetry.dlq.labels(reason="refused")._value.get() == 1
    await dlq.stop()


@pytest.mark.asyncio
async def test_keyless_record_goes_to_the_dlq_key(telemetry: Telemetry) -> None:
    bus = MemoryBus(partitions=2)
    dlq = bus.consumer([Topic.DLQ.value], "dlq-reader")
    await dlq.start()
    assert await decode_record(bus, Record(Topic.K8S.value, 0, 0, None, b"\xff\xfe"), telemetry) is None
    (out,) = await dlq.getmany(timeout_ms=100)
    assert out.key == "dlq"
    await dlq.stop()
