"""The reflectors under API failures, each served by the emulator itself (kmock reactions): 410 Gone
(in the stream and as a status), 5xx, 429 with Retry-After, connection refused, 403, malformed and
oversized watch lines, idle streams, and a prompt stop. Backoff timing is asserted in looptime's
fake loop time."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import threading
import time
from typing import Any

import pytest
from servers.kube import Cluster, EventRecorder, KubeEmulator, kmock, wait_event, wait_until

from trainmedic.agent.jobindex import JobIndex
from trainmedic.agent.telemetry import Telemetry
from trainmedic.agent.watchers.k8s import KubeWatchers, WatchSettings
from trainmedic.events import NodeStatus, PodStatus

from .conftest import FAST, StartWatchers

pytestmark = pytest.mark.asyncio

POD_RESOURCE = "v1/pods"  # kmock.resource() of it is built in the tests (kmock may be missing)
GONE = {
    "type": "ERROR",
    "object": {
        "apiVersion": "v1",
        "kind": "Status",
        "status": "Failure",
        "code": 410,
        "reason": "Expired",
        "message": "too old resource version: 1000 (2000)",
    },
}


def _sample(telemetry: Telemetry, name: str, **labels: str) -> float:
    return telemetry.registry.get_sample_value(name, labels) or 0.0


def _stream_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("trainmedic-stream:")]


@pytest.mark.parametrize(
    ("how", "versioned"),
    [("error-event", False), ("error-event", True), ("http-410", True)],
    ids=["error-event-unversioned", "error-event-versioned", "http-410-versioned"],
)
async def test_410_gone_relists_and_publishes_the_difference(
    how: str,
    versioned: bool,
    kube: KubeEmulator,
    start_watchers: StartWatchers,
    recorder: EventRecorder,
    telemetry: Telemetry,
) -> None:
    cluster = Cluster(kube, versioned=versioned)
    for name in ("keep", "gone", "changed"):
        await cluster.create_pod("train", name, labels={"job-name": "llama"})
    # The first watch is a live stream the test controls; later watches are the emulator's own.
    kube.handler[kmock.action.WATCH, kmock.resource(POD_RESOURCE)][:1] << (b"", ...)
    if how == "http-410":
        kube.handler[kmock.action.WATCH, kmock.resource(POD_RESOURCE)][1:2] << 410 << GONE["object"]
    await start_watchers(resources=["pods"], open_watches=False)
    await wait_until(lambda: len(kube.requests("v1/pods", action="watch")) == 1, what="the first watch")
    mark = recorder.mark()

    # Changes no watch reports (the watch cache moved on without us).
    kube.store_delete("v1/pods", "train", "gone")
    kube.store_patch("v1/pods", "train", "changed", {"status": {"phase": "Failed"}})
    if how == "error-event":
        kube.handler[kmock.action.WATCH][...] << GONE
    else:
        kube.handler[kmock.action.WATCH][...] << b""  # the stream ends; resuming from the resourceVersion gets 410

    gone = await recorder.wait_for(lambda p: isinstance(p, PodStatus) and p.deleted, since=mark)
    changed = await recorder.wait_for(lambda p: isinstance(p, PodStatus) and p.pod == "changed", since=mark)
    assert (gone.pod, changed.phase) == ("gone", "Failed")
    assert {p.pod for p in recorder.payloads(PodStatus, since=mark)} == {"gone", "changed"}
    assert _sample(telemetry, "trainmedic_watch_relists_total", resource="pods") == 1


@pytest.mark.looptime
@pytest.mark.parametrize(
    ("responses", "expected_s", "kind", "count"),
    [
        ([500, 500], 1.0 + 2.0, "api_500", 2),
        ([(429, "7")], 7.0, "api_429", 1),
        ([(503, "3"), 500], 3.0 + 2.0, "api_500", 1),
    ],
    ids=["500-twice", "429-retry-after", "503-retry-after-then-500"],
)
async def test_api_errors_back_off_then_recover(
    responses: list[Any],
    expected_s: float,
    kind: str,
    count: int,
    kube: KubeEmulator,
    cluster: Cluster,
    start_watchers: StartWatchers,
    recorder: EventRecorder,
    telemetry: Telemetry,
) -> None:
    await cluster.create_pod("train", "p0", labels={"job-name": "llama"})
    lists = kube.handler[kmock.action.LIST, kmock.resource(POD_RESOURCE)]
    for i, r in enumerate(responses):
        status, retry_after = r if isinstance(r, tuple) else (r, None)
        reaction = lists[i : i + 1] << status
        if retry_after is not None:
            reaction << {"Retry-After": retry_after}
    settings = dataclasses.replace(FAST, backoff_base_s=1.0, backoff_max_s=30.0, backoff_jitter=0.0)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    w = await start_watchers(resources=["pods"], settings=settings, wait=False)
    await wait_event(w.ready, what="watchers ready")
    assert loop.time() - t0 == pytest.approx(expected_s, abs=0.05)
    assert [p.pod for p in recorder.payloads(PodStatus)] == ["p0"]
    assert len(kube.requests("v1/pods", action="list")) == len(responses) + 1
    assert _sample(telemetry, "trainmedic_watch_errors_total", source="k8s/pods", kind=kind) == count


async def test_connection_refused_then_recovery_sees_what_changed_meanwhile(
    kube: KubeEmulator, cluster: Cluster, start_watchers: StartWatchers, recorder: EventRecorder, telemetry: Telemetry
) -> None:
    for name in ("a", "b"):
        await cluster.create_pod("train", name, labels={"job-name": "llama"})
    w = await start_watchers(resources=["pods"])
    mark = recorder.mark()
    await kube.pause()  # connection refused from now on
    kube.store_delete("v1/pods", "train", "a")
    kube.store_patch("v1/pods", "train", "b", {"spec": {"nodeName": "gpu-3"}})
    await wait_until(
        lambda: _sample(telemetry, "trainmedic_watch_errors_total", source="k8s/pods", kind="connection") >= 2,
        what="two refused attempts",
    )
    assert w.states()["pods"] in ("backoff", "listing")
    await kube.resume()
    deleted = await recorder.wait_for(lambda p: isinstance(p, PodStatus) and p.deleted, since=mark)
    moved = await recorder.wait_for(lambda p: isinstance(p, PodStatus) and p.node == "gpu-3", since=mark)
    assert (deleted.pod, moved.pod) == ("a", "b")
    await wait_until(lambda: w.states()["pods"] == "watching", what="watching again")


async def test_forbidden_is_reported_as_configuration_and_rechecked(
    kube: KubeEmulator,
    cluster: Cluster,
    start_watchers: StartWatchers,
    recorder: EventRecorder,
    telemetry: Telemetry,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="trainmedic.watchers.k8s")
    await cluster.add_node("gpu-1", gpus=8)
    await cluster.create_pod("train", "p0", labels={"job-name": "llama"})
    body = (
        b'{"kind":"Status","apiVersion":"v1","status":"Failure","code":403,"reason":"Forbidden","message":'
        b'"nodes is forbidden: User \\"system:serviceaccount:trainmedic:agent\\" cannot list resource \\"nodes\\"'
        b' in API group \\"\\" at the cluster scope"}'
    )
    kube.handler[kmock.action.LIST, kmock.resource("v1/nodes")][:1] << 403 << body
    w = await start_watchers(resources=["pods", "nodes"])  # ready: a forbidden resource does not block it
    assert [p.pod for p in recorder.payloads(PodStatus)] == ["p0"]
    (err,) = [r for r in caplog.records if r.levelno == logging.ERROR]
    message = err.getMessage()
    assert "configuration error" in message and "list nodes" in message and "403 Forbidden" in message
    assert "cannot list resource" in message
    assert _sample(telemetry, "trainmedic_watch_errors_total", source="k8s/nodes", kind="forbidden") == 1
    # RBAC fixed: the next check (forbidden_recheck_s) lists the nodes.
    st = await recorder.wait_for(lambda p: isinstance(p, NodeStatus))
    assert st.node == "gpu-1"
    await wait_until(lambda: w.states()["nodes"] == "watching", what="nodes watched")


@pytest.mark.parametrize("status", [401, 403])
async def test_a_refusal_after_a_good_list_is_retried_soon_and_resumes_the_watch(
    status: int,
    kube: KubeEmulator,
    cluster: Cluster,
    start_watchers: StartWatchers,
    recorder: EventRecorder,
    telemetry: Telemetry,
) -> None:
    """A restarting API server refuses everyone until its caches fill: a watch that had listed fine
    is retried at the backoff pace, not after forbidden_recheck_s (that it resumes from its
    resourceVersion, kmock having none, is proven on the real plane: tests/realplane/test_watch.py)."""
    await cluster.create_pod("train", "p0", labels={"job-name": "llama"})
    kube.handler[kmock.action.WATCH, kmock.resource(POD_RESOURCE)][:2] << status
    settings = dataclasses.replace(FAST, forbidden_recheck_s=300.0)
    w = await start_watchers(resources=["pods"], settings=settings, wait=False)
    await wait_event(w.ready, what="watchers ready")
    await wait_until(lambda: len(kube.requests("v1/pods", action="watch")) >= 3, what="the third watch")
    kind = "forbidden" if status == 403 else "unauthorized"
    assert _sample(telemetry, "trainmedic_watch_errors_total", source="k8s/pods", kind=kind) == 2
    await wait_until(lambda: w.states()["pods"] == "watching", what="watching again")


async def test_malformed_and_oversized_watch_lines_are_set_aside(
    kube: KubeEmulator, start_watchers: StartWatchers, recorder: EventRecorder, telemetry: Telemetry
) -> None:
    kube.handler[kmock.action.WATCH, kmock.resource(POD_RESOURCE)][:1] << (b"", ...)
    await start_watchers(
        resources=["pods"], settings=dataclasses.replace(FAST, max_event_bytes=4096), open_watches=False
    )
    await wait_until(lambda: len(kube.requests("v1/pods", action="watch")) == 1, what="the first watch")
    ghost = {
        "type": "ADDED",
        "object": {
            "metadata": {"name": "ghost", "namespace": "train", "uid": "u-1", "labels": {"job-name": "llama"}},
            "spec": {"nodeName": "gpu-1"},
            "status": {"phase": "Running"},
        },
    }
    feed = kube.handler[kmock.action.WATCH][...]
    feed << b"{not json\n" << b'"a string"\n' << b"x" * 10_000 + b"\n" << b"\x00\xff\xfe garbage\n" << ghost << ...
    st = await recorder.wait_for(lambda p: isinstance(p, PodStatus) and p.pod == "ghost")
    assert (st.phase, st.node) == ("Running", "gpu-1")
    assert _sample(telemetry, "trainmedic_watch_errors_total", source="k8s/pods", kind="malformed") == 4


async def test_an_idle_stream_is_recycled(kube: KubeEmulator, start_watchers: StartWatchers) -> None:
    # kmock ignores timeoutSeconds: a quiet watch would stay open for ever without the read timeout.
    await start_watchers(resources=["nodes"], settings=dataclasses.replace(FAST, stream_idle_s=0.3))
    await wait_until(lambda: len(kube.requests("v1/nodes", action="watch")) >= 3, what="three watches", timeout=10)


async def test_stop_is_prompt_even_with_a_watch_stuck_before_its_headers(
    kube: KubeEmulator, cluster: Cluster, recorder: EventRecorder, telemetry: Telemetry
) -> None:
    await cluster.create_pod("train", "p0")
    # The nodes watch never gets its response headers: its thread is blocked in the request itself.
    kube.handler[kmock.action.WATCH, kmock.resource("v1/nodes")] << (...,)
    w = KubeWatchers(
        kube.api_client(),
        bus=recorder,
        job_index=JobIndex(),
        telemetry=telemetry,
        settings=dataclasses.replace(FAST, stream_idle_s=30.0),
        workloads=False,
    )
    task = asyncio.create_task(w.run())
    try:
        await wait_event(w.ready, what="watchers ready")
        await wait_until(lambda: len(_stream_threads()) >= 3, what="three streams open")
        assert all(t.daemon for t in _stream_threads())  # never keeps the process alive
    finally:
        t0 = time.monotonic()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        assert time.monotonic() - t0 < 1.0
    # Streams with a response are shut down at once; the stuck one ends at its read timeout.
    await wait_until(lambda: len(_stream_threads()) <= 1, what="stream threads gone", timeout=5)
    assert all(t.daemon for t in _stream_threads())


async def test_unknown_resource_names_are_refused(kube: KubeEmulator, recorder: EventRecorder) -> None:
    with pytest.raises(ValueError, match="unknown resource 'deployments'"):
        KubeWatchers(
            kube.api_client(),
            bus=recorder,
            job_index=JobIndex(),
            telemetry=Telemetry(),
            resources=["pods", "deployments"],
            settings=WatchSettings(),
        )
