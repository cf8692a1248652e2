"""`trainmedic demo`: each fault run in-process end to end (the real agent against the emulated
cluster), its JSON checked against the store, the scene, the reports and the emulated API server;
the command itself once as a subprocess; and the demo's own pieces (checkpoint writers, the lines
its jobs print, the scheduler's rules) against the real checkpoint discovery, rules and policy.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from paths import ROOT
from servers.kube import JOB, VOLCANO_JOB, require_kmock

from trainmedic.agent.cli import main as cli_main
from trainmedic.agent.demo import logs
from trainmedic.agent.demo.output import TEXTS, Lang, text
from trainmedic.agent.demo.runner import DemoOutcome, fresh_dir, parse_faults, run_demo
from trainmedic.agent.demo.runner import main as demo_main
from trainmedic.agent.demo.scenario import DemoCluster, FaultResult
from trainmedic.agent.demo.training import unschedulable_reason, write_hf_checkpoint, write_megatron_checkpoint
from trainmedic.detectors.diagnose import diagnose_text, make_engine
from trainmedic.remediations.checkpoints import latest_complete, list_checkpoints

# -- the whole loop, per fault ---------------------------------------------------------------------------

EXPECTED: dict[str, dict[str, Any]] = {
    "xid": {
        "fault_class": "device_error",
        "code": "xid:79",
        "node": "gpu-2",
        "quarantined_nodes": ["gpu-2"],
        "excluded_nodes": ["gpu-2"],
        "rescheduled_job": "Job/train/llama3-8b-sft",
        "resource": JOB,
        "incidents": 1,
        "healed": True,
    },
    "oom": {
        "fault_class": "accelerator_oom",
        "code": "cuda_oom",
        "node": "gpu-1",
        "quarantined_nodes": [],
        "excluded_nodes": [],
        "rescheduled_job": None,
        "resource": JOB,
        "incidents": 1,
        "healed": None,
    },
    "hccl": {
        "fault_class": "comm_init",
        "code": "EI0006",
        "node": "npu-2",
        "quarantined_nodes": ["npu-2"],
        "excluded_nodes": ["npu-2"],
        "rescheduled_job": "Job/train/qwen2-72b-pretrain",
        "resource": VOLCANO_JOB,
        "incidents": 3,
        "healed": True,
    },
    "hang": {
        "fault_class": "hang",
        "code": "no_progress",
        "node": "gpu-1",
        "quarantined_nodes": [],
        "excluded_nodes": [],
        "rescheduled_job": "Job/train/llama3-8b-dpo",
        "resource": JOB,
        "incidents": 1,
        "healed": True,
    },
    "node-lost": {
        "fault_class": "node_failure",
        "code": "kubelet_stopped",
        "node": "gpu-2",
        "quarantined_nodes": ["gpu-2"],
        "excluded_nodes": ["gpu-2"],
        "rescheduled_job": "Job/train/llama3-8b-pt",
        "resource": JOB,
        "incidents": 1,
        "healed": True,
    },
    "app-error": {
        "fault_class": "app_error",
        "code": "python_exception",
        "node": "gpu-2",
        "quarantined_nodes": [],
        "excluded_nodes": [],
        "rescheduled_job": None,
        "resource": JOB,
        "incidents": 1,
        "healed": None,
    },
}


def _excluded_by_affinity(pod_spec: dict[str, Any]) -> set[str]:
    terms = pod_spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    out: set[str] = set()
    for term in terms:
        for e in term.get("matchExpressions") or []:
            if e["key"] == "kubernetes.io/hostname" and e["operator"] == "NotIn":
                out.update(e["values"])
    return out


def _pod_specs(workload: dict[str, Any]) -> list[dict[str, Any]]:
    if workload["kind"] == "Job" and workload["apiVersion"] == "batch/v1":
        return [workload["spec"]["template"]["spec"]]
    return [t["template"]["spec"] for t in workload["spec"]["tasks"]]


def _last_complete(scene: Path, mount: str) -> tuple[str | None, list[dict[str, Any]]]:
    """The last complete checkpoint the scene listed (and the whole listing): the scene names each
    candidate as the job does (under `mount`), not as the agent's mount of the shared volume."""
    listing = json.loads((scene / "checkpoints.json").read_text())
    entries = listing["checkpoints"] if isinstance(listing, dict) else listing
    assert all(c["path"].startswith(mount + "/") for c in entries), entries
    done = [c for c in entries if c["complete"]]
    if not done:
        return None, entries
    best = max(done, key=lambda c: c["step"])
    return str(best["path"]), entries


@pytest.mark.parametrize("fault", ["xid", "oom", "hccl", "hang", "node-lost", "app-error"])
@pytest.mark.asyncio
async def test_demo_fault_end_to_end(fault: str, tmp_path: Path) -> None:
    require_kmock()
    want = EXPECTED[fault]
    seen: dict[str, Any] = {}

    def inspect(dc: DemoCluster, result: FaultResult) -> None:
        seen["workloads"] = [o for o in dc.kube.objects(want["resource"]) if o["metadata"]["namespace"] == "train"]
        seen["first_uid"] = dc.first.uid if dc.first is not None else None
        seen["pods"] = {
            p["metadata"]["name"]: p["spec"].get("nodeName") for p in dc.kube.objects("v1/pods") if "metadata" in p
        }

    out = io.StringIO()
    outcome = await run_demo([fault], workdir=tmp_path, json_lines=True, out=out, inspect=inspect)
    assert isinstance(outcome, DemoOutcome)
    lines = out.getvalue().splitlines()
    assert len(lines) == 1, "--json prints one object per fault and nothing else"
    doc = json.loads(lines[0])
    assert doc["problems"] == [] and doc["ok"] is True and outcome.exit_code == 0

    for k in ("fault_class", "code", "node", "quarantined_nodes", "excluded_nodes", "rescheduled_job", "healed"):
        assert doc[k] == want[k], k
    assert len(doc["incidents"]) == want["incidents"]
    assert doc["status"] == "resolved"
    assert isinstance(doc["detect_ms"], float) and doc["detect_ms"] >= 0

    # The scene: a manifest, the pods' logs, the checkpoint listing.
    scene = Path(doc["scene_dir"])
    manifest = json.loads((scene / "manifest.json").read_text())
    paths = {f["path"] for f in manifest["files"]}
    assert any(p.startswith("layout/") for p in paths) and "objects/workload.yaml" in paths
    assert manifest["root_cause"]["code"] == want["code"]

    # Notifications reached the local receiver, signed; the report was written.
    assert doc["webhooks_delivered"] >= 2, "at least the plan and the resolution"
    assert doc["webhooks_verified"] in (None, doc["webhooks_delivered"])
    assert doc["report_html"] is not None and Path(doc["report_html"]).is_file()
    # Device metrics came through the metrics watcher (the nodes' simulated exporters): the scene keeps
    # the root node's series, and the report charts them.
    metrics = json.loads((scene / "metrics.json").read_text())
    assert want["node"] in metrics["nodes"]
    assert "<svg" in Path(doc["report_html"]).read_text(encoding="utf-8")
    if fault == "oom":
        # The device that ran out of memory filled up in the minute before.
        used = [v for _, v in metrics["nodes"][want["node"]]["accelerator_memory_used{0}"]]
        # (its peak, not its last sample: once the process died the exporter may already read it freed)
        assert used[0] < 0.8 * 81_559 < 0.95 * 81_559 < max(used)

    [workload] = seen["workloads"]
    annotations = workload["metadata"].get("annotations") or {}
    if want["rescheduled_job"] is None:
        # Notify only: the job is the one that failed, untouched.
        assert workload["metadata"]["uid"] == seen["first_uid"]
        assert doc["checkpoint"] is None and doc["recover_ms"] is None
        assert [a.split(":")[0] for a in doc["actions"]] == ["notify"]
        if fault == "oom":
            assert doc["hints"], "an accelerator OOM comes with hints"
        if fault == "app-error":
            assert "KeyError" in manifest["root_cause"]["summary"], "the owner is told the exception"
        return
    # Restarted: from the last complete checkpoint, the bad node excluded, training again elsewhere.
    mount = "/mnt/ckpt"
    expected, listing = _last_complete(scene, mount)
    assert expected is not None and doc["checkpoint"] == expected
    if fault == "xid":
        assert any(not c["complete"] and c["step"] > int(expected.rsplit("-", 1)[1]) for c in listing), (
            "the save cut short by the fault is listed, incomplete"
        )
    assert workload["metadata"]["uid"] != seen["first_uid"]
    assert annotations["trainmedic.io/incident"] == doc["incident_id"]
    assert annotations["trainmedic.io/resumed-from"] == doc["checkpoint"]
    if want["excluded_nodes"]:
        for spec in _pod_specs(workload):
            assert set(want["excluded_nodes"]) <= _excluded_by_affinity(spec)
    assert not set(doc["rescheduled_to"]) & set(want["quarantined_nodes"])
    assert len(doc["rescheduled_to"]) == 2
    assert isinstance(doc["recover_ms"], float) and doc["recover_ms"] >= doc["detect_ms"]
    if fault == "hang":
        stacks = list((scene / "stacks").iterdir())
        assert stacks and any("all_reduce" in p.read_text() for p in stacks), "stacks taken before the restart"


@pytest.mark.asyncio
async def test_demo_prints_stages_in_chinese(tmp_path: Path) -> None:
    require_kmock()
    out = io.StringIO()
    outcome = await run_demo(["oom"], workdir=tmp_path, lang="zh", out=out)
    printed = out.getvalue()
    assert outcome.ok, printed
    for key in ("injected", "detected", "scene", "planned"):
        head = TEXTS[key][1].split("{")[0]
        assert head in printed, key
    assert "汇总" in printed


def test_demo_command_as_a_subprocess(tmp_path: Path) -> None:
    require_kmock()
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run(
        [sys.executable, "-m", "trainmedic.agent", "demo", "--fault", "xid", "--json", "--workdir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=100,
        env=env,
        cwd=ROOT,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    [line] = proc.stdout.splitlines()
    doc = json.loads(line)
    assert (doc["fault"], doc["fault_class"], doc["code"], doc["node"]) == ("xid", "device_error", "xid:79", "gpu-2")
    assert doc["quarantined_nodes"] == ["gpu-2"] and doc["excluded_nodes"] == ["gpu-2"]
    assert doc["checkpoint"].startswith("/mnt/ckpt/llama3-8b-sft/checkpoint-")
    for key in ("scene_dir", "rescheduled_job", "webhooks_delivered", "report_html", "detect_ms", "recover_ms"):
        assert doc[key] is not None, key


# -- the command line ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "faults"),
    [
        ("all", ["xid", "oom", "hccl", "hang", "node-lost", "app-error"]),
        ("hang", ["hang"]),
        ("xid, hccl", ["xid", "hccl"]),
    ],
)
def test_parse_faults(value: str, faults: list[str]) -> None:
    assert parse_faults(value) == faults


def test_unknown_fault_is_refused_with_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["demo", "--fault", "ecc"]) == 2
    err = capsys.readouterr().err
    assert "unknown fault(s) ecc" in err and "xid, oom, hccl, hang" in err


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_every_text_formats_in_both_languages(lang: Lang) -> None:
    for key, (en, zh) in TEXTS.items():
        assert en and zh, key
        fields = {
            name.split(":")[0].split("!")[0]: "x" for part in (en + zh).split("{")[1:] if (name := part.split("}")[0])
        }
        assert text(key, lang, **fields)


# -- what the simulated jobs write and print -------------------------------------------------------------


def test_hf_checkpoints_as_the_trainer_writes_them(tmp_path: Path) -> None:
    for step in (10, 20):
        write_hf_checkpoint(tmp_path, step, max_steps=3000, save_steps=10)
    write_hf_checkpoint(tmp_path, 30, max_steps=3000, save_steps=10, cut=True)
    found = {c.step: c for c in list_checkpoints(str(tmp_path))}
    assert found[10].complete and found[20].complete and not found[30].complete
    assert all(c.format == "hf_trainer" for c in found.values())
    best = latest_complete(str(tmp_path))
    assert best is not None and best.step == 20


def test_megatron_checkpoints_with_their_tracker(tmp_path: Path) -> None:
    for step in (10, 20):
        write_megatron_checkpoint(tmp_path, step, tp=8)
    write_megatron_checkpoint(tmp_path, 30, tp=8, cut=True)
    assert (tmp_path / "latest_checkpointed_iteration.txt").read_text() == "20"
    found = {c.step: c for c in list_checkpoints(str(tmp_path))}
    assert found[20].complete and found[20].format == "megatron" and not found[30].complete
    best = latest_complete(str(tmp_path))
    assert best is not None and best.step == 20


@pytest.fixture(scope="module")
def engine() -> Any:
    return make_engine(fast=False)


def test_healthy_training_lines_raise_nothing(engine: Any) -> None:
    hf, mg = logs.HFTrainerLog(), logs.MegatronLog()
    lines = [
        *hf.nccl_init("llama3-8b-sft-0-abcde", 0, 1.7e9),
        *hf.banner(16, 1.7e9),
        *hf.resume("/mnt/ckpt/x/checkpoint-20", 20, 1.7e9),
        *(hf.step(s) for s in range(1, 60)),
        *hf.saving("/mnt/ckpt/x/checkpoint-20", 1.7e9),
        *hf.saved("/mnt/ckpt/x/checkpoint-20", 1.7e9),
        *mg.banner(16, 1.7e9),
        *mg.resume("/mnt/ckpt/q", 20),
        *(mg.step(s, 40.0) for s in range(1, 60)),
        *mg.saving("/mnt/ckpt/q", 20),
        *mg.saved("/mnt/ckpt/q", 20),
        logs.hang_stack(),
    ]
    diagnosis = diagnose_text("\n".join(lines), engine)
    assert diagnosis.root_cause is None, [f.rule_id for f in diagnosis.findings]


@pytest.mark.parametrize(
    ("lines", "fault_class", "code"),
    [
        (
            [logs.kern_log_line("gpu-2", 1.7e9, 86400.5, logs.xid79_message("0000:3b:00", 57))],
            "device_error",
            "xid:79",
        ),
        (logs.cuda_oom_lines(0, "llama3-8b-sft-0-abcde", 1.7e9), "accelerator_oom", "cuda_oom"),
        (logs.hccl_ei0006_lines(8, 0, 1292363, 1.7e9), "comm_init", "EI0006"),
        (logs.nccl_watchdog_lines(0, 1.7e9, 7753), "hang", None),
    ],
    ids=["xid79", "cuda-oom", "hccl-ei0006", "nccl-watchdog"],
)
def test_fault_lines_are_what_the_rules_know(engine: Any, lines: list[str], fault_class: str, code: str | None) -> None:
    diagnosis = diagnose_text("\n".join(lines), engine)
    rc = diagnosis.root_cause
    assert rc is not None and rc.fault_class.value == fault_class
    if code is not None:
        assert rc.code == code


# -- the scheduler's rules -------------------------------------------------------------------------------


def _node(**spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "gpu-2", "labels": {"kubernetes.io/hostname": "gpu-2", "nvidia.com/gpu.present": "true"}},
        "spec": spec,
        "status": {
            "allocatable": {"nvidia.com/gpu": "8"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


NO_MATCH = "node(s) didn't match Pod's node affinity/selector"
NOT_GPU2 = {
    "affinity": {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "NotIn", "values": ["gpu-2"]}]}
                ]
            }
        }
    }
}


@pytest.mark.parametrize(
    ("node", "pod_spec", "needs", "why"),
    [
        (_node(), {}, {"nvidia.com/gpu": 8}, None),
        (_node(unschedulable=True), {}, {}, "node(s) were unschedulable"),
        (
            _node(taints=[{"key": "trainmedic.io/unhealthy", "value": "device_error", "effect": "NoSchedule"}]),
            {},
            {},
            "node(s) had untolerated taint {trainmedic.io/unhealthy: device_error}",
        ),
        (
            _node(taints=[{"key": "trainmedic.io/unhealthy", "value": "device_error", "effect": "NoSchedule"}]),
            {"tolerations": [{"key": "trainmedic.io/unhealthy", "operator": "Exists"}]},
            {},
            None,
        ),
        (_node(), NOT_GPU2, {}, NO_MATCH),
        (
            _node(),
            {"nodeSelector": {"accelerator": "huawei-Ascend910"}},
            {},
            "node(s) didn't match Pod's node affinity/selector",
        ),
        (_node(), {}, {"nvidia.com/gpu": 16}, "Insufficient nvidia.com/gpu"),
        (_node(), {}, {"huawei.com/Ascend910": 8}, "Insufficient huawei.com/Ascend910"),
    ],
    ids=["fits", "cordoned", "tainted", "tolerated", "affinity", "selector", "too-few-gpus", "no-npus"],
)
def test_scheduler_rules(
    node: dict[str, Any], pod_spec: dict[str, Any], needs: dict[str, int], why: str | None
) -> None:
    assert unschedulable_reason(node, pod_spec, needs) == why


def test_a_fault_that_does_not_heal_in_time_fails_the_demo(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    require_kmock()
    assert demo_main("oom", workdir=tmp_path, timeout_s=0.5) == 1
    captured = capsys.readouterr()
    assert "trainmedic: demo: oom: not done within 0.5 s" in captured.err
    assert "trainmedic: demo: failed: oom" in captured.err
    assert "FAILED" in captured.out


def test_an_earlier_run_in_the_same_workdir_is_left_alone(tmp_path: Path) -> None:
    (tmp_path / "xid").mkdir()
    (tmp_path / "xid" / "trainmedic.db").write_bytes(b"")
    (tmp_path / "xid-2").mkdir()
    (tmp_path / "xid-2" / "policy.yaml").write_text("")
    assert fresh_dir(tmp_path, "xid") == tmp_path / "xid-3"
    assert fresh_dir(tmp_path, "oom") == tmp_path / "oom"
