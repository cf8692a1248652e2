"""The action registry: one module per action, keyed by the names the policy plans."""

from __future__ import annotations

import pytest

from trainmedic.remediations.actions import ACTIONS
from trainmedic.remediations.policy import ActionName


@pytest.mark.parametrize("name", [a.value for a in ActionName])
def test_every_policy_action_has_its_module(name: str) -> None:
    action = ACTIONS[name]
    assert action.name == name
    assert action.run is not None and action.spec
    assert action.mutating is (name != "notify")


def test_the_registry_has_no_action_the_policy_cannot_plan() -> None:
    assert set(ACTIONS) == {a.value for a in ActionName}
