"""The remediation policy: what to do about a diagnosis, as data, with the safety rails built in.

A policy file (`policy.yaml` ships as the default) says, for each kind of failure, which actions
to take (quarantine the node, take the training processes' stacks, restart the job from its
checkpoint, raise its memory limit, notify), and bounds them:

- `mode`: observe (diagnose and notify only) | dry-run (plan recorded, nothing changed) |
  approve (plan recorded, a person approves) | enforce (act). Namespaces may override it.
- `rules`: ordered, first match wins, matching on fault class, code globs, chip, the vendor's
  own action bucket, trainmedic's normalized action and a minimum severity.
- `budgets`: restarts per job per window, with exponential backoff between restarts of one job;
  a spent budget blocks the restart and pages a person.
- `escalation`: frequency rules in the spirit of Ascend MindCluster's fault-frequency config
  (`FaultFrequency`: EventId, TimeWindow, Times, FaultHandling): the same fault on the same node
  (or device) k times within a window adds a node quarantine ahead of the restart.
- `circuit_breaker`: never quarantine more than a share of a node pool within a window; past it,
  quarantines are dropped, a person is paged, and the breaker stays open for the window. The share
  taken is read from the cluster (the pool's tainted nodes, and the claims brains write on nodes
  right before tainting them: `pool_claims`), so brains that share only the cluster agree on it.
- a workload annotated `trainmedic.io/remediate: "false"` gets notifications only.

`Policy.decide` is pure given the `PolicyState` (recent history, see policy_state.py): it never
records. The caller records every fault occurrence (whatever the mode, before deciding) with
`Policy.observe_fault`, and what was really done with `Policy.commit` (or `commit_restart`,
`commit_quarantine`, `commit_breaker` action by action), so escalation, budgets and the breaker
see them.
The file is validated like the rule files: every problem is listed with file:line and a broken
policy refuses to load.
"""

from __future__ import annotations

import fnmatch
import math
import re
import time
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from trainmedic import quantity as shared_quantity
from trainmedic.datafile import format_error, node_line, parse_yaml, read_data_file
from trainmedic.errors import Problem, TrainmedicError
from trainmedic.models import SEVERITY_RANK, Action, Chip, FaultClass, Finding, I18nText, RootCause, Severity
from trainmedic.remediations.hints import HintBook, HintError, default_hints, hints_for, load_hints
from trainmedic.remediations.policy_state import PolicyState
from trainmedic.timefmt import rfc3339

POLICY_FILE = Path(__file__).with_name("policy.yaml")
MAX_POLICY_FILE_BYTES = 1024 * 1024
# The policy state keeps 30 days of history (policy_state.RETENTION_S): no window may be longer.
MAX_WINDOW_S = 30 * 86400.0
ID_RE = r"^[a-z0-9][a-z0-9_.-]{0,79}$"
# A label key: optional DNS-subdomain prefix and a name of at most 63 characters.
LABEL_KEY_RE = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
OPT_OUT_ANNOTATION = "trainmedic.io/remediate"
ALL_NODES_POOL = "all"


class Mode(StrEnum):
    OBSERVE = "observe"
    DRY_RUN = "dry-run"
    APPROVE = "approve"
    ENFORCE = "enforce"


class ActionName(StrEnum):
    QUARANTINE_NODE = "quarantine_node"
    RESTART_FROM_CHECKPOINT = "restart_from_checkpoint"
    RAISE_MEMORY_LIMIT = "raise_memory_limit"
    DUMP_STACKS = "dump_stacks"
    NOTIFY = "notify"


# Actions that recreate the workload (and so spend the restart budget).
RESTARTING = frozenset({ActionName.RESTART_FROM_CHECKPOINT, ActionName.RAISE_MEMORY_LIMIT})


class PolicyError(TrainmedicError):
    """A policy (or its hints file) that cannot be used. Carries every problem found."""

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = problems
        errors = [p for p in problems if not p.warning]
        lines = "\n".join(f"  {p}" for p in errors)
        super().__init__(f"the remediation policy cannot be used: {len(errors)} problem(s)\n{lines}")


# --- values in the file -----------------------------------------------------------------------

_DURATION_RE = re.compile(r"^(\d+(?:\.\d+)?)(s|m|h|d)$")
_DURATION_UNIT = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(value: object) -> float:
    """Seconds in a duration such as "30s", "10m", "1h", "2d". Raises ValueError."""
    if not isinstance(value, str):
        raise ValueError(f"a duration is a number with a unit (30s, 10m, 1h, 2d), not {value!r}")
    m = _DURATION_RE.match(value.strip())
    if m is None:
        raise ValueError(f"bad duration {value!r}: use a number and a unit, e.g. 30s, 10m, 1h, 2d")
    return float(m.group(1)) * _DURATION_UNIT[m.group(2)]


def format_duration(seconds: float) -> str:
    """The shortest "1h30m"-style text for a number of seconds."""
    s = max(0, round(seconds))
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= size:
            parts.append(f"{s // size}{unit}")
            s %= size
    if s or not parts:
        parts.append(f"{s}s")
    return "".join(parts)


def _duration(value: object) -> float:
    seconds = parse_duration(value)
    if seconds <= 0:
        raise ValueError(f"duration {value!r} must be more than zero")
    if seconds > MAX_WINDOW_S:
        raise ValueError(f"duration {value!r} is longer than the 30 days of history the policy keeps")
    return seconds


Duration = Annotated[float, BeforeValidator(_duration)]


def parse_quantity(value: object) -> int:
    """Bytes in a Kubernetes memory quantity ("512Gi", "1.5G", "129e6", "1024"), rounded up: read by
    trainmedic.quantity, without a sign, a sub-unit suffix (n u m) or a negative exponent."""
    text = str(value).strip() if isinstance(value, (str, int)) and not isinstance(value, bool) else None
    bad = f"bad memory size {value!r}: use a Kubernetes quantity such as 512Gi, 64G or 1.5Ti"
    if text is None or text.startswith(("+", "-")) or text.endswith(("n", "u", "m")) or re.search("[eE][+-]", text):
        raise ValueError(bad)
    try:
        amount = shared_quantity.parse_quantity(text)
    except shared_quantity.BadQuantity as exc:
        raise ValueError(f"memory size {value!r} is too large" if exc.reason == "exponent" else bad) from None
    if amount <= 0:
        raise ValueError(f"memory size {value!r} must be more than zero")
    if amount > 2**63 - 1:
        raise ValueError(f"memory size {value!r} is too large")
    return math.ceil(amount)


def _quantity(value: object) -> str:
    parse_quantity(value)
    return str(value).strip()


Quantity = Annotated[str, BeforeValidator(_quantity)]


def _check_glob(pattern: str, literal: str, what: str) -> str:
    """A glob (fnmatch: * ? [...]) over `literal` characters, with every bracket closed."""
    if not pattern:
        raise ValueError(f"empty {what} pattern")
    if len(pattern) > 253:
        raise ValueError(f"{what} pattern is longer than 253 characters")
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if c == "[":
            j = i + 1
            if j < len(pattern) and pattern[j] == "!":
                j += 1
            if j < len(pattern) and pattern[j] == "]":
                j += 1
            while j < len(pattern) and pattern[j] != "]":
                j += 1
            if j >= len(pattern):
                raise ValueError(f"bad glob {pattern!r}: the '[' at position {i} is never closed")
            i = j + 1
            continue
        if c == "]":
            raise ValueError(f"bad glob {pattern!r}: ']' at position {i} closes no '['")
        if c not in "*?!" and not re.fullmatch(literal, c):
            raise ValueError(f"bad glob {pattern!r}: {c!r} cannot appear in a {what}")
        i += 1
    return pattern


def _code_glob(pattern: str) -> str:
    return _check_glob(pattern, r"[A-Za-z0-9_.:/+\-]", "code")


def _namespace_glob(pattern: str) -> str:
    return _check_glob(pattern, r"[a-z0-9\-]", "namespace")


CodeGlob = Annotated[str, AfterValidator(_code_glob)]
NamespaceGlob = Annotated[str, AfterValidator(_namespace_glob)]
RuleId = Annotated[str, Field(pattern=ID_RE)]


# --- the file schema --------------------------------------------------------------------------


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


# --- plans ------------------------------------------------------------------------------------


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


# --- state keys -------------------------------------------------------------------------------

TAINT_PREFIX = "trainmedic.io/"
EV_RESTART = "restart"
EV_QUARANTINE = "quarantine"  # key: pool
EV_QUARANTINED_NODE = "quarantined_node"  # key: node
EV_BREAKER_OPEN = "breaker_open"  # key: pool
EV_FAULT = "fault"  # key: escalation rule + node (+ device)
EV_FAULT_SEEN = "fault_seen"  # key: incident
EV_DONE = "done"  # key: incident + action (commit is idempotent per incident and action)
# A quarantine reserved before the node is tainted holds its place this long: longer than any read of
# the nodes can be stale, so a node tainted since that read is still counted once, by its name.
RESERVATION_HOLD_S = 900.0
# The annotation a brain writes on a node right before it taints it: `<epoch seconds> <incident id>`.
# Every brain ranks the pool's claims alike (oldest first, then by node name), so brains that share
# nothing but the cluster take no more than the pool's share between them.
CLAIM_ANNOTATION = TAINT_PREFIX + "breaker-claim"


def format_claim(t: float, incident_id: str) -> str:
    return f"{t:.6f} {incident_id}"


def parse_claim(value: object) -> tuple[float, str] | None:
    """(t, incident id) of a claim annotation; None when absent or not one."""
    if not isinstance(value, str):
        return None
    at, _, incident = value.partition(" ")
    try:
        t = float(at)
    except ValueError:
        return None
    return (t, incident) if math.isfinite(t) else None


_EVER = float("-inf")


def _pool_key(pool: str) -> str:
    return f"pool:{pool}"


def _restart_key(job_key: str) -> str:
    return f"restart:{job_key}"


def _node_key(node: str) -> str:
    return f"node:{node}"


def _incident_key(incident_id: str) -> str:
    return f"incident:{incident_id}"


def _iso(t: float) -> str:
    try:
        return rfc3339(t)
    except (OverflowError, OSError, ValueError):
        return f"t={t:.0f}"


# --- the policy -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Policy:
    """A validated policy. Build it with `load_policy` or `parse_policy`."""

    spec: PolicyFile
    hint_book: HintBook = field(default_factory=default_hints)
    source: str = "-"
    warnings: tuple[Problem, ...] = ()

    @property
    def mode(self) -> Mode:
        return self.spec.mode

    @property
    def rules(self) -> list[PolicyRule]:
        return self.spec.rules

    @property
    def pool_label(self) -> str | None:
        """The node label whose value makes a node pool for the circuit breaker."""
        return self.spec.circuit_breaker.pool_label

    def namespace_policy(self, namespace: str | None) -> NamespacePolicy | None:
        """The override for a namespace: an exact name first, else the first glob that matches."""
        if not namespace:
            return None
        for ns in self.spec.namespaces:
            if ns.match == namespace:
                return ns
        for ns in self.spec.namespaces:
            if fnmatch.fnmatchcase(namespace, ns.match):
                return ns
        return None

    def mode_for(self, namespace: str | None) -> Mode:
        ns = self.namespace_policy(namespace)
        return ns.mode if ns is not None and ns.mode is not None else self.spec.mode

    def budgets_for(self, namespace: str | None) -> tuple[RestartBudget, Backoff]:
        restarts = self.spec.budgets.restarts or DEFAULT_RESTARTS
        backoff = self.spec.budgets.backoff or DEFAULT_BACKOFF
        ns = self.namespace_policy(namespace)
        if ns is not None and ns.budgets is not None:
            restarts = ns.budgets.restarts or restarts
            backoff = ns.budgets.backoff or backoff
        return restarts, backoff

    def disabled_for(self, namespace: str | None) -> frozenset[ActionName]:
        ns = self.namespace_policy(namespace)
        return frozenset(ns.disabled_actions) if ns is not None else frozenset()

    def match(self, root_cause: RootCause) -> PolicyRule | None:
        return next((r for r in self.spec.rules if r.match.matches(root_cause)), None)

    def pool_of(self, node: str | None, nodes: Iterable[Mapping[str, Any]]) -> tuple[str, int]:
        """The pool of `node` among Kubernetes Node objects, and the pool's size.

        A pool is the nodes sharing the configured label's value; a node without the label (or
        no label configured) belongs to the pool of all nodes.
        """
        labelled: list[tuple[str, Mapping[str, Any]]] = []
        for obj in nodes:
            meta = obj.get("metadata") if isinstance(obj, Mapping) else None
            if not isinstance(meta, Mapping) or not isinstance(meta.get("name"), str):
                continue
            labels = meta.get("labels")
            labelled.append((meta["name"], labels if isinstance(labels, Mapping) else {}))
        label = self.spec.circuit_breaker.pool_label
        mine = next((labels for name, labels in labelled if name == node), None)
        if not label or mine is None or not isinstance(mine.get(label), str):
            return ALL_NODES_POOL, len(labelled)
        value = mine[label]
        return f"{label}={value}", sum(labels.get(label) == value for _, labels in labelled)

    def pool_selector(self, node: Mapping[str, Any] | None) -> dict[str, str] | None:
        """The label selector of the pool of the Node object `node` (see `pool_of`), for listing
        only that pool's nodes; None when its pool is all nodes (no label configured, or the node
        lacks it) or the node is unknown."""
        label = self.spec.circuit_breaker.pool_label
        meta = node.get("metadata") if isinstance(node, Mapping) else None
        labels = meta.get("labels") if isinstance(meta, Mapping) else None
        if not label or not isinstance(labels, Mapping) or not isinstance(labels.get(label), str):
            return None
        return {label: labels[label]}

    def _pool_members(
        self, node: str | None, nodes: Iterable[Mapping[str, Any]]
    ) -> list[tuple[str, Mapping[str, Any]]]:
        """(name, Node) of the nodes in `node`'s pool (see `pool_of`: the pool of all nodes takes
        every node), in one pass over `nodes`."""
        named: list[tuple[str, Mapping[str, Any]]] = []
        for obj in nodes:
            meta = obj.get("metadata") if isinstance(obj, Mapping) else None
            if isinstance(meta, Mapping) and isinstance(meta.get("name"), str):
                named.append((meta["name"], obj))
        pool, _ = self.pool_of(node, (obj for _, obj in named))
        if pool == ALL_NODES_POOL:
            return named
        label = self.pool_label or ""
        out = []
        for name, obj in named:
            raw = obj["metadata"].get("labels")
            labels: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
            if f"{label}={labels.get(label)}" == pool:
                out.append((name, obj))
        return out

    def pool_quarantined(self, node: str | None, nodes: Iterable[Mapping[str, Any]]) -> frozenset[str]:
        """The nodes of `node`'s pool (see `pool_of`) that carry a taint of trainmedic's
        (`trainmedic.io/...`): the cluster's own count for the circuit breaker."""
        out: set[str] = set()
        for name, obj in self._pool_members(node, nodes):
            taints = (obj.get("spec") or {}).get("taints") or []
            if any(isinstance(t, Mapping) and str(t.get("key", "")).startswith(TAINT_PREFIX) for t in taints):
                out.add(name)
        return frozenset(out)

    def pool_claims(
        self, node: str | None, nodes: Iterable[Mapping[str, Any]], since: float
    ) -> list[tuple[float, str]]:
        """The breaker claims (`trainmedic.io/breaker-claim`, written by any brain right before it
        taints a node) on the nodes of `node`'s pool made at `t >= since`, as (t, node), oldest first:
        the order every brain ranks them in."""
        out: list[tuple[float, str]] = []
        for name, obj in self._pool_members(node, nodes):
            ann = obj["metadata"].get("annotations")
            claim = parse_claim(ann.get(CLAIM_ANNOTATION) if isinstance(ann, Mapping) else None)
            if claim is not None and claim[0] >= since:
                out.append((claim[0], name))
        return sorted(out)

    def breaker_refusal(
        self, node: str, ctx: PolicyContext, state: PolicyState, done: int, *, incident_id: str | None = None
    ) -> I18nText:
        """Why `node` is not quarantined (its pool's share is taken); the breaker is recorded open."""
        self.commit_breaker(ctx, state, incident_id=incident_id)
        return self._breaker_text(ctx, node, done, self.spec.circuit_breaker.allowed(ctx.pool_size))

    # -- escalation --

    def _escalation_key(self, rule: EscalationRule, ctx: PolicyContext) -> str | None:
        if not ctx.node:
            return None
        if rule.scope == "device":
            if not ctx.device:
                return None
            return f"esc:{rule.id}|node:{ctx.node}|device:{ctx.device}"
        return f"esc:{rule.id}|node:{ctx.node}"

    def observe_fault(
        self, root_cause: RootCause, ctx: PolicyContext, state: PolicyState, *, incident_id: str | None = None
    ) -> bool:
        """Record one occurrence of the incident's fault for the escalation rules, whatever the mode.

        Call it once per incident, before `decide` (which counts what is recorded). With an
        `incident_id` a repeated call for the same incident (a replayed diagnosis) is a no-op.
        Returns whether anything was recorded.
        """
        if incident_id is not None:
            if state.count(EV_FAULT_SEEN, _incident_key(incident_id), _EVER):
                return False
            state.record(EV_FAULT_SEEN, _incident_key(incident_id), ctx.now)
        for rule in self.spec.escalation:
            key = self._escalation_key(rule, ctx)
            if key is not None and rule.match.matches(root_cause):
                state.record(EV_FAULT, key, ctx.now)
        return True

    def escalation_due(
        self, root_cause: RootCause, ctx: PolicyContext, state: PolicyState
    ) -> tuple[EscalationRule, int] | None:
        """The first escalation rule whose recorded occurrences within its window reached `times`."""
        for rule in self.spec.escalation:
            key = self._escalation_key(rule, ctx)
            if key is None or not rule.match.matches(root_cause):
                continue
            seen = state.count(EV_FAULT, key, ctx.now - rule.window)
            if seen >= rule.times:
                return rule, seen
        return None

    # -- deciding --

    def decide(
        self,
        incident_id: str,
        root_cause: RootCause,
        findings: Sequence[Finding],
        ctx: PolicyContext,
        state: PolicyState,
    ) -> Plan:
        """The plan for one incident. Pure given `state`: nothing is recorded.

        Escalation counts the occurrences `observe_fault` recorded, so observe this incident first.
        """
        mode = self.mode_for(ctx.namespace)
        rule = self.match(root_cause)
        plan = Plan(
            incident_id=incident_id,
            mode=mode,
            matched=rule.id if rule else "",
            namespace=ctx.namespace,
            job_key=ctx.job_key,
            node=ctx.node,
            pool=ctx.pool,
            pool_size=ctx.pool_size,
            fault_class=root_cause.fault_class.value,
            code=root_cause.code,
            decided_at=ctx.now,
        )
        wanted: list[tuple[ActionSpec, I18nText]] = []
        specs: list[ActionSpec] = list(rule.actions) if rule else [NotifySpec(action="notify")]
        quarantine_wanted = any(isinstance(s, QuarantineSpec) for s in specs)

        due = self.escalation_due(root_cause, ctx, state)
        if due is not None and not quarantine_wanted:
            esc, seen = due
            plan.escalated = True
            plan.escalation = esc.id
            quarantine_wanted = True
            wanted.append((QuarantineSpec(action="quarantine_node"), _escalation_reason(root_cause, ctx, esc, seen)))

        for spec in specs:
            wanted.append((spec, _reason(spec, root_cause, ctx)))

        blocked: list[I18nText] = []
        disabled = self.disabled_for(ctx.namespace)
        restarts_budget, backoff = self.budgets_for(ctx.namespace)
        breaker = self.spec.circuit_breaker

        for spec, reason in wanted:
            name = ActionName(spec.action)
            if name is ActionName.NOTIFY:
                plan.actions.append(PlannedAction(name, {}, reason))
                continue
            skip: I18nText | None = None
            if ctx.remediate_opt_out:
                skip = _OPT_OUT
                if _OPT_OUT not in blocked:
                    blocked.append(_OPT_OUT)
            elif mode is Mode.OBSERVE:
                skip = _OBSERVE
            elif name in disabled:
                skip = _t(
                    f"{name.value} is disabled for namespace {ctx.namespace} by the policy.",
                    f"策略对命名空间 {ctx.namespace} 禁用了 {name.value}。",
                )
            elif isinstance(spec, RaiseMemorySpec) and not spec.enabled:
                skip = _t(
                    "raise_memory_limit is opt-in and not enabled in the policy (enabled: false).",
                    "raise_memory_limit 需显式开启，策略中未开启（enabled: false）。",
                )
            elif name is ActionName.QUARANTINE_NODE:
                skip = self._check_quarantine(plan, ctx, state, breaker, blocked)
            elif name in RESTARTING:
                skip = self._check_restart(plan, ctx, state, restarts_budget, backoff, blocked)
            if skip is not None:
                plan.skipped.append(SkippedAction(name, skip))
                continue
            plan.actions.append(PlannedAction(name, self._params(spec, root_cause, ctx, quarantine_wanted), reason))

        if plan.breaker_open:
            # The breaker stops every change, not only the quarantine: a fault spreading over a pool
            # is more likely the platform (network, driver rollout) than the job, and a person decides.
            for a in [a for a in plan.actions if a.name is not ActionName.NOTIFY]:
                plan.actions.remove(a)
                plan.skipped.append(SkippedAction(a.name, blocked[-1]))
        if blocked:
            plan.blocked = I18nText(en=" ".join(b.en for b in blocked), zh="".join(b.zh for b in blocked))
        if not plan.actions or ((plan.page or plan.blocked) and plan.action(ActionName.NOTIFY) is None):
            plan.actions.append(PlannedAction(ActionName.NOTIFY, {}, _NOTIFY))
        notify = plan.action(ActionName.NOTIFY)
        if notify is not None:
            notify.params["page"] = plan.page
        if rule is None or rule.hints:
            plan.hints = hints_for(root_cause.fault_class, findings, ctx.texts, book=self.hint_book)
        return plan

    def _check_quarantine(
        self, plan: Plan, ctx: PolicyContext, state: PolicyState, breaker: CircuitBreaker, blocked: list[I18nText]
    ) -> I18nText | None:
        if not ctx.node:
            plan.page = True
            why = _t(
                "The fault calls for isolating its node, but no node was localised: a person must find it.",
                "该故障需要隔离所在节点，但未能定位到节点：需要人工排查。",
            )
            blocked.append(why)
            return why
        since = ctx.now - breaker.window
        allowed = breaker.allowed(ctx.pool_size)
        if ctx.quarantined is not None:
            taken = (
                set(ctx.quarantined)
                | set(ctx.claimed)
                | state.reserved(_pool_key(ctx.pool), ctx.now - RESERVATION_HOLD_S)
            )
            if ctx.node in taken:
                return None  # already quarantined (or on its way): idempotent, not counted again
            done = len(taken)
        else:
            if state.count(EV_QUARANTINED_NODE, _node_key(ctx.node), since):
                return None  # already quarantined: idempotent, not counted again
            done = state.count(EV_QUARANTINE, _pool_key(ctx.pool), since)
        tripped = state.count(EV_BREAKER_OPEN, _pool_key(ctx.pool), since) > 0
        if not tripped and done < allowed:
            return None
        plan.page = True
        plan.breaker_open = True
        why = self._breaker_text(ctx, ctx.node, done, allowed)
        blocked.append(why)
        return why

    def _breaker_text(self, ctx: PolicyContext, node: str, done: int, allowed: int) -> I18nText:
        breaker = self.spec.circuit_breaker
        size = "?" if ctx.pool_size is None else str(ctx.pool_size)
        pool = "all nodes" if ctx.pool == ALL_NODES_POOL else f"pool {ctx.pool}"
        pool_zh = "全部节点" if ctx.pool == ALL_NODES_POOL else f"节点池 {ctx.pool}"
        window = format_duration(breaker.window)
        return _t(
            f"Circuit breaker open for {pool}: {done} of {size} nodes quarantined in the last {window} "
            f"(at most {allowed} allowed); node {node} is not quarantined. A person must look.",
            f"{pool_zh} 的熔断已打开：最近 {window} 内已隔离 {size} 个节点中的 {done} 个（最多允许 {allowed} 个），"
            f"节点 {node} 未被隔离，需要人工处理。",
        )

    def reserve_quarantine(
        self, node: str, ctx: PolicyContext, state: PolicyState, *, incident_id: str | None = None
    ) -> I18nText | None:
        """Take `node`'s place under the circuit breaker of `ctx.pool` right before it is tainted.

        The check and the reservation are one atomic step of the state (reserve, act, then
        `commit_quarantine`, or `release_quarantine` when the act did not happen), so faults planned
        at the same moment cannot all pass a count read before any of them acted. The places taken
        are the pool's nodes carrying our taint (`ctx.quarantined`, from the cluster) and the
        reservations not yet visible there. None when reserved; else why not (the breaker is then
        recorded open for its window).
        """
        breaker = self.spec.circuit_breaker
        allowed = breaker.allowed(ctx.pool_size)
        held = set(ctx.quarantined or ())
        since = ctx.now - breaker.window
        tripped = state.count(EV_BREAKER_OPEN, _pool_key(ctx.pool), since) > 0
        if node in held:
            return None
        if not tripped and state.reserve(
            _pool_key(ctx.pool), node, limit=allowed, held=held, t=ctx.now, since=ctx.now - RESERVATION_HOLD_S
        ):
            return None
        done = len(held | state.reserved(_pool_key(ctx.pool), ctx.now - RESERVATION_HOLD_S))
        self.commit_breaker(ctx, state, incident_id=incident_id)
        return self._breaker_text(ctx, node, done, allowed)

    def release_quarantine(self, node: str, ctx: PolicyContext, state: PolicyState) -> None:
        """Give back the place `reserve_quarantine` took for `node` (its taint was not written)."""
        state.release(_pool_key(ctx.pool), node)

    def _check_restart(
        self,
        plan: Plan,
        ctx: PolicyContext,
        state: PolicyState,
        budget: RestartBudget,
        backoff: Backoff,
        blocked: list[I18nText],
    ) -> I18nText | None:
        if not ctx.job_key:
            return _t(
                "The failed pods belong to no known workload: there is nothing to restart.",
                "故障 Pod 不属于任何已知的工作负载：没有可以重启的对象。",
            )
        if ctx.lineage_restarts >= budget.lifetime_max:
            plan.page = True
            why = _t(
                f"Lifetime restart cap reached: {ctx.job_key} was already recreated {ctx.lineage_restarts} times "
                f"(at most {budget.lifetime_max} per job lineage). It keeps failing: a person must look.",
                f"已达重启次数上限：{ctx.job_key} 已被重建 {ctx.lineage_restarts} 次"
                f"（每个作业谱系最多 {budget.lifetime_max} 次），作业反复失败，需要人工处理。",
            )
            blocked.append(why)
            return why
        recent = state.times(EV_RESTART, ctx.job_key, ctx.now - budget.window)
        window = format_duration(budget.window)
        if len(recent) >= budget.max:
            plan.page = True
            why = _t(
                f"Restart budget spent: {len(recent)} restarts of {ctx.job_key} in the last {window} "
                f"(at most {budget.max}). A person must look.",
                f"重启预算已用完：{ctx.job_key} 在最近 {window} 内已重启 {len(recent)} 次"
                f"（最多 {budget.max} 次），需要人工处理。",
            )
            blocked.append(why)
            return why
        wait = backoff.delay(len(recent))
        if recent and ctx.now < recent[-1] + wait:
            plan.not_before = recent[-1] + wait
            left = format_duration(plan.not_before - ctx.now)
            why = _t(
                f"Backing off: {ctx.job_key} was restarted {format_duration(ctx.now - recent[-1])} ago; "
                f"the next restart may run at {_iso(plan.not_before)} (in {left}).",
                f"退避中：{ctx.job_key} 在 {format_duration(ctx.now - recent[-1])} 前刚重启过；"
                f"下一次重启最早可在 {_iso(plan.not_before)}（{left} 后）进行。",
            )
            blocked.append(why)
            return why
        return None

    def restart_refused(self, ctx: PolicyContext, state: PolicyState, incident_id: str) -> I18nText | None:
        """The restart budgets checked again when a planned restart is about to run (an approval may
        come long after the plan), and the restart's place in the budget reserved in the same atomic
        step of the state (reserve, act, then `commit_restart`, or `release_restart` when nothing was
        deleted): two brains restarting one job at once (a rebalance) cannot both spend its last
        restart. None when it may run, else why not."""
        budget, backoff = self.budgets_for(ctx.namespace)
        if incident_id and state.count(EV_DONE, f"{_incident_key(incident_id)}|restart", _EVER):
            return None  # this incident's own restart, already counted
        plan = Plan(incident_id=incident_id, mode=Mode.ENFORCE, matched="")
        why = self._check_restart(plan, ctx, state, budget, backoff, [])
        if why is not None or not ctx.job_key:
            return why
        since = ctx.now - budget.window
        done = {f"@{t!r}" for t in state.times(EV_RESTART, ctx.job_key, since)}
        if state.reserve(_restart_key(ctx.job_key), incident_id, limit=budget.max, held=done, t=ctx.now, since=since):
            return None
        return _t(
            f"Restart budget spent: another restart of {ctx.job_key} is under way and would use its last "
            f"place (at most {budget.max} in {format_duration(budget.window)}). A person must look.",
            f"重启预算已用完：{ctx.job_key} 的另一次重启正在进行，将用掉最后的名额"
            f"（{format_duration(budget.window)} 内最多 {budget.max} 次），需要人工处理。",
        )

    def release_restart(self, ctx: PolicyContext, state: PolicyState, incident_id: str) -> None:
        """Give back the place `restart_refused` reserved (the workload was not deleted)."""
        if ctx.job_key:
            state.release(_restart_key(ctx.job_key), incident_id)

    def _params(self, spec: ActionSpec, rc: RootCause, ctx: PolicyContext, quarantine: bool) -> dict[str, Any]:
        exclude = [ctx.node] if ctx.node and (quarantine or getattr(spec, "exclude_node", False)) else []
        if isinstance(spec, QuarantineSpec):
            return {
                "node": ctx.node,
                "device": ctx.device,
                "fault_class": rc.fault_class.value,
                "code": rc.code,
                "pool": ctx.pool,
            }
        if isinstance(spec, DumpStacksSpec):
            return {"job_key": ctx.job_key}
        if isinstance(spec, RaiseMemorySpec):
            return {
                "job_key": ctx.job_key,
                "factor": spec.factor,
                "max": spec.max,
                "max_bytes": spec.max_bytes,
                "exclude_nodes": exclude,
            }
        return {"job_key": ctx.job_key, "exclude_nodes": exclude}

    # -- recording what was done --

    @staticmethod
    def _once(state: PolicyState, incident_id: str | None, what: str, now: float) -> bool:
        """False when `what` was already recorded for this incident (no incident: always True)."""
        if incident_id is None:
            return True
        key = f"{_incident_key(incident_id)}|{what}"
        if state.count(EV_DONE, key, _EVER):
            return False
        state.record(EV_DONE, key, now)
        return True

    def commit_restart(self, ctx: PolicyContext, state: PolicyState, *, incident_id: str | None = None) -> bool:
        """Record a restart of `ctx.job_key` (spends the budget, starts the backoff). Returns whether recorded."""
        if not ctx.job_key or not self._once(state, incident_id, "restart", ctx.now):
            return False
        state.record(EV_RESTART, ctx.job_key, ctx.now)
        if incident_id:
            # Recorded: the reservation has become the restart (counted once more meanwhile: conservative).
            state.release(_restart_key(ctx.job_key), incident_id)
        return True

    def commit_quarantine(
        self, node: str, ctx: PolicyContext, state: PolicyState, *, incident_id: str | None = None
    ) -> bool:
        """Record the quarantine of `node` in `ctx.pool`. Returns whether it counted for the breaker.

        A node already quarantined within the breaker's window is not counted twice.
        """
        if not node or not self._once(state, incident_id, "quarantine", ctx.now):
            return False
        counted = not state.count(EV_QUARANTINED_NODE, _node_key(node), ctx.now - self.spec.circuit_breaker.window)
        if counted:
            state.record(EV_QUARANTINE, _pool_key(ctx.pool), ctx.now)
        state.record(EV_QUARANTINED_NODE, _node_key(node), ctx.now)
        return counted

    def commit_breaker(self, ctx: PolicyContext, state: PolicyState, *, incident_id: str | None = None) -> bool:
        """Record that the breaker of `ctx.pool` tripped: it then stays open for its window."""
        if not self._once(state, incident_id, "breaker", ctx.now):
            return False
        state.record(EV_BREAKER_OPEN, _pool_key(ctx.pool), ctx.now)
        return True

    def commit(
        self, plan: Plan, ctx: PolicyContext, state: PolicyState, executed: Collection[ActionName] | None = None
    ) -> list[str]:
        """Record the actions really carried out (all of the plan's, or `executed`), and a tripped breaker.

        Call it when (and only when) actions were executed. Idempotent per incident and action.
        Returns the kinds of events recorded.
        """
        names = set(plan.names() if executed is None else executed)
        recorded: list[str] = []
        if names & RESTARTING and self.commit_restart(ctx, state, incident_id=plan.incident_id):
            recorded.append(EV_RESTART)
        quarantine = plan.action(ActionName.QUARANTINE_NODE)
        node = (quarantine.params.get("node") if quarantine else None) or ctx.node
        if (
            ActionName.QUARANTINE_NODE in names
            and node
            and self.commit_quarantine(node, ctx, state, incident_id=plan.incident_id)
        ):
            recorded.append(EV_QUARANTINE)
        if plan.breaker_open and self.commit_breaker(ctx, state, incident_id=plan.incident_id):
            recorded.append(EV_BREAKER_OPEN)
        return recorded


# --- texts ------------------------------------------------------------------------------------


def _t(en: str, zh: str) -> I18nText:
    return I18nText(en=en, zh=zh)


_OPT_OUT = _t(
    f'The workload opted out of remediation ({OPT_OUT_ANNOTATION}: "false"): notify only.',
    f'该工作负载已选择不自动修复（{OPT_OUT_ANNOTATION}: "false"）：仅通知。',
)
_OBSERVE = _t("Observe mode: diagnose and notify only.", "观察模式：只诊断和通知。")
_NOTIFY = _t("Tell the team what happened and what was done.", "通知团队发生了什么、做了什么。")


def _what(rc: RootCause) -> tuple[str, str]:
    vendor = f", vendor action {rc.vendor_action}" if rc.vendor_action else ""
    vendor_zh = f"，厂商建议 {rc.vendor_action}" if rc.vendor_action else ""
    return f"{rc.code} ({rc.fault_class.value}{vendor})", f"{rc.code}（{rc.fault_class.value}{vendor_zh}）"


def _reason(spec: ActionSpec, rc: RootCause, ctx: PolicyContext) -> I18nText:
    what, what_zh = _what(rc)
    node = ctx.node or "?"
    job = ctx.job_key or "?"
    if isinstance(spec, QuarantineSpec):
        return _t(
            f"Node {node} reported {what}: keep new work off it until someone checks it.",
            f"节点 {node} 上报 {what_zh}：在人工检查前不再向其调度新任务。",
        )
    if isinstance(spec, RestartSpec):
        return _t(
            f"Restart {job} from its latest complete checkpoint after {what}.",
            f"在 {what_zh} 之后，从最近的完整检查点重启 {job}。",
        )
    if isinstance(spec, DumpStacksSpec):
        return _t(
            f"Take the Python stacks of {job}'s training processes into the scene before anything restarts them.",
            f"在重启之前，将 {job} 训练进程的 Python 调用栈保存到现场。",
        )
    if isinstance(spec, RaiseMemorySpec):
        return _t(
            f"Recreate {job} with memory limits raised {spec.factor}x (at most {spec.max}) after {what}.",
            f"在 {what_zh} 之后，将内存限制提高到 {spec.factor} 倍（最多 {spec.max}）并重建 {job}。",
        )
    return _NOTIFY


def _escalation_reason(rc: RootCause, ctx: PolicyContext, rule: EscalationRule, seen: int) -> I18nText:
    what, what_zh = _what(rc)
    where = f"node {ctx.node}" + (f" device {ctx.device}" if rule.scope == "device" else "")
    where_zh = f"节点 {ctx.node}" + (f" 设备 {ctx.device}" if rule.scope == "device" else "")
    window = format_duration(rule.window)
    return _t(
        f"{what} seen {seen} times on {where} within {window} (escalation {rule.id}: {rule.times} times): "
        f"isolate node {ctx.node}.",
        f"{where_zh} 在 {window} 内出现 {what_zh} {seen} 次（升级规则 {rule.id}：{rule.times} 次）："
        f"隔离节点 {ctx.node}。",
    )


# --- loading ----------------------------------------------------------------------------------


def _clean_loc(loc: Sequence[int | str]) -> list[int | str]:
    """Drop the tag a discriminated union adds after an action's index."""
    out: list[int | str] = []
    for i, part in enumerate(loc):
        if i >= 2 and loc[i - 2] == "actions" and isinstance(loc[i - 1], int) and part in ActionName._value2member_map_:
            continue
        out.append(part)
    return out


def _ids(root: Any, data: Mapping[str, Any], name: str) -> list[Problem]:
    """Duplicate ids across rules and escalation rules, and repeated namespace entries."""
    problems: list[Problem] = []
    seen: dict[str, int | None] = {}
    for section in ("escalation", "rules"):
        items = data.get(section)
        if not isinstance(items, list):
            continue
        for i, item in enumerate(items):
            ident = item.get("id") if isinstance(item, dict) else None
            if not isinstance(ident, str):
                continue
            line = node_line(root, [section, i, "id"])
            if ident in seen:
                problems.append(
                    Problem(name, line, f"duplicate id {ident!r}, first defined at line {seen[ident]}", ident)
                )
            else:
                seen[ident] = line
    matches: dict[str, int | None] = {}
    namespaces = data.get("namespaces")
    if isinstance(namespaces, list):
        for i, item in enumerate(namespaces):
            pattern = item.get("match") if isinstance(item, dict) else None
            if not isinstance(pattern, str):
                continue
            line = node_line(root, ["namespaces", i, "match"])
            if pattern in matches:
                problems.append(
                    Problem(name, line, f"namespace {pattern!r} is listed twice, first at line {matches[pattern]}")
                )
            else:
                matches[pattern] = line
    return problems


def _unreachable(spec: PolicyFile, root: Any, name: str) -> list[Problem]:
    for i, rule in enumerate(spec.rules):
        if rule.match.is_catch_all and i + 1 < len(spec.rules):
            return [
                Problem(
                    name,
                    node_line(root, ["rules", j, "id"]),
                    f"rule is never reached: catch-all rule {rule.id!r} comes first",
                    later.id,
                    warning=True,
                )
                for j, later in enumerate(spec.rules[i + 1 :], start=i + 1)
            ]
    return []


def parse_policy(text: str, name: str = "<policy>", *, hints: HintBook | None = None) -> Policy:
    """Validate a policy document. Raises PolicyError listing every problem with its line."""
    root, data, problem = parse_yaml(text, name)
    if problem is not None:
        raise PolicyError([problem])
    if not isinstance(data, dict):
        raise PolicyError([Problem(name, 1, "a policy file is a mapping with `mode`, `rules`, `budgets`, ...")])
    problems: list[Problem] = []
    spec: PolicyFile | None = None
    try:
        spec = PolicyFile.model_validate(data)
    except ValidationError as exc:
        for err in exc.errors():
            loc = _clean_loc(err["loc"])
            rule_id = None
            if len(loc) >= 2 and loc[0] in ("rules", "escalation") and isinstance(loc[1], int):
                items = data.get(str(loc[0]))
                item = items[loc[1]] if isinstance(items, list) and loc[1] < len(items) else None
                rule_id = item.get("id") if isinstance(item, dict) and isinstance(item.get("id"), str) else None
            problems.append(Problem(name, node_line(root, loc), format_error({**err, "loc": loc}), rule_id))
    problems.extend(_ids(root, data, name))
    if spec is not None:
        problems.extend(_unreachable(spec, root, name))
    if spec is None or any(not p.warning for p in problems):
        problems.sort(key=lambda p: (p.line or 0, p.message))
        raise PolicyError(problems)
    return Policy(spec, hints or default_hints(), name, tuple(problems))


def load_policy(path: str | Path | None = None, *, hints_path: str | Path | None = None) -> Policy:
    """Load a policy file (None: the shipped default) and its hints. Raises PolicyError."""
    p = POLICY_FILE if path is None else Path(path)
    try:
        book = default_hints() if hints_path is None else load_hints(hints_path)
    except HintError as exc:
        raise PolicyError(exc.problems) from None
    got = read_data_file(p, MAX_POLICY_FILE_BYTES)
    if isinstance(got, Problem):
        raise PolicyError([got])
    return parse_policy(got[1], str(p), hints=book)


def opt_out(annotations: Mapping[str, Any] | None) -> bool:
    """Whether a workload's annotations opt it out of remediation."""
    value = (annotations or {}).get(OPT_OUT_ANNOTATION)
    return isinstance(value, str) and value.strip().lower() in ("false", "no", "off", "0")


__all__ = [
    "ALL_NODES_POOL",
    "DEFAULT_BACKOFF",
    "DEFAULT_RESTARTS",
    "OPT_OUT_ANNOTATION",
    "POLICY_FILE",
    "RESTARTING",
    "ActionName",
    "Backoff",
    "CircuitBreaker",
    "DumpStacksSpec",
    "EscalationRule",
    "Match",
    "Mode",
    "Plan",
    "PlannedAction",
    "Policy",
    "PolicyContext",
    "PolicyError",
    "PolicyFile",
    "PolicyRule",
    "RestartBudget",
    "SkippedAction",
    "format_duration",
    "load_policy",
    "opt_out",
    "parse_duration",
    "parse_policy",
    "parse_quantity",
]
