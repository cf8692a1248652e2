"""KubeOps, the Kubernetes operations the responder performs, over the official client: the
retrying call in threads of its own, reads, workloads (get, delete, wait until gone, create), pods,
logs, exec, finalizers and events, and the read-modify-write every write of ours goes through. The
node operations are NodeQuarantineMixin's (nodes.py), which KubeOps inherits.

- Deleting a workload carries a uid precondition, so a retry never deletes the newer incarnation
  the restart created; the uid is also compared client-side first (kmock, the emulator the tests
  run against, ignores preconditions).
- A create retried after a lost response finds its own object (409 with our incident annotation)
  and returns it instead of failing.

Threads: the official client is synchronous; every call runs in a thread of KubeOps' own executor
(as many threads as the connection pool has connections, `pool_maxsize`) with a
(connect, read) timeout, so a hung API server costs a bounded wait, never a blocked event loop.
KubeOps makes its own ApiClient from the caller's configuration, without urllib3's hidden retries
(which would sleep out a Retry-After inside the thread); backoff waits are `asyncio.sleep` on the
loop clock (looptime fast-forwards them in tests). `close()` releases that client's pool.
Responses are read as raw JSON (`_preload_content=False`): the same camelCase dicts that
`sanitize_for_serialization` makes of the typed models, without building those models, and
without failing on a field the client's models do not know.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import copy
import logging
import random
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

import urllib3.util
from kubernetes import client as kclient

from trainmedic.backoff import backoff_delay
from trainmedic.remediations.kube.errors import (
    ConflictError,
    KubeInvalid,
    KubeNotFound,
    PermanentKubeError,
    TemporaryKubeError,
    _json_object,
    classify,
)
from trainmedic.remediations.kube.nodes import NodeQuarantineMixin
from trainmedic.remediations.kube.pods import PodRunMixin
from trainmedic.remediations.kube.resources import (
    ANN_INCIDENT,
    EVENTS,
    JOBS,
    JSON,
    LOG_BYTES,
    MERGE_PATCH,
    NODES,
    PODS,
    SCENE_FINALIZER,
    KindLike,
    Outcome,
    _check_names,
    _event_time,
    _identify,
    _labels_match,
    _list,
    _map,
    _meta,
    _selector,
    _str_map,
    _What,
    _with_rv,
    _workload_res,
)
from trainmedic.remediations.stacks import ExecResult, exec_in_pod

log = logging.getLogger("trainmedic.remediations.kube")

T = TypeVar("T")


# ------------------------------------------------------------------------------------------------
# The operations


def own_client(api: Any, pool_maxsize: int | None = None) -> Any:
    """An ApiClient made from the caller's configuration (credentials, TLS, proxy, token refresh hook)
    with its own connection pool and a retry policy that leaves HTTP statuses to the caller (KubeOps,
    the watchers' reflectors): urllib3's
    default honours a 429/503 Retry-After by sleeping inside the thread (uncancellable, as long as
    the server says, invisible to the loop clock) and retries behind our back. Connection attempts
    are still retried at once (twice); a read is never repeated by urllib3 (a PATCH must not be)."""
    cfg = copy.deepcopy(api.configuration)
    if pool_maxsize is not None:
        # One connection per call in flight at once (`pool_maxsize`), never fewer than the
        # configuration's own: past the pool, urllib3 opens and drops a connection per request.
        cfg.connection_pool_maxsize = max(pool_maxsize, cfg.connection_pool_maxsize or 0)
    cfg.retries = urllib3.util.Retry(
        total=3,
        connect=2,
        read=0,
        status=0,
        other=0,
        redirect=3,
        respect_retry_after_header=False,
        raise_on_status=False,
    )
    client = kclient.ApiClient(cfg)
    client.default_headers.update(getattr(api, "default_headers", {}) or {})
    client.cookie = getattr(api, "cookie", None)
    return client


class KubeOps(NodeQuarantineMixin, PodRunMixin):
    """Async Kubernetes operations over the official client (an `ApiClient` given by the caller).

    `attempts` bounds the tries of one call on temporary errors (and the re-reads after 409 on our own
    writes); the wait between tries is `base_delay * 2**n` capped at `max_delay`, less up to `jitter`
    of it at random, or the server's Retry-After (capped at `retry_after_max`) when it sent one.
    `request_timeout` is the (connect, read) timeout of every request. `pool_maxsize` sizes the
    connection pool to the calls made at once (the responder's `remediate.max_concurrent`).
    """

    def __init__(
        self,
        api_client: Any,
        *,
        attempts: int = 5,
        base_delay: float = 0.2,
        max_delay: float = 10.0,
        jitter: float = 0.5,
        retry_after_max: float = 60.0,
        request_timeout: tuple[float, float] = (5.0, 30.0),
        page_size: int = 500,
        rng: random.Random | None = None,
        sleep: Callable[[float], Awaitable[None]] | None = None,
        pool_maxsize: int | None = None,
    ) -> None:
        if attempts < 1:
            raise ValueError("attempts must be at least 1")
        if not 0.0 <= jitter <= 1.0:
            raise ValueError("jitter is a fraction of the delay, from 0 to 1")
        self.api = own_client(api_client, pool_maxsize)
        # The blocking client's calls run in threads of their own, as many as the pool has
        # connections: in the loop's default executor (`min(32, CPUs + 4)`, 6 on 2 cores, shared with
        # SQLite and scene writes) incidents handled at once would wait for a thread, not the API.
        self._threads = concurrent.futures.ThreadPoolExecutor(
            max_workers=max(pool_maxsize or 0, 4), thread_name_prefix="trainmedic-kube"
        )
        self.attempts = attempts
        self.base_delay = base_delay
        self.max_delay = max_delay
        self.jitter = jitter
        self.retry_after_max = retry_after_max
        self.request_timeout = request_timeout
        self.page_size = page_size
        self._rng = rng or random.Random()  # noqa: S311 - jitter, not cryptography
        self._sleep = sleep or asyncio.sleep
        self.core = kclient.CoreV1Api(self.api)
        self.batch = kclient.BatchV1Api(self.api)
        self.custom = kclient.CustomObjectsApi(self.api)

    def close(self) -> None:
        """Close the connection pool of the client this object made (the caller's is left alone) and
        its threads (calls in flight finish first)."""
        self.api.close()
        self._threads.shutdown(wait=False, cancel_futures=True)

    async def _in_thread(self, run: Callable[[], T]) -> T:
        """`run()` in one of this client's threads (context variables carried, as `to_thread` does)."""
        ctx = contextvars.copy_context()
        return await asyncio.get_running_loop().run_in_executor(self._threads, ctx.run, run)

    # -- the retrying call -------------------------------------------------------------------------

    def backoff(self, attempt: int) -> float:
        """The wait after failed try number `attempt` (1-based) when the server named none."""
        jitter = (1.0 - self.jitter, 1.0)
        return backoff_delay(attempt - 1, base=self.base_delay, cap=self.max_delay, jitter=jitter, rng=self._rng)

    async def _retrying(self, what: _What, run: Callable[[], T], on_retry: Callable[[], None] | None = None) -> T:
        """Run a blocking call in a thread; retry temporary errors (telling `on_retry` before each
        retry); raise the typed error otherwise."""
        attempt = 0
        while True:
            attempt += 1
            try:
                return await self._in_thread(run)
            except Exception as exc:
                err = classify(exc, what, retry_after_max=self.retry_after_max)
                if err is None:
                    raise
                if not isinstance(err, TemporaryKubeError):
                    raise err from exc
                if err.delay is None:
                    err.delay = self.backoff(attempt)
                if attempt >= self.attempts:
                    raise TemporaryKubeError(
                        f"{err} (gave up after {attempt} attempts)", delay=err.delay, status=err.status
                    ) from exc
                log.info("%s; retrying in %.2f s (attempt %d of %d)", err, err.delay, attempt, self.attempts)
                if on_retry is not None:
                    on_retry()
                await self._sleep(err.delay)

    async def _request(
        self,
        what: _What,
        fn: Callable[..., Any],
        *args: Any,
        on_retry: Callable[[], None] | None = None,
        **kwargs: Any,
    ) -> JSON:
        """One call whose answer is a JSON object."""

        def run() -> JSON:
            resp = fn(*args, _preload_content=False, _request_timeout=self.request_timeout, **kwargs)
            try:
                return _json_object(resp.data)
            finally:
                resp.release_conn()

        return await self._retrying(what, run, on_retry)

    async def _list(self, what: _What, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> list[JSON]:
        """Every item of a list, page by page (servers that ignore `limit` answer in one page)."""
        items: list[JSON] = []
        token: str | None = None
        seen: set[str] = set()
        while True:
            page_kw = dict(kwargs, limit=self.page_size)
            if token:
                page_kw["_continue"] = token
            doc = await self._request(what, fn, *args, **page_kw)
            items.extend(x for x in _list(doc.get("items")) if isinstance(x, dict))
            token = _meta(doc).get("continue") or None
            if not isinstance(token, str) or token in seen:
                return items
            seen.add(token)

    async def _get(self, what: _What, fn: Callable[..., Any], *args: Any) -> JSON | None:
        try:
            return await self._request(what, fn, *args)
        except KubeNotFound:
            return None

    # -- generic reads -----------------------------------------------------------------------------

    async def get(self, kind: KindLike | str, namespace: str | None, name: str) -> JSON | None:
        """An object by kind ("node", "pod", or anything with api_version and kind); None when absent."""
        if isinstance(kind, str):
            if kind.lower() == "node":
                return await self.get_node(name)
            if kind.lower() == "pod":
                if not namespace:
                    raise PermanentKubeError(f"get pod {name}: a namespace is required")
                return await self.get_pod(namespace, name)
            raise PermanentKubeError(f"get: unknown kind {kind!r} (node, pod, or a workload kind)")
        if not namespace:
            raise PermanentKubeError(f"get {kind.kind} {name}: a namespace is required")
        return await self.get_workload(kind.api_version, kind.kind, namespace, name)

    async def get_node(self, name: str) -> JSON | None:
        _check_names(node=name)
        return await self._get(_What("get", NODES, name=name), self.core.read_node, name)

    async def list_nodes(self, *, label_selector: Mapping[str, str] | None = None) -> list[JSON]:
        selector = _selector(label_selector or {})
        kw: dict[str, Any] = {"label_selector": selector} if selector else {}
        nodes = await self._list(_What("list", NODES), self.core.list_node, **kw)
        return [n for n in nodes if _labels_match(n, label_selector or {})]

    async def get_pod(self, namespace: str, name: str) -> JSON | None:
        _check_names(namespace=namespace, pod=name)
        return await self._get(_What("get", PODS, namespace, name), self.core.read_namespaced_pod, name, namespace)

    # -- workloads ---------------------------------------------------------------------------------

    async def get_workload(self, api_version: str, kind: str, namespace: str, name: str) -> JSON | None:
        """A training workload as the API's JSON (camelCase), or None when it does not exist."""
        res = _workload_res(api_version, kind)
        _check_names(namespace=namespace, name=name)
        what = _What("get", res, namespace, name)
        if res is JOBS:
            return await self._get(what, self.batch.read_namespaced_job, name, namespace)
        return await self._get(
            what, self.custom.get_namespaced_custom_object, res.group, res.version, namespace, res.plural, name
        )

    async def delete_workload(self, obj: Mapping[str, Any], *, propagation: str = "Background") -> bool:
        """Delete the workload `obj` is, and only that incarnation of it.

        With a uid in `obj`, the object is read first and left alone when its uid differs (a newer
        incarnation, e.g. the one a restart created) or it is gone; the delete itself carries the uid
        as a precondition, which the API server enforces against a race between the read and the
        delete (kmock does not, hence the read). True when a delete was accepted.
        """
        if propagation not in ("Background", "Foreground", "Orphan"):
            raise PermanentKubeError(f"propagation must be Background, Foreground or Orphan, not {propagation!r}")
        res, namespace, name = _identify(obj)
        uid = _meta(obj).get("uid")
        uid = uid if isinstance(uid, str) and uid else None
        if uid is not None:
            current = await self.get_workload(res.api_version, res.kind, namespace, name)
            if current is None:
                return False
            current_uid = _meta(current).get("uid")
            if current_uid and current_uid != uid:
                log.info(
                    "not deleting %s %s/%s: it is a newer incarnation (uid %s, not %s)",
                    res.kind, namespace, name, current_uid, uid,
                )  # fmt: skip
                return False
        body: JSON = {"propagationPolicy": propagation}
        if uid is not None:
            body["preconditions"] = {"uid": uid}
        what = _What("delete", res, namespace, name)
        try:
            if res is JOBS:
                await self._request(what, self.batch.delete_namespaced_job, name, namespace, body=body)
            else:
                await self._request(
                    what,
                    self.custom.delete_namespaced_custom_object,
                    res.group,
                    res.version,
                    namespace,
                    res.plural,
                    name,
                    body=body,
                )
        except KubeNotFound:
            return False
        except ConflictError:
            # The uid precondition failed: what is there now is another incarnation.
            log.info("not deleting %s %s/%s: its uid is no longer %s", res.kind, namespace, name, uid)
            return False
        return True

    async def wait_gone(
        self,
        api_version: str,
        kind: str,
        namespace: str,
        name: str,
        *,
        uid: str | None = None,
        timeout_s: float,
        poll_s: float = 0.5,
    ) -> bool:
        """Poll until the workload is gone (or, with `uid`, replaced by another incarnation). True when
        gone, False when `timeout_s` (loop time) passed first. Temporary API errors keep polling."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            try:
                current = await self.get_workload(api_version, kind, namespace, name)
            except TemporaryKubeError as exc:
                log.info("waiting for %s %s/%s to go: %s", kind, namespace, name, exc)
            else:
                if current is None:
                    return True
                if uid is not None and _meta(current).get("uid") not in (None, uid):
                    return True
            left = deadline - loop.time()
            if left <= 0:
                return False
            await self._sleep(min(poll_s, left))

    async def create_workload(self, body: Mapping[str, Any]) -> JSON:
        """Create a workload; 409 -> ConflictError, unless the object there is the one this very call
        created before its answer was lost (same `trainmedic.io/incident`), which is returned."""
        res, namespace, name = _identify(body)
        clean = dict(body)
        meta = _meta(body)
        for server_field in (
            "uid", "resourceVersion", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds",
            "generation", "managedFields", "selfLink",
        ):  # fmt: skip
            meta.pop(server_field, None)
        meta["namespace"] = namespace
        clean["metadata"] = meta
        what = _What("create", res, namespace, name)
        retried = False

        def note_retry() -> None:
            nonlocal retried
            retried = True

        try:
            # Every kind, batch/v1 Job included, goes through the generic endpoint (the same URL): the
            # typed BatchV1Api validates a dict body against the client's own models and refuses any
            # field they do not know (a cluster newer than the client, an alpha field), which would
            # fail a restart on our side for no reason the API server would give.
            return await self._request(
                what,
                self.custom.create_namespaced_custom_object,
                res.group,
                res.version,
                namespace,
                res.plural,
                clean,
                on_retry=note_retry,
            )
        except ConflictError:
            incident = _str_map(meta.get("annotations")).get(ANN_INCIDENT)
            if retried and incident:
                existing = await self.get_workload(res.api_version, res.kind, namespace, name)
                if existing is not None and _str_map(_meta(existing).get("annotations")).get(ANN_INCIDENT) == incident:
                    return existing
            raise

    # -- pods, logs, events ------------------------------------------------------------------------

    async def list_job_pods(self, namespace: str, selector: Mapping[str, str]) -> list[JSON]:
        """The pods of a job by its label selector (sent to the API and checked here as well: a server
        that ignores selectors, as kmock does, must not hand us other jobs' pods)."""
        _check_names(namespace=namespace)
        if not selector:
            raise PermanentKubeError(f"list pods in {namespace}: an empty selector would match every pod")
        pods = await self._list(
            _What("list", PODS, namespace), self.core.list_namespaced_pod, namespace, label_selector=_selector(selector)
        )
        return [p for p in pods if _labels_match(p, selector)]

    async def pod_log(
        self,
        namespace: str,
        pod: str,
        container: str,
        *,
        tail_lines: int = 1000,
        previous: bool = False,
        limit_bytes: int | None = LOG_BYTES,
    ) -> str:
        """The last `tail_lines` lines of a container's log, at most `limit_bytes` (None: `LOG_BYTES`)
        of their end, cut at a line start. A container with no such instance (no previous run, or
        not started yet) has an empty log, not an error."""
        _check_names(namespace=namespace, pod=pod, container=container)
        if limit_bytes is None:
            limit_bytes = LOG_BYTES
        if tail_lines < 0 or limit_bytes <= 0:
            raise PermanentKubeError("pod_log: tail_lines must be >= 0 and limit_bytes > 0")
        what = _What("get", PODS, namespace, pod, sub="log")

        def run() -> str:
            resp: Any = self.core.read_namespaced_pod_log(
                pod,
                namespace,
                container=container,
                tail_lines=tail_lines,
                previous=previous,
                _preload_content=False,
                _request_timeout=self.request_timeout,
            )
            tail = bytearray()
            mid_line = False  # the kept bytes start inside a line
            try:
                for chunk in resp.stream(64 * 1024):
                    tail += chunk
                    if len(tail) > limit_bytes:
                        drop = len(tail) - limit_bytes
                        mid_line = tail[drop - 1] != ord("\n")
                        del tail[:drop]
            finally:
                resp.release_conn()
            if mid_line:
                # Start at the first whole line, unless the kept bytes are the end of one long line.
                nl = tail.find(b"\n")
                if 0 <= nl < len(tail) - 1:
                    del tail[: nl + 1]
            return tail.decode("utf-8", "replace")

        try:
            return await self._retrying(what, run)
        except KubeInvalid as exc:
            text = str(exc)
            if "previous terminated container" in text or "waiting to start" in text:
                return ""
            raise

    async def exec(
        self,
        namespace: str,
        pod: str,
        container: str,
        command: list[str],
        *,
        timeout_s: float,
        max_bytes: int = 1 << 20,
    ) -> ExecResult:
        """Run a command in a container (pods/exec, remediations.stacks.exec_in_pod): never raises for
        what the cluster answers (a refusal, a timeout, a command that cannot start are in the result)."""
        return await exec_in_pod(self.api, namespace, pod, container, command, timeout_s=timeout_s, max_bytes=max_bytes)

    async def add_pod_finalizer(self, namespace: str, pod: str, name: str = SCENE_FINALIZER) -> bool:
        """Add a finalizer to a pod (idempotent). False when it was there already, the pod is gone, or
        the pod is already being deleted (the API accepts no new finalizer then)."""
        return await self._pod_finalizer(namespace, pod, name, add=True)

    async def remove_pod_finalizer(self, namespace: str, pod: str, name: str = SCENE_FINALIZER) -> bool:
        """Remove a finalizer from a pod (idempotent; a pod already gone is fine). True when removed."""
        return await self._pod_finalizer(namespace, pod, name, add=False)

    async def add_finalizer(self, pod: Mapping[str, Any], name: str = SCENE_FINALIZER) -> bool:
        """`add_pod_finalizer` for a pod object."""
        meta = _meta(pod)
        return await self.add_pod_finalizer(str(meta.get("namespace") or ""), str(meta.get("name") or ""), name)

    async def remove_finalizer(self, pod: Mapping[str, Any], name: str = SCENE_FINALIZER) -> bool:
        """`remove_pod_finalizer` for a pod object."""
        meta = _meta(pod)
        return await self.remove_pod_finalizer(str(meta.get("namespace") or ""), str(meta.get("name") or ""), name)

    async def _pod_finalizer(self, namespace: str, pod: str, name: str, *, add: bool) -> bool:
        _check_names(namespace=namespace, pod=pod)

        def change(obj: JSON) -> JSON | None:
            meta = _meta(obj)
            current = [str(f) for f in _list(meta.get("finalizers"))]
            if add:
                if name in current or meta.get("deletionTimestamp"):
                    return None
                wanted = [*current, name]
            else:
                if name not in current:
                    return None
                wanted = [f for f in current if f != name]
            return {"metadata": {"finalizers": wanted}}

        what = _What("patch", PODS, namespace, pod)
        outcome = await self._read_modify_write(
            lambda: self.get_pod(namespace, pod),
            change,
            lambda patch: self._request(
                what, self.core.patch_namespaced_pod, pod, namespace, patch, _content_type=MERGE_PATCH
            ),
            what,
            missing_ok=True,
        )
        return outcome == "written"

    async def list_events(self, namespace: str, *, involved: set[tuple[str, str]] | None = None) -> list[JSON]:
        """core/v1 events of a namespace, optionally only those about the (kind, name) pairs in
        `involved` (filtered here: a field selector cannot ask for several objects), oldest first."""
        _check_names(namespace=namespace)
        kw: dict[str, Any] = {}
        if involved and len(involved) == 1:
            ((kind, name),) = involved
            kw["field_selector"] = f"involvedObject.kind={kind},involvedObject.name={name}"
        events = await self._list(_What("list", EVENTS, namespace), self.core.list_namespaced_event, namespace, **kw)
        if involved is not None:
            events = [
                e
                for e in events
                if (str(_map(e.get("involvedObject")).get("kind")), str(_map(e.get("involvedObject")).get("name")))
                in involved
            ]
        return sorted(events, key=_event_time)

    # -- read-modify-write with optimistic concurrency ---------------------------------------------

    async def _read_modify_write(
        self,
        read: Callable[[], Awaitable[JSON | None]],
        change: Callable[[JSON], JSON | None],
        write: Callable[[JSON], Awaitable[JSON]],
        what: _What,
        *,
        missing_ok: bool = False,
        first: JSON | None = None,
    ) -> Outcome:
        """Read, compute a patch, write it with the resourceVersion read; on 409 read again.
        `first`: the object as the caller has just seen it (a write's answer), used for the first try
        instead of a read (a 409 still reads it again).

        "written", "unchanged" (no write was needed), or "missing" when the object is gone and
        `missing_ok` (else KubeNotFound)."""
        for attempt in range(1, self.attempts + 1):
            obj = first if attempt == 1 and first is not None else await read()
            if obj is None:
                if missing_ok:
                    return "missing"
                raise KubeNotFound(f"{what.verb} {what.target}: not found", status=404)
            patch = change(obj)
            if patch is None:
                return "unchanged"
            try:
                await write(_with_rv(obj, patch))
            except KubeNotFound:
                if missing_ok:
                    return "missing"
                raise
            except ConflictError as exc:
                if attempt >= self.attempts:
                    raise ConflictError(f"{exc} (still conflicting after {attempt} attempts)") from exc
                log.info("%s; reading it again (attempt %d of %d)", exc, attempt, self.attempts)
            else:
                return "written"
        raise AssertionError("unreachable")  # pragma: no cover
