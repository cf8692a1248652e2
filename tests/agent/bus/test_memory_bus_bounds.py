"""The in-process bus stays bounded for weeks: it trims on commit, holds at most a byte budget per
topic (publishers wait beyond it, counted), and a topic nobody reads keeps only a small window.

Time is looptime's fake loop time: a publisher held back for a minute takes no wall-clock time.
"""

from __future__ import annotations

import asyncio

import pytest

from bus.conftest import log_event
from trainmedic.agent.bus.memory import RECORD_OVERHEAD, MemoryBus
from trainmedic.agent.telemetry import Telemetry


async def _drain(bus: MemoryBus, topic: str, group: str, n: int) -> int:
    consumer = bus.consumer([topic], group)
    await consumer.start()
    read = 0
    while read < n:
        records = await consumer.getmany(timeout_ms=10, max_records=1000)
        read += len(records)
        if records:
            last = records[-1]
            await consumer.commit({(last.topic, last.partition): last.offset + 1})
    await consumer.stop()
    return read


@pytest.mark.looptime
@pytest.mark.asyncio
@pytest.mark.parametrize("partitions", [1, 4])
async def test_a_commit_frees_what_every_reader_has_committed(partitions: int) -> None:
    bus = MemoryBus(partitions=partitions)
    consumer = bus.consumer(["t"], "g")
    await consumer.start()
    for i in range(500):
        await bus.publish("t", log_event(f"job{i % 7}", i))
    assert bus.stats()["t"]["records"] == 500
    seen = 0
    while seen < 500:
        records = await consumer.getmany(timeout_ms=10)
        seen += len(records)
        ends: dict[tuple[str, int], int] = {}
        for r in records:
            ends[(r.topic, r.partition)] = r.offset + 1
        await consumer.commit(ends)
    assert bus.stats()["t"] == {"records": 0, "bytes": 0, "backpressure_waits": 0}


@pytest.mark.looptime
@pytest.mark.asyncio
async def test_the_slowest_group_decides_what_is_kept() -> None:
    bus = MemoryBus(partitions=1)
    fast, slow = bus.consumer(["t"], "fast"), bus.consumer(["t"], "slow")
    await fast.start()
    await slow.start()
    for i in range(10):
        await bus.publish("t", log_event("job", i))
    await fast.getmany()
    await fast.commit({("t", 0): 10})
    assert bus.stats()["t"]["records"] == 10
    await slow.getmany()
    await slow.commit({("t", 0): 4})
    assert bus.stats()["t"]["records"] == 6


@pytest.mark.looptime
@pytest.mark.asyncio
async def test_a_full_byte_budget_holds_publishers_back_until_a_commit() -> None:
    telemetry = Telemetry()
    one = RECORD_OVERHEAD + len(log_event("job", 0).key or "") + len(log_event("job", 0).encode())
    bus = MemoryBus(partitions=1, max_backlog_bytes=one * 5 + 10, telemetry=telemetry)
    consumer = bus.consumer(["t"], "g")
    await consumer.start()
    for i in range(5):
        await bus.publish("t", log_event("job", i))
    blocked = asyncio.create_task(bus.publish("t", log_event("job", 5)))
    await asyncio.sleep(60)
    assert not blocked.done(), "a topic at its byte budget holds the publisher back"
    assert bus.stats()["t"]["backpressure_waits"] == 1
    assert b'trainmedic_bus_backpressure_total{topic="t"} 1.0' in telemetry.exposition()
    assert b'trainmedic_bus_backlog_records{topic="t"} 5.0' in telemetry.exposition()
    await consumer.getmany()
    await consumer.commit({("t", 0): 2})
    await asyncio.wait_for(blocked, 1)
    assert bus.stats()["t"]["records"] == 4
    await consumer.stop()


@pytest.mark.looptime
@pytest.mark.asyncio
async def test_one_record_larger_than_the_budget_passes_into_an_empty_topic() -> None:
    bus = MemoryBus(partitions=1, max_backlog_bytes=1 << 20)
    consumer = bus.consumer(["t"], "g")
    await consumer.start()
    await asyncio.wait_for(bus.publish_raw("t", "k", b"x" * (2 << 20)), 1)
    assert bus.stats()["t"]["records"] == 1


@pytest.mark.looptime
@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("partitions", "orphan_records", "orphan_bytes", "kept"),
    [(1, 100, 1 << 30, 100), (1, 10_000, 50_000, None), (4, 100, 1 << 30, 100), (12, 120, 1 << 30, 120)],
)
async def test_a_topic_nobody_reads_keeps_a_small_window(
    partitions: int, orphan_records: int, orphan_bytes: int, kept: int | None
) -> None:
    """The budget is the topic's, however many partitions share it."""
    bus = MemoryBus(partitions=partitions, orphan_records=orphan_records, orphan_bytes=orphan_bytes)
    for i in range(2_000):
        # Keys spread over every partition (many jobs).
        await asyncio.wait_for(bus.publish("nobody", log_event(f"job{i % 97}", i)), 1)
    held = bus.stats()["nobody"]
    assert held["records"] <= orphan_records
    assert held["bytes"] <= orphan_bytes
    if kept is not None:
        assert held["records"] == kept
    assert held["backpressure_waits"] == 0


@pytest.mark.looptime
@pytest.mark.asyncio
@pytest.mark.parametrize(("partitions", "size"), [(12, 200), (12, 4_000), (1, 20_000)])
async def test_the_embedded_bus_keeps_a_topic_nobody_reads_small(partitions: int, size: int) -> None:
    """As `--role all` builds it: findings, incidents and the DLQ nobody reads in one process keep at
    most 1,000 records and 1 MiB a topic, whatever comes (not 10,000 records / 16 MB a topic)."""
    from trainmedic.agent.config import Settings
    from trainmedic.agent.run import make_bus

    bus = make_bus(Settings.model_validate({"bus": {"kind": "memory", "partitions": partitions}}), Telemetry())
    assert isinstance(bus, MemoryBus)
    for i in range(5_000):
        await asyncio.wait_for(bus.publish_raw("nobody", f"job{i % 97}", b"x" * size), 1)
    held = bus.stats()["nobody"]
    assert 0 < held["records"] <= 1_000
    assert held["bytes"] <= 1 << 20


@pytest.mark.looptime
@pytest.mark.asyncio
async def test_a_steady_stream_stays_flat() -> None:
    """Read and committed as it comes, 100,000 records never hold more than a batch."""
    bus = MemoryBus(partitions=4)
    consumer = bus.consumer(["t"], "g")
    await consumer.start()
    peak = 0
    for batch in range(100):
        for i in range(1_000):
            await bus.publish("t", log_event(f"job{i % 13}", batch * 1_000 + i))
        peak = max(peak, bus.stats()["t"]["records"])
        ends: dict[tuple[str, int], int] = {}
        while records := await consumer.getmany(timeout_ms=1, max_records=5_000):
            for r in records:
                ends[(r.topic, r.partition)] = r.offset + 1
        await consumer.commit(ends)
    assert peak <= 1_000
    assert bus.stats()["t"]["records"] == 0
