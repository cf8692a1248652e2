"""An incident without a scene bundle is reported from the diagnosis the store holds: its root cause,
its findings as the evidence. The store holds what the responder writes (the diagnosis event, the
diagnosis under `diagnosis`) or a bare diagnosis (root cause and findings at the top, as other
writers and older stores have it); both read the same, through reports and through the API."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path
from typing import Any

import httpx
import pytest

from trainmedic.agent.api import create_app, diagnose_blobs
from trainmedic.agent.config import ApiSettings
from trainmedic.agent.reporting import render_incident, report_context
from trainmedic.agent.store import IncidentStore
from trainmedic.agent.telemetry import Telemetry
from trainmedic.detectors.diagnose import make_engine
from trainmedic.events import DiagnosisEvent, JobRef
from trainmedic.models import Diagnosis
from trainmedic.reports.report import LANGS, labels, render_report

TOKEN = "st0red-diagnosis"
XID79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid=2876, name=python, GPU has fallen off the bus."
IID = "c0ffee0000000001"


@cache
def _diagnosis() -> Diagnosis:
    return diagnose_blobs([("train.log", (XID79 + "\n").encode())], make_engine(()))


def _bare(d: Diagnosis) -> dict[str, Any]:
    return d.model_dump(mode="json")


def _event(d: Diagnosis) -> dict[str, Any]:
    job = JobRef(namespace="train", name="llama", kind="Job")
    event = DiagnosisEvent(diagnosis_id=IID, job=job, window_start=1.0e9, window_end=1.0e9 + 5, diagnosis=d)
    return event.model_dump(mode="json")


SHAPES: dict[str, Callable[[Diagnosis], dict[str, Any]]] = {"bare": _bare, "event": _event}


@pytest.fixture(params=sorted(SHAPES))
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[IncidentStore]:
    d = _diagnosis()
    assert d.root_cause is not None and d.findings
    s = IncidentStore(tmp_path / "incidents.db")
    s.open_incident(
        IID,
        key="job:train/llama",
        diagnosis=SHAPES[request.param](d),
        revision=1,
        namespace="train",
        job="llama",
        job_kind="Job",
        node="gpu-2",
        fault_class="device_error",
        code="xid:79",
        chip="nvidia",
    )
    yield s
    s.close()


def test_context_has_the_stored_root_cause_and_findings(store: IncidentStore) -> None:
    ctx = report_context(store, IID)
    assert ctx["root_cause"] is not None and ctx["root_cause"]["code"] == "xid:79"
    assert ctx["root_cause"]["summary"]["en"] and "79" in ctx["root_cause"]["summary"]["en"]
    assert ctx["vendor"] is not None and ctx["vendor"]["code"] == "xid:79"
    items = ctx["evidence"]["items"]
    assert items and items[0]["code"] == "xid:79" and "fallen off the bus" in items[0]["text"]
    assert items[0]["is_root"] and not ctx["evidence"]["in_scene"]


@pytest.mark.parametrize("lang", LANGS)
@pytest.mark.parametrize("fmt", ["md", "html"])
def test_rendered_report_shows_the_stored_diagnosis(store: IncidentStore, fmt: str, lang: str) -> None:
    out = render_report(report_context(store, IID), fmt=fmt, lang=lang)
    words = labels()["labels"]
    assert words["no_root_cause"][lang] not in out
    assert words["evidence_none"][lang] not in out
    assert "fallen off the bus" in out


@pytest.mark.asyncio
@pytest.mark.parametrize("lang", LANGS)
@pytest.mark.parametrize("fmt", ["md", "html"])
async def test_api_report_shows_the_stored_diagnosis(store: IncidentStore, fmt: str, lang: str) -> None:
    def render(incident_id: str, f: str, lg: str) -> str:
        return render_incident(store, incident_id, fmt=f, lang=lg)

    app = create_app(store=store, telemetry=Telemetry(), settings=ApiSettings(token=TOKEN), render=render, env={})
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app),
        base_url="http://trainmedic",
        headers={"Authorization": f"Bearer {TOKEN}"},
    ) as c:
        r = await c.get(f"/api/v1/incidents/{IID}/report", params={"format": fmt, "lang": lang})
    assert r.status_code == 200, r.text
    words = labels()["labels"]
    assert words["no_root_cause"][lang] not in r.text
    assert words["evidence_none"][lang] not in r.text
    assert "fallen off the bus" in r.text


def test_the_store_lists_the_summary_of_either_shape(store: IncidentStore) -> None:
    total, rows = store.search()
    assert total == 1 and rows[0].summary_en and "79" in rows[0].summary_en and rows[0].summary_zh
    incident = store.get(IID)
    stored = incident.stored_diagnosis()
    assert stored is not None and stored["root_cause"]["code"] == "xid:79"
