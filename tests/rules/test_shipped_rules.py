"""Test what we ship: every rule file parses into the schema and every embedded example holds."""

from __future__ import annotations

from typing import Any

import pytest

from trainmedic.detectors.engine import Engine
from trainmedic.detectors.loader import RuleSet, load_rules
from trainmedic.detectors.schema import RuleStatus
from trainmedic.models import FaultClass

_SHIPPED = load_rules(run_examples=False)


def _examples() -> list[Any]:
    out = []
    for rule in _SHIPPED.rules:
        for i, ex in enumerate(rule.examples.match):
            out.append(pytest.param(rule.id, ex.line, ex.code, ex.fault_class, id=f"{rule.id}-match{i}"))
    return out


def _near_misses() -> list[Any]:
    out = []
    for rule in _SHIPPED.rules:
        for i, line in enumerate(rule.examples.no_match):
            out.append(pytest.param(rule.id, line, id=f"{rule.id}-nomatch{i}"))
    return out


@pytest.mark.parametrize(("rule_id", "line", "code", "fault_class"), _examples())
def test_match_example(
    re_engine: Engine, shipped_ruleset: RuleSet, rule_id: str, line: str, code: str, fault_class: FaultClass | None
) -> None:
    hits = [f for f in re_engine.scan_text(line) if f.rule_id == rule_id]
    assert hits, "example does not match its rule"
    assert code in {h.code for h in hits}
    expected = fault_class or shipped_ruleset.by_id(rule_id).fault_class
    assert expected in {h.fault_class for h in hits}


@pytest.mark.parametrize(("rule_id", "line"), _near_misses())
def test_near_miss_example(re_engine: Engine, rule_id: str, line: str) -> None:
    assert not [f for f in re_engine.scan_text(line) if f.rule_id == rule_id]


def test_stable_rules_have_examples() -> None:
    bare = [r.id for r in _SHIPPED.rules if r.status is RuleStatus.STABLE and not r.examples.match]
    assert bare == []


def test_shipped_rules_load_without_warnings_of_error_kind() -> None:
    assert load_rules().rules


@pytest.mark.parametrize("fault_class", list(FaultClass))
def test_every_fault_class_has_shipped_rules(fault_class: FaultClass) -> None:
    assert any(r.fault_class is fault_class for r in _SHIPPED.rules)


def test_rule_ids_are_namespaced() -> None:
    assert all("." in r.id for r in _SHIPPED.rules)
