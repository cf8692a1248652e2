"""The deployment files (deploy/, Dockerfile, docker-compose.yml) checked without a container engine.

Nothing here runs a container or a cluster, so the files are parsed and held against the code they
deploy: every role's configuration goes through the real settings model (agent.config.load_settings,
with the environment the container would get) and check_role; the RBAC rules are compared with the
API calls remediations/kube/ and the watchers make, verb by verb; host paths, users, probes,
resources and image references are checked one by one; the compose services' configuration must
name the compose services it talks to. Where the real tools are installed they check too:
`kubectl kustomize` renders both kustomizations, `promtool` and `amtool` check the Prometheus and
Alertmanager configuration (under CI=true these two must be there: `make test` installs them).
"""

from __future__ import annotations

import ast
import base64
import functools
import importlib
import inspect
import pkgutil
import re
import shutil
import subprocess
import tomllib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml
from kubernetes import client as kclient
from paths import ROOT
from servers.prometheus import in_ci

from trainmedic.agent import api as api_mod
from trainmedic.agent.bus.memory import MemoryBus
from trainmedic.agent.config import ApiSettings, ConfigError, Role, Settings, check_role, load_settings
from trainmedic.agent.run import build_agent
from trainmedic.agent.telemetry import Telemetry
from trainmedic.agent.watchers.k8s import RESOURCES
from trainmedic.detectors.loader import load_rules
from trainmedic.events import MetricBatch
from trainmedic.remediations import kube as kube_mod
from trainmedic.remediations.policy import POLICY_FILE, load_policy

DEPLOY = ROOT / "deploy"
COMPOSE_DIR = DEPLOY / "compose"
COMPOSE_FILE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"
KUSTOMIZATIONS = (DEPLOY / "kustomization.yaml", DEPLOY / "training-namespace" / "kustomization.yaml")
NAMESPACE = "trainmedic"
STATE_DIR = "/var/lib/trainmedic"
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "PersistentVolume", "StorageClass"}
WORKLOAD_KINDS = {"Deployment", "DaemonSet", "StatefulSet"}
READ_VERBS = {"get", "list", "watch"}
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]

# The only things trainmedic creates or deletes: the exec sessions of stack dumps, the training
# workloads a restart from checkpoint replaces (remediations/kube/ WORKLOADS), and Events on a Node.
CREATE_ALLOWED = {("", "pods/exec"), ("", "events")} | {(r.group, r.plural) for r in kube_mod.WORKLOADS.values()}
DELETE_ALLOWED = {(r.group, r.plural) for r in kube_mod.WORKLOADS.values()}

Doc = dict[str, Any]


def yaml_docs(path: Path) -> list[Doc]:
    return [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d is not None]


def yaml_doc(path: Path) -> Doc:
    doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    assert isinstance(doc, dict), f"{path}: the top level must be a mapping"
    return doc


# ------------------------------------------------------------------------------------------------
# The kustomizations and what they contain


@dataclass(frozen=True)
class Manifest:
    file: Path
    doc: Doc
    namespace: str | None  # the kustomization's `namespace:`

    @property
    def kind(self) -> str:
        return str(self.doc.get("kind"))

    @property
    def name(self) -> str:
        return str((self.doc.get("metadata") or {}).get("name"))

    @property
    def id(self) -> str:
        return f"{self.file.relative_to(DEPLOY)}:{self.kind}/{self.name}"


def kustomization(path: Path) -> Doc:
    return yaml_doc(path)


def generator_files(k: Doc) -> dict[str, dict[str, str]]:
    """configMapGenerator name -> {key in the ConfigMap (or '.env' for an env file): file}."""
    out: dict[str, dict[str, str]] = {}
    for gen in k.get("configMapGenerator") or []:
        files: dict[str, str] = {}
        for spec in gen.get("files") or []:
            key, _, src = str(spec).rpartition("=")
            files[key or Path(src).name] = src
        for env in gen.get("envs") or []:
            files[".env:" + str(env)] = str(env)
        out[str(gen["name"])] = files
    return out


def manifests() -> list[Manifest]:
    out: list[Manifest] = []
    for kpath in KUSTOMIZATIONS:
        k = kustomization(kpath)
        for res in k.get("resources") or []:
            path = kpath.parent / str(res)
            out.extend(Manifest(path, doc, k.get("namespace")) for doc in yaml_docs(path))
    return out


MANIFESTS = manifests()


def by_kind(*kinds: str) -> list[Manifest]:
    return [m for m in MANIFESTS if m.kind in kinds]


def one(kind: str, name: str) -> Manifest:
    found = [m for m in MANIFESTS if m.kind == kind and m.name == name]
    assert len(found) == 1, f"expected one {kind} {name}, found {len(found)}"
    return found[0]


WORKLOADS = by_kind(*WORKLOAD_KINDS)


def pod_spec(m: Manifest) -> Doc:
    spec = m.doc["spec"]["template"]["spec"]
    assert isinstance(spec, dict)
    return spec


def containers(m: Manifest) -> list[Doc]:
    spec = pod_spec(m)
    return list(spec.get("initContainers") or []) + list(spec.get("containers") or [])


CONTAINERS = [(m, c) for m in WORKLOADS for c in containers(m)]


def container_id(item: tuple[Manifest, Doc]) -> str:
    return f"{item[0].name}/{item[1]['name']}"


def arg_value(args: list[str], flag: str) -> str | None:
    return args[args.index(flag) + 1] if flag in args and args.index(flag) + 1 < len(args) else None


def role_arg(args: list[str]) -> Role:
    role = arg_value(args, "--role")
    assert role is not None, f"no --role in {args}"
    return Role(role)


def config_arg(args: list[str]) -> str:
    config = arg_value(args, "--config")
    assert config is not None, f"no --config in {args}"
    return config


def env_file(path: Path) -> dict[str, str]:
    """A kustomize / docker env file: KEY=VALUE lines, # comments and blank lines ignored."""
    out = {}
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        assert sep, f"{path}: not KEY=VALUE: {line!r}"
        out[key.strip()] = value
    return out


# ------------------------------------------------------------------------------------------------
# Everything parses, and every file is accounted for


def deploy_yaml_files() -> list[Path]:
    # Helm templates are Go templates, not YAML (tests/project/test_helm.py renders them).
    files = (p for p in DEPLOY.rglob("*") if p.suffix in (".yaml", ".yml") and "templates" not in p.parts)
    return [*sorted(files), COMPOSE_FILE]


@pytest.mark.parametrize("path", deploy_yaml_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_yaml_file_parses(path: Path) -> None:
    docs = yaml_docs(path)
    assert docs, f"{path} is empty"


def referenced_files() -> dict[Path, str]:
    """Every file a kustomization names (resources, generator inputs) -> which one names it."""
    out: dict[Path, str] = {}
    for kpath in KUSTOMIZATIONS:
        k = kustomization(kpath)
        for res in k.get("resources") or []:
            out[(kpath.parent / str(res)).resolve()] = str(kpath.relative_to(DEPLOY))
        for files in generator_files(k).values():
            for src in files.values():
                out[(kpath.parent / src).resolve()] = str(kpath.relative_to(DEPLOY))
    return out


@pytest.mark.parametrize("kpath", KUSTOMIZATIONS, ids=lambda p: str(p.relative_to(DEPLOY)))
def test_kustomization_names_only_existing_files(kpath: Path) -> None:
    k = kustomization(kpath)
    assert k.get("apiVersion") == "kustomize.config.k8s.io/v1beta1" and k.get("kind") == "Kustomization"
    named = [str(r) for r in k.get("resources") or []]
    named += [src for files in generator_files(k).values() for src in files.values()]
    assert len(set(named)) == len(named), f"{kpath}: a file is named twice"
    for rel in named:
        path = (kpath.parent / rel).resolve()
        assert path.is_file(), f"{kpath}: {rel} does not exist"
        # kustomize refuses files outside the kustomization's folder.
        assert path.is_relative_to(kpath.parent.resolve()), f"{kpath}: {rel} is outside {kpath.parent}"


# Folders checked by tests of their own: tests/project/test_deploy_allinone.py, tests/project/test_helm.py.
OWN_TESTS = ("all-in-one", "monitoring", "helm")


def test_every_file_in_deploy_is_used() -> None:
    """No manifest is forgotten: each file under deploy/ is a kustomization, named by one, or part of
    the compose setup (used by docker-compose.yml, checked below)."""
    used = referenced_files()
    kustomizations = {k.resolve() for k in KUSTOMIZATIONS}
    unused = [
        str(p.relative_to(DEPLOY))
        for p in sorted(DEPLOY.rglob("*"))
        if p.is_file()
        and p.resolve() not in used
        and p.resolve() not in kustomizations
        and not p.is_relative_to(COMPOSE_DIR)
        and not any(p.is_relative_to(DEPLOY / d) for d in OWN_TESTS)
    ]
    assert unused == [], f"files under deploy/ that no kustomization names: {unused}"


# ------------------------------------------------------------------------------------------------
# Manifest shapes


@pytest.mark.parametrize("m", MANIFESTS, ids=lambda m: m.id)
def test_manifest_shape(m: Manifest) -> None:
    assert isinstance(m.doc.get("apiVersion"), str) and m.doc["apiVersion"]
    assert isinstance(m.doc.get("kind"), str) and m.doc["kind"]
    meta = m.doc.get("metadata") or {}
    assert isinstance(meta.get("name"), str) and meta["name"]
    if m.kind in CLUSTER_SCOPED:
        assert "namespace" not in meta, f"{m.id}: a cluster-scoped object has no namespace"
    else:
        assert meta.get("namespace") == m.namespace, f"{m.id}: namespace {meta.get('namespace')} != {m.namespace}"
    assert (meta.get("labels") or {}).get("app.kubernetes.io/part-of") == "trainmedic", f"{m.id}: part-of label"


def schema_problems(value: Any, type_name: str, where: str) -> list[str]:
    """Where a manifest strays from the API's schema, as the official client's models describe it:
    unknown keys (a typo the API server would reject or, worse, silently drop) and wrong scalar types
    (an unquoted `true` in a string map)."""
    for prefix in ("List[", "list["):
        if type_name.startswith(prefix):
            if not isinstance(value, list):
                return [f"{where}: expected a list"]
            inner = type_name[len(prefix) : -1]
            return [p for i, v in enumerate(value) for p in schema_problems(v, inner, f"{where}[{i}]")]
    for prefix in ("Dict[", "dict("):
        if type_name.startswith(prefix):
            if not isinstance(value, dict):
                return [f"{where}: expected a mapping"]
            inner = type_name[len(prefix) : -1].split(",", 1)[1].strip()
            return [p for k, v in value.items() for p in schema_problems(v, inner, f"{where}.{k}")]
    scalars: dict[str, tuple[type, ...]] = {"str": (str,), "int": (int,), "float": (int, float), "bool": (bool,)}
    if type_name in scalars:
        ok = isinstance(value, scalars[type_name]) and not (type_name != "bool" and isinstance(value, bool))
        return [] if ok else [f"{where}: expected {type_name}, got {type(value).__name__} {value!r}"]
    if type_name in ("object", "datetime", "date"):
        return []
    model = getattr(kclient, type_name)
    if not isinstance(value, dict):
        return [f"{where}: expected a {type_name} mapping"]
    by_json = {j: py for py, j in model.attribute_map.items()}
    out = []
    for key, v in value.items():
        if key not in by_json:
            out.append(f"{where}: unknown field {key!r} in {type_name}")
            continue
        out.extend(schema_problems(v, model.openapi_types[by_json[key]], f"{where}.{key}"))
    return out


@pytest.mark.parametrize("m", MANIFESTS, ids=lambda m: m.id)
def test_manifest_matches_the_api_schema(m: Manifest) -> None:
    version = str(m.doc["apiVersion"]).rpartition("/")[2]
    model = f"{version.capitalize()}{m.kind}"
    assert hasattr(kclient, model), f"{m.id}: no model {model} in the kubernetes client"
    assert schema_problems(m.doc, model, m.kind) == []


def test_main_kustomization_namespace() -> None:
    k = kustomization(KUSTOMIZATIONS[0])
    assert k["namespace"] == NAMESPACE
    assert one("Namespace", NAMESPACE)


@pytest.mark.parametrize("m", WORKLOADS, ids=lambda m: m.id)
def test_workload_selector_matches_its_pods(m: Manifest) -> None:
    selector = m.doc["spec"]["selector"]["matchLabels"]
    labels = m.doc["spec"]["template"]["metadata"]["labels"]
    assert selector and all(labels.get(k) == v for k, v in selector.items())


# ------------------------------------------------------------------------------------------------
# Images


def image_tag(image: str) -> tuple[str, str | None]:
    name, _, digest = image.partition("@")
    head, sep, tag = name.rpartition(":")
    if sep and "/" not in tag:
        return head, tag if not digest else f"{tag}@{digest}"
    return name, None if not digest else f"@{digest}"


def dockerfile_args() -> dict[str, str]:
    return dict(re.findall(r"^ARG\s+(\w+)=(\S+)\s*$", DOCKERFILE.read_text(), flags=re.M))


@pytest.mark.parametrize("item", CONTAINERS, ids=container_id)
def test_workload_image_is_the_built_one(item: tuple[Manifest, Doc]) -> None:
    """Manifests name the image `trainmedic`; the kustomization pins it to the package version."""
    _, c = item
    assert c["image"] == "trainmedic"
    assert c.get("imagePullPolicy") in ("IfNotPresent", "Always")
    images = {i["name"]: i for i in kustomization(KUSTOMIZATIONS[0])["images"]}
    pinned = images["trainmedic"]
    assert str(pinned["newTag"]) == VERSION, "the image tag must be the package version"
    assert pinned["newTag"] != "latest"


def test_dockerfile_version_matches_the_package() -> None:
    assert dockerfile_args()["VERSION"] == VERSION


# ------------------------------------------------------------------------------------------------
# RBAC


@dataclass(frozen=True)
class RuleRef:
    role: Manifest
    index: int
    rule: Doc

    @property
    def id(self) -> str:
        return f"{self.role.kind}/{self.role.name}#{self.index}"

    def pairs(self) -> Iterator[tuple[str, str]]:
        for group in self.rule.get("apiGroups") or []:
            for res in self.rule.get("resources") or []:
                yield str(group), str(res)


RULES = [RuleRef(r, i, rule) for r in by_kind("Role", "ClusterRole") for i, rule in enumerate(r.doc.get("rules") or [])]


@pytest.mark.parametrize("ref", RULES, ids=lambda r: r.id)
def test_rbac_rule_is_least_privilege(ref: RuleRef) -> None:
    rule = ref.rule
    verbs = set(rule.get("verbs") or [])
    groups = set(rule.get("apiGroups") or [])
    resources = set(rule.get("resources") or [])
    assert verbs and resources and rule.get("apiGroups") is not None, f"{ref.id}: incomplete rule"
    assert "*" not in verbs | groups | resources, f"{ref.id}: wildcard"
    assert not rule.get("nonResourceURLs"), f"{ref.id}: non-resource URLs"
    assert not verbs & {"escalate", "bind", "impersonate"}, f"{ref.id}: privilege-granting verb"
    assert verbs <= READ_VERBS | {"patch", "create", "delete"}, f"{ref.id}: unexpected verbs {verbs}"
    assert "secrets" not in resources, f"{ref.id}: secrets"
    assert not any(r.startswith("secrets/") or r.startswith("serviceaccounts") for r in resources)
    if "pods/exec" in resources or "pods/attach" in resources:
        assert ref.role.kind == "Role", f"{ref.id}: exec may be granted per namespace only (a Role), never cluster-wide"
    # The checkpoint reader's pods (remediations/checkpoint_reader.py): created and deleted per
    # training namespace only, never cluster-wide.
    reader = {("", "pods")} if ref.role.kind == "Role" else set()
    if "create" in verbs:
        extra = set(ref.pairs()) - CREATE_ALLOWED - reader
        assert not extra, f"{ref.id}: create is only for exec, the restart's workloads and the reader pod, not {extra}"
    if "delete" in verbs:
        extra = set(ref.pairs()) - DELETE_ALLOWED - reader
        assert not extra, f"{ref.id}: delete is only for the restart's workloads and the reader pod, not {extra}"


Grant = tuple[str, str, str, str]  # scope ("cluster" / "namespace"), apiGroup, resource, verb


def grants_of(service_account: str) -> set[Grant]:
    """What a ServiceAccount of ours may do, through every binding in deploy/."""
    roles = {(m.kind, m.name): m for m in by_kind("Role", "ClusterRole")}
    out: set[Grant] = set()
    for b in by_kind("RoleBinding", "ClusterRoleBinding"):
        subjects = b.doc.get("subjects") or []
        if not any(
            s.get("kind") == "ServiceAccount" and s.get("name") == service_account and s.get("namespace") == NAMESPACE
            for s in subjects
        ):
            continue
        ref = b.doc["roleRef"]
        role = roles[(ref["kind"], ref["name"])]
        scope = "cluster" if b.kind == "ClusterRoleBinding" else "namespace"
        for rule in role.doc.get("rules") or []:
            for group in rule["apiGroups"]:
                for res in rule["resources"]:
                    for verb in rule["verbs"]:
                        out.add((scope, group, res, verb))
    return out


@pytest.mark.parametrize("b", by_kind("RoleBinding", "ClusterRoleBinding"), ids=lambda m: m.id)
def test_bindings_name_our_accounts_and_roles(b: Manifest) -> None:
    accounts = {m.name for m in by_kind("ServiceAccount")}
    roles = {(m.kind, m.name, m.doc["metadata"].get("namespace")) for m in by_kind("Role", "ClusterRole")}
    ref = b.doc["roleRef"]
    assert ref["apiGroup"] == "rbac.authorization.k8s.io"
    if ref["kind"] == "Role":
        assert b.kind == "RoleBinding"
        assert ("Role", ref["name"], b.doc["metadata"]["namespace"]) in roles
    else:
        assert ("ClusterRole", ref["name"], None) in roles
    for s in b.doc["subjects"]:
        assert s["kind"] == "ServiceAccount" and s["name"] in accounts and s["namespace"] == NAMESPACE


def test_every_workload_has_its_own_account() -> None:
    accounts = [pod_spec(m).get("serviceAccountName") for m in WORKLOADS]
    assert None not in accounts and "default" not in accounts
    assert len(set(accounts)) == len(accounts), "one ServiceAccount per role"


def test_node_agent_reads_only() -> None:
    """The node role writes nothing through the API: pods of its node, list and watch."""
    grants = grants_of("trainmedic-node")
    assert grants == {("cluster", "", "pods", "list"), ("cluster", "", "pods", "watch")}


def test_cluster_watcher_reads_exactly_what_it_watches() -> None:
    """List + watch of each resource agent/watchers/k8s/ reflects, nothing more."""
    grants = grants_of("trainmedic-cluster")
    assert {g[3] for g in grants} <= READ_VERBS, "the cluster role writes nothing"
    needed = {("cluster", spec.group, spec.plural, verb) for spec in RESOURCES.values() for verb in ("list", "watch")}
    config = role_settings("trainmedic-cluster")
    if config.kubernetes.follow_pod_logs:
        needed.add(("cluster", "", "pods/log", "get"))
    assert grants == needed


def kube_modules() -> list[ModuleType]:
    """The remediations/kube/ package and each of its modules (KubeOps and what it is built from)."""
    parts = pkgutil.iter_modules(kube_mod.__path__, prefix=f"{kube_mod.__name__}.")
    return [kube_mod, *(importlib.import_module(m.name) for m in parts)]


def what_calls() -> Iterator[tuple[ModuleType, ast.Call]]:
    """Each `_What(...)` call in the source of remediations/kube/, with the module whose code makes
    it (where the resource name it passes is looked up)."""
    for module in kube_modules():
        for node in ast.walk(ast.parse(inspect.getsource(module))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "_What":
                yield module, node


def kubeops_calls() -> set[tuple[str, str, str, bool]]:
    """(verb, apiGroup, resource[/sub], namespaced) of every API call remediations/kube/ describes
    with `_What(verb, RESOURCE, ..., sub=...)`, read from its source: the code is the reference."""
    out: set[tuple[str, str, str, bool]] = set()
    for module, node in what_calls():
        verb_node, res_node = node.args[0], node.args[1]
        assert isinstance(verb_node, ast.Constant) and isinstance(verb_node.value, str)
        assert isinstance(res_node, ast.Name), ast.dump(node)
        sub = next(
            (str(k.value.value) for k in node.keywords if k.arg == "sub" and isinstance(k.value, ast.Constant)), None
        )
        if res_node.id == "res":  # a workload of any supported kind
            targets = list(kube_mod.WORKLOADS.values())
        else:
            target = getattr(module, res_node.id)
            assert isinstance(target, kube_mod._Res), f"unknown resource name {res_node.id} in a _What call"
            targets = [target]
        for r in targets:
            out.add((verb_node.value, r.group, r.plural + (f"/{sub}" if sub else ""), r.namespaced))
    return out


def test_kubeops_calls_are_read_from_the_code() -> None:
    calls = kubeops_calls()
    # A sanity check of the reading itself: the well-known calls are there.
    assert ("patch", "", "nodes/status", False) in calls
    assert ("create", "kubeflow.org", "pytorchjobs", True) in calls
    assert ("get", "", "pods/log", True) in calls


def test_brain_rights_are_exactly_what_the_responder_uses() -> None:
    """Every call of KubeOps is granted, nothing else is: node operations cluster-wide, everything
    on pods and workloads only in the training namespaces (a Role bound per namespace)."""
    needed: set[Grant] = set()
    for verb, group, resource, namespaced in kubeops_calls():
        needed.add(("namespace" if namespaced else "cluster", group, resource, verb))
    # Events on a Node (node-problem-detector style) live in `default`, not a training namespace:
    # granted with the node rights.
    assert any("NODE_EVENT_NAMESPACE, body" in inspect.getsource(m) for m in kube_modules())
    needed.discard(("namespace", "", "events", "create"))
    needed.add(("cluster", "", "events", "create"))
    # Stack dumps: remediations/stacks/ opens the exec WebSocket (a GET; authorized as `get`, and
    # from Kubernetes 1.35 also as `create`).
    stacks = "".join(p.read_text(encoding="utf-8") for p in sorted((ROOT / "remediations" / "stacks").glob("*.py")))
    assert "connect_get_namespaced_pod_exec" in stacks
    needed |= {("namespace", "", "pods/exec", "get"), ("namespace", "", "pods/exec", "create")}
    assert grants_of("trainmedic-brain") == needed


def test_exec_is_never_cluster_wide() -> None:
    for account in ("trainmedic-node", "trainmedic-cluster", "trainmedic-brain"):
        assert not [g for g in grants_of(account) if g[0] == "cluster" and g[2] in ("pods/exec", "pods/attach")]


# ------------------------------------------------------------------------------------------------
# Pods: users, host paths, resources, probes


def is_root(pod: Doc, c: Doc) -> bool:
    sc = {**(pod.get("securityContext") or {}), **(c.get("securityContext") or {})}
    return sc.get("runAsUser") == 0 or sc.get("runAsNonRoot") is not True


@pytest.mark.parametrize("item", CONTAINERS, ids=container_id)
def test_container_security(item: tuple[Manifest, Doc]) -> None:
    m, c = item
    pod = pod_spec(m)
    sc = c.get("securityContext") or {}
    assert sc.get("readOnlyRootFilesystem") is True
    assert not pod.get("hostNetwork") and not pod.get("hostPID") and not pod.get("hostIPC")
    if m.kind == "DaemonSet" and m.name == "trainmedic-node":
        # The node agent is the one exception, and says why where it is declared.
        text = m.file.read_text(encoding="utf-8")
        assert "/dev/kmsg" in text and "privileged" in text and "root" in text
        assert "Why it runs as root, privileged" in text
        return
    assert not sc.get("privileged"), f"{container_id(item)} is privileged"
    assert not is_root(pod, c), f"{container_id(item)} may run as root"
    assert sc.get("allowPrivilegeEscalation") is False
    assert (sc.get("capabilities") or {}).get("drop") == ["ALL"]
    assert not (sc.get("capabilities") or {}).get("add")
    assert (pod.get("securityContext") or {}).get("seccompProfile", {}).get("type") == "RuntimeDefault"


@pytest.mark.parametrize("m", WORKLOADS, ids=lambda m: m.id)
def test_only_the_node_agent_sees_the_host(m: Manifest) -> None:
    host = [v["name"] for v in pod_spec(m).get("volumes") or [] if "hostPath" in v]
    if m.kind == "DaemonSet" and m.name == "trainmedic-node":
        assert host
    else:
        assert host == [], f"{m.id} mounts host paths {host}"


@pytest.mark.parametrize("item", CONTAINERS, ids=container_id)
def test_container_resources(item: tuple[Manifest, Doc]) -> None:
    res = item[1].get("resources") or {}
    requests, limits = res.get("requests") or {}, res.get("limits") or {}
    assert {"cpu", "memory"} <= set(requests), "cpu and memory requests"
    assert {"cpu", "memory"} <= set(limits), "cpu and memory limits"


def node_daemonset() -> Manifest:
    return one("DaemonSet", "trainmedic-node")


def test_node_host_paths_are_read_only_but_the_state_dir() -> None:
    ds = node_daemonset()
    pod = pod_spec(ds)
    host = {v["name"]: v["hostPath"] for v in pod["volumes"] if "hostPath" in v}
    mounts = {mt["name"]: mt for c in containers(ds) for mt in c.get("volumeMounts") or []}
    writable = {host[n]["path"] for n in host if n in mounts and not mounts[n].get("readOnly")}
    assert writable == {STATE_DIR}, f"writable host paths: {writable}"
    state = next(h for h in host.values() if h["path"] == STATE_DIR)
    assert state.get("type") == "DirectoryOrCreate"
    for name, h in host.items():
        assert name in mounts, f"host path {h['path']} is declared but not mounted"
        assert h.get("type"), f"host path {h['path']} has no type (a missing path would be created as a folder)"
        if h["path"] != STATE_DIR:
            assert mounts[name].get("readOnly") is True, f"{h['path']} must be read-only"
            assert h["type"] != "DirectoryOrCreate", f"{h['path']}: only the state dir may be created on the host"
        # Mounted where the settings expect them, so nothing is remapped.
        assert mounts[name]["mountPath"] == h["path"]


def test_node_host_paths_are_the_ones_its_settings_read() -> None:
    """Only the host paths the node role's sources read (logs.root, kernel.path) and the state dir
    holding its position stores: nothing else of the host is visible."""
    s = role_settings("trainmedic-node")
    host = {v["hostPath"]["path"] for v in pod_spec(node_daemonset())["volumes"] if "hostPath" in v}
    expected = {s.logs.root, STATE_DIR}
    if s.kernel.source in ("kmsg", "file"):
        expected.add(s.kernel.path)
    assert host == expected
    for store in (s.logs.position_store, s.kernel.position_store):
        assert store is None or store.startswith(STATE_DIR + "/")


def test_node_agent_runs_everywhere_and_knows_its_node() -> None:
    pod = pod_spec(node_daemonset())
    assert {"operator": "Exists"} in (pod.get("tolerations") or []), "tolerate every taint (quarantined nodes too)"
    env = {e["name"]: e for e in containers(node_daemonset())[0].get("env") or []}
    assert env["TRAINMEDIC_NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert env["NVIDIA_VISIBLE_DEVICES"]["value"] == "all"


# -- each role's settings, as its container would load them -----------------------------------------


def workload_of(service_account: str) -> Manifest:
    found = [m for m in WORKLOADS if pod_spec(m).get("serviceAccountName") == service_account]
    assert len(found) == 1
    return found[0]


def config_maps() -> dict[str, dict[str, str]]:
    return generator_files(kustomization(KUSTOMIZATIONS[0]))


def container_env(c: Doc) -> dict[str, str]:
    """The environment the container gets: envFrom ConfigMaps (from their generator files), then
    env (Downward API values as placeholders; Secret references as placeholders)."""
    maps = config_maps()
    env: dict[str, str] = {}
    for src in c.get("envFrom") or []:
        ref = src.get("configMapRef")
        assert ref is not None, "only ConfigMaps are used for envFrom"
        files = maps[ref["name"]]
        for key, path in files.items():
            assert key.startswith(".env:"), f"envFrom {ref['name']} must come from an env file"
            env.update(env_file(DEPLOY / path))
    for e in c.get("env") or []:
        if "value" in e:
            env[e["name"]] = str(e["value"])
        else:
            src = e["valueFrom"]
            env[e["name"]] = "placeholder-" + str(next(iter(src)))
    return env


def mount_source(m: Manifest, c: Doc, path: str) -> tuple[Doc, str] | None:
    """The volume and the path inside it that a container path comes from."""
    volumes = {v["name"]: v for v in pod_spec(m).get("volumes") or []}
    best = None
    for mt in c.get("volumeMounts") or []:
        mp = str(mt["mountPath"]).rstrip("/")
        if (path == mp or path.startswith(mp + "/")) and (best is None or len(mp) > len(best[1])):
            best = (mt, mp)
    if best is None:
        return None
    mt, mp = best
    return volumes[mt["name"]], path[len(mp) :].lstrip("/")


def role_config(service_account: str) -> tuple[Manifest, Doc, Role, Path, dict[str, str]]:
    m = workload_of(service_account)
    c = containers(m)[0]
    args = [str(a) for a in c.get("args") or c.get("command") or []]
    assert args[0] == "run", args
    role = role_arg(args)
    config_path = arg_value(args, "--config")
    assert config_path is not None
    src = mount_source(m, c, config_path)
    assert src is not None, f"{config_path} is not mounted"
    volume, key = src
    assert "configMap" in volume, f"{config_path} must come from a ConfigMap"
    files = config_maps()[volume["configMap"]["name"]]
    return m, c, role, DEPLOY / files[key], container_env(c)


def role_settings(service_account: str) -> Settings:
    _, _, _, path, env = role_config(service_account)
    return load_settings(path, env=env)


ACCOUNTS = ["trainmedic-node", "trainmedic-cluster", "trainmedic-brain"]


@pytest.mark.parametrize("account", ACCOUNTS)
def test_role_config_validates_for_its_role(account: str) -> None:
    _, _, role, path, env = role_config(account)
    try:
        settings = load_settings(path, env=env)
    except ConfigError as e:
        pytest.fail(f"{path.relative_to(ROOT)} with the container's environment: {e.problems}")
    assert check_role(settings, role) == []
    expected = {"trainmedic-node": Role.NODE, "trainmedic-cluster": Role.CLUSTER, "trainmedic-brain": Role.BRAIN}
    assert role is expected[account]
    assert settings.bus.kind == "kafka"


@pytest.mark.parametrize("account", ACCOUNTS)
def test_role_files_and_state_are_mounted(account: str) -> None:
    """Each path the settings read is mounted (read-only), each path they write is on a writable
    volume (the state dir; a PVC for the brain's incident store)."""
    m, c, _, _, _ = role_config(account)
    s = role_settings(account)
    reads = [*s.detect.rule_dirs]
    if s.remediate.policy:
        reads.append(s.remediate.policy)
    if s.api.token_file:
        reads.append(s.api.token_file)
    for path in reads:
        src = mount_source(m, c, path)
        assert src is not None, f"{account}: {path} is not mounted"
    writes: list[str] = []
    if account == "trainmedic-node":
        writes += [p for p in (s.logs.position_store, s.kernel.position_store) if p]
    if account == "trainmedic-brain":
        writes += [s.remediate.store, s.remediate.scene_dir]
    for path in writes:
        src = mount_source(m, c, path)
        assert src is not None, f"{account}: {path} is not on a volume (the root filesystem is read-only)"
        volume, _ = src
        mt = next(mt for mt in c["volumeMounts"] if mt["name"] == volume["name"])
        assert not mt.get("readOnly"), f"{account}: {path} must be writable"
    if account == "trainmedic-brain":
        volume, _ = mount_source(m, c, s.remediate.store) or ({}, "")
        assert "persistentVolumeClaim" in volume, "the incident store must survive the pod"
        token = mount_source(m, c, s.api.token_file or "")
        assert token is not None and "secret" in token[0]


def quiet(settings: Settings) -> Settings:
    """The same settings with every source, the responder and the token off: enough to see which
    components a role builds, without a host, a cluster or a store."""
    return settings.model_copy(
        update={
            "kubernetes": settings.kubernetes.model_copy(update={"enabled": False}),
            "logs": settings.logs.model_copy(update={"enabled": False}),
            "kernel": settings.kernel.model_copy(update={"source": "off"}),
            "metrics": settings.metrics.model_copy(update={"nvml": False, "prometheus_url": None}),
            "remediate": settings.remediate.model_copy(update={"enabled": False}),
            "detect": settings.detect.model_copy(update={"rule_dirs": []}),
            "api": settings.api.model_copy(update={"token_file": None, "token_env": None, "token": None}),
        }
    )


@functools.cache
def serves_api(role: Role, config: Path) -> bool:
    """Whether `trainmedic run --role ROLE` serves the HTTP API (health, /metrics) with this config:
    asked of agent.run.build_agent itself, so the probes follow the code."""
    agent = build_agent(quiet(load_settings(config, env={})), role, bus=MemoryBus())
    return "api" in agent.components


@pytest.mark.parametrize("account", ACCOUNTS)
def test_probes_hit_the_api_health_endpoints(account: str) -> None:
    """A role that serves the API is probed on /healthz and /readyz at api.port and scraped there;
    one that serves nothing has no probe (a probe on a closed port would restart it forever)."""
    m, c, role, path, _ = role_config(account)
    s = role_settings(account)
    ann = m.doc["spec"]["template"]["metadata"].get("annotations") or {}
    probes = ("livenessProbe", "readinessProbe", "startupProbe")
    if not serves_api(role, path):
        assert not [p for p in probes if p in c], f"{account}: {role.value} serves no HTTP endpoint to probe"
        assert not c.get("ports") and "prometheus.io/scrape" not in ann
        return
    assert s.api.enabled and s.api.host == "0.0.0.0", "the API must listen beyond loopback for the kubelet"
    ports = {p["name"]: p for p in c.get("ports") or []}
    assert ports["http"]["containerPort"] == s.api.port
    for probe, want in zip(probes, ("/healthz", "/readyz", "/healthz"), strict=True):
        get = (c.get(probe) or {}).get("httpGet") or {}
        assert get.get("path") == want, f"{account}: {probe}"
        assert get.get("port") in ("http", s.api.port), f"{account}: {probe} port"
    assert ann.get("prometheus.io/port") == str(s.api.port)


def test_the_brain_serves_the_api() -> None:
    _, _, role, path, _ = role_config("trainmedic-brain")
    assert serves_api(role, path)


def test_brain_keeps_one_writer_of_its_store() -> None:
    brain = workload_of("trainmedic-brain")
    assert brain.doc["spec"]["replicas"] == 1
    assert brain.doc["spec"]["strategy"]["type"] == "Recreate"
    claim = pod_spec(brain)
    pvcs = {v["persistentVolumeClaim"]["claimName"] for v in claim["volumes"] if "persistentVolumeClaim" in v}
    assert pvcs == {m.name for m in by_kind("PersistentVolumeClaim")}


def test_service_reaches_the_brain_api() -> None:
    svc = one("Service", "trainmedic")
    brain = workload_of("trainmedic-brain")
    labels = brain.doc["spec"]["template"]["metadata"]["labels"]
    assert all(labels.get(k) == v for k, v in svc.doc["spec"]["selector"].items())
    ports = {p["name"] for c in containers(brain) for p in c.get("ports") or []}
    for p in svc.doc["spec"]["ports"]:
        assert p["targetPort"] in ports
        assert p["port"] == role_settings("trainmedic-brain").api.port


def test_network_policy_admits_the_api_port() -> None:
    np = one("NetworkPolicy", "trainmedic")
    allowed = {p["port"] for rule in np.doc["spec"]["ingress"] for p in rule.get("ports") or []}
    assert allowed == {role_settings("trainmedic-brain").api.port}
    selector = np.doc["spec"]["podSelector"]["matchLabels"]
    for m in WORKLOADS:
        labels = m.doc["spec"]["template"]["metadata"]["labels"]
        assert all(labels.get(k) == v for k, v in selector.items()), f"{m.id} is not covered"


def test_network_policy_admits_only_named_sources() -> None:
    """No ingress rule is open to every source: each names who may reach the API port."""
    np = one("NetworkPolicy", "trainmedic")
    for rule in np.doc["spec"]["ingress"]:
        sources = rule.get("from") or []
        assert sources, "an ingress rule without `from` admits the whole cluster"
        for src in sources:
            assert "ipBlock" not in src
            if "namespaceSelector" in src:
                assert src["namespaceSelector"].get("matchLabels"), "an empty namespaceSelector is every namespace"


@pytest.mark.parametrize("role", ["trainmedic-brain"])
def test_the_brain_api_needs_the_token_for_reads(role: str) -> None:
    api = role_settings(role).api
    assert api.read_auth and api.token_file


def test_cluster_watcher_is_a_single_replica() -> None:
    m = workload_of("trainmedic-cluster")
    assert m.doc["spec"]["replicas"] == 1, "two watchers would publish every event twice"


# -- rules and policy ConfigMaps ------------------------------------------------------------------


def test_site_rules_load_with_the_shipped_ones() -> None:
    ruleset = load_rules([DEPLOY / "rules"])
    assert ruleset.rules


def test_site_rules_sketch_is_a_valid_rule(tmp_path: Path) -> None:
    """The commented example in deploy/rules/site.yaml loads and its example matches."""
    text = (DEPLOY / "rules" / "site.yaml").read_text(encoding="utf-8")
    block = text[text.index("# rules:") : text.index("\nversion:")]
    body = "\n".join(line[2:] if line.startswith("# ") else line.lstrip("#") for line in block.splitlines())
    (tmp_path / "sketch.yaml").write_text("version: 1\n" + body + "\n", encoding="utf-8")
    ruleset = load_rules([tmp_path])
    assert any(r.id.startswith("site.") for r in ruleset.rules)


def test_policy_config_map_is_the_shipped_policy() -> None:
    """deploy/policy.yaml is a copy (kustomize reads no file outside deploy/): the same bytes."""
    assert (DEPLOY / "policy.yaml").read_bytes() == POLICY_FILE.read_bytes(), (
        "deploy/policy.yaml differs from remediations/policy.yaml: copy it over"
    )
    policy = load_policy(DEPLOY / "policy.yaml")
    assert policy.mode.value == "dry-run", "a fresh deployment changes nothing until told to"


# -- the real renderer, where it is installed ----------------------------------------------------


def kubectl_kustomize(path: Path) -> list[Doc]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed (its built-in kustomize renders the manifests)")
    out = subprocess.run([kubectl, "kustomize", str(path)], capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d is not None]


def test_kustomize_renders_the_deployment() -> None:
    docs = kubectl_kustomize(DEPLOY)
    cms = {d["metadata"]["name"] for d in docs if d["kind"] == "ConfigMap"}
    assert all(re.match(r".+-[a-z0-9]{10}$", n) for n in cms), "generated names carry a content hash"
    for d in docs:
        if d["kind"] not in WORKLOAD_KINDS:
            continue
        pod = d["spec"]["template"]["spec"]
        for c in pod["containers"]:
            assert c["image"] == f"trainmedic:{VERSION}"
            for src in c.get("envFrom") or []:
                assert src["configMapRef"]["name"] in cms
        for v in pod["volumes"]:
            if "configMap" in v:
                assert v["configMap"]["name"] in cms, f"{v['configMap']['name']} was not rewritten"
        assert d["metadata"]["namespace"] == NAMESPACE


def test_kustomize_keeps_the_brain_as_subject_in_a_training_namespace() -> None:
    docs = kubectl_kustomize(DEPLOY / "training-namespace")
    binding = next(d for d in docs if d["kind"] == "RoleBinding")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "trainmedic-brain", "namespace": NAMESPACE}]


# ------------------------------------------------------------------------------------------------
# Dockerfile


def dockerfile_instructions() -> list[tuple[str, str]]:
    text = DOCKERFILE.read_text(encoding="utf-8").replace("\\\n", " ")
    out = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        word, _, rest = line.partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def test_dockerfile_is_multi_stage_slim_python_and_non_root() -> None:
    ins = dockerfile_instructions()
    args = dockerfile_args()
    base = args["PYTHON_IMAGE"]
    name, tag = image_tag(base)
    assert name == "python" and tag is not None and re.match(r"3\.12(\.\d+)?-slim", tag), base
    froms = [rest for word, rest in ins if word == "FROM"]
    assert len(froms) >= 2, "multi-stage"
    assert all(f.split()[0] == "${PYTHON_IMAGE}" for f in froms), "both stages from the same pinned base"
    users = [rest for word, rest in ins if word == "USER"]
    assert users, "a USER is set"
    uid = users[-1].split(":")[0]
    assert uid not in ("0", "root") and uid.isdigit(), "numeric non-root user (runAsNonRoot can check it)"
    assert ("ENTRYPOINT", '["trainmedic"]') in ins
    health = [rest for word, rest in ins if word == "HEALTHCHECK"]
    assert health and "/healthz" in health[0]
    runs = " ".join(rest for word, rest in ins if word == "RUN")
    assert "pip install" in runs and '"${spec}"' in runs and 'spec="."' in runs


def test_docker_context_holds_every_package() -> None:
    """The folders pyproject.toml ships packages from (trainmedic/ and each folder its package-dir
    maps into the namespace) are each copied in the Dockerfile and let through .dockerignore (an
    allowlist), with what `pip install .` reads besides."""
    py = tomllib.loads((ROOT / "pyproject.toml").read_text())
    setuptools = py["tool"]["setuptools"]
    packages = sorted({"trainmedic", *setuptools["package-dir"].values()})
    assert len(packages) > 1 and all("/" not in p for p in packages)
    copied = {rest.split()[0] for word, rest in dockerfile_instructions() if word == "COPY" and "--from" not in rest}
    ignore = [ln.strip() for ln in (ROOT / ".dockerignore").read_text().splitlines()]
    ignore = [ln for ln in ignore if ln and not ln.startswith("#")]
    assert ignore[0] == "*", "an allowlist"
    allowed = {ln[1:].rstrip("/") for ln in ignore if ln.startswith("!")}
    for pkg in packages:
        assert pkg in copied, f"{pkg} is not copied in the Dockerfile"
        assert pkg in allowed, f"{pkg} is kept out by .dockerignore"
        assert (ROOT / pkg).is_dir()
    readme = py["project"].get("readme")
    for needed in ("pyproject.toml", *([readme] if isinstance(readme, str) else [])):
        assert needed in allowed and any(needed in rest.split() for word, rest in dockerfile_instructions())
    assert "trainmedic" in py["project"]["scripts"], "the ENTRYPOINT is the package's console script"


# ------------------------------------------------------------------------------------------------
# docker-compose.yml


def compose() -> Doc:
    return yaml_doc(COMPOSE_FILE)


_VAR = re.compile(r"\$\{(\w+)(?:(:?[-?])((?:[^${}]|\$\$)*))?\}")


def interpolate(value: str, env: Mapping[str, str]) -> str:
    """Compose's variable syntax (${V}, ${V:-default}, ${V-default}, nested, $$), innermost first."""
    while True:
        m = _VAR.search(value)
        if m is None:
            return value.replace("$$", "$")
        name, op, default = m.group(1), m.group(2), m.group(3) or ""
        got = env.get(name)
        if op == ":-":
            rep = got if got else default
        elif op == "-":
            rep = got if got is not None else default
        else:
            assert op is None, f"unsupported interpolation {m.group(0)}"
            rep = got or ""
        value = value[: m.start()] + rep + value[m.end() :]


HOST_ENV = {"HOME": "/home/someone"}


def service_env(svc: Doc) -> dict[str, str]:
    raw = svc.get("environment") or {}
    if isinstance(raw, list):
        raw = dict(str(x).partition("=")[::2] for x in raw)
    return {str(k): interpolate(str(v), HOST_ENV) for k, v in raw.items()}


def service_mounts(svc: Doc) -> dict[str, str]:
    """Container path -> host path or volume name."""
    out = {}
    for v in svc.get("volumes") or []:
        parts = interpolate(str(v), HOST_ENV).split(":")
        out[parts[1]] = parts[0]
    for s in svc.get("secrets") or []:
        name = s if isinstance(s, str) else s["source"]
        target = f"/run/secrets/{name}" if isinstance(s, str) else s.get("target", f"/run/secrets/{name}")
        out[target] = f"secret:{name}"
    return out


COMPOSE_SERVICES = {"kafka", "prometheus", "alertmanager", "trainmedic-cluster", "trainmedic-brain"}
TRAINMEDIC_SERVICES = sorted(s for s in COMPOSE_SERVICES if s.startswith("trainmedic"))


def test_compose_services() -> None:
    c = compose()
    assert set(c["services"]) == COMPOSE_SERVICES
    assert "version" not in c, "the `version` key is obsolete"


@pytest.mark.parametrize("name", sorted(COMPOSE_SERVICES))
def test_compose_images_are_pinned(name: str) -> None:
    svc = compose()["services"][name]
    image, tag = image_tag(svc["image"])
    assert tag and tag != "latest" and re.search(r"\d", tag), f"{name}: {svc['image']} is not pinned"
    if name.startswith("trainmedic"):
        assert image == "trainmedic" and tag == VERSION
        build = svc["build"]
        context = build if isinstance(build, str) else build.get("context", ".")
        assert (ROOT / context / "Dockerfile").resolve() == DOCKERFILE


@pytest.mark.parametrize("name", sorted(COMPOSE_SERVICES))
def test_compose_bind_mounts_exist(name: str) -> None:
    svc = compose()["services"][name]
    for target, source in service_mounts(svc).items():
        if source.startswith("./"):
            assert (ROOT / source).exists(), f"{name}: {source} (mounted at {target}) does not exist"
        elif source.startswith("secret:"):
            secret = compose()["secrets"][source.removeprefix("secret:")]
            assert (ROOT / secret["file"]).is_file()
        elif not source.startswith("/"):
            assert source in (compose().get("volumes") or {}), f"{name}: volume {source} is not declared"


def test_every_compose_file_is_used() -> None:
    used = {
        (ROOT / src).resolve()
        for svc in compose()["services"].values()
        for src in service_mounts(svc).values()
        if src.startswith("./")
    }
    used |= {(ROOT / sec["file"]).resolve() for sec in (compose().get("secrets") or {}).values()}
    unused = [str(p.relative_to(ROOT)) for p in sorted(COMPOSE_DIR.iterdir()) if p.resolve() not in used]
    assert unused == [], f"files under deploy/compose/ that docker-compose.yml does not mount: {unused}"


def kafka_env() -> dict[str, str]:
    return service_env(compose()["services"]["kafka"])


def listeners(value: str) -> dict[str, tuple[str, int]]:
    out = {}
    for item in value.split(","):
        name, _, hostport = item.partition("://")
        host, _, port = hostport.rpartition(":")
        out[name] = (host, int(port))
    return out


def test_compose_kafka_runs_in_kraft_mode() -> None:
    env = kafka_env()
    assert not [k for k in env if "ZOOKEEPER" in k]
    assert set(env["KAFKA_PROCESS_ROLES"].split(",")) == {"broker", "controller"}
    node_id = env["KAFKA_NODE_ID"]
    controller = env["KAFKA_CONTROLLER_LISTENER_NAMES"]
    lst = listeners(env["KAFKA_LISTENERS"])
    assert controller in lst
    voters = env["KAFKA_CONTROLLER_QUORUM_VOTERS"].split(",")
    assert voters == [f"{node_id}@kafka:{lst[controller][1]}"]
    protocols = dict(p.split(":") for p in env["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"].split(","))
    assert set(lst) <= set(protocols)
    advertised = listeners(env["KAFKA_ADVERTISED_LISTENERS"])
    assert controller not in advertised, "the controller listener is not advertised to clients"
    assert env["KAFKA_INTER_BROKER_LISTENER_NAME"] in advertised
    # KRaft's cluster id: a base64url UUID (16 bytes).
    cid = env["CLUSTER_ID"]
    assert len(base64.urlsafe_b64decode(cid + "=" * (-len(cid) % 4))) == 16
    # One broker: every internal topic with one replica.
    for key in ("KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR", "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR"):
        assert env[key] == "1"
    assert "test" in compose()["services"]["kafka"]["healthcheck"]


@pytest.mark.parametrize("name", TRAINMEDIC_SERVICES)
def test_compose_trainmedic_depends_on_its_servers(name: str) -> None:
    deps = compose()["services"][name]["depends_on"]
    assert deps["kafka"]["condition"] == "service_healthy"
    assert "prometheus" in deps
    if name == "trainmedic-brain":
        assert "alertmanager" in deps


def compose_settings(name: str) -> tuple[Settings, Role, dict[str, str]]:
    svc = compose()["services"][name]
    command = [str(x) for x in svc["command"]]
    role = role_arg(command)
    config = arg_value(command, "--config")
    assert config is not None
    mounts = service_mounts(svc)
    assert config in mounts, f"{name}: {config} is not mounted"
    env = service_env(svc)
    try:
        settings = load_settings(ROOT / mounts[config], env=env)
    except ConfigError as e:
        pytest.fail(f"{name}: {e.problems}")
    return settings, role, mounts


def host_port(url: str) -> tuple[str, int]:
    m = re.match(r"^(?:\w+://)?([^/:]+):(\d+)", url)
    assert m, url
    return m.group(1), int(m.group(2))


@pytest.mark.parametrize("name", TRAINMEDIC_SERVICES)
def test_compose_trainmedic_config_validates_and_names_the_compose_services(name: str) -> None:
    settings, role, mounts = compose_settings(name)
    assert check_role(settings, role) == []
    assert role is {"trainmedic-brain": Role.BRAIN, "trainmedic-cluster": Role.CLUSTER}[name]
    services = compose()["services"]
    # Kafka: the listener advertised to the other containers.
    advertised = set(listeners(kafka_env()["KAFKA_ADVERTISED_LISTENERS"]).values())
    assert settings.bus.kind == "kafka"
    for server in settings.bus.bootstrap.split(","):
        assert host_port(server) in advertised and host_port(server)[0] in services
    # Prometheus on its default port.
    assert settings.metrics.prometheus_url is not None
    assert host_port(settings.metrics.prometheus_url) == ("prometheus", 9090)
    # Alertmanager as a notification sink.
    am = [s for s in settings.notify.sinks if s.kind == "alertmanager"]
    assert am and all(host_port(s.url) == ("alertmanager", 9093) for s in am)
    # The kubeconfig and the API token are mounted where the settings read them.
    assert settings.kubernetes.enabled and settings.kubernetes.kubeconfig in mounts
    config = ROOT / mounts[config_arg([str(x) for x in services[name]["command"]])]
    if not serves_api(role, config):
        # The image's HEALTHCHECK asks /healthz: off where nothing listens.
        assert services[name].get("healthcheck", {}).get("disable") is True
    if role is Role.BRAIN:
        assert serves_api(role, config)
        assert settings.api.token_file in mounts and mounts[settings.api.token_file].startswith("secret:")
        assert settings.api.host == "0.0.0.0"
        published = [str(p) for p in services[name].get("ports") or []]
        assert any(p.endswith(f":{settings.api.port}") for p in published)
        assert settings.remediate.store.startswith(STATE_DIR + "/") and mounts.get(STATE_DIR) == "trainmedic-state"


def prometheus_config() -> Doc:
    return yaml_doc(COMPOSE_DIR / "prometheus.yml")


def alertmanager_config() -> Doc:
    return yaml_doc(COMPOSE_DIR / "alertmanager.yml")


def test_compose_prometheus_config_points_at_the_services() -> None:
    cfg = prometheus_config()
    targets = [t for am in cfg["alerting"]["alertmanagers"] for sc in am["static_configs"] for t in sc["targets"]]
    assert targets == ["alertmanager:9093"]
    scrape = {j["job_name"]: [t for sc in j["static_configs"] for t in sc["targets"]] for j in cfg["scrape_configs"]}
    brain, _, _ = compose_settings("trainmedic-brain")
    assert f"trainmedic-brain:{brain.api.port}" in scrape["trainmedic"]
    for target in scrape["trainmedic"]:
        # Only what serves /metrics: a scrape of a silent service would page as TrainmedicDown.
        host, port = host_port(target)
        settings, role, mounts = compose_settings(host)
        config = ROOT / mounts[config_arg([str(x) for x in compose()["services"][host]["command"]])]
        assert serves_api(role, config) and port == settings.api.port
    # The rule files sit beside the config, in the file and in the container.
    mounts = service_mounts(compose()["services"]["prometheus"])
    for rel in cfg["rule_files"]:
        assert (COMPOSE_DIR / rel).is_file()
        assert f"/etc/prometheus/{rel}" in mounts


def route_receiver(route: Doc, labels: Mapping[str, str]) -> str:
    """Alertmanager's routing for one alert (first matching child route, `matchers` only)."""
    for child in route.get("routes") or []:
        if all(matches(m, labels) for m in child.get("matchers") or []):
            return route_receiver({**child, "receiver": child.get("receiver", route["receiver"])}, labels)
    return str(route["receiver"])


def matches(matcher: str, labels: Mapping[str, str]) -> bool:
    m = re.match(r'^\s*(\w+)\s*(=~|!~|!=|=)\s*"?(.*?)"?\s*$', matcher)
    assert m, matcher
    name, op, value = m.groups()
    got = labels.get(name, "")
    if op == "=":
        return got == value
    if op == "!=":
        return got != value
    hit = re.fullmatch(value, got) is not None
    return hit if op == "=~" else not hit


def test_compose_alertmanager_feeds_trainmedic_without_a_loop() -> None:
    cfg = alertmanager_config()
    receivers = {r["name"]: r for r in cfg["receivers"]}
    brain, _, mounts = compose_settings("trainmedic-brain")
    hooks = [w for r in receivers.values() for w in r.get("webhook_configs") or []]
    token_file = brain.api.token_file
    assert token_file is not None, "the brain's API requires a token"
    ours = [w for w in hooks if host_port(w["url"])[0] == "trainmedic-brain"]
    assert ours, "exporters' alerts reach trainmedic's receiver"
    for w in ours:
        assert host_port(w["url"]) == ("trainmedic-brain", brain.api.port)
        assert w["url"].endswith("/api/v1/alertmanager")
        auth = w["http_config"]["authorization"]
        assert auth.get("type", "Bearer") == "Bearer"
        # The same token file the brain reads.
        assert auth["credentials_file"] == token_file
        am_mounts = service_mounts(compose()["services"]["alertmanager"])
        assert am_mounts[auth["credentials_file"]] == mounts[token_file]
    receiver_of_trainmedic = {n for n, r in receivers.items() if any(w in ours for w in r.get("webhook_configs") or [])}
    # trainmedic's own alerts (its incidents, its health) never go back to it.
    for alertname in ("TrainmedicIncident", "TrainmedicDown"):
        assert route_receiver(cfg["route"], {"alertname": alertname}) not in receiver_of_trainmedic
    assert route_receiver(cfg["route"], {"alertname": "GpuXidError"}) in receiver_of_trainmedic


def api_routes() -> set[tuple[str, str]]:
    """(method, path) of every route of the real API app."""
    app = api_mod.create_app(store=None, telemetry=Telemetry(), settings=ApiSettings())
    out = set()
    for route in app.routes:
        for method in getattr(route, "methods", None) or ():
            out.add((method, str(getattr(route, "path", ""))))
    return out


def test_probed_and_posted_paths_are_the_apis() -> None:
    """The paths the manifests probe and Alertmanager posts to are routes of agent/api/."""
    routes = api_routes()
    assert ("GET", "/healthz") in routes and ("GET", "/readyz") in routes and ("GET", "/metrics") in routes
    for w in (w for r in alertmanager_config()["receivers"] for w in r.get("webhook_configs") or []):
        path = re.sub(r"^\w+://[^/]+", "", w["url"])
        assert ("POST", path) in routes, f"{w['url']}: no such route"


def render_alert_template(text: str, labels: Mapping[str, str], value: float) -> str:
    text = re.sub(r"\{\{\s*\$value\s*\}\}", f"{value:g}", text)
    return re.sub(r"\{\{\s*\$labels\.(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), text)


def test_compose_xid_alert_becomes_a_device_metric_for_the_brain() -> None:
    """The example exporter alert, as Alertmanager would deliver it, is read by the API as an Xid on
    a node (the same metric the device rules watch)."""
    rules = yaml_doc(COMPOSE_DIR / "alert-rules.yml")
    rule = next(r for g in rules["groups"] for r in g["rules"] if r.get("alert") == "GpuXidError")
    series = {"Hostname": "gpu-node-1", "gpu": "3", "UUID": "GPU-8f3a"}
    labels = {"alertname": "GpuXidError", **series}
    labels.update({k: render_alert_template(str(v), series, 79.0) for k, v in rule["labels"].items()})
    annotations = {k: render_alert_template(str(v), labels, 79.0) for k, v in rule["annotations"].items()}
    payload = api_mod.AlertmanagerWebhook.model_validate(
        {
            "version": "4",
            "status": "firing",
            "receiver": "trainmedic",
            "alerts": [{"status": "firing", "labels": labels, "annotations": annotations, "fingerprint": "f1"}],
        }
    )
    assert route_receiver(alertmanager_config()["route"], labels) == "trainmedic"
    events = api_mod.alert_events(payload, now=1.0).events
    batches = [e.payload for e in events if isinstance(e.payload, MetricBatch)]
    assert batches and batches[0].node == "gpu-node-1"
    assert [s.value for s in batches[0].samples if s.name == "xid_errors"][-1] == 79.0


# -- the real checkers ------------------------------------------------------------------------------


def require_tool(*names: str) -> str:
    for name in names:
        found = shutil.which(name)
        if found:
            return found
    if in_ci():
        pytest.fail(f"CI is set but {' / '.join(names)} is not installed (make servers installs it)")
    pytest.skip(f"{' / '.join(names)} is not installed")


def test_promtool_checks_the_prometheus_config() -> None:
    promtool = require_tool("promtool")
    out = subprocess.run(
        # --syntax-only: the files it names live in the containers (/run/secrets/api-token), not here.
        [promtool, "check", "config", "--syntax-only", str(COMPOSE_DIR / "prometheus.yml")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_amtool_checks_the_alertmanager_config() -> None:
    amtool = require_tool("amtool")
    out = subprocess.run(
        [amtool, "check-config", str(COMPOSE_DIR / "alertmanager.yml")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr
