"""Workload adapters: the body that recreates a training workload so it resumes from a checkpoint
on healthy nodes.

Restarting a training job in place rarely helps: its pods land on the same broken node and start
from step 0. The restart action therefore deletes the workload and creates it again from the body
built here, a pure function of the live object (camelCase dicts, as a dynamic GET or
`ApiClient.sanitize_for_serialization` gives them; no API calls):

* identity kept: same apiVersion, kind, name, namespace, labels and the user's annotations, so
  dashboards, quotas and the user's own tooling still find it; what the API server or a controller
  set (uid, resourceVersion, managedFields, status, a batch/v1 Job's generated selector and labels)
  is dropped, or the create would be refused or would select the old pods;
* healthy nodes only: every pod template gets a required node affinity
  `kubernetes.io/hostname NotIn [...]`, added to every nodeSelectorTerm (terms are ORed) and
  replacing the one an earlier restart added, so repeated restarts never stack;
* resume: the checkpoint path and step go into env (`trainmedic.io/resume-env`, default
  `TRAINMEDIC_RESUME_FROM`, and `TRAINMEDIC_RESUME_STEP`) and, when the workload declares
  `trainmedic.io/resume-args`, into the container args; the args appended last time are recorded
  in `trainmedic.io/resume-args-applied` and replaced, not stacked;
* the history travels with the workload: `trainmedic.io/lineage` (bounded), the incident, the
  checkpoint resumed from, the nodes excluded and the restart count.

Supported: batch/v1 Job (Indexed too), Volcano batch.volcano.sh/v1alpha1 Job (gang settings kept),
Kubeflow kubeflow.org/v1 PyTorchJob (elastic too). A workload controlled by another controller
(a CronJob's Job, a pipeline's PyTorchJob) is refused: that controller would fight the recreation.

Build the body before deleting anything: every refusal happens here, while the job still exists.

Errors (all permanent: the same input gives the same answer; each carries `reason`, an I18nText):

    WorkloadError
    ├── UnsupportedWorkload        a kind we cannot restart, or one owned by another controller
    │   └── MalformedWorkload      the object lacks what the kind requires (no name, no template)
    ├── InvalidResumeConfig        the resume annotations cannot be applied (bad env name, no such container)
    │   └── InvalidResumeTemplate  trainmedic.io/resume-args is not a valid template
    ├── OptedOut                   trainmedic.io/remediate: "false"
    └── QuantityError              a Kubernetes quantity that does not parse

The parts: `kinds` (the annotations, the errors, the supported kinds, and the helpers that read a
workload's body defensively), `resume` (the job's resume settings and its arguments' template),
`templates` (pod templates, selectors, lineage and excluded nodes; memory quantities and a raised
limit), `recreate` (the replacement's body: `build_recreation`, `recreate_body`). This package
re-exports every public name.
"""

from __future__ import annotations

from trainmedic.remediations.workloads.kinds import (
    ANN_CHECKPOINT_DIR,
    ANN_EXCLUDED_NODES,
    ANN_INCIDENT,
    ANN_LINEAGE,
    ANN_REMEDIATE,
    ANN_RESTARTS,
    ANN_RESUME_ARGS,
    ANN_RESUME_ARGS_APPLIED,
    ANN_RESUME_CONTAINER,
    ANN_RESUME_ENV,
    ANN_RESUMED_FROM,
    DEFAULT_RESUME_ENV,
    HOSTNAME_LABEL,
    JOB,
    LINEAGE_LIMIT,
    PYTORCH_JOB,
    RESUME_STEP_ENV,
    SUPPORTED,
    VOLCANO_JOB,
    InvalidResumeConfig,
    InvalidResumeTemplate,
    MalformedWorkload,
    OptedOut,
    QuantityError,
    UnsupportedWorkload,
    WorkloadError,
    WorkloadKind,
    workload_kind,
    workload_kind_for,
)
from trainmedic.remediations.workloads.recreate import Recreation, build_recreation, recreate_body
from trainmedic.remediations.workloads.resume import CheckpointRef, ResumeSpec, render_resume_args, resume_spec
from trainmedic.remediations.workloads.templates import (
    MemoryChange,
    excluded_nodes,
    format_quantity,
    job_pod_selector,
    lineage,
    memory_bytes,
    parse_quantity,
    pod_templates,
    pod_templates_by_path,
    raise_memory,
)

__all__ = [
    "ANN_CHECKPOINT_DIR",
    "ANN_EXCLUDED_NODES",
    "ANN_INCIDENT",
    "ANN_LINEAGE",
    "ANN_REMEDIATE",
    "ANN_RESTARTS",
    "ANN_RESUMED_FROM",
    "ANN_RESUME_ARGS",
    "ANN_RESUME_ARGS_APPLIED",
    "ANN_RESUME_CONTAINER",
    "ANN_RESUME_ENV",
    "DEFAULT_RESUME_ENV",
    "HOSTNAME_LABEL",
    "JOB",
    "LINEAGE_LIMIT",
    "PYTORCH_JOB",
    "RESUME_STEP_ENV",
    "SUPPORTED",
    "VOLCANO_JOB",
    "CheckpointRef",
    "InvalidResumeConfig",
    "InvalidResumeTemplate",
    "MalformedWorkload",
    "MemoryChange",
    "OptedOut",
    "QuantityError",
    "Recreation",
    "ResumeSpec",
    "UnsupportedWorkload",
    "WorkloadError",
    "WorkloadKind",
    "build_recreation",
    "excluded_nodes",
    "format_quantity",
    "job_pod_selector",
    "lineage",
    "memory_bytes",
    "parse_quantity",
    "pod_templates",
    "pod_templates_by_path",
    "raise_memory",
    "recreate_body",
    "render_resume_args",
    "resume_spec",
    "workload_kind",
    "workload_kind_for",
]
