"""Interruptions that no log line explains still become incidents, end to end on the demo's emulated
cluster with the real agent and the shipped policy: a rank that exits 3 after lines no rule knows is
an `unknown` incident, notified with each rank's last error lines and the exit codes, not restarted."""

from __future__ import annotations

import io
import json
import time
from pathlib import Path

import pytest
from servers.kube import JOB, require_kmock

from trainmedic.agent.demo import scenario
from trainmedic.agent.demo.output import Progress
from trainmedic.agent.demo.scenario import DemoCluster, Scenario, run_fault
from trainmedic.agent.demo.training import JobProfile, TrainingRun

ERROR_LINES = [
    "[rank8]: ERROR data.shards: shard 17 failed its checksum twice, giving up",
    "[rank8]: Traceback (most recent call last):",
]


async def _exit_only(dc: DemoCluster, run: TrainingRun) -> tuple[str, str]:
    bad, peer = run.ranks[1], run.ranks[0]
    dc.t0 = time.time()
    dc.progress.t0 = dc.t0
    run.end()
    run.log(bad, "[rank8]: step 14 loss 1.93", *ERROR_LINES)
    await run.exit(bad, 3)
    await run.exit(peer, 3)
    return ("rank 8 exits 3", "rank 8 以退出码 3 结束")


@pytest.mark.asyncio
async def test_a_failure_nothing_explains_is_an_unknown_incident_with_its_evidence(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    require_kmock()
    sc = Scenario(
        "exit-only",
        ("a rank exits 3", "rank 以退出码 3 结束"),
        "mistral-7b-sft",
        JOB,
        JobProfile("hf", f"{scenario.MOUNT}/mistral-7b-sft"),
        "unknown",
        quarantine=False,
        restart=False,
        inject=_exit_only,
        ready=lambda run: len(run.saved) >= 1,
    )
    monkeypatch.setitem(scenario.SCENARIOS, "exit-only", sc)
    result = await run_fault("exit-only", tmp_path, Progress("en", quiet=True, out=io.StringIO()))
    assert result.problems == [] and result.ok
    assert (result.fault_class, result.code) == ("unknown", "exit_3")
    assert [a.split(":")[0] for a in result.actions] == ["notify"]
    assert result.rescheduled_job is None and result.quarantined_nodes == []
    assert len(result.incidents) == 1
    assert result.scene_dir is not None
    doc = json.loads((Path(result.scene_dir) / "findings.json").read_text())
    assert doc["exit_codes"] and set(doc["exit_codes"].values()) == {3}
    assert any(lines[-len(ERROR_LINES) :] == ERROR_LINES for lines in doc["error_lines"].values())
