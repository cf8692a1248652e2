"""Where the suite's files are, for tests in any folder under tests/: the repository root, the tests
folder and its data (`from paths import ROOT, DATA`; tests/conftest.py puts tests/ on `sys.path`)."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
DATA = TESTS / "data"
GOLDEN = TESTS / "golden"
