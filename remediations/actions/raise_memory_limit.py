"""raise_memory_limit: the restart of restart_from_checkpoint with the containers' memory raised by
`factor` up to `max_bytes` (skipped when the plan restarts the job anyway: that restart applies it)."""

from __future__ import annotations

from trainmedic.remediations.actions import restart_from_checkpoint
from trainmedic.remediations.actions.base import ActionDef
from trainmedic.remediations.policy import RaiseMemorySpec

ACTION = ActionDef(
    name="raise_memory_limit",
    spec=(RaiseMemorySpec,),
    parameters=("job_key", "factor", "max", "max_bytes", "exclude_nodes", "identity"),
    preconditions=restart_from_checkpoint.ACTION.preconditions,
    run=restart_from_checkpoint.run,
)
