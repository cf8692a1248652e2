"""The agent's HTTP API (FastAPI, served by uvicorn in the brain): probes, metrics, incidents, diagnose, alerts.

    GET  /healthz                                  liveness: the process answers (always cheap)
    GET  /readyz                                   readiness: 503 with the reasons until the agent is ready
    GET  /metrics                                  Prometheus exposition of the agent's own metrics
    GET  /api/v1/incidents?status=&limit=          recent incidents (newest first)
    GET  /api/v1/incidents/{id}                    one incident with its timeline (a unique id prefix works)
    GET  /api/v1/incidents/{id}/report?format=md|html&lang=en|zh
    POST /api/v1/incidents/{id}/approve|reject     {by, comment}: a person's decision on a pending plan
    POST /api/v1/diagnose                          uploaded logs -> the JSON of `trainmedic diagnose --format json`
    POST /api/v1/alertmanager                      Alertmanager webhook (payload version 4) -> input events
    /console/...                                   the web console (agent/console; not in the OpenAPI schema)

Why it is built this way:

* Every state-changing call (any method but GET/HEAD/OPTIONS) needs `Authorization: Bearer <token>`,
  compared in constant time. With no token configured those calls are refused (503 and a message
  saying which setting to set), never silently open; `allow_unauthenticated: true` is the explicit
  opt-out for a laptop. `read_auth` protects the reads too (the probes stay open for the kubelet).
  The check runs in an ASGI middleware before any body is read, so no route can forget it and an
  anonymous client cannot make the agent buffer a large body.
* Bodies are bounded while they are read: a Content-Length over `max_body_bytes` is refused at once,
  and a chunked body is counted as it streams in and refused (413) when it crosses the limit. Gzip
  uploads are inflated with a bound as well.
* `/api/v1/diagnose` runs the same core as the CLI (`detectors.diagnose.make_engine`, the engine's
  streamed scan, `detectors.correlator.correlate`) and answers with `Diagnosis.contract_dict`, so a
  log gives the same JSON whether it is uploaded or passed to `trainmedic diagnose --logs`.
* Alertmanager notifications become the input events the brain already understands: each firing alert
  is a `K8sEvent` (object kind `Alert`, reason = alertname, message = summary plus the key labels),
  and an alert that names a device metric of udal's vocabulary (an Xid code from dcgm-exporter's `xid`
  / `err_code` labels, or explicit `trainmedic_metric` / `trainmedic_value` labels) is also a
  `MetricBatch`. The metric rules fire on edges (a first sample is a baseline); an alert *is* an edge
  (Alertmanager notifies on the transition), so it is sent as the pair (healthy value, alerting value).
  Event ids derive from the alert's fingerprint and start time: Alertmanager re-sends a group whenever
  it changes, and the brain de-duplicates by id. 5xx when the events cannot be handed on, so
  Alertmanager retries; resolved alerts are counted and dropped (the fault they report is history), and
  trainmedic's own incident alerts (alertname `Trainmedic...`) are ignored, so a route that sends them
  back here cannot make a loop.
* `serve` runs uvicorn on a socket bound here (port 0: the port is read back from
  `app.state.server`), without uvicorn's signal handlers (the agent owns SIGTERM), and lets requests in
  flight finish when `stop` is set. A port that cannot be bound is an `ApiBindError`, not an exit.
* Errors are JSON: `{"error": <English>, "error_zh": <Chinese>, "code": <machine code>, "detail": ...}`.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import io
import json
import logging
import math
import socket
import threading
import time
import zlib
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, Self

import uvicorn
from fastapi import Body, Depends, FastAPI, Query, Request, Security
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.security import HTTPBearer
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from trainmedic.agent.authlimit import AuthFailures, client_address
from trainmedic.agent.config import ApiSettings, secret_setting
from trainmedic.agent.jobindex import JobIndex
from trainmedic.agent.store import Incident, IncidentStatus, IncidentStore, StoreError
from trainmedic.agent.telemetry import Telemetry
from trainmedic.agent.watchers.metrics import device_of, node_of
from trainmedic.detectors.diagnose import attribute, correlate_placed, make_engine
from trainmedic.detectors.engine import Engine
from trainmedic.detectors.layout import Layout
from trainmedic.detectors.metric_rules import RULES_BY_METRIC, Kind
from trainmedic.errors import InputError, RuleLoadError, TrainmedicError
from trainmedic.events import Event, K8sEvent, MetricBatch, MetricSample, Topic, event_key
from trainmedic.models import Chip, Diagnosis, Finding
from trainmedic.udal import METRIC_VOCABULARY
from trainmedic.udal.registry import is_chip, plugin_of_exporter_labels

log = logging.getLogger("trainmedic.api")

Ingest = Callable[[list[Event]], Awaitable[None]]
Ready = Callable[[], tuple[bool, dict[str, Any]]]
# (incident_id, fmt "md" | "html", lang "en" | "zh") -> the rendered report
Render = Callable[[str, str, str], str]

API_PREFIX = "/api/v1"
MAX_LIST_LIMIT = 1000
MAX_ALERTS = 1000
MAX_NAME = 255
# Uploaded gzip logs may inflate to this many times the body limit, in total.
INFLATE_FACTOR = 4
DEDUP_SIZE = 10_000
# Alerts trainmedic itself pushes (alertname TrainmedicIncident, ...) are never input.
OWN_ALERT_PREFIX = "Trainmedic"
# Probes stay open (kubelet, load balancers); the schema and docs say nothing secret.
OPEN_PATHS = frozenset({"/healthz", "/readyz", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"})
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
# The web console (agent/console) checks its own auth: a session cookie with a CSRF token on every
# form, or this bearer token. Body limits still apply to it here.
CONSOLE_PREFIX = "/console"
# Metric label values stay bounded whatever method a client invents.
KNOWN_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
# Labels that carry the alert's place and identity, copied into the event message.
KEY_LABELS = (
    "severity",
    "namespace",
    "pod",
    "container",
    "node",
    "instance",
    "Hostname",
    "gpu",
    "device",
    "UUID",
    "modelName",
    "xid",
    "err_code",
    "err_msg",
)
MARKDOWN = "text/markdown; charset=utf-8"
HTML = "text/html; charset=utf-8"


# ------------------------------------------------------------------------------------------------
# Errors


class ApiError(Exception):
    """An answer other than success, with its status, machine code and message in both languages."""

    def __init__(
        self,
        status: int,
        code: str,
        en: str,
        zh: str,
        *,
        detail: Any = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(en)
        self.status = status
        self.code = code
        self.en = en
        self.zh = zh
        self.detail = detail
        self.headers = dict(headers or {})

    def body(self) -> dict[str, Any]:
        out: dict[str, Any] = {"error": self.en, "error_zh": self.zh, "code": self.code}
        if self.detail is not None:
            out["detail"] = self.detail
        return out

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


# Generic texts for the statuses Starlette raises itself (unknown route, wrong method, bad form).
_STATUS_TEXT: dict[int, tuple[str, str, str]] = {
    400: ("bad_request", "the request cannot be used", "请求无法处理"),
    404: ("not_found", "no such resource", "资源不存在"),
    405: ("method_not_allowed", "method not allowed on this resource", "该资源不支持此方法"),
    409: ("conflict", "the incident is not in a state that allows this", "事件当前状态不允许此操作"),
    413: ("too_large", "request body too large", "请求体过大"),
    415: ("unsupported_media_type", "unsupported content type", "不支持的内容类型"),
    422: ("invalid_request", "the request does not match the API schema", "请求不符合 API 定义"),
    401: ("unauthorized", "a valid bearer token is required", "需要有效的令牌"),
    429: ("too_many_failures", "too many wrong tokens from this address (Retry-After)", "该地址错误令牌过多"),
    500: ("internal", "internal error (logged by the agent)", "内部错误（已记录在代理日志中）"),
    503: ("unavailable", "not available in this agent, or not ready", "该代理不提供此功能或尚未就绪"),
}


def _known_query(request: Request) -> None:
    """Refuse a query parameter the API route does not declare (a typo such as `?stauts=open` would
    otherwise be ignored silently and answer with everything)."""
    if not request.url.path.startswith(API_PREFIX):
        return
    route = request.scope.get("route")
    dependant = getattr(route, "dependant", None)
    if dependant is None:
        return
    # Declared parameters, and those a route reads itself and documents in its `openapi_extra`.
    extra = getattr(route, "openapi_extra", None) or {}
    known: set[str] = {p["name"] for p in extra.get("parameters", ()) if p.get("in") == "query" and "name" in p}
    stack = [dependant]
    while stack:
        d = stack.pop()
        known.update(p.alias for p in d.query_params)
        stack.extend(d.dependencies)
    unknown = sorted({k for k in request.query_params if k not in known})
    if unknown:
        raise ApiError(
            422,
            "invalid_request",
            "the request does not match the API schema",
            "请求不符合 API 定义",
            detail=[
                {"loc": ["query", k[:100]], "msg": "unknown query parameter", "type": "extra_forbidden"}
                for k in unknown[:20]
            ],
        )


def _not_found(incident_id: str) -> ApiError:
    return ApiError(404, "not_found", f"no incident {incident_id!r}", f"不存在事件 {incident_id!r}")


def _no_store() -> ApiError:
    return ApiError(
        503,
        "no_store",
        "the incident store is not available in this agent (remediate.store)",
        "该代理未启用事件存储（remediate.store）",
    )


# ------------------------------------------------------------------------------------------------
# Models (the OpenAPI schema)


class ErrorBody(BaseModel):
    error: str = Field(description="What went wrong (English).")
    error_zh: str = Field(description="What went wrong (Chinese).")
    code: str = Field(description="Machine-readable reason.")
    detail: Any = None


class Health(BaseModel):
    status: Literal["ok"] = "ok"


class Readiness(BaseModel):
    ready: bool
    detail: dict[str, Any] = Field(default_factory=dict)


class Decision(BaseModel):
    """A person's decision on a remediation plan awaiting approval."""

    model_config = ConfigDict(extra="forbid", strict=True)

    by: str = Field(min_length=1, max_length=200, description="Who decides (recorded in the timeline).")
    comment: str = Field("", max_length=4000, description="Why (recorded in the timeline).")


class ActionOut(BaseModel):
    seq: int
    name: str
    state: str
    params: dict[str, Any]
    result: dict[str, Any] | None = None
    started: float | None = None
    finished: float | None = None


class IncidentOut(BaseModel):
    id: str
    key: str
    status: IncidentStatus
    namespace: str | None = None
    job: str | None = None
    job_kind: str | None = None
    node: str | None = None
    fault_class: str | None = None
    code: str | None = None
    chip: str | None = None
    mode: str | None = None
    revision: int
    created: float
    updated: float
    scene_dir: str | None = None
    plan: dict[str, Any] | None = None
    actions: list[ActionOut]
    approval: dict[str, Any] | None = None
    diagnosis: dict[str, Any]


class TimelineEntry(BaseModel):
    t: float
    kind: str
    detail: dict[str, Any]


class IncidentDetail(IncidentOut):
    timeline: list[TimelineEntry]


class IncidentList(BaseModel):
    count: int
    incidents: list[IncidentOut]


class PlaceOut(BaseModel):
    place: str
    node: str | None = None
    device: str | None = None
    rank: int | None = None


class RootCauseOut(BaseModel):
    fault_class: str
    chip: str
    code: str
    vendor_action: str | None = None
    action: str | None = None
    node: str | None = None
    device: str | None = None
    rank: int | None = None
    summary: str
    hint: str | None = None
    # Communication faults: the wait chain ending at the root, or the candidates when it is undecided.
    chain: list[str] = []
    candidates: list[str] = []
    # The same places with their node, device and rank where the logs say them.
    chain_places: list[PlaceOut] = []
    candidate_places: list[PlaceOut] = []
    # The vendor's possible causes and ordered steps for the code, verbatim from its catalog.
    vendor_causes: list[str] = []
    vendor_steps: list[str] = []


class FindingOut(BaseModel):
    rule_id: str
    fault_class: str
    chip: str
    code: str
    source: str
    line_no: int | None = None
    text: str
    file: str | None = None
    count: int
    node: str | None = None
    device: str | None = None
    rank: int | None = None


class DiagnoseResult(BaseModel):
    """The JSON of `trainmedic diagnose --format json` (docs/contracts.md)."""

    root_cause: RootCauseOut | None
    findings: list[FindingOut]


class DiagnoseJson(BaseModel):
    """Logs as text: `{"logs": {"train.log": "...", "rank1.log": "..."}, "lang": "zh"}`."""

    model_config = ConfigDict(extra="forbid", strict=True)

    logs: dict[str, str] = Field(min_length=1, description="Log name -> its text.")
    lang: Literal["en", "zh"] = "en"


class AlertIn(BaseModel):
    """One alert of an Alertmanager notification."""

    model_config = ConfigDict(extra="ignore", strict=True)

    status: Literal["firing", "resolved"]
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    startsAt: str = ""
    endsAt: str = ""
    generatorURL: str = ""
    fingerprint: str = ""


class AlertmanagerWebhook(BaseModel):
    """Alertmanager's webhook notification, payload version 4 (prometheus.io, webhook_config)."""

    model_config = ConfigDict(extra="ignore", strict=True)

    version: Literal["4"]
    groupKey: str = ""
    truncatedAlerts: int = 0
    status: Literal["firing", "resolved"]
    receiver: str = ""
    groupLabels: dict[str, str] = Field(default_factory=dict)
    commonLabels: dict[str, str] = Field(default_factory=dict)
    commonAnnotations: dict[str, str] = Field(default_factory=dict)
    externalURL: str = ""
    alerts: list[AlertIn] = Field(max_length=MAX_ALERTS)


class AlertsAccepted(BaseModel):
    received: int = Field(description="Alerts in the notification.")
    firing: int
    resolved: int
    duplicates: int = Field(description="Firing alerts already handed on (Alertmanager re-sends groups).")
    own: int = Field(0, description="trainmedic's own incident alerts routed back here (ignored: no loops).")
    events: int = Field(description="Input events handed to the brain.")


def _responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    # Wherever a token is checked, an address that sent too many wrong ones is refused (429).
    codes = (*codes, 429) if 401 in codes else codes
    return {c: {"model": ErrorBody, "description": _STATUS_TEXT.get(c, ("", "error", ""))[1]} for c in codes}


# ------------------------------------------------------------------------------------------------
# Auth and body limits (ASGI middleware)


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


# ------------------------------------------------------------------------------------------------
# Diagnose: the CLI's core over uploaded texts


def _inflate(data: bytes, limit: int, name: str) -> bytes:
    """Gunzip `data` (every member, as gzip.open reads a concatenation) into at most `limit` bytes."""
    too_large = ApiError(
        413,
        "too_large",
        f"{name}: the uploaded logs inflate to more than {INFLATE_FACTOR} x api.max_body_bytes",
        f"{name}：上传的日志解压后超过 api.max_body_bytes 的 {INFLATE_FACTOR} 倍",
    )
    out: list[bytes] = []
    size = 0
    rest = data
    try:
        while rest:
            if size >= limit:
                raise too_large
            d = zlib.decompressobj(16 + zlib.MAX_WBITS)
            # max_length > 0 always (0 would mean "no limit").
            chunk = d.decompress(rest, limit - size + 1)
            size += len(chunk)
            out.append(chunk)
            if size > limit or d.unconsumed_tail:
                raise too_large
            if not d.eof:
                raise zlib.error("truncated gzip stream")
            rest = d.unused_data.lstrip(b"\x00")
    except zlib.error as e:
        raise ApiError(
            400, "bad_gzip", f"{name}: not a readable gzip file: {e}", f"{name}：不是可读取的 gzip 文件：{e}"
        ) from e
    return b"".join(out)


def diagnose_blobs(blobs: Sequence[tuple[str, bytes]], engine: Engine) -> Diagnosis:
    """Classify named texts and correlate all findings as one job: what `diagnose_paths` does for files
    (the engine's streamed scan, then `correlate`), for texts that arrived over the network."""
    findings: list[Finding] = []
    ranks: dict[int, str | None] = {}
    lines = 0
    layout = Layout([name for name, _ in blobs], "", blobs)
    for name, data in blobs:
        found, n = engine.scan_stream(io.BytesIO(data), file=name)
        findings.extend(attribute(found, name, "", ranks, layout))
        lines += n
    return correlate_placed(findings, lines, ranks, [layout])


def _name(raw: str | None, index: int) -> str:
    name = (raw or "").strip().replace("\x00", "")[:MAX_NAME]
    return name or f"log-{index + 1}"


# ------------------------------------------------------------------------------------------------
# Alertmanager webhook -> input events


def _alert_identity(alert: AlertIn) -> str:
    ident = alert.fingerprint or json.dumps(alert.labels, sort_keys=True)
    return f"{ident}@{alert.startsAt}"


def _event_id(identity: str, kind: str) -> str:
    return hashlib.sha256(f"alertmanager\x00{identity}\x00{kind}".encode()).hexdigest()[:32]


def _alert_message(alert: AlertIn, common: Mapping[str, str]) -> str:
    ann = {**common, **alert.annotations}
    text = ann.get("summary") or ann.get("description") or ann.get("message") or ""
    if ann.get("description") and ann.get("description") != text:
        text = f"{text} - {ann['description']}" if text else ann["description"]
    keys = " ".join(f"{k}={alert.labels[k]}" for k in KEY_LABELS if alert.labels.get(k))
    return " ".join(p for p in (text.strip(), f"[{keys}]" if keys else "") if p)


def _number(raw: str | None) -> float | None:
    if raw is None:
        return None
    try:
        value = float(raw.strip())
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _chip(labels: Mapping[str, str], has_xid: bool) -> str:
    """The alert's `chip` label when it names a chip plugin; else an Xid (dcgm-exporter) is NVIDIA's;
    else the plugin whose exporter's labels these are (`exporter_labels_match`); else generic."""
    chip = labels.get("chip", "").lower()
    if is_chip(chip):
        return chip
    if has_xid:
        return Chip.NVIDIA.value
    plugin = plugin_of_exporter_labels(labels)
    return plugin.chip.value if plugin is not None else Chip.GENERIC.value


def _xid(alert: AlertIn) -> int | None:
    """The Xid an alert reports: dcgm-exporter's `xid` label (DCGM_EXP_XID_ERRORS_COUNT), or its
    `err_code` label (DCGM_FI_DEV_XID_ERRORS) on an alert about Xids or an NVIDIA GPU."""
    labels = alert.labels
    raw = labels.get("xid") or labels.get("xid_code")
    if raw is None and labels.get("err_code"):
        name = labels.get("alertname", "").lower()
        if "xid" in name or "err_msg" in labels or labels.get("UUID", "").startswith("GPU-"):
            raw = labels["err_code"]
    value = _number(raw)
    if value is None or value <= 0 or not value.is_integer():
        return None
    return int(value)


def _baseline(metric: str, value: float) -> float | None:
    """The healthy value before the alerting one, for the metric rule that watches `metric`."""
    rule = RULES_BY_METRIC.get(metric)
    if rule is None:
        return None
    if rule.kind is Kind.DOWN:
        return 1.0
    if rule.kind is Kind.RISING:
        return value - 1.0
    return 0.0


def _metric_batch(alert: AlertIn, node: str) -> MetricBatch | None:
    labels = alert.labels
    xid = _xid(alert)
    if xid is not None:
        metric, value = "xid_errors", float(xid)
    else:
        metric = labels.get("trainmedic_metric", "")
        raw = _number(labels.get("trainmedic_value") or alert.annotations.get("value"))
        if metric not in METRIC_VOCABULARY or raw is None:
            return None
        value = raw
    device = device_of(labels)
    samples = []
    baseline = _baseline(metric, value)
    if baseline is not None and baseline != value:
        samples.append(MetricSample(name=metric, value=baseline, device=device, vendor_name="alertmanager"))
    samples.append(MetricSample(name=metric, value=value, device=device, vendor_name="alertmanager"))
    return MetricBatch(node=node, chip=_chip(labels, xid is not None), origin="alertmanager", samples=samples)


@dataclass
class AlertConversion:
    events: list[Event] = field(default_factory=list)
    firing: int = 0
    resolved: int = 0
    duplicates: int = 0
    own: int = 0
    # Identities of the firing alerts converted (remembered once the events were handed on).
    identities: list[str] = field(default_factory=list)


def alert_events(
    payload: AlertmanagerWebhook,
    *,
    producer: str = "api",
    now: float | None = None,
    seen: Callable[[str], bool] | None = None,
) -> AlertConversion:
    """The input events for the firing alerts of one notification (see the module docstring)."""
    at = time.time() if now is None else now
    out = AlertConversion()
    for alert in payload.alerts:
        if alert.status != "firing":
            out.resolved += 1
            continue
        out.firing += 1
        labels = alert.labels
        alertname = labels.get("alertname") or payload.commonLabels.get("alertname") or "Alert"
        if alertname.startswith(OWN_ALERT_PREFIX):
            # trainmedic's own incident alerts (its `alertmanager` sink) routed back here: not new input.
            out.own += 1
            continue
        identity = _alert_identity(alert)
        if seen is not None and seen(identity):
            out.duplicates += 1
            continue
        out.identities.append(identity)
        node = node_of(labels)
        k8s = K8sEvent(
            namespace=labels.get("namespace") or None,
            type="Warning",
            reason=alertname,
            message=_alert_message(alert, payload.commonAnnotations),
            object_kind="Alert",
            object_name=labels.get("pod") or node or alertname,
            node=node,
            uid=alert.fingerprint or None,
        )
        out.events.append(
            Event(id=_event_id(identity, "k8s"), time=at, producer=producer, key=event_key(k8s), payload=k8s)
        )
        if node is not None:
            batch = _metric_batch(alert, node)
            if batch is not None:
                out.events.append(
                    Event(
                        id=_event_id(identity, "metric"),
                        time=at,
                        producer=producer,
                        key=event_key(batch),
                        payload=batch,
                    )
                )
    return out


def topic_of(event: Event) -> Topic:
    """The input topic an alert event goes to."""
    return Topic.METRICS if isinstance(event.payload, MetricBatch) else Topic.K8S


def attach_jobs(events: Sequence[Event], job_index: JobIndex) -> list[Event]:
    """Key alert events by job where the agent knows it, as the watchers do: an alert about a pod
    belongs to the pod's job; a node's metric batch is copied to every job on the node (same id)."""
    out: list[Event] = []
    for event in events:
        p = event.payload
        if isinstance(p, K8sEvent) and p.namespace and p.object_name:
            info = job_index.pod(p.namespace, p.object_name)
            if info is not None and info.job is not None:
                job = info.job
                out.append(event.model_copy(update={"key": job.key, "payload": p.model_copy(update={"job": job})}))
                continue
        if isinstance(p, MetricBatch):
            jobs = job_index.jobs_on_node(p.node)
            if jobs:
                out.extend(
                    event.model_copy(update={"key": j.key, "payload": p.model_copy(update={"job": j})}) for j in jobs
                )
                continue
        out.append(event)
    return out


# ------------------------------------------------------------------------------------------------
# The application


@dataclass
class _State:
    settings: ApiSettings
    store: IncidentStore | None
    telemetry: Telemetry
    ingest: Ingest | None
    ready: Ready | None
    render: Render | None
    engine: Engine | None
    rule_dirs: tuple[Path, ...]
    fast: bool | None
    producer: str
    # Hyperscan's scratch space is per engine and not thread-safe: scans of one engine take turns.
    # (Locks of the threading kind: the scans run in worker threads, and a test client may drive
    # the app from more than one event loop.)
    engine_lock: threading.Lock = field(default_factory=threading.Lock)
    seen_alerts: OrderedDict[str, None] = field(default_factory=OrderedDict)

    def diagnose(self, blobs: Sequence[tuple[str, bytes]]) -> Diagnosis:
        """Build the engine on first use, then scan (blocking: run in a worker thread)."""
        with self.engine_lock:
            if self.engine is None:
                self.engine = make_engine(self.rule_dirs, fast=self.fast)
            return diagnose_blobs(blobs, self.engine)

    def need_store(self) -> IncidentStore:
        if self.store is None:
            raise _no_store()
        return self.store


def _served(incident: Incident) -> dict[str, Any]:
    """An incident as the API serves it: action parameters pass the scene's redaction once more (a
    journal written before bodies were kept apart may still hold a workload's env values)."""
    from trainmedic.remediations.scene import redact_object

    out = incident.as_dict()
    out["actions"] = [dict(a, params=redact_object(a.get("params") or {})) for a in out.get("actions") or []]
    return out


def _incident_detail(store: IncidentStore, incident_id: str) -> dict[str, Any] | None:
    incident = store.find(incident_id)
    if incident is None:
        return None
    return dict(_served(incident), timeline=store.timeline(incident.id))


def create_app(
    *,
    store: IncidentStore | None,
    telemetry: Telemetry,
    settings: ApiSettings,
    ingest: Ingest | None = None,
    ready: Ready | None = None,
    render: Render | None = None,
    engine: Engine | None = None,
    rule_dirs: Sequence[str | Path] = (),
    fast: bool | None = None,
    producer: str = "api",
    env: Mapping[str, str] | None = None,
    release_node: Callable[[str, str], Awaitable[bool]] | None = None,
) -> FastAPI:
    """The API over an incident store (None: the incident routes answer 503), the agent's telemetry,
    `ingest` (hands alert events to the brain; None: the Alertmanager receiver answers 503), `ready`
    (None: ready once serving), `render` (None: reports answer 503) and the diagnose engine (`engine`,
    or built on first use from the shipped rules plus `rule_dirs`, as `trainmedic diagnose` builds it;
    an engine given here is this app's alone: its scans take turns, nothing else may scan with it).
    With `api.console`, the web console is served under /console (agent/console); `release_node`
    (node, incident id) is what its release button calls (None: the console says how to do it by hand)."""
    state = _State(
        settings=settings,
        store=store,
        telemetry=telemetry,
        ingest=ingest,
        ready=ready,
        render=render,
        engine=engine,
        rule_dirs=tuple(Path(d) for d in rule_dirs),
        fast=fast,
        producer=producer,
    )
    app = FastAPI(
        title="trainmedic",
        version="1",
        description="Fault diagnosis and self-healing for AI training jobs: incidents, reports, approvals, "
        "log diagnosis and the Alertmanager receiver. State-changing calls need `Authorization: Bearer <token>`.",
        dependencies=[Depends(_known_query)],
    )
    app.state.trainmedic = state
    bearer = HTTPBearer(auto_error=False, description="api.token (api.token_env / api.token_file)")
    token = resolve_token(settings, env)
    if token is None and not settings.allow_unauthenticated:
        log.warning("no API token configured: approve, reject, diagnose and the alert receiver are refused")
    failures = AuthFailures(limit=settings.auth_failure_limit, window_s=settings.auth_failure_window_s)
    telemetry.refreshers.append(lambda: telemetry.state_entries.labels("auth_failures").set(len(failures)))
    app.add_middleware(
        _Guard,
        token=token,
        read_auth=settings.read_auth,
        allow_unauthenticated=settings.allow_unauthenticated,
        max_body_bytes=settings.max_body_bytes,
        telemetry=telemetry,
        failures=failures,
        routes=app.router.routes,
    )

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code, en, zh = _STATUS_TEXT.get(exc.status_code, ("error", "request failed", "请求失败"))
        detail = exc.detail if isinstance(exc.detail, str) and exc.detail not in (en,) else None
        return ApiError(exc.status_code, code, en, zh, detail=detail, headers=exc.headers).response()

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [
            {"loc": [str(x) for x in e.get("loc", ())], "msg": str(e.get("msg", "")), "type": str(e.get("type", ""))}
            for e in exc.errors()
        ]
        return ApiError(
            422, "invalid_request", "the request does not match the API schema", "请求不符合 API 定义", detail=errors
        ).response()

    @app.exception_handler(Exception)
    async def _internal_error(request: Request, exc: Exception) -> JSONResponse:
        log.error("API %s %s failed", request.method, request.url.path, exc_info=exc)
        return ApiError(
            500, "internal", "internal error (logged by the agent)", "内部错误（已记录在代理日志中）"
        ).response()

    # -- probes and metrics ----------------------------------------------------------------------

    @app.get("/healthz", response_model=Health, tags=["probes"], summary="Liveness")
    async def healthz() -> Health:
        return Health()

    @app.get("/readyz", response_model=Readiness, tags=["probes"], summary="Readiness", responses=_responses(503))
    async def readyz() -> Readiness | JSONResponse:
        if state.ready is None:
            return Readiness(ready=True)
        try:
            ok, detail = state.ready()
        except Exception as e:  # a readiness check that fails is a "not ready", with its reason
            log.exception("readiness check failed")
            ok, detail = False, {"error": f"{type(e).__name__}: {e}"}
        if ok:
            return Readiness(ready=True, detail=detail)
        return ApiError(503, "not_ready", "the agent is not ready yet", "代理尚未就绪", detail=detail).response()

    @app.get(
        "/metrics",
        tags=["probes"],
        summary="Prometheus metrics of the agent",
        response_class=Response,
        responses={
            200: {"content": {"text/plain": {"schema": {"type": "string"}}}, "description": "exposition"},
            **_responses(401, 503),
        },
        dependencies=[Security(bearer)] if settings.read_auth else [],
    )
    async def metrics() -> Response:
        return Response(telemetry.exposition(), media_type=CONTENT_TYPE_LATEST)

    # -- incidents -------------------------------------------------------------------------------

    read_deps = [Security(bearer)] if settings.read_auth else []
    read_errors = (401, 503) if settings.read_auth else (503,)

    @app.get(
        f"{API_PREFIX}/incidents",
        response_model=IncidentList,
        tags=["incidents"],
        summary="Recent incidents, newest first",
        responses=_responses(422, *read_errors),
        dependencies=read_deps,
    )
    async def list_incidents(
        status: IncidentStatus | None = Query(None, description="Only incidents with this status."),  # noqa: B008
        limit: int = Query(100, ge=1, le=MAX_LIST_LIMIT),
    ) -> IncidentList:
        s = state.need_store()
        incidents = await asyncio.to_thread(s.recent, status=status.value if status else None, limit=limit)
        return IncidentList(count=len(incidents), incidents=[IncidentOut.model_validate(_served(i)) for i in incidents])

    @app.get(
        f"{API_PREFIX}/incidents/{{incident_id}}",
        response_model=IncidentDetail,
        tags=["incidents"],
        summary="One incident with its timeline (a unique prefix of at least 4 characters works)",
        responses=_responses(404, 422, *read_errors),
        dependencies=read_deps,
    )
    async def get_incident(incident_id: str) -> IncidentDetail:
        s = state.need_store()
        data = await asyncio.to_thread(_incident_detail, s, incident_id)
        if data is None:
            raise _not_found(incident_id)
        return IncidentDetail.model_validate(data)

    @app.get(
        f"{API_PREFIX}/incidents/{{incident_id}}/report",
        tags=["incidents"],
        summary="The incident's report (Markdown or a self-contained HTML page)",
        response_class=Response,
        responses={
            200: {
                "description": "the report",
                "content": {
                    "text/markdown": {"schema": {"type": "string"}},
                    "text/html": {"schema": {"type": "string"}},
                },
            },
            **_responses(404, 422, 500, *read_errors),
        },
        dependencies=read_deps,
    )
    async def get_report(
        incident_id: str,
        fmt: Literal["md", "html"] = Query("md", alias="format"),
        lang: Literal["en", "zh"] = Query("en"),
    ) -> Response:
        s = state.need_store()
        incident = await asyncio.to_thread(s.find, incident_id)
        if incident is None:
            raise _not_found(incident_id)
        if state.render is None:
            raise ApiError(503, "no_reports", "reports are not available in this agent", "该代理未启用报告生成功能")
        try:
            text = await asyncio.to_thread(state.render, incident.id, fmt, lang)
        except StoreError as e:
            raise _not_found(incident_id) from e
        except Exception as e:  # a template or a scene file that cannot be read: say so, keep serving
            log.exception("report of incident %s (%s, %s) failed", incident.id, fmt, lang)
            first = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise ApiError(
                500,
                "report_failed",
                f"the report could not be rendered: {first}",
                f"报告生成失败：{first}",
            ) from e
        return Response(text, media_type=HTML if fmt == "html" else MARKDOWN)

    async def decide(incident_id: str, decision: Decision, approve: bool) -> IncidentDetail:
        s = state.need_store()
        incident = await asyncio.to_thread(s.find, incident_id)
        if incident is None:
            raise _not_found(incident_id)
        try:
            await asyncio.to_thread(s.approve, incident.id, by=decision.by, approve=approve, comment=decision.comment)
        except StoreError as e:
            current = await asyncio.to_thread(s.find, incident.id)
            status = current.status.value if current is not None else incident.status.value
            raise ApiError(
                409,
                "not_awaiting_approval",
                f"incident {incident.id} is {status}, not awaiting approval",
                f"事件 {incident.id} 当前状态为 {status}，不在等待审批",
                detail={"status": status},
            ) from e
        data = await asyncio.to_thread(_incident_detail, s, incident.id)
        if data is None:
            raise _not_found(incident_id)
        return IncidentDetail.model_validate(data)

    write_errors = (400, 401, 404, 409, 413, 422, 503)

    @app.post(
        f"{API_PREFIX}/incidents/{{incident_id}}/approve",
        response_model=IncidentDetail,
        tags=["incidents"],
        summary="Approve the remediation plan awaiting approval",
        responses=_responses(*write_errors),
        dependencies=[Security(bearer)],
    )
    async def approve(incident_id: str, decision: Decision = Body(...)) -> IncidentDetail:  # noqa: B008
        return await decide(incident_id, decision, True)

    @app.post(
        f"{API_PREFIX}/incidents/{{incident_id}}/reject",
        response_model=IncidentDetail,
        tags=["incidents"],
        summary="Reject the remediation plan awaiting approval (nothing is changed)",
        responses=_responses(*write_errors),
        dependencies=[Security(bearer)],
    )
    async def reject(incident_id: str, decision: Decision = Body(...)) -> IncidentDetail:  # noqa: B008
        return await decide(incident_id, decision, False)

    # -- diagnose --------------------------------------------------------------------------------

    json_schema = DiagnoseJson.model_json_schema()
    json_schema["properties"]["logs"]["maxProperties"] = settings.max_files

    @app.post(
        f"{API_PREFIX}/diagnose",
        response_model=DiagnoseResult,
        tags=["diagnose"],
        summary="Diagnose uploaded logs (the JSON of `trainmedic diagnose --format json`)",
        responses=_responses(400, 401, 413, 415, 422, 503),
        dependencies=[Security(bearer)],
        openapi_extra={
            "parameters": [
                {
                    "name": "lang",
                    "in": "query",
                    "required": False,
                    "description": "Language of the summaries (also a form field or JSON key).",
                    "schema": {"type": "string", "enum": ["en", "zh"]},
                }
            ],
            "requestBody": {
                "required": True,
                "content": {
                    "multipart/form-data": {
                        "schema": {
                            "type": "object",
                            "properties": {
                                "logs": {
                                    "type": "array",
                                    "items": {"type": "string", "format": "binary"},
                                    "minItems": 1,
                                    "maxItems": settings.max_files,
                                },
                                "lang": {"type": "string", "enum": ["en", "zh"]},
                            },
                            "required": ["logs"],
                            "additionalProperties": False,
                        }
                    },
                    "application/json": {"schema": json_schema},
                },
            },
        },
    )
    async def diagnose(request: Request) -> DiagnoseResult:
        blobs, lang = await _read_logs(request, settings)
        try:
            diagnosis = await asyncio.to_thread(state.diagnose, blobs)
        except InputError as e:
            raise ApiError(400, "unusable_input", str(e), f"输入无法使用：{e}") from e
        except (RuleLoadError, RuntimeError) as e:  # detect.rule_dirs broken, or the matcher unavailable
            log.error("diagnose: the rules cannot be loaded: %s", e)
            raise ApiError(
                503, "rules_unavailable", f"the rules cannot be loaded: {e}", f"检测规则无法加载：{e}"
            ) from e
        return DiagnoseResult.model_validate(diagnosis.contract_dict(lang))

    # -- Alertmanager receiver -------------------------------------------------------------------

    @app.post(
        f"{API_PREFIX}/alertmanager",
        response_model=AlertsAccepted,
        tags=["alerts"],
        summary="Alertmanager webhook receiver (payload version 4): firing alerts become input events",
        responses=_responses(400, 401, 413, 422, 503),
        dependencies=[Security(bearer)],
    )
    async def alertmanager(payload: AlertmanagerWebhook) -> AlertsAccepted:
        if state.ingest is None:
            raise ApiError(
                503,
                "no_ingest",
                "this agent does not take alerts (no brain in this process)",
                "该代理不接收告警（本进程未运行分析组件）",
            )
        conv = alert_events(payload, producer=state.producer, seen=lambda i: i in state.seen_alerts)
        for a in payload.alerts:
            telemetry.alerts_in.labels(a.status).inc()
        if conv.events:
            try:
                await state.ingest(conv.events)
            except Exception as e:  # the bus refused: Alertmanager retries on 5xx
                log.warning("alert events could not be handed on: %s", e)
                raise ApiError(
                    503,
                    "ingest_failed",
                    f"the alerts could not be handed to the brain: {e}",
                    f"告警未能交给分析组件：{e}",
                ) from e
        for identity in conv.identities:
            state.seen_alerts[identity] = None
        while len(state.seen_alerts) > DEDUP_SIZE:
            state.seen_alerts.popitem(last=False)
        return AlertsAccepted(
            received=len(payload.alerts),
            firing=conv.firing,
            resolved=conv.resolved,
            duplicates=conv.duplicates,
            own=conv.own,
            events=len(conv.events),
        )

    if settings.console:
        from trainmedic.agent.console import mount_console

        mount_console(
            app,
            store=store,
            settings=settings,
            token=token,
            render=render,
            release=release_node,
            env=env,
            failures=failures,
        )
    return app


async def _read_logs(request: Request, settings: ApiSettings) -> tuple[list[tuple[str, bytes]], str]:
    """The uploaded logs (multipart file parts, or JSON {"logs": {name: text}}) and the language."""
    ctype = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    inflate_limit = settings.max_body_bytes * INFLATE_FACTOR
    blobs: list[tuple[str, bytes]] = []
    lang = request.query_params.get("lang", "en")
    if lang not in ("en", "zh"):
        raise ApiError(
            400,
            "bad_request",
            f"lang must be en or zh, not {lang[:20]!r}",
            f"lang 只能是 en 或 zh，而不是 {lang[:20]!r}",
        )
    if ctype == "application/json":
        raw = await request.body()
        try:
            parsed = DiagnoseJson.model_validate_json(raw)
        except ValidationError as e:
            first = e.errors()[0]
            where = ".".join(str(x) for x in first.get("loc", ())) or "body"
            raise ApiError(
                400,
                "bad_request",
                f"the JSON body is not usable: {where}: {first.get('msg', 'invalid')}",
                f"JSON 请求体无法使用：{where}：{first.get('msg', 'invalid')}",
            ) from e
        lang = parsed.lang
        for i, (name, text) in enumerate(parsed.logs.items()):
            blobs.append((_name(name, i), text.encode("utf-8", "surrogatepass")))
    elif ctype == "multipart/form-data":
        # One more than allowed, so that too many files get this API's own answer below.
        form = await request.form(max_files=settings.max_files + 1, max_fields=8, max_part_size=settings.max_body_bytes)
        try:
            for i, (key, value) in enumerate(form.multi_items()):
                if isinstance(value, UploadFile):
                    blobs.append((_name(value.filename or key, i), await value.read()))
                elif key == "lang":
                    lang = value
                else:
                    raise ApiError(
                        400,
                        "bad_request",
                        f"form field {key!r} is not a file: send each log as a file part (curl -F logs=@train.log)",
                        f"表单字段 {key!r} 不是文件：请以文件形式上传每个日志（curl -F logs=@train.log）",
                    )
        finally:
            await form.close()
    else:
        raise ApiError(
            415,
            "unsupported_media_type",
            'send the logs as multipart/form-data files or as JSON {"logs": {"name": "text"}}',
            '请以 multipart/form-data 文件或 JSON {"logs": {"名称": "文本"}} 形式提交日志',
        )
    if lang not in ("en", "zh"):
        raise ApiError(
            400, "bad_request", f"lang must be en or zh, not {lang!r}", f"lang 只能是 en 或 zh，而不是 {lang!r}"
        )
    if not blobs:
        raise ApiError(400, "no_logs", "no logs were given", "未提交任何日志")
    if len(blobs) > settings.max_files:
        raise ApiError(
            400,
            "too_many_files",
            f"more than {settings.max_files} logs in one request (api.max_files)",
            f"单次请求的日志超过 {settings.max_files} 个（api.max_files）",
        )
    out: list[tuple[str, bytes]] = []
    budget = inflate_limit
    for name, raw in blobs:
        data = _inflate(raw, max(budget, 0), name) if raw[:2] == b"\x1f\x8b" else raw
        budget -= len(data)
        out.append((name, data))
    return out, lang


# ------------------------------------------------------------------------------------------------
# Serving


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
