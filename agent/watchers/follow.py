"""Follow a file by inode, like `tail -F`, with explicit positions: the read side shared by the
container-log tailer (agent/watchers/crilog.py) and the kernel log file source (kernel.py).

Why a file is followed by (st_dev, st_ino) and not by its name: kubelet rotates a container log by
renaming `0.log` to `0.log.<timestamp>` and asking the runtime to reopen, and logrotate renames
`kern.log` and creates a new one. Between the rename and the reopen the writer still appends to the
renamed file, so:

* when the name points to a new inode, the old file is read to its end first, then kept open for
  `rotate_wait` seconds for late writes, read once more, and only then closed; the new file is read
  from its start. No line is lost or read twice across a rotation.
* when the name is gone but the open file still has a link (renamed, new file not created yet), it
  is simply followed on; when its last link is gone (pod directory removed, rotated file deleted)
  it is read to its end and then reported closed.
* a file that became shorter than the read position (copytruncate, `> file`) is read again from 0.

Reads go through `os.read` in chunks of `chunk_bytes`, at most `budget` bytes per call, never the
whole file. A line longer than `max_line_bytes` is cut there and the rest of it, up to its newline,
is skipped (counted in `Segment.cut`), so a 10 MB line costs at most the cap in memory. Complete
lines are handed out in `Segment`s with their byte offsets, so a caller can persist exactly where it
is (`PositionStore`) and resume there after a restart.

Everything here is blocking file I/O: callers run it in a thread (asyncio.to_thread).

The saved positions (`PositionStore`, `PositionSaver`) and the timestamp parser (`Rfc3339`) are in
agent/watchers/positions.py; this module re-exports them.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from trainmedic.agent.watchers.positions import FileId, FilePosition, PositionSaver, PositionStore, Rfc3339

log = logging.getLogger("trainmedic.watchers.follow")


StartAt = Literal["start", "end"]

DEFAULT_CHUNK_BYTES = 64 << 10
DEFAULT_ROTATE_WAIT_S = 5.0


@dataclass(slots=True)
class Segment:
    """Consecutive complete lines of one file (newlines removed).

    `start` is the byte offset of `lines[0]`, `end` the offset just past the newline of the last
    line. Every line but possibly the last is exactly `len(line) + 1` bytes of the file; the last
    one was cut when `cut` > 0 (that many bytes of it were skipped), which is why a cut line always
    ends its segment.
    """

    path: str
    fid: FileId
    lines: list[bytes]
    first_line: int
    start: int
    end: int
    cut: int = 0


@dataclass(slots=True)
class Opened:
    """A file the follower started reading, and where (a caller's initial commit point)."""

    path: str
    fid: FileId
    offset: int
    line: int


@dataclass(slots=True)
class ReadResult:
    segments: list[Segment] = field(default_factory=list)
    opened: list[Opened] = field(default_factory=list)
    # Files finished and closed (rotated and drained, or deleted and drained).
    closed: list[FileId] = field(default_factory=list)
    # The budget ran out before the end of the data: call again soon.
    more: bool = False
    # Nothing is open and the path does not exist: the followed file is gone for good.
    gone: bool = False


class _Handle:
    __slots__ = (
        "carry",
        "carry_start",
        "cut",
        "deadline",
        "failing",
        "fd",
        "fid",
        "line",
        "opened_at",
        "path",
        "pos",
        "skip",
    )

    def __init__(self, fd: int, fid: FileId, path: str) -> None:
        self.opened_at = time.time()
        self.fd = fd
        self.fid = fid
        self.path = path
        self.pos = 0  # offset of the next byte os.read returns
        self.carry = b""  # the start of a line whose newline has not been read yet
        self.carry_start = 0  # its offset (= offset of the first byte not handed out)
        self.line = 0  # complete lines before carry_start
        self.skip = False  # inside an over-long (or, at a start "end", a half-read) line
        self.cut = 0  # bytes of that line skipped so far
        self.deadline: float | None = None  # draining a rotated file until then
        self.failing = False


Notify = Callable[[str], None]


class FileFollower:
    """One path followed across rotations and truncations. Not thread-safe; one caller at a time.

    `start`: where to begin in the file found at the path on the first open: "start", "end", or a
    byte offset (a resumed position, with `start_line` complete lines before it). Files that appear
    later (after a rotation, or a path that did not exist yet) are always read from their start.
    `expect`: the identity the resumed offset belongs to; another file at the path starts at 0.
    `notify` is called with a kind ("rotated", "truncated", "cut_line", "read_error") for counting.
    `catch_up`: at a rotation, also drain rotated siblings (`<name>.<suffix>`, not `.gz`) renamed
    since the current file was opened that were never followed: two rotations between two reads.
    Only for writers that never rename a rotated file again (kubelet); logrotate's `.1` -> `.2`
    renames would make old files look new.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        start: StartAt | int = "start",
        start_line: int = 0,
        expect: FileId | None = None,
        max_line_bytes: int = 256 << 10,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        rotate_wait: float = DEFAULT_ROTATE_WAIT_S,
        count_lines: bool = True,
        catch_up: bool = False,
        notify: Notify | None = None,
    ) -> None:
        if max_line_bytes < 1 or chunk_bytes < 1:
            raise ValueError("max_line_bytes and chunk_bytes must be positive")
        self.path = os.fspath(path)
        self.max_line = max_line_bytes
        self.chunk = chunk_bytes
        self.rotate_wait = rotate_wait
        self.count_lines = count_lines
        self.catch_up = catch_up
        self._seen: list[FileId] = []
        self._start: StartAt | int = start
        self._start_line = start_line
        self._expect = expect
        self._notify = notify or (lambda _kind: None)
        self._cur: _Handle | None = None
        self._draining: list[_Handle] = []
        self._first_open = True
        self._open_failing = False

    # -- public ---------------------------------------------------------------------------------

    def add_rotated(self, path: str, offset: int, line: int, now: float) -> bool:
        """Resume a file that was rotated away while nobody read it (found by its inode at start).

        It is drained from `offset` like a freshly rotated file. False when it cannot be opened.
        """
        h = self._open(path, offset, line)
        if h is None:
            return False
        h.deadline = now + self.rotate_wait
        self._draining.append(h)
        return True

    def start_from_beginning(self) -> None:
        """Read the file at the path from its start after all (before the first read only)."""
        if self._first_open:
            self._start, self._start_line, self._expect = "start", 0, None

    def read(self, now: float, budget: int = 1 << 20) -> ReadResult:
        """Read what is new, up to about `budget` bytes. `now` is a monotonic time for rotate_wait."""
        res = ReadResult()
        # Rotated files first: their lines are older than the new file's.
        for h in list(self._draining):
            budget, at_eof = self._read_handle(h, budget, res)
            if not at_eof:
                res.more = True
                return res
            if (h.deadline is not None and now >= h.deadline) or self._unlinked(h):
                self._finish(h, res)
                self._draining.remove(h)
        cur = self._cur
        if cur is None:
            cur = self._cur = self._open_current(res)
            if cur is None:
                res.gone = not self._draining and not os.path.lexists(self.path)
                return res
        while True:
            budget, at_eof = self._read_handle(cur, budget, res)
            if not at_eof:
                res.more = True
                return res
            try:
                st = os.stat(self.path)
            except FileNotFoundError:
                if self._unlinked(cur):
                    self._finish(cur, res)
                    self._cur = None
                    res.gone = not self._draining
                return res  # renamed and not recreated yet: follow the open file on
            except OSError as e:
                log.warning("cannot stat %s: %s", self.path, e)
                self._notify("read_error")
                return res
            if (st.st_dev, st.st_ino) == cur.fid:
                if st.st_size < cur.pos:
                    log.info(
                        "%s was truncated (%d < %d bytes read): reading it again from the start",
                        self.path,
                        st.st_size,
                        cur.pos,
                    )
                    self._notify("truncated")
                    self._rewind(cur)
                    continue
                return res
            # Rotated: the name points to a new file. Drain the old one (the writer may still have
            # appended between our last read and its reopen), keep it open for late writes, then
            # follow the new one from its start.
            self._notify("rotated")
            budget, at_eof = self._read_handle(cur, max(budget, self.chunk), res)
            old_name, cur.path = cur.path, self._name_of(cur.fid) or cur.path
            for seg in res.segments:
                if seg.fid == cur.fid and seg.path == old_name:
                    seg.path = cur.path  # read before the rename was seen: name the file it is in now
            cur.deadline = now + self.rotate_wait
            self._draining.append(cur)
            log.debug("%s rotated: draining %s", self.path, cur.path)
            if self.catch_up and self._catch_up(cur, (st.st_dev, st.st_ino), now):
                for h in self._draining[self._draining.index(cur) + 1 :]:
                    budget, eof = self._read_handle(h, max(budget, self.chunk), res)
                    at_eof = at_eof and eof
                if not at_eof:
                    self._cur = None  # the new file is opened once the missed ones are read
                    res.more = True
                    return res
            new = self._open_current(res)
            self._cur = new
            # The name moved on again between the stat above and the open: the file the stat saw
            # was rotated away unread in between. Read it (and any other) before the new one.
            moved = new is not None and self.catch_up and new.fid != (st.st_dev, st.st_ino)
            if moved and new is not None and self._catch_up(cur, new.fid, now):
                res.more = True
                return res
            if new is None or not at_eof:
                res.more = res.more or not at_eof
                return res
            cur = new

    def positions(self) -> list[Opened]:
        """Where each open file stands: the first byte not yet handed out (lines before it)."""
        hs = [*self._draining, *([self._cur] if self._cur else [])]
        return [Opened(h.path, h.fid, h.carry_start, h.line) for h in hs]

    @property
    def current(self) -> FileId | None:
        return self._cur.fid if self._cur is not None else None

    def close(self) -> None:
        for h in [*self._draining, *([self._cur] if self._cur else [])]:
            with contextlib.suppress(OSError):
                os.close(h.fd)
        self._draining.clear()
        self._cur = None

    # -- internals ------------------------------------------------------------------------------

    def _open_current(self, res: ReadResult) -> _Handle | None:
        if self._first_open:
            start, line = self._start, self._start_line
        else:
            start, line = 0, 0
        h = self._open(self.path, start, line, expect=self._expect if self._first_open else None)
        if h is None:
            return None
        self._first_open = False
        res.opened.append(Opened(h.path, h.fid, h.carry_start, h.line))
        return h

    def _open(self, path: str, start: StartAt | int, line: int, expect: FileId | None = None) -> _Handle | None:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        except OSError as e:
            if not self._open_failing:
                log.warning("cannot open %s: %s (will retry)", path, e)
                self._notify("read_error")
            self._open_failing = True
            return None
        self._open_failing = False
        try:
            st = os.fstat(fd)
            h = _Handle(fd, (st.st_dev, st.st_ino), path)
            self._seen = [*self._seen[-15:], h.fid]
            if isinstance(start, int) and expect is not None and expect != h.fid:
                start, line = 0, 0  # the resumed position belongs to another file
            if start in ("start", 0):
                return h
            if start == "end":
                offset = st.st_size
                line = self._count_lines(fd, offset) if self.count_lines else 0
            else:
                offset = int(start)
                if offset > st.st_size:
                    log.info(
                        "%s is shorter than its saved position (%d > %d): reading from the start",
                        path,
                        offset,
                        st.st_size,
                    )
                    offset, line = 0, 0
            if offset > 0:
                os.lseek(fd, offset, os.SEEK_SET)
                h.pos = h.carry_start = offset
                h.line = line
                # Starting inside a line (the writer is mid-line, or the file changed): skip to the
                # next line start rather than hand out half a line.
                if os.pread(fd, 1, offset - 1) != b"\n":
                    h.skip = True
            return h
        except OSError as e:
            log.warning("cannot read %s: %s", path, e)
            self._notify("read_error")
            os.close(fd)
            return None

    def _catch_up(self, old: _Handle, new: FileId, now: float) -> bool:
        """Rotated files that appeared since `old` was opened and were never read: read them whole."""
        d = os.path.dirname(self.path) or "."
        prefix = os.path.basename(self.path) + "."
        found: list[tuple[float, str]] = []
        try:
            with os.scandir(d) as it:
                for e in it:
                    if not e.name.startswith(prefix) or e.name.endswith(".gz"):
                        continue
                    st = e.stat(follow_symlinks=False)
                    fid = (st.st_dev, st.st_ino)
                    if fid in self._seen or fid == new or st.st_ctime < old.opened_at - 0.1:
                        continue
                    found.append((st.st_mtime, e.path))
        except OSError as e:
            log.warning("cannot list %s: %s", d, e)
            return False
        for _, path in sorted(found):
            log.warning("%s was rotated more than once between two reads: reading %s too", self.path, path)
            h = self._open(path, 0, 0)
            if h is not None:
                h.deadline = now + self.rotate_wait
                self._draining.append(h)
        return bool(found)

    def _count_lines(self, fd: int, upto: int) -> int:
        n = off = 0
        while off < upto:
            block = os.pread(fd, min(1 << 20, upto - off), off)
            if not block:
                break
            n += block.count(b"\n")
            off += len(block)
        return n

    def _rewind(self, h: _Handle) -> None:
        os.lseek(h.fd, 0, os.SEEK_SET)
        h.pos = h.carry_start = h.line = h.cut = 0
        h.carry = b""
        h.skip = False

    def _unlinked(self, h: _Handle) -> bool:
        try:
            return os.fstat(h.fd).st_nlink == 0
        except OSError:
            return True

    def _name_of(self, fid: FileId) -> str | None:
        """The current name of a rotated file (same directory, same inode), for evidence paths."""
        d = os.path.dirname(self.path) or "."
        try:
            with os.scandir(d) as it:
                for e in it:
                    if e.inode() == fid[1] and e.name != os.path.basename(self.path):
                        return os.path.join(d, e.name)
        except OSError:
            return None
        return None

    def _read_handle(self, h: _Handle, budget: int, res: ReadResult) -> tuple[int, bool]:
        """Read h until EOF or the budget is spent. Returns (budget left, reached EOF)."""
        while budget > 0:
            try:
                data = os.read(h.fd, min(self.chunk, budget))
            except OSError as e:
                if not h.failing:
                    log.warning("error reading %s at %d: %s (will retry)", h.path, h.pos, e)
                    self._notify("read_error")
                h.failing = True
                return budget, True
            h.failing = False
            if not data:
                return budget, True
            budget -= len(data)
            self._feed(h, data, res)
        return budget, False

    def _feed(self, h: _Handle, data: bytes, res: ReadResult) -> None:
        base = h.pos  # offset of data[0]
        h.pos += len(data)
        if h.skip:
            i = data.find(b"\n")
            if i < 0:
                h.cut += len(data)
                return
            end = base + i + 1
            if h.carry:
                h.cut += i
                res.segments.append(Segment(h.path, h.fid, [h.carry], h.line + 1, h.carry_start, end, h.cut))
                self._notify("cut_line")
            h.line += 1
            h.skip = False
            h.carry = b""
            h.cut = 0
            h.carry_start = end
            data = data[i + 1 :]
            if not data:
                return
        buf = h.carry + data if h.carry else data
        start = h.carry_start
        nl = buf.rfind(b"\n")
        if nl < 0:
            self._keep(h, buf)
            return
        lines = buf[:nl].split(b"\n")
        end = start + nl + 1
        if len(buf) <= self.max_line:
            res.segments.append(Segment(h.path, h.fid, lines, h.line + 1, start, end))
        else:
            self._segments_with_cuts(h, lines, start, res)
        h.line += len(lines)
        h.carry_start = end
        h.carry = b""
        self._keep(h, buf[nl + 1 :])

    def _keep(self, h: _Handle, rest: bytes) -> None:
        if len(rest) > self.max_line:
            h.carry = rest[: self.max_line]
            h.cut = len(rest) - self.max_line
            h.skip = True
        else:
            h.carry = rest

    def _segments_with_cuts(self, h: _Handle, lines: list[bytes], start: int, res: ReadResult) -> None:
        cap = self.max_line
        first = h.line + 1
        seg: list[bytes] = []
        seg_start = off = start
        for ln in lines:
            n = len(ln)
            off += n + 1
            if n <= cap:
                seg.append(ln)
                continue
            seg.append(ln[:cap])
            res.segments.append(Segment(h.path, h.fid, seg, first, seg_start, off, n - cap))
            self._notify("cut_line")
            first += len(seg)
            seg = []
            seg_start = off
        if seg:
            res.segments.append(Segment(h.path, h.fid, seg, first, seg_start, off))

    def _finish(self, h: _Handle, res: ReadResult) -> None:
        """Close a file for good; an unterminated last line is handed out as it is."""
        if h.carry:
            res.segments.append(
                Segment(h.path, h.fid, [h.carry], h.line + 1, h.carry_start, h.carry_start + len(h.carry), h.cut)
            )
            h.line += 1
        with contextlib.suppress(OSError):
            os.close(h.fd)
        res.closed.append(h.fid)


__all__ = [
    "FileFollower",
    "FileId",
    "FilePosition",
    "PositionSaver",
    "PositionStore",
    "ReadResult",
    "Rfc3339",
    "Segment",
    "StartAt",
]
