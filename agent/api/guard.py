"""Auth and body limits, as an ASGI middleware (`_Guard`) in front of every route.

Every state-changing call (any method but GET/HEAD/OPTIONS) needs `Authorization: Bearer <token>`,
compared in constant time. With no token configured those calls are refused (503 and a message
saying which setting to set), never silently open; `allow_unauthenticated: true` is the explicit
opt-out for a laptop. `read_auth` protects the reads too (the probes stay open for the kubelet).
The check runs before any body is read, so no route can forget it and an anonymous client cannot
make the agent buffer a large body. An address that sent too many wrong tokens is refused (429,
agent/authlimit.py).

Bodies are bounded while they are read: a Content-Length over `max_body_bytes` is refused at once,
and a chunked body is counted as it streams in and refused (413) when it crosses the limit.
"""

from __future__ import annotations

import hmac
import json
import logging
import math
import time
from collections.abc import Mapping, Sequence

from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from trainmedic.agent.api.errors import ApiError
from trainmedic.agent.authlimit import AuthFailures, client_address
from trainmedic.agent.config import ApiSettings, secret_setting
from trainmedic.agent.telemetry import Telemetry

log = logging.getLogger("trainmedic.api")

# Probes stay open (kubelet, load balancers); the schema and docs say nothing secret.
OPEN_PATHS = frozenset({"/healthz", "/readyz", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"})
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
# The web console (agent/console) checks its own auth: a session cookie with a CSRF token on every
# form, or this bearer token. Body limits still apply to it here.
CONSOLE_PREFIX = "/console"
# Metric label values stay bounded whatever method a client invents.
KNOWN_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


def resolve_token(settings: ApiSettings, env: Mapping[str, str] | None = None) -> str | None:
    """The bearer token: `token`, else the variable `token_env` names, else the file `token_file`."""
    return secret_setting(
        settings.token,
        settings.token_env,
        settings.token_file,
        what="api.token",
        env=env,
        unset=": state-changing calls are refused",
    )


def throttled(wait_s: float) -> ApiError:
    """The answer to a client address that sent too many wrong tokens (agent/authlimit.py)."""
    retry = max(1, math.ceil(wait_s))
    return ApiError(
        429,
        "too_many_failures",
        f"too many wrong tokens from this address: try again in {retry} s (api.auth_failure_limit)",
        f"该地址发送的错误令牌过多：请在 {retry} 秒后重试（api.auth_failure_limit）",
        headers={"Retry-After": str(retry)},
    )


def _bearer(headers: Sequence[tuple[bytes, bytes]]) -> bytes | None:
    """The credentials of `Authorization: Bearer <credentials>` (the scheme is case-insensitive), as sent."""
    value = _header(headers, b"authorization")
    if value is None:
        return None
    scheme, _, credentials = value.strip().partition(b" ")
    if scheme.lower() != b"bearer" or not credentials.strip():
        return None
    return credentials.strip()


def _header(headers: Sequence[tuple[bytes, bytes]], wanted: bytes) -> bytes | None:
    for name, value in headers:
        if name.lower() == wanted:
            return value
    return None


async def _send_error(send: Send, err: ApiError) -> None:
    body = json.dumps(err.body(), ensure_ascii=False).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in err.headers.items()]
    await send({"type": "http.response.start", "status": err.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class _Guard:
    """Bearer auth before anything is read, then the body read in full under the size limit."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        token: str | None,
        read_auth: bool,
        allow_unauthenticated: bool,
        max_body_bytes: int,
        telemetry: Telemetry,
        failures: AuthFailures,
        routes: Sequence[BaseRoute] = (),
    ) -> None:
        self.app = app
        self.failures = failures
        self.routes = routes
        self.token = token.encode("utf-8") if token else None
        self.read_auth = read_auth
        self.allow_unauthenticated = allow_unauthenticated
        self.max_body_bytes = max_body_bytes
        self.telemetry = telemetry

    def _auth_problem(self, headers: Sequence[tuple[bytes, bytes]]) -> ApiError | None:
        if self.token is None:
            if self.allow_unauthenticated:
                return None
            return ApiError(
                503,
                "auth_not_configured",
                "no API token is configured (api.token, api.token_env or api.token_file), so this call is "
                "refused; set one, or api.allow_unauthenticated: true on a trusted machine",
                "未配置 API 令牌（api.token、api.token_env 或 api.token_file），因此拒绝此调用；"
                "请配置令牌，或仅在可信环境中设置 api.allow_unauthenticated: true",
            )
        given = _bearer(headers)
        challenge = {"WWW-Authenticate": 'Bearer realm="trainmedic"'}
        if given is None:
            return ApiError(
                401,
                "unauthorized",
                "this call needs an `Authorization: Bearer <token>` header",
                "此调用需要 `Authorization: Bearer <令牌>` 请求头",
                headers=challenge,
            )
        if not hmac.compare_digest(given, self.token):
            return ApiError(
                401,
                "invalid_token",
                "the bearer token is not valid",
                "令牌无效",
                headers={"WWW-Authenticate": 'Bearer realm="trainmedic", error="invalid_token"'},
            )
        return None

    def _too_large(self) -> ApiError:
        return ApiError(
            413,
            "too_large",
            f"request body larger than {self.max_body_bytes} bytes (api.max_body_bytes)",
            f"请求体超过 {self.max_body_bytes} 字节上限（api.max_body_bytes）",
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.monotonic()
        status_seen: list[int] = []

        async def counting_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                status_seen.append(int(message["status"]))
            await send(message)

        try:
            await self._handle(scope, receive, counting_send)
        finally:
            template = self._template(scope)
            code = str(status_seen[0]) if status_seen else "none"
            method = str(scope.get("method", ""))
            method = method if method in KNOWN_METHODS else "other"
            self.telemetry.api_requests.labels(method, template, code).inc()
            log.debug("%s %s -> %s in %.1f ms", method, template, code, (time.monotonic() - started) * 1e3)

    def _template(self, scope: Scope) -> str:
        """The route's path template (a bounded label), also for calls refused before routing."""
        route = scope.get("route")
        if route is None:
            route = next((r for r in self.routes if r.matches(scope)[0] is Match.FULL), None)
        path = getattr(route, "path", None)
        return path if isinstance(path, str) else "unmatched"

    async def _handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        method = str(scope.get("method", "GET")).upper()
        path = str(scope.get("path", "/"))
        headers: list[tuple[bytes, bytes]] = list(scope.get("headers") or [])
        writes = method not in SAFE_METHODS
        console = path == CONSOLE_PREFIX or path.startswith(CONSOLE_PREFIX + "/")
        if not console and (writes or (self.read_auth and path not in OPEN_PATHS)):
            client = client_address(scope.get("client"))
            wait = self.failures.retry_after(client) if self.token is not None else None
            if wait is not None:
                await _send_error(send, throttled(wait))
                return
            problem = self._auth_problem(headers)
            if problem is not None:
                if problem.code == "invalid_token":
                    self.failures.failed(client)
                await _send_error(send, problem)
                return
        raw_length = _header(headers, b"content-length")
        if raw_length is not None:
            try:
                length = int(raw_length)
                if length < 0:
                    raise ValueError(length)
            except ValueError:
                await _send_error(
                    send,
                    ApiError(400, "bad_request", "invalid Content-Length header", "Content-Length 请求头无效"),
                )
                return
            if length > self.max_body_bytes:
                await _send_error(send, self._too_large())
                return
        if not writes:
            await self.app(scope, receive, send)
            return
        # Read the whole body now, counting as it streams (chunked bodies have no length up front).
        chunks: list[bytes] = []
        total = 0
        more = True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            total += len(chunk)
            if total > self.max_body_bytes:
                await _send_error(send, self._too_large())
                return
            chunks.append(chunk)
            more = bool(message.get("more_body", False))
        body = b"".join(chunks)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)
