"""`trainmedic diagnose --job` (with `--save`) and `trainmedic scan` on the real control plane, as a read-only
ServiceAccount (get and list only: any write the commands tried would be refused), through a
kubeconfig with the plane's CA and the account's bearer token."""

from __future__ import annotations

import asyncio
import json
import urllib.error
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from servers.kubeplane import KubePlane

from trainmedic.agent.cli import main

from .plane import GPU, TRAINING, clean, create_job, job_body, post_node_addresses, running_on, until

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
    path = plane.write_kubeconfig(tmp_path / "viewer.kubeconfig", token, namespace=TRAINING)
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


async def test_a_saved_scene_gives_the_live_answer_and_nothing_is_written(
    plane: KubePlane, viewer: tuple[Path, str], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """`diagnose --job --save DIR` as the read-only account: the bundle is written locally (the account
    could write nothing to the cluster, and the command needed nothing refused), and `diagnose --scene
    DIR` gives the live JSON."""
    kubeconfig, token = viewer
    job = create_job(plane, job_body("oom-saved", pods=1))
    [node] = await until("the pod Running", lambda: running_on(plane, job, 1))
    plane.write_log(node, CUDA_OOM)
    before = _versions(plane)
    saved = tmp_path / "scene"
    argv = ["diagnose", "--job", "oom-saved", "--format", "json", "--save", str(saved), "--kubeconfig", str(kubeconfig)]
    rc = await asyncio.to_thread(main, argv)
    live, err = capsys.readouterr()
    assert rc == 0, err
    assert token not in live and token not in err
    assert "forbidden" not in err.lower()
    root = json.loads(live)["root_cause"]
    assert (root["fault_class"], root["node"], root["rank"]) == ("accelerator_oom", node, 0)
    manifest = json.loads((saved / "manifest.json").read_text())
    assert any(f["path"].startswith(f"layout/{node}/rank0_oom-saved-") for f in manifest["files"])

    rc = await asyncio.to_thread(main, ["diagnose", "--scene", str(saved), "--format", "json"])
    again, err = capsys.readouterr()
    assert rc == 0, err
    assert json.loads(again) == json.loads(live)
    # The job and its pods are as their owners left them, and no event is trainmedic's: nothing was written.
    assert _versions(plane) == before
    events = plane.request("GET", f"/api/v1/namespaces/{TRAINING}/events").get("items") or []
    assert not [
        e for e in events if "trainmedic" in json.dumps(e.get("source") or {}) + str(e.get("reportingComponent"))
    ]


def _versions(plane: KubePlane) -> dict[str, Any]:
    """Every job and pod of the training namespace as its owner wrote it: metadata (without the
    resourceVersion and managedFields that the controllers' status updates move) and spec."""
    out: dict[str, Any] = {}
    for path in (
        f"/apis/batch/v1/namespaces/{TRAINING}/jobs",
        f"/api/v1/namespaces/{TRAINING}/pods",
    ):
        for item in plane.request("GET", path).get("items") or []:
            meta = {k: v for k, v in item["metadata"].items() if k not in ("resourceVersion", "managedFields")}
            out[f"{path}/{meta['name']}"] = {"metadata": meta, "spec": item.get("spec")}
    return out


async def test_scan_as_the_read_only_account_lists_a_failed_gpu_pod_no_job_owns(
    plane: KubePlane, viewer: tuple[Path, str], capsys: pytest.CaptureFixture[str]
) -> None:
    """A bare pod asking for GPUs fails after a CUDA OOM: `scan -A` run by the account that may only get
    and list names it with its diagnosis, and changes nothing (nothing it tried was refused)."""
    kubeconfig, token = viewer
    limits = {GPU: "8", "cpu": "1", "memory": "1Gi"}
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "solo", "namespace": TRAINING},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "trainer", "image": "registry.example/train:1", "resources": {"limits": limits}}],
        },
    }
    plane.request("POST", f"/api/v1/namespaces/{TRAINING}/pods", pod)

    def running() -> str | None:
        obj = plane.request("GET", f"/api/v1/namespaces/{TRAINING}/pods/solo")
        return obj["spec"].get("nodeName") if (obj.get("status") or {}).get("phase") == "Running" else None

    node = await until("the bare pod Running", running)
    post_node_addresses(plane, node)  # a node an earlier test revived: as its kubelet would on start
    plane.write_log(node, CUDA_OOM)
    status = {
        "status": {
            "phase": "Failed",
            "containerStatuses": [
                {
                    "name": "trainer",
                    "image": "registry.example/train:1",
                    "imageID": "",
                    "ready": False,
                    "restartCount": 0,
                    "state": {"terminated": {"exitCode": 1, "reason": "Error"}},
                }
            ],
        }
    }
    plane.request(
        "PATCH",
        f"/api/v1/namespaces/{TRAINING}/pods/solo/status",
        status,
        content_type="application/merge-patch+json",
    )
    await until(
        "the bare pod Failed",
        lambda: plane.request("GET", f"/api/v1/namespaces/{TRAINING}/pods/solo")["status"]["phase"] == "Failed",
    )
    before = _versions(plane)
    argv = ["scan", "-A", "--format", "json", "--lang", "en", "--kubeconfig", str(kubeconfig)]
    rc = await asyncio.to_thread(main, argv)
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert token not in out and token not in err
    found = {(w["kind"], w["namespace"], w["name"]): w for w in json.loads(out)["workloads"]}
    solo = found[("Pod", TRAINING, "solo")]
    assert solo["state"] == "Failed (Error, exit code 1)" and solo["pods"] == 1
    assert (solo["root_cause"]["fault_class"], solo["root_cause"]["node"]) == ("accelerator_oom", node)
    assert _versions(plane) == before
