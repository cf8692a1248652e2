"""A real HTTP webhook receiver on a free loopback port, for tests, the demo and the benchmark.

Webhook delivery is only tested honestly against a server that speaks HTTP over a socket: one
that answers 200, one that answers 500 or 429 with Retry-After, one that is slow, one that is down
(nothing listening on the port). `Receiver` is that server, written on asyncio streams (HTTP/1.1,
keep-alive, Content-Length bodies), so it runs in the test's own event loop: under looptime the
loop's fake clock drives its delays (`Reply.delay_s`) exactly like the client's timeouts, and real
loopback sockets still carry every byte.

    async with Receiver() as rx:
        rx.script(Reply(500), Reply(429, retry_after=30))   # the next two requests, then the default
        ...                                                 # POST to rx.url + "/hook"
        await rx.wait_for(3)
        rx.requests[-1].json()

    await rx.stop()     # down: connections refused, open keep-alive connections closed
    await rx.start()    # up again, on the same port

`ThreadedReceiver` runs one in a thread with its own loop, for synchronous callers.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Self
from urllib.parse import parse_qs, urlsplit

MAX_BODY = 16 << 20
MAX_HEADER = 64 << 10

_REASONS = {
    200: "OK",
    202: "Accepted",
    204: "No Content",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    408: "Request Timeout",
    413: "Payload Too Large",
    429: "Too Many Requests",
    500: "Internal Server Error",
    502: "Bad Gateway",
    503: "Service Unavailable",
}


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class Reply:
    """How to answer one request. `body` may be bytes, text, or a JSON-able value (sent as JSON)."""

    status: int = 200
    body: Any = b"ok"
    headers: Mapping[str, str] = field(default_factory=dict)
    # Seconds (of the loop's clock) to wait before answering: a slow receiver.
    delay_s: float = 0.0
    # Retry-After header value in seconds (429 / 503).
    retry_after: float | None = None
    # Close the connection without answering (a receiver that crashes mid-request).
    drop: bool = False

    def encoded(self) -> tuple[bytes, str]:
        if isinstance(self.body, bytes):
            return self.body, "text/plain; charset=utf-8"
        if isinstance(self.body, str):
            return self.body.encode(), "text/plain; charset=utf-8"
        return json.dumps(self.body, ensure_ascii=False).encode(), "application/json; charset=utf-8"


@dataclass(frozen=True)
class Request:
    """One request as received."""

    method: str
    target: str
    headers: dict[str, str]  # names lower-cased
    body: bytes
    # Wall-clock and loop-clock time when the body was complete.
    time: float
    loop_time: float
    # The reply it got (None: dropped, or still waiting when the receiver stopped).
    status: int | None = None

    @property
    def path(self) -> str:
        return urlsplit(self.target).path

    @property
    def query(self) -> dict[str, list[str]]:
        return parse_qs(urlsplit(self.target).query)

    def header(self, name: str) -> str | None:
        return self.headers.get(name.lower())

    def json(self) -> Any:
        return json.loads(self.body)


Handler = Callable[[Request], Reply | None]


class Receiver:
    """An HTTP/1.1 server on 127.0.0.1 that records every request and answers as told."""

    def __init__(
        self, *, port: int | None = None, default: Reply | None = None, handler: Handler | None = None
    ) -> None:
        self.port = port or free_port()
        self.default = default or Reply()
        # Called first for every request; None falls through to the script, then `default`.
        self.handler = handler
        self.requests: list[Request] = []
        # Requests answered with 2xx, in order.
        self.accepted: list[Request] = []
        self._script: list[Reply] = []
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._arrived = asyncio.Condition()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        return self._server is not None

    def script(self, *replies: Reply) -> None:
        """Answer the next requests with `replies`, in order; then `default` again."""
        self._script.extend(replies)

    def json_bodies(self, path: str | None = None, *, accepted_only: bool = True) -> list[Any]:
        reqs = self.accepted if accepted_only else self.requests
        return [r.json() for r in reqs if path is None or r.path == path]

    # -- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> Self:
        if self._server is None:
            self._server = await asyncio.start_server(
                self._serve, "127.0.0.1", self.port, reuse_address=True, limit=MAX_HEADER
            )
        return self

    async def stop(self) -> None:
        """Down: stop listening (connections are refused) and close open connections."""
        server, self._server = self._server, None
        if server is None:
            return
        server.close()
        for w in list(self._writers):
            w.close()
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await server.wait_closed()

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    async def wait_for(
        self, count: int, *, timeout: float = 10.0, accepted: bool = True, path: str | None = None
    ) -> list[Request]:
        """Wait until `count` requests (2xx-answered ones unless `accepted=False`) were recorded."""

        def matching() -> list[Request]:
            reqs = self.accepted if accepted else self.requests
            return [r for r in reqs if path is None or r.path == path]

        async with asyncio.timeout(timeout):
            async with self._arrived:
                await self._arrived.wait_for(lambda: len(matching()) >= count)
        return matching()

    # -- serving ---------------------------------------------------------------------------------

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        self._writers.add(writer)
        try:
            while await self._one(reader, writer):
                pass
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError):
            pass
        except asyncio.CancelledError:
            pass
        finally:
            self._writers.discard(writer)
            if task is not None:
                self._tasks.discard(task)
            writer.close()
            with contextlib.suppress(ConnectionError, asyncio.CancelledError):
                await writer.wait_closed()

    async def _one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """Read and answer one request; False when the connection is over."""
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError:
            return False
        lines = head.decode("latin-1").split("\r\n")
        method, target, _version = lines[0].split(" ", 2)
        headers: dict[str, str] = {}
        for line in lines[1:]:
            if ":" in line:
                k, v = line.split(":", 1)
                headers[k.strip().lower()] = v.strip()
        length = int(headers.get("content-length") or 0)
        if headers.get("transfer-encoding", "").lower() == "chunked" or length > MAX_BODY:
            await self._write(writer, 413 if length > MAX_BODY else 400, b"unsupported body", "text/plain", {})
            return False
        body = await reader.readexactly(length) if length else b""
        loop = asyncio.get_running_loop()
        request = Request(method, target, headers, body, time.time(), loop.time())
        idx = len(self.requests)
        self.requests.append(request)
        async with self._arrived:
            self._arrived.notify_all()
        reply = self.handler(request) if self.handler is not None else None
        if reply is None:
            reply = self._script.pop(0) if self._script else self.default
        if reply.delay_s > 0:
            await asyncio.sleep(reply.delay_s)
        if reply.drop:
            return False
        out, ctype = reply.encoded()
        extra = dict(reply.headers)
        if reply.retry_after is not None:
            extra["Retry-After"] = f"{reply.retry_after:g}"
        await self._write(writer, reply.status, out, ctype, extra)
        answered = Request(method, target, headers, body, request.time, request.loop_time, reply.status)
        self.requests[idx] = answered
        async with self._arrived:
            if 200 <= reply.status < 300:
                self.accepted.append(answered)
            self._arrived.notify_all()
        return headers.get("connection", "").lower() != "close"

    @staticmethod
    async def _write(
        writer: asyncio.StreamWriter, status: int, body: bytes, ctype: str, headers: Mapping[str, str]
    ) -> None:
        lines = [f"HTTP/1.1 {status} {_REASONS.get(status, 'Status')}", f"Content-Length: {len(body)}"]
        lines.append(f"Content-Type: {ctype}")
        lines.extend(f"{k}: {v}" for k, v in headers.items())
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)
        await writer.drain()


class ThreadedReceiver:
    """A `Receiver` in a thread of its own (its own event loop), for synchronous code.

    `requests` / `accepted` are read from the caller's thread (list appends are atomic); `script`
    and `stop` / `start` are passed to the receiver's loop.
    """

    def __init__(self, **kwargs: Any) -> None:
        self._kwargs = kwargs
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="webhook-receiver", daemon=True)
        self.receiver: Receiver | None = None

    def _call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=30)

    def start(self) -> Self:
        if not self._thread.is_alive():
            self._thread.start()

        async def make() -> Receiver:
            return Receiver(**self._kwargs)

        if self.receiver is None:
            self.receiver = self._call(make())
        self._call(self.rx.start())
        return self

    @property
    def rx(self) -> Receiver:
        if self.receiver is None:
            raise RuntimeError("the receiver is not started")
        return self.receiver

    @property
    def url(self) -> str:
        return self.rx.url

    @property
    def requests(self) -> list[Request]:
        return self.rx.requests

    @property
    def accepted(self) -> list[Request]:
        return self.rx.accepted

    def script(self, *replies: Reply) -> None:
        rx = self.rx

        async def put() -> None:
            rx.script(*replies)

        self._call(put())  # applied before this returns, so the next request gets it

    def wait_for(self, count: int, *, timeout: float = 10.0, accepted: bool = True) -> list[Request]:
        result: list[Request] = self._call(self.rx.wait_for(count, timeout=timeout, accepted=accepted))
        return result

    def stop(self) -> None:
        if self.receiver is not None:
            self._call(self.receiver.stop())

    def close(self) -> None:
        self.stop()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
