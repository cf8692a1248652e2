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
from servers.kube import Cluster, KubeEmulator, require_kmock
from servers.tansu import TansuBroker, tansu_binary

ROOT = Path(__file__).resolve().parent.parent
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
            sys.executable, "-m", "agent", "run", "--config", str(self.config), "--role", self.role,
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
