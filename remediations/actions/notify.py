"""notify: the incident's state goes to `trainmedic.incidents` (and so to every sink) with each status
the responder publishes; the action itself only records that, and whether a person is paged."""

from __future__ import annotations

from trainmedic.remediations.actions.base import ActionCall, ActionDef
from trainmedic.remediations.policy import NotifySpec

TOPIC = "trainmedic.incidents"


async def run(call: ActionCall) -> None:
    await call.journal.update(call.seq, "done", result={"published": TOPIC})


ACTION = ActionDef(
    name="notify",
    spec=(NotifySpec,),
    parameters=("page",),
    preconditions=(),
    run=run,
    mutating=False,
)
