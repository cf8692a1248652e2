"""What a decision produces and what it is made on: `Plan` (the actions planned, those skipped and
why, what blocks the rest, whether a person is paged, the hints), with `PlannedAction` and
`SkippedAction` and the round trip through `as_dict`/`from_dict` that the incident store keeps,
and `PolicyContext`, where the failure happened and what the caller knows of it (namespace, job,
node and device, pool, opt-out, the clock, the pool's tainted and claimed nodes).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from trainmedic.models import I18nText
from trainmedic.remediations.policy.values import ALL_NODES_POOL, ActionName, Mode


@dataclass
class PlannedAction:
    name: ActionName
    params: dict[str, Any]
    reason: I18nText

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name.value, "params": dict(self.params), "reason": self.reason.model_dump()}


@dataclass
class SkippedAction:
    """An action the matched rule wanted but the plan leaves out, and why."""

    name: ActionName
    reason: I18nText

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name.value, "reason": self.reason.model_dump()}


@dataclass
class Plan:
    incident_id: str
    mode: Mode
    # The id of the policy rule that matched ("" when none did: notify only).
    matched: str
    actions: list[PlannedAction] = field(default_factory=list)
    # Why something wanted is not done (budget, backoff, circuit breaker, opt-out, no node).
    blocked: I18nText | None = None
    # A person must act (budget spent, breaker open, a node to isolate that cannot be).
    page: bool = False
    escalated: bool = False
    hints: list[I18nText] = field(default_factory=list)
    skipped: list[SkippedAction] = field(default_factory=list)
    # Backoff: the earliest time the blocked restart may run (same clock as PolicyContext.now).
    not_before: float | None = None
    breaker_open: bool = False
    escalation: str | None = None
    namespace: str | None = None
    job_key: str | None = None
    node: str | None = None
    pool: str | None = None
    pool_size: int | None = None
    fault_class: str | None = None
    code: str | None = None
    decided_at: float | None = None

    def action(self, name: ActionName) -> PlannedAction | None:
        return next((a for a in self.actions if a.name is name), None)

    def names(self) -> list[ActionName]:
        return [a.name for a in self.actions]

    @property
    def acts(self) -> bool:
        """Whether the plan is to be carried out now without a person (enforce mode)."""
        return self.mode is Mode.ENFORCE

    def as_dict(self) -> dict[str, Any]:
        return {
            "incident_id": self.incident_id,
            "mode": self.mode.value,
            "matched": self.matched,
            "actions": [a.as_dict() for a in self.actions],
            "skipped": [s.as_dict() for s in self.skipped],
            "blocked": self.blocked.model_dump() if self.blocked else None,
            "page": self.page,
            "escalated": self.escalated,
            "escalation": self.escalation,
            "hints": [h.model_dump() for h in self.hints],
            "not_before": self.not_before,
            "breaker_open": self.breaker_open,
            "namespace": self.namespace,
            "job_key": self.job_key,
            "node": self.node,
            "pool": self.pool,
            "pool_size": self.pool_size,
            # What the decision was made on, enough to rebuild the PolicyContext when acting later.
            "context": {
                "namespace": self.namespace,
                "job_key": self.job_key,
                "node": self.node,
                "pool": self.pool,
                "pool_size": self.pool_size,
            },
            "fault_class": self.fault_class,
            "code": self.code,
            "decided_at": self.decided_at,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Plan:
        """The plan back from `as_dict()` (e.g. read from the incident store for approval)."""

        def text(v: Any) -> I18nText | None:
            return I18nText.model_validate(v) if v else None

        return cls(
            incident_id=str(data["incident_id"]),
            mode=Mode(data["mode"]),
            matched=str(data.get("matched") or ""),
            actions=[
                PlannedAction(ActionName(a["name"]), dict(a.get("params") or {}), I18nText.model_validate(a["reason"]))
                for a in data.get("actions") or []
            ],
            skipped=[
                SkippedAction(ActionName(s["name"]), I18nText.model_validate(s["reason"]))
                for s in data.get("skipped") or []
            ],
            blocked=text(data.get("blocked")),
            page=bool(data.get("page")),
            escalated=bool(data.get("escalated")),
            escalation=data.get("escalation"),
            hints=[I18nText.model_validate(h) for h in data.get("hints") or []],
            not_before=data.get("not_before"),
            breaker_open=bool(data.get("breaker_open")),
            namespace=data.get("namespace"),
            job_key=data.get("job_key"),
            node=data.get("node"),
            pool=data.get("pool"),
            pool_size=data.get("pool_size"),
            fault_class=data.get("fault_class"),
            code=data.get("code"),
            decided_at=data.get("decided_at"),
        )


@dataclass(frozen=True)
class PolicyContext:
    """Where the failure happened and what the caller knows about it."""

    namespace: str
    # The job's key (trainmedic.events.job_key: "job:<ns>/<name>"); None for pods of no known workload.
    job_key: str | None
    # The root cause's node and device.
    node: str | None = None
    device: str | None = None
    # The node's pool (see Policy.pool_of) and how many nodes it has (None: unknown).
    pool: str = ALL_NODES_POOL
    pool_size: int | None = None
    # The workload carries `trainmedic.io/remediate: "false"` (either name may be given).
    opt_out: bool = False
    remediate_opt_out: bool = False
    # The current time (epoch seconds, or any one clock used for all calls on one state).
    now: float = field(default_factory=time.time)
    # Log lines around the failure (the scene's log tails): hints look for the framework there too.
    texts: tuple[str, ...] = ()
    # The nodes of `pool` that carry trainmedic's taint now, read from the cluster (None: unknown, the
    # recorded history counts instead). Every brain reads the same nodes, so every brain counts alike.
    quarantined: frozenset[str] | None = None
    # The nodes of `pool` claimed for a quarantine and not tainted yet (`trainmedic.io/breaker-claim`,
    # written by any brain right before it taints, within RESERVATION_HOLD_S), read from the cluster with
    # `quarantined`: places other brains have taken count when a plan is made, not only when it runs.
    claimed: frozenset[str] = frozenset()
    # How many times trainmedic recreated this job's lineage so far (its trainmedic.io/restarts).
    lineage_restarts: int = 0

    def __post_init__(self) -> None:
        both = bool(self.opt_out or self.remediate_opt_out)
        object.__setattr__(self, "opt_out", both)
        object.__setattr__(self, "remediate_opt_out", both)
