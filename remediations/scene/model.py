"""The scene's shared ground: the bundle's schema version and manifest name, SceneError, the check of
an incident id (a bundle's directory name), the source a scene reads from (SceneSource), and what a
scene is given and gives back (SceneSettings, SceneInputs, SceneResult). Every other module of the
package builds on this one and on nothing else of it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import yaml

from trainmedic.errors import TrainmedicError
from trainmedic.events import DiagnosisEvent
from trainmedic.remediations.stacks import ExecResult
from trainmedic.udal.registry import env_prefixes, visible_devices_envs

SCHEMA_VERSION = 1
MANIFEST = "manifest.json"
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,200}$")

try:
    _YAML_DUMPER: Any = yaml.CSafeDumper
    _YAML_LOADER: Any = yaml.CSafeLoader
except AttributeError:  # pragma: no cover - PyYAML without libyaml
    _YAML_DUMPER = yaml.SafeDumper
    _YAML_LOADER = yaml.SafeLoader


class SceneError(TrainmedicError):
    """A bundle that cannot be written or read (bad incident id, corrupt manifest, ...)."""


def valid_bundle_name(name: str) -> bool:
    """Whether `name` can name a bundle's directory (the incident id: letters, digits, . _ -)."""
    return bool(_ID.match(name))


# ------------------------------------------------------------------------------------------------
# Inputs, settings, results


class SceneSource(Protocol):
    """Where the scene reads from: the API server (remediations.kube.KubeOps, exec over
    remediations.stacks.exec_in_pod) and the agent's metrics. Failures are recorded as problems.

    `list_events(namespace, involved=...)` returns the namespace's core/v1 events about the
    (kind, name) pairs given; `metrics_range` returns {series name: [(time, value), ...]} for a
    node, or None (or raises NotImplementedError) where no metrics source is configured."""

    async def pod_log(
        self,
        namespace: str,
        pod: str,
        container: str,
        *,
        tail_lines: int,
        previous: bool = False,
        limit_bytes: int = ...,
    ) -> str: ...

    async def list_events(self, namespace: str, *, involved: set[tuple[str, str]]) -> list[dict[str, Any]]: ...

    async def metrics_range(
        self, node: str, start: float, end: float, step: float
    ) -> Mapping[str, list[tuple[float, float]]] | None: ...

    async def exec(
        self, namespace: str, pod: str, container: str, command: list[str], *, timeout_s: float
    ) -> ExecResult: ...


ENV_ALLOW_NAMES = (
    "RANK",
    "WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "NODE_RANK",
    "GROUP_RANK",
    "NPROC_PER_NODE",
    "OMP_NUM_THREADS",
    "PYTHONUNBUFFERED",
    "TRAINMEDIC_RESUME_FROM",
    "TRAINMEDIC_RESUME_STEP",
)
ENV_ALLOW_PREFIXES = ("TORCH_", "PYTORCH_")
# Beside these, every chip plugin's visible-devices variables (CUDA_VISIBLE_DEVICES, ...) and
# collective-library prefixes (NCCL_, HCCL_, CNCL_, ...) are kept (SceneSettings' defaults).


@dataclass(frozen=True, kw_only=True)
class SceneSettings:
    """What a scene collects and its bounds (the `remediate.scene` settings)."""

    # Last lines kept per container instance (the current one and, after a restart, the previous).
    log_lines: int = 10_000
    # A file over this keeps its tail (logs) or is left out (objects); marked `truncated`.
    max_file_bytes: int = 8 << 20
    # Bulky files (logs, kernel, metrics, stacks, events) past this total are left out, each a problem.
    max_total_bytes: int = 256 << 20
    # Longer lines are cut to this many bytes (a marker says how much went).
    max_line_bytes: int = 64 << 10
    # Container logs fetched at the same time.
    concurrency: int = 16
    # Kernel lines kept from this long before the fault to this long after it, at most max_kernel_lines.
    kernel_before_s: float = 600.0
    kernel_after_s: float = 60.0
    max_kernel_lines: int = 20_000
    # Accelerator metrics of this window before the fault, at this resolution.
    metrics_window_s: float = 900.0
    # After the fault, up to the scene's own time: what the fault did to the devices.
    metrics_after_s: float = 60.0
    metrics_step_s: float = 15.0
    max_metric_series: int = 256
    max_metric_points: int = 4096
    max_events: int = 5000
    # Stack dumps for a hang (remediations.stacks), bounded per pod.
    stacks: bool = True
    stack_timeout_s: float = 20.0
    # fsync files and directories before the bundle is renamed into place (survives a power loss).
    durable: bool = True
    env_allow_names: tuple[str, ...] = field(default_factory=lambda: (*ENV_ALLOW_NAMES, *visible_devices_envs()))
    env_allow_prefixes: tuple[str, ...] = field(default_factory=lambda: (*env_prefixes(), *ENV_ALLOW_PREFIXES))

    def limits(self) -> dict[str, object]:
        out = asdict(self)
        out.pop("env_allow_names")
        out.pop("env_allow_prefixes")
        return out


@dataclass(frozen=True, kw_only=True)
class SceneInputs:
    """What the responder knows when it saves a scene. Objects are the API's JSON (camelCase dicts).

    `kernel_lines`: node -> [(wall-clock time, line)]; `ranks`: pod name -> rank, where the agent's
    job index knows it (else the pod's RANK env is used).
    """

    incident_id: str
    diagnosis: DiagnosisEvent
    workload: Mapping[str, Any] | None = None
    pods: Sequence[Mapping[str, Any]] = ()
    nodes: Sequence[Mapping[str, Any]] = ()
    kernel_lines: Mapping[str, Sequence[tuple[float, str]]] = field(default_factory=dict)
    checkpoints: Sequence[Mapping[str, Any]] = ()
    hang: bool = False
    now: float
    ranks: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class SceneResult:
    dir: Path
    manifest: dict[str, Any]
    # False: the bundle was already complete and was returned as it is.
    created: bool

    @property
    def problems(self) -> list[dict[str, Any]]:
        return list(self.manifest.get("problems") or [])
