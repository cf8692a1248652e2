"""A hang report links the stacks trainmedic saved (and no longer sends the reader to take them), its
pace reads as a real duration; WHERE shows the device (and rank) a HCCL / CANN line names."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from trainmedic.agent.reporting import report_context
from trainmedic.agent.store import ActionState, IncidentStatus, IncidentStore
from trainmedic.detectors.hang import _message
from trainmedic.detectors.hang_state import seconds_text
from trainmedic.reports.report import LANGS, labels, render_report

PYSPY_HINT = {"en": "Dump the stacks (`py-spy dump --pid <pid>`).", "zh": "用 `py-spy dump --pid <pid>` 抓取调用栈。"}


@pytest.mark.parametrize(
    ("value", "text"), [(0.004, "0.004"), (0.2, "0.2"), (0.25, "0.25"), (1.0, "1"), (2.46, "2.5"), (45.6, "46")]
)
def test_seconds_text(value: float, text: str) -> None:
    assert seconds_text(value) == text


@pytest.mark.parametrize("interval", [0.004, 0.2, 0.4, 0.6, 1.0, 30.0])
@pytest.mark.parametrize("phase", [None, "epoch"])
def test_hang_message_never_says_a_step_every_0_s(interval: float, phase: str | None) -> None:
    m = _message("job", "the job", 2.0, 2.0, interval, phase)
    assert "every 0 s" not in m.en and "每 0 秒" not in m.zh
    if interval >= 0.01:
        assert f"a step every {seconds_text(interval)} s" in m.en and f"每 {seconds_text(interval)} 秒一步" in m.zh
    else:
        assert "step every" not in m.en and "正常每" not in m.zh


@pytest.fixture
def store(tmp_path: Path) -> Iterator[IncidentStore]:
    s = IncidentStore(tmp_path / "s.db")
    yield s
    s.close()


def _hang(store: IncidentStore, scene: Path | None, *, stacks_before: bool) -> None:
    rc = {
        "fault_class": "hang",
        "chip": "generic",
        "code": "no_progress",
        "action": "restart_app",
        "rank": 0,
        "node": "gpu-1",
        "summary": {"en": "No training progress for 600 s", "zh": "训练已 600 秒无进展"},
        "hint": PYSPY_HINT,
    }
    store.open_incident(
        "hang-1",
        key="job:train/llama",
        diagnosis={"diagnosis": {"root_cause": rc, "findings": []}},
        revision=1,
        namespace="train",
        job="llama",
        job_kind="Job",
        node="gpu-1",
        fault_class="hang",
        code="no_progress",
        chip="generic",
    )
    if scene is not None:
        store.set_scene("hang-1", str(scene), {"files": 1})
    result = {"files": ["stacks-before-restart/llama-0.txt"], "methods": {"llama-0": "sigusr1"}, "dumped": 1}
    store.set_plan("hang-1", {"mode": "enforce"}, "enforce", [("dump_stacks", {}), ("restart_from_checkpoint", {})])
    if stacks_before:
        store.update_action("hang-1", 0, ActionState.DONE, result=result)
    store.update_action("hang-1", 1, ActionState.DONE, result={"resumed_from": None})
    store.set_status("hang-1", IncidentStatus.RESOLVED)


def _scene(tmp_path: Path) -> Path:
    scene = tmp_path / "scene"
    (scene / "stacks").mkdir(parents=True)
    (scene / "stacks-before-restart").mkdir()
    (scene / "stacks" / "llama-0.txt").write_text("Thread 0x1 (most recent call first):\n", encoding="utf-8")
    (scene / "stacks-before-restart" / "llama-0.txt").write_text("Thread 0x1:\n", encoding="utf-8")
    # Not the action's: a file beside them that no one listed is not linked.
    (scene / "stacks-before-restart" / "other.txt").write_text("x\n", encoding="utf-8")
    manifest = {"files": [{"path": "stacks/llama-0.txt", "lines": 1}], "pods": [], "stacks": {}}
    (scene / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
    return scene


@pytest.mark.parametrize("lang", LANGS)
def test_hang_report_links_the_saved_stacks(store: IncidentStore, tmp_path: Path, lang: str) -> None:
    _hang(store, _scene(tmp_path), stacks_before=True)
    ctx = report_context(store, "hang-1")
    assert [s["path"] for s in ctx["stacks"]] == ["stacks-before-restart/llama-0.txt", "stacks/llama-0.txt"]
    assert "py-spy" not in json.dumps(ctx["root_cause"]["hint"]) and "py-spy" not in json.dumps(ctx["outcome"])
    assert ctx["outcome"]["did"][0][lang].startswith(labels()["outcome"]["did_stacks"][lang].split("{")[0])
    out = render_report(ctx, fmt="html", lang=lang)
    top = out[out.index('id="outcome"') : out.index('id="summary"')]
    assert '<a href="stacks-before-restart/llama-0.txt">' in top
    section = out[out.index('id="stacks"') :]
    assert '<a href="stacks/llama-0.txt">' in section and "other.txt" not in out
    assert str(tmp_path / "scene" / "stacks-before-restart" / "llama-0.txt") in section
    md = render_report(ctx, fmt="md", lang=lang)
    assert "](<stacks-before-restart/llama-0.txt>)" in md and "py-spy" not in md.split("## ")[1]


def test_hang_report_without_stacks_says_how_to_take_them(store: IncidentStore) -> None:
    _hang(store, None, stacks_before=False)
    ctx = report_context(store, "hang-1")
    assert ctx["stacks"] == []
    texts = [n["text"]["en"] for n in ctx["outcome"]["now"]]
    assert labels()["now"]["hang_no_stacks"]["en"] in texts
    assert ctx["root_cause"]["hint"] == PYSPY_HINT


def test_a_stack_file_outside_the_scene_is_not_linked(store: IncidentStore, tmp_path: Path) -> None:
    scene = _scene(tmp_path)
    (scene / "stacks-before-restart" / "llama-0.txt").unlink()
    (scene / "stacks-before-restart" / "llama-0.txt").symlink_to(tmp_path / "s.db")
    _hang(store, scene, stacks_before=True)
    assert [s["path"] for s in report_context(store, "hang-1")["stacks"]] == ["stacks/llama-0.txt"]


CANN = "[rank8]: [ERROR] (PID:1292364, Device:{device}, RankID:{rank}) ERR01100 OPS call acl api failed."


@pytest.mark.parametrize(
    ("line_rank", "rc_rank", "device", "rank"),
    [(8, 8, "3", 8), (9, 8, None, 8), (8, None, "3", 8)],
)
def test_where_shows_the_device_a_hccl_line_names(
    store: IncidentStore, line_rank: int, rc_rank: int | None, device: str | None, rank: int | None
) -> None:
    text = CANN.format(device=3, rank=line_rank)
    rc: dict[str, Any] = {
        "fault_class": "comm_init",
        "chip": "ascend",
        "code": "EI0006",
        "rank": rc_rank,
        "node": "npu-2",
        "summary": {"en": "HCCL setup failed", "zh": "HCCL 建链失败"},
    }
    finding = {"file": "train.log", "line_no": 3, "code": "EI0006", "rule_id": "ascend.hccl_init_code", "text": text}
    store.open_incident("hccl-1", key="job:train/qwen", diagnosis={"root_cause": rc, "findings": [finding]}, revision=1)
    ctx = report_context(store, "hccl-1")
    assert (ctx["where"]["device"], ctx["where"]["rank"]) == (device, rank)
    if device is not None:
        for lang in LANGS:
            html = render_report(ctx, fmt="html", lang=lang)
            row = re.search(r"<tr><th>[^<]+</th><td><code>3</code> <span class=\"muted\">\(([^)]*)\)", html)
            assert row is not None and "train.log:3" in row.group(1)
