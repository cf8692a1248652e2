"""Settings of the agent: one YAML file, every field documented, environment overrides on top.

    trainmedic run --config trainmedic.yaml --role all|node|cluster|brain

Groups mirror the pipeline: `bus`, `kubernetes`, `logs`, `kernel`, `metrics`, `detect`,
`remediate`. Every field has a default, so an empty file (or none) is the embedded default: memory bus, everything in
one process. Environment variables override the file: `TRAINMEDIC_<GROUP>__<FIELD>` (double
underscore between levels), e.g. `TRAINMEDIC_BUS__KIND=kafka`,
`TRAINMEDIC_BUS__BOOTSTRAP=kafka-0:9092`, `TRAINMEDIC_NODE_NAME` (the Downward API's
spec.nodeName for the DaemonSet). Values are parsed as YAML scalars (`true`, `15`, `[a, b]`).

Validation collects every problem (`location: message`) and refuses to start; unknown keys are
errors, so a typo is caught rather than silently ignored.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from trainmedic.errors import TrainmedicError

ENV_PREFIX = "TRAINMEDIC_"


class Role(StrEnum):
    NODE = "node"
    CLUSTER = "cluster"
    BRAIN = "brain"
    ALL = "all"


class _Group(BaseModel):
    model_config = ConfigDict(extra="forbid")


class BusSettings(_Group):
    kind: Literal["memory", "kafka"] = Field(
        "memory", description="memory: in-process (one process, `--role all` only); kafka: Apache Kafka via aiokafka."
    )
    bootstrap: str = Field("localhost:9092", description="Kafka bootstrap servers, comma-separated host:port.")
    partitions: int = Field(12, ge=1, description="Partitions of each topic when the agent creates it.")
    compression: Literal["zstd", "lz4", "gzip", "none"] = Field(
        "zstd", description="Producer batch compression (zstd needs Kafka >= 2.1)."
    )
    linger_ms: int = Field(5, ge=0, le=1000, description="How long the producer waits to fill a batch.")
    buffer_max: int = Field(100_000, ge=100, description="Events buffered while the broker is unreachable.")
    fetch_max_wait_ms: int = Field(
        20, ge=1, le=5000, description="Longest a consumer fetch waits at the broker (bounds detection latency)."
    )
    group: str = Field("trainmedic-brain", description="Consumer group of the brains (they split jobs by partition).")
    client_id: str = Field("trainmedic", description="Kafka client id prefix.")


class KubernetesSettings(_Group):
    enabled: bool = Field(True, description="Watch the Kubernetes API (cluster role; node role: its own pods).")
    kubeconfig: str | None = Field(None, description="Path to a kubeconfig; unset: in-cluster config, then ~/.kube.")
    namespaces: list[str] = Field(default_factory=list, description="Namespaces to watch; empty: all.")
    label_selector: str | None = Field(None, description="Only pods with these labels (e.g. a training platform's).")
    workloads: bool = Field(True, description="Watch Jobs, Volcano Jobs and PyTorchJobs as well as pods.")
    follow_pod_logs: bool = Field(
        False, description="Follow training pods' logs through the API (small clusters without the node role)."
    )


class LogsSettings(_Group):
    enabled: bool = Field(True, description="Tail container logs on this node (node role).")
    root: str = Field("/var/log/pods", description="kubelet's CRI log directory.")
    poll_interval_s: float = Field(1.0, gt=0, description="How often new pod log files are looked for.")
    read_interval_s: float = Field(0.25, gt=0, description="How often known log files are read for new lines.")
    start_at: Literal["end", "start"] = Field("end", description="Where to start in files found at startup.")
    position_store: str | None = Field(
        "/var/lib/trainmedic/positions.json", description="Read positions kept across restarts; null: none."
    )


class KernelSettings(_Group):
    source: Literal["kmsg", "file", "journald", "off"] = Field("kmsg", description="Where kernel messages come from.")
    path: str = Field("/dev/kmsg", description="/dev/kmsg, or the kernel log file for `file`.")
    position_store: str | None = Field(
        "/var/lib/trainmedic/kernel-position.json",
        description="Last kernel record read (kmsg sequence, file offset or journal cursor); null: start at the end.",
    )


class MetricsSettings(_Group):
    prometheus_url: str | None = Field(None, description="Prometheus with the device exporters; null: off.")
    interval_s: float = Field(15.0, gt=0, description="How often device metrics are queried.")
    nvml: bool = Field(True, description="Read NVIDIA GPUs through NVML on this node, where a driver is present.")


class DetectSettings(_Group):
    rule_dirs: list[str] = Field(default_factory=list, description="Extra rule directories beside the shipped rules.")
    engine: Literal["auto", "fast", "re"] = Field("auto", description="Hyperscan when installed (auto), or `re`.")
    window_s: float = Field(30.0, gt=0, description="Seconds a job's diagnosis window gathers evidence.")
    hang_floor_s: float = Field(300.0, gt=0, description="Shortest silence that can be a hang.")
    hang_factor: float = Field(3.0, gt=1, description="A hang is silence longer than this many step intervals.")


class RemediateSettings(_Group):
    enabled: bool = Field(True, description="Run the responder in the brain: scene, policy, actions (per the mode).")
    mode: Literal["observe", "dry-run", "approve", "enforce"] | None = Field(
        None,
        description="Overrides the policy file's mode. dry-run (the shipped policy's mode) records the plan "
        "and changes nothing; approve waits for `trainmedic approve`; enforce acts.",
    )
    policy: str | None = Field(None, description="Policy YAML; null: the shipped remediations/policy.yaml.")
    store: str = Field("/var/lib/trainmedic/trainmedic.db", description="SQLite incident store (journal, approvals).")
    scene_dir: str = Field("/var/lib/trainmedic/scenes", description="Where scene bundles are written.")
    log_lines: int = Field(10_000, ge=10, le=1_000_000, description="Last lines kept per container in a scene.")
    stacks: bool = Field(True, description="For a hang, dump every rank's stacks (exec) before pods are killed.")
    checkpoint_path_map: dict[str, str] = Field(
        default_factory=dict,
        description="Checkpoint paths as jobs declare them -> where this agent mounts them (prefix map).",
    )
    wait_gone_s: float = Field(120.0, gt=0, description="How long a deleted workload may take to disappear.")


class Settings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    node_name: str = Field(default_factory=socket.gethostname, description="This node (env TRAINMEDIC_NODE_NAME).")
    log_format: Literal["json", "text"] = Field("json", description="Structured JSON logs, or text for people.")
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    bus: BusSettings = Field(default_factory=BusSettings)
    kubernetes: KubernetesSettings = Field(default_factory=KubernetesSettings)
    logs: LogsSettings = Field(default_factory=LogsSettings)
    kernel: KernelSettings = Field(default_factory=KernelSettings)
    metrics: MetricsSettings = Field(default_factory=MetricsSettings)
    detect: DetectSettings = Field(default_factory=DetectSettings)
    remediate: RemediateSettings = Field(default_factory=RemediateSettings)


class ConfigError(TrainmedicError):
    """The configuration cannot be used; `problems` lists every one as `where: what`."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("invalid configuration:\n  " + "\n  ".join(problems))
        self.problems = problems


def _env_overrides(env: Mapping[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, raw in env.items():
        if not name.startswith(ENV_PREFIX) or name in {"TRAINMEDIC_LANG"}:
            continue
        path = [p.lower() for p in name[len(ENV_PREFIX) :].split("__") if p]
        if not path:
            continue
        try:
            value = yaml.safe_load(raw) if raw != "" else None
        except yaml.YAMLError:
            value = raw
        cur = out
        for p in path[:-1]:
            nxt = cur.setdefault(p, {})
            if not isinstance(nxt, dict):
                break
            cur = nxt
        else:
            cur[path[-1]] = value
    return out


def _merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = v
    return out


def load_settings(path: str | Path | None = None, env: Mapping[str, str] | None = None) -> Settings:
    """The settings from a YAML file (optional) with environment overrides; ConfigError lists all problems."""
    data: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        try:
            loaded = yaml.safe_load(p.read_text(encoding="utf-8"))
        except OSError as e:
            raise ConfigError([f"{p}: cannot read: {e.strerror or e}"]) from e
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            where = f"{p}:{mark.line + 1}" if mark is not None else str(p)
            raise ConfigError([f"{where}: not valid YAML: {getattr(e, 'problem', e)}"]) from e
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise ConfigError([f"{p}: the top level must be a mapping, not {type(loaded).__name__}"])
        data = loaded
    data = _merge(data, _env_overrides(os.environ if env is None else env))
    try:
        return Settings.model_validate(data)
    except ValidationError as e:
        problems = []
        for err in e.errors():
            where = ".".join(str(x) for x in err["loc"]) or "(top level)"
            problems.append(f"{where}: {err['msg']}")
        raise ConfigError(problems) from e


def check_role(settings: Settings, role: Role) -> list[str]:
    """Problems with running `role` under `settings` (beyond field validation)."""
    problems = []
    if role is not Role.ALL and settings.bus.kind == "memory":
        problems.append(
            f"bus.kind: the {role.value} role talks to other processes, so it needs bus.kind=kafka "
            "(the memory bus only works inside one process, --role all)"
        )
    return problems
