"""The tests mirror the source tree: a test module lives in the folder of the code it tests
(tests/agent/watchers/ for agent/watchers/, tests/core/ for trainmedic/'s own modules), never directly
in tests/, and the files the suite's scheduler names (tests/conftest.py) exist."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import conftest
from paths import ROOT, TESTS

# The modules directly in tests/: the root conftest and the helpers tests in several folders import
# (tests/ is on sys.path). A test module is never one of them.
SUPPORT = {
    "conftest.py",  # shared fixtures, the fake chip's registration, the pytest-xdist scheduler
    "paths.py",  # the repository root and the test data folders, for tests in any folder
    "rulefix.py",  # rule files as YAML text (tests/detectors/test_loader.py, tests/core/test_cache.py)
    "zetachip.py",  # a chip plugin trainmedic does not ship (tests/udal, tests/agent/watchers)
}

# tests/<first folder> -> the source folder it mirrors. tests/core mirrors trainmedic/ (backoff.py,
# cache.py, errors.py, ...): a folder named `trainmedic` on sys.path would shadow the package.
MIRRORS = {
    "agent": "agent",
    "bench": "bench",
    "core": "trainmedic",
    "detectors": "detectors",
    "remediations": "remediations",
    "reports": "reports",
    "rules": "rules",
    "udal": "udal",
}
# Folders of tests that mirror no single source folder: project-wide checks (docs, packaging, deploy
# files, the corpus's shape, this layout) and the real control plane's suite.
OWN = {"project", "realplane"}
# Folders with no test modules: the test servers, their build files, data and golden files.
NO_TESTS = {"cluster", "data", "golden", "kafka", "servers"}


def _test_modules() -> list[Path]:
    return sorted(
        p
        for p in TESTS.rglob("*.py")
        if p.name.startswith("test_") and p.relative_to(TESTS).parts[0] not in NO_TESTS and "__pycache__" not in p.parts
    )


def test_no_test_module_directly_in_tests() -> None:
    top = sorted(p.name for p in TESTS.glob("*.py"))
    assert [name for name in top if name not in SUPPORT] == [], (
        "a test module goes in the folder of the code it tests (tests/agent/, tests/detectors/, tests/project/, ...)"
    )


def test_support_modules_are_there() -> None:
    assert sorted(SUPPORT) == sorted(p.name for p in TESTS.glob("*.py"))


def test_every_test_folder_mirrors_a_source_folder() -> None:
    wrong = []
    for module in _test_modules():
        first, *rest = module.parent.relative_to(TESTS).parts or ("",)
        if first in OWN:
            continue
        source = MIRRORS.get(first)
        if source is None or not (ROOT / source).joinpath(*rest).is_dir():
            wrong.append(module.relative_to(ROOT).as_posix())
    assert wrong == []


def test_folders_without_tests_hold_none() -> None:
    found = [p.relative_to(ROOT).as_posix() for d in NO_TESTS for p in (TESTS / d).rglob("test_*.py")]
    assert found == []


def test_module_names_are_unique() -> None:
    """Test modules outside a package are imported by their file name (pytest's default import mode;
    mypy names them the same way), so two in different folders would collide."""
    by_name: dict[str, list[str]] = defaultdict(list)
    for module in _test_modules():
        if not (module.parent / "__init__.py").is_file():
            by_name[module.name].append(module.relative_to(ROOT).as_posix())
    assert {name: paths for name, paths in by_name.items() if len(paths) > 1} == {}


def test_scheduler_names_existing_modules() -> None:
    named = sorted(conftest.SPREAD | conftest.OWN_PLANE)
    assert [name for name in named if not (ROOT / name).is_file()] == []
    assert (ROOT / conftest.REALPLANE).is_dir()
