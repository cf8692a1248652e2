"""The entry points: `report_context` joins the store's record and the scene bundle; `render_incident`,
`default_report_dir`, `write_text_atomic` and `write_reports` render and write the reports.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from trainmedic.agent.reporting.bundle import _Bundle
from trainmedic.agent.reporting.outcome import _outcome
from trainmedic.agent.reporting.sections import (
    _actions,
    _checkpoint,
    _evidence,
    _fault_time,
    _findings,
    _metrics,
    _recommendations,
    _root_cause,
    _skipped,
    _stacks,
    _timeline,
    _vendor,
    _where,
)
from trainmedic.agent.reporting.values import CONTEXT_SCHEMA, _missing
from trainmedic.agent.store import Incident, IncidentStore
from trainmedic.remediations.scene import redact_object
from trainmedic.reports.report import FORMATS, LANGS, ReportError, i18n, render_report

# ------------------------------------------------------------------------------------------------
# Public API


def report_context(store: IncidentStore, incident_id: str, *, now: float | None = None) -> dict[str, Any]:
    """Everything a report of the incident shows, as a JSON-ready dict (StoreError when there is no
    such incident). A missing or partial scene bundle is listed under `missing`, never an error."""
    incident = store.get(incident_id)
    missing: list[dict[str, Any]] = []
    bundle = _Bundle(incident.scene_dir, missing)
    scene_findings = None
    if bundle.ok:
        if "findings.json" in bundle.files:
            doc = bundle.json("findings.json")
            scene_findings = doc if isinstance(doc, Mapping) else None
        if scene_findings is None:
            missing.append(
                _missing(
                    "findings.json",
                    "the bundle's findings cannot be read; evidence is shown as the diagnosis recorded it",
                    "无法读取现场包中的发现；证据按诊断记录显示",
                )
            )
    rc = _root_cause(incident, scene_findings)
    stacks = _stacks(incident, bundle)
    if rc is not None and rc.get("fault_class") == "hang" and stacks:
        # The stacks are saved: the generic advice to go and take them would send the reader back
        # to a job that has been restarted since.
        rc["hint"] = i18n("recommend", "hang_stacks")
    findings, in_scene = _findings(incident, scene_findings)
    evidence = _evidence(findings, in_scene, rc, bundle)
    fault_time = _fault_time(incident, bundle, findings)
    # While a person is paged for an action that goes on, `blocked` says why (Incident.shown_plan).
    shown = incident.shown_plan()
    plan = shown if isinstance(shown, Mapping) else None
    manifest = bundle.manifest or {}
    pods = [p for p in manifest.get("pods") or [] if isinstance(p, Mapping)]
    node_names: list[Any] = manifest["nodes"] if isinstance(manifest.get("nodes"), list) else []
    ctx: dict[str, Any] = {
        "schema": CONTEXT_SCHEMA,
        "generated_at": now if now is not None else store.clock(),
        "incident": {
            "id": incident.id,
            "key": incident.key,
            "status": incident.status.value,
            "status_label": i18n("status", incident.status.value),
            "mode": incident.mode,
            "mode_label": i18n("mode", incident.mode) if incident.mode else None,
            "namespace": incident.namespace,
            "job": incident.job,
            "job_kind": incident.job_kind,
            "node": incident.node,
            "fault_class": incident.fault_class,
            "fault_class_label": i18n("fault_class", incident.fault_class) if incident.fault_class else None,
            "code": incident.code,
            "chip": incident.chip,
            "created": incident.created,
            "updated": incident.updated,
            "revision": incident.revision,
            "scene_dir": incident.scene_dir,
            "approval": dict(incident.approval) if incident.approval else None,
        },
        "scale": {"pods": len(pods), "nodes": len(node_names)} if bundle.ok else None,
        "fault_time": fault_time,
        "root_cause": rc,
        "vendor": _vendor(rc, evidence),
        "where": _where(incident, rc, evidence, bundle),
        "timeline": _timeline(store, incident),
        "evidence": evidence,
        "metrics": _metrics(bundle, rc, missing),
        "actions": _actions(incident),
        "skipped": _skipped(plan),
        "checkpoint": _checkpoint(incident, bundle, fault_time, missing),
        "stacks": stacks,
        "recommendations": _recommendations(incident, rc, plan, bundle),
        "missing": missing,
    }
    ctx["outcome"] = _outcome(incident, rc, plan, ctx["checkpoint"], ctx["where"], ctx["stacks"])
    # Log lines and error strings reach a report from the store's record too (finding texts when the
    # bundle has none, action results, timeline details, a person's comment): every string passes the
    # scene's redaction, as the API and the console serve them (a bundle's own lines already did).
    redacted: dict[str, Any] = redact_object(ctx)
    return redacted


def render_incident(
    store: IncidentStore,
    incident_id: str,
    *,
    fmt: str,
    lang: str,
    template_dir: str | Path | None = None,
) -> str:
    """One report of one incident (what the API and `trainmedic report` serve)."""
    return render_report(report_context(store, incident_id), fmt=fmt, lang=lang, template_dir=template_dir)


def default_report_dir(store: IncidentStore, incident: Incident) -> Path:
    """Beside the evidence (the scene bundle's directory) when there is one, else beside the store."""
    if incident.scene_dir and Path(incident.scene_dir).is_dir():
        return Path(incident.scene_dir)
    if store.path == ":memory:":
        raise ReportError(f"incident {incident.id}: no scene directory and an in-memory store; give out_dir")
    return Path(store.path).parent / "reports" / incident.id


def write_text_atomic(path: Path, text: str) -> None:
    """`text` at `path` whole or not at all: a temporary file beside it, flushed, renamed into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(text.encode("utf-8"))
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_reports(
    store: IncidentStore,
    incident_id: str,
    out_dir: Path | None = None,
    *,
    formats: Iterable[str] = FORMATS,
    langs: Iterable[str] = LANGS,
) -> dict[str, Path]:
    """report.{en,zh}.{md,html} of the incident in `out_dir` (default: `default_report_dir`).
    Returns {"en.md": path, ...}. StoreError for an unknown incident; ReportError / OSError when a
    report cannot be rendered or written."""
    ctx = report_context(store, incident_id)
    incident = store.get(incident_id)
    target = Path(out_dir) if out_dir is not None else default_report_dir(store, incident)
    out: dict[str, Path] = {}
    for lang in langs:
        for fmt in formats:
            text = render_report(ctx, fmt=fmt, lang=lang)
            path = target / f"report.{lang}.{fmt}"
            write_text_atomic(path, text)
            out[f"{lang}.{fmt}"] = path
    return out
