"""The real workload controllers on the real control plane (tests/servers/kubeplane.py): the Kubeflow
Training Operator for PyTorchJobs, and Volcano's job controllers with its scheduler for Volcano Jobs.
Each is built by tests/cluster/build.sh (`make cluster`) from a Go module of its own at the version
it pins, runs as processes of the plane (they stop with it) under its own ServiceAccounts, bound to
the ClusterRoles the project publishes, and without its admission webhooks (see below why).

The Training Operator. Its manager, `cmd/training-operator.v1` of github.com/kubeflow/training-operator at the version
tests/cluster/training-operator/go.mod pins (built by tests/cluster/build.sh, `make cluster`, into
`${XDG_CACHE_HOME:-~/.cache}/trainmedic/training-operator-<version>/bin`), runs as a process of the
plane, the way its own manifests deploy it as far as a plane without kubelets allows:

- as its ServiceAccount `kubeflow/training-operator`, bound to the ClusterRole the project publishes
  (tests/cluster/training-operator/training-operator.yaml, transcribed from its v1.8.1 manifests), with a
  token from the TokenRequest API in its kubeconfig: what it may do is what that role says;
- with only the PyTorchJob controller (`--enable-scheme=pytorchjob`), no gang scheduler (no
  `--gang-scheduler-name`: the stock scheduler places the pods), no leader election, and its
  metrics, health and webhook ports on free ports.

Its admission webhook: v1.8.1 always starts a cert rotator (pkg/cert, open-policy-agent's
cert-controller) and, once that reports ready, its webhook server; the PyTorchJob validation is
served there for the ValidatingWebhookConfiguration `validator.training-operator.kubeflow.org`,
which the deployment points at the Service `training-operator.kubeflow.svc`. This plane has no
cluster DNS and no Service routing (no kube-proxy), so the API server could not reach a webhook
behind that Service, and with the configuration's `failurePolicy: Fail` every PyTorchJob create
would be refused. So the configuration is not registered: the API server never calls the webhook,
and nothing validates a PyTorchJob beyond its CRD schema. What the operator needs so that it starts
all the same:

- the Secret `kubeflow/training-operator-webhook-cert` (the empty one its manifests create; the
  rotator fills it with a CA and a serving certificate). The rotator tolerates the missing webhook
  configuration (cert-controller's `ensureCerts` logs "Webhook not found" and goes on) and then
  reports the certificates ready, which is what starts the controllers;
- a certificate in the webhook server's directory. The server (controller-runtime's) reads
  `$TMPDIR/k8s-webhook-server/serving-certs/tls.{crt,key}`, a mounted copy of that Secret in the
  deployment; here TMPDIR is the operator's own directory and the pair a self-signed one made for
  127.0.0.1 (nothing connects to it but the readiness check's listener test);
- `/tmp/k8s-webhook-server/serving-certs/tls.crt`: the rotator checks that this file exists (a path
  fixed in pkg/cert, not under TMPDIR) before it reports ready, and gives up, stopping the manager,
  after 8 to 17 minutes without it (ten tries, backing off from 1 s). It only looks for the file,
  never reads it: a copy of the self-signed certificate is put there when it is missing (several
  planes on one machine share it).

Volcano. vc-controller-manager and vc-scheduler of volcano.sh/volcano at the version
tests/cluster/volcano/go.mod pins (into `.../trainmedic/volcano-<version>/bin`), as its development
manifest (installer/volcano-development.yaml, the Helm chart rendered) deploys them, less what a
plane without kubelets and Service routing cannot have:

- as the ServiceAccounts `volcano-system/volcano-controllers` and `volcano-system/volcano-scheduler`,
  bound to the project's ClusterRoles (tests/cluster/volcano/volcano.yaml), the scheduler with the
  published scheduler configuration (`volcano-scheduler.conf` of that file's ConfigMap), no leader
  election, health and metrics on free loopback ports;
- the CRDs they need besides the Job's (PodGroup, Queue, Command, Numatopology:
  tests/cluster/volcano/crds/); the scheduler creates the `default` Queue, as it does when deployed;
- the job controller, the PodGroup, Queue and garbage-collection controllers
  (`--controllers=job-controller,pg-controller,queue-controller,gc-controller`): not the JobFlow
  and JobTemplate ones (the default, `*`, has them too), whose CRDs trainmedic has nothing to do with;
- the scheduler is needed, not only wanted: the job controller creates a job's pods only once its
  PodGroup has left `Pending`, which the scheduler's enqueue action does; it then binds the pods
  (the job's `schedulerName: volcano`), with the published plugins (gang, predicates: taints, node
  affinity, unschedulable nodes...);
- no vc-webhook-manager: its webhooks too are reached through a Service in the deployment, and its
  mutating ones are what fills a Job's defaults (queue, schedulerName, minAvailable, maxRetry, task
  names); the test jobs give those fields themselves, and nothing validates a Job beyond its schema.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from trainmedic.agent.demo.plane import ROOT, KubePlane, Proc, free_port

from .kubeplane import in_ci

CLUSTER = ROOT / "tests" / "cluster"
OPERATORS = CLUSTER / "training-operator"
MANIFEST = OPERATORS / "training-operator.yaml"
MODULE = "github.com/kubeflow/training-operator"
NAMESPACE = "kubeflow"
SERVICE_ACCOUNT = "training-operator"
# The path pkg/cert of v1.8.1 fixes for the rotator's check (see the module docstring).
ROTATOR_CERT = Path("/tmp/k8s-webhook-server/serving-certs/tls.crt")
TOKEN_S = 24 * 3600

VOLCANO = CLUSTER / "volcano"
VOLCANO_MANIFEST = VOLCANO / "volcano.yaml"
VOLCANO_CRDS = sorted((VOLCANO / "crds").glob("*.yaml"))
VOLCANO_MODULE = "volcano.sh/volcano"
VOLCANO_NAMESPACE = "volcano-system"
VOLCANO_CONTROLLERS = "job-controller,pg-controller,queue-controller,gc-controller"


def module_version(go_mod: Path, module: str) -> str:
    """The version of `module` that `go_mod` requires."""
    for line in go_mod.read_text().splitlines():
        words = line.split()
        if words[:1] == ["require"]:
            words = words[1:]
        if len(words) >= 2 and words[0] == module:
            return words[1]
    raise RuntimeError(f"{go_mod} does not require {module}")


def cache_bin(project: str, version: str) -> Path:
    """Where tests/cluster/build.sh puts a project's commands:
    ${XDG_CACHE_HOME:-~/.cache}/trainmedic/<project>-<version>/bin."""
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "trainmedic" / f"{project}-{version}" / "bin"


def training_operator_version() -> str:
    return module_version(OPERATORS / "go.mod", MODULE)


def training_operator_bin() -> Path:
    return cache_bin("training-operator", training_operator_version()) / "training-operator"


def volcano_version() -> str:
    return module_version(VOLCANO / "go.mod", VOLCANO_MODULE)


def volcano_bins() -> tuple[Path, Path]:
    """vc-controller-manager and vc-scheduler."""
    d = cache_bin("volcano", volcano_version())
    return d / "vc-controller-manager", d / "vc-scheduler"


def _require(what: str, paths: tuple[Path, ...]) -> None:
    """Skip the test where a command is not built, or fail it under CI=true (where `make test`
    builds it), as `require_plane` does for the plane."""
    gone = [str(p) for p in paths if not os.access(p, os.X_OK)]
    if gone:
        reason = f"{what} is not built ({', '.join(gone)}); `make cluster` builds it"
        if in_ci():
            pytest.fail(f"CI is set but {reason}")
        pytest.skip(reason)


def require_training_operator() -> None:
    _require("the Kubeflow training-operator", (training_operator_bin(),))


def require_volcano() -> None:
    _require("Volcano", volcano_bins())


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def manifest_docs() -> list[dict[str, Any]]:
    return _docs(MANIFEST)


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return bool(r.status == 200)
    except (OSError, urllib.error.URLError):
        return False


def _wait(what: str, ok: Callable[[], Any], procs: list[Proc], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not ok():
        dead = [p for p in procs if not p.alive()]
        if dead or time.monotonic() > deadline:
            logs = "\n".join(f"--- {p.name}\n{p.tail()}" for p in (dead or procs))
            raise RuntimeError(f"{what} not ready:\n{logs}")
        time.sleep(0.2)


def _self_signed(d: Path) -> None:
    d.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-keyout", "tls.key", "-out", "tls.crt", "-days", "2", "-subj", "/CN=training-operator",
         "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
        cwd=d, check=True, capture_output=True,
    )  # fmt: skip


def _ensure_rotator_cert(source: Path) -> None:
    if ROTATOR_CERT.is_file():
        return
    ROTATOR_CERT.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=ROTATOR_CERT.parent, prefix=".tls.crt.")
    os.close(fd)
    shutil.copyfile(source, tmp)
    os.replace(tmp, ROTATOR_CERT)


class TrainingOperator:
    """The operator's manager as a process of `plane` (it stops with the plane, or with `stop()`)."""

    name = "training-operator"

    def __init__(self, plane: KubePlane, workdir: Path) -> None:
        self.plane = plane
        self.dir = workdir
        self.health_port = free_port()
        self.metrics_port = free_port()
        self.webhook_port = free_port()
        self.proc: Proc | None = None

    def start(self, timeout: float = 90.0) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        self.plane.apply(manifest_docs())
        token = self.plane.service_account_token(NAMESPACE, SERVICE_ACCOUNT, seconds=TOKEN_S)
        kubeconfig = self.plane.write_kubeconfig(self.dir / "training-operator.kubeconfig", token)
        tmp = self.dir / "tmp"
        certs = tmp / "k8s-webhook-server" / "serving-certs"
        _self_signed(certs)
        _ensure_rotator_cert(certs / "tls.crt")
        argv = [
            str(training_operator_bin()),
            f"--kubeconfig={kubeconfig}",
            "--enable-scheme=pytorchjob",
            f"--metrics-bind-address=127.0.0.1:{self.metrics_port}",
            f"--health-probe-bind-address=127.0.0.1:{self.health_port}",
            f"--webhook-server-port={self.webhook_port}",
        ]
        # MY_POD_NAMESPACE: where the rotator's Secret is (the Deployment sets it from the pod's namespace).
        env = {"TMPDIR": str(tmp), "MY_POD_NAMESPACE": NAMESPACE, "KUBECONFIG": str(kubeconfig)}
        self.proc = self.plane.start_process(self.name, argv, env)
        self._wait_ready(timeout)

    def _wait_ready(self, timeout: float) -> None:
        """Ready: the certificates reported ready (so the PyTorchJob controller is being set up) and
        the webhook server listening (its readiness check, main.go `setupProbeEndpoints`)."""
        url = f"http://127.0.0.1:{self.health_port}/readyz"
        _wait(self.name, lambda: _http_ok(url), [self.proc] if self.proc else [], timeout)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.alive()

    @property
    def errors(self) -> list[str]:
        """What went wrong with the process (it exited), for a test's final check."""
        return [] if self.alive() else [f"training-operator exited:\n{self.tail()}"]

    def tail(self, n: int = 40) -> str:
        return self.proc.tail(n) if self.proc is not None else ""

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()
            self.plane.procs.pop(self.name, None)


class Volcano:
    """vc-controller-manager and vc-scheduler as processes of `plane` (they stop with the plane, or
    with `stop()`)."""

    names = ("vc-scheduler", "vc-controller-manager")

    def __init__(self, plane: KubePlane, workdir: Path) -> None:
        self.plane = plane
        self.dir = workdir
        self.procs: list[Proc] = []

    def start(self, timeout: float = 90.0) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        docs = _docs(VOLCANO_MANIFEST)
        self.plane.apply([d for d in docs if d["kind"] != "ConfigMap"])
        [config] = [d for d in docs if d["kind"] == "ConfigMap"]
        conf = self.dir / "volcano-scheduler.conf"
        conf.write_text(config["data"]["volcano-scheduler.conf"])
        self.plane.install_crds(VOLCANO_CRDS)
        controller_manager, scheduler = volcano_bins()

        def kubeconfig(sa: str) -> Path:
            token = self.plane.service_account_token(VOLCANO_NAMESPACE, sa, seconds=TOKEN_S)
            return self.plane.write_kubeconfig(self.dir / f"{sa}.kubeconfig", token)

        health = {name: free_port() for name in self.names}
        self.procs.append(
            self.plane.start_process(
                "vc-scheduler",
                [
                    str(scheduler),
                    f"--kubeconfig={kubeconfig('volcano-scheduler')}",
                    f"--scheduler-conf={conf}",
                    "--enable-healthz=true",
                    f"--healthz-address=127.0.0.1:{health['vc-scheduler']}",
                    "--enable-metrics=true",
                    f"--listen-address=127.0.0.1:{free_port()}",
                    "--leader-elect=false",
                    "--logtostderr",
                    "-v=3",
                ],
            )
        )
        self.procs.append(
            self.plane.start_process(
                "vc-controller-manager",
                [
                    str(controller_manager),
                    f"--kubeconfig={kubeconfig('volcano-controllers')}",
                    f"--controllers={VOLCANO_CONTROLLERS}",
                    "--enable-healthz=true",
                    f"--healthz-address=127.0.0.1:{health['vc-controller-manager']}",
                    "--leader-elect=false",
                    "--logtostderr",
                    "-v=3",
                ],
            )
        )
        for name, port in health.items():
            _wait(name, functools.partial(_http_ok, f"http://127.0.0.1:{port}/healthz"), self.procs, timeout)

        def default_queue_open() -> bool:
            try:
                q = self.plane.request("GET", "/apis/scheduling.volcano.sh/v1beta1/queues/default")
            except (OSError, urllib.error.URLError):
                return False
            return bool((q.get("status") or {}).get("state") == "Open")

        # The scheduler creates it, the queue controller opens it: jobs are enqueued from then on.
        _wait("the default Queue open", default_queue_open, self.procs, timeout)

    def alive(self) -> bool:
        return bool(self.procs) and all(p.alive() for p in self.procs)

    @property
    def errors(self) -> list[str]:
        """What went wrong with the processes (one exited), for a test's final check."""
        return [f"{p.name} exited:\n{p.tail()}" for p in self.procs if not p.alive()]

    def stop(self) -> None:
        for p in self.procs:
            p.stop()
            self.plane.procs.pop(p.name, None)
