"""Node-level findings in node-problem-detector's style, against the emulated API: a
Trainmedic*Problem condition (status True, reason the fault class, message in English and Chinese)
and an Event on the Node; cleared (False, Released) with a Normal Event when the node is released;
written by the responder only when the mode acts or the setting asks for it."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from kubefix import NODES, cluster_fixture, kube_fixture, ops_fixture  # noqa: F401
from respfix import diagnosis, policy
from servers.kube import EVENT, Cluster, KubeEmulator

from trainmedic.agent.bus.memory import MemoryBus
from trainmedic.agent.responder import Responder, ResponderSettings
from trainmedic.agent.store import IncidentStore
from trainmedic.events import job_key
from trainmedic.models import FaultClass, I18nText
from trainmedic.remediations.kube import (
    CONDITION_TYPE,
    PROBLEM_ACCELERATOR,
    PROBLEM_NODE,
    KubeOps,
    fault_reason,
    problem_condition,
)
from trainmedic.remediations.policy_state import MemoryPolicyState

pytestmark = pytest.mark.asyncio

MESSAGE = I18nText(en="GPU has fallen off the bus (GPU 3)", zh="GPU 掉卡（GPU 3）")


def _node(kube: KubeEmulator, name: str = "gpu-1") -> dict[str, Any]:
    (node,) = [n for n in kube.objects(NODES) if n["metadata"]["name"] == name]
    return node


def _conditions(kube: KubeEmulator, name: str = "gpu-1") -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in _node(kube, name)["status"]["conditions"]}


def _node_events(kube: KubeEmulator, name: str = "gpu-1") -> list[dict[str, Any]]:
    return [
        e
        for e in kube.objects(EVENT)
        if e.get("involvedObject", {}).get("kind") == "Node" and e["involvedObject"].get("name") == name
    ]


@pytest.mark.parametrize(
    ("fault", "kind"),
    [
        (FaultClass.DEVICE_ERROR, PROBLEM_ACCELERATOR),
        (FaultClass.ACCELERATOR_OOM, PROBLEM_ACCELERATOR),
        (FaultClass.NODE_FAILURE, PROBLEM_NODE),
        (FaultClass.STORAGE_ERROR, PROBLEM_NODE),
    ],
)
async def test_condition_and_event_like_node_problem_detector(
    kube: KubeEmulator, cluster: Cluster, ops: KubeOps, fault: FaultClass, kind: str
) -> None:
    await cluster.add_node("gpu-1", gpus=8)
    kubelet = _conditions(kube)
    assert problem_condition(fault) == kind
    assert await ops.report_node_problem("gpu-1", incident_id="inc-1", fault_class=fault, message=MESSAGE)

    conds = _conditions(kube)
    assert {t: c for t, c in conds.items() if t != kind} == kubelet
    ours = conds[kind]
    assert (ours["status"], ours["reason"]) == ("True", fault_reason(fault.value))
    assert MESSAGE.en in ours["message"] and MESSAGE.zh in ours["message"] and "inc-1" in ours["message"]
    assert ours["lastTransitionTime"] and ours["lastHeartbeatTime"]

    (event,) = _node_events(kube)
    assert event["metadata"]["namespace"] == "default"
    assert (event["type"], event["reason"]) == ("Warning", fault_reason(fault.value))
    assert event["involvedObject"] == {"apiVersion": "v1", "kind": "Node", "name": "gpu-1", "uid": "gpu-1"}
    assert event["source"]["component"] == "trainmedic" and MESSAGE.zh in event["message"]


@pytest.mark.parametrize("times", [2, 3])
async def test_reporting_again_writes_nothing_new(
    kube: KubeEmulator, cluster: Cluster, ops: KubeOps, times: int
) -> None:
    await cluster.add_node("gpu-1", gpus=8)
    first = await ops.report_node_problem(
        "gpu-1", incident_id="inc-1", fault_class=FaultClass.DEVICE_ERROR, message=MESSAGE
    )
    before = _conditions(kube)[PROBLEM_ACCELERATOR]
    again = [
        await ops.report_node_problem(
            "gpu-1", incident_id="inc-1", fault_class=FaultClass.DEVICE_ERROR, message=MESSAGE
        )
        for _ in range(times - 1)
    ]
    assert first and not any(again)
    assert _conditions(kube)[PROBLEM_ACCELERATOR] == before
    assert len(_node_events(kube)) == 1


@pytest.mark.parametrize("quarantined", [True, False])
async def test_release_clears_the_condition_with_an_event(
    kube: KubeEmulator, cluster: Cluster, ops: KubeOps, quarantined: bool
) -> None:
    await cluster.add_node("gpu-1", gpus=8)
    if quarantined:
        await ops.quarantine_node("gpu-1", incident_id="inc-1", fault_class=FaultClass.DEVICE_ERROR, reason="Xid 79")
    await ops.report_node_problem("gpu-1", incident_id="inc-1", fault_class=FaultClass.DEVICE_ERROR, message=MESSAGE)

    assert await ops.release_node("gpu-1", incident_id="inc-1")
    conds = _conditions(kube)
    assert (conds[PROBLEM_ACCELERATOR]["status"], conds[PROBLEM_ACCELERATOR]["reason"]) == ("False", "Released")
    if quarantined:
        assert conds[CONDITION_TYPE]["status"] == "False"
        assert not _node(kube)["spec"].get("unschedulable")
    reasons = [(e["type"], e["reason"]) for e in _node_events(kube)]
    assert reasons == [("Warning", "DeviceError"), ("Normal", "TrainmedicNodeReleased")]
    # A second release has nothing left to clear.
    assert not await ops.release_node("gpu-1", incident_id="inc-1")
    assert len(_node_events(kube)) == 2


@pytest.mark.parametrize("fault", [FaultClass.DEVICE_ERROR])
async def test_a_node_that_is_gone_gets_nothing(kube: KubeEmulator, ops: KubeOps, fault: FaultClass) -> None:
    assert not await ops.report_node_problem("gone", incident_id="inc-1", fault_class=fault, message=MESSAGE)
    assert _node_events(kube, "gone") == []


# ------------------------------------------------------------------------------------------------
# The responder: only when the mode acts, or with the explicit setting


@pytest.mark.parametrize(
    ("mode", "setting", "written"),
    [
        ("enforce", None, True),
        ("approve", None, True),
        ("dry-run", None, False),
        ("observe", None, False),
        ("dry-run", True, True),
        ("enforce", False, False),
    ],
)
async def test_the_responder_marks_the_node_when_it_may(
    tmp_path: Path, kube: KubeEmulator, cluster: Cluster, mode: str, setting: bool | None, written: bool
) -> None:
    await cluster.add_node("gpu-1", gpus=8)
    ops = KubeOps(kube.api_client(), attempts=2, base_delay=0.01, jitter=0.0)
    store = IncidentStore(tmp_path / "incidents.db")
    responder = Responder(
        MemoryBus(),
        ops,
        store,
        policy(mode=mode, actions="[notify]"),
        MemoryPolicyState(),
        settings=ResponderSettings(
            scene_dir=tmp_path / "scenes", reports=False, stacks=False, node_conditions=setting, wait_gone_s=1
        ),
        clock=time.time,
    )
    try:
        d = diagnosis("train", "llama", "gpu-1")
        assert d.job is not None
        incident = await responder.handle(d, key=job_key(d.job.namespace, d.job.name))
        assert incident is not None
        conds = _conditions(kube)
        assert (PROBLEM_ACCELERATOR in conds) is written
        assert bool(_node_events(kube)) is written
        kinds = [e["kind"] for e in store.timeline(incident.id)]
        assert ("node_condition" in kinds) is written
    finally:
        responder.close()
