"""deploy/helm/trainmedic with a real `helm` (built from its Go module by `make helm`): `helm lint`
passes, and `helm template` renders, for each layout, exactly the objects `kubectl kustomize`
renders from the kustomize base (the Namespace aside: `helm install --create-namespace` makes it);
the templates are what tools/helm_chart.py generates from the bases today."""

from __future__ import annotations

import importlib
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from paths import ROOT
from servers.prometheus import in_ci

CHART = ROOT / "deploy" / "helm" / "trainmedic"
HELM_VERSION = "v3.19.0"
LAYOUTS = {"all-in-one": ROOT / "deploy" / "all-in-one", "kafka": ROOT / "deploy"}

# tools/ is not a package: its generator is loaded by path.
sys.path.insert(0, str(ROOT / "tools"))
helm_chart = importlib.import_module("helm_chart")


def _require(name: str, found: str | None) -> str:
    if found is None:
        why = f"{name} is not installed" + (" (make helm builds it)" if name == "helm" else "")
        if in_ci():
            pytest.fail(f"CI is set but {why}")
        pytest.skip(why)
    return found


def helm() -> str:
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "trainmedic" / f"helm-{HELM_VERSION}"
    for candidate in (os.environ.get("TRAINMEDIC_HELM"), str(cache / "helm"), shutil.which("helm")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return _require("helm", None)


def run(*argv: str) -> str:
    out = subprocess.run(list(argv), capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def docs(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d is not None]


def key(d: dict[str, Any]) -> tuple[str, str, str]:
    return (str(d["kind"]), str(d["metadata"].get("namespace") or ""), str(d["metadata"]["name"]))


def test_the_makefile_builds_this_version() -> None:
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    assert f"HELM_VERSION := {HELM_VERSION}\n" in makefile


def test_helm_lint() -> None:
    out = run(helm(), "lint", "--strict", str(CHART))
    assert "0 chart(s) failed" in out


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_helm_renders_what_kustomize_renders(layout: str) -> None:
    kubectl = _require("kubectl", shutil.which("kubectl"))
    rendered = docs(run(helm(), "template", "trainmedic", str(CHART), "-n", "trainmedic", "--set", f"layout={layout}"))
    base = [d for d in docs(run(kubectl, "kustomize", str(LAYOUTS[layout]))) if d["kind"] != "Namespace"]
    assert sorted(map(key, rendered)) == sorted(map(key, base))
    by_key = {key(d): d for d in base}
    for d in rendered:
        assert d == by_key[key(d)], f"{key(d)} differs from the kustomize base"


@pytest.mark.parametrize(("namespace", "image"), [("ml-ops", "registry.example/trainmedic"), ("trainmedic", "x/y")])
def test_namespace_and_image_come_from_the_release(namespace: str, image: str) -> None:
    rendered = docs(
        run(
            helm(),
            "template",
            "t",
            str(CHART),
            "-n",
            namespace,
            "--set",
            f"image.repository={image}",
            "--set",
            "image.tag=9.9",
        )
    )
    assert rendered
    for d in rendered:
        if d["kind"] not in ("ClusterRole", "ClusterRoleBinding"):
            assert d["metadata"]["namespace"] == namespace
        for s in d.get("subjects") or []:
            assert s["namespace"] == namespace
        spec = (d.get("spec") or {}).get("template", {}).get("spec", {})
        for c in spec.get("containers") or []:
            assert c["image"] == f"{image}:9.9"


def test_an_unknown_layout_is_refused() -> None:
    out = subprocess.run(
        [helm(), "template", "t", str(CHART), "--set", "layout=three-roles"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode != 0 and "layout" in out.stderr


def test_templates_are_generated_from_the_bases() -> None:
    _require("kubectl", shutil.which("kubectl"))
    assert helm_chart.main(["--check"]) == 0
