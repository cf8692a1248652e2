"""The API's OpenAPI schema fuzzed with schemathesis: every operation, valid and invalid inputs.

Each generated call is checked against the schema the app publishes: no 5xx, documented status codes
and content types, responses that match their schemas, invalid input rejected, valid input accepted,
and the bearer token required where the schema says so. State-changing calls carry the token; a
share of the incident ids is swapped for ids that exist, so the fuzzing also reaches the found paths
(details, reports, approvals that succeed once and then conflict).
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis import Case
from schemathesis.core.parameters import ParameterLocation

from trainmedic.agent.api import create_app
from trainmedic.agent.config import ApiSettings
from trainmedic.agent.store import IncidentStatus, IncidentStore
from trainmedic.agent.telemetry import Telemetry
from trainmedic.events import Event

TOKEN = "fuzz-t0ken"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
SEEDED = [f"{i:02d}c0ffee{i:012d}" for i in range(6)]


async def _ingest(events: list[Event]) -> None:
    return None


def _render(incident_id: str, fmt: str, lang: str) -> str:
    if fmt == "html":
        return f"<!doctype html><title>{incident_id}</title><p>{lang}</p>"
    return f"# {incident_id} ({lang})\n"


def _seeded_store() -> IncidentStore:
    store = IncidentStore(":memory:")
    for n, iid in enumerate(SEEDED):
        store.open_incident(
            iid,
            key=f"job:train/job-{n}",
            diagnosis={"root_cause": None},
            revision=1,
            namespace="train",
            job=f"job-{n}",
            node=f"gpu-node-{n}",
            fault_class="device_error",
            code="xid:79",
            chip="nvidia",
        )
        store.set_plan(iid, {"actions": ["quarantine_node"]}, "approve", [("quarantine_node", {"node": "n"})])
        status = IncidentStatus.AWAITING_APPROVAL if n % 2 == 0 else IncidentStatus.RESOLVED
        store.set_status(iid, status)
    return store


# The schema is loaded when the module is collected (schemathesis' lazy fixture loader does not work
# with this pytest); the diagnose engine is built on the first diagnose call.
STORE = _seeded_store()
APP = create_app(
    store=STORE,
    telemetry=Telemetry(),
    # The fuzzer sends thousands of wrong tokens from one address, which the guessing throttle exists
    # to stop (tests/agent/api/test_api.py proves it); here every answer must be the schema's, not a 429.
    settings=ApiSettings(token=TOKEN, max_body_bytes=1024 * 1024, max_files=8, auth_failure_limit=10_000),
    ingest=_ingest,
    ready=lambda: (True, {"waiting": []}),
    render=_render,
    env={},
)
schema = schemathesis.openapi.from_asgi("/openapi.json", APP)


@pytest.fixture(scope="module", autouse=True)
def _close_store() -> Iterator[None]:
    yield
    STORE.close()


@pytest.fixture(scope="module", autouse=True)
def _engine_built() -> None:
    """Build the diagnose engine before the fuzzing: on a fresh cache that takes seconds (every rule's
    examples run, the Hyperscan database compiles), longer than the fuzzer's 10 s read timeout."""

    async def warm() -> httpx.Response:
        transport = httpx.ASGITransport(app=APP)
        async with httpx.AsyncClient(transport=transport, base_url="http://trainmedic", timeout=None) as c:
            return await c.post("/api/v1/diagnose", headers=AUTH, files={"logs": ("warm.log", b"warm-up\n")})

    r = asyncio.run(warm())
    assert r.status_code == 200, r.text


@schema.parametrize()
@settings(
    max_examples=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
)
def test_openapi_fuzz(case: Case[Any]) -> None:
    incident_id = case.path_parameters.get("incident_id") if case.path_parameters else None
    if isinstance(incident_id, str):
        pick = hashlib.sha256(incident_id.encode("utf-8", "surrogatepass")).digest()[0]
        if pick % 2 == 0:
            case.path_parameters = {**(case.path_parameters or {}), "incident_id": SEEDED[pick % len(SEEDED)]}
    # A case generated to leave out the Authorization header is sent without the token: the API must
    # refuse it (401). Every other case carries the token, so the fuzzing reaches past the guard.
    headers = AUTH
    if (
        case.meta is not None
        and case.meta.is_negative_at(ParameterLocation.HEADER)
        and not any(k.lower() == "authorization" for k in case.headers or {})
    ):
        headers = {}
    case.call_and_validate(headers=headers)
