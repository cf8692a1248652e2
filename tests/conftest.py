"""Shared fixtures: the shipped rules and one engine per matcher path, built once per session."""

from __future__ import annotations

import os

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
