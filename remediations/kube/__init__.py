"""The Kubernetes operations the responder performs, with their failures typed by what to do next.

Remediation acts on a live cluster that other people and controllers change at the same time, so
every operation here is written to be safe to repeat and to race (each module's docstring says how).

The parts:

- `errors`: the KubeError tree, each error with its retry semantics, and `classify` (with
  `retry_after` and `api_message`), which maps what the official client raised onto it;
- `resources`: the names the agent writes (trainmedic.io/...), the resources as the API and RBAC
  name them (`_Res`, `_What`: one API call described), and helpers on the API's JSON (name checks,
  label selectors, `_identify`);
- `client`: `own_client` and `KubeOps`: its threads, the retrying call, reads, workloads (delete with
  a uid precondition, create that finds its own object), pods, logs, exec, finalizers, events, and
  the read-modify-write with optimistic concurrency that every write of ours goes through;
- `pods`: `PodRunMixin`, the pods trainmedic runs itself (create, delete), inherited by KubeOps;
- `nodes`: `NodeQuarantineMixin`, the node operations KubeOps inherits (quarantine and release,
  claims, node problems as conditions and Events), with `QuarantineResult`, `problem_condition`
  and `fault_reason`.

A call's way through: a KubeOps method (client, nodes) checks the names it puts into a URL and
describes the call as a `_What` (resources) -> the blocking client runs in one of KubeOps' threads
(`_request`, client) -> what it raised is classified (errors): a temporary error is retried with
backoff and jitter, anything else is raised, typed, at once. A write of ours reads the object,
computes a patch and writes it with the resourceVersion it read, reading again on a 409.

The RBAC the deploy files grant is read from the code: tests/project/test_deploy.py and
tests/project/test_deploy_allinone.py collect the `_What(verb, RESOURCE, ...)` of every module here.

This package re-exports the names the rest of trainmedic and its tests import from it.
"""

from trainmedic.remediations.kube.client import KubeOps, own_client
from trainmedic.remediations.kube.errors import (
    ConflictError,
    KubeError,
    KubeForbidden,
    KubeInvalid,
    KubeNotFound,
    PermanentKubeError,
    ReleaseRefused,
    TemporaryKubeError,
    api_message,
    retry_after,
)
from trainmedic.remediations.kube.nodes import QuarantineResult, fault_reason, problem_condition
from trainmedic.remediations.kube.resources import (
    ANN_INCIDENT,
    ANN_QUARANTINE_REASON,
    ANN_QUARANTINED_AT,
    ANN_WAS_UNSCHEDULABLE,
    CONDITION_TYPE,
    JOBS,
    LABEL_QUARANTINED,
    LOG_BYTES,
    MPI_JOBS,
    NODES,
    PODS,
    PREFIX,
    PROBLEM_ACCELERATOR,
    PROBLEM_CONDITIONS,
    PROBLEM_NODE,
    PYTORCH_JOBS,
    READ_WORKLOADS,
    SCENE_FINALIZER,
    TAINT_EFFECT,
    TAINT_KEY,
    VOLCANO_JOBS,
    WORKLOADS,
)
from trainmedic.remediations.kube.resources import _check_names as _check_names
from trainmedic.remediations.kube.resources import _Res as _Res
from trainmedic.remediations.kube.resources import _What as _What

__all__ = [
    "ANN_INCIDENT",
    "ANN_QUARANTINED_AT",
    "ANN_QUARANTINE_REASON",
    "ANN_WAS_UNSCHEDULABLE",
    "CONDITION_TYPE",
    "JOBS",
    "LABEL_QUARANTINED",
    "LOG_BYTES",
    "MPI_JOBS",
    "NODES",
    "PODS",
    "PREFIX",
    "PROBLEM_ACCELERATOR",
    "PROBLEM_CONDITIONS",
    "PROBLEM_NODE",
    "PYTORCH_JOBS",
    "READ_WORKLOADS",
    "SCENE_FINALIZER",
    "TAINT_EFFECT",
    "TAINT_KEY",
    "VOLCANO_JOBS",
    "WORKLOADS",
    "ConflictError",
    "KubeError",
    "KubeForbidden",
    "KubeInvalid",
    "KubeNotFound",
    "KubeOps",
    "PermanentKubeError",
    "QuarantineResult",
    "ReleaseRefused",
    "TemporaryKubeError",
    "api_message",
    "fault_reason",
    "own_client",
    "problem_condition",
    "retry_after",
]
