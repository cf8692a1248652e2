"""The watchers against the real API server, as the cluster role runs them (trainmedic-cluster's
token, the shipped RBAC): paginated lists, label and field selectors, resourceVersion resumes with
bookmarks, 410 Gone after etcd compaction, and an API server restarted mid-watch."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import urllib.error
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
import pytest_asyncio
from servers.kube import EventRecorder
from servers.kubeplane import KubePlane

from trainmedic.agent.jobindex import JobIndex
from trainmedic.agent.telemetry import Telemetry
from trainmedic.agent.watchers.k8s import KubeWatchers, WatchSettings
from trainmedic.events import PodStatus

from .plane import TRAINING, clean, until

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(300)]

FAST = WatchSettings(
    backoff_base_s=0.05,
    backoff_max_s=0.5,
    backoff_jitter=0.0,
    connect_timeout_s=2.0,
    request_timeout_s=10.0,
    missing_recheck_s=0.5,
    forbidden_recheck_s=0.5,
)


def pod_body(name: str, *, node: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": TRAINING, "labels": labels or {}},
        "spec": {
            "nodeName": node,
            "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "trainer", "image": "registry.example/train:1"}],
        },
    }


def create_pod(plane: KubePlane, name: str, *, node: str = "gpu-1", labels: dict[str, str] | None = None) -> None:
    plane.request("POST", f"/api/v1/namespaces/{TRAINING}/pods", pod_body(name, node=node, labels=labels))


def delete_pod(plane: KubePlane, name: str) -> None:
    with contextlib.suppress(urllib.error.HTTPError):
        plane.request("DELETE", f"/api/v1/namespaces/{TRAINING}/pods/{name}", {"gracePeriodSeconds": 0})


Start = Callable[..., Awaitable[KubeWatchers]]


@pytest_asyncio.fixture
async def watch(plane: KubePlane) -> AsyncIterator[tuple[EventRecorder, Telemetry, Start]]:
    """`await start(**options)`: KubeWatchers on pods in the training namespace, listed and watching,
    as trainmedic-cluster; cancelled at teardown."""
    await clean(plane)
    recorder, telemetry = EventRecorder(), Telemetry()
    tasks: list[asyncio.Task[None]] = []
    clients: list[Any] = []

    async def start(*, settings: WatchSettings = FAST, **options: Any) -> KubeWatchers:
        api = plane.api_client(plane.service_account_token("trainmedic", "trainmedic-cluster"))
        clients.append(api)
        w = KubeWatchers(
            api,
            bus=recorder,
            job_index=JobIndex(),
            telemetry=telemetry,
            producer="cluster/test",
            namespaces=[TRAINING],
            resources=["pods"],
            settings=settings,
            **options,
        )
        tasks.append(asyncio.create_task(w.run()))
        await asyncio.wait_for(w.ready.wait(), 30)
        await until("the watch open", lambda: all(r.state == "watching" for r in w.reflectors), timeout=30)
        return w

    try:
        yield recorder, telemetry, start
    finally:
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        for c in clients:
            c.close()
        await clean(plane)


def seen(recorder: EventRecorder, pod: str, *, since: int = 0, phase: str | None = None, deleted: bool = False) -> bool:
    return any(
        p.pod == pod and (phase is None or p.phase == phase) and p.deleted == deleted
        for p in recorder.payloads(PodStatus, since=since)
    )


def relists(telemetry: Telemetry) -> float:
    return float(telemetry.watch_relists.labels(resource="pods")._value.get())


@pytest.mark.parametrize(
    ("options", "wanted", "unwanted"),
    [
        ({"label_selector": "team=llm"}, ("a", {"team": "llm"}, "gpu-1"), ("b", {"team": "vision"}, "gpu-1")),
        ({"node_name": "gpu-2"}, ("a", {}, "gpu-2"), ("b", {}, "gpu-3")),
        (
            {"label_selector": "team in (llm),tier!=scratch"},
            ("a", {"team": "llm"}, "gpu-1"),
            ("b", {"team": "llm", "tier": "scratch"}, "gpu-1"),
        ),
    ],
    ids=["label", "field-node", "set-based"],
)
async def test_selectors_are_honoured(
    plane: KubePlane,
    watch: tuple[EventRecorder, Telemetry, Start],
    options: dict[str, str],
    wanted: tuple[str, dict[str, str], str],
    unwanted: tuple[str, dict[str, str], str],
) -> None:
    recorder, _, start = watch
    # Some exist before the list (paged two at a time), some come during the watch.
    for i in range(3):
        create_pod(plane, f"pre-{wanted[0]}-{i}", node=wanted[2], labels=wanted[1])
        create_pod(plane, f"pre-{unwanted[0]}-{i}", node=unwanted[2], labels=unwanted[1])
    await start(settings=dataclasses.replace(FAST, page_size=2), **options)
    create_pod(plane, f"live-{wanted[0]}", node=wanted[2], labels=wanted[1])
    create_pod(plane, f"live-{unwanted[0]}", node=unwanted[2], labels=unwanted[1])
    for name in (*(f"pre-{wanted[0]}-{i}" for i in range(3)), f"live-{wanted[0]}"):
        await until(f"{name} Running", functools.partial(seen, recorder, name, phase="Running"))
    names = {p.pod for p in recorder.payloads(PodStatus)}
    assert not {n for n in names if n.startswith(("pre-b", "live-b"))}


async def test_watches_resume_from_their_resource_version_without_relisting(
    plane: KubePlane, watch: tuple[EventRecorder, Telemetry, Start]
) -> None:
    """Watches the server ends (timeoutSeconds) are resumed from the last resourceVersion or bookmark:
    nothing is listed again, and nothing that happened between two watches is missed."""
    recorder, telemetry, start = watch
    w = await start(settings=dataclasses.replace(FAST, watch_timeout_s=1.0))
    [r] = w.reflectors
    first_rv = r._rv
    for i in range(4):
        create_pod(plane, f"p{i}")
        await until(f"p{i} Running", functools.partial(seen, recorder, f"p{i}", phase="Running"))
        await asyncio.sleep(1.5)  # at least one watch ended by the server and resumed
    delete_pod(plane, "p0")
    await until("p0 deleted", lambda: seen(recorder, "p0", deleted=True))
    assert relists(telemetry) == 0
    assert r._rv is not None and int(r._rv) > int(first_rv or 0)


@pytest.mark.parametrize("compact", [False, True], ids=["restart", "compacted-restart"])
async def test_a_watch_survives_an_apiserver_restart_and_410_gone(
    plane: KubePlane, watch: tuple[EventRecorder, Telemetry, Start], compact: bool
) -> None:
    recorder, telemetry, start = watch
    # A refusal is re-checked only every 300 s, as deployed: a restarting API server's 401/403 must
    # not cost that long.
    w = await start(settings=dataclasses.replace(FAST, forbidden_recheck_s=300.0))
    create_pod(plane, "before")
    create_pod(plane, "doomed")
    await until("before Running", lambda: seen(recorder, "before", phase="Running"))
    await until("doomed Running", lambda: seen(recorder, "doomed", phase="Running"))
    if compact:
        # Served by etcd directly (no watch cache, no bookmark at shutdown), the watch keeps the
        # resourceVersion of the last pod it saw; other writes move etcd on and compacting there
        # expires it: the restarted API server answers the resumed watch 410 Gone.
        await asyncio.to_thread(plane.restart_apiserver, watch_cache=False)
        await until("the watch open again", lambda: w.reflectors[0].state == "watching")
        for i in range(5):
            plane.request("POST", f"/api/v1/namespaces/{TRAINING}/configmaps", {"metadata": {"name": f"churn-{i}"}})
        plane.compact()
    mark = recorder.mark()
    await asyncio.to_thread(plane.restart_apiserver)
    create_pod(plane, "after")
    delete_pod(plane, "doomed")
    await until("after Running", lambda: seen(recorder, "after", since=mark, phase="Running"))
    await until("doomed deleted", lambda: seen(recorder, "doomed", since=mark, deleted=True))
    if compact:
        assert relists(telemetry) >= 1
    # "before" is still there: the relist's diff does not take it for deleted.
    assert not seen(recorder, "before", since=mark, deleted=True)
    for i in range(5 if compact else 0):
        with contextlib.suppress(urllib.error.HTTPError):
            plane.request("DELETE", f"/api/v1/namespaces/{TRAINING}/configmaps/churn-{i}")
