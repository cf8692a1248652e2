"""The texts of a plan, in English and Chinese: why each action is planned (`_reason`), why an
escalation adds a quarantine (`_escalation_reason`), and the fixed reasons for an opted-out
workload, observe mode and the notification (`_t` builds each text).
"""

from __future__ import annotations

from trainmedic.models import I18nText, RootCause
from trainmedic.remediations.policy.plan import PolicyContext
from trainmedic.remediations.policy.schema import (
    ActionSpec,
    DumpStacksSpec,
    EscalationRule,
    QuarantineSpec,
    RaiseMemorySpec,
    RestartSpec,
)
from trainmedic.remediations.policy.values import OPT_OUT_ANNOTATION, format_duration


def _t(en: str, zh: str) -> I18nText:
    return I18nText(en=en, zh=zh)


_OPT_OUT = _t(
    f'The workload opted out of remediation ({OPT_OUT_ANNOTATION}: "false"): notify only.',
    f'该工作负载已选择不自动修复（{OPT_OUT_ANNOTATION}: "false"）：仅通知。',
)
_OBSERVE = _t("Observe mode: diagnose and notify only.", "观察模式：只诊断和通知。")
_NOTIFY = _t("Tell the team what happened and what was done.", "通知团队发生了什么、做了什么。")


def _what(rc: RootCause) -> tuple[str, str]:
    vendor = f", vendor action {rc.vendor_action}" if rc.vendor_action else ""
    vendor_zh = f"，厂商建议 {rc.vendor_action}" if rc.vendor_action else ""
    return f"{rc.code} ({rc.fault_class.value}{vendor})", f"{rc.code}（{rc.fault_class.value}{vendor_zh}）"


def _reason(spec: ActionSpec, rc: RootCause, ctx: PolicyContext) -> I18nText:
    what, what_zh = _what(rc)
    node = ctx.node or "?"
    job = ctx.job_key or "?"
    if isinstance(spec, QuarantineSpec):
        return _t(
            f"Node {node} reported {what}: keep new work off it until someone checks it.",
            f"节点 {node} 上报 {what_zh}：在人工检查前不再向其调度新任务。",
        )
    if isinstance(spec, RestartSpec):
        return _t(
            f"Restart {job} from its latest complete checkpoint after {what}.",
            f"在 {what_zh} 之后，从最近的完整检查点重启 {job}。",
        )
    if isinstance(spec, DumpStacksSpec):
        return _t(
            f"Take the Python stacks of {job}'s training processes into the scene before anything restarts them.",
            f"在重启之前，将 {job} 训练进程的 Python 调用栈保存到现场。",
        )
    if isinstance(spec, RaiseMemorySpec):
        return _t(
            f"Recreate {job} with memory limits raised {spec.factor}x (at most {spec.max}) after {what}.",
            f"在 {what_zh} 之后，将内存限制提高到 {spec.factor} 倍（最多 {spec.max}）并重建 {job}。",
        )
    return _NOTIFY


def _escalation_reason(rc: RootCause, ctx: PolicyContext, rule: EscalationRule, seen: int) -> I18nText:
    what, what_zh = _what(rc)
    where = f"node {ctx.node}" + (f" device {ctx.device}" if rule.scope == "device" else "")
    where_zh = f"节点 {ctx.node}" + (f" 设备 {ctx.device}" if rule.scope == "device" else "")
    window = format_duration(rule.window)
    return _t(
        f"{what} seen {seen} times on {where} within {window} (escalation {rule.id}: {rule.times} times): "
        f"isolate node {ctx.node}.",
        f"{where_zh} 在 {window} 内出现 {what_zh} {seen} 次（升级规则 {rule.id}：{rule.times} 次）："
        f"隔离节点 {ctx.node}。",
    )
