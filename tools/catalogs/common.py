"""Shared helpers of the catalog generators (not part of the package): YAML writing and the
bilingual action sentences every generated row ends with."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

UDAL = Path(__file__).resolve().parents[2] / "udal"

ACTION_EN = {
    "ignore": "No action is needed; keep watching for it.",
    "restart_app": "Restart the job from its last checkpoint.",
    "reset_device": "Drain the device and reset it before work is scheduled on it again.",
    "reboot_node": "Drain the node and reboot it, then restart the job.",
    "isolate_node": "Take the node out of scheduling and have the hardware checked.",
    "contact_support": "A person must look at this: collect the logs and contact the vendor's support.",
    "notify_owner": (
        "The job's owner must fix the code, configuration or environment; a restart as is would fail the same way."
    ),
}
ACTION_ZH = {
    "ignore": "无需处理，持续观察即可。",
    "restart_app": "请从最近的检查点重启作业。",
    "reset_device": "请排空该设备并复位后再调度任务。",
    "reboot_node": "请排空节点并重启，然后重启作业。",
    "isolate_node": "请将节点移出调度并检修硬件。",
    "contact_support": "需要人工处理：请收集日志并联系厂商技术支持。",
    "notify_owner": "需要作业负责人修正代码、配置或环境；原样重启会以同样方式失败。",
}
SEVERITY = {
    "ignore": "info",
    "restart_app": "error",
    "reset_device": "critical",
    "reboot_node": "critical",
    "isolate_node": "critical",
    "contact_support": "error",
    "notify_owner": "error",
}


def row(
    code: str,
    *,
    mnemonic: str | None,
    description: str,
    action: str,
    origin: str,
    fault_class: str | None,
    en: str,
    zh: str,
    vendor_action: str | None = None,
    severity: str | None = None,
    note: str | None = None,
    inferred: bool = False,
    texts: list[str] | None = None,
    steps: list[str] | None = None,
    causes: list[str] | None = None,
    consequence: bool = False,
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "code": code,
        "mnemonic": mnemonic,
        "description": description,
        "vendor_action": vendor_action,
        "action": action,
        "origin": origin,
        "fault_class": fault_class,
        "severity": severity or SEVERITY[action],
        "consequence": consequence,
        "message": {"en": f"{en} {ACTION_EN[action]}", "zh": f"{zh}{ACTION_ZH[action]}"},
    }
    if inferred:
        out["inferred"] = True
    if note:
        out["note"] = note
    if causes:
        out["causes"] = causes
    if steps:
        out["steps"] = steps
    if texts:
        out["texts"] = texts
    return out


def write(name: str, header: str, body: dict[str, Any]) -> None:
    text = yaml.safe_dump(body, allow_unicode=True, sort_keys=False, width=120)
    (UDAL / name).write_text(header.rstrip() + "\n" + text, encoding="utf-8")
