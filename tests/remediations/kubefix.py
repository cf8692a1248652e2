"""Fixtures and helpers of the KubeOps tests: kmock's emulator on loopback, the cluster stand-in
(tests/servers/kube.py), a KubeOps with exact timings, and API failures injected as kmock reactions.

Import the fixtures into a test module (`from .kubefix import cluster_fixture, kube_fixture,
ops_fixture`); pytest finds them there, under their names `kube`, `cluster` and `ops`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
import pytest_asyncio
from servers.kube import Cluster, KubeEmulator, kmock, require_kmock

from trainmedic.remediations.kube import KubeOps

NODES = "v1/nodes"
PODS = "v1/pods"
JOBS = "batch/v1/jobs"
VOLCANO_JOBS = "batch.volcano.sh/v1alpha1/jobs"
PYTORCH_JOBS = "kubeflow.org/v1/pytorchjobs"

# Backoff without jitter: 1, 2, 4 s between the 4 attempts (asserted in loop time).
ATTEMPTS = 4
BASE_DELAY = 1.0


@pytest_asyncio.fixture(name="kube")
async def kube_fixture() -> AsyncIterator[KubeEmulator]:
    require_kmock()
    async with KubeEmulator() as k:
        yield k


@pytest.fixture(name="cluster")
def cluster_fixture(kube: KubeEmulator) -> Cluster:
    return Cluster(kube)


@pytest.fixture(name="ops")
def ops_fixture(kube: KubeEmulator) -> Iterator[KubeOps]:
    ops = KubeOps(
        kube.api_client(), attempts=ATTEMPTS, base_delay=BASE_DELAY, max_delay=8.0, jitter=0.0, request_timeout=(2, 10)
    )
    yield ops
    ops.close()


def _criteria(action: str, resource: str, subresource: str | None) -> list[Any]:
    crit: list[Any] = [getattr(kmock.action, action.upper()), kmock.resource(resource)]
    if subresource is not None:
        crit.append(kmock.subresource(subresource))
    return crit


def seen(kube: KubeEmulator, action: str, resource: str, subresource: str | None = None) -> list[Any]:
    """The requests served so far for an action ("fetch", "list", "create", "update", "delete")."""
    return list(kube.handler[tuple(_criteria(action, resource, subresource))])


Response = int | tuple[int, dict[str, str]] | tuple[int, bytes] | Callable[[Any], Any]


def inject(
    kube: KubeEmulator,
    action: str,
    resource: str,
    *responses: Response,
    subresource: str | None = None,
    forever: bool = False,
) -> None:
    """The next requests of an action on a resource get these responses (a status, with headers or a
    body, or a kmock reaction callable); with `forever` the last one repeats. kmock slices count every
    request ever served, so the reactions start after the ones already seen. (kmock still applies a
    write it answers with an error: a create or patch that "failed" has landed, as when a response
    is lost.)"""
    view = kube.handler[tuple(_criteria(action, resource, subresource))]
    start = len(list(view))
    for i, r in enumerate(responses):
        last = forever and i == len(responses) - 1
        window = view[start + i :] if last else view[start + i : start + i + 1]
        if callable(r):
            window << r
            continue
        status, extra = r if isinstance(r, tuple) else (r, None)
        reaction = window << status
        if extra is not None:
            reaction << extra


def forbidden_body(verb: str, resource: str) -> bytes:
    """The Status body the API server sends with a 403."""
    msg = (
        f'{resource} is forbidden: User \\"system:serviceaccount:trainmedic:brain\\" cannot {verb} '
        f'resource \\"{resource}\\" in API group \\"\\" at the cluster scope'
    )
    return (
        b'{"kind":"Status","apiVersion":"v1","status":"Failure","code":403,"reason":"Forbidden","message":"'
        + msg.encode()
        + b'"}'
    )
