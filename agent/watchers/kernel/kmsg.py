"""`KmsgSource`: kernel messages read from /dev/kmsg (records parsed, continuation lines kept, an
overrun counted, the position resumed by sequence number).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import select
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from trainmedic.agent.bus.base import Bus
from trainmedic.agent.jobindex import JobIndex
from trainmedic.agent.telemetry import Telemetry
from trainmedic.agent.watchers.follow import PositionSaver, StartAt
from trainmedic.agent.watchers.kernel.publish import (
    MAX_KERNEL_LINE,
    KernelSourceUnavailable,
    _cap,
    _Chunk,
    _KernelSource,
    boot_time,
    read_boot_id,
    record_lines,
    unescape_kmsg,
)
from trainmedic.backoff import Backoff

log = logging.getLogger("trainmedic.watchers.kernel")


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


# -- /dev/kmsg ---------------------------------------------------------------------------------------


class KmsgFile(Protocol):
    """What `KmsgSource` needs of an opened /dev/kmsg (a raw file object; a stub in tests)."""

    def read(self, size: int = -1, /) -> bytes | None: ...

    def close(self) -> None: ...


def _open_kmsg(path: str) -> KmsgFile:
    return open(path, "rb", buffering=0)


class KmsgSource(_KernelSource):
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
        self.boot_time = boot_time
        self.boot_id = boot_id
        self.poll_timeout = poll_timeout
        self.positions = PositionSaver.at(position_store, position_flush_interval, self.SOURCE, telemetry)
        super().__init__(
            bus, node, job_index, telemetry, producer, batch_lines, batch_bytes, batch_linger, self._published
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
