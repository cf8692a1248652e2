"""The in-process bus: partitions, consumer groups and commits without a broker.

It behaves like a small Kafka so the code above it is the same: keys pick partitions, a group's
members split the partitions, a member that leaves or is replaced hands its partitions over from the
last committed offset (records it read but did not commit are read again).

Bounded by design (the embedded default runs for weeks):
- every commit trims what every group reading the topic has committed, at once;
- a topic holding `max_backlog` records, or `max_backlog_bytes` bytes, not yet committed by its
  slowest group makes publishers wait (back-pressure, counted in `backpressure_waits` and
  `trainmedic_bus_backpressure_total`) rather than grow; one record larger than the whole budget
  still passes when nothing else is waiting, so nothing is refused for its size alone;
- a topic nobody reads keeps only the newest `orphan_records` records and `orphan_bytes` bytes
  (Kafka's retention in miniature): `trainmedic.findings`, `trainmedic.incidents` and the DLQ in
  one process, where nobody joins later to read them. The budget is small on purpose: at 10,000
  records / 16 MB a topic, filling it was most of the embedded bus's memory growth under load.
`stats()` says what is held, per topic, for the gauges (`trainmedic_bus_backlog_records`,
`trainmedic_bus_backlog_bytes`).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from trainmedic.agent.bus.base import Bus, Consumer, Record, TopicPartition, partition_for
from trainmedic.agent.telemetry import Telemetry
from trainmedic.events import Event

# What one record costs beyond its key and value (tuple, ints, deque slot): counted in the byte bound.
RECORD_OVERHEAD = 96


def _size(key: str | None, value: bytes | None) -> int:
    return RECORD_OVERHEAD + (len(key) if key else 0) + (len(value) if value else 0)


@dataclass
class _Partition:
    base: int = 0  # offset of log[0]
    log: deque[tuple[str | None, bytes | None, int]] = field(default_factory=deque)
    bytes: int = 0  # what the records held cost (`_size`)

    @property
    def end(self) -> int:
        return self.base + len(self.log)

    def drop_oldest(self) -> None:
        key, value, _ = self.log.popleft()
        self.base += 1
        self.bytes -= _size(key, value)


@dataclass
class _Group:
    members: list[MemoryConsumer] = field(default_factory=list)
    committed: dict[TopicPartition, int] = field(default_factory=dict)
    topics: set[str] = field(default_factory=set)


class MemoryBus(Bus):
    name = "memory"

    def __init__(
        self,
        partitions: int = 4,
        max_backlog: int = 200_000,
        max_backlog_bytes: int = 256 << 20,
        orphan_records: int = 1_000,
        orphan_bytes: int = 1 << 20,
        telemetry: Telemetry | None = None,
        replays: bool = True,
    ) -> None:
        # replays=False (the embedded `--role all` bus): readers commit what they have read at once
        # rather than hold it for a replay no crash could use (the bus goes with the process), so
        # the bus holds only what is not read yet. Tests model a broker with replays=True.
        self.replays = replays
        self.partitions = partitions
        self.max_backlog = max_backlog
        self.max_backlog_bytes = max_backlog_bytes
        self.orphan_records = orphan_records
        self.orphan_bytes = orphan_bytes
        self.telemetry = telemetry
        self._topics: dict[str, list[_Partition]] = {}
        self._groups: dict[str, _Group] = {}
        self._changed = asyncio.Condition()
        self.published = 0
        self.backpressure_waits: dict[str, int] = {}
        if telemetry is not None:
            telemetry.refreshers.append(self.report)

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    def _topic(self, topic: str) -> list[_Partition]:
        parts = self._topics.get(topic)
        if parts is None:
            parts = self._topics[topic] = [_Partition() for _ in range(self.partitions)]
        return parts

    async def publish(self, topic: str, event: Event) -> None:
        await self.publish_raw(topic, event.key, event.encode())

    async def publish_raw(self, topic: str, key: str | None, value: bytes | None) -> None:
        parts = self._topic(topic)
        part = parts[partition_for(key, len(parts))]
        size = _size(key, value)
        async with self._changed:
            waited = False
            if not self._read(topic):
                # Nobody reads this topic (yet): keep only the newest records, like a retention limit
                # (nobody could free room for a waiting publisher).
                # The budget is the topic's: each partition keeps its share of it.
                records = max(1, min(self.orphan_records, self.max_backlog) // len(parts))
                budget = max(1, min(self.orphan_bytes, self.max_backlog_bytes) // len(parts))
                while part.log and (len(part.log) >= records or part.bytes + size > budget):
                    part.drop_oldest()
            while self._read(topic) and self._full(topic, part, size):
                self._trim(topic)
                if not self._full(topic, part, size):
                    break
                if not waited:
                    waited = True
                    self.backpressure_waits[topic] = self.backpressure_waits.get(topic, 0) + 1
                    if self.telemetry is not None:
                        self.telemetry.bus_backpressure.labels(topic).inc()
                await self._changed.wait()
            part.log.append((key, value, int(time.time() * 1000)))
            part.bytes += size
            self.published += 1
            self._changed.notify_all()

    def _read(self, topic: str) -> bool:
        return any(topic in g.topics for g in self._groups.values())

    def _full(self, topic: str, part: _Partition, size: int) -> bool:
        """No room for a record of `size` in `part`: its record bound, or the topic's byte bound (a
        record alone larger than the budget passes once the topic is empty)."""
        if part.end - part.base >= self.max_backlog:
            return True
        held = sum(p.bytes for p in self._topic(topic))
        return held > 0 and held + size > self.max_backlog_bytes

    def _trim(self, topic: str, only: int | None = None) -> None:
        groups = [g for g in self._groups.values() if topic in g.topics]
        if not groups:
            return
        for p, part in enumerate(self._topic(topic)):
            if only is not None and p != only:
                continue
            low = min(g.committed.get((topic, p), 0) for g in groups)
            while part.log and part.base < low:
                part.drop_oldest()

    def stats(self) -> dict[str, dict[str, int]]:
        """Per topic: records and bytes held (not yet committed by its slowest reader, or retained
        for nobody), and how often a publisher had to wait."""
        out: dict[str, dict[str, int]] = {}
        for topic, parts in self._topics.items():
            out[topic] = {
                "records": sum(len(p.log) for p in parts),
                "bytes": sum(p.bytes for p in parts),
                "backpressure_waits": self.backpressure_waits.get(topic, 0),
            }
        return out

    def report(self) -> None:
        """Set the backlog gauges from `stats()` (called on each /metrics scrape)."""
        if self.telemetry is None:
            return
        for topic, s in self.stats().items():
            self.telemetry.bus_backlog_records.labels(topic).set(s["records"])
            self.telemetry.bus_backlog_bytes.labels(topic).set(s["bytes"])

    async def flush(self) -> None:
        return None

    def consumer(self, topics: Sequence[str], group: str) -> MemoryConsumer:
        return MemoryConsumer(self, list(topics), group)

    # -- group membership -------------------------------------------------------------------------

    def _join(self, member: MemoryConsumer) -> None:
        g = self._groups.setdefault(member.group, _Group())
        g.members.append(member)
        g.topics.update(member.topics)
        self._rebalance(g)

    def _leave(self, member: MemoryConsumer) -> None:
        g = self._groups.get(member.group)
        if g and member in g.members:
            g.members.remove(member)
            self._rebalance(g)

    def _rebalance(self, g: _Group) -> None:
        tps = sorted({(t, p) for m in g.members for t in m.topics for p in range(len(self._topic(t)))})
        for m in g.members:
            m._assigned = set()
        for i, tp in enumerate(tps):
            members = [m for m in g.members if tp[0] in m.topics]
            if members:
                owner = members[i % len(members)]
                owner._assigned.add(tp)
        for m in g.members:
            # A new owner starts from the group's last commit: what the old owner read but did not
            # commit is read again (at-least-once).
            m._position = {tp: g.committed.get(tp, self._topic(tp[0])[tp[1]].base) for tp in m._assigned}


class MemoryConsumer(Consumer):
    def __init__(self, bus: MemoryBus, topics: list[str], group: str) -> None:
        self.bus = bus
        self.topics = topics
        self.group = group
        self._assigned: set[TopicPartition] = set()
        self._position: dict[TopicPartition, int] = {}
        self._running = False

    async def start(self) -> None:
        self._running = True
        self.bus._join(self)

    async def stop(self) -> None:
        self._running = False
        self.bus._leave(self)
        async with self.bus._changed:
            self.bus._changed.notify_all()

    def assignment(self) -> set[TopicPartition]:
        return set(self._assigned)

    def _collect(self, max_records: int) -> list[Record]:
        out: list[Record] = []
        for tp in sorted(self._assigned):
            part = self.bus._topic(tp[0])[tp[1]]
            pos = max(self._position.get(tp, part.base), part.base)
            while pos < part.end and len(out) < max_records:
                key, value, ts = part.log[pos - part.base]
                out.append(Record(tp[0], tp[1], pos, key, value, ts))
                pos += 1
            self._position[tp] = pos
            if len(out) >= max_records:
                break
        return out

    async def getmany(self, timeout_ms: int = 100, max_records: int = 1000) -> list[Record]:
        if not self._running:
            return []
        out = self._collect(max_records)
        if out:
            return out
        try:
            async with self.bus._changed:
                await asyncio.wait_for(self.bus._changed.wait(), timeout_ms / 1000)
        except TimeoutError:
            return []
        return self._collect(max_records) if self._running else []

    async def commit(self, offsets: dict[TopicPartition, int]) -> None:
        g = self.bus._groups.get(self.group)
        if g is None:
            return
        for tp, off in offsets.items():
            if tp in self._assigned and off > g.committed.get(tp, -1):
                g.committed[tp] = off
                # What every reader has committed is gone at once, not when the backlog fills up.
                self.bus._trim(tp[0], only=tp[1])
        async with self.bus._changed:
            self.bus._changed.notify_all()

    async def lag(self) -> int:
        total = 0
        for tp in self._assigned:
            part = self.bus._topic(tp[0])[tp[1]]
            total += part.end - max(self._position.get(tp, part.base), part.base)
        return total
