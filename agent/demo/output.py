"""What `trainmedic demo` prints: one line per stage as it happens, in English or Chinese.

Lines are timed from the moment the fault was injected (`[+  312 ms]`); what happens before it
(cluster start, training) is marked `[  setup   ]`. With --json nothing is printed here: stdout carries
only the JSON lines.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping
from typing import Any, Literal, TextIO

__all__ = ["TEXTS", "Lang", "Progress", "duration", "text"]

Lang = Literal["en", "zh"]

# key -> (English, Chinese). Format fields are filled by name.
TEXTS: dict[str, tuple[str, str]] = {
    "title": (
        "trainmedic demo: {n} fault(s) on an emulated cluster, agent in enforce mode",
        "trainmedic 演示：在模拟集群上注入 {n} 个故障，agent 处于 enforce（自动处置）模式",
    ),
    "workdir": ("work directory (store, scenes, reports): {dir}", "工作目录（事件库、现场、报告）：{dir}"),
    "header": ("{fault}: {title}", "{fault}：{title}"),
    "cluster": (
        "cluster: {gpu} NVIDIA nodes (8x nvidia.com/gpu), {npu} Ascend nodes (8x huawei.com/Ascend910); agent:"
        " watchers, memory bus, detectors, responder",
        "集群：{gpu} 个 NVIDIA 节点（每个 8× nvidia.com/gpu），{npu} 个昇腾节点（每个 8× huawei.com/Ascend910"
        "）；agent：监听器、内存总线、检测器、响应器",
    ),
    "real_title": (
        "trainmedic demo: {n} fault(s) on a real Kubernetes control plane (KWOK nodes), agent in enforce mode",
        "trainmedic 演示：在真实 Kubernetes 控制面（KWOK 节点）上注入 {n} 个故障，agent 处于 enforce（自动处置）模式",
    ),
    "real_starting": (
        "starting the real control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler, KWOK)"
        " from {bin}",
        "正在启动真实控制面（etcd、kube-apiserver、kube-controller-manager、kube-scheduler、KWOK），二进制目录 {bin}",
    ),
    "real_started": ("control plane up in {seconds} s at {url}", "控制面已启动（{seconds} 秒），地址 {url}"),
    "real_cluster": (
        "cluster: real control plane ({version}), {n} KWOK nodes (8x nvidia.com/gpu); agent: cluster role and"
        " brain with their deploy/ ServiceAccounts and RBAC, memory bus",
        "集群：真实控制面（{version}），{n} 个 KWOK 节点（每个 8× nvidia.com/gpu）；agent：cluster 角色与 brain，"
        "使用 deploy/ 中的 ServiceAccount 与 RBAC，内存总线",
    ),
    "webhook_sink": ("webhooks: CloudEvents to {url}", "Webhook：以 CloudEvents 发送到 {url}"),
    "no_notify": ("webhooks: not available in this build ({why})", "Webhook：当前版本不可用（{why}）"),
    "job_running": ("job {job} running on {nodes}", "作业 {job} 运行在 {nodes}"),
    "training": (
        "training: step {step}, checkpoints {checkpoints}",
        "训练中：第 {step} 步，已保存检查点 {checkpoints}",
    ),
    "injected": ("injected: {what}", "注入故障：{what}"),
    "detected": (
        "detected: {fault_class} {code} on {node} (incident {id})",
        "已检测：{node} 上的 {fault_class} {code}（事件 {id}）",
    ),
    "revised": ("root cause revised: {fault_class} {code} on {node}", "根因修正为：{node} 上的 {fault_class} {code}"),
    "scene": ("scene saved: {dir} ({files} files)", "现场已保存：{dir}（{files} 个文件）"),
    "planned": ("plan ({mode}): {actions}", "处置计划（{mode}）：{actions}"),
    "escalated": ("escalated: {why}", "已升级：{why}"),
    "blocked": ("held back: {why}", "暂缓：{why}"),
    "quarantined": (
        "node {node} quarantined: cordoned, tainted trainmedic.io/unhealthy:NoSchedule",
        "节点 {node} 已隔离：已禁止调度，并打上污点 trainmedic.io/unhealthy:NoSchedule",
    ),
    "recreated": (
        "{workload} recreated from {checkpoint}, excluding {excluded}",
        "{workload} 已从 {checkpoint} 重建，排除节点 {excluded}",
    ),
    "notify_action": ("notified: incident published on {topic}", "已通知：事件已发布到 {topic}"),
    "hint": ("hint: {hint}", "建议：{hint}"),
    "status": ("incident {id}: {status}", "事件 {id}：{status}"),
    "webhook": (
        "webhook delivered to {sink}: {status} (HTTP {http})",
        "Webhook 已送达 {sink}：{status}（HTTP {http}）",
    ),
    "webhook_failed": ("webhook to {sink} failed: {error}", "Webhook 发送到 {sink} 失败：{error}"),
    "rescheduled": ("rescheduled: pods on {nodes}", "已重新调度：Pod 运行在 {nodes}"),
    "pending": ("pods pending: {message}", "Pod 等待调度：{message}"),
    "resumed": (
        "resumed from {checkpoint}: step {step} on {nodes}",
        "已从 {checkpoint} 恢复：第 {step} 步，节点 {nodes}",
    ),
    "report": ("report: {path}", "报告：{path}"),
    "no_report": ("report: not available in this build ({why})", "报告：当前版本不可用（{why}）"),
    "webhooks_total": ("webhooks received by the local receiver: {n}", "本地接收端收到的 Webhook：{n} 条"),
    "healed": (
        "healed: detected in {detect}, training resumed in {recover}",
        "已自愈：{detect} 内检测到，{recover} 内恢复训练",
    ),
    "notified_only": (
        "detected in {detect}; no restart: the policy notifies with hints (a restart as it is would fail again)",
        "{detect} 内检测到；未重启：策略仅通知并给出建议（原样重启会再次失败）",
    ),
    "failed": ("FAILED: {problems}", "失败：{problems}"),
    "warning": ("note: {what}", "提示：{what}"),
    "summary": ("summary", "汇总"),
    "summary_row": (
        "{fault:<5} {outcome:<8} detect {detect:>8}  recover {recover:>8}  {detail}",
        "{fault:<5} {outcome:<8} 检测 {detect:>8}  恢复 {recover:>8}  {detail}",
    ),
    "outcome_healed": ("healed", "已自愈"),
    "outcome_notified": ("notified", "已通知"),
    "outcome_failed": ("FAILED", "失败"),
    "kept": ("artifacts kept in {dir}", "产物保存在 {dir}"),
}


def text(key: str, lang: Lang, **fields: Any) -> str:
    en, zh = TEXTS[key]
    return (zh if lang == "zh" else en).format(**fields)


def duration(ms: float | None) -> str:
    if ms is None:
        return "-"
    return f"{ms:.0f} ms" if ms < 1000 else f"{ms / 1000:.1f} s"


class Progress:
    """Prints the stages of one demo run (nothing in JSON mode)."""

    def __init__(self, lang: Lang = "en", *, quiet: bool = False, out: TextIO | None = None) -> None:
        self.lang = lang
        self.quiet = quiet
        self.out = out if out is not None else sys.stdout
        self.t0: float | None = None
        # Stages seen while the fault is still being injected (the agent can be that fast) wait for
        # the "injected" line, so the output reads in the order things happened.
        self._held: list[str] | None = None

    def line(self, key: str, *, at: float | None = None, **fields: Any) -> None:
        if self.quiet:
            return
        if self.t0 is None:
            stamp = "[  setup   ]"
        else:
            ms = ((at if at is not None else time.time()) - self.t0) * 1000
            stamp = f"[+{ms:6.0f} ms]"
        row = f"  {stamp} {text(key, self.lang, **fields)}\n"
        if self.t0 is not None and self._held is None and key != "injected":
            self._held = []
        if self._held is not None and key != "injected":
            self._held.append(row)
            return
        self.out.write(row)
        if key == "injected":
            self._release()
        self.out.flush()

    def _release(self) -> None:
        if self._held:
            self.out.write("".join(self._held))
        self._held = None

    def result(self, key: str, **fields: Any) -> None:
        """The outcome of a fault, after its stages (untimed)."""
        self._release()
        if not self.quiet:
            self.out.write(f"  => {text(key, self.lang, **fields)}\n")
            self.out.flush()

    def plain(self, key: str, **fields: Any) -> None:
        if not self.quiet:
            self.out.write(text(key, self.lang, **fields) + "\n")
            self.out.flush()

    def heading(self, key: str, **fields: Any) -> None:
        self._release()
        self.t0 = None
        if not self.quiet:
            self.out.write("\n== " + text(key, self.lang, **fields) + " ==\n")
            self.out.flush()

    def i18n(self, value: Mapping[str, Any] | str | None) -> str:
        """The language's side of an {"en": ..., "zh": ...} text."""
        if isinstance(value, Mapping):
            return str(value.get(self.lang) or value.get("en") or "")
        return str(value or "")
