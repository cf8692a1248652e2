"""Vendor catalogs meet the rules: every Xid NVIDIA publishes is recognised in a kernel line and
carries the vendor's own action; Ascend and Cambricon codes the rules emit resolve in udal."""

from __future__ import annotations

from typing import Any

import pytest

from trainmedic import udal
from trainmedic.detectors.correlator import correlate
from trainmedic.detectors.engine import Engine
from trainmedic.models import Chip, FaultClass

_NVIDIA = udal.get_plugin(Chip.NVIDIA)
_XIDS = sorted(int(code.split(":")[1]) for code in _NVIDIA.catalog() if code.startswith("xid:"))

KERNEL_FORMS = {
    "syslog": "Nov 21 03:12:45 gpu-node-07 kernel: NVRM: Xid (PCI:0000:3b:00): {n}, pid=2211, name=python3",
    "dmesg": "[1843308.145120] NVRM: Xid (PCI:0000:3b:00): {n}, pid='<unknown>', name=<unknown>, Ch 00000008",
    "journal-iso": "2025-03-27T17:40:36+0000 node-1 kernel: NVRM: Xid (PCI:0000:3b:00): {n}, Ch 00000002",
}


def test_catalog_covers_published_xids() -> None:
    # NVIDIA's catalog numbers Xids from 1 to the 170s; every row is transcribed.
    assert len(_XIDS) >= 140
    assert {13, 31, 43, 45, 48, 63, 64, 74, 79, 92, 94, 95, 119, 154} <= set(_XIDS)


def _xid_cases() -> list[Any]:
    return [pytest.param(n, form, id=f"xid{n}-{form}") for n in _XIDS for form in KERNEL_FORMS]


@pytest.mark.parametrize(("xid", "form"), _xid_cases())
def test_every_catalog_xid_is_classified(re_engine: Engine, xid: int, form: str) -> None:
    line = KERNEL_FORMS[form].format(n=xid)
    findings = [f for f in re_engine.scan_text(line) if f.code == f"xid:{xid}"]
    assert findings, line
    diagnosis = correlate(findings)
    rc = diagnosis.root_cause
    assert rc is not None
    assert rc.fault_class is FaultClass.DEVICE_ERROR
    entry = _NVIDIA.lookup(f"xid:{xid}")
    assert entry is not None
    assert rc.vendor_action == entry.vendor_action
    assert rc.action == entry.action
    assert rc.device == "0000:3b:00"


# Codes rules emit that no published vendor table lists; everything else must resolve.
NOT_IN_VENDOR_TABLES = frozenset(
    {
        "hccl_init",
        "nccl_comm_aborted",
        "cncl:unknown",
        "nccl_warn",
        "cuda_program_error",
        "device_exception",
        "nccl_duplicate_gpu",
        # HCCL's P2P link-setup timeout returns HCCL_E_DRV, which no error-code table names.
        "hccl_p2p_timeout",
    }
)


def _emitted_codes() -> list[Any]:
    from trainmedic.detectors.loader import load_rules

    cases = []
    for rule in load_rules(run_examples=False).rules:
        if rule.chip is Chip.GENERIC or rule.catalog_class:
            # Code-family extractors name any code of the family, catalogued or not (a code no
            # catalog lists still gives a finding): their catalogued codes are checked below.
            continue
        for ex in rule.examples.match:
            if ex.code not in NOT_IN_VENDOR_TABLES:
                cases.append(pytest.param(rule.chip, ex.code, id=f"{rule.id}:{ex.code}"))
    return cases


@pytest.mark.parametrize(("chip", "code"), _emitted_codes())
def test_codes_in_rule_examples_resolve_in_the_catalog(chip: Chip, code: str) -> None:
    assert udal.lookup(chip, code) is not None, f"{chip}:{code} has no catalog entry"


@pytest.mark.parametrize("code", sorted(NOT_IN_VENDOR_TABLES))
def test_codes_outside_vendor_tables_are_still_outside(code: str) -> None:
    """When a catalog gains one of these, it leaves the list (and gets its vendor action)."""
    assert all(udal.lookup(chip, code) is None for chip in Chip)


def _family_codes() -> list[Any]:
    from trainmedic.detectors.loader import load_rules

    return [
        pytest.param(rule.id, ex.line, ex.code, id=f"{rule.id}:{ex.code}")
        for rule in load_rules(run_examples=False).rules
        if rule.catalog_class
        for ex in rule.examples.match
    ]


@pytest.mark.parametrize(("rule_id", "line", "code"), _family_codes())
def test_a_family_extractor_takes_the_catalog_class_when_there_is_one(
    re_engine: Engine, rule_id: str, line: str, code: str
) -> None:
    found = [f for f in re_engine.scan_text(line) if f.rule_id == rule_id and f.code == code]
    assert found
    entry = udal.lookup(found[0].chip, code)
    if entry is not None and entry.fault_class is not None:
        assert found[0].fault_class in (entry.fault_class, FaultClass.COMM_INIT)
    else:
        assert found[0].vendor_action is None
