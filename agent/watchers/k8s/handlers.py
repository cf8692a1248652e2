"""The handlers a reflector feeds, and the set of watchers of one agent (`KubeWatchers`).

Each handler keeps a cache of digests keyed by object and publishes through the `Publisher` on
`trainmedic.k8s` only when something meaningful changed. A node that is unhealthy or deleted is
published once more per job with pods on it (`NodeHandler`), so the node's loss reaches each job.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from trainmedic.agent.bus.base import Bus
from trainmedic.agent.jobindex import JobIndex, _get, _map
from trainmedic.agent.telemetry import Telemetry
from trainmedic.agent.watchers.k8s.digest import (
    PodDigest,
    _plugin_resources,
    event_pod,
    event_time,
    k8s_event,
    node_status,
    pod_digest,
    workload_status,
)
from trainmedic.agent.watchers.k8s.lines import node_unhealthy
from trainmedic.agent.watchers.k8s.objects import (
    EVENTS,
    NODES,
    PODS,
    RESOURCES,
    WORKLOAD_RESOURCES,
    ResourceSpec,
    _int,
    _str,
    object_key,
    resource_spec,
)
from trainmedic.agent.watchers.k8s.reflector import Handler, Reflector, WatchSettings, watch_client
from trainmedic.backoff import Backoff
from trainmedic.events import NodeStatus, Payload, PodStatus, Topic, WorkloadStatus, make_event

log = logging.getLogger("trainmedic.watchers.k8s")


class Publisher:
    """Publishes payloads on trainmedic.k8s (keyed by job, else node, else pod) and counts them."""

    def __init__(self, bus: Bus, telemetry: Telemetry, producer: str, topic: Topic = Topic.K8S) -> None:
        self.bus = bus
        self.telemetry = telemetry
        self.producer = producer
        self.topic = topic

    async def publish(self, payload: Payload) -> None:
        await self.bus.publish(self.topic, make_event(payload, producer=self.producer))
        self.telemetry.events_out.labels(topic=self.topic.value).inc()


PodListener = Callable[[PodStatus], None]


class PodHandler(Handler):
    """Pods -> JobIndex + PodStatus on meaningful changes."""

    def __init__(
        self, publisher: Publisher, jobs: JobIndex, *, only_job_pods: bool = False, publish: bool = True
    ) -> None:
        self.publisher = publisher
        self.jobs = jobs
        self.only_job_pods = only_job_pods
        # The node role only keeps its JobIndex warm; the cluster role publishes pod statuses.
        self.publish = publish
        self.cache: dict[str, PodDigest] = {}
        self.listeners: list[PodListener] = []

    def key(self, obj: Mapping[str, Any]) -> str | None:
        key = object_key(obj)
        if key is not None and "/" not in key:
            key = f"default/{key}"
        return key

    def keys(self, namespace: str | None) -> list[str]:
        if namespace is None:
            return list(self.cache)
        prefix = f"{namespace}/"
        return [k for k in self.cache if k.startswith(prefix)]

    def has(self, key: str) -> bool:
        return key in self.cache

    async def _emit(self, status: PodStatus) -> None:
        if (self.only_job_pods and status.job is None) or not self.publish:
            return
        await self.publisher.publish(status)
        for listener in self.listeners:
            listener(status)

    async def apply(self, obj: Mapping[str, Any]) -> None:
        key = self.key(obj)
        if key is None:
            return
        info = self.jobs.update_pod(obj)
        digest = pod_digest(obj, info)
        old = self.cache.get(key)
        if old is not None and old.meaningful() == digest.meaningful():
            self.cache[key] = digest
            return
        await self._emit(digest.status())
        self.cache[key] = digest

    async def remove(self, key: str, obj: Mapping[str, Any] | None) -> None:
        old = self.cache.get(key)
        digest = pod_digest(obj) if obj is not None else old
        ns, _, name = key.partition("/")
        current = self.jobs.pod(ns, name)
        if obj is None or current is None or current.uid == _str(_get(obj, "metadata", "uid")):
            self.jobs.remove_pod(ns, name)
        if digest is not None:
            await self._emit(digest.status(deleted=True))
        self.cache.pop(key, None)


class EventHandler(Handler):
    """core/v1 Events -> K8sEvent, de-duplicated by uid + count; old events recorded, not published,
    and so are events from before the agent started about pods that are gone."""

    def __init__(self, publisher: Publisher, jobs: JobIndex, settings: WatchSettings) -> None:
        self.publisher = publisher
        self.jobs = jobs
        self.settings = settings
        self.seen: OrderedDict[str, int] = OrderedDict()
        self.started = time.time()

    def key(self, obj: Mapping[str, Any]) -> str | None:
        return _str(_get(obj, "metadata", "uid")) or object_key(obj)

    def _history(self, obj: Mapping[str, Any], when: float | None) -> bool:
        """An event from before this agent started about a pod the index does not hold (`event_pod`:
        not even where a pod of its name now has another uid): the pod is gone, and so is what the
        event said (a NodeNotReady the node lifecycle controller recorded on a pod since deleted,
        replayed by the first list after a restart). Recorded, not published."""
        # Event times have whole seconds (lastTimestamp): one second of slack.
        if when is None or when >= self.started - 1.0:
            return False
        inv = _map(obj.get("involvedObject")) or _map(obj.get("regarding"))
        if _str(inv.get("kind")) != "Pod":
            return False
        return event_pod(obj, self.jobs) is None

    def keys(self, namespace: str | None) -> list[str]:
        return []  # events that disappear expired (TTL): nothing to publish

    def has(self, key: str) -> bool:
        return False

    async def apply(self, obj: Mapping[str, Any]) -> None:
        key = self.key(obj)
        if key is None:
            return
        count = _int(obj.get("count")) or _int(_get(obj, "series", "count")) or 1
        if self.seen.get(key, 0) >= count:
            return
        when = event_time(obj)
        fresh = when is None or time.time() - when <= self.settings.event_max_age_s
        if fresh and not self._history(obj, when):
            await self.publisher.publish(k8s_event(obj, self.jobs))
        self.seen[key] = count
        self.seen.move_to_end(key)
        while len(self.seen) > self.settings.event_dedup_size:
            self.seen.popitem(last=False)

    async def remove(self, key: str, obj: Mapping[str, Any] | None) -> None:
        return None


class NodeHandler(Handler):
    """Nodes -> NodeStatus when conditions, taints, schedulability, accelerators or labels change.

    A node that is unhealthy (Ready not True, a node lifecycle taint) or deleted is also published
    once per job with pods on it (`JobIndex.jobs_on_node`): copies of the one event (same id), each
    with its `job` and keyed by it, as kernel lines are, so the brain that owns each job sees it.
    """

    def __init__(self, publisher: Publisher, jobs: JobIndex | None = None) -> None:
        self.publisher = publisher
        self.jobs = jobs
        self.cache: dict[str, NodeStatus] = {}
        self._resources = _plugin_resources()

    async def _publish(self, status: NodeStatus) -> None:
        event = make_event(status, producer=self.publisher.producer)
        await self.publisher.bus.publish(self.publisher.topic, event)
        self.publisher.telemetry.events_out.labels(topic=self.publisher.topic.value).inc()
        if self.jobs is None or not node_unhealthy(status):
            return
        for job in self.jobs.jobs_on_node(status.node):
            copy = event.model_copy(update={"key": job.key, "payload": status.model_copy(update={"job": job})})
            await self.publisher.bus.publish(self.publisher.topic, copy)
            self.publisher.telemetry.events_out.labels(topic=self.publisher.topic.value).inc()

    def key(self, obj: Mapping[str, Any]) -> str | None:
        return _str(_get(obj, "metadata", "name"))

    def keys(self, namespace: str | None) -> list[str]:
        return list(self.cache)

    def has(self, key: str) -> bool:
        return key in self.cache

    async def apply(self, obj: Mapping[str, Any]) -> None:
        status = node_status(obj, plugin_resources=self._resources)
        if self.cache.get(status.node) == status:
            return
        await self._publish(status)
        self.cache[status.node] = status

    async def remove(self, key: str, obj: Mapping[str, Any] | None) -> None:
        old = self.cache.get(key)
        status = node_status(obj, plugin_resources=self._resources) if obj is not None else old
        if status is not None:
            await self._publish(status.model_copy(update={"deleted": True}))
        self.cache.pop(key, None)


class WorkloadHandler(Handler):
    """Jobs / Volcano Jobs / PyTorchJobs -> WorkloadStatus on change."""

    def __init__(self, publisher: Publisher, spec: ResourceSpec) -> None:
        self.publisher = publisher
        self.spec = spec
        self.cache: dict[str, WorkloadStatus] = {}

    def key(self, obj: Mapping[str, Any]) -> str | None:
        return object_key(obj)

    def keys(self, namespace: str | None) -> list[str]:
        if namespace is None:
            return list(self.cache)
        return [k for k in self.cache if k.startswith(f"{namespace}/")]

    def has(self, key: str) -> bool:
        return key in self.cache

    async def apply(self, obj: Mapping[str, Any]) -> None:
        key = self.key(obj)
        if key is None:
            return
        status = workload_status(self.spec, obj)
        if self.cache.get(key) == status:
            return
        await self.publisher.publish(status)
        self.cache[key] = status

    async def remove(self, key: str, obj: Mapping[str, Any] | None) -> None:
        old = self.cache.get(key)
        status = workload_status(self.spec, obj, deleted=True) if obj is not None else old
        if status is not None:
            await self.publisher.publish(status.model_copy(update={"deleted": True}))
        self.cache.pop(key, None)


# ------------------------------------------------------------------------------------------------
# The set of watchers of one agent


async def guarded(name: str, run: Callable[[], Any], telemetry: Telemetry, source: str) -> None:
    """Run a long-lived coroutine until cancelled; log, count and restart it (with backoff) if it fails."""
    backoff = Backoff(1.0, 60.0)
    while True:
        try:
            await run()
            log.warning("%s returned; restarting", name)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("%s failed; restarting in %.0f s", name, backoff.current)
            telemetry.watch_errors.labels(source=source, kind="crash").inc()
        await asyncio.sleep(backoff.next())


@dataclass
class _Sync:
    pending: set[str] = field(default_factory=set)
    pods_pending: set[str] = field(default_factory=set)


class KubeWatchers:
    """The list+watch loops of one agent over one Bus, JobIndex and Telemetry.

    `run()` runs until cancelled. `ready` is set once every loop has finished its first list (or
    found its resource missing or forbidden), i.e. once the JobIndex is warm.

    Options: `namespaces` (empty: all), `label_selector` (pods only), `node_name` (the node role:
    only the pods bound to this node, a field selector), `resources` (names among pods, events,
    nodes, jobs, volcanojobs, pytorchjobs; None: pods, events, nodes, plus the workloads when
    `workloads`), `only_job_pods` (publish PodStatus only for pods of a job; the index has them all), `publish_pods`
    (False: only feed the JobIndex, as the node role does; the cluster role publishes pod statuses).

    The events loops start once the pods are listed (or after `events_wait_s`): an event about a
    pod is keyed by the pod's job, which the JobIndex must know by then.
    """

    events_wait_s: float = 30.0

    def __init__(
        self,
        api: Any,
        *,
        bus: Bus,
        job_index: JobIndex,
        telemetry: Telemetry,
        producer: str = "",
        namespaces: Sequence[str] = (),
        label_selector: str | None = None,
        node_name: str | None = None,
        resources: Iterable[str] | None = None,
        workloads: bool = True,
        only_job_pods: bool = False,
        publish_pods: bool = True,
        settings: WatchSettings | None = None,
    ) -> None:
        self.api = watch_client(api)
        self.bus = bus
        self.job_index = job_index
        self.telemetry = telemetry
        self.producer = producer
        self.settings = settings or WatchSettings()
        self.namespaces: tuple[str | None, ...] = tuple(dict.fromkeys(namespaces)) or (None,)
        self.label_selector = label_selector
        self.node_name = node_name
        if resources is None:
            names = ["pods", "events", "nodes", *(WORKLOAD_RESOURCES if workloads else ())]
        else:
            names = [resource_spec(r).name for r in resources]
        self.resources = tuple(dict.fromkeys(names))
        self.ready = asyncio.Event()
        self.publisher = Publisher(bus, telemetry, producer)
        self.pods = PodHandler(self.publisher, job_index, only_job_pods=only_job_pods, publish=publish_pods)
        self.events = EventHandler(self.publisher, job_index, self.settings)
        self.nodes = NodeHandler(self.publisher, job_index)
        self.workloads: dict[str, WorkloadHandler] = {}
        self.reflectors: list[Reflector] = []
        self._sync = _Sync()
        for name in self.resources:
            spec = RESOURCES[name]
            handler: Handler
            if spec is PODS:
                handler = self.pods
            elif spec is EVENTS:
                handler = self.events
            elif spec is NODES:
                handler = self.nodes
            else:
                handler = self.workloads.setdefault(name, WorkloadHandler(self.publisher, spec))
            for ns in self.namespaces if spec.namespaced else (None,):
                r = Reflector(
                    spec,
                    handler,
                    api=self.api,
                    telemetry=telemetry,
                    settings=self.settings,
                    namespace=ns,
                    label_selector=label_selector if spec is PODS else None,
                    node_name=node_name if spec is PODS else None,
                    on_synced=self._synced,
                )
                self.reflectors.append(r)
                self._sync.pending.add(r.name)
                if spec is PODS:
                    self._sync.pods_pending.add(r.name)
        self._pods_listed = asyncio.Event()
        if not self._sync.pods_pending:
            self._pods_listed.set()

    def add_pod_listener(self, listener: PodListener) -> None:
        """Called with every PodStatus published (after the bus accepted it)."""
        self.pods.listeners.append(listener)

    def _synced(self, r: Reflector) -> None:
        self._sync.pending.discard(r.name)
        self._sync.pods_pending.discard(r.name)
        if not self._sync.pods_pending:
            self._pods_listed.set()
        if not self._sync.pending:
            self.ready.set()

    async def _run_reflector(self, r: Reflector) -> None:
        if r.spec is EVENTS:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.events_wait_s):
                    await self._pods_listed.wait()
        await guarded(f"watch {r.name}", r.run, self.telemetry, r.source)

    def states(self) -> dict[str, str]:
        """Each loop's state: starting, listing, watching, backoff, missing or forbidden."""
        return {r.name: r.state for r in self.reflectors}

    async def run(self) -> None:
        if not self.reflectors:
            self.ready.set()
        tasks = [asyncio.create_task(self._run_reflector(r), name=f"k8s:{r.name}") for r in self.reflectors]
        try:
            await asyncio.gather(*tasks)
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
