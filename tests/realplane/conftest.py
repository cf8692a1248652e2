"""The real control plane (tests/servers/kubeplane.py), started once for the whole realplane session,
with the shipped deploy/ RBAC applied as is, a `training` namespace for the jobs and the Volcano Job
and Kubeflow PyTorchJob CRDs as their projects publish them (tests/cluster/crds/)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import yaml
from servers.kubeplane import KubePlane, require_plane

ROOT = Path(__file__).resolve().parents[2]
DEPLOY_RBAC = (
    ROOT / "deploy" / "namespace.yaml",
    ROOT / "deploy" / "rbac-brain.yaml",
    ROOT / "deploy" / "rbac-cluster.yaml",
    ROOT / "deploy" / "rbac-node.yaml",
    ROOT / "deploy" / "training-namespace" / "role.yaml",
)
TRAINING = "training"
CRDS = sorted((ROOT / "tests" / "cluster" / "crds").glob("*.yaml"))


def deploy_docs() -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for path in DEPLOY_RBAC:
        docs.extend(d for d in yaml.safe_load_all(path.read_text()) if d)
    return docs


@pytest.fixture(scope="session")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubePlane]:
    require_plane()
    p = KubePlane(tmp_path_factory.mktemp("kubeplane"))
    try:
        p.start()
        p.apply([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": TRAINING}}])
        p.apply(deploy_docs())
        p.install_crds(CRDS)
        yield p
    finally:
        p.stop()


@pytest_asyncio.fixture
async def fresh(plane: KubePlane) -> AsyncIterator[KubePlane]:
    """The session's plane, cleaned before and after the test (tests/realplane/plane.py `clean`)."""
    from .plane import clean

    await clean(plane)
    yield plane
    await clean(plane)
