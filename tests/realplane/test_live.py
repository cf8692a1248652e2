"""`trainmedic diagnose --job` on the real control plane, as a read-only
ServiceAccount (get and list only: any write the commands tried would be refused), through a
kubeconfig with the plane's CA and the account's bearer token."""

from __future__ import annotations

import asyncio
import json
import urllib.error
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
import yaml
from servers.kubeplane import KubePlane

from agent.cli import main

from .plane import TRAINING, clean, create_job, job_body, running_on, until

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(300)]

CUDA_OOM = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
    "79.10 GiB of which 1.20 GiB is free."
)
VIEWER = "trainmedic-viewer"
READ_ONLY = [
    {"apiGroups": [""], "resources": ["pods", "pods/log", "events", "nodes"], "verbs": ["get", "list"]},
    {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["get", "list"]},
]


@pytest_asyncio.fixture
async def viewer(plane: KubePlane, tmp_path: Path) -> AsyncIterator[tuple[Path, str]]:
    """A kubeconfig for a ServiceAccount that may only get and list (its token, the plane's CA)."""
    await clean(plane)
    plane.apply(
        [
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": VIEWER, "namespace": TRAINING}},
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRole",
                "metadata": {"name": VIEWER},
                "rules": READ_ONLY,
            },
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRoleBinding",
                "metadata": {"name": VIEWER},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": VIEWER},
                "subjects": [{"kind": "ServiceAccount", "name": VIEWER, "namespace": TRAINING}],
            },
        ]
    )
    token = plane.service_account_token(TRAINING, VIEWER)
    admin = yaml.safe_load(plane.kubeconfig.read_text())
    admin["users"] = [{"name": VIEWER, "user": {"token": token}}]
    admin["contexts"] = [{"name": "plane", "context": {"cluster": "plane", "user": VIEWER, "namespace": TRAINING}}]
    path = tmp_path / "viewer.kubeconfig"
    path.write_text(yaml.safe_dump(admin))
    try:
        yield path, token
    finally:
        await clean_again(plane)


async def clean_again(plane: KubePlane, tries: int = 3) -> None:
    """`clean`, again when an object went away between its list and its patch (404)."""
    for attempt in range(1, tries + 1):
        try:
            await clean(plane)
            return
        except urllib.error.HTTPError as exc:
            if exc.code != 404 or attempt == tries:
                raise


async def test_read_only_account_diagnoses_the_job(
    plane: KubePlane, viewer: tuple[Path, str], capsys: pytest.CaptureFixture[str]
) -> None:
    kubeconfig, token = viewer
    job = create_job(plane, job_body("oom", pods=1))
    [node] = await until("the pod Running", lambda: running_on(plane, job, 1))
    plane.write_log(node, CUDA_OOM)
    argv = ["diagnose", "--job", "oom", "--format", "json", "--kubeconfig", str(kubeconfig)]
    rc = await asyncio.to_thread(main, argv)
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert token not in out and token not in err
    # The namespace is the kubeconfig context's; the rank is the Indexed Job's completion index.
    root = json.loads(out)["root_cause"]
    assert (root["fault_class"], root["node"], root["rank"]) == ("accelerator_oom", node, 0)
