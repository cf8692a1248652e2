"""The demo's stand-in for the ops system: a local HTTP endpoint that records the webhooks it gets.

`trainmedic demo` configures it as a CloudEvents sink of the agent's `notify` settings, so each
incident's notifications travel the same way they would to a real receiver: over HTTP, signed,
through the durable outbox. It answers 200 to every well-formed POST, keeps what it received, and
checks the signature with trainmedic's own verifier where the running build has one.

aiohttp (a dependency of kmock, which the demo needs anyway) serves it on 127.0.0.1, on a free port.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Delivery", "WebhookReceiver"]

MAX_BODY = 1 << 20


@dataclass(frozen=True)
class Delivery:
    """One POST the receiver accepted."""

    time: float
    path: str
    headers: dict[str, str]
    body: bytes
    events: list[dict[str, Any]] = field(default_factory=list)  # CloudEvents in it (a batch holds several)
    verified: bool | None = None  # the signature checked out (None: no secret, or no verifier here)

    @property
    def subjects(self) -> list[str]:
        return [str(e.get("subject")) for e in self.events if e.get("subject")]


class WebhookReceiver:
    """Records webhook POSTs on http://127.0.0.1:<port>/<any path>."""

    def __init__(self, *, secret: bytes | None = None, host: str = "127.0.0.1", port: int = 0) -> None:
        self.secret = secret
        self.host = host
        self._port = port
        self.deliveries: list[Delivery] = []
        self.rejected = 0
        self._runner: Any = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self._port}/hooks/trainmedic"

    async def __aenter__(self) -> WebhookReceiver:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        from aiohttp import web

        app = web.Application(client_max_size=MAX_BODY)
        app.router.add_post("/{tail:.*}", self._post)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, self.host, self._port)
        await site.start()
        self._runner = runner
        for addr in runner.addresses:  # (host, port) of the bound socket: the port asked was 0
            self._port = int(addr[1])
            break

    async def stop(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    def mark(self) -> int:
        """A position: `since(mark)` is what arrived after it."""
        return len(self.deliveries)

    def since(self, mark: int) -> list[Delivery]:
        return self.deliveries[mark:]

    async def _post(self, request: Any) -> Any:
        from aiohttp import web

        body = await request.read()
        headers = {str(k): str(v) for k, v in request.headers.items()}
        try:
            doc = json.loads(body) if body else None
        except ValueError:
            self.rejected += 1
            return web.json_response({"error": "the body is not JSON"}, status=400)
        events = [e for e in (doc if isinstance(doc, list) else [doc]) if isinstance(e, dict)]
        self.deliveries.append(Delivery(time.time(), request.path, headers, body, events, self._verify(headers, body)))
        return web.json_response({"accepted": len(events)})

    def _verify(self, headers: dict[str, str], body: bytes) -> bool | None:
        if self.secret is None:
            return None
        try:
            from trainmedic.reports.payloads import verify  # the agent's own verifier (the ops integration)
        except ImportError:
            return None
        lowered = {k.lower(): v for k, v in headers.items()}
        merged = {**headers, **lowered}
        try:
            return bool(verify(self.secret, merged, body, now=time.time()))
        except Exception:  # noqa: BLE001 - a verifier that cannot judge this request: not verified
            return False
