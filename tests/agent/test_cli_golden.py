"""Golden files for `trainmedic diagnose` in every format and both languages.

Regenerate after an intended change with `UPDATE_GOLDEN=1 make test` (or pytest on this file) and
review the diff like code.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from paths import GOLDEN, ROOT

from trainmedic.agent.cli import main

CASES = {
    "gpu-fell-off-bus": ["examples/gpu-fell-off-bus"],
    "healthy": ["tests/data/healthy-train.log"],
}
FORMATS = {"json": "json", "text": "txt", "markdown": "md"}


@pytest.mark.parametrize("lang", ["en", "zh"])
@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("case", list(CASES))
def test_diagnose_output_matches_golden(
    case: str, fmt: str, lang: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)
    rc = main(["diagnose", "--logs", *CASES[case], "--format", fmt, "--lang", lang])
    out, err = capsys.readouterr()
    assert rc == 0, err
    if fmt == "json":
        parsed = json.loads(out)
        assert set(parsed) == {"root_cause", "findings"}
    golden = GOLDEN / f"{case}.{lang}.{FORMATS[fmt]}"
    if os.environ.get("UPDATE_GOLDEN"):
        golden.write_text(out, encoding="utf-8")
    assert out == golden.read_text(encoding="utf-8")


def test_json_contract_shape(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """DESIGN.md's `diagnose --format json` shape, key for key."""
    monkeypatch.chdir(ROOT)
    assert main(["diagnose", "--logs", "examples/gpu-fell-off-bus", "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    contract = {"fault_class", "chip", "code", "vendor_action", "action", "node", "device", "rank", "summary", "hint"}
    # docs/contracts.md: the wait chain and the candidates (with their places) and the vendor's causes
    # and steps are additions to the shape.
    additions = {"chain", "candidates", "chain_places", "candidate_places", "vendor_causes", "vendor_steps"}
    assert set(out["root_cause"]) == contract | additions
    for finding in out["findings"]:
        assert {"rule_id", "fault_class", "chip", "code", "source", "line_no", "text"} <= set(finding)
        # ... and each finding's place, null where the logs do not say it.
        assert {"node", "device", "rank"} <= set(finding)


@pytest.mark.parametrize("control", ["\u009b31m", "\u0085", "\u009d0;title\u009c", "\x1b[2J", "\x07"])
@pytest.mark.parametrize("fmt", ["text", "markdown"])
def test_diagnose_output_carries_no_control_characters(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], control: str, fmt: str
) -> None:
    log = tmp_path / "train.log"
    log.write_text(
        f"NVRM: Xid (PCI:0000:3b:00): 79, pid=2876, name=python{control}, GPU has fallen off the bus.{control}\n",
        encoding="utf-8",
    )
    assert main(["diagnose", "--logs", str(log), "--format", fmt]) == 0
    out = capsys.readouterr().out
    assert "79" in out
    bad = [c for c in out if (ord(c) < 32 and c not in "\n\t") or 0x7F <= ord(c) <= 0x9F]
    assert bad == []
