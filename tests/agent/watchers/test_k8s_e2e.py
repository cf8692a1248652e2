"""Opt-in: the watchers against a real cluster for a few seconds.

Skipped unless TRAINMEDIC_E2E_KUBECONFIG names a kubeconfig (read-only use: list/watch of pods,
events, nodes and the workload kinds present). Every cluster has nodes and kube-system pods, so
both must be listed; a workload CRD that is not installed must only be reported missing.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from typing import Any

import pytest
from servers.kube import EventRecorder, wait_event

from trainmedic.agent.jobindex import JobIndex
from trainmedic.agent.telemetry import Telemetry
from trainmedic.agent.watchers.k8s import KubeWatchers
from trainmedic.events import NodeStatus, PodStatus

KUBECONFIG = os.environ.get("TRAINMEDIC_E2E_KUBECONFIG")

pytestmark = pytest.mark.skipif(not KUBECONFIG, reason="set TRAINMEDIC_E2E_KUBECONFIG to run against a real cluster")


@pytest.mark.asyncio
async def test_watchers_list_and_watch_a_real_cluster() -> None:
    from kubernetes import config

    new_client: Any = config.new_client_from_config  # untyped in the client
    api = new_client(config_file=KUBECONFIG)
    recorder = EventRecorder()
    jobs = JobIndex()
    w = KubeWatchers(api, bus=recorder, job_index=jobs, telemetry=Telemetry(), producer="e2e")
    task = asyncio.create_task(w.run())
    try:
        await wait_event(w.ready, timeout=60, what="first lists")
        await asyncio.sleep(3)  # watches open and running
        states = w.states()
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert recorder.payloads(NodeStatus), "no node listed"
    pods = recorder.payloads(PodStatus)
    assert pods and len(jobs) > 0
    assert states["pods"] == "watching" and states["nodes"] == "watching"
    assert all(s in ("watching", "missing") for s in states.values()), states
