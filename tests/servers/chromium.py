"""Debian's Chromium for the console's browser tests, driven by the `playwright` package.

Playwright's own browser downloads are never used: the tests launch `/usr/bin/chromium` (or
$TRAINMEDIC_CHROMIUM) through `executable_path`. `make test` installs Debian's `chromium` and a CJK
font (`fonts-wqy-microhei`) when missing. Where the browser or the package is missing, the tests
skip, or fail under CI=true (DESIGN.md "Real components").
"""

from __future__ import annotations

import os
import shutil

import pytest

ENV_BINARY = "TRAINMEDIC_CHROMIUM"
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def find_chromium() -> str | None:
    explicit = os.environ.get(ENV_BINARY)
    if explicit:
        return explicit if os.access(explicit, os.X_OK) else None
    debian = "/usr/bin/chromium"
    if os.access(debian, os.X_OK):
        return debian
    return shutil.which("chromium")


def _missing(reason: str) -> None:
    if in_ci():
        pytest.fail(f"CI is set but {reason}")
    pytest.skip(reason)


def require_chromium() -> str:
    """The Chromium binary; skips (fails under CI) when it or the playwright package is missing."""
    try:
        import playwright.async_api  # noqa: F401
    except ImportError:
        _missing("the playwright package is missing (pip install -e '.[test]')")
    binary = find_chromium()
    if binary is None:
        _missing("Debian's chromium is missing (make test installs it: apt-get install chromium)")
    assert binary is not None
    return binary
