"""The brain's detector service: input topics in, findings and diagnoses out.

One `Brain` is one member of the consumer group over the input topics (logs, kernel, k8s,
metrics). Because events are keyed by job (trainmedic/events.py), the member that owns a partition
owns every job hashed to it: it alone correlates that job, and (issue 4) alone acts on it.

Per event:
* log and kernel batches go through the rule engine (the same engine as `trainmedic diagnose`,
  compiled once per source: container logs, kernel, Kubernetes lines); pod statuses, core/v1
  events, unhealthy nodes (the copies published per job) and failed workloads are rendered as the
  canonical `pod_status:` / `k8s_event:` / `node_status:` / `job_status:` lines the rules match
  (agent/watchers/k8s/); a container's termination is taken once, however often its pod's later
  changes render it again, and not at all when it ended more than `termination_max_age_s` ago;
* the hang detector sees every log batch (step progress, checkpoint and evaluation markers), the
  job's running state and the accelerator utilisation; it is checked on a timer;
* metric batches go through the metric rules (Xid / ECC counters rising, health 0, link down).

Every interruption becomes a diagnosis: a pod that failed with nothing but an exit code, a node
gone NotReady under a job, a workload marked Failed give findings of their own (`unknown`,
`node_failure`, `process_killed`), which the correlator ranks below any cause a log, kernel or
device line gives. A window whose root cause is still `unknown` when it is due stays open until no
finding has come for `settle_s`, so the log evidence of the same failure, shipped a little later
than the pod's status, settles it instead. An `unknown` diagnosis carries the last error-looking
lines of every rank of the job and the containers' exit codes.

Findings are grouped per key (job, or node for node-only signals) in a window. A diagnosis is
published on `trainmedic.diagnoses` as soon as the window has its first finding (revision 1: the
fault-to-diagnosis latency is one hop), re-published when the root cause changes as more evidence
arrives (revision 2, 3, ...; a peer's NCCL timeout seen first is superseded by the Xid 79 that
caused it), and published a last time with `final: true` when the window closes. The diagnosis id
is derived from the key and the first evidence event, so a replay after a crash yields the same id
and downstream steps de-duplicate on it.

Nothing lost: an input record is committed once the work it caused is durable. A record that
produced no finding is done at once; one that produced findings is held by its window until the
final diagnosis is published, so a brain that dies mid-window leaves those offsets uncommitted and
the next owner replays them (on a bus that outlives the process: over the in-process bus of
`--role all` nothing could replay them, and nothing is held). Malformed, oversized or
unknown-schema messages go to the DLQ. Events seen twice (a replay, or a kernel line fanned out
to one job twice) are skipped by (id, key).

Size: one class, `Brain`, whose methods share the per-job windows, the offsets they hold and the
state kept for `unknown` diagnoses (error lines, exit codes, kernel lines); the settings and the
error-line helpers around it are short. Split it as the responder was (mixins over one state) when
it grows.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from trainmedic.agent.bus.base import Bus, OffsetTracker, Record, TopicPartition
from trainmedic.agent.bus.dlq import decode_record, set_aside
from trainmedic.agent.telemetry import Telemetry
from trainmedic.agent.watchers.k8s import (
    k8s_event_line,
    node_status_lines,
    node_unhealthy,
    pod_status_entries,
    workload_status_lines,
)
from trainmedic.detectors.correlator import correlate
from trainmedic.detectors.engine import Engine
from trainmedic.detectors.hang import HangDetector
from trainmedic.detectors.loader import load_rules
from trainmedic.detectors.metric_rules import MetricRules
from trainmedic.events import (
    INPUT_TOPICS,
    DiagnosisEvent,
    Event,
    FindingEvent,
    JobRef,
    K8sEvent,
    KernelBatch,
    LogBatch,
    MetricBatch,
    NodeStatus,
    PodStatus,
    Topic,
    WorkloadStatus,
    make_event,
    node_key,
)
from trainmedic.models import FaultClass, Finding, Source

log = logging.getLogger("trainmedic.brain")

T = TypeVar("T")

# A job's running state for the hang detector, from its pods' phases.
_RUNNING_PHASES = frozenset({"Running"})
_TERMINAL_WORKLOAD = frozenset({"Succeeded", "Failed", "Completed", "Complete", "Aborted", "Terminated"})


@dataclass
class BrainSettings:
    """What the detector service does with what it consumes."""

    # Consumer group of the brains: brains with the same group split the jobs between them.
    group: str = "trainmedic-brain"
    # Seconds a job's diagnosis window stays open after its first finding, gathering evidence
    # (peers' timeouts, the Xid that explains them) before the final diagnosis.
    window_s: float = 30.0
    # How often the hang detector and the window timers are checked.
    tick_s: float = 1.0
    # Records per poll; a poll waits at most `poll_ms` for data.
    max_records: int = 500
    poll_ms: int = 100
    # Event ids remembered to skip replays and duplicates.
    dedup_size: int = 100_000
    # Distinct findings kept per window (identical ones are folded into a count).
    max_findings_per_window: int = 1_000
    # Publish every new distinct finding on trainmedic.findings as well.
    publish_findings: bool = True
    # Recent kernel lines kept per node for the scene bundle (lines per node, nodes).
    kernel_tail_lines: int = 5_000
    kernel_tail_nodes: int = 2_000
    # A window whose root cause is still `unknown` when it is due stays open until no finding has
    # come for this long (at most `window_s` more), waiting for the log line that explains it.
    # Capped at `window_s`.
    settle_s: float = 5.0
    # A container termination that ended longer ago than this (a pod listed again at start-up) is
    # not a finding.
    termination_max_age_s: float = 600.0
    # Error-looking lines kept per rank for `unknown` diagnoses (lines per rank, ranks per job, jobs).
    error_lines_per_rank: int = 20
    error_ranks_per_job: int = 64
    error_jobs: int = 1_000
    # Bounded state (docs/architecture.md, "State and eviction"). Everything the brain keeps per
    # job (hang streams, pods' running state, error lines, exit codes, terminations taken, node
    # lines) goes `job_grace_s` after the job ended (its workload finished or was deleted, or its
    # last pod was deleted): late lines of the same failure still find it. A key with no event at
    # all for `idle_s` goes too (a job whose end was never seen), and so does a node's kernel tail.
    job_grace_s: float = 120.0
    idle_s: float = 6 * 3600.0
    # How often the sweep that applies these rules runs (amortised; on the tick).
    sweep_s: float = 10.0
    # Processing runs in slices of about this long, then yields to the loop (the tailers and the
    # responder share it in `--role all`).
    slice_s: float = 0.010


@dataclass
class _Window:
    key: str
    job: JobRef | None
    node: str | None
    opened: float
    first_event_time: float
    diagnosis_id: str
    findings: dict[tuple[object, ...], Finding] = field(default_factory=dict)
    evidence: list[str] = field(default_factory=list)
    held: dict[TopicPartition, list[int]] = field(default_factory=dict)
    revision: int = 0
    signature: tuple[object, ...] | None = None
    latency_recorded: bool = False
    last_added: float = 0.0
    unknown: bool = False


# What an error-looking line of a rank's log is, for the evidence of an `unknown` diagnosis.
_ERROR_LINE = re.compile(
    r"Traceback|Error\b|ERROR|Exception\b|FATAL|Fatal|\bexit(?:ed|code| code| status)|Killed|"
    r"Segmentation fault|Aborted|\bE\d{4} \d\d:"
)
_ERROR_LINE_MAX = 500
# The same alternatives without the leading word boundaries (checked on the two that have one):
# searched over a whole batch at once, about ten times faster than `_ERROR_LINE` line by line.
_ERROR_HINT = re.compile(
    r"Traceback|Error\b|ERROR|Exception\b|FATAL|Fatal|Killed|Segmentation fault|Aborted|"
    r"exit(?:ed|code| code| status)|E\d{4} \d\d:"
)


def error_lines_of(lines: Sequence[str]) -> list[str]:
    """The lines `_ERROR_LINE` finds, in order, found in one pass over the joined batch."""
    text = "\n".join(lines)
    out: list[str] = []
    taken = -1  # end of the last line taken
    for m in _ERROR_HINT.finditer(text):
        start = m.start()
        if start < taken:
            continue
        if start > 0 and (text[start] == "e" or text[start + 1].isdigit()):
            before = text[start - 1]
            if before.isalnum() or before == "_":
                continue  # `exit...` and `E1234 12:` start a word
        begin = text.rfind("\n", 0, start) + 1
        end = text.find("\n", start)
        end = len(text) if end < 0 else end
        out.append(text[begin:end])
        taken = end
    return out


def _fold_key(f: Finding) -> tuple[object, ...]:
    return (f.rule_id, f.code, f.node, f.pod, f.device, f.rank, f.file)


def _diagnosis_id(key: str, event_id: str) -> str:
    return hashlib.sha256(f"{key}\x00{event_id}".encode()).hexdigest()[:20]


class Brain:
    """Consumes the input topics, detects, correlates per job window, publishes diagnoses."""

    def __init__(
        self,
        bus: Bus,
        *,
        settings: BrainSettings | None = None,
        rule_dirs: Sequence[str] = (),
        fast: bool | None = None,
        hang: HangDetector | None = None,
        metric_rules: MetricRules | None = None,
        telemetry: Telemetry | None = None,
        producer: str = "brain",
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.bus = bus
        self.settings = settings or BrainSettings()
        self.telemetry = telemetry or Telemetry()
        self.producer = producer
        self.clock = clock
        rules = load_rules([Path(d) for d in rule_dirs]).rules
        self.engines = {
            Source.CONTAINER_LOG: Engine(rules, fast=fast, sources=[Source.CONTAINER_LOG], unwrap=False),
            Source.KERNEL: Engine(rules, fast=fast, sources=[Source.KERNEL], unwrap=False),
            Source.POD_STATUS: Engine(rules, fast=fast, sources=[Source.POD_STATUS, Source.K8S_EVENT], unwrap=False),
        }
        self.hang = hang if hang is not None else HangDetector()
        # Newest bus timestamp read: while behind, hangs are judged at this time (see `tick`).
        self._read_until = 0.0
        self.metric_rules = metric_rules if metric_rules is not None else MetricRules()
        self.windows: dict[str, _Window] = {}
        self.tracker = OffsetTracker()
        # Event (id, key) hashes read lately (a replay or a fan-out read twice is skipped): two
        # generations of `dedup_size` / 2 each (the newer fills, then replaces the older), so the
        # newest `dedup_size` / 2 at least are always remembered; a hash is an int, not two strings.
        self._seen: set[int] = set()
        self._seen_old: set[int] = set()
        self._job_pods_running: dict[str, dict[str, bool]] = {}
        self._assignment: set[TopicPartition] = set()
        self.ready = asyncio.Event()
        self.processed = 0
        self.diagnoses_published = 0
        # node -> (time, line) of its recent kernel messages: the scene's "kernel lines around the fault".
        self.kernel_tail: OrderedDict[str, deque[tuple[float, str]]] = OrderedDict()
        self._kernel_ids: OrderedDict[str, None] = OrderedDict()
        # job key -> rank label -> its last error-looking lines; job key -> "<pod>/<container>" -> exit code.
        self.error_lines: OrderedDict[str, dict[str, deque[str]]] = OrderedDict()
        self.exit_codes: OrderedDict[str, dict[str, int]] = OrderedDict()
        # Container terminations already turned into lines, per key (pod uid, container, end time).
        self._terminations: dict[str, set[str]] = {}
        # Per event key: the time its last event was read (idle eviction); keys whose job ended, and when.
        self._last_seen: dict[str, float] = {}
        self._ended: dict[str, float] = {}
        self._last_sweep = 0.0
        # Jobs and nodes let go by the sweeps so far (tests, telemetry).
        self.evicted = 0
        # (job key, node, node_status line) already taken.
        self._node_lines_seen: OrderedDict[tuple[str, str, str], None] = OrderedDict()
        # (job key, node) of node failures a closed diagnosis of the job already reported.
        self._lost_nodes: OrderedDict[tuple[str, str | None], None] = OrderedDict()

    # -- the consume loop -----------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event | None = None) -> None:
        """Consume until cancelled or `stop` is set. On a graceful stop, open windows are published
        as final and their offsets committed; on cancellation they are left uncommitted (replayed)."""
        stop = stop or asyncio.Event()
        # The vendor catalogs are parsed now, not by the first diagnosis of each chip (the Ascend
        # catalog alone takes most of a second).
        await asyncio.to_thread(warm_catalogs)
        consumer = self.bus.consumer([t.value for t in INPUT_TOPICS], self.settings.group)
        await consumer.start()
        self.ready.set()
        last_tick = self.clock()
        try:
            while not stop.is_set():
                records = await consumer.getmany(
                    timeout_ms=self.settings.poll_ms, max_records=self.settings.max_records
                )
                self._check_assignment(consumer.assignment())
                started = time.perf_counter()
                for record in records:
                    await self._handle(record)
                    self._read_until = max(self._read_until, record.timestamp_ms / 1000)
                    if time.perf_counter() - started >= self.settings.slice_s:
                        # A slice is done: what else waits on the loop (tailers, responder, API) runs now.
                        await asyncio.sleep(0)
                        started = time.perf_counter()
                now = self.clock()
                if now - last_tick >= self.settings.tick_s:
                    last_tick = now
                    lag = await consumer.lag()
                    await self.tick(now, behind=lag > 0)
                offsets = self.tracker.committable()
                if offsets:
                    await consumer.commit(offsets)
                    self.tracker.committed(offsets)
                self.telemetry.consumer_lag.set(await consumer.lag())
            await self.close_all()
            offsets = self.tracker.committable()
            if offsets:
                await consumer.commit(offsets)
                self.tracker.committed(offsets)
        finally:
            await consumer.stop()

    def _check_assignment(self, now: set[TopicPartition]) -> None:
        lost = self._assignment - now
        self._assignment = now
        if not lost:
            return
        # The new owner replays these partitions from their last commit; drop what we held.
        self.tracker.forget(lost)
        for key in [k for k, w in self.windows.items() if lost & set(w.held)]:
            log.info("partition moved to another brain; dropping the open window of %s", key)
            del self.windows[key]

    async def _handle(self, record: Record) -> None:
        self.tracker.track(record)
        event = await decode_record(self.bus, record, self.telemetry)
        if event is None:
            self.tracker.done(record)
            return
        self.telemetry.events_in.labels(record.topic).inc()
        self._last_seen[event.key] = self.clock()
        if self.bus.replays:
            # Only a bus that delivers a record again (a broker's at-least-once, a rebalance) needs
            # the ring: the embedded bus (replays=False) hands each record to its group once, and
            # every event id is new (uuid4), so there it would only fill up (~7 MB at its cap).
            seen_key = hash((event.id, event.key))
            if seen_key in self._seen or seen_key in self._seen_old:
                self.tracker.done(record)
                return
            self._seen.add(seen_key)
            if len(self._seen) >= max(1, self.settings.dedup_size // 2):
                self._seen_old, self._seen = self._seen, set()
        try:
            findings = self.detect(event)
        except Exception:  # a bug in one detector must not stop the pipeline; the event is set aside
            log.exception("detector failed on event %s (%s)", event.id, event.payload.kind)
            await set_aside(self.bus, record, "detector error", self.telemetry)
            self.tracker.done(record)
            return
        self.processed += 1
        if not findings:
            self.tracker.done(record)
            return
        await self._add(event, findings, record)

    # -- detection ------------------------------------------------------------------------------------

    def detect(self, event: Event) -> list[Finding]:
        """Findings for one input event (and state updates of the stateful detectors).

        A job is told once about the loss of one node: once a diagnosis of the job has closed with
        a node_failure on a node, later node_failure findings of that job on that node (the pods'
        NodeLost, the taint manager's evictions minutes later, about the pods of the job's earlier
        incarnation) are dropped until the node is seen healthy again."""
        found = self._detect(event)
        job = getattr(event.payload, "job", None)
        if found and isinstance(job, JobRef) and self._lost_nodes:
            found = [
                f
                for f in found
                if not (f.fault_class is FaultClass.NODE_FAILURE and (job.key, f.node) in self._lost_nodes)
            ]
        return found

    def _detect(self, event: Event) -> list[Finding]:
        p = event.payload
        if isinstance(p, LogBatch):
            self.telemetry.lines_in.labels("container_log").inc(len(p.lines))
            job_key = p.job.key if p.job else event.key
            self.hang.observe_lines(
                job_key, p.rank, p.pod, p.node, p.times[-1] if p.times else event.time, p.lines, times=p.times or None
            )
            if p.job is not None:
                self._keep_error_lines(p.job.key, f"rank {p.rank}" if p.rank is not None else p.pod, p.lines)
            return self._scan(Source.CONTAINER_LOG, p.lines, p.times, event, p.first_line, p.file)
        if isinstance(p, KernelBatch):
            self.telemetry.lines_in.labels("kernel").inc(len(p.lines))
            self._keep_kernel(p, event.id, event.time)
            return self._scan(Source.KERNEL, p.lines, p.times, event, p.first_line, f"kernel:{p.node}:{p.source}")
        if isinstance(p, PodStatus):
            self._pod_running(p, event.time)
            self._keep_exit_codes(p)
            lines = self._new_pod_lines(p, event.time, event.key)
            return self._scan(Source.POD_STATUS, lines, [], event, 1, f"pod/{p.namespace}/{p.pod}") if lines else []
        if isinstance(p, K8sEvent):
            return self._scan(Source.K8S_EVENT, [k8s_event_line(p)], [], event, 1, "events")
        if isinstance(p, WorkloadStatus):
            if p.deleted or (p.phase in _TERMINAL_WORKLOAD):
                self.hang.observe_job(p.job.key, False, event.time)
                self._job_pods_running.pop(p.job.key, None)
                self._ended.setdefault(p.job.key, self.clock())
            else:
                self._ended.pop(p.job.key, None)
            lines = workload_status_lines(p)
            return (
                self._scan(Source.K8S_EVENT, lines, [], event, 1, f"{p.job.kind}/{p.job.namespace}/{p.job.name}")
                if lines
                else []
            )
        if isinstance(p, MetricBatch):
            mjob = p.job.key if p.job else None
            for s in p.samples:
                if s.name == "accelerator_utilization" and mjob:
                    self.hang.observe_utilization(mjob, p.node, s.device, event.time, s.value, chip=p.chip)
            found = self.metric_rules.observe(node=p.node, chip=p.chip, job_key=mjob, samples=p.samples, t=event.time)
            return [f.model_copy(update={"job": p.job.name if p.job else None}) for f in found]
        if isinstance(p, NodeStatus):
            return self._node_lines(p, event)
        return []

    def _node_lines(self, p: NodeStatus, event: Event) -> list[Finding]:
        """Only the copies published per job: a node with no job on it is no training interruption.
        A job is told once about one state of its node (a later change trainmedic's own quarantine
        makes renders the same line); a healthy status of the node (node-keyed) forgets it."""
        if p.job is None:
            if not node_unhealthy(p):
                for k in [k for k in self._node_lines_seen if k[1] == p.node]:
                    del self._node_lines_seen[k]
                for lost in [k for k in self._lost_nodes if k[1] == p.node]:
                    del self._lost_nodes[lost]
            return []
        lines = []
        for line in node_status_lines(p):
            k = (p.job.key, p.node, line)
            if k in self._node_lines_seen:
                continue
            self._node_lines_seen[k] = None
            if len(self._node_lines_seen) > 10_000:
                self._node_lines_seen.popitem(last=False)
            lines.append(line)
        return self._scan(Source.K8S_EVENT, lines, [], event, 1, f"node/{p.node}") if lines else []

    def _new_pod_lines(self, p: PodStatus, t: float, key: str) -> list[str]:
        """The pod's lines, without the terminations already taken (a later change of the pod, its
        deletion, render them again) and those that ended too long ago. Kept per key (the job),
        forgotten with it; at most `dedup_size` per key."""
        lines = []
        taken = self._terminations.get(key)
        for ident, line in pod_status_entries(p, now=t, max_age_s=self.settings.termination_max_age_s):
            if taken is None:
                taken = self._terminations[key] = set()
            if ident in taken:
                continue
            if len(taken) >= self.settings.dedup_size:
                taken.clear()
            taken.add(ident)
            lines.append(line)
        return lines

    def _job_slot(self, table: OrderedDict[str, dict[str, T]], job_key: str) -> dict[str, T]:
        slot = table.get(job_key)
        if slot is None:
            slot = table[job_key] = {}
            while len(table) > self.settings.error_jobs:
                table.popitem(last=False)
        else:
            table.move_to_end(job_key)
        return slot

    def _keep_error_lines(self, job_key: str, rank: str, lines: Sequence[str]) -> None:
        errors = [line[:_ERROR_LINE_MAX] for line in error_lines_of(lines)]
        if not errors:
            return
        ranks = self._job_slot(self.error_lines, job_key)
        tail = ranks.get(rank)
        if tail is None:
            if len(ranks) >= self.settings.error_ranks_per_job:
                return
            tail = ranks[rank] = deque(maxlen=self.settings.error_lines_per_rank)
        tail.extend(errors)

    def _keep_exit_codes(self, p: PodStatus) -> None:
        if p.job is None:
            return
        codes: dict[str, int] | None = None
        for c in p.containers:
            code = c.get("exit_code") if c.get("state") == "terminated" else c.get("last_exit_code")
            if isinstance(code, int) and not isinstance(code, bool):
                if codes is None:
                    codes = self._job_slot(self.exit_codes, p.job.key)
                if len(codes) < self.settings.error_ranks_per_job * 4:
                    codes[f"{p.pod}/{c.get('name')}"] = code

    def _keep_kernel(self, p: KernelBatch, event_id: str, t: float) -> None:
        # A batch fanned out to several jobs on the node arrives once per job (same id): keep it once.
        if event_id in self._kernel_ids:
            return
        self._kernel_ids[event_id] = None
        if len(self._kernel_ids) > 4096:
            self._kernel_ids.popitem(last=False)
        tail = self.kernel_tail.get(p.node)
        if tail is None:
            tail = self.kernel_tail[p.node] = deque(maxlen=self.settings.kernel_tail_lines)
            while len(self.kernel_tail) > self.settings.kernel_tail_nodes:
                self.kernel_tail.popitem(last=False)
        else:
            self.kernel_tail.move_to_end(p.node)
        times = p.times
        for i, line in enumerate(p.lines):
            tail.append((times[i] if i < len(times) else t, line))

    def _pod_running(self, p: PodStatus, t: float) -> None:
        if p.job is None:
            return
        key = p.job.key
        pods = self._job_pods_running.get(key)
        if p.deleted:
            if pods is not None:
                pods.pop(p.pod, None)
            if not pods:
                # The job's last pod is gone: it ended (a workload status may say so too).
                self._job_pods_running.pop(key, None)
                self._ended.setdefault(key, self.clock())
                self.hang.observe_job(key, False, t)
                return
        else:
            if pods is None:
                pods = self._job_pods_running[key] = {}
            pods[p.pod] = p.phase in _RUNNING_PHASES
            if p.phase in _RUNNING_PHASES:
                self._ended.pop(key, None)
        self.hang.observe_job(key, any(pods.values()), t)

    def _scan(
        self,
        source: Source,
        lines: Sequence[str],
        times: Sequence[float],
        event: Event,
        first_line: int,
        file: str | None,
    ) -> list[Finding]:
        engine = self.engines[Source.POD_STATUS if source is Source.K8S_EVENT else source]
        found = engine.scan_text("\n".join(lines), file=file)
        if not found:
            return []
        p = event.payload
        node = getattr(p, "node", None)
        pod = getattr(p, "pod", None)
        namespace = getattr(p, "namespace", None)
        job = getattr(p, "job", None)
        prank = getattr(p, "rank", None)
        out = []
        for f in found:
            idx = (f.line_no or 1) - 1
            update: dict[str, object] = {
                "source": source,
                "line_no": (f.line_no or 1) + first_line - 1,
                "last_line_no": (f.last_line_no or f.line_no or 1) + first_line - 1,
                "timestamp": times[idx] if idx < len(times) else event.time,
                # Where the line came from is known for certain; a node named inside the text
                # (a pasted syslog line) only fills a gap.
                "node": node or f.node,
                "pod": pod or f.pod,
                "namespace": namespace or f.namespace,
                "job": job.name if isinstance(job, JobRef) else f.job,
                # A rank printed on the line (torchrun's [rank3]:) is more precise than the pod's.
                "rank": f.rank if f.rank is not None else prank,
            }
            out.append(f.model_copy(update=update))
        return out

    # -- windows and diagnoses ------------------------------------------------------------------------

    async def _add(self, event: Event, findings: list[Finding], record: Record | None) -> None:
        key = event.key
        w = self.windows.get(key)
        now = self.clock()
        if w is None:
            p = event.payload
            job = getattr(p, "job", None)
            node = getattr(p, "node", None)
            w = self.windows[key] = _Window(
                key=key,
                job=job if isinstance(job, JobRef) else None,
                node=node if isinstance(node, str) else None,
                opened=now,
                first_event_time=event.time,
                diagnosis_id=_diagnosis_id(key, event.id),
            )
        w.last_added = now
        if record is not None:
            if self.bus.replays:
                w.held.setdefault(record.tp, []).append(record.offset)
            else:
                # Nothing would replay it after a crash (an in-process bus): not held.
                self.tracker.done(record)
        if event.id not in w.evidence:
            w.evidence.append(event.id)
        for f in findings:
            self.telemetry.findings.labels(f.fault_class.value).inc()
            fk = _fold_key(f)
            old = w.findings.get(fk)
            if old is not None:
                old.count += f.count
                old.last_line_no = f.last_line_no
                continue
            if len(w.findings) >= self.settings.max_findings_per_window:
                continue
            w.findings[fk] = f
            if self.settings.publish_findings:
                fe = make_event(FindingEvent(job=w.job, finding=f), producer=self.producer, key=key)
                await self.bus.publish(Topic.FINDINGS, fe)
        await self._publish(w, final=False)

    async def _publish(self, w: _Window, *, final: bool) -> None:
        findings = sorted(w.findings.values(), key=lambda f: (f.timestamp or 0.0, f.line_no or 0))
        diagnosis = correlate(findings)
        rc = diagnosis.root_cause
        signature = (rc.fault_class, rc.code, rc.node, rc.device, rc.rank) if rc else None
        w.unknown = rc is not None and rc.fault_class is FaultClass.UNKNOWN
        if not final and signature == w.signature:
            return
        w.signature = signature
        w.revision += 1
        error_lines: dict[str, list[str]] = {}
        exit_codes: dict[str, int] = {}
        if w.unknown and w.job is not None:
            error_lines = {r: list(t) for r, t in self.error_lines.get(w.job.key, {}).items()}
            exit_codes = dict(self.exit_codes.get(w.job.key, {}))
        payload = DiagnosisEvent(
            diagnosis_id=w.diagnosis_id,
            revision=w.revision,
            final=final,
            job=w.job,
            node=w.node,
            window_start=w.opened,
            window_end=self.clock(),
            evidence=list(w.evidence[:200]),
            diagnosis=diagnosis,
            error_lines=error_lines,
            exit_codes=exit_codes,
        )
        await self.bus.publish(Topic.DIAGNOSES, make_event(payload, producer=self.producer, key=w.key))
        self.diagnoses_published += 1
        log.info(
            "diagnosis %s rev %d%s for %s: %s",
            w.diagnosis_id,
            w.revision,
            " (final)" if final else "",
            w.key,
            f"{rc.fault_class.value} {rc.code} on {rc.node or '?'}: {rc.summary.en}" if rc else "no root cause",
        )
        if rc is not None:
            self.telemetry.diagnoses.labels(rc.fault_class.value).inc()
        if not w.latency_recorded:
            w.latency_recorded = True
            self.telemetry.fault_to_diagnosis.observe(max(0.0, time.time() - w.first_event_time))

    async def tick(self, now: float, *, behind: bool = False) -> None:
        """Close windows that are due and run the hang detector.

        A brain that is behind on its input (unread records) judges silences at the time it has read
        up to, not the wall clock: lines still waiting on the bus are not a hang."""
        check_at = min(now, self._read_until) if behind and self._read_until > 0 else now
        if now - self._last_sweep >= self.settings.sweep_s:
            self._last_sweep = now
            self.sweep(now)
        for f in self.hang.check(check_at):
            job_key = f.groups.get("job_key") or (f"job:{f.namespace}/{f.job}" if f.job else None)
            key = job_key or (node_key(f.node) if f.node else "cluster")
            hang_event = make_event(
                FindingEvent(job=_job_from_key(key), finding=f), producer=self.producer, key=key, at=now
            )
            await self._add(hang_event, [f], None)
        for key in [k for k, w in self.windows.items() if self._due(w, now)]:
            w = self.windows.pop(key)
            await self._publish(w, final=True)
            self._closed(w)
            await self.bus.flush()
            for tp, offsets in w.held.items():
                self.tracker.done_offsets(tp, offsets)

    # -- bounded state --------------------------------------------------------------------------------

    def sweep(self, now: float) -> int:
        """Let go of the state of keys whose job ended more than `job_grace_s` ago, of keys with no
        event for `idle_s`, and of kernel tails of nodes silent for `idle_s`. An open window keeps
        its key. Returns how many keys went."""
        grace, idle = self.settings.job_grace_s, self.settings.idle_s
        gone = [k for k, t in self._ended.items() if now - t >= grace and k not in self.windows]
        gone += [
            k for k, t in self._last_seen.items() if now - t >= idle and k not in self.windows and k not in self._ended
        ]
        if gone:
            self.forget(gone)
        stale = [n for n, tail in self.kernel_tail.items() if not tail or now - tail[-1][0] >= idle]
        for node in stale:
            del self.kernel_tail[node]
        self.evicted += len(gone) + len(stale)
        return len(gone)

    def forget(self, keys: Sequence[str]) -> None:
        """Drop everything kept about these keys (jobs, or node / pod keys without one)."""
        drop = set(keys)
        for key in drop:
            self._ended.pop(key, None)
            self._last_seen.pop(key, None)
            self._job_pods_running.pop(key, None)
            self._terminations.pop(key, None)
            self.error_lines.pop(key, None)
            self.exit_codes.pop(key, None)
            self.hang.forget(key)
        self.metric_rules.forget_jobs(drop)
        for k in [k for k in self._node_lines_seen if k[0] in drop]:
            del self._node_lines_seen[k]
        for lost in [k for k in self._lost_nodes if k[0] in drop]:
            del self._lost_nodes[lost]

    def state_sizes(self) -> dict[str, int]:
        """Entries per kind of state held (`trainmedic_state_entries{kind=...}`)."""
        return {
            "brain_windows": len(self.windows),
            "brain_keys": len(self._last_seen),
            "brain_jobs_ended": len(self._ended),
            "brain_dedup": len(self._seen) + len(self._seen_old),
            "brain_jobs_running": len(self._job_pods_running),
            "brain_terminations": sum(len(v) for v in self._terminations.values()),
            "brain_error_lines_jobs": len(self.error_lines),
            "brain_exit_codes_jobs": len(self.exit_codes),
            "brain_node_lines": len(self._node_lines_seen),
            "brain_lost_nodes": len(self._lost_nodes),
            "brain_kernel_tail_nodes": len(self.kernel_tail),
            "brain_kernel_tail_lines": sum(len(t) for t in self.kernel_tail.values()),
            "brain_kernel_ids": len(self._kernel_ids),
            "brain_offsets_open": self.tracker.open_count(),
            "hang_jobs": len(self.hang.jobs()),
            "metric_tracks": self.metric_rules.size(),
        }

    def report(self) -> None:
        """Set the state gauges (called on each /metrics scrape)."""
        for kind, n in self.state_sizes().items():
            self.telemetry.state_entries.labels(kind).set(n)

    def _closed(self, w: _Window) -> None:
        if w.job is None:
            return
        for f in w.findings.values():
            if f.fault_class is FaultClass.NODE_FAILURE and f.node:
                self._lost_nodes[(w.job.key, f.node)] = None
                if len(self._lost_nodes) > 10_000:
                    self._lost_nodes.popitem(last=False)

    def _due(self, w: _Window, now: float) -> bool:
        """Open for `window_s`; an `unknown` one until `settle_s` passed without a finding (at most
        `window_s` more): the log line that explains the failure may still be on its way."""
        window = self.settings.window_s
        if now - w.opened < window:
            return False
        if not w.unknown or now - w.opened >= 2 * window:
            return True
        return now - w.last_added >= min(self.settings.settle_s, window)

    async def close_all(self) -> None:
        """Publish every open window as final (graceful shutdown)."""
        for key in list(self.windows):
            w = self.windows.pop(key)
            await self._publish(w, final=True)
            self._closed(w)
            for tp, offsets in w.held.items():
                self.tracker.done_offsets(tp, offsets)
        await self.bus.flush()


def _job_from_key(key: str) -> JobRef | None:
    if not key.startswith("job:") or "/" not in key:
        return None
    ns, _, name = key[4:].partition("/")
    return JobRef(namespace=ns, name=name)


def warm_catalogs() -> None:
    """Load every chip plugin's fault catalog (a broken one is logged; lookups then say why)."""
    from trainmedic.udal.registry import load_plugins

    for name, plugin in load_plugins().items():
        try:
            plugin.catalog()
        except Exception as e:  # noqa: BLE001 - the first lookup reports it again, in context
            log.warning("chip plugin %s: its catalog cannot be loaded: %s", name, e)
