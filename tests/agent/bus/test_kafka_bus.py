"""The bus contract on both implementations, and what only the Kafka bus has to survive.

Contract (each test runs on MemoryBus and on KafkaBus against two real brokers, Apache Kafka and
tansu): round trip, per key order, a group splitting partitions, at-least-once commits. Kafka only
(on both brokers): topic creation, a broker killed and restarted mid-stream, the bounded producer
buffer, a bounded stop.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter, defaultdict
from collections.abc import Callable

import pytest
import yaml
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.codec import has_zstd
from aiokafka.partitioner import DefaultPartitioner
from paths import ROOT
from servers.kafka import kafka_version
from servers.tansu import free_port

from bus.conftest import PARTITIONS, Broker, collect, kafka_bus, log_event, seq_of, started
from trainmedic.agent.bus.base import Bus, Consumer, Record, TopicPartition
from trainmedic.agent.bus.kafka import KafkaBus, backoff, check_compression, kafka_partition
from trainmedic.agent.telemetry import Telemetry
from trainmedic.events import Topic, decode

# -- the contract, on both buses ------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_round_trip(bus: Bus, topic: str, group: str) -> None:
    consumer = bus.consumer([topic], group)
    early = await started(consumer)
    sent = [log_event(f"job{i % 3}", i) for i in range(30)]
    for ev in sent:
        await bus.publish(topic, ev)
    await asyncio.wait_for(bus.flush(), 20)
    records = early + await collect(consumer, len(sent))
    got = {decode(r.value).id: decode(r.value) for r in records}
    assert set(got) == {ev.id for ev in sent}
    assert all(got[ev.id] == ev for ev in sent)
    assert all(r.topic == topic and r.key == got[decode(r.value).id].key for r in records)
    assert await consumer.lag() == 0
    await consumer.stop()


@pytest.mark.asyncio
async def test_per_key_order(bus: Bus, topic: str, group: str) -> None:
    consumer = bus.consumer([topic], group)
    await started(consumer)
    keys = [f"job{k}" for k in range(6)]
    for i in range(240):
        await bus.publish(topic, log_event(keys[i % len(keys)], i))
    assert await asyncio.wait_for(_lag_reaches(consumer, 240), 20)
    records = await collect(consumer, 240)
    by_key: dict[str | None, list[int]] = defaultdict(list)
    partitions: dict[str | None, set[int]] = defaultdict(set)
    for r in records:
        by_key[r.key].append(seq_of(decode(r.value)))
        partitions[r.key].add(r.partition)
    assert len(by_key) == len(keys)
    for key, seqs in by_key.items():
        assert seqs == sorted(seqs), key
        assert len(partitions[key]) == 1, key
    await consumer.stop()


async def _stable_split(a: Consumer, b: Consumer, topic: str, timeout: float = 30.0) -> None:
    """Wait until the two members own disjoint, complete halves of the topic's partitions."""
    everything = {(topic, p) for p in range(PARTITIONS)}

    async def run() -> None:
        while True:
            sa, sb = a.assignment(), b.assignment()
            if sa and sb and not (sa & sb) and sa | sb == everything:
                return
            await asyncio.gather(a.getmany(timeout_ms=50), b.getmany(timeout_ms=50))

    await asyncio.wait_for(run(), timeout)


@pytest.mark.asyncio
async def test_group_members_share_partitions(bus: Bus, topic: str, group: str) -> None:
    a, b = bus.consumer([topic], group), bus.consumer([topic], group)
    await a.start()
    await b.start()
    await _stable_split(a, b, topic)
    sent = [log_event(f"job{i % 20}", i) for i in range(200)]
    for ev in sent:
        await bus.publish(topic, ev)
    got: dict[str, list[Record]] = {"a": [], "b": []}

    async def run() -> None:
        while len(got["a"]) + len(got["b"]) < len(sent):
            ra, rb = await asyncio.gather(a.getmany(timeout_ms=100), b.getmany(timeout_ms=100))
            got["a"] += ra
            got["b"] += rb

    await asyncio.wait_for(run(), 30)
    assert got["a"] and got["b"], "both members must get a share"
    ids_a = {decode(r.value).id for r in got["a"]}
    ids_b = {decode(r.value).id for r in got["b"]}
    assert not ids_a & ids_b, "no record goes to both members"
    assert ids_a | ids_b == {ev.id for ev in sent}
    keys_a, keys_b = {r.key for r in got["a"]}, {r.key for r in got["b"]}
    assert not keys_a & keys_b, "each key has exactly one owner"
    await a.stop()
    await b.stop()


def _offsets_through(records: list[Record]) -> dict[TopicPartition, int]:
    out: dict[TopicPartition, int] = {}
    for r in records:
        out[r.tp] = max(out.get(r.tp, 0), r.offset + 1)
    return out


@pytest.mark.asyncio
async def test_uncommitted_records_are_redelivered_to_the_next_member(bus: Bus, topic: str, group: str) -> None:
    first = bus.consumer([topic], group)
    await started(first)
    sent = [log_event(f"job{i % 5}", i) for i in range(60)]
    for ev in sent:
        await bus.publish(topic, ev)
    records = await collect(first, len(sent))
    processed = [r for r in records if seq_of(decode(r.value)) < 30]
    # Records of one partition arrive in publish order, so "processed" is a prefix of each partition.
    await first.commit(_offsets_through(processed))
    await first.stop()

    second = bus.consumer([topic], group)
    again = await started(second)
    again += await collect(second, len(sent) - len(processed), quiet=0.5)
    seqs = sorted(seq_of(decode(r.value)) for r in again)
    assert seqs == list(range(30, 60)), "exactly the uncommitted records, once each"
    await second.stop()


async def _lag_reaches(consumer: Consumer, n: int) -> bool:
    """Kafka learns the high-water mark from fetches: poll lag until it shows everything unread."""
    while await consumer.lag() < n:
        await asyncio.sleep(0.05)
    return True


async def _until(condition: Callable[[], bool]) -> None:
    while not condition():
        await asyncio.sleep(0.05)


# -- Kafka only ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("key", [b"job:ns/train", b"node:gpu-7", "job:训练/任务".encode(), b""])
def test_kafka_partition_is_the_default_partitioner(key: bytes) -> None:
    """The lanes use the partition aiokafka's (and the Java client's) default partitioner picks."""
    parts = list(range(12))
    assert kafka_partition(key, 12) == DefaultPartitioner()(key, parts, parts)


def test_keyless_events_spread_over_partitions() -> None:
    assert {kafka_partition(None, 3) for _ in range(200)} == {0, 1, 2}


@pytest.mark.parametrize(
    ("compression", "expected"),
    [(None, None), ("none", None), ("", None), ("gzip", "gzip"), ("zstd", "zstd" if has_zstd() else ValueError)],
)
def test_compression_is_checked_when_the_bus_is_made(compression: str | None, expected: object) -> None:
    if expected is ValueError:
        with pytest.raises(ValueError, match="cramjam"):
            check_compression(compression)
    else:
        assert check_compression(compression) == expected


def test_unknown_compression_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown Kafka compression 'brotli'"):
        KafkaBus("127.0.0.1:9", compression="brotli")


@pytest.mark.parametrize("attempt", [1, 2, 5, 30])
def test_backoff_grows_with_jitter_and_a_cap(attempt: int) -> None:
    delays = [backoff(attempt, base=0.2, cap=15.0) for _ in range(50)]
    top = min(15.0, 0.2 * 2 ** (attempt - 1))
    assert all(top / 2 <= d <= top for d in delays)
    assert len(set(delays)) > 1


def test_the_test_broker_is_the_one_compose_runs() -> None:
    """tests/kafka/pom.xml (what `make kafka` fetches) pins the Apache Kafka of docker-compose.yml."""
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    assert compose["services"]["kafka"]["image"] == f"apache/kafka:{kafka_version()}"


@pytest.mark.asyncio
async def test_start_creates_the_design_topics(broker: Broker, telemetry: Telemetry) -> None:
    bus = KafkaBus(broker.bootstrap, partitions=3, telemetry=telemetry, stop_timeout=5)
    await bus.start()
    admin = AIOKafkaAdminClient(bootstrap_servers=broker.bootstrap)
    await admin.start()
    try:
        described = await admin.describe_topics([t.value for t in Topic])
    finally:
        await admin.close()
        await bus.stop()
    counts = {d["topic"]: len(d["partitions"]) for d in described}
    assert counts == {t.value: 3 for t in Topic}


@pytest.mark.parametrize(
    "outage",
    [
        pytest.param(1.5, id="short"),
        # Longer than 3 request timeouts (the producer rebuilds its client) and than the session
        # timeout (the broker forgets the member, which must join the group again).
        pytest.param(4.5, id="long"),
    ],
)
@pytest.mark.asyncio
async def test_broker_killed_and_restarted_mid_stream(
    durable_broker: Broker,
    telemetry: Telemetry,
    topic: str,
    group: str,
    caplog: pytest.LogCaptureFixture,
    outage: float,
) -> None:
    """Nothing published is lost across a broker crash; the consumer rides it out.

    The broker keeps its log and the group's offsets across the restart (Apache Kafka's log
    directory; tansu's durable storage). The producer keeps publishing while it is down (publish never raises), the
    buffer drains once it is back, and the consumer, which keeps polling through the outage,
    resumes from its last commit: every event id arrives at least once, duplicates are told apart
    by id, and each key's events come in publish order.
    """
    caplog.set_level(logging.WARNING, logger="trainmedic.bus")
    # tansu's S3 engine takes longer than the default 20 ms fetch wait to serve a fetch from object
    # storage and answers empty until then; a Kafka broker has no such floor.
    bus = kafka_bus(durable_broker.bootstrap, telemetry, request_timeout_ms=1000, fetch_max_wait_ms=200)
    await bus.start()
    consumer = bus.consumer([topic], group)
    seen: list[Record] = list(await started(consumer))
    stop = asyncio.Event()
    errors: list[BaseException] = []

    committed: set[str] = set()
    polls = [0]

    async def consume() -> None:
        try:
            while not stop.is_set():
                records = await consumer.getmany(timeout_ms=100)
                polls[0] += 1
                seen.extend(records)
                await consumer.commit(_offsets_through(records))
                committed.update(decode(r.value).id for r in records)
        except BaseException as e:
            errors.append(e)
            raise

    task = asyncio.create_task(consume())
    sent = [log_event(f"job{i % 7}", i) for i in range(150)]
    for ev in sent[:50]:
        await bus.publish(topic, ev)
    await asyncio.wait_for(bus.flush(), 20)
    await asyncio.wait_for(_until(lambda: {ev.id for ev in sent[:50]} <= committed), 20)

    durable_broker.kill()
    polls_before = polls[0]
    for ev in sent[50:100]:
        await asyncio.wait_for(bus.publish(topic, ev), 1)  # returns at once, never raises
    await asyncio.sleep(outage)
    assert telemetry.producer_buffered._value.get() > 0
    assert polls[0] > polls_before, "the consumer keeps polling through the outage"
    # The broker comes up while the loop runs: the clients see it as they would see a real one.
    await asyncio.to_thread(durable_broker.start)
    for ev in sent[100:]:
        await bus.publish(topic, ev)
    await asyncio.wait_for(bus.flush(), 40)

    async def all_seen() -> None:
        want = {ev.id for ev in sent}
        while not want <= {decode(r.value).id for r in seen}:
            await asyncio.sleep(0.1)

    await asyncio.wait_for(all_seen(), 40)
    stop.set()
    await task
    await consumer.stop()
    await bus.stop()
    assert not errors
    ids = Counter(decode(r.value).id for r in seen)
    assert set(ids) == {ev.id for ev in sent}
    # The group's offsets survived the crash: what was committed before it is not read again.
    assert all(ids[ev.id] == 1 for ev in sent[:50])
    first_seen: dict[str | None, list[int]] = defaultdict(list)
    done: set[str] = set()
    for r in seen:
        ev = decode(r.value)
        if ev.id not in done:
            done.add(ev.id)
            first_seen[r.key].append(seq_of(ev))
    assert all(s == sorted(s) for s in first_seen.values())
    assert telemetry.producer_buffered._value.get() == 0
    assert any("no acknowledgement" in m or "failed" in m or "unreachable" in m for m in caplog.messages)


@pytest.mark.asyncio
async def test_full_buffer_drops_the_oldest_while_the_broker_is_down(
    make_broker: Callable[[int], Broker],
    telemetry: Telemetry,
    topic: str,
    group: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="trainmedic.bus")
    port = free_port()
    bus = kafka_bus(f"127.0.0.1:{port}", telemetry, buffer_max=10, topics=[topic])
    await bus.start()  # nothing listens there: start logs and goes on
    sent = [log_event("job", i) for i in range(25)]
    for ev in sent:
        await asyncio.wait_for(bus.publish(topic, ev), 1)
    assert telemetry.producer_dropped.labels(topic=topic)._value.get() == 15
    assert telemetry.producer_buffered._value.get() == 10
    full = [r for r in caplog.records if "buffer full" in r.getMessage()]
    assert len(full) == 1, "rate-limited: one line for the burst"
    assert full[0].levelno == logging.WARNING

    # The broker appears: the 10 newest are delivered, in order.
    broker = make_broker(port)
    assert broker.bootstrap == bus.bootstrap
    await asyncio.to_thread(broker.start)
    await asyncio.wait_for(bus.flush(), 40)
    consumer = bus.consumer([topic], group)
    records = await started(consumer)
    records += await collect(consumer, 10 - len(records), quiet=0.3)
    assert [seq_of(decode(r.value)) for r in records] == list(range(15, 25))
    await consumer.stop()
    await bus.stop()


@pytest.mark.asyncio
async def test_stop_is_bounded_and_reports_what_was_left(
    telemetry: Telemetry, topic: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="trainmedic.bus")
    bus = kafka_bus(f"127.0.0.1:{free_port()}", telemetry, stop_timeout=0.5, topics=[topic])
    await bus.start()
    for i in range(3):
        await bus.publish(topic, log_event("job", i))
    await asyncio.wait_for(bus.stop(), 10)
    assert any("3 events unsent" in m and f"{topic}=3" in m for m in caplog.messages)


def test_the_test_brokers_cluster_ids_never_read_as_an_option() -> None:
    """`kafka-storage format -t <id>`: an id starting with `-` (one base64url id in 64) is taken for an
    option and the broker never starts; the ids drawn for the test brokers never start so."""
    from servers.kafka import _cluster_id

    ids = [_cluster_id() for _ in range(4000)]
    assert not [i for i in ids if i.startswith("-")]
    assert all(len(i) == 22 for i in ids) and len(set(ids)) == len(ids)
