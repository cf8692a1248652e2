"""The node's container logs: a tailer of kubelet's CRI log files, like fluent-bit's tail input with
the CRI parser, publishing `LogBatch` events on `trainmedic.logs`.

Layout (kubelet): `<root>/<namespace>_<pod>_<uid>/<container>/<restart>.log`. kubelet rotates
`0.log` to `0.log.<timestamp>` (older ones may be gzipped) and a new `0.log` appears; a restart of
the container writes `1.log`, `2.log`, ... Each `<n>.log` is followed by inode (agent/watchers/
follow.py): the renamed file is read to its end before its successor, so no line is lost or doubled
across a rotation; a truncated file is read again from 0; a removed pod directory is drained and
then forgotten. Rotated files (`.log.<timestamp>`, `.gz`) are never picked up on their own: their
lines were read while they were the live file. The exceptions: a file rotated twice between two
reads, or once more between seeing a rotation and opening the new file (the middle one is found by
its inode and change time, and read whole), and a restart with a
position store, where a file rotated away while the agent was down is found again by its inode and
read from the saved offset (a gzipped one cannot be, and that loss is logged).

Discovery is by polling, no inotify: the tree is scanned every `poll_interval` (1 s) for new pods,
containers and restarts; known files are read every `read_interval` (0.25 s), in a worker thread,
in bounded chunks (`read_budget` per file and `poll_budget` per poll, round-robin over the files).

CRI line format: `<RFC3339Nano> <stdout|stderr> <P|F> <content>`. The runtime splits lines longer
than 16 KiB into `P` (partial) parts ended by one `F` part; the parts of each stream are joined into
one logical line, capped at `max_line_bytes` (the rest is dropped up to the `F` and counted, the kept
head ends with a marker). A line that is not CRI (no timestamp, binary junk) is passed on as text,
undecodable bytes replaced, and counted; invalid UTF-8 in the content likewise. Parsing splits with
bytes.split and caches the whole-second part of timestamps: no regex per line.

Attribution: the pod's job and rank come from the `JobIndex`, by the uid in the directory name, then
by (namespace, pod). The pod watch may lag the first lines by a second, so lines of a pod the index
does not know are held up to `attribution_grace` seconds; then they go out keyed by the pod alone.

Delivery: batches of up to `batch_lines` lines / `batch_bytes` bytes / `batch_linger` seconds per
container file. With a position store, the offset after a batch is recorded once `bus.publish`
accepted it, and saved at most every `position_flush_interval` seconds (and on a graceful stop): a
restart resumes there, so lines are delivered at least once, and after a crash at most the batches
accepted since the last save (one batch with `position_flush_interval=0`) are sent twice. Files found at the
first start (no saved position) begin at `start_at` ("end" by default); on a restart, a file the
store does not know whose first line is newer than the store's last save is read from its start
(a container that started while the agent was down).

Size: one class, `CriLogTailer`, whose methods share one state (the followed files per pod, rotation
chains, partial lines, batches in flight and the saved positions); the helpers around it are short.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from trainmedic.agent.bus.base import Bus
from trainmedic.agent.jobindex import JobIndex
from trainmedic.agent.telemetry import Telemetry
from trainmedic.agent.watchers.follow import (
    FileFollower,
    FileId,
    PositionSaver,
    PositionStore,
    Rfc3339,
    Segment,
    StartAt,
)
from trainmedic.backoff import Backoff, poll_forever, retry_until_done
from trainmedic.events import MAX_MESSAGE_BYTES, Event, JobRef, LogBatch, Topic, make_event

log = logging.getLogger("trainmedic.watchers.crilog")

_Build = Callable[[list[str], list[float], int], Event]

SOURCE = "crilog"
_STREAMS = (b"stdout", b"stderr")
_CUT_MARKER = " [trainmedic: line cut at {n} bytes]"
# A batch whose content stays under this cannot exceed the bus message limit once JSON-encoded
# (6 bytes per character at worst, for escaped control characters), so it is not measured.
_SAFE_BATCH_BYTES = (MAX_MESSAGE_BYTES - (64 << 10)) // 6


@dataclass
class TailerStats:
    """What the tailer saw, for tests and debugging (the Prometheus counters carry the same)."""

    lines: int = 0
    batches: int = 0
    malformed: int = 0
    invalid_utf8: int = 0
    cut_lines: int = 0
    dropped_bytes: int = 0
    rotations: int = 0
    truncations: int = 0
    read_errors: int = 0
    publish_errors: int = 0
    unattributed_batches: int = 0
    stale_partials: int = 0


@dataclass(slots=True)
class _Partial:
    """The parts of a logical line of one stream seen so far (P lines)."""

    parts: list[bytes]
    size: int
    t: float
    line: int  # physical line number of the first part
    start: int  # its byte offset, a bound on what may be committed
    fid: FileId
    seen: float  # loop time of the last part
    cut: bool = False
    dropped: int = 0


@dataclass(slots=True)
class _Batch:
    path: str
    fid: FileId
    first_line: int
    born: float
    lines: list[str] = field(default_factory=list)
    times: list[float] = field(default_factory=list)
    nbytes: int = 0
    # Where the file can be resumed once this batch is accepted (offset, complete lines before it).
    end_off: int = 0
    end_line: int = 0


@dataclass(eq=False)
class _Pod:
    namespace: str
    name: str
    uid: str
    path: str
    chains: dict[str, _Chain] = field(default_factory=dict)
    hold_since: float | None = None
    grace_over: bool = False


@dataclass(eq=False)
class _Chain:
    """One container log file, `<container>/<n>.log`, followed across its rotations."""

    pod: _Pod
    container: str
    path: str
    follower: FileFollower
    partials: dict[bytes, _Partial] = field(default_factory=dict)
    batch: _Batch | None = None
    ready: deque[_Batch] = field(default_factory=deque)
    live: set[FileId] = field(default_factory=set)
    closed: set[FileId] = field(default_factory=set)
    gone: bool = False


def _is_live_log(name: str) -> bool:
    return name.endswith(".log") and name[:-4].isdigit()


def _live_name(name: str) -> str | None:
    """`0.log.20240101-120000` -> `0.log` (None for anything else)."""
    head, sep, _ = name.partition(".log.")
    if not sep or not head.isdigit() or name.endswith(".gz"):
        return None
    return head + ".log"


class CriLogTailer:
    """Follow every container log under `root` and publish its lines as `LogBatch` events.

    `poll_interval`: how often the directory tree is scanned for new files (seconds);
    `read_interval`: how often known files are read for new lines;
    `start_at`: where files present at the first start begin ("end" or "start");
    `position_store`: a JSON file of read positions (None: positions are not kept);
    `attribution_grace`: how long lines of a pod unknown to the job index are held;
    `batch_lines` / `batch_bytes` / `batch_linger`: when a batch is cut;
    `max_line_bytes`: the cap on one logical line (bus messages are at most 1 MB);
    `rotate_wait`: how long a rotated file is still watched for late writes;
    `partial_timeout`: a partial line whose end never comes is published as it is after this long;
    `read_budget` / `poll_budget`: bytes read per file / in all per poll (the rest waits a poll);
    `max_ready_batches`: a file is not read further while this many of its batches wait to go out.
    """

    def __init__(
        self,
        root: str | os.PathLike[str] = "/var/log/pods",
        *,
        bus: Bus,
        node: str,
        job_index: JobIndex,
        telemetry: Telemetry,
        producer: str = "",
        poll_interval: float = 1.0,
        read_interval: float = 0.25,
        start_at: StartAt = "end",
        position_store: str | os.PathLike[str] | None = None,
        position_flush_interval: float = 1.0,
        attribution_grace: float = 5.0,
        batch_lines: int = 512,
        batch_bytes: int = 256 << 10,
        batch_linger: float = 0.05,
        max_line_bytes: int = 256 << 10,
        rotate_wait: float = 5.0,
        partial_timeout: float = 5.0,
        read_budget: int = 1 << 20,
        poll_budget: int = 8 << 20,
        max_ready_batches: int = 32,
    ) -> None:
        if start_at not in ("start", "end"):
            raise ValueError(f"start_at must be 'start' or 'end', not {start_at!r}")
        self.root = Path(root)
        self.bus = bus
        self.node = node
        self.job_index = job_index
        self.telemetry = telemetry
        self.producer = producer
        self.poll_interval = poll_interval
        self.read_interval = read_interval
        self.start_at: StartAt = start_at
        self.store = PositionStore(position_store) if position_store is not None else None
        self.position_flush_interval = position_flush_interval
        self._saver = PositionSaver(self.store, position_flush_interval, SOURCE, telemetry)
        self.attribution_grace = attribution_grace
        self.batch_lines = batch_lines
        self.batch_bytes = batch_bytes
        self.batch_linger = batch_linger
        self.max_line_bytes = max_line_bytes
        self.rotate_wait = rotate_wait
        self.partial_timeout = partial_timeout
        self.read_budget = read_budget
        self.poll_budget = poll_budget
        self.max_ready_batches = max_ready_batches
        self.stats = TailerStats()
        self._ts = Rfc3339()
        self._pods: dict[str, _Pod] = {}
        self._ignored: set[str] = set()
        self._started = False
        self._next_scan = 0.0
        self._last_t = 0.0
        self._root_missing = False
        self._inflight: asyncio.Future[bool] | None = None
        self._rr = 0

    # -- running --------------------------------------------------------------------------------

    async def run(self) -> None:
        """Tail until cancelled. Failures are logged, counted and retried with backoff."""

        def failed(delay: float) -> None:
            log.exception("container log tailer failed; retrying in %.1f s", delay)
            self.telemetry.watch_errors.labels(source=SOURCE, kind="poll").inc()

        try:
            await poll_forever(self.poll_once, idle_s=self.read_interval, backoff=Backoff(1.0, 30.0), on_failure=failed)
        finally:
            await self._shutdown()

    async def poll_once(self) -> bool:
        """Scan (when due), read what is new, publish what is ready. True when data is left to read."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        startup = not self._started
        scan = startup or now >= self._next_scan
        if scan:
            self._next_scan = now + self.poll_interval
        # Shielded: a cancelled poll lets the thread finish before files are closed (see _shutdown).
        self._inflight = asyncio.ensure_future(asyncio.to_thread(self._work, now, scan, startup))
        more = await asyncio.shield(self._inflight)
        self._started = True
        if startup:
            # Where every file starts, before anything is published: a crash from here on resumes
            # at these offsets instead of at the end of files that have grown meanwhile.
            await self._maybe_save(force=True)
        await self._publish_ready()
        await self._maybe_save(force=False)
        return more

    async def _shutdown(self) -> None:
        inflight = self._inflight
        if inflight is not None:
            if not inflight.done():
                await asyncio.wait({inflight})
            if not inflight.cancelled() and inflight.exception() is not None:
                log.warning("the last read before stopping failed: %s", inflight.exception())
        try:
            await self._saver.save(force=True)
        except Exception:
            log.exception("could not save read positions on shutdown")
        finally:
            for pod in self._pods.values():
                for ch in pod.chains.values():
                    ch.follower.close()

    # -- the reading side (runs in a thread) -------------------------------------------------------

    def _work(self, now: float, scan: bool, startup: bool) -> bool:
        if startup and self.store is not None:
            self.store.load()
        if scan:
            self._scan(now, startup)
        if startup and self.store is not None:
            self._resume_rotated(now)
        more = False
        chains = [ch for pod in self._pods.values() for ch in pod.chains.values()]
        # Start where the last poll stopped, so a busy container cannot starve the others, and stop
        # once this poll has read `poll_budget` bytes (the rest waits for the next poll).
        self._rr = self._rr % len(chains) if chains else 0
        used = 0
        for k, ch in enumerate(chains[self._rr :] + chains[: self._rr]):
            if used >= self.poll_budget:
                self._rr += k
                return True
            if not ch.gone and len(ch.ready) < self.max_ready_batches:
                chain_more, n = self._read_chain(ch, now)
                more = more or chain_more
                used += n
        self._rr += 1
        return more

    def _scan(self, now: float, startup: bool) -> None:
        try:
            with os.scandir(self.root) as it:
                pod_dirs = [e for e in it if e.is_dir(follow_symlinks=False)]
        except FileNotFoundError:
            if not self._root_missing:
                log.warning("%s does not exist (yet)", self.root)
            self._root_missing = True
            return
        except OSError as e:
            log.warning("cannot list %s: %s", self.root, e)
            self._count("read_error")
            return
        self._root_missing = False
        for pe in pod_dirs:
            pod = self._pods.get(pe.path)
            if pod is None:
                parts = pe.name.split("_")
                if len(parts) != 3 or not all(parts):
                    if pe.name not in self._ignored:
                        self._ignored.add(pe.name)
                        log.info("ignoring %s: not a <namespace>_<pod>_<uid> directory", pe.path)
                    continue
                pod = _Pod(namespace=parts[0], name=parts[1], uid=parts[2], path=pe.path)
            try:
                with os.scandir(pe.path) as it:
                    containers = [e for e in it if e.is_dir(follow_symlinks=False)]
                for ce in containers:
                    with os.scandir(ce.path) as it:
                        names = [fe.name for fe in it if _is_live_log(fe.name)]
                    for name in names:
                        path = os.path.join(ce.path, name)
                        if path not in pod.chains:
                            self._add_chain(pod, ce.name, path, now, startup)
            except FileNotFoundError:
                continue  # removed while scanning; its chains notice on their own
            except OSError as e:
                log.warning("cannot list %s: %s", pe.path, e)
                self._count("read_error")
            if pod.chains:
                self._pods.setdefault(pe.path, pod)

    def _add_chain(self, pod: _Pod, container: str, path: str, now: float, startup: bool) -> None:
        start: StartAt | int = "start"
        line = 0
        expect: FileId | None = None
        if startup:
            start = self.start_at
            try:
                st = os.stat(path)
            except OSError:
                return
            fid = (st.st_dev, st.st_ino)
            saved = self.store.get(fid) if self.store is not None else None
            if saved is not None and os.path.dirname(saved.path) == os.path.dirname(path):
                start, line, expect = saved.offset, saved.line, fid
            elif (
                self.store is not None
                and self.store.saved_at is not None
                and self._newer_than(path, self.store.saved_at)
            ):
                start = "start"
        ch = _Chain(
            pod=pod,
            container=container,
            path=path,
            follower=FileFollower(
                path,
                start=start,
                start_line=line,
                expect=expect,
                max_line_bytes=self.max_line_bytes + 64,  # room for the CRI header
                rotate_wait=self.rotate_wait,
                catch_up=True,
                notify=self._count,
            ),
        )
        pod.chains[path] = ch

    def _newer_than(self, path: str, saved_at: float) -> bool:
        """Whether the file's first line was written after the store was last saved."""
        try:
            with open(path, "rb") as f:
                head = f.read(128)
        except OSError:
            return False
        t = self._ts(head.split(b" ", 1)[0])
        return t is not None and t >= saved_at - 1.0

    def _resume_rotated(self, now: float) -> None:
        """Saved positions of files rotated away while the agent was down: find them by inode."""
        assert self.store is not None
        chains = {ch.path: ch for pod in self._pods.values() for ch in pod.chains.values()}
        live = {fid for fid in map(self._fid, chains) if fid is not None}
        for key, pos in list(self.store.files.items()):
            dev, _, ino = key.partition(":")
            fid = (int(dev), int(ino))
            if fid in live:
                continue
            d = os.path.dirname(pos.path)
            found = None
            try:
                with os.scandir(d) as it:
                    found = next((e for e in it if e.inode() == fid[1] and _live_name(e.name) is not None), None)
            except OSError:
                pass
            ch = chains.get(os.path.join(d, _live_name(found.name) or "")) if found is not None else None
            if found is None or ch is None or not ch.follower.add_rotated(found.path, pos.offset, pos.line, now):
                log.warning(
                    "%s was rotated away or removed while the agent was down; its unread lines are lost", pos.path
                )
                self.store.drop(fid)
                continue
            ch.live.add(fid)
            # The file now at the path was created after the saved position: all of it is unread.
            ch.follower.start_from_beginning()

    @staticmethod
    def _fid(path: str) -> FileId | None:
        try:
            st = os.stat(path)
        except OSError:
            return None
        return (st.st_dev, st.st_ino)

    def _read_chain(self, ch: _Chain, now: float) -> tuple[bool, int]:
        """Read one file chain and parse what came. Returns (more waiting, bytes read)."""
        res = ch.follower.read(now, self.read_budget)
        for o in res.opened:
            ch.live.add(o.fid)
            if self.store is not None and self.store.get(o.fid) is None:
                self.store.set(o.fid, o.path, o.offset, o.line)
        for seg in res.segments:
            self._parse(ch, seg, now)
        for fid in res.closed:
            if ch.batch is not None and ch.batch.fid == fid:
                self._close_batch(ch)
            ch.live.discard(fid)
            ch.closed.add(fid)
        if ch.partials:
            self._flush_stale_partials(ch, now)
        if res.gone:
            ch.gone = True
            for stream in list(ch.partials):
                self._finish_partial(ch, stream, now)
            ch.follower.close()
            log.info("%s is gone; dropping it once its last lines are out", ch.path)
        b = ch.batch
        if b is not None and (not res.more or now - b.born >= self.batch_linger):
            self._close_batch(ch)
        return res.more, sum(seg.end - seg.start for seg in res.segments)

    def _parse(self, ch: _Chain, seg: Segment, now: float) -> None:
        """The hot loop: CRI lines of one segment into the chain's batches."""
        b = ch.batch
        if b is not None and b.fid != seg.fid:
            self._close_batch(ch)
            b = None
        ts_of = self._ts
        partials = ch.partials
        max_lines, max_bytes = self.batch_lines, self.batch_bytes
        path, fid = seg.path, seg.fid
        lines = seg.lines[:-1] if seg.cut else seg.lines
        lineno = seg.first_line - 1
        off = seg.start
        t: float | None = None
        for raw in lines:
            lineno += 1
            off += len(raw) + 1
            parts = raw.split(b" ", 3)
            if len(parts) == 4 and not partials:
                ts, stream, tag, content = parts
                if tag == b"F" and stream in _STREAMS:
                    t = ts_of(ts)
                    if t is not None:
                        try:
                            text = content.decode()
                        except UnicodeDecodeError:
                            text = content.decode("utf-8", "replace")
                            self._count("invalid_utf8")
                        if b is None:
                            b = ch.batch = _Batch(path, fid, lineno, now)
                        b.lines.append(text)
                        b.times.append(t)
                        b.nbytes += len(content) + 1
                        if len(b.lines) >= max_lines or b.nbytes >= max_bytes:
                            b.end_off, b.end_line = off, lineno
                            self._close_batch(ch)
                            b = None
                        continue
            if b is not None:
                b.end_off, b.end_line = off - len(raw) - 1, lineno - 1
            self._slow_line(ch, seg, parts, raw, lineno, off - len(raw) - 1, off, 0, now)
            b = ch.batch
        if seg.cut:
            raw = seg.lines[-1]
            self._slow_line(ch, seg, raw.split(b" ", 3), raw, lineno + 1, off, seg.end, seg.cut, now)
            lineno += 1
        if ch.batch is not None:
            ch.batch.end_off, ch.batch.end_line = seg.end, lineno
        if t is not None:
            self._last_t = t

    def _slow_line(
        self,
        ch: _Chain,
        seg: Segment,
        parts: list[bytes],
        raw: bytes,
        lineno: int,
        start: int,
        end: int,
        cut: int,
        now: float,
    ) -> None:
        """A line off the fast path: partial parts, a partial's end, a cut line, or not CRI at all."""
        t = None
        stream = tag = content = b""
        if len(parts) >= 3:
            stream, tag = parts[1], parts[2]
            content = parts[3] if len(parts) == 4 else b""
            if stream in _STREAMS and tag in (b"F", b"P"):
                t = self._ts(parts[0])
        if t is None:
            self._count("malformed")
            text = raw.decode("utf-8", "replace")
            if cut:
                self.stats.dropped_bytes += cut
                text += _CUT_MARKER.format(n=len(raw))
            self._emit(ch, seg, text, self._last_t or time.time(), lineno, lineno, end, len(raw), now)
            return
        self._last_t = t
        p = ch.partials.get(stream)
        if tag == b"P" or p is not None:
            if p is None:
                p = ch.partials[stream] = _Partial([], 0, t, lineno, start, seg.fid, now)
            p.seen = now
            if p.cut:
                p.dropped += len(content) + cut
            else:
                room = self.max_line_bytes - p.size
                if len(content) > room or cut:
                    p.parts.append(content[:room])
                    p.size += min(room, len(content))
                    p.dropped += max(0, len(content) - room) + cut
                    p.cut = True
                    if not cut:  # a line cut by the follower is counted there
                        self._count("cut_line")
                    text = b"".join(p.parts).decode("utf-8", "replace") + _CUT_MARKER.format(n=p.size)
                    p.parts = []
                    self._emit(ch, seg, text, p.t, p.line, lineno, end, p.size, now)
                else:
                    p.parts.append(content)
                    p.size += len(content)
            if tag == b"F":
                del ch.partials[stream]
                if p.cut:
                    self.stats.dropped_bytes += p.dropped
                    log.debug("%s: a %d-byte line was cut to %d bytes", ch.path, p.size + p.dropped, p.size)
                else:
                    self._emit(ch, seg, self._decode(b"".join(p.parts)), p.t, p.line, lineno, end, p.size, now)
            return
        # A full line that was too long for one physical line (cut by the follower).
        text = self._decode(content)
        if cut:
            self.stats.dropped_bytes += cut
            text += _CUT_MARKER.format(n=len(content))
        self._emit(ch, seg, text, t, lineno, lineno, end, len(content), now)

    def _decode(self, data: bytes) -> str:
        try:
            return data.decode()
        except UnicodeDecodeError:
            self._count("invalid_utf8")
            return data.decode("utf-8", "replace")

    def _emit(
        self, ch: _Chain, seg: Segment, text: str, t: float, lineno: int, phys: int, end: int, size: int, now: float
    ) -> None:
        """Add a logical line (starting at physical line `lineno`, ending at line `phys`, whose end
        is at byte `end`) to the chain's batch."""
        b = ch.batch
        if b is not None and b.fid != seg.fid:
            self._close_batch(ch)
            b = None
        if b is None:
            b = ch.batch = _Batch(seg.path, seg.fid, lineno, now)
        b.lines.append(text)
        b.times.append(t)
        b.nbytes += size + 1
        b.end_off, b.end_line = end, phys
        if len(b.lines) >= self.batch_lines or b.nbytes >= self.batch_bytes:
            self._close_batch(ch)

    def _close_batch(self, ch: _Chain) -> None:
        b = ch.batch
        ch.batch = None
        if b is None or not b.lines:
            return
        # Never commit past the start of a logical line still being joined in this file.
        for p in ch.partials.values():
            if p.fid == b.fid and p.start < b.end_off:
                b.end_off, b.end_line = p.start, p.line - 1
        ch.ready.append(b)

    def _finish_partial(self, ch: _Chain, stream: bytes, now: float) -> None:
        p = ch.partials.pop(stream)
        if p.cut or not p.parts:
            return
        self.stats.stale_partials += 1
        seg = Segment(ch.path, p.fid, [], p.line, p.start, p.start)
        b = ch.batch
        # Committing past it: up to what the batch already covers in that file, else up to its start.
        end, phys = (b.end_off, b.end_line) if b is not None and b.fid == p.fid else (p.start, p.line - 1)
        self._emit(ch, seg, self._decode(b"".join(p.parts)), p.t, p.line, phys, end, p.size, now)

    def _flush_stale_partials(self, ch: _Chain, now: float) -> None:
        for stream, p in list(ch.partials.items()):
            if now - p.seen >= self.partial_timeout:
                log.info(
                    "%s: a partial %s line got no end in %.0f s; publishing it as it is",
                    ch.path,
                    stream.decode(),
                    self.partial_timeout,
                )
                self._finish_partial(ch, stream, now)

    def _count(self, kind: str) -> None:
        """Count a follower or parser event in the stats and, for problems, in the telemetry."""
        if kind == "rotated":
            self.stats.rotations += 1
            return
        attr = {"truncated": "truncations", "cut_line": "cut_lines", "read_error": "read_errors"}.get(kind, kind)
        if hasattr(self.stats, attr):
            setattr(self.stats, attr, getattr(self.stats, attr) + 1)
        self.telemetry.watch_errors.labels(source=SOURCE, kind=kind).inc()

    # -- the publishing side (on the loop) -------------------------------------------------------

    async def _publish_ready(self) -> None:
        now = asyncio.get_running_loop().time()
        for pod_path, pod in list(self._pods.items()):
            for path, ch in list(pod.chains.items()):
                if ch.ready:
                    attribution = self._attribute(pod, now)
                    if attribution is None:
                        continue  # held: the job index may know the pod in a moment
                    job, rank = attribution
                    while ch.ready:
                        b = ch.ready[0]
                        for ev in self._events(pod, ch, b, job, rank):
                            await self._publish(ev)
                        ch.ready.popleft()
                        self.stats.batches += 1
                        self.stats.lines += len(b.lines)
                        self.telemetry.lines_in.labels(source=SOURCE).inc(len(b.lines))
                        if job is None:
                            self.stats.unattributed_batches += 1
                        self._commit(ch, b)
                        await self._maybe_save(force=False)
                self._forget_closed(ch)
                if ch.gone and not ch.ready and ch.batch is None:
                    del pod.chains[path]
                    for fid in ch.live | ch.closed:
                        if self.store is not None:
                            self.store.drop(fid)
            if not pod.chains:
                del self._pods[pod_path]

    def _attribute(self, pod: _Pod, now: float) -> tuple[JobRef | None, int | None] | None:
        """(job, rank) of a pod, or None while its lines are held for the job index to catch up."""
        info = self.job_index.pod_by_uid(pod.uid)
        if info is None:
            info = self.job_index.pod(pod.namespace, pod.name)
            if info is not None and info.uid and info.uid != pod.uid:
                info = None  # an earlier or later pod of the same name
        if info is not None:
            pod.hold_since = None
            return info.job, info.rank
        if pod.grace_over:
            return None, None
        if pod.hold_since is None:
            pod.hold_since = now
        if now - pod.hold_since < self.attribution_grace:
            return None
        pod.grace_over = True
        log.info(
            "pod %s/%s (uid %s) is not in the job index after %.0f s: publishing its lines by pod",
            pod.namespace,
            pod.name,
            pod.uid,
            self.attribution_grace,
        )
        return None, None

    def _events(self, pod: _Pod, ch: _Chain, b: _Batch, job: JobRef | None, rank: int | None) -> list[Event]:
        key = job.key if job is not None else f"pod:{pod.namespace}/{pod.name}"

        def build(lines: list[str], times: list[float], first: int) -> Event:
            payload = LogBatch(
                node=self.node,
                namespace=pod.namespace,
                pod=pod.name,
                container=ch.container,
                job=job,
                rank=rank,
                file=b.path,
                first_line=first,
                lines=lines,
                times=times,
            )
            return make_event(payload, producer=self.producer, key=key)

        if b.nbytes <= _SAFE_BATCH_BYTES:
            return [build(b.lines, b.times, b.first_line)]
        return self._fit(build, b.lines, b.times, b.first_line)

    def _fit(self, build: _Build, lines: list[str], times: list[float], first: int) -> list[Event]:
        """Split a batch until every event fits the bus message limit; cut a line that alone does not."""
        ev = build(lines, times, first)
        if len(ev.encode()) <= MAX_MESSAGE_BYTES:
            return [ev]
        if len(lines) == 1:
            keep = _SAFE_BATCH_BYTES
            text = lines[0][:keep] + _CUT_MARKER.format(n=keep)
            return [build([text], times, first)]
        half = len(lines) // 2
        return self._fit(build, lines[:half], times[:half], first) + self._fit(
            build, lines[half:], times[half:], first + half
        )

    async def _publish(self, ev: Event) -> None:

        def failed(e: Exception, delay: float) -> None:
            self.stats.publish_errors += 1
            self.telemetry.watch_errors.labels(source=SOURCE, kind="publish").inc()
            log.warning("publishing a log batch failed (%s); retrying in %.1f s", e, delay)

        # Any bus failure is retried; the batch is kept.
        await retry_until_done(lambda: self.bus.publish(Topic.LOGS, ev), Backoff(0.5, 30.0), failed)

    def _commit(self, ch: _Chain, b: _Batch) -> None:
        if self.store is not None and (b.fid in ch.live or b.fid in ch.closed):
            self.store.set(b.fid, b.path, b.end_off, b.end_line)

    def _forget_closed(self, ch: _Chain) -> None:
        """Drop the saved position of a finished file once none of its lines is waiting."""
        for fid in list(ch.closed):
            if any(b.fid == fid for b in ch.ready) or (ch.batch is not None and ch.batch.fid == fid):
                continue
            ch.closed.discard(fid)
            if self.store is not None:
                self.store.drop(fid)

    async def _maybe_save(self, *, force: bool) -> None:
        await self._saver.save(force=force)

    async def save_positions(self) -> None:
        """Write the position store now (what a graceful stop does)."""
        await self._maybe_save(force=True)
