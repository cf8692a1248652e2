"""Self-healing end to end on the emulated cluster: the real agent (`build_agent`, role all: watchers,
memory bus, brain, responder) against kmock, with the test playing kubelet, scheduler and the
workload controllers (tests/servers/kube.py) and the node agent (kernel lines published as the node
role publishes them).

Scenarios (issue 4): Xid 79 on one node of a 2-node x 8-GPU job; repeated HCCL init failures on one
Ascend node; GPU OOM (notify, hints); host OOM with raise_memory_limit; a hang (stacks, then
restart); the circuit breaker; dry-run and approve.
"""

from __future__ import annotations

import asyncio
import functools
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import yaml
from paths import ROOT
from servers.kube import JOB, NODE, VOLCANO_JOB, Cluster, KubeEmulator, require_kmock

from trainmedic.agent.bus.memory import MemoryBus
from trainmedic.agent.config import Role, Settings
from trainmedic.agent.run import Agent, build_agent, run_agent
from trainmedic.agent.store import IncidentStatus, IncidentStore
from trainmedic.events import JobRef, KernelBatch, Topic, make_event
from trainmedic.remediations.policy import load_policy

SHIPPED_POLICY = ROOT / "remediations" / "policy.yaml"
XID79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid=2876, name=python, GPU has fallen off the bus."
NCCL_ERR = (
    "[rank1]:[E1206 18:44:12.755262105 ProcessGroupNCCL.cpp:607] [Rank 1] Watchdog caught collective operation "
    "timeout: WorkNCCL(SeqNum=7753, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for "
    "600099 milliseconds before timing out."
)
HCCL = (
    "[rank1]: EI0006: [PID: 1292363] 2025-04-08-18:07:20.444.436 Getting socket times out. Reason: Remote Rank "
    "did not send the data in time. Please check the reason for the rank being stuck"
)
CUDA_OOM = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
    "79.10 GiB of which 1.20 GiB is free. Including non-PyTorch memory, this process has 77.80 GiB memory in use."
)
RESUME_ARGS = "--resume_from_checkpoint={checkpoint}"


@dataclass
class Env:
    kube: KubeEmulator
    cluster: Cluster
    tmp: Path


@pytest_asyncio.fixture
async def env(tmp_path: Path) -> AsyncIterator[Env]:
    require_kmock()
    async with KubeEmulator() as kube:
        yield Env(kube, Cluster(kube), tmp_path)


def write_hf_checkpoints(root: Path, complete: int, half_written: int | None = None) -> None:
    """checkpoint-<complete> as the HF Trainer leaves it; checkpoint-<half_written> cut short at the crash."""
    done = root / f"checkpoint-{complete}"
    done.mkdir(parents=True)
    (done / "trainer_state.json").write_text(json.dumps({"global_step": complete}))
    (done / "pytorch_model.bin").write_bytes(b"\x01" * 4096)
    (done / "optimizer.pt").write_bytes(b"\x02" * 1024)
    if half_written is not None:
        cut = root / f"checkpoint-{half_written}"
        cut.mkdir()
        (cut / "optimizer.pt").write_bytes(b"\x02" * 512)


def policy_file(env: Env, **changes: Any) -> Path:
    """The shipped policy with some settings changed (backoff, breaker, raise_memory_limit)."""
    data = yaml.safe_load(SHIPPED_POLICY.read_text())
    for path, value in changes.items():
        cur = data
        keys = path.split("__")
        for k in keys[:-1]:
            cur = cur[k]
        cur[keys[-1]] = value
    out = env.tmp / "policy.yaml"
    out.write_text(yaml.safe_dump(data, allow_unicode=True))
    load_policy(out)  # the test's policy must be valid itself
    return out


def settings(
    env: Env,
    *,
    mode: str = "enforce",
    policy: Path | None = None,
    notify: dict[str, Any] | None = None,
    api: dict[str, Any] | None = None,
    **detect: Any,
) -> Settings:
    return Settings.model_validate(
        {
            "node_name": "brain-0",
            "log_format": "text",
            "kubernetes": {"follow_pod_logs": True},
            "logs": {"enabled": False},
            "api": {"port": 0, **(api or {})},
            "notify": notify or {},
            "kernel": {"source": "off"},
            "metrics": {"nvml": False},
            "detect": {"window_s": 0.5, **detect},
            "remediate": {
                "mode": mode,
                "policy": str(policy) if policy else None,
                "store": str(env.tmp / "trainmedic.db"),
                "scene_dir": str(env.tmp / "scenes"),
                "wait_gone_s": 5,
                "log_lines": 500,
            },
        }
    )


@dataclass
class Running:
    agent: Agent
    task: asyncio.Task[None]

    @property
    def responder(self) -> Any:
        return self.agent.responder

    @property
    def store(self) -> IncidentStore:
        """The incident store, opened as `trainmedic incidents` opens it (usable after the agent stopped)."""
        return IncidentStore(self.agent.settings.remediate.store)

    async def stop(self) -> None:
        self.agent.stop.set()
        await asyncio.wait_for(self.task, 30)


async def start_agent(env: Env, s: Settings) -> Running:
    bus = MemoryBus(partitions=4)
    agent = build_agent(s, Role.ALL, bus=bus, api_client=env.kube.api_client())
    assert agent.responder is not None, agent.disabled
    task = asyncio.create_task(run_agent(agent, drain_timeout_s=10))
    await asyncio.wait_for(agent.responder.ready.wait(), 10)
    return Running(agent, task)


async def until(what: str, predicate: Callable[[], Any], timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


def terminal(run: Running, n: int = 1) -> list[Any]:
    """The responder's finished incidents (id, status), once there are n of them."""
    done = [(i, s) for i, s in run.responder.handled.items()]
    return done if len(done) >= n else []


def obj(env: Env, resource: str, name: str) -> dict[str, Any] | None:
    return next((o for o in env.kube.objects(resource) if o["metadata"]["name"] == name), None)


def annots(o: dict[str, Any] | None) -> dict[str, str]:
    return dict(((o or {}).get("metadata") or {}).get("annotations") or {})


async def training_job(
    env: Env,
    name: str,
    nodes: list[str],
    *,
    ckpt: Path | None,
    memory: str | None = None,
    namespace: str = "train",
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """An Indexed batch/v1 Job declaring its checkpoints, one pod per node, running and logging steps."""
    c = env.cluster
    ann = {"trainmedic.io/resume-args": RESUME_ARGS}
    if ckpt is not None:
        ann["trainmedic.io/checkpoint-dir"] = str(ckpt)
    container: dict[str, Any] = {"name": "trainer", "image": "registry.example/train:1", "command": ["torchrun"]}
    if memory:
        container["resources"] = {"limits": {"memory": memory}, "requests": {"memory": memory}}
    body = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": c._meta(name, namespace, annotations=ann),
        "spec": {
            "completions": len(nodes),
            "parallelism": len(nodes),
            "completionMode": "Indexed",
            "backoffLimit": 0,
            "template": {"spec": {"restartPolicy": "Never", "containers": [container]}},
        },
    }
    job = await c.create(JOB, body)
    pods = await run_pods(env, job, nodes)
    return job, pods


async def run_pods(env: Env, job: dict[str, Any], nodes: list[str]) -> list[dict[str, Any]]:
    c = env.cluster
    pods = await c.create_job_pods(job)
    for pod, node in zip(pods, nodes, strict=True):
        await c.bind(pod, node)
        await c.start(pod)
        for step in range(1, 4):
            c.write_log(pod, "trainer", f"{{'loss': {2.5 - step / 10:.2f}, 'learning_rate': 1e-05, 'epoch': 0.{step}}}")
    return pods


async def kernel_line(run: Running, node: str, job: dict[str, Any], line: str) -> None:
    """What the node agent on `node` publishes for a kernel message (one copy per job on the node)."""
    meta = job["metadata"]
    ref = JobRef(namespace=meta["namespace"], name=meta["name"], kind=job["kind"], api_version=job["apiVersion"])
    batch = KernelBatch(node=node, job=ref, source="kmsg", lines=[line], times=[time.time()])
    await run.agent.bus.publish(Topic.KERNEL, make_event(batch, producer=f"node/{node}"))


async def followed(env: Env, pods: list[dict[str, Any]]) -> None:
    for p in pods:
        await until("the agent following the pod's log", functools.partial(env.cluster.open_log_streams, p))


def api_server_stamps(env: Env, resource: str, o: dict[str, Any]) -> dict[str, Any]:
    """The uid a real API server gives every object it creates (kmock 0.8 gives none)."""
    meta = o["metadata"]
    if not meta.get("uid"):
        env.kube.store_patch(resource, meta.get("namespace"), meta["name"], {"metadata": {"uid": str(uuid.uuid4())}})
    found = obj(env, resource, meta["name"])
    assert found is not None
    return found


def node_quarantined(env: Env, node: str) -> bool:
    n = obj(env, NODE, node) or {}
    taints = (n.get("spec") or {}).get("taints") or []
    return bool((n.get("spec") or {}).get("unschedulable")) and any(
        t.get("key") == "trainmedic.io/unhealthy" for t in taints
    )


def affinity_excludes(job: dict[str, Any]) -> set[str]:
    terms = job["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    out: set[str] = set()
    for term in terms:
        for e in term.get("matchExpressions") or []:
            if e["key"] == "kubernetes.io/hostname" and e["operator"] == "NotIn":
                out.update(e["values"])
    return out


# -- scenarios --------------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_xid79_quarantines_the_node_and_resumes_the_job_elsewhere(env: Env) -> None:
    c = env.cluster
    for n in ("gpu-1", "gpu-2", "gpu-3"):
        await c.add_node(n, gpus=8, labels={"node.kubernetes.io/instance-type": "h100x8"})
    ckpt = env.tmp / "ckpt"
    write_hf_checkpoints(ckpt, 1000, half_written=1500)
    policy = policy_file(env, circuit_breaker__max_share=0.5)
    run = await start_agent(env, settings(env, policy=policy))
    try:
        job, pods = await training_job(env, "llama", ["gpu-1", "gpu-2"], ckpt=ckpt)
        old_uid = job["metadata"]["uid"]
        await followed(env, pods)
        c.write_log(pods[0], "trainer", NCCL_ERR)
        await kernel_line(run, "gpu-2", job, XID79)
        [(incident_id, status)] = await until("the incident", lambda: terminal(run))
        assert status is IncidentStatus.RESOLVED
    finally:
        await run.stop()

    # The node is quarantined: cordoned, tainted, labelled, annotated with the incident, condition set.
    node = obj(env, NODE, "gpu-2")
    assert node is not None and node_quarantined(env, "gpu-2")
    assert annots(node)["trainmedic.io/incident"] == incident_id
    assert node["metadata"]["labels"]["trainmedic.io/quarantined"] == "true"
    cond = {c["type"]: c for c in node["status"]["conditions"]}["TrainmedicUnhealthy"]
    assert cond["status"] == "True"
    assert not node_quarantined(env, "gpu-1")

    # The job is recreated under its name, resuming from the last complete checkpoint, off gpu-2.
    new = obj(env, JOB, "llama")
    assert new is not None and new["metadata"].get("uid") != old_uid
    ann = annots(new)
    assert ann["trainmedic.io/incident"] == incident_id
    assert ann["trainmedic.io/resumed-from"] == str(ckpt / "checkpoint-1000")
    assert json.loads(ann["trainmedic.io/lineage"])[-1]["uid"] == old_uid
    assert "gpu-2" in affinity_excludes(new)
    container = new["spec"]["template"]["spec"]["containers"][0]
    env_vars = {e["name"]: e.get("value") for e in container["env"]}
    assert env_vars["TRAINMEDIC_RESUME_FROM"] == str(ckpt / "checkpoint-1000")
    assert env_vars["TRAINMEDIC_RESUME_STEP"] == "1000"
    assert container["args"] == [f"--resume_from_checkpoint={ckpt / 'checkpoint-1000'}"]

    # Evidence first: the scene holds both pods' logs, the objects and the checkpoint listing.
    manifest = json.loads((env.tmp / "scenes" / incident_id / "manifest.json").read_text())
    paths = {f["path"] for f in manifest["files"]}
    logs = {c["log"] for p in manifest["pods"] for c in p["containers"]}
    assert {p["name"] for p in manifest["pods"]} >= {p["metadata"]["name"] for p in pods}
    assert logs <= paths and all(x.startswith("layout/") for x in logs)
    assert "objects/workload.yaml" in paths and "checkpoints.json" in paths
    # The nodes' kernel lines lie beside their containers' logs (layout/<node>/dmesg).
    assert {s["path"] for s in manifest["kernel_sections"]} <= paths
    assert all(
        p.startswith("layout/") and p.endswith("/dmesg") for p in {s["path"] for s in manifest["kernel_sections"]}
    )
    assert manifest["kernel_sections"]
    assert manifest["root_cause"]["code"] == "xid:79"
    listing = json.loads((env.tmp / "scenes" / incident_id / "checkpoints.json").read_text())
    assert any(not c["complete"] for c in (listing if isinstance(listing, list) else listing["checkpoints"]))
    # The pods were held for the scene and released after it.
    for p in c.pods.values():
        pod = obj(env, "v1/pods", p.name)
        assert "trainmedic.io/scene" not in ((pod or {}).get("metadata") or {}).get("finalizers", [])


@pytest.mark.asyncio
async def test_a_pipeline_incident_reaches_every_sink_has_reports_and_is_served_by_the_api(env: Env) -> None:
    """Issue 5's loop: log and kernel lines -> brain -> responder -> store -> outbox -> real HTTP
    receivers (CloudEvents signed, a Feishu robot) -> reports in both languages -> the API, with auth."""
    import httpx
    from servers.receiver import Receiver, Reply

    from trainmedic.reports.payloads import verify

    c = env.cluster
    for n in ("gpu-1", "gpu-2", "gpu-3"):
        await c.add_node(n, gpus=8, labels={"node.kubernetes.io/instance-type": "h100x8"})
    ckpt = env.tmp / "ckpt"
    write_hf_checkpoints(ckpt, 1000, half_written=1500)
    token, secret = "api-token-0123456789", "ce-secret"
    async with Receiver(default=Reply(200, {"code": 0})) as rx:
        s = settings(
            env,
            policy=policy_file(env, circuit_breaker__max_share=0.5),
            notify={
                "sinks": [
                    {"kind": "cloudevents", "url": f"{rx.url}/ce", "secret": secret},
                    {"kind": "feishu", "url": f"{rx.url}/feishu", "lang": "zh"},
                ]
            },
            api={"token": token},
        )
        run = await start_agent(env, s)
        try:
            job, pods = await training_job(env, "llama", ["gpu-1", "gpu-2"], ckpt=ckpt)
            await followed(env, pods)
            c.write_log(pods[0], "trainer", NCCL_ERR)
            await kernel_line(run, "gpu-2", job, XID79)
            [(incident_id, status)] = await until("the incident", lambda: terminal(run))
            assert status is IncidentStatus.RESOLVED
            ce = await rx.wait_for(3, path="/ce", timeout=30)
            feishu = await rx.wait_for(1, path="/feishu", timeout=30)
            server = await until("the API listening", lambda: getattr(run.agent.api_app.state, "server", None))
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.port}") as api:
                # Reads need the token too (read_auth defaults to required).
                assert (await api.get(f"/api/v1/incidents/{incident_id[:12]}")).status_code == 401
                bearer = {"Authorization": f"Bearer {token}"}
                detail = await api.get(f"/api/v1/incidents/{incident_id[:12]}", headers=bearer)
                report = await api.get(
                    f"/api/v1/incidents/{incident_id}/report", params={"format": "html", "lang": "zh"}, headers=bearer
                )
                anonymous = await api.post(f"/api/v1/incidents/{incident_id}/approve", json={"by": "someone"})
                wrong = await api.post(
                    f"/api/v1/incidents/{incident_id}/approve",
                    json={"by": "someone"},
                    headers={"Authorization": "Bearer not-the-token"},
                )
                resolved_already = await api.post(
                    f"/api/v1/incidents/{incident_id}/approve",
                    json={"by": "someone"},
                    headers={"Authorization": f"Bearer {token}"},
                )
                metrics = await api.get("/metrics", headers=bearer)
            await until("the report files", (env.tmp / "scenes" / incident_id / "report.zh.html").is_file)
        finally:
            await run.stop()

    # Every sink, every state the sink wants, signed where it is signed.
    assert [r.json()["type"].rsplit(".", 1)[1] for r in ce] == ["open", "acting", "resolved"]
    assert all(verify(secret.encode(), r.headers, r.body, now=time.time()) for r in ce)
    assert {r.header("x-trainmedic-dedup-key") for r in ce} == {
        f"{incident_id}/{x}" for x in ("open", "acting", "resolved")
    }
    assert ce[-1].json()["data"]["code"] == "xid:79" and ce[-1].json()["data"]["node"] == "gpu-2"
    assert feishu[0].json()["msg_type"] == "interactive"
    # The store holds the whole story, notifications included.
    store = run.store
    try:
        kinds = [e["kind"] for e in store.timeline(incident_id)]
    finally:
        store.close()
    assert {"detected", "scene_saved", "notified", "report"} <= set(kinds)
    # Reports in both languages and both formats beside the scene.
    for name in ("report.en.md", "report.zh.md", "report.en.html", "report.zh.html"):
        assert (env.tmp / "scenes" / incident_id / name).stat().st_size > 0, name
    # The API serves it; only the token changes state.
    assert detail.status_code == 200 and detail.json()["id"] == incident_id
    assert report.status_code == 200 and report.headers["content-type"].startswith("text/html")
    assert "xid:79" in report.text
    assert anonymous.status_code == 401 and wrong.status_code == 401
    assert resolved_already.status_code == 409
    assert 'trainmedic_notifications_total{outcome="delivered",sink="cloudevents"} 3.0' in metrics.text


@pytest.mark.asyncio
async def test_repeated_hccl_init_failure_isolates_the_ascend_node(env: Env) -> None:
    c = env.cluster
    for n in ("npu-1", "npu-2", "npu-3"):
        await c.add_node(n, ascend=8, labels={"node.kubernetes.io/instance-type": "atlas800"})
    ckpt = env.tmp / "ckpt"
    write_hf_checkpoints(ckpt, 200)
    policy = policy_file(env, budgets__backoff__base="1s", budgets__restarts__max=5, circuit_breaker__max_share=0.5)
    run = await start_agent(env, settings(env, policy=policy))
    try:
        job, pods = await training_job(env, "pangu", ["npu-1", "npu-2"], ckpt=ckpt)
        for attempt in range(1, 4):
            await followed(env, pods)
            c.write_log(pods[1], "trainer", HCCL)  # rank 1 on npu-2 fails to build the communicator
            await until(f"incident {attempt}", functools.partial(terminal, run, attempt))
            latest = obj(env, JOB, "pangu")
            assert latest is not None and latest["metadata"].get("uid") != job["metadata"]["uid"]
            job = api_server_stamps(env, JOB, latest)
            quarantined = node_quarantined(env, "npu-2")
            assert quarantined is (attempt == 3), f"attempt {attempt}"
            # The Job controller stand-in: the recreated Job's pods, scheduled as its affinity allows.
            for p in pods:
                await c.delete_pod(p)
            nodes = ["npu-1", "npu-3"] if "npu-2" in affinity_excludes_or_empty(job) else ["npu-1", "npu-2"]
            pods = await run_pods(env, job, nodes)
            await asyncio.sleep(1.1)  # the policy's backoff between restarts (1 s here)
    finally:
        await run.stop()
    statuses = list(run.responder.handled.values())
    assert statuses == [IncidentStatus.RESOLVED] * 3
    store = run.store
    plans = [store.get(i).plan for i in run.responder.handled]
    assert [(p or {}).get("escalated") for p in plans] == [False, False, True]
    final = obj(env, JOB, "pangu")
    assert final is not None and "npu-2" in affinity_excludes(final)


def affinity_excludes_or_empty(job: dict[str, Any]) -> set[str]:
    try:
        return affinity_excludes(job)
    except (KeyError, TypeError):
        return set()


@pytest.mark.asyncio
async def test_gpu_oom_notifies_with_hints_and_changes_nothing(env: Env) -> None:
    c = env.cluster
    await c.add_node("gpu-1", gpus=8)
    run = await start_agent(env, settings(env))
    try:
        job, pods = await training_job(env, "sft", ["gpu-1"], ckpt=None)
        await followed(env, pods)
        c.write_log(
            pods[0], "trainer", "[2025-01-01 10:00:00,000] [INFO] [config.py:1000] DeepSpeed info: zero_stage=2"
        )
        c.write_log(pods[0], "trainer", CUDA_OOM)
        [(incident_id, status)] = await until("the incident", lambda: terminal(run))
    finally:
        await run.stop()
    incident = run.store.get(incident_id)
    assert status is IncidentStatus.RESOLVED
    assert [a.name for a in incident.actions] == ["notify"]
    assert incident.plan is not None and incident.plan["hints"], "GPU OOM comes with hints"
    hints = " ".join(h["en"] for h in incident.plan["hints"])
    assert "ZeRO" in hints or "micro" in hints.lower()
    assert obj(env, JOB, "sft")["metadata"]["uid"] == job["metadata"]["uid"]  # type: ignore[index]
    assert not node_quarantined(env, "gpu-1")


@pytest.mark.asyncio
async def test_host_oom_with_raise_memory_limit_enabled_raises_the_limit(env: Env) -> None:
    c = env.cluster
    await c.add_node("cpu-1")
    await c.add_node("cpu-2")
    host_oom_rule = next(r for r in yaml.safe_load(SHIPPED_POLICY.read_text())["rules"] if r["id"] == "host-oom")
    actions = [
        dict(a, enabled=True) if isinstance(a, dict) and a.get("action") == "raise_memory_limit" else a
        for a in host_oom_rule["actions"]
    ]
    data = yaml.safe_load(SHIPPED_POLICY.read_text())
    for r in data["rules"]:
        if r["id"] == "host-oom":
            r["actions"] = actions
    path = env.tmp / "policy.yaml"
    path.write_text(yaml.safe_dump(data, allow_unicode=True))
    run = await start_agent(env, settings(env, policy=path))
    try:
        job, pods = await training_job(env, "etl", ["cpu-1"], ckpt=None, memory="64Gi")
        await followed(env, pods)
        await c.terminate(pods[0], "trainer", reason="OOMKilled", exit_code=137)
        [(incident_id, status)] = await until("the incident", lambda: terminal(run))
    finally:
        await run.stop()
    assert status is IncidentStatus.RESOLVED
    new = obj(env, JOB, "etl")
    assert new is not None and new["metadata"].get("uid") != job["metadata"]["uid"]
    resources = new["spec"]["template"]["spec"]["containers"][0]["resources"]
    assert resources["limits"]["memory"] == "96Gi"
    incident = run.store.get(incident_id)
    assert incident.fault_class == "host_oom"


@pytest.mark.asyncio
async def test_hang_captures_stacks_then_restarts_from_checkpoint(env: Env) -> None:
    c = env.cluster
    for n in ("gpu-1", "gpu-2"):
        await c.add_node(n, gpus=8)
    ckpt = env.tmp / "ckpt"
    write_hf_checkpoints(ckpt, 300)
    run = await start_agent(env, settings(env, hang_floor_s=2.0, hang_factor=3.0))
    try:
        _, pods = await training_job(env, "stuck", ["gpu-1", "gpu-2"], ckpt=ckpt)
        await followed(env, pods)
        for step in range(4, 30):  # steady progress, then silence while the pods keep running
            for p in pods:
                c.write_log(p, "trainer", f"{{'loss': 1.{step:02d}, 'learning_rate': 1e-05, 'epoch': 1.{step}}}")
            await asyncio.sleep(0.1)
        [(incident_id, status)] = await until("the hang incident", lambda: terminal(run), timeout=60)
    finally:
        await run.stop()
    incident = run.store.get(incident_id)
    assert incident.fault_class == "hang" and status is IncidentStatus.RESOLVED
    scene = env.tmp / "scenes" / incident_id
    stacks = sorted(p.name for p in (scene / "stacks").iterdir())
    assert stacks == sorted(f"{p['metadata']['name']}.txt" for p in pods)
    assert any("Thread" in (scene / "stacks" / s).read_text() for s in stacks)
    assert c.exec_requests, "the stacks came through pods/exec"
    new = obj(env, JOB, "stuck")
    assert new is not None and annots(new)["trainmedic.io/incident"] == incident_id
    assert annots(new)["trainmedic.io/resumed-from"] == str(ckpt / "checkpoint-300")


@pytest.mark.asyncio
async def test_circuit_breaker_trips_at_the_share_and_pages(env: Env) -> None:
    c = env.cluster
    nodes = [f"gpu-{i}" for i in range(1, 5)]
    for n in nodes:
        await c.add_node(n, gpus=8, labels={"node.kubernetes.io/instance-type": "h100x8"})
    policy = policy_file(env, circuit_breaker__max_share=0.25)  # 1 of 4 nodes
    run = await start_agent(env, settings(env, policy=policy))
    try:
        jobs = []
        for i, n in enumerate(nodes[:2]):
            job, pods = await training_job(env, f"job-{i}", [n], ckpt=None)
            await followed(env, pods)
            jobs.append((job, n))
        for job, n in jobs:
            await kernel_line(run, n, job, XID79)
            await until(f"the incident on {n}", functools.partial(terminal, run, len(run.responder.handled) + 1))
    finally:
        await run.stop()
    statuses = list(run.responder.handled.values())
    assert statuses == [IncidentStatus.RESOLVED, IncidentStatus.BLOCKED]
    assert node_quarantined(env, "gpu-1") and not node_quarantined(env, "gpu-2")
    second = run.store.get(list(run.responder.handled)[1])
    assert second.plan is not None and second.plan["breaker_open"] and second.plan["page"]
    assert [a.name for a in second.actions] == ["notify"]
    assert obj(env, JOB, "job-1")["metadata"]["uid"] == jobs[1][0]["metadata"]["uid"]  # type: ignore[index]


@pytest.mark.parametrize("mode", ["dry-run", "approve"])
@pytest.mark.asyncio
async def test_dry_run_and_approve_change_nothing_until_approved(env: Env, mode: str) -> None:
    c = env.cluster
    for n in ("gpu-1", "gpu-2"):
        await c.add_node(n, gpus=8)
    run = await start_agent(env, settings(env, mode=mode, policy=policy_file(env, circuit_breaker__max_share=0.5)))
    try:
        job, pods = await training_job(env, "llama", ["gpu-1", "gpu-2"], ckpt=None)
        await followed(env, pods)
        await kernel_line(run, "gpu-2", job, XID79)
        incident_id = await until(
            "the plan",
            lambda: next((i.id for i in run.store.recent() if i.status is not IncidentStatus.OPEN and i.plan), None),
        )
        incident = run.store.get(incident_id)
        assert [a.name for a in incident.actions][:2] == ["quarantine_node", "restart_from_checkpoint"]
        await asyncio.sleep(1.0)
        assert not node_quarantined(env, "gpu-2")
        assert obj(env, JOB, "llama")["metadata"]["uid"] == job["metadata"]["uid"]  # type: ignore[index]
        if mode == "dry-run":
            assert incident.status is IncidentStatus.OBSERVED
            return
        assert incident.status is IncidentStatus.AWAITING_APPROVAL
        run.store.approve(incident_id, by="alice")  # what `trainmedic approve` does
        await until("the approved plan carried out", lambda: node_quarantined(env, "gpu-2"))
        await until(
            "the job recreated",
            lambda: annots(obj(env, JOB, "llama")).get("trainmedic.io/incident") == incident_id,
        )
    finally:
        await run.stop()


@pytest.mark.asyncio
async def test_volcano_job_is_recreated_with_its_gang_settings(env: Env) -> None:
    c = env.cluster
    for n in ("npu-1", "npu-2", "npu-3"):
        await c.add_node(n, ascend=8, labels={"node.kubernetes.io/instance-type": "atlas800"})
    run = await start_agent(env, settings(env, policy=policy_file(env, circuit_breaker__max_share=0.5)))
    try:
        vcjob = await c.create_volcano_job("train", "mindspore", {"master": 1, "worker": 1})
        pods = await c.create_volcano_pods(vcjob)
        for p, n in zip(pods, ["npu-1", "npu-2"], strict=True):
            await c.bind(p, n)
            await c.start(p)
        await followed(env, pods)
        await kernel_line(run, "npu-2", vcjob, XID79)
        [(incident_id, status)] = await until("the incident", lambda: terminal(run))
    finally:
        await run.stop()
    assert status is IncidentStatus.RESOLVED
    new = obj(env, VOLCANO_JOB, "mindspore")
    assert new is not None and annots(new)["trainmedic.io/incident"] == incident_id
    assert new["spec"]["minAvailable"] == 2 and new["spec"]["queue"] == "default"
    assert new["spec"]["plugins"] == vcjob["spec"]["plugins"]


@pytest.mark.asyncio
async def test_evidence_older_than_the_recreated_job_is_not_acted_on_again(env: Env) -> None:
    """A kernel line re-read after an agent restart (old timestamp) about a job trainmedic already
    recreated: a new incident is recorded, the job is not restarted a second time."""
    c = env.cluster
    for n in ("gpu-1", "gpu-2", "gpu-3"):
        await c.add_node(n, gpus=8)
    run = await start_agent(env, settings(env, policy=policy_file(env, circuit_breaker__max_share=0.5)))
    try:
        job, pods = await training_job(env, "llama", ["gpu-1", "gpu-2"], ckpt=None)
        await followed(env, pods)
        seen_at = time.time() - 120
        meta = job["metadata"]
        ref = JobRef(namespace=meta["namespace"], name=meta["name"], kind="Job", api_version="batch/v1")
        old = KernelBatch(node="gpu-2", job=ref, source="kmsg", lines=[XID79], times=[seen_at])
        await run.agent.bus.publish(Topic.KERNEL, make_event(old, producer="node/gpu-2", at=seen_at))
        await until("the first incident", lambda: terminal(run))
        recreated = annots(obj(env, JOB, "llama"))["trainmedic.io/incident"]
        again = KernelBatch(node="gpu-2", job=ref, source="kmsg", lines=[XID79], times=[seen_at])
        await run.agent.bus.publish(Topic.KERNEL, make_event(again, producer="node/gpu-2", at=seen_at))
        await until("the second incident", lambda: terminal(run, 2))
    finally:
        await run.stop()
    assert list(run.responder.handled.values()) == [IncidentStatus.RESOLVED, IncidentStatus.OBSERVED]
    assert annots(obj(env, JOB, "llama"))["trainmedic.io/incident"] == recreated
    second = run.store.get(list(run.responder.handled)[1])
    assert "stale" in [e["kind"] for e in run.store.timeline(second.id)]
