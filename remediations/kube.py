"""The Kubernetes operations the responder performs, with their failures typed by what to do next.

Remediation acts on a live cluster that other people and controllers change at the same time, so
every operation here is written to be safe to repeat and to race:

- Node quarantine and release are read-modify-write: a merge patch replaces lists whole, so the
  taints and the node conditions are read, ours changed in place (everyone else's kept) and the
  whole list written back together with the resourceVersion that was read; a 409 Conflict re-reads
  and re-applies. Both are idempotent: a second quarantine for the same incident writes nothing,
  and what was there before (a cordon a person set) is recorded once and restored on release.
- Deleting a workload carries a uid precondition, so a retry never deletes the newer incarnation
  the restart created; the uid is also compared client-side first (kmock, the emulator the tests
  run against, ignores preconditions).
- A create retried after a lost response finds its own object (409 with our incident annotation)
  and returns it instead of failing.

Errors carry their retry semantics, as kopf's do (STYLE.md):

    KubeError (TrainmedicError)
    +-- PermanentKubeError      retrying will not help: raised at once
    |   +-- KubeForbidden       403: names the verb, resource and scope, and the RBAC rule missing
    |   +-- KubeNotFound        404: the object (or the API: a CRD not installed) is not there
    |   +-- KubeInvalid         400/422: the API's own message
    |   +-- ReleaseRefused      the node was quarantined by another incident
    +-- TemporaryKubeError      429 (Retry-After honoured), 5xx, connection refused/reset,
    |                           timeouts, a garbled response: retried with exponential backoff and
    |                           jitter up to `attempts`, then raised with the delay to wait
    +-- ConflictError           409: somebody else wrote first (re-read and re-apply)

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
import contextlib
import contextvars
import copy
import http.client
import json
import logging
import random
import re
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, TypeVar

import pydantic
import urllib3.exceptions
import urllib3.util
from kubernetes import client as kclient
from kubernetes.client.exceptions import ApiException

from trainmedic.backoff import backoff_delay, parse_retry_after
from trainmedic.errors import PermanentError, TemporaryError, TrainmedicError
from trainmedic.models import FaultClass, I18nText
from trainmedic.remediations.stacks import ExecResult, exec_in_pod
from trainmedic.timefmt import rfc3339

__all__ = [
    "ANN_INCIDENT",
    "ANN_QUARANTINED_AT",
    "ANN_QUARANTINE_REASON",
    "ANN_WAS_UNSCHEDULABLE",
    "CONDITION_TYPE",
    "LABEL_QUARANTINED",
    "PREFIX",
    "PROBLEM_ACCELERATOR",
    "PROBLEM_CONDITIONS",
    "PROBLEM_NODE",
    "SCENE_FINALIZER",
    "TAINT_KEY",
    "ConflictError",
    "KubeError",
    "KubeForbidden",
    "KubeInvalid",
    "KubeNotFound",
    "KubeOps",
    "PermanentKubeError",
    "QuarantineResult",
    "ReleaseRefused",
    "TemporaryKubeError",
    "fault_reason",
    "problem_condition",
]

log = logging.getLogger("trainmedic.remediations.kube")

T = TypeVar("T")
JSON = dict[str, Any]
Outcome = Literal["written", "unchanged", "missing"]

# ------------------------------------------------------------------------------------------------
# Names the agent writes (docs/contracts.md: prefix trainmedic.io/)

PREFIX = "trainmedic.io/"
TAINT_KEY = PREFIX + "unhealthy"
TAINT_EFFECT = "NoSchedule"
LABEL_QUARANTINED = PREFIX + "quarantined"
ANN_INCIDENT = PREFIX + "incident"
ANN_QUARANTINED_AT = PREFIX + "quarantined-at"
ANN_QUARANTINE_REASON = PREFIX + "quarantine-reason"
ANN_WAS_UNSCHEDULABLE = PREFIX + "was-unschedulable"
QUARANTINE_ANNOTATIONS = (ANN_INCIDENT, ANN_QUARANTINED_AT, ANN_QUARANTINE_REASON, ANN_WAS_UNSCHEDULABLE)
CONDITION_TYPE = "TrainmedicUnhealthy"
RELEASED_REASON = "Released"
# Node-level findings, as node-problem-detector reports problems: a condition per kind of problem
# (status True, reason the fault class in CamelCase, message in English and Chinese) and an Event on
# the Node. Events about a cluster-scoped object live in the `default` namespace.
PROBLEM_ACCELERATOR = "TrainmedicAcceleratorProblem"
PROBLEM_NODE = "TrainmedicNodeProblem"
PROBLEM_CONDITIONS = (PROBLEM_ACCELERATOR, PROBLEM_NODE)
ACCELERATOR_FAULTS = frozenset({FaultClass.DEVICE_ERROR.value, FaultClass.ACCELERATOR_OOM.value})
NODE_EVENT_NAMESPACE = "default"
EVENT_COMPONENT = "trainmedic"
SCENE_FINALIZER = PREFIX + "scene"
# The default bound of a log read (the end of the log is kept).
LOG_BYTES = 1 << 20

MERGE_PATCH = "application/merge-patch+json"
# Bounded texts: an annotation or a condition message is not a place for a whole log.
REASON_MAX = 1024
_LABEL_VALUE = re.compile(r"^(?:[A-Za-z0-9](?:[A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?)?$")

# ------------------------------------------------------------------------------------------------
# Errors with retry semantics


class KubeError(TrainmedicError):
    """A Kubernetes operation failed; the subclass says what the caller does next."""

    def __init__(self, message: str, *, status: int | None = None, hint: I18nText | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.hint = hint


class PermanentKubeError(KubeError, PermanentError):
    """Retrying will not help (RBAC, a missing object, an invalid request)."""


class KubeForbidden(PermanentKubeError):
    """403: the agent's service account lacks an RBAC rule; the message names it, `need` holds the
    rule alone ("pods/log: get") and `scope` where it is missing ("namespace train", "cluster scope")."""

    need: str | None = None
    scope: str | None = None


class KubeNotFound(PermanentKubeError):
    """404: the object is not there (or the API is not served: a CRD that is not installed)."""


class KubeInvalid(PermanentKubeError):
    """400/422: the API refused the request as invalid; the message is the API's own."""


class ReleaseRefused(PermanentKubeError):
    """The node is quarantined by another incident than the one asking to release it."""


class TemporaryKubeError(KubeError, TemporaryError):
    """Worth retrying after `delay` seconds (the server's Retry-After when it sent one)."""

    def __init__(self, message: str, *, delay: float | None = None, status: int | None = None) -> None:
        super().__init__(message, status=status)
        self.delay = delay


class ConflictError(KubeError, TemporaryError):
    """409: the object changed since it was read, or one of that name already exists (read it again
    and decide again: temporary, no delay)."""

    delay = None

    def __init__(self, message: str) -> None:
        super().__init__(message, status=409)


# ------------------------------------------------------------------------------------------------
# Resources


@dataclass(frozen=True, slots=True)
class _Res:
    """A resource as the API and RBAC name it."""

    api_version: str
    kind: str
    plural: str
    namespaced: bool

    @property
    def group(self) -> str:
        return self.api_version.rpartition("/")[0]

    @property
    def version(self) -> str:
        return self.api_version.rpartition("/")[2]

    @property
    def custom(self) -> bool:
        return self.group not in ("", "batch")


NODES = _Res("v1", "Node", "nodes", namespaced=False)
PODS = _Res("v1", "Pod", "pods", namespaced=True)
EVENTS = _Res("v1", "Event", "events", namespaced=True)
JOBS = _Res("batch/v1", "Job", "jobs", namespaced=True)
VOLCANO_JOBS = _Res("batch.volcano.sh/v1alpha1", "Job", "jobs", namespaced=True)
PYTORCH_JOBS = _Res("kubeflow.org/v1", "PyTorchJob", "pytorchjobs", namespaced=True)
WORKLOADS: dict[tuple[str, str], _Res] = {(r.api_version, r.kind): r for r in (JOBS, VOLCANO_JOBS, PYTORCH_JOBS)}
# Read only (`trainmedic diagnose --job`, `trainmedic scan`): the kinds looked at, restarted or not.
MPI_JOBS = _Res("kubeflow.org/v2beta1", "MPIJob", "mpijobs", namespaced=True)
READ_WORKLOADS: tuple[_Res, ...] = (PYTORCH_JOBS, MPI_JOBS, VOLCANO_JOBS, JOBS)


class KindLike(Protocol):
    """Anything that names a workload kind: remediations.workloads.WorkloadKind, a JobRef."""

    @property
    def api_version(self) -> str: ...

    @property
    def kind(self) -> str: ...


def _workload_res(api_version: str, kind: str) -> _Res:
    res = WORKLOADS.get((api_version, kind))
    if res is None:
        known = ", ".join(f"{a} {k}" for a, k in WORKLOADS)
        raise PermanentKubeError(f"unsupported workload kind {api_version} {kind} (supported: {known})")
    return res


@dataclass(frozen=True, slots=True)
class _What:
    """One API call, described for error messages: verb, resource, subresource, where."""

    verb: str
    res: _Res
    namespace: str | None = None
    name: str | None = None
    sub: str | None = None

    @property
    def rbac_resource(self) -> str:
        return self.res.plural + (f"/{self.sub}" if self.sub else "")

    @property
    def scope(self) -> str:
        return f"namespace {self.namespace}" if self.res.namespaced and self.namespace else "cluster scope"

    @property
    def target(self) -> str:
        kind = self.res.kind if not self.res.group else f"{self.res.kind}.{self.res.group}"
        if self.name is None:
            return f"{self.res.plural} ({self.scope})"
        where = f"{self.namespace}/{self.name}" if self.res.namespaced and self.namespace else self.name
        return f"{kind} {where}" + (f" ({self.sub})" if self.sub else "")

    def forbidden(self, api_message: str) -> KubeForbidden:
        group = f' in apiGroup "{self.res.group}"' if self.res.group else ""
        need = f"{self.rbac_resource}: {self.verb}{group}"
        # deploy/: node rules are in the brain's ClusterRole; what it does to jobs and pods is granted
        # per training namespace by the Role of deploy/training-namespace (trainmedic-remediate).
        if self.res.namespaced and self.namespace:
            role = f"the Role trainmedic-remediate in namespace {self.namespace}"
            role_zh = f"命名空间 {self.namespace} 中的 Role trainmedic-remediate"
        else:
            role, role_zh = "the trainmedic brain's ClusterRole", "trainmedic brain 的 ClusterRole"
        message = f"forbidden: cannot {self.verb} {self.rbac_resource} ({self.scope}): {role} needs {need}"
        if api_message:
            message += f" (API: {api_message})"
        hint = I18nText(
            en=f"Grant {role} the rule {need} (deploy/training-namespace for a training namespace), then retry.",
            zh=f"请为{role_zh}添加权限规则 {need}（训练命名空间见 deploy/training-namespace），然后重试。",
        )
        err = KubeForbidden(message, status=403, hint=hint)
        err.need, err.scope = need, self.scope
        return err


# ------------------------------------------------------------------------------------------------
# Classifying what the client raised


class _Malformed(ValueError):
    """A 2xx response whose body is not the JSON object expected (a proxy's HTML page, a cut body)."""


def retry_after(headers: Any, cap: float) -> float | None:
    """Retry-After as seconds (delta-seconds or an HTTP date), capped; None when absent or unreadable."""
    raw = None
    with contextlib.suppress(Exception):
        raw = headers.get("Retry-After") if headers is not None else None
    return parse_retry_after(raw, now=time.time(), cap=cap)


def api_message(exc: ApiException, limit: int = 500) -> str:
    """The Status message of an API error body, else the HTTP reason (bounded)."""
    body = getattr(exc, "body", None)
    if isinstance(body, bytes):
        body = body.decode("utf-8", "replace")
    if isinstance(body, str) and body:
        with contextlib.suppress(ValueError):
            doc = json.loads(body)
            if isinstance(doc, dict) and doc.get("message"):
                return str(doc["message"])[:limit]
    return str(exc.reason or "")[:limit]


def classify(exc: BaseException, what: _What, *, retry_after_max: float = 60.0) -> KubeError | None:
    """The KubeError an exception raised by a client call stands for; None for a programming error."""
    if isinstance(exc, KubeError):
        return exc
    if isinstance(exc, ApiException):
        status = int(exc.status or 0)
        message = api_message(exc)
        if status == 403:
            return what.forbidden(message)
        if status == 401:
            return PermanentKubeError(
                f"unauthorized: {what.verb} {what.target}: the API server rejected the agent's credentials ({message})",
                status=401,
            )
        if status == 404:
            extra = " (is its CRD installed?)" if what.res.custom else ""
            return KubeNotFound(f"{what.verb} {what.target}: not found{extra} ({message})", status=404)
        if status == 409:
            return ConflictError(f"{what.verb} {what.target}: conflict ({message})")
        if status in (400, 422):
            return KubeInvalid(f"{what.verb} {what.target}: invalid ({status}): {message}", status=status)
        if status in {0, 408, 429} or status >= 500:
            return TemporaryKubeError(
                f"{what.verb} {what.target}: {status or 'transport error'} {message}".rstrip(),
                delay=retry_after(exc.headers, retry_after_max),
                status=status or None,
            )
        return PermanentKubeError(f"{what.verb} {what.target}: {status} {message}", status=status)
    if isinstance(exc, urllib3.exceptions.HTTPError | OSError | http.client.HTTPException):
        return TemporaryKubeError(f"{what.verb} {what.target}: connection error: {exc}")
    if isinstance(exc, _Malformed):
        return TemporaryKubeError(f"{what.verb} {what.target}: malformed response: {exc}")
    if isinstance(exc, pydantic.ValidationError):
        errors = exc.errors()
        detail = f"{'.'.join(str(x) for x in errors[0]['loc'])}: {errors[0]['msg']}" if errors else str(exc)
        return PermanentKubeError(f"{what.verb} {what.target}: invalid request arguments: {detail}")
    return None


def _json_object(data: bytes) -> JSON:
    try:
        doc = json.loads(data)
    except ValueError as exc:
        raise _Malformed(f"not JSON ({len(data)} bytes: {data[:80]!r})") from exc
    if not isinstance(doc, dict):
        raise _Malformed(f"expected a JSON object, got {type(doc).__name__}")
    return doc


# ------------------------------------------------------------------------------------------------
# Small helpers on the API's JSON (nothing is trusted to have the right type)


def _map(v: Any) -> dict[str, Any]:
    return dict(v) if isinstance(v, Mapping) else {}


def _list(v: Any) -> list[Any]:
    return list(v) if isinstance(v, list) else []


def _meta(obj: Mapping[str, Any]) -> dict[str, Any]:
    return _map(obj.get("metadata"))


def _str_map(v: Any) -> dict[str, str]:
    return {str(k): str(x) for k, x in _map(v).items() if x is not None}


def fault_reason(fault_class: str) -> str:
    """A condition reason (CamelCase, as the API wants) from a fault class: device_error -> DeviceError."""
    words = [w for w in re.split(r"[^A-Za-z0-9]+", fault_class) if w]
    reason = "".join(w[:1].upper() + w[1:] for w in words)
    if not reason or not reason[0].isalpha():
        reason = "Fault" + reason
    return reason[:128]


def _bounded(text: str, limit: int = REASON_MAX) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _with_rv(obj: Mapping[str, Any], patch: JSON) -> JSON:
    """Add the resourceVersion that was read, when the object has one: the API then refuses (409) a
    write over a change it did not see (optimistic concurrency). kmock versions nothing."""
    rv = _meta(obj).get("resourceVersion")
    if isinstance(rv, str) and rv and rv != "...":
        patch.setdefault("metadata", {})["resourceVersion"] = rv
    return patch


@dataclass(frozen=True, slots=True)
class QuarantineResult:
    """What `quarantine_node` did: `changed` is False when the node was already quarantined as asked;
    `already_by` names the other incident that quarantined it first (its annotations are kept);
    `incident` is the incident the node is now recorded under."""

    node: str
    changed: bool
    already_by: str | None = None
    incident: str | None = None


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


class KubeOps:
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

    # -- nodes: quarantine and release -------------------------------------------------------------

    async def quarantine_node(
        self, node: str, *, incident_id: str, fault_class: FaultClass | str, reason: str
    ) -> QuarantineResult:
        """Keep new pods off a node: cordon, taint, label, annotate, and a node condition.

        Idempotent: what is already in place is not written again. A node quarantined by another
        incident keeps that incident's annotations (returned as `already_by`); missing pieces are
        restored. What the node was before (cordoned by a person or not) is recorded once.
        """
        fault = str(fault_class)
        if not incident_id:
            raise PermanentKubeError(f"quarantine {node}: an incident id is required")
        if not fault or not _LABEL_VALUE.match(fault):
            raise PermanentKubeError(f"quarantine {node}: {fault!r} cannot be a taint value")
        seen: dict[str, Any] = {}

        def change_spec(obj: JSON) -> JSON | None:
            meta, spec = _meta(obj), _map(obj.get("spec"))
            labels, ann = _str_map(meta.get("labels")), _str_map(meta.get("annotations"))
            owner = ann.get(ANN_INCIDENT)
            already_by = owner if owner and owner != incident_id else None
            seen["already_by"] = already_by
            seen["incident"] = owner or incident_id
            patch: JSON = {}
            wanted_ann = {
                ANN_INCIDENT: owner or incident_id,
                ANN_QUARANTINED_AT: ann.get(ANN_QUARANTINED_AT) or rfc3339(),
                ANN_QUARANTINE_REASON: ann.get(ANN_QUARANTINE_REASON) or _bounded(reason),
                ANN_WAS_UNSCHEDULABLE: ann.get(ANN_WAS_UNSCHEDULABLE) or str(spec.get("unschedulable") is True).lower(),
            }
            new_ann = {k: v for k, v in wanted_ann.items() if ann.get(k) != v}
            meta_patch: JSON = {}
            if new_ann:
                meta_patch["annotations"] = new_ann
            if labels.get(LABEL_QUARANTINED) != "true":
                meta_patch["labels"] = {LABEL_QUARANTINED: "true"}
            if meta_patch:
                patch["metadata"] = meta_patch
            spec_patch: JSON = {}
            if spec.get("unschedulable") is not True:
                spec_patch["unschedulable"] = True
            taints = [t for t in _list(spec.get("taints")) if isinstance(t, dict)]
            ours = next((t for t in taints if _is_our_taint(t)), None)
            seen["fault"] = str(ours.get("value")) if ours is not None and already_by else fault
            if ours is None:
                spec_patch["taints"] = [*taints, {"key": TAINT_KEY, "value": fault, "effect": TAINT_EFFECT}]
            elif not already_by and ours.get("value") != fault:
                spec_patch["taints"] = [dict(t, value=fault) if t is ours else t for t in taints]
            if spec_patch:
                patch["spec"] = spec_patch
            return patch or None

        # The node as last seen (read, or the spec patch's answer): the status step starts from it
        # rather than reading the node once more.
        last: dict[str, JSON] = {}

        async def get() -> JSON | None:
            obj = await self.get_node(node)
            if obj is not None:
                last["node"] = obj
            return obj

        async def write_spec(patch: JSON) -> JSON:
            obj = await self._request(patch_what, self.core.patch_node, node, patch, _content_type=MERGE_PATCH)
            if isinstance(obj, dict) and obj.get("metadata"):
                last["node"] = obj
            return obj

        patch_what = _What("patch", NODES, name=node)
        outcome = await self._read_modify_write(get, change_spec, write_spec, patch_what)
        changed = outcome == "written"

        def change_status(obj: JSON) -> JSON | None:
            conds = [c for c in _list(_map(obj.get("status")).get("conditions")) if isinstance(c, dict)]
            ours = next((c for c in conds if c.get("type") == CONDITION_TYPE), None)
            if ours is not None and ours.get("status") == "True":
                return None
            ann = _str_map(_meta(obj).get("annotations"))
            now = rfc3339()
            cond = {
                "type": CONDITION_TYPE,
                "status": "True",
                "reason": fault_reason(str(seen.get("fault") or fault)),
                "message": _bounded(
                    f"quarantined by trainmedic, incident {ann.get(ANN_INCIDENT) or incident_id}: "
                    f"{ann.get(ANN_QUARANTINE_REASON) or reason}"
                ),
                "lastHeartbeatTime": now,
                "lastTransitionTime": now,
            }
            return {"status": {"conditions": _replace_condition(conds, cond)}}

        status_what = _What("patch", NODES, name=node, sub="status")
        outcome = await self._read_modify_write(
            get,
            change_status,
            lambda patch: self._request(
                status_what, self.core.patch_node_status, node, patch, _content_type=MERGE_PATCH
            ),
            status_what,
            first=last.get("node"),
        )
        changed = changed or outcome == "written"
        already_by = seen.get("already_by")
        if already_by:
            log.info("node %s is already quarantined by incident %s (asked by %s)", node, already_by, incident_id)
        return QuarantineResult(node, changed, already_by, seen.get("incident"))

    async def annotate_node(self, node: str, name: str, value: str | None) -> None:
        """Set (or, with None, remove) one annotation of a node, leaving the rest alone (a merge patch:
        no read first, so it is one round trip; the circuit breaker's claims are written this way)."""
        _check_names(node=node)
        what = _What("patch", NODES, name=node)
        patch = {"metadata": {"annotations": {name: value}}}
        await self._request(what, self.core.patch_node, node, patch, _content_type=MERGE_PATCH)

    async def release_node(self, node: str, *, incident_id: str | None = None) -> bool:
        """Undo exactly what `quarantine_node` did: our taint, label and annotations go, the condition
        turns False (Released), and the node is uncordoned only if it was schedulable before.
        False when the node is not quarantined (or gone). With `incident_id`, a node quarantined by
        another incident is refused (ReleaseRefused)."""
        get = lambda: self.get_node(node)  # noqa: E731
        found: dict[str, bool] = {}

        def change_spec(obj: JSON) -> JSON | None:
            meta, spec = _meta(obj), _map(obj.get("spec"))
            labels, ann = _str_map(meta.get("labels")), _str_map(meta.get("annotations"))
            taints = [t for t in _list(spec.get("taints")) if isinstance(t, dict)]
            conds = _list(_map(obj.get("status")).get("conditions"))
            ours_cond = any(
                isinstance(c, dict)
                and c.get("type") in (CONDITION_TYPE, *PROBLEM_CONDITIONS)
                and c.get("status") == "True"
                for c in conds
            )
            quarantined = (
                LABEL_QUARANTINED in labels
                or any(k in ann for k in QUARANTINE_ANNOTATIONS)
                or any(_is_our_taint(t) for t in taints)
                or ours_cond
            )
            found["quarantined"] = quarantined
            if not quarantined:
                return None
            owner = ann.get(ANN_INCIDENT)
            if incident_id is not None and owner and owner != incident_id:
                raise ReleaseRefused(
                    f"release {node}: quarantined by incident {owner}, not {incident_id}",
                    hint=I18nText(
                        en=f"Node {node} was quarantined by incident {owner}; release it from that incident.",
                        zh=f"节点 {node} 由事件 {owner} 隔离，请从该事件解除隔离。",
                    ),
                )
            patch: JSON = {}
            meta_patch: JSON = {}
            drop_ann = {k: None for k in QUARANTINE_ANNOTATIONS if k in ann}
            if drop_ann:
                meta_patch["annotations"] = drop_ann
            if LABEL_QUARANTINED in labels:
                meta_patch["labels"] = {LABEL_QUARANTINED: None}
            if meta_patch:
                patch["metadata"] = meta_patch
            spec_patch: JSON = {}
            kept = [t for t in taints if not _is_our_taint(t)]
            if len(kept) != len(taints):
                spec_patch["taints"] = kept or None
            was = ann.get(ANN_WAS_UNSCHEDULABLE)
            if was == "false" and spec.get("unschedulable"):
                spec_patch["unschedulable"] = None
            elif was is None and spec.get("unschedulable"):
                log.warning("node %s: %s is missing; leaving it cordoned", node, ANN_WAS_UNSCHEDULABLE)
            if spec_patch:
                patch["spec"] = spec_patch
            return patch or None

        patch_what = _What("patch", NODES, name=node)
        outcome = await self._read_modify_write(
            get,
            change_spec,
            lambda patch: self._request(patch_what, self.core.patch_node, node, patch, _content_type=MERGE_PATCH),
            patch_what,
            missing_ok=True,
        )
        if outcome == "missing" or not found.get("quarantined"):
            return False

        def change_status(obj: JSON) -> JSON | None:
            conds = [c for c in _list(_map(obj.get("status")).get("conditions")) if isinstance(c, dict)]
            ours = [
                c
                for c in conds
                if c.get("type") in (CONDITION_TYPE, *PROBLEM_CONDITIONS) and c.get("status") != "False"
            ]
            if not ours:
                return None
            now = rfc3339()
            for c in ours:
                cond = {
                    "type": c["type"],
                    "status": "False",
                    "reason": RELEASED_REASON,
                    "message": "released by trainmedic"
                    + (f" (incident {incident_id})" if incident_id else "")
                    + " / 已由 trainmedic 解除隔离",
                    "lastHeartbeatTime": now,
                    "lastTransitionTime": now,
                }
                conds = _replace_condition(conds, cond)
            cleared.extend(str(c["type"]) for c in ours)
            return {"status": {"conditions": conds}}

        cleared: list[str] = []
        status_what = _What("patch", NODES, name=node, sub="status")
        await self._read_modify_write(
            get,
            change_status,
            lambda patch: self._request(
                status_what, self.core.patch_node_status, node, patch, _content_type=MERGE_PATCH
            ),
            status_what,
            missing_ok=True,
        )
        if any(t in PROBLEM_CONDITIONS for t in cleared):
            await self.node_event(
                node,
                key=f"released-{incident_id or 'manual'}",
                event_type="Normal",
                reason="TrainmedicNodeReleased",
                message="released by trainmedic: the node takes new pods again / "
                "已由 trainmedic 解除隔离，节点重新接收新 Pod",
                best_effort=True,
            )
        return True

    async def report_node_problem(
        self, node: str, *, incident_id: str, fault_class: FaultClass | str, message: I18nText
    ) -> bool:
        """A node-level fault as node-problem-detector reports one: the condition of its kind
        (problem_condition) set True with the fault class as reason and the message in both languages,
        and a Warning Event on the Node. Idempotent per incident (the condition is rewritten only when
        it changes; the Event has a name per incident). False when the node is gone."""
        fault = str(fault_class)
        kind = problem_condition(fault)
        reason = fault_reason(fault)
        text = _bounded(f"{message.en} / {message.zh} (trainmedic incident {incident_id})")

        def change_status(obj: JSON) -> JSON | None:
            conds = [c for c in _list(_map(obj.get("status")).get("conditions")) if isinstance(c, dict)]
            ours = next((c for c in conds if c.get("type") == kind), None)
            if ours is not None and (ours.get("status"), ours.get("reason"), ours.get("message")) == (
                "True",
                reason,
                text,
            ):
                return None
            now = rfc3339()
            was_true = ours is not None and ours.get("status") == "True"
            cond = {
                "type": kind,
                "status": "True",
                "reason": reason,
                "message": text,
                "lastHeartbeatTime": now,
                "lastTransitionTime": (ours or {}).get("lastTransitionTime") if was_true else now,
            }
            return {"status": {"conditions": _replace_condition(conds, cond)}}

        status_what = _What("patch", NODES, name=node, sub="status")
        outcome = await self._read_modify_write(
            lambda: self.get_node(node),
            change_status,
            lambda patch: self._request(
                status_what, self.core.patch_node_status, node, patch, _content_type=MERGE_PATCH
            ),
            status_what,
            missing_ok=True,
        )
        if outcome == "missing":
            return False
        await self.node_event(node, key=incident_id, event_type="Warning", reason=reason, message=text)
        return outcome == "written"

    async def node_event(
        self,
        node: str,
        *,
        key: str,
        event_type: Literal["Normal", "Warning"],
        reason: str,
        message: str,
        best_effort: bool = False,
    ) -> bool:
        """An Event about the Node (core/v1, in `default`, as the kubelet and node-problem-detector
        write them): `kubectl describe node` shows it. One per `key`: a retry finds its own (409).
        With `best_effort`, a failure is logged instead of raised (a release must not fail on it)."""
        now = rfc3339()
        body: JSON = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": _event_name(node, key), "namespace": NODE_EVENT_NAMESPACE},
            # node-problem-detector's convention: a Node's uid in its events is its name.
            "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node},
            "type": event_type,
            "reason": reason,
            "message": _bounded(message),
            "source": {"component": EVENT_COMPONENT, "host": node},
            "reportingComponent": EVENT_COMPONENT,
            "reportingInstance": node,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        what = _What("create", EVENTS, NODE_EVENT_NAMESPACE, name=body["metadata"]["name"])
        try:
            await self._request(what, self.core.create_namespaced_event, NODE_EVENT_NAMESPACE, body)
        except ConflictError:
            return False  # already written (a retry, or the same incident again)
        except KubeError as e:
            if not best_effort:
                raise
            log.warning("node %s: the %s event was not written: %s", node, reason, e)
            return False
        return True

    async def quarantined_nodes(self) -> list[JSON]:
        """Nodes carrying our quarantine label: name, incident, reason, since, fault class, cordon."""
        out: list[JSON] = []
        for n in await self.list_nodes(label_selector={LABEL_QUARANTINED: "true"}):
            meta, spec = _meta(n), _map(n.get("spec"))
            ann = _str_map(meta.get("annotations"))
            taint = next((t for t in _list(spec.get("taints")) if isinstance(t, dict) and _is_our_taint(t)), None)
            out.append(
                {
                    "name": str(meta.get("name") or ""),
                    "incident": ann.get(ANN_INCIDENT),
                    "reason": ann.get(ANN_QUARANTINE_REASON),
                    "since": ann.get(ANN_QUARANTINED_AT),
                    "fault_class": None if taint is None else taint.get("value"),
                    "unschedulable": spec.get("unschedulable") is True,
                }
            )
        return sorted(out, key=lambda x: str(x["name"]))

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


def _is_our_taint(t: Mapping[str, Any]) -> bool:
    return t.get("key") == TAINT_KEY and t.get("effect") == TAINT_EFFECT


def _replace_condition(conds: Sequence[JSON], cond: JSON) -> list[JSON]:
    """The conditions with ours (of `cond`'s type) replaced in place (or appended); everyone else's
    kept as they are."""
    kind = cond.get("type")
    out = [cond if c.get("type") == kind else c for c in conds]
    if not any(c.get("type") == kind for c in conds):
        out.append(cond)
    return out


def problem_condition(fault_class: FaultClass | str) -> str:
    """The node-problem-detector style condition type of a node-level fault: the accelerator's own
    faults on TrainmedicAcceleratorProblem, the rest on TrainmedicNodeProblem."""
    return PROBLEM_ACCELERATOR if str(fault_class) in ACCELERATOR_FAULTS else PROBLEM_NODE


def _event_name(node: str, key: str) -> str:
    """A stable Event name per node and occurrence (a retried create finds its own: 409)."""
    safe = re.sub(r"[^a-z0-9.-]+", "-", f"{node}.trainmedic-{key}".lower()).strip("-.")
    return safe[:253]


def _check_names(**names: str | None) -> None:
    """Names that go into a URL path: a non-empty string without a slash (an empty pod name would
    turn a GET of one pod into a list of all of them)."""
    for what, value in names.items():
        if not isinstance(value, str) or not value or "/" in value or len(value) > 253:
            raise PermanentKubeError(f"invalid {what} name {value!r}: a non-empty name without '/' is required")


def _selector(labels: Mapping[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


def _labels_match(obj: Mapping[str, Any], selector: Mapping[str, str]) -> bool:
    labels = _str_map(_meta(obj).get("labels"))
    return all(labels.get(k) == v for k, v in selector.items())


def _event_time(e: Mapping[str, Any]) -> str:
    for key in ("lastTimestamp", "eventTime", "firstTimestamp"):
        v = e.get(key)
        if isinstance(v, str) and v:
            return v
    v = _meta(e).get("creationTimestamp")
    return v if isinstance(v, str) else ""


def _identify(obj: Mapping[str, Any]) -> tuple[_Res, str, str]:
    """The workload resource, namespace and name of an object; a clear error when it lacks them."""
    if not isinstance(obj, Mapping):
        raise PermanentKubeError(f"expected a Kubernetes object (a mapping), got {type(obj).__name__}")
    api_version, kind = obj.get("apiVersion"), obj.get("kind")
    if not isinstance(api_version, str) or not isinstance(kind, str):
        raise PermanentKubeError("malformed object: apiVersion and kind are required")
    res = _workload_res(api_version, kind)
    meta = _meta(obj)
    name, namespace = meta.get("name"), meta.get("namespace")
    if not isinstance(name, str) or not name:
        raise PermanentKubeError(f"malformed {kind}: metadata.name is required")
    if not isinstance(namespace, str) or not namespace:
        raise PermanentKubeError(f"malformed {kind} {name}: metadata.namespace is required")
    return res, namespace, name
