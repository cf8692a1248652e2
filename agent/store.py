"""The incident store: SQLite (embedded, WAL), one row per incident, its actions and its timeline.

An incident is a diagnosed fault of one job (or node) that the responder handles: its diagnosis, the
scene bundle, the policy's plan, each action with its state and result, approvals, and a timeline of
what happened when. The store is also the responder's journal: an action's state is written
*before* the cluster is changed (`deleting` before the workload is deleted, `creating` with the
exact body before it is created), so an agent killed half way resumes from the journal instead of
leaving a deleted job without a replacement.

Durability: WAL with `synchronous=FULL`; a method returns only after its transaction committed, so
what was acknowledged survives a crash. Several processes may open one file (the CLI approving a
plan while the agent runs): each write is one short transaction with a busy timeout.

Schema changes are migrations (`MIGRATIONS`, applied in order, recorded in
`incident_schema_version`, so the policy state can share the file with its own table); a file
written by a newer agent than this one is refused rather than misread.

Incident ids are the diagnosis ids (derived from the job key and the first evidence event), so a
diagnosis replayed after a crash lands on the same incident.

The errors, the states, the schema's migrations and the records are in agent/store_model.py; this
module re-exports the names the rest of trainmedic and its tests import from it.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Collection, Mapping
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from trainmedic.agent.store_model import (
    LIST_FILTERS,
    MIGRATIONS,
    TERMINAL,
    UNFINISHED_ACTIONS,
    ActionRecord,
    ActionState,
    Incident,
    IncidentRow,
    IncidentStatus,
    LinkUsedError,
    StoreError,
)
from trainmedic.sqlitedb import immediate, migrate, open_durable

_INCIDENT_COLUMNS = (
    "id, key, status, created, updated, diagnosis, namespace, job, job_kind, job_api_version, node, "
    "fault_class, code, chip, mode, revision, scene_dir, plan, fault_observed, source_topic, source_partition"
)


class IncidentStore:
    """Incidents in one SQLite file (`:memory:` for a throwaway store)."""

    def __init__(self, path: str | Path, *, clock: Any = time.time) -> None:
        self.path = str(path)
        self.clock = clock
        try:
            self._db = open_durable(self.path, foreign_keys=True)
        except (OSError, sqlite3.Error) as e:
            raise StoreError(f"incident store {self.path}: cannot open: {e}") from e
        self._lock = threading.RLock()
        self._migrate()

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # -- plumbing -------------------------------------------------------------------------------------

    def _tx(self) -> AbstractContextManager[sqlite3.Connection]:
        return immediate(self._db, self._lock, lambda why: StoreError(f"incident store {self.path}: {why}"))

    def _migrate(self) -> None:
        def newer(have: int) -> StoreError:
            return StoreError(
                f"incident store {self.path} has schema version {have}; this agent knows up to "
                f"{len(MIGRATIONS)} (it was written by a newer trainmedic)"
            )

        with self._tx() as db:
            migrate(db, "incident_schema_version", MIGRATIONS, newer)

    @property
    def schema_version(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT MAX(version) FROM incident_schema_version").fetchone()[0] or 0)

    # -- incidents ------------------------------------------------------------------------------------

    def open_incident(
        self,
        incident_id: str,
        *,
        key: str,
        diagnosis: Mapping[str, Any],
        revision: int,
        namespace: str | None = None,
        job: str | None = None,
        job_kind: str | None = None,
        job_api_version: str | None = None,
        node: str | None = None,
        fault_class: str | None = None,
        code: str | None = None,
        chip: str | None = None,
        source_topic: str | None = None,
        source_partition: int | None = None,
    ) -> tuple[Incident, bool]:
        """Create the incident, or update its diagnosis when `revision` is newer. (incident, created)."""
        now = self.clock()
        with self._tx() as db:
            row = db.execute("SELECT revision FROM incidents WHERE id = ?", (incident_id,)).fetchone()
            created = row is None
            if created:
                db.execute(
                    "INSERT INTO incidents (id, key, status, created, updated, diagnosis, namespace, job, job_kind, "
                    "job_api_version, node, fault_class, code, chip, revision, source_topic, source_partition) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        incident_id,
                        key,
                        IncidentStatus.OPEN.value,
                        now,
                        now,
                        json.dumps(diagnosis, ensure_ascii=False),
                        namespace,
                        job,
                        job_kind,
                        job_api_version,
                        node,
                        fault_class,
                        code,
                        chip,
                        revision,
                        source_topic,
                        source_partition,
                    ),
                )
                self._event(db, incident_id, now, "detected", {"revision": revision, "fault_class": fault_class})
            elif revision > int(row[0]):
                db.execute(
                    "UPDATE incidents SET diagnosis = ?, revision = ?, node = ?, fault_class = ?, code = ?, chip = ?, "
                    "updated = ? WHERE id = ?",
                    (
                        json.dumps(diagnosis, ensure_ascii=False),
                        revision,
                        node,
                        fault_class,
                        code,
                        chip,
                        now,
                        incident_id,
                    ),
                )
                self._event(
                    db, incident_id, now, "diagnosis_revised", {"revision": revision, "fault_class": fault_class}
                )
        return self.get(incident_id), created

    def get(self, incident_id: str) -> Incident:
        incident = self.find(incident_id)
        if incident is None:
            raise StoreError(f"no incident {incident_id!r}")
        return incident

    def find(self, incident_id: str) -> Incident | None:
        with self._lock:
            row = self._db.execute(f"SELECT {_INCIDENT_COLUMNS} FROM incidents WHERE id = ?", (incident_id,)).fetchone()
            if row is None and len(incident_id) >= 4:
                # The prefix is compared as it is: no LIKE, so `_` and `%` are not wildcards.
                rows = self._db.execute(
                    f"SELECT {_INCIDENT_COLUMNS} FROM incidents WHERE substr(id, 1, ?) = ? LIMIT 2",
                    (len(incident_id), incident_id),
                ).fetchall()
                row = rows[0] if len(rows) == 1 else None
            if row is None:
                return None
            incident = self._incident(row)
            incident.actions = self._actions(incident.id)
            arow = self._db.execute(
                "SELECT decision, by, t, comment FROM approvals WHERE incident_id = ?", (incident.id,)
            ).fetchone()
            if arow is not None:
                incident.approval = {"decision": arow[0], "by": arow[1], "t": arow[2], "comment": arow[3]}
            return incident

    def recent(self, *, status: str | None = None, limit: int = 100) -> list[Incident]:
        with self._lock:
            if status:
                rows = self._db.execute(
                    f"SELECT {_INCIDENT_COLUMNS} FROM incidents WHERE status = ? ORDER BY created DESC LIMIT ?",
                    (status, limit),
                ).fetchall()
            else:
                rows = self._db.execute(
                    f"SELECT {_INCIDENT_COLUMNS} FROM incidents ORDER BY created DESC LIMIT ?",
                    (limit,),
                ).fetchall()
            out = [self._incident(r) for r in rows]
            for inc in out:
                inc.actions = self._actions(inc.id)
            return out

    def unfinished(self) -> list[Incident]:
        """Incidents the responder must carry on with: acting (an action was interrupted) or approved, and
        blocked ones whose journal is still under way (a person was told; the restart still waits for the
        old workload to go)."""
        return self._going_on((IncidentStatus.ACTING, IncidentStatus.OPEN))

    def carrying_on(self) -> list[Incident]:
        """Incidents whose actions go on now: acting (approved, or interrupted), and blocked ones whose
        journal is still under way. Unlike `unfinished` (a restart's list), not the open ones: under a
        steady fault rate hundreds are open at once, each waiting for its job's final diagnosis, and
        reading them all on every poll held the store from the incidents' own writes."""
        return self._going_on((IncidentStatus.ACTING,))

    def restarting(self, namespace: str, job: str, *, besides: str, actions: Collection[str]) -> str | None:
        """The incident (not `besides`) with one of `actions` (the restarting ones) on that job between
        its delete and its create (its journal says deleting or creating), oldest first; else None."""
        names = sorted(actions)
        with self._lock:
            row = self._db.execute(
                "SELECT id FROM incidents WHERE status IN (?, ?) AND namespace = ? AND job = ? AND id != ? AND EXISTS "
                "(SELECT 1 FROM actions a WHERE a.incident_id = incidents.id "
                f"AND a.name IN ({', '.join('?' * len(names))}) AND a.state IN (?, ?)) ORDER BY created LIMIT 1",
                (
                    IncidentStatus.ACTING.value,
                    IncidentStatus.BLOCKED.value,
                    namespace,
                    job,
                    besides,
                    *names,
                    ActionState.DELETING.value,
                    ActionState.CREATING.value,
                ),
            ).fetchone()
        return str(row[0]) if row is not None else None

    def _going_on(self, statuses: tuple[IncidentStatus, ...]) -> list[Incident]:
        """Incidents in `statuses`, and blocked ones with an action still under way, oldest first."""
        marks = ", ".join("?" * len(statuses))
        with self._lock:
            rows = self._db.execute(
                f"SELECT {_INCIDENT_COLUMNS} FROM incidents WHERE status IN ({marks}) OR (status = ? AND EXISTS "
                "(SELECT 1 FROM actions a WHERE a.incident_id = incidents.id AND a.state IN (?, ?, ?))) "
                "ORDER BY created",
                (
                    *(st.value for st in statuses),
                    IncidentStatus.BLOCKED.value,
                    *sorted(a.value for a in UNFINISHED_ACTIONS),
                ),
            ).fetchall()
            out = [self._incident(r) for r in rows]
        for inc in out:
            inc.actions = self._actions(inc.id)
        return out

    def set_status(self, incident_id: str, status: IncidentStatus, detail: Mapping[str, Any] | None = None) -> None:
        now = self.clock()
        with self._tx() as db:
            db.execute("UPDATE incidents SET status = ?, updated = ? WHERE id = ?", (status.value, now, incident_id))
            self._event(db, incident_id, now, f"status:{status.value}", dict(detail or {}))

    def set_scene(self, incident_id: str, scene_dir: str, detail: Mapping[str, Any] | None = None) -> None:
        now = self.clock()
        with self._tx() as db:
            db.execute("UPDATE incidents SET scene_dir = ?, updated = ? WHERE id = ?", (scene_dir, now, incident_id))
            self._event(db, incident_id, now, "scene_saved", dict(detail or {}, scene_dir=scene_dir))

    def mark_fault_observed(self, incident_id: str) -> bool:
        """Record that the policy counted this incident's fault; False when it already had."""
        with self._tx() as db:
            cur = db.execute(
                "UPDATE incidents SET fault_observed = 1 WHERE id = ? AND fault_observed = 0", (incident_id,)
            )
            return cur.rowcount == 1

    def set_plan(
        self,
        incident_id: str,
        plan: Mapping[str, Any],
        mode: str,
        actions: list[tuple[str, dict[str, Any]]],
    ) -> None:
        """Record the plan and its actions (state planned). A plan already recorded is kept: a replayed
        diagnosis must not re-plan an incident half way through its actions."""
        now = self.clock()
        with self._tx() as db:
            row = db.execute("SELECT plan FROM incidents WHERE id = ?", (incident_id,)).fetchone()
            if row is None:
                raise StoreError(f"no incident {incident_id!r}")
            if row[0] is not None:
                return
            db.execute(
                "UPDATE incidents SET plan = ?, mode = ?, updated = ? WHERE id = ?",
                (json.dumps(plan, ensure_ascii=False), mode, now, incident_id),
            )
            for seq, (name, params) in enumerate(actions):
                db.execute(
                    "INSERT INTO actions (incident_id, seq, name, state, params) VALUES (?, ?, ?, ?, ?)",
                    (incident_id, seq, name, ActionState.PLANNED.value, json.dumps(params, ensure_ascii=False)),
                )
            self._event(db, incident_id, now, "planned", {"mode": mode, "actions": [a for a, _ in actions]})

    def update_action(
        self,
        incident_id: str,
        seq: int,
        state: ActionState,
        *,
        params: Mapping[str, Any] | None = None,
        result: Mapping[str, Any] | None = None,
    ) -> None:
        """Move an action to `state` (journal first: called before the cluster is changed)."""
        now = self.clock()
        with self._tx() as db:
            row = db.execute(
                "SELECT name, started FROM actions WHERE incident_id = ? AND seq = ?", (incident_id, seq)
            ).fetchone()
            if row is None:
                raise StoreError(f"no action {seq} in incident {incident_id!r}")
            sets = ["state = ?"]
            values: list[Any] = [state.value]
            if params is not None:
                sets.append("params = ?")
                values.append(json.dumps(params, ensure_ascii=False))
            if result is not None:
                sets.append("result = ?")
                values.append(json.dumps(result, ensure_ascii=False))
            if row[1] is None and state is not ActionState.PLANNED:
                sets.append("started = ?")
                values.append(now)
            if state in (ActionState.DONE, ActionState.FAILED, ActionState.SKIPPED):
                sets.append("finished = ?")
                values.append(now)
            db.execute(
                f"UPDATE actions SET {', '.join(sets)} WHERE incident_id = ? AND seq = ?",
                (*values, incident_id, seq),
            )
            db.execute("UPDATE incidents SET updated = ? WHERE id = ?", (now, incident_id))
            self._event(db, incident_id, now, f"action:{row[0]}:{state.value}", dict(result or {}) if result else {})

    def approve(
        self,
        incident_id: str,
        *,
        by: str,
        approve: bool = True,
        comment: str = "",
        link_nonce: str | None = None,
    ) -> Incident:
        """A person's decision on a plan awaiting approval. Deciding twice keeps the first decision.

        `link_nonce`: the decision comes through a signed single-use link; the nonce is recorded in the
        same transaction, and a nonce recorded before raises LinkUsedError (nothing is decided)."""
        incident = self.get(incident_id)
        if incident.status is not IncidentStatus.AWAITING_APPROVAL:
            raise StoreError(f"incident {incident.id} is {incident.status.value}, not awaiting approval")
        now = self.clock()
        decision = "approved" if approve else "rejected"
        with self._tx() as db:
            if link_nonce is not None:
                cur = db.execute(
                    "INSERT OR IGNORE INTO links_used (nonce, incident_id, action, by, t) VALUES (?, ?, ?, ?, ?)",
                    (link_nonce, incident.id, decision, by, now),
                )
                if cur.rowcount != 1:
                    raise LinkUsedError(f"the link for incident {incident.id} was already used")
            db.execute(
                "INSERT OR IGNORE INTO approvals (incident_id, decision, by, t, comment) VALUES (?, ?, ?, ?, ?)",
                (incident.id, decision, by, now, comment),
            )
            status = IncidentStatus.ACTING if approve else IncidentStatus.REJECTED
            db.execute(
                "UPDATE incidents SET status = ?, updated = ? WHERE id = ? AND status = ?",
                (status.value, now, incident.id, IncidentStatus.AWAITING_APPROVAL.value),
            )
            self._event(db, incident.id, now, decision, {"by": by, "comment": comment})
        return self.get(incident.id)

    def link_used(self, nonce: str) -> bool:
        """Whether a signed single-use link was used already."""
        with self._lock:
            return self._db.execute("SELECT 1 FROM links_used WHERE nonce = ?", (nonce,)).fetchone() is not None

    def search(
        self,
        *,
        filters: Mapping[str, str] | None = None,
        since: float | None = None,
        until: float | None = None,
        offset: int = 0,
        limit: int = 50,
    ) -> tuple[int, list[IncidentRow]]:
        """(how many match, one page of them newest first). `filters` names LIST_FILTERS columns and the
        value each must equal (`job` also matches "namespace/name"); `since` <= created < `until`."""
        where: list[str] = []
        values: list[Any] = []
        for name, value in (filters or {}).items():
            if name not in LIST_FILTERS:
                raise StoreError(f"unknown incident filter {name!r}")
            if name == "job" and "/" in value:
                namespace, _, job = value.partition("/")
                where.append("namespace = ? AND job = ?")
                values += [namespace, job]
            else:
                where.append(f"{name} = ?")
                values.append(value)
        if since is not None:
            where.append("created >= ?")
            values.append(since)
        if until is not None:
            where.append("created < ?")
            values.append(until)
        clause = f" WHERE {' AND '.join(where)}" if where else ""
        with self._lock:
            total = int(self._db.execute(f"SELECT COUNT(*) FROM incidents{clause}", values).fetchone()[0])
            rows = self._db.execute(
                "SELECT id, status, created, updated, namespace, job, node, fault_class, code, chip, mode, "
                # The responder stores the diagnosis event (the diagnosis under `diagnosis`);
                # a bare diagnosis has its root cause at the top (Incident.stored_diagnosis).
                "COALESCE(json_extract(diagnosis, '$.diagnosis.root_cause.summary.en'), "
                "json_extract(diagnosis, '$.root_cause.summary.en')), "
                "COALESCE(json_extract(diagnosis, '$.diagnosis.root_cause.summary.zh'), "
                "json_extract(diagnosis, '$.root_cause.summary.zh')) "
                f"FROM incidents{clause} ORDER BY created DESC, id LIMIT ? OFFSET ?",
                (*values, limit, offset),
            ).fetchall()
        return total, [
            IncidentRow(
                id=r[0],
                status=IncidentStatus(r[1]),
                created=r[2],
                updated=r[3],
                namespace=r[4],
                job=r[5],
                node=r[6],
                fault_class=r[7],
                code=r[8],
                chip=r[9],
                mode=r[10],
                summary_en=r[11] if isinstance(r[11], str) else None,
                summary_zh=r[12] if isinstance(r[12], str) else None,
            )
            for r in rows
        ]

    def distinct(self, column: str) -> list[str]:
        """The values one list filter column takes (for the console's filter choices)."""
        if column not in LIST_FILTERS:
            raise StoreError(f"unknown incident filter {column!r}")
        with self._lock:
            rows = self._db.execute(
                f"SELECT DISTINCT {column} FROM incidents WHERE {column} IS NOT NULL ORDER BY {column} LIMIT 500"
            ).fetchall()
        return [str(r[0]) for r in rows]

    def last_change(self) -> tuple[float, int]:
        """(the latest `updated` of any incident, how many incidents): what live views poll."""
        with self._lock:
            row = self._db.execute("SELECT MAX(updated), COUNT(*) FROM incidents").fetchone()
        return float(row[0] or 0.0), int(row[1])

    def timeline(self, incident_id: str) -> list[dict[str, Any]]:
        with self._lock:
            rows = self._db.execute(
                "SELECT t, kind, detail FROM timeline WHERE incident_id = ? ORDER BY t, rowid", (incident_id,)
            ).fetchall()
        return [{"t": r[0], "kind": r[1], "detail": json.loads(r[2])} for r in rows]

    def note(self, incident_id: str, kind: str, detail: Mapping[str, Any] | None = None) -> None:
        now = self.clock()
        with self._tx() as db:
            self._event(db, incident_id, now, kind, dict(detail or {}))

    # -- rows -----------------------------------------------------------------------------------------

    @staticmethod
    def _event(db: sqlite3.Connection, incident_id: str, t: float, kind: str, detail: Mapping[str, Any]) -> None:
        db.execute(
            "INSERT INTO timeline (incident_id, t, kind, detail) VALUES (?, ?, ?, ?)",
            (incident_id, t, kind, json.dumps(detail, ensure_ascii=False, default=str)),
        )

    @staticmethod
    def _incident(row: tuple[Any, ...]) -> Incident:
        (
            iid,
            key,
            status,
            created,
            updated,
            diagnosis,
            namespace,
            job,
            job_kind,
            job_api_version,
            node,
            fault_class,
            code,
            chip,
            mode,
            revision,
            scene_dir,
            plan,
            fault_observed,
            source_topic,
            source_partition,
        ) = row
        return Incident(
            id=iid,
            key=key,
            status=IncidentStatus(status),
            created=created,
            updated=updated,
            diagnosis=json.loads(diagnosis),
            namespace=namespace,
            job=job,
            job_kind=job_kind,
            job_api_version=job_api_version,
            node=node,
            fault_class=fault_class,
            code=code,
            chip=chip,
            mode=mode,
            revision=revision,
            scene_dir=scene_dir,
            plan=json.loads(plan) if plan else None,
            fault_observed=bool(fault_observed),
            source_topic=source_topic,
            source_partition=source_partition,
        )

    def _actions(self, incident_id: str) -> list[ActionRecord]:
        rows = self._db.execute(
            "SELECT seq, name, state, params, result, started, finished FROM actions "
            "WHERE incident_id = ? ORDER BY seq",
            (incident_id,),
        ).fetchall()
        return [
            ActionRecord(
                incident_id=incident_id,
                seq=r[0],
                name=r[1],
                state=ActionState(r[2]),
                params=json.loads(r[3]),
                result=json.loads(r[4]) if r[4] else None,
                started=r[5],
                finished=r[6],
            )
            for r in rows
        ]


__all__ = [
    "LIST_FILTERS",
    "MIGRATIONS",
    "TERMINAL",
    "ActionRecord",
    "ActionState",
    "Incident",
    "IncidentStatus",
    "IncidentStore",
    "LinkUsedError",
    "StoreError",
]
