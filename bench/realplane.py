"""Self-healing figures on the real control plane (`make bench` merges them into its JSON).

    python -m bench.realplane [--repetitions 5] [--no-node-lost] [--churn 1000]
                              [--scale-nodes 1000] [--scale-pods 5000]

The plane is tests/servers/kubeplane.py's `KubePlane` (etcd, kube-apiserver with RBAC,
kube-controller-manager, kube-scheduler, one KWOK process per fake node: four with 8
`nvidia.com/gpu`, two with 8 `huawei.com/Ascend910`), started once in a temporary directory with
the shipped deploy/ RBAC applied as is and the Volcano Job and PyTorchJob CRDs installed
(tests/cluster/crds/). The agent is wired as tests/realplane/plane.py wires it: the cluster role
(watchers) as the `trainmedic-cluster` ServiceAccount and the brain as `trainmedic-brain`, each with
its own token, over one in-memory bus, the shipped policy in enforce mode. Everything (plane,
agent, this process) shares the machine.

* `real_fault_to_pods_running_p50_s` / `_p99_s`: a 2-pod Indexed batch/v1 Job with an HF Trainer
  checkpoint Running on two GPU nodes; the node agent's Xid 79 kernel line about the pod of index 0
  is published on the bus (time 0); the figure ends when the replacement Job (new uid, same name)
  has 2 pods Running (KWOK reports them) on nodes other than the faulty one. On the way: diagnosis,
  scene bundle, quarantine (taint + cordon), delete and wait for the old Job, recreate from the
  checkpoint, the real Job controller's pods, the real scheduler, KWOK. `--repetitions` incidents,
  each with a clean plane and a fresh agent (store, scene directory); `real_fault_to_pods_running_runs_s`
  holds every run. With few repetitions p99 is the slowest run.
* `real_node_lost_to_pods_running_s`: the same Job; the KWOK process playing the kubelet of the
  pod-0 node is stopped (time 0; no more lease renewals or status). The node lifecycle controller
  marks the node NotReady and taints it unreachable after its grace period, the agent's watchers
  report it (`node_failure`), the Job is brought back elsewhere; the figure ends when the new
  Job's 2 pods are Running on other nodes. It is dominated by the node lifecycle controller's
  settings, reported alongside (`real_node_lost_settings`: the plane's short test settings, not a
  production cluster's 40 s default grace period).
* `agent_watch_events_per_s`: the cluster role's Kubernetes watchers (`KubeWatchers` as
  `trainmedic-cluster`: pods, events, nodes, workloads, cluster-wide) while `--churn` pods and as
  many core/v1 Events are created in the training namespace by 8 threads (admin clients, one
  watch event each: the pods are bound to no node and name a scheduler that does not exist, so
  nothing else touches them). From the first write to both the pods' and the events' watch having
  passed the resourceVersion of its last write. The writers share the 2 cores with the API server
  and the watchers, so the figure is the churn the watchers kept up with, bounded by what the
  writers could produce: `agent_watch_lag_s` (last write to caught up) near zero means the
  watchers were not the limit.

* `agent_rss_mb_5000_pods` and `agent_watch_events_per_s_5000_pods`, on a plane of their own:
  `--scale-nodes` (1,000) KWOK nodes played by one KWOK process, with a production cluster's node
  settings (`scale_node_settings`: 40 s leases, 50 s grace period) since a lease renewal per node
  every second would not fit the machine, and `--scale-pods` (5,000) running training pods (a
  PyTorchJob worker's labels and env, ~4 KB each), bound to their nodes at creation (through the
  scheduler the setup would measure the scheduler) and made Running by KWOK. The RSS figure is
  the VmRSS of `trainmedic run --role all` (the all-in-one deployment: memory bus, its
  ServiceAccount and ClusterRole from deploy/all-in-one/) in its own process, the largest sample
  once it has listed and watched everything and again after `--churn` pods and Events more
  (sampled each second until it stops growing). The watch figure is `agent_watch_events_per_s`'s
  measurement on that plane: the watchers first list the 5,000 pods and 1,000 nodes.

Where the plane's binaries are missing (`make cluster` builds them), the figures are null and
`realplane_error` says why; any other failure is reported the same way, so that the rest of
`make bench` keeps its figures.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
for _p in (ROOT, ROOT / "tests"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

from servers import kubeplane  # noqa: E402

SCALE_FIGURES = ("agent_rss_mb_5000_pods", "agent_watch_events_per_s_5000_pods")
FIGURES = (
    "real_fault_to_pods_running_p50_s",
    "real_fault_to_pods_running_p99_s",
    "real_node_lost_to_pods_running_s",
    "agent_watch_events_per_s",
    *SCALE_FIGURES,
)
WRITERS = 8
TRAINING_NS = "training"
POLL_S = 0.05  # how often the end condition is polled (one GET of the job's pods)


def _log(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def _pct(values: list[float], q: float) -> float:
    """The q-th percentile (nearest rank): with fewer than 100 runs p99 is the slowest."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), int(-(-q * len(ordered) // 100))))
    return ordered[rank - 1]


def _null(reason: str) -> dict[str, Any]:
    out: dict[str, Any] = dict.fromkeys(FIGURES)
    out["realplane_error"] = reason
    return out


async def _one_incident(plane: Any, tmp: Path, name: str, fault: str) -> float:
    """Seconds from the fault (Xid line published, or the node's KWOK stopped) to the replacement
    Job's pods Running on healthy nodes."""
    from realplane.plane import (
        clean,
        create_job,
        get_job,
        job_body,
        job_pods,
        running_on,
        start_agents,
        until,
        write_hf_checkpoints,
    )

    await clean(plane)
    ckpt = tmp / "ckpt"
    write_hf_checkpoints(ckpt, 1000)
    agents = await start_agents(plane, tmp)
    try:
        job = create_job(plane, job_body(name, ckpt=ckpt))
        await until("the job's pods Running", lambda: running_on(plane, job, 2))
        old_uid = job["metadata"]["uid"]
        bad = next(
            str(p["spec"]["nodeName"])
            for p in job_pods(plane, job)
            if p["metadata"]["annotations"].get("batch.kubernetes.io/job-completion-index") == "0"
        )

        def healed() -> bool:
            new = get_job(plane, name)
            if new is None or new["metadata"]["uid"] == old_uid:
                return False
            nodes = running_on(plane, new, 2)
            return nodes is not None and bad not in nodes

        t0 = time.perf_counter()
        if fault == "xid79":
            from realplane.plane import XID79

            await agents.kernel_line(bad, job, XID79)
        else:
            plane.lose_node(bad)
        await until("the replacement's pods Running on healthy nodes", healed, timeout=180, every=POLL_S)
        return time.perf_counter() - t0
    finally:
        await agents.stop()


def _churn(plane: Any, namespace: str, n: int) -> dict[str, int]:
    """Create n pods and n Events with WRITERS threads; the highest resourceVersion written of each
    (a watch of one resource passes only its own objects' versions, bookmarks aside)."""
    from concurrent.futures import ThreadPoolExecutor

    from kubernetes import client as kclient

    def write(worker: int) -> dict[str, int]:
        api = plane.api_client()
        core: Any = kclient.CoreV1Api(api)  # raw responses (_preload_content=False)
        top = {"pods": 0, "events": 0}
        try:
            for i in range(worker, n, WRITERS):
                pod = {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {"name": f"churn-{i}", "labels": {"bench": "churn"}},
                    "spec": {
                        "schedulerName": "nobody",
                        "containers": [{"name": "c", "image": "registry.example/idle:1"}],
                    },
                }
                out = core.create_namespaced_pod(namespace, pod, _preload_content=False)
                top["pods"] = max(top["pods"], int(json.loads(out.data)["metadata"]["resourceVersion"]))
                event = {
                    "apiVersion": "v1",
                    "kind": "Event",
                    "metadata": {"name": f"churn-{i}"},
                    "involvedObject": {"kind": "Pod", "namespace": namespace, "name": f"churn-{i}"},
                    "reason": "BackOff",
                    "message": "Back-off restarting failed container",
                    "type": "Warning",
                }
                out = core.create_namespaced_event(namespace, event, _preload_content=False)
                top["events"] = max(top["events"], int(json.loads(out.data)["metadata"]["resourceVersion"]))
        finally:
            api.close()
        return top

    with ThreadPoolExecutor(WRITERS) as pool:
        tops = list(pool.map(write, range(WRITERS)))
    return {k: max(t[k] for t in tops) for k in ("pods", "events")}


async def _watch_rate(plane: Any, churn: int) -> dict[str, Any]:
    """The cluster role's watchers against `churn` pods and `churn` Events written meanwhile."""
    from realplane.conftest import TRAINING

    from trainmedic.agent.bus.memory import MemoryBus
    from trainmedic.agent.jobindex import JobIndex
    from trainmedic.agent.telemetry import Telemetry
    from trainmedic.agent.watchers.k8s import KubeWatchers

    api = plane.api_client(plane.service_account_token("trainmedic", "trainmedic-cluster"))
    watchers = KubeWatchers(api, bus=MemoryBus(partitions=4), job_index=JobIndex(), telemetry=Telemetry())
    task = asyncio.create_task(watchers.run())
    try:
        await asyncio.wait_for(watchers.ready.wait(), 60)
        loops = [r for r in watchers.reflectors if r.spec.name in ("pods", "events")]

        def caught_up(rv: dict[str, int]) -> bool:
            return all(r._rv is not None and int(r._rv) >= rv[r.spec.name] for r in loops)

        t0 = time.perf_counter()
        last = await asyncio.to_thread(_churn, plane, TRAINING, churn)
        written = time.perf_counter()
        deadline = written + 120
        while not caught_up(last):
            if time.perf_counter() > deadline:
                raise RuntimeError(f"the watchers did not reach resourceVersion {last} within 120 s")
            await asyncio.sleep(0.01)
        done = time.perf_counter()
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
        api.close()
    events = 2 * churn
    return {
        "agent_watch_events_per_s": round(events / (done - t0), 1),
        "agent_watch_events": events,
        "agent_watch_writes_per_s": round(events / (written - t0), 1),
        "agent_watch_lag_s": round(done - written, 3),
    }


async def _measure(plane: Any, tmp: Path, repetitions: int, node_lost: bool) -> dict[str, Any]:
    runs: list[float] = []
    for i in range(repetitions):
        d = tmp / f"xid-{i}"
        d.mkdir()
        s = await _one_incident(plane, d, f"bench-xid-{i}", "xid79")
        _log(f"real plane: Xid 79 -> replacement pods Running in {s:.2f} s ({i + 1}/{repetitions})")
        runs.append(s)
    out: dict[str, Any] = {
        "real_fault_to_pods_running_p50_s": round(statistics.median(runs), 3),
        "real_fault_to_pods_running_p99_s": round(_pct(runs, 99), 3),
        "real_fault_to_pods_running_runs_s": [round(s, 3) for s in runs],
        "real_fault_to_pods_running_n": repetitions,
        "real_node_lost_to_pods_running_s": None,
    }
    if node_lost:
        d = tmp / "node-lost"
        d.mkdir()
        s = await _one_incident(plane, d, "bench-lost", "node_lost")
        _log(f"real plane: node lost -> replacement pods Running in {s:.2f} s")
        out["real_node_lost_to_pods_running_s"] = round(s, 3)
    from realplane.plane import clean

    await clean(plane)
    return out


def _delete_churn(plane: Any) -> None:
    """The churn's pods and Events gone (they have no node: deleted at once), so it can run again."""
    from realplane.conftest import TRAINING

    plane.request("DELETE", f"/api/v1/namespaces/{TRAINING}/pods?labelSelector=bench%3Dchurn")
    plane.request("DELETE", f"/api/v1/namespaces/{TRAINING}/events")
    deadline = time.monotonic() + 120
    while plane.request("GET", f"/api/v1/namespaces/{TRAINING}/pods?labelSelector=bench%3Dchurn&limit=1")["items"]:
        if time.monotonic() > deadline:
            raise RuntimeError("the churn's pods were not deleted within 120 s")
        time.sleep(0.5)


# -- the scale figures: 1,000 KWOK nodes, 5,000 pods -------------------------------------------------

SCALE_LABEL = "trainmedic.io/bench-scale"
# A production cluster's node settings (kubelet and kube-controller-manager defaults of 1.34): the
# short grace periods of the healing figures would need a lease renewal per node every second.
SCALE_NODE_LEASE_S = 40
SCALE_NODE_GRACE_S = 50
SCALE_NODE_MONITOR_PERIOD_S = 5
SCALE_PODS_PER_JOB = 8


def _parallel(items: list[Any], work: Any, threads: int = WRITERS) -> None:
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(threads) as pool:
        for _ in pool.map(work, items):
            pass


def _scale_pod(i: int, nodes: int) -> dict[str, Any]:
    """A running training pod as a PyTorchJob's worker has it (labels, torch env, 6 volumes, ~4 KB),
    bound to a node at creation (5,000 pods through the scheduler would measure the scheduler)."""
    job, index = divmod(i, SCALE_PODS_PER_JOB)
    env = [{"name": f"VAR_{k}", "value": "x" * 40} for k in range(16)]
    env += [
        {"name": "MASTER_ADDR", "value": f"scale-{job:04d}-master-0"},
        {"name": "MASTER_PORT", "value": "23456"},
        {"name": "WORLD_SIZE", "value": str(SCALE_PODS_PER_JOB)},
        {"name": "RANK", "value": str(index)},
    ]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"scale-{job:04d}-worker-{index}",
            "labels": {
                "bench": "scale",
                "training.kubeflow.org/job-name": f"scale-{job:04d}",
                "training.kubeflow.org/operator-name": "pytorchjob-controller",
                "training.kubeflow.org/replica-type": "worker",
                "training.kubeflow.org/replica-index": str(index),
                "app.kubernetes.io/part-of": "training-platform",
            },
            "annotations": {"prometheus.io/scrape": "true"},
        },
        "spec": {
            "nodeName": f"scale-{i % nodes:04d}",
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "pytorch",
                    "image": "registry.example/llm/train:2025.01",
                    "command": ["torchrun", "--nnodes=625", "--nproc-per-node=8", "train.py", "--config=/etc/70b.yaml"],
                    "env": env,
                    "resources": {"limits": {"nvidia.com/gpu": "1", "memory": "200Gi"}, "requests": {"cpu": "10"}},
                    "volumeMounts": [{"name": f"vol{k}", "mountPath": f"/mnt/{k}"} for k in range(6)],
                }
            ],
            "volumes": [{"name": f"vol{k}", "emptyDir": {}} for k in range(6)],
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        },
    }


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _settled_rss(pid: int, *, at_least_s: float, at_most_s: float = 120.0) -> float:
    """The process's largest VmRSS, sampled each second for at least `at_least_s` and until it has
    not grown by 1 % over 5 samples (its lists and watch events taken in)."""
    samples: list[float] = []
    t0 = time.monotonic()
    while True:
        samples.append(_rss_mb(pid))
        elapsed = time.monotonic() - t0
        if elapsed >= at_most_s:
            break
        if elapsed >= at_least_s and len(samples) >= 6 and samples[-1] <= samples[-6] * 1.01:
            break
        time.sleep(1.0)
    return max(samples)


def _agent_rss(plane: Any, tmp: Path, churn: int) -> dict[str, Any]:
    """`trainmedic run --role all` (the all-in-one deployment: memory bus, its ServiceAccount and
    ClusterRole from deploy/all-in-one/) in its own process against the plane: VmRSS once it has
    listed and watched everything, and again after `churn` pods and Events more."""
    import subprocess

    import yaml

    token = plane.service_account_token("trainmedic", "trainmedic-brain")
    kubeconfig = plane.write_kubeconfig(tmp / "agent.kubeconfig", token)
    config = tmp / "agent.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "log_format": "json",
                "kubernetes": {"kubeconfig": str(kubeconfig)},
                "logs": {"enabled": False},
                "kernel": {"source": "off"},
                "metrics": {"nvml": False},
                "api": {"enabled": False},
                "remediate": {"mode": "observe", "store": str(tmp / "tm.db"), "scene_dir": str(tmp / "scenes")},
            }
        )
    )
    env = dict(os.environ, TRAINMEDIC_NODE_NAME="bench", PYTHONPATH=str(ROOT))
    log = (tmp / "agent.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "trainmedic.agent", "run", "--config", str(config), "--role", "all"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=log,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while b"running" not in (tmp / "agent.log").read_bytes():
            if time.monotonic() > deadline or proc.poll() is not None:
                tail = (tmp / "agent.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"the agent did not start: {tail}")
            time.sleep(0.2)
        listed = _settled_rss(proc.pid, at_least_s=15)
        _log(f"scale: the agent holds {listed:.0f} MB once it has listed and watched")
        after = listed
        if churn > 0:
            _churn(plane, TRAINING_NS, churn)
            after = _settled_rss(proc.pid, at_least_s=10)
            _log(f"scale: {after:.0f} MB after {churn} pods and Events more")
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(30)
        log.close()
    # A figure of an agent that was refused what it watches would flatter it.
    refused = [
        line
        for line in (tmp / "agent.log").read_text(errors="replace").splitlines()
        if "forbidden" in line.lower() or "not allowed" in line.lower()
    ]
    if refused:
        raise RuntimeError(f"the agent was refused by the API server: {refused[0][:500]}")
    if churn > 0:
        _delete_churn(plane)
    return {
        "agent_rss_mb_5000_pods": round(max(listed, after), 1),
        "agent_rss_mb_after_list_5000_pods": round(listed, 1),
    }


def run_scale(*, nodes: int = 1000, pods: int = 5000, churn: int = 1000) -> dict[str, Any]:
    """The agent at scale on its own plane: `nodes` KWOK nodes (one KWOK process, production node
    settings), `pods` running training pods; `agent_rss_mb_5000_pods` and the watch figure there."""
    from realplane.conftest import CRDS, TRAINING, deploy_docs

    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="tm-bench-scale-") as tmp:
        d = Path(tmp)
        plane = kubeplane.KubePlane(
            d / "plane",
            nodes=(),
            node_grace_s=SCALE_NODE_GRACE_S,
            node_monitor_period_s=SCALE_NODE_MONITOR_PERIOD_S,
            node_lease_s=SCALE_NODE_LEASE_S,
        )
        try:
            _log(f"scale: starting a real plane with {nodes} KWOK nodes (one KWOK process) and {pods} pods")
            plane.start()
            plane.apply([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": TRAINING}}])
            plane.apply(deploy_docs())
            plane.apply(yaml_docs(ROOT / "deploy" / "all-in-one" / "rbac.yaml"))
            plane.install_crds(CRDS)
            plane.start_bulk_kwok(SCALE_LABEL)
            labels = {SCALE_LABEL: "true", **kubeplane.GPU_LABELS}
            _parallel(
                [kubeplane.FakeNode(f"scale-{k:04d}", "nvidia.com/gpu", labels=labels) for k in range(nodes)],
                plane.add_node,
            )
            selector = f"labelSelector={SCALE_LABEL}%3Dtrue"

            def ready_nodes() -> int:
                items = plane.request("GET", f"/api/v1/nodes?{selector}")["items"]
                return sum(
                    1
                    for n in items
                    for c in (n.get("status") or {}).get("conditions") or []
                    if c.get("type") == "Ready" and c.get("status") == "True"
                )

            _wait_for(f"{nodes} nodes Ready", lambda: ready_nodes() >= nodes, 300)
            t_pods = time.perf_counter()
            _parallel(
                list(range(pods)),
                lambda i: plane.request("POST", f"/api/v1/namespaces/{TRAINING}/pods", _scale_pod(i, nodes)),
            )
            not_running = (
                f"/api/v1/namespaces/{TRAINING}/pods?labelSelector=bench%3Dscale"
                "&fieldSelector=status.phase%21%3DRunning&limit=1"
            )
            _wait_for(f"{pods} pods Running", lambda: not plane.request("GET", not_running)["items"], 600)
            _log(f"scale: {nodes} nodes Ready, {pods} pods Running ({time.perf_counter() - t_pods:.0f} s for the pods)")
            out = _agent_rss(plane, d, churn)
            watch = asyncio.run(_watch_rate(plane, churn))
            out["agent_watch_events_per_s_5000_pods"] = watch["agent_watch_events_per_s"]
            out["agent_watch_lag_s_5000_pods"] = watch["agent_watch_lag_s"]
            _log(
                f"scale: {watch['agent_watch_events_per_s']} watch events/s with {pods} pods and {nodes} nodes "
                f"(lag {watch['agent_watch_lag_s']} s)"
            )
        finally:
            plane.stop()
    out["scale_nodes"] = nodes
    out["scale_pods"] = pods
    out["scale_churn"] = churn
    out["scale_node_settings"] = {
        "node_monitor_grace_period_s": SCALE_NODE_GRACE_S,
        "node_monitor_period_s": SCALE_NODE_MONITOR_PERIOD_S,
        "node_lease_duration_s": SCALE_NODE_LEASE_S,
    }
    out["scale_bench_s"] = round(time.perf_counter() - started, 1)
    return out


def yaml_docs(path: Path) -> list[dict[str, Any]]:
    import yaml

    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _wait_for(what: str, ok: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not ok():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(1.0)


def run_realplane(
    *,
    repetitions: int = 5,
    node_lost: bool = True,
    churn: int = 1000,
    scale_nodes: int = 1000,
    scale_pods: int = 5000,
) -> dict[str, Any]:
    """The real-plane figures as a dict; null figures and `realplane_error` where they cannot be had.
    `scale_nodes` / `scale_pods` size the scale figures' own plane (0 pods: no scale figures)."""
    if repetitions < 1:
        raise ValueError("repetitions must be at least 1")
    gone = kubeplane.missing()
    if gone:
        return _null(f"the real control plane is not built ({', '.join(gone)}); `make cluster` builds it")
    started = time.perf_counter()
    settings = {
        "node_monitor_grace_period_s": kubeplane.NODE_GRACE_S,
        "node_monitor_period_s": kubeplane.NODE_MONITOR_PERIOD_S,
        "node_lease_duration_s": kubeplane.NODE_LEASE_S,
    }
    try:
        from realplane.conftest import CRDS, TRAINING, deploy_docs

        with tempfile.TemporaryDirectory(prefix="tm-bench-realplane-") as tmp:
            d = Path(tmp)
            plane = kubeplane.KubePlane(d / "plane")
            try:
                _log("real plane: starting etcd, kube-apiserver, controller-manager, scheduler, 6 KWOK nodes")
                plane.start()
                plane.apply([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": TRAINING}}])
                plane.apply(deploy_docs())
                plane.install_crds(CRDS)
                _log(f"real plane up in {time.perf_counter() - started:.1f} s")
                out = asyncio.run(_measure(plane, d, repetitions, node_lost))
                if churn > 0:
                    _log(
                        f"real plane: the watchers against {churn} pods and {churn} Events created by {WRITERS} threads"
                    )
                    try:
                        watch = asyncio.run(_watch_rate(plane, churn))
                    except Exception as exc:  # noqa: BLE001 - the healing figures above stand
                        _log(f"watch figure failed: {type(exc).__name__}: {exc}")
                        watch = {"agent_watch_events_per_s": None, "agent_watch_error": f"{type(exc).__name__}: {exc}"}
                    else:
                        _log(
                            f"real plane: {watch['agent_watch_events_per_s']} watch events/s "
                            f"(writers {watch['agent_watch_writes_per_s']}/s, lag {watch['agent_watch_lag_s']} s)"
                        )
                    out.update(watch)
                    _delete_churn(plane)
                else:
                    out["agent_watch_events_per_s"] = None
            finally:
                plane.stop()
    except Exception as exc:  # noqa: BLE001 - reported in the JSON
        _log(f"real-plane figures failed: {type(exc).__name__}: {exc}")
        return _null(f"{type(exc).__name__}: {exc}")
    out["real_node_lost_settings"] = settings
    out["real_plane_kubernetes"] = kubeplane.kube_version()
    if scale_pods > 0:
        try:
            out.update(run_scale(nodes=scale_nodes, pods=scale_pods, churn=churn))
        except Exception as exc:  # noqa: BLE001 - the figures above stand
            _log(f"scale figures failed: {type(exc).__name__}: {exc}")
            out["scale_error"] = f"{type(exc).__name__}: {exc}"
    for key in SCALE_FIGURES:
        out.setdefault(key, None)
    out["realplane_bench_s"] = round(time.perf_counter() - started, 1)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Self-healing figures on the real control plane, as one JSON object.")
    ap.add_argument("--repetitions", type=int, default=5, help="Xid 79 incidents (default 5)")
    ap.add_argument("--no-node-lost", action="store_true", help="no node-lost figure")
    ap.add_argument("--churn", type=int, default=1000, help="pods and Events written for the watch figure (0: none)")
    ap.add_argument("--scale-nodes", type=int, default=1000, help="KWOK nodes of the scale figures (default 1000)")
    ap.add_argument(
        "--scale-pods", type=int, default=5000, help="running pods of the scale figures (default 5000; 0: none)"
    )
    args = ap.parse_args(argv)
    if args.repetitions < 1:
        ap.error("--repetitions must be at least 1")
    if args.scale_pods > 0 and args.scale_nodes < 1:
        ap.error("--scale-nodes must be at least 1")
    out = run_realplane(
        repetitions=args.repetitions,
        node_lost=not args.no_node_lost,
        churn=args.churn,
        scale_nodes=args.scale_nodes,
        scale_pods=args.scale_pods,
    )
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
