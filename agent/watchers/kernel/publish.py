"""What the kernel sources share: the line limits and escapes, `KernelSourceUnavailable`, the boot
time and boot id, `_Publisher`, which batches the lines read into bus events for the jobs on the
node, and `_KernelSource`, what every source holds (its telemetry and publisher).
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import ClassVar

from trainmedic.agent.bus.base import Bus
from trainmedic.agent.jobindex import JobIndex
from trainmedic.agent.telemetry import Telemetry
from trainmedic.backoff import Backoff, retry_until_done
from trainmedic.errors import PermanentError
from trainmedic.events import MAX_MESSAGE_BYTES, Event, KernelBatch, Topic, make_event, node_key

log = logging.getLogger("trainmedic.watchers.kernel")


MAX_KERNEL_LINE = 16 << 10  # longer lines are cut (a printk record is at most ~1 KiB)
_ESCAPE = re.compile(rb"\\x([0-9a-fA-F]{2})")
# Text up to this many characters always fits one bus message, even at 6 JSON bytes per character.
_SAFE_CHARS = (MAX_MESSAGE_BYTES - (64 << 10)) // 6


class KernelSourceUnavailable(PermanentError):
    """A kernel source cannot run on this host (journalctl missing, /dev/kmsg unreadable)."""


# -- records and their text -----------------------------------------------------------------------


def record_lines(message: str) -> list[str]:
    """A kernel message as published lines: continuation lines indented, as dmesg prints them."""
    parts = message.rstrip("\n").split("\n")
    return [parts[0], *(" " + p for p in parts[1:])]


def _cap(text: str) -> str:
    return text if len(text) <= MAX_KERNEL_LINE else text[:MAX_KERNEL_LINE] + " [trainmedic: line cut]"


def unescape_kmsg(raw: bytes) -> str:
    """`\\xNN` escapes of a kmsg message back to bytes, then UTF-8 (invalid bytes replaced)."""
    if b"\\x" in raw:
        raw = _ESCAPE.sub(lambda m: bytes((int(m.group(1), 16),)), raw)
    return raw.decode("utf-8", "replace")


def boot_time() -> float:
    """Wall-clock time of boot: kmsg stamps records with the monotonic clock since boot."""
    return time.time() - time.clock_gettime(time.CLOCK_MONOTONIC)


def read_boot_id() -> str | None:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip() or None
    except OSError:
        return None


# -- publishing ------------------------------------------------------------------------------------


@dataclass(slots=True)
class _Chunk:
    lines: list[str]
    times: list[float]
    first_line: int
    # What to remember once this is accepted (a kmsg seq, a journald cursor, a file position).
    mark: object = None


class _Publisher:
    """Batches chunks from a source and publishes them, one copy per job on the node."""

    def __init__(
        self,
        *,
        source: str,
        bus: Bus,
        node: str,
        job_index: JobIndex,
        telemetry: Telemetry,
        producer: str,
        batch_lines: int,
        batch_bytes: int,
        batch_linger: float,
        on_published: Callable[[object], Awaitable[None]] | None = None,
        queue_size: int = 256,
    ) -> None:
        self.source = source
        self.bus = bus
        self.node = node
        self.job_index = job_index
        self.telemetry = telemetry
        self.producer = producer
        self.batch_lines = batch_lines
        self.batch_bytes = batch_bytes
        self.batch_linger = batch_linger
        self.on_published = on_published
        self.queue: asyncio.Queue[_Chunk | BaseException] = asyncio.Queue(maxsize=queue_size)
        self.published_lines = 0
        self.publish_errors = 0

    async def run(self) -> None:
        """Publish what the source queues, until cancelled; a queued exception ends it (raised)."""
        loop = asyncio.get_running_loop()
        while True:
            item = await self.queue.get()
            if isinstance(item, BaseException):
                raise item
            chunks = [item]
            n, size = len(item.lines), sum(map(len, item.lines))
            deadline = loop.time() + self.batch_linger
            failure: BaseException | None = None
            while n < self.batch_lines and size < self.batch_bytes:
                left = deadline - loop.time()
                try:
                    nxt = self.queue.get_nowait() if left <= 0 else await asyncio.wait_for(self.queue.get(), left)
                except (asyncio.QueueEmpty, TimeoutError):
                    break
                if isinstance(nxt, BaseException):
                    failure = nxt
                    break
                chunks.append(nxt)
                n += len(nxt.lines)
                size += sum(map(len, nxt.lines))
            await self.publish_chunks(chunks)
            if failure is not None:
                raise failure

    async def publish_chunks(self, chunks: Sequence[_Chunk]) -> None:
        lines: list[str] = []
        times: list[float] = []
        first = chunks[0].first_line if chunks else 1
        mark: object = None
        for c in chunks:
            if len(lines) + len(c.lines) > self.batch_lines and lines:
                await self.publish(lines, times, first)
                lines, times, first = [], [], c.first_line
            lines.extend(c.lines)
            times.extend(c.times)
            mark = c.mark if c.mark is not None else mark
        if lines:
            await self.publish(lines, times, first)
        if mark is not None and self.on_published is not None:
            await self.on_published(mark)

    def events(self, lines: list[str], times: list[float], first_line: int) -> list[Event]:
        """One event, copied once per job on this node (same id), or keyed by the node."""
        payload = KernelBatch(node=self.node, source=self.source, first_line=first_line, lines=lines, times=times)
        base = make_event(payload, producer=self.producer, key=node_key(self.node))
        jobs = self.job_index.jobs_on_node(self.node)
        if not jobs:
            return [base]
        return [
            base.model_copy(update={"key": job.key, "payload": payload.model_copy(update={"job": job})}) for job in jobs
        ]

    async def publish(self, lines: list[str], times: list[float], first_line: int) -> None:
        events = self.events(lines, times, first_line)
        if len(lines) > 1 and sum(map(len, lines)) > _SAFE_CHARS and len(events[0].encode()) > MAX_MESSAGE_BYTES:
            half = len(lines) // 2  # too big for one bus message (escaped control characters): split
            await self.publish(lines[:half], times[:half], first_line)
            await self.publish(lines[half:], times[half:], first_line + half)
            return
        for ev in events:
            # Any bus failure is retried; the batch is kept.
            await retry_until_done(
                partial(self.bus.publish, Topic.KERNEL, ev), Backoff(0.5, 30.0), self._publish_failed
            )
        self.published_lines += len(lines)
        self.telemetry.lines_in.labels(source=self.source).inc(len(lines))

    def _publish_failed(self, e: Exception, delay: float) -> None:
        self.publish_errors += 1
        self.telemetry.watch_errors.labels(source=self.source, kind="publish").inc()
        log.warning("publishing kernel lines failed (%s); retrying in %.1f s", e, delay)


class _KernelSource:
    """What every kernel source holds: its telemetry and its publisher."""

    SOURCE: ClassVar[str]

    def __init__(
        self,
        bus: Bus,
        node: str,
        job_index: JobIndex,
        telemetry: Telemetry,
        producer: str,
        batch_lines: int,
        batch_bytes: int,
        batch_linger: float,
        on_published: Callable[[object], Awaitable[None]] | None = None,
    ) -> None:
        self.telemetry = telemetry
        self.publisher = _Publisher(
            source=self.SOURCE,
            bus=bus,
            node=node,
            job_index=job_index,
            telemetry=telemetry,
            producer=producer,
            batch_lines=batch_lines,
            batch_bytes=batch_bytes,
            batch_linger=batch_linger,
            on_published=on_published,
        )


async def _together(*coros: Awaitable[None]) -> None:
    """Run coroutines until the first one ends; its exception is raised, the others are cancelled."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for t in done:
            t.result()
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
