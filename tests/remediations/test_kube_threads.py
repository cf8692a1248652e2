"""KubeOps runs the blocking client's calls in threads of its own, as many as its connection pool
(`pool_maxsize`, the responder's `remediate.max_concurrent`): the incidents handled at once are not
capped by the loop's small default executor (6 threads on 2 cores), which SQLite and scene writes
share. No API server is needed: the calls here block on a barrier that opens only when all of them
are in flight at once."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable

import pytest
from kubernetes import client as kclient

from trainmedic.remediations.kube import NODES, KubeOps, _What

pytestmark = pytest.mark.asyncio


@pytest.mark.parametrize("calls", [2, 8, 16])
async def test_calls_in_flight_at_once_are_not_capped_by_the_default_executor(calls: int) -> None:
    loop = asyncio.get_running_loop()
    loop.set_default_executor(concurrent.futures.ThreadPoolExecutor(max_workers=1))
    ops = KubeOps(kclient.ApiClient(kclient.Configuration()), pool_maxsize=calls)
    barrier = threading.Barrier(calls, timeout=30)  # broken (an error) unless every call runs at once

    def call(i: int) -> Callable[[], int]:
        def run() -> int:
            barrier.wait()
            return i

        return run

    try:
        got = await asyncio.gather(*(ops._retrying(_What("get", NODES, name=f"n{i}"), call(i)) for i in range(calls)))
    finally:
        ops.close()
    assert sorted(got) == list(range(calls))
    assert ops.api.configuration.connection_pool_maxsize >= calls


async def test_a_closed_client_lets_its_threads_go() -> None:
    ops = KubeOps(kclient.ApiClient(kclient.Configuration()), pool_maxsize=4)
    names = await asyncio.gather(*(ops._retrying(_What("get", NODES), threading.current_thread) for _ in range(4)))
    assert all(t.name.startswith("trainmedic-kube") for t in names)
    ops.close()
    for t in {t for t in names}:
        t.join(timeout=30)
        assert not t.is_alive()
