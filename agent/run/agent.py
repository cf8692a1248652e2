"""`Agent`: the components of one `trainmedic run` process, and what they share: the bus of the
settings and the Kubernetes API client.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from trainmedic.agent.brain import Brain
from trainmedic.agent.bus.base import Bus
from trainmedic.agent.bus.memory import MemoryBus
from trainmedic.agent.config import Role, Settings
from trainmedic.agent.jobindex import JobIndex
from trainmedic.agent.looplag import LoopLagMonitor
from trainmedic.agent.telemetry import Telemetry


class SourceUnavailableError(Exception):
    """A source cannot run on this host (its reason is logged once; the agent goes on without it)."""


@dataclass
class Agent:
    """The components of one process, built from settings for a role."""

    settings: Settings
    role: Role
    bus: Bus
    telemetry: Telemetry
    job_index: JobIndex = field(default_factory=JobIndex)
    components: dict[str, Callable[[], Awaitable[None]]] = field(default_factory=dict)
    disabled: dict[str, str] = field(default_factory=dict)
    brain: Brain | None = None
    responder: Any = None  # agent.responder.Responder when remediation is on (brain / all roles)
    api_app: Any = None  # the FastAPI app when the API is on (its `state.server` once it listens)
    notifier: Any = None  # agent.notify.Notifier when notify.sinks are configured (with the responder)
    lag: LoopLagMonitor | None = None  # trainmedic_event_loop_lag_seconds, in every role
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    started: asyncio.Event = field(default_factory=asyncio.Event)


def make_bus(settings: Settings, telemetry: Telemetry) -> Bus:
    if settings.bus.kind == "memory":
        b = settings.bus
        return MemoryBus(
            partitions=b.partitions,
            max_backlog=b.memory_max_records,
            max_backlog_bytes=b.memory_max_bytes,
            telemetry=telemetry,
            # In one process a crash takes the bus with it: nothing read is held for a replay.
            replays=False,
        )
    from trainmedic.agent.bus.kafka import KafkaBus

    b = settings.bus
    return KafkaBus(
        b.bootstrap,
        client_id=f"{b.client_id}-{settings.node_name}",
        partitions=b.partitions,
        compression=None if b.compression == "none" else b.compression,
        linger_ms=b.linger_ms,
        buffer_max=b.buffer_max,
        fetch_max_wait_ms=b.fetch_max_wait_ms,
        telemetry=telemetry,
    )


def _kube_api_client(settings: Settings) -> Any:
    """A kubernetes ApiClient from the kubeconfig setting, in-cluster config, or ~/.kube/config."""
    from kubernetes import client
    from kubernetes import config as kube_config

    config: Any = kube_config  # the client's loaders are untyped
    cfg = client.Configuration()
    if settings.kubernetes.kubeconfig:
        config.load_kube_config(config_file=settings.kubernetes.kubeconfig, client_configuration=cfg)
    else:
        try:
            config.load_incluster_config(client_configuration=cfg)
        except config.ConfigException:
            try:
                config.load_kube_config(client_configuration=cfg)
            except (config.ConfigException, OSError) as e:
                raise SourceUnavailableError(f"no Kubernetes configuration: {e}") from e
    return client.ApiClient(cfg)
