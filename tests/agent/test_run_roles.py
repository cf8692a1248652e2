"""`trainmedic run` as real processes, from a config file, against the emulated API server.

* `--role all`: one process, memory bus: container logs (CRI files), kernel lines (a kern.log), pod
  statuses (kmock, the test playing kubelet) reach the brain, which logs its diagnosis.
* `--role node`, `--role cluster`, `--role brain`: three processes around the real Kafka-protocol
  broker (tansu); the same faults reach the brain through Kafka.

The agent writes JSON log lines on stderr; the test reads them to see what it concluded, and
SIGTERM must stop every process cleanly (exit 0).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import yaml
from paths import ROOT
from servers.kube import Cluster, KubeEmulator, require_kmock
from servers.tansu import TansuBroker, tansu_binary

XID79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid=2876, name=python, GPU has fallen off the bus."
WATCHDOG = (
    "[rank1]:[E1206 18:44:12.755262105 ProcessGroupNCCL.cpp:607] [Rank 1] Watchdog caught collective operation "
    "timeout: WorkNCCL(SeqNum=7753, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for "
    "600099 milliseconds before timing out."
)


class AgentProcess:
    """`trainmedic run` in a subprocess; its JSON log lines collected as they come."""

    def __init__(self, name: str, config: Path, role: str, node: str) -> None:
        self.name, self.config, self.role, self.node = name, config, role, node
        self.proc: asyncio.subprocess.Process | None = None
        self.records: list[dict[str, Any]] = []
        self._reader: asyncio.Task[None] | None = None

    async def start(self) -> None:
        env = dict(os.environ, TRAINMEDIC_NODE_NAME=self.node, PYTHONUNBUFFERED="1")
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "trainmedic.agent", "run", "--config", str(self.config), "--role", self.role,
            cwd=ROOT, env=env, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        async for raw in self.proc.stderr:
            line = raw.decode(errors="replace").strip()
            try:
                rec = json.loads(line)
            except ValueError:
                rec = {"message": line, "level": "raw"}
            if isinstance(rec, dict):
                self.records.append(rec)

    def messages(self) -> list[str]:
        return [str(r.get("message", "")) for r in self.records]

    async def wait_message(self, needle: str, timeout: float = 60) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for m in self.messages():
                if needle in m:
                    return m
            assert self.proc is not None
            if self.proc.returncode is not None:
                break
            await asyncio.sleep(0.1)
        tail = "\n".join(self.messages()[-30:])
        raise AssertionError(f"{self.name}: no log line with {needle!r} within {timeout} s; last lines:\n{tail}")

    async def stop(self) -> int:
        assert self.proc is not None
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            rc = await asyncio.wait_for(self.proc.wait(), 30)
        except TimeoutError:
            self.proc.kill()
            rc = await self.proc.wait()
        if self._reader is not None:
            await asyncio.wait_for(self._reader, 5)
        return rc


def _kubeconfig(path: Path, url: str) -> Path:
    cfg = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "kmock", "cluster": {"server": url}}],
        "users": [{"name": "test", "user": {"token": "test-token"}}],
        "contexts": [{"name": "kmock", "context": {"cluster": "kmock", "user": "test"}}],
        "current-context": "kmock",
    }
    path.write_text(yaml.safe_dump(cfg))
    return path


async def _has_open(pid: int, path: Path, timeout: float = 60.0) -> None:
    """Wait until process `pid` holds `path` open (/proc/<pid>/fd)."""
    deadline = time.monotonic() + timeout
    target = str(path.resolve())
    while time.monotonic() < deadline:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            fds = []
        for fd in fds:
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") == target:
                    return
            except OSError:
                continue
        await asyncio.sleep(0.05)
    raise AssertionError(f"process {pid} never opened {path}")


def _config(path: Path, settings: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(settings))
    return path


def _cri(path: Path, *lines: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime())
    with path.open("a") as f:
        for line in lines:
            f.write(f"{stamp}.000000000Z stderr F {line}\n")


@pytest_asyncio.fixture
async def cluster() -> AsyncIterator[tuple[KubeEmulator, Cluster]]:
    require_kmock()
    async with KubeEmulator() as kube:
        yield kube, Cluster(kube)


async def _training_job(cluster: Cluster) -> list[dict[str, Any]]:
    await cluster.add_node("gpu-node-a", gpus=8)
    await cluster.add_node("gpu-node-b", gpus=8)
    job = await cluster.create_job("train", "llama", completions=2)
    pods = await cluster.create_job_pods(job)
    for pod, node in zip(pods, ["gpu-node-a", "gpu-node-b"], strict=True):
        await cluster.bind(pod, node)
        await cluster.start(pod)
    return pods


def _base_settings(tmp: Path, kubeconfig: Path) -> dict[str, Any]:
    return {
        "log_format": "json",
        "kubernetes": {"kubeconfig": str(kubeconfig), "workloads": True},
        "logs": {"root": str(tmp / "pods"), "start_at": "start", "position_store": None, "poll_interval_s": 0.2},
        "kernel": {"source": "file", "path": str(tmp / "kern.log"), "position_store": None},
        "metrics": {"nvml": False},
        "detect": {"window_s": 3},
        "remediate": {"store": str(tmp / "trainmedic.db"), "scene_dir": str(tmp / "scenes"), "log_lines": 1000},
    }


@pytest.mark.asyncio
@pytest.mark.timeout(180)
async def test_role_all_from_a_config_file(tmp_path: Path, cluster: tuple[KubeEmulator, Cluster]) -> None:
    kube, c = cluster
    pods = await _training_job(c)
    (tmp_path / "kern.log").write_text("")
    (tmp_path / "pods").mkdir()
    settings = _base_settings(tmp_path, _kubeconfig(tmp_path / "kubeconfig", kube.url))
    agent = AgentProcess("all", _config(tmp_path / "trainmedic.yaml", settings), "all", "gpu-node-a")
    await agent.start()
    try:
        await agent.wait_message("trainmedic all running")
        assert not any(r.get("level") == "error" for r in agent.records), agent.messages()
        # A peer's collective timeout in its container log (CRI file of pod 1 on this node)...
        meta = pods[1]["metadata"]
        _cri(tmp_path / "pods" / f"train_{meta['name']}_{meta['uid']}" / "trainer" / "0.log", "step 10", WATCHDOG)
        await agent.wait_message("hang nccl_watchdog")
        # ... then the Xid 79 that explains it, in the kernel log of node a.
        with (tmp_path / "kern.log").open("a") as f:
            f.write(f"Nov 21 02:00:00 gpu-node-a kernel: [12345.678901] {XID79}\n")
        line = await agent.wait_message("device_error xid:79 on gpu-node-a")
        assert "for job:train/llama" in line
        await agent.wait_message("(final)")
        # The shipped policy is dry-run: the plan is recorded, nothing is changed.
        assert "observed" in await agent.wait_message("incident ")
        assert not any((n.get("spec") or {}).get("unschedulable") for n in kube.objects("v1/nodes"))
        # A pod killed for memory is seen through the API (the test plays kubelet).
        await c.terminate(pods[0], "trainer", reason="OOMKilled", exit_code=137, restart=True)
        await agent.wait_message("host_oom")
    finally:
        rc = await agent.stop()
    assert rc == 0
    assert any("stopped" in m for m in agent.messages())


@pytest.mark.asyncio
@pytest.mark.timeout(240)
async def test_node_cluster_brain_roles_over_kafka(tmp_path: Path, cluster: tuple[KubeEmulator, Cluster]) -> None:
    if tansu_binary() is None:
        if os.environ.get("CI", "").lower() not in ("", "0", "false"):
            pytest.fail("CI is set but the tansu broker binary is missing")
        pytest.skip("tansu broker binary not installed")
    kube, c = cluster
    pods = await _training_job(c)
    (tmp_path / "kern.log").write_text("")
    (tmp_path / "pods").mkdir()
    with TansuBroker() as broker:
        settings = _base_settings(tmp_path, _kubeconfig(tmp_path / "kubeconfig", kube.url))
        settings["bus"] = {"kind": "kafka", "bootstrap": broker.bootstrap, "partitions": 4}
        config = _config(tmp_path / "trainmedic.yaml", settings)
        procs = [
            AgentProcess("brain", config, "brain", "brain-0"),
            AgentProcess("cluster", config, "cluster", "cluster-0"),
            AgentProcess("node", config, "node", "gpu-node-a"),
        ]
        for p in procs:
            await p.start()
        brain, cluster_role, node = procs
        try:
            for p in procs:
                await p.wait_message(f"trainmedic {p.role} running")
            assert "kubernetes" in await node.wait_message("running")
            with (tmp_path / "kern.log").open("a") as f:
                f.write(f"Nov 21 02:00:00 gpu-node-a kernel: [12345.678901] {XID79}\n")
            line = await brain.wait_message("device_error xid:79 on gpu-node-a", timeout=90)
            assert "for job:train/llama" in line
            # Once that window is closed, a new fault opens a new diagnosis (within the window it
            # would be evidence of the same incident, and the Xid would stay the root cause).
            await brain.wait_message("(final)")
            await c.terminate(pods[0], "trainer", reason="OOMKilled", exit_code=137, restart=True)
            try:
                await brain.wait_message("host_oom", timeout=60)
            except AssertionError as e:
                raise AssertionError(f"{e}\ncluster role said:\n" + "\n".join(cluster_role.messages()[-20:])) from None
        finally:
            codes = [await p.stop() for p in reversed(procs)]
    assert codes == [0, 0, 0], [p.messages()[-10:] for p in procs]
    assert cluster_role.records


@pytest.mark.asyncio
@pytest.mark.timeout(180)
async def test_agent_killed_between_delete_and_create_recreates_the_job_exactly_once(
    tmp_path: Path, cluster: tuple[KubeEmulator, Cluster]
) -> None:
    """SIGKILL while the agent's DELETE of the job is in flight (the API server completes it): the
    restarted agent finds `deleting` in its journal and creates the replacement, once."""
    import kmock

    kube, c = cluster
    await _training_job(c)
    ckpt = tmp_path / "ckpt" / "checkpoint-400"
    ckpt.mkdir(parents=True)
    (ckpt / "trainer_state.json").write_text('{"global_step": 400}')
    (ckpt / "pytorch_model.bin").write_bytes(b"\x01" * 1024)
    await c.patch(
        "batch/v1/jobs",
        "train",
        "llama",
        {"metadata": {"annotations": {"trainmedic.io/checkpoint-dir": str(ckpt.parent)}}},
    )
    policy = yaml.safe_load((ROOT / "remediations" / "policy.yaml").read_text())
    policy["circuit_breaker"]["max_share"] = 0.5
    (tmp_path / "policy.yaml").write_text(yaml.safe_dump(policy))
    (tmp_path / "kern.log").write_text("")
    (tmp_path / "pods").mkdir()
    settings = _base_settings(tmp_path, _kubeconfig(tmp_path / "kubeconfig", kube.url))
    settings["detect"] = {"window_s": 1}
    settings["remediate"].update(mode="enforce", policy=str(tmp_path / "policy.yaml"), wait_gone_s=10)
    config = _config(tmp_path / "trainmedic.yaml", settings)

    first = AgentProcess("all", config, "all", "gpu-node-a")
    killed: list[float] = []

    def kill_on_delete(_request: Any) -> None:
        if not killed and first.proc is not None:
            os.kill(first.proc.pid, signal.SIGKILL)
            killed.append(time.time())
        # None: kmock records the request and goes on serving it, so the deletion happens.

    kube.handler[kmock.action.DELETE, kmock.resource("batch/v1/jobs")] << kill_on_delete
    await first.start()
    await first.wait_message("trainmedic all running")
    # The kernel source starts at the end of the file: write the fault once the agent has it open.
    assert first.proc is not None
    await _has_open(first.proc.pid, tmp_path / "kern.log")
    with (tmp_path / "kern.log").open("a") as f:
        f.write(f"Nov 21 02:00:00 gpu-node-a kernel: [12345.678901] {XID79}\n")
    assert first.proc is not None
    assert await asyncio.wait_for(first.proc.wait(), 60) == -signal.SIGKILL
    assert killed
    assert not [j for j in kube.objects("batch/v1/jobs") if j["metadata"]["name"] == "llama"], "deleted, not recreated"
    creates_before = len(kube.requests("batch/v1/jobs", action="create"))

    second = AgentProcess("all", config, "all", "gpu-node-a")
    await second.start()
    try:
        await second.wait_message("resuming incident")
        deadline = time.monotonic() + 30
        while not [j for j in kube.objects("batch/v1/jobs") if j["metadata"]["name"] == "llama"]:
            assert time.monotonic() < deadline, second.messages()[-20:]
            await asyncio.sleep(0.1)
        await second.wait_message("recreated from")
    finally:
        assert await second.stop() == 0
    [job] = [j for j in kube.objects("batch/v1/jobs") if j["metadata"]["name"] == "llama"]
    annotations = job["metadata"]["annotations"]
    assert annotations["trainmedic.io/resumed-from"] == str(ckpt)
    assert annotations["trainmedic.io/incident"]
    assert len(kube.requests("batch/v1/jobs", action="create")) - creates_before == 1
