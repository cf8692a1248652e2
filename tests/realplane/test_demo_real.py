"""`trainmedic demo --cluster real`, as a user runs it: a subprocess that starts its own real control
plane (agent/demo/plane.py), runs the fault with the agent under its deploy/ ServiceAccounts and RBAC,
and prints the emulator demo's --json object. The outcome is checked there: the node quarantined, the
job recreated from its last complete checkpoint and Running on healthy nodes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from servers.kubeplane import require_plane

ROOT = Path(__file__).resolve().parents[2]
EXPECTED = {"xid": ("device_error", "xid:79"), "node-lost": ("node_failure", None)}


@pytest.mark.timeout(420)
@pytest.mark.parametrize("fault", ["xid", "node-lost"])
def test_the_demo_heals_the_fault_on_the_real_plane(tmp_path: Path, fault: str) -> None:
    require_plane()
    argv = ["demo", "--cluster", "real", "--fault", fault, "--json", "--workdir", str(tmp_path)]
    proc = subprocess.run(
        [sys.executable, "-m", "agent", *argv],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    [line] = proc.stdout.splitlines()  # --json: one object per fault, nothing else on stdout
    doc = json.loads(line)
    assert doc["ok"] is True and doc["problems"] == [], doc
    fault_class, code = EXPECTED[fault]
    assert doc["fault_class"] == fault_class and doc["status"] == "resolved"
    if code is not None:
        assert doc["code"] == code
    bad = doc["node"]
    assert bad in ("gpu-1", "gpu-2", "gpu-3")
    assert doc["quarantined_nodes"] == [bad]
    assert doc["excluded_nodes"] == [bad]
    assert doc["healed"] is True and len(doc["rescheduled_to"]) == 2 and bad not in doc["rescheduled_to"]
    assert doc["checkpoint"].endswith("/checkpoint-20")  # checkpoint-30 was cut by the fault (xid)
    assert doc["actions"] == ["quarantine_node:done", "restart_from_checkpoint:done"]
    assert doc["rescheduled_job"] == f"Job/training/{'llama3-8b-sft' if fault == 'xid' else 'llama3-8b-pt'}"
    assert doc["webhooks_delivered"] >= 3 and doc["webhooks_verified"] == doc["webhooks_delivered"]
    assert Path(doc["report_html"]).is_file()
    assert doc["detect_ms"] >= 0 and doc["recover_ms"] >= doc["detect_ms"]
