"""The keys a policy records its history under in the `PolicyState` (the kinds of events, `EV_*`,
and the keys of pools, restarts, nodes and incidents), how long a reserved quarantine holds its
place (`RESERVATION_HOLD_S`), and the breaker claim a brain writes on a node right before tainting
it (`CLAIM_ANNOTATION`, read and written by `parse_claim` and `format_claim`).
"""

from __future__ import annotations

import math

from trainmedic.timefmt import rfc3339

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
