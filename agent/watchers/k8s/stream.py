"""Blocking calls and streams in daemon threads.

The official client is synchronous, so nothing of it runs on the event loop. A list page goes
through `loop.run_in_executor` with `CALLS`, an executor that gives each call its own daemon
thread: a hung API server cannot pin the default executor's few workers (which the file and
Prometheus sources share), and a call stuck at shutdown does not keep the interpreter alive. A
stream (a watch, a followed log) lives for minutes, so each is read by its own daemon thread
(`LineStream`); closing the stream shuts its socket down, so cancellation is prompt.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, Literal, ParamSpec, TypeVar

import urllib3.exceptions

T = TypeVar("T")
P = ParamSpec("P")


class DaemonThreadExecutor(concurrent.futures.Executor):
    """Runs each call in a new daemon thread (calls are rare: one per list page)."""

    def __init__(self, name: str = "trainmedic-k8s-call") -> None:
        self._name = name

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> concurrent.futures.Future[T]:
        future: concurrent.futures.Future[T] = concurrent.futures.Future()

        def run() -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                result = fn(*args, **kwargs)
            except BaseException as e:  # noqa: BLE001 - handed to the awaiting coroutine
                future.set_exception(e)
            else:
                future.set_result(result)

        threading.Thread(target=run, name=self._name, daemon=True).start()
        return future


CALLS = DaemonThreadExecutor()


def shutdown_response(resp: Any) -> None:
    """Unblock a thread reading this urllib3 response: shut its socket down (close follows in the reader)."""
    sock = getattr(getattr(resp, "connection", None), "sock", None)
    if sock is None:
        return
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


@dataclass
class _End:
    reason: Literal["eof", "timeout", "closed"]


class LineStream(Generic[T]):
    """A streaming HTTP response (a watch, a followed log) read line by line in a daemon thread.

    `open_` performs the request (in the thread) and returns the urllib3 response. Lines are parsed
    in the thread by `parse` (None skips a line) and handed to the event loop in batches, at most
    `max_pending` batches ahead of the consumer (back-pressure). A line longer than `max_line` is
    truncated (`truncate=True`, logs) or set aside through `bad_line` (watch events). `close()` (also
    on leaving `async with`) shuts the socket down, so the thread ends at once.
    """

    def __init__(
        self,
        open_: Callable[[], Any],
        parse: Callable[[bytes], T | None],
        *,
        name: str,
        max_line: int = 1 << 20,
        truncate: bool = False,
        bad_line: Callable[[bytes, Exception], None] | None = None,
        max_pending: int = 16,
    ) -> None:
        self._open = open_
        self._parse = parse
        self.name = name
        self._max_line = max_line
        self._truncate = truncate
        self._bad_line = bad_line
        self._slots = threading.Semaphore(max_pending)
        self._queue: asyncio.Queue[list[T] | BaseException | _End] = asyncio.Queue()
        self._lock = threading.Lock()
        self._resp: Any = None
        self._stopped = False
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.ended: str | None = None

    async def __aenter__(self) -> LineStream[T]:
        self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._run, name=f"trainmedic-stream:{self.name}", daemon=True)
        self._thread.start()

    def close(self) -> None:
        with self._lock:
            self._stopped = True
            if self._resp is not None:
                shutdown_response(self._resp)

    @property
    def thread(self) -> threading.Thread | None:
        return self._thread

    async def next_batch(self, timeout: float | None = None) -> list[T] | None:
        """The next batch of parsed lines; None when `timeout` passed first. Raises StopAsyncIteration
        at the end of the stream and the thread's error (the request's ApiException, a broken
        connection) when it failed."""
        if self.ended is not None:
            raise StopAsyncIteration
        try:
            # asyncio.timeout, not wait_for (which can swallow a cancellation on 3.11, see podlogs).
            async with asyncio.timeout(timeout):
                item = await self._queue.get()
        except TimeoutError:
            return None
        self._slots.release()
        if isinstance(item, _End):
            self.ended = item.reason
            raise StopAsyncIteration
        if isinstance(item, BaseException):
            self.ended = "error"
            raise item
        return item

    def __aiter__(self) -> LineStream[T]:
        return self

    async def __anext__(self) -> list[T]:
        while True:
            batch = await self.next_batch()
            if batch:
                return batch

    # -- the thread --------------------------------------------------------------------------------

    def _post(self, item: list[T] | BaseException | _End) -> bool:
        while not self._slots.acquire(timeout=0.25):
            if self._stopped:
                return False
        loop = self._loop
        if loop is None:
            return False
        try:
            loop.call_soon_threadsafe(self._queue.put_nowait, item)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            self._stopped = True
            return False
        return True

    def _emit(self, raw: bytes, out: list[T]) -> None:
        if len(raw) > self._max_line:
            if not self._truncate:
                if self._bad_line is not None:
                    self._bad_line(raw[:200], ValueError(f"line longer than {self._max_line} bytes"))
                return
            raw = raw[: self._max_line] + b" [truncated]"
        try:
            parsed = self._parse(raw)
        except Exception as e:  # noqa: BLE001 - one bad line is set aside, the stream goes on
            if self._bad_line is not None:
                self._bad_line(raw, e)
            return
        if parsed is not None:
            out.append(parsed)

    def _run(self) -> None:
        try:
            resp = self._open()
        except BaseException as e:  # noqa: BLE001 - handed over to the consumer, which classifies it
            self._post(e)
            return
        with self._lock:
            self._resp = resp
            stopped = self._stopped
        end: _End | BaseException = _End("closed")
        try:
            if not stopped:
                end = self._read(resp)
        finally:
            with self._lock:
                self._resp = None
            with contextlib.suppress(Exception):
                resp.close()
                resp.release_conn()
        if not self._stopped:
            self._post(end)

    def _read(self, resp: Any) -> _End | BaseException:
        buf = bytearray()
        skipping = False
        try:
            for chunk in resp.stream(amt=None, decode_content=True):
                if self._stopped:
                    return _End("closed")
                out: list[T] = []
                start = 0
                data = bytes(chunk)
                while True:
                    nl = data.find(b"\n", start)
                    if nl < 0:
                        break
                    if skipping:
                        skipping = False
                        buf.clear()
                    else:
                        buf += data[start:nl]
                        self._emit(bytes(buf), out)
                        buf.clear()
                    start = nl + 1
                if not skipping:
                    buf += data[start:]
                    if len(buf) > self._max_line:
                        # No newline in sight: cut (or set aside) now, skip the rest up to the newline.
                        self._emit(bytes(buf), out)
                        buf.clear()
                        skipping = True
                if out and not self._post(out):
                    return _End("closed")
        except urllib3.exceptions.ReadTimeoutError:
            return _End("timeout")
        except Exception as e:  # noqa: BLE001 - handed over to the consumer
            return _End("closed") if self._stopped else e
        if buf and not skipping:
            tail: list[T] = []
            self._emit(bytes(buf), tail)
            if tail:
                self._post(tail)
        return _End("eof")
