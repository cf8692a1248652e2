"""quarantine_node: cordon, taint `trainmedic.io/unhealthy`, label, annotate and condition the node.

Preconditions: the fault is localised to a node (else skipped); the circuit breaker of the node's
pool has room, checked against the cluster's own count (the pool's nodes carrying our taint) and
reserved in the same atomic step (reserve, act, commit; released when nothing was written), so
faults acted on at the same moment cannot all pass. A full pool raises ActionBlocked.
"""

from __future__ import annotations

import dataclasses

from remediations.actions.base import ActionCall, ActionDef
from remediations.errors import ActionBlocked
from remediations.policy import QuarantineSpec


async def run(call: ActionCall) -> None:
    rt, rc = call.runtime, call.rc
    node = call.entry.params.get("node") or rc.node
    if not node:
        call.journal.update(call.seq, "skipped", result={"reason": "the fault is not localised to a node"})
        return
    call.journal.update(call.seq, "running", params=dict(call.entry.params, node=node))
    nodes = await rt.kube.list_nodes()
    pool, pool_size = rt.policy.pool_of(node, nodes)
    ctx = dataclasses.replace(
        rt.policy_context(call.incident_id, rc),
        node=node,
        pool=pool,
        pool_size=pool_size,
        quarantined=rt.policy.pool_quarantined(node, nodes),
    )
    refused = rt.policy.reserve_quarantine(node, ctx, rt.policy_state, incident_id=call.incident_id)
    if refused is not None:
        raise ActionBlocked(refused)
    try:
        result = await rt.kube.quarantine_node(
            node, incident_id=call.incident_id, fault_class=rc.fault_class.value, reason=rc.summary.en
        )
    except BaseException:
        rt.policy.release_quarantine(node, ctx, rt.policy_state)
        raise
    rt.policy.commit_quarantine(node, ctx, rt.policy_state, incident_id=call.incident_id)
    call.journal.update(
        call.seq, "done", result={"node": node, "changed": result.changed, "already_by": result.already_by}
    )


ACTION = ActionDef(
    name="quarantine_node",
    spec=(QuarantineSpec,),
    parameters=("node", "device", "fault_class", "code", "pool"),
    preconditions=("the fault is localised to a node", "the circuit breaker of the node's pool has room"),
    run=run,
)
