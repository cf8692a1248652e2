"""The demo's stage: its constants (namespace, nodes, detection windows), what one fault's run gives
(`FaultResult`), the incident watch that reports the agent's progress, and `DemoCluster`, what a
scenario acts on.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainmedic.agent.demo.emulator import Cluster, KubeEmulator
from trainmedic.agent.demo.metrics import DemoMetrics, FailKind
from trainmedic.agent.demo.output import Progress
from trainmedic.agent.demo.training import Controllers, Incarnation, NodeKernelLogs, World
from trainmedic.agent.store import Incident, IncidentStatus, IncidentStore

FAULTS = ("xid", "oom", "hccl", "hang", "node-lost", "app-error")
NAMESPACE = "train"
MOUNT = "/mnt/ckpt"  # where the jobs mount the shared checkpoint volume
GPU_NODES = ("gpu-1", "gpu-2", "gpu-3")
NPU_NODES = ("npu-1", "npu-2", "npu-3")
# The demo's time scale (a cluster's defaults: 30 s, 300 s, 1m, 1 s).
WINDOW_S = 1.0  # detect.window_s: how long a diagnosis window gathers evidence (a loaded machine follows logs late)
HANG_FLOOR_S = 1.5  # detect.hang_floor_s in the hang fault: the shortest silence that can be a hang
QUIET_FLOOR_S = 60.0  # ... in the others, where a pause of the demo's own process must not look like one
BACKOFF = "0.2s"  # the policy's first backoff between two restarts of one job
TICK_S = 0.1  # how often the brain closes windows and checks for hangs
METRICS_INTERVAL_S = 1.0  # metrics.interval_s: how often the watcher reads the exporters
DEMO_METRICS_URL = "demo://exporters"  # what the watcher's messages call the demo's metrics


# -- what one fault's run produced ----------------------------------------------------------------------


@dataclass
class FaultResult:
    """One fault, from injection to healing; `as_json` is the object `--json` prints."""

    fault: str
    ok: bool = False
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    fault_class: str | None = None
    code: str | None = None
    chip: str | None = None
    node: str | None = None
    incident_id: str | None = None
    incidents: list[str] = field(default_factory=list)
    status: str | None = None
    actions: list[str] = field(default_factory=list)
    scene_dir: str | None = None
    quarantined_nodes: list[str] = field(default_factory=list)
    checkpoint: str | None = None
    rescheduled_job: str | None = None
    excluded_nodes: list[str] = field(default_factory=list)
    rescheduled_to: list[str] = field(default_factory=list)
    resumed_step: int | None = None
    healed: bool | None = None
    hints: list[str] = field(default_factory=list)
    webhooks_delivered: int = 0
    webhooks_verified: int | None = None
    report_html: str | None = None
    reports: dict[str, str] = field(default_factory=dict)
    detect_ms: float | None = None
    recover_ms: float | None = None
    workdir: str | None = None

    def as_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        for k in ("detect_ms", "recover_ms"):
            if out[k] is not None:
                out[k] = round(out[k], 1)
        return out


# -- the agent's store, watched for progress ------------------------------------------------------------


class IncidentWatch:
    """Follows the incident store's timeline of one job and prints each stage as it is recorded."""

    def __init__(self, store: IncidentStore, job: str, progress: Progress) -> None:
        self.store = store
        self.job = job
        self.progress = progress
        self.order: list[str] = []
        self.seen: dict[str, int] = {}
        self.first_detected: float | None = None
        self.shown: dict[str, tuple[str | None, str | None, str | None]] = {}

    def incidents(self) -> list[Incident]:
        return [self.store.get(i) for i in self.order]

    def terminal(self) -> list[Incident]:
        return [i for i in self.incidents() if i.status not in (IncidentStatus.OPEN, IncidentStatus.ACTING)]

    def poll(self) -> None:
        for inc in sorted(self.store.recent(limit=50), key=lambda i: i.created):
            if inc.job != self.job:
                continue
            if inc.id not in self.seen:
                self.seen[inc.id] = 0
                self.order.append(inc.id)
            timeline = self.store.timeline(inc.id)
            for entry in timeline[self.seen[inc.id] :]:
                self._stage(inc.id, entry)
            self.seen[inc.id] = len(timeline)

    def _stage(self, incident_id: str, entry: Mapping[str, Any]) -> None:
        p, kind, d, at = self.progress, str(entry["kind"]), entry.get("detail") or {}, float(entry["t"])
        inc = self.store.get(incident_id)
        short = incident_id[:8]
        if kind == "detected":
            if self.first_detected is None:
                self.first_detected = at
            p.line("detected", at=at, fault_class=inc.fault_class, code=inc.code, node=inc.node or "?", id=short)
            self.shown[incident_id] = (inc.fault_class, inc.code, inc.node)
        elif kind == "diagnosis_revised":
            shown = (inc.fault_class, inc.code, inc.node)
            if self.shown.get(incident_id) != shown:  # a new revision with the same root cause: nothing to say
                p.line("revised", at=at, fault_class=inc.fault_class, code=inc.code, node=inc.node or "?")
        elif kind == "scene_saved":
            p.line("scene", at=at, dir=d.get("scene_dir"), files=d.get("files", "?"))
        elif kind == "planned":
            plan = inc.plan or {}
            p.line("planned", at=at, mode=d.get("mode"), actions=", ".join(d.get("actions") or []) or "-")
            if plan.get("escalated"):
                why = next(
                    (a.get("reason") for a in plan.get("actions") or [] if a.get("name") == "quarantine_node"), None
                )
                p.line("escalated", at=at, why=p.i18n(why) or plan.get("escalation"))
            if plan.get("blocked"):
                p.line("blocked", at=at, why=p.i18n(plan.get("blocked")))
            for h in plan.get("hints") or []:
                p.line("hint", at=at, hint=p.i18n(h))
        elif kind == "action:quarantine_node:done":
            p.line("quarantined", at=at, node=d.get("node"))
        elif kind in ("action:restart_from_checkpoint:done", "action:raise_memory_limit:done") and d.get("workload"):
            p.line(
                "recreated",
                at=at,
                workload=d.get("workload"),
                checkpoint=_short_ckpt(d.get("resumed_from")),
                excluded=", ".join(d.get("excluded_nodes") or []) or "-",
            )
        elif kind == "action:notify:done":
            p.line("notify_action", at=at, topic=d.get("published", "trainmedic.incidents"))
        elif kind.startswith("status:") and kind not in ("status:acting", "status:open"):
            p.line("status", at=at, id=short, status=kind.split(":", 1)[1])
        elif kind == "notified":
            p.line("webhook", at=at, sink=d.get("sink"), status=d.get("status"), http=d.get("http", "?"))
        elif kind == "notify_failed":
            p.line("webhook_failed", at=at, sink=d.get("sink"), error=d.get("error") or d.get("http") or "?")


def _short_ckpt(path: Any) -> str:
    if not path:
        return "-"
    return str(path).rstrip("/").rsplit("/", 1)[-1]


# -- the scenarios --------------------------------------------------------------------------------------


@dataclass
class DemoCluster:
    """Everything one fault's run holds: the emulator, the controllers, the agent, the paths."""

    kube: KubeEmulator
    cluster: Cluster
    world: World
    controllers: Controllers
    kernels: NodeKernelLogs
    agent: Any
    store: IncidentStore
    progress: Progress
    workdir: Path
    t0: float | None = None
    first: Incarnation | None = None
    # The nodes' exporters as the metrics watcher reads them (agent/demo/metrics.py).
    metrics: DemoMetrics | None = None

    def devices_fail(self, node: str | None, kind: FailKind, *, at: float, devices: list[str] | None = None) -> None:
        if self.metrics is not None and node:
            self.metrics.fail(node, kind, at=at, devices=devices)
