"""Events on the bus: one versioned envelope, a typed payload per kind, and the partition keys.

Everything the watchers observe and everything the brain concludes travels as an `Event`, encoded
as JSON (pydantic-core, so encode/decode stays off the Python hot path). The rules that make
ordering and ownership hold (docs/architecture.md):

* an event that concerns a training job is keyed by the job (`job:<namespace>/<name>`), so one
  job's logs, pod statuses and device signals land on one partition, in order, and exactly one
  brain (the consumer that owns that partition) correlates and acts on the job;
* an event that concerns only a node is keyed by the node (`node:<name>`);
* a node-level signal that concerns jobs (a kernel Xid on a node running two jobs) is published once
  per job, same event `id`, so each job's owner sees it; consumers de-duplicate by `id`.

`v` is the schema version. A consumer that meets a version it does not know, a malformed body or an
oversized message sets it aside on `trainmedic.dlq` (`DeadLetter`) and goes on.
"""

from __future__ import annotations

import time
import uuid
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from trainmedic.models import Diagnosis, Finding, I18nText, RootCause

SCHEMA_VERSION = 1
# A message larger than this is refused by producers and set aside by consumers (Kafka's own
# default message.max.bytes is 1 MiB; a log batch is cut well below it).
MAX_MESSAGE_BYTES = 1_000_000


class Topic(StrEnum):
    """The bus topics (docs/contracts.md)."""

    K8S = "trainmedic.k8s"
    LOGS = "trainmedic.logs"
    KERNEL = "trainmedic.kernel"
    METRICS = "trainmedic.metrics"
    FINDINGS = "trainmedic.findings"
    DIAGNOSES = "trainmedic.diagnoses"
    INCIDENTS = "trainmedic.incidents"
    DLQ = "trainmedic.dlq"


INPUT_TOPICS: tuple[Topic, ...] = (Topic.K8S, Topic.LOGS, Topic.KERNEL, Topic.METRICS)


class JobRef(BaseModel):
    """The training job a pod belongs to: the top-most controller that owns it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    namespace: str
    name: str
    # batch/v1 Job, batch.volcano.sh/v1alpha1 Job, kubeflow.org/v1 PyTorchJob, or Pod for a bare pod.
    kind: str = "Job"
    api_version: str = "batch/v1"

    @property
    def key(self) -> str:
        return job_key(self.namespace, self.name)


def job_key(namespace: str, name: str) -> str:
    return f"job:{namespace}/{name}"


def node_key(node: str) -> str:
    return f"node:{node}"


class _Payload(BaseModel):
    model_config = ConfigDict(extra="forbid")


class LogBatch(_Payload):
    """Consecutive lines of one container's log (one pod, one container, one rank)."""

    kind: Literal["log_batch"] = "log_batch"
    node: str | None = None
    namespace: str
    pod: str
    container: str
    job: JobRef | None = None
    rank: int | None = None
    # The file the lines came from (CRI log path) or "api" when followed through the API server.
    file: str | None = None
    # Offset (line number, 1-based) of the first line within `file`, for evidence references.
    first_line: int = 1
    lines: list[str]
    # Per-line wall-clock times (CRI timestamps); empty when the source does not stamp lines.
    times: list[float] = Field(default_factory=list)


class KernelBatch(_Payload):
    """Kernel messages of one node (/dev/kmsg, a kern.log file or journald)."""

    kind: Literal["kernel_batch"] = "kernel_batch"
    node: str
    # The jobs with pods on this node when the lines were read (the fan-out copy's own job is `job`).
    job: JobRef | None = None
    source: str = "kmsg"
    first_line: int = 1
    lines: list[str]
    times: list[float] = Field(default_factory=list)


class MetricSample(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # One name of udal.METRIC_VOCABULARY (accelerator_utilization, xid_errors, ecc_dbe, health, ...).
    name: str
    value: float
    device: str | None = None
    # The vendor metric it was read from (DCGM_FI_DEV_GPU_UTIL, npu_chip_info_health_status, ...).
    vendor_name: str | None = None


class MetricBatch(_Payload):
    """Accelerator metrics of one node at one instant, in the unified vocabulary."""

    kind: Literal["metric_batch"] = "metric_batch"
    node: str
    chip: str
    job: JobRef | None = None
    # "prometheus" or "nvml" (or "npu-smi").
    origin: str
    samples: list[MetricSample]


class PodStatus(_Payload):
    """A training pod as the API server reports it (one per change)."""

    kind: Literal["pod_status"] = "pod_status"
    namespace: str
    pod: str
    uid: str | None = None
    node: str | None = None
    job: JobRef | None = None
    rank: int | None = None
    phase: str | None = None
    # The pod's own reason (status.reason: NodeLost, Evicted, Shutdown, ...; else the reason of a
    # true DisruptionTarget condition: DeletionByTaintManager, PreemptionByScheduler, ...).
    reason: str | None = None
    # metadata.deletionTimestamp is set: the pod is Terminating.
    terminating: bool = False
    deleted: bool = False
    # One entry per container: name, ready, restarts, state, reason, exit_code, signal, oom_killed.
    containers: list[dict[str, object]] = Field(default_factory=list)
    labels: dict[str, str] = Field(default_factory=dict)


class K8sEvent(_Payload):
    """A core/v1 Event (FailedScheduling, BackOff, OOMKilling, Evicted, ...)."""

    kind: Literal["k8s_event"] = "k8s_event"
    namespace: str | None = None
    type: str | None = None
    reason: str | None = None
    message: str = ""
    object_kind: str | None = None
    object_name: str | None = None
    node: str | None = None
    job: JobRef | None = None
    count: int = 1
    uid: str | None = None


class NodeStatus(_Payload):
    """A node's conditions, taints and accelerator capacity."""

    kind: Literal["node_status"] = "node_status"
    node: str
    # Set on the copies published once per job with pods on an unhealthy or deleted node (keyed by
    # the job, same event id), as kernel lines are: each job's owner sees the node it lost.
    job: JobRef | None = None
    deleted: bool = False
    unschedulable: bool = False
    conditions: dict[str, str] = Field(default_factory=dict)
    # The reason of each condition that has one (Ready: KubeletReady, KubeletNotReady, NodeStatusUnknown).
    reasons: dict[str, str] = Field(default_factory=dict)
    taints: list[str] = Field(default_factory=list)
    # Extended resources: nvidia.com/gpu, huawei.com/Ascend910, cambricon.com/mlu -> count.
    accelerators: dict[str, int] = Field(default_factory=dict)
    chip: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)


class WorkloadStatus(_Payload):
    """A training workload (batch/v1 Job, Volcano Job, Kubeflow PyTorchJob)."""

    kind: Literal["workload_status"] = "workload_status"
    job: JobRef
    deleted: bool = False
    # Running | Succeeded | Failed | Pending | ... as the controller reports it.
    phase: str | None = None
    # Why it is in that phase, when the controller says (BackoffLimitExceeded, DeadlineExceeded, ...).
    reason: str | None = None
    replicas: int | None = None
    annotations: dict[str, str] = Field(default_factory=dict)


class FindingEvent(_Payload):
    kind: Literal["finding"] = "finding"
    job: JobRef | None = None
    finding: Finding


class DiagnosisEvent(_Payload):
    """A job's diagnosis. Re-published with a higher `revision` while its window is open."""

    kind: Literal["diagnosis"] = "diagnosis"
    diagnosis_id: str
    revision: int = 1
    final: bool = False
    job: JobRef | None = None
    node: str | None = None
    window_start: float
    window_end: float
    # The ids of the input events whose lines are the evidence.
    evidence: list[str] = Field(default_factory=list)
    diagnosis: Diagnosis
    # When nothing explains the failure (root cause `unknown`): the last error-looking lines of each
    # rank ("rank <n>" or the pod's name -> lines, oldest first, bounded) and the containers' exit
    # codes ("<pod>/<container>" -> code), so the owner gets what there is.
    error_lines: dict[str, list[str]] = Field(default_factory=dict)
    exit_codes: dict[str, int] = Field(default_factory=dict)


class IncidentEvent(_Payload):
    """An incident's state after each step of the responder (scene saved, planned, acted, resolved).

    Published on `trainmedic.incidents`, keyed like the job, so the ops integration (webhooks,
    reports) sees every change of one incident in order. `actions` carry each action's name, state,
    params and result as the incident store records them.
    """

    kind: Literal["incident"] = "incident"
    incident_id: str
    status: str
    job: JobRef | None = None
    node: str | None = None
    root_cause: RootCause | None = None
    mode: str | None = None
    scene_dir: str | None = None
    plan: dict[str, Any] | None = None
    actions: list[dict[str, Any]] = Field(default_factory=list)
    hints: list[I18nText] = Field(default_factory=list)


class DeadLetter(_Payload):
    kind: Literal["dead_letter"] = "dead_letter"
    reason: str
    topic: str
    partition: int | None = None
    offset: int | None = None
    key: str | None = None
    # The first 4 KiB of the refused message (as text, undecodable bytes replaced).
    head: str = ""
    size: int = 0


Payload = Annotated[
    LogBatch
    | KernelBatch
    | MetricBatch
    | PodStatus
    | K8sEvent
    | NodeStatus
    | WorkloadStatus
    | FindingEvent
    | DiagnosisEvent
    | IncidentEvent
    | DeadLetter,
    Field(discriminator="kind"),
]


class Event(BaseModel):
    """The envelope every bus message is."""

    model_config = ConfigDict(extra="forbid")

    v: int = SCHEMA_VERSION
    id: str = Field(default_factory=lambda: uuid.uuid4().hex)
    # Wall-clock seconds when the producer observed it.
    time: float = Field(default_factory=time.time)
    # Who produced it: "<role>/<node or host>".
    producer: str = ""
    key: str
    payload: Payload

    def encode(self) -> bytes:
        return self.model_dump_json(exclude_defaults=False).encode()


class EventError(ValueError):
    """A message that is not a usable event; `reason` is what goes to the DLQ."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def decode(data: bytes | None) -> Event:
    """Parse one bus message, or raise EventError with a one-line reason."""
    if data is None:
        raise EventError("empty message (tombstone)")
    if len(data) > MAX_MESSAGE_BYTES:
        raise EventError(f"oversized message: {len(data)} bytes > {MAX_MESSAGE_BYTES}")
    try:
        event = Event.model_validate_json(data)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ())) or "body"
        if where == "v" or _version_of(data) not in (None, SCHEMA_VERSION):
            raise EventError(
                f"unknown schema version {_version_of(data)!r} (this agent reads v{SCHEMA_VERSION})"
            ) from e
        raise EventError(f"malformed event: {where}: {first.get('msg', 'invalid')} ({e.error_count()} errors)") from e
    if event.v != SCHEMA_VERSION:
        raise EventError(f"unknown schema version {event.v!r} (this agent reads v{SCHEMA_VERSION})")
    return event


def _version_of(data: bytes) -> object:
    import json

    try:
        obj = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return None
    return obj.get("v") if isinstance(obj, dict) else None


def event_key(payload: BaseModel) -> str:
    """The partition key of a payload: its job when it has one, else its node, else its pod."""
    job = getattr(payload, "job", None)
    if isinstance(job, JobRef):
        return job.key
    node = getattr(payload, "node", None)
    if isinstance(node, str) and node:
        return node_key(node)
    ns, pod = getattr(payload, "namespace", None), getattr(payload, "pod", None)
    if isinstance(pod, str):
        return f"pod:{ns}/{pod}"
    return "cluster"


def make_event(payload: Payload, *, producer: str = "", key: str | None = None, at: float | None = None) -> Event:
    return Event(
        producer=producer,
        key=key or event_key(payload),
        payload=payload,
        time=at if at is not None else time.time(),
    )
