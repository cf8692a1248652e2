"""Shared fixtures: the shipped rules and one engine per matcher path, built once per session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from detectors.engine import Engine, has_hyperscan
from detectors.loader import RuleSet, load_rules
from udal.registry import register

# The fake chip is a test double, not a shipped entry point: the suite registers it for itself.
FAKE_PLUGIN = ("fake", "udal.fake:FakePlugin")
register(*FAKE_PLUGIN)

# No on-disk compile cache unless a test asks for one (tests/test_cache.py): a test never reads an
# entry that an earlier test, or the developer's own runs, left behind.
os.environ.setdefault("TRAINMEDIC_CACHE_DIR", "")


@pytest.fixture(scope="session")
def shipped_ruleset() -> RuleSet:
    return load_rules()


@pytest.fixture(scope="session")
def re_engine(shipped_ruleset: RuleSet) -> Engine:
    return Engine(shipped_ruleset.rules, fast=False)


@pytest.fixture(scope="session")
def fast_engine(shipped_ruleset: RuleSet) -> Engine:
    """The Hyperscan path. Skipped where the wheel is missing, except under CI, where it must be there."""
    if not has_hyperscan():
        if os.environ.get("CI", "").lower() not in ("", "0", "false"):
            pytest.fail("CI is set but the hyperscan module is not importable")
        pytest.skip("hyperscan is not installed")
    return Engine(shipped_ruleset.rules, fast=True)


# looptime leaves a stray event loop behind in synchronous tests; close it around every test so an
# unclosed-loop ResourceWarning never fails an unrelated later test (see tests/servers/loops.py).
from servers.loops import no_stray_event_loop  # noqa: E402, F401


# `make test` runs the suite on several pytest-xdist workers (`-n auto --dist loadgroup`). A test that
# shares an expensive server with others stays with them on one worker, so the server starts once:
# the real control plane (one per session, tests/realplane/conftest.py) for the whole realplane
# directory, and a module's own module-scoped fixtures (the Kafka and tansu brokers, Prometheus, a
# benchmark's figures) for that module. Every other test goes to whichever worker is free.
HERE = Path(__file__).resolve().parent
REALPLANE = HERE / "realplane"
# The brokers there are module-scoped but reached through `request.getfixturevalue` (tests/bus/conftest.py).
BUS = HERE / "bus"


def xdist_group(item: pytest.Item) -> str | None:
    path = Path(str(item.path))
    if REALPLANE in path.parents:
        return "realplane"
    if BUS in path.parents:
        return path.relative_to(HERE).as_posix()
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return None
    for defs in info.name2fixturedefs.values():
        if any(d.scope == "module" for d in defs):
            return path.relative_to(HERE).as_posix()
    return None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        group = xdist_group(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
