"""The real Kubernetes control plane for the tests: agent/demo/plane.py's (also what
`trainmedic demo --cluster real` starts), re-exported, and `require_plane()`: where a binary is
missing it skips the test, or fails it under CI=true, where `make test` (its `cluster` target) must
have built them."""

from __future__ import annotations

import os

import pytest

from trainmedic.agent.demo.plane import (
    COMPONENTS,
    DEFAULT_NODES,
    GO_MOD,
    GPU_LABELS,
    KUBE_VERSION,
    NODE_GRACE_S,
    NODE_LEASE_S,
    NODE_MONITOR_PERIOD_S,
    NPU_LABELS,
    ROOT,
    FakeNode,
    KubePlane,
    Proc,
    bin_dir,
    collection_path,
    free_port,
    kube_version,
    make_pki,
    missing,
)

__all__ = [
    "COMPONENTS",
    "DEFAULT_NODES",
    "GO_MOD",
    "GPU_LABELS",
    "KUBE_VERSION",
    "NODE_GRACE_S",
    "NODE_LEASE_S",
    "NODE_MONITOR_PERIOD_S",
    "NPU_LABELS",
    "ROOT",
    "FakeNode",
    "KubePlane",
    "Proc",
    "bin_dir",
    "collection_path",
    "free_port",
    "in_ci",
    "kube_version",
    "make_pki",
    "missing",
    "require_plane",
]


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def require_plane() -> None:
    gone = missing()
    if gone:
        reason = f"the real control plane is not built ({', '.join(gone)}); `make cluster` builds it"
        if in_ci():
            pytest.fail(f"CI is set but {reason}")
        pytest.skip(reason)
