"""Where the followers of agent/watchers/follow.py resume: the saved positions of the files and the
sources' cursors (`PositionStore`, written atomically, a corrupt file set aside), saved at most so
often (`PositionSaver`); and `Rfc3339`, the container runtime's timestamps parsed with a cache.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as _dt
import json
import logging
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trainmedic.agent.telemetry import Telemetry


log = logging.getLogger("trainmedic.watchers.follow")


FileId = tuple[int, int]  # (st_dev, st_ino)


# -- timestamps -----------------------------------------------------------------------------------


class Rfc3339:
    """RFC 3339 timestamps (`2024-01-01T12:00:00.123456789Z`, `...+08:00`) to epoch seconds, fast.

    The whole-second part is converted once and cached (consecutive log lines share it); the
    fraction is added with float(). Returns None for anything that is not such a timestamp.
    """

    def __init__(self, cache_size: int = 4096) -> None:
        self._cache: dict[bytes, float] = {}
        self._cache_size = cache_size

    def __call__(self, ts: bytes) -> float | None:
        if ts[-1:] == b"Z":
            key = ts[:19]
            frac = ts[19:-1]
        else:
            key = ts[:19] + ts[-6:]
            frac = ts[19:-6]
        base = self._cache.get(key)
        if base is None:
            base = self._base(key)
        if base is None:
            return None
        if not frac:
            return base
        if frac[:1] not in (b".", b","):
            return None
        try:
            return base + float(b"." + frac[1:]) if frac[:1] == b"," else base + float(frac)
        except ValueError:
            return None

    def _base(self, key: bytes) -> float | None:
        value: float | None
        if len(key) not in (19, 25) or key[4:5] != b"-" or key[10:11] not in (b"T", b"t", b" "):
            return None  # not cached: junk must not fill the cache
        try:
            text = key.decode("ascii")
            value = _dt.datetime.fromisoformat(text if len(key) == 25 else text + "+00:00").timestamp()
        except (ValueError, UnicodeDecodeError):
            return None
        if len(self._cache) >= self._cache_size:
            self._cache.clear()
        self._cache[key] = value
        return value


# -- positions ------------------------------------------------------------------------------------


@dataclass(slots=True)
class FilePosition:
    path: str
    offset: int
    line: int


class PositionStore:
    """Read positions kept across restarts: one small JSON file, written atomically.

    `files` maps a file identity ("<dev>:<ino>") to its path (for finding a rotated file again and
    for sanity) and the offset and line count of the first byte not yet accepted by the bus.
    `cursors` holds the named positions of non-file sources (kmsg sequence, journald cursor).
    Callers update it after the bus accepted what they published, and save it from a thread.
    A store that cannot be parsed is set aside as `<file>.corrupt` and replaced by an empty one.
    """

    VERSION = 1

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.files: dict[str, FilePosition] = {}
        self.cursors: dict[str, object] = {}
        # When the file was last saved (None: first run, nothing remembered).
        self.saved_at: float | None = None
        self.dirty = False

    @staticmethod
    def key(fid: FileId) -> str:
        return f"{fid[0]}:{fid[1]}"

    def load(self) -> PositionStore:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return self
        except OSError as e:
            log.warning("cannot read position store %s: %s (starting without it)", self.path, e)
            return self
        try:
            obj = json.loads(raw)
            if not isinstance(obj, dict) or obj.get("v") != self.VERSION:
                raise ValueError(f"unknown format (v={obj.get('v') if isinstance(obj, dict) else None!r})")
            files = {
                str(k): FilePosition(str(v["path"]), int(v["offset"]), int(v["line"]))
                for k, v in dict(obj.get("files") or {}).items()
            }
            cursors = dict(obj.get("cursors") or {})
            saved_at = float(obj["saved_at"]) if obj.get("saved_at") is not None else None
        except (ValueError, TypeError, KeyError, AttributeError) as e:
            aside = self.path.with_name(self.path.name + ".corrupt")
            log.warning("position store %s is unusable (%s): set aside as %s, starting without it", self.path, e, aside)
            with contextlib.suppress(OSError):
                os.replace(self.path, aside)
            return self
        self.files, self.cursors, self.saved_at = files, cursors, saved_at
        return self

    def get(self, fid: FileId) -> FilePosition | None:
        return self.files.get(self.key(fid))

    def set(self, fid: FileId, path: str, offset: int, line: int) -> None:
        k = self.key(fid)
        old = self.files.get(k)
        if old is None or old.offset != offset or old.path != path or old.line != line:
            self.files[k] = FilePosition(path, offset, line)
            self.dirty = True

    def drop(self, fid: FileId) -> None:
        self.drop_key(self.key(fid))

    def drop_key(self, key: str) -> None:
        if self.files.pop(key, None) is not None:
            self.dirty = True

    def set_cursor(self, name: str, value: object) -> None:
        if self.cursors.get(name) != value:
            self.cursors[name] = value
            self.dirty = True

    def save(self) -> None:
        """Write the store (tmp file, fsync, rename). Blocking: call it from a thread."""
        self.dirty = False
        now = time.time()
        body = {
            "v": self.VERSION,
            "saved_at": now,
            "files": {k: {"path": p.path, "offset": p.offset, "line": p.line} for k, p in self.files.items()},
            "cursors": self.cursors,
        }
        data = json.dumps(body, separators=(",", ":"), sort_keys=True).encode()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=self.path.name + ".", suffix=".tmp", dir=self.path.parent)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            self.dirty = True
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise


class PositionSaver:
    """Saves a source's `PositionStore` from the event loop: in a thread, one save at a time.

    A saver is shared by a source's publisher (which moves positions on acknowledgement) and its
    stop path. A save runs in a thread that a cancelled caller does not stop; a forced save (the
    last one, on stop) first waits for one still running, so the file on disk is never older than
    what was acknowledged. Unforced saves happen at most once per `flush_interval`.
    """

    def __init__(self, store: PositionStore | None, flush_interval: float, source: str, telemetry: Telemetry) -> None:
        self.store = store
        self.flush_interval = flush_interval
        self.source = source
        self.telemetry = telemetry
        self._last_save = float("-inf")
        self._failing = False
        self._inflight: asyncio.Future[None] | None = None

    @classmethod
    def at(
        cls, path: str | os.PathLike[str] | None, flush_interval: float, source: str, telemetry: Telemetry
    ) -> PositionSaver:
        return cls(PositionStore(path) if path is not None else None, flush_interval, source, telemetry)

    async def load(self) -> None:
        if self.store is not None:
            await asyncio.to_thread(self.store.load)

    async def save(self, *, force: bool = False) -> None:
        """Save the store if it changed; errors are counted and logged once, and retried later."""
        if self.store is None:
            return
        running = self._inflight
        if running is not None and not running.done():
            if not force:
                return
            await asyncio.wait([running])
        if not self.store.dirty:
            return
        now = asyncio.get_running_loop().time()
        if not force and now - self._last_save < self.flush_interval:
            return
        self._last_save = now
        self._inflight = task = asyncio.ensure_future(asyncio.to_thread(self.store.save))
        await asyncio.wait([task])
        try:
            task.result()
        except OSError as e:
            if not self._failing:
                log.warning("cannot save read positions to %s: %s (will retry)", self.store.path, e)
            self._failing = True
            self.telemetry.watch_errors.labels(source=self.source, kind="position_store").inc()
        else:
            self._failing = False
