"""The installed layout: one top-level name, `trainmedic`.

The code lives in the folders the project is known by (agent/, detectors/, remediations/, reports/,
rules/, udal/); pyproject.toml maps each into the namespace (trainmedic.agent, ...) and the
repository's trainmedic/<folder> symlinks give pytest, mypy and `python -m` the same names. These
tests hold the three together: no code imports a bare folder name (it would load a second copy of a
module in the repository and fail once installed), the package list follows the folders, and the
wheel built from the tree holds only `trainmedic` with every module and data file in it, and runs.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
from paths import ROOT

from trainmedic import cache

NS = "trainmedic"
FOLDERS = ("agent", "detectors", "remediations", "reports", "rules", "udal")
# Where code that imports the packages lives (tests/data/pytorch runs in its own torch environment).
CODE_ROOTS = ("trainmedic", *FOLDERS, "tests", "bench", "tools")
SKIP = ("tests/data/pytorch/",)
# A string that is a whole module path or entry-point value: "agent.cli", "udal.fake:FakePlugin".
MODULE_STRING = re.compile(rf"^({'|'.join(FOLDERS)})((?:\.\w+)+)(:\w+)?$")


def _is_module(folder: str, rest: str) -> bool:
    """Whether `<folder><rest>` names a module or package of ours (its first part is enough)."""
    first = rest.lstrip(".").split(".")[0]
    return (ROOT / folder / f"{first}.py").is_file() or (ROOT / folder / first / "__init__.py").is_file()


def bare_references(source: str) -> list[str]:
    """Each import of a bare folder name (`from agent.cli import main`, `import udal`) and each string
    that is a bare module path (`"agent.cli:main"`, a mock target) in one module's source."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] in FOLDERS:
                found.append(f"{node.lineno}: from {node.module} import ...")
        elif isinstance(node, ast.Import):
            found.extend(f"{node.lineno}: import {a.name}" for a in node.names if a.name.split(".")[0] in FOLDERS)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            m = MODULE_STRING.match(node.value)
            if m and _is_module(m.group(1), m.group(2)):
                found.append(f"{node.lineno}: {node.value!r}")
    return found


def python_files(top: str) -> list[Path]:
    base = ROOT / top
    return sorted(
        p
        for p in base.rglob("*.py")
        if "__pycache__" not in p.parts and not p.relative_to(ROOT).as_posix().startswith(SKIP)
    )


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("from agent.cli import main\n", ["1: from agent.cli import ..."]),
        ("import udal\n", ["1: import udal"]),
        ("import detectors.engine as e\n", ["1: import detectors.engine"]),
        ('ep = "udal.nvidia:NvidiaPlugin"\n', ["1: 'udal.nvidia:NvidiaPlugin'"]),
        ('target = "detectors.diagnose.make_engine"\n', ["1: 'detectors.diagnose.make_engine'"]),
        ("from trainmedic.agent.cli import main\nfrom trainmedic import udal\n", []),
        ('x = "trainmedic.udal.nvidia:NvidiaPlugin"\n', []),
        # Not module paths: an attribute of a variable named agent, a word, a file name.
        ("agent.bus.start()\n", []),
        ('key = "rules"\npath = "rules/hang.yaml"\n', []),
        ('"""Docstring naming agent.cli in prose."""\n', []),
    ],
)
def test_bare_references_finds_what_it_must(source: str, expected: list[str]) -> None:
    assert bare_references(source) == expected


@pytest.mark.parametrize("top", CODE_ROOTS)
def test_no_bare_package_names(top: str) -> None:
    """Every module imports trainmedic.<folder>..., never the bare folder name: in the repository the
    bare name would load a second copy of the module (two registries, two settings classes), and in
    an installed wheel it does not exist."""
    files = python_files(top)
    assert files, f"no Python files under {top}/"
    offenders = {
        p.relative_to(ROOT).as_posix(): refs for p in files if (refs := bare_references(p.read_text(encoding="utf-8")))
    }
    assert offenders == {}, "use trainmedic.<folder>: " + repr(offenders)


def folder_packages() -> list[str]:
    """The packages the folders hold (every folder with an __init__.py), under the namespace."""
    found = [NS]
    for folder in FOLDERS:
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT)
            if "__pycache__" not in rel.parts:
                found.append(".".join((NS, *rel.parts)))
    return sorted(found)


def setuptools_table() -> dict[str, object]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]  # type: ignore[no-any-return]


def test_package_list_follows_the_folders() -> None:
    """pyproject.toml lists every package the folders hold (a new subpackage left out of the list
    would be missing from the wheel) and maps each folder into the namespace."""
    table = setuptools_table()
    assert sorted(table["packages"]) == folder_packages()  # type: ignore[call-overload]
    assert table["package-dir"] == {f"{NS}.{f}": f for f in FOLDERS}


@pytest.mark.parametrize("folder", FOLDERS)
def test_repository_namespace_links(folder: str) -> None:
    """trainmedic/<folder> is a relative symlink to the folder: what pytest, mypy and `python -m
    trainmedic.agent` import in the repository is the code in the folder, under the installed name."""
    link = ROOT / NS / folder
    assert link.is_symlink(), f"{link.relative_to(ROOT)} must be a symlink to ../{folder}"
    assert os.readlink(link) == f"../{folder}"
    assert link.resolve() == (ROOT / folder).resolve()
    module = __import__(f"{NS}.{folder}", fromlist=["__file__"])
    assert Path(module.__file__ or "").resolve().parent == (ROOT / folder).resolve()


def test_cache_fingerprint_reads_its_files() -> None:
    """The compile cache's key hashes source files named relative to the package: each must be
    there (a missing one would hash as absent and miss code changes)."""
    for rel in cache._CODE_FILES:
        assert (cache._ROOT / rel).is_file(), rel
    assert list(cache._ROOT.glob(cache._CODE_GLOBS[0]))


def _source_copy(dest: Path) -> Path:
    """What `pip install .` reads (pyproject.toml, README, LICENSE, the package folders, the
    namespace links), copied so the build leaves nothing in the checkout."""
    dest.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(ROOT / name, dest / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(ROOT / NS, dest / NS, symlinks=True, ignore=ignore)
    for folder in FOLDERS:
        shutil.copytree(ROOT / folder, dest / folder, ignore=ignore)
    return dest


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel built from the tree, offline (setuptools from the test extras, no build isolation)."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = _source_copy(tmp / "src")
    out = tmp / "dist"
    pip = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index"]
    proc = subprocess.run(
        [*pip, "--no-cache-dir", "-q", "-w", str(out), str(src)],
        capture_output=True,
        text=True,
        timeout=110,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (built,) = out.glob("trainmedic-*.whl")
    return built


def test_wheel_has_one_top_level_name(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        top_level = z.read(next(n for n in names if n.endswith(".dist-info/top_level.txt"))).decode().split()
    tops = {n.split("/")[0] for n in names}
    dist_info = {t for t in tops if t.endswith(".dist-info")}
    assert tops - dist_info == {NS}, sorted(tops)
    assert len(dist_info) == 1
    assert top_level == [NS]


def _shipped_files() -> list[str]:
    """Every file of the package folders as the wheel names it (trainmedic/<folder>/...)."""
    out = [f"{NS}/{p.name}" for p in (ROOT / NS).iterdir() if p.is_file() and p.suffix in (".py", ".typed")]
    for folder in FOLDERS:
        for p in (ROOT / folder).rglob("*"):
            if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc":
                out.append(f"{NS}/{p.relative_to(ROOT).as_posix()}")
    return sorted(out)


def test_wheel_holds_every_module_and_data_file(wheel: Path) -> None:
    """Modules and package data (rules YAML, vendor catalogs, report and console templates, console
    static files, policy and hints) all land under trainmedic/ in the wheel."""
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
    shipped = _shipped_files()
    missing = [f for f in shipped if f not in names]
    assert missing == []
    # The data the code finds next to itself, named once more so a glob mistake cannot hide it.
    kinds = {
        "rules": f"{NS}/rules/nvidia_xid.yaml",
        "phases": f"{NS}/rules/phases/phases.yaml",
        "catalog": f"{NS}/udal/nvidia_catalog.yaml",
        "report template": f"{NS}/reports/templates/report.html.j2",
        "report labels": f"{NS}/reports/report_labels.yaml",
        "console template": f"{NS}/agent/console/templates/base.html.j2",
        "console static": f"{NS}/agent/console/static/console.js",
        "policy": f"{NS}/remediations/policy.yaml",
        "progress markers": f"{NS}/detectors/progress.yaml",
    }
    assert {k: v for k, v in kinds.items() if v not in names} == {}
    assert [f"{NS}/{rel}" for rel in cache._CODE_FILES if f"{NS}/{rel}" not in names] == []


def test_wheel_entry_points_name_the_namespace(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as z:
        text = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/entry_points.txt"))).decode()
    section, entries = "", {}
    for line in text.splitlines():
        if line.startswith("["):
            section = line.strip("[]")
        elif "=" in line:
            name, value = (s.strip() for s in line.split("=", 1))
            entries[(section, name)] = value
    assert entries[("console_scripts", "trainmedic")] == f"{NS}.agent.cli:main"
    chips = {name: value for (sec, name), value in entries.items() if sec == "trainmedic.chips"}
    assert set(chips) == {"nvidia", "ascend", "cambricon", "generic"}
    assert all(v.startswith(f"{NS}.udal.") for v in chips.values()), chips


def test_installed_wheel_diagnoses(wheel: Path, tmp_path: Path) -> None:
    """The wheel unpacked on its own (the checkout off the path) imports only as trainmedic.*, finds
    its data files and diagnoses the worked example; the bare folder names do not exist there."""
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as z:
        z.extractall(site)
    script = (
        "import importlib.util, json, sys\n"
        f"sys.path.insert(0, {str(site)!r})\n"
        "import trainmedic.agent.cli as cli\n"
        f"assert cli.__file__.startswith({str(site)!r}), cli.__file__\n"
        "bare = [n for n in ('agent', 'detectors', 'remediations', 'reports', 'rules', 'udal')"
        " if importlib.util.find_spec(n) is not None]\n"
        "assert bare == [], bare\n"
        "sys.exit(cli.main(sys.argv[1:]))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["TRAINMEDIC_CACHE_DIR"] = ""
    example = ROOT / "examples" / "gpu-fell-off-bus"
    proc = subprocess.run(
        [sys.executable, "-c", script, "diagnose", "--logs", str(example), "--format", "json"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=110,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "gpu_fallen_off_bus" in proc.stdout
