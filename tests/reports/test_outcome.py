"""The top block of every report: the outcome (healed, waiting for approval, failed, observe-only, ...),
what trainmedic did and what a person must still do, with the exact command; the same advice for
every incident of one fault class; no raw placeholders; evidence wrapped, never cut."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, cast

import pytest
from jinja2.runtime import Context

from trainmedic.agent.reporting import report_context
from trainmedic.agent.store import ActionState, IncidentStatus, IncidentStore
from trainmedic.reports.report import LANGS, labels, render_report

FAULT_CLASSES = [
    "device_error",
    "node_failure",
    "accelerator_oom",
    "host_oom",
    "comm_init",
    "comm_error",
    "hang",
    "process_killed",
    "storage_error",
    "app_error",
    "unknown",
]


def _incident(
    tmp_path: Path,
    *,
    status: IncidentStatus,
    mode: str = "enforce",
    fault_class: str = "device_error",
    actions: dict[str, tuple[ActionState, dict[str, Any]]] | None = None,
    iid: str = "inc-0001",
) -> IncidentStore:
    store = IncidentStore(tmp_path / "s.db")
    store.open_incident(
        iid,
        key="job:train/llama",
        diagnosis={"revision": 1},
        revision=1,
        namespace="train",
        job="llama",
        job_kind="Job",
        fault_class=fault_class,
        code="xid:79",
        node="gpu-2",
    )
    acts = actions or {}
    store.set_plan(iid, {"mode": mode}, mode, [(name, dict(params)) for name, (_, params) in acts.items()])
    for seq, (_name, (state, params)) in enumerate(acts.items()):
        store.update_action(iid, seq, state, result=params.get("result"))
    store.set_status(iid, status)
    return store


Action = tuple[str, tuple[ActionState, dict[str, Any]]]

QUARANTINE_DONE: Action = ("quarantine_node", (ActionState.DONE, {"node": "gpu-2", "result": {"node": "gpu-2"}}))
RESTART_DONE: Action = (
    "restart_from_checkpoint",
    (
        ActionState.DONE,
        {
            "checkpoint": "/ckpt/llama/checkpoint-20",
            "step": 20,
            "result": {"resumed_from": "/ckpt/llama/checkpoint-20", "excluded_nodes": ["gpu-2"]},
        },
    ),
)


@pytest.mark.parametrize(
    ("status", "mode", "actions", "kind"),
    [
        (IncidentStatus.RESOLVED, "enforce", [QUARANTINE_DONE, RESTART_DONE], "healed"),
        (IncidentStatus.RESOLVED, "enforce", [QUARANTINE_DONE], "not_restarted"),
        (IncidentStatus.AWAITING_APPROVAL, "approve", [], "awaiting_approval"),
        (IncidentStatus.FAILED, "enforce", [], "failed"),
        (IncidentStatus.OBSERVED, "dry-run", [], "observe_only"),
        (IncidentStatus.REJECTED, "approve", [], "rejected"),
        (IncidentStatus.ACTING, "enforce", [], "acting"),
    ],
)
def test_the_outcome_names_how_it_ended(
    tmp_path: Path, status: IncidentStatus, mode: str, actions: list[Any], kind: str
) -> None:
    store = _incident(tmp_path, status=status, mode=mode, actions=dict(actions))
    outcome = report_context(store, "inc-0001")["outcome"]
    assert outcome["kind"] == kind
    for lang in LANGS:
        assert outcome["headline"][lang].startswith(labels()["outcome"][kind][lang])
    commands = [n["command"] for n in outcome["now"] if n["command"]]
    if kind == "awaiting_approval":
        assert "trainmedic approve inc-0001" in commands
    if any(name == "quarantine_node" for name, _ in actions):
        assert "trainmedic release-node gpu-2 --incident inc-0001" in commands
    if kind == "healed":
        assert "kubectl -n train get job llama" in commands
        did = outcome["did"]
        assert did[0]["en"] == "quarantined gpu-2"
        assert did[1]["en"] == "resumed from /ckpt/llama/checkpoint-20 at step 20 away from gpu-2"
        assert "第 20 步" in did[1]["zh"]
    else:
        assert "kubectl -n train get job llama" not in commands


@pytest.mark.parametrize("fault_class", FAULT_CLASSES)
def test_the_advice_is_the_same_for_every_incident_of_a_class(tmp_path: Path, fault_class: str) -> None:
    advice = []
    for i, status in enumerate((IncidentStatus.OBSERVED, IncidentStatus.FAILED)):
        store = _incident(tmp_path / str(i), status=status, fault_class=fault_class, iid=f"inc-{i:04d}")
        now = report_context(store, f"inc-{i:04d}")["outcome"]["now"]
        per_class = [n["text"] for n in now if n["text"]["en"] in _class_texts()]
        assert len(per_class) == 1
        advice.append(per_class[0])
    assert advice[0] == advice[1]


def _class_texts() -> set[str]:
    keys = [*FAULT_CLASSES, "hang_no_stacks"]
    return {labels()["now"][fc]["en"].replace("{node}", "gpu-2") for fc in keys}


@pytest.mark.parametrize("lang", LANGS)
@pytest.mark.parametrize("fmt", ["md", "html"])
@pytest.mark.parametrize("status", [IncidentStatus.RESOLVED, IncidentStatus.AWAITING_APPROVAL, IncidentStatus.OBSERVED])
def test_the_top_block_comes_first_without_placeholders(
    tmp_path: Path, lang: str, fmt: str, status: IncidentStatus
) -> None:
    actions = dict([QUARANTINE_DONE, RESTART_DONE]) if status is IncidentStatus.RESOLVED else {}
    store = _incident(tmp_path, status=status, actions=actions)
    ctx = report_context(store, "inc-0001")
    out = render_report(ctx, fmt=fmt, lang=lang)
    headline = ctx["outcome"]["headline"][lang]
    what_now = labels()["labels"]["what_now"][lang]
    summary = labels()["labels"]["summary"][lang]
    actions_title = labels()["labels"]["actions"][lang]
    assert out.index(headline) < out.index(what_now) < out.index(summary) < out.index(actions_title)
    assert not re.search(r"\{[a-z_]+\}|%s|&lt;|&amp;lt;", out)


def test_evidence_lines_wrap_in_html(tmp_path: Path) -> None:
    store = _incident(tmp_path, status=IncidentStatus.OBSERVED)
    out = render_report(report_context(store, "inc-0001"), fmt="html", lang="en")
    pre = re.search(r"\npre \{[^}]*\}", out)
    assert pre is not None and "white-space: pre-wrap" in pre.group(0) and "overflow-x" not in pre.group(0)
    assert "@media (max-width: 640px)" in out


@pytest.mark.parametrize(("restart", "shown"), [(False, False), (True, True)])
def test_restart_advice_only_where_the_plan_restarts(tmp_path: Path, restart: bool, shown: bool) -> None:
    store = IncidentStore(tmp_path / "s.db")
    rc = {
        "fault_class": "accelerator_oom",
        "chip": "nvidia",
        "code": "cuda_oom",
        "action": "restart_app",
        "vendor_action": None,
        "summary": {"en": "CUDA out of memory", "zh": "显存不足"},
        "hint": {"en": "Reduce the micro-batch size.", "zh": "请减小 micro-batch。"},
    }
    store.open_incident(
        "inc-0001",
        key="job:train/llama",
        diagnosis={"revision": 1, "diagnosis": {"root_cause": rc, "findings": []}},
        revision=1,
        namespace="train",
        job="llama",
        fault_class="accelerator_oom",
        code="cuda_oom",
    )
    actions: list[tuple[str, dict[str, Any]]] = [("restart_from_checkpoint", {})] if restart else [("notify", {})]
    store.set_plan("inc-0001", {"mode": "enforce"}, "enforce", actions)
    store.set_status("inc-0001", IncidentStatus.RESOLVED)
    recs = report_context(store, "inc-0001")["recommendations"]
    assert any("restart_app" in r["en"] for r in recs) is shown


@pytest.mark.parametrize("lang", LANGS)
@pytest.mark.parametrize("fmt", ["md", "html"])
def test_a_job_left_down_is_not_called_resolved(tmp_path: Path, fmt: str, lang: str) -> None:
    """An incident closed without a restart (an OOM the policy will not restart) reads as what it
    is in the summary's status, not as "resolved" beside a dead job."""
    store = _incident(tmp_path, status=IncidentStatus.RESOLVED, actions=dict([QUARANTINE_DONE]))
    ctx = report_context(store, "inc-0001")
    out = render_report(ctx, fmt=fmt, lang=lang)
    summary = out[out.index(labels()["labels"]["summary"][lang], out.index(labels()["labels"]["what_now"][lang])) :]
    status_row = next(line for line in summary.splitlines() if labels()["labels"]["status"][lang] in line)
    assert labels()["outcome"]["not_restarted"][lang] in status_row
    # The status code itself stays (for a search), its "resolved" wording does not.
    words = re.sub(r"<code>resolved</code>|`resolved`", "", status_row)
    assert labels()["status"]["resolved"][lang] not in words


@pytest.mark.parametrize(
    ("seconds", "en", "zh"),
    [
        (0.0, "under 1 s", "不到 1 秒"),
        (0.4, "under 1 s", "不到 1 秒"),
        (0.6, "1 s", "1 秒"),
        (75, "1 min 15 s", "1 分 15 秒"),
    ],
)
def test_durations_read_as_durations(seconds: float, en: str, zh: str) -> None:
    from trainmedic.reports.report import _dur

    # The filter reads the language from the template's context; a mapping stands in for it.
    assert _dur(cast(Context, {"lang": "en"}), seconds) == en and _dur(cast(Context, {"lang": "zh"}), seconds) == zh
