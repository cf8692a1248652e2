"""The node's kernel messages (NVIDIA Xid, OOM killer, PCIe and ECC reports) as `KernelBatch`
events on `trainmedic.kernel`, from whichever place the node keeps them:

* `KmsgSource`: /dev/kmsg, the kernel's own ring buffer. One record per read():
  `<prio>,<seq>,<usec since boot>,<flags>[,...];<message>` followed by ` KEY=value` lines
  (SUBSYSTEM, DEVICE) that belong to it; non-printable bytes of the message come escaped as `\\xNN`.
  A reader that falls behind the ring gets EPIPE once and continues at the oldest record: the gap in
  sequence numbers is logged with its size and counted. It starts at the end of the ring, or after a
  remembered sequence number of the same boot. Reads block, so they run in a dedicated thread.
* `KernelFileSource`: a syslog file (/var/log/kern.log, /var/log/messages), followed by inode
  across rotation and truncation with the tailer's helper (agent/watchers/follow.py).
* `JournaldSource`: `journalctl -k -f -o json` as a subprocess, resumed with `--after-cursor`,
  restarted with backoff when it exits.

What is published is the message text as the kernel wrote it, without a syslog prefix for kmsg and
journald (`NVRM: Xid (PCI:0000:3b:00): 79, pid=..., GPU has fallen off the bus.`), so the shipped
rules (rules/nvidia_xid.yaml, rules/host_oom.yaml) match it. A message of several lines (the
driver's "fallen off the bus" report) becomes its first line followed by indented continuation
lines, which is how dmesg prints it and how the rules' `continuation` joins it back.

Fan-out: kernel messages concern every job on the node, and events are partitioned by job, so one
batch is published once per job with pods here (`JobIndex.jobs_on_node`), as copies of one event
with the same `id` (consumers de-duplicate by id), or once keyed by the node when no job runs here.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import select
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Protocol

from trainmedic.agent.bus.base import Bus
from trainmedic.agent.jobindex import JobIndex
from trainmedic.agent.telemetry import Telemetry
from trainmedic.agent.watchers.follow import (
    FileFollower,
    FileId,
    PositionSaver,
    PositionStore,
    ReadResult,
    Rfc3339,
    StartAt,
)
from trainmedic.backoff import Backoff, poll_forever, retry_until_done
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


@dataclass(slots=True)
class KmsgRecord:
    prio: int
    seq: int
    usec: int
    flags: str
    message: str
    fields: dict[str, str] = field(default_factory=dict)

    @property
    def facility(self) -> int:
        return self.prio >> 3

    @property
    def level(self) -> int:
        return self.prio & 7


def parse_kmsg_record(line: bytes) -> KmsgRecord | None:
    """One `prio,seq,usec,flags[,...];message` line (without its newline), or None if it is not one."""
    head, sep, msg = line.partition(b";")
    if not sep:
        return None
    f = head.split(b",")
    if len(f) < 4:
        return None
    try:
        prio, seq, usec = int(f[0]), int(f[1]), int(f[2])
    except ValueError:
        return None
    if prio < 0 or seq < 0 or usec < 0:
        return None
    return KmsgRecord(prio, seq, usec, f[3].decode("ascii", "replace"), unescape_kmsg(msg))


class KmsgParser:
    """Records out of what read() returned: one record per read from the device, any number (and
    pieces across reads) from a regular file or FIFO standing in for it."""

    def __init__(self) -> None:
        self._carry = b""
        self._last: KmsgRecord | None = None
        # Lines that are not records, passed on as text.
        self.malformed: list[str] = []

    def feed(self, data: bytes) -> list[KmsgRecord]:
        data = self._carry + data if self._carry else data
        nl = data.rfind(b"\n")
        if nl < 0:
            self._carry = data if len(data) <= MAX_KERNEL_LINE * 4 else b""
            return []
        rest = data[nl + 1 :]
        self._carry = rest if len(rest) <= MAX_KERNEL_LINE * 4 else b""
        out: list[KmsgRecord] = []
        for line in data[:nl].split(b"\n"):
            if line[:1] == b" ":
                if self._last is not None:
                    k, _, v = line[1:].partition(b"=")
                    self._last.fields[k.decode("ascii", "replace")] = unescape_kmsg(v)
                continue
            if not line:
                continue
            rec = parse_kmsg_record(line)
            if rec is None:
                self.malformed.append(line.decode("utf-8", "replace"))
                continue
            out.append(rec)
            self._last = rec
        return out


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


# -- /dev/kmsg ---------------------------------------------------------------------------------------


class KmsgFile(Protocol):
    """What `KmsgSource` needs of an opened /dev/kmsg (a raw file object; a stub in tests)."""

    def read(self, size: int = -1, /) -> bytes | None: ...

    def close(self) -> None: ...


def _open_kmsg(path: str) -> KmsgFile:
    return open(path, "rb", buffering=0)


class KmsgSource:
    """Kernel records from /dev/kmsg.

    `opener(path)` opens the device (a regular file or FIFO in kmsg format works too; tests pass a
    stub whose read() raises BrokenPipeError to play an overrun). `start_at`: "end" skips what is in
    the ring at start, "start" reads it all; a remembered sequence number of the same boot (from
    `position_store`) wins over both. `boot_time`: wall-clock seconds at boot, for record times.
    """

    SOURCE = "kmsg"

    def __init__(
        self,
        path: str | os.PathLike[str] = "/dev/kmsg",
        *,
        bus: Bus,
        node: str,
        job_index: JobIndex,
        telemetry: Telemetry,
        producer: str = "",
        opener: Callable[[str], KmsgFile] = _open_kmsg,
        start_at: StartAt = "end",
        position_store: str | os.PathLike[str] | None = None,
        position_flush_interval: float = 1.0,
        boot_time: float | None = None,
        boot_id: str | None = None,
        batch_lines: int = 512,
        batch_bytes: int = 128 << 10,
        batch_linger: float = 0.05,
        poll_timeout: float = 0.5,
    ) -> None:
        self.path = os.fspath(path)
        self.opener = opener
        self.start_at = start_at
        self.telemetry = telemetry
        self.boot_time = boot_time
        self.boot_id = boot_id
        self.poll_timeout = poll_timeout
        self.positions = PositionSaver.at(position_store, position_flush_interval, self.SOURCE, telemetry)
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
            on_published=self._published,
        )
        self.missed = 0  # records overwritten before they could be read
        self.malformed = 0
        self._last_seq: int | None = None

    async def run(self) -> None:
        """Read and publish until cancelled. Raises KernelSourceUnavailable if the device cannot be opened."""
        await self.positions.load()
        if self.boot_id is None:
            self.boot_id = await asyncio.to_thread(read_boot_id)
        base = self.boot_time if self.boot_time is not None else boot_time()
        resume, from_start = self._resume_seq()
        try:
            f = await asyncio.to_thread(self.opener, self.path)
        except OSError as e:
            raise KernelSourceUnavailable(f"cannot open {self.path}: {e}") from e
        if not from_start:
            seek = getattr(f, "seek", None)
            if seek is not None:
                await asyncio.to_thread(seek, 0, os.SEEK_END)
        self._last_seq = resume
        stop = threading.Event()
        loop = asyncio.get_running_loop()
        thread = threading.Thread(
            target=self._read_loop, args=(f, base, loop, stop), name=f"trainmedic-kmsg:{self.path}", daemon=True
        )
        thread.start()
        try:
            await self.publisher.run()
        finally:
            stop.set()
            await asyncio.to_thread(thread.join, self.poll_timeout + 2.0)
            with contextlib.suppress(OSError):
                f.close()
            await self.positions.save(force=True)

    def _resume_seq(self) -> tuple[int | None, bool]:
        """(the last sequence number published, whether to read the ring from its start)."""
        store = self.positions.store
        saved = store.cursors.get(self.SOURCE) if store is not None else None
        if isinstance(saved, dict) and isinstance(saved.get("seq"), int):
            if saved.get("boot_id") == self.boot_id:
                return int(saved["seq"]), True
            # Rebooted since: everything in the ring is from this boot, none of it was read.
            log.info("%s: the node rebooted since the last read; reading the kernel log of this boot", self.path)
            return None, True
        return None, self.start_at == "start"

    async def _published(self, mark: object) -> None:
        if self.positions.store is not None:
            self.positions.store.set_cursor(self.SOURCE, {"boot_id": self.boot_id, "seq": mark})
            await self.positions.save()

    def _read_loop(self, f: KmsgFile, base: float, loop: asyncio.AbstractEventLoop, stop: threading.Event) -> None:
        """The reader thread: blocking reads, records to the publisher's queue (with back-pressure)."""
        parser = KmsgParser()
        poller = self._poller(f)
        overrun = False
        backoff = Backoff(0.5, 30.0, jitter=(1.0, 1.0))  # a reader thread: no jitter needed
        try:
            while not stop.is_set():
                if poller is not None and not poller.poll(self.poll_timeout * 1000):
                    continue
                try:
                    data = f.read(8192)
                except BrokenPipeError:
                    # The ring overwrote records we had not read; the next read resumes at the
                    # oldest one still there, and the gap in sequence numbers says how many.
                    overrun = True
                    continue
                except InterruptedError:
                    continue
                except OSError as e:
                    log.warning("reading %s failed: %s (retrying in %.1f s)", self.path, e, backoff.current)
                    self.telemetry.watch_errors.labels(source=self.SOURCE, kind="read_error").inc()
                    stop.wait(backoff.next())
                    continue
                backoff.reset()
                if not data:
                    stop.wait(0.1)  # a regular file or FIFO at its end (the device never ends)
                    continue
                chunk = self._chunk(parser, parser.feed(data), base, overrun)
                overrun = False
                if chunk is not None and not self._hand_over(chunk, loop, stop):
                    return
        except Exception as e:
            log.exception("the %s reader failed", self.path)
            self._hand_over(e, loop, stop)

    def _poller(self, f: KmsgFile) -> select.poll | None:
        fileno = getattr(f, "fileno", None)
        if fileno is None:
            return None
        try:
            p = select.poll()
            p.register(fileno(), select.POLLIN | select.POLLPRI)
        except (OSError, ValueError, TypeError):
            return None
        return p

    def _chunk(self, parser: KmsgParser, records: list[KmsgRecord], base: float, overrun: bool) -> _Chunk | None:
        lines: list[str] = []
        times: list[float] = []
        first: int | None = None
        for rec in records:
            last = self._last_seq
            if last is not None:
                if rec.seq <= last:
                    continue  # already published before a restart
                if rec.seq > last + 1:
                    missed = rec.seq - last - 1
                    self.missed += missed
                    self.telemetry.watch_errors.labels(source=self.SOURCE, kind="overrun").inc(missed)
                    log.warning(
                        "%s: %d kernel messages were overwritten before they could be read (seq %d to %d)%s",
                        self.path,
                        missed,
                        last + 1,
                        rec.seq - 1,
                        " (EPIPE)" if overrun else "",
                    )
            elif overrun:
                log.warning("%s: kernel messages were overwritten before they could be read (EPIPE)", self.path)
            self._last_seq = rec.seq
            if first is None:
                first = rec.seq
            t = base + rec.usec / 1e6
            for ln in record_lines(rec.message):
                lines.append(_cap(ln))
                times.append(t)
        if parser.malformed:
            self.malformed += len(parser.malformed)
            self.telemetry.watch_errors.labels(source=self.SOURCE, kind="malformed").inc(len(parser.malformed))
            log.warning("%s: %d lines are not kmsg records; passed on as text", self.path, len(parser.malformed))
            now = time.time()
            for text in parser.malformed:
                lines.append(_cap(text))
                times.append(now)
            parser.malformed.clear()
        if not lines:
            return None
        if first is None:  # only lines that are not records
            first = self._last_seq + 1 if self._last_seq is not None else 1
        return _Chunk(lines, times, first, self._last_seq)

    def _hand_over(self, item: _Chunk | BaseException, loop: asyncio.AbstractEventLoop, stop: threading.Event) -> bool:
        """Queue an item on the loop, waiting while the queue is full. False when stopping."""
        try:
            fut = asyncio.run_coroutine_threadsafe(self.publisher.queue.put(item), loop)
        except RuntimeError:
            return False  # the loop is closed
        while True:
            try:
                fut.result(timeout=0.2)
                return True
            except TimeoutError:
                if stop.is_set():
                    fut.cancel()
                    return False
            except Exception:  # noqa: BLE001 (cancelled with the loop)
                return False


# -- a kernel log file -------------------------------------------------------------------------------


class KernelFileSource:
    """A syslog-written kernel log (kern.log, messages), followed across rotation and truncation.

    Lines are published as they are in the file (with their syslog prefix). `times` are the
    file's own RFC 3339 stamps where a line starts with one (rsyslog's high-precision format),
    else the time the line was read.
    """

    SOURCE = "kernel_file"

    def __init__(
        self,
        path: str | os.PathLike[str] = "/var/log/kern.log",
        *,
        bus: Bus,
        node: str,
        job_index: JobIndex,
        telemetry: Telemetry,
        producer: str = "",
        start_at: StartAt = "end",
        position_store: str | os.PathLike[str] | None = None,
        position_flush_interval: float = 1.0,
        poll_interval: float = 0.5,
        rotate_wait: float = 5.0,
        read_budget: int = 1 << 20,
        batch_lines: int = 512,
        batch_bytes: int = 128 << 10,
    ) -> None:
        self.path = Path(path)
        self.start_at = start_at
        self.poll_interval = poll_interval
        self.rotate_wait = rotate_wait
        self.read_budget = read_budget
        self.telemetry = telemetry
        self.positions = PositionSaver.at(position_store, position_flush_interval, self.SOURCE, telemetry)
        self.publisher = _Publisher(
            source=self.SOURCE,
            bus=bus,
            node=node,
            job_index=job_index,
            telemetry=telemetry,
            producer=producer,
            batch_lines=batch_lines,
            batch_bytes=batch_bytes,
            batch_linger=0.0,
        )
        self.follower: FileFollower | None = None
        self._inflight: asyncio.Future[ReadResult] | None = None
        self._ts = Rfc3339()

    async def run(self) -> None:
        """Follow the file until cancelled; read failures are logged and retried with backoff."""

        def failed(delay: float) -> None:
            log.exception("kernel log file source failed; retrying in %.1f s", delay)
            self.telemetry.watch_errors.labels(source=self.SOURCE, kind="poll").inc()

        try:
            await poll_forever(self.poll_once, idle_s=self.poll_interval, backoff=Backoff(1.0, 30.0), on_failure=failed)
        finally:
            inflight = self._inflight
            if inflight is not None:
                if not inflight.done():
                    await asyncio.wait({inflight})
                if not inflight.cancelled() and inflight.exception() is not None:
                    log.warning("the last read of %s before stopping failed: %s", self.path, inflight.exception())
            if self.follower is not None:
                self.follower.close()
            await self.positions.save(force=True)

    async def poll_once(self) -> bool:
        """Read what is new and publish it. True when more is waiting."""
        loop = asyncio.get_running_loop()
        if self.follower is None:
            await self.positions.load()
            self.follower = await asyncio.to_thread(self._make_follower, loop.time())
        # Shielded: a cancelled poll lets the read finish before run() closes the file.
        self._inflight = asyncio.ensure_future(asyncio.to_thread(self.follower.read, loop.time(), self.read_budget))
        res = await asyncio.shield(self._inflight)
        store = self.positions.store
        for o in res.opened:
            if store is not None and store.get(o.fid) is None:
                store.set(o.fid, o.path, o.offset, o.line)
        now = time.time()
        for seg in res.segments:
            lines = [_cap(raw.decode("utf-8", "replace")) for raw in seg.lines]
            if seg.cut:
                lines[-1] += " [trainmedic: line cut]"
            times = [self._ts(raw.split(b" ", 1)[0]) or now for raw in seg.lines]
            for k in range(0, len(lines), self.publisher.batch_lines):
                n = min(self.publisher.batch_lines, len(lines) - k)
                await self.publisher.publish(lines[k : k + n], times[k : k + n], seg.first_line + k)
            if store is not None:
                store.set(seg.fid, seg.path, seg.end, seg.first_line + len(seg.lines) - 1)
        for fid in res.closed:
            if store is not None:
                store.drop(fid)
        await self.positions.save()
        return res.more

    def _make_follower(self, now: float) -> FileFollower:
        start: StartAt | int = self.start_at
        line = 0
        expect: FileId | None = None
        store = self.positions.store
        try:
            st = os.stat(self.path)
        except OSError:
            st = None
            start = "start"  # it does not exist yet: when it appears, all of it is new
        rotated: list[tuple[str, int, int]] = []
        if st is not None and store is not None:
            fid = (st.st_dev, st.st_ino)
            saved = store.get(fid)
            if saved is not None:
                start, line, expect = saved.offset, saved.line, fid
            else:
                rotated = self._rotated_while_down(store, fid)
                if rotated:
                    start = "start"  # the file at the path appeared after the saved position
        follower = FileFollower(
            self.path,
            start=start,
            start_line=line,
            expect=expect,
            max_line_bytes=MAX_KERNEL_LINE,
            rotate_wait=self.rotate_wait,
            notify=self._notify,
        )
        for path, offset, n in rotated:
            follower.add_rotated(path, offset, n, now)
        return follower

    def _rotated_while_down(self, store: PositionStore, current: FileId) -> list[tuple[str, int, int]]:
        """Saved positions of this file's earlier inodes, found again under a rotated name."""
        out: list[tuple[str, int, int]] = []
        d, base = self.path.parent, self.path.name + "."
        for key, pos in list(store.files.items()):
            if Path(pos.path).parent != d or key == store.key(current):
                continue
            try:
                with os.scandir(d) as it:
                    found = next(
                        (
                            e.path
                            for e in it
                            if e.name.startswith(base)
                            and not e.name.endswith(".gz")
                            and f"{e.stat().st_dev}:{e.inode()}" == key
                        ),
                        None,
                    )
            except OSError:
                found = None
            if found is None:
                log.warning("%s was rotated away while the agent was down; its unread lines are lost", pos.path)
                store.drop_key(key)
            else:
                out.append((found, pos.offset, pos.line))
        return out

    def _notify(self, kind: str) -> None:
        if kind != "rotated":
            self.telemetry.watch_errors.labels(source=self.SOURCE, kind=kind).inc()


# -- journald ----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class JournalEntry:
    message: str
    time: float | None
    cursor: str | None


def _field_text(value: Any) -> str | None:
    """A journal field as `journalctl -o json` prints it: a string, an array of byte values (for
    binary or invalid UTF-8 data), or an array of such values when the field repeats."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        if all(isinstance(b, int) and not isinstance(b, bool) and 0 <= b < 256 for b in value):
            return bytes(value).decode("utf-8", "replace")
        parts = [_field_text(v) for v in value]
        return "\n".join(p for p in parts if p is not None)
    return None


def parse_journal_entry(line: bytes | str) -> JournalEntry | None:
    """One line of `journalctl -o json`, or None when it is not a journal entry."""
    try:
        obj = json.loads(line)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(obj, dict):
        return None
    message = _field_text(obj.get("MESSAGE"))
    if message is None:
        return None
    t: float | None = None
    raw_t = obj.get("__REALTIME_TIMESTAMP")
    if isinstance(raw_t, str | int) and not isinstance(raw_t, bool):
        with contextlib.suppress(ValueError):
            t = int(raw_t) / 1e6
    cursor = obj.get("__CURSOR")
    return JournalEntry(message, t, cursor if isinstance(cursor, str) else None)


class JournaldSource:
    """Kernel messages from the systemd journal, through `journalctl -k -f -o json`.

    `command`: the journalctl executable (and any leading arguments). `start_at`: "start" reads the
    current boot's kernel messages (`--no-tail`), "end" only new ones; a saved cursor (from
    `position_store`) resumes right after the last published entry. journalctl exiting is logged
    with its last stderr lines and it is started again with exponential backoff (with jitter),
    resuming after the last entry read.
    """

    SOURCE = "journald"

    def __init__(
        self,
        *,
        bus: Bus,
        node: str,
        job_index: JobIndex,
        telemetry: Telemetry,
        producer: str = "",
        command: Sequence[str] = ("journalctl",),
        start_at: StartAt = "start",
        position_store: str | os.PathLike[str] | None = None,
        position_flush_interval: float = 1.0,
        backoff_initial: float = 1.0,
        backoff_max: float = 30.0,
        batch_lines: int = 512,
        batch_bytes: int = 128 << 10,
        batch_linger: float = 0.05,
        max_entry_bytes: int = 1 << 20,
    ) -> None:
        if not command:
            raise ValueError("command must name the journalctl executable")
        self.command = list(command)
        self.start_at = start_at
        self.telemetry = telemetry
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self.max_entry_bytes = max_entry_bytes
        self.positions = PositionSaver.at(position_store, position_flush_interval, self.SOURCE, telemetry)
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
            on_published=self._published,
        )
        self.cursor: str | None = None
        self.restarts = 0
        self.malformed = 0
        self._count = 0

    def argv(self) -> list[str]:
        argv = [*self.command, "-k", "-f", "-o", "json", "--all", "--no-pager"]
        if self.cursor:
            argv += ["--no-tail", f"--after-cursor={self.cursor}"]
        elif self.start_at == "start":
            argv.append("--no-tail")
        else:
            argv.append("--lines=0")
        return argv

    async def run(self) -> None:
        """Follow the journal until cancelled. Raises KernelSourceUnavailable when journalctl is missing."""
        await self.positions.load()
        store = self.positions.store
        saved = store.cursors.get(self.SOURCE) if store is not None else None
        if isinstance(saved, str) and saved:
            self.cursor = saved
        try:
            await _together(self._follow(), self.publisher.run())
        finally:
            await self.positions.save(force=True)

    async def _published(self, mark: object) -> None:
        if self.positions.store is not None and isinstance(mark, str):
            self.positions.store.set_cursor(self.SOURCE, mark)
            await self.positions.save()

    async def _follow(self) -> None:
        loop = asyncio.get_running_loop()
        backoff = Backoff(self.backoff_initial, self.backoff_max)
        while True:
            argv = self.argv()
            try:
                proc = await asyncio.create_subprocess_exec(
                    *argv,
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.PIPE,
                )
            except FileNotFoundError as e:
                raise KernelSourceUnavailable(
                    f"{argv[0]} not found: journald kernel messages need journalctl on this host "
                    "(or set kernel.source to kmsg or file)"
                ) from e
            except PermissionError as e:
                raise KernelSourceUnavailable(f"cannot run {argv[0]}: {e}") from e
            started = loop.time()
            assert proc.stdout is not None and proc.stderr is not None
            err_task = asyncio.ensure_future(self._stderr_tail(proc.stderr))
            got = 0
            try:
                got = await self._read(proc.stdout)
                rc = await proc.wait()
            finally:
                if proc.returncode is None:
                    with contextlib.suppress(ProcessLookupError):
                        proc.kill()
                    await proc.wait()
                tail = await err_task
            self.restarts += 1
            self.telemetry.watch_errors.labels(source=self.SOURCE, kind="exited").inc()
            if got or loop.time() - started > 30.0:
                backoff.reset()
            log.warning(
                "journalctl exited with status %s%s; starting it again in %.1f s",
                rc,
                f": {tail}" if tail else "",
                backoff.current,
            )
            await asyncio.sleep(backoff.next())

    async def _stderr_tail(self, stream: asyncio.StreamReader) -> str:
        tail: list[str] = []
        while chunk := await stream.read(4096):
            tail = [*tail, *chunk.decode("utf-8", "replace").splitlines()][-5:]
        return " | ".join(t.strip() for t in tail if t.strip())

    async def _read(self, stream: asyncio.StreamReader) -> int:
        """Entries from journalctl's stdout to the publisher; returns how many were read."""
        carry = b""
        skipping = False
        got = 0
        while data := await stream.read(64 << 10):
            if skipping:
                i = data.find(b"\n")
                if i < 0:
                    continue
                data, skipping = data[i + 1 :], False
            buf = carry + data if carry else data
            nl = buf.rfind(b"\n")
            if nl < 0:
                carry = buf
            else:
                chunk = self._chunk(buf[:nl].split(b"\n"))
                got += len(chunk.lines) if chunk is not None else 0
                if chunk is not None:
                    await self.publisher.queue.put(chunk)
                carry = buf[nl + 1 :]
            if len(carry) > self.max_entry_bytes:
                self.malformed += 1
                self.telemetry.watch_errors.labels(source=self.SOURCE, kind="oversized").inc()
                log.warning("a journal entry longer than %d bytes was skipped", self.max_entry_bytes)
                carry, skipping = b"", True
        return got

    def _chunk(self, raw_lines: list[bytes]) -> _Chunk | None:
        lines: list[str] = []
        times: list[float] = []
        now = time.time()
        first = self._count + 1
        for raw in raw_lines:
            if not raw.strip():
                continue
            entry = parse_journal_entry(raw)
            if entry is None:
                self.malformed += 1
                self.telemetry.watch_errors.labels(source=self.SOURCE, kind="malformed").inc()
                log.warning("not a journal entry, skipped: %.200r", raw)
                continue
            if entry.cursor:
                self.cursor = entry.cursor
            for ln in record_lines(entry.message):
                lines.append(_cap(ln))
                times.append(entry.time if entry.time is not None else now)
        if not lines:
            return None
        self._count += len(lines)
        return _Chunk(lines, times, first, self.cursor)
