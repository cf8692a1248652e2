"""`build_agent`: the components a role runs (sources, the brain, the responder with its notifier, the
API), each added only where it can work here.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Awaitable, Callable
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainmedic.agent.brain import Brain, BrainSettings
from trainmedic.agent.bus.base import Bus
from trainmedic.agent.config import Role, Settings
from trainmedic.agent.health import readiness
from trainmedic.agent.looplag import LoopLagMonitor
from trainmedic.agent.run.agent import Agent, SourceUnavailableError, _kube_api_client, make_bus
from trainmedic.agent.telemetry import Telemetry

if TYPE_CHECKING:
    from trainmedic.agent.responder import ResponderSettings


def build_agent(
    settings: Settings,
    role: Role,
    *,
    bus: Bus | None = None,
    telemetry: Telemetry | None = None,
    api_client: Any = None,
    prom_client: Any = None,
    clock: Callable[[], float] = time.time,
) -> Agent:
    """Assemble the components of a role. `bus`, `api_client` and `prom_client` (what answers the
    metrics watcher's Prometheus queries when `metrics.prometheus_url` is set) may be given (tests,
    the demo)."""
    telemetry = telemetry or Telemetry()
    agent = Agent(settings=settings, role=role, bus=bus or make_bus(settings, telemetry), telemetry=telemetry)
    producer = f"{role.value}/{settings.node_name}"
    # Every role shares one loop between its parts: how late it runs is measured in each.
    lag = agent.lag = LoopLagMonitor(telemetry)
    agent.components["looplag"] = lambda: lag.run(agent.stop)
    index = agent.job_index
    telemetry.refreshers.append(lambda: telemetry.state_entries.labels("job_index_pods").set(len(index)))
    node_sources = role in (Role.NODE, Role.ALL)
    cluster_sources = role in (Role.CLUSTER, Role.ALL)

    if settings.kubernetes.enabled and (node_sources or cluster_sources):
        try:
            api = api_client if api_client is not None else _kube_api_client(settings)
        except SourceUnavailableError as e:
            agent.disabled["kubernetes"] = str(e)
        else:
            _add_kube(agent, api, producer, node_only=not cluster_sources)

    if node_sources:
        _add_node_sources(agent, producer)
    if cluster_sources and settings.metrics.prometheus_url:
        from trainmedic.agent.watchers.metrics import PrometheusSource

        prom = PrometheusSource(
            settings.metrics.prometheus_url,
            bus=agent.bus,
            job_index=agent.job_index,
            telemetry=telemetry,
            producer=producer,
            interval_s=settings.metrics.interval_s,
            client=prom_client,
        )
        agent.components["prometheus"] = prom.run
    elif cluster_sources:
        agent.disabled["prometheus"] = "metrics.prometheus_url is not set"

    if role in (Role.BRAIN, Role.ALL):
        from trainmedic.detectors.hang import HangDetector

        d = settings.detect
        agent.brain = Brain(
            agent.bus,
            settings=BrainSettings(
                group=settings.bus.group,
                window_s=d.window_s,
                tick_s=d.tick_s,
                job_grace_s=d.job_grace_s,
                idle_s=d.idle_s,
            ),
            rule_dirs=d.rule_dirs,
            fast={"auto": None, "fast": True, "re": False}[d.engine],
            hang=HangDetector(settings=d.hang),
            telemetry=telemetry,
            producer=producer,
            clock=clock,
        )
        brain = agent.brain
        telemetry.refreshers.append(brain.report)
        agent.components["brain"] = lambda: brain.run(agent.stop)
        if settings.remediate.enabled and settings.kubernetes.enabled:
            _add_responder(agent, api_client, producer, clock, prom_client)
        elif not settings.remediate.enabled:
            agent.disabled["responder"] = "remediate.enabled is false"
        else:
            agent.disabled["responder"] = "kubernetes.enabled is false (the responder acts through the API)"
    # Every role serves the API: health, readiness and /metrics for its probes and scrapes; the
    # incident routes where an incident store is (the brain's).
    if settings.api.enabled:
        _add_api(agent, producer)
    else:
        agent.disabled["api"] = "api.enabled is false"
    return agent


def responder_settings(settings: Settings) -> ResponderSettings:
    """The responder's settings from the `remediate` group: every field the two share by name, the
    ones that need a type of their own converted, the consumer group derived from the bus's."""
    from trainmedic.agent.responder import ResponderSettings
    from trainmedic.remediations.policy import Mode

    r = settings.remediate
    shared = {f.name for f in fields(ResponderSettings)} & set(type(r).model_fields)
    values: dict[str, Any] = {name: getattr(r, name) for name in shared}
    values.update(
        group=f"{settings.bus.group}-responder",
        scene_dir=Path(r.scene_dir),
        body_dir=Path(r.body_dir) if r.body_dir else None,
        mode=Mode(r.mode) if r.mode else None,
        checkpoint_path_map=dict(r.checkpoint_path_map),
    )
    return ResponderSettings(**values)


def _add_responder(
    agent: Agent, api_client: Any, producer: str, clock: Callable[[], float], prom_client: Any = None
) -> None:
    """The responder: scene, policy, actions. Off (with the reason logged) when its parts cannot start."""
    from trainmedic.agent.responder import Responder
    from trainmedic.agent.store import IncidentStore, StoreError
    from trainmedic.remediations.kube import KubeOps
    from trainmedic.remediations.policy import PolicyError, load_policy
    from trainmedic.remediations.policy_state import PolicyStateError, SqlitePolicyState

    r = agent.settings.remediate
    try:
        api = api_client if api_client is not None else _kube_api_client(agent.settings)
    except SourceUnavailableError as e:
        agent.disabled["responder"] = str(e)
        return
    try:
        policy = load_policy(r.policy)
    except PolicyError as e:
        # A broken policy must not act on guesses: the responder stays off and says why.
        agent.disabled["responder"] = str(e)
        return
    try:
        store = IncidentStore(r.store)
        state = SqlitePolicyState(r.store)
    except (StoreError, PolicyStateError) as e:
        agent.disabled["responder"] = str(e)
        return
    metrics_range = None
    if agent.settings.metrics.prometheus_url:
        from trainmedic.agent.watchers.metrics import PrometheusSource

        prom = PrometheusSource(
            agent.settings.metrics.prometheus_url,
            bus=agent.bus,
            job_index=agent.job_index,
            telemetry=agent.telemetry,
            producer=producer,
            client=prom_client,
        )
        metrics_range = prom.range_query
    brain = agent.brain
    responder = Responder(
        agent.bus,
        # A connection for each incident handled at once (remediate.max_concurrent).
        KubeOps(api, pool_maxsize=r.max_concurrent),
        store,
        policy,
        state,
        settings=responder_settings(agent.settings),
        telemetry=agent.telemetry,
        kernel_tail=brain.kernel_tail if brain is not None else None,
        metrics_range=metrics_range,
        producer=producer,
        clock=clock,
        notifier=_add_notifier(agent, store, clock),
    )
    agent.responder = responder
    agent.telemetry.refreshers.append(responder.report)
    agent.components["responder"] = lambda: responder.run(agent.stop)


def _add_notifier(agent: Agent, store: Any, clock: Callable[[], float]) -> Any:
    """Incident notifications (agent/notify.py), their outbox in the incident store's file; None when
    no sink is configured or it cannot be built (the reason is logged; remediation goes on)."""
    from trainmedic.agent.notify import NotifyError, build_notifier
    from trainmedic.agent.outbox import OutboxError

    s = agent.settings
    try:
        notifier = build_notifier(
            s.notify, store_path=s.remediate.store, store=store, telemetry=agent.telemetry, clock=clock, api=s.api
        )
    except (NotifyError, OutboxError) as e:
        agent.disabled["notifier"] = str(e)
        return None
    if notifier is None:
        agent.disabled["notifier"] = "notify.sinks is empty" if s.notify.enabled else "notify.enabled is false"
        return None
    agent.notifier = notifier
    agent.components["notifier"] = lambda: notifier.run(agent.stop)
    return notifier


def _release_node(responder: Any) -> Callable[[str, str], Awaitable[bool]] | None:
    """The console's node release: the responder's KubeOps.release_node, as `trainmedic release-node
    NODE --incident ID` calls it (None without a responder: the console says how to do it by hand)."""
    kube = getattr(responder, "kube", None)
    if kube is None:
        return None

    async def release(node: str, incident_id: str) -> bool:
        released: bool = await kube.release_node(node, incident_id=incident_id)
        return released

    return release


def _add_api(agent: Agent, producer: str) -> None:
    """The HTTP API (agent/api/): the responder's incident store (or the store file, when one exists),
    alerts from Alertmanager onto the bus, readiness from the agent's state. It serves until `stop`;
    a port it cannot listen on leaves the rest of the agent running and says why."""
    from trainmedic.agent import api
    from trainmedic.agent.store import IncidentStore, StoreError

    s = agent.settings
    store = getattr(agent.responder, "store", None)
    own_store = False
    if store is None and Path(s.remediate.store).is_file():
        try:
            store = IncidentStore(s.remediate.store)
            own_store = True
        except (StoreError, OSError) as e:
            agent.disabled["api-incidents"] = f"incident store {s.remediate.store}: {e}"
    elif store is None:
        agent.disabled["api-incidents"] = f"no incident store at {s.remediate.store} (remediate.store)"

    async def ingest(events: list[Any]) -> None:
        for event in api.attach_jobs(events, agent.job_index):
            await agent.bus.publish(api.topic_of(event), event)
        await agent.bus.flush()

    ready = readiness(agent)
    # The trainmedic_ready gauge is current at every scrape, probed or not.

    def refresh_ready() -> None:
        ready()

    agent.telemetry.refreshers.append(refresh_ready)

    render = None
    if store is not None:
        try:
            from trainmedic.agent.reporting import report_context
            from trainmedic.reports.report import render_report
        except ImportError as e:
            agent.disabled["api-reports"] = f"reports are not available: {e}"
        else:
            report_store = store

            def render(incident_id: str, fmt: str, lang: str) -> str:
                return render_report(
                    report_context(report_store, incident_id),
                    fmt="html" if fmt == "html" else "md",
                    lang="zh" if lang == "zh" else "en",
                )

    app = api.create_app(
        store=store,
        telemetry=agent.telemetry,
        settings=s.api,
        ingest=ingest,
        ready=ready,
        render=render,
        rule_dirs=s.detect.rule_dirs,
        fast={"auto": None, "fast": True, "re": False}[s.detect.engine],
        producer=producer,
        release_node=_release_node(agent.responder),
    )

    agent.api_app = app

    async def run_api() -> None:
        try:
            await api.serve(app, s.api, agent.stop)
        except api.ApiBindError as e:
            agent.disabled["api"] = str(e)
            raise SourceUnavailableError(str(e)) from e
        finally:
            if own_store and agent.stop.is_set() and store is not None:
                store.close()

    agent.components["api"] = run_api


def _add_kube(agent: Agent, api: Any, producer: str, *, node_only: bool) -> None:
    from trainmedic.agent.watchers.k8s import KubeWatchers

    k = agent.settings.kubernetes
    watchers = KubeWatchers(
        api,
        bus=agent.bus,
        job_index=agent.job_index,
        telemetry=agent.telemetry,
        producer=producer,
        namespaces=k.namespaces,
        label_selector=k.label_selector,
        node_name=agent.settings.node_name if node_only else None,
        resources=("pods",) if node_only else None,
        workloads=k.workloads,
        publish_pods=not node_only,
    )
    agent.components["kubernetes"] = watchers.run
    if k.follow_pod_logs and not node_only:
        from trainmedic.agent.watchers.podlogs import PodLogFollower

        follower = PodLogFollower(
            api, bus=agent.bus, job_index=agent.job_index, telemetry=agent.telemetry, producer=producer
        )
        agent.components["pod-logs"] = follower.run


def _add_node_sources(agent: Agent, producer: str) -> None:
    s = agent.settings
    if s.logs.enabled:
        root = Path(s.logs.root)
        if root.is_dir():
            from trainmedic.agent.watchers.crilog import CriLogTailer

            tailer = CriLogTailer(
                root,
                bus=agent.bus,
                node=s.node_name,
                job_index=agent.job_index,
                telemetry=agent.telemetry,
                producer=producer,
                poll_interval=s.logs.poll_interval_s,
                read_interval=s.logs.read_interval_s,
                start_at=s.logs.start_at,
                position_store=Path(s.logs.position_store) if s.logs.position_store else None,
            )
            agent.components["container-logs"] = tailer.run
        else:
            agent.disabled["container-logs"] = f"{root} is not a directory on this host"
    else:
        agent.disabled["container-logs"] = "logs.enabled is false"
    if s.kernel.source == "off":
        agent.disabled["kernel"] = "kernel.source is off"
    else:
        from trainmedic.agent.watchers import kernel

        common: dict[str, Any] = {
            "bus": agent.bus,
            "node": s.node_name,
            "job_index": agent.job_index,
            "telemetry": agent.telemetry,
            "producer": producer,
            "position_store": s.kernel.position_store,
        }
        if s.kernel.source == "kmsg":
            if os.access(s.kernel.path, os.R_OK):
                agent.components["kernel"] = kernel.KmsgSource(path=s.kernel.path, **common).run
            else:
                agent.disabled["kernel"] = f"{s.kernel.path} is not readable (needs the host's /dev/kmsg and root)"
        elif s.kernel.source == "file":
            agent.components["kernel"] = kernel.KernelFileSource(Path(s.kernel.path), **common).run
        elif shutil.which("journalctl"):
            agent.components["kernel"] = kernel.JournaldSource(**common).run
        else:
            agent.disabled["kernel"] = "kernel.source is journald but journalctl is not installed"
    if not s.metrics.nvml:
        agent.disabled["nvml"] = "metrics.nvml is false"
    else:
        from trainmedic.agent.watchers.nvml import NvmlSource, SourceUnavailable

        try:
            nvml = NvmlSource(
                bus=agent.bus, node=s.node_name, job_index=agent.job_index, telemetry=agent.telemetry, producer=producer
            )
            nvml.check()
        except SourceUnavailable as e:
            agent.disabled["nvml"] = str(e)
        else:
            agent.components["nvml"] = nvml.run
