"""quarantine_node: cordon, taint `trainmedic.io/unhealthy`, label, annotate and condition the node.

Preconditions: the fault is localised to a node (else skipped); the circuit breaker of the node's
pool has room. The room is checked twice, both times right before the taint, so a plan approved
late is judged on the cluster as it is when it runs:

1. within this brain, against the cluster's own count (the pool's nodes carrying our taint) and
   reserved in the same atomic step of the policy state (reserve, act, commit; released when
   nothing was written), so faults this brain acts on at the same moment cannot all pass;
2. across brains, which share nothing but the cluster: the node gets a claim annotation
   (`trainmedic.io/breaker-claim: <time> <incident>`), the brain waits `breaker_settle_s` (longer
   than a write takes to land, and than the brains' clocks differ), lists the pool again, and ranks
   the claims and taints there as every brain does (tainted nodes, then claims oldest first, then
   by node name): past the share it backs off (the claim is removed). The first claims of the order
   go through, the others back off, whichever brain wrote them.

A full pool raises ActionBlocked. A pool whose share is all of it has nothing to count.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from typing import Any

from trainmedic.remediations.actions.base import ActionCall, ActionDef
from trainmedic.remediations.errors import ActionBlocked
from trainmedic.remediations.kube import KubeOps
from trainmedic.remediations.policy import (
    CLAIM_ANNOTATION,
    RESERVATION_HOLD_S,
    Policy,
    PolicyContext,
    QuarantineSpec,
    format_claim,
)

log = logging.getLogger("trainmedic.responder")


async def pool_nodes(kube: KubeOps, policy: Policy, node: str | None) -> list[dict[str, Any]]:
    """The Node objects of `node`'s circuit-breaker pool, read fresh from the API: only that pool's
    (one read of the node, one list by the pool label) when it has one, all nodes otherwise. On a
    cluster of thousands of nodes in many pools this keeps each incident's read to its pool."""
    if node and policy.pool_label:
        selector = policy.pool_selector(await kube.get_node(node))
        if selector is not None:
            return await kube.list_nodes(label_selector=selector)
    return await kube.list_nodes()


async def _claim(call: ActionCall, node: str, ctx: PolicyContext) -> bool:
    """Take `node`'s place among the claims of its pool in the cluster (step 2 above); raises
    ActionBlocked (the claim removed) when the place is past the pool's share. Whether a claim was
    written (none when the whole pool may go)."""
    rt = call.runtime
    allowed = rt.policy.spec.circuit_breaker.allowed(ctx.pool_size)
    if ctx.pool_size is not None and allowed >= ctx.pool_size:
        return False  # the whole pool may go: nothing to rank
    at = rt.clock()
    await rt.kube.annotate_node(node, CLAIM_ANNOTATION, format_claim(at, call.incident_id))
    try:
        await asyncio.sleep(rt.settings.breaker_settle_s)
        nodes = await pool_nodes(rt.kube, rt.policy, node)
        tainted = rt.policy.pool_quarantined(node, nodes) - {node}
        claims = rt.policy.pool_claims(node, nodes, since=at - RESERVATION_HOLD_S)
        mine = (at, node)
        ahead = set(tainted) | {n for c, n in claims if (c, n) < mine and n != node}
    except BaseException:
        with contextlib.suppress(Exception):
            await rt.kube.annotate_node(node, CLAIM_ANNOTATION, None)
        raise
    if len(ahead) >= allowed:
        with contextlib.suppress(Exception):
            await rt.kube.annotate_node(node, CLAIM_ANNOTATION, None)
        log.info(
            "incident %s: node %s backs off: %d of the pool's %d places are taken",
            call.incident_id,
            node,
            len(ahead),
            allowed,
        )
        raise ActionBlocked(
            await rt.in_policy(
                rt.policy.breaker_refusal, node, ctx, rt.policy_state, len(ahead), incident_id=call.incident_id
            )
        )
    return True


async def run(call: ActionCall) -> None:
    rt, rc = call.runtime, call.rc
    node = call.entry.params.get("node") or rc.node
    if not node:
        await call.journal.update(call.seq, "skipped", result={"reason": "the fault is not localised to a node"})
        return
    await call.journal.update(call.seq, "running", params=dict(call.entry.params, node=node))
    # Two independent reads, from the API and the store: side by side. (gather, not a task group:
    # the first error surfaces as itself, with its retry meaning; the other read simply finishes.)
    nodes, base = await asyncio.gather(pool_nodes(rt.kube, rt.policy, node), rt.policy_context(call.incident_id, rc))
    pool, pool_size = rt.policy.pool_of(node, nodes)
    quarantined = rt.policy.pool_quarantined(node, nodes)
    ctx = dataclasses.replace(
        base,
        node=node,
        pool=pool,
        pool_size=pool_size,
        quarantined=quarantined,
    )
    refused = await rt.in_policy(rt.policy.reserve_quarantine, node, ctx, rt.policy_state, incident_id=call.incident_id)
    if refused is not None:
        raise ActionBlocked(refused)
    claimed = False
    try:
        if node not in quarantined:
            claimed = await _claim(call, node, ctx)
        result = await rt.kube.quarantine_node(
            node, incident_id=call.incident_id, fault_class=rc.fault_class.value, reason=rc.summary.en
        )
    except BaseException:
        await rt.in_policy(rt.policy.release_quarantine, node, ctx, rt.policy_state)
        raise
    await rt.in_policy(rt.policy.commit_quarantine, node, ctx, rt.policy_state, incident_id=call.incident_id)
    await call.journal.update(
        call.seq, "done", result={"node": node, "changed": result.changed, "already_by": result.already_by}
    )
    if claimed:
        # The taint counts now; the claim has done its part (a claim left behind expires anyway).
        with contextlib.suppress(Exception):
            await rt.kube.annotate_node(node, CLAIM_ANNOTATION, None)


ACTION = ActionDef(
    name="quarantine_node",
    spec=(QuarantineSpec,),
    parameters=("node", "device", "fault_class", "code", "pool"),
    preconditions=(
        "the fault is localised to a node",
        "the circuit breaker of the node's pool has room, in this brain and among the claims of every brain",
    ),
    run=run,
)
