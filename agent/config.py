"""Settings of the agent: one YAML file, every field documented, environment overrides on top.

    trainmedic run --config trainmedic.yaml --role all|node|cluster|brain

Groups mirror the pipeline: `bus`, `kubernetes`, `logs`, `kernel`, `metrics`, `detect`,
`remediate`, then the ops side: `notify` (webhook sinks and the outbox) and `api` (the HTTP
service). Every field has a default, so an empty file (or none) is the embedded default: memory
bus, everything in one process. Environment variables override the file: `TRAINMEDIC_<GROUP>__<FIELD>` (double
underscore between levels), e.g. `TRAINMEDIC_BUS__KIND=kafka`,
`TRAINMEDIC_BUS__BOOTSTRAP=kafka-0:9092`, `TRAINMEDIC_NODE_NAME` (the Downward API's
spec.nodeName for the DaemonSet). Values are parsed as YAML scalars (`true`, `15`, `[a, b]`).

Validation collects every problem (`location: message`) and refuses to start; unknown keys are
errors, so a typo is caught rather than silently ignored.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Mapping
from dataclasses import replace
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, model_validator

from trainmedic.datafile import load_yaml
from trainmedic.detectors.hang_state import HangSettings
from trainmedic.errors import TrainmedicError

ENV_PREFIX = "TRAINMEDIC_"


_log = logging.getLogger("trainmedic.config")


def secret_setting(
    value: SecretStr | None,
    env_name: str | None,
    file: str | None,
    *,
    what: str,
    env: Mapping[str, str] | None = None,
    unset: str = "",
) -> str | None:
    """A secret set three ways: the value itself, else the variable `env_name` names, else the file
    `file` (stripped); None when none gives one, with a warning naming the setting (`what`, e.g.
    "api.token") and what follows from it (`unset`) when a variable or file is named but empty or
    unreadable. The secret itself is never logged."""
    env = os.environ if env is None else env
    if value is not None and value.get_secret_value():
        return value.get_secret_value()
    if env_name:
        found = env.get(env_name, "").strip()
        if found:
            return found
        _log.warning("%s_env names %s, which is not set%s", what, env_name, unset)
    if file:
        try:
            found = Path(file).read_text(encoding="utf-8").strip()
        except OSError as e:
            _log.warning("%s_file %s cannot be read (%s)%s", what, file, e, unset)
        else:
            if found:
                return found
    return None


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
    memory_max_bytes: int = Field(
        256 << 20,
        ge=1 << 20,
        description="In-process bus: bytes a topic may hold uncommitted before publishers wait (back-pressure).",
    )
    memory_max_records: int = Field(
        200_000, ge=100, description="In-process bus: records a partition may hold uncommitted before publishers wait."
    )
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
    hang: HangSettings = Field(
        default_factory=HangSettings, description="The hang detector (detectors/hang.py), every field of it."
    )
    hang_floor_s: float | None = Field(
        None, gt=0, description="Older name of `hang.floor_s`; when set it overrides that (kept for existing files)."
    )
    hang_factor: float | None = Field(
        None, gt=1, description="Older name of `hang.factor`; when set it overrides that (kept for existing files)."
    )
    tick_s: float = Field(
        1.0, gt=0, le=60, description="How often closed windows are published and silent jobs checked for a hang."
    )
    job_grace_s: float = Field(
        120.0, gt=0, description="What the brain keeps about a job is let go this long after the job ended."
    )
    idle_s: float = Field(
        21_600.0, gt=0, description="What the brain keeps about a job (or node) with no event for this long is let go."
    )

    @model_validator(mode="after")
    def _fold_older_names(self) -> DetectSettings:
        if self.hang_floor_s is not None:
            self.hang = replace(self.hang, floor_s=self.hang_floor_s)
        if self.hang_factor is not None:
            self.hang = replace(self.hang, factor=self.hang_factor)
        return self


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
    checkpoint_reader: Literal["off", "auto", "pod"] = Field(
        "auto",
        description="How a job's checkpoints are listed: off, only where this agent sees the directory "
        "(checkpoint_path_map or the same path); pod, always by a short-lived reader pod in the job's "
        "namespace that mounts the job's checkpoint volume read only; auto, a reader pod when the directory "
        "is not visible here. A reader pod needs checkpoint_reader_image.",
    )
    checkpoint_reader_image: str | None = Field(
        None,
        description="trainmedic's own image, which the checkpoint reader pod runs (`trainmedic checkpoints DIR "
        "--json`); null: no reader pod.",
    )
    checkpoint_reader_timeout_s: float = Field(
        120.0, gt=0, le=3600, description="How long a checkpoint reader pod may take, pulling its image included."
    )
    wait_gone_s: float = Field(120.0, gt=0, description="How long a deleted workload may take to disappear.")
    breaker_settle_s: float = Field(
        2.0,
        ge=0,
        description="Between writing a node's circuit-breaker claim and reading its pool's claims back; longer "
        "than an API write takes and than the brains' clocks differ, so brains sharing the cluster never "
        "quarantine more than the pool's share between them.",
    )
    max_concurrent: int = Field(
        16, ge=1, le=1024, description="Incidents of different jobs handled at once (each job's stay serial)."
    )
    max_pending: int = Field(
        200,
        ge=1,
        description="Diagnoses waiting for a turn; past it the oldest are handled observe-only, with a note why.",
    )
    stack_timeout_s: float = Field(20.0, gt=0, description="How long the stack dump of a hung job may take.")
    metrics_window_s: float = Field(
        900.0, gt=0, description="Device metrics of this many seconds before a fault go into its scene."
    )
    metrics_after_s: float = Field(
        60.0,
        ge=0,
        description="... and of up to this many seconds after it, as far as the scene's time (what the fault did "
        "to the devices).",
    )
    metrics_step_s: float = Field(15.0, gt=0, description="The step of the scene's device metrics (a scrape interval).")
    body_dir: str | None = Field(
        None,
        description="Where a restart's full replacement body (env values included) waits between the delete and "
        "the create, mode 0600; null: `restart-bodies` beside `scene_dir`.",
    )
    gone_deadline_s: float = Field(
        3600.0,
        gt=0,
        description="A workload still terminating this long after its delete is escalated to a person (the "
        "replacement is still created once it is gone).",
    )
    approval_poll_s: float = Field(2.0, gt=0, description="How often pending approvals are looked for (approve mode).")
    retry_after_s: float = Field(10.0, gt=0, description="An action that failed temporarily is tried again after this.")
    retry_deadline_s: float = Field(
        1800.0,
        gt=0,
        description="An action still failing temporarily this long after its first retry (an API answering 5xx or "
        "409 for good, a restart waiting on another incident's replacement) is escalated: the incident turns "
        "blocked and pages a person while the action goes on being tried. A workload still terminating after "
        "its delete keeps its own deadline (gone_deadline_s).",
    )
    retry_max_s: float = Field(
        600.0,
        gt=0,
        description="Longest wait between two tries of a restart whose replacement the cluster refuses after the "
        "delete (quota, admission webhook, invalid, forbidden): the delay doubles from retry_after_s up to this.",
    )
    poll_ms: int = Field(100, ge=1, le=60_000, description="Longest wait of one poll for diagnoses on the bus.")
    max_records: int = Field(100, ge=1, le=100_000, description="Diagnoses read from the bus per poll.")
    reports: bool = Field(
        True, description="Write report.{en,zh}.{md,html} into the scene directory when an incident settles."
    )
    node_conditions: bool | None = Field(
        None,
        description="A node-level fault becomes a Node condition and an Event on the Node "
        "(node-problem-detector style), cleared when the node is released. null: when the mode acts "
        "(approve, enforce); true: in every mode; false: never.",
    )


SINK_KINDS = ("cloudevents", "alertmanager", "feishu", "dingtalk", "wecom", "slack")
CHAT_SINKS = frozenset({"feishu", "dingtalk", "wecom", "slack"})
# The sinks whose messages carry a signature made with `secret`.
SIGNED_SINKS = frozenset({"cloudevents", "feishu", "dingtalk"})
INCIDENT_STATUSES = frozenset(
    {"open", "observed", "awaiting_approval", "rejected", "acting", "resolved", "blocked", "failed"}
)
# Chat robots reach people: by default only what a person should read (what happened and was
# decided, what needs them, how it ended), not every intermediate step.
CHAT_DEFAULT_STATUSES = ("observed", "awaiting_approval", "rejected", "blocked", "failed", "resolved")


class SinkSettings(_Group):
    """One destination of incident notifications (`notify.sinks[]`)."""

    kind: Literal["cloudevents", "alertmanager", "feishu", "dingtalk", "wecom", "slack"] = Field(
        description="cloudevents: CloudEvents 1.0 JSON POSTed to `url`, HMAC-signed with `secret`; "
        "alertmanager: alerts pushed to `url`/api/v2/alerts; feishu, dingtalk, wecom, slack: the chat robot's "
        "incoming-webhook URL."
    )
    name: str | None = Field(
        None, pattern=r"^[A-Za-z0-9_.-]{1,64}$", description="Name in metrics and timelines; default: the kind."
    )
    url: str = Field(description="Webhook URL (Alertmanager: its base URL, e.g. http://alertmanager:9093).")
    secret: SecretStr | None = Field(
        None,
        description="Signing secret (cloudevents HMAC, Feishu / DingTalk signature); prefer secret_env. Never logged.",
    )
    secret_env: str | None = Field(None, description="Name of an environment variable holding the signing secret.")
    lang: Literal["en", "zh", "both"] = Field("both", description="Language of chat messages.")
    statuses: list[str] | None = Field(
        None,
        description="Incident statuses sent to this sink; default: all for cloudevents and alertmanager, "
        f"{', '.join(CHAT_DEFAULT_STATUSES)} for chat robots.",
    )
    timeout_s: float = Field(10.0, gt=0, le=300, description="Timeout of one delivery request.")
    burst: int | None = Field(
        None,
        ge=1,
        le=10_000,
        description="Messages sent one per notice within `window_s` before the rest are merged into one digest "
        "per window; default: 3 for chat robots, 5 otherwise (a 500-node outage stays under 10 messages a sink).",
    )
    window_s: float = Field(60.0, gt=0, le=86_400, description="The rate-limit window of `burst`.")
    max_batch: int = Field(500, ge=1, le=5000, description="Most notices merged into one digest or batch message.")
    headers: dict[str, SecretStr] = Field(
        default_factory=dict, description="Extra HTTP headers (e.g. Authorization for the receiver). Never logged."
    )
    tls_verify: bool = Field(True, description="Verify the receiver's TLS certificate.")
    resend_s: float = Field(
        60.0,
        ge=0,
        description="Alertmanager only: re-send the alerts of incidents still firing this often, so Alertmanager "
        "does not end them after its resolve_timeout (5 min by default); 0: never.",
    )
    resend_for_s: float = Field(
        86_400.0, gt=0, description="Alertmanager only: stop re-sending an alert this long after its state was sent."
    )

    @property
    def sink_name(self) -> str:
        return self.name or self.kind

    @property
    def effective_burst(self) -> int:
        if self.burst is not None:
            return self.burst
        return 3 if self.kind in CHAT_SINKS else 5

    @property
    def effective_statuses(self) -> frozenset[str]:
        if self.statuses is not None:
            return frozenset(self.statuses)
        return frozenset(CHAT_DEFAULT_STATUSES) if self.kind in CHAT_SINKS else INCIDENT_STATUSES

    @model_validator(mode="after")
    def _check(self) -> SinkSettings:
        problems = []
        if not self.url.startswith(("http://", "https://")):
            problems.append(f"url must be http:// or https://, not {self.url.split(':', 1)[0]!r}")
        if self.secret is not None and self.secret_env:
            problems.append("give secret or secret_env, not both")
        if (self.secret is not None or self.secret_env) and self.kind not in SIGNED_SINKS:
            problems.append(f"{self.kind} messages are not signed; put credentials in url or headers")
        unknown = sorted(set(self.statuses or ()) - INCIDENT_STATUSES)
        if unknown:
            problems.append(f"unknown statuses {unknown}; known: {sorted(INCIDENT_STATUSES)}")
        if problems:
            raise ValueError("; ".join(problems))
        return self


class NotifySettings(_Group):
    """Incident notifications: a durable outbox (in the incident store's file) delivering to `sinks`."""

    enabled: bool = Field(True, description="Send notifications to the configured sinks (brain role).")
    sinks: list[SinkSettings] = Field(default_factory=list, description="Where incidents are sent; empty: nowhere.")
    source: str = Field(
        "trainmedic", min_length=1, description="CloudEvents `source` (a URI reference naming this agent/cluster)."
    )
    report_base_url: str | None = Field(
        None, description="Base URL of this agent's API, for report links in messages (e.g. https://trainmedic.ops)."
    )
    retry_initial_s: float = Field(1.0, gt=0, description="First retry delay (exponential backoff, full jitter).")
    retry_max_s: float = Field(300.0, gt=0, description="Longest retry delay; also caps a receiver's Retry-After.")
    give_up_after_s: float = Field(
        86_400.0, gt=0, description="A notice not delivered this long after it was queued is given up (dead)."
    )

    @model_validator(mode="after")
    def _check(self) -> NotifySettings:
        names = [s.sink_name for s in self.sinks]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"sink names must be unique (set `name`): {duplicates}")
        if self.retry_max_s < self.retry_initial_s:
            raise ValueError("retry_max_s must be at least retry_initial_s")
        return self


class ApiSettings(_Group):
    enabled: bool = Field(True, description="Serve the HTTP API (health, metrics, incidents, diagnose) in the brain.")
    host: str = Field("127.0.0.1", description="Listen address (0.0.0.0 in a pod, behind its Service).")
    port: int = Field(8080, ge=0, le=65535, description="Listen port; 0 picks a free one (logged).")
    token: SecretStr | None = Field(
        None,
        description="Bearer token required by every state-changing call; prefer token_env or token_file. Never logged.",
    )
    token_env: str | None = Field(None, description="Name of an environment variable holding the bearer token.")
    token_file: str | None = Field(None, description="File holding the bearer token (a mounted Secret).")
    read_auth: bool = Field(
        True,
        description="Require the token for reads (incidents, reports, /metrics) too; false opens them to anyone "
        "who reaches the port (an explicit choice; incidents hold job and node details).",
    )
    allow_unauthenticated: bool = Field(
        False,
        description="With no token configured, accept state-changing calls from anyone (a laptop demo only); "
        "otherwise they are refused.",
    )
    max_body_bytes: int = Field(
        32 * 1024 * 1024, ge=1024, description="Largest request body (uploaded logs included); larger: 413."
    )
    max_files: int = Field(64, ge=1, le=10_000, description="Most log files one diagnose request may upload.")
    shutdown_timeout_s: float = Field(5.0, gt=0, description="How long requests in flight may finish at shutdown.")
    console: bool = Field(True, description="Serve the web console at /console (incidents, approvals, node release).")
    public_url: str | None = Field(
        None,
        description="Base URL people reach this API at (e.g. https://trainmedic.ops): chat messages then link to "
        "the incident's console page and carry signed approve and reject links for plans awaiting approval.",
    )
    console_secret: SecretStr | None = Field(
        None,
        description="Key material for console sessions, CSRF tokens and signed approve / reject links; prefer "
        "console_secret_env or console_secret_file. Unset: derived from the API token. Never logged.",
    )
    console_secret_env: str | None = Field(None, description="Name of an environment variable holding console_secret.")
    console_secret_file: str | None = Field(None, description="File holding console_secret (a mounted Secret).")
    session_ttl_s: float = Field(
        43_200.0, ge=60, le=30 * 86_400, description="How long a console login lasts (the signed cookie expires)."
    )
    approve_link_ttl_s: float = Field(
        86_400.0,
        ge=60,
        le=30 * 86_400,
        description="How long a signed approve or reject link in a chat message stays valid.",
    )
    auth_failure_limit: int = Field(
        10,
        ge=1,
        le=10_000,
        description=(
            "Wrong tokens one client address may send (API bearer, console sign-in) within "
            "auth_failure_window_s; past it the address is refused with 429 until the window passes."
        ),
    )
    auth_failure_window_s: float = Field(
        60.0, gt=0, le=86_400, description="The window of auth_failure_limit, in seconds."
    )

    @model_validator(mode="after")
    def _check_public_url(self) -> ApiSettings:
        if self.public_url is not None:
            from urllib.parse import urlsplit

            parts = urlsplit(self.public_url)
            if parts.scheme not in ("http", "https") or not parts.netloc or parts.query or parts.fragment:
                raise ValueError(
                    f"public_url must be an http(s) URL without query or fragment, not {self.public_url!r}"
                )
            if parts.username or parts.password:
                raise ValueError("public_url must not carry credentials")
        return self


class Settings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    node_name: str = Field(default_factory=socket.gethostname, description="This node (env TRAINMEDIC_NODE_NAME).")
    log_format: Literal["json", "text"] = Field("json", description="Structured JSON logs, or text for people.")
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(
        "INFO", description="Level of the agent's own logs."
    )
    bus: BusSettings = Field(default_factory=BusSettings)
    kubernetes: KubernetesSettings = Field(default_factory=KubernetesSettings)
    logs: LogsSettings = Field(default_factory=LogsSettings)
    kernel: KernelSettings = Field(default_factory=KernelSettings)
    metrics: MetricsSettings = Field(default_factory=MetricsSettings)
    detect: DetectSettings = Field(default_factory=DetectSettings)
    remediate: RemediateSettings = Field(default_factory=RemediateSettings)
    notify: NotifySettings = Field(default_factory=NotifySettings)
    api: ApiSettings = Field(default_factory=ApiSettings)


class ConfigError(TrainmedicError):
    """The configuration cannot be used; `problems` lists every one as `where: what`."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("invalid configuration:\n  " + "\n  ".join(problems))
        self.problems = problems


def _env_overrides(env: Mapping[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, raw in env.items():
        # Not settings: the CLI's language and the compile cache's folder (trainmedic/cache.py).
        if not name.startswith(ENV_PREFIX) or name in {"TRAINMEDIC_LANG", "TRAINMEDIC_CACHE_DIR"}:
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
            text = p.read_text(encoding="utf-8")
            try:
                loaded = load_yaml(text)
            except yaml.YAMLError:
                loaded = yaml.safe_load(text)  # the problem as the pure-Python parser words it
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
