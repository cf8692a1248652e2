"""The demo emulator's workload controllers against what the real ones and the real API server do
(the real plane with the real training-operator and Volcano, tests/realplane/, is the reference):

- Volcano Jobs and PyTorchJobs have a status subresource: a status sent with the create is dropped by
  the API server, so the stand-ins create them without one and write it through `/status`;
- training-operator v1.8.1 writes PYTHONUNBUFFERED, MASTER_* / WORLD_SIZE / RANK and their PET_*
  twins (PET_MASTER_ADDR, PET_MASTER_PORT, PET_NODE_RANK), PET_NPROC_PER_NODE (its default,
  "auto") and PET_NNODES into every container.
"""

from __future__ import annotations

from typing import Any

import pytest
from servers.kube import Cluster, KubeEmulator

from trainmedic.agent.demo.emulator import PYTORCH_JOB, VOLCANO_JOB
from trainmedic.agent.demo.scenario import SCENARIOS, job_body, volcano_body

pytestmark = pytest.mark.asyncio


def _env(pod: dict[str, Any]) -> dict[str, str]:
    [container] = pod["spec"]["containers"]
    return {e["name"]: e["value"] for e in container.get("env") or []}


@pytest.mark.parametrize("resource", [VOLCANO_JOB, PYTORCH_JOB])
async def test_custom_workloads_are_created_without_a_status(
    kube: KubeEmulator, cluster: Cluster, resource: str
) -> None:
    if resource == VOLCANO_JOB:
        obj = await cluster.create_volcano_job("train", "vc")
        assert obj["status"]["state"]["phase"] == "Pending"
    else:
        obj = await cluster.create_pytorchjob("train", "pt")
        assert [c["type"] for c in obj["status"]["conditions"]] == ["Created"]
    [create] = kube.requests(resource, action="create")
    assert "status" not in create.data
    # ... and the status came through the subresource, as the controllers write it.
    assert any(r.subresource == "status" for r in kube.requests(resource, action="update"))


@pytest.mark.parametrize("fault", ["xid", "hccl"])
async def test_the_demo_workloads_carry_no_status(cluster: Cluster, fault: str) -> None:
    sc = SCENARIOS[fault]
    body = volcano_body(cluster, sc) if fault == "hccl" else job_body(cluster, sc)
    assert "status" not in body


@pytest.mark.parametrize(
    ("replica", "rank"),
    [("pt-master-0", "0"), ("pt-worker-0", "1"), ("pt-worker-1", "2")],
)
async def test_pytorchjob_pods_get_the_training_operator_env(cluster: Cluster, replica: str, rank: str) -> None:
    pj = await cluster.create_pytorchjob("train", "pt", masters=1, workers=2)
    pods = {p["metadata"]["name"]: p for p in await cluster.create_pytorchjob_pods(pj)}
    assert _env(pods[replica]) == {
        "PYTHONUNBUFFERED": "1",
        "MASTER_PORT": "23456",
        "PET_MASTER_PORT": "23456",
        "MASTER_ADDR": "pt-master-0",
        "PET_MASTER_ADDR": "pt-master-0",
        "WORLD_SIZE": "3",
        "RANK": rank,
        "PET_NODE_RANK": rank,
        "PET_NPROC_PER_NODE": "auto",
        "PET_NNODES": "3",
    }


async def test_pytorchjob_pods_without_rank_env_still_unbuffered(cluster: Cluster) -> None:
    pj = await cluster.create_pytorchjob("train", "pt", masters=1, workers=1)
    for pod in await cluster.create_pytorchjob_pods(pj, rank_env=False):
        assert _env(pod) == {"PYTHONUNBUFFERED": "1"}
