"""Serving: the app on a socket bound here, under uvicorn.

`serve` runs uvicorn on a socket bound here (port 0: the port is read back from `app.state.server`),
without uvicorn's signal handlers (the agent owns SIGTERM), and lets requests in flight finish when
`stop` is set. A port that cannot be bound is an `ApiBindError`, not an exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import socket
from types import TracebackType
from typing import Any, Self

import uvicorn
from fastapi import FastAPI

from trainmedic.agent.config import ApiSettings
from trainmedic.errors import TrainmedicError

log = logging.getLogger("trainmedic.api")


class ApiBindError(TrainmedicError):
    """The API cannot listen on its address (port taken, address not on this host, no permission)."""


class _Server(uvicorn.Server):
    """uvicorn without its signal handlers: the agent owns SIGTERM / SIGINT and sets `stop`."""

    @contextlib.contextmanager
    def capture_signals(self) -> Any:
        yield


def _bind(host: str, port: int) -> socket.socket:
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, kind, proto, _, addr = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
        sock.listen(128)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


class ApiServer:
    """The app on a listening socket. With `port` 0 the kernel picks a free one: read it back from
    `port` / `url` once started, or from `app.state.server` (what `serve` started)."""

    def __init__(self, app: FastAPI, settings: ApiSettings) -> None:
        self.app = app
        self.settings = settings
        self._server: _Server | None = None
        self._task: asyncio.Task[None] | None = None
        self.host = settings.host
        self.port = settings.port

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        if host in ("0.0.0.0", "[::]"):  # noqa: S104 (a wildcard bind is reached on loopback)
            host = "127.0.0.1"
        return f"http://{host}:{self.port}"

    async def start(self) -> None:
        try:
            sock = await asyncio.to_thread(_bind, self.settings.host, self.settings.port)
        except OSError as e:
            raise ApiBindError(
                f"the API cannot listen on {self.settings.host}:{self.settings.port} (api.host, api.port): "
                f"{e.strerror or e}"
            ) from e
        self.port = int(sock.getsockname()[1])
        # Where a caller that asked for port 0 finds the port the kernel picked.
        self.app.state.server = self
        config = uvicorn.Config(
            self.app,
            log_config=None,
            access_log=False,
            lifespan="off",
            server_header=False,
            timeout_graceful_shutdown=math.ceil(self.settings.shutdown_timeout_s),
        )
        server = self._server = _Server(config)
        self._task = asyncio.create_task(server.serve(sockets=[sock]), name="trainmedic:api-server")
        while not server.started:
            if self._task.done():
                sock.close()
                exc = self._task.exception()
                raise RuntimeError(f"the API server did not start: {exc!r}")
            await asyncio.sleep(0.01)
        log.info("API listening on %s", self.url)

    async def stop(self) -> None:
        server, task = self._server, self._task
        if server is None or task is None:
            return
        server.should_exit = True
        try:
            await asyncio.wait_for(asyncio.shield(task), self.settings.shutdown_timeout_s + 2.0)
        except TimeoutError:
            server.force_exit = True
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        finally:
            self._server = self._task = None

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()


async def serve(app: FastAPI, settings: ApiSettings, stop: asyncio.Event) -> None:
    """Serve `app` until `stop` is set (or the caller is cancelled), then let requests in flight finish."""
    async with ApiServer(app, settings):
        await stop.wait()
