"""kmock's KubernetesEmulator on a free loopback port, and a stand-in for the cluster's controllers:
the emulated cluster of `trainmedic demo`, of the end-to-end tests and of the benchmarks.

The emulator (PyPI `kmock`) is a stateful Kubernetes API: create, list, watch, patch (also the
status subresource) and delete work through the official client. It is not a cluster: nothing
schedules pods, runs containers, writes statuses, emits events or serves logs. Its quirks (0.8):
objects come back without resourceVersion, uid or creationTimestamp; a list's resourceVersion is
the literal "..."; label and field selectors, `limit` and a watch's timeoutSeconds are ignored; a
watch first replays every existing object as ADDED, whatever resourceVersion it asks from; and a
GET of pods/<name>/log answers with the Pod itself (the subresource is ignored). `Cluster` plays
the missing parts as faithfully as a test needs: the Job, Volcano and Kubeflow controllers (pods
with the owner references, labels, annotations and env those controllers set, uids and creation
times), the scheduler (binding to a node), the kubelet (container statuses through Pending ->
Running -> terminated / CrashLoopBackOff, restart counts, container IDs, events such as Scheduled,
Pulled, Started, BackOff, and the pods/log subresource, served through a kmock reaction, with
follow, previous, timestamps, sinceSeconds, tailLines and limitBytes), node-problem-detector
(OOMKilling on a node). `Cluster(versioned=True)` also stamps resourceVersions, as a real API
server does.

The pods/exec subresource is a kmock reaction too, speaking the API server's websocket protocol to
the official client: the GET .../pods/<name>/exec?command=...&container=...&stdout=true&stderr=true
with `Upgrade: websocket` is upgraded by aiohttp's WebSocketResponse inside the reaction (kmock
hands reactions the aiohttp request), subprotocol v5 or v4.channel.k8s.io as the client offers;
binary frames carry the channel byte (1 stdout, 2 stderr) and the last one, on channel 3, the
Status: Success, or Failure with details.causes [{reason: ExitCode, message: "<code>"}], or a
Failure without an exit code when the runtime cannot start the command. A refusal (403 RBAC, 404
pod, 400 container not running) is a Status answer instead of the upgrade. (The reaction is an
async generator so kmock treats the exchange as a stream; after the websocket has closed the
connection, kmock's own attempt to start a stream response meets the closed transport, which it
ignores.) What a command does is up to a per-pod handler (`on_exec`); the default container has a
POSIX shell, /proc with one Python process (pid 1, `python train.py`, which registered
faulthandler for SIGUSR1) and no py-spy: `py-spy` is "executable file not found" (or exit 127
through sh), the process listing of remediations.stacks (PROCESS_LIST_SCRIPT) is answered from the
pod's process table (`set_processes`), and `kill -USR1 <pid>` makes a process that handles the
signal print a faulthandler stack to the container's log.

Failures are served by the emulator too, through kmock's reactions (a status, a Retry-After
header, an ERROR event in a live watch stream), and `KubeEmulator.pause()` / `resume()` stop and
restart serving on the same port (connection refused in between; open streams are cut at once,
which aiohttp would otherwise wait up to a minute for).

Plain Python (asyncio), no pytest. kmock is an optional dependency (the `demo` and `test` extras):
this module imports without it, and `KubeEmulator()` says what is missing. The tests reach it as
`servers.kube`, which re-exports this module with their own helpers.

    async with KubeEmulator() as kube:
        api = kube.api_client()            # kubernetes.client.ApiClient for the official client
        cluster = Cluster(kube)
        await cluster.add_node("gpu-1", gpus=8)
        job = await cluster.create_job("train", "llama", completions=2)
        pods = await cluster.create_job_pods(job)
        await cluster.bind(pods[0], "gpu-1")
        await cluster.start(pods[0])
        cluster.write_log(pods[0], "trainer", "step 1 loss 2.3")
        cluster.on_exec(pods[0], lambda container, argv: ExecReply(stdout="hi\n"))
        await cluster.terminate(pods[0], "trainer", reason="OOMKilled", exit_code=137, restart=True)
        await kube.pause(); await kube.resume()   # connection refused in between, same port

Size: one emulated cluster: `Cluster` keeps every object of the emulated API server (nodes,
workloads, pods, events) with the container logs and exec sessions it serves, and the faults drive
that one state through its methods; `KubeEmulator` is the server it runs in.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import re
import secrets
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from trainmedic.remediations.stacks import PROCESS_LIST_SCRIPT
from trainmedic.timefmt import rfc3339, rfc3339nano

try:
    import kmock as _kmock
except ImportError:  # pragma: no cover - reported by KubeEmulator() and kmock_available()
    _kmock = None  # type: ignore[assignment]
kmock: Any = _kmock

__all__ = [
    "BUILTIN",
    "CRDS",
    "DEFAULT_STACK",
    "EVENT",
    "JOB",
    "NODE",
    "POD",
    "PYTORCH_JOB",
    "VOLCANO_JOB",
    "Cluster",
    "ExecHandler",
    "ExecReply",
    "FakeProcess",
    "KubeApiError",
    "KubeEmulator",
    "PodRef",
    "kmock",
    "kmock_available",
    "rfc3339",
    "rfc3339nano",
]

POD = "v1/pods"
NODE = "v1/nodes"
EVENT = "v1/events"
JOB = "batch/v1/jobs"
VOLCANO_JOB = "batch.volcano.sh/v1alpha1/jobs"
PYTORCH_JOB = "kubeflow.org/v1/pytorchjobs"

# The resources the emulator serves from the start (kmock answers 404 for a resource it does not
# know): what a bare cluster has, plus the CRDs a test installs.
BUILTIN: dict[str, dict[str, Any]] = {
    POD: {"kind": "Pod", "namespaced": True, "subresources": {"status", "log", "exec"}},
    EVENT: {"kind": "Event", "namespaced": True},
    NODE: {"kind": "Node", "namespaced": False, "subresources": {"status"}},
    "v1/namespaces": {"kind": "Namespace", "namespaced": False},
    JOB: {"kind": "Job", "namespaced": True, "subresources": {"status"}},
}
CRDS: dict[str, tuple[str, dict[str, Any]]] = {
    "volcanojobs": (VOLCANO_JOB, {"kind": "Job", "namespaced": True, "subresources": {"status"}}),
    "pytorchjobs": (PYTORCH_JOB, {"kind": "PyTorchJob", "namespaced": True, "subresources": {"status"}}),
}


def kmock_available() -> bool:
    return kmock is not None


class KubeApiError(RuntimeError):
    """The emulator refused a request the stand-in made (status and body)."""

    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"{status}: {body[:300]}")
        self.status = status


class KubeEmulator:
    """kmock's KubernetesEmulator served on 127.0.0.1 (a free port, kept across pause/resume)."""

    def __init__(self, *, crds: Iterable[str] = ("volcanojobs", "pytorchjobs")) -> None:
        if kmock is None:
            raise RuntimeError("kmock is not installed (pip install kmock)")
        self.handler: Any = kmock.KubernetesEmulator()
        self._server: Any = None
        self._port: int | None = None
        self._entered = False
        self._clients: list[Any] = []
        for res, info in BUILTIN.items():
            self.handler.resources[res] = kmock.ResourceInfo(**info)
        for name in crds:
            self.install_crd(name)

    # -- lifecycle ---------------------------------------------------------------------------------

    async def __aenter__(self) -> KubeEmulator:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        if not self._entered:
            await self.handler.__aenter__()
            self._entered = True
        await self.resume()

    async def stop(self) -> None:
        for api in self._clients:
            api.close()
        self._clients.clear()
        await self.pause()
        if self._entered:
            self._entered = False
            await self.handler.__aexit__(None, None, None)

    async def pause(self) -> None:
        """Stop serving (connections are refused, open streams are cut); the state is kept."""
        server, self._server = self._server, None
        if server is None:
            return
        # Cut open streams first: aiohttp would otherwise wait for them to finish.
        for conn in list(server.server.handler.connections):
            conn.force_close()
            if conn.transport is not None:
                conn.transport.abort()
        await server.__aexit__(None, None, None)

    async def resume(self) -> None:
        """Serve again, on the same port."""
        if self._server is not None:
            return
        server = kmock.Server(self.handler, port=self._port)
        await server.__aenter__()
        self._server = server
        self._port = server.port

    @property
    def running(self) -> bool:
        return self._server is not None

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("the emulator was never started")
        return self._port

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def api_client(self, *, pool_maxsize: int = 64) -> Any:
        """A kubernetes.client.ApiClient for this emulator (closed by stop())."""
        from kubernetes import client as kclient

        cfg = kclient.Configuration(host=self.url)
        cfg.connection_pool_maxsize = pool_maxsize
        api = kclient.ApiClient(cfg)
        self._clients.append(api)
        return api

    # -- resources ---------------------------------------------------------------------------------

    def install_crd(self, name: str) -> None:
        """Serve a custom resource (volcanojobs, pytorchjobs), as installing its CRD would."""
        res, info = CRDS[name]
        self.handler.resources[res] = kmock.ResourceInfo(**info)

    def objects(self, resource: str) -> list[dict[str, Any]]:
        """The current (not deleted) objects of a resource, e.g. "v1/pods"."""
        want = kmock.resource(resource)
        out: list[dict[str, Any]] = []
        for (res, _ns, _name), obj in self.handler.objects.items():
            if res == want and not obj.deleted:
                out.append(obj.raw)
        return out

    def open_watches(self, resource: str) -> int:
        """Watch streams of a resource subscribed to the emulator's changes right now. (A change made
        before a watch subscribes is not sent to it, and without resourceVersions nothing replays
        a deletion: tests that delete wait for this first.)"""
        bus = self.handler._buses.get(kmock.resource(resource))
        return 0 if bus is None else int(bus.consumer_count)

    def requests(self, resource: str | None = None, *, action: str | None = None) -> list[Any]:
        """kmock's record of the requests served, optionally of one resource and action (list, watch...)."""
        out = []
        for r in list(self.handler):
            if resource is not None and (r.resource is None or r.resource != kmock.resource(resource)):
                continue
            if action is not None and (r.action is None or r.action.value.lower() != action.lower()):
                continue
            out.append(r)
        return out

    def forget_requests(self) -> None:
        """Drop kmock's record of the requests served so far (`requests()` starts empty again). On
        every request kmock checks each reaction by walking that whole record, so a long run (a
        benchmark) slows down quadratically unless it is cleared between rounds."""
        self.handler._requests.clear()

    # Changes that no watch sees: what happens while a client is disconnected, or before a 410.
    def store_patch(self, resource: str, namespace: str | None, name: str, patch: Mapping[str, Any]) -> None:
        self.handler.objects[resource, namespace, name].patch(dict(patch))

    def store_delete(self, resource: str, namespace: str | None, name: str) -> None:
        self.handler.objects[resource, namespace, name].delete()

    # -- the REST calls of the stand-in (kmock's own aiohttp client, on the loop) ------------------

    async def call(self, method: str, path: str, body: Any = None) -> Any:
        if self._server is None:
            raise RuntimeError("the emulator is paused")
        async with self._server.client.request(method, path, json=body) as resp:
            data = await resp.read()
            if resp.status >= 400:
                raise KubeApiError(resp.status, data.decode("utf-8", "replace"))
            return json.loads(data) if data else None


def _path(resource: str, namespace: str | None = None, name: str | None = None, sub: str | None = None) -> str:
    parts = resource.split("/")
    plural = parts[-1]
    base = f"/api/{parts[0]}" if len(parts) == 2 else f"/apis/{parts[0]}/{parts[1]}"
    path = base + (f"/namespaces/{namespace}" if namespace else "") + f"/{plural}"
    if name:
        path += f"/{name}"
    if sub:
        path += f"/{sub}"
    return path


PodRef = Mapping[str, Any] | str


def _ref(pod: PodRef) -> tuple[str, str]:
    if isinstance(pod, str):
        ns, _, name = pod.partition("/")
        return ns, name
    meta = pod["metadata"]
    return str(meta.get("namespace") or "default"), str(meta["name"])


@dataclass(frozen=True)
class ExecReply:
    """What a command run through pods/exec gives back.

    `exit_code` None with `failure`: the runtime could not start the command (a Failure Status
    without an exit code, as containerd reports a missing executable). `status` refuses the exec
    itself with that HTTP status and `message` (403 RBAC, ...) instead of upgrading the connection.
    `delay_s` holds the answer back (a command that hangs).
    """

    stdout: str | bytes = ""
    stderr: str | bytes = ""
    exit_code: int | None = 0
    failure: str | None = None
    status: int | None = None
    message: str = ""
    delay_s: float = 0.0


# (container, argv) -> the reply, sync or async.
ExecHandler = Callable[[str, list[str]], "ExecReply | Awaitable[ExecReply]"]


@dataclass(frozen=True)
class FakeProcess:
    """A process in the stand-in's container: what /proc shows of it, and its SIGUSR1 answer."""

    pid: int
    cmdline: str
    # faulthandler.register(signal.SIGUSR1) was called: the signal prints `stack` to stderr.
    handles_sigusr1: bool = True
    stack: str = ""


DEFAULT_STACK = """Thread 0x00007f5e2effd640 (most recent call first):
  File "/usr/lib/python3.10/threading.py", line 320 in wait
  File "/usr/lib/python3.10/threading.py", line 607 in wait
  File "/opt/conda/lib/python3.10/site-packages/torch/utils/data/_utils/pin_memory.py", line 51 in _pin_memory_loop

Current thread 0x00007f5e3a8e7740 (most recent call first):
  File "/opt/conda/lib/python3.10/site-packages/torch/distributed/distributed_c10d.py", line 2050 in all_reduce
  File "/workspace/train.py", line 88 in train_step
  File "/workspace/train.py", line 120 in <module>"""

# SigCgt as /proc/<pid>/status shows it: a Python process catches SIGINT (bit 1), and SIGUSR1
# (bit 9: signal 10) once faulthandler registered it.
_SIGCGT_PLAIN = "0000000000000002"
_SIGCGT_USR1 = "0000000000000202"


@dataclass
class _Instance:
    """One run of a container: its ID and its log."""

    cid: str
    lines: list[tuple[int, str]] = field(default_factory=list)
    running: bool = True
    # Live follow streams: queue -> with timestamps
    streams: dict[asyncio.Queue[bytes | None], bool] = field(default_factory=dict)

    def end_streams(self) -> None:
        for q in self.streams:
            q.put_nowait(None)
        self.streams.clear()


@dataclass
class _Container:
    name: str
    restarts: int = 0
    state: dict[str, Any] = field(default_factory=lambda: {"waiting": {"reason": "ContainerCreating"}})
    last_state: dict[str, Any] = field(default_factory=dict)
    ready: bool = False
    instances: list[_Instance] = field(default_factory=list)
    started: bool = False

    def status(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "image": "registry.example/train:1",
            "imageID": "registry.example/train@sha256:" + "0" * 64,
            "ready": self.ready,
            "started": self.started,
            "restartCount": self.restarts,
            "state": self.state,
            "lastState": self.last_state,
        }
        if "running" in self.state and self.instances:
            out["containerID"] = self.instances[-1].cid
        if "terminated" in self.state and self.instances:
            out["containerID"] = self.instances[-1].cid
        return out

    def live(self) -> _Instance | None:
        return self.instances[-1] if self.instances and self.instances[-1].running else None


@dataclass
class _Pod:
    namespace: str
    name: str
    uid: str
    containers: dict[str, _Container]
    restart_policy: str
    node: str | None = None
    phase: str = "Pending"
    conditions: list[dict[str, Any]] = field(default_factory=list)
    # container -> its processes, for the default exec handler (None: the default table).
    processes: dict[str, list[FakeProcess]] = field(default_factory=dict)


class Cluster:
    """The scheduler, kubelet and workload controllers a test needs, acting through the emulator.

    `versioned=True` stamps every object this stand-in writes with an increasing resourceVersion,
    as a real API server does (kmock itself leaves it out).
    """

    def __init__(self, kube: KubeEmulator, *, versioned: bool = False) -> None:
        self.kube = kube
        self.versioned = versioned
        self._rv = 1000
        self.pods: dict[tuple[str, str], _Pod] = {}
        self.log_requests: list[dict[str, str]] = []
        # Every exec asked for: namespace, pod, container, command (argv), protocol offered.
        self.exec_requests: list[dict[str, Any]] = []
        self._exec_handlers: dict[tuple[str, str], ExecHandler] = {}
        kube.handler[kmock.resource(POD), kmock.subresource("log")] << self._serve_log
        kube.handler[kmock.resource(POD), kmock.subresource("exec")] << self._serve_exec

    # -- helpers -----------------------------------------------------------------------------------

    def _version(self, meta: dict[str, Any]) -> dict[str, Any]:
        if self.versioned:
            self._rv += 1
            meta["resourceVersion"] = str(self._rv)
        return meta

    def _meta(
        self,
        name: str,
        namespace: str | None = None,
        *,
        labels: Mapping[str, str] | None = None,
        annotations: Mapping[str, str] | None = None,
        owner: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": name, "uid": str(uuid.uuid4()), "creationTimestamp": rfc3339()}
        if namespace is not None:
            meta["namespace"] = namespace
        if labels:
            meta["labels"] = dict(labels)
        if annotations:
            meta["annotations"] = dict(annotations)
        if owner is not None:
            meta["ownerReferences"] = [
                {
                    "apiVersion": owner["apiVersion"],
                    "kind": owner["kind"],
                    "name": owner["metadata"]["name"],
                    "uid": owner["metadata"]["uid"],
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ]
        return self._version(meta)

    async def create(self, resource: str, body: dict[str, Any]) -> dict[str, Any]:
        ns = body["metadata"].get("namespace")
        result: dict[str, Any] = await self.kube.call("POST", _path(resource, ns), body)
        return result

    async def patch(
        self, resource: str, namespace: str | None, name: str, body: dict[str, Any], *, sub: str | None = None
    ) -> dict[str, Any]:
        if self.versioned:
            body = dict(body, metadata=self._version(dict(body.get("metadata") or {})))
        result: dict[str, Any] = await self.kube.call("PATCH", _path(resource, namespace, name, sub), body)
        return result

    async def delete(self, resource: str, namespace: str | None, name: str) -> None:
        await self.kube.call("DELETE", _path(resource, namespace, name))

    # -- nodes -------------------------------------------------------------------------------------

    @staticmethod
    def _node_conditions(ready: bool, overrides: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
        now = rfc3339()
        statuses = {
            "Ready": "True" if ready else "False",
            "MemoryPressure": "False",
            "DiskPressure": "False",
            "PIDPressure": "False",
        }
        statuses.update(overrides or {})
        return [
            {"type": t, "status": s, "lastHeartbeatTime": now, "lastTransitionTime": now, "reason": f"Kubelet{t}"}
            for t, s in statuses.items()
        ]

    async def add_node(
        self,
        name: str,
        *,
        gpus: int = 0,
        ascend: int = 0,
        mlus: int = 0,
        labels: Mapping[str, str] | None = None,
        ready: bool = True,
        taints: Sequence[Mapping[str, str]] = (),
        capacity: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        cap = {"cpu": "96", "memory": "1056561388Ki", "pods": "110", "ephemeral-storage": "3750000000Ki"}
        if gpus:
            cap["nvidia.com/gpu"] = str(gpus)
        if ascend:
            cap["huawei.com/Ascend910"] = str(ascend)
        if mlus:
            cap["cambricon.com/mlu"] = str(mlus)
        cap.update(capacity or {})
        base_labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64"}
        base_labels.update(labels or {})
        body = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": self._meta(name, labels=base_labels),
            "spec": {"taints": [dict(t) for t in taints]} if taints else {},
            "status": {"capacity": cap, "allocatable": dict(cap), "conditions": self._node_conditions(ready)},
        }
        return await self.create(NODE, body)

    async def set_node_conditions(self, name: str, statuses: Mapping[str, str], *, ready: bool = True) -> None:
        """Replace the node's conditions (e.g. {"Ready": "False"} or a GPU problem condition)."""
        await self.patch(
            NODE, None, name, {"status": {"conditions": self._node_conditions(ready, statuses)}}, sub="status"
        )

    async def heartbeat(self, name: str, *, ready: bool = True) -> None:
        """What the kubelet does every few seconds: new heartbeat times, nothing else changed."""
        await self.patch(NODE, None, name, {"status": {"conditions": self._node_conditions(ready)}}, sub="status")

    async def lose_node(self, name: str) -> None:
        """The node lifecycle controller when a node stops heartbeating (past node-monitor-grace-period):
        its conditions go Unknown ("Kubelet stopped posting node status."), the unreachable taints
        (NoSchedule, NoExecute) go on, its pods are marked not ready with a NodeNotReady event each."""
        now = rfc3339()
        conditions = [
            {
                "type": t,
                "status": "Unknown",
                "lastHeartbeatTime": now,
                "lastTransitionTime": now,
                "reason": "NodeStatusUnknown",
                "message": "Kubelet stopped posting node status.",
            }
            for t in ("Ready", "MemoryPressure", "DiskPressure", "PIDPressure")
        ]
        await self.patch(NODE, None, name, {"status": {"conditions": conditions}}, sub="status")
        await self.taint(
            name,
            [
                {"key": "node.kubernetes.io/unreachable", "effect": "NoSchedule", "timeAdded": now},
                {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute", "timeAdded": now},
            ],
        )
        for p in [p for p in self.pods.values() if p.node == name]:
            p.conditions = [
                dict(c, status="False") if c["type"] in ("Ready", "ContainersReady") else c for c in p.conditions
            ]
            await self._push(p)
            await self.event(
                p.namespace,
                kind="Pod",
                name=p.name,
                involved_uid=p.uid,
                reason="NodeNotReady",
                message="Node is not ready",
                type="Warning",
                component="node-controller",
            )

    async def taint(self, name: str, taints: Sequence[Mapping[str, str]]) -> None:
        await self.patch(NODE, None, name, {"spec": {"taints": [dict(t) for t in taints]}})

    async def cordon(self, name: str, unschedulable: bool = True) -> None:
        await self.patch(NODE, None, name, {"spec": {"unschedulable": unschedulable}})

    # -- workloads (what their controllers create) -------------------------------------------------

    @staticmethod
    def _container_spec(name: str, env: Mapping[str, str] | None = None) -> dict[str, Any]:
        spec: dict[str, Any] = {"name": name, "image": "registry.example/train:1", "command": ["torchrun", "train.py"]}
        if env:
            spec["env"] = [{"name": k, "value": v} for k, v in env.items()]
        return spec

    async def create_job(
        self,
        namespace: str,
        name: str,
        *,
        completions: int = 2,
        parallelism: int | None = None,
        indexed: bool = True,
        containers: Sequence[str] = ("trainer",),
    ) -> dict[str, Any]:
        body = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": self._meta(name, namespace),
            "spec": {
                "completions": completions,
                "parallelism": parallelism or completions,
                "completionMode": "Indexed" if indexed else "NonIndexed",
                "backoffLimit": 0,
                "template": {
                    "spec": {"restartPolicy": "Never", "containers": [self._container_spec(c) for c in containers]}
                },
            },
        }
        return await self.create(JOB, body)

    async def create_job_pods(self, job: Mapping[str, Any], *, from_template: bool = False) -> list[dict[str, Any]]:
        """The pods the Job controller creates: one per completion index, labelled and owned like it does
        (with `from_template`, their spec is the Job's pod template, as the real controller makes it)."""
        meta, spec = job["metadata"], job["spec"]
        uid, jname, ns = meta["uid"], meta["name"], meta["namespace"]
        containers = [c["name"] for c in spec["template"]["spec"]["containers"]]
        pods = []
        for i in range(int(spec.get("parallelism") or 1)):
            indexed = spec.get("completionMode") == "Indexed"
            labels = {
                "batch.kubernetes.io/controller-uid": uid,
                "batch.kubernetes.io/job-name": jname,
                "controller-uid": uid,
                "job-name": jname,
            }
            annotations: dict[str, str] = {}
            if indexed:
                labels["batch.kubernetes.io/job-completion-index"] = str(i)
                annotations["batch.kubernetes.io/job-completion-index"] = str(i)
            name = f"{jname}-{i}-{secrets.token_hex(3)[:5]}" if indexed else f"{jname}-{secrets.token_hex(3)[:5]}"
            pods.append(
                await self.create_pod(
                    ns,
                    name,
                    labels=labels,
                    annotations=annotations,
                    owner=job,
                    containers=containers,
                    restart_policy="Never",
                    template=spec["template"] if from_template else None,
                    env={"JOB_COMPLETION_INDEX": str(i)} if from_template and indexed else None,
                )
            )
        return pods

    async def set_job_status(self, job: Mapping[str, Any], status: Mapping[str, Any]) -> None:
        meta = job["metadata"]
        await self.patch(JOB, meta["namespace"], meta["name"], {"status": dict(status)}, sub="status")

    async def create_volcano_job(
        self, namespace: str, name: str, tasks: Mapping[str, int] | None = None, *, queue: str = "default"
    ) -> dict[str, Any]:
        tasks = dict(tasks or {"master": 1, "worker": 2})
        body = {
            "apiVersion": "batch.volcano.sh/v1alpha1",
            "kind": "Job",
            "metadata": self._meta(name, namespace),
            "spec": {
                "minAvailable": sum(tasks.values()),
                "schedulerName": "volcano",
                "queue": queue,
                "plugins": {"pytorch": ["--master=master", "--worker=worker", "--port=23456"]},
                "tasks": [
                    {
                        "name": t,
                        "replicas": n,
                        "template": {
                            "spec": {"restartPolicy": "OnFailure", "containers": [self._container_spec("pytorch")]}
                        },
                    }
                    for t, n in tasks.items()
                ],
            },
        }
        # The CRD has a status subresource: the API server drops a status sent with the create. The
        # job controller's first sync writes it (Pending) through the subresource.
        await self.create(VOLCANO_JOB, body)
        return await self.patch(VOLCANO_JOB, namespace, name, {"status": {"state": {"phase": "Pending"}}}, sub="status")

    async def create_volcano_pods(
        self, vcjob: Mapping[str, Any], *, pytorch_plugin: bool = True, from_template: bool = False
    ) -> list[dict[str, Any]]:
        """The pods the Volcano job controller creates (`<job>-<task>-<index>`); with its pytorch plugin,
        MASTER_ADDR / WORLD_SIZE / RANK env (master 0, workers 1..n); with `from_template`, their spec
        is the task's pod template."""
        meta, spec = vcjob["metadata"], vcjob["spec"]
        jname, ns = meta["name"], meta["namespace"]
        world = sum(int(t["replicas"]) for t in spec["tasks"])
        has_master = any(t["name"] == "master" for t in spec["tasks"])
        pods = []
        for task in spec["tasks"]:
            for i in range(int(task["replicas"])):
                labels = {
                    "volcano.sh/job-name": jname,
                    "volcano.sh/job-namespace": ns,
                    "volcano.sh/queue-name": spec.get("queue", "default"),
                    "volcano.sh/task-spec": task["name"],
                    # Volcano (v1.10.0 createJobPod) puts the task index in a label too.
                    "volcano.sh/task-index": str(i),
                }
                annotations = {
                    "volcano.sh/job-name": jname,
                    "volcano.sh/task-spec": task["name"],
                    "volcano.sh/task-index": str(i),
                    "scheduling.k8s.io/group-name": f"{jname}-{meta['uid']}",
                }
                env = None
                if pytorch_plugin:
                    rank = 0 if task["name"] == "master" else i + (1 if has_master else 0)
                    env = {
                        "MASTER_ADDR": f"{jname}-master-0.{jname}",
                        "MASTER_PORT": "23456",
                        "WORLD_SIZE": str(world),
                        "RANK": str(rank),
                    }
                pods.append(
                    await self.create_pod(
                        ns,
                        f"{jname}-{task['name']}-{i}",
                        labels=labels,
                        annotations=annotations,
                        owner=vcjob,
                        containers=("pytorch",),
                        env=env,
                        restart_policy="OnFailure",
                        template=task["template"] if from_template else None,
                    )
                )
        return pods

    async def set_volcano_phase(self, vcjob: Mapping[str, Any], phase: str, **counts: int) -> None:
        meta = vcjob["metadata"]
        await self.patch(
            VOLCANO_JOB,
            meta["namespace"],
            meta["name"],
            {"status": {"state": {"phase": phase}, **counts}},
            sub="status",
        )

    async def create_pytorchjob(
        self, namespace: str, name: str, *, masters: int = 1, workers: int = 2
    ) -> dict[str, Any]:
        specs: dict[str, Any] = {}
        for rtype, n in (("Master", masters), ("Worker", workers)):
            if n:
                specs[rtype] = {
                    "replicas": n,
                    "restartPolicy": "OnFailure",
                    "template": {"spec": {"containers": [self._container_spec("pytorch")]}},
                }
        body = {
            "apiVersion": "kubeflow.org/v1",
            "kind": "PyTorchJob",
            "metadata": self._meta(name, namespace),
            "spec": {"pytorchReplicaSpecs": specs},
        }
        # The CRD has a status subresource: the API server drops a status sent with the create. The
        # training-operator writes the Created condition through the subresource.
        await self.create(PYTORCH_JOB, body)
        now = rfc3339()
        created_condition = {
            "type": "Created",
            "status": "True",
            "reason": "PyTorchJobCreated",
            "message": f"PyTorchJob {name} is created.",
            "lastUpdateTime": now,
            "lastTransitionTime": now,
        }
        return await self.patch(
            PYTORCH_JOB, namespace, name, {"status": {"conditions": [created_condition]}}, sub="status"
        )

    async def create_pytorchjob_pods(self, pj: Mapping[str, Any], *, rank_env: bool = True) -> list[dict[str, Any]]:
        """The pods the training-operator creates (`<job>-master-0`, `<job>-worker-<i>`), with its labels
        and env: PYTHONUNBUFFERED, and with `rank_env` MASTER_ADDR / MASTER_PORT / WORLD_SIZE / RANK and
        their PET_* twins, PET_NPROC_PER_NODE, PET_NNODES (workers: index + 1 with a master); without
        it, labels only."""
        meta, specs = pj["metadata"], pj["spec"]["pytorchReplicaSpecs"]
        jname, ns = meta["name"], meta["namespace"]
        world = sum(int(s["replicas"]) for s in specs.values())
        has_master = "Master" in specs
        pods = []
        for rtype, s in specs.items():
            for i in range(int(s["replicas"])):
                lower = rtype.lower()
                labels = {
                    "training.kubeflow.org/job-name": jname,
                    "training.kubeflow.org/operator-name": "pytorchjob-controller",
                    "training.kubeflow.org/replica-type": lower,
                    "training.kubeflow.org/replica-index": str(i),
                }
                if lower == "master":
                    labels["training.kubeflow.org/job-role"] = "master"
                # As training-operator v1.8.1 (pkg/controller.v1/pytorch/envvar.go `setPodEnv`, nprocPerNode
                # defaulted to "auto", counted as 1) writes it into every container: PYTHONUNBUFFERED always;
                # with a Master, its address and port and the rank (plain and PET_ for torchrun);
                # PET_NPROC_PER_NODE; PET_NNODES unless elastic (the real operator's pods on the real
                # plane carry the same, tests/realplane/test_workloads.py).
                env = {"PYTHONUNBUFFERED": "1"}
                if rank_env:
                    rank = i + 1 if lower == "worker" and has_master else i
                    master = f"{jname}-master-0"
                    if has_master:
                        env.update(
                            {
                                "MASTER_PORT": "23456",
                                "PET_MASTER_PORT": "23456",
                                "MASTER_ADDR": master,
                                "PET_MASTER_ADDR": master,
                                "WORLD_SIZE": str(world),
                                "RANK": str(rank),
                                "PET_NODE_RANK": str(rank),
                            }
                        )
                    env["PET_NPROC_PER_NODE"] = "auto"
                    env["PET_NNODES"] = str(world)
                pods.append(
                    await self.create_pod(
                        ns,
                        f"{jname}-{lower}-{i}",
                        labels=labels,
                        owner=pj,
                        containers=("pytorch",),
                        env=env,
                        restart_policy="OnFailure",
                    )
                )
        return pods

    async def set_pytorchjob_condition(
        self, pj: Mapping[str, Any], ctype: str, *, reason: str = "", message: str = ""
    ) -> None:
        """Append a condition as the training-operator does (the newest last; earlier ones turn False)."""
        meta = pj["metadata"]
        obj = await self.kube.call("GET", _path(PYTORCH_JOB, meta["namespace"], meta["name"]))
        conds = [
            dict(c, status="False") if c.get("type") == "Running" else dict(c)
            for c in (obj.get("status") or {}).get("conditions") or []
        ]
        conds.append(
            {
                "type": ctype,
                "status": "True",
                "reason": reason or f"PyTorchJob{ctype}",
                "message": message,
                "lastTransitionTime": rfc3339(),
            }
        )
        await self.patch(PYTORCH_JOB, meta["namespace"], meta["name"], {"status": {"conditions": conds}}, sub="status")

    # -- pods --------------------------------------------------------------------------------------

    async def create_pod(
        self,
        namespace: str,
        name: str,
        *,
        labels: Mapping[str, str] | None = None,
        annotations: Mapping[str, str] | None = None,
        owner: Mapping[str, Any] | None = None,
        containers: Sequence[str] = ("trainer",),
        env: Mapping[str, str] | None = None,
        restart_policy: str = "Never",
        template: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """A pod as a controller creates it. With `template` (a workload's pod template), its spec is
        the template's (containers with their env, args and resources; affinity, tolerations), the
        template's labels and annotations are kept, and `env` is added to every container."""
        spec: dict[str, Any] = {
            "restartPolicy": restart_policy,
            "schedulerName": "default-scheduler",
            "containers": [self._container_spec(c, env) for c in containers],
        }
        qos = "BestEffort"
        if template is not None:
            tmeta = template.get("metadata") or {}
            labels = {**(tmeta.get("labels") or {}), **(labels or {})}
            annotations = {**(tmeta.get("annotations") or {}), **(annotations or {})}
            spec = json.loads(json.dumps(template.get("spec") or {}))
            spec.setdefault("restartPolicy", restart_policy)
            spec.setdefault("schedulerName", "default-scheduler")
            for c in spec.get("containers") or []:
                if env:
                    c["env"] = [*(c.get("env") or []), *({"name": k, "value": v} for k, v in env.items())]
                if c.get("resources"):
                    qos = "Burstable"
            containers = [str(c["name"]) for c in spec.get("containers") or []]
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": self._meta(name, namespace, labels=labels, annotations=annotations, owner=owner),
            "spec": spec,
            "status": {"phase": "Pending", "qosClass": qos},
        }
        created = await self.create(POD, body)
        meta = created["metadata"]
        self.pods[(namespace, name)] = _Pod(
            namespace, name, meta["uid"], {c: _Container(c) for c in containers}, restart_policy
        )
        return created

    def _pod(self, pod: PodRef | _Pod) -> _Pod:
        return pod if isinstance(pod, _Pod) else self.pods[_ref(pod)]

    async def _push(self, p: _Pod, extra: Mapping[str, Any] | None = None) -> None:
        status: dict[str, Any] = {
            "phase": p.phase,
            "conditions": p.conditions,
            "containerStatuses": [c.status() for c in p.containers.values()],
        }
        if p.node:
            status["hostIP"] = "10.0.0.1"
            status["podIP"] = "10.244.0.10"
        status.update(extra or {})
        await self.patch(POD, p.namespace, p.name, {"status": status}, sub="status")

    async def event(
        self,
        namespace: str,
        *,
        kind: str,
        name: str,
        reason: str,
        message: str,
        type: str = "Normal",
        uid: str | None = None,
        involved_uid: str | None = None,
        host: str | None = None,
        component: str = "kubelet",
        count: int = 1,
        at: float | None = None,
    ) -> dict[str, Any]:
        """Create (or, with the same `uid`, bump the count of) a core/v1 Event."""
        now = rfc3339(at)
        ev_name = f"{name}.{secrets.token_hex(8)}"
        body: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": self._version(
                {"name": ev_name, "namespace": namespace, "uid": uid or str(uuid.uuid4()), "creationTimestamp": now}
            ),
            "involvedObject": {
                "kind": kind,
                "name": name,
                "namespace": namespace if kind != "Node" else "",
                "apiVersion": "v1",
            },
            "reason": reason,
            "message": message,
            "type": type,
            "count": count,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "source": {"component": component, **({"host": host} if host else {})},
            "reportingComponent": component,
            "reportingInstance": host or "",
        }
        if involved_uid:
            body["involvedObject"]["uid"] = involved_uid
        return await self.create(EVENT, body)

    async def bump_event(self, event: Mapping[str, Any], count: int) -> None:
        """The same event seen again: its count and lastTimestamp move (what the event recorder does)."""
        meta = event["metadata"]
        await self.patch("v1/events", meta["namespace"], meta["name"], {"count": count, "lastTimestamp": rfc3339()})

    async def pod_event(self, pod: PodRef | _Pod, reason: str, message: str, *, type: str = "Normal") -> dict[str, Any]:
        p = self._pod(pod)
        return await self.event(
            p.namespace,
            kind="Pod",
            name=p.name,
            involved_uid=p.uid,
            reason=reason,
            message=message,
            type=type,
            host=p.node,
        )

    async def node_oom(self, node: str, message: str) -> dict[str, Any]:
        """node-problem-detector's kernel monitor: OOMKilling on the Node."""
        return await self.event(
            "default",
            kind="Node",
            name=node,
            reason="OOMKilling",
            message=message,
            type="Warning",
            host=node,
            component="kernel-monitor",
        )

    async def bind(self, pod: PodRef, node: str) -> None:
        """The scheduler: bind the pod to a node (spec.nodeName, PodScheduled) and say so."""
        p = self._pod(pod)
        p.node = node
        await self.patch(POD, p.namespace, p.name, {"spec": {"nodeName": node}})
        p.conditions = [{"type": "PodScheduled", "status": "True", "lastTransitionTime": rfc3339()}]
        await self._push(p)
        await self.event(
            p.namespace,
            kind="Pod",
            name=p.name,
            involved_uid=p.uid,
            reason="Scheduled",
            message=f"Successfully assigned {p.namespace}/{p.name} to {node}",
            component="default-scheduler",
        )

    async def start(self, pod: PodRef, containers: Sequence[str] | None = None, *, events: bool = True) -> None:
        """The kubelet: pull, create and start containers (a new instance each, with a new container ID)."""
        p = self._pod(pod)
        for name in containers or list(p.containers):
            c = p.containers[name]
            if c.live() is None:
                c.instances.append(_Instance(f"containerd://{secrets.token_hex(32)}"))
            c.state = {"running": {"startedAt": rfc3339()}}
            c.ready = c.started = True
            if events:
                await self.pod_event(
                    p, "Pulled", 'Container image "registry.example/train:1" already present on machine'
                )
                await self.pod_event(p, "Created", f"Created container {name}")
                await self.pod_event(p, "Started", f"Started container {name}")
        p.phase = "Running"
        p.conditions = [
            {"type": t, "status": "True", "lastTransitionTime": rfc3339()}
            for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")
        ]
        await self._push(p, {"startTime": rfc3339()})

    async def terminate(
        self,
        pod: PodRef,
        container: str | None = None,
        *,
        reason: str = "Error",
        exit_code: int = 1,
        signal: int | None = None,
        restart: bool = False,
        message: str = "",
    ) -> None:
        """A container exits. With `restart`, the kubelet keeps the pod and backs off before the next run
        (state waiting CrashLoopBackOff, the termination in lastState); otherwise the pod ends
        (Failed, or Succeeded when every container exited 0)."""
        p = self._pod(pod)
        c = p.containers[container or next(iter(p.containers))]
        inst = c.live()
        now = rfc3339()
        started = c.state.get("running", {}).get("startedAt", now)
        term: dict[str, Any] = {"exitCode": exit_code, "reason": reason, "startedAt": started, "finishedAt": now}
        if inst is not None:
            term["containerID"] = inst.cid
            inst.running = False
            inst.end_streams()
        if signal is not None:
            term["signal"] = signal
        if message:
            term["message"] = message
        c.ready = c.started = False
        if restart:
            c.last_state = {"terminated": term}
            c.state = {
                "waiting": {
                    "reason": "CrashLoopBackOff",
                    "message": f"back-off 10s restarting failed container={c.name} pod={p.name}_{p.namespace}({p.uid})",
                }
            }
            p.conditions = [
                dict(cond, status="False") if cond["type"] in ("Ready", "ContainersReady") else cond
                for cond in p.conditions
            ]
            await self._push(p)
            await self.pod_event(
                p,
                "BackOff",
                f"Back-off restarting failed container {c.name} in pod {p.name}_{p.namespace}({p.uid})",
                type="Warning",
            )
            return
        c.state = {"terminated": term}
        if all("terminated" in x.state for x in p.containers.values()):
            codes = [x.state["terminated"]["exitCode"] for x in p.containers.values()]
            p.phase = "Succeeded" if all(code == 0 for code in codes) else "Failed"
        await self._push(p)

    async def restart(self, pod: PodRef, container: str | None = None) -> None:
        """The back-off is over: the kubelet starts the next instance (restartCount + 1)."""
        p = self._pod(pod)
        c = p.containers[container or next(iter(p.containers))]
        c.restarts += 1
        c.instances.append(_Instance(f"containerd://{secrets.token_hex(32)}"))
        c.state = {"running": {"startedAt": rfc3339()}}
        c.ready = c.started = True
        p.phase = "Running"
        p.conditions = [dict(cond, status="True") for cond in p.conditions]
        await self._push(p)
        await self.pod_event(p, "Started", f"Started container {c.name}")

    async def label_pod(self, pod: PodRef, labels: Mapping[str, str]) -> None:
        ns, name = _ref(pod)
        await self.patch(POD, ns, name, {"metadata": {"labels": dict(labels)}})

    async def touch_pod(self, pod: PodRef) -> None:
        """A status write that changes nothing a diagnosis uses (probe times, a condition's timestamp)."""
        p = self._pod(pod)
        p.conditions = [dict(cond, lastProbeTime=rfc3339()) for cond in p.conditions]
        await self._push(p)

    async def delete_pod(self, pod: PodRef) -> None:
        p = self.pods.pop(_ref(pod))
        for c in p.containers.values():
            for inst in c.instances:
                inst.running = False
                inst.end_streams()
        await self.delete(POD, p.namespace, p.name)

    # -- logs --------------------------------------------------------------------------------------

    def write_log(self, pod: PodRef, container: str, *lines: str, at_ns: int | None = None) -> None:
        """Lines written by the running instance of a container (stamped now, or all at `at_ns`)."""
        c = self._pod(pod).containers[container]
        inst = c.live()
        if inst is None:
            raise RuntimeError(f"container {container} of {_ref(pod)} is not running")
        for text in lines:
            ts = at_ns if at_ns is not None else time.time_ns()
            inst.lines.append((ts, text))
            for q, stamps in inst.streams.items():
                q.put_nowait(self._fmt(ts, text, stamps))

    def drop_log_streams(self, pod: PodRef, container: str | None = None) -> int:
        """Cut the open follow streams (an API server restart, a proxy timeout); the container runs on."""
        p = self._pod(pod)
        n = 0
        for c in p.containers.values():
            if container is None or c.name == container:
                for inst in c.instances:
                    n += len(inst.streams)
                    inst.end_streams()
        return n

    def open_log_streams(self, pod: PodRef) -> int:
        p = self.pods.get(_ref(pod))
        return 0 if p is None else sum(len(i.streams) for c in p.containers.values() for i in c.instances)

    @staticmethod
    def _fmt(ts: int, text: str, stamps: bool) -> bytes:
        return (f"{rfc3339nano(ts)} {text}\n" if stamps else f"{text}\n").encode()

    @staticmethod
    def _bad_request(message: str) -> Any:
        return kmock.KubernetesError(status=400, reason="BadRequest", message=message)

    async def _serve_log(self, request: Any) -> Any:
        """GET .../pods/<name>/log as the kubelet (through the API server) answers it."""
        params = dict(request.params)
        self.log_requests.append({"namespace": request.namespace, "pod": request.name, **params})
        p = self.pods.get((request.namespace, request.name))
        if p is None:
            return kmock.KubernetesObjectNotFoundError()
        cname = params.get("container") or next(iter(p.containers))
        c = p.containers.get(cname)
        if c is None:
            return self._bad_request(f"container {cname} is not valid for pod {p.name}")
        last_cid = (c.last_state.get("terminated") or {}).get("containerID")
        previous = params.get("previous") == "true"
        if previous:
            inst = next((i for i in c.instances if i.cid == last_cid), None)
            if inst is None:
                return self._bad_request(f'previous terminated container "{cname}" in pod "{p.name}" not found')
        elif "running" in c.state or "terminated" in c.state:
            inst = c.instances[-1]
        elif last_cid is not None:
            inst = next(i for i in c.instances if i.cid == last_cid)
        else:
            reason = c.state.get("waiting", {}).get("reason", "ContainerCreating")
            return self._bad_request(f'container "{cname}" in pod "{p.name}" is waiting to start: {reason}')
        stamps = params.get("timestamps") == "true"
        lines = inst.lines
        if "sinceSeconds" in params:
            floor = time.time_ns() - int(params["sinceSeconds"]) * 1_000_000_000
            lines = [ln for ln in lines if ln[0] >= floor]
        if "tailLines" in params:
            tail = int(params["tailLines"])
            lines = lines[-tail:] if tail > 0 else []
        body = b"".join(self._fmt(ts, text, stamps) for ts, text in lines)
        if "limitBytes" in params:
            body = body[: max(0, int(params["limitBytes"]))]
        if params.get("follow") == "true" and inst.running and not previous:
            queue: asyncio.Queue[bytes | None] = asyncio.Queue()
            inst.streams[queue] = stamps
            return self._follow(body, queue, inst)
        return body

    @staticmethod
    async def _follow(head: bytes, queue: asyncio.Queue[bytes | None], inst: _Instance) -> AsyncIterator[bytes]:
        try:
            yield head  # also sends the headers at once when there is nothing yet
            while True:
                item = await queue.get()
                if item is None:
                    return
                yield item
        finally:
            inst.streams.pop(queue, None)

    # -- exec --------------------------------------------------------------------------------------

    def on_exec(self, pod: PodRef, handler: ExecHandler | None) -> None:
        """What commands do in this pod's containers from now on (None: the default container)."""
        key = _ref(pod)
        if handler is None:
            self._exec_handlers.pop(key, None)
        else:
            self._exec_handlers[key] = handler

    def forbid_exec(self, pod: PodRef, user: str = "system:serviceaccount:trainmedic:trainmedic") -> None:
        """RBAC without pods/exec: the API server answers 403 before anything runs."""
        ns, name = _ref(pod)
        message = (
            f'pods "{name}" is forbidden: User "{user}" cannot create resource "pods/exec" '
            f'in API group "" in the namespace "{ns}"'
        )
        self.on_exec(pod, lambda _c, _argv: ExecReply(status=403, message=message))

    def set_processes(self, pod: PodRef, container: str, processes: Sequence[FakeProcess]) -> None:
        """The processes the default exec handler shows in a container."""
        self._pod(pod).processes[container] = list(processes)

    def _processes(self, p: _Pod, container: str) -> list[FakeProcess]:
        if container in p.processes:
            return p.processes[container]
        return [FakeProcess(1, "python train.py", handles_sigusr1=True, stack=DEFAULT_STACK)]

    def _default_exec(self, p: _Pod, container: str, argv: list[str]) -> ExecReply:
        """A container with a POSIX shell and /proc, without py-spy."""
        if argv[:2] == ["sh", "-c"] and len(argv) == 3:
            script = argv[2]
            if script == PROCESS_LIST_SCRIPT:
                procs = self._processes(p, container)
                out = "".join(
                    f"{x.pid}\t{_SIGCGT_USR1 if x.handles_sigusr1 else _SIGCGT_PLAIN}\t{x.cmdline}\n"
                    for x in procs
                    if "python" in x.cmdline
                )
                return ExecReply(stdout=out)
            m = re.fullmatch(r"kill -(?:USR1|SIGUSR1|10)((?: \d+)+)", script.strip())
            if m:
                return self._sigusr1(p, container, [int(x) for x in m.group(1).split()])
            word = script.split()[0] if script.split() else script
            return ExecReply(stderr=f"sh: 1: {word}: not found\n", exit_code=127)
        if argv and argv[0] in ("sh", "/bin/sh", "kill", "cat", "ls"):
            return ExecReply(stderr=f"{argv[0]}: usage not emulated: {argv[1:]}\n", exit_code=2)
        program = argv[0] if argv else ""
        return ExecReply(
            exit_code=None,
            failure=(
                "failed to exec in container: failed to start exec: OCI runtime exec failed: exec failed: "
                f'unable to start container process: exec: "{program}": executable file not found in $PATH: unknown'
            ),
        )

    def _sigusr1(self, p: _Pod, container: str, pids: list[int]) -> ExecReply:
        procs = {x.pid: x for x in self._processes(p, container)}
        err = ""
        for pid in pids:
            proc = procs.get(pid)
            if proc is None:
                err += "sh: 1: kill: No such process\n"
                continue
            if proc.handles_sigusr1:
                self.write_log(p.namespace + "/" + p.name, container, *proc.stack.splitlines())
        return ExecReply(stderr=err, exit_code=1 if err else 0)

    async def _serve_exec(self, request: Any) -> Any:
        """GET .../pods/<name>/exec: checks as the API server and kubelet make them, then the upgrade."""
        raw = request._raw_request
        argv = list(raw.query.getall("command", []))
        container = raw.query.get("container")
        self.exec_requests.append(
            {
                "namespace": request.namespace,
                "pod": request.name,
                "container": container,
                "command": argv,
                "protocols": raw.headers.get("Sec-WebSocket-Protocol", ""),
            }
        )
        key = (request.namespace, request.name)
        handler = self._exec_handlers.get(key)
        p = self.pods.get(key)
        reply: ExecReply | None = None
        if handler is not None:
            # RBAC is checked before the pod is looked at: a handler may refuse first.
            result = handler(container or "", argv)
            reply = await result if inspect.isawaitable(result) else result
            if reply.status is not None:
                reason = {403: "Forbidden", 404: "NotFound", 400: "BadRequest"}.get(reply.status, "Failure")
                return kmock.KubernetesError(status=reply.status, reason=reason, message=reply.message)
        if p is None:
            return kmock.KubernetesObjectNotFoundError()
        cname = container or next(iter(p.containers))
        c = p.containers.get(cname)
        if c is None:
            return self._bad_request(f"container {cname} is not valid for pod {p.name}")
        if "running" not in c.state:
            return self._bad_request(f'unable to upgrade connection: container not found ("{cname}")')
        if not argv:
            return self._bad_request("you must specify at least 1 command")
        if raw.headers.get("Upgrade", "").lower() != "websocket":
            return self._bad_request("Upgrade request required")
        if reply is None:
            reply = self._default_exec(p, cname, argv)
        return self._exec_session(raw, reply)

    @staticmethod
    async def _exec_session(raw: Any, reply: ExecReply) -> AsyncIterator[bytes]:
        import aiohttp.web

        ws = aiohttp.web.WebSocketResponse(protocols=("v5.channel.k8s.io", "v4.channel.k8s.io"))
        await ws.prepare(raw)
        try:
            if reply.delay_s:
                await asyncio.sleep(reply.delay_s)
            for channel, data in ((1, reply.stdout), (2, reply.stderr)):
                body = data.encode() if isinstance(data, str) else data
                for i in range(0, len(body), 32 * 1024):
                    await ws.send_bytes(bytes([channel]) + body[i : i + 32 * 1024])
            if reply.exit_code == 0:
                status: dict[str, Any] = {"metadata": {}, "status": "Success"}
            elif reply.exit_code is not None:
                status = {
                    "metadata": {},
                    "status": "Failure",
                    "message": f"command terminated with non-zero exit code: exit status {reply.exit_code}",
                    "reason": "NonZeroExitCode",
                    "details": {"causes": [{"reason": "ExitCode", "message": str(reply.exit_code)}]},
                }
            else:
                status = {"metadata": {}, "status": "Failure", "message": reply.failure or "exec failed"}
            await ws.send_bytes(b"\x03" + json.dumps(status).encode())
            await ws.close()
        except (ConnectionError, RuntimeError):
            pass  # the client went away (its own timeout)
        finally:
            if not ws.closed:
                await ws.close()
        # kmock streams what this yields; the websocket has closed the connection, so its response
        # start meets a closed transport, which kmock ignores.
        yield b""
