"""Self-healing figures on the real control plane (`make bench` merges them into its JSON).

    python -m bench.realplane [--repetitions 5] [--no-node-lost]

The plane is tests/servers/kubeplane.py's `KubePlane` (etcd, kube-apiserver with RBAC,
kube-controller-manager, kube-scheduler, one KWOK process per fake node: four with 8
`nvidia.com/gpu`, two with 8 `huawei.com/Ascend910`), started once in a temporary directory with
the shipped deploy/ RBAC applied as is. The agent is wired as tests/realplane/plane.py wires it: the
cluster role (watchers) as the `trainmedic-cluster` ServiceAccount and the brain as
`trainmedic-brain`, each with its own token, over one in-memory bus, the shipped policy in enforce
mode. Everything (plane, agent, this process) shares the machine.

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

Where the plane's binaries are missing (`make cluster` builds them), the figures are null and
`realplane_error` says why; any other failure is reported the same way, so that the rest of
`make bench` keeps its figures.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
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

FIGURES = (
    "real_fault_to_pods_running_p50_s",
    "real_fault_to_pods_running_p99_s",
    "real_node_lost_to_pods_running_s",
    "agent_watch_events_per_s",
)
WRITERS = 8
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

    from agent.bus.memory import MemoryBus
    from agent.jobindex import JobIndex
    from agent.telemetry import Telemetry
    from agent.watchers.k8s import KubeWatchers

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
    from realplane.conftest import TRAINING

    plane.request("DELETE", f"/api/v1/namespaces/{TRAINING}/pods?labelSelector=bench%3Dchurn")


def run_realplane(*, repetitions: int = 5, node_lost: bool = True, churn: int = 1000) -> dict[str, Any]:
    """The real-plane figures as a dict; null figures and `realplane_error` where they cannot be had."""
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
        from realplane.conftest import TRAINING, deploy_docs

        with tempfile.TemporaryDirectory(prefix="tm-bench-realplane-") as tmp:
            d = Path(tmp)
            plane = kubeplane.KubePlane(d / "plane")
            try:
                _log("real plane: starting etcd, kube-apiserver, controller-manager, scheduler, 6 KWOK nodes")
                plane.start()
                plane.apply([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": TRAINING}}])
                plane.apply(deploy_docs())
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
    out["realplane_bench_s"] = round(time.perf_counter() - started, 1)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Self-healing figures on the real control plane, as one JSON object.")
    ap.add_argument("--repetitions", type=int, default=5, help="Xid 79 incidents (default 5)")
    ap.add_argument("--no-node-lost", action="store_true", help="no node-lost figure")
    ap.add_argument("--churn", type=int, default=1000, help="pods and Events written for the watch figure (0: none)")
    args = ap.parse_args(argv)
    if args.repetitions < 1:
        ap.error("--repetitions must be at least 1")
    out = run_realplane(repetitions=args.repetitions, node_lost=not args.no_node_lost, churn=args.churn)
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
