"""The FastAPI application: `create_app` builds the app over the agent's parts and registers the
routes, each group by a function of its own (`_error_handlers`, `_probe_routes`, `_incident_routes`,
`_diagnose_routes`, `_alert_routes`) over the app's `_State`. The routes are listed in the package's
docstring (agent/api/__init__.py).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from fastapi import Body, Depends, FastAPI, Query, Request, Security
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.security import HTTPBearer
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException as StarletteHTTPException

from trainmedic.agent.api.errors import _STATUS_TEXT, API_PREFIX, ApiError, _known_query, _no_store, _not_found
from trainmedic.agent.api.guard import _Guard, resolve_token
from trainmedic.agent.api.models import (
    AlertsAccepted,
    Decision,
    DiagnoseJson,
    DiagnoseResult,
    Health,
    IncidentDetail,
    IncidentList,
    IncidentOut,
    Readiness,
    _responses,
)
from trainmedic.agent.api.uploads import _read_logs, diagnose_blobs
from trainmedic.agent.authlimit import AuthFailures
from trainmedic.agent.config import ApiSettings
from trainmedic.agent.store import Incident, IncidentStatus, IncidentStore, StoreError
from trainmedic.agent.telemetry import Telemetry
from trainmedic.agent.watchers.alertmanager import AlertmanagerWebhook, alert_events
from trainmedic.detectors.diagnose import make_engine
from trainmedic.detectors.engine import Engine
from trainmedic.errors import InputError, RuleLoadError
from trainmedic.events import Event
from trainmedic.models import Diagnosis

log = logging.getLogger("trainmedic.api")

Ingest = Callable[[list[Event]], Awaitable[None]]
Ready = Callable[[], tuple[bool, dict[str, Any]]]
# (incident_id, fmt "md" | "html", lang "en" | "zh") -> the rendered report
Render = Callable[[str, str, str], str]

MAX_LIST_LIMIT = 1000
DEDUP_SIZE = 10_000
MARKDOWN = "text/markdown; charset=utf-8"
HTML = "text/html; charset=utf-8"


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


# The fields of an incident that carry text from logs, the cluster or errors: the diagnosis (finding
# texts are raw log lines), the plan, the approval's comment, the actions' params (a journal written
# before bodies were kept apart may still hold a workload's env values) and results (error strings).
_REDACTED_FIELDS = ("diagnosis", "plan", "approval", "actions")


def _served(incident: Incident) -> dict[str, Any]:
    """An incident as the API serves it: every field that can carry log text or an error string
    passes the scene's redaction (remediations/scene/redact.py), as the web console shows it
    (agent/console/parts.py); the record in the store is left as it is. Blocking (the first call
    builds the redactor): run in a worker thread."""
    from trainmedic.remediations.scene import redact_object

    out = incident.as_dict()
    for name in _REDACTED_FIELDS:
        if out.get(name) is not None:
            out[name] = redact_object(out[name])
    return out


def _served_list(store: IncidentStore, status: str | None, limit: int) -> list[dict[str, Any]]:
    return [_served(i) for i in store.recent(status=status, limit=limit)]


def _incident_detail(store: IncidentStore, incident_id: str) -> dict[str, Any] | None:
    """One incident as served, with its timeline (each entry's detail redacted as the fields are)."""
    from trainmedic.remediations.scene import redact_object

    incident = store.find(incident_id)
    if incident is None:
        return None
    timeline = [dict(e, detail=redact_object(e.get("detail") or {})) for e in store.timeline(incident.id)]
    return dict(_served(incident), timeline=timeline)


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
    _error_handlers(app)
    _probe_routes(app, state, bearer)
    _incident_routes(app, state, bearer)
    _diagnose_routes(app, state, bearer)
    _alert_routes(app, state, bearer)

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


def _error_handlers(app: FastAPI) -> None:
    """Every error answer is the JSON of `ApiError`: this API's own, Starlette's, validation errors and the
    unexpected (logged, answered 500)."""

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


def _probe_routes(app: FastAPI, state: _State, bearer: HTTPBearer) -> None:
    """Probes and metrics."""

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
        dependencies=[Security(bearer)] if state.settings.read_auth else [],
    )
    async def metrics() -> Response:
        return Response(state.telemetry.exposition(), media_type=CONTENT_TYPE_LATEST)


def _incident_routes(app: FastAPI, state: _State, bearer: HTTPBearer) -> None:
    """Incidents: the list, one with its timeline, its report, and a person's decision on its plan."""

    read_deps = [Security(bearer)] if state.settings.read_auth else []
    read_errors = (401, 503) if state.settings.read_auth else (503,)

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
        incidents = await asyncio.to_thread(_served_list, s, status.value if status else None, limit)
        return IncidentList(count=len(incidents), incidents=[IncidentOut.model_validate(i) for i in incidents])

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


def _diagnose_routes(app: FastAPI, state: _State, bearer: HTTPBearer) -> None:
    """Diagnose: uploaded logs -> the JSON of `trainmedic diagnose --format json`."""

    json_schema = DiagnoseJson.model_json_schema()
    json_schema["properties"]["logs"]["maxProperties"] = state.settings.max_files

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
                                    "maxItems": state.settings.max_files,
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
        blobs, lang = await _read_logs(request, state.settings)
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


def _alert_routes(app: FastAPI, state: _State, bearer: HTTPBearer) -> None:
    """The Alertmanager receiver: the conversion is agent/watchers/alertmanager.py's."""

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
            state.telemetry.alerts_in.labels(a.status).inc()
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
