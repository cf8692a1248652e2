"""The bus interface: what watchers publish to and what the brain consumes from.

Two implementations sit behind it with the same code above: `KafkaBus` (aiokafka, production) and
`MemoryBus` (in-process, the embedded default for `--role all`, the demo and most tests). Both give
the same guarantees the pipeline relies on:

* partitions by key: records with one key keep their order and go to one consumer of a group;
* consumer groups: the partitions of a topic are split among a group's consumers, so brains scale
  out and each job (key) has exactly one owner at a time;
* at-least-once: a consumer commits offsets itself, after it has fully processed the records;
  after a restart or a rebalance it resumes from the last commit (so it may see a record twice,
  never miss one). `OffsetTracker` computes what is safe to commit when some records are held
  open (a job's diagnosis window).
"""

from __future__ import annotations

import abc
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from trainmedic.events import Event

TopicPartition = tuple[str, int]


@dataclass(frozen=True, slots=True)
class Record:
    """One message as a consumer receives it."""

    topic: str
    partition: int
    offset: int
    key: str | None
    value: bytes | None
    timestamp_ms: int = 0

    @property
    def tp(self) -> TopicPartition:
        return (self.topic, self.partition)


def partition_for(key: str | None, partitions: int) -> int:
    """The partition of a key. The memory bus uses this; Kafka uses its own murmur2 partitioner."""
    if not key or partitions <= 1:
        return 0
    return zlib.crc32(key.encode()) % partitions


class Consumer(abc.ABC):
    """A member of a consumer group over some topics."""

    @abc.abstractmethod
    async def start(self) -> None: ...

    @abc.abstractmethod
    async def stop(self) -> None:
        """Leave the group. Offsets not committed before are read again by the next owner."""

    @abc.abstractmethod
    async def getmany(self, timeout_ms: int = 100, max_records: int = 1000) -> list[Record]:
        """The next records of the partitions this member owns (empty after `timeout_ms`)."""

    @abc.abstractmethod
    async def commit(self, offsets: dict[TopicPartition, int]) -> None:
        """Record, per partition, the offset of the next record to read (last processed + 1)."""

    @abc.abstractmethod
    def assignment(self) -> set[TopicPartition]:
        """The partitions this member owns now."""

    async def lag(self) -> int:
        """Records in the owned partitions not yet read (best effort; 0 when unknown)."""
        return 0


class Bus(abc.ABC):
    """Publish events by key; hand out consumers in groups."""

    name: str = "bus"
    # Whether records read and not committed outlive the reader's process (a broker keeps them): only
    # then is holding a commit back (a brain's open window) worth what it costs, a replay after a
    # crash. An in-process bus dies with its readers.
    replays: bool = True

    @property
    def connected(self) -> bool:
        """Whether the bus can deliver now (a broker bus: the broker acknowledges); readiness reads it."""
        return True

    @abc.abstractmethod
    async def start(self) -> None: ...

    @abc.abstractmethod
    async def stop(self) -> None:
        """Flush what is buffered (bounded by the implementation's timeout), then close."""

    @abc.abstractmethod
    async def publish(self, topic: str, event: Event) -> None:
        """Queue one event under its key. Returns once it is accepted into the producer's buffer;
        the event is not lost if the broker is down (the buffer retries), unless the buffer is full,
        which is counted and logged."""

    @abc.abstractmethod
    async def publish_raw(self, topic: str, key: str | None, value: bytes | None) -> None:
        """Queue bytes as they are (forwarding a refused message to the DLQ; tests)."""

    @abc.abstractmethod
    async def flush(self) -> None:
        """Wait until every event published so far is acknowledged by the broker."""

    @abc.abstractmethod
    def consumer(self, topics: Sequence[str], group: str) -> Consumer: ...


@dataclass
class OffsetTracker:
    """What is safe to commit when records finish out of order.

    Each record read is `track`ed; when the work it caused is durable (its findings and diagnosis
    are published, or it produced nothing) it is `done`. The committable offset of a partition is
    the smallest offset still open, or one past the highest read when none is open. A diagnosis
    window that holds a record open therefore holds back the commit of its partition, and a crash
    replays the window's input instead of losing it.
    """

    _open: dict[TopicPartition, set[int]] = field(default_factory=dict)
    _high: dict[TopicPartition, int] = field(default_factory=dict)
    _committed: dict[TopicPartition, int] = field(default_factory=dict)

    def track(self, record: Record) -> None:
        self._open.setdefault(record.tp, set()).add(record.offset)
        if record.offset + 1 > self._high.get(record.tp, -1):
            self._high[record.tp] = record.offset + 1

    def done(self, record: Record) -> None:
        self.done_offsets(record.tp, (record.offset,))

    def done_offsets(self, tp: TopicPartition, offsets: Iterable[int]) -> None:
        s = self._open.get(tp)
        if s is not None:
            s.difference_update(offsets)

    def committable(self) -> dict[TopicPartition, int]:
        """Offsets to commit now (only partitions that moved since the last `committed`)."""
        out: dict[TopicPartition, int] = {}
        for tp, high in self._high.items():
            open_ = self._open.get(tp)
            upto = min(open_) if open_ else high
            if upto > self._committed.get(tp, -1):
                out[tp] = upto
        return out

    def committed(self, offsets: dict[TopicPartition, int]) -> None:
        self._committed.update(offsets)

    def forget(self, partitions: Iterable[TopicPartition]) -> None:
        """Drop the state of partitions this member no longer owns (after a rebalance)."""
        for tp in partitions:
            self._open.pop(tp, None)
            self._high.pop(tp, None)
            self._committed.pop(tp, None)

    def open_count(self) -> int:
        return sum(len(s) for s in self._open.values())
