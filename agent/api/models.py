"""The API's response and request models (the OpenAPI schema), and `_responses`, the error answers a
route documents. The Alertmanager payload (`AlertmanagerWebhook`, `AlertIn`) is the receiver's, in
agent/watchers/alertmanager.py.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from trainmedic.agent.api.errors import _STATUS_TEXT
from trainmedic.agent.store import IncidentStatus


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
