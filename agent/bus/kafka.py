"""The Kafka bus (aiokafka): what node agents publish to and brains consume from at scale.

Producer: `publish()` never waits for the broker and never raises because it is down. Events go
into a bounded buffer (`buffer_max` events, `buffer_max_bytes` bytes) that one guarded background
task drains. The buffer keeps a FIFO lane per topic-partition (Kafka's murmur2 partitioner on the
event key, so a job's or a node's events keep their order); each lane has at most one batch in
flight, and an event is forgotten only once the broker acknowledged it (`acks`). A batch that fails
with a transient error (broker down, timeout, leader moved) is sent again from the same place after
an exponential backoff with jitter; nothing behind it in its lane was sent meanwhile, so per-key
order survives retries (a retry may duplicate a batch the broker stored but did not acknowledge:
consumers de-duplicate by event id). A batch the broker refuses for good (message too large,
corrupt) is split and the refused event dropped with an ERROR line.

When the buffer is full the oldest waiting event is dropped, counted in
`trainmedic_producer_dropped{topic}` and reported by a rate-limited WARNING. Back-pressure is light
and only applies while the broker is acknowledging: above half the buffer a publisher waits for room
(the producer is outrunning a healthy broker, so slowing it loses nothing); while the broker is
unreachable publishers never wait (watchers must keep reading /dev/kmsg and pod logs) and the
drop-oldest policy bounds memory instead. Publishers also yield to the loop every few hundred
events so a burst cannot starve the sender.

Consumer: a group member with manual commits (at-least-once). Broker outages are logged and backed
off inside `getmany()` (which then returns nothing) and the underlying aiokafka consumer is rebuilt
when it keeps failing, so the caller's loop never sees the broker's trouble.

Size: the Kafka bus as one unit: `KafkaBus` is one producer state machine (buffer, lanes, in-flight
sends, reconnection, topics) and `KafkaConsumer` shares its client settings and failure handling.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.codec import has_gzip, has_lz4, has_snappy, has_zstd
from aiokafka.errors import (
    CommitFailedError,
    CorruptRecordException,
    IllegalStateError,
    InvalidTopicError,
    KafkaError,
    KafkaTimeoutError,
    MessageSizeTooLargeError,
    RecordListTooLargeError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
)
from aiokafka.partitioner import murmur2
from aiokafka.structs import TopicPartition as KafkaTP

from trainmedic.agent.bus.base import Bus, Consumer, Record, TopicPartition
from trainmedic.agent.telemetry import Telemetry
from trainmedic.backoff import backoff_delay
from trainmedic.events import MAX_MESSAGE_BYTES, DeadLetter, Event, Topic, make_event
from trainmedic.ratelog import RateLimitedLog

log = logging.getLogger("trainmedic.bus")

# Errors that say "this message will never be accepted": retrying them would block the lane forever.
_PERMANENT = (MessageSizeTooLargeError, RecordListTooLargeError, CorruptRecordException, InvalidTopicError)
_BACKOFF_BASE = 0.2
_BACKOFF_MAX = 15.0
_YIELD_EVERY = 256
_LOG_EVERY_S = 10.0


def backoff(attempt: int, base: float = _BACKOFF_BASE, cap: float = _BACKOFF_MAX) -> float:
    """Exponential backoff with full jitter in its upper half: attempt 1 -> [base/2, base]."""
    return backoff_delay(attempt - 1, base=base, cap=cap, jitter=(0.5, 1.0))


_CODECS = {"gzip": has_gzip, "snappy": has_snappy, "lz4": has_lz4, "zstd": has_zstd}


def check_compression(compression: str | None) -> str | None:
    """The producer's codec, refused at construction (not at the first send) when it cannot work."""
    if compression in (None, "", "none"):
        return None
    check = _CODECS.get(compression)
    if check is None:
        raise ValueError(f"unknown Kafka compression {compression!r}: use one of none, {', '.join(_CODECS)}")
    if not check():
        raise ValueError(f"Kafka compression {compression!r} needs the cramjam package, which is not installed")
    return compression


def kafka_partition(key: bytes | None, partitions: int) -> int:
    """Kafka's default partitioner for a keyed record (the Java client's murmur2); keyless: any."""
    if key is None:
        return random.randrange(partitions)  # noqa: S311
    return int((murmur2(key) & 0x7FFFFFFF) % partitions)


@dataclass(slots=True)
class _Msg:
    seq: int
    topic: str
    key: bytes | None
    value: bytes | None
    size: int


@dataclass
class _Lane:
    """The events of one topic-partition, oldest first; the first `inflight` are being sent."""

    topic: str
    partition: int
    queue: deque[_Msg] = field(default_factory=deque)
    inflight: int = 0
    failures: int = 0
    retry_at: float = 0.0
    # After a permanent refusal of a multi-event batch: send this many events one by one.
    singles: int = 0
    # When the batch in flight was handed to the client, and which send it is (a late answer to a
    # send given up on is ignored).
    sent_at: float = 0.0
    attempt: int = 0


class KafkaBus(Bus):
    """Publish to and consume from Kafka (any Kafka-protocol broker) with a buffering producer."""

    name = "kafka"

    def __init__(
        self,
        bootstrap: str,
        *,
        client_id: str = "trainmedic",
        partitions: int = 12,
        compression: str | None = "zstd",
        linger_ms: int = 5,
        max_batch_bytes: int = 1_048_576,
        buffer_max: int = 100_000,
        buffer_max_bytes: int = 256 * 1024 * 1024,
        acks: str | int = "all",
        request_timeout_ms: int = 10_000,
        stop_timeout: float = 10.0,
        topics: Sequence[str] | None = None,
        session_timeout_ms: int = 10_000,
        heartbeat_interval_ms: int = 1_000,
        fetch_max_wait_ms: int = 20,
        telemetry: Telemetry | None = None,
    ) -> None:
        self.bootstrap = bootstrap
        self.client_id = client_id
        self.partitions = partitions
        self.compression = check_compression(compression)
        self.linger_ms = linger_ms
        self.max_batch_bytes = max_batch_bytes
        self.buffer_max = max(1, buffer_max)
        self.buffer_max_bytes = buffer_max_bytes
        self.acks = acks
        self.request_timeout_ms = request_timeout_ms
        self.stop_timeout = stop_timeout
        # Consumer group membership: a member silent this long is dropped and its partitions move.
        # (tansu also waits half of it for more members when a group forms.)
        self.session_timeout_ms = session_timeout_ms
        self.heartbeat_interval_ms = heartbeat_interval_ms
        # How long a fetch may wait at the broker for new data. Kafka answers as soon as data
        # arrives; some Kafka-protocol brokers (tansu) hold the fetch for the whole wait, which
        # would add up to this much latency to every fault, so it is kept short.
        self.fetch_max_wait_ms = fetch_max_wait_ms
        self.telemetry = telemetry or Telemetry()
        # Topics created (when missing) on start and on reconnection: the contract's, plus any published to.
        self._topics: set[str] = set(topics if topics is not None else (t.value for t in Topic))
        self._topics_ready: set[str] = set()
        self._topics_lock = asyncio.Lock()
        self._partition_counts: dict[str, int] = {}
        self._key_cache: dict[tuple[str, bytes], int] = {}

        self._producer: AIOKafkaProducer | None = None
        self._sender: asyncio.Task[None] | None = None
        self._running = False
        self._seq = 0
        self._count = 0
        self._bytes = 0
        self._unassigned: deque[_Msg] = deque()
        self._lanes: dict[TopicPartition, _Lane] = {}
        self._wake = asyncio.Event()
        self._drained = asyncio.Event()
        self._drained.set()
        self._room = asyncio.Event()
        self._room.set()
        self._connect_failures = 0
        self._connect_retry_at = 0.0
        self._topics_retry_at = 0.0
        self._topic_failures = 0
        self._failing_since: float | None = None
        self._since_yield = 0
        self._dropped_log = RateLimitedLog(_LOG_EVERY_S)
        self._dropped_since_log = 0
        self._retry_log = RateLimitedLog(_LOG_EVERY_S)
        self.acked = 0

    # -- lifecycle -------------------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the sender. Does not fail when the broker is unreachable: the sender keeps trying."""
        if self._running:
            return
        self._running = True
        try:
            await self._connect()
        except Exception as e:  # noqa: BLE001 (any start failure is retried by the sender)
            log.warning("Kafka broker %s not reachable yet (%s); buffering and retrying", self.bootstrap, _why(e))
            self._connect_failures = 1
            self._connect_retry_at = time.monotonic() + backoff(1)
        self._sender = asyncio.create_task(self._guarded_sender(), name="kafka-bus-sender")

    async def stop(self) -> None:
        """Flush for at most `stop_timeout` seconds, then close; what was left is logged."""
        if not self._running:
            return
        try:
            await asyncio.wait_for(self.flush(), self.stop_timeout)
        except TimeoutError:
            by_topic: dict[str, int] = {}
            for m in self._buffered():
                by_topic[m.topic] = by_topic.get(m.topic, 0) + 1
            log.warning(
                "Kafka bus stopping with %d events unsent after %.1fs (broker %s): %s",
                self._count,
                self.stop_timeout,
                self.bootstrap,
                ", ".join(f"{t}={n}" for t, n in sorted(by_topic.items())),
            )
        self._running = False
        sender, self._sender = self._sender, None
        if sender is not None:
            sender.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):  # a crash was logged by the guard
                await sender
        await self._close_producer()
        self._room.set()

    async def flush(self) -> None:
        while self._count:
            self._drained.clear()
            if self._count:
                await self._drained.wait()

    def consumer(self, topics: Sequence[str], group: str) -> KafkaConsumer:
        return KafkaConsumer(
            self,
            topics,
            group,
            session_timeout_ms=self.session_timeout_ms,
            heartbeat_interval_ms=self.heartbeat_interval_ms,
        )

    # -- publishing ------------------------------------------------------------------------------------

    async def publish(self, topic: str, event: Event) -> None:
        await self.publish_raw(topic, event.key, event.encode())

    async def publish_raw(self, topic: str, key: str | None, value: bytes | None) -> None:
        size = len(value or b"") + len(key or "")
        if value is not None and len(value) > MAX_MESSAGE_BYTES and topic != Topic.DLQ:
            await self._refuse_oversized(topic, key, value)
            return
        if self._broker_ok() and self._over_high_water():
            # The broker is taking events, just slower than they come: wait for room rather than drop.
            self._room.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._room.wait(), self.request_timeout_ms / 1000)
        while self._count >= self.buffer_max or (self._bytes + size > self.buffer_max_bytes and self._count):
            if not self._drop_oldest():
                # Everything buffered is in flight: the newest event is the one that cannot be kept.
                self._count_drop(topic)
                return
        self._topics.add(topic)
        self._seq += 1
        self._unassigned.append(_Msg(self._seq, topic, key.encode() if key is not None else None, value, size))
        self._count += 1
        self._bytes += size
        self._drained.clear()
        self.telemetry.producer_buffered.set(self._count)
        self._wake.set()
        self._since_yield += 1
        if self._since_yield >= _YIELD_EVERY:
            self._since_yield = 0
            await asyncio.sleep(0)

    async def _refuse_oversized(self, topic: str, key: str | None, value: bytes) -> None:
        reason = f"oversized message: {len(value)} bytes > {MAX_MESSAGE_BYTES}"
        log.warning("refusing to publish to %s (key %s): %s; set aside on %s", topic, key, reason, Topic.DLQ)
        self.telemetry.dlq.labels(reason="oversized").inc()
        letter = DeadLetter(
            reason=reason, topic=topic, key=key, head=value[:4096].decode(errors="replace"), size=len(value)
        )
        await self.publish(Topic.DLQ, make_event(letter, producer=self.client_id, key=key or "dlq"))

    def _over_high_water(self) -> bool:
        return self._count >= self.buffer_max // 2 or self._bytes >= self.buffer_max_bytes // 2

    def _buffered(self) -> list[_Msg]:
        out = list(self._unassigned)
        for lane in self._lanes.values():
            out.extend(lane.queue)
        return out

    def _drop_oldest(self) -> bool:
        """Drop the oldest event that is not in flight. False when there is none."""
        best: deque[_Msg] | None = None
        best_index = 0
        best_seq = None
        if self._unassigned:
            best, best_seq = self._unassigned, self._unassigned[0].seq
        for lane in self._lanes.values():
            if len(lane.queue) > lane.inflight:
                seq = lane.queue[lane.inflight].seq
                if best_seq is None or seq < best_seq:
                    best, best_index, best_seq = lane.queue, lane.inflight, seq
        if best is None:
            return False
        msg = best[best_index]
        del best[best_index]
        self._forget(msg)
        self._count_drop(msg.topic)
        return True

    def _count_drop(self, topic: str) -> None:
        self.telemetry.producer_dropped.labels(topic=topic).inc()
        self._dropped_since_log += 1
        if self._dropped_log.ready():
            log.warning(
                "Kafka producer buffer full (%d events, %d bytes; broker %s %s): dropped %d oldest events",
                self._count,
                self._bytes,
                self.bootstrap,
                "acknowledging" if self._broker_ok() else "unreachable",
                self._dropped_since_log,
            )
            self._dropped_since_log = 0

    def _forget(self, msg: _Msg) -> None:
        self._count -= 1
        self._bytes -= msg.size
        self.telemetry.producer_buffered.set(self._count)
        if self._count == 0:
            self._drained.set()
        if not self._over_high_water():
            self._room.set()

    # -- the sender ------------------------------------------------------------------------------------

    async def _guarded_sender(self) -> None:
        try:
            await self._send_loop()
        except asyncio.CancelledError:
            raise
        except BaseException:
            log.exception("Kafka bus sender crashed; events stay buffered until the bus is restarted")
            raise

    async def _send_loop(self) -> None:
        while self._running:
            self._wake.clear()
            try:
                if self._producer is None and time.monotonic() >= self._connect_retry_at:
                    await self._reconnect()
                if self._producer is not None and self._stalled():
                    log.warning(
                        "no acknowledgement from %s for %.0fs; rebuilding the Kafka producer",
                        self.bootstrap,
                        time.monotonic() - (self._failing_since or 0.0),
                    )
                    await self._close_producer()
                    continue
                self._check_inflight()
                if self._producer is not None:
                    await self._ensure_topics()
                    await self._assign()
                    if self.linger_ms and any(lane.inflight == 0 and lane.queue for lane in self._lanes.values()):
                        await asyncio.sleep(self.linger_ms / 1000)
                    await self._launch()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # the sender must outlive any one failure
                self._failing_since = self._failing_since or time.monotonic()
                self._room.set()
                self.telemetry.producer_retries.inc()
                if self._retry_log.ready():
                    log.warning("Kafka bus sender error (%s); retrying", _why(e), exc_info=True)
                await asyncio.sleep(backoff(2))
            await self._idle()

    def _stalled(self) -> bool:
        """Failing for a long time with nothing in flight: rebuild the client rather than trust it."""
        return (
            self._failing_since is not None
            and time.monotonic() - self._failing_since > 3 * self.request_timeout_ms / 1000
            and not any(lane.inflight for lane in self._lanes.values())
        )

    @property
    def connected(self) -> bool:
        return self._running and self._broker_ok()

    def _broker_ok(self) -> bool:
        """The broker acknowledges: no failure since the last acknowledgement, nothing overdue."""
        if self._producer is None or self._failing_since is not None:
            return False
        limit = time.monotonic() - self.request_timeout_ms / 1000
        return not any(lane.inflight and lane.sent_at < limit for lane in self._lanes.values())

    def _check_inflight(self) -> None:
        """Notice batches the client holds without an answer (it waits for a broker that is gone)."""
        now = time.monotonic()
        timeout = self.request_timeout_ms / 1000
        for lane in self._lanes.values():
            if not lane.inflight:
                continue
            age = now - lane.sent_at
            if age > timeout:
                self._room.set()  # publishers must not wait for room while the broker is away
                if self._retry_log.ready():
                    log.warning(
                        "no acknowledgement from %s for %.0fs (%s[%d]); %d events buffered",
                        self.bootstrap,
                        age,
                        lane.topic,
                        lane.partition,
                        self._count,
                    )
            if age > 3 * timeout:
                # Give up on this send: send the batch again (after backoff) instead of trusting a
                # client that may never answer; a late answer to the old send is ignored.
                n = lane.inflight
                lane.attempt += 1
                self._failed(lane, n, KafkaTimeoutError(f"no answer in {age:.0f}s"))

    async def _idle(self) -> None:
        """Sleep until new events, an acknowledgement, or the next retry is due."""
        now = time.monotonic()
        rt = self.request_timeout_ms / 1000
        due = [lane.retry_at for lane in self._lanes.values() if lane.queue and not lane.inflight]
        for lane in self._lanes.values():
            if lane.inflight:
                due.extend(t for t in (lane.sent_at + rt, lane.sent_at + 3 * rt) if t > now)
        if self._producer is None:
            due.append(self._connect_retry_at)
        elif self._unassigned:
            due.append(now + 0.5)
        timeout = max(0.0, min(due) - now) if due else None
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), timeout)

    async def _connect(self) -> None:
        producer = AIOKafkaProducer(
            bootstrap_servers=self.bootstrap,
            client_id=self.client_id,
            acks=self.acks,
            compression_type=self.compression,
            max_batch_size=self.max_batch_bytes,
            max_request_size=max(self.max_batch_bytes, 1_048_576) + 65_536,
            request_timeout_ms=self.request_timeout_ms,
            metadata_max_age_ms=60_000,
        )
        try:
            await asyncio.wait_for(producer.start(), self.request_timeout_ms / 1000)
        except BaseException:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(producer.stop(), 5)
            raise
        self._producer = producer
        self._topics_ready.clear()
        self._topics_retry_at = 0.0
        self._failing_since = None
        self._connect_failures = 0
        log.info("Kafka producer connected to %s", self.bootstrap)
        await self._ensure_topics()

    async def _reconnect(self) -> None:
        try:
            await self._connect()
        except Exception as e:  # noqa: BLE001
            self._connect_failures += 1
            self._connect_retry_at = time.monotonic() + backoff(self._connect_failures)
            self.telemetry.producer_retries.inc()
            if self._retry_log.ready():
                log.warning(
                    "Kafka broker %s unreachable (%s); %d events buffered, retrying (attempt %d)",
                    self.bootstrap,
                    _why(e),
                    self._count,
                    self._connect_failures,
                )

    async def _close_producer(self) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            try:
                await asyncio.wait_for(producer.stop(), 5)
            except Exception as e:  # noqa: BLE001
                log.debug("closing the Kafka producer: %s", _why(e))

    async def ensure_topics(self, topics: Sequence[str]) -> None:
        """Create these topics (with `partitions` partitions) when missing; best effort, never raises."""
        self._topics.update(topics)
        async with self._topics_lock:
            await self._create_topics([t for t in topics if t not in self._topics_ready])

    async def _create_topics(self, missing: list[str]) -> None:
        if not missing:
            return
        admin = AIOKafkaAdminClient(
            bootstrap_servers=self.bootstrap, client_id=f"{self.client_id}-admin", request_timeout_ms=5000
        )
        try:
            await asyncio.wait_for(admin.start(), 5)
            existing = set(await asyncio.wait_for(admin.list_topics(), 5))
            new = [NewTopic(t, self.partitions, 1) for t in missing if t not in existing]
            if new:
                resp = await asyncio.wait_for(admin.create_topics(new), 10)
                for name, code, *rest in getattr(resp, "topic_errors", ()):
                    if code and code != TopicAlreadyExistsError.errno:
                        log.error(
                            "the broker refused to create topic %s (error %s: %s); create it by hand", name, code, rest
                        )
                    else:
                        log.info("created topic %s with %d partitions", name, self.partitions)
            self._topics_ready.update(missing)
        except TopicAlreadyExistsError:
            self._topics_ready.update(missing)
        except Exception as e:  # noqa: BLE001 (a broker that forbids creation is not fatal)
            log.warning("could not create topics %s on %s: %s", ", ".join(missing), self.bootstrap, _why(e))
        finally:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(admin.close(), 5)

    async def _ensure_topics(self) -> None:
        missing = sorted(self._topics - self._topics_ready)
        if not missing or time.monotonic() < self._topics_retry_at:
            return
        await self.ensure_topics(missing)
        if self._topics - self._topics_ready:
            self._topic_failures += 1
            self._topics_retry_at = time.monotonic() + backoff(self._topic_failures)
        else:
            self._topic_failures = 0

    async def _partition_count(self, topic: str) -> int | None:
        producer = self._producer
        if producer is None:
            return None
        known = producer.client.cluster.partitions_for_topic(topic)
        if not known:
            try:
                known = await asyncio.wait_for(producer.partitions_for(topic), 2)
            except (TimeoutError, KafkaError) as e:
                log.debug("no metadata for %s yet: %s", topic, _why(e))
                self._topics_ready.discard(topic)
                return None
        n = len(known)
        if self._partition_counts.get(topic) != n:
            self._partition_counts[topic] = n
            self._key_cache = {k: v for k, v in self._key_cache.items() if k[0] != topic}
        return n

    async def _assign(self) -> None:
        """Move new events into their partition's lane (in publish order)."""
        if not self._unassigned:
            return
        counts: dict[str, int | None] = {}
        held: deque[_Msg] = deque()
        while self._unassigned:
            msg = self._unassigned.popleft()
            if msg.topic not in counts:
                counts[msg.topic] = self._partition_counts.get(msg.topic) or await self._partition_count(msg.topic)
            n = counts[msg.topic]
            if n is None:
                held.append(msg)  # later events of this topic wait behind it, so keys keep their order
                continue
            if msg.key is None:
                p = kafka_partition(None, n)
            else:
                ck = (msg.topic, msg.key)
                p_cached = self._key_cache.get(ck)
                if p_cached is None:
                    if len(self._key_cache) > 200_000:
                        self._key_cache.clear()
                    p_cached = self._key_cache[ck] = kafka_partition(msg.key, n)
                p = p_cached
            lane = self._lanes.get((msg.topic, p))
            if lane is None:
                lane = self._lanes[(msg.topic, p)] = _Lane(msg.topic, p)
            lane.queue.append(msg)
        self._unassigned = held

    async def _launch(self) -> None:
        producer = self._producer
        if producer is None:
            return
        now = time.monotonic()
        for lane in self._lanes.values():
            if lane.inflight or not lane.queue or lane.retry_at > now:
                continue
            batch = producer.create_batch()
            n = 0
            limit = 1 if lane.singles else len(lane.queue)
            for msg in lane.queue:
                if n >= limit or batch.append(key=msg.key, value=msg.value, timestamp=None) is None:
                    break
                n += 1
            if n == 0:  # one event larger than a whole batch: it can never be sent
                msg = lane.queue.popleft()
                log.error("dropping an event for %s of %d bytes: larger than max_batch_bytes", lane.topic, msg.size)
                self._forget(msg)
                self._count_drop(lane.topic)
                continue
            lane.inflight = n
            lane.sent_at = time.monotonic()
            lane.attempt += 1
            attempt = lane.attempt
            try:
                fut = await producer.send_batch(batch, lane.topic, partition=lane.partition)
            except Exception as e:  # noqa: BLE001
                self._failed(lane, n, e)
                continue
            fut.add_done_callback(lambda f, lane=lane, n=n, attempt=attempt: self._done(lane, n, attempt, f))

    def _done(self, lane: _Lane, n: int, attempt: int, fut: asyncio.Future[Any]) -> None:
        if attempt != lane.attempt:
            return  # an answer to a send given up on: the batch was (or will be) sent again
        if fut.cancelled():
            self._failed(lane, n, asyncio.CancelledError())
            return
        exc = fut.exception()
        if exc is not None:
            self._failed(lane, n, exc)
            return
        lane.inflight = 0
        lane.failures = 0
        lane.retry_at = 0.0
        lane.singles = max(0, lane.singles - n)
        for _ in range(n):
            self._forget(lane.queue.popleft())
        self.acked += n
        self.telemetry.events_out.labels(topic=lane.topic).inc(n)
        if self._failing_since is not None:
            log.info("Kafka broker %s acknowledging again; %d events buffered", self.bootstrap, self._count)
        self._failing_since = None
        self._wake.set()

    def _failed(self, lane: _Lane, n: int, exc: BaseException) -> None:
        lane.inflight = 0
        if isinstance(exc, _PERMANENT):
            if n > 1:
                lane.singles = n  # find the refused one: send these one by one
            else:
                msg = lane.queue.popleft()
                log.error(
                    "the broker refused an event for %s (%d bytes) for good: %s; dropped", lane.topic, msg.size, exc
                )
                self._forget(msg)
                self._count_drop(lane.topic)
            self._wake.set()
            return
        lane.failures += 1
        lane.retry_at = time.monotonic() + backoff(lane.failures)
        if self._failing_since is None:
            self._failing_since = time.monotonic()
        self._room.set()
        self.telemetry.producer_retries.inc()
        if isinstance(exc, UnknownTopicOrPartitionError):
            self._topics_ready.discard(lane.topic)
        if self._retry_log.ready():
            log.warning(
                "Kafka send to %s[%d] failed (%s); %d events buffered, retrying (attempt %d, %d similar suppressed)",
                lane.topic,
                lane.partition,
                _why(exc),
                self._count,
                lane.failures,
                self._retry_log.take_suppressed(),
            )
        self._wake.set()


def _why(e: BaseException) -> str:
    text = str(e)
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


# -- consumer ------------------------------------------------------------------------------------------


class KafkaConsumer(Consumer):
    """One member of a Kafka consumer group; commits are manual (the caller's OffsetTracker)."""

    # Rebuild the aiokafka consumer after this many failed polls in a row.
    rebuild_after = 5

    def __init__(
        self,
        bus: KafkaBus,
        topics: Sequence[str],
        group: str,
        *,
        session_timeout_ms: int = 10_000,
        heartbeat_interval_ms: int = 1_000,
    ) -> None:
        self.bus = bus
        self.topics = list(topics)
        self.group = group
        self.session_timeout_ms = session_timeout_ms
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self._consumer: AIOKafkaConsumer | None = None
        self._running = False
        self._failures = 0
        self._retry_at = 0.0
        self._log = RateLimitedLog(_LOG_EVERY_S)

    async def start(self) -> None:
        """Join the group. A broker that is down now is retried by `getmany()`, not raised."""
        self._running = True
        await self.bus.ensure_topics(self.topics)
        try:
            await self._open()
        except Exception as e:  # noqa: BLE001
            self._note_failure("joining the group", e)

    async def _open(self) -> None:
        consumer = AIOKafkaConsumer(
            *self.topics,
            bootstrap_servers=self.bus.bootstrap,
            client_id=self.bus.client_id,
            group_id=self.group,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            session_timeout_ms=self.session_timeout_ms,
            heartbeat_interval_ms=self.heartbeat_interval_ms,
            request_timeout_ms=max(self.bus.request_timeout_ms, self.session_timeout_ms + 5000),
            metadata_max_age_ms=30_000,
            max_partition_fetch_bytes=max(self.bus.max_batch_bytes, 1_048_576) + 65_536,
            fetch_max_wait_ms=self.bus.fetch_max_wait_ms,
        )
        try:
            # Joining waits for the group to form (tansu: half a session timeout; longer after a
            # member vanished without leaving): be patient here rather than rejoin from scratch.
            await asyncio.wait_for(consumer.start(), (self.bus.request_timeout_ms + 3 * self.session_timeout_ms) / 1000)
        except BaseException:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(consumer.stop(), 5)
            raise
        self._consumer = consumer
        self._failures = 0

    async def _close(self) -> None:
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            try:
                await asyncio.wait_for(consumer.stop(), 10)
            except Exception as e:  # noqa: BLE001
                log.debug("closing Kafka consumer of group %s: %s", self.group, _why(e))

    async def stop(self) -> None:
        self._running = False
        await self._close()

    def _note_failure(self, what: str, e: BaseException) -> None:
        self._failures += 1
        self._retry_at = time.monotonic() + backoff(self._failures)
        if self._log.ready():
            log.warning(
                "Kafka consumer (group %s, broker %s) failed %s: %s; retrying (attempt %d)",
                self.group,
                self.bus.bootstrap,
                what,
                _why(e),
                self._failures,
            )

    async def getmany(self, timeout_ms: int = 100, max_records: int = 1000) -> list[Record]:
        if not self._running:
            return []
        if self._consumer is None or self._failures >= self.rebuild_after:
            wait = self._retry_at - time.monotonic()
            if wait > 0:
                await asyncio.sleep(min(wait, timeout_ms / 1000))
                return []
            if self._consumer is not None:
                log.warning("rebuilding the Kafka consumer of group %s after %d errors", self.group, self._failures)
                await self._close()
            try:
                await self._open()
            except Exception as e:  # noqa: BLE001
                self._note_failure("joining the group", e)
                return []
        consumer = self._consumer
        if consumer is None:
            return []
        try:
            batches = await consumer.getmany(timeout_ms=timeout_ms, max_records=max_records)
        except Exception as e:  # noqa: BLE001 (the caller's loop must not see the broker's trouble)
            self._note_failure("fetching", e)
            await asyncio.sleep(min(backoff(self._failures), timeout_ms / 1000))
            return []
        self._failures = 0
        out: list[Record] = []
        for tp in sorted(batches, key=lambda t: (t.topic, t.partition)):
            for m in batches[tp]:
                key = m.key.decode(errors="replace") if isinstance(m.key, bytes) else m.key
                out.append(Record(m.topic, m.partition, m.offset, key, m.value, m.timestamp or 0))
        return out

    async def commit(self, offsets: dict[TopicPartition, int]) -> None:
        consumer = self._consumer
        if consumer is None or not offsets:
            return
        owned = consumer.assignment()
        todo = {KafkaTP(t, p): off for (t, p), off in offsets.items() if KafkaTP(t, p) in owned}
        if len(todo) < len(offsets):
            log.debug("not committing %d partitions this member no longer owns", len(offsets) - len(todo))
        if not todo:
            return
        for attempt in range(1, 4):
            try:
                await consumer.commit(todo)
                return
            except (CommitFailedError, IllegalStateError) as e:
                # A rebalance gave the partitions away: the new owner reads them again (at-least-once).
                log.warning("commit of group %s not accepted (%s); records will be redelivered", self.group, _why(e))
                return
            except Exception as e:  # noqa: BLE001
                if attempt == 3:
                    log.warning("commit of group %s failed (%s); records will be redelivered", self.group, _why(e))
                    return
                await asyncio.sleep(backoff(attempt))

    def assignment(self) -> set[TopicPartition]:
        consumer = self._consumer
        if consumer is None:
            return set()
        return {(tp.topic, tp.partition) for tp in consumer.assignment()}

    async def lag(self) -> int:
        consumer = self._consumer
        if consumer is None:
            return 0
        total = 0
        for tp in consumer.assignment():
            high = consumer.highwater(tp)
            if high is None:
                continue
            try:
                pos = await asyncio.wait_for(consumer.position(tp), 1)
            except Exception as e:  # noqa: BLE001 (best effort)
                log.debug("no position for %s: %s", tp, _why(e))
                continue
            total += max(0, int(high) - int(pos))
        self.bus.telemetry.consumer_lag.set(total)
        return total
