"""The circuit breaker and the restart budgets of a policy: `LimitsMixin`, the half of `Policy`
(core.py) that keeps their books. At plan time it checks a quarantine against its pool's share and a
restart against the job's budget, backoff and lifetime cap; right before acting it reserves the
place (`reserve_quarantine`, `restart_refused`) and gives it back when nothing was done; after
acting it records what was done (`commit`, `commit_restart`, `commit_quarantine`,
`commit_breaker`), once per incident and action.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING

from trainmedic.models import I18nText
from trainmedic.remediations.policy.plan import Plan, PolicyContext
from trainmedic.remediations.policy.schema import Backoff, CircuitBreaker, PolicyFile, RestartBudget
from trainmedic.remediations.policy.state import (
    _EVER,
    EV_BREAKER_OPEN,
    EV_DONE,
    EV_QUARANTINE,
    EV_QUARANTINED_NODE,
    EV_RESTART,
    RESERVATION_HOLD_S,
    _incident_key,
    _iso,
    _node_key,
    _pool_key,
    _restart_key,
)
from trainmedic.remediations.policy.texts import _t
from trainmedic.remediations.policy.values import ALL_NODES_POOL, RESTARTING, ActionName, Mode, format_duration
from trainmedic.remediations.policy_state import PolicyState


class LimitsMixin:
    """The circuit breaker's and the restart budgets' checks, reservations and records. `Policy`
    inherits them; what they use of it is declared below."""

    if TYPE_CHECKING:
        spec: PolicyFile

        def budgets_for(self, namespace: str | None) -> tuple[RestartBudget, Backoff]: ...

    def breaker_refusal(
        self, node: str, ctx: PolicyContext, state: PolicyState, done: int, *, incident_id: str | None = None
    ) -> I18nText:
        """Why `node` is not quarantined (its pool's share is taken); the breaker is recorded open."""
        self.commit_breaker(ctx, state, incident_id=incident_id)
        return self._breaker_text(ctx, node, done, self.spec.circuit_breaker.allowed(ctx.pool_size))

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
