"""The checkpoint reader pod (remediations/checkpoint_reader.py): the pod it builds from a job's own
template, the listing `trainmedic checkpoints DIR --json` prints and the brain reads back, and the
run of a reader (created, waited for, read, always deleted) with looptime's fake loop time."""

from __future__ import annotations

import asyncio
import copy
import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from test_checkpoints import hf_checkpoint

from trainmedic.agent.cli import main
from trainmedic.remediations import checkpoint_reader as cr
from trainmedic.remediations.checkpoints import list_checkpoints

ROOT = "/mnt/ckpt/run-7"


def _job(volumes: list[dict[str, Any]], mounts: list[dict[str, Any]], **pod_spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "llama", "namespace": "team-a", "uid": "u-1"},
        "spec": {
            "template": {
                "metadata": {"labels": {"app": "llama"}},
                "spec": {
                    "containers": [{"name": "trainer", "image": "train:1", "volumeMounts": mounts}],
                    "volumes": volumes,
                    **pod_spec,
                },
            }
        },
    }


PVC = {"name": "ckpt", "persistentVolumeClaim": {"claimName": "team-a-ckpt"}}
DATA = {"name": "data", "nfs": {"server": "10.0.0.5", "path": "/export/data"}}


def test_the_pod_mounts_the_volume_holding_the_root_read_only_as_the_job_does() -> None:
    job = _job(
        [DATA, PVC, {"name": "shm", "emptyDir": {"medium": "Memory"}}],
        [
            {"name": "data", "mountPath": "/mnt"},  # holds the root too, but less closely
            {"name": "ckpt", "mountPath": "/mnt/ckpt/", "subPath": "runs"},
            {"name": "shm", "mountPath": "/dev/shm"},
        ],
        securityContext={
            "runAsUser": 1000,
            "runAsGroup": 1000,
            "fsGroup": 2000,
            "sysctls": [{"name": "x", "value": "1"}],
        },
    )
    pod = cr.reader_pod(job, ROOT, image="trainmedic:9", incident_id="INC-2026-abc_1", timeout_s=90)
    spec = pod["spec"]
    assert pod["metadata"]["namespace"] == "team-a"
    assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", pod["metadata"]["name"])
    assert len(pod["metadata"]["name"]) <= 63
    assert pod["metadata"]["labels"][cr.READER_LABEL] == "true"
    assert pod["metadata"]["annotations"]["trainmedic.io/incident"] == "INC-2026-abc_1"
    assert spec["volumes"] == [
        {"name": "ckpt", "persistentVolumeClaim": {"claimName": "team-a-ckpt", "readOnly": True}}
    ]
    (container,) = spec["containers"]
    assert container["volumeMounts"] == [
        {"name": "ckpt", "mountPath": "/mnt/ckpt/", "readOnly": True, "subPath": "runs"}
    ]
    assert container["command"] == ["trainmedic", "checkpoints", ROOT, "--json"]
    assert container["image"] == "trainmedic:9"
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    # who wrote the files may read them; nothing else of the job's pod is taken
    assert spec["securityContext"] == {"runAsUser": 1000, "runAsGroup": 1000, "fsGroup": 2000}
    assert spec["automountServiceAccountToken"] is False
    assert spec["restartPolicy"] == "Never" and spec["activeDeadlineSeconds"] == 90
    assert "tolerations" not in spec and "nodeSelector" not in spec and "serviceAccountName" not in spec
    # the job's own object is left as it was
    assert job["spec"]["template"]["spec"]["volumes"][1] == PVC


def test_a_volume_on_shared_storage_of_another_kind_is_copied_as_is() -> None:
    job = _job([DATA], [{"name": "data", "mountPath": "/mnt"}])
    pod = cr.reader_pod(job, ROOT, image="t:1", incident_id="i", timeout_s=5)
    assert pod["spec"]["volumes"] == [DATA]


@pytest.mark.parametrize(
    ("volumes", "mounts", "why"),
    [
        ([{"name": "c", "emptyDir": {}}], [{"name": "c", "mountPath": "/mnt/ckpt"}], "emptyDir"),
        ([{"name": "c", "hostPath": {"path": "/data"}}], [{"name": "c", "mountPath": "/mnt"}], "hostPath"),
        (
            [{"name": "c", "ephemeral": {"volumeClaimTemplate": {"spec": {}}}}],
            [{"name": "c", "mountPath": "/mnt"}],
            "ephemeral",
        ),
        ([PVC], [{"name": "ckpt", "mountPath": "/elsewhere"}], "no volume"),
        ([PVC], [{"name": "ckpt", "mountPath": "/mnt/ckpt/run-70"}], "no volume"),  # a sibling, not a parent
        ([], [{"name": "ckpt", "mountPath": "/mnt"}], "does not declare"),
        ([PVC], [{"name": "ckpt", "mountPath": "/mnt", "subPathExpr": "$(POD_NAME)"}], "subPathExpr"),
    ],
)
def test_a_root_no_reader_can_reach_is_refused_with_the_reason(
    volumes: list[dict[str, Any]], mounts: list[dict[str, Any]], why: str
) -> None:
    with pytest.raises(cr.CheckpointsUnreachable, match=why):
        cr.reader_pod(_job(volumes, mounts), ROOT, image="t:1", incident_id="i", timeout_s=5)


# -- the listing -----------------------------------------------------------------------------------


def _tree(tmp_path: Path) -> Path:
    root = tmp_path / "run"
    hf_checkpoint(root / "checkpoint-10", 10)
    hf_checkpoint(root / "checkpoint-20", 20)
    (root / "checkpoint-20" / "trainer_state.json").unlink()  # a save cut short
    return root


def test_the_cli_listing_reads_back_as_the_local_listing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = _tree(tmp_path)
    assert main(["checkpoints", str(root), "--json"]) == 0
    out = capsys.readouterr().out
    assert len(out.strip().splitlines()) == 1
    # what a reader's log looks like: other output around the listing
    log = "UserWarning: something\n" + out + "\n"
    assert cr.parse_listing(log, str(root)) == list_checkpoints(root)
    assert [c.complete for c in cr.parse_listing(log, str(root))] == [True, False]


def test_the_cli_says_which_checkpoint_a_restart_resumes_from(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = _tree(tmp_path)
    assert main(["checkpoints", str(root)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("*") and "checkpoint-10" in lines[0]
    assert "checkpoint-20" in lines[1] and "incomplete" in lines[1]
    assert main(["checkpoints", str(tmp_path / "none")]) == 0
    assert "no checkpoint" in capsys.readouterr().out


def _entry(**change: Any) -> dict[str, Any]:
    base = {
        "path": ROOT + "/checkpoint-10",
        "step": 10,
        "format": "hf_trainer",
        "complete": True,
        "reason": None,
        "mtime": 1.5,
        "size_bytes": 10,
        "reason_zh": None,
    }
    base.update(change)
    return base


def _doc(entries: list[Any], **change: Any) -> str:
    doc = {cr.LISTING_KEY: 1, "root": ROOT, "checkpoints": entries}
    doc.update(change)
    return json.dumps(doc)


@pytest.mark.parametrize(
    ("log", "why"),
    [
        ("", "no listing"),
        ("Traceback (most recent call last):\nOSError: [Errno 13] Permission denied\n", "no listing"),
        ('{"trainmedic_checkpoints": 1, "root": ', "not JSON"),
        (_doc([], trainmedic_checkpoints=2), "version"),
        (_doc([], root="/other"), "listed '/other'"),
        (_doc([], checkpoints={}), "no list"),
        (_doc([[1]]), "not an object"),
        (_doc([_entry(extra=1)]), "wrong fields"),
        (_doc([_entry(path="/etc/passwd")]), "malformed"),
        (_doc([_entry(step="10")]), "malformed"),
        (_doc([_entry(step=True)]), "malformed"),
        (_doc([_entry(format="pickle")]), "malformed"),
        (_doc([_entry(complete="yes")]), "malformed"),
        (_doc([_entry(mtime="now")]), "malformed"),
        (_doc([_entry(size_bytes=1.5)]), "malformed"),
    ],
)
def test_a_log_without_a_sound_listing_is_an_error(log: str, why: str) -> None:
    with pytest.raises(cr.CheckpointReadError, match=why):
        cr.parse_listing(log, ROOT)


def test_the_last_listing_counts() -> None:
    log = _doc([_entry()]) + "\n" + _doc([_entry(step=20, path=ROOT + "/checkpoint-20")]) + "\n"
    (c,) = cr.parse_listing(log, ROOT)
    assert c.step == 20


# -- a reader's run --------------------------------------------------------------------------------


class _Runner:
    """The API as read_checkpoints sees it: the pod goes through `phases` (one per read)."""

    def __init__(self, phases: list[str], log: str, *, exit_code: int = 0, vanish: bool = False) -> None:
        self.phases, self.log, self.exit_code, self.vanish = phases, log, exit_code, vanish
        self.created: list[dict[str, Any]] = []
        self.deleted: list[tuple[str, str]] = []
        self.reads = 0

    async def create_pod(self, namespace: str, body: Mapping[str, Any]) -> dict[str, Any]:
        self.created.append(copy.deepcopy(dict(body)))
        return dict(body)

    async def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        if self.vanish:
            return None
        phase = self.phases[min(self.reads, len(self.phases) - 1)]
        self.reads += 1
        status: dict[str, Any] = {"phase": phase}
        if phase == "Pending":
            status["containerStatuses"] = [{"name": "reader", "state": {"waiting": {"reason": "ImagePullBackOff"}}}]
        if phase in ("Succeeded", "Failed"):
            status["containerStatuses"] = [
                {"name": "reader", "state": {"terminated": {"exitCode": self.exit_code, "reason": "Error"}}}
            ]
        return {"metadata": {"name": name, "namespace": namespace}, "status": status}

    async def pod_log(
        self, namespace: str, pod: str, container: str, *, tail_lines: int = 1000, limit_bytes: int | None = None
    ) -> str:
        assert container == cr.CONTAINER
        return self.log

    async def delete_pod(self, namespace: str, name: str) -> bool:
        self.deleted.append((namespace, name))
        return True


def _read(runner: _Runner, timeout_s: float = 60.0) -> Any:
    job = _job([PVC], [{"name": "ckpt", "mountPath": "/mnt/ckpt"}])
    return cr.read_checkpoints(runner, job, ROOT, image="t:1", incident_id="inc-1", timeout_s=timeout_s, poll_s=2.0)


@pytest.mark.asyncio
@pytest.mark.looptime
async def test_a_reader_that_succeeds_gives_its_listing_and_is_deleted() -> None:
    runner = _Runner(["Pending", "Running", "Succeeded"], _doc([_entry()]) + "\n")
    start = asyncio.get_running_loop().time()
    (c,) = await _read(runner)
    assert c.step == 10 and c.complete
    assert asyncio.get_running_loop().time() - start == pytest.approx(4.0)  # two polls
    name = runner.created[0]["metadata"]["name"]
    assert runner.deleted == [("team-a", name)]


@pytest.mark.asyncio
@pytest.mark.looptime
@pytest.mark.parametrize(
    ("runner", "why"),
    [
        (_Runner(["Pending"], ""), r"did not finish in 60 s \(Pending, ImagePullBackOff\)"),
        (_Runner(["Running", "Failed"], "PermissionError: [Errno 13] /mnt/ckpt\n", exit_code=1), r"failed \(exit 1"),
        (_Runner(["Succeeded"], "no json here\n"), "no listing"),
        (_Runner(["Running"], "", vanish=True), "deleted before it finished"),
    ],
)
async def test_a_reader_without_a_listing_raises_and_is_deleted_all_the_same(runner: _Runner, why: str) -> None:
    with pytest.raises(cr.CheckpointReadError, match=why):
        await _read(runner)
    assert len(runner.deleted) == 1
