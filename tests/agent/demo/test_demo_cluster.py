"""`trainmedic demo --cluster`: the real plane refused clearly (en and zh, with the `make cluster`
command) where its binaries are not built, faults it does not run refused, and the plane's launcher
importable from the shipped package at the release tests/cluster/go.mod pins. The run itself is
tests/realplane/test_demo_real.py's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from paths import ROOT

from trainmedic.agent.demo import plane
from trainmedic.agent.demo.runner import EXIT_UNUSABLE, REAL_FAULTS, parse_faults


def _demo(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trainmedic.agent", "demo", *args],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


@pytest.mark.parametrize(
    ("lang", "words"),
    [("en", "the real control plane is not built"), ("zh", "真实控制面尚未构建")],
)
def test_without_the_binaries_the_real_plane_is_refused_with_make_cluster(
    tmp_path: Path, lang: str, words: str
) -> None:
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    proc = _demo("--cluster", "real", "--fault", "xid", "--lang", lang, "--workdir", str(tmp_path / "w"), env=env)
    assert proc.returncode == EXIT_UNUSABLE
    assert proc.stdout == ""
    assert words in proc.stderr and "`make cluster`" in proc.stderr
    assert str(tmp_path / "cache" / "trainmedic" / f"kube-{plane.kube_version()}" / "bin") in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "w").exists()  # refused before anything was made


@pytest.mark.parametrize("fault", ["oom", "hccl", "hang", "app-error"])
def test_the_real_plane_refuses_the_faults_it_does_not_run(fault: str) -> None:
    with pytest.raises(ValueError, match="run on the emulated cluster only"):
        parse_faults(fault, "real")
    assert parse_faults(fault) == [fault]


def test_all_on_the_real_plane_is_its_faults() -> None:
    assert parse_faults("all", "real") == list(REAL_FAULTS) == ["xid", "node-lost"]


def test_an_unknown_cluster_is_refused() -> None:
    proc = _demo("--cluster", "minikube")
    assert proc.returncode == 2 and "invalid choice" in proc.stderr


def test_the_shipped_launcher_pins_the_release_of_the_go_module() -> None:
    assert plane.GO_MOD.is_file()
    assert plane.kube_version() == plane.KUBE_VERSION
