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


@pytest.mark.timeout(560)
@pytest.mark.parametrize(
    ("arg", "faults"),
    [
        pytest.param("xid", ["xid"], id="xid"),
        # Both on one plane: node-lost runs after xid's quarantine was released and the plane reset.
        pytest.param("all", ["xid", "node-lost"], id="all"),
    ],
)
def test_the_demo_heals_the_fault_on_the_real_plane(tmp_path: Path, arg: str, faults: list[str]) -> None:
    require_plane()
    argv = ["demo", "--cluster", "real", "--fault", arg, "--json", "--workdir", str(tmp_path)]
    proc = subprocess.run(
        [sys.executable, "-m", "trainmedic.agent", *argv],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=540,
    )
    docs = [json.loads(line) for line in proc.stdout.splitlines()]  # --json: one object per fault, nothing else
    assert [d["fault"] for d in docs] == faults, proc.stderr[-4000:]
    problems = {d["fault"]: d["problems"] for d in docs if d["problems"]}
    assert problems == {} and proc.returncode == 0, (problems, proc.stderr[-4000:])
    for doc in docs:
        fault_class, code = EXPECTED[doc["fault"]]
        assert doc["ok"] is True and doc["fault_class"] == fault_class and doc["status"] == "resolved"
        if code is not None:
            assert doc["code"] == code
        bad = doc["node"]
        assert bad in ("gpu-1", "gpu-2", "gpu-3")
        # The node quarantined (and only it: the earlier fault's quarantine was released), the Job
        # recreated from the last complete checkpoint, its pods Running on the two healthy nodes.
        assert doc["quarantined_nodes"] == [bad] and doc["excluded_nodes"] == [bad]
        assert doc["healed"] is True and len(doc["rescheduled_to"]) == 2 and bad not in doc["rescheduled_to"]
        assert doc["checkpoint"].endswith("/checkpoint-20")  # xid: checkpoint-30 was cut by the fault
        assert doc["actions"] == ["quarantine_node:done", "restart_from_checkpoint:done"]
        job = "llama3-8b-sft" if doc["fault"] == "xid" else "llama3-8b-pt"
        assert doc["rescheduled_job"] == f"Job/training/{job}"
        assert doc["webhooks_delivered"] >= 3 and doc["webhooks_verified"] == doc["webhooks_delivered"]
        assert Path(doc["report_html"]).is_file()
        assert doc["detect_ms"] >= 0 and doc["recover_ms"] >= doc["detect_ms"]
