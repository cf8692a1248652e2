"""The canonical `pod_status:` / `k8s_event:` lines are what the shipped rules match: each line form
the watchers produce is scanned with the real engine (detectors.diagnose.make_engine)."""

from __future__ import annotations

import pytest

from trainmedic.agent.watchers.k8s import k8s_event_line, pod_status_lines
from trainmedic.detectors.engine import Engine
from trainmedic.events import K8sEvent, PodStatus


def _container(**kw: object) -> dict[str, object]:
    base: dict[str, object] = {
        "name": "trainer",
        "ready": False,
        "restarts": 0,
        "state": "terminated",
        "reason": None,
        "exit_code": None,
        "signal": None,
        "oom_killed": False,
        "started_at": None,
        "finished_at": None,
    }
    base.update(kw)
    return base


@pytest.mark.parametrize(
    ("container", "line", "rules"),
    [
        (
            _container(reason="OOMKilled", exit_code=137, oom_killed=True, restarts=2),
            "pod_status: container=trainer state=terminated reason=OOMKilled exit_code=137 signal=0 restarts=2",
            {"generic.host_oom.pod_oomkilled"},
        ),
        (
            _container(reason="OOMKilled", exit_code=137, waiting_reason="CrashLoopBackOff", restarts=5),
            "pod_status: container=trainer state=terminated reason=OOMKilled exit_code=137 signal=0 restarts=5",
            {"generic.host_oom.pod_oomkilled"},
        ),
        (
            _container(reason="Error", exit_code=137, signal=9, restarts=1),
            "pod_status: container=trainer state=terminated reason=Error exit_code=137 signal=9 restarts=1",
            {"generic.killed.sigkill"},
        ),
        (
            _container(reason="Error", exit_code=1, restarts=1),
            "pod_status: container=trainer state=terminated reason=Error exit_code=1 signal=0 restarts=1",
            {"generic.k8s.container_exit"},
        ),
        (
            _container(reason="Completed", exit_code=0),
            "pod_status: container=trainer state=terminated reason=Completed exit_code=0 signal=0 restarts=0",
            set(),
        ),
        (
            _container(state="waiting", reason="ImagePullBackOff"),
            "pod_status: container=trainer state=waiting reason=ImagePullBackOff restarts=0",
            set(),
        ),
        (
            _container(name="weird name", reason="Container Cannot Run", exit_code=None),
            "pod_status: container=weird_name state=terminated reason=Container_Cannot_Run exit_code=-1 signal=0 "
            "restarts=0",
            set(),
        ),
    ],
    ids=["oomkilled", "crashloop-after-oom", "exit-137", "exit-1", "completed", "image-pull", "odd-values"],
)
def test_pod_status_lines_match_the_shipped_rules(
    container: dict[str, object], line: str, rules: set[str], shipped_engine: Engine
) -> None:
    status = PodStatus(namespace="train", pod="p", containers=[container])
    assert pod_status_lines(status) == [line]
    found = {f.rule_id for f in shipped_engine.scan_text(line)}
    assert found == rules


def test_running_containers_give_no_line() -> None:
    status = PodStatus(namespace="train", pod="p", containers=[_container(state="running")])
    assert pod_status_lines(status) == []


@pytest.mark.parametrize(
    ("event", "line", "rule"),
    [
        (
            K8sEvent(
                type="Warning",
                reason="OOMKilling",
                object_kind="Node",
                object_name="gpu-node-7",
                message="Memory cgroup out of memory: Killed process 4321 (python)\ntotal-vm:98765432kB",
            ),
            "k8s_event: type=Warning reason=OOMKilling object=Node/gpu-node-7 message=Memory cgroup out of memory: "
            "Killed process 4321 (python) total-vm:98765432kB",
            "generic.host_oom.pod_oomkilled",
        ),
        (
            K8sEvent(
                type="Warning",
                reason="SystemOOM",
                object_kind="Node",
                object_name="gpu-node-7",
                message="System OOM encountered, victim process: python, pid: 4321",
            ),
            "k8s_event: type=Warning reason=SystemOOM object=Node/gpu-node-7 message=System OOM encountered, "
            "victim process: python, pid: 4321",
            "generic.host_oom.pod_oomkilled",
        ),
        (
            K8sEvent(
                type="Warning",
                reason="Occur",
                object_kind="Pod",
                object_name="ascend-device-plugin-daemonset-910-dlpmv",
                message="device fault, nodeName:k8smaster, assertion:Occur, cardID:2, deviceID:0, "
                "faultCodes:8C084E00, faultLevelName:RestartBusiness, alarmRaisedTime:2023-11-21 05:36:53",
            ),
            "k8s_event: type=Warning reason=Occur object=Pod/ascend-device-plugin-daemonset-910-dlpmv message=device "
            "fault, nodeName:k8smaster, assertion:Occur, cardID:2, deviceID:0, faultCodes:8C084E00, "
            "faultLevelName:RestartBusiness, alarmRaisedTime:2023-11-21 05:36:53",
            "ascend.device_fault_event",
        ),
        (
            K8sEvent(
                type="Normal", reason="Pulled", object_kind="Pod", object_name="p", message="Container image pulled\r\n"
            ),
            "k8s_event: type=Normal reason=Pulled object=Pod/p message=Container image pulled",
            None,
        ),
        (
            K8sEvent(),
            "k8s_event: type=Normal reason=Unknown object=?/? message=",
            None,
        ),
    ],
    ids=["oomkilling", "system-oom", "ascend-device-fault", "pulled", "empty"],
)
def test_k8s_event_line_matches_the_shipped_rules(
    event: K8sEvent, line: str, rule: str | None, shipped_engine: Engine
) -> None:
    assert k8s_event_line(event) == line
    found = {f.rule_id for f in shipped_engine.scan_text(line)}
    if rule is None:
        assert not found
    else:
        assert rule in found


def test_k8s_event_line_is_bounded() -> None:
    line = k8s_event_line(K8sEvent(reason="Huge", message="x" * 100_000))
    assert len(line) < 5000
