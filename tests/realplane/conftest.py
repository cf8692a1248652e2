"""The real control plane (tests/servers/kubeplane.py), started once for the whole realplane session,
with the shipped deploy/ RBAC applied as is, a `training` namespace for the jobs and the Volcano Job
and Kubeflow PyTorchJob CRDs as their projects publish them (tests/cluster/crds/); their real
controllers (tests/servers/operators.py: the Kubeflow training-operator; Volcano's job controllers
and scheduler) as processes of that plane from the first test that needs them to the end of the
session."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import yaml
from servers.kubeplane import KubePlane, require_plane
from servers.operators import TrainingOperator, Volcano, require_training_operator, require_volcano

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


@pytest.fixture(scope="session")
def training_operator(plane: KubePlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TrainingOperator]:
    """The real training-operator reconciling PyTorchJobs on the session's plane (its pods, their
    Services, the job's status); a test that needs it fails under CI=true where it is not built."""
    require_training_operator()
    op = TrainingOperator(plane, tmp_path_factory.mktemp("training-operator"))
    try:
        op.start()
        yield op
    finally:
        op.stop()


@pytest.fixture(scope="session")
def volcano(plane: KubePlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Volcano]:
    """Volcano's job controllers and scheduler on the session's plane (a Volcano Job's PodGroup,
    pods and status; the binding of its pods); a test that needs them fails under CI=true where
    they are not built."""
    require_volcano()
    vc = Volcano(plane, tmp_path_factory.mktemp("volcano"))
    try:
        vc.start()
        yield vc
    finally:
        vc.stop()


@pytest.fixture
def controller(request: pytest.FixtureRequest, kind: str) -> Any:
    """The real controller of a custom workload `kind` (a test parameter): the training-operator for
    PyTorchJobs, Volcano for Volcano Jobs. Either has `errors`, empty while its processes run."""
    return request.getfixturevalue("training_operator" if kind == "pytorchjob" else "volcano")


@pytest_asyncio.fixture
async def fresh(plane: KubePlane) -> AsyncIterator[KubePlane]:
    """The session's plane, cleaned before and after the test (tests/realplane/plane.py `clean`)."""
    from .plane import clean

    await clean(plane)
    yield plane
    await clean(plane)
