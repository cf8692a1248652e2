"""Incident reports: golden files for Markdown and HTML in English and Chinese, built from a real
incident store and a real scene bundle (remediations.scene.save_scene) with a fixed clock; escaping
(`<script>` in a log line and in a pod name stays text), StrictUndefined, the sandbox for user
templates, a missing or damaged scene bundle, the SVG chart as XML, and `trainmedic report`.

Regenerate the golden files after an intended change with `UPDATE_GOLDEN=1` (or
`TRAINMEDIC_UPDATE_GOLDEN=1`) and review the diff like code.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
import shutil
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from paths import GOLDEN as GOLDEN_ROOT

from trainmedic.agent.cli import main
from trainmedic.agent.reporting import MAX_EVIDENCE, report_context, write_reports
from trainmedic.agent.store import ActionState, IncidentStatus, IncidentStore
from trainmedic.events import DiagnosisEvent, JobRef
from trainmedic.models import Action, Chip, Diagnosis, FaultClass, Finding, I18nText, RootCause, Severity, Source
from trainmedic.remediations.scene import SceneInputs, SceneSettings, save_scene
from trainmedic.remediations.stacks import ExecResult
from trainmedic.reports.chart import Series, decimate, sparkline, svg_chart
from trainmedic.reports.report import LANGS, ReportError, labels, md_code, md_text, render_report

GOLDEN = GOLDEN_ROOT / "reports"
NOW = 1_767_225_600.0  # 2026-01-01T00:00:00Z
FAULT = NOW - 60
INCIDENT = "d-llama-20260101"
JOB = JobRef(namespace="train", name="llama")
XID79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid=2876, name=python, GPU has fallen off the bus."
WATCHDOG = (
    "[rank1]:[E101 23:59:02.903881913 ProcessGroupNCCL.cpp:616] [Rank 1] Watchdog caught collective operation "
    "timeout: WorkNCCL(SeqNum=808, OpType=ALLREDUCE, NumelIn=9801523, NumelOut=9801523, Timeout(ms)=600000) "
    "ran for 600020 milliseconds before timing out."
)
SCRIPT = '<script>alert("log")</script> & `ticks` | pipe'


def _update_golden() -> bool:
    return any(os.environ.get(v, "") not in ("", "0") for v in ("UPDATE_GOLDEN", "TRAINMEDIC_UPDATE_GOLDEN"))


# -- a deterministic incident ------------------------------------------------------------------------


class Clock:
    """The store's clock: starts just after the fault and moves 2 s per reading."""

    def __init__(self, start: float = NOW + 1) -> None:
        self.t = start - 2

    def __call__(self) -> float:
        self.t += 2
        return self.t


def _log(rank: int, last_step: int, extra: list[str]) -> str:
    lines = [f"[rank{rank}]: step {i} loss {2 - i / 1000:.3f} lr 3.0e-05" for i in range(last_step - 29, last_step + 1)]
    return "\n".join([*lines, *extra]) + "\n"


def _pod(name: str, *, node: str, rank: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "train", "uid": f"uid-{rank}"},
        "spec": {
            "nodeName": node,
            "containers": [
                {"name": "trainer", "image": "registry.example/train:1", "env": [{"name": "RANK", "value": str(rank)}]}
            ],
        },
        "status": {"phase": "Failed", "containerStatuses": [{"name": "trainer", "restartCount": 0, "state": {}}]},
    }


def _series(start: float, end: float, fn: Any) -> list[tuple[float, float]]:
    out = []
    t = start
    while t <= end:
        out.append((t, float(fn(t))))
        t += 15.0
    return out


class CannedSource:
    """A SceneSource with canned logs, events and metrics (no cluster needed for a report)."""

    def __init__(self, logs: Mapping[str, str], metrics: Mapping[str, Any]) -> None:
        self.logs = dict(logs)
        self.metrics = dict(metrics)

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
        return self.logs.get(pod, "")

    async def list_events(self, namespace: str, *, involved: set[tuple[str, str]]) -> list[dict[str, Any]]:
        return []

    async def metrics_range(
        self, node: str, start: float, end: float, step: float
    ) -> Mapping[str, list[tuple[float, float]]] | None:
        if node not in self.metrics:
            return None
        return {k: _series(start, end, fn) for k, fn in self.metrics[node].items()}

    async def exec(
        self, namespace: str, pod: str, container: str, command: list[str], *, timeout_s: float
    ) -> ExecResult:
        return ExecResult(error="no exec here")


def _util(device: int) -> Any:
    return lambda t: 0.0 if (device == 0 and t > FAULT - 45) else 92.0 + device + (t % 60) / 20


METRICS = {
    "gpu-b": {
        "accelerator_utilization{0}": _util(0),
        "accelerator_utilization{1}": _util(1),
        "accelerator_temperature{0}": lambda t: 71.0 if t < FAULT - 45 else 45.0,
        "accelerator_temperature{1}": lambda t: 69.5,
        "xid_errors{0}": lambda t: 79.0 if t > FAULT - 45 else 0.0,
        "accelerator_power{0}": lambda t: 350.0,
    },
    "gpu-a": {"accelerator_utilization{0}": lambda t: 95.0},
}


def _findings(pod1: str) -> list[Finding]:
    return [
        Finding(
            rule_id="nvidia.xid_fatal",
            fault_class=FaultClass.DEVICE_ERROR,
            chip=Chip.NVIDIA,
            code="xid:79",
            source=Source.KERNEL,
            severity=Severity.CRITICAL,
            line_no=3,
            text=XID79,
            file="kmsg",
            node="gpu-b",
            device="0000:3b:00",
            timestamp=FAULT,
            vendor_action="RESTART_BM",
            action=Action.REBOOT_NODE,
        ),
        Finding(
            rule_id="nccl.watchdog_timeout",
            fault_class=FaultClass.HANG,
            chip=Chip.NVIDIA,
            code="nccl_watchdog",
            source=Source.CONTAINER_LOG,
            severity=Severity.ERROR,
            line_no=33,
            text=WATCHDOG,
            file="/var/log/pods/train_llama-1/trainer/0.log",
            node="gpu-b",
            pod=pod1,
            namespace="train",
            rank=1,
            timestamp=FAULT + 30,
            consequence_of="xid:79",
        ),
    ]


def _root_cause() -> RootCause:
    return RootCause(
        fault_class=FaultClass.DEVICE_ERROR,
        chip=Chip.NVIDIA,
        code="xid:79",
        vendor_action="RESTART_BM",
        action=Action.REBOOT_NODE,
        node="gpu-b",
        device="0000:3b:00",
        rank=1,
        summary=I18nText(
            en="GPU 0000:3b:00 on gpu-b fell off the bus (Xid 79).",
            zh="gpu-b 上的 GPU 0000:3b:00 已从总线掉卡（Xid 79）。",
        ),
        hint=I18nText(
            en="Drain gpu-b, restart the job elsewhere from its last checkpoint, then reboot the node.",
            zh="排空 gpu-b，在其他节点上从最近检查点重启作业，然后重启该节点。",
        ),
        rule_id="nvidia.xid_fatal",
        severity=Severity.CRITICAL,
        occurrences=2,
        ranks=[1],
        nodes=["gpu-b"],
    )


def _diagnosis_event(pod1: str, revision: int, final: bool) -> DiagnosisEvent:
    findings = _findings(pod1)
    return DiagnosisEvent(
        diagnosis_id=INCIDENT,
        revision=revision,
        final=final,
        job=JOB,
        node="gpu-b",
        window_start=FAULT - 5,
        window_end=FAULT + 40,
        diagnosis=Diagnosis(root_cause=_root_cause(), findings=findings, distinct_findings=2, lines_scanned=64),
    )


CHECKPOINTS = [
    {
        "path": "/ckpt/llama/checkpoint-100",
        "step": 100,
        "format": "hf_trainer",
        "complete": True,
        "reason": None,
        "mtime": NOW - 1500,
        "size_bytes": 1 << 30,
        "reason_zh": None,
    },
    {
        "path": "/ckpt/llama/checkpoint-120",
        "step": 120,
        "format": "hf_trainer",
        "complete": True,
        "reason": None,
        "mtime": NOW - 660,
        "size_bytes": 1 << 30,
        "reason_zh": None,
    },
    {
        "path": "/ckpt/llama/checkpoint-140",
        "step": 140,
        "format": "hf_trainer",
        "complete": False,
        "reason": "trainer_state.json missing",
        "mtime": NOW - 70,
        "size_bytes": 1 << 29,
        "reason_zh": "缺少 trainer_state.json",
    },
]


@dataclass
class Built:
    root: Path
    store_path: Path
    scene_dir: Path
    incident_id: str

    def store(self) -> IncidentStore:
        return IncidentStore(self.store_path, clock=Clock(NOW + 100))


def build_incident(root: Path, *, pod1: str = "llama-worker-1", scene: bool = True, status: str = "resolved") -> Built:
    """A device fault on gpu-b handled end to end (scene, plan, quarantine, restart, notifications)."""
    pods = [_pod("llama-worker-0", node="gpu-a", rank=0), _pod(pod1, node="gpu-b", rank=1)]
    logs = {
        "llama-worker-0": _log(0, 140, ["[rank0]: waiting for rank 1"]),
        pod1: _log(1, 142, [f"[rank1]: {SCRIPT}", WATCHDOG, "[rank1]: Traceback (most recent call last):"]),
    }
    kernel = {
        "gpu-b": [
            (FAULT - 20, "NVRM: loading NVIDIA UNIX x86_64 Kernel Module"),
            (FAULT - 1, "pcieport: AER"),
            (FAULT, XID79),
            (FAULT + 1, "NVRM: GPU at PCI:0000:3b:00: GPU has fallen off the bus."),
        ]
    }
    d = _diagnosis_event(pod1, 2, True)
    scene_root = root / "scenes"
    if scene:
        inputs = SceneInputs(
            incident_id=INCIDENT,
            diagnosis=d,
            workload={"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "llama", "namespace": "train"}},
            pods=pods,
            nodes=[{"apiVersion": "v1", "kind": "Node", "metadata": {"name": n}} for n in ("gpu-a", "gpu-b")],
            kernel_lines=kernel,
            checkpoints=CHECKPOINTS,
            now=NOW,
        )
        asyncio.run(save_scene(scene_root, inputs, CannedSource(logs, METRICS), SceneSettings(durable=False)))
    store_path = root / "trainmedic.db"
    store = IncidentStore(store_path, clock=Clock())
    first = _diagnosis_event(pod1, 1, False)
    store.open_incident(
        INCIDENT,
        key=JOB.key,
        diagnosis=first.model_dump(mode="json"),
        revision=1,
        namespace="train",
        job="llama",
        job_kind="Job",
        job_api_version="batch/v1",
        node="gpu-b",
        fault_class="device_error",
        code="xid:79",
        chip="nvidia",
    )
    store.open_incident(
        INCIDENT,
        key=JOB.key,
        diagnosis=d.model_dump(mode="json"),
        revision=2,
        namespace="train",
        job="llama",
        node="gpu-b",
        fault_class="device_error",
        code="xid:79",
        chip="nvidia",
    )
    if scene:
        store.set_scene(INCIDENT, str(scene_root / INCIDENT), {"files": 9, "problems": 1})
    mode = "approve" if status == "awaiting_approval" else "enforce"
    plan: dict[str, Any] = {
        "incident_id": INCIDENT,
        "mode": mode,
        "matched": "device-error-fatal",
        "actions": [],
        "skipped": [{"name": "raise_memory_limit", "reason": {"en": "not a memory fault", "zh": "不是内存故障"}}],
        "blocked": None,
        "page": False,
        "hints": [
            {
                "en": "Check the riser card of gpu-b if Xid 79 repeats.",
                "zh": "如果 Xid 79 反复出现，请检查 gpu-b 的 PCIe 转接卡。",
            }
        ],
    }
    store.set_plan(INCIDENT, plan, mode, [("quarantine_node", {"node": "gpu-b"}), ("restart_from_checkpoint", {})])
    if status == "awaiting_approval":
        store.set_status(INCIDENT, IncidentStatus.AWAITING_APPROVAL, {"mode": "approve"})
        store.note(INCIDENT, "notified", {"sink": "ops", "status": "awaiting_approval", "http": 200, "attempt": 1})
        store.close()
        return Built(root, store_path, scene_root / INCIDENT, INCIDENT)
    store.set_status(INCIDENT, IncidentStatus.ACTING, {"mode": "enforce"})
    store.update_action(INCIDENT, 0, ActionState.RUNNING, params={"node": "gpu-b"})
    store.update_action(INCIDENT, 0, ActionState.DONE, result={"node": "gpu-b", "changed": True, "already_by": None})
    params = {
        "body": {"kind": "Job", "metadata": {"name": "llama"}},
        "uid": "uid-job",
        "api_version": "batch/v1",
        "kind": "Job",
        "checkpoint": "/ckpt/llama/checkpoint-120",
        "step": 120,
        "excluded_nodes": ["gpu-b"],
        "memory": None,
    }
    store.update_action(INCIDENT, 1, ActionState.DELETING, params=params)
    store.update_action(INCIDENT, 1, ActionState.CREATING)
    store.update_action(
        INCIDENT,
        1,
        ActionState.DONE,
        result={
            "workload": "Job/train/llama",
            "uid": "uid-new",
            "resumed_from": "/ckpt/llama/checkpoint-120",
            "excluded_nodes": ["gpu-b"],
            "restarts": "1",
        },
    )
    store.set_status(INCIDENT, IncidentStatus.RESOLVED)
    store.note(INCIDENT, "notified", {"sink": "ops-webhook", "status": "resolved", "http": 200, "attempt": 1})
    store.note(INCIDENT, "notify_failed", {"sink": "feishu", "status": "resolved", "error": "HTTP 500", "attempts": 6})
    store.close()
    return Built(root, store_path, scene_root / INCIDENT, INCIDENT)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    return build_incident(tmp_path_factory.mktemp("report"))


@pytest.fixture(scope="module")
def ctx(built: Built) -> dict[str, Any]:
    store = built.store()
    try:
        return report_context(store, built.incident_id, now=NOW + 600)
    finally:
        store.close()


def _normalise(text: str, built: Built) -> str:
    return text.replace(str(built.root), "TMP")


# -- golden files ------------------------------------------------------------------------------------


@pytest.mark.parametrize("lang", LANGS)
@pytest.mark.parametrize("fmt", ["md", "html"])
def test_report_matches_golden(fmt: str, lang: str, built: Built, ctx: dict[str, Any]) -> None:
    out = _normalise(render_report(ctx, fmt=fmt, lang=lang), built)
    golden = GOLDEN / f"incident.{lang}.{fmt}"
    if _update_golden():
        GOLDEN.mkdir(parents=True, exist_ok=True)
        golden.write_text(out, encoding="utf-8")
    assert out == golden.read_text(encoding="utf-8")


def test_context_is_json_and_complete(ctx: dict[str, Any]) -> None:
    assert json.loads(json.dumps(ctx)) == ctx
    assert ctx["where"] == {
        "node": "gpu-b",
        "device": "0000:3b:00",
        "place_from": None,
        "rank": 1,
        "pod": "llama-worker-1",
        "namespace": "train",
        "job": "llama",
        "job_kind": "Job",
        "ranks": [1],
        "nodes": ["gpu-b"],
        "chain": [],
        "candidates": [],
    }
    assert ctx["vendor"]["vendor_action"] == "RESTART_BM" and ctx["vendor"]["action"] == "reboot_node"
    kinds = [e["kind"] for e in ctx["timeline"]["items"]]
    assert kinds[:4] == ["detected", "diagnosis_revised", "scene_saved", "planned"]
    assert {"action:quarantine_node:done", "action:restart_from_checkpoint:done", "status:resolved"} <= set(kinds)
    assert kinds[-2:] == ["notified", "notify_failed"]
    ck = ctx["checkpoint"]
    assert ck["kind"] == "resumed" and ck["used"]["path"] == "/ckpt/llama/checkpoint-120"
    # rank 1 logged up to step 142; the restart resumed from 120; the checkpoint was written 600 s before the fault.
    assert (ck["last_step"], ck["steps_lost"], ck["time_lost_s"]) == (142, 22, 600.0)
    assert ctx["evidence"]["in_scene"]
    root = ctx["evidence"]["items"][0]
    assert (
        root["is_root"]
        and root["file"] == "layout/gpu-b/dmesg"
        and any(c["hit"] and c["text"] == XID79 for c in root["context"])
    )
    assert ctx["metrics"]["available"] and ctx["metrics"]["charts"][0]["node"] == "gpu-b"
    assert not any("body" in a["params"] for a in ctx["actions"])


# -- escaping ----------------------------------------------------------------------------------------


class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        for name, value in attrs:
            assert not name.startswith("on"), (tag, name)
            assert "javascript:" not in (value or "").lower()

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def _parse_html(text: str) -> _Tags:
    p = _Tags()
    p.feed(text)
    p.close()
    return p


@pytest.mark.parametrize("lang", LANGS)
def test_script_in_a_log_line_and_a_pod_name_is_text(lang: str, tmp_path: Path) -> None:
    built = build_incident(tmp_path, pod1='llama-<script>alert("pod")</script>')
    store = built.store()
    ctx = report_context(store, built.incident_id)
    store.close()
    html = render_report(ctx, fmt="html", lang=lang)
    parsed = _parse_html(html)
    assert "script" not in parsed.tags
    assert "<script" not in html.lower()
    text = "".join(parsed.text)
    assert SCRIPT in text  # the log line, shown as it was
    assert 'llama-<script>alert("pod")</script>' in text  # the pod name, as text
    assert "&lt;script&gt;alert(&#34;pod&#34;)&lt;/script&gt;" in html
    # Nothing is fetched: no external resource of any kind.
    assert not re.search(r"""(?:src|href)\s*=\s*["']?(?:https?:)?//""", html)
    assert "Content-Security-Policy" in html

    md = render_report(ctx, fmt="md", lang=lang)
    # Outside code, HTML-significant characters are entities; the log line itself is in a fenced block.
    outside = re.sub(r"(?ms)^(`{3,})text\n.*?^\1$", "", md)
    outside = re.sub(r"(`+)(?:(?!\1).)+?\1", "", outside)
    assert "<script" not in outside
    assert SCRIPT in md


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("a|b", "`a\\|b`"),
        ("has `tick`", "`` has `tick` ``"),
        ("`start", "`` `start ``"),
        ("two\nlines", "`two lines`"),
        ("", ""),
    ],
)
def test_md_code(value: str, expected: str) -> None:
    assert md_code(value) == expected


def test_md_text_escapes_html_and_markdown() -> None:
    assert md_text('<img src=x onerror="a()"> *b* [c](d) | e_f \\') == (
        '&lt;img src=x onerror="a()"&gt; \\*b\\* \\[c\\](d) \\| e\\_f \\\\'
    )


# -- templates: strictness and the sandbox -----------------------------------------------------------


def test_shipped_templates_render_every_language_and_format_without_a_scene(tmp_path: Path) -> None:
    built = build_incident(tmp_path, scene=False)
    store = built.store()
    ctx = report_context(store, built.incident_id)
    store.close()
    assert ctx["scale"] is None and not ctx["metrics"]["available"]
    assert [m["what"] for m in ctx["missing"]] == ["scene"]
    # Evidence falls back to the diagnosis as recorded (original file:line, no bundle context).
    assert not ctx["evidence"]["in_scene"] and ctx["evidence"]["items"][0]["where"] == "kmsg:3"
    for lang in LANGS:
        md = render_report(ctx, fmt="md", lang=lang)
        assert labels()["labels"]["missing"][lang] in md
        assert labels()["labels"]["metrics_none"][lang] in md
        html = render_report(ctx, fmt="html", lang=lang)
        assert "no scene bundle was saved" in html or "没有保存现场包" in html


def test_damaged_scene_still_renders_and_says_what_is_missing(tmp_path: Path) -> None:
    built = build_incident(tmp_path)
    (built.scene_dir / "metrics.json").unlink()
    (built.scene_dir / "findings.json").write_text("{not json", encoding="utf-8")
    store = built.store()
    ctx = report_context(store, built.incident_id)
    store.close()
    whats = [m["what"] for m in ctx["missing"]]
    assert "scene" in whats and "findings.json" in whats
    assert not ctx["metrics"]["available"]
    assert not ctx["evidence"]["in_scene"] and ctx["evidence"]["items"]
    for fmt in ("md", "html"):
        assert "findings.json" in render_report(ctx, fmt=fmt, lang="en")


def test_scene_directory_gone(tmp_path: Path) -> None:
    built = build_incident(tmp_path)
    shutil.rmtree(built.scene_dir)
    store = built.store()
    ctx = report_context(store, built.incident_id)
    store.close()
    assert ctx["missing"][0]["what"] == "scene" and "cannot be used" in ctx["missing"][0]["reason"]["en"]
    assert render_report(ctx, fmt="html", lang="zh")


def test_evidence_path_outside_the_bundle_is_not_read(tmp_path: Path) -> None:
    built = build_incident(tmp_path)
    secret = tmp_path / "secret.txt"
    secret.write_text("TOP SECRET\n" * 5, encoding="utf-8")
    doc = json.loads((built.scene_dir / "findings.json").read_text(encoding="utf-8"))
    doc["findings"][0]["evidence"] = {"path": "../../secret.txt", "line": 2, "last_line": 2}
    (built.scene_dir / "findings.json").write_text(json.dumps(doc), encoding="utf-8")
    store = built.store()
    ctx = report_context(store, built.incident_id)
    store.close()
    assert ctx["evidence"]["items"][0]["context"] == []
    assert "TOP SECRET" not in json.dumps(ctx)


def test_missing_field_in_a_shipped_style_template_is_an_error(ctx: dict[str, Any]) -> None:
    broken = dict(ctx)
    del broken["checkpoint"]
    with pytest.raises(ReportError, match="checkpoint"):
        render_report(broken, fmt="md", lang="en")


@pytest.mark.parametrize("fmt", ["md", "html"])
def test_user_template_with_an_unknown_field_raises(fmt: str, tmp_path: Path, ctx: dict[str, Any]) -> None:
    (tmp_path / f"report.{fmt}.j2").write_text("{{ incident.id }} {{ incident.no_such_field }}", encoding="utf-8")
    with pytest.raises(ReportError, match="no_such_field"):
        render_report(ctx, fmt=fmt, lang="en", template_dir=tmp_path)


@pytest.mark.parametrize(
    "source",
    [
        "{{ ''.__class__.__mro__ }}",
        "{{ incident.__class__ }}",
        "{{ lang.__class__.__base__.__subclasses__() }}",
        "{{ t.__globals__ }}",
        "{% for x in ().__class__.__base__.__subclasses__() %}{{ x }}{% endfor %}",
    ],
)
def test_sandbox_refuses_unsafe_access(source: str, tmp_path: Path, ctx: dict[str, Any]) -> None:
    (tmp_path / "report.md.j2").write_text(source, encoding="utf-8")
    with pytest.raises(ReportError, match=r"unsafe|SecurityError|Undefined"):
        render_report(ctx, fmt="md", lang="en", template_dir=tmp_path)


def test_user_template_sees_the_same_fields_and_filters(tmp_path: Path, ctx: dict[str, Any]) -> None:
    (tmp_path / "report.html.j2").write_text(
        "<h1>{{ incident.id }}</h1><p>{{ root_cause.summary | tr }}</p>"
        "{% for e in evidence['items'] %}<pre>{{ e.text }}</pre>{% endfor %}{{ charts | length }}",
        encoding="utf-8",
    )
    out = render_report(ctx, fmt="html", lang="zh", template_dir=tmp_path)
    assert out.startswith(f"<h1>{INCIDENT}</h1><p>gpu-b 上的 GPU")
    assert out.endswith(str(len(ctx["metrics"]["charts"])))


def test_user_template_directory_errors(tmp_path: Path, ctx: dict[str, Any]) -> None:
    with pytest.raises(ReportError, match="does not exist"):
        render_report(ctx, fmt="md", lang="en", template_dir=tmp_path / "nope")
    with pytest.raises(ReportError, match=r"report\.md\.j2"):
        render_report(ctx, fmt="md", lang="en", template_dir=tmp_path)


@pytest.mark.parametrize(("fmt", "lang"), [("pdf", "en"), ("md", "fr")])
def test_unknown_format_or_language(fmt: str, lang: str, ctx: dict[str, Any]) -> None:
    with pytest.raises(ReportError):
        render_report(ctx, fmt=fmt, lang=lang)


def test_every_label_has_both_languages() -> None:
    for group, entries in labels().items():
        for key, text in entries.items():
            assert set(text) == set(LANGS) and all(text.values()), (group, key)


# -- the chart ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("lang", LANGS)
def test_html_charts_are_well_formed_svg(lang: str, ctx: dict[str, Any]) -> None:
    html = render_report(ctx, fmt="html", lang=lang)
    svgs = re.findall(r"<svg\b.*?</svg>", html, flags=re.S)
    assert len(svgs) == len(ctx["metrics"]["charts"]) >= 2
    for svg in svgs:
        root = ET.fromstring(svg)
        assert root.tag == "{http://www.w3.org/2000/svg}svg"
        assert root.find("{http://www.w3.org/2000/svg}title") is not None
        assert root.findall(".//{http://www.w3.org/2000/svg}polyline")


@pytest.mark.parametrize(
    "series",
    [
        [],
        [Series("empty", [])],
        [Series("one", [(NOW, 1.0)])],
        [Series("flat", [(NOW, 5.0), (NOW + 15, 5.0)])],
        [Series("gaps", [(NOW, 1.0), (NOW + 15, None), (NOW + 30, 3.0), (NOW + 45, 4.0)])],
        [Series("nan", [(NOW, math.nan), (math.inf, 1.0), (NOW + 15, -math.inf), (NOW + 30, 2.0)])],
        [Series(f"dev{i}", [(NOW + j, float(i * j)) for j in range(50)]) for i in range(40)],
    ],
    ids=["none", "empty", "one-point", "flat", "gaps", "non-finite", "many-series"],
)
def test_svg_chart_edge_cases_are_well_formed(series: list[Series]) -> None:
    svg = svg_chart(series, fault_time=NOW + 20, title='GPU <b>"util"</b> & co', fault_label="<fault>")
    root = ET.fromstring(svg)
    assert root.find("{http://www.w3.org/2000/svg}title").text == 'GPU <b>"util"</b> & co'  # type: ignore[union-attr]
    assert "<b>" not in svg and "<fault>" not in svg


def test_svg_chart_escapes_series_names_and_marks_the_fault() -> None:
    svg = svg_chart([Series('<script>x</script>"\x01', [(NOW, 1.0), (NOW + 60, 2.0)])], fault_time=NOW + 30, title="t")
    root = ET.fromstring(svg)
    ns = "{http://www.w3.org/2000/svg}"
    assert not root.findall(f".//{ns}script")
    texts = ["".join(e.itertext()) for e in root.iter(f"{ns}text")]
    assert any("<script>x</script>" in t for t in texts)
    fault_lines = [e for e in root.iter(f"{ns}line") if e.get("stroke") == "#D00000"]
    assert len(fault_lines) == 1
    assert any(t.startswith("fault 00:00:30") for t in texts)


def test_decimate_keeps_spikes_and_bounds() -> None:
    pts = [(float(i), 0.0) for i in range(10_000)]
    pts[5000] = (5000.0, 99.0)
    out = decimate(pts, 100)
    assert len(out) <= 102
    assert (5000.0, 99.0) in out and out[0] == pts[0] and out[-1] == pts[-1]


def test_sparkline() -> None:
    assert sparkline([(float(i), float(i)) for i in range(8)], width=8) == "▁▂▃▄▅▆▇█"
    assert sparkline([]) == ""
    assert sparkline([(0.0, None), (1.0, 2.0)], width=2) == " ▁"


# -- write_reports and the CLI -----------------------------------------------------------------------


def test_write_reports_beside_the_scene(tmp_path: Path) -> None:
    built = build_incident(tmp_path)
    store = built.store()
    paths = write_reports(store, built.incident_id)
    store.close()
    assert sorted(paths) == ["en.html", "en.md", "zh.html", "zh.md"]
    for key, path in paths.items():
        assert path == built.scene_dir / f"report.{key}"
        assert path.read_text(encoding="utf-8")
    assert not [p for p in built.scene_dir.iterdir() if p.name.endswith(".tmp")]


def test_write_reports_without_a_scene_goes_beside_the_store(tmp_path: Path) -> None:
    built = build_incident(tmp_path, scene=False)
    store = built.store()
    paths = write_reports(store, built.incident_id)
    store.close()
    assert paths["zh.html"] == tmp_path / "reports" / INCIDENT / "report.zh.html"


def test_awaiting_approval_says_how_to_approve(tmp_path: Path) -> None:
    built = build_incident(tmp_path, status="awaiting_approval")
    store = built.store()
    ctx = report_context(store, built.incident_id)
    store.close()
    assert ctx["checkpoint"]["kind"] == "candidate" and ctx["checkpoint"]["used"]["step"] == 120
    md = render_report(ctx, fmt="md", lang="en")
    assert f"`trainmedic approve {INCIDENT}`" in md
    html = render_report(ctx, fmt="html", lang="zh")
    assert f"<code>trainmedic approve {INCIDENT} --reject</code>" in html


@pytest.mark.parametrize(
    ("fmt", "lang", "needle"), [("md", "en", "# Incident report"), ("html", "zh", "<!DOCTYPE html>")]
)
def test_cli_report_to_stdout(
    fmt: str, lang: str, needle: str, built: Built, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = main(["report", INCIDENT[:8], "--store", str(built.store_path), "--format", fmt, "--lang", lang])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert out.startswith(needle) and INCIDENT in out


def test_cli_report_to_a_file_with_user_templates(
    built: Built, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "tpl").mkdir()
    (tmp_path / "tpl" / "report.md.j2").write_text("{{ incident.id }}: {{ incident.status }}\n", encoding="utf-8")
    out_file = tmp_path / "out" / "r.md"
    rc = main(
        [
            "report",
            INCIDENT,
            "--store",
            str(built.store_path),
            "--out",
            str(out_file),
            "--templates",
            str(tmp_path / "tpl"),
        ]
    )
    assert rc == 0, capsys.readouterr().err
    assert out_file.read_text(encoding="utf-8") == f"{INCIDENT}: resolved\n"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["nope-incident"], "no incident"),
        ([INCIDENT, "--store", "{tmp}/absent.db"], "no incident store"),
        ([INCIDENT, "--store", "{tmp}/garbage.db"], ""),
        ([INCIDENT, "--templates", "{tmp}/no-templates"], "does not exist"),
    ],
    ids=["unknown-incident", "no-store", "not-a-database", "bad-templates"],
)
def test_cli_report_unusable_input_exits_2(
    args: list[str], message: str, built: Built, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "garbage.db").write_bytes(b"this is not a database\n" * 100)
    argv = ["report", *[a.replace("{tmp}", str(tmp_path)) for a in args]]
    if "--store" not in argv:
        argv += ["--store", str(built.store_path)]
    rc = main(argv)
    out, err = capsys.readouterr()
    assert rc == 2
    assert out == ""
    assert len(err.strip().splitlines()) == 1 and err.startswith("trainmedic: ") and message in err


def test_evidence_is_capped(tmp_path: Path) -> None:
    """A diagnosis with many findings shows the first MAX_EVIDENCE and counts the rest."""
    store = IncidentStore(tmp_path / "s.db", clock=Clock())
    many = [
        Finding(
            rule_id="nccl.watchdog_timeout",
            fault_class=FaultClass.HANG,
            chip=Chip.NVIDIA,
            code="nccl_watchdog",
            source=Source.CONTAINER_LOG,
            severity=Severity.ERROR,
            line_no=i,
            text=f"watchdog {i}",
            file=f"pod-{i}.log",
        )
        for i in range(1, 201)
    ]
    d = DiagnosisEvent(
        diagnosis_id="many",
        job=JOB,
        window_start=NOW,
        window_end=NOW,
        diagnosis=Diagnosis(root_cause=_root_cause(), findings=many),
    )
    store.open_incident("many", key=JOB.key, diagnosis=d.model_dump(mode="json"), revision=1)
    ctx = report_context(store, "many")
    store.close()
    assert len(ctx["evidence"]["items"]) == MAX_EVIDENCE and ctx["evidence"]["hidden"] == 200 - MAX_EVIDENCE
    assert "150" in render_report(ctx, fmt="md", lang="en")


@pytest.mark.parametrize(
    "rel",
    [
        "layout/gpu-b/dmesg",
        "layout/gpu-b/rank1_llama-worker-1_trainer.log",
        "layout/gpu-a/rank0_llama-worker-0_trainer.log",
    ],
)
def test_lines_read_from_the_end_match_a_forward_read(rel: str, built: Built) -> None:
    from trainmedic.agent.reporting import _Bundle

    bundle = _Bundle(str(built.scene_dir), [])
    total = bundle.line_counts[rel]
    every = set(range(1, total + 1))
    forward = bundle.lines(rel, every)
    assert forward is not None and len(forward) == total
    for start in range(1, total + 1):
        wanted = set(range(start, min(total, start + 6) + 1)) | {total + 3}
        assert bundle._lines_from_end(built.scene_dir / rel, wanted, total) == {
            n: forward[n] for n in wanted if n <= total
        }


def test_md_fence_outgrows_backticks_in_the_text() -> None:
    from trainmedic.reports.report import md_fence

    assert md_fence(["plain"]) == "```"
    assert md_fence(["ok\n  ````x", "```"]) == "`````"


def test_incident_without_root_cause_or_scene(tmp_path: Path) -> None:
    store = IncidentStore(tmp_path / "s.db", clock=Clock())
    store.open_incident(
        "bare-1", key="node:gpu-9", diagnosis={"diagnosis": {"root_cause": None, "findings": []}}, revision=1
    )
    ctx = report_context(store, "bare-1")
    store.close()
    assert ctx["root_cause"] is None and ctx["vendor"] is None and ctx["evidence"]["items"] == []
    for lang in LANGS:
        for fmt in ("md", "html"):
            out = render_report(ctx, fmt=fmt, lang=lang)
            assert labels()["labels"]["no_root_cause"][lang] in out
            assert "node:gpu-9" in out


@settings(max_examples=60, deadline=None)
@given(
    names=st.lists(st.text(max_size=40), max_size=5),
    values=st.lists(st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True)), max_size=30),
    title=st.text(max_size=60),
)
# Two samples a subnormal apart: a quarter of that span underflows to zero (the tick step's log10).
@example(names=["a"], values=[0.0, 5e-324], title="")
def test_svg_chart_is_well_formed_for_any_input(names: list[str], values: list[float | None], title: str) -> None:
    series = [Series(n, [(NOW + 15 * i, v) for i, v in enumerate(values)]) for n in names]
    ET.fromstring(svg_chart(series, fault_time=NOW, title=title, fault_label=title))


@settings(max_examples=100, deadline=None)
@given(st.text())
def test_md_escaping_never_leaves_html(text: str) -> None:
    assert "<" not in md_text(text) and ">" not in md_text(text) and "\n" not in md_text(text)
    code = md_code(text)
    if code:
        fence = re.match(r"`+", code).group(0)  # type: ignore[union-attr]
        assert code.endswith(fence) and fence not in code[len(fence) : -len(fence)] and "\n" not in code


def test_a_link_out_of_the_bundle_is_not_followed(tmp_path: Path) -> None:
    built = build_incident(tmp_path)
    secret = tmp_path / "secret.log"
    secret.write_text("TOP SECRET\n" * 40, encoding="utf-8")
    log = built.scene_dir / "layout" / "gpu-b" / "rank1_llama-worker-1_trainer.log"
    log.unlink()
    log.symlink_to(secret)
    store = built.store()
    ctx = report_context(store, built.incident_id)
    store.close()
    assert "TOP SECRET" not in json.dumps(ctx)
