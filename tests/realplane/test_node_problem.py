"""On the real control plane with the shipped RBAC: the brain's ServiceAccount may write the
node-problem-detector style condition and the Event on a Node, and clear them; the Helm chart
installs (all-in-one layout) and uninstalls cleanly."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from servers.kubeplane import KubePlane

from trainmedic.models import FaultClass, I18nText
from trainmedic.remediations.kube import PROBLEM_ACCELERATOR, KubeOps

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "trainmedic"
HELM_VERSION = "v3.19.0"


@pytest_asyncio.fixture
async def brain_ops(plane: KubePlane) -> AsyncIterator[KubeOps]:
    api = plane.api_client(plane.service_account_token("trainmedic", "trainmedic-brain"))
    ops = KubeOps(api, attempts=3)
    try:
        yield ops
    finally:
        ops.close()
        api.close()


@pytest.mark.parametrize("fault", [FaultClass.DEVICE_ERROR])
async def test_the_brain_may_mark_and_clear_a_node(plane: KubePlane, brain_ops: KubeOps, fault: FaultClass) -> None:
    nodes = await brain_ops.list_nodes()
    node = str(nodes[0]["metadata"]["name"])
    message = I18nText(en="GPU has fallen off the bus", zh="GPU 掉卡")
    assert await brain_ops.report_node_problem(node, incident_id="inc-npd", fault_class=fault, message=message)
    got = await brain_ops.get_node(node)
    assert got is not None
    conds = {c["type"]: c for c in got["status"]["conditions"]}
    assert conds[PROBLEM_ACCELERATOR]["status"] == "True"
    events = plane.request("GET", "/api/v1/namespaces/default/events")["items"]
    assert any(e["involvedObject"]["name"] == node and e["reason"] == "DeviceError" for e in events)
    assert await brain_ops.release_node(node, incident_id="inc-npd")
    got = await brain_ops.get_node(node)
    assert got is not None
    conds = {c["type"]: c for c in got["status"]["conditions"]}
    assert conds[PROBLEM_ACCELERATOR]["status"] == "False"


def _helm() -> str | None:
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "trainmedic" / f"helm-{HELM_VERSION}"
    for candidate in (os.environ.get("TRAINMEDIC_HELM"), str(cache / "helm"), shutil.which("helm")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


@pytest.mark.parametrize("layout", ["all-in-one"])
async def test_the_chart_installs(plane: KubePlane, layout: str) -> None:
    helm = _helm()
    if helm is None:
        if os.environ.get("CI", "").lower() not in ("", "0", "false"):
            pytest.fail("CI is set but helm is missing (make helm builds it)")
        pytest.skip("helm is not installed (make helm builds it)")
    base = [helm, "--kubeconfig", str(plane.kubeconfig), "-n", "tm-helm"]

    def run(*argv: str) -> str:
        out = subprocess.run([*base, *argv], capture_output=True, text=True, timeout=180, check=False)
        assert out.returncode == 0, out.stdout + out.stderr
        return out.stdout

    run("install", "tm", str(CHART), "--create-namespace", "--set", f"layout={layout}")
    try:
        assert "STATUS: deployed" in run("status", "tm")
        dep = plane.request("GET", "/apis/apps/v1/namespaces/tm-helm/deployments/trainmedic")
        assert dep["spec"]["template"]["spec"]["serviceAccountName"] == "trainmedic-brain"
        binding = plane.request("GET", "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/trainmedic-all")
        assert binding["subjects"][0]["namespace"] == "tm-helm"
    finally:
        run("uninstall", "tm")
