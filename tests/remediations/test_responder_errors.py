"""One error tree with retry meanings (remediations.errors), used by the responder: a permanent error
ends the incident `failed` and tells a person; nothing is left `acting`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from respfix import FakeKube, diagnosis, harness, job, node, policy

from trainmedic.agent.store import ActionState, IncidentStatus
from trainmedic.remediations import workloads as wl
from trainmedic.remediations.errors import (
    FatalActionError,
    PermanentActionError,
    StalePlan,
    TemporaryActionError,
    classify,
)
from trainmedic.remediations.kube import ConflictError, KubeForbidden, KubeNotFound, TemporaryKubeError


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        (TemporaryKubeError("503", delay=7.0), TemporaryActionError),
        (ConflictError("409"), TemporaryActionError),
        (KubeForbidden("403"), PermanentActionError),
        (KubeNotFound("404"), PermanentActionError),
        (wl.UnsupportedWorkload("owned by CronJob nightly", "由 CronJob 控制"), PermanentActionError),
        (StalePlan("resubmitted"), StalePlan),
        (KeyError("spec"), PermanentActionError),
        (__import__("sqlite3").OperationalError("disk I/O error"), FatalActionError),
    ],
)
def test_classify_gives_every_error_its_retry_meaning(exc: BaseException, kind: type[Exception]) -> None:
    err = classify(exc)
    assert isinstance(err, kind)
    if isinstance(exc, TemporaryKubeError):
        assert isinstance(err, TemporaryActionError) and err.delay == 7.0


def cronjob_owned(name: str) -> dict[str, Any]:
    obj = job("train", name)
    obj["metadata"]["ownerReferences"] = [
        {"apiVersion": "batch/v1", "kind": "CronJob", "name": "nightly", "uid": "c-1", "controller": True}
    ]
    return obj


@pytest.mark.parametrize("mode", ["enforce", "approve"])
@pytest.mark.asyncio
@pytest.mark.looptime
async def test_a_permanent_workload_error_fails_the_incident_and_pages(tmp_path: Path, mode: str) -> None:
    kube = FakeKube(nodes={"gpu-0": node("gpu-0")})
    kube.add(cronjob_owned("nightly-123"))
    h = harness(tmp_path, policy(actions="[restart_from_checkpoint]", mode=mode), kube)
    incident = await h.handle(diagnosis("train", "nightly-123", "gpu-0"))
    if mode == "approve":
        h.store.approve(incident.id, by="sre")
        await h.responder.poll_store()
        await h.responder.drain()
    incident = h.store.get(incident.id)

    assert incident.status is IncidentStatus.FAILED
    restart = incident.actions[0]
    assert restart.state is ActionState.FAILED
    assert "controlled by CronJob nightly" in (restart.result or {})["error"]
    assert kube.deleted == [] and kube.created == []
    assert h.store.unfinished() == []
    # The failure is published (and so reaches the sinks) with status failed.
    assert h.responder.handled[incident.id] is IncidentStatus.FAILED
