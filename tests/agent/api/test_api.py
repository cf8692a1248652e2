"""The HTTP API: probes, metrics, incidents, approvals, diagnose uploads, the Alertmanager receiver,
bearer auth and body limits; in process (httpx over ASGI) for most, over real sockets (uvicorn) for
serving, and with a real Alertmanager delivering its webhook to the served app."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
import socket
import time
from collections.abc import AsyncIterator, Iterator, MutableMapping
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
from fastapi import FastAPI
from paths import DATA
from servers.alertmanager import AlertmanagerServer, require_alertmanager, webhook_config

from trainmedic.agent.api import (
    AlertmanagerWebhook,
    ApiBindError,
    ApiServer,
    alert_events,
    attach_jobs,
    create_app,
    resolve_token,
    serve,
    topic_of,
)
from trainmedic.agent.brain import Brain, BrainSettings
from trainmedic.agent.bus.memory import MemoryBus
from trainmedic.agent.cli import main as cli_main
from trainmedic.agent.config import ApiSettings, load_settings
from trainmedic.agent.jobindex import JobIndex
from trainmedic.agent.store import ActionState, IncidentStatus, IncidentStore
from trainmedic.agent.telemetry import Telemetry
from trainmedic.detectors.correlator import correlate
from trainmedic.detectors.diagnose import make_engine
from trainmedic.detectors.engine import Engine
from trainmedic.events import DiagnosisEvent, Event, K8sEvent, MetricBatch, Topic, decode

TOKEN = "s3cret-t0ken"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
XID79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid=2876, name=python, GPU has fallen off the bus."
NCCL_TIMEOUT = (
    "[rank1]:[E ProcessGroupNCCL.cpp:616] [Rank 1] Watchdog caught collective operation timeout: "
    "WorkNCCL(SeqNum=3, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600035 "
    "milliseconds before timing out."
)
OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.15 GiB"
AWAITING = "a1b2c3d4e5f60718293a"
RESOLVED = "ffee00112233445566aa"


# ------------------------------------------------------------------------------------------------
# Fixtures and helpers


@pytest.fixture(scope="module")
def engine() -> Engine:
    """The engine `trainmedic diagnose --logs` builds (shipped rules, default matcher)."""
    return make_engine()


class Clock:
    def __init__(self) -> None:
        self.t = 1_700_000_000.0

    def __call__(self) -> float:
        self.t += 1.0
        return self.t


@pytest.fixture
def store(tmp_path: Path) -> Iterator[IncidentStore]:
    s = IncidentStore(tmp_path / "trainmedic.db", clock=Clock())
    for iid, node in ((RESOLVED, "gpu-node-b"), (AWAITING, "gpu-node-a")):
        s.open_incident(
            iid,
            key="job:train/llama",
            diagnosis={"root_cause": {"fault_class": "device_error", "code": "xid:79"}},
            revision=1,
            namespace="train",
            job="llama",
            job_kind="Job",
            node=node,
            fault_class="device_error",
            code="xid:79",
            chip="nvidia",
        )
        s.set_plan(iid, {"actions": ["quarantine_node"]}, "approve", [("quarantine_node", {"node": node})])
    s.set_status(RESOLVED, IncidentStatus.RESOLVED)
    s.set_status(AWAITING, IncidentStatus.AWAITING_APPROVAL)
    yield s
    s.close()


class Recorder:
    """An `ingest` that keeps what it was handed (and can be told to fail)."""

    def __init__(self) -> None:
        self.batches: list[list[Event]] = []
        self.fail: Exception | None = None

    async def __call__(self, events: list[Event]) -> None:
        if self.fail is not None:
            raise self.fail
        self.batches.append(list(events))

    @property
    def events(self) -> list[Event]:
        return [e for b in self.batches for e in b]


def render_stub(incident_id: str, fmt: str, lang: str) -> str:
    if fmt == "html":
        return f"<!doctype html><title>{incident_id}</title><p>{lang}</p>"
    return f"# {incident_id}\n\nlang: {lang}\n"


def make_app(
    engine: Engine,
    store: IncidentStore | None = None,
    *,
    settings: ApiSettings | None = None,
    ingest: Recorder | None = None,
    telemetry: Telemetry | None = None,
    **kw: Any,
) -> FastAPI:
    return create_app(
        store=store,
        telemetry=telemetry or Telemetry(),
        settings=settings or ApiSettings(token=TOKEN),
        ingest=ingest,
        engine=engine,
        env={},
        **kw,
    )


@contextlib.asynccontextmanager
async def client(app: FastAPI, *, auth: bool = True) -> AsyncIterator[httpx.AsyncClient]:
    """A client of the app; it sends the token (reads need it by default) unless `auth` is False."""
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://trainmedic", headers=AUTH if auth else None
    ) as c:
        yield c


def am_payload(*alerts: dict[str, Any], status: str = "firing") -> dict[str, Any]:
    """An Alertmanager webhook notification, version 4, as Alertmanager builds it."""
    full = [
        {
            "status": a.get("status", "firing"),
            "labels": a["labels"],
            "annotations": a.get("annotations", {}),
            "startsAt": a.get("startsAt", "2026-11-21T02:00:00.123456789Z"),
            "endsAt": "0001-01-01T00:00:00Z",
            "generatorURL": "http://prometheus:9090/graph?g0.expr=DCGM_EXP_XID_ERRORS_COUNT",
            "fingerprint": a.get("fingerprint", f"{abs(hash(json.dumps(a['labels'], sort_keys=True))):016x}"),
        }
        for a in alerts
    ]
    return {
        "version": "4",
        "groupKey": '{}:{alertname="GpuXidError"}',
        "truncatedAlerts": 0,
        "status": status,
        "receiver": "trainmedic",
        "groupLabels": {"alertname": full[0]["labels"].get("alertname", "") if full else ""},
        "commonLabels": {},
        "commonAnnotations": {},
        "externalURL": "http://alertmanager:9093",
        "alerts": full,
    }


XID_ALERT = {
    "labels": {
        "alertname": "GpuXidError",
        "severity": "critical",
        "Hostname": "node-3",
        "gpu": "0",
        "UUID": "GPU-b9f9e81b-bee7-34bc-af17-132ef6592740",
        "modelName": "NVIDIA H100 80GB HBM3",
        "xid": "79",
        "instance": "10.0.0.3:9400",
        "job": "dcgm-exporter",
    },
    "annotations": {"summary": "GPU 0 on node-3 reported Xid 79"},
}


# ------------------------------------------------------------------------------------------------
# Probes and metrics


@pytest.mark.asyncio
async def test_liveness_is_always_ok(engine: Engine) -> None:
    app = make_app(engine, ready=lambda: (False, {"waiting": ["starting"]}))
    async with client(app) as c:
        r = await c.get("/healthz")
    assert r.status_code == 200 and r.json() == {"status": "ok"}


@pytest.mark.asyncio
async def test_readiness_says_why_until_ready(engine: Engine) -> None:
    state = {"ok": False}

    def ready() -> tuple[bool, dict[str, Any]]:
        waiting = [] if state["ok"] else ["the brain has not joined its consumer group yet"]
        return state["ok"], {"waiting": waiting, "disabled": {"kernel": "/dev/kmsg is not readable"}}

    app = make_app(engine, ready=ready)
    async with client(app) as c:
        r = await c.get("/readyz")
        assert r.status_code == 503
        body = r.json()
        assert body["code"] == "not_ready" and body["error"] and body["error_zh"]
        assert body["detail"]["waiting"] == ["the brain has not joined its consumer group yet"]
        state["ok"] = True
        r = await c.get("/readyz")
    assert r.status_code == 200
    assert r.json() == {"ready": True, "detail": {"waiting": [], "disabled": {"kernel": "/dev/kmsg is not readable"}}}


@pytest.mark.asyncio
async def test_metrics_expose_the_agent_registry(engine: Engine) -> None:
    telemetry = Telemetry()
    telemetry.events_in.labels("trainmedic.logs").inc(3)
    telemetry.diagnoses.labels("device_error").inc()
    app = make_app(engine, telemetry=telemetry)
    async with client(app) as c:
        await c.get("/healthz")
        await c.get("/no/such/route")
        r = await c.get("/metrics")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain")
    text = r.text
    assert 'trainmedic_events_in_total{topic="trainmedic.logs"} 3.0' in text
    assert 'trainmedic_diagnoses_total{fault_class="device_error"} 1.0' in text
    assert 'trainmedic_api_requests_total{code="200",method="GET",route="/healthz"} 1.0' in text
    # Unknown paths share one label value: a scanner cannot blow up the series count.
    assert 'trainmedic_api_requests_total{code="404",method="GET",route="unmatched"} 1.0' in text


# ------------------------------------------------------------------------------------------------
# Incidents


@pytest.mark.asyncio
async def test_incident_list_newest_first_and_filtered(engine: Engine, store: IncidentStore) -> None:
    async with client(make_app(engine, store)) as c:
        everything = (await c.get("/api/v1/incidents")).json()
        awaiting = (await c.get("/api/v1/incidents", params={"status": "awaiting_approval"})).json()
        one = (await c.get("/api/v1/incidents", params={"limit": 1})).json()
    assert [i["id"] for i in everything["incidents"]] == [AWAITING, RESOLVED]
    assert everything["count"] == 2
    assert [i["id"] for i in awaiting["incidents"]] == [AWAITING]
    assert awaiting["incidents"][0]["actions"][0]["name"] == "quarantine_node"
    assert [i["id"] for i in one["incidents"]] == [AWAITING]


@pytest.mark.parametrize(
    ("params", "status"),
    [
        ({"limit": 0}, 422),
        ({"limit": 1001}, 422),
        ({"limit": "ten"}, 422),
        ({"status": "on_fire"}, 422),
        ({"limit": 1000}, 200),
        ({"status": "resolved", "limit": 1}, 200),
        # A misspelt filter is refused, not ignored (it would answer with every incident).
        ({"stauts": "open"}, 422),
        ({"status": "resolved", "x": "1"}, 422),
    ],
)
@pytest.mark.asyncio
async def test_incident_list_bounds(engine: Engine, store: IncidentStore, params: dict[str, Any], status: int) -> None:
    async with client(make_app(engine, store)) as c:
        r = await c.get("/api/v1/incidents", params=params)
    assert r.status_code == status, r.text
    if status == 422:
        assert r.json()["code"] == "invalid_request" and r.json()["detail"]
        unknown = sorted(set(params) - {"status", "limit"})
        if unknown:
            assert [d["loc"] for d in r.json()["detail"]] == [["query", k] for k in unknown]


@pytest.mark.parametrize("ref", [AWAITING, AWAITING[:4], AWAITING[:9]])
@pytest.mark.asyncio
async def test_incident_detail_by_id_or_unique_prefix(engine: Engine, store: IncidentStore, ref: str) -> None:
    async with client(make_app(engine, store)) as c:
        r = await c.get(f"/api/v1/incidents/{ref}")
    assert r.status_code == 200
    body = r.json()
    assert body["id"] == AWAITING and body["status"] == "awaiting_approval"
    assert [e["kind"] for e in body["timeline"]] == ["detected", "planned", "status:awaiting_approval"]


@pytest.mark.parametrize("ref", ["nope", "a1b", "0000000000", "%2Fetc%2Fpasswd"])
@pytest.mark.asyncio
async def test_unknown_incident_is_404(engine: Engine, store: IncidentStore, ref: str) -> None:
    async with client(make_app(engine, store)) as c:
        detail = await c.get(f"/api/v1/incidents/{ref}")
        report = await c.get(f"/api/v1/incidents/{ref}/report")
        approve = await c.post(f"/api/v1/incidents/{ref}/approve", json={"by": "alice"}, headers=AUTH)
    for r in (detail, report, approve):
        assert r.status_code == 404, r.text
        assert r.json()["code"] == "not_found" and r.json()["error_zh"]


@pytest.mark.asyncio
async def test_ambiguous_prefix_is_404(engine: Engine, store: IncidentStore) -> None:
    store.open_incident("a1b2ffff000000000000", key="job:x/y", diagnosis={}, revision=1)
    async with client(make_app(engine, store)) as c:
        assert (await c.get("/api/v1/incidents/a1b2")).status_code == 404
        assert (await c.get("/api/v1/incidents/a1b2c")).status_code == 200


@pytest.mark.parametrize(
    "request_",
    [
        ("GET", "/api/v1/incidents", None),
        ("GET", f"/api/v1/incidents/{AWAITING}", None),
        ("GET", f"/api/v1/incidents/{AWAITING}/report", None),
        ("POST", f"/api/v1/incidents/{AWAITING}/approve", {"by": "alice"}),
    ],
)
@pytest.mark.asyncio
async def test_without_a_store_incident_routes_answer_503(
    engine: Engine, request_: tuple[str, str, dict[str, Any] | None]
) -> None:
    method, path, body = request_
    async with client(make_app(engine, None, render=render_stub)) as c:
        r = await c.request(method, path, json=body, headers=AUTH)
    assert r.status_code == 503 and r.json()["code"] == "no_store"


@pytest.mark.parametrize(
    ("fmt", "lang", "ctype"),
    [
        ("md", "en", "text/markdown"),
        ("md", "zh", "text/markdown"),
        ("html", "zh", "text/html"),
        ("html", "en", "text/html"),
    ],
)
@pytest.mark.asyncio
async def test_report_calls_the_renderer(engine: Engine, store: IncidentStore, fmt: str, lang: str, ctype: str) -> None:
    calls: list[tuple[str, str, str]] = []

    def render(incident_id: str, f: str, lg: str) -> str:
        calls.append((incident_id, f, lg))
        return render_stub(incident_id, f, lg)

    async with client(make_app(engine, store, render=render)) as c:
        r = await c.get(f"/api/v1/incidents/{AWAITING[:6]}/report", params={"format": fmt, "lang": lang})
    assert r.status_code == 200
    assert r.headers["content-type"].split(";")[0] == ctype
    assert "charset=utf-8" in r.headers["content-type"]
    assert calls == [(AWAITING, fmt, lang)]  # the full id, whatever prefix was asked for
    assert AWAITING in r.text and lang in r.text


@pytest.mark.asyncio
async def test_report_default_is_english_markdown(engine: Engine, store: IncidentStore) -> None:
    async with client(make_app(engine, store, render=render_stub)) as c:
        r = await c.get(f"/api/v1/incidents/{AWAITING}/report")
    assert r.headers["content-type"].startswith("text/markdown") and "lang: en" in r.text


@pytest.mark.parametrize("params", [{"format": "pdf"}, {"lang": "fr"}])
@pytest.mark.asyncio
async def test_report_rejects_unknown_format_or_language(
    engine: Engine, store: IncidentStore, params: dict[str, str]
) -> None:
    async with client(make_app(engine, store, render=render_stub)) as c:
        r = await c.get(f"/api/v1/incidents/{AWAITING}/report", params=params)
    assert r.status_code == 422


@pytest.mark.asyncio
async def test_report_that_cannot_be_rendered_is_a_json_500(
    engine: Engine, store: IncidentStore, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(incident_id: str, fmt: str, lang: str) -> str:
        raise OSError("scene/pods.json: Permission denied")

    async with client(make_app(engine, store, render=broken)) as c:
        r = await c.get(f"/api/v1/incidents/{AWAITING}/report")
        assert (await c.get("/healthz")).status_code == 200  # still serving
    assert r.status_code == 500
    assert r.json()["code"] == "report_failed" and "Permission denied" in r.json()["error"]
    assert "report of incident" in caplog.text


@pytest.mark.asyncio
async def test_a_failing_readiness_check_is_not_ready(engine: Engine, caplog: pytest.LogCaptureFixture) -> None:
    def ready() -> tuple[bool, dict[str, Any]]:
        raise RuntimeError("bus gone")

    async with client(make_app(engine, ready=ready)) as c:
        r = await c.get("/readyz")
    assert r.status_code == 503 and r.json()["detail"] == {"error": "RuntimeError: bus gone"}


@pytest.mark.asyncio
async def test_report_without_a_renderer_is_503(engine: Engine, store: IncidentStore) -> None:
    async with client(make_app(engine, store)) as c:
        r = await c.get(f"/api/v1/incidents/{AWAITING}/report")
    assert r.status_code == 503 and r.json()["code"] == "no_reports"


# ------------------------------------------------------------------------------------------------
# Approve / reject


@pytest.mark.parametrize(
    ("verb", "status", "decision"), [("approve", "acting", "approved"), ("reject", "rejected", "rejected")]
)
@pytest.mark.asyncio
async def test_decision_on_a_pending_plan(
    engine: Engine, store: IncidentStore, verb: str, status: str, decision: str
) -> None:
    async with client(make_app(engine, store)) as c:
        r = await c.post(
            f"/api/v1/incidents/{AWAITING[:8]}/{verb}", json={"by": "alice", "comment": "ok, 去吧"}, headers=AUTH
        )
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["status"] == status
        assert body["approval"]["decision"] == decision and body["approval"]["by"] == "alice"
        assert body["timeline"][-1] == {
            "t": body["timeline"][-1]["t"],
            "kind": decision,
            "detail": {"by": "alice", "comment": "ok, 去吧"},
        }
        # Deciding again: the incident is no longer awaiting approval; the first decision stands.
        again = await c.post(f"/api/v1/incidents/{AWAITING}/approve", json={"by": "bob"}, headers=AUTH)
    assert again.status_code == 409
    assert again.json()["code"] == "not_awaiting_approval" and again.json()["detail"] == {"status": status}
    assert store.get(AWAITING).approval == {**body["approval"]}


@pytest.mark.asyncio
async def test_decision_on_an_incident_not_awaiting_approval_is_409(engine: Engine, store: IncidentStore) -> None:
    async with client(make_app(engine, store)) as c:
        r = await c.post(f"/api/v1/incidents/{RESOLVED}/reject", json={"by": "alice"}, headers=AUTH)
    assert r.status_code == 409
    assert "resolved" in r.json()["error"] and r.json()["error_zh"]
    assert store.get(RESOLVED).status is IncidentStatus.RESOLVED


@pytest.mark.parametrize(
    "body",
    [None, {}, {"by": ""}, {"by": 7}, {"by": "alice", "comment": None}, {"by": "alice", "extra": 1}, {"by": "x" * 201}],
)
@pytest.mark.asyncio
async def test_decision_body_is_validated(engine: Engine, store: IncidentStore, body: dict[str, Any] | None) -> None:
    async with client(make_app(engine, store)) as c:
        r = await c.post(f"/api/v1/incidents/{AWAITING}/approve", json=body, headers=AUTH)
    assert r.status_code == 422, r.text
    assert store.get(AWAITING).status is IncidentStatus.AWAITING_APPROVAL


@pytest.mark.asyncio
async def test_decision_body_that_is_not_json_is_refused(engine: Engine, store: IncidentStore) -> None:
    headers = {**AUTH, "Content-Type": "application/json"}
    async with client(make_app(engine, store)) as c:
        r = await c.post(f"/api/v1/incidents/{AWAITING}/approve", content=b"{by: alice", headers=headers)
    assert r.status_code == 422 and r.json()["code"] == "invalid_request"


# ------------------------------------------------------------------------------------------------
# Auth matrix


VARIANTS: dict[str, ApiSettings] = {
    "token": ApiSettings(token=TOKEN),
    "no-token": ApiSettings(),
    "explicitly-open": ApiSettings(allow_unauthenticated=True),
    "read-auth": ApiSettings(token=TOKEN, read_auth=True),
    "token-open-reads": ApiSettings(token=TOKEN, read_auth=False),
    "no-token-open-reads": ApiSettings(read_auth=False),
}
# Reads are protected unless a setting opens them explicitly (read_auth: false, or no auth at all).
OPEN_READS = ("token-open-reads", "no-token-open-reads", "explicitly-open")
HEADERS: dict[str, dict[str, str]] = {
    "none": {},
    "right": AUTH,
    "wrong": {"Authorization": "Bearer not-the-token"},
    "prefix-of-token": {"Authorization": f"Bearer {TOKEN[:-1]}"},
    "basic": {"Authorization": "Basic YWxpY2U6czNjcmV0"},
    "lowercase-scheme": {"Authorization": f"bearer {TOKEN}"},
}
ROUTES: dict[str, tuple[str, str, str, Any]] = {
    # name: (kind, method, path, json body)
    "approve": ("write", "POST", f"/api/v1/incidents/{AWAITING}/approve", {"by": "alice"}),
    "reject": ("write", "POST", f"/api/v1/incidents/{AWAITING}/reject", {"by": "alice"}),
    "diagnose": ("write", "POST", "/api/v1/diagnose", {"logs": {"train.log": XID79}}),
    "alertmanager": ("write", "POST", "/api/v1/alertmanager", am_payload(XID_ALERT)),
    "incidents": ("read", "GET", "/api/v1/incidents", None),
    "incident": ("read", "GET", f"/api/v1/incidents/{AWAITING}", None),
    "report": ("read", "GET", f"/api/v1/incidents/{AWAITING}/report", None),
    "metrics": ("read", "GET", "/metrics", None),
    "healthz": ("probe", "GET", "/healthz", None),
    "readyz": ("probe", "GET", "/readyz", None),
}


def expected_status(variant: str, header: str, kind: str) -> int:
    if kind == "probe":
        return 200
    protected = kind == "write" or variant not in OPEN_READS
    if not protected or variant == "explicitly-open":
        return 200
    if variant.startswith("no-token"):
        return 503
    return 200 if header in ("right", "lowercase-scheme") else 401


@pytest.mark.parametrize("route", sorted(ROUTES))
@pytest.mark.parametrize("header", sorted(HEADERS))
@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.asyncio
async def test_auth_matrix(engine: Engine, store: IncidentStore, variant: str, header: str, route: str) -> None:
    kind, method, path, body = ROUTES[route]
    ingest = Recorder()
    app = make_app(engine, store, settings=VARIANTS[variant], ingest=ingest, render=render_stub)
    async with client(app, auth=False) as c:
        r = await c.request(method, path, json=body, headers=HEADERS[header])
    want = expected_status(variant, header, kind)
    assert r.status_code == want, r.text
    if want == 401:
        assert r.json()["code"] in ("unauthorized", "invalid_token")
        assert r.headers["www-authenticate"].startswith("Bearer")
    if want == 503:
        assert r.json()["code"] == "auth_not_configured"
        assert "api.token" in r.json()["error"] and "api.token" in r.json()["error_zh"]
    if want != 200 and kind == "write":
        # Refused calls change nothing.
        assert store.get(AWAITING).status is IncidentStatus.AWAITING_APPROVAL
        assert ingest.events == []


@pytest.mark.parametrize(
    ("settings", "env", "files", "want"),
    [
        ({"token": "inline"}, {"MY_TOKEN": "from-env"}, {}, "inline"),
        ({"token_env": "MY_TOKEN"}, {"MY_TOKEN": " from-env\n"}, {}, "from-env"),
        ({"token_env": "MY_TOKEN"}, {}, {}, None),
        ({"token_file": "token"}, {}, {"token": "from-file\n"}, "from-file"),
        ({"token_env": "MY_TOKEN", "token_file": "token"}, {}, {"token": "from-file"}, "from-file"),
        ({"token_file": "missing"}, {}, {}, None),
        ({"token_file": "token"}, {}, {"token": "  \n"}, None),
        ({}, {}, {}, None),
    ],
)
def test_token_sources(
    tmp_path: Path, settings: dict[str, str], env: dict[str, str], files: dict[str, str], want: str | None
) -> None:
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    if "token_file" in settings:
        settings = {**settings, "token_file": str(tmp_path / settings["token_file"])}
    assert resolve_token(ApiSettings.model_validate(settings), env) == want


def test_api_settings_from_config_and_environment(tmp_path: Path) -> None:
    cfg = tmp_path / "trainmedic.yaml"
    cfg.write_text("api:\n  port: 0\n  token_env: API_TOKEN\n  read_auth: true\n")
    s = load_settings(cfg, env={"TRAINMEDIC_API__HOST": "0.0.0.0", "TRAINMEDIC_API__MAX_BODY_BYTES": "2048"})
    assert (s.api.port, s.api.host, s.api.token_env, s.api.read_auth) == (0, "0.0.0.0", "API_TOKEN", True)
    assert s.api.max_body_bytes == 2048 and s.api.enabled and not s.api.allow_unauthenticated


# ------------------------------------------------------------------------------------------------
# Body limits


async def _chunks(n: int, size: int, consumed: list[int]) -> AsyncIterator[bytes]:
    for _ in range(n):
        consumed.append(size)
        yield b"x" * size


@pytest.mark.asyncio
async def test_content_length_over_the_limit_is_413(engine: Engine) -> None:
    ingest = Recorder()
    app = make_app(engine, settings=ApiSettings(token=TOKEN, max_body_bytes=1024), ingest=ingest)
    body = json.dumps({"logs": {"train.log": XID79 + "\n" + "y" * 2000}})
    async with client(app) as c:
        r = await c.post("/api/v1/diagnose", content=body, headers={**AUTH, "Content-Type": "application/json"})
    assert r.status_code == 413
    assert r.json()["code"] == "too_large" and "1024" in r.json()["error"] and r.json()["error_zh"]


@pytest.mark.asyncio
async def test_chunked_body_is_counted_while_streaming(engine: Engine) -> None:
    ingest = Recorder()
    app = make_app(engine, settings=ApiSettings(token=TOKEN, max_body_bytes=1024), ingest=ingest)
    consumed: list[int] = []
    async with client(app) as c:
        r = await c.post(
            "/api/v1/alertmanager",
            content=_chunks(100, 400, consumed),
            headers={**AUTH, "Content-Type": "application/json"},
        )
    assert r.status_code == 413 and r.json()["code"] == "too_large"
    assert ingest.events == []


@pytest.mark.asyncio
async def test_chunked_body_under_the_limit_goes_through(engine: Engine) -> None:
    ingest = Recorder()
    app = make_app(engine, settings=ApiSettings(token=TOKEN, max_body_bytes=64 * 1024), ingest=ingest)
    payload = json.dumps(am_payload(XID_ALERT)).encode()

    async def pieces() -> AsyncIterator[bytes]:
        for i in range(0, len(payload), 100):
            yield payload[i : i + 100]

    async with client(app) as c:
        r = await c.post("/api/v1/alertmanager", content=pieces(), headers={**AUTH, "Content-Type": "application/json"})
    assert r.status_code == 200, r.text
    assert r.json()["events"] == 2


@pytest.mark.asyncio
async def test_auth_is_checked_before_the_body_is_read(engine: Engine) -> None:
    app = make_app(engine, settings=ApiSettings(token=TOKEN, max_body_bytes=1024))
    consumed: list[int] = []
    async with client(app, auth=False) as c:
        r = await c.post(
            "/api/v1/diagnose", content=_chunks(100, 400, consumed), headers={"Content-Type": "text/plain"}
        )
    assert r.status_code == 401
    # httpx's ASGI transport hands over the first chunk when the request starts; nothing more was read.
    assert len(consumed) <= 1


@pytest.mark.parametrize("length", [b"abc", b"-1", b"1e3"])
@pytest.mark.asyncio
async def test_invalid_content_length_is_400(engine: Engine, length: bytes) -> None:
    app = make_app(engine)
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(dict(message))

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/api/v1/diagnose",
        "raw_path": b"/api/v1/diagnose",
        "query_string": b"",
        "root_path": "",
        "headers": [(b"authorization", f"Bearer {TOKEN}".encode()), (b"content-length", length)],
        "client": ("127.0.0.1", 1234),
        "server": ("127.0.0.1", 80),
    }
    await app(scope, receive, send)
    assert sent[0]["status"] == 400
    assert json.loads(sent[1]["body"])["code"] == "bad_request"


# ------------------------------------------------------------------------------------------------
# Diagnose: the CLI's core and JSON


def _cli_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *args: str) -> Any:
    monkeypatch.chdir(tmp_path)
    assert cli_main(["diagnose", *args, "--format", "json"]) == 0
    return json.loads(capsys.readouterr().out)


LOGS = {
    "rank0.log": "step 10 loss 2.1\n" + NCCL_TIMEOUT + "\n",
    "kern.log": f"Nov 21 02:00:00 gpu-node-a kernel: [12345.678901] {XID79}\n",
}


@pytest.mark.parametrize("lang", ["en", "zh"])
@pytest.mark.parametrize("transport", ["multipart", "json", "multipart-gzip"])
@pytest.mark.asyncio
async def test_diagnose_answers_what_the_cli_prints(
    engine: Engine,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    transport: str,
    lang: str,
) -> None:
    for name, text in LOGS.items():
        (tmp_path / name).write_text(text)
    want = _cli_json(tmp_path, monkeypatch, capsys, "--logs", *LOGS, "--lang", lang)
    assert want["root_cause"]["code"] == "xid:79"  # the Xid explains the peer's timeout
    async with client(make_app(engine)) as c:
        if transport == "json":
            r = await c.post("/api/v1/diagnose", json={"logs": LOGS, "lang": lang}, headers=AUTH)
        else:
            pack = gzip.compress if transport.endswith("gzip") else bytes
            files = [("logs", (name, pack(text.encode()))) for name, text in LOGS.items()]
            r = await c.post("/api/v1/diagnose", files=files, data={"lang": lang}, headers=AUTH)
    assert r.status_code == 200, r.text
    assert r.json() == want


@pytest.mark.asyncio
async def test_diagnose_reads_every_gzip_member(engine: Engine) -> None:
    """A concatenation of gzip members (what `cat a.gz b.gz` makes) reads as one text, as gzip.open reads it."""
    text = LOGS["rank0.log"] + LOGS["kern.log"]
    packed = gzip.compress(LOGS["rank0.log"].encode()) + gzip.compress(LOGS["kern.log"].encode())
    async with client(make_app(engine)) as c:
        plain = await c.post("/api/v1/diagnose", files=[("logs", ("all.log", text.encode()))], headers=AUTH)
        gz = await c.post("/api/v1/diagnose", files=[("logs", ("all.log", packed))], headers=AUTH)
    assert gz.status_code == 200 and gz.json() == plain.json()
    assert gz.json()["root_cause"]["code"] == "xid:79"


@pytest.mark.asyncio
async def test_diagnose_lang_as_query_parameter(engine: Engine) -> None:
    async with client(make_app(engine)) as c:
        r = await c.post("/api/v1/diagnose?lang=zh", files=[("logs", ("x.log", OOM.encode()))], headers=AUTH)
    summary = r.json()["root_cause"]["summary"]
    assert r.json()["root_cause"]["fault_class"] == "accelerator_oom"
    assert any("\u4e00" <= ch <= "\u9fff" for ch in summary)


@pytest.mark.asyncio
async def test_diagnose_healthy_log_has_no_root_cause(engine: Engine) -> None:
    text = (DATA / "healthy-train.log").read_text()
    async with client(make_app(engine)) as c:
        r = await c.post("/api/v1/diagnose", json={"logs": {"healthy-train.log": text}}, headers=AUTH)
    assert r.status_code == 200
    assert r.json() == {"root_cause": None, "findings": []}


BOMB = gzip.compress(b"\0" * (8 * 1024 * 1024))


@pytest.mark.parametrize(
    ("kwargs", "status", "code"),
    [
        ({"content": b"NVRM: Xid", "headers": {"Content-Type": "text/plain"}}, 415, "unsupported_media_type"),
        ({"content": b'{"logs": ', "headers": {"Content-Type": "application/json"}}, 400, "bad_request"),
        ({"json": {"logs": {}}}, 400, "bad_request"),
        ({"json": {"logs": ["a", "b"]}}, 400, "bad_request"),
        ({"json": {"logs": {"a": 1}}}, 400, "bad_request"),
        ({"json": {"logs": {"a": "x"}, "lang": "fr"}}, 400, "bad_request"),
        ({"json": {"text": "x"}}, 400, "bad_request"),
        ({"files": [("logs", ("a.log.gz", b"\x1f\x8bnot really gzip"))]}, 400, "bad_gzip"),
        ({"files": [("logs", ("a.log.gz", gzip.compress(b"NVRM")[:-6]))]}, 400, "bad_gzip"),
        ({"files": [("logs", ("bomb.gz", BOMB))]}, 413, "too_large"),
        ({"files": [("logs", (f"{i}.gz", gzip.compress(b"\0" * (3 << 20)))) for i in range(2)]}, 413, "too_large"),
        ({"files": [("logs", (f"{i}.log", b"x")) for i in range(5)]}, 400, "too_many_files"),
        ({"files": [("logs", ("a.log", b"x"))], "data": {"lang": "fr"}}, 400, "bad_request"),
        ({"files": [("logs", ("a.log", b"x"))], "data": {"notes": "x"}}, 400, "bad_request"),
        ({"data": {"lang": "en"}, "files": [("other", ("a", b""))]}, 200, None),
    ],
)
@pytest.mark.asyncio
async def test_diagnose_unusable_input(engine: Engine, kwargs: dict[str, Any], status: int, code: str | None) -> None:
    settings = ApiSettings(token=TOKEN, max_files=4, max_body_bytes=1024 * 1024)
    kwargs = {**kwargs, "headers": {**AUTH, **kwargs.get("headers", {})}}
    async with client(make_app(engine, settings=settings)) as c:
        r = await c.post("/api/v1/diagnose", **kwargs)
    assert r.status_code == status, r.text
    if code is not None:
        assert r.json()["code"] == code and r.json()["error"] and r.json()["error_zh"]


@pytest.mark.asyncio
async def test_diagnose_builds_the_engine_once_on_first_use() -> None:
    app = create_app(store=None, telemetry=Telemetry(), settings=ApiSettings(token=TOKEN), env={})
    async with client(app) as c:
        rs = await asyncio.gather(
            *(c.post("/api/v1/diagnose", json={"logs": {"a.log": OOM}}, headers=AUTH) for _ in range(3))
        )
    assert [r.json()["root_cause"]["code"] for r in rs] == ["cuda_oom"] * 3
    assert app.state.trainmedic.engine is not None


# ------------------------------------------------------------------------------------------------
# Alertmanager webhook -> input events -> the brain


@pytest.fixture(scope="module")
def brain() -> Brain:
    return Brain(MemoryBus())


def _findings(brain: Brain, events: list[Event]) -> list[Any]:
    return [f for e in events for f in brain.detect(e)]


def test_xid_alert_becomes_an_event_and_a_metric_edge() -> None:
    conv = alert_events(AlertmanagerWebhook.model_validate(am_payload(XID_ALERT)), producer="brain/b0", now=1000.0)
    assert (conv.firing, conv.resolved, conv.duplicates) == (1, 0, 0)
    k8s, metric = conv.events
    assert isinstance(k8s.payload, K8sEvent) and isinstance(metric.payload, MetricBatch)
    assert k8s.payload.object_kind == "Alert" and k8s.payload.reason == "GpuXidError"
    assert k8s.payload.node == "node-3" and k8s.payload.type == "Warning"
    assert k8s.payload.message.startswith("GPU 0 on node-3 reported Xid 79 [severity=critical")
    assert "xid=79" in k8s.payload.message and "gpu=0" in k8s.payload.message
    assert k8s.key == metric.key == "node:node-3"
    assert (k8s.time, k8s.producer) == (1000.0, "brain/b0")
    m = metric.payload
    assert (m.node, m.chip, m.origin) == ("node-3", "nvidia", "alertmanager")
    assert [(s.name, s.value, s.device) for s in m.samples] == [("xid_errors", 0.0, "0"), ("xid_errors", 79.0, "0")]
    assert [topic_of(e) for e in conv.events] == [Topic.K8S, Topic.METRICS]
    # Stable ids: a re-sent notification maps to the same events (the brain skips them).
    again = alert_events(AlertmanagerWebhook.model_validate(am_payload(XID_ALERT)), now=2000.0)
    assert [e.id for e in again.events] == [e.id for e in conv.events]
    # Every event is a valid bus message.
    assert [decode(e.encode()) for e in conv.events] == conv.events


ALERT_CASES: dict[str, tuple[dict[str, Any], set[tuple[str, str, str | None]]]] = {
    # name: (alert, {(fault_class, code, node)} the brain finds)
    "dcgm-xid-count": (XID_ALERT, {("device_error", "xid:79", "node-3")}),
    "dcgm-xid-err-code": (
        {
            "labels": {
                "alertname": "GPUXidErrors",
                "err_code": "79",
                "err_msg": "GPU has fallen off the bus",
                "Hostname": "node-3",
                "gpu": "1",
            },
            "annotations": {"description": "Xid {{ $labels.err_code }} on node-3"},
        },
        {("device_error", "xid:79", "node-3")},
    ),
    "node-from-instance": (
        {"labels": {"alertname": "XidError", "instance": "node-3:9400", "xid": "48", "gpu": "2"}},
        {("device_error", "xid:48", "node-3")},
    ),
    "oom-kill-event": (
        {"labels": {"alertname": "OOMKilling", "node": "node-4"}, "annotations": {"summary": "OOM kill"}},
        {("host_oom", "oom_killed", "node-4")},
    ),
    "explicit-health": (
        {
            "labels": {
                "alertname": "NpuUnhealthy",
                "node": "npu-node-5",
                "id": "3",
                "chip": "ascend",
                "trainmedic_metric": "health",
                "trainmedic_value": "0",
            }
        },
        {("device_error", "health", "npu-node-5")},
    ),
    "unrelated": ({"labels": {"alertname": "DiskAlmostFull", "instance": "node-6:9100"}}, set()),
    "no-node": ({"labels": {"alertname": "GpuXidError", "xid": "79"}}, set()),
    "xid-zero": ({"labels": {"alertname": "GpuXidError", "xid": "0", "node": "node-7"}}, set()),
    "err-code-not-about-xid": ({"labels": {"alertname": "DiskError", "err_code": "79", "node": "node-8"}}, set()),
    "unknown-metric": (
        {"labels": {"alertname": "X", "node": "n-9", "trainmedic_metric": "bogus", "trainmedic_value": "1"}},
        set(),
    ),
}


@pytest.mark.parametrize("case", sorted(ALERT_CASES))
def test_alerts_reach_the_brains_rules(brain: Brain, case: str) -> None:
    alert, want = ALERT_CASES[case]
    conv = alert_events(AlertmanagerWebhook.model_validate(am_payload(alert)))
    assert len(conv.events) >= 1  # every firing alert is at least an event
    found = _findings(brain, conv.events)
    got = {(f.fault_class.value, f.code, f.node) for f in found}
    assert got == want
    if want:
        rc = correlate(found).root_cause
        assert rc is not None and (rc.fault_class.value, rc.code, rc.node) == next(iter(want))


def test_xid_alert_diagnosis_names_the_vendor_action(brain: Brain) -> None:
    conv = alert_events(AlertmanagerWebhook.model_validate(am_payload(XID_ALERT)))
    rc = correlate(_findings(brain, conv.events)).root_cause
    assert rc is not None
    assert (rc.chip.value, rc.device, rc.vendor_action) == ("nvidia", "0", "RESTART_BM")


def test_a_second_alert_on_the_same_device_is_a_new_edge(brain: Brain) -> None:
    first = {**XID_ALERT, "labels": {**XID_ALERT["labels"], "Hostname": "node-30"}, "startsAt": "2026-11-21T02:00:00Z"}
    later = {**first, "startsAt": "2026-11-21T03:00:00Z", "fingerprint": "f2"}
    for alert in (first, later):
        conv = alert_events(AlertmanagerWebhook.model_validate(am_payload(alert)))
        assert {f.code for f in _findings(brain, conv.events)} == {"xid:79"}


def test_resolved_alerts_are_counted_not_ingested() -> None:
    payload = am_payload({**XID_ALERT, "status": "resolved"}, XID_ALERT, status="firing")
    conv = alert_events(AlertmanagerWebhook.model_validate(payload))
    assert (conv.firing, conv.resolved, len(conv.events)) == (1, 1, 2)


def test_trainmedics_own_alerts_are_not_input() -> None:
    """An incident alert trainmedic pushed (its `alertmanager` sink) and Alertmanager routed back here."""
    own = {
        "labels": {"alertname": "TrainmedicIncident", "incident": AWAITING, "node": "node-3", "code": "xid:79"},
        "annotations": {"summary": "device_error xid:79 on node-3"},
    }
    conv = alert_events(AlertmanagerWebhook.model_validate(am_payload(own, XID_ALERT)))
    assert (conv.firing, conv.own, len(conv.events)) == (2, 1, 2)
    assert {getattr(e.payload, "node", None) for e in conv.events} == {"node-3"}
    assert "GpuXidError" in {getattr(e.payload, "reason", None) for e in conv.events}


def test_alert_events_are_keyed_by_job_where_known() -> None:
    index = JobIndex()
    for name, node, job in (("llama-0", "node-3", "llama"), ("qwen-0", "node-3", "qwen")):
        index.update_pod(
            {
                "metadata": {"name": name, "namespace": "train", "uid": name, "labels": {"job-name": job}},
                "spec": {"nodeName": node},
            }
        )
    pod_alert = {"labels": {"alertname": "PodOOM", "namespace": "train", "pod": "llama-0", "node": "node-3"}}
    conv = alert_events(AlertmanagerWebhook.model_validate(am_payload(pod_alert, XID_ALERT)))
    routed = attach_jobs(conv.events, index)
    keys = [(type(e.payload).__name__, e.key) for e in routed]
    assert keys == [
        ("K8sEvent", "job:train/llama"),
        ("K8sEvent", "node:node-3"),  # the Xid alert names no pod
        ("MetricBatch", "job:train/llama"),  # the node's batch goes to each job on it, same id
        ("MetricBatch", "job:train/qwen"),
    ]
    assert routed[2].id == routed[3].id
    assert isinstance(routed[2].payload, MetricBatch) and routed[2].payload.job is not None


@pytest.mark.asyncio
async def test_receiver_hands_events_on_once(engine: Engine) -> None:
    ingest = Recorder()
    telemetry = Telemetry()
    app = make_app(engine, ingest=ingest, telemetry=telemetry)
    payload = am_payload(XID_ALERT, {**XID_ALERT, "status": "resolved", "fingerprint": "r1"})
    async with client(app) as c:
        first = await c.post("/api/v1/alertmanager", json=payload, headers=AUTH)
        again = await c.post("/api/v1/alertmanager", json=payload, headers=AUTH)
        metrics = (await c.get("/metrics")).text
    assert first.json() == {"received": 2, "firing": 1, "resolved": 1, "duplicates": 0, "own": 0, "events": 2}
    assert again.json() == {"received": 2, "firing": 1, "resolved": 1, "duplicates": 1, "own": 0, "events": 0}
    assert len(ingest.batches) == 1
    assert 'trainmedic_alerts_in_total{status="firing"} 2.0' in metrics


@pytest.mark.asyncio
async def test_receiver_answers_503_when_the_bus_refuses_and_takes_the_retry(engine: Engine) -> None:
    ingest = Recorder()
    ingest.fail = ConnectionError("broker unreachable")
    app = make_app(engine, ingest=ingest)
    async with client(app) as c:
        refused = await c.post("/api/v1/alertmanager", json=am_payload(XID_ALERT), headers=AUTH)
        ingest.fail = None
        retried = await c.post("/api/v1/alertmanager", json=am_payload(XID_ALERT), headers=AUTH)
    assert refused.status_code == 503 and refused.json()["code"] == "ingest_failed"
    assert "broker unreachable" in refused.json()["error"]
    assert retried.status_code == 200 and retried.json()["events"] == 2  # not mistaken for a duplicate


@pytest.mark.asyncio
async def test_receiver_without_ingest_is_503(engine: Engine) -> None:
    async with client(make_app(engine)) as c:
        r = await c.post("/api/v1/alertmanager", json=am_payload(XID_ALERT), headers=AUTH)
    assert r.status_code == 503 and r.json()["code"] == "no_ingest"


@pytest.mark.parametrize(
    "mutate",
    [
        lambda p: {**p, "version": "3"},
        lambda p: {k: v for k, v in p.items() if k != "alerts"},
        lambda p: {**p, "alerts": [{**p["alerts"][0], "status": "pending"}]},
        lambda p: {**p, "alerts": [{**p["alerts"][0], "labels": {"a": 1}}]},
        lambda p: {**p, "alerts": [p["alerts"][0]] * 1001},
        lambda p: [p],
    ],
    ids=["version-3", "no-alerts", "bad-status", "non-string-label", "too-many-alerts", "not-an-object"],
)
@pytest.mark.asyncio
async def test_receiver_rejects_malformed_payloads(engine: Engine, mutate: Any) -> None:
    ingest = Recorder()
    async with client(make_app(engine, ingest=ingest)) as c:
        r = await c.post("/api/v1/alertmanager", json=mutate(am_payload(XID_ALERT)), headers=AUTH)
    assert r.status_code == 422 and r.json()["code"] == "invalid_request"
    assert ingest.events == []


@pytest.mark.asyncio
async def test_receiver_ignores_fields_it_does_not_know(engine: Engine) -> None:
    ingest = Recorder()
    payload = am_payload(XID_ALERT)
    payload["orgId"] = 1
    payload["alerts"][0]["silenceURL"] = "http://am/silence"
    async with client(make_app(engine, ingest=ingest)) as c:
        r = await c.post("/api/v1/alertmanager", json=payload, headers=AUTH)
    assert r.status_code == 200 and r.json()["events"] == 2


# ------------------------------------------------------------------------------------------------
# Real sockets: uvicorn


@pytest.mark.asyncio
async def test_served_over_a_real_socket_with_graceful_stop(engine: Engine, store: IncidentStore) -> None:
    settings = ApiSettings(token=TOKEN, port=0, max_body_bytes=4096)
    app = make_app(engine, store, settings=settings)
    stop = asyncio.Event()
    task = asyncio.create_task(serve(app, settings, stop))
    try:
        # The port the kernel picked is read back once the server listens.
        server: ApiServer | None = None
        deadline = time.monotonic() + 10
        async with httpx.AsyncClient() as c:
            while server is None and time.monotonic() < deadline:
                server = getattr(app.state, "server", None)
                await asyncio.sleep(0.01)
            assert server is not None and server.port > 0
            r = await c.get(f"{server.url}/healthz")
            assert r.status_code == 200
            r = await c.get(f"{server.url}/api/v1/incidents/{AWAITING[:6]}", headers=AUTH)
            assert r.json()["id"] == AWAITING
            consumed: list[int] = []
            r = await c.post(
                f"{server.url}/api/v1/diagnose",
                content=_chunks(64, 1024, consumed),
                headers={**AUTH, "Content-Type": "application/json"},
            )
            assert r.status_code == 413 and r.json()["code"] == "too_large"
            url = server.url
        stop.set()
        await asyncio.wait_for(task, 10)
    finally:
        stop.set()
        await asyncio.gather(task, return_exceptions=True)
    async with httpx.AsyncClient() as c:
        with pytest.raises(httpx.ConnectError):
            await c.get(f"{url}/healthz")


@pytest.mark.asyncio
async def test_a_taken_port_is_a_clear_error(engine: Engine) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        settings = ApiSettings(token=TOKEN, port=port)
        with pytest.raises(ApiBindError, match=f"127.0.0.1:{port}"):
            await serve(make_app(engine, settings=settings), settings, asyncio.Event())


# ------------------------------------------------------------------------------------------------
# A real Alertmanager delivers its webhook to the served receiver


@pytest_asyncio.fixture
async def pipeline() -> AsyncIterator[tuple[MemoryBus, Brain, asyncio.Event]]:
    bus = MemoryBus(partitions=2)
    await bus.start()
    brain = Brain(bus, settings=BrainSettings(window_s=60.0, tick_s=0.2, poll_ms=20))
    stop = asyncio.Event()
    task = asyncio.create_task(brain.run(stop))
    await asyncio.wait_for(brain.ready.wait(), 10)
    try:
        yield bus, brain, stop
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
        await bus.stop()


async def _wait(predicate: Any, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not met")
        await asyncio.sleep(0.05)


def _sample(telemetry: Telemetry, name: str, labels: dict[str, str]) -> float:
    value = telemetry.registry.get_sample_value(name, labels)
    return float(value or 0.0)


@pytest.mark.asyncio
@pytest.mark.timeout(60)
async def test_real_alertmanager_xid_alert_becomes_a_diagnosis(
    engine: Engine, pipeline: tuple[MemoryBus, Brain, asyncio.Event]
) -> None:
    require_alertmanager()
    bus, _brain, _ = pipeline
    diagnoses = bus.consumer([Topic.DIAGNOSES.value], "test-diagnoses")
    await diagnoses.start()
    received: list[Event] = []

    async def ingest(events: list[Event]) -> None:
        received.extend(events)
        for e in events:
            await bus.publish(topic_of(e), e)

    telemetry = Telemetry()
    settings = ApiSettings(token=TOKEN, port=0)
    app = create_app(store=None, telemetry=telemetry, settings=settings, ingest=ingest, engine=engine, env={})
    receiver = {"route": "/api/v1/alertmanager", "method": "POST"}
    try:
        async with ApiServer(app, settings) as server:
            hook = f"{server.url}/api/v1/alertmanager"
            # An Alertmanager with the wrong credentials is refused: nothing reaches the brain.
            async with AlertmanagerServer(webhook_config(hook, token="wrong")) as am:
                await am.post_alerts([{"labels": {"alertname": "Probe", "node": "node-9"}}])
                await _wait(
                    lambda: _sample(telemetry, "trainmedic_api_requests_total", {**receiver, "code": "401"}) >= 1
                )
            assert received == []
            # The right one delivers the v4 notification; the brain diagnoses the Xid on node-3.
            async with AlertmanagerServer(webhook_config(hook, token=TOKEN)) as am:
                alert = {
                    "labels": XID_ALERT["labels"],
                    "annotations": XID_ALERT["annotations"],
                    "generatorURL": "http://prometheus:9090/graph",
                }
                await am.post_alerts([alert])
                found: list[DiagnosisEvent] = []

                async def poll() -> None:
                    while not found:
                        for rec in await diagnoses.getmany(timeout_ms=100):
                            ev = decode(rec.value)
                            assert isinstance(ev.payload, DiagnosisEvent)
                            found.append(ev.payload)

                await asyncio.wait_for(poll(), 20)
                rc = found[0].diagnosis.root_cause
                assert rc is not None
                assert (rc.fault_class.value, rc.code, rc.node, rc.device) == ("device_error", "xid:79", "node-3", "0")
                kinds = {type(e.payload).__name__ for e in received}
                assert kinds == {"K8sEvent", "MetricBatch"}
                k8s = next(e.payload for e in received if isinstance(e.payload, K8sEvent))
                assert k8s.reason == "GpuXidError" and k8s.uid  # Alertmanager's fingerprint
                # Resolving the alert: Alertmanager sends the resolved notification; no new input.
                n = len(received)
                await am.post_alerts([{**alert, "endsAt": "2000-01-01T00:00:00Z"}])
                await _wait(lambda: _sample(telemetry, "trainmedic_alerts_in_total", {"status": "resolved"}) >= 1)
                assert len(received) == n
    finally:
        await diagnoses.stop()


# ------------------------------------------------------------------------------------------------
# In the agent: `trainmedic run` serves the API from the brain


def _agent_settings(tmp_path: Path, **api: Any) -> Any:
    from trainmedic.agent.config import Settings

    return Settings.model_validate(
        {
            "node_name": "brain-0",
            "kubernetes": {"enabled": False},
            "logs": {"enabled": False},
            "kernel": {"source": "off"},
            "metrics": {"nvml": False},
            "detect": {"window_s": 60},
            "remediate": {"store": str(tmp_path / "trainmedic.db"), "scene_dir": str(tmp_path / "scenes")},
            "api": {"port": 0, "token": TOKEN, **api},
        }
    )


async def _agent_url(caplog: pytest.LogCaptureFixture) -> str:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        for rec in caplog.records:
            if rec.name == "trainmedic.api" and rec.getMessage().startswith("API listening on "):
                return rec.getMessage().removeprefix("API listening on ")
        await asyncio.sleep(0.02)
    raise TimeoutError("the agent's API did not start")


@pytest.mark.asyncio
@pytest.mark.timeout(60)
async def test_the_agent_serves_its_store_and_takes_alerts(
    tmp_path: Path, store: IncidentStore, caplog: pytest.LogCaptureFixture
) -> None:
    from trainmedic.agent.config import Role
    from trainmedic.agent.run import build_agent, run_agent

    caplog.set_level("INFO", logger="trainmedic.api")
    settings = _agent_settings(tmp_path)  # the `store` fixture wrote tmp_path/trainmedic.db
    bus = MemoryBus(partitions=2)
    agent = build_agent(settings, Role.ALL, bus=bus)
    assert "api" in agent.components and agent.responder is None
    diagnoses = bus.consumer([Topic.DIAGNOSES.value], "test")
    task = asyncio.create_task(run_agent(agent, drain_timeout_s=5))
    try:
        url = await _agent_url(caplog)
        await diagnoses.start()
        async with httpx.AsyncClient(base_url=url, headers=AUTH) as c:
            await _wait(lambda: agent.brain is not None and agent.brain.ready.is_set())
            ready = await c.get("/readyz")
            assert ready.status_code == 200, ready.text
            assert ready.json()["detail"]["disabled"]["responder"].startswith("kubernetes.enabled is false")
            incidents = (await c.get("/api/v1/incidents")).json()
            assert [i["id"] for i in incidents["incidents"]] == [AWAITING, RESOLVED]
            # The shipped report templates render the incident (no scene bundle: listed as missing).
            for fmt, ctype in (("md", "text/markdown"), ("html", "text/html")):
                report = await c.get(f"/api/v1/incidents/{AWAITING[:8]}/report", params={"format": fmt, "lang": "zh"})
                assert report.status_code == 200, report.text
                assert report.headers["content-type"].startswith(ctype) and AWAITING in report.text
            r = await c.post("/api/v1/alertmanager", json=am_payload(XID_ALERT), headers=AUTH)
            assert r.status_code == 200 and r.json()["events"] == 2
            found: list[DiagnosisEvent] = []
            while not found:
                for rec in await diagnoses.getmany(timeout_ms=100):
                    payload = decode(rec.value).payload
                    assert isinstance(payload, DiagnosisEvent)
                    found.append(payload)
            rc = found[0].diagnosis.root_cause
            assert rc is not None and (rc.code, rc.node) == ("xid:79", "node-3")
            metrics = (await c.get("/metrics")).text
            assert 'trainmedic_diagnoses_total{fault_class="device_error"}' in metrics
    finally:
        agent.stop.set()
        await asyncio.wait_for(task, 20)
        await diagnoses.stop()
    async with httpx.AsyncClient() as c:
        with pytest.raises(httpx.ConnectError):
            await c.get(f"{url}/healthz")


@pytest.mark.asyncio
@pytest.mark.timeout(60)
async def test_the_agent_without_a_store_file_serves_the_rest(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from trainmedic.agent.config import Role
    from trainmedic.agent.run import build_agent, run_agent

    caplog.set_level("INFO", logger="trainmedic.api")
    agent = build_agent(_agent_settings(tmp_path), Role.ALL, bus=MemoryBus(partitions=1))
    assert "no incident store" in agent.disabled["api-incidents"]
    task = asyncio.create_task(run_agent(agent, drain_timeout_s=5))
    try:
        async with httpx.AsyncClient(base_url=await _agent_url(caplog), headers=AUTH) as c:
            assert (await c.get("/api/v1/incidents")).status_code == 503
            assert (await c.get("/healthz")).status_code == 200
    finally:
        agent.stop.set()
        await asyncio.wait_for(task, 20)
    assert not (tmp_path / "trainmedic.db").exists()  # the API does not create a store


def test_the_api_can_be_turned_off(tmp_path: Path) -> None:
    from trainmedic.agent.config import Role
    from trainmedic.agent.run import build_agent

    agent = build_agent(_agent_settings(tmp_path, enabled=False), Role.ALL, bus=MemoryBus(partitions=1))
    assert "api" not in agent.components and agent.disabled["api"] == "api.enabled is false"


@pytest.mark.asyncio
@pytest.mark.timeout(60)
async def test_the_agent_keeps_running_when_its_port_is_taken(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from trainmedic.agent.config import Role
    from trainmedic.agent.run import build_agent, run_agent

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        settings = _agent_settings(tmp_path, port=taken.getsockname()[1])
        agent = build_agent(settings, Role.ALL, bus=MemoryBus(partitions=1))
        task = asyncio.create_task(run_agent(agent, drain_timeout_s=5))
        try:
            await _wait(lambda: "api" in agent.disabled)
            assert "cannot listen" in agent.disabled["api"]
            assert not task.done()
        finally:
            agent.stop.set()
            await asyncio.wait_for(task, 20)


@pytest.mark.parametrize("path", ["/api/v1/incidents/{id}", "/api/v1/incidents"])
@pytest.mark.asyncio
async def test_an_old_journal_with_env_values_is_served_redacted(engine: Engine, tmp_path: Path, path: str) -> None:
    """A restart journalled before bodies were kept apart held the live spec; the API masks it."""
    s = IncidentStore(tmp_path / "old.db", clock=Clock())
    body = {
        "kind": "Job",
        "spec": {"template": {"spec": {"containers": [{
            "name": "t",
            "env": [{"name": "WANDB_API_KEY", "value": "wandb-secret-value"}],
            "args": ["--hf_token", "hf_secretvalue"],
        }]}}},
    }  # fmt: skip
    s.open_incident("c0ffee00", key="job:train/llama", diagnosis={}, revision=1)
    s.set_plan("c0ffee00", {}, "enforce", [("restart_from_checkpoint", {"body": body})])
    async with client(make_app(engine, s)) as c:
        r = await c.get(path.format(id="c0ffee00"))
    s.close()
    assert r.status_code == 200
    assert "wandb-secret-value" not in r.text and "hf_secretvalue" not in r.text
    assert "WANDB_API_KEY" in r.text


# A log line with two secrets: a password and a chat webhook whose URL path is its token.
LEAKY_PASSWORD = "hunter2hunter2"
LEAKY_HOOK_TOKEN = "0a1b2c3d-hooktoken-4e5f"
LEAKY_LINE = (
    f"login failed with password={LEAKY_PASSWORD}; "
    f"paging https://open.feishu.cn/open-apis/bot/v2/hook/{LEAKY_HOOK_TOKEN} next"
)


def _leaky_store(path: Path, where: str) -> IncidentStore:
    """An incident whose `where` (a finding's raw log line, an action's error, a timeline detail, a
    person's comment) holds LEAKY_LINE."""
    s = IncidentStore(path, clock=Clock())
    iid = "1eaky000"
    finding = {"rule_id": "app.auth", "code": "auth", "text": LEAKY_LINE if where == "finding" else "login failed"}
    s.open_incident(iid, key="job:train/llama", diagnosis={"findings": [finding]}, revision=1, namespace="train")
    s.set_plan(
        iid, {"actions": ["restart_from_checkpoint"]}, "approve", [("restart_from_checkpoint", {"job": "llama"})]
    )
    s.set_status(iid, IncidentStatus.AWAITING_APPROVAL)
    if where == "action-result":
        s.update_action(iid, 0, ActionState.FAILED, result={"error": LEAKY_LINE})
    elif where == "timeline":
        s.note(iid, "action_error", {"error": LEAKY_LINE})
    elif where == "approval":
        s.approve(iid, by="alice", approve=False, comment=LEAKY_LINE)
    return s


@pytest.mark.parametrize(
    ("where", "path"),
    [
        ("finding", "/api/v1/incidents"),
        ("finding", "/api/v1/incidents/1eaky000"),
        ("action-result", "/api/v1/incidents"),
        ("action-result", "/api/v1/incidents/1eaky000"),
        # The list has no approvals and no timelines.
        ("approval", "/api/v1/incidents/1eaky000"),
        ("timeline", "/api/v1/incidents/1eaky000"),
    ],
)
@pytest.mark.asyncio
async def test_log_text_and_errors_are_served_redacted(engine: Engine, tmp_path: Path, where: str, path: str) -> None:
    """Finding texts (raw log lines), action results, comments and timeline details are served with
    the scene's redaction, as the console shows them; the stored record keeps the line."""
    s = _leaky_store(tmp_path / "leaky.db", where)
    settings = ApiSettings(token=TOKEN, read_auth=True)
    try:
        async with client(make_app(engine, s, settings=settings)) as c:
            r = await c.get(path)
        assert r.status_code == 200, r.text
        assert LEAKY_PASSWORD not in r.text and LEAKY_HOOK_TOKEN not in r.text
        # The line itself is served, its secrets masked.
        assert "password=<redacted>" in r.text
        assert "open.feishu.cn/open-apis/bot/v2/hook/<redacted>" in r.text
        assert LEAKY_PASSWORD in json.dumps(s.get("1eaky000").as_dict()) + json.dumps(s.timeline("1eaky000"))
    finally:
        s.close()


@pytest.mark.parametrize("fmt", ["md", "html"])
@pytest.mark.parametrize("where", ["finding", "action-result", "approval", "timeline"])
@pytest.mark.asyncio
async def test_reports_served_by_the_api_are_redacted(engine: Engine, tmp_path: Path, where: str, fmt: str) -> None:
    """The report the API renders (no scene bundle: the evidence is the finding as the diagnosis
    recorded it) shows the log line and the error with their secrets masked."""
    from trainmedic.agent.reporting import render_incident

    s = _leaky_store(tmp_path / "leaky.db", where)

    def render(incident_id: str, f: str, lang: str) -> str:
        return render_incident(s, incident_id, fmt=f, lang=lang)

    try:
        async with client(make_app(engine, s, render=render)) as c:
            r = await c.get(f"/api/v1/incidents/1eaky000/report?format={fmt}")
        assert r.status_code == 200, r.text
        assert LEAKY_PASSWORD not in r.text and LEAKY_HOOK_TOKEN not in r.text
        assert "open.feishu.cn/open-apis/bot/v2/hook/" in r.text
    finally:
        s.close()


@pytest.mark.parametrize("via", ["api", "console"])
@pytest.mark.asyncio
async def test_wrong_tokens_throttle_the_address_for_api_and_console(
    engine: Engine, store: IncidentStore, via: str
) -> None:
    """Three wrong tokens from one address (API bearer or console sign-in, one shared count): then
    that address is refused with 429 even with the right token, on both; another address is not."""
    app = make_app(engine, store, settings=ApiSettings(token=TOKEN, auth_failure_limit=3))
    guesser = httpx.ASGITransport(app=app, client=("10.0.0.66", 40000))
    other = httpx.ASGITransport(app=app, client=("10.0.0.7", 40000))
    async with httpx.AsyncClient(transport=guesser, base_url="http://trainmedic") as c:
        for i in range(3):
            if via == "api":
                r = await c.get("/api/v1/incidents", headers={"Authorization": f"Bearer guess-{i}"})
                assert r.status_code == 401
            else:
                r = await c.post("/console/login", data={"token": f"guess-{i}", "name": "mallory"})
                assert r.status_code == 401
        r = await c.get("/api/v1/incidents", headers=AUTH)
        assert r.status_code == 429
        assert r.json()["code"] == "too_many_failures"
        assert int(r.headers["retry-after"]) >= 1
        assert "api.auth_failure_limit" in r.json()["error"]
        r = await c.post("/console/login", data={"token": TOKEN, "name": "mallory"})
        assert r.status_code == 429
        assert "set-cookie" not in r.headers
        assert int(r.headers["retry-after"]) >= 1
    async with httpx.AsyncClient(transport=other, base_url="http://trainmedic") as c:
        assert (await c.get("/api/v1/incidents", headers=AUTH)).status_code == 200
        r = await c.post("/console/login", data={"token": TOKEN, "name": "alice"})
        assert r.status_code == 303


@pytest.mark.asyncio
async def test_open_reads_and_missing_tokens_are_not_counted(engine: Engine, store: IncidentStore) -> None:
    app = make_app(engine, store, settings=ApiSettings(token=TOKEN, auth_failure_limit=2))
    transport = httpx.ASGITransport(app=app, client=("10.0.0.8", 1))
    async with httpx.AsyncClient(transport=transport, base_url="http://trainmedic") as c:
        for _ in range(5):
            assert (await c.get("/api/v1/incidents")).status_code == 401  # no token at all
            assert (await c.get("/healthz")).status_code == 200
        assert (await c.get("/api/v1/incidents", headers=AUTH)).status_code == 200
