"""The remediation actions, one module each, in a registry keyed by action name.

    remediations/actions/
        base.py                      ActionDef, ActionCall, the Journal and Runtime protocols
        notify.py                    notify
        quarantine_node.py           quarantine_node (circuit breaker: reserve, act, commit)
        restart_from_checkpoint.py   restart_from_checkpoint (the journalled delete and create)
        raise_memory_limit.py        raise_memory_limit (the same restart, more memory)
        dump_stacks.py               dump_stacks (the training processes' stacks into the scene, best effort)

A new action is a module with an `ACTION = ActionDef(...)` and a line in `ACTIONS` below, plus its
name in remediations.policy.ActionName and its spec there. The responder keeps only the per-key
queue and the incident's state machine; it calls `ACTIONS[name].run(call)`.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from trainmedic.remediations.actions import (
    dump_stacks,
    notify,
    quarantine_node,
    raise_memory_limit,
    restart_from_checkpoint,
)
from trainmedic.remediations.actions.base import ActionCall, ActionDef, Entry, Journal, Runtime

ACTIONS: Mapping[str, ActionDef] = MappingProxyType(
    {
        a.name: a
        for a in (
            notify.ACTION,
            quarantine_node.ACTION,
            restart_from_checkpoint.ACTION,
            raise_memory_limit.ACTION,
            dump_stacks.ACTION,
        )
    }
)

__all__ = ["ACTIONS", "ActionCall", "ActionDef", "Entry", "Journal", "Runtime"]
