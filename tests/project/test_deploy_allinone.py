"""deploy/all-in-one (one `--role all` pod) and deploy/monitoring (ServiceMonitor, PrometheusRule,
Grafana dashboard): the manifests parse and match the API schema, the pod's rights are exactly the
calls the code makes, and every metric an alert or a panel reads is one the agent exports, in an
expression the real Prometheus (and promtool) accepts."""

from __future__ import annotations

import ast
import inspect
import json
import re
import shutil
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as kclient
from paths import ROOT
from servers.prometheus import PrometheusServer, in_ci, require_prometheus
from test_deploy import kube_modules, schema_problems, what_calls

from trainmedic.agent.config import Role, check_role, load_settings
from trainmedic.agent.run import build_agent
from trainmedic.agent.telemetry import Telemetry
from trainmedic.agent.watchers.k8s import RESOURCES
from trainmedic.remediations import kube as kube_mod

ALL_IN_ONE = ROOT / "deploy" / "all-in-one"
MONITORING = ROOT / "deploy" / "monitoring"
TRAINING_NS = ROOT / "deploy" / "training-namespace"
NAMESPACE = "trainmedic"
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding"}

Doc = dict[str, Any]


def docs(path: Path) -> list[Doc]:
    return [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d is not None]


def kustomization(folder: Path) -> Doc:
    k = docs(folder / "kustomization.yaml")[0]
    assert k["apiVersion"] == "kustomize.config.k8s.io/v1beta1" and k["kind"] == "Kustomization"
    return k


def named_files(folder: Path) -> set[Path]:
    k = kustomization(folder)
    out = {folder / str(r) for r in k.get("resources") or []}
    for gen in k.get("configMapGenerator") or []:
        out |= {folder / str(spec).rpartition("=")[2] for spec in gen.get("files") or []}
    return out


def manifests(folder: Path) -> list[Doc]:
    return [d for r in kustomization(folder).get("resources") or [] for d in docs(folder / str(r))]


def one(folder: Path, kind: str) -> Doc:
    found = [d for d in manifests(folder) if d["kind"] == kind]
    assert len(found) == 1, f"expected one {kind} in {folder}"
    return found[0]


FOLDERS = [ALL_IN_ONE, MONITORING]
ALL_MANIFESTS = [(f, d) for f in FOLDERS for d in manifests(f)]


def mid(item: tuple[Path, Doc]) -> str:
    return f"{item[0].name}:{item[1]['kind']}/{item[1]['metadata']['name']}"


# ------------------------------------------------------------------------------------------------
# Files and shapes


@pytest.mark.parametrize("folder", FOLDERS, ids=lambda p: p.name)
def test_every_file_is_named_by_the_kustomization(folder: Path) -> None:
    files = {p for p in folder.rglob("*") if p.is_file() and p.name != "kustomization.yaml"}
    named = named_files(folder)
    assert {p for p in named if not p.is_file()} == set(), "a named file is missing"
    assert files - named == set(), "a file no kustomization names"


@pytest.mark.parametrize("item", ALL_MANIFESTS, ids=mid)
def test_manifest_shape_and_namespace(item: tuple[Path, Doc]) -> None:
    _, doc = item
    meta = doc["metadata"]
    if doc["kind"] in CLUSTER_SCOPED:
        assert "namespace" not in meta
    else:
        assert meta.get("namespace") == NAMESPACE
    assert meta["labels"]["app.kubernetes.io/part-of"] == "trainmedic"


@pytest.mark.parametrize("item", [i for i in ALL_MANIFESTS if i[0] == ALL_IN_ONE], ids=mid)
def test_all_in_one_matches_the_api_schema(item: tuple[Path, Doc]) -> None:
    _, doc = item
    model = f"{str(doc['apiVersion']).rpartition('/')[2].capitalize()}{doc['kind']}"
    assert hasattr(kclient, model)
    assert schema_problems(doc, model, doc["kind"]) == []


@pytest.mark.parametrize("folder", FOLDERS, ids=lambda p: p.name)
def test_kustomize_renders(folder: Path) -> None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        if in_ci():
            pytest.fail("CI is set but kubectl is missing")
        pytest.skip("kubectl is not installed")
    out = subprocess.run([kubectl, "kustomize", str(folder)], capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    rendered = [d for d in yaml.safe_load_all(out.stdout) if d is not None]
    kinds = {d["kind"] for d in rendered}
    if folder == ALL_IN_ONE:
        assert {"Deployment", "ConfigMap", "PersistentVolumeClaim", "NetworkPolicy", "ClusterRole"} <= kinds
        dep = next(d for d in rendered if d["kind"] == "Deployment")
        cms = {d["metadata"]["name"] for d in rendered if d["kind"] == "ConfigMap"}
        vols = dep["spec"]["template"]["spec"]["volumes"]
        assert all(v["configMap"]["name"] in cms for v in vols if "configMap" in v)
    else:
        assert kinds == {"ServiceMonitor", "PrometheusRule", "ConfigMap"}


# ------------------------------------------------------------------------------------------------
# The pod: one replica of --role all on the memory bus, following pod logs


def all_in_one_config() -> Path:
    dep = one(ALL_IN_ONE, "Deployment")
    args = dep["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--role") + 1] == "all"
    path = args[args.index("--config") + 1]
    assert path == "/etc/trainmedic/config/config.yaml"
    return ALL_IN_ONE / "config" / "all.yaml"


def test_one_replica_that_never_overlaps() -> None:
    spec = one(ALL_IN_ONE, "Deployment")["spec"]
    assert spec["replicas"] == 1 and spec["strategy"]["type"] == "Recreate"


def test_config_is_the_embedded_layout() -> None:
    settings = load_settings(all_in_one_config(), env={})
    assert check_role(settings, Role.ALL) == []
    assert settings.bus.kind == "memory"
    assert settings.kubernetes.follow_pod_logs and not settings.logs.enabled
    mounts = {
        m["mountPath"]: m["name"]
        for m in one(ALL_IN_ONE, "Deployment")["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]
    }
    assert mounts["/var/lib/trainmedic"] == "state"
    assert Path(settings.remediate.store).parent == Path("/var/lib/trainmedic")
    assert settings.api.token_file and Path(settings.api.token_file).parent.as_posix() in mounts


def test_the_pod_runs_every_component(tmp_path: Path) -> None:
    settings = load_settings(
        all_in_one_config(),
        env={
            "TRAINMEDIC_REMEDIATE__STORE": str(tmp_path / "s.db"),
            "TRAINMEDIC_REMEDIATE__SCENE_DIR": str(tmp_path / "scenes"),
            "TRAINMEDIC_API__TOKEN_FILE": str(tmp_path / "token"),
        },
    )
    (tmp_path / "token").write_text("t" * 32)
    cfg = kclient.Configuration()
    cfg.host = "http://127.0.0.1:1"
    agent = build_agent(settings, Role.ALL, api_client=kclient.ApiClient(cfg))
    try:
        assert {"kubernetes", "pod-logs", "brain", "responder", "api"} <= set(agent.components)
        assert "container-logs" in agent.disabled and "kernel" not in agent.components
    finally:
        if agent.responder is not None:
            agent.responder.close()


# ------------------------------------------------------------------------------------------------
# RBAC: exactly the calls the code makes


Grant = tuple[str, str, str]  # apiGroup, resource, verb


def rules_grants(rules: list[Doc]) -> set[Grant]:
    return {(g, r, v) for rule in rules for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}


def kubeops_calls() -> set[tuple[str, str, str, bool]]:
    """(verb, apiGroup, resource[/sub], namespaced) of each `_What(...)` in remediations/kube/."""
    out = set()
    for module, node in what_calls():
        verb, res = node.args[0], node.args[1]
        assert isinstance(verb, ast.Constant) and isinstance(res, ast.Name)
        sub = next(
            (str(k.value.value) for k in node.keywords if k.arg == "sub" and isinstance(k.value, ast.Constant)), None
        )
        targets = list(kube_mod.WORKLOADS.values()) if res.id == "res" else [getattr(module, res.id)]
        for r in targets:
            out.add((str(verb.value), r.group, r.plural + (f"/{sub}" if sub else ""), r.namespaced))
    return out


def test_cluster_role_is_exactly_what_the_pod_calls() -> None:
    needed: set[Grant] = {(spec.group, spec.plural, v) for spec in RESOURCES.values() for v in ("list", "watch")}
    podlogs = (ROOT / "agent" / "watchers" / "podlogs.py").read_text(encoding="utf-8")
    assert "read_namespaced_pod_log" in podlogs
    needed.add(("", "pods/log", "get"))
    for verb, group, resource, namespaced in kubeops_calls():
        if not namespaced:
            needed.add((group, resource, verb))
    # Events on a Node live in the `default` namespace, which a kustomization cannot grant a Role in:
    # the node-problem-detector style Event is created through the ClusterRole.
    assert ("create", "", "events", True) in kubeops_calls()
    assert any("NODE_EVENT_NAMESPACE, body" in inspect.getsource(m) for m in kube_modules())
    needed.add(("", "events", "create"))
    granted = rules_grants(one(ALL_IN_ONE, "ClusterRole")["rules"])
    assert granted == needed
    assert not {g for g in granted if g[1] in ("secrets", "pods/exec") or "*" in g}


def test_namespaced_calls_are_granted_per_training_namespace() -> None:
    role = next(d for d in docs(TRAINING_NS / "role.yaml") if d["kind"] == "Role")
    granted = rules_grants(role["rules"])
    needed = {
        (g, r, v) for v, g, r, namespaced in kubeops_calls() if namespaced and not (r == "events" and v == "create")
    }
    assert needed <= granted
    binding = [d for f in kustomization(TRAINING_NS)["resources"] for d in docs(TRAINING_NS / f)]
    subjects = [s for d in binding if d["kind"] == "RoleBinding" for s in d["subjects"]]
    sa = one(ALL_IN_ONE, "ServiceAccount")["metadata"]["name"]
    assert {"kind": "ServiceAccount", "name": sa, "namespace": NAMESPACE} in subjects
    assert one(ALL_IN_ONE, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"] == sa


def test_binding_names_the_pod_account() -> None:
    b = one(ALL_IN_ONE, "ClusterRoleBinding")
    assert b["roleRef"]["name"] == one(ALL_IN_ONE, "ClusterRole")["metadata"]["name"]
    assert b["subjects"] == [
        {
            "kind": "ServiceAccount",
            "name": one(ALL_IN_ONE, "ServiceAccount")["metadata"]["name"],
            "namespace": NAMESPACE,
        }
    ]


def test_network_policy_admits_only_the_api_port_from_named_sources() -> None:
    np = one(ALL_IN_ONE, "NetworkPolicy")["spec"]
    assert set(np["policyTypes"]) == {"Ingress", "Egress"}
    (ingress,) = np["ingress"]
    assert ingress["ports"] == [{"port": 8080, "protocol": "TCP"}]
    for peer in ingress["from"]:
        assert peer in (
            {"podSelector": {}},
            {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}},
        )
    egress_ports = {p["port"] for rule in np["egress"] for p in rule["ports"]}
    assert {53, 443} <= egress_ports
    assert all("to" not in rule or rule["to"] for rule in np["egress"])


def test_pod_security_is_restricted() -> None:
    ns = one(ALL_IN_ONE, "Namespace")
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    pod = one(ALL_IN_ONE, "Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert "hostPath" not in json.dumps(pod["volumes"])
    c = pod["containers"][0]["securityContext"]
    assert c["allowPrivilegeEscalation"] is False and c["capabilities"]["drop"] == ["ALL"]


# ------------------------------------------------------------------------------------------------
# Monitoring: names that exist, expressions that parse


def exported_metric_names() -> set[str]:
    """Every sample name the agent's registry can expose (counters as _total, histograms' series)."""
    names: set[str] = set()
    for family in Telemetry().registry.collect():
        if family.type == "counter":
            names |= {family.name + "_total", family.name + "_created"}
        elif family.type == "histogram":
            names |= {family.name + s for s in ("_bucket", "_sum", "_count", "_created")}
        else:
            names.add(family.name)
    return names


def alert_rules() -> list[Doc]:
    return [r for g in one(MONITORING, "PrometheusRule")["spec"]["groups"] for r in g["rules"]]


def dashboard() -> Doc:
    data = json.loads((MONITORING / "grafana-dashboard.json").read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


def dashboard_exprs() -> list[str]:
    return [t["expr"] for p in dashboard()["panels"] for t in p["targets"]]


EXPRS = [("alert " + r["alert"], r["expr"]) for r in alert_rules()] + [
    (f"panel {i}", e) for i, e in enumerate(dashboard_exprs())
]
METRIC = re.compile(r"\btrainmedic_[a-z0-9_]+")


@pytest.mark.parametrize(("where", "expr"), EXPRS, ids=[w for w, _ in EXPRS])
def test_every_metric_named_exists_in_the_code(where: str, expr: str) -> None:
    used = set(METRIC.findall(expr))
    assert used, f"{where} reads no trainmedic metric"
    assert used <= exported_metric_names(), f"{where}: {used - exported_metric_names()} not exported"


def test_the_ready_gauge_is_alerted_on() -> None:
    assert any("trainmedic_ready" in r["expr"] for r in alert_rules())


def test_alerts_are_bilingual() -> None:
    cjk = re.compile(r"[\u4e00-\u9fff]")
    for r in alert_rules():
        assert r["labels"]["severity"] in ("info", "warning", "critical")
        assert cjk.search(r["annotations"]["summary"]) and re.search("[A-Za-z]", r["annotations"]["summary"])


def test_promtool_accepts_the_rules(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        if in_ci():
            pytest.fail("CI is set but promtool is missing (make servers installs prometheus)")
        pytest.skip("promtool is not installed")
    rules = tmp_path / "rules.yml"
    rules.write_text(yaml.safe_dump({"groups": one(MONITORING, "PrometheusRule")["spec"]["groups"]}))
    out = subprocess.run(
        [promtool, "check", "rules", str(rules)], check=False, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Any:
    binary = require_prometheus()
    with PrometheusServer(binary, tmp_path_factory.mktemp("prom"), []) as server:
        yield server


def test_the_real_prometheus_parses_every_expression(prometheus: PrometheusServer) -> None:
    problems = []
    for where, expr in EXPRS:
        # Grafana's interval variable, as Grafana substitutes it.
        query = expr.replace("$__rate_interval", "5m")
        url = f"{prometheus.url}/api/v1/query?" + urllib.parse.urlencode({"query": query})
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                status = json.loads(r.read())["status"]
        except urllib.error.HTTPError as e:
            status = f"{e.code}: {e.read().decode(errors='replace')[:300]}"
        if status != "success":
            problems.append(f"{where}: {status}")
    assert problems == []


def test_service_monitor_finds_both_layouts_services() -> None:
    sm = one(MONITORING, "ServiceMonitor")["spec"]
    services = [one(ALL_IN_ONE, "Service"), *docs(ROOT / "deploy" / "brain-service.yaml")]
    for svc in services:
        labels = svc["metadata"]["labels"]
        assert all(labels.get(k) == v for k, v in sm["selector"]["matchLabels"].items())
        assert sm["endpoints"][0]["port"] in {p["name"] for p in svc["spec"]["ports"]}
    assert sm["endpoints"][0]["authorization"]["credentials"]["name"] == "trainmedic-api-token"


def test_dashboard_shape() -> None:
    d = dashboard()
    ids = [p["id"] for p in d["panels"]]
    assert len(set(ids)) == len(ids) and d["uid"] == "trainmedic"
    for p in d["panels"]:
        assert p["datasource"]["uid"] == "${datasource}"
