"""The in-process bus: partitions, consumer groups and commits without a broker.

It behaves like a small Kafka so the code above it is the same: keys pick partitions, a group's
members split the partitions, a member that leaves or is replaced hands its partitions over from the
last committed offset (records it read but did not commit are read again). Records below every
group's commit are trimmed; a topic with more than `max_backlog` unread records makes publishers
wait (back-pressure) rather than grow without bound.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from agent.bus.base import Bus, Consumer, Record, TopicPartition, partition_for
from trainmedic.events import Event


@dataclass
class _Partition:
    base: int = 0  # offset of log[0]
    log: deque[tuple[str | None, bytes | None, int]] = field(default_factory=deque)

    @property
    def end(self) -> int:
        return self.base + len(self.log)


@dataclass
class _Group:
    members: list[MemoryConsumer] = field(default_factory=list)
    committed: dict[TopicPartition, int] = field(default_factory=dict)
    topics: set[str] = field(default_factory=set)


class MemoryBus(Bus):
    name = "memory"

    def __init__(self, partitions: int = 4, max_backlog: int = 200_000) -> None:
        self.partitions = partitions
        self.max_backlog = max_backlog
        self._topics: dict[str, list[_Partition]] = {}
        self._groups: dict[str, _Group] = {}
        self._changed = asyncio.Condition()
        self.published = 0

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
        async with self._changed:
            if not any(topic in g.topics for g in self._groups.values()):
                # Nobody reads this topic (yet): keep the newest `max_backlog` like a retention limit.
                while len(part.log) >= self.max_backlog:
                    part.log.popleft()
                    part.base += 1
            while self._backlog(topic, part) >= self.max_backlog:
                self._trim(topic)
                if self._backlog(topic, part) < self.max_backlog:
                    break
                await self._changed.wait()
            part.log.append((key, value, int(time.time() * 1000)))
            self.published += 1
            self._changed.notify_all()

    def _backlog(self, topic: str, part: _Partition) -> int:
        return part.end - part.base

    def _trim(self, topic: str) -> None:
        groups = [g for g in self._groups.values() if topic in g.topics]
        if not groups:
            return
        for p, part in enumerate(self._topic(topic)):
            low = min(g.committed.get((topic, p), 0) for g in groups)
            while part.log and part.base < low:
                part.log.popleft()
                part.base += 1

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
        async with self.bus._changed:
            self.bus._changed.notify_all()

    async def lag(self) -> int:
        total = 0
        for tp in self._assigned:
            part = self.bus._topic(tp[0])[tp[1]]
            total += part.end - max(self._position.get(tp, part.base), part.base)
        return total
