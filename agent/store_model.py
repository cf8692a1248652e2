"""What the incident store (agent/store.py) holds: its errors, the incident's and the action's states,
the schema's migrations, and the records it returns (`IncidentRow`, `ActionRecord`, `Incident`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from trainmedic.errors import TrainmedicError


class StoreError(TrainmedicError):
    """The incident store cannot be used (unreadable file, newer schema, unknown incident)."""


class IncidentStatus(StrEnum):
    OPEN = "open"  # diagnosed, scene and plan in progress
    OBSERVED = "observed"  # mode observe / dry-run: plan recorded, nothing changed
    AWAITING_APPROVAL = "awaiting_approval"
    REJECTED = "rejected"
    ACTING = "acting"
    RESOLVED = "resolved"  # every action done
    BLOCKED = "blocked"  # budget, backoff or circuit breaker: a person must look
    FAILED = "failed"  # an action failed for good


TERMINAL = frozenset(
    {
        IncidentStatus.OBSERVED,
        IncidentStatus.REJECTED,
        IncidentStatus.RESOLVED,
        IncidentStatus.BLOCKED,
        IncidentStatus.FAILED,
    }
)


class ActionState(StrEnum):
    PLANNED = "planned"
    RUNNING = "running"
    DELETING = "deleting"  # restart: the original workload is being deleted (its spec is in the scene)
    CREATING = "creating"  # restart: the replacement body is recorded and being created
    DONE = "done"
    SKIPPED = "skipped"
    FAILED = "failed"


UNFINISHED_ACTIONS = frozenset({ActionState.RUNNING, ActionState.DELETING, ActionState.CREATING})

MIGRATIONS: tuple[str, ...] = (
    # 1: incidents, actions, timeline, approvals
    """
    CREATE TABLE incidents (
        id TEXT PRIMARY KEY,
        key TEXT NOT NULL,
        namespace TEXT, job TEXT, job_kind TEXT, job_api_version TEXT,
        node TEXT, fault_class TEXT, code TEXT, chip TEXT,
        status TEXT NOT NULL,
        mode TEXT,
        revision INTEGER NOT NULL DEFAULT 0,
        created REAL NOT NULL, updated REAL NOT NULL,
        diagnosis TEXT NOT NULL,
        scene_dir TEXT,
        plan TEXT,
        fault_observed INTEGER NOT NULL DEFAULT 0,
        source_topic TEXT, source_partition INTEGER
    );
    CREATE INDEX incidents_status ON incidents(status);
    CREATE INDEX incidents_key ON incidents(key, created);
    CREATE TABLE actions (
        incident_id TEXT NOT NULL REFERENCES incidents(id),
        seq INTEGER NOT NULL,
        name TEXT NOT NULL,
        state TEXT NOT NULL,
        params TEXT NOT NULL,
        result TEXT,
        started REAL, finished REAL,
        PRIMARY KEY (incident_id, seq)
    );
    CREATE TABLE timeline (
        incident_id TEXT NOT NULL REFERENCES incidents(id),
        t REAL NOT NULL,
        kind TEXT NOT NULL,
        detail TEXT NOT NULL
    );
    CREATE INDEX timeline_incident ON timeline(incident_id, t);
    CREATE TABLE approvals (
        incident_id TEXT PRIMARY KEY REFERENCES incidents(id),
        decision TEXT NOT NULL,
        by TEXT NOT NULL,
        t REAL NOT NULL,
        comment TEXT NOT NULL DEFAULT ''
    );
    """,
    # 2: the console's list filters and live updates, and signed approve links used once
    """
    CREATE INDEX incidents_created ON incidents(created);
    CREATE INDEX incidents_updated ON incidents(updated);
    CREATE INDEX incidents_class ON incidents(fault_class, created);
    CREATE INDEX incidents_chip ON incidents(chip, created);
    CREATE INDEX incidents_node ON incidents(node, created);
    CREATE INDEX incidents_job ON incidents(job, created);
    CREATE INDEX incidents_status_created ON incidents(status, created);
    CREATE TABLE links_used (
        nonce TEXT PRIMARY KEY,
        incident_id TEXT NOT NULL REFERENCES incidents(id),
        action TEXT NOT NULL,
        by TEXT NOT NULL,
        t REAL NOT NULL
    );
    """,
)

# Columns the incident list filters on (the console), with the index that serves each.
LIST_FILTERS = ("status", "fault_class", "chip", "node", "job")


class LinkUsedError(StoreError):
    """A signed single-use link was already used."""


@dataclass
class IncidentRow:
    """One line of the incident list: the columns and the root cause's summary, nothing parsed."""

    id: str
    status: IncidentStatus
    created: float
    updated: float
    namespace: str | None
    job: str | None
    node: str | None
    fault_class: str | None
    code: str | None
    chip: str | None
    mode: str | None
    summary_en: str | None
    summary_zh: str | None


@dataclass
class ActionRecord:
    incident_id: str
    seq: int
    name: str
    state: ActionState
    params: dict[str, Any]
    result: dict[str, Any] | None = None
    started: float | None = None
    finished: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "name": self.name,
            "state": self.state.value,
            "params": self.params,
            "result": self.result,
            "started": self.started,
            "finished": self.finished,
        }


@dataclass
class Incident:
    id: str
    key: str
    status: IncidentStatus
    created: float
    updated: float
    diagnosis: dict[str, Any]
    namespace: str | None = None
    job: str | None = None
    job_kind: str | None = None
    job_api_version: str | None = None
    node: str | None = None
    fault_class: str | None = None
    code: str | None = None
    chip: str | None = None
    mode: str | None = None
    revision: int = 0
    scene_dir: str | None = None
    plan: dict[str, Any] | None = None
    fault_observed: bool = False
    source_topic: str | None = None
    source_partition: int | None = None
    actions: list[ActionRecord] = field(default_factory=list)
    approval: dict[str, Any] | None = None

    def stored_diagnosis(self) -> dict[str, Any] | None:
        """The diagnosis itself (root cause, findings): under `diagnosis` where the responder stored
        the whole diagnosis event, the document itself where a bare diagnosis was stored."""
        inner = self.diagnosis.get("diagnosis")
        if isinstance(inner, dict):
            return inner
        if "root_cause" in self.diagnosis or "findings" in self.diagnosis:
            return self.diagnosis
        return None

    def escalation(self) -> dict[str, str] | None:
        """Why a person was paged while an action goes on (blocked, its journal still under way: a
        restart's replacement refused after the delete, a wait past its deadline), in both languages,
        from the newest such action; None otherwise."""
        if self.status is not IncidentStatus.BLOCKED:
            return None
        for a in reversed(self.actions):
            why = (a.result or {}).get("why")
            if a.state in UNFINISHED_ACTIONS and (a.result or {}).get("escalated") and isinstance(why, dict):
                return {"en": str(why.get("en") or ""), "zh": str(why.get("zh") or why.get("en") or "")}
        return None

    def shown_plan(self) -> dict[str, Any] | None:
        """The plan as people read it (pages, reports): while an escalation blocks the incident and the
        plan itself was not refused, its `blocked` says why. The stored plan is left as it is."""
        why = self.escalation()
        if why is None or (self.plan or {}).get("blocked"):
            return self.plan
        return dict(self.plan or {}, blocked=why)

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "key": self.key,
            "status": self.status.value,
            "namespace": self.namespace,
            "job": self.job,
            "job_kind": self.job_kind,
            "node": self.node,
            "fault_class": self.fault_class,
            "code": self.code,
            "chip": self.chip,
            "mode": self.mode,
            "revision": self.revision,
            "created": self.created,
            "updated": self.updated,
            "scene_dir": self.scene_dir,
            "plan": self.plan,
            "actions": [a.as_dict() for a in self.actions],
            "approval": self.approval,
            "diagnosis": self.diagnosis,
        }
