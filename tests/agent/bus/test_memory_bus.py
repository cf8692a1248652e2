"""What only the in-process bus does (back-pressure, retention, wake-ups), and the OffsetTracker.

Time is looptime's fake loop time: a 5 s poll timeout or a publisher held back for a minute takes
no wall-clock time and is asserted exactly.
"""

from __future__ import annotations

import asyncio

import pytest

from bus.conftest import log_event, seq_of
from trainmedic.agent.bus.base import OffsetTracker, Record, TopicPartition, partition_for
from trainmedic.agent.bus.memory import MemoryBus
from trainmedic.events import decode

TP: TopicPartition = ("t", 0)


def rec(offset: int, tp: TopicPartition = TP) -> Record:
    return Record(tp[0], tp[1], offset, "k", b"{}")


# -- MemoryBus -----------------------------------------------------------------------------------------


@pytest.mark.looptime
@pytest.mark.asyncio
async def test_publisher_waits_while_the_backlog_is_full_until_a_commit() -> None:
    bus = MemoryBus(partitions=1, max_backlog=5)
    consumer = bus.consumer(["t"], "g")
    await consumer.start()
    for i in range(5):
        await bus.publish("t", log_event("job", i))
    blocked = asyncio.create_task(bus.publish("t", log_event("job", 5)))
    await asyncio.sleep(60)
    assert not blocked.done(), "a full backlog holds the publisher back"
    records = await consumer.getmany()
    assert [seq_of(decode(r.value)) for r in records] == [0, 1, 2, 3, 4]
    await asyncio.sleep(60)
    assert not blocked.done(), "reading is not enough: the records are not processed until committed"
    await consumer.commit({records[-1].tp: records[-1].offset + 1})
    await asyncio.wait_for(blocked, 1)
    assert [seq_of(decode(r.value)) for r in await consumer.getmany()] == [5]
    await consumer.stop()


@pytest.mark.looptime
@pytest.mark.asyncio
async def test_unread_topic_keeps_only_the_newest_records() -> None:
    bus = MemoryBus(partitions=1, max_backlog=3)
    for i in range(10):
        await asyncio.wait_for(bus.publish("t", log_event("job", i)), 1)
    consumer = bus.consumer(["t"], "late")
    await consumer.start()
    records = await consumer.getmany()
    assert [seq_of(decode(r.value)) for r in records] == [7, 8, 9]
    assert [r.offset for r in records] == [7, 8, 9], "offsets keep counting across what was trimmed"
    await consumer.stop()


@pytest.mark.looptime
@pytest.mark.asyncio
async def test_getmany_returns_nothing_after_its_timeout() -> None:
    bus = MemoryBus()
    consumer = bus.consumer(["t"], "g")
    await consumer.start()
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    assert await consumer.getmany(timeout_ms=5000) == []
    assert loop.time() - t0 == pytest.approx(5.0)
    await consumer.stop()


@pytest.mark.looptime
@pytest.mark.asyncio
async def test_getmany_wakes_when_a_record_arrives() -> None:
    bus = MemoryBus()
    consumer = bus.consumer(["t"], "g")
    await consumer.start()
    loop = asyncio.get_running_loop()

    async def later() -> None:
        await asyncio.sleep(2)
        await bus.publish("t", log_event("job", 1))

    task = asyncio.create_task(later())
    t0 = loop.time()
    got = await consumer.getmany(timeout_ms=30_000)
    assert loop.time() - t0 == pytest.approx(2.0)
    assert [seq_of(decode(r.value)) for r in got] == [1]
    await task
    await consumer.stop()


@pytest.mark.asyncio
async def test_lag_counts_unread_records() -> None:
    bus = MemoryBus(partitions=2)
    consumer = bus.consumer(["t"], "g")
    await consumer.start()
    for i in range(7):
        await bus.publish("t", log_event(f"job{i}", i))
    assert await consumer.lag() == 7
    await consumer.getmany(max_records=3)
    assert await consumer.lag() == 4
    await consumer.stop()


@pytest.mark.parametrize(("key", "partitions"), [(None, 4), ("", 4), ("job:a/b", 1), ("job:a/b", 4), ("node:n", 12)])
def test_partition_for_is_stable_and_in_range(key: str | None, partitions: int) -> None:
    p = partition_for(key, partitions)
    assert 0 <= p < partitions
    assert p == partition_for(key, partitions)


# -- OffsetTracker --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("done_order", "expected"),
    [
        ([0, 1, 2, 3], [1, 2, 3, 4]),
        ([3, 2, 1, 0], [0, 0, 0, 4]),
        ([1, 0, 3, 2], [0, 2, 2, 4]),
        ([2, 0, 1, 3], [0, 1, 3, 4]),
    ],
)
def test_committable_is_the_lowest_open_offset(done_order: list[int], expected: list[int]) -> None:
    t = OffsetTracker()
    for o in range(4):
        t.track(rec(o))
    seen = []
    for o in done_order:
        t.done(rec(o))
        seen.append(t.committable().get(TP, 0))
    assert seen == expected


def test_a_held_record_blocks_the_commit_of_its_partition_only() -> None:
    t = OffsetTracker()
    other: TopicPartition = ("t", 1)
    for o in range(5):
        t.track(rec(o))
        t.track(rec(o, other))
    t.done_offsets(TP, [0, 1, 3, 4])  # 2 is held open (a diagnosis window)
    t.done_offsets(other, range(5))
    assert t.committable() == {TP: 2, other: 5}
    t.committed(t.committable())
    assert t.committable() == {}, "nothing moved since the last commit"
    assert t.open_count() == 1
    t.done(rec(2))
    assert t.committable() == {TP: 5}


def test_forget_drops_partitions_lost_in_a_rebalance() -> None:
    t = OffsetTracker()
    lost: TopicPartition = ("t", 1)
    t.track(rec(0))
    t.track(rec(7, lost))
    t.forget([lost])
    assert t.open_count() == 1
    t.done(rec(0))
    t.done(rec(7, lost))  # late completion of work on a partition we no longer own: ignored
    assert t.committable() == {TP: 1}


def test_records_tracked_again_after_a_rebalance_start_fresh() -> None:
    t = OffsetTracker()
    t.track(rec(10))
    t.done(rec(10))
    t.committed(t.committable())
    t.forget([TP])
    # The partition comes back: records are replayed from the group's commit.
    t.track(rec(11))
    assert t.committable() == {TP: 11}
    t.done(rec(11))
    assert t.committable() == {TP: 12}
