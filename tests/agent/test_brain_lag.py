"""A brain behind on its input judges silences at the time it has read up to: lines still waiting on
the bus are not a hang (the hang floor is 20 s, far shorter than a busy brain's lag can be)."""

from __future__ import annotations

import pytest

from trainmedic.agent.brain import Brain
from trainmedic.agent.bus.memory import MemoryBus
from trainmedic.detectors.hang import HangDetector
from trainmedic.models import Finding


class Recorder(HangDetector):
    def __init__(self) -> None:
        super().__init__()
        self.checked: list[float] = []

    def check(self, now: float) -> list[Finding]:
        self.checked.append(now)
        return []


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("behind", "read_until", "expected"), [(False, 900.0, 1000.0), (True, 900.0, 900.0), (True, 0.0, 1000.0)]
)
async def test_hangs_are_judged_at_the_time_read_while_behind(behind: bool, read_until: float, expected: float) -> None:
    hang = Recorder()
    brain = Brain(MemoryBus(), hang=hang, fast=False)
    brain._read_until = read_until
    await brain.tick(1000.0, behind=behind)
    assert hang.checked == [expected]
