"""Kubernetes watchers: pods, core/v1 events, nodes and training workloads, by list + watch.

The parts:

- `errors`: the WatchError tree (with the retry semantics of each error) and `classify`;
- `objects`: accessors of the API's JSON, the watched resources (`ResourceSpec`, `resource_spec`),
  `object_key` and the client-side `LabelSelector`;
- `digest`: what an object says, reduced to what diagnosis uses (`PodDigest`, `node_status`,
  `workload_status`, `k8s_event`), and the accelerator resources of the chip plugins;
- `lines`: the canonical text lines rendered from the digests' payloads, which the rules match;
- `stream`: blocking calls (`DaemonThreadExecutor`, `CALLS`) and streams (`LineStream`) in daemon threads;
- `reflector`: `Reflector`, list + watch of one resource with resourceVersion, into a `Handler`;
- `handlers`: the handlers of pods, events, nodes and workloads, the `Publisher`, and `KubeWatchers`,
  the reflectors of one agent.

The flow, in two halves:

    API objects -> digests -> lines -> rules
        a listed or watched object (plain JSON, never the client's model classes) is reduced to a
        digest, the payload published from it is rendered by the brain as canonical lines, and
        rules/*.yaml of source pod_status / k8s_event match those lines;

    reflector -> handlers -> publisher
        a reflector lists and watches one resource, hands each object to its handler, whose cache
        of digests publishes through the publisher on `trainmedic.k8s` only what changed meaningfully.

This package re-exports the names the rest of trainmedic and its tests import from it.
"""

from trainmedic.agent.watchers.k8s.digest import (
    PodDigest,
    container_digest,
    is_accelerator_resource,
    k8s_event,
    node_status,
    pod_digest,
    workload_status,
)
from trainmedic.agent.watchers.k8s.errors import (
    MissingResource,
    PermanentWatchError,
    ResourceGone,
    TemporaryWatchError,
    classify,
)
from trainmedic.agent.watchers.k8s.handlers import KubeWatchers, Publisher, guarded
from trainmedic.agent.watchers.k8s.lines import (
    k8s_event_line,
    node_status_lines,
    node_unhealthy,
    pod_status_entries,
    pod_status_input,
    pod_status_lines,
    workload_status_lines,
)
from trainmedic.agent.watchers.k8s.objects import (
    JOBS,
    PODS,
    PYTORCH_JOBS,
    RESOURCES,
    VOLCANO_JOBS,
    LabelSelector,
    ResourceSpec,
    object_key,
)
from trainmedic.agent.watchers.k8s.reflector import Handler, Reflector, WatchSettings, watch_client
from trainmedic.agent.watchers.k8s.stream import DaemonThreadExecutor, LineStream

__all__ = [
    "JOBS",
    "PODS",
    "PYTORCH_JOBS",
    "RESOURCES",
    "VOLCANO_JOBS",
    "DaemonThreadExecutor",
    "Handler",
    "KubeWatchers",
    "LabelSelector",
    "LineStream",
    "MissingResource",
    "PermanentWatchError",
    "PodDigest",
    "Publisher",
    "Reflector",
    "ResourceGone",
    "ResourceSpec",
    "TemporaryWatchError",
    "WatchSettings",
    "classify",
    "container_digest",
    "guarded",
    "is_accelerator_resource",
    "k8s_event",
    "k8s_event_line",
    "node_status",
    "node_status_lines",
    "node_unhealthy",
    "object_key",
    "pod_digest",
    "pod_status_entries",
    "pod_status_input",
    "pod_status_lines",
    "watch_client",
    "workload_status",
    "workload_status_lines",
]
