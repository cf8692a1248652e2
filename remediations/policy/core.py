"""`Policy`, a validated policy file with its hints: the settings that apply to a namespace (mode,
budgets, disabled actions), the rule that matches a root cause, the node pools of the circuit
breaker as the cluster shows them (`pool_of`, `pool_selector`, `pool_quarantined`, `pool_claims`),
the escalation counts (`observe_fault`, `escalation_due`) and `decide`, which turns an incident into
a `Plan`. The breaker's and budgets' books are kept by `LimitsMixin` (limits.py), which it inherits.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from trainmedic.errors import Problem
from trainmedic.models import Finding, I18nText, RootCause
from trainmedic.remediations.hints import HintBook, default_hints, hints_for
from trainmedic.remediations.policy.limits import LimitsMixin
from trainmedic.remediations.policy.plan import Plan, PlannedAction, PolicyContext, SkippedAction
from trainmedic.remediations.policy.schema import (
    DEFAULT_BACKOFF,
    DEFAULT_RESTARTS,
    ActionSpec,
    Backoff,
    DumpStacksSpec,
    EscalationRule,
    NamespacePolicy,
    NotifySpec,
    PolicyFile,
    PolicyRule,
    QuarantineSpec,
    RaiseMemorySpec,
    RestartBudget,
)
from trainmedic.remediations.policy.state import (
    _EVER,
    CLAIM_ANNOTATION,
    EV_FAULT,
    EV_FAULT_SEEN,
    TAINT_PREFIX,
    _incident_key,
    parse_claim,
)
from trainmedic.remediations.policy.texts import _NOTIFY, _OBSERVE, _OPT_OUT, _escalation_reason, _reason, _t
from trainmedic.remediations.policy.values import ALL_NODES_POOL, RESTARTING, ActionName, Mode
from trainmedic.remediations.policy_state import PolicyState


@dataclass(frozen=True)
class Policy(LimitsMixin):
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
