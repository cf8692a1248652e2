"""A real Kubernetes control plane on loopback: the tests' (issue 15) and `trainmedic demo --cluster real`'s.

etcd, kube-apiserver, kube-controller-manager and kube-scheduler built with `go build` from the
`k8s.io/kubernetes` module pinned in tests/cluster/go.mod and the etcd server it uses
(tests/cluster/build.sh, run by `make cluster`), and KWOK (one process per node) playing the kubelets
of fake nodes (by default four with 8 `nvidia.com/gpu` each, two with 8 `huawei.com/Ascend910` each).

The API server serves TLS with certificates made here (openssl), authenticates clients by
certificate (the admin is in `system:masters`) and by service-account token (signed with a key made
here), and authorizes with Node and RBAC: what a ServiceAccount may do is what its bindings say.
The controller manager runs the controllers the agent relies on (service accounts and their tokens,
Job, garbage collector, node lifecycle with short grace periods, taint eviction, namespaces); the
scheduler is the stock one.

`KubePlane.start()` brings all of it up on free ports in a directory and waits until the nodes are
Ready; `stop()` ends every process (SIGTERM, then SIGKILL). `restart_apiserver()` stops and starts
the API server alone, on the same port and etcd (a watch then loses its connection), and `compact()`
compacts etcd up to its current revision (an older resourceVersion then answers 410).

`missing()` lists what is not built (`make cluster` builds it into `bin_dir()`). Only the standard
library, PyYAML and (for `api_client`) the kubernetes client are needed: nothing of the tests.
"""

from __future__ import annotations

import base64
import functools
import json
import os
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]  # the checkout (where `make cluster` is run)
GO_MOD = ROOT / "tests" / "cluster" / "go.mod"
# The release tests/cluster/go.mod pins (read from it where the checkout is; this where it is not).
KUBE_VERSION = "v1.34.4"
MAKE_CLUSTER = "make cluster"
COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")
# The node lifecycle controller's settings under test: a node whose lease is not renewed for
# NODE_GRACE_S is NotReady (Unknown) and tainted unreachable. Production keeps the defaults (40s+).
NODE_GRACE_S = 6
NODE_MONITOR_PERIOD_S = 1
NODE_LEASE_S = 4


def kube_version() -> str:
    if not GO_MOD.is_file():
        return KUBE_VERSION
    for line in GO_MOD.read_text().splitlines():
        words = line.split()
        if words[:1] == ["require"]:
            words = words[1:]
        if len(words) >= 2 and words[0] == "k8s.io/kubernetes":
            return words[1]
    raise RuntimeError(f"{GO_MOD} does not require k8s.io/kubernetes")


def bin_dir() -> Path:
    """Where tests/cluster/build.sh puts the binaries: ${XDG_CACHE_HOME:-~/.cache}/trainmedic/kube-<v>/bin."""
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "trainmedic" / f"kube-{kube_version()}" / "bin"


def missing() -> list[str]:
    out = [str(bin_dir() / c) for c in COMPONENTS if not os.access(bin_dir() / c, os.X_OK)]
    if not (bin_dir().parent / "kwok-stages.yaml").is_file():
        out.append(str(bin_dir().parent / "kwok-stages.yaml"))
    return out


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_pki(d: Path) -> None:
    """A CA, the API server's serving certificate (127.0.0.1, localhost), the admin's client
    certificate (O=system:masters) and the service-account signing key pair."""
    d.mkdir(parents=True, exist_ok=True)
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    _openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-days", "2",
             "-subj", "/CN=trainmedic-test-ca", cwd=d)  # fmt: skip
    _openssl("req", "-x509", *ec, "-CA", "ca.crt", "-CAkey", "ca.key", "-keyout", "apiserver.key",
             "-out", "apiserver.crt", "-days", "2", "-subj", "/CN=kube-apiserver",
             "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes.default.svc",
             "-addext", "extendedKeyUsage=serverAuth", "-addext", "basicConstraints=critical,CA:FALSE",
             cwd=d)  # fmt: skip
    _openssl("req", "-x509", *ec, "-CA", "ca.crt", "-CAkey", "ca.key", "-keyout", "admin.key",
             "-out", "admin.crt", "-days", "2", "-subj", "/O=system:masters/CN=trainmedic-test-admin",
             "-addext", "extendedKeyUsage=clientAuth", "-addext", "basicConstraints=critical,CA:FALSE",
             cwd=d)  # fmt: skip
    _openssl("genrsa", "-out", "sa.key", "2048", cwd=d)
    _openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=d)


@dataclass
class Proc:
    name: str
    argv: list[str]
    log: Path
    env: Mapping[str, str] = field(default_factory=dict)
    popen: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        out = self.log.open("ab")
        try:
            self.popen = subprocess.Popen(
                self.argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env={**os.environ, **self.env}
            )
        finally:
            out.close()

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def stop(self, timeout: float = 10.0) -> None:
        p = self.popen
        if p is None or p.poll() is not None:
            return
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout)

    def tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


@dataclass(frozen=True)
class FakeNode:
    name: str
    resource: str  # nvidia.com/gpu or huawei.com/Ascend910
    count: int = 8
    labels: Mapping[str, str] = field(default_factory=dict)


GPU_LABELS = {"node.kubernetes.io/instance-type": "h100x8"}
NPU_LABELS = {"node.kubernetes.io/instance-type": "ascend910x8"}
DEFAULT_NODES = (
    *(FakeNode(f"gpu-{i}", "nvidia.com/gpu", labels=GPU_LABELS) for i in range(1, 5)),
    *(FakeNode(f"npu-{i}", "huawei.com/Ascend910", labels=NPU_LABELS) for i in range(1, 3)),
)


class KubePlane:
    """The whole plane; see the module docstring."""

    def __init__(
        self,
        workdir: Path,
        nodes: Sequence[FakeNode] = DEFAULT_NODES,
        *,
        node_grace_s: int = NODE_GRACE_S,
        node_monitor_period_s: int = NODE_MONITOR_PERIOD_S,
        node_lease_s: int = NODE_LEASE_S,
    ) -> None:
        self.dir = workdir
        self.nodes = list(nodes)
        self.node_grace_s = node_grace_s
        self.node_monitor_period_s = node_monitor_period_s
        self.node_lease_s = node_lease_s
        self.bin = bin_dir()
        self.pki = workdir / "pki"
        self.port = free_port()
        self.url = f"https://127.0.0.1:{self.port}"
        self.etcd_port = free_port()
        self.etcd_url = f"http://127.0.0.1:{self.etcd_port}"
        self.kubeconfig = workdir / "admin.kubeconfig"
        self.procs: dict[str, Proc] = {}
        self.crd_collections: list[str] = []  # what install_crds installed, cluster-wide list paths
        # When restart_apiserver last brought the API server back (wall clock; 0: never): node leases
        # renewed before it may still read stale to the node lifecycle controller for a while.
        self.apiserver_restarted_at = 0.0

    # -- processes ---------------------------------------------------------------------------------

    def _proc(self, name: str, argv: list[str], env: Mapping[str, str] | None = None) -> Proc:
        p = Proc(name, argv, self.dir / f"{name}.log", dict(env or {}))
        self.procs[name] = p
        p.start()
        return p

    def start_process(self, name: str, argv: list[str], env: Mapping[str, str] | None = None) -> Proc:
        """Start another process of the plane (a workload controller run against it), logging to
        `<dir>/<name>.log`: `stop()` ends it first, and a wait of the plane fails when it has exited."""
        if name in self.procs:
            raise ValueError(f"a process named {name} is already part of the plane")
        return self._proc(name, argv, env)

    def _apiserver_argv(self, *, watch_cache: bool = True) -> list[str]:
        k = self.pki
        return [
            str(self.bin / "kube-apiserver"),
            *([] if watch_cache else ["--watch-cache=false"]),
            f"--etcd-servers={self.etcd_url}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={self.port}",
            f"--tls-cert-file={k / 'apiserver.crt'}",
            f"--tls-private-key-file={k / 'apiserver.key'}",
            f"--client-ca-file={k / 'ca.crt'}",
            "--authorization-mode=Node,RBAC",
            "--service-account-issuer=https://kubernetes.default.svc",
            f"--service-account-key-file={k / 'sa.pub'}",
            f"--service-account-signing-key-file={k / 'sa.key'}",
            "--service-cluster-ip-range=10.96.0.0/16",
            "--allow-privileged=true",
            "--enable-priority-and-fairness=false",
            "--profiling=false",
            "--endpoint-reconciler-type=none",
            "--v=1",
        ]

    def start(self, timeout: float = 90.0) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        make_pki(self.pki)
        self._write_kubeconfig()
        etcd = str(self.bin / "etcd")
        peer = free_port()
        self._proc(
            "etcd",
            [
                etcd,
                "--name=plane",
                f"--data-dir={self.dir / 'etcd'}",
                f"--listen-client-urls={self.etcd_url}",
                f"--advertise-client-urls={self.etcd_url}",
                f"--listen-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-cluster=plane=http://127.0.0.1:{peer}",
                "--log-level=warn",
                "--unsafe-no-fsync",
            ],
        )
        self._wait("etcd", lambda: self._http_ok(f"{self.etcd_url}/health"), timeout)
        self._proc("kube-apiserver", self._apiserver_argv())
        self.wait_apiserver(timeout)
        self._proc(
            "kube-controller-manager",
            [
                str(self.bin / "kube-controller-manager"),
                f"--kubeconfig={self.kubeconfig}",
                "--leader-elect=false",
                "--secure-port=0",
                "--controllers=serviceaccount-controller,serviceaccount-token-controller,job-controller,"
                "garbage-collector-controller,node-lifecycle-controller,taint-eviction-controller,"
                "namespace-controller,pod-garbage-collector-controller,root-ca-certificate-publisher-controller",
                f"--service-account-private-key-file={self.pki / 'sa.key'}",
                f"--root-ca-file={self.pki / 'ca.crt'}",
                f"--node-monitor-period={self.node_monitor_period_s}s",
                f"--node-monitor-grace-period={self.node_grace_s}s",
                "--node-startup-grace-period=20s",
                "--concurrent-job-syncs=10",
                "--kube-api-qps=200",
                "--kube-api-burst=400",
                "--v=1",
            ],
        )
        self._proc(
            "kube-scheduler",
            [
                str(self.bin / "kube-scheduler"),
                f"--kubeconfig={self.kubeconfig}",
                f"--authentication-kubeconfig={self.kubeconfig}",
                f"--authorization-kubeconfig={self.kubeconfig}",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                f"--secure-port={free_port()}",
                "--v=1",
            ],
        )
        for n in self.nodes:
            self.add_node(n)
            self.start_kwok(n.name)
        self._wait("the fake nodes Ready", lambda: all(self.node_ready(n.name) for n in self.nodes), timeout)
        self._wait(
            "the default ServiceAccount",
            lambda: self._get("/api/v1/namespaces/default/serviceaccounts/default"),
            timeout,
        )

    def start_kwok(self, node: str) -> None:
        """KWOK playing the kubelet of one node: its lease, status and pods' lifecycle, and the
        kubelet API for the containers' logs (every container on the node serves `node_log(node)`).
        One process per node, so that one node can be lost (`lose_node`) while the others go on."""
        port = free_port()
        log = self.node_log(node)
        log.parent.mkdir(parents=True, exist_ok=True)
        log.touch()
        logs = self.dir / f"kwok-{node}.yaml"
        logs.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "kwok.x-k8s.io/v1alpha1",
                    "kind": "ClusterLogs",
                    "metadata": {"name": "containers"},
                    "spec": {"logs": [{"logsFile": str(log), "follow": True}]},
                }
            )
        )
        self._proc(
            f"kwok-{node}",
            [
                str(self.bin / "kwok"),
                f"--kubeconfig={self.kubeconfig}",
                f"--config={self.bin.parent / 'kwok-stages.yaml'}",
                f"--config={logs}",
                f"--manage-single-node={node}",
                f"--node-lease-duration-seconds={self.node_lease_s}",
                "--cidr=10.244.0.0/16",
                # The node's kubelet endpoint is KWOK's own server (logs through the API server).
                "--node-ip=127.0.0.1",
                f"--node-port={port}",
                f"--server-address=127.0.0.1:{port}",
                f"--tls-cert-file={self.pki / 'apiserver.crt'}",
                f"--tls-private-key-file={self.pki / 'apiserver.key'}",
            ],
        )

    def start_bulk_kwok(self, label: str) -> None:
        """One KWOK process playing the kubelets of every node labelled `label`=true (the scale
        figures' thousand nodes: one process each would not fit the machine). No kubelet API."""
        self._proc(
            f"kwok-bulk-{label.replace('/', '-')}",
            [
                str(self.bin / "kwok"),
                f"--kubeconfig={self.kubeconfig}",
                f"--config={self.bin.parent / 'kwok-stages.yaml'}",
                f"--manage-nodes-with-label-selector={label}=true",
                f"--node-lease-duration-seconds={self.node_lease_s}",
                "--cidr=10.244.0.0/16",
                "--node-ip=127.0.0.1",
            ],
        )

    def node_log(self, node: str) -> Path:
        """The log every container on `node` serves (CRI format: `write_log` appends to it)."""
        return self.dir / "logs" / f"{node}.log"

    def write_log(self, node: str, line: str, stream: str = "stdout") -> None:
        """Append a line to the containers' log on `node`, as the container runtime writes it."""
        now = time.time()
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1e9):09d}Z"
        with self.node_log(node).open("a") as f:
            f.write(f"{stamp} {stream} F {line}\n")

    def lose_node(self, name: str) -> None:
        """The node's kubelet goes silent (KWOK for it stops): no more lease renewals or status."""
        self.procs[f"kwok-{name}"].stop()

    def revive_node(self, name: str) -> None:
        """KWOK plays the node's kubelet again (it renews the lease; the node turns Ready)."""
        if not self.procs[f"kwok-{name}"].alive():
            self.start_kwok(name)

    def stop(self) -> None:
        core = ("kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd")
        others = [n for n in self.procs if n not in core]  # the KWOKs, what start_process started
        for name in (*others, *core):
            p = self.procs.get(name)
            if p is not None:
                p.stop()

    def restart_apiserver(self, timeout: float = 60.0, *, watch_cache: bool = True) -> None:
        """Stop the API server and start it again on the same port and etcd. Without its watch cache,
        watches are served by etcd itself (and the API server sends no bookmarks on shutdown)."""
        self.procs["kube-apiserver"].stop()
        self._proc("kube-apiserver", self._apiserver_argv(watch_cache=watch_cache))
        self.wait_apiserver(timeout)
        self.apiserver_restarted_at = time.time()
        # Ready is not yet serving the custom resources: their collections answer 429 for a moment.
        for collection in self.crd_collections:
            self._wait(f"{collection} served again", functools.partial(self._get, collection), timeout)

    def wait_apiserver(self, timeout: float = 60.0) -> None:
        self._wait("kube-apiserver ready", lambda: self._get("/readyz") is not None, timeout)

    def compact(self) -> int:
        """Compact etcd at its current revision (physical); returns that revision."""
        status = self._etcd("/v3/kv/range", {"key": base64.b64encode(b"/").decode(), "limit": 1})
        rev = int(status["header"]["revision"])
        self._etcd("/v3/kv/compaction", {"revision": rev, "physical": True})
        return rev

    def _etcd(self, path: str, body: Mapping[str, Any]) -> Any:
        req = urllib.request.Request(
            self.etcd_url + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=10) as r:
            return json.loads(r.read())

    def _wait(self, what: str, ok: Callable[[], Any], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                if ok():
                    return
            except (OSError, urllib.error.URLError, ValueError):
                pass
            dead = [p for p in self.procs.values() if not p.alive() and p.popen is not None]
            if dead or time.monotonic() > deadline:
                logs = "\n".join(f"--- {p.name}\n{p.tail()}" for p in (dead or self.procs.values()))
                raise RuntimeError(f"timed out or a process exited waiting for {what}:\n{logs}")
            time.sleep(0.2)

    # -- the API, as the admin ---------------------------------------------------------------------

    def _ssl(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.pki / "ca.crt"))
        ctx.load_cert_chain(str(self.pki / "admin.crt"), str(self.pki / "admin.key"))
        return ctx

    def request(self, method: str, path: str, body: Any = None, *, content_type: str = "application/json") -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method, headers={"Content-Type": content_type})
        with urllib.request.urlopen(req, timeout=15, context=self._ssl()) as r:
            raw = r.read()
        try:
            return json.loads(raw) if raw else None
        except ValueError:
            return raw.decode()

    def _get(self, path: str) -> Any:
        try:
            return self.request("GET", path)
        except urllib.error.HTTPError as e:
            if e.code == 404:
                return None
            raise

    def _http_ok(self, url: str) -> bool:
        with urllib.request.urlopen(url, timeout=2) as r:
            return bool(r.status == 200)

    def _write_kubeconfig(self) -> None:
        self.write_kubeconfig(self.kubeconfig)

    def write_kubeconfig(self, path: Path, token: str | None = None, namespace: str | None = None) -> Path:
        """A kubeconfig for the admin (client certificate), or for the bearer of `token` (a
        ServiceAccount's), optionally with a default namespace."""
        user: dict[str, str] = (
            {"client-certificate": str(self.pki / "admin.crt"), "client-key": str(self.pki / "admin.key")}
            if token is None
            else {"token": token}
        )
        context: dict[str, str] = {"cluster": "plane", "user": "admin" if token is None else "bearer"}
        if namespace is not None:
            context["namespace"] = namespace
        cfg = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {"name": "plane", "cluster": {"server": self.url, "certificate-authority": str(self.pki / "ca.crt")}}
            ],
            "users": [{"name": context["user"], "user": user}],
            "contexts": [{"name": "plane", "context": context}],
            "current-context": "plane",
        }
        path.write_text(yaml.safe_dump(cfg))
        return path

    def configuration(self, token: str | None = None) -> Any:
        """A kubernetes.client.Configuration for the admin, or for the bearer of `token`."""
        from kubernetes import client as kclient

        cfg = kclient.Configuration(host=self.url)
        cfg.ssl_ca_cert = str(self.pki / "ca.crt")
        if token is None:
            cfg.cert_file = str(self.pki / "admin.crt")
            cfg.key_file = str(self.pki / "admin.key")
        else:
            cfg.api_key = {"authorization": f"Bearer {token}"}
        return cfg

    def api_client(self, token: str | None = None) -> Any:
        from kubernetes import client as kclient

        return kclient.ApiClient(self.configuration(token))

    def service_account_token(self, namespace: str, name: str, seconds: int = 3600) -> str:
        """A token for the ServiceAccount from the TokenRequest API (what a projected volume holds)."""
        body = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"expirationSeconds": seconds},
        }
        out = self.request("POST", f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token", body)
        return str(out["status"]["token"])

    def apply(self, docs: Sequence[Mapping[str, Any]]) -> None:
        """Create each object (as `kubectl create` would; an existing one is replaced)."""
        for doc in docs:
            path = collection_path(doc)
            try:
                self.request("POST", path, dict(doc))
            except urllib.error.HTTPError as e:
                if e.code != 409:
                    raise RuntimeError(f"creating {doc['kind']} {doc['metadata']['name']}: {e.read().decode()}") from e
                cur = self.request("GET", f"{path}/{doc['metadata']['name']}")
                new = dict(doc)
                new["metadata"] = {**doc["metadata"], "resourceVersion": cur["metadata"]["resourceVersion"]}
                self.request("PUT", f"{path}/{doc['metadata']['name']}", new)

    def install_crds(self, files: Sequence[Path], timeout: float = 60.0) -> None:
        """Create the CustomResourceDefinitions in `files` and wait until the API server serves each
        (Established, and its collection answers a list)."""
        served: list[tuple[str, str]] = []
        for path in files:
            docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
            self.apply(docs)
            for d in docs:
                spec = d["spec"]
                version = next(v["name"] for v in spec["versions"] if v.get("served"))
                served.append((d["metadata"]["name"], f"/apis/{spec['group']}/{version}/{spec['names']['plural']}"))

        def established(name: str) -> bool:
            crd = self._get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}") or {}
            conds = (crd.get("status") or {}).get("conditions") or []
            return any(c.get("type") == "Established" and c.get("status") == "True" for c in conds)

        for name, collection in served:
            self._wait(f"the CRD {name} established", functools.partial(established, name), timeout)
            self._wait(f"{collection} served", functools.partial(self._get, collection), timeout)
            self.crd_collections.append(collection)

    # -- nodes -------------------------------------------------------------------------------------

    def add_node(self, n: FakeNode) -> None:
        capacity = {"cpu": "96", "memory": "1Ti", "pods": "110", "ephemeral-storage": "2Ti", n.resource: str(n.count)}
        body = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": n.name,
                "annotations": {"node.alpha.kubernetes.io/ttl": "0"},
                "labels": {
                    "kubernetes.io/hostname": n.name,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                    "type": "kwok",
                    **n.labels,
                },
            },
            "status": {"capacity": capacity, "allocatable": capacity},
        }
        self.request("POST", "/api/v1/nodes", body)

    def node(self, name: str) -> dict[str, Any]:
        return dict(self.request("GET", f"/api/v1/nodes/{name}"))

    def node_ready(self, name: str) -> bool:
        conds = (self.node(name).get("status") or {}).get("conditions") or []
        return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds)


def collection_path(doc: Mapping[str, Any]) -> str:
    """The REST collection an object is created in (the built-in and RBAC kinds the tests use)."""
    api_version = str(doc["apiVersion"])
    kind = str(doc["kind"])
    plural = {
        "ServiceAccount": "serviceaccounts",
        "Namespace": "namespaces",
        "Role": "roles",
        "RoleBinding": "rolebindings",
        "ClusterRole": "clusterroles",
        "ClusterRoleBinding": "clusterrolebindings",
        "ConfigMap": "configmaps",
        "Secret": "secrets",
        "Job": "jobs",
        "Pod": "pods",
        "CustomResourceDefinition": "customresourcedefinitions",
    }[kind]
    prefix = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    namespace = (doc.get("metadata") or {}).get("namespace")
    cluster_scoped = kind in ("Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition")
    if namespace and not cluster_scoped:
        return f"{prefix}/namespaces/{namespace}/{plural}"
    return f"{prefix}/{plural}"
