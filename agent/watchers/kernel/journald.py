"""`JournaldSource`: kernel messages from `journalctl -k -f -o json`, resumed from the saved cursor,
the process restarted with backoff.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from trainmedic.agent.bus.base import Bus
from trainmedic.agent.jobindex import JobIndex
from trainmedic.agent.telemetry import Telemetry
from trainmedic.agent.watchers.follow import PositionSaver, StartAt
from trainmedic.agent.watchers.kernel.publish import (
    KernelSourceUnavailable,
    _cap,
    _Chunk,
    _KernelSource,
    _together,
    record_lines,
)
from trainmedic.backoff import Backoff

log = logging.getLogger("trainmedic.watchers.kernel")


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


class JournaldSource(_KernelSource):
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
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self.max_entry_bytes = max_entry_bytes
        self.positions = PositionSaver.at(position_store, position_flush_interval, self.SOURCE, telemetry)
        super().__init__(
            bus, node, job_index, telemetry, producer, batch_lines, batch_bytes, batch_linger, self._published
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
