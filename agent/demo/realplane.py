"""`trainmedic demo --cluster real`: the demo's faults on a real Kubernetes control plane.

The plane is agent/demo/plane.py's (what `make cluster` builds: etcd, kube-apiserver with RBAC and
service-account tokens, kube-controller-manager with the Job, garbage collector and node lifecycle
controllers, the stock kube-scheduler, and KWOK playing the kubelets of three NVIDIA nodes with
8 `nvidia.com/gpu` each). It is started once for the run in the work directory, with deploy/'s
namespace, ServiceAccounts and RBAC applied as they ship, and the Volcano Job and PyTorchJob CRDs
where the checkout has them (tests/cluster/crds/).

The agent runs as it is deployed: the cluster role (watchers) with the `trainmedic-cluster`
ServiceAccount's token, the brain (detectors, responder, notifier) with `trainmedic-brain`'s, over
one in-memory bus; each node's kernel log is followed by its node agent's kernel source. Nothing of
the agent is special to the demo but its time scale (scenario.py).

    xid        Xid 79 on one node of a 2-node Job -> quarantine (the real scheduler then keeps new
               pods off it), the Job deleted and recreated from its last complete checkpoint, the
               real Job controller's pods Running on healthy nodes
    node-lost  KWOK stops one node's heartbeat; the real node lifecycle controller marks it
               NotReady and taints it unreachable -> `node_failure`, the same recovery

The training process is played by the demo: it writes the Trainer's lines into the containers' log
(KWOK serves it through the kubelet API) and HF checkpoints into the shared volume. A fault's result
has the fields of the emulator's (`FaultResult`), read from the incident store and the plane.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
import urllib.error
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from trainmedic.agent.demo.logs import HFTrainerLog, xid79_message
from trainmedic.agent.demo.output import Progress
from trainmedic.agent.demo.plane import MAKE_CLUSTER, ROOT, FakeNode, KubePlane, bin_dir, missing
from trainmedic.agent.demo.receiver import WebhookReceiver
from trainmedic.agent.demo.scenario import (
    MOUNT,
    SCENARIOS,
    FaultResult,
    IncidentWatch,
    Scenario,
    collect_incident,
    demo_settings,
    read_reports,
)
from trainmedic.agent.demo.training import NodeKernelLogs, write_hf_checkpoint
from trainmedic.agent.store import IncidentStatus, IncidentStore
from trainmedic.errors import TrainmedicError

__all__ = ["REAL_FAULTS", "RealPlaneDemo", "RealPlaneUnavailable", "run_real_fault", "unavailable_reason"]

log = logging.getLogger("trainmedic.demo")

REAL_FAULTS = ("xid", "node-lost")
NAMESPACE = "training"  # the namespace deploy/training-namespace/role.yaml grants the brain
GPU_NODES = ("gpu-1", "gpu-2", "gpu-3")
TAINT_KEY = "trainmedic.io/unhealthy"
UNREACHABLE = "node.kubernetes.io/unreachable"
SAVE_EVERY = 10
DEPLOY_RBAC = (
    "deploy/namespace.yaml",
    "deploy/rbac-brain.yaml",
    "deploy/rbac-cluster.yaml",
    "deploy/rbac-node.yaml",
    "deploy/training-namespace/role.yaml",
)
CRD_DIR = ROOT / "tests" / "cluster" / "crds"
NODE_LABELS = {
    "node.kubernetes.io/instance-type": "h100x8",
    "nvidia.com/gpu.present": "true",
    "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
    "nvidia.com/gpu.count": "8",
}


class RealPlaneUnavailable(TrainmedicError):
    """The real plane cannot run here (binaries not built, no checkout); the message is in en and zh."""


def unavailable_reason() -> tuple[str, str] | None:
    """Why `--cluster real` cannot run here, in English and Chinese; None when it can."""
    gone = missing()
    if gone:
        return (
            f"the real control plane is not built (missing: {', '.join(gone)}); build it once with "
            f"`{MAKE_CLUSTER}` in the trainmedic checkout (Go; about 10 CPU-minutes), or run the demo "
            "without --cluster real (the emulated cluster needs only Python)",
            f"真实控制面尚未构建（缺少：{', '.join(gone)}）；请在 trainmedic 源码目录执行一次 `{MAKE_CLUSTER}`"
            "（需要 Go，约 10 CPU 分钟），或不带 --cluster real 运行演示（模拟集群只需要 Python）",
        )
    absent = [f for f in DEPLOY_RBAC if not (ROOT / f).is_file()]
    if absent:
        return (
            f"the deploy/ manifests are not here ({', '.join(absent)}): run the demo from a trainmedic checkout",
            f"找不到 deploy/ 清单（{', '.join(absent)}）：请在 trainmedic 源码目录中运行演示",
        )
    return None


def _docs(paths: Sequence[Path]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for p in paths:
        out.extend(d for d in yaml.safe_load_all(p.read_text(encoding="utf-8")) if d)
    return out


@dataclass
class _Agents:
    cluster: Any
    brain: Any
    clients: list[Any]
    tasks: list[asyncio.Task[None]]

    async def stop(self) -> None:
        for a in (self.cluster, self.brain):
            a.stop.set()
        for t in self.tasks:
            done, _ = await asyncio.wait({t}, timeout=15)
            if not done:
                t.cancel()
            await asyncio.gather(t, return_exceptions=True)
        for c in self.clients:
            with contextlib.suppress(Exception):
                c.close()


class RealPlaneDemo:
    """The plane for one demo run; `run_fault` for each fault in turn (the plane reset between)."""

    def __init__(self, workdir: Path, progress: Progress) -> None:
        self.workdir = workdir
        self.progress = progress
        self.plane = KubePlane(
            workdir / "plane", [FakeNode(n, "nvidia.com/gpu", labels=NODE_LABELS) for n in GPU_NODES]
        )

    async def start(self) -> None:
        reason = unavailable_reason()
        if reason is not None:
            raise RealPlaneUnavailable(reason[1] if self.progress.lang == "zh" else reason[0])
        self.progress.plain("real_starting", bin=bin_dir())
        t = time.monotonic()
        try:
            await asyncio.to_thread(self._start)
        except (OSError, RuntimeError, urllib.error.URLError) as e:
            await asyncio.to_thread(self.plane.stop)
            raise RealPlaneUnavailable(f"the real control plane did not start: {e}") from e
        self.progress.plain("real_started", seconds=f"{time.monotonic() - t:.0f}", url=self.plane.url)

    def _start(self) -> None:
        p = self.plane
        p.start()
        p.apply([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}])
        p.apply(_docs([ROOT / f for f in DEPLOY_RBAC]))
        crds = sorted(CRD_DIR.glob("*.yaml")) if CRD_DIR.is_dir() else []
        if crds:
            p.install_crds(crds)

    async def stop(self) -> None:
        await asyncio.to_thread(self.plane.stop)

    # -- one fault ---------------------------------------------------------------------------------

    async def run_fault(
        self, fault: str, workdir: Path, *, receiver: WebhookReceiver | None, result: FaultResult
    ) -> None:
        sc = SCENARIOS[fault]
        secret = secrets.token_hex(16)
        if receiver is not None:
            receiver.secret = secret.encode()
        mark = receiver.mark() if receiver is not None else 0
        settings, webhooks_off = demo_settings(
            workdir, receiver_url=receiver.url if receiver is not None else None, secret=secret
        )
        # Container logs are read for the scene (through the API server and KWOK), not followed.
        settings = settings.model_copy(
            update={"kubernetes": settings.kubernetes.model_copy(update={"follow_pod_logs": False})}
        )
        shared = workdir / "shared-volume"
        shared.mkdir(parents=True, exist_ok=True)
        kernels = NodeKernelLogs(workdir / "nodes", list(GPU_NODES))
        agents = await self._start_agents(settings, kernels)
        store = IncidentStore(settings.remediate.store)
        watch = IncidentWatch(store, sc.job, self.progress)
        stop = asyncio.Event()
        poller = asyncio.create_task(_poll(watch, stop), name="demo:watch")
        p = self.progress
        try:
            p.line("real_cluster", n=len(GPU_NODES), version=bin_dir().parent.name)
            if webhooks_off is None and receiver is not None:
                p.line("webhook_sink", url=receiver.url)
            else:
                result.warnings.append(f"webhooks off: {webhooks_off}")
                p.line("no_notify", why=webhooks_off)
            job, nodes = await self._start_job(sc, shared, agents)
            t0, bad = await self._inject(sc, job, nodes, kernels, shared)
            result.detect_ms = None
            new, new_nodes = await self._until_healed(sc, job, watch, bad)
            recovered = time.time()
            resumed = self._resume(sc, new_nodes, shared)
            p.line("rescheduled", at=recovered, nodes=", ".join(new_nodes))
            p.line("resumed", at=time.time(), checkpoint=f"checkpoint-{resumed - 1}", step=resumed,
                   nodes=", ".join(new_nodes))  # fmt: skip
            watch.poll()
            await _flush(agents.brain)
            watch.poll()
            quarantined = await asyncio.to_thread(self._quarantined)
            self._collect(sc, watch, result, new, new_nodes, bad, quarantined)
            result.resumed_step = resumed
            result.recover_ms = (recovered - t0) * 1000
            if watch.first_detected is not None:
                result.detect_ms = max(0.0, (watch.first_detected - t0) * 1000)
            if receiver is not None and webhooks_off is None:
                got = receiver.since(mark)
                result.webhooks_delivered = len(got)
                checked = [d.verified for d in got if d.verified is not None]
                result.webhooks_verified = sum(1 for v in checked if v) if checked else None
                p.line("webhooks_total", n=len(got))
            await read_reports(store, p, result)
        finally:
            stop.set()
            await asyncio.gather(poller, return_exceptions=True)
            await agents.stop()
            store.close()
            try:
                await self._release()
                await asyncio.to_thread(self._reset, sc)
            except Exception as e:  # noqa: BLE001 (the next fault says what it finds; this result stands)
                log.warning("demo: resetting the real plane after %s failed: %s", sc.fault, e)
                result.warnings.append(f"the plane was not reset after the fault: {e}")

    async def _start_agents(self, settings: Any, kernels: NodeKernelLogs) -> _Agents:
        from trainmedic.agent.bus.memory import MemoryBus
        from trainmedic.agent.config import Role
        from trainmedic.agent.run import build_agent, run_agent

        p = self.plane
        bus = MemoryBus(partitions=4)
        brain_token = await asyncio.to_thread(p.service_account_token, "trainmedic", "trainmedic-brain")
        cluster_token = await asyncio.to_thread(p.service_account_token, "trainmedic", "trainmedic-cluster")
        brain_api, cluster_api = p.api_client(brain_token), p.api_client(cluster_token)
        cluster = build_agent(
            settings.model_copy(update={"node_name": "trainmedic-cluster"}), Role.CLUSTER, bus=bus,
            api_client=cluster_api,
        )  # fmt: skip
        brain = build_agent(
            settings.model_copy(update={"node_name": "trainmedic-brain"}), Role.BRAIN, bus=bus, api_client=brain_api
        )
        if brain.responder is None:
            raise RuntimeError(f"the responder is off: {brain.disabled.get('responder', 'unknown reason')}")
        # Each node's kernel log, followed as its node agent does (jobs on a node from the watchers' index).
        cluster.components.update(
            kernels.sources(bus=bus, job_index=cluster.job_index, telemetry=cluster.telemetry, poll_interval=0.05)
        )
        tasks = [
            asyncio.create_task(run_agent(a, drain_timeout_s=10), name=f"demo:{a.role.value}") for a in (cluster, brain)
        ]
        agents = _Agents(cluster, brain, [brain_api, cluster_api], tasks)
        try:
            async with asyncio.timeout(30):
                await brain.responder.ready.wait()
                if brain.brain is not None:
                    await brain.brain.ready.wait()
        except BaseException:
            await agents.stop()
            raise
        return agents

    def _job_body(self, sc: Scenario) -> dict[str, Any]:
        """An Indexed batch/v1 Job, 2 pods x 8 GPUs, LLaMA-Factory under torchrun (the emulator's job,
        without the shared volume: the plane has no storage; the agent maps the mount to the demo's)."""
        container = {
            "name": "trainer",
            "image": "registry.example.com/llamafactory:0.9.1-cu124",
            "command": ["torchrun", "--nnodes=2", "--nproc-per-node=8", "--rdzv-backend=c10d", "src/train.py"],
            "args": [f"examples/train_full/{sc.job}.yaml"],
            "env": [{"name": "NCCL_DEBUG", "value": "INFO"}],
            "resources": {"limits": {"nvidia.com/gpu": "8"}, "requests": {"nvidia.com/gpu": "8"}},
        }
        return {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {
                "name": sc.job,
                "namespace": NAMESPACE,
                "annotations": {
                    "trainmedic.io/checkpoint-dir": sc.profile.checkpoint_dir,
                    "trainmedic.io/resume-args": "--resume_from_checkpoint {checkpoint}",
                },
            },
            "spec": {
                "completions": 2,
                "parallelism": 2,
                "completionMode": "Indexed",
                "backoffLimit": 0,
                "template": {
                    "metadata": {"labels": {"app": sc.job}},
                    "spec": {
                        "restartPolicy": "Never",
                        "terminationGracePeriodSeconds": 0,
                        "nodeSelector": {"nvidia.com/gpu.present": "true"},
                        "containers": [container],
                    },
                },
            },
        }

    async def _start_job(self, sc: Scenario, shared: Path, agents: _Agents) -> tuple[dict[str, Any], list[str]]:
        p = self.plane
        body = self._job_body(sc)
        job = dict(await asyncio.to_thread(p.request, "POST", f"/apis/batch/v1/namespaces/{NAMESPACE}/jobs", body))
        nodes = await _until(f"the job {sc.job} Running", lambda: self._running_on(job, 2), 90)
        self.progress.line("job_running", job=f"Job (batch/v1) {NAMESPACE}/{sc.job}", nodes=", ".join(nodes))
        # The training process: the Trainer's lines in the containers' log, checkpoints on the volume.
        root = shared / sc.job
        hf = HFTrainerLog()
        now = time.time()
        for rank, n in enumerate(nodes):
            for line in (*hf.nccl_init(n, rank, now), *hf.banner(16, now)):
                p.write_log(n, line)
        saved = []
        for step in range(1, 2 * SAVE_EVERY + 4):
            for n in nodes:
                p.write_log(n, hf.step(step))
            if step % SAVE_EVERY == 0:
                write_hf_checkpoint(root, step, max_steps=hf.total_steps, save_steps=SAVE_EVERY)
                for line in (*hf.saving(f"{MOUNT}/{sc.job}/checkpoint-{step}", now), *hf.saved("x", now)):
                    p.write_log(nodes[0], line)
                saved.append(f"checkpoint-{step}")
        # The agent must know the pods' nodes before a kernel line can name the job.
        await _until(
            "the agent indexing the job's pods",
            lambda: all(any(j.name == sc.job for j in agents.cluster.job_index.jobs_on_node(n)) for n in nodes),
            30,
            blocking=False,
        )
        self.progress.line("training", step=2 * SAVE_EVERY + 3, checkpoints=", ".join(saved))
        return job, nodes

    async def _inject(
        self, sc: Scenario, job: dict[str, Any], nodes: list[str], kernels: NodeKernelLogs, shared: Path
    ) -> tuple[float, str]:
        p, bad = self.plane, nodes[1]
        t0 = time.time()
        self.progress.t0 = t0
        if sc.fault == "xid":
            # The GPU falls off the bus while checkpoint-30 is written: the save never completes.
            write_hf_checkpoint(shared / sc.job, 3 * SAVE_EVERY, max_steps=3000, save_steps=SAVE_EVERY, cut=True)
            kernels.write(bad, xid79_message("0000:3b:00", 57))
            what = (
                f"Xid 79 on {bad} (GPU 0000:3b:00 has fallen off the bus) while checkpoint-30 was being written",
                f"{bad} 上出现 Xid 79（GPU 0000:3b:00 掉卡），此时正在写 checkpoint-30",
            )
        else:
            await asyncio.to_thread(p.lose_node, bad)
            what = (
                f"{bad} stops answering (KWOK stops its heartbeat): the node lifecycle controller marks it"
                " NotReady and taints it unreachable",
                f"{bad} 失联（KWOK 停止心跳）：节点生命周期控制器将其标记为 NotReady 并打上 unreachable 污点",
            )
        self.progress.line("injected", at=t0, what=what[1] if self.progress.lang == "zh" else what[0])
        return t0, bad

    async def _until_healed(
        self, sc: Scenario, old: dict[str, Any], watch: IncidentWatch, bad: str
    ) -> tuple[dict[str, Any], list[str]]:
        """Until the incident is finished and the replacement Job's pods run (on healthy nodes)."""
        old_uid = old["metadata"]["uid"]

        def replacement() -> tuple[dict[str, Any], list[str]] | None:
            new = self._get_job(sc.job)
            if new is None or new["metadata"]["uid"] == old_uid:
                return None
            nodes = self._running_on(new, 2)
            return (new, nodes) if nodes else None

        deadline = time.monotonic() + 150
        while time.monotonic() < deadline:
            finished = watch.terminal()  # the store is read on the loop's thread only
            if finished:
                last = finished[-1]
                if last.status is not IncidentStatus.RESOLVED or not any(
                    a.name == "restart_from_checkpoint" for a in last.actions
                ):
                    raise RuntimeError(f"incident {last.id[:8]} ended {last.status.value} without a restart")
                found = await asyncio.to_thread(replacement)
                if found is not None:
                    return found
            await asyncio.sleep(0.2)
        raise RuntimeError("timed out after 150 s waiting for the job to resume")

    def _resume(self, sc: Scenario, nodes: list[str], shared: Path) -> int:
        """The replacement's training process resumes from the last complete checkpoint."""
        hf = HFTrainerLog()
        step = 2 * SAVE_EVERY
        for n in nodes:
            for line in hf.resume(f"{MOUNT}/{sc.job}/checkpoint-{step}", step, time.time()):
                self.plane.write_log(n, line)
            for s in range(step + 1, step + 4):
                self.plane.write_log(n, hf.step(s))
        return step + 1

    # -- reading the plane -------------------------------------------------------------------------

    def _get_job(self, name: str) -> dict[str, Any] | None:
        try:
            return dict(self.plane.request("GET", f"/apis/batch/v1/namespaces/{NAMESPACE}/jobs/{name}"))
        except urllib.error.HTTPError as e:
            if e.code == 404:
                return None
            raise

    def _running_on(self, job: dict[str, Any], n: int) -> list[str] | None:
        uid = job["metadata"]["uid"]
        out = self.plane.request(
            "GET", f"/api/v1/namespaces/{NAMESPACE}/pods?labelSelector=batch.kubernetes.io/controller-uid={uid}"
        )
        running = [
            p
            for p in out["items"]
            if not p["metadata"].get("deletionTimestamp") and (p.get("status") or {}).get("phase") == "Running"
        ]
        if len(running) < n:
            return None
        return sorted(str(p["spec"]["nodeName"]) for p in running)

    def _quarantined(self) -> list[str]:
        out = []
        for n in GPU_NODES:
            taints = (self.plane.node(n).get("spec") or {}).get("taints") or []
            if any(t.get("key") == TAINT_KEY for t in taints):
                out.append(n)
        return out

    def _collect(
        self,
        sc: Scenario,
        watch: IncidentWatch,
        r: FaultResult,
        new: dict[str, Any],
        nodes: list[str],
        bad: str,
        quarantined: list[str],
    ) -> None:
        """The result fields, read from the store and the plane (as the emulator demo's `_collect`)."""
        last = collect_incident(watch, self.progress, r)
        if last is None:
            return
        r.quarantined_nodes = quarantined
        r.rescheduled_to = nodes
        r.healed = bool(nodes) and bad not in nodes
        expected = f"{sc.profile.checkpoint_dir}/checkpoint-{2 * SAVE_EVERY}"
        if last.fault_class != sc.fault_class:
            r.problems.append(f"diagnosed {last.fault_class} {last.code}, expected {sc.fault_class}")
        if last.node != bad:
            r.problems.append(f"the incident names node {last.node}, the fault was on {bad}")
        if last.status is not IncidentStatus.RESOLVED:
            r.problems.append(f"incident {last.id[:8]} ended {last.status.value}")
        if bad not in r.quarantined_nodes:
            r.problems.append(f"node {bad} was not quarantined")
        if not r.healed:
            r.problems.append("the job did not resume on healthy nodes")
        if r.checkpoint != expected:
            r.problems.append(f"resumed from {r.checkpoint}, expected the last complete checkpoint {expected}")
        ann = (new["metadata"].get("annotations") or {}).get("trainmedic.io/incident")
        if ann != last.id:
            r.problems.append(f"the replacement Job is not marked with incident {last.id[:8]} ({ann})")

    async def _release(self) -> None:
        """Our quarantines undone, as `trainmedic release-node` does (taint, label, annotations,
        condition, cordon), so that the next fault starts on three schedulable nodes."""
        from trainmedic.remediations.kube import KubeOps

        api = self.plane.api_client()
        ops = KubeOps(api)
        try:
            for n in GPU_NODES:
                await ops.release_node(n)
        finally:
            ops.close()
            api.close()

    def _reset(self, sc: Scenario) -> None:
        """Back to three healthy nodes and no job for the next fault: the job deleted, KWOK plays every
        node again (its addresses posted again), the pods gone."""
        p = self.plane
        with contextlib.suppress(urllib.error.HTTPError):
            p.request(
                "DELETE", f"/apis/batch/v1/namespaces/{NAMESPACE}/jobs/{sc.job}", {"propagationPolicy": "Background"}
            )
        for n in GPU_NODES:
            p.revive_node(n)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            pods = p.request("GET", f"/api/v1/namespaces/{NAMESPACE}/pods")["items"]
            nodes = [p.node(n) for n in GPU_NODES]
            if (
                not pods
                and all(p.node_ready(n) for n in GPU_NODES)
                and not any((x.get("spec") or {}).get("taints") for x in nodes)
                and all((x.get("status") or {}).get("addresses") for x in nodes)
            ):
                return
            for x in nodes:
                if not (x.get("status") or {}).get("addresses") and p.node_ready(x["metadata"]["name"]):
                    # KWOK does not post a revived node's addresses again, as a kubelet does on start.
                    name = x["metadata"]["name"]
                    addresses = [{"type": "InternalIP", "address": "127.0.0.1"}, {"type": "Hostname", "address": name}]
                    with contextlib.suppress(urllib.error.HTTPError):
                        p.request(
                            "PATCH",
                            f"/api/v1/nodes/{name}/status",
                            {"status": {"addresses": addresses}},
                            content_type="application/merge-patch+json",
                        )
            time.sleep(0.3)
        log.warning("demo: the real plane did not settle after %s", sc.fault)


async def _until(what: str, predicate: Any, timeout: float, *, blocking: bool = True) -> Any:
    """Poll `predicate` (in a thread when it blocks) until it is truthy."""
    deadline = time.monotonic() + timeout
    while True:
        value = await asyncio.to_thread(predicate) if blocking else predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout:g} s waiting for {what}")
        await asyncio.sleep(0.2)


async def _poll(watch: IncidentWatch, stop: asyncio.Event) -> None:
    while not stop.is_set():
        try:
            watch.poll()
        except Exception:  # a read racing the agent's write: the next round sees it
            log.debug("incident watch", exc_info=True)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(0.1):
                await stop.wait()


async def _flush(agent: Any) -> None:
    notifier = getattr(agent, "notifier", None)
    if notifier is None or not hasattr(notifier, "flush"):
        return
    try:
        await notifier.flush(5.0)
    except Exception:  # undelivered notices stay in the outbox; the receiver's count says so
        log.warning("demo: flushing notifications failed", exc_info=True)


async def run_real_fault(
    demo: RealPlaneDemo,
    fault: str,
    workdir: Path,
    progress: Progress,
    *,
    receiver: WebhookReceiver | None = None,
    timeout_s: float = 240.0,
) -> FaultResult:
    """One fault on the real plane, end to end; never raises for what went wrong in the run."""
    from trainmedic.agent.demo.scenario import conclude

    sc = SCENARIOS[fault]
    result = FaultResult(fault=fault, workdir=str(workdir))
    workdir.mkdir(parents=True, exist_ok=True)
    progress.t0 = None
    progress.heading("header", fault=fault, title=sc.title[1] if progress.lang == "zh" else sc.title[0])
    try:
        await asyncio.wait_for(demo.run_fault(fault, workdir, receiver=receiver, result=result), timeout_s)
    except TimeoutError:
        result.problems.append(f"not done within {timeout_s:g} s")
    except Exception as e:  # the demo reports what broke, as a problem of this fault, not a traceback
        log.debug("demo %s failed", fault, exc_info=True)
        result.problems.append(f"{type(e).__name__}: {e}")
    result.ok = not result.problems
    conclude(result, progress)
    return result
