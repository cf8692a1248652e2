"""Scene bundles: what a 2-pod job's bundle holds (logs with the previous instance's, events,
objects, kernel lines in the fault window, metrics, checkpoints, findings pointing into the bundle's
own files), redaction of secrets and env values, the caps, undecodable bytes and huge lines, a pod
whose log fails, idempotence, a crash mid-write, stacks for a hang; the redaction fast path against
the reference; and one bundle collected from the emulated cluster through KubeOps and exec."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import math
import os
import re
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from servers.kube import Cluster, KubeEmulator, require_kmock

from trainmedic.detectors.correlator import correlate
from trainmedic.detectors.engine import Engine
from trainmedic.events import DiagnosisEvent, JobRef
from trainmedic.models import Finding, Source
from trainmedic.remediations import scene as scene_mod
from trainmedic.remediations.kube import KubeOps
from trainmedic.remediations.scene import (
    SceneError,
    SceneInputs,
    SceneSettings,
    load_scene,
    redact_text,
    save_scene,
)
from trainmedic.remediations.stacks import ExecResult, exec_in_pod

NOW = 1_767_225_600.0  # 2026-01-01T00:00:00Z
JOB = JobRef(namespace="train", name="llama")
WATCHDOG = (
    "[rank1]:[E626 06:24:44.903881913 ProcessGroupNCCL.cpp:616] [Rank 1] Watchdog caught collective operation "
    "timeout: WorkNCCL(SeqNum=808, OpType=ALLREDUCE, NumelIn=9801523, NumelOut=9801523, Timeout(ms)=600000) "
    "ran for 600020 milliseconds before timing out."
)
XID79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid=2876, name=python, GPU has fallen off the bus."
HEALTHY = [f"[rank1]: step {i} loss 2.{i:03d}" for i in range(30)]
FAST = SceneSettings(durable=False)


# -- helpers --------------------------------------------------------------------------------------


def make_pod(
    name: str,
    *,
    node: str,
    rank: int,
    restarts: int = 0,
    env: list[dict[str, Any]] | None = None,
    args: list[str] | None = None,
) -> dict[str, Any]:
    status: dict[str, Any] = {"name": "trainer", "restartCount": restarts, "state": {"running": {}}}
    if restarts:
        status["lastState"] = {"terminated": {"exitCode": 1, "reason": "Error"}}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "train",
            "uid": f"uid-{name}",
            "annotations": {"kubectl.kubernetes.io/last-applied-configuration": '{"big": "json"}'},
        },
        "spec": {
            "nodeName": node,
            "containers": [
                {
                    "name": "trainer",
                    "image": "registry.example/train:1",
                    "args": args or [],
                    "env": [{"name": "RANK", "value": str(rank)}, *(env or [])],
                }
            ],
        },
        "status": {"phase": "Running", "containerStatuses": [status]},
    }


def make_node(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name},
        "status": {"capacity": {"nvidia.com/gpu": "8"}},
    }


def event(kind: str, name: str, reason: str, namespace: str = "train") -> dict[str, Any]:
    return {
        "metadata": {"name": f"{name}.{reason}", "namespace": namespace},
        "involvedObject": {"kind": kind, "name": name, "namespace": namespace},
        "reason": reason,
        "message": f"{reason} of {name}",
        "type": "Warning",
        "lastTimestamp": "2026-01-01T00:00:00Z",
    }


def finding(engine: Engine, text: str, **where: Any) -> Finding:
    found = engine.scan_text(text)
    assert found, text
    return found[0].model_copy(update=where)


def diagnosis_event(findings: list[Finding], job: JobRef | None = JOB) -> DiagnosisEvent:
    return DiagnosisEvent(
        diagnosis_id="diag-1",
        job=job,
        window_start=NOW - 10,
        window_end=NOW,
        final=True,
        diagnosis=correlate(findings),
    )


class FakeSource:
    """A SceneSource with canned answers; a log value that is an exception is raised."""

    def __init__(
        self,
        logs: Mapping[tuple[str, bool], Any],
        *,
        events: list[dict[str, Any]] | None = None,
        metrics: Mapping[str, Any] | None = None,
        exec_reply: ExecResult | BaseException | None = None,
    ) -> None:
        self.logs = dict(logs)
        self.events = events or []
        self.metrics = dict(metrics or {})
        self.exec_reply = exec_reply
        self.log_calls: list[dict[str, Any]] = []
        self.event_calls: list[tuple[str, set[tuple[str, str]]]] = []
        self.exec_calls: list[list[str]] = []

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
        self.log_calls.append(
            {"pod": pod, "container": container, "tail_lines": tail_lines, "previous": previous, "limit": limit_bytes}
        )
        value = self.logs.get((pod, previous), "")
        if isinstance(value, BaseException):
            raise value
        if callable(value):
            value = await value()
        return value  # type: ignore[no-any-return]

    async def list_events(self, namespace: str, *, involved: set[tuple[str, str]]) -> list[dict[str, Any]]:
        self.event_calls.append((namespace, set(involved)))
        return [
            e
            for e in self.events
            if e["metadata"]["namespace"] == namespace
            and (e["involvedObject"]["kind"], e["involvedObject"]["name"]) in involved
        ]

    async def metrics_range(
        self, node: str, start: float, end: float, step: float
    ) -> Mapping[str, list[tuple[float, float]]] | None:
        value = self.metrics.get(node)
        if isinstance(value, BaseException):
            raise value
        return value

    async def exec(
        self, namespace: str, pod: str, container: str, command: list[str], *, timeout_s: float
    ) -> ExecResult:
        self.exec_calls.append(command)
        if isinstance(self.exec_reply, BaseException):
            raise self.exec_reply
        return self.exec_reply or ExecResult(error="no exec here")


class Untouchable(FakeSource):
    def __init__(self) -> None:
        super().__init__({})

    async def pod_log(self, *args: Any, **kwargs: Any) -> str:
        raise AssertionError("a complete bundle was collected again")


def files_of(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def manifest_entry(manifest: Mapping[str, Any], path: str) -> dict[str, Any]:
    return next(e for e in manifest["files"] if e["path"] == path)


def simple_inputs(pods: list[dict[str, Any]], findings: list[Finding] | None = None, **kw: Any) -> SceneInputs:
    return SceneInputs(
        incident_id="inc-1",
        diagnosis=diagnosis_event(findings or []),
        pods=pods,
        now=NOW,
        **kw,
    )


# -- the bundle of a 2-pod job ----------------------------------------------------------------------


@pytest.mark.asyncio
async def test_bundle_of_a_two_pod_job(tmp_path: Path, re_engine: Engine) -> None:
    pods = [make_pod("llama-0", node="node-a", rank=0), make_pod("llama-1", node="node-b", rank=1, restarts=1)]
    workload = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "llama", "namespace": "train", "annotations": {"trainmedic.io/checkpoint-dir": "/ckpt"}},
        "spec": {"template": {"spec": {"containers": [{"name": "trainer", "env": [{"name": "RANK", "value": "0"}]}]}}},
    }
    logs = {
        ("llama-0", False): "".join(f"[rank0]: step {i} loss 2.{i:03d}\n" for i in range(30)),
        ("llama-1", False): "".join(line + "\n" for line in [*HEALTHY, WATCHDOG, "after the timeout"]),
        ("llama-1", True): "first run\nCUDA error: an illegal memory access was encountered\n",
    }
    events = [
        event("Pod", "llama-0", "Started"),
        event("Pod", "llama-1", "BackOff"),
        event("Job", "llama", "SuccessfulCreate"),
        event("Pod", "someone-else", "Killing"),
        event("Node", "node-a", "NodeNotReady", namespace="default"),
    ]
    metrics = {"node-a": {"accelerator_utilization": [(NOW - 60, 99.0), (NOW - 30, 0.0), (NOW - 15, math.nan)]}}
    watchdog = finding(
        re_engine, WATCHDOG, pod="llama-1", namespace="train", node="node-b", timestamp=NOW, source=Source.CONTAINER_LOG
    )
    xid = finding(re_engine, XID79, node="node-a", timestamp=NOW - 5, source=Source.KERNEL)
    d = diagnosis_event([watchdog, xid])
    inputs = SceneInputs(
        incident_id="inc-1",
        diagnosis=d,
        workload=workload,
        pods=pods,
        nodes=[make_node("node-a"), make_node("node-b")],
        kernel_lines={
            "node-a": [(NOW - 700, "too early"), (NOW - 5, XID79), (NOW + 30, "after it"), (NOW + 120, "too late")]
        },
        checkpoints=[{"path": "/ckpt/step-100", "step": 100, "complete": True}],
        now=NOW,
    )
    source = FakeSource(logs, events=events, metrics=metrics)
    result = await save_scene(tmp_path, inputs, source)

    assert result.created and result.dir == tmp_path / "inc-1"
    assert sorted(os.listdir(tmp_path)) == ["inc-1"]
    files = files_of(result.dir)
    assert set(files) == {
        "manifest.json",
        "findings.json",
        "checkpoints.json",
        "events.yaml",
        "metrics.json",
        "layout/node-a/dmesg",
        "layout/node-a/rank0_llama-0_trainer.log",
        "layout/node-b/rank1_llama-1_trainer.log",
        "layout/node-b/rank1_llama-1_trainer.previous.log",
        "objects/workload.yaml",
        "objects/pods/llama-0.yaml",
        "objects/pods/llama-1.yaml",
        "objects/nodes/node-a.yaml",
        "objects/nodes/node-b.yaml",
    }
    manifest = json.loads(files["manifest.json"])
    assert manifest == result.manifest
    for e in manifest["files"]:
        assert hashlib.sha256(files[e["path"]]).hexdigest() == e["sha256"]
        assert len(files[e["path"]]) == e["bytes"]
    # Logs: as the source gave them, the previous instance only for the restarted container.
    assert files["layout/node-b/rank1_llama-1_trainer.previous.log"] == logs[("llama-1", True)].encode()
    assert files["layout/node-b/rank1_llama-1_trainer.log"] == logs[("llama-1", False)].encode()
    assert manifest_entry(manifest, "layout/node-b/rank1_llama-1_trainer.log")["lines"] == 32
    assert sorted((c["pod"], c["previous"]) for c in source.log_calls) == [
        ("llama-0", False),
        ("llama-1", False),
        ("llama-1", True),
    ]
    assert {(c["tail_lines"], c["limit"]) for c in source.log_calls} == {(10_000, 8 << 20)}
    # Events about the job, its pods and their nodes.
    assert sorted(source.event_calls) == [
        ("default", {("Node", "node-a"), ("Node", "node-b")}),
        ("train", {("Job", "llama"), ("Pod", "llama-0"), ("Pod", "llama-1")}),
    ]
    saved_events = yaml.safe_load(files["events.yaml"])
    assert sorted(e["reason"] for e in saved_events) == ["BackOff", "NodeNotReady", "Started", "SuccessfulCreate"]
    # Kernel lines of the window [fault - 10 min, fault + 1 min]; the fault is the earliest finding.
    # They lie beside the node's container logs, where a collected layout has them.
    assert files["layout/node-a/dmesg"].decode().splitlines() == [XID79, "after it"]
    assert manifest["fault_time"] == "2025-12-31T23:59:55Z"
    assert manifest["kernel_sections"] == [
        {
            "node": "node-a",
            "path": "layout/node-a/dmesg",
            "first_line": 1,
            "last_line": 2,
            "first_time": NOW - 5,
            "last_time": NOW + 30,
        }
    ]
    # Metrics before the fault; a node without them is a problem, not a failure.
    saved_metrics = json.loads(files["metrics.json"])
    assert saved_metrics["nodes"]["node-a"]["accelerator_utilization"] == [
        [NOW - 60, 99.0],
        [NOW - 30, 0.0],
        [NOW - 15, None],
    ]
    # From 15 minutes before the fault to the scene's own time (at most a minute after the fault).
    assert saved_metrics["window"] == {"start": NOW - 5 - 900, "end": NOW, "step": 15.0}
    assert [p["what"] for p in manifest["problems"]] == ["metrics.json"]
    assert "node-b" in manifest["problems"][0]["reason"]["en"] and "node-b" in manifest["problems"][0]["reason"]["zh"]
    # Findings: the contract JSON plus places, and evidence lines in the bundle's own files.
    doc = json.loads(files["findings.json"])
    assert d.diagnosis.root_cause is not None
    assert doc["root_cause"] == d.diagnosis.root_cause.contract_dict("en")
    assert doc["root_cause_zh"] == d.diagnosis.root_cause.contract_dict("zh")
    by_code = {f["code"]: f for f in doc["findings"]}
    log = "layout/node-b/rank1_llama-1_trainer.log"
    assert by_code[watchdog.code]["evidence"] == {"path": log, "line": 31, "last_line": 31}
    assert by_code[watchdog.code]["pod"] == "llama-1" and by_code[watchdog.code]["rank"] == 1
    assert by_code[xid.code]["evidence"] == {"path": "layout/node-a/dmesg", "line": 1, "last_line": 1}
    assert set(doc["findings"][0]) >= {"rule_id", "fault_class", "chip", "code", "source", "line_no", "text", "file"}
    # The manifest says what the bundle is about.
    assert manifest["schema_version"] == 1 and manifest["incident_id"] == "inc-1"
    assert manifest["created"] == "2026-01-01T00:00:00Z"
    assert manifest["job"] == {"namespace": "train", "name": "llama", "kind": "Job", "api_version": "batch/v1"}
    assert manifest["root_cause"] == d.diagnosis.root_cause.contract_dict("en")
    assert manifest["pods"][1] == {
        "name": "llama-1",
        "namespace": "train",
        "node": "node-b",
        "rank": 1,
        "uid": "uid-llama-1",
        "object": "objects/pods/llama-1.yaml",
        "containers": [
            {
                "name": "trainer",
                "restarts": 1,
                "log": "layout/node-b/rank1_llama-1_trainer.log",
                "previous_log": "layout/node-b/rank1_llama-1_trainer.previous.log",
            }
        ],
    }
    assert manifest["limits"]["log_lines"] == 10_000 and manifest["limits"]["max_file_bytes"] == 8 << 20
    # The workload as it was (nothing in it to redact), ready to recreate from.
    assert yaml.safe_load(files["objects/workload.yaml"]) == workload
    assert json.loads(files["checkpoints.json"]) == {"checkpoints": inputs.checkpoints}


# -- redaction --------------------------------------------------------------------------------------

SECRETS = [
    ("bearer", "calling the hub with Bearer {s} now", "abcdefghijklmnop1234"),
    ("authorization", "Authorization: {s}", "Basic dXNlcjpwYXNzd29yZA=="),
    ("aws-key", "aws_access_key_id {s} loaded", "AKIAIOSFODNN7EXAMPLE"),
    ("password", "connecting with password={s} to db", "hunter2hunter2"),
    ("token", "--hf_token={s} --model llama", "hf_qwertyuiopasdfghjklzxcvbnm123456"),
    ("secret-json", 'config {{"client_secret": "{s}"}}', "s3cr3t-value-42"),
    ("url-credentials", "cloning https://{s}@github.com/org/repo.git", "bob:correct-horse-battery"),
    ("jwt", "service account token {s}", "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJzeXN0ZW06c2EifQ.c2lnbmF0dXJlLWJ5dGVz"),
    ("github", "GITHUB_TOKEN is {s}", "ghp_abcdefghijklmnopqrstuvwxyz0123456789"),
    (
        "private-key",
        "key:\n{s}\nnext line",
        "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEAx4U3v0zHk7sXOmabcdef\n"
        "Z3h5c2VjcmV0a2V5bWF0ZXJpYWxoZXJl\n-----END RSA PRIVATE KEY-----",
    ),
    ("password-flag", "python train.py --password {s} --lr 3e-4", "hunter2hunter2"),
    ("api-key-flag", "wandb login --api-key {s}", "0123456789abcdef0123"),
    ("token-flag", "torchrun train.py --hf_token {s} --bf16", "hf_qwertyuiopasdfghjklzxcvbnm1234"),
    (
        "slack-hook",
        "posting to https://hooks.slack.com/services/{s} failed",
        "T0000000/B0000000/XXXXXXXXXXXXXXXXXXXXXXXX",
    ),
    # Quoted values run to the closing quote.
    ("password-flag-double-quoted", 'python train.py --password "{s}" --lr 3e-4', "correct horse battery"),
    ("token-flag-single-quoted", "torchrun train.py --hf_token '{s}' --bf16", "hf_abc"),
    ("api-key-equals-quoted", 'wandb login --api-key="{s}"', "0123456789abcdef0123"),
    # A flag and its value split in two, printed as a list: Python's repr (CalledProcessError), JSON.
    (
        "argv-single-quoted",
        "Command '['python', 'train.py', '--password', '{s}']' returned non-zero exit status 1.",
        "hunter2hunter2",
    ),
    ("argv-double-quoted", 'args: ["--hf_token", "{s}", "--bf16"]', "hf_short_value_1"),
    # SECRET_KEY and --secret-key, in all three forms.
    ("secret-key-env", "SECRET_KEY={s} python manage.py runserver", "django-insecure-abc123"),
    ("secret-key-flag", "python app.py --secret-key {s} --debug", "s3cr3t-k3y-v4lue"),
    ("secret-key-argv", 'command: ["python", "app.py", "--secret-key", "{s}"]', "s3cr3t-k3y-v4lue"),
    # Chat webhooks whose URL is the credential (trainmedic/hookurls.py).
    (
        "feishu-hook",
        "POST https://open.feishu.cn/open-apis/bot/v2/hook/{s} failed: 502",
        "0a1b2c3d-4e5f-6789-abcd-ef0123456789",
    ),
    (
        "lark-hook",
        "notify https://open.larksuite.com/open-apis/bot/v2/hook/{s}",
        "9f8e7d6c-5b4a-3210-fedc-ba9876543210",
    ),
    (
        "wecom-hook",
        "POST https://qyapi.weixin.qq.com/cgi-bin/webhook/send?key={s} timed out",
        "693a91f6-7f0e-4bc4-97a0-0ec2f1fa5aaa",
    ),
    ("discord-hook", "webhook https://discord.com/api/webhooks/{s} 429", "123456789012345678/AbCdEfGhIjKlMnOpQrStUvWx"),
    ("dingtalk-hook", "POST https://oapi.dingtalk.com/robot/send?access_token={s}", "abcdef0123456789abcdef01"),
    ("any-host-hook", "mattermost https://chat.example.com:8065/hooks/{s} answered 403", "xoq7k3bz9yfgmc4h"),
]


@pytest.mark.parametrize(("shape", "template", "secret"), SECRETS, ids=[s[0] for s in SECRETS])
@pytest.mark.asyncio
async def test_secrets_in_logs_are_redacted(tmp_path: Path, shape: str, template: str, secret: str) -> None:
    line = template.format(s=secret)
    source = FakeSource({("llama-0", False): f"step 1 loss 2.0\n{line}\nstep 2 loss 1.9\n"})
    pods = [make_pod("llama-0", node="node-a", rank=0, args=[f"--extra={line}"])]
    result = await save_scene(tmp_path, simple_inputs(pods), source, FAST)
    files = files_of(result.dir)
    for part in (secret, *secret.splitlines()[1:2]):
        assert not any(part.encode() in data for data in files.values()), f"{shape} leaked"
    log = files["layout/node-a/rank0_llama-0_trainer.log"].decode()
    assert log.startswith("step 1 loss 2.0\n") and log.endswith("step 2 loss 1.9\n")
    assert "<redacted" in log
    assert manifest_entry(result.manifest, "layout/node-a/rank0_llama-0_trainer.log")["redactions"] == 1
    # In a pod spec the same text is redacted inside the YAML string (the file stays valid YAML).
    spec = yaml.safe_load(files["objects/pods/llama-0.yaml"])
    assert "<redacted" in spec["spec"]["containers"][0]["args"][0]


@pytest.mark.parametrize(("shape", "template", "secret"), SECRETS[:4], ids=[s[0] for s in SECRETS[:4]])
@pytest.mark.asyncio
async def test_secrets_in_metric_names_are_redacted(tmp_path: Path, shape: str, template: str, secret: str) -> None:
    # The metrics file is written compact with only its strings redacted (not walked value by value).
    name = template.format(s=secret)
    metrics = {"node-a": {name: [(NOW - 30, 1.0)], "accelerator_utilization": [(NOW - 30, 97.5)]}}
    pods = [make_pod("llama-0", node="node-a", rank=0)]
    source = FakeSource({("llama-0", False): "step 1\n"}, metrics=metrics)
    result = await save_scene(tmp_path, simple_inputs(pods), source, FAST)
    data = files_of(result.dir)["metrics.json"]
    assert secret.encode() not in data, f"{shape} leaked"
    saved = json.loads(data)["nodes"]["node-a"]
    assert saved["accelerator_utilization"] == [[NOW - 30, 97.5]]
    assert any("<redacted" in k for k in saved)
    assert manifest_entry(result.manifest, "metrics.json")["redactions"] == 1


@pytest.mark.parametrize(
    ("name", "kept"),
    [
        ("RANK", True),
        ("MASTER_ADDR", True),
        ("NCCL_DEBUG", True),
        ("TORCH_NCCL_ASYNC_ERROR_HANDLING", True),
        ("HF_TOKEN", False),
        ("TORCH_HUB_TOKEN", False),
        ("WANDB_API_KEY", False),
        ("DATABASE_URL", False),
        ("MY_SETTING", False),
    ],
)
@pytest.mark.asyncio
async def test_env_values_are_redacted_unless_they_only_configure_the_job(
    tmp_path: Path, name: str, kept: bool
) -> None:
    env: list[dict[str, Any]] = [
        {"name": name, "value": "value-1234"},
        {"name": "FROM_SECRET", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "token"}}},
    ]
    pod = make_pod("llama-0", node="node-a", rank=0, env=env)
    workload = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "llama", "namespace": "train"},
        "spec": {"template": {"spec": {"containers": [{"name": "trainer", "env": env}]}}},
    }
    result = await save_scene(tmp_path, simple_inputs([pod], workload=workload), FakeSource({}), FAST)
    saved_pod = yaml.safe_load((result.dir / "objects/pods/llama-0.yaml").read_text())
    saved_wl = yaml.safe_load((result.dir / "objects/workload.yaml").read_text())
    for container in (saved_pod["spec"]["containers"][0], saved_wl["spec"]["template"]["spec"]["containers"][0]):
        values = {e["name"]: e.get("value") for e in container["env"]}
        assert values[name] == ("value-1234" if kept else "<redacted>")
        # valueFrom is a reference, not a value: kept as is.
        assert container["env"][-1] == env[-1]
    # The last-applied annotation (a full copy of the spec, env values included) is dropped.
    assert "kubectl.kubernetes.io/last-applied-configuration" not in saved_pod["metadata"]["annotations"]
    entry = manifest_entry(result.manifest, "objects/pods/llama-0.yaml")
    assert entry["redactions"] == (1 if kept else 2)


def _reference(data: bytes) -> bytes:
    """The redaction without any prefilter: the private key pattern, then the line patterns, over
    the whole text."""
    r = scene_mod._Redactor(use_hyperscan=False)
    out = r.pk_b.sub(lambda m: r.masks["pk"].encode(), data)
    return bytes(r.line_b.sub(r._repl, out))


FRAGMENTS = st.sampled_from(
    [s[1].format(s=s[2]) for s in SECRETS]
    + ["step 7 loss 1.2", "tokens/s 1234", "https://example.com:8443/x", "key-value store", "Asia/Shanghai", "é中"]
)
TEXTS = st.lists(st.one_of(FRAGMENTS, st.text(alphabet=st.characters(codec="utf-8"), max_size=40)), max_size=12).map(
    lambda parts: "\n".join(parts).encode("utf-8", "surrogatepass")
)


@settings(max_examples=150, deadline=None)
@given(TEXTS)
def test_prefiltered_redaction_equals_the_reference(data: bytes) -> None:
    expected = _reference(data)
    assert scene_mod._Redactor(use_hyperscan=False).redact_bytes(data)[0] == expected
    if scene_mod._hs is not None:
        assert scene_mod._redactor().redact_bytes(data)[0] == expected


@pytest.mark.parametrize(("shape", "template", "secret"), SECRETS, ids=[s[0] for s in SECRETS])
def test_redact_text_is_the_bundle_pass(shape: str, template: str, secret: str) -> None:
    text, n = redact_text(template.format(s=secret))
    assert secret not in text and n == 1


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # A quoted value goes whole, its quotes (escaped ones too, as in a JSON log line) kept.
        ('--api-key="two words" --lr 1', '--api-key="<redacted>" --lr 1'),
        ('--password "it\'s" --lr 1', '--password "<redacted>" --lr 1'),
        ('{"msg": "login with password=\\"hunter2\\" ok"}', '{"msg": "login with password=\\"<redacted>\\" ok"}'),
        ("['--password', \"it's\"]", "['--password', \"<redacted>\"]"),
        ("--secret_key=abc SECRET_KEY: 'abc'", "--secret_key=<redacted> SECRET_KEY: '<redacted>'"),
        # A hook keeps what names the receiver: host, path up to the credential, WeCom's ?key=.
        (
            "https://u:pw@chat.example.com:8065/hooks/abc",
            "https://<redacted>@chat.example.com:8065/hooks/<redacted>",
        ),
        ("https://ptb.discord.com/api/v10/webhooks/1/tok", "https://ptb.discord.com/api/v10/webhooks/<redacted>"),
        ("qyapi.weixin.qq.com/cgi-bin/webhook/send?key=k3y", "qyapi.weixin.qq.com/cgi-bin/webhook/send?key=<redacted>"),
    ],
)
def test_redaction_keeps_the_shape_of_the_line(text: str, expected: str) -> None:
    assert redact_text(text)[0] == expected


@pytest.mark.parametrize(
    "text",
    [
        "[rank0]: step 10 tokens/s 4521 max_new_tokens=512 pad_token_id=0",
        "saving to s3://bucket/ckpt/step-100 via https://minio.local:9000/bucket",
        "torch.distributed: key-value store at 10.0.0.1:29500",
        # A flag or key that names a file holding the secret keeps its path (the path is no secret).
        "python train.py --password-file /etc/trainer/pw --lr 3e-4",
        "--token-file /run/secrets/hf api_key_file=/run/secrets/wandb",
        "['python', 'train.py', '--password-file', '/etc/trainer/pw']",
        # Words that only contain a secret's name.
        "keyboard interrupt; monkey=3 tokenizer: llama secretary=bob",
        # A secret flag without a value (the next flag is not its value); an argument list without secrets.
        "python train.py --password --lr 3e-4",
        "Command '['python', 'train.py', '--lr', '3e-4']' returned non-zero exit status 1.",
        # Hook-like paths that are not a hook URL's own path.
        "/usr/lib/python3/site-packages/torch/utils/hooks/__init__.py",
        "GET https://api.github.com/repos/org/repo/hooks/12345",
        # What a redaction left: a second pass changes nothing.
        "password=<redacted> --password \"<redacted>\" ['--password', '<redacted>']",
        "https://hooks.slack.com/services/<redacted> https://discord.com/api/webhooks/<redacted>",
    ],
)
def test_ordinary_training_lines_are_left_alone(text: str) -> None:
    assert redact_text(text) == (text, 0)


# -- bounds -----------------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_only_the_last_lines_are_kept(tmp_path: Path) -> None:
    log = "".join(f"line {i}\n" for i in range(250))
    settings = SceneSettings(durable=False, log_lines=100)
    result = await save_scene(
        tmp_path, simple_inputs([make_pod("p", node="n", rank=0)]), FakeSource({("p", False): log}), settings
    )
    saved = (result.dir / "layout/n/rank0_p_trainer.log").read_text().splitlines()
    assert saved == [f"line {i}" for i in range(150, 250)]
    entry = manifest_entry(result.manifest, "layout/n/rank0_p_trainer.log")
    assert entry["truncated"] and entry["lines"] == 100


@pytest.mark.asyncio
async def test_a_log_over_the_file_cap_keeps_its_tail_from_a_line_start(tmp_path: Path) -> None:
    log = "".join(f"line {i:05d} {'x' * 40}\n" for i in range(2000))
    settings = SceneSettings(durable=False, max_file_bytes=10_000)
    result = await save_scene(
        tmp_path, simple_inputs([make_pod("p", node="n", rank=0)]), FakeSource({("p", False): log}), settings
    )
    saved = (result.dir / "layout/n/rank0_p_trainer.log").read_bytes()
    assert 9_000 < len(saved) <= 10_000
    assert log.encode().endswith(saved)
    assert saved.startswith(b"line ") and saved.endswith(b"line 01999 " + b"x" * 40 + b"\n")
    assert manifest_entry(result.manifest, "layout/n/rank0_p_trainer.log")["truncated"] is True


@pytest.mark.asyncio
async def test_bulky_files_past_the_total_cap_are_left_out(tmp_path: Path, re_engine: Engine) -> None:
    pods = [make_pod(f"p{i}", node="n", rank=i) for i in range(4)]
    logs = {(f"p{i}", False): "".join(f"p{i} line {j} {'y' * 80}\n" for j in range(200)) for i in range(4)}
    watchdog = finding(re_engine, WATCHDOG, pod="p0", timestamp=NOW)
    settings = SceneSettings(durable=False, max_total_bytes=40_000, concurrency=1)
    workload = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "llama", "namespace": "train"}}
    result = await save_scene(tmp_path, simple_inputs(pods, [watchdog], workload=workload), FakeSource(logs), settings)
    written = [e["path"] for e in result.manifest["files"] if e["kind"] == "log"]
    left_out = [p for p in result.problems if "total cap" in p["reason"]["en"]]
    assert len(written) == 2 and len(left_out) == 2
    assert {p["what"] for p in left_out} | set(written) == {f"layout/n/rank{i}_p{i}_trainer.log" for i in range(4)}
    bulky = ("log", "previous_log", "events", "kernel", "metrics", "stacks")
    assert sum(e["bytes"] for e in result.manifest["files"] if e["kind"] in bulky) <= 40_000
    # What a person and a restart need is never crowded out.
    paths = {e["path"] for e in result.manifest["files"]}
    assert {"findings.json", "objects/workload.yaml", "objects/pods/p3.yaml"} <= paths


@pytest.mark.parametrize(
    "raw",
    [
        b"ok\n\xff\xfe bad bytes\x00nul\n" + b"z" * (1 << 20) + b"\nend\n",
        "ok\n\udcff bad bytes\x00nul\n" + "z" * (1 << 20) + "\nend\n",
    ],
    ids=["bytes", "text"],
)
@pytest.mark.asyncio
async def test_binary_bytes_and_a_1_mib_line(tmp_path: Path, raw: bytes | str) -> None:
    source = FakeSource({("p", False): raw})
    result = await save_scene(tmp_path, simple_inputs([make_pod("p", node="n", rank=0)]), source, FAST)
    saved = (result.dir / "layout/n/rank0_p_trainer.log").read_bytes()
    text = saved.decode("utf-8")  # strictly valid UTF-8
    assert "\x00" not in text
    lines = text.splitlines()
    assert len(lines) == 4 and lines[0] == "ok" and lines[-1] == "end"
    assert "bad bytes" in lines[1] and "nul" in lines[1]
    assert len(lines[2].encode()) < (64 << 10) + 64
    assert lines[2].startswith("z" * 1000) and lines[2].endswith(f" [... {(1 << 20) - (64 << 10)} bytes cut]")
    entry = manifest_entry(result.manifest, "layout/n/rank0_p_trainer.log")
    assert entry["cut_lines"] == 1 and entry["lines"] == 4


# -- failures ---------------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_a_pod_whose_log_fails_is_a_problem_not_a_failure(tmp_path: Path) -> None:
    pods = [make_pod("p0", node="n", rank=0), make_pod("p1", node="n", rank=1)]
    source = FakeSource({("p0", False): "fine\n", ("p1", False): RuntimeError("500 Internal Server Error")})
    result = await save_scene(tmp_path, simple_inputs(pods), source, FAST)
    assert result.created
    assert (result.dir / "layout/n/rank0_p0_trainer.log").read_text() == "fine\n"
    assert not (result.dir / "layout/n/rank1_p1_trainer.log").exists()
    (problem,) = [p for p in result.problems if p["what"].startswith("layout/")]
    assert problem["what"] == "layout/n/rank1_p1_trainer.log"
    assert "500 Internal Server Error" in problem["reason"]["en"] and "无法读取日志" in problem["reason"]["zh"]
    assert result.manifest["pods"][1]["containers"][0]["log"] is None


@pytest.mark.asyncio
async def test_a_second_call_returns_the_complete_bundle_unchanged(tmp_path: Path) -> None:
    pods = [make_pod("p0", node="n", rank=0)]
    first = await save_scene(tmp_path, simple_inputs(pods), FakeSource({("p0", False): "one\n"}), FAST)
    before = {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in first.dir.rglob("*") if p.is_file()}
    second = await save_scene(tmp_path, simple_inputs(pods), Untouchable(), FAST)
    assert not second.created and second.dir == first.dir and second.manifest == first.manifest
    assert before == {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in first.dir.rglob("*") if p.is_file()}


class _Crash(BaseException):
    """The process dies mid-write (not an error the scene could record)."""


@pytest.mark.parametrize("how", ["crash", "cancel"])
@pytest.mark.asyncio
async def test_a_crash_mid_write_leaves_only_a_partial_bundle(tmp_path: Path, how: str) -> None:
    pods = [make_pod(f"p{i}", node="n", rank=i) for i in range(3)]
    blocked = asyncio.Event()

    async def crash() -> str:
        if how == "crash":
            raise _Crash
        blocked.set()
        await asyncio.sleep(3600)
        return ""

    logs: dict[tuple[str, bool], Any] = {("p0", False): "zero\n", ("p1", False): crash, ("p2", False): "two\n"}
    settings = SceneSettings(durable=False, concurrency=1)
    task = asyncio.create_task(save_scene(tmp_path, simple_inputs(pods), FakeSource(logs), settings))
    if how == "cancel":
        await blocked.wait()
        task.cancel()
    with pytest.raises(_Crash if how == "crash" else asyncio.CancelledError):
        await task
    assert os.listdir(tmp_path) == [".inc-1.partial"]
    assert not (tmp_path / ".inc-1.partial" / "manifest.json").exists()
    with pytest.raises(SceneError, match="not a directory"):
        load_scene(tmp_path / "inc-1")

    good = FakeSource({("p0", False): "zero\n", ("p1", False): "one\n", ("p2", False): "two\n"})
    result = await save_scene(tmp_path, simple_inputs(pods), good, settings)
    assert result.created and os.listdir(tmp_path) == ["inc-1"]
    assert (result.dir / "layout/n/rank1_p1_trainer.log").read_text() == "one\n"
    assert load_scene(result.dir, verify=True).incident_id == "inc-1"


@pytest.mark.parametrize("incident_id", ["", "../escape", "a/b", ".hidden", "x" * 300])
@pytest.mark.asyncio
async def test_an_incident_id_that_cannot_name_a_directory(tmp_path: Path, incident_id: str) -> None:
    inputs = SceneInputs(incident_id=incident_id, diagnosis=diagnosis_event([]), now=NOW)
    with pytest.raises(SceneError, match="cannot name a directory"):
        await save_scene(tmp_path, inputs, FakeSource({}), FAST)
    assert os.listdir(tmp_path) == []


@pytest.mark.asyncio
async def test_a_directory_in_the_way_is_not_taken_for_a_bundle(tmp_path: Path) -> None:
    (tmp_path / "inc-1").mkdir()
    (tmp_path / "inc-1" / "notes.txt").write_text("someone's files")
    with pytest.raises(SceneError, match="no complete scene bundle"):
        await save_scene(tmp_path, simple_inputs([]), FakeSource({}), FAST)
    assert (tmp_path / "inc-1" / "notes.txt").read_text() == "someone's files"


# -- stacks for a hang --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reply", "method", "reason"),
    [
        (
            ExecResult(stdout="Thread 0x1 (active): MainThread\n    all_reduce (c10d.py:2050)\n", exit_code=0),
            "py-spy",
            None,
        ),
        (NotImplementedError("this source cannot exec"), None, "NotImplementedError"),
    ],
    ids=["py-spy", "no-exec"],
)
@pytest.mark.asyncio
async def test_a_hang_saves_stacks_first(
    tmp_path: Path, reply: ExecResult | BaseException, method: str | None, reason: str | None
) -> None:
    pods = [make_pod("p0", node="n", rank=0)]
    source = FakeSource({("p0", False): "step 1\n"}, exec_reply=reply)
    result = await save_scene(tmp_path, simple_inputs(pods, hang=True), source, FAST)
    text = (result.dir / "stacks/p0.txt").read_text()
    assert f"# method: {method or 'none'}" in text
    assert result.manifest["stacks"]["p0"]["method"] == method
    if method:
        assert "all_reduce (c10d.py:2050)" in text and result.manifest["stacks"]["p0"]["reason"] is None
    else:
        assert reason is not None and reason in result.manifest["stacks"]["p0"]["attempts"][0]
        assert any(p["what"] == "stacks/p0.txt" for p in result.problems)
    # Not a hang: no exec at all.
    other = await save_scene(tmp_path / "other", simple_inputs(pods), FakeSource({}, exec_reply=reply), FAST)
    assert "stacks" not in {e["kind"] for e in other.manifest["files"]} and other.manifest["stacks"] == {}


# -- from the emulated cluster ------------------------------------------------------------------------


class ClusterSource:
    """SceneSource over the real client: KubeOps for logs and events, exec_in_pod for exec."""

    def __init__(self, api: Any) -> None:
        self.api = api
        self.ops = KubeOps(api, attempts=2, base_delay=0.05)

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
        return await self.ops.pod_log(
            namespace, pod, container, tail_lines=tail_lines, previous=previous, limit_bytes=limit_bytes
        )

    async def list_events(self, namespace: str, *, involved: set[tuple[str, str]]) -> list[dict[str, Any]]:
        return await self.ops.list_events(namespace, involved=involved)

    async def metrics_range(
        self, node: str, start: float, end: float, step: float
    ) -> Mapping[str, list[tuple[float, float]]] | None:
        return None

    async def exec(
        self, namespace: str, pod: str, container: str, command: list[str], *, timeout_s: float
    ) -> ExecResult:
        return await exec_in_pod(self.api, namespace, pod, container, command, timeout_s=timeout_s)


@pytest_asyncio.fixture
async def kube() -> AsyncIterator[KubeEmulator]:
    require_kmock()
    async with KubeEmulator() as k:
        yield k


@pytest.mark.asyncio
async def test_scene_of_a_hung_job_on_the_emulated_cluster(tmp_path: Path, kube: KubeEmulator) -> None:
    cluster = Cluster(kube)
    for node in ("gpu-1", "gpu-2"):
        await cluster.add_node(node, gpus=8)
    job = await cluster.create_job("train", "llama", completions=2)
    pods = await cluster.create_job_pods(job)
    for p, node in zip(pods, ("gpu-1", "gpu-2"), strict=True):
        await cluster.bind(p, node)
        await cluster.start(p)
    cluster.write_log(pods[1], "trainer", "first run", "killed soon")
    await cluster.terminate(pods[1], "trainer", reason="OOMKilled", exit_code=137, restart=True)
    await cluster.restart(pods[1])
    await cluster.node_oom("gpu-2", "Memory cgroup out of memory: Killed process 4321 (python)")
    for p in pods:
        cluster.write_log(p, "trainer", "step 1 loss 2.3", "step 2 loss 2.2")
    cluster.write_log(pods[0], "trainer", "[rank0]: " + WATCHDOG.split(":", 1)[1])
    names = [p["metadata"]["name"] for p in pods]
    objs = [await kube.call("GET", f"/api/v1/namespaces/train/pods/{n}") for n in names]
    job_obj = await kube.call("GET", "/apis/batch/v1/namespaces/train/jobs/llama")
    nodes = [await kube.call("GET", f"/api/v1/nodes/{n}") for n in ("gpu-1", "gpu-2")]

    inputs = SceneInputs(
        incident_id="hang-1",
        diagnosis=diagnosis_event([]),
        workload=job_obj,
        pods=objs,
        nodes=nodes,
        hang=True,
        now=NOW,
    )
    settings = SceneSettings(durable=False, stack_timeout_s=15)
    result = await save_scene(tmp_path, inputs, ClusterSource(kube.api_client()), settings)
    scene = load_scene(result.dir, verify=True)
    paths = {e["path"] for e in scene.files}
    # Each log under its node's folder (layout/<node>/...), as the manifest records it.
    logs = {p["name"]: p["containers"][0] for p in scene.manifest["pods"]}
    assert {logs[n]["log"] for n in names} <= paths
    assert logs[names[0]]["log"].startswith("layout/gpu-1/") and logs[names[1]]["log"].startswith("layout/gpu-2/")
    assert logs[names[1]]["previous_log"] in paths
    assert (result.dir / logs[names[1]]["previous_log"]).read_text() == "first run\nkilled soon\n"
    # Stacks through the exec websocket: no py-spy in the stand-in's image, so SIGUSR1.
    for n in names:
        assert scene.manifest["stacks"][n]["method"] == "sigusr1"
        stack = (result.dir / f"stacks/{n}.txt").read_text()
        assert 'File "/workspace/train.py", line 88 in train_step' in stack
        # Taken before the logs: the dump is in the saved log too.
        assert "Current thread 0x" in (result.dir / logs[n]["log"]).read_text()
    reasons = {(e["involvedObject"]["name"], e["reason"]) for e in scene.events()}
    assert (names[1], "BackOff") in reasons and ("gpu-2", "OOMKilling") in reasons
    assert {e["kind"] for e in scene.files} >= {"workload", "pod", "node", "events", "stacks", "log", "previous_log"}
    assert scene.workload() is not None and scene.workload()["metadata"]["name"] == "llama"  # type: ignore[index]
    assert [p["what"] for p in scene.manifest["problems"]] == ["metrics.json"]
    assert re.fullmatch(r"\d+\.\d+|\d+", str(scene.manifest["collect_s"]))


@pytest.mark.parametrize(
    ("args", "secret"),
    [
        (["--hf_token", "hf_qwertyuiopasdfghjklzxcvbnm1234", "--bf16"], "hf_qwertyuiopasdfghjklzxcvbnm1234"),
        (["--password", "hunter2hunter2"], "hunter2hunter2"),
        (["-api-key", "0123456789abcdef"], "0123456789abcdef"),
        (["--WANDB_API_KEY", "abcdefabcdef"], "abcdefabcdef"),
        (["--secret-key", "s3cr3t-k3y-v4lue", "--debug"], "s3cr3t-k3y-v4lue"),
        (["--secret_key", "s3cr3t-k3y-v4lue"], "s3cr3t-k3y-v4lue"),
    ],
)
@pytest.mark.asyncio
async def test_a_secret_flag_split_from_its_value_in_args_is_redacted(
    tmp_path: Path, args: list[str], secret: str
) -> None:
    source = FakeSource({("llama-0", False): "step 1\n"})
    pods = [make_pod("llama-0", node="node-a", rank=0, args=args)]
    result = await save_scene(tmp_path, simple_inputs(pods), source, FAST)
    files = files_of(result.dir)
    assert not any(secret.encode() in data for data in files.values())
    assert any(args[0].encode() in data for data in files.values()), "the flag itself is kept"


# -- what `diagnose --job --save` relies on: init containers kept, one event order --------------------------


def test_init_containers_logs_are_kept_first(tmp_path: Path) -> None:
    pod = make_pod("llama-0", node="node-a", rank=0)
    pod["spec"]["initContainers"] = [{"name": "fetch", "image": "registry.example/fetch:1"}]
    pod["status"]["initContainerStatuses"] = [
        {"name": "fetch", "restartCount": 2, "lastState": {"terminated": {"exitCode": 1}}, "state": {"running": {}}}
    ]
    source = FakeSource({("llama-0", False): "current\n", ("llama-0", True): "previous\n"})
    inputs = SceneInputs(incident_id="inc-init", diagnosis=diagnosis_event([]), pods=[pod], now=NOW)
    result = asyncio.run(save_scene(tmp_path, inputs, source, FAST))
    (p,) = result.manifest["pods"]
    assert [c["name"] for c in p["containers"]] == ["fetch", "trainer"]
    assert p["containers"][0]["log"] == "layout/node-a/rank0_llama-0_fetch.log"
    assert p["containers"][0]["previous_log"] == "layout/node-a/rank0_llama-0_fetch.previous.log"
    assert (result.dir / "layout/node-a/rank0_llama-0_fetch.previous.log").read_text() == "previous\n"


@pytest.mark.parametrize("reverse", [False, True], ids=["listed-in-order", "listed-reversed"])
def test_events_of_one_second_keep_one_order_whatever_the_listing(tmp_path: Path, reverse: bool) -> None:
    """Events with the same timestamp are ordered by namespace and name: `diagnose --job` orders what it
    read the same way, so the findings' line numbers in `events` agree."""
    events = [event("Pod", "llama-0", reason) for reason in ("BackOff", "Failed", "Killing", "Unhealthy")]
    source = FakeSource({}, events=list(reversed(events)) if reverse else events)
    pod = make_pod("llama-0", node="node-a", rank=0)
    inputs = SceneInputs(incident_id="inc-ev", diagnosis=diagnosis_event([]), pods=[pod], now=NOW)
    result = asyncio.run(save_scene(tmp_path, inputs, source, FAST))
    saved = yaml.safe_load((result.dir / "events.yaml").read_text())
    assert [e["reason"] for e in saved] == ["BackOff", "Failed", "Killing", "Unhealthy"]


class SlowMetrics(FakeSource):
    """A metrics source that answers each range query after a second (a Prometheus round trip)."""

    def __init__(self, metrics: Mapping[str, Any]) -> None:
        super().__init__({}, metrics=metrics)
        self.in_flight = 0
        self.most_in_flight = 0

    async def metrics_range(
        self, node: str, start: float, end: float, step: float
    ) -> Mapping[str, list[tuple[float, float]]] | None:
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await asyncio.sleep(1.0)
            return await super().metrics_range(node, start, end, step)
        finally:
            self.in_flight -= 1


@pytest.mark.looptime
@pytest.mark.asyncio
async def test_the_nodes_metrics_are_read_concurrently_within_the_bound(tmp_path: Path) -> None:
    """40 nodes, 8 queries at a time: 5 seconds of round trips, not 40; every node's series kept, each
    point cleaned (a non-finite value is null, a malformed point dropped, a string value parsed)."""
    nodes = [f"node-{i:02d}" for i in range(40)]
    metrics = {
        n: {"accelerator_utilization": [(NOW - 30, 97.5), (NOW - 15, float("nan")), ("bad",), (NOW, "12.5")]}
        for n in nodes
    }
    source = SlowMetrics(metrics)
    settings = dataclasses.replace(FAST, concurrency=8)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    result = await save_scene(
        tmp_path, simple_inputs([], nodes=[{"metadata": {"name": n}} for n in nodes]), source, settings
    )
    assert loop.time() - t0 == pytest.approx(5.0, abs=0.5)
    assert source.most_in_flight == 8
    saved = json.loads(files_of(result.dir)["metrics.json"])["nodes"]
    assert sorted(saved) == nodes
    assert saved["node-17"]["accelerator_utilization"] == [[NOW - 30, 97.5], [NOW - 15, None], [NOW, 12.5]]
