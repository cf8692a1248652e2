"""Resident memory of the agent watching 1,000 training pods: `agent_rss_mb_1000_pods`.

    python -m bench.rss            (make bench runs it)

The emulated API server (kmock: tests/servers/kube.py) holds 125 nodes with 8 GPUs each and 1,000
running training pods of Jobs (the realistic pod of tests/agent/watchers/test_k8s_digest.py).
`trainmedic run --role all` (memory bus, the embedded default) starts against it from a
kubeconfig, lists and watches pods, events, nodes and Jobs, and runs the brain over what it
publishes. The figure is the agent process's VmRSS (from /proc) after the first lists and after a
round of status updates (10 % of the pods restart), the larger of the two.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
for p in (ROOT, ROOT / "tests"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

NODES = 125


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def _measure(pods_total: int) -> dict[str, Any]:
    from servers.kube import Cluster, KubeEmulator
    from watchers.test_k8s_digest import _pod_json

    async with KubeEmulator() as kube:
        cluster = Cluster(kube)
        t0 = time.perf_counter()
        for n in range(NODES):
            await cluster.add_node(f"gpu-node-{n:03d}", gpus=8)
        # Realistic running training pods (~4.7 KB of JSON each: owner references to their Job,
        # labels, env, volumes, container statuses) are put straight into the emulator's store:
        # creating 1,000 through its API one by one takes minutes in the emulator, not in the agent.
        names = []
        for i in range(pods_total):
            pod = json.loads(_pod_json(i))
            kube.handler.objects["v1/pods", pod["metadata"]["namespace"], pod["metadata"]["name"]] = pod
            names.append((pod["metadata"]["namespace"], pod["metadata"]["name"], i))
        setup_s = time.perf_counter() - t0
        with tempfile.TemporaryDirectory(prefix="tm-rss-") as tmp:
            d = Path(tmp)
            kubeconfig = d / "kubeconfig"
            kubeconfig.write_text(
                yaml.safe_dump(
                    {
                        "apiVersion": "v1",
                        "kind": "Config",
                        "clusters": [{"name": "k", "cluster": {"server": kube.url}}],
                        "users": [{"name": "u", "user": {"token": "t"}}],
                        "contexts": [{"name": "k", "context": {"cluster": "k", "user": "u"}}],
                        "current-context": "k",
                    }
                )
            )
            config = d / "trainmedic.yaml"
            config.write_text(
                yaml.safe_dump(
                    {
                        "log_format": "json",
                        "kubernetes": {"kubeconfig": str(kubeconfig)},
                        "logs": {"enabled": False},
                        "kernel": {"source": "off"},
                        "metrics": {"nvml": False},
                    }
                )
            )
            env = dict(os.environ, TRAINMEDIC_NODE_NAME="bench", PYTHONPATH=str(ROOT))
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "trainmedic.agent", "run", "--config", str(config), "--role", "all",
                cwd=ROOT, env=env, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
            )  # fmt: skip
            messages: list[str] = []

            async def read() -> None:
                assert proc.stderr is not None
                async for raw in proc.stderr:
                    try:
                        messages.append(str(json.loads(raw).get("message", "")))
                    except ValueError:
                        messages.append(raw.decode(errors="replace"))

            reader = asyncio.create_task(read())
            try:
                deadline = time.monotonic() + 120
                while not any("running" in m for m in messages):
                    if time.monotonic() > deadline or proc.returncode is not None:
                        raise RuntimeError("agent did not start: " + " | ".join(messages[-5:]))
                    await asyncio.sleep(0.2)
                await asyncio.sleep(10)  # first lists, watches open, statuses through the brain
                rss_listed = _rss_mb(proc.pid)
                for ns, name, i in names[::10]:
                    status = json.loads(_pod_json(i))["status"]
                    status["containerStatuses"][0]["restartCount"] = 1
                    await kube.call("PATCH", f"/api/v1/namespaces/{ns}/pods/{name}/status", {"status": status})
                await asyncio.sleep(8)
                rss = _rss_mb(proc.pid)
            finally:
                proc.terminate()
                await asyncio.wait_for(proc.wait(), 30)
                await reader
    return {
        "agent_rss_mb_1000_pods": round(max(rss, rss_listed), 1),
        "agent_rss_mb_after_list": round(rss_listed, 1),
        "agent_rss_pods": pods_total,
        "agent_rss_nodes": NODES,
        "agent_rss_setup_s": round(setup_s, 1),
    }


def run_rss(pods: int = 1000) -> dict[str, Any]:
    try:
        return asyncio.run(_measure(pods))
    except Exception as e:  # noqa: BLE001 - the benchmark reports the failure rather than dying
        return {"agent_rss_mb_1000_pods": None, "agent_rss_error": f"{type(e).__name__}: {e}"}


if __name__ == "__main__":
    print(json.dumps(run_rss(), indent=2))
