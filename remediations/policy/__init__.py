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

`Policy.decide` is pure given the `PolicyState` (recent history, see remediations/policy_state.py): it never
records. The caller records every fault occurrence (whatever the mode, before deciding) with
`Policy.observe_fault`, and what was really done with `Policy.commit` (or `commit_restart`,
`commit_quarantine`, `commit_breaker` action by action), so escalation, budgets and the breaker
see them.
The file is validated like the rule files: every problem is listed with file:line and a broken
policy refuses to load.

The parts:

- `values`: the modes and action names, and the values in the file (durations, memory quantities,
  globs) with the pydantic types that read them;
- `schema`: the file's pydantic models, from `Match` and the action specs to `PolicyFile`;
- `plan`: `Plan` (with `PlannedAction`, `SkippedAction`) and `PolicyContext`;
- `state`: the keys the policy records under in the `PolicyState`, and the breaker claims written on
  nodes (`CLAIM_ANNOTATION`, `format_claim`, `parse_claim`);
- `texts`: the plan's reasons in English and Chinese;
- `limits`: `LimitsMixin`, the circuit breaker's and the restart budgets' checks, reservations and
  records, which `Policy` inherits;
- `core`: `Policy`: namespaces, rule matching, node pools, escalation and `decide`;
- `load`: `parse_policy`, `load_policy`, `PolicyError` and `POLICY_FILE` (remediations/policy.yaml).

This package re-exports the names the rest of trainmedic and its tests import from it.
"""

from trainmedic.remediations.policy.core import Policy
from trainmedic.remediations.policy.limits import LimitsMixin
from trainmedic.remediations.policy.load import (
    MAX_POLICY_FILE_BYTES,
    POLICY_FILE,
    PolicyError,
    load_policy,
    parse_policy,
)
from trainmedic.remediations.policy.plan import Plan, PlannedAction, PolicyContext, SkippedAction
from trainmedic.remediations.policy.schema import (
    DEFAULT_BACKOFF,
    DEFAULT_RESTARTS,
    ActionSpec,
    Backoff,
    Budgets,
    CircuitBreaker,
    DumpStacksSpec,
    EscalationRule,
    Match,
    NamespacePolicy,
    NotifySpec,
    PolicyFile,
    PolicyRule,
    QuarantineSpec,
    RaiseMemorySpec,
    RestartBudget,
    RestartSpec,
)
from trainmedic.remediations.policy.state import (
    CLAIM_ANNOTATION,
    EV_BREAKER_OPEN,
    EV_DONE,
    EV_FAULT,
    EV_FAULT_SEEN,
    EV_QUARANTINE,
    EV_QUARANTINED_NODE,
    EV_RESTART,
    RESERVATION_HOLD_S,
    TAINT_PREFIX,
    format_claim,
    parse_claim,
)
from trainmedic.remediations.policy.values import (
    ALL_NODES_POOL,
    ID_RE,
    LABEL_KEY_RE,
    MAX_WINDOW_S,
    OPT_OUT_ANNOTATION,
    RESTARTING,
    ActionName,
    CodeGlob,
    Duration,
    Mode,
    NamespaceGlob,
    Quantity,
    RuleId,
    format_duration,
    opt_out,
    parse_duration,
    parse_quantity,
)

__all__ = [
    "ALL_NODES_POOL",
    "CLAIM_ANNOTATION",
    "DEFAULT_BACKOFF",
    "DEFAULT_RESTARTS",
    "EV_BREAKER_OPEN",
    "EV_DONE",
    "EV_FAULT",
    "EV_FAULT_SEEN",
    "EV_QUARANTINE",
    "EV_QUARANTINED_NODE",
    "EV_RESTART",
    "ID_RE",
    "LABEL_KEY_RE",
    "MAX_POLICY_FILE_BYTES",
    "MAX_WINDOW_S",
    "OPT_OUT_ANNOTATION",
    "POLICY_FILE",
    "RESERVATION_HOLD_S",
    "RESTARTING",
    "TAINT_PREFIX",
    "ActionName",
    "ActionSpec",
    "Backoff",
    "Budgets",
    "CircuitBreaker",
    "CodeGlob",
    "DumpStacksSpec",
    "Duration",
    "EscalationRule",
    "LimitsMixin",
    "Match",
    "Mode",
    "NamespaceGlob",
    "NamespacePolicy",
    "NotifySpec",
    "Plan",
    "PlannedAction",
    "Policy",
    "PolicyContext",
    "PolicyError",
    "PolicyFile",
    "PolicyRule",
    "Quantity",
    "QuarantineSpec",
    "RaiseMemorySpec",
    "RestartBudget",
    "RestartSpec",
    "RuleId",
    "SkippedAction",
    "format_claim",
    "format_duration",
    "load_policy",
    "opt_out",
    "parse_claim",
    "parse_duration",
    "parse_policy",
    "parse_quantity",
]
