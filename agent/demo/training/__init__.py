"""The emulated cluster's moving parts: controllers, scheduler, kubelet, training processes, node logs.

`KubeEmulator` + `Cluster` (emulator.py) serve the Kubernetes API and act as the kubelet when asked;
this module is what asks, as a cluster's own components would, so the real agent sees a cluster
that behaves like one:

* `Controllers`: the batch/v1 Job and Volcano Job controllers (pods from the workload's pod
  template, labelled and owned as those controllers do, uids stamped as the API server stamps
  them), the scheduler (nodes with the accelerators the pods request, Ready, not cordoned, no
  untolerated NoSchedule taint, node affinity and nodeSelector honoured, gang-scheduled) and the
  garbage collector (a deleted workload's pods go with it);
* `TrainingRun`: the processes of one incarnation of a job: start-up lines, the resume from the
  checkpoint its pod's env names (`TRAINMEDIC_RESUME_FROM` / `TRAINMEDIC_RESUME_STEP`, which
  trainmedic's recreation sets), a progress line per step, checkpoints written to the shared volume
  file by file in the framework's order (commit marker last), so a crash mid-save leaves what a real
  one leaves;
* `NodeKernelLogs`: each node's /var/log/kern.log, followed by the node agent's real kernel source.

Everything runs on the caller's event loop; nothing sleeps longer than a poll interval.

The parts: `checkpoints` (the checkpoint files a run writes, whole or cut short), `run` (a job's
profile, its ranks and incarnations, `World`, and `TrainingRun`, the simulated training), `controllers`
(`Controllers`: the job controllers' work, pods scheduled on the nodes that fit). This package keeps
the node kernel logs and re-exports every public name.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

from trainmedic.agent.bus.base import Bus
from trainmedic.agent.demo.logs import kern_log_line
from trainmedic.agent.demo.training.checkpoints import ACCELERATORS, write_hf_checkpoint, write_megatron_checkpoint
from trainmedic.agent.demo.training.controllers import Controllers, unschedulable_reason
from trainmedic.agent.demo.training.run import Incarnation, JobProfile, RankPod, TrainingRun, World
from trainmedic.agent.jobindex import JobIndex
from trainmedic.agent.telemetry import Telemetry

__all__ = [
    "ACCELERATORS",
    "Controllers",
    "Incarnation",
    "JobProfile",
    "NodeKernelLogs",
    "RankPod",
    "TrainingRun",
    "World",
    "unschedulable_reason",
    "write_hf_checkpoint",
    "write_megatron_checkpoint",
]

log = logging.getLogger("trainmedic.demo")


# -- the nodes' kernel logs ----------------------------------------------------------------------------


class NodeKernelLogs:
    """Each emulated node's /var/log/kern.log (rsyslog format), in a directory of the demo's."""

    def __init__(self, root: Path, nodes: Sequence[str]) -> None:
        self.root = root
        self.nodes = list(nodes)
        self.booted = {n: time.time() - 86_400 - 1_000 * i for i, n in enumerate(self.nodes)}
        for n in self.nodes:
            self.path(n).parent.mkdir(parents=True, exist_ok=True)
            self.path(n).touch()

    def path(self, node: str) -> Path:
        return self.root / node / "kern.log"

    def write(self, node: str, *messages: str) -> None:
        now = time.time()
        with self.path(node).open("a", encoding="utf-8") as f:
            for m in messages:
                f.write(kern_log_line(node, now, now - self.booted[node], m) + "\n")

    def sources(
        self, *, bus: Bus, job_index: JobIndex, telemetry: Telemetry, poll_interval: float = 0.1
    ) -> dict[str, Callable[[], Awaitable[None]]]:
        """The node agent's kernel source for each node (agent/watchers/kernel.py), as components."""
        from trainmedic.agent.watchers.kernel import KernelFileSource

        out: dict[str, Callable[[], Awaitable[None]]] = {}
        for n in self.nodes:
            src = KernelFileSource(
                self.path(n),
                bus=bus,
                node=n,
                job_index=job_index,
                telemetry=telemetry,
                producer=f"node/{n}",
                start_at="end",
                poll_interval=poll_interval,
            )
            out[f"node-agent/{n}/kernel"] = src.run
        return out
