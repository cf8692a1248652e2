"""The policy file's schema as pydantic models, strict (unknown keys refused) and frozen: `Match`
(what a rule applies to), the action specs (`QuarantineSpec`, `RestartSpec`, `RaiseMemorySpec`,
`DumpStacksSpec`, `NotifySpec`, one `ActionSpec` union), `PolicyRule`, `EscalationRule`, the
restart budget and backoff (`RestartBudget`, `Backoff`, `Budgets` and their defaults), the
`CircuitBreaker`, the per-namespace overrides (`NamespacePolicy`) and the whole `PolicyFile`.
"""

from __future__ import annotations

import fnmatch
import math
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from trainmedic.models import SEVERITY_RANK, Action, Chip, FaultClass, RootCause, Severity
from trainmedic.remediations.policy.values import (
    LABEL_KEY_RE,
    ActionName,
    CodeGlob,
    Duration,
    Mode,
    NamespaceGlob,
    Quantity,
    RuleId,
    format_duration,
    parse_quantity,
)


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Match(_Model):
    """What a rule applies to. Every field given must match; within one list, any item may."""

    fault_class: list[FaultClass] = Field(default_factory=list)
    code: list[CodeGlob] = Field(default_factory=list)
    chip: list[Chip] = Field(default_factory=list)
    # The vendor's own bucket, verbatim (RESTART_APP, RESET_GPU, RESTART_BM, SeparateNPU, ...).
    vendor_action: list[CodeGlob] = Field(default_factory=list)
    # trainmedic's normalized action (ignore, restart_app, reset_device, reboot_node, ...).
    action: list[Action] = Field(default_factory=list)
    severity_at_least: Severity | None = None

    @model_validator(mode="before")
    @classmethod
    def _scalars_as_lists(cls, data: Any) -> Any:
        if isinstance(data, dict):
            return {k: [v] if k != "severity_at_least" and isinstance(v, str) else v for k, v in data.items()}
        return data

    @property
    def is_catch_all(self) -> bool:
        return not (
            self.fault_class or self.code or self.chip or self.vendor_action or self.action or self.severity_at_least
        )

    def matches(self, rc: RootCause) -> bool:
        if self.fault_class and rc.fault_class not in self.fault_class:
            return False
        if self.code and not any(fnmatch.fnmatchcase(rc.code, p) for p in self.code):
            return False
        if self.chip and rc.chip not in self.chip:
            return False
        if self.vendor_action and not (
            rc.vendor_action and any(fnmatch.fnmatchcase(rc.vendor_action, p) for p in self.vendor_action)
        ):
            return False
        if self.action and rc.action not in self.action:
            return False
        return not (self.severity_at_least and SEVERITY_RANK[rc.severity] < SEVERITY_RANK[self.severity_at_least])


class QuarantineSpec(_Model):
    """Cordon and taint the root cause's node so no new work lands on it."""

    action: Literal["quarantine_node"]


class RestartSpec(_Model):
    """Recreate the workload from its latest complete checkpoint."""

    action: Literal["restart_from_checkpoint"]
    # Keep the restarted pods off the failed node even when it is not quarantined.
    exclude_node: bool = False


class RaiseMemorySpec(_Model):
    """Recreate the workload with its memory limits multiplied (opt-in: host OOM)."""

    action: Literal["raise_memory_limit"]
    enabled: bool = False
    factor: float = Field(1.5, gt=1.0, le=16.0)
    max: Quantity = "512Gi"

    @property
    def max_bytes(self) -> int:
        return parse_quantity(self.max)


class DumpStacksSpec(_Model):
    """Take the Python stacks of the job's training processes (py-spy, or the SIGUSR1 faulthandler
    dump) into the incident's scene right before a restart kills them; never blocks what follows."""

    action: Literal["dump_stacks"]


class NotifySpec(_Model):
    """Tell the team (report, webhooks)."""

    action: Literal["notify"]


ActionSpec = Annotated[
    QuarantineSpec | RestartSpec | RaiseMemorySpec | DumpStacksSpec | NotifySpec, Field(discriminator="action")
]


class PolicyRule(_Model):
    id: RuleId
    description: str | None = None
    match: Match = Field(default_factory=Match)
    actions: list[ActionSpec] = Field(min_length=1)
    # Attach the framework-aware hints (hints.yaml) for the fault class to the plan.
    hints: bool = True

    @field_validator("actions", mode="before")
    @classmethod
    def _short_form(cls, value: Any) -> Any:
        # `- notify` is short for `- action: notify`.
        if isinstance(value, list):
            return [{"action": v} if isinstance(v, str) else v for v in value]
        return value

    @model_validator(mode="after")
    def _distinct_actions(self) -> PolicyRule:
        names = [a.action for a in self.actions]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"action(s) listed more than once: {', '.join(dup)}")
        if {"restart_from_checkpoint", "raise_memory_limit"} <= set(names):
            raise ValueError(
                "raise_memory_limit already restarts the job: list restart_from_checkpoint or it, not both"
            )
        return self


class EscalationRule(_Model):
    """k matching faults on the same node (or device) within a window -> quarantine the node."""

    id: RuleId
    match: Match = Field(default_factory=Match)
    scope: Literal["node", "device"] = "node"
    times: int = Field(ge=1, le=1000)
    window: Duration
    action: Literal["quarantine_node"] = "quarantine_node"
    source: str | None = None


class RestartBudget(_Model):
    max: int = Field(ge=1, le=1000)
    window: Duration
    # Restarts over a job's whole lineage (each recreation carries the count in trainmedic.io/restarts):
    # a job failing just slower than the rate budget would otherwise be restarted forever.
    lifetime_max: int = Field(10, ge=1, le=10_000)


class Backoff(_Model):
    base: Duration
    factor: float = Field(2.0, ge=1.0, le=100.0)
    max: Duration

    @model_validator(mode="after")
    def _max_at_least_base(self) -> Backoff:
        if self.max < self.base:
            raise ValueError(f"backoff max ({format_duration(self.max)}) is below base ({format_duration(self.base)})")
        return self

    def delay(self, restarts: int) -> float:
        """The wait before the next restart after `restarts` recent ones (0 when none)."""
        if restarts <= 0:
            return 0.0
        return min(self.max, self.base * self.factor ** min(restarts - 1, 64))


class Budgets(_Model):
    restarts: RestartBudget | None = None
    backoff: Backoff | None = None


DEFAULT_RESTARTS = RestartBudget.model_validate({"max": 3, "window": "1h"})
DEFAULT_BACKOFF = Backoff.model_validate({"base": "1m", "factor": 2, "max": "30m"})


class CircuitBreaker(_Model):
    max_share: float = Field(0.1, gt=0.0, le=1.0)
    window: Duration = 86400.0
    min_nodes: int = Field(1, ge=1)
    # Nodes sharing this label's value form a pool; without the label, all nodes are one pool.
    pool_label: str | None = Field("node.kubernetes.io/instance-type", pattern=LABEL_KEY_RE)

    def allowed(self, pool_size: int | None) -> int:
        """How many nodes of a pool may be quarantined within the window."""
        share = math.floor(self.max_share * pool_size + 1e-9) if pool_size and pool_size > 0 else 0
        return max(self.min_nodes, share)


class NamespacePolicy(_Model):
    match: NamespaceGlob
    mode: Mode | None = None
    disabled_actions: list[ActionName] = Field(default_factory=list)
    budgets: Budgets | None = None


class PolicyFile(_Model):
    version: Literal[1] = 1
    mode: Mode = Mode.DRY_RUN
    budgets: Budgets = Field(default_factory=Budgets)
    circuit_breaker: CircuitBreaker = Field(default_factory=CircuitBreaker)
    escalation: list[EscalationRule] = Field(default_factory=list)
    namespaces: list[NamespacePolicy] = Field(default_factory=list)
    rules: list[PolicyRule] = Field(min_length=1)
