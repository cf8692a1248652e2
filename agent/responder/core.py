"""`Responder`, the core of the package: its state, the consume loop over `trainmedic.diagnoses` and
the per-key work queue. One serial worker per key (kopf's model) runs a job's work in order; at most
`max_concurrent` workers run at once, and past `max_pending` waiting diagnoses the oldest are handled
observe-only (`_shed`); the offsets of the diagnoses read are committed once handled. The rest of
Responder is inherited, each part a mixin in its own module: the incident state machine
(incidents.py), a plan's actions run in order (execute.py), the scene and the pods kept for it
(scene.py), and the services the actions call back (runtime.py).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from trainmedic.agent.bus.base import Bus, OffsetTracker, Record, TopicPartition
from trainmedic.agent.bus.dlq import decode_record
from trainmedic.agent.responder.execute import ExecuteMixin
from trainmedic.agent.responder.incidents import IncidentMixin
from trainmedic.agent.responder.runtime import RuntimeMixin
from trainmedic.agent.responder.scene import SceneMixin
from trainmedic.agent.responder.settings import MetricsRange, ResponderSettings
from trainmedic.agent.store import Incident, IncidentStatus, IncidentStore
from trainmedic.agent.telemetry import Telemetry
from trainmedic.events import DiagnosisEvent, Topic
from trainmedic.ratelog import RateLimitedLog
from trainmedic.remediations import checkpoints as ckpt
from trainmedic.remediations.kube import KubeOps
from trainmedic.remediations.policy import Policy
from trainmedic.remediations.policy_state import PolicyState
from trainmedic.remediations.scene import warm_redactor
from trainmedic.remediations.stacks import StackSource

if TYPE_CHECKING:
    from trainmedic.agent.notify import Notifier

log = logging.getLogger("trainmedic.responder")


@dataclass
class _Work:
    """One queued piece of a key's work. `degraded`, when set, is why it runs observe-only."""

    run: Callable[[_Work], Awaitable[Any]]
    record: Record | None
    degradable: bool
    seq: int = 0
    degraded: str | None = None


@dataclass
class _KeyWorker:
    queue: asyncio.Queue[_Work]
    task: asyncio.Task[None]


class Responder(IncidentMixin, ExecuteMixin, SceneMixin, RuntimeMixin):
    """Consumes diagnoses and carries incidents through scene, plan and actions."""

    def __init__(
        self,
        bus: Bus,
        kube: KubeOps,
        store: IncidentStore,
        policy: Policy,
        policy_state: PolicyState,
        *,
        settings: ResponderSettings | None = None,
        telemetry: Telemetry | None = None,
        kernel_tail: Mapping[str, Sequence[tuple[float, str]]] | None = None,
        metrics_range: MetricsRange | None = None,
        stack_dumper: Callable[..., Awaitable[Mapping[str, Any]]] | None = None,
        stack_source: StackSource | None = None,
        producer: str = "brain",
        clock: Callable[[], float] = time.time,
        notifier: Notifier | None = None,
    ) -> None:
        self.bus = bus
        self.kube = kube
        self.store = store
        self.policy = policy
        self.policy_state = policy_state
        self.settings = settings or ResponderSettings()
        self.telemetry = telemetry or Telemetry()
        self.kernel_tail = kernel_tail if kernel_tail is not None else {}
        self.metrics_range = metrics_range
        self.stack_dumper = stack_dumper
        # Exec and logs for the dump_stacks action (None: the API server's exec through KubeOps).
        self._stack_source = stack_source
        self.producer = producer
        self.clock = clock
        # Each incident state is queued in the notifier's durable outbox before it is published.
        self.notifier = notifier
        self.tracker = OffsetTracker()
        self._workers: dict[str, _KeyWorker] = {}
        self._assignment: set[TopicPartition] = set()
        self._scheduled: set[str] = set()
        # incident -> (checkpoint root, when, listing) of a reader pod (runtime.py, checkpoints_of)
        self._reader_listings: dict[str, tuple[str, float, tuple[ckpt.Checkpoint, ...]]] = {}
        self.ready = asyncio.Event()
        # Completed incident handlings, for tests and the demo: incident id -> final status (the newest
        # `handled_max`).
        self.handled: OrderedDict[str, IncidentStatus] = OrderedDict()
        # Work queued and not started, oldest first (seq -> work); the global bound on work in progress.
        self._waiting: OrderedDict[int, _Work] = OrderedDict()
        self._queued = 0  # every queued item, degraded ones included
        self._seq = 0
        self._slots = asyncio.Semaphore(self.settings.max_concurrent)
        self._policy_thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="trainmedic-policy")
        self._degraded_log = RateLimitedLog(60.0)
        self.degraded = 0
        self.changed = asyncio.Event()

    # -- the consume loop -----------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event | None = None) -> None:
        stop = stop or asyncio.Event()
        consumer = self.bus.consumer([Topic.DIAGNOSES.value], self.settings.group)
        await consumer.start()
        try:
            await asyncio.to_thread(warm_redactor)  # not on the loop with the first scene
            await self.resume()
            self.ready.set()
            last_poll = self.clock()
            while not stop.is_set():
                if self._queued >= 2 * self.settings.max_pending:
                    # Full: what is not read yet waits on the bus (bounded there) until the queue drains.
                    records = []
                    await asyncio.sleep(self.settings.poll_ms / 1000)
                else:
                    records = await consumer.getmany(
                        timeout_ms=self.settings.poll_ms, max_records=self.settings.max_records
                    )
                self._assignment = consumer.assignment()
                for record in records:
                    await self._dispatch(record)
                now = self.clock()
                if now - last_poll >= self.settings.approval_poll_s:
                    last_poll = now
                    await self.poll_store()
                offsets = self.tracker.committable()
                if offsets:
                    await consumer.commit(offsets)
                    self.tracker.committed(offsets)
            await self.drain()
            offsets = self.tracker.committable()
            if offsets:
                await consumer.commit(offsets)
                self.tracker.committed(offsets)
        finally:
            for w in self._workers.values():
                w.task.cancel()
            await asyncio.gather(*(w.task for w in self._workers.values()), return_exceptions=True)
            self._workers.clear()
            await consumer.stop()

    def close(self) -> None:
        """Release the API client and the store (after `run` returned)."""
        self.kube.close()
        self._policy_thread.shutdown(wait=True)
        self.store.close()
        close = getattr(self.policy_state, "close", None)
        if callable(close):
            close()

    async def _dispatch(self, record: Record) -> None:
        self.tracker.track(record)
        event = await decode_record(self.bus, record, self.telemetry)
        if event is None or not isinstance(event.payload, DiagnosisEvent):
            self.tracker.done(record)
            return
        payload, key, tp = event.payload, event.key, record.tp

        def run(work: _Work) -> Awaitable[Incident | None]:
            return self.handle(payload, key=key, tp=tp, degraded=work.degraded)

        self._submit(key, run, record, degradable=True)

    def _submit(
        self, key: str, run: Callable[[_Work], Awaitable[Any]], record: Record | None, *, degradable: bool = False
    ) -> None:
        worker = self._workers.get(key)
        if worker is None or worker.task.done():
            queue: asyncio.Queue[_Work] = asyncio.Queue()
            task = asyncio.create_task(self._work(key, queue), name=f"trainmedic:respond:{key}")
            worker = self._workers[key] = _KeyWorker(queue, task)
        self._seq += 1
        work = _Work(run, record, degradable, seq=self._seq)
        if degradable:
            self._waiting[work.seq] = work
            self._shed()
        self._queued += 1
        worker.queue.put_nowait(work)

    def _shed(self) -> None:
        """Over `max_pending` waiting diagnoses: the oldest are handled observe-only, with the reason."""
        while len(self._waiting) > self.settings.max_pending:
            _, oldest = self._waiting.popitem(last=False)
            oldest.degraded = (
                f"responder over its bounds: more than {self.settings.max_pending} diagnoses waiting "
                f"(remediate.max_pending) with {self.settings.max_concurrent} handled at once "
                "(remediate.max_concurrent); handled observe-only, oldest first"
            )
            self.degraded += 1
            self.telemetry.responder_degraded.inc()

    async def _work(self, key: str, queue: asyncio.Queue[_Work]) -> None:
        """One key's serial worker; exits when idle (kopf's queueing model). At most
        `max_concurrent` workers run work at once."""
        while True:
            try:
                work = await asyncio.wait_for(queue.get(), timeout=30.0)
            except TimeoutError:
                if queue.empty():
                    self._workers.pop(key, None)
                    return
                continue
            try:
                async with self._slots:
                    self._waiting.pop(work.seq, None)
                    await work.run(work)
            except Exception:  # one incident's bug must not stop the others; it is in the log and the store
                log.exception("responding for %s failed", key)
            finally:
                self._waiting.pop(work.seq, None)
                self._queued -= 1
                if work.record is not None:
                    self.tracker.done(work.record)
                queue.task_done()

    def state_sizes(self) -> dict[str, int]:
        """Entries per kind of state held (`trainmedic_state_entries{kind=...}`)."""
        return {
            "responder_workers": len(self._workers),
            "responder_queued": self._queued,
            "responder_waiting": len(self._waiting),
            "responder_scheduled": len(self._scheduled),
            "responder_handled": len(self.handled),
            "responder_offsets_open": self.tracker.open_count(),
            "responder_reader_listings": len(self._reader_listings),
        }

    def report(self) -> None:
        for kind, n in self.state_sizes().items():
            self.telemetry.state_entries.labels(kind).set(n)

    async def drain(self) -> None:
        """Wait for every queued diagnosis to be handled (graceful stop, tests)."""
        for w in list(self._workers.values()):
            await w.queue.join()

    def owns(self, incident: Incident) -> bool:
        """True when this member owns the partition the incident's diagnosis came from (or when the
        incident did not come from the bus)."""
        if incident.source_topic is None or incident.source_partition is None:
            return True
        return (incident.source_topic, incident.source_partition) in self._assignment
