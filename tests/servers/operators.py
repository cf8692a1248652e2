"""The real Kubeflow Training Operator on the real control plane (tests/servers/kubeplane.py).

Its manager, `cmd/training-operator.v1` of github.com/kubeflow/training-operator at the version
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
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from trainmedic.agent.demo.plane import ROOT, KubePlane, Proc, free_port

from .kubeplane import in_ci

OPERATORS = ROOT / "tests" / "cluster" / "training-operator"
MANIFEST = OPERATORS / "training-operator.yaml"
MODULE = "github.com/kubeflow/training-operator"
NAMESPACE = "kubeflow"
SERVICE_ACCOUNT = "training-operator"
# The path pkg/cert of v1.8.1 fixes for the rotator's check (see the module docstring).
ROTATOR_CERT = Path("/tmp/k8s-webhook-server/serving-certs/tls.crt")
TOKEN_S = 24 * 3600


def training_operator_version() -> str:
    for line in (OPERATORS / "go.mod").read_text().splitlines():
        words = line.split()
        if words[:1] == ["require"]:
            words = words[1:]
        if len(words) >= 2 and words[0] == MODULE:
            return words[1]
    raise RuntimeError(f"{OPERATORS / 'go.mod'} does not require {MODULE}")


def training_operator_bin() -> Path:
    """Where tests/cluster/build.sh puts it: ${XDG_CACHE_HOME:-~/.cache}/trainmedic/training-operator-<v>/bin."""
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "trainmedic" / f"training-operator-{training_operator_version()}" / "bin" / "training-operator"


def require_training_operator() -> None:
    """Skip the test where the operator is not built, or fail it under CI=true (where `make test`
    builds it), as `require_plane` does for the plane."""
    path = training_operator_bin()
    if not os.access(path, os.X_OK):
        reason = f"the Kubeflow training-operator is not built ({path}); `make cluster` builds it"
        if in_ci():
            pytest.fail(f"CI is set but {reason}")
        pytest.skip(reason)


def manifest_docs() -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(MANIFEST.read_text()) if d]


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

    def _ready(self) -> bool:
        url = f"http://127.0.0.1:{self.health_port}/readyz"
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                return bool(r.status == 200)
        except (OSError, urllib.error.URLError):
            return False

    def _wait_ready(self, timeout: float) -> None:
        """Ready: the certificates reported ready (so the PyTorchJob controller is being set up) and
        the webhook server listening (its readiness check, main.go `setupProbeEndpoints`)."""
        deadline = time.monotonic() + timeout
        while not self._ready():
            if not self.alive() or time.monotonic() > deadline:
                raise RuntimeError(f"training-operator not ready:\n{self.tail()}")
            time.sleep(0.2)

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
