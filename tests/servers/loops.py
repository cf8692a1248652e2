"""An autouse fixture that closes the stray event loop looptime leaves behind in synchronous tests.

looptime 0.9's pytest hook asks pytest-asyncio's (session, autouse) event loop policy for the
current loop in every test, sync ones included; with no loop set, the policy creates one, sets it
and nobody closes it. When a later async test replaces it, the garbage collector finds an unclosed
loop and pytest (warnings as errors) fails whichever test is running then. Import this fixture into
a test module to close such a loop before and after each of its tests. Loops of pytest-asyncio's
runners are patched by looptime (LoopTimeEventLoop) and are never touched.
"""

from __future__ import annotations

import asyncio
import warnings
from collections.abc import Iterator

import pytest
from looptime import LoopTimeEventLoop


def close_stray_event_loop() -> None:
    policy = asyncio.get_event_loop_policy()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            loop = policy.get_event_loop()
        except RuntimeError:
            return
    if isinstance(loop, LoopTimeEventLoop) or loop.is_running() or loop.is_closed():
        return
    loop.close()
    policy.set_event_loop(None)


@pytest.fixture(autouse=True)
def no_stray_event_loop() -> Iterator[None]:
    close_stray_event_loop()
    yield
    close_stray_event_loop()
