"""Training pods' logs followed through the Kubernetes API, for small clusters without the node role.

Without the DaemonSet there is no /var/log/pods to tail, so the cluster role asks the API server:
`read_namespaced_pod_log(follow=True, timestamps=True)` per container of every pod that maps to a
job (bare pods are not training pods). Each stream is read line by line in its own daemon thread
(`LineStream`) and published as `LogBatch` (file="api") with the namespace, pod, container, node,
job and rank filled, batched up to 512 lines or 50 ms, whichever comes first.

Which log is read, per container (instance n = the container's restartCount while it runs):

* a running instance is followed from its start; one already running when the follower starts is
  followed from "now" (`start_at="end"`, like tail -f) so a restart of the agent does not replay
  hours of old lines;
* when the stream ends and the instance still runs (the API server or a proxy dropped it, or it was
  idle past `stream_idle_s`), it is resumed with sinceSeconds covering the last line seen, and lines
  already published are skipped by their timestamp (ties counted), so nothing is published twice;
* when the instance ended, one last non-follow read (previous=true when the container was already
  restarted) collects lines a dropped stream missed; then the next instance is followed from its
  start (CrashLoopBackOff: each new instance's log);
* an instance that started and ended between two observations (a crash in the first second) is
  read afterwards through previous=true, if the kubelet still has it (it keeps the previous one);
* when the pod goes away (or stops mapping to a job), its streams are closed.

The follower has its own pod list+watch (the same `Reflector` as the watchers) so it runs beside
`KubeWatchers` or alone. Every urllib3 connection of a followed stream stays open: give the
ApiClient a `connection_pool_maxsize` above the number of containers followed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Literal

from kubernetes import client as kclient
from kubernetes.client.exceptions import ApiException

from trainmedic.agent.bus.base import Bus
from trainmedic.agent.jobindex import JobIndex, PodInfo, _map, pod_info
from trainmedic.agent.telemetry import Telemetry
from trainmedic.agent.watchers.k8s import (
    PODS,
    Handler,
    LineStream,
    Publisher,
    Reflector,
    WatchSettings,
    classify,
    guarded,
    object_key,
    watch_client,
)
from trainmedic.backoff import backoff_delay
from trainmedic.events import LogBatch, Topic
from trainmedic.timefmt import parse_rfc3339_ns

log = logging.getLogger("trainmedic.watchers.podlogs")

SOURCE = "podlogs"


@dataclass(frozen=True)
class PodLogSettings:
    """Knobs of the API log follower; defaults suit a real cluster."""

    # A LogBatch is published when it has this many lines, this many bytes, or its first line has
    # waited this long.
    max_lines: int = 512
    max_wait_s: float = 0.05
    # (With lines cut at max_line_bytes, a batch stays under the bus's 1 MB message limit even when
    # JSON has to escape every character.)
    max_batch_bytes: int = 128 << 10
    # A longer line is cut there (marked " [truncated]").
    max_line_bytes: int = 16 << 10
    # A followed stream that delivers nothing for this long is closed and resumed (a quiet job, a
    # half-dead connection); resuming costs one request and no duplicate.
    stream_idle_s: float = 300.0
    connect_timeout_s: float = 10.0
    # sinceSeconds slack when resuming, against clock skew between this host and the node.
    resume_margin_s: int = 5
    # After a stream ends while the container still runs by the last status seen, wait this long
    # (doubling while streams keep ending empty, up to 30 s) for a newer status before resuming.
    settle_s: float = 1.0
    backoff_base_s: float = 0.5
    backoff_max_s: float = 30.0
    # Containers already running when the follower starts: "end" follows from now, "start" reads
    # their whole current log first.
    start_at: Literal["end", "start"] = "end"
    # Instances that ended at most this long before the follower started are still read.
    catch_up_s: float = 60.0
    # At most this many containers followed at once (each holds a connection and a thread).
    max_streams: int = 500
    # The pod list+watch.
    watch: WatchSettings = field(default_factory=WatchSettings)


@dataclass(frozen=True, slots=True)
class ContainerState:
    """A container's status as the follower needs it.

    Instances are told apart by container ID (a restart count when the runtime gave none). What the
    kubelet serves (pkg/kubelet validateContainerLogStatus): without `previous`, the running or
    terminated container, or, while it waits to restart, the last terminated one; with `previous`,
    the last terminated one (lastState).
    """

    restarts: int
    # running | waiting | terminated (the current state, not the last termination)
    state: str
    # The instance a read without `previous` returns; None while nothing can be read.
    current_id: str | None
    # The instance a read with `previous` returns (lastState.terminated); None when there is none.
    last_id: str | None
    started_at: float | None
    finished_at: float | None
    last_finished_at: float | None


def _t(v: Any) -> float | None:
    ns = parse_rfc3339_ns(v) if isinstance(v, str) else None
    return ns / 1e9 if ns is not None else None


def _id(v: Any) -> str | None:
    return v if isinstance(v, str) and v else None


def container_state(cs: Mapping[str, Any]) -> ContainerState:
    state = _map(cs.get("state"))
    last_term = _map(cs.get("lastState")).get("terminated")
    raw = cs.get("restartCount")
    r = raw if isinstance(raw, int) and not isinstance(raw, bool) and raw >= 0 else 0
    started = finished = None
    if isinstance(state.get("running"), Mapping):
        kind, started = "running", _t(state["running"].get("startedAt"))
        current = _id(cs.get("containerID")) or f"#{r}"
    elif isinstance(state.get("terminated"), Mapping):
        term = state["terminated"]
        kind, started, finished = "terminated", _t(term.get("startedAt")), _t(term.get("finishedAt"))
        current = _id(term.get("containerID")) or _id(cs.get("containerID")) or f"#{r}"
    else:
        kind, current = "waiting", None
    last = None
    if isinstance(last_term, Mapping):
        # While waiting to restart, the kubelet reports the dead instance's own restart count.
        last = _id(last_term.get("containerID")) or (f"#{r}" if kind == "waiting" else f"#{r - 1}")
        if kind == "waiting":
            current = last
    return ContainerState(
        restarts=r,
        state=kind,
        current_id=current,
        last_id=last,
        started_at=started,
        finished_at=finished,
        last_finished_at=_t(last_term.get("finishedAt")) if isinstance(last_term, Mapping) else None,
    )


def parse_log_line(raw: bytes) -> tuple[int | None, str]:
    """A `timestamps=true` log line: (nanoseconds since the epoch or None, the text after the stamp)."""
    text = raw.decode("utf-8", "replace")
    if text.endswith("\r"):
        text = text[:-1]
    head, sep, rest = text.partition(" ")
    if sep:
        ns = parse_rfc3339_ns(head)
        if ns is not None:
            return ns, rest
    return None, text


@dataclass
class _Cursor:
    """Where the reading of one container instance is: what was published already."""

    instance: str
    emitted: int = 0
    last_ns: int | None = None
    # lines published with the timestamp `last_ns` (several lines can share one stamp)
    at_last: int = 0
    # Followed "from now": lines stamped before this were not wanted (used when resuming before
    # the first line arrived).
    floor_ns: int | None = None


class _Follower:
    """Follows one container of one pod across its instances until stopped."""

    def __init__(self, owner: PodLogFollower, info: PodInfo, container: str, state: ContainerState) -> None:
        self.owner = owner
        self.info = info
        self.container = container
        self.state = state
        self.changed = asyncio.Event()
        # The instance being followed (a container ID).
        self.following: str | None = None
        # Instances read (or being read): not read again. The last few are enough.
        self.done: OrderedDict[str, None] = OrderedDict()
        self.cursor: _Cursor | None = None
        self.requests = 0
        self._first = True
        self._quiet = 0
        self.task: asyncio.Task[None] | None = None

    @property
    def name(self) -> str:
        return f"{self.info.namespace}/{self.info.name}/{self.container}"

    def observe(self, info: PodInfo, state: ContainerState) -> None:
        self.info = info
        if state != self.state:
            self.state = state
            self.changed.set()

    def _recent(self, t: float | None) -> bool:
        return t is not None and t >= self.owner.started_wall - self.owner.settings.catch_up_s

    def _mark(self, instance: str) -> None:
        self.done[instance] = None
        self.done.move_to_end(instance)
        while len(self.done) > 8:
            self.done.popitem(last=False)

    async def run(self) -> None:
        try:
            while True:
                self.changed.clear()
                busy = await self._step(self.state)
                self._first = False
                if not busy:
                    await self.changed.wait()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("following %s failed; it is picked up again at its next status change", self.name)
            self.owner.telemetry.watch_errors.labels(source=SOURCE, kind="crash").inc()
        finally:
            self.owner._forget(self)

    async def _step(self, st: ContainerState) -> bool:
        """Do one thing about the latest state; False when there is nothing to do until it changes."""
        running = st.current_id if st.state == "running" else None
        # 1. The instance being followed ended: one last read for what a dropped stream missed.
        if self.following is not None and self.following != running:
            inst, self.following = self.following, None
            if inst == st.current_id:
                await self._read(inst, previous=False, follow=False)
            elif inst == st.last_id:
                await self._read(inst, previous=True, follow=False)
            return True
        # 2. The last terminated instance was never read (it crashed between two observations, or
        #    just before the follower started): the kubelet still has it.
        if st.last_id is not None and st.last_id not in self.done:
            if not self._first or self._recent(st.last_finished_at):
                await self._read(st.last_id, previous=True, follow=False)
                return True
            self._mark(st.last_id)  # ended long before the follower started: not replayed
        # 3. The current instance.
        if running is not None:
            resume = self.following == running
            self.following = running
            from_now = (
                not resume
                and running not in self.done
                and self._first
                and self.owner.settings.start_at == "end"
                and not self._recent(st.started_at)
            )
            outcome = await self._read(running, previous=False, follow=True, from_now=from_now)
            await self._settle(outcome)
            return True
        if st.state == "terminated" and st.current_id is not None and st.current_id not in self.done:
            if not self._first or self._recent(st.finished_at):
                await self._read(st.current_id, previous=False, follow=False)
                return True
            self._mark(st.current_id)
        return False

    async def _settle(self, outcome: str) -> None:
        """After a follow stream ended: wait for a newer status (or a backoff) before going on."""
        s = self.owner.settings
        if outcome == "data":
            self._quiet = 0
            delay = backoff_delay(0, base=s.settle_s, cap=s.settle_s)
        else:
            delay = backoff_delay(self._quiet, base=max(s.settle_s, s.backoff_base_s), cap=s.backoff_max_s)
            self._quiet = min(self._quiet + 1, 20)
        # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancellation that arrives as
        # its awaitable completes, and the follower would outlive the agent's shutdown.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(delay):
                await self.changed.wait()

    def _open(self, **kw: Any) -> Any:
        core = kclient.CoreV1Api(self.owner.api)
        return core.read_namespaced_pod_log(self.info.name, self.info.namespace, **kw)

    async def _read(self, instance: str, *, previous: bool, follow: bool, from_now: bool = False) -> str:
        """Read (or follow) one instance's log and publish it; returns "data", "empty" or "error"."""
        s = self.owner.settings
        if self.cursor is None or self.cursor.instance != instance:
            self.cursor = _Cursor(instance)
        cur = self.cursor
        self._mark(instance)
        kw: dict[str, Any] = {
            "container": self.container,
            "timestamps": True,
            "follow": follow,
            "_preload_content": False,
            "_request_timeout": (s.connect_timeout_s, s.stream_idle_s),
        }
        if previous:
            kw["previous"] = True
        skip_lines = 0
        resume_ns, resume_at_last = cur.last_ns, cur.at_last
        if cur.emitted and cur.last_ns is not None:
            kw["since_seconds"] = max(1, math.ceil(time.time() - cur.last_ns / 1e9) + s.resume_margin_s)
        elif cur.emitted:
            skip_lines = cur.emitted  # a server without timestamps: skip by position
        elif cur.floor_ns is not None:
            kw["since_seconds"] = max(1, math.ceil(time.time() - cur.floor_ns / 1e9) + s.resume_margin_s)
            resume_ns, resume_at_last = cur.floor_ns, 0
        elif from_now:
            kw["tail_lines"] = 0
            cur.floor_ns = time.time_ns()
        self.requests += 1
        stream: LineStream[tuple[int | None, str]] = LineStream(
            partial(self._open, **kw),
            parse_log_line,
            name=f"log:{self.name}",
            max_line=s.max_line_bytes,
            truncate=True,
        )
        batch = _Batch(self, cur)
        seen_at_last = 0
        loop = asyncio.get_running_loop()
        got = False
        try:
            async with stream:
                while True:
                    timeout = None if not batch.lines else max(0.0, batch.deadline - loop.time())
                    try:
                        lines = await stream.next_batch(timeout)
                    except StopAsyncIteration:
                        break
                    if lines is None:
                        await batch.flush()
                        continue
                    for ts, text in lines:
                        if skip_lines:
                            skip_lines -= 1
                            continue
                        if resume_ns is not None and ts is not None:
                            if ts < resume_ns:
                                continue
                            if ts == resume_ns and seen_at_last < resume_at_last:
                                seen_at_last += 1
                                continue
                            resume_ns = None  # past what was published: everything else is new
                        got = True
                        batch.add(ts, text, loop.time())
                        if batch.full():
                            await batch.flush()
                    if batch.lines and loop.time() >= batch.deadline:
                        await batch.flush()
            await batch.flush()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - classified in _failed, which re-raises what it does not know
            await batch.flush()
            return self._failed(exc, previous=previous, follow=follow)
        if stream.ended == "timeout":
            log.debug("%s: log stream idle for %.0f s; resuming", self.name, s.stream_idle_s)
        return "data" if got else "empty"

    def _failed(self, exc: Exception, *, previous: bool, follow: bool) -> str:
        verb = "follow" if follow else "read"
        if isinstance(exc, ApiException) and exc.status in (400, 404):
            # 400: the container is not started yet / has no previous instance; 404: the pod is gone.
            # The pod watch brings the status that explains it.
            log.debug("%s: cannot %s the log (%s): %s", self.name, verb, exc.status, exc.reason)
            return "error"
        err = classify(exc, resource=f"pods/log of {self.name}", verb=verb)
        if err is None:
            raise exc
        self.owner.telemetry.watch_errors.labels(source=SOURCE, kind=err.kind).inc()
        log.warning("%s", err)
        return "error"


class _Batch:
    """Lines waiting to be published as one LogBatch."""

    def __init__(self, follower: _Follower, cursor: _Cursor) -> None:
        self.f = follower
        self.cursor = cursor
        self.lines: list[str] = []
        self.times: list[float] = []
        self.bytes = 0
        self.first_line = cursor.emitted + 1
        self.deadline = 0.0

    def add(self, ts: int | None, text: str, now: float) -> None:
        s = self.f.owner.settings
        c = self.cursor
        if not self.lines:
            self.deadline = now + s.max_wait_s
            self.first_line = c.emitted + 1
        self.lines.append(text)
        if ts is None:
            self.times.append(self.times[-1] if self.times else time.time())
        else:
            self.times.append(ts / 1e9)
            if ts == c.last_ns:
                c.at_last += 1
            else:
                c.last_ns, c.at_last = ts, 1
        self.bytes += len(text.encode("utf-8", "replace")) + 1
        c.emitted += 1

    def full(self) -> bool:
        s = self.f.owner.settings
        return len(self.lines) >= s.max_lines or self.bytes >= s.max_batch_bytes

    async def flush(self) -> None:
        if not self.lines:
            return
        info = self.f.info
        payload = LogBatch(
            node=info.node,
            namespace=info.namespace,
            pod=info.name,
            container=self.f.container,
            job=info.job,
            rank=info.rank,
            file="api",
            first_line=self.first_line,
            lines=self.lines,
            times=self.times,
        )
        self.lines, self.times, self.bytes = [], [], 0
        await self.f.owner.publisher.publish(payload)


class _PodHandler(Handler):
    """The follower's view of pods: which containers of which training pods run."""

    def __init__(self, owner: PodLogFollower) -> None:
        self.owner = owner
        self.pods: dict[str, str | None] = {}

    def key(self, obj: Mapping[str, Any]) -> str | None:
        key = object_key(obj)
        return f"default/{key}" if key is not None and "/" not in key else key

    def keys(self, namespace: str | None) -> list[str]:
        return [k for k in self.pods if namespace is None or k.startswith(f"{namespace}/")]

    def has(self, key: str) -> bool:
        return key in self.pods

    async def apply(self, obj: Mapping[str, Any]) -> None:
        key = self.key(obj)
        if key is None:
            return
        info = pod_info(obj)
        if info.job is None:
            if key in self.pods:
                self.owner.stop_pod(info.namespace, info.name)
                del self.pods[key]
            return
        old_uid = self.pods.get(key)
        if key in self.pods and old_uid != info.uid:
            self.owner.stop_pod(info.namespace, info.name)  # a new pod under the same name
        self.pods[key] = info.uid
        statuses = _map(obj.get("status")).get("containerStatuses")
        for cs in statuses if isinstance(statuses, list) else ():
            if isinstance(cs, Mapping) and isinstance(cs.get("name"), str):
                self.owner.observe(info, cs["name"], container_state(cs))

    async def remove(self, key: str, obj: Mapping[str, Any] | None) -> None:
        ns, _, name = key.partition("/")
        self.pods.pop(key, None)
        self.owner.stop_pod(ns, name)


class PodLogFollower:
    """Follows the logs of training pods through the API and publishes LogBatch on trainmedic.logs.

    `run()` until cancelled; `ready` is set after the first pod list. `job_index` is accepted for
    symmetry with the other sources; the job and rank are computed from each pod itself.
    """

    def __init__(
        self,
        api: Any,
        *,
        bus: Bus,
        telemetry: Telemetry,
        job_index: JobIndex | None = None,
        producer: str = "",
        namespaces: Sequence[str] = (),
        label_selector: str | None = None,
        settings: PodLogSettings | None = None,
    ) -> None:
        self.api = watch_client(api)
        self.telemetry = telemetry
        self.job_index = job_index
        self.settings = settings or PodLogSettings()
        self.publisher = Publisher(bus, telemetry, producer, topic=Topic.LOGS)
        self.ready = asyncio.Event()
        self.started_wall = time.time()
        self.followers: dict[tuple[str, str, str], _Follower] = {}
        self._handler = _PodHandler(self)
        self._pending: set[str] = set()
        self._warned_limit = False
        self.reflectors = [
            Reflector(
                PODS,
                self._handler,
                api=self.api,
                telemetry=telemetry,
                settings=self.settings.watch,
                namespace=ns,
                label_selector=label_selector,
                on_synced=self._synced,
                source=SOURCE,
            )
            for ns in (tuple(dict.fromkeys(namespaces)) or (None,))
        ]
        self._pending = {r.name for r in self.reflectors}

    def _synced(self, r: Reflector) -> None:
        self._pending.discard(r.name)
        if not self._pending:
            self.ready.set()

    def observe(self, info: PodInfo, container: str, state: ContainerState) -> None:
        key = (info.namespace, info.name, container)
        f = self.followers.get(key)
        if f is not None:
            f.observe(info, state)
            return
        if len(self.followers) >= self.settings.max_streams:
            if not self._warned_limit:
                self._warned_limit = True
                log.warning(
                    "following %d containers already (max_streams); %s is not followed",
                    len(self.followers),
                    "/".join(key),
                )
            return
        f = _Follower(self, info, container, state)
        self.followers[key] = f
        f.task = asyncio.create_task(f.run(), name=f"podlog:{f.name}")

    def stop_pod(self, namespace: str, pod: str) -> None:
        for key in [k for k in self.followers if k[0] == namespace and k[1] == pod]:
            f = self.followers.pop(key)
            if f.task is not None:
                f.task.cancel()

    def _forget(self, f: _Follower) -> None:
        key = (f.info.namespace, f.info.name, f.container)
        if self.followers.get(key) is f:
            del self.followers[key]

    async def run(self) -> None:
        tasks = [
            asyncio.create_task(
                guarded(f"pod log watch {r.name}", r.run, self.telemetry, SOURCE), name=f"podlogs:{r.name}"
            )
            for r in self.reflectors
        ]
        try:
            await asyncio.gather(*tasks)
        finally:
            for t in tasks:
                t.cancel()
            followers = [f.task for f in self.followers.values() if f.task is not None]
            self.followers.clear()
            for t in followers:
                t.cancel()
            await asyncio.gather(*tasks, *followers, return_exceptions=True)
