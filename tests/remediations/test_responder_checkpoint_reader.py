"""The responder lists a job's checkpoints through a reader pod (remediations/checkpoint_reader.py)
when the directory is not visible to it: the restart resumes from what the pod listed, the scene
shows the same listing, one pod serves both and is deleted, and a reader that fails leaves the
incident going on without a checkpoint, with the reason on its timeline."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from respfix import FakeKube, diagnosis, harness, job, node, policy
from test_checkpoints import hf_checkpoint

from trainmedic.agent.store import IncidentStatus
from trainmedic.remediations import checkpoint_reader as cr
from trainmedic.remediations.checkpoints import list_checkpoints

pytestmark = pytest.mark.asyncio

ROOT = "/mnt/ckpt/llama"
RESTART = "[restart_from_checkpoint]"


def _job() -> dict[str, Any]:
    obj = job("train", "llama", **{"trainmedic.io/checkpoint-dir": ROOT})
    spec = obj["spec"]["template"]["spec"]
    spec["volumes"] = [{"name": "ckpt", "persistentVolumeClaim": {"claimName": "llama-ckpt"}}]
    spec["containers"][0]["volumeMounts"] = [{"name": "ckpt", "mountPath": "/mnt/ckpt"}]
    return obj


def _storage(tmp_path: Path) -> Path:
    """The claim's files, as a reader pod would see them under /mnt/ckpt/llama."""
    local = tmp_path / "claim" / "llama"
    hf_checkpoint(local / "checkpoint-10", 10)
    hf_checkpoint(local / "checkpoint-20", 20)
    (local / "checkpoint-20" / "trainer_state.json").unlink()  # the save the fault cut short
    return local


def _kube(reader: Any) -> FakeKube:
    kube = FakeKube(nodes={f"gpu-{i}": node(f"gpu-{i}") for i in range(3)}, reader=reader)
    kube.add(_job())
    return kube


def _listing_of(local: Path) -> Any:
    def run(pod: dict[str, Any]) -> tuple[str, int]:
        (container,) = pod["spec"]["containers"]
        assert container["command"] == ["trainmedic", "checkpoints", ROOT, "--json"]
        assert container["volumeMounts"][0]["readOnly"] is True
        found = [dataclasses.replace(c, path=ROOT + c.path[len(str(local)) :]) for c in list_checkpoints(local)]
        return "some warning on stderr\n" + cr.render_listing(ROOT, found) + "\n", 0

    return run


@pytest.mark.looptime
async def test_the_restart_resumes_from_what_the_reader_pod_listed(tmp_path: Path) -> None:
    kube = _kube(_listing_of(_storage(tmp_path)))
    h = harness(
        tmp_path, policy(actions=RESTART), kube, checkpoint_reader="pod", checkpoint_reader_image="trainmedic:t"
    )
    incident = await h.handle(diagnosis("train", "llama", "gpu-0"))
    assert incident.status is IncidentStatus.RESOLVED
    (created,) = kube.created
    assert created["metadata"]["annotations"]["trainmedic.io/resumed-from"] == ROOT + "/checkpoint-10"
    env = {e["name"]: e.get("value") for e in created["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert ROOT + "/checkpoint-10" in env.values()
    # one reader pod served the scene and the restart, and is gone
    assert len(kube.pods_created) == 1
    assert kube.pods_deleted == [kube.pods_created[0]["metadata"]["name"]]
    assert kube.run_pods == {}
    assert h.responder.state_sizes()["responder_reader_listings"] == 1


@pytest.mark.looptime
async def test_a_reader_that_fails_leaves_the_incident_going_on_without_a_checkpoint(tmp_path: Path) -> None:
    kube = _kube(lambda pod: ("PermissionError: [Errno 13] Permission denied: '/mnt/ckpt/llama'\n", 1))
    h = harness(
        tmp_path, policy(actions=RESTART), kube, checkpoint_reader="pod", checkpoint_reader_image="trainmedic:t"
    )
    incident = await h.handle(diagnosis("train", "llama", "gpu-0"))
    # the scene's reader and the restart's each tried (a failure is not kept: it may be transient),
    # each noted on the timeline with the reader's own words, each pod deleted
    notes = [e for e in h.store.timeline(incident.id) if e["kind"] == "checkpoints_unread"]
    assert len(notes) == 2 and all("Permission denied" in str(n) for n in notes)
    assert len(kube.pods_created) == 2 and sorted(kube.pods_deleted) == sorted(
        p["metadata"]["name"] for p in kube.pods_created
    )
    assert kube.run_pods == {}
    # as with a job whose directory holds no complete checkpoint: recreated without a resume point
    assert incident.status is IncidentStatus.RESOLVED
    (created,) = kube.created
    assert "trainmedic.io/resumed-from" not in created["metadata"]["annotations"]


@pytest.mark.parametrize(("mode", "image", "pods"), [("auto", "trainmedic:t", 0), ("off", "trainmedic:t", 0)])
@pytest.mark.looptime
async def test_a_directory_visible_here_is_read_here(tmp_path: Path, mode: str, image: str, pods: int) -> None:
    local = _storage(tmp_path)
    kube = _kube(_listing_of(local))
    h = harness(
        tmp_path,
        policy(actions=RESTART),
        kube,
        checkpoint_reader=mode,
        checkpoint_reader_image=image,
        checkpoint_path_map={"/mnt/ckpt": str(local.parent)},
    )
    incident = await h.handle(diagnosis("train", "llama", "gpu-0"))
    assert incident.status is IncidentStatus.RESOLVED
    assert len(kube.pods_created) == pods
    (created,) = kube.created
    assert created["metadata"]["annotations"]["trainmedic.io/resumed-from"] == ROOT + "/checkpoint-10"
