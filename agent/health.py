"""Readiness and the pre-flight check: what an agent needs to be useful, and what is off and why.

Two callers, one list of checks:

- `/readyz` (agent/run.py wires `readiness(agent)` into the API): 503 with the reasons while a
  required dependency is down. Required: the Kafka broker answering (bus.kind=kafka) and, for a
  role that has sources (node, cluster, all), at least one source running (a watcher, or the API's
  Alertmanager receiver where it can take alerts): an agent that watches nothing must not look
  ready. `trainmedic_ready` (a gauge, 1 or 0) follows the same answer at
  every check, so an alert needs no probe.
- `trainmedic run --check` (`preflight`): every source and capability of the role with on / off
  and the reason, the Kubernetes API read once with the agent's credentials, the brokers reached
  over TCP, and the checkpoint directories the responder
  reads (`remediate.checkpoint_path_map`, or the checkpoint reader pod: remediations/checkpoint_reader.py):
  a restart from checkpoint needs one or the other. A problem
  that makes the agent useless (no broker, nothing to watch, a mapped checkpoint directory that
  is not there) exits non-zero with the reason in English and Chinese.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from trainmedic.agent.config import Role, Settings

if TYPE_CHECKING:
    from trainmedic.agent.run import Agent

# Components that watch something (an agent with none of these sees nothing).
SOURCES = frozenset({"kubernetes", "pod-logs", "container-logs", "kernel", "nvml", "prometheus"})
ROLE_HAS_SOURCES = frozenset({Role.NODE, Role.CLUSTER, Role.ALL})

# What each component gives the user, for the `--check` listing (en, zh).
CAPABILITIES: dict[str, tuple[str, str]] = {
    "kubernetes": ("pods, events, nodes and workloads", "Pod、事件、节点与训练作业"),
    "pod-logs": ("training pods' logs through the API", "经 API 跟随训练 Pod 日志"),
    "container-logs": ("container logs on this node", "本节点容器日志"),
    "kernel": ("kernel messages (Xid, driver errors)", "内核日志（Xid、驱动错误）"),
    "nvml": ("NVIDIA device metrics (NVML)", "NVIDIA 设备指标（NVML）"),
    "prometheus": ("accelerator metrics from Prometheus", "来自 Prometheus 的加速卡指标"),
    "brain": ("detection and diagnosis", "检测与诊断"),
    "responder": ("evidence, policy and self-healing", "现场保存、策略与自愈"),
    "notifier": ("notifications (chat, webhooks)", "通知（IM、Webhook）"),
    "api": ("HTTP API, probes and /metrics", "HTTP API、探针与 /metrics"),
    "api-incidents": ("incidents over the API", "通过 API 查询事件"),
    "api-reports": ("reports over the API", "通过 API 获取报告"),
    "node-conditions": ("Node conditions and Events for node faults", "节点故障写入 Node 状况与事件"),
}

Level = Literal["ok", "off", "fail"]


@dataclass(frozen=True)
class Check:
    """One line of `run --check`: a component, a broker or a mount; `fail` makes the check exit 1."""

    name: str
    level: Level
    en: str
    zh: str

    def line(self) -> str:
        mark = {"ok": "ok  ", "off": "off ", "fail": "FAIL"}[self.level]
        return f"{mark} {self.name:<16} {self.en}\n     {'':<16} {self.zh}"


def bootstrap_hosts(bootstrap: str) -> list[tuple[str, int]]:
    """`host:port,host:port` (IPv6 in brackets) as pairs; a missing port is Kafka's 9092."""
    out = []
    for part in (p.strip() for p in bootstrap.split(",")):
        if not part:
            continue
        if part.startswith("["):
            host, _, rest = part[1:].partition("]")
            port = rest.lstrip(":")
        else:
            host, sep, port = part.rpartition(":")
            if not sep:
                host, port = part, ""
        out.append((host, int(port) if port.isdigit() else 9092))
    return out


def tcp_reachable(host: str, port: int, timeout: float = 3.0) -> str | None:
    """None when a TCP connection opens; else why not (one line)."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return None
    except OSError as e:
        return e.strerror or type(e).__name__


def sources_running(components: Sequence[str], settings: Settings | None = None) -> list[str]:
    """The inputs among `components`; the API counts as one where its Alertmanager receiver can take
    alerts (a token is configured, or unauthenticated calls are allowed on purpose)."""
    found = set(SOURCES.intersection(components))
    if settings is not None and "api" in components:
        a = settings.api
        if a.token is not None or a.token_env or a.token_file or a.allow_unauthenticated:
            found.add("api")
    return sorted(found)


def not_ready_reasons(agent: Agent) -> list[tuple[str, str]]:
    """Why a running agent is not ready (en, zh); empty when it is."""
    reasons: list[tuple[str, str]] = []
    if not agent.started.is_set():
        reasons.append(("the agent is starting", "代理正在启动"))
    if agent.stop.is_set():
        reasons.append(("the agent is stopping", "代理正在停止"))
    connected = getattr(agent.bus, "connected", True)
    if not connected:
        bootstrap = agent.settings.bus.bootstrap
        reasons.append(
            (f"the Kafka broker {bootstrap} is unreachable", f"Kafka 服务 {bootstrap} 无法连接"),
        )
    if agent.role in ROLE_HAS_SOURCES and not sources_running(list(agent.components), agent.settings):
        reasons.append(
            (
                "every source is off (see `disabled`): the agent watches nothing",
                "所有数据源均已关闭（见 disabled）：代理没有监视任何内容",
            )
        )
    if agent.brain is not None and not agent.brain.ready.is_set():
        reasons.append(("the brain has not joined its consumer group yet", "诊断组件尚未加入消费组"))
    responder = agent.responder
    if responder is not None and hasattr(responder, "ready") and not responder.ready.is_set():
        reasons.append(("the responder has not started yet", "自愈组件尚未启动"))
    return reasons


def readiness(agent: Agent) -> Callable[[], tuple[bool, dict[str, Any]]]:
    """The API's readiness callback for `agent`; it also sets the `trainmedic_ready` gauge."""

    def ready() -> tuple[bool, dict[str, Any]]:
        reasons = not_ready_reasons(agent)
        agent.telemetry.ready.set(0 if reasons else 1)
        return not reasons, {
            "role": agent.role.value,
            "components": sorted(agent.components),
            "disabled": dict(agent.disabled),
            "waiting": [en for en, _ in reasons],
            "waiting_zh": [zh for _, zh in reasons],
        }

    return ready


def kube_check(api: Any, role: Role, timeout: float = 3.0) -> Check:
    """One read the role's ServiceAccount may make (the brain: nodes; the others: pods), to prove the
    API server answers and the credentials work before the watchers depend on them."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    core = client.CoreV1Api(api)
    what = "nodes" if role is Role.BRAIN else "pods"
    try:
        resp: Any
        if role is Role.BRAIN:
            resp = core.list_node(limit=1, _request_timeout=timeout, _preload_content=False)
        else:
            resp = core.list_pod_for_all_namespaces(limit=1, _request_timeout=timeout, _preload_content=False)
        resp.release_conn()
    except ApiException as e:
        if e.status in (401, 403):
            return Check(
                "kubernetes-api",
                "fail",
                f"the API server refuses to list {what} ({e.status} {e.reason}): check the ServiceAccount and its RBAC",
                f"API 服务器拒绝列出 {what}（{e.status} {e.reason}）：请检查 ServiceAccount 及其 RBAC 权限",
            )
        return Check(
            "kubernetes-api",
            "fail",
            f"the API server answered {e.status} {e.reason} to a list of {what}",
            f"API 服务器对 {what} 列表请求返回 {e.status} {e.reason}",
        )
    except Exception as e:  # noqa: BLE001 (connection refused, DNS, TLS, timeout: each is "unreachable")
        why = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
        return Check(
            "kubernetes-api",
            "fail",
            f"the API server is unreachable ({why})",
            f"无法连接 API 服务器（{why}）",
        )
    return Check("kubernetes-api", "ok", f"API server reachable, {what} readable", f"API 服务器可连接，可读取 {what}")


def preflight(
    settings: Settings,
    role: Role,
    *,
    agent: Agent | None = None,
    api_client: Any = None,
    timeout: float = 3.0,
) -> list[Check]:
    """Every check of `run --check` for `role`. `agent` (built without starting) and `api_client`
    (the Kubernetes client; default: from the settings, as the agent makes it) may be given."""
    from trainmedic.agent.run import SourceUnavailableError, _kube_api_client, build_agent

    if agent is None:
        agent = build_agent(settings, role, api_client=api_client)
    checks: list[Check] = []
    for name in sorted(set(agent.components) | set(agent.disabled)):
        en, zh = CAPABILITIES.get(name, (name, name))
        if name in agent.disabled:
            why = agent.disabled[name]
            checks.append(Check(name, "off", f"off: {en}: {why}", f"已关闭：{zh}：{why}"))
        else:
            checks.append(Check(name, "ok", f"on: {en}", f"已开启：{zh}"))
    if role in ROLE_HAS_SOURCES and not sources_running(list(agent.components), settings):
        checks.append(
            Check(
                "sources",
                "fail",
                "every source is off: the agent would watch nothing (see the reasons above)",
                "所有数据源均已关闭：代理将无法监视任何内容（原因见上）",
            )
        )
    if settings.bus.kind == "kafka":
        for host, port in bootstrap_hosts(settings.bus.bootstrap):
            unreachable = tcp_reachable(host, port, timeout)
            if unreachable is None:
                checks.append(Check(f"kafka {host}:{port}", "ok", "broker reachable", "Kafka 可连接"))
            else:
                checks.append(
                    Check(
                        f"kafka {host}:{port}",
                        "fail",
                        f"broker unreachable ({unreachable}): check bus.bootstrap and the network policy",
                        f"Kafka 无法连接（{unreachable}）：请检查 bus.bootstrap 与网络策略",
                    )
                )
    if settings.kubernetes.enabled and "kubernetes" not in agent.disabled:
        own = api_client is None
        try:
            api = api_client if api_client is not None else _kube_api_client(settings)
        except SourceUnavailableError as e:
            checks.append(Check("kubernetes-api", "fail", str(e), f"无法加载 Kubernetes 配置：{e}"))
        else:
            checks.append(kube_check(api, role, timeout))
            if own:
                api.close()
    if role in (Role.BRAIN, Role.ALL) and "responder" in agent.components:
        checks.extend(checkpoint_checks(settings))
    _close(agent)
    return checks


def checkpoint_checks(settings: Settings) -> list[Check]:
    """The responder restarts jobs from the checkpoints it can read: each mapped directory must be there."""
    r = settings.remediate
    mapping = r.checkpoint_path_map
    reader = r.checkpoint_reader != "off" and bool(r.checkpoint_reader_image)
    out = []
    if reader:
        out.append(
            Check(
                "checkpoint reader",
                "ok",
                f"a reader pod ({r.checkpoint_reader_image}) lists a job's checkpoints"
                + (" where the directory is not visible here" if r.checkpoint_reader == "auto" else ""),
                f"由读取 Pod（{r.checkpoint_reader_image}）列出作业的检查点"
                + ("（当本容器内看不到该目录时）" if r.checkpoint_reader == "auto" else ""),
            )
        )
    elif r.checkpoint_reader == "pod":
        out.append(
            Check(
                "checkpoint reader",
                "off",
                f"remediate.checkpoint_reader is {r.checkpoint_reader} but remediate.checkpoint_reader_image is "
                "not set: no reader pod",
                f"remediate.checkpoint_reader 为 {r.checkpoint_reader}，"
                "但未设置 remediate.checkpoint_reader_image：不会启动读取 Pod",
            )
        )
    if not mapping and not reader:
        out.append(
            Check(
                "checkpoints",
                "off",
                "remediate.checkpoint_path_map is empty and no checkpoint reader pod: a job is restarted from a "
                "checkpoint only when its directory is readable here at the path the job declares",
                "remediate.checkpoint_path_map 为空且没有检查点读取 Pod："
                "仅当作业声明的检查点目录在本容器内同路径可读时，才能从检查点恢复",
            )
        )
    for declared, local in sorted(mapping.items()):
        if Path(local).is_dir():
            out.append(Check(f"checkpoints {local}", "ok", f"mounted ({declared})", f"已挂载（{declared}）"))
        else:
            out.append(
                Check(
                    f"checkpoints {local}",
                    "fail",
                    f"{local} (for {declared}) is not a directory here: mount the checkpoint volume into the agent",
                    f"{local}（对应 {declared}）在本容器内不存在：请将检查点存储挂载到代理",
                )
            )
    return out


def _close(agent: Agent) -> None:
    """Release what building the agent opened (stores, clients): `--check` starts nothing."""
    if agent.responder is not None:
        agent.responder.close()
        return
    state = getattr(getattr(agent.api_app, "state", None), "trainmedic", None)
    store = getattr(state, "store", None)
    if store is not None:
        store.close()
