"""Node quarantine and release against the emulated API: every field written exactly, other people's
taints and the kubelet's conditions kept, idempotence, a second incident, a cordon a person set
before, refusals, and the optimistic concurrency of the read-modify-write."""

from __future__ import annotations

import calendar
import time
from typing import Any

import pytest
from kubefix import NODES, cluster_fixture, inject, kube_fixture, ops_fixture, seen  # noqa: F401
from servers.kube import Cluster, KubeEmulator, kmock

from trainmedic.models import FaultClass
from trainmedic.remediations.kube import (
    ANN_INCIDENT,
    ANN_QUARANTINE_REASON,
    ANN_QUARANTINED_AT,
    ANN_WAS_UNSCHEDULABLE,
    CONDITION_TYPE,
    LABEL_QUARANTINED,
    TAINT_KEY,
    ConflictError,
    KubeNotFound,
    KubeOps,
    PermanentKubeError,
    QuarantineResult,
    ReleaseRefused,
    fault_reason,
)

pytestmark = pytest.mark.asyncio

OTHER_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
OUR_TAINT = {"key": TAINT_KEY, "value": "device_error", "effect": "NoSchedule"}
REASON = "Xid 79 (GPU has fallen off the bus) on GPU 3"


def _node(kube: KubeEmulator, name: str = "gpu-1") -> dict[str, Any]:
    (node,) = [n for n in kube.objects(NODES) if n["metadata"]["name"] == name]
    return node


def _conditions(node: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in node["status"]["conditions"]}


def _epoch(stamp: str) -> float:
    return calendar.timegm(time.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ"))


async def _quarantine(ops: KubeOps, incident: str = "inc-1", node: str = "gpu-1") -> QuarantineResult:
    return await ops.quarantine_node(node, incident_id=incident, fault_class=FaultClass.DEVICE_ERROR, reason=REASON)


async def test_quarantine_writes_every_field_and_keeps_what_others_wrote(
    kube: KubeEmulator, cluster: Cluster, ops: KubeOps
) -> None:
    await cluster.add_node("gpu-1", gpus=8, taints=[OTHER_TAINT])
    before = _node(kube)
    t0 = time.time()
    result = await _quarantine(ops)
    assert result == QuarantineResult("gpu-1", changed=True, already_by=None, incident="inc-1")

    node = _node(kube)
    meta, spec = node["metadata"], node["spec"]
    assert spec["unschedulable"] is True
    assert spec["taints"] == [OTHER_TAINT, OUR_TAINT]
    assert meta["labels"] == {**before["metadata"]["labels"], LABEL_QUARANTINED: "true"}
    ann = meta["annotations"]
    assert set(ann) == {ANN_INCIDENT, ANN_QUARANTINED_AT, ANN_QUARANTINE_REASON, ANN_WAS_UNSCHEDULABLE}
    assert (ann[ANN_INCIDENT], ann[ANN_QUARANTINE_REASON], ann[ANN_WAS_UNSCHEDULABLE]) == ("inc-1", REASON, "false")
    assert t0 - 1 <= _epoch(ann[ANN_QUARANTINED_AT]) <= time.time() + 1

    conds = _conditions(node)
    kubelet = {c["type"]: c for c in before["status"]["conditions"]}
    assert {t: c for t, c in conds.items() if t != CONDITION_TYPE} == kubelet
    ours = conds[CONDITION_TYPE]
    assert (ours["status"], ours["reason"]) == ("True", "DeviceError")
    assert ours["message"] == f"quarantined by trainmedic, incident inc-1: {REASON}"
    assert ours["lastTransitionTime"] == ours["lastHeartbeatTime"]
    assert t0 - 1 <= _epoch(ours["lastTransitionTime"]) <= time.time() + 1
    # Capacity, allocatable and the rest of the status are untouched.
    assert {k: v for k, v in node["status"].items() if k != "conditions"} == {
        k: v for k, v in before["status"].items() if k != "conditions"
    }


async def test_a_quarantine_reads_the_node_once(kube: KubeEmulator, cluster: Cluster, ops: KubeOps) -> None:
    """The spec patch's answer is the node the condition is written on: one read, two writes (a 409
    on the status write still reads it again: the optimistic-concurrency tests below)."""
    await cluster.add_node("gpu-1", gpus=8)
    kube.forget_requests()
    await _quarantine(ops)
    assert len(seen(kube, "fetch", NODES)) == 1
    assert len(seen(kube, "update", NODES)) == 2
    assert _conditions(_node(kube))[CONDITION_TYPE]["status"] == "True"


async def test_quarantining_twice_for_the_same_incident_changes_nothing(
    kube: KubeEmulator, cluster: Cluster, ops: KubeOps
) -> None:
    await cluster.add_node("gpu-1", gpus=8, taints=[OTHER_TAINT])
    await _quarantine(ops)
    after_first = _node(kube)
    writes = len(seen(kube, "update", NODES))
    assert await _quarantine(ops) == QuarantineResult("gpu-1", changed=False, already_by=None, incident="inc-1")
    assert _node(kube) == after_first
    assert len(seen(kube, "update", NODES)) == writes  # nothing written at all


async def test_a_second_incident_finds_the_node_already_quarantined(
    kube: KubeEmulator, cluster: Cluster, ops: KubeOps
) -> None:
    await cluster.add_node("gpu-1", gpus=8)
    await _quarantine(ops, "inc-1")
    after_first = _node(kube)
    result = await ops.quarantine_node(
        "gpu-1", incident_id="inc-2", fault_class=FaultClass.HANG, reason="NCCL watchdog timeout"
    )
    assert result == QuarantineResult("gpu-1", changed=False, already_by="inc-1", incident="inc-1")
    assert _node(kube) == after_first  # inc-1's annotations, taint value and condition are kept


async def test_a_second_incident_restores_a_cordon_somebody_lifted(
    kube: KubeEmulator, cluster: Cluster, ops: KubeOps
) -> None:
    await cluster.add_node("gpu-1", gpus=8)
    await _quarantine(ops, "inc-1")
    await cluster.cordon("gpu-1", False)
    result = await _quarantine(ops, "inc-2")
    assert (result.changed, result.already_by) == (True, "inc-1")
    node = _node(kube)
    assert node["spec"]["unschedulable"] is True
    assert node["metadata"]["annotations"][ANN_INCIDENT] == "inc-1"
    assert node["metadata"]["annotations"][ANN_WAS_UNSCHEDULABLE] == "false"  # recorded once, not overwritten


async def test_a_stale_taint_of_ours_is_updated_in_place(kube: KubeEmulator, cluster: Cluster, ops: KubeOps) -> None:
    stale = {"key": TAINT_KEY, "value": "hang", "effect": "NoSchedule"}
    await cluster.add_node("gpu-1", gpus=8, taints=[stale, OTHER_TAINT])
    await _quarantine(ops)
    assert _node(kube)["spec"]["taints"] == [OUR_TAINT, OTHER_TAINT]


@pytest.mark.parametrize("cordoned_before", [False, True], ids=["schedulable-before", "cordoned-by-a-person"])
async def test_release_undoes_exactly_what_quarantine_did(
    cordoned_before: bool, kube: KubeEmulator, cluster: Cluster, ops: KubeOps
) -> None:
    await cluster.add_node("gpu-1", gpus=8, taints=[OTHER_TAINT])
    if cordoned_before:
        await cluster.cordon("gpu-1")
    before = _node(kube)
    await _quarantine(ops)
    assert _node(kube)["metadata"]["annotations"][ANN_WAS_UNSCHEDULABLE] == str(cordoned_before).lower()

    assert await ops.release_node("gpu-1", incident_id="inc-1") is True
    node = _node(kube)
    assert bool(node["spec"].get("unschedulable")) is cordoned_before
    assert node["spec"]["taints"] == [OTHER_TAINT]
    assert node["metadata"]["labels"] == before["metadata"]["labels"]
    assert not node["metadata"].get("annotations")
    conds = _conditions(node)
    ours = conds.pop(CONDITION_TYPE)
    assert (ours["status"], ours["reason"]) == ("False", "Released")
    assert ours["message"] == "released by trainmedic (incident inc-1) / 已由 trainmedic 解除隔离"
    assert conds == {c["type"]: c for c in before["status"]["conditions"]}

    assert await ops.release_node("gpu-1") is False  # nothing left to release
    assert await ops.quarantined_nodes() == []


async def test_release_is_refused_for_another_incident(kube: KubeEmulator, cluster: Cluster, ops: KubeOps) -> None:
    await cluster.add_node("gpu-1", gpus=8)
    await _quarantine(ops, "inc-1")
    quarantined = _node(kube)
    with pytest.raises(ReleaseRefused, match="quarantined by incident inc-1, not inc-2") as err:
        await ops.release_node("gpu-1", incident_id="inc-2")
    assert isinstance(err.value, PermanentKubeError)
    assert err.value.hint is not None and "inc-1" in err.value.hint.zh
    assert _node(kube) == quarantined
    assert await ops.release_node("gpu-1") is True  # no incident given: an operator's release


@pytest.mark.parametrize("exists", [True, False], ids=["never-quarantined", "no-such-node"])
async def test_release_of_a_node_not_quarantined_is_false(
    exists: bool, kube: KubeEmulator, cluster: Cluster, ops: KubeOps
) -> None:
    if exists:
        await cluster.add_node("gpu-1", gpus=8, taints=[OTHER_TAINT])
        before = _node(kube)
    assert await ops.release_node("gpu-1", incident_id="inc-1") is False
    if exists:
        assert _node(kube) == before
    assert seen(kube, "update", NODES) == []


async def test_quarantine_of_a_missing_node_is_not_found(cluster: Cluster, ops: KubeOps) -> None:
    with pytest.raises(KubeNotFound, match="Node gpu-9"):
        await _quarantine(ops, node="gpu-9")


async def test_quarantined_nodes_lists_ours(cluster: Cluster, ops: KubeOps) -> None:
    for name in ("gpu-1", "gpu-2", "gpu-3"):
        await cluster.add_node(name, gpus=8)
    await _quarantine(ops, "inc-1", node="gpu-3")
    await ops.quarantine_node("gpu-1", incident_id="inc-7", fault_class="hang", reason="stalled ranks")
    listed = await ops.quarantined_nodes()
    assert [(n["name"], n["incident"], n["reason"], n["fault_class"], n["unschedulable"]) for n in listed] == [
        ("gpu-1", "inc-7", "stalled ranks", "hang", True),
        ("gpu-3", "inc-1", REASON, "device_error", True),
    ]
    assert all(isinstance(n["since"], str) and n["since"].endswith("Z") for n in listed)


async def test_a_conflict_on_our_write_is_read_again_and_reapplied(
    kube: KubeEmulator, cluster: Cluster, ops: KubeOps
) -> None:
    await cluster.add_node("gpu-1", gpus=8, taints=[OTHER_TAINT])
    concurrent = {"key": "example.com/maintenance", "value": "planned", "effect": "NoSchedule"}

    def somebody_wrote_first(request: Any) -> Any:
        # Our write did not land; another writer's did (kmock applies every write, so undo ours).
        kube.store_patch(
            NODES,
            None,
            "gpu-1",
            {
                "metadata": {"labels": {LABEL_QUARANTINED: None}, "annotations": None},
                "spec": {"unschedulable": None, "taints": [OTHER_TAINT, concurrent]},
            },
        )
        return kmock.KubernetesError(status=409, reason="Conflict", message="the object has been modified")

    inject(kube, "update", NODES, somebody_wrote_first)
    result = await _quarantine(ops)
    assert result.changed
    first, second, status_patch = (r.data for r in seen(kube, "update", NODES))
    assert first["spec"]["taints"] == [OTHER_TAINT, OUR_TAINT]
    assert second["spec"]["taints"] == [OTHER_TAINT, concurrent, OUR_TAINT]  # recomputed from a fresh read
    node = _node(kube)
    assert node["spec"]["taints"] == [OTHER_TAINT, concurrent, OUR_TAINT]  # the other writer's taint is kept
    assert node["spec"]["unschedulable"] is True
    assert node["metadata"]["labels"][LABEL_QUARANTINED] == "true"
    assert status_patch["status"]["conditions"][-1]["type"] == CONDITION_TYPE


async def test_a_conflict_that_never_ends_is_raised(kube: KubeEmulator, cluster: Cluster, ops: KubeOps) -> None:
    await cluster.add_node("gpu-1", gpus=8)

    def conflict(request: Any) -> Any:
        kube.store_patch(NODES, None, "gpu-1", {"spec": {"unschedulable": None}})
        return kmock.KubernetesError(status=409, reason="Conflict", message="the object has been modified")

    inject(kube, "update", NODES, conflict, forever=True)
    with pytest.raises(ConflictError, match="still conflicting after 4 attempts"):
        await _quarantine(ops)
    assert len(seen(kube, "update", NODES)) == 4


async def test_writes_carry_the_resource_version_that_was_read(kube: KubeEmulator, ops: KubeOps) -> None:
    versioned = Cluster(kube, versioned=True)
    await versioned.add_node("gpu-1", gpus=8)
    rv = _node(kube)["metadata"]["resourceVersion"]
    await _quarantine(ops)
    spec_patch, status_patch = (r.data for r in seen(kube, "update", NODES))
    assert spec_patch["metadata"]["resourceVersion"] == rv
    assert status_patch["metadata"]["resourceVersion"] == rv
    assert status_patch["status"]["conditions"][-1]["type"] == CONDITION_TYPE


@pytest.mark.parametrize("fault", ["bad value", "x" * 64, ""], ids=["space", "too-long", "empty"])
async def test_a_fault_class_that_cannot_be_a_taint_value_is_refused(
    fault: str, kube: KubeEmulator, cluster: Cluster, ops: KubeOps
) -> None:
    await cluster.add_node("gpu-1", gpus=8)
    with pytest.raises(PermanentKubeError, match="taint value"):
        await ops.quarantine_node("gpu-1", incident_id="inc-1", fault_class=fault, reason="r")
    assert seen(kube, "update", NODES) == []


REASONS = {
    FaultClass.ACCELERATOR_OOM: "AcceleratorOom",
    FaultClass.HOST_OOM: "HostOom",
    FaultClass.DEVICE_ERROR: "DeviceError",
    FaultClass.COMM_INIT: "CommInit",
    FaultClass.COMM_ERROR: "CommError",
    FaultClass.HANG: "Hang",
}


@pytest.mark.parametrize(("fault", "reason"), list(REASONS.items()), ids=[f.value for f in REASONS])
async def test_condition_reasons_are_camel_case(fault: FaultClass, reason: str) -> None:
    assert fault_reason(fault) == reason


@pytest.mark.parametrize("other", [{}, {"team.example/owner": "infra"}])
async def test_a_breaker_claim_is_written_and_withdrawn_leaving_other_annotations(
    kube: KubeEmulator, cluster: Cluster, ops: KubeOps, other: dict[str, str]
) -> None:
    from trainmedic.remediations.policy import CLAIM_ANNOTATION, format_claim, parse_claim

    await cluster.add_node("gpu-1", gpus=8)
    if other:
        await ops.annotate_node("gpu-1", *next(iter(other.items())))
    await ops.annotate_node("gpu-1", CLAIM_ANNOTATION, format_claim(1000.5, "inc-1"))
    ann = _node(kube)["metadata"]["annotations"]
    assert parse_claim(ann[CLAIM_ANNOTATION]) == (1000.5, "inc-1")
    await ops.annotate_node("gpu-1", CLAIM_ANNOTATION, None)
    assert CLAIM_ANNOTATION not in (_node(kube)["metadata"].get("annotations") or {})
    assert {k: v for k, v in (_node(kube)["metadata"].get("annotations") or {}).items()} == other
