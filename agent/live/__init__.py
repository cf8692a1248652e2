"""Read-only diagnosis of the live cluster on the current kubeconfig: `trainmedic diagnose --job` and
`trainmedic scan`.

`diagnose --job [NAMESPACE/]NAME` finds the workload (PyTorchJob, MPIJob, Volcano Job, batch/v1 Job,
or any other owner of pods: the pods whose ownerReferences name it, or the pod of that name), reads
its pods' container logs (the current and the previous instance, a bounded tail of each), the events
of the workload, of its pods and of their nodes, the nodes' status, and classifies them with the same
engine and attribution as `diagnose --scene`: a log's findings take its pod, namespace, node
(pod.spec.nodeName) and rank (RANK env, the replica or completion index). What is classified is what
a scene bundle keeps (redacted, bounded, each log named by its file there: agent/jobinputs.py), and
`--save DIR` writes that bundle (remediations/scene/, the agent's own layout) from what was read,
so `diagnose --scene DIR` gives the same JSON.

`scan [-n NS | -A]` lists the training workloads that failed or are restarting, each with the
diagnosis `diagnose --job` gives it; the failing training pods no training workload owns (bare pods,
pods of a ReplicaSet, StatefulSet, RayJob, ...: see `loose_training_pods`), one entry per owner with
its diagnosis; and the nodes with problems (NotReady or unreachable,
trainmedic's quarantine taint, an accelerator or node-problem-detector condition), each with a
one-line reason.

Only GET and LIST requests are made (nothing is written); every request has a (connect, read)
timeout, at most `concurrency` run at once, and the whole command a deadline.

The parts: `access` (the limits, `LiveError` and its causes, the API client from the kubeconfig and the
read-only operations over it), `reader` (`Reader`: a workload, its pods, logs, events and nodes read into
a `JobScene`), `triage` (which workloads, pods and nodes are in trouble, and `scan` itself). This package
re-exports what the rest of trainmedic and its tests import.
"""

from trainmedic.agent.live.access import LiveError, parse_job
from trainmedic.agent.live.reader import JobScene, Reader, with_ops
from trainmedic.agent.live.triage import pod_trouble, scan, training_pod

__all__ = [
    "JobScene",
    "LiveError",
    "Reader",
    "parse_job",
    "pod_trouble",
    "scan",
    "training_pod",
    "with_ops",
]
