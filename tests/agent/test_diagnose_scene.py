"""`trainmedic diagnose --scene DIR`: a saved bundle diagnosed again gives the root cause the brain
gave live (real failure excerpts from tests/data/real-logs.jsonl; the brain on the memory bus, in
looptime's fake time), with container logs attributed to their pod, rank and node; a bundle that
cannot be used is exit 2 with a one-line reason."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from paths import DATA

from trainmedic.agent.brain import Brain, BrainSettings
from trainmedic.agent.bus.memory import MemoryBus
from trainmedic.agent.cli import main
from trainmedic.agent.watchers.k8s import pod_digest
from trainmedic.events import DiagnosisEvent, JobRef, KernelBatch, LogBatch, Topic, decode, make_event
from trainmedic.remediations.scene import SceneError, SceneInputs, SceneSettings, load_scene, save_scene
from trainmedic.remediations.stacks import ExecResult

JOB = JobRef(namespace="train", name="llama")
HEALTHY = [f"step {i} loss 2.{i:03d} lr 3e-4" for i in range(40)]


def corpus(entry_id: str) -> list[str]:
    for line in (DATA / "real-logs.jsonl").read_text().splitlines():
        row = json.loads(line)
        if row["id"] == entry_id:
            return str(row["text"]).splitlines()
    raise KeyError(entry_id)


def pod(name: str, node: str, rank: int, *, oom_killed: bool = False) -> dict[str, Any]:
    status: dict[str, Any] = {"name": "trainer", "restartCount": 0, "ready": True, "state": {"running": {}}}
    if oom_killed:
        status = {
            "name": "trainer",
            "restartCount": 1,
            "ready": False,
            "state": {"waiting": {"reason": "CrashLoopBackOff"}},
            "lastState": {"terminated": {"reason": "OOMKilled", "exitCode": 137}},
        }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "train",
            "uid": f"uid-{name}",
            "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "llama", "controller": True}],
        },
        "spec": {"nodeName": node, "containers": [{"name": "trainer", "env": [{"name": "RANK", "value": str(rank)}]}]},
        "status": {"phase": "Running", "containerStatuses": [status]},
    }


# Each case: pod logs (by pod), kernel lines (by node), pods whose status the brain also saw.
CASES: dict[str, dict[str, Any]] = {
    "gpu-fell-off-the-bus": {
        "logs": {"llama-0": [*HEALTHY, *corpus("nccl_hang-2")], "llama-1": [*HEALTHY, *corpus("nccl_hang-4")]},
        "kernel": {"node-a": corpus("xid-8")},
        "oom_killed": None,
        "expect": ("device_error", "node-a"),
    },
    "host-oom-killed": {
        "logs": {"llama-0": [*HEALTHY, *corpus("nccl_hang-2")], "llama-1": HEALTHY},
        "kernel": {},
        "oom_killed": "llama-1",
        "expect": ("host_oom", "node-b"),
    },
    "gpu-oom-rank-from-the-pod": {
        "logs": {"llama-0": [*HEALTHY, *corpus("nccl_hang-2")], "llama-1": [*HEALTHY, *corpus("gpu_oom-5")]},
        "kernel": {},
        "oom_killed": None,
        "expect": ("accelerator_oom", "node-b"),
    },
}
PLACES = {"llama-0": ("node-a", 0), "llama-1": ("node-b", 1)}


class Source:
    def __init__(self, logs: dict[str, list[str]]) -> None:
        self.logs = logs

    async def pod_log(
        self,
        namespace: str,
        pod: str,
        container: str,
        *,
        tail_lines: int,
        previous: bool = False,
        limit_bytes: int = 1 << 20,
    ) -> str:
        return "" if previous else "".join(line + "\n" for line in self.logs.get(pod, []))

    async def list_events(self, namespace: str, *, involved: set[tuple[str, str]]) -> list[dict[str, Any]]:
        return []

    async def metrics_range(self, node: str, start: float, end: float, step: float) -> None:
        return None

    async def exec(
        self, namespace: str, pod: str, container: str, command: list[str], *, timeout_s: float
    ) -> ExecResult:
        return ExecResult(error="no exec")


async def brain_diagnosis(
    case: dict[str, Any], clock: Callable[[], float]
) -> tuple[DiagnosisEvent, dict[str, list[tuple[float, str]]]]:
    """The final diagnosis the brain publishes for the case's inputs, and the kernel lines with times."""
    bus = MemoryBus(partitions=2)
    observer = bus.consumer([Topic.DIAGNOSES], "observer")
    await observer.start()
    brain = Brain(bus, settings=BrainSettings(window_s=30.0, tick_s=0.5), clock=clock)
    stop = asyncio.Event()
    task = asyncio.create_task(brain.run(stop))
    await brain.ready.wait()
    kernel: dict[str, list[tuple[float, str]]] = {}
    for node, lines in case["kernel"].items():
        t = clock()
        kernel[node] = [(t, line) for line in lines]
        await bus.publish(Topic.KERNEL, make_event(KernelBatch(node=node, job=JOB, lines=lines), at=t))
    if case["oom_killed"]:
        name = case["oom_killed"]
        status = pod_digest(pod(name, *PLACES[name], oom_killed=True)).status()
        await bus.publish(Topic.K8S, make_event(status.model_copy(update={"job": JOB}), at=clock()))
    for name, lines in case["logs"].items():
        node, rank = PLACES[name]
        batch = LogBatch(node=node, namespace="train", pod=name, container="trainer", job=JOB, rank=rank, lines=lines)
        await bus.publish(Topic.LOGS, make_event(batch, at=clock()))
    final: DiagnosisEvent | None = None
    while final is None:
        for record in await observer.getmany(timeout_ms=200):
            payload = decode(record.value).payload
            if isinstance(payload, DiagnosisEvent) and payload.final:
                final = payload
    stop.set()
    await task
    await observer.stop()
    return final, kernel


@pytest.mark.looptime
@pytest.mark.parametrize("case_id", list(CASES))
@pytest.mark.asyncio
async def test_a_saved_scene_gives_the_brains_root_cause(
    case_id: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    case = CASES[case_id]
    clock = asyncio.get_running_loop().time
    diagnosis, kernel = await brain_diagnosis(case, clock)
    rc = diagnosis.diagnosis.root_cause
    assert rc is not None and (rc.fault_class.value, rc.node) == case["expect"]

    pods = [pod(name, *PLACES[name], oom_killed=name == case["oom_killed"]) for name in PLACES]
    inputs = SceneInputs(
        incident_id=f"inc-{case_id}",
        diagnosis=diagnosis,
        pods=pods,
        kernel_lines=kernel,
        now=clock(),
    )
    result = await save_scene(tmp_path, inputs, Source(case["logs"]), SceneSettings(durable=False))

    assert main(["diagnose", "--scene", str(result.dir), "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"root_cause", "findings"}
    assert out["root_cause"] == rc.contract_dict("en")
    assert {f["rule_id"] for f in out["findings"]} == {f.rule_id for f in diagnosis.diagnosis.findings}

    assert main(["diagnose", "--scene", str(result.dir), "--format", "text", "--lang", "zh"]) == 0
    assert rc.summary.zh.split("（")[0][:20] in capsys.readouterr().out


def test_container_logs_keep_their_pod_rank_and_node(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An OOM line that names no rank is placed by the pod it came from (rank from its RANK env)."""
    logs = {"llama-0": HEALTHY, "llama-1": [*HEALTHY, *corpus("gpu_oom-5")]}
    d = DiagnosisEvent(
        diagnosis_id="d", job=JOB, window_start=0.0, window_end=1.0, diagnosis={"root_cause": None, "findings": []}
    )
    inputs = SceneInputs(incident_id="inc", diagnosis=d, pods=[pod(n, *PLACES[n]) for n in PLACES], now=1.0)
    result = asyncio.run(save_scene(tmp_path, inputs, Source(logs), SceneSettings(durable=False)))
    assert main(["diagnose", "--scene", str(result.dir), "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["root_cause"]["fault_class"] == "accelerator_oom"
    assert (out["root_cause"]["node"], out["root_cause"]["rank"], out["root_cause"]["device"]) == ("node-b", 1, "0")
    (oom,) = [f for f in out["findings"] if f["fault_class"] == "accelerator_oom"]
    assert oom["file"] == "layout/node-b/rank1_llama-1_trainer.log" and oom["line_no"] == len(HEALTHY) + 1
    assert oom["source"] == "container_log"
    # The bundle is also a collected layout (layout/<node>/rank<R>_<pod>_<container>.log): diagnosed as
    # a directory it places the root the same way.
    assert main(["diagnose", "--logs", str(result.dir), "--format", "json"]) == 0
    as_dir = json.loads(capsys.readouterr().out)["root_cause"]
    assert (as_dir["fault_class"], as_dir["node"], as_dir["rank"], as_dir["device"]) == (
        "accelerator_oom",
        "node-b",
        1,
        "0",
    )


# -- bundles that cannot be used -------------------------------------------------------------------------


def _break(kind: str, d: Path) -> None:
    manifest = d / "manifest.json"
    log = d / "layout/node-a/rank0_llama-0_trainer.log"
    if kind == "no-manifest":
        manifest.unlink()
    elif kind == "not-json":
        manifest.write_text('{"schema_version": 1, "files": [')
    elif kind == "not-an-object":
        manifest.write_text("[1, 2]")
    elif kind == "unknown-schema":
        doc = json.loads(manifest.read_text())
        doc["schema_version"] = 99
        manifest.write_text(json.dumps(doc))
    elif kind == "path-escapes":
        doc = json.loads(manifest.read_text())
        doc["files"][0]["path"] = "../../etc/passwd"
        manifest.write_text(json.dumps(doc))
    elif kind == "file-missing":
        log.unlink()
    elif kind == "size-differs":
        log.write_bytes(log.read_bytes() + b"more\n")
    elif kind == "content-differs":
        data = bytearray(log.read_bytes())
        data[0] ^= 1
        log.write_bytes(bytes(data))
    elif kind == "not-a-directory":
        import shutil

        shutil.rmtree(d)


BROKEN = {
    "no-manifest": "manifest.json: cannot be read",
    "not-json": "not valid JSON",
    "not-an-object": "not a JSON object",
    "unknown-schema": "schema_version 99",
    "path-escapes": "no usable path",
    "file-missing": "listed in the manifest but cannot be read",
    "size-differs": "the manifest says",
    "content-differs": "does not match its sha256",
    "not-a-directory": "not a directory",
}


@pytest.mark.parametrize("kind", list(BROKEN))
def test_a_bundle_that_cannot_be_used_is_exit_2(tmp_path: Path, kind: str, capsys: pytest.CaptureFixture[str]) -> None:
    d = DiagnosisEvent(
        diagnosis_id="d", job=JOB, window_start=0.0, window_end=1.0, diagnosis={"root_cause": None, "findings": []}
    )
    inputs = SceneInputs(incident_id="inc", diagnosis=d, pods=[pod("llama-0", "node-a", 0)], now=1.0)
    result = asyncio.run(save_scene(tmp_path, inputs, Source({"llama-0": HEALTHY}), SceneSettings(durable=False)))
    _break(kind, result.dir)
    with pytest.raises(SceneError, match=BROKEN[kind]):
        load_scene(result.dir, verify=True)
    assert main(["diagnose", "--scene", str(result.dir), "--format", "json"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    err = captured.err.strip()
    assert err.startswith("trainmedic: ") and "\n" not in err and BROKEN[kind] in err


@pytest.mark.parametrize(
    "argv",
    [["diagnose", "--format", "json"], ["diagnose", "--logs", "x.log", "--scene", "dir"]],
    ids=["neither", "both"],
)
def test_logs_and_scene_are_one_or_the_other(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    assert "--logs" in capsys.readouterr().err


# -- host faults in a saved bundle ------------------------------------------------------------------------

READ_ONLY = [
    "[ 5012.330416] EXT4-fs error (device sda2): ext4_find_entry:1455: inode #2: comm python3: "
    "reading directory lblock 0",
    "[ 5012.330911] EXT4-fs (sda2): Remounting filesystem read-only",
]
BENIGN_KERNEL = [
    "[ 4990.100000] mlx5_core 0000:3b:00.0 ens1f0np0: Link up",
    "[ 4990.200000] EDAC MC0: 1 CE memory read error",
]


def _host_fault_bundle(tmp_path: Path) -> Path:
    """node-b's kernel remounted its disk read-only, node-a's printed only benign lines; the kernel
    lines name no host (dmesg form), so only where the bundle puts them says which node they are."""
    d = DiagnosisEvent(
        diagnosis_id="d", job=JOB, window_start=0.0, window_end=1.0, diagnosis={"root_cause": None, "findings": []}
    )
    inputs = SceneInputs(
        incident_id="inc-host",
        diagnosis=d,
        pods=[pod(n, *PLACES[n]) for n in PLACES],
        kernel_lines={
            "node-a": [(99.0, line) for line in BENIGN_KERNEL],
            "node-b": [(99.5, line) for line in READ_ONLY],
        },
        now=100.0,
    )
    logs = {"llama-0": HEALTHY, "llama-1": HEALTHY}
    return asyncio.run(save_scene(tmp_path, inputs, Source(logs), SceneSettings(durable=False))).dir


@pytest.mark.parametrize("how", ["--scene", "--logs"])
def test_a_host_fault_in_a_bundle_is_its_nodes(how: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The bundle keeps each node's kernel lines in layout/<node>/dmesg: diagnosed as a scene or as a
    collected layout, the read-only remount is node-b's, and node-a's benign lines are nothing."""
    bundle = _host_fault_bundle(tmp_path)
    assert (bundle / "layout" / "node-b" / "dmesg").read_text().splitlines() == READ_ONLY
    assert main(["diagnose", how, str(bundle), "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    rc = out["root_cause"]
    assert (rc["fault_class"], rc["code"], rc["node"], rc["device"], rc["rank"]) == (
        "storage_error",
        "fs_error",
        "node-b",
        None,
        None,
    )
    assert {f["node"] for f in out["findings"]} == {"node-b"}
    # --scene names the file within the bundle, --logs by its path.
    assert all(f["file"].endswith("layout/node-b/dmesg") for f in out["findings"])


def test_a_bundle_with_one_kernel_log_still_loads(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Bundles written before kept every node's kernel lines in one kernel.log, in sections: --scene
    still reads each section as its node's."""
    import hashlib

    bundle = _host_fault_bundle(tmp_path)
    manifest = json.loads((bundle / "manifest.json").read_text())
    texts = []
    sections = []
    line = 1
    for s in manifest["kernel_sections"]:
        text = (bundle / s["path"]).read_bytes()
        n = text.count(b"\n")
        texts.append(text)
        sections.append({k: v for k, v in s.items() if k != "path"} | {"first_line": line, "last_line": line + n - 1})
        line += n
        (bundle / s["path"]).unlink()
    data = b"".join(texts)
    (bundle / "kernel.log").write_bytes(data)
    files = [e for e in manifest["files"] if e.get("kind") != "kernel"]
    files.append(
        {
            "path": "kernel.log",
            "kind": "kernel",
            "bytes": len(data),
            "sha256": hashlib.sha256(data).hexdigest(),
            "truncated": False,
            "lines": data.count(b"\n"),
            "redactions": 0,
        }
    )
    manifest["files"], manifest["kernel_sections"] = files, sections
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    assert [(log.rel, log.node, log.first_line) for log in load_scene(bundle).logs() if log.rel == "kernel.log"] == [
        ("kernel.log", "node-a", 1),
        ("kernel.log", "node-b", 3),
    ]
    assert main(["diagnose", "--scene", str(bundle), "--format", "json"]) == 0
    rc = json.loads(capsys.readouterr().out)["root_cause"]
    assert (rc["fault_class"], rc["node"]) == ("storage_error", "node-b")
