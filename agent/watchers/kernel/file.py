"""`KernelFileSource`: a kernel log file (kern.log and the like) followed through rotation, its
position saved.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from pathlib import Path

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
from trainmedic.agent.watchers.kernel.publish import MAX_KERNEL_LINE, _cap, _KernelSource
from trainmedic.backoff import Backoff, poll_forever

log = logging.getLogger("trainmedic.watchers.kernel")


# -- a kernel log file -------------------------------------------------------------------------------


class KernelFileSource(_KernelSource):
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
        self.positions = PositionSaver.at(position_store, position_flush_interval, self.SOURCE, telemetry)
        super().__init__(bus, node, job_index, telemetry, producer, batch_lines, batch_bytes, 0.0)
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
