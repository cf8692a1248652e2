"""Shared fixtures: the shipped rules and one engine per matcher path, built once per session."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Sequence
from typing import Any

import pytest

from trainmedic.detectors.engine import Engine, has_hyperscan
from trainmedic.detectors.loader import RuleSet, load_rules
from trainmedic.udal.registry import register

# The fake chip is a test double, not a shipped entry point: the suite registers it for itself.
FAKE_PLUGIN = ("fake", "trainmedic.udal.fake:FakePlugin")
register(*FAKE_PLUGIN)

# No on-disk compile cache unless a test asks for one (tests/core/test_cache.py): a test never reads an
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


# -- pytest-xdist ------------------------------------------------------------------------------------
# `make test` spreads the suite over pytest-xdist workers (`-n N --dist loadscope`, N: the cores and
# one more) with this suite's own scopes: tests that share a server run on one worker, so the server
# starts once there.
#  - tests/realplane: the session's real control plane (tests/realplane/conftest.py) is one scope,
#    except the modules that start control planes of their own, whose tests go anywhere;
#  - any other module is one scope (its module-scoped fixtures: the Kafka and tansu brokers,
#    Prometheus, a benchmark's figures, start once), except the modules in SPREAD: independent slow
#    tests with nothing expensive shared, each its own scope.
# Scopes go out in collection order (`--no-loadscope-reorder`), and tests/realplane is collected first
# (pytest_collection_modifyitems below), which starts the control plane early.
REALPLANE = "tests/realplane/"
OWN_PLANE = {"tests/realplane/test_bench.py", "tests/realplane/test_demo_real.py"}
SPREAD = {
    "tests/agent/demo/test_demo.py",
    "tests/agent/test_diagnose_scene.py",
    "tests/agent/test_live_cli.py",
    "tests/agent/test_remediation_e2e.py",
    "tests/agent/test_run_roles.py",
    "tests/core/test_cache.py",
    "tests/detectors/test_correlator.py",
}


def xdist_scope(nodeid: str) -> str:
    """The scope of a test for pytest-xdist's `loadscope` distribution (see above)."""
    module = nodeid.split("::", 1)[0]
    if module in OWN_PLANE or module in SPREAD:
        return nodeid
    if module.startswith(REALPLANE):
        return REALPLANE
    return module


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """tests/realplane first, the rest in their own order: the real control plane (one scope, one worker)
    starts while the other scopes run, though its folder sorts after most of the suite's."""
    items.sort(key=lambda item: not item.nodeid.startswith(REALPLANE))


def distinct_ids(ids: Sequence[str]) -> list[str]:
    """The test ids with the second and later copies of a repeated id made distinct (`id #2`, ...)."""
    seen: Counter[str] = Counter()
    out = []
    for nodeid in ids:
        seen[nodeid] += 1
        out.append(nodeid if seen[nodeid] == 1 else f"{nodeid} #{seen[nodeid]}")
    return out


try:
    from xdist.scheduler import LoadScopeScheduling
except ImportError:  # pragma: no cover - pytest-xdist is in the `test` extra; without it the suite runs in one process
    pass
else:

    class SuiteScopeScheduling(LoadScopeScheduling):  # type: ignore[misc]  # pytest-xdist ships no type hints
        """loadscope with the scopes above. The scheduler keeps its books by test id, and schemathesis
        gives every operation it fuzzes (tests/agent/api/test_api_schemathesis.py) the same id: a repeated id gets
        a `#n` suffix here, so each of those tests is sent to a worker (the worker runs them by index)."""

        def add_node_collection(self, node: Any, collection: Sequence[str]) -> None:
            super().add_node_collection(node, distinct_ids(collection))

        def _split_scope(self, nodeid: str) -> str:
            return xdist_scope(nodeid)

    def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> LoadScopeScheduling | None:
        if config.getvalue("dist") != "loadscope":
            return None
        return SuiteScopeScheduling(config, log)


# looptime leaves a stray event loop behind in synchronous tests; close it around every test so an
# unclosed-loop ResourceWarning never fails an unrelated later test (see tests/servers/loops.py).
from servers.loops import no_stray_event_loop  # noqa: E402, F401
