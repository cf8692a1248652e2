"""`trainmedic diagnose --job` and `trainmedic scan` against the emulated Kubernetes API (kmock, with
the stand-in kubelet and controllers of tests/servers/kube.py), through the CLI and a kubeconfig as a
user has one: the CLI runs in a thread (its own event loop) while the emulator serves on the test's.

Scenarios: a failed PyTorchJob whose worker died of a CUDA OOM (accelerator_oom on the worker's
pod, rank and node, read from the previous container's log); a batch/v1 Job whose node has an Xid
event; a job that does not exist; a user without the permission to list pods; no kubeconfig; the
JSON shape of `scan`. Every request the commands make is a read.
"""

from __future__ import annotations

import asyncio
import fnmatch
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import yaml
from servers.kube import Cluster, KubeEmulator, kmock, require_kmock

from trainmedic.agent.cli import main
from trainmedic.remediations.kube import TAINT_KEY

# A fake bearer token: it must never be printed.
TOKEN = "tm-test-token-5f0c9a"
CUDA_OOM = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
    "79.10 GiB of which 1.20 GiB is free. Including non-PyTorch memory, this process has 77.80 GiB memory in use."
)
XID_EVENT = "XidCriticalError: Xid=79 on Device=GPU-d23d91a3-5f1c-2b33-9f43-1a2b3c4d5e6f; marking device as unhealthy."
READS = {"fetch", "list", "watch"}


@dataclass
class Env:
    kube: KubeEmulator
    cluster: Cluster
    kubeconfig: Path


@pytest_asyncio.fixture
async def env(tmp_path: Path) -> AsyncIterator[Env]:
    require_kmock()
    async with KubeEmulator() as kube:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "emu", "cluster": {"server": kube.url}}],
            "users": [{"name": "sre", "user": {"token": TOKEN}}],
            "contexts": [{"name": "emu", "context": {"cluster": "emu", "user": "sre", "namespace": "train"}}],
            "current-context": "emu",
        }
        path = tmp_path / "kubeconfig"
        path.write_text(yaml.safe_dump(config))
        yield Env(kube, Cluster(kube), path)


async def cli(env: Env, capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """Run the CLI; the emulator's record of requests then holds only the CLI's (`only_reads`)."""
    env.kube.forget_requests()
    rc = await asyncio.to_thread(main, [*argv, "--kubeconfig", str(env.kubeconfig)])
    out, err = capsys.readouterr()
    assert TOKEN not in out and TOKEN not in err
    return rc, out, err


def only_reads(kube: KubeEmulator) -> None:
    actions = {r.action.value.lower() for r in kube.requests() if r.action is not None}
    assert actions <= READS, actions


async def oom_pytorchjob(c: Cluster) -> None:
    """llama in train: master on gpu-1, worker-0 (rank 1) on gpu-2 died of a CUDA OOM, restarted once,
    and the job failed."""
    await c.add_node("gpu-1", gpus=8)
    await c.add_node("gpu-2", gpus=8)
    pj = await c.create_pytorchjob("train", "llama", masters=1, workers=1)
    master, worker = await c.create_pytorchjob_pods(pj)
    for pod, node in ((master, "gpu-1"), (worker, "gpu-2")):
        await c.bind(pod, node)
        await c.start(pod)
    c.write_log(master, "pytorch", "step 10 loss 2.31")
    c.write_log(worker, "pytorch", "step 10 loss 2.29", CUDA_OOM)
    await c.terminate(worker, "pytorch", reason="Error", exit_code=1, restart=True)
    await c.restart(worker, "pytorch")
    c.write_log(worker, "pytorch", "step 0 loss 9.99")
    await c.set_pytorchjob_condition(pj, "Failed", reason="PyTorchJobFailed", message="worker-0 failed")


async def xid_job(c: Cluster) -> None:
    """bert in train: a batch/v1 Job on gpu-3, whose device plugin reported Xid 79 on the Node."""
    await c.add_node("gpu-3", gpus=8)
    job = await c.create_job("train", "bert", completions=1)
    (pod,) = await c.create_job_pods(job)
    await c.bind(pod, "gpu-3")
    await c.start(pod)
    c.write_log(pod, "trainer", "step 5 loss 3.0")
    await c.event(
        "default", kind="Node", name="gpu-3", reason="XidCriticalError", message=XID_EVENT, type="Warning",
        host="gpu-3", component="nvidia-device-plugin",
    )  # fmt: skip


@pytest.mark.parametrize(
    ("scenario", "job", "fault_class", "node", "rank", "pod"),
    [
        pytest.param(
            oom_pytorchjob, "train/llama", "accelerator_oom", "gpu-2", 1, "llama-worker-0", id="pytorchjob-oom"
        ),
        pytest.param(oom_pytorchjob, "llama", "accelerator_oom", "gpu-2", 1, "llama-worker-0", id="context-namespace"),
        pytest.param(xid_job, "train/bert", "device_error", "gpu-3", None, None, id="job-node-xid"),
    ],
)
@pytest.mark.parametrize("fmt", ["json", "text"])
@pytest.mark.asyncio
async def test_diagnose_job(
    env: Env,
    capsys: pytest.CaptureFixture[str],
    scenario: Any,
    job: str,
    fault_class: str,
    node: str,
    rank: int | None,
    pod: str | None,
    fmt: str,
) -> None:
    await scenario(env.cluster)
    rc, out, err = await cli(env, capsys, "diagnose", "--job", job, "--format", fmt, "--lang", "en")
    assert rc == 0, err
    assert f"{job.rpartition('/')[2]}: read " in err and " pods, " in err and " container logs, " in err
    if fmt == "json":
        data = json.loads(out)
        assert set(data) == {"root_cause", "findings"}
        root = data["root_cause"]
        assert root["fault_class"] == fault_class
        assert root["node"] == node
        if rank is not None:
            assert root["rank"] == rank
    else:
        assert fault_class in out or fault_class.replace("_", " ") in out.lower(), out
        assert node in out
    only_reads(env.kube)


@pytest.mark.asyncio
async def test_diagnose_job_reads_the_previous_container(env: Env, capsys: pytest.CaptureFixture[str]) -> None:
    await oom_pytorchjob(env.cluster)
    rc, out, err = await cli(env, capsys, "diagnose", "--job", "train/llama", "--format", "json")
    assert rc == 0, err
    findings = json.loads(out)["findings"]
    assert any("CUDA out of memory" in f["text"] for f in findings)
    logs = env.kube.requests("v1/pods")
    assert any("previous=true" in str(getattr(r, "url", "")).lower() for r in logs) or any(
        "previous" in str(getattr(r, "params", "")) for r in logs
    )


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (("diagnose", "--job", "train/nope", "--lang", "en"), "job train/nope not found"),
        (("diagnose", "--job", "train/nope", "--lang", "zh"), "未找到作业 train/nope"),
    ],
)
@pytest.mark.asyncio
async def test_job_not_found(
    env: Env, capsys: pytest.CaptureFixture[str], argv: tuple[str, ...], expected: str
) -> None:
    await env.cluster.add_node("gpu-1", gpus=8)
    rc, out, err = await cli(env, capsys, *argv)
    assert rc == 2 and out == ""
    assert expected in err


def forbid_pod_lists(kube: KubeEmulator) -> None:
    body = (
        b'{"kind":"Status","apiVersion":"v1","status":"Failure","code":403,"reason":"Forbidden","message":'
        b'"pods is forbidden: User \\"sre\\" cannot list resource \\"pods\\" in API group \\"\\" in the '
        b'namespace \\"train\\""}'
    )
    view = kube.handler[kmock.action.LIST, kmock.resource("v1/pods")]
    view[len(list(view)) :] << 403 << body


@pytest.mark.parametrize(
    ("lang", "expected"),
    [
        ("en", "lacks the RBAC permission pods: list (namespace train)"),
        ("zh", "缺少 RBAC 权限 pods: list（namespace train）"),
    ],
)
@pytest.mark.asyncio
async def test_forbidden_names_the_permission(
    env: Env, capsys: pytest.CaptureFixture[str], lang: str, expected: str
) -> None:
    await oom_pytorchjob(env.cluster)
    forbid_pod_lists(env.kube)
    rc, out, err = await cli(env, capsys, "diagnose", "--job", "train/llama", "--lang", lang)
    assert rc == 2 and out == ""
    assert expected in err, err


@pytest.mark.parametrize(
    ("lang", "expected"), [("en", "no Kubernetes configuration"), ("zh", "未找到 Kubernetes 配置")]
)
@pytest.mark.parametrize("command", [("diagnose", "--job", "train/llama"), ("scan",)])
def test_no_kubeconfig(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: tuple[str, ...], lang: str, expected: str
) -> None:
    rc = main([*command, "--lang", lang, "--kubeconfig", str(tmp_path / "missing")])
    out, err = capsys.readouterr()
    assert rc == 2 and out == ""
    assert expected in err


async def sick_nodes(c: Cluster) -> None:
    await c.add_node("gpu-9", gpus=8, ready=False)
    await c.add_node("gpu-8", gpus=8, taints=[{"key": TAINT_KEY, "value": "device_error", "effect": "NoSchedule"}])
    await c.add_node("gpu-7", gpus=8)
    await c.set_node_conditions("gpu-7", {"TrainmedicAcceleratorProblem": "True"})
    await c.add_node("cpu-1")


@pytest.mark.parametrize("where", [("-n", "train"), ("-A",), ()])
@pytest.mark.asyncio
async def test_scan_json(env: Env, capsys: pytest.CaptureFixture[str], where: tuple[str, ...]) -> None:
    await oom_pytorchjob(env.cluster)
    await xid_job(env.cluster)  # running: not listed
    await sick_nodes(env.cluster)
    rc, out, err = await cli(env, capsys, "scan", *where, "--format", "json", "--lang", "en")
    assert rc == 0, err
    data = json.loads(out)
    assert set(data) == {"namespace", "workloads", "nodes", "skipped"}
    assert data["namespace"] == (None if where == ("-A",) else "train")
    (w,) = data["workloads"]
    assert {k: w[k] for k in ("kind", "namespace", "name", "phase")} == {
        "kind": "PyTorchJob",
        "namespace": "train",
        "name": "llama",
        "phase": "Failed",
    }
    assert w["root_cause"]["fault_class"] == "accelerator_oom" and w["root_cause"]["node"] == "gpu-2"
    assert w["pods"] == 2 and w["summary"].startswith("accelerator_oom: ")
    nodes = {n["node"]: n for n in data["nodes"]}
    assert set(nodes) == {"gpu-7", "gpu-8", "gpu-9"}
    assert any(p.startswith("NotReady") for p in nodes["gpu-9"]["problems"])
    assert any("quarantined by trainmedic" in p for p in nodes["gpu-8"]["problems"])
    assert any(p.startswith("TrainmedicAcceleratorProblem=True") for p in nodes["gpu-7"]["problems"])
    only_reads(env.kube)


@pytest.mark.parametrize(
    ("lang", "heading", "none", "not_ready"),
    [
        ("en", "Training workloads (train):", "none failed or restarting", "NotReady (Ready=False"),
        ("zh", "训练作业 (train):", "无失败或重启中的作业", "未就绪 (Ready=False"),
    ],
)
@pytest.mark.asyncio
async def test_scan_text(
    env: Env, capsys: pytest.CaptureFixture[str], lang: str, heading: str, none: str, not_ready: str
) -> None:
    await sick_nodes(env.cluster)
    rc, out, err = await cli(env, capsys, "scan", "--lang", lang)
    assert rc == 0, err
    assert out.startswith(heading) and none in out
    assert f"gpu-9  {not_ready}" in out and "cpu-1" not in out


def forbid(kube: KubeEmulator, action: Any, resource: str) -> None:
    body = b'{"kind":"Status","apiVersion":"v1","status":"Failure","code":403,"reason":"Forbidden","message":"no"}'
    view = kube.handler[action, kmock.resource(resource)]
    view[len(list(view)) :] << 403 << body


@pytest.mark.parametrize(
    ("action", "resource", "skipped"),
    [
        ("FETCH", "v1/nodes", "skipped (forbidden): nodes (nodes: get)"),
        ("LIST", "v1/events", None),
    ],
)
@pytest.mark.asyncio
async def test_node_reads_are_optional(
    env: Env, capsys: pytest.CaptureFixture[str], action: str, resource: str, skipped: str | None
) -> None:
    """A user who may not read nodes still gets the diagnosis (what was left out is said); events of
    the job's own namespace are required."""
    await oom_pytorchjob(env.cluster)
    forbid(env.kube, getattr(kmock.action, action), resource)
    rc, out, err = await cli(env, capsys, "diagnose", "--job", "train/llama", "--format", "json", "--lang", "en")
    if skipped is None:
        assert rc == 2 and "lacks the RBAC permission events: list (namespace train)" in err, err
        return
    assert rc == 0, err
    assert skipped in err
    assert json.loads(out)["root_cause"]["fault_class"] == "accelerator_oom"


@pytest.mark.parametrize("command", [("diagnose", "--job", "train/llama"), ("scan",)])
@pytest.mark.asyncio
async def test_a_slow_api_does_not_hang_the_command(
    env: Env, capsys: pytest.CaptureFixture[str], command: tuple[str, ...]
) -> None:
    """The API holds every pod list for a minute; with --timeout 1 the command gives up on its own
    (the held answer never arrives: an answer would be an empty list and a different result)."""
    await oom_pytorchjob(env.cluster)
    answered: list[bool] = []

    async def stall() -> dict[str, Any]:
        await asyncio.sleep(60)
        answered.append(True)
        return {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": []}

    view = env.kube.handler[kmock.action.LIST, kmock.resource("v1/pods")]
    view[len(list(view)) :] << (lambda _request: stall())
    rc, out, err = await cli(env, capsys, *command, "--timeout", "1", "--lang", "zh")
    assert not answered
    assert rc == 2 and out == ""
    assert "Kubernetes API 在 1 秒内未响应" in err


async def ray_pods(c: Cluster) -> None:
    """Pods of an owner kind trainmedic has no adapter for (a RayJob): the worker died of a CUDA OOM."""
    await c.add_node("gpu-5", gpus=8)
    owner = {"apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": {"name": "ray", "uid": "0b1c"}}
    pod = await c.create_pod("train", "ray-worker-0", owner=owner, env={"RANK": "3"})
    await c.bind(pod, "gpu-5")
    await c.start(pod)
    c.write_log(pod, "trainer", CUDA_OOM)


@pytest.mark.parametrize(
    ("job", "forbidden", "rc", "expected"),
    [
        pytest.param("ray", False, 0, "accelerator_oom", id="pod-owner"),
        pytest.param("ray-worker-0", False, 0, "accelerator_oom", id="bare-pod"),
        pytest.param("ray", True, 0, "accelerator_oom", id="pod-owner-pytorchjobs-forbidden"),
        pytest.param("nope", True, 2, "pytorchjobs: get", id="not-found-pytorchjobs-forbidden"),
    ],
)
@pytest.mark.asyncio
async def test_pods_of_any_owner(
    env: Env, capsys: pytest.CaptureFixture[str], job: str, forbidden: bool, rc: int, expected: str
) -> None:
    """Pods are found by their owner's (or their own) name; a kind the user may not read does not stop
    that, and names the permission when nothing else has the name."""
    await ray_pods(env.cluster)
    if forbidden:
        forbid(env.kube, kmock.action.FETCH, "kubeflow.org/v1/pytorchjobs")
    code, out, err = await cli(env, capsys, "diagnose", "--job", f"train/{job}", "--format", "json", "--lang", "en")
    assert code == rc, err
    if rc:
        assert expected in err and out == ""
        return
    root = json.loads(out)["root_cause"]
    assert (root["fault_class"], root["node"], root["rank"]) == (expected, "gpu-5", 3)


# -- diagnose --job --save DIR: the agent's bundle of what was read ----------------------------------------

SECRET = "hunter2-very-secret"


async def secret_in_logs(c: Cluster) -> None:
    """A RayJob's worker that printed a password and carries one in its env, then died of a CUDA OOM."""
    await c.add_node("gpu-6", gpus=8)
    owner = {"apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": {"name": "ray", "uid": "0b1d"}}
    pod = await c.create_pod("train", "ray-worker-1", owner=owner, env={"RANK": "2", "DB_PASSWORD": SECRET})
    await c.bind(pod, "gpu-6")
    await c.start(pod)
    c.write_log(pod, "trainer", f"connecting with password={SECRET}", f"{CUDA_OOM} (run token={SECRET})")


SAVED_CASES = [
    (oom_pytorchjob, "train/llama", ("layout/gpu-2/rank1_llama-worker-0_pytorch.previous.log",), "pytorchjob-oom"),
    (xid_job, "train/bert", ("layout/gpu-3/rank0_bert-0-*_trainer.log", "objects/nodes/gpu-3.yaml"), "job-node-xid"),
    (ray_pods, "train/ray", ("layout/gpu-5/rank3_ray-worker-0_trainer.log",), "pod-owner"),
    (
        secret_in_logs,
        "train/ray",
        ("layout/gpu-6/rank2_ray-worker-1_trainer.log", "objects/pods/ray-worker-1.yaml"),
        "secret-redacted",
    ),
]


@pytest.mark.parametrize(("scenario", "job", "files"), [pytest.param(*case[:3], id=case[3]) for case in SAVED_CASES])
@pytest.mark.asyncio
async def test_a_saved_live_scene_gives_the_same_answer(
    env: Env, capsys: pytest.CaptureFixture[str], tmp_path: Path, scenario: Any, job: str, files: tuple[str, ...]
) -> None:
    """`diagnose --job --save DIR` writes the agent's bundle of what it read (per-node layout, manifest,
    objects, events, redacted) and nothing to the cluster; `diagnose --scene DIR` gives the same JSON."""
    await scenario(env.cluster)
    saved = tmp_path / "scene"
    rc, live, err = await cli(env, capsys, "diagnose", "--job", job, "--format", "json", "--save", str(saved))
    assert rc == 0, err
    only_reads(env.kube)
    assert f"scene saved to {saved}" in err
    manifest = json.loads((saved / "manifest.json").read_text())
    paths = {f["path"] for f in manifest["files"]}
    for pattern in files:
        assert fnmatch.filter(paths, pattern), (pattern, sorted(paths))
    assert manifest["job"]["name"] == job.rpartition("/")[2]
    if job == "train/ray":
        assert (manifest["job"]["kind"], manifest["job"]["api_version"]) == ("RayJob", "ray.io/v1")

    rc, again, err = await cli(env, capsys, "diagnose", "--scene", str(saved), "--format", "json")
    assert rc == 0, err
    assert json.loads(again) == json.loads(live)
    assert json.loads(live)["root_cause"] is not None

    assert SECRET not in live
    for path in saved.rglob("*"):
        if path.is_file():
            assert SECRET not in path.read_text(errors="replace"), path


@pytest.mark.parametrize(
    ("argv", "prepare", "expected"),
    [
        pytest.param(("--job", "train/llama"), "non-empty", "exists and is not empty", id="dir-not-empty"),
        pytest.param(("--job", "train/llama"), "a-file", "exists and is not empty", id="dir-is-a-file"),
        pytest.param(("--job", "train/llama"), "bad-name", "a bundle directory's name is letters", id="bad-name"),
        pytest.param(("--logs", "x.log"), None, "--save DIR goes with --job", id="not-live"),
    ],
)
@pytest.mark.asyncio
async def test_save_refuses_what_it_cannot_write(
    env: Env,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    argv: tuple[str, ...],
    prepare: str | None,
    expected: str,
) -> None:
    await oom_pytorchjob(env.cluster)
    saved = tmp_path / ("my scene" if prepare == "bad-name" else "scene")
    if prepare == "non-empty":
        saved.mkdir()
        (saved / "notes.txt").write_text("mine")
    elif prepare == "a-file":
        saved.write_text("mine")
    rc, out, err = await cli(env, capsys, "diagnose", *argv, "--format", "json", "--save", str(saved))
    assert rc == 2 and out == ""
    assert expected in err and "\n" not in err.strip()
    if prepare == "non-empty":
        assert sorted(p.name for p in saved.iterdir()) == ["notes.txt"]
    only_reads(env.kube)


# -- scan: failing training pods that no training workload owns ---------------------------------------------

GPU_SPEC = {"containers": [{"name": "trainer", "image": "registry.example/train:1", "resources": {"limits": {"nvidia.com/gpu": "8"}}}]}  # fmt: skip  # noqa: E501
NPU_SPEC = {"containers": [{"name": "trainer", "image": "registry.example/train:1", "resources": {"requests": {"huawei.com/Ascend910": "8"}}}]}  # fmt: skip  # noqa: E501
WEB_SPEC = {"containers": [{"name": "trainer", "image": "registry.example/web:1"}]}


async def loose_pod(
    c: Cluster,
    name: str,
    *,
    spec: dict[str, Any] | None = None,
    env: dict[str, str] | None = None,
    owner: dict[str, Any] | None = None,
    end: str | None = None,
    log: str = CUDA_OOM,
) -> None:
    """A pod on gpu-4 of no training workload that logged `log`, then crash-looped or Failed (`end`)."""
    await c.add_node("gpu-4", gpus=8)
    pod = await c.create_pod("train", name, owner=owner, env=env, template={"spec": spec or WEB_SPEC})
    await c.bind(pod, "gpu-4")
    await c.start(pod)
    c.write_log(pod, "trainer", "step 1 loss 3.1", log)
    if end == "crashloop":
        await c.terminate(pod, "trainer", reason="Error", exit_code=1, restart=True)
    elif end == "failed":
        await c.terminate(pod, "trainer", reason="Error", exit_code=1)


RAY = {"apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": {"name": "rl", "uid": "7e1f"}, "controller": True}
LOOSE = {
    "bare-gpu-pod-crashloop": (
        dict(name="solo", spec=GPU_SPEC, end="crashloop"),
        ("Pod", "solo", "CrashLoopBackOff", "accelerator_oom"),
    ),
    "bare-npu-pod-failed": (
        dict(name="npu-solo", spec=NPU_SPEC, end="failed"),
        ("Pod", "npu-solo", "Failed (Error, exit code 1)", "accelerator_oom"),
    ),
    "rayjob-pod-with-launcher-env-failed": (
        dict(name="rl-worker-0", env={"WORLD_SIZE": "2", "RANK": "1"}, owner=RAY, end="failed"),
        ("RayJob", "rl", "Failed (Error, exit code 1)", "accelerator_oom"),
    ),
    "gpu-pod-running": (dict(name="solo", spec=GPU_SPEC, end=None), None),
    "web-pod-crashloop": (dict(name="web", spec=WEB_SPEC, end="crashloop", log="panic: boom"), None),
}


@pytest.mark.parametrize(("pod", "expected"), list(LOOSE.values()), ids=list(LOOSE))
@pytest.mark.parametrize("where", [("-n", "train"), ("-A",)])
@pytest.mark.asyncio
async def test_scan_lists_failing_training_pods_no_workload_owns(
    env: Env,
    capsys: pytest.CaptureFixture[str],
    pod: dict[str, Any],
    expected: tuple[str, str, str, str] | None,
    where: tuple[str, ...],
) -> None:
    """A pod no PyTorchJob, MPIJob or Job owns is listed when it fails (Failed, CrashLoopBackOff, a
    restart after a non-zero exit) and is a training pod (requests an accelerator, or carries a
    launcher's env), one entry per owner with its diagnosis; the failed PyTorchJob is listed once."""
    await oom_pytorchjob(env.cluster)
    await loose_pod(env.cluster, **pod)
    rc, out, err = await cli(env, capsys, "scan", *where, "--format", "json", "--lang", "en")
    assert rc == 0, err
    found = {(w["kind"], w["name"]): w for w in json.loads(out)["workloads"]}
    assert ("PyTorchJob", "llama") in found and len([w for w in found if w[1].startswith("llama")]) == 1
    loose = {k: w for k, w in found.items() if k != ("PyTorchJob", "llama")}
    if expected is None:
        assert loose == {}
    else:
        kind, name, state, fault_class = expected
        (w,) = loose.values()
        assert (w["kind"], w["namespace"], w["name"], w["state"], w["pods"]) == (kind, "train", name, state, 1)
        assert w["root_cause"]["fault_class"] == fault_class and w["root_cause"]["node"] == "gpu-4"
        assert w["summary"].startswith(f"{fault_class}: ")
    only_reads(env.kube)


def _status_pod(phase: str, reason: str | None = None, **cs: Any) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": phase, "containerStatuses": [{"name": "trainer", **cs}]}
    if reason:
        status["reason"] = reason
    return {"metadata": {"name": "p"}, "status": status}


@pytest.mark.parametrize(
    ("pod", "expected"),
    [
        pytest.param(
            _status_pod("Running", restartCount=2, lastState={"terminated": {"exitCode": 137}}, state={"running": {}}),
            "Restarting (2 restarts, last exit code 137)",
            id="restarted-after-a-failure",
        ),
        pytest.param(
            _status_pod("Running", restartCount=1, lastState={"terminated": {"exitCode": 0}}, state={"running": {}}),
            None,
            id="restarted-after-success",
        ),
        pytest.param(_status_pod("Failed", "Evicted", restartCount=0), "Failed (Evicted)", id="evicted"),
        pytest.param(
            _status_pod("Running", restartCount=3, state={"waiting": {"reason": "CrashLoopBackOff"}}),
            "CrashLoopBackOff (3 restarts)",
            id="crashloop",
        ),
        pytest.param(_status_pod("Running", restartCount=0, state={"running": {}}), None, id="healthy"),
    ],
)
def test_pod_trouble(pod: dict[str, Any], expected: str | None) -> None:
    from trainmedic.agent.live import pod_trouble

    assert pod_trouble(pod) == expected


@pytest.mark.parametrize(
    ("container", "expected"),
    [
        ({"resources": {"limits": {"cambricon.com/mlu370": "4"}}}, True),
        ({"resources": {"requests": {"nvidia.com/mig-1g.10gb": "1"}}}, True),
        ({"resources": {"limits": {"cpu": "4", "memory": "8Gi"}}}, False),
        ({"env": [{"name": "MASTER_ADDR", "value": "llama-master-0"}]}, True),
        ({"env": [{"name": "HOME", "value": "/root"}]}, False),
    ],
    ids=["cambricon", "nvidia-mig", "cpu-only", "launcher-env", "other-env"],
)
def test_training_pod(container: dict[str, Any], expected: bool) -> None:
    from trainmedic.agent.live import training_pod

    pod = {"spec": {"containers": [{"name": "trainer", **container}]}}
    assert training_pod(pod, plugin_resources={}) is expected
