"""dump_stacks: the training processes' stacks go into the scene right before the restart, and a
dump that fails (exec forbidden, no py-spy, an exec that hangs, no pod) never holds the restart back."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from respfix import FakeKube, diagnosis, harness, job, node, pod, policy

from trainmedic.agent.store import ActionState, IncidentStatus
from trainmedic.models import FaultClass
from trainmedic.remediations.actions.dump_stacks import SUBDIR
from trainmedic.remediations.policy import POLICY_FILE, ActionName, load_policy
from trainmedic.remediations.stacks import ExecResult

STACK = (
    'Thread 0x7F12 (active): "MainThread"\n'
    "    all_reduce (torch/distributed/distributed_c10d.py:2050)\n"
    "    train_step (train.py:88) --hf_token hf_secretvalue\n"
)


@dataclass
class Pods:
    """The pods' side of exec, as the API server and the container answer it."""

    kube: FakeKube
    behaviour: str
    # What the cluster looked like at each exec: how many workloads had been deleted by then.
    deleted_at_exec: list[int] = field(default_factory=list)

    async def exec(
        self, namespace: str, pod: str, container: str, command: list[str], *, timeout_s: float
    ) -> ExecResult:
        self.deleted_at_exec.append(len(self.kube.deleted))
        if self.behaviour == "py-spy":
            return ExecResult(stdout=STACK, exit_code=0)
        if self.behaviour == "forbidden":
            return ExecResult(error="403 Forbidden: pods/exec", status=403)
        if self.behaviour == "raises":
            raise ConnectionResetError("websocket closed")
        if self.behaviour == "hangs":
            await asyncio.sleep(3600)
        return ExecResult(stderr="sh: py-spy: not found", exit_code=127)

    async def pod_log(self, namespace: str, pod: str, container: str, **kw: object) -> str:
        return ""


@pytest.mark.parametrize(
    ("behaviour", "pods", "state"),
    [
        ("py-spy", 2, ActionState.DONE),
        ("forbidden", 2, ActionState.SKIPPED),
        ("raises", 2, ActionState.SKIPPED),
        ("hangs", 2, ActionState.SKIPPED),
        ("not-found", 1, ActionState.SKIPPED),
        ("py-spy", 0, ActionState.SKIPPED),
    ],
)
@pytest.mark.asyncio
@pytest.mark.looptime
async def test_stacks_are_taken_before_the_restart_and_a_failed_dump_never_blocks_it(
    tmp_path: Path, behaviour: str, pods: int, state: ActionState
) -> None:
    kube = FakeKube(nodes={"gpu-0": node("gpu-0")})
    kube.add(job("train", "llama"))
    kube.pods = [pod("train", "llama", f"llama-{i}") for i in range(pods)] + [
        pod("train", "llama", "llama-old", phase="Failed")
    ]
    source = Pods(kube, behaviour)
    h = harness(
        tmp_path,
        policy(actions="[dump_stacks, restart_from_checkpoint]"),
        kube,
        stack_source=source,
        stack_timeout_s=5.0,
    )
    incident = await h.handle(diagnosis("train", "llama", "gpu-0"))

    assert incident.status is IncidentStatus.RESOLVED
    dump, restart = incident.actions
    assert (dump.name, restart.name) == ("dump_stacks", "restart_from_checkpoint")
    assert dump.state is state, dump.result
    assert restart.state is ActionState.DONE and len(kube.created) == 1
    # Every exec happened before the job was deleted; a Failed pod is not exec'd into.
    assert source.deleted_at_exec and set(source.deleted_at_exec) == {0} if pods else source.deleted_at_exec == []
    result = dump.result or {}
    scene = Path(incident.scene_dir or "")
    if state is ActionState.DONE:
        assert result["dumped"] == pods and result["methods"] == {f"llama-{i}": "py-spy" for i in range(pods)}
        text = (scene / SUBDIR / "llama-0.txt").read_text()
        assert "all_reduce" in text and "hf_secretvalue" not in text
        index = json.loads((scene / SUBDIR / "index.json").read_text())
        assert set(index) == {f"llama-{i}" for i in range(pods)}
    else:
        assert result["reason"]
        assert "hf_secretvalue" not in json.dumps(result)


def test_the_shipped_policy_takes_the_stacks_of_a_hang_before_restarting_it() -> None:
    policy_ = load_policy(POLICY_FILE)
    rc = diagnosis("train", "llama", "gpu-0").diagnosis.root_cause
    assert rc is not None
    rule = policy_.match(rc.model_copy(update={"fault_class": FaultClass.HANG, "code": "nccl_watchdog"}))
    assert rule is not None
    assert [a.action for a in rule.actions] == [ActionName.DUMP_STACKS.value, ActionName.RESTART_FROM_CHECKPOINT.value]
