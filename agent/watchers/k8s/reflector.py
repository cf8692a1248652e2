"""The reflector: list + watch of one resource (in one namespace, or all) into a `Handler`.

Each resource (and namespace) runs one `Reflector`, the pattern of client-go's reflector and kopf's
watcher: list (paginated), then watch from the list's resourceVersion; every event updates a small
local cache and publishes on `trainmedic.k8s` only when something meaningful changed, never on a
bare resourceVersion bump (a pod's probe timestamps, a node's heartbeat). After a watch ends the
reflector resumes from the last resourceVersion it saw; on 410 Gone it relists and diffs the list
against its cache: deletions are published for objects that disappeared, changes for objects that
changed (`Telemetry.watch_relists`). What each error leads to is in errors.py.

Servers that do not version objects (kmock's emulator in the tests: no resourceVersion, a watch's
timeoutSeconds ignored) are handled without special cases: a stream idle for `stream_idle_s` is
recycled by the client-side read timeout, and without a resourceVersion the reflector watches
without one and relists on every resume, de-duplicating by content (the digests).
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import json
import logging
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any, Literal

from kubernetes import client as kclient
from kubernetes.client.exceptions import ApiException

from trainmedic.agent.jobindex import _get, _map
from trainmedic.agent.telemetry import Telemetry
from trainmedic.agent.watchers.k8s.errors import (
    MissingResource,
    PermanentWatchError,
    ResourceGone,
    TemporaryWatchError,
    WatchError,
    classify,
)
from trainmedic.agent.watchers.k8s.objects import (
    LabelSelector,
    ResourceSpec,
    _int,
    _str,
    _str_map,
    object_key,
)
from trainmedic.agent.watchers.k8s.stream import CALLS, LineStream
from trainmedic.backoff import backoff_delay
from trainmedic.remediations.kube import own_client

log = logging.getLogger("trainmedic.watchers.k8s")


@dataclass(frozen=True)
class WatchSettings:
    """Timing and size knobs of the reflectors. The defaults suit a real cluster; tests shorten them."""

    # timeoutSeconds of a watch; each watch draws a value in [1x, 2x) (as client-go does) so many
    # reflectors do not reconnect in lockstep.
    watch_timeout_s: float = 300.0
    # A stream that delivers nothing for this long is closed and re-opened (a server that ignores
    # timeoutSeconds, a half-dead connection). Bookmarks keep a healthy quiet watch alive.
    stream_idle_s: float = 330.0
    connect_timeout_s: float = 10.0
    # The read timeout of one list page.
    request_timeout_s: float = 60.0
    page_size: int = 500
    # Backoff after temporary errors: base * 2^attempt, capped, times a random factor in 1 +/- jitter.
    backoff_base_s: float = 0.5
    backoff_max_s: float = 30.0
    backoff_jitter: float = 0.2
    retry_after_max_s: float = 300.0
    # How often a missing resource (CRD not installed) or a forbidden one (RBAC) is re-checked.
    missing_recheck_s: float = 300.0
    forbidden_recheck_s: float = 300.0
    # A watch that listed fine before and is then refused (401/403) is retried at the backoff pace
    # this many times before it counts as a configuration error: an API server that is starting
    # (or restarting) refuses requests until its authenticator and authorizer caches are filled.
    refused_retries: int = 5
    # Events older than this when first seen (the list at start-up replays up to an hour) are recorded
    # for de-duplication but not published.
    event_max_age_s: float = 600.0
    # Event uids remembered for de-duplication (uid + count).
    event_dedup_size: int = 50_000
    # A watch event line longer than this is set aside.
    max_event_bytes: int = 32 << 20


class Handler(abc.ABC):
    """What a reflector feeds: a cache keyed by "namespace/name" (or "name") that publishes changes."""

    @abc.abstractmethod
    def key(self, obj: Mapping[str, Any]) -> str | None: ...

    @abc.abstractmethod
    def keys(self, namespace: str | None) -> list[str]:
        """Cached keys (of one namespace, or all): the relist diff removes those not listed again."""

    def has(self, key: str) -> bool:
        return key in self.keys(None)

    @abc.abstractmethod
    async def apply(self, obj: Mapping[str, Any]) -> None:
        """An object as listed, added or modified."""

    @abc.abstractmethod
    async def remove(self, key: str, obj: Mapping[str, Any] | None) -> None:
        """An object deleted (its last state when the watch said so; None when a relist found it gone)."""


def _rv_of(obj: Any) -> str | None:
    return _str(_get(obj, "metadata", "resourceVersion"))


# The watchers' client: the same retry policy as KubeOps (HTTP statuses are left to the reflectors).
watch_client = own_client


def list_function(api: Any, spec: ResourceSpec, namespace: str | None) -> Callable[..., Any]:
    """The client method that lists (and, with watch=True, watches) a resource."""
    if spec.custom:
        co = kclient.CustomObjectsApi(api)
        if namespace is not None:
            return partial(co.list_namespaced_custom_object, spec.group, spec.version, namespace, spec.plural)
        return partial(co.list_cluster_custom_object, spec.group, spec.version, spec.plural)
    typed = kclient.CoreV1Api(api) if spec.group == "" else kclient.BatchV1Api(api)
    if namespace is not None and spec.namespaced:
        return partial(getattr(typed, spec.list_namespaced), namespace)
    return getattr(typed, spec.list_all)  # type: ignore[no-any-return]


State = Literal["starting", "listing", "watching", "backoff", "missing", "forbidden"]


class Reflector:
    """List + watch of one resource (in one namespace, or all) into a Handler; runs until cancelled."""

    def __init__(
        self,
        spec: ResourceSpec,
        handler: Handler,
        *,
        api: Any,
        telemetry: Telemetry,
        settings: WatchSettings | None = None,
        namespace: str | None = None,
        label_selector: str | None = None,
        node_name: str | None = None,
        on_synced: Callable[[Reflector], None] | None = None,
        source: str = "k8s",
    ) -> None:
        self.spec = spec
        self.handler = handler
        self.telemetry = telemetry
        self.settings = settings or WatchSettings()
        self.namespace = namespace if spec.namespaced else None
        self.label_selector = label_selector or None
        self.node_name = node_name or None
        self.field_selector = f"spec.nodeName={node_name}" if node_name else None
        self.name = spec.name if self.namespace is None else f"{spec.name}[{self.namespace}]"
        self.source = f"{source}/{spec.name}"
        self.state: State = "starting"
        self.synced = False
        self.relists = 0
        self._on_synced = on_synced
        self._list_fn = list_function(api, spec, self.namespace)
        self._labels = LabelSelector.parse(self.label_selector)
        self._rv: str | None = None
        self._missing_logged = False
        self._listed = False  # a list has succeeded: the credentials and RBAC were fine then
        self._refused = 0  # refusals (401/403) since the last successful list
        self._transient = False  # the last error was a refusal retried as transient
        self.stream: LineStream[dict[str, Any]] | None = None

    # -- helpers -----------------------------------------------------------------------------------

    def _count(self, kind: str) -> None:
        self.telemetry.watch_errors.labels(source=self.source, kind=kind).inc()

    def _mark_synced(self) -> None:
        if not self.synced:
            self.synced = True
            if self._on_synced is not None:
                self._on_synced(self)

    def _selected(self, obj: Mapping[str, Any]) -> bool:
        if self.node_name is not None and _get(obj, "spec", "nodeName") != self.node_name:
            return False
        if self.label_selector is not None:
            return self._labels.matches(_str_map(_get(obj, "metadata", "labels")))
        return True

    def _query(self) -> dict[str, Any]:
        q: dict[str, Any] = {}
        if self.label_selector:
            q["label_selector"] = self.label_selector
        if self.field_selector:
            q["field_selector"] = self.field_selector
        return q

    def backoff(self, attempt: int) -> float:
        s = self.settings
        jitter = (1 - s.backoff_jitter, 1 + s.backoff_jitter)
        return backoff_delay(min(attempt, 30), base=s.backoff_base_s, cap=s.backoff_max_s, jitter=jitter)

    # -- the loop ----------------------------------------------------------------------------------

    async def run(self) -> None:
        attempt = 0
        need_list = True
        loop = asyncio.get_running_loop()
        while True:
            verb = "list" if need_list else "watch"
            try:
                if need_list:
                    self.state = "listing"
                    await self._list()
                    need_list = False
                    attempt = 0
                    self._listed, self._refused = True, 0
                    self._mark_synced()
                verb = "watch"
                self.state = "watching"
                started = loop.time()
                got = await self._watch()
                self._refused = 0  # the watch was accepted
                if self._rv is None:
                    # The server does not version objects: a bare re-watch could miss deletions.
                    need_list = True
                if not got and loop.time() - started < 1.0:
                    # A stream that ends at once with nothing in it: do not spin.
                    self.state = "backoff"
                    await asyncio.sleep(self.backoff(attempt))
                    attempt += 1
                else:
                    attempt = 0
            except Exception as exc:
                err = classify(exc, resource=self._what(), verb=verb, retry_after_max=self.settings.retry_after_max_s)
                if err is None:
                    raise
                need_list = need_list or self._rv is None
                attempt = await self._handle_error(err, attempt)
                # A refusal retried as transient keeps the resourceVersion: the watch resumes from it
                # (a restarted API server is not made to list everything again for nothing).
                if isinstance(err, ResourceGone) or (isinstance(err, PermanentWatchError) and not self._transient):
                    need_list = True

    def _what(self) -> str:
        res = self.spec.plural if not self.spec.group else f"{self.spec.plural}.{self.spec.group}"
        return res if self.namespace is None else f"{res} in namespace {self.namespace}"

    async def _handle_error(self, err: WatchError, attempt: int) -> int:
        s = self.settings
        self._transient = False
        if isinstance(err, ResourceGone):
            self.relists += 1
            self.telemetry.watch_relists.labels(resource=self.spec.name).inc()
            self._rv = None
            log.info("%s: %s; relisting", self.name, err)
            return attempt
        if isinstance(err, MissingResource):
            self._count("missing")
            self.state = "missing"
            if not self._missing_logged:
                self._missing_logged = True
                log.warning("%s; not watched, re-checked every %g s", err, s.missing_recheck_s)
            else:
                log.debug("%s: still not served", self.name)
            self._mark_synced()
            await asyncio.sleep(s.missing_recheck_s)
            return 0
        if isinstance(err, PermanentWatchError):
            self._count(err.kind)
            self.state = "forbidden"
            if self._listed and err.kind in ("unauthorized", "forbidden") and self._refused < s.refused_retries:
                # It worked before: most likely an API server still filling its caches after a
                # restart, which refuses everyone for a few seconds. Retry soon before giving up.
                self._refused += 1
                self._transient = True
                delay = self.backoff(self._refused - 1)
                log.warning("%s: %s; it was allowed before, retrying in %.1f s", self.name, err, delay)
                await asyncio.sleep(delay)
                return attempt
            log.error("configuration error: %s; retrying in %g s", err, s.forbidden_recheck_s)
            self._mark_synced()
            await asyncio.sleep(s.forbidden_recheck_s)
            return 0
        assert isinstance(err, TemporaryWatchError)
        self._count(err.kind)
        self.state = "backoff"
        delay = err.retry_after if err.retry_after is not None else self.backoff(attempt)
        log.warning("%s: %s; retrying in %.1f s", self.name, err, delay)
        await asyncio.sleep(delay)
        return attempt + 1

    async def _list(self) -> None:
        seen: set[str] = set()
        cont: str | None = None
        list_rv: str | None = None
        versioned = True
        while True:
            items, page_rv, cont = await asyncio.get_running_loop().run_in_executor(CALLS, self._list_page, cont)
            if list_rv is None:
                list_rv = page_rv
            for obj in items:
                if not isinstance(obj, Mapping):
                    self._count("bad_object")
                    continue
                versioned = versioned and _rv_of(obj) is not None
                key = self.handler.key(obj)
                if key is None or not self._selected(obj):
                    continue
                seen.add(key)
                await self._apply(obj)
            if not cont:
                break
        if self._missing_logged:
            log.info("%s is served now; watching it", self._what())
            self._missing_logged = False
        gone = [k for k in self.handler.keys(self.namespace) if k not in seen]
        for key in gone:
            await self._remove(key, None)
        # Objects without a resourceVersion: the server does not version them (watch without one).
        self._rv = list_rv if versioned else None

    def _list_page(self, cont: str | None) -> tuple[list[Any], str | None, str | None]:
        s = self.settings
        kw: dict[str, Any] = dict(self._query(), limit=s.page_size)
        if cont:
            kw["_continue"] = cont
        resp = self._list_fn(_preload_content=False, _request_timeout=(s.connect_timeout_s, s.request_timeout_s), **kw)
        try:
            data = resp.data
        finally:
            with contextlib.suppress(Exception):
                resp.release_conn()
        doc = json.loads(data)
        if not isinstance(doc, dict):
            raise ValueError("the list response is not a JSON object")
        items = doc.get("items") or []
        if not isinstance(items, list):
            raise ValueError("the list response has no items array")
        meta = _map(doc.get("metadata"))
        return items, _str(meta.get("resourceVersion")), _str(meta.get("continue"))

    def _open_watch(self) -> Any:
        s = self.settings
        kw: dict[str, Any] = dict(
            self._query(),
            watch=True,
            allow_watch_bookmarks=True,
            timeout_seconds=int(s.watch_timeout_s * random.uniform(1.0, 2.0)),  # noqa: S311 (spread)
        )
        if self._rv is not None:
            kw["resource_version"] = self._rv
        return self._list_fn(_preload_content=False, _request_timeout=(s.connect_timeout_s, s.stream_idle_s), **kw)

    def _bad_line(self, raw: bytes, exc: Exception) -> None:
        self._count("malformed")
        log.warning("%s: watch event set aside (%s): %r", self.name, exc, raw[:200])

    async def _watch(self) -> bool:
        got = False
        stream: LineStream[dict[str, Any]] = LineStream(
            self._open_watch,
            _parse_watch_line,
            name=self.name,
            max_line=self.settings.max_event_bytes,
            bad_line=self._bad_line,
        )
        self.stream = stream
        try:
            async with stream:
                async for batch in stream:
                    for ev in batch:
                        got = True
                        await self._on_event(ev)
        finally:
            self.stream = None
        if stream.ended == "timeout":
            log.debug("%s: stream idle for %.0f s; re-watching", self.name, self.settings.stream_idle_s)
        return got

    async def _on_event(self, ev: dict[str, Any]) -> None:
        typ = ev.get("type")
        obj = ev.get("object")
        if typ == "ERROR":
            code = _int(_get(obj, "code")) or 500
            message = _str(_get(obj, "message")) or _str(_get(obj, "reason")) or "watch error"
            err = ApiException(status=code, reason=message)
            raise err
        if not isinstance(obj, Mapping):
            self._count("malformed")
            log.warning("%s: watch event without an object set aside: %r", self.name, str(ev)[:200])
            return
        if typ == "BOOKMARK":
            self._rv = _rv_of(obj) or self._rv
            return
        key = self.handler.key(obj)
        if key is None:
            self._count("bad_object")
            return
        if typ in ("ADDED", "MODIFIED"):
            if self._selected(obj):
                await self._apply(obj)
            elif self.handler.has(key):
                # It no longer matches the selectors: for this watch it is gone.
                await self._remove(key, obj)
        elif typ == "DELETED":
            await self._remove(key, obj)
        else:
            log.debug("%s: unknown watch event type %r", self.name, typ)
            return
        self._rv = _rv_of(obj)

    async def _apply(self, obj: Mapping[str, Any]) -> None:
        try:
            await self.handler.apply(obj)
        except (ValueError, TypeError, KeyError, AttributeError) as e:
            self._count("bad_object")
            log.warning("%s: object %s set aside: %s", self.name, object_key(obj), e)

    async def _remove(self, key: str, obj: Mapping[str, Any] | None) -> None:
        try:
            await self.handler.remove(key, obj)
        except (ValueError, TypeError, KeyError, AttributeError) as e:
            self._count("bad_object")
            log.warning("%s: deletion of %s set aside: %s", self.name, key, e)


def _parse_watch_line(raw: bytes) -> dict[str, Any] | None:
    if not raw.strip():
        return None
    ev = json.loads(raw)
    if not isinstance(ev, dict) or not isinstance(ev.get("type"), str):
        raise ValueError("not a watch event (an object with a type)")
    return ev
