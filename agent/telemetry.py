"""The agent's own metrics (served on /metrics by the API) and structured log helpers.

One `Telemetry` object per agent process, passed to the components that count things; each owns a
private CollectorRegistry, so two agents in one test process never share counters.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

log = logging.getLogger("trainmedic")


class Telemetry:
    def __init__(self) -> None:
        # Gauges read from their owner at each scrape (the in-process bus's backlog).
        self.refreshers: list[Callable[[], None]] = []
        r = self.registry = CollectorRegistry()
        self.events_in = Counter("trainmedic_events_in", "Events consumed from the bus", ["topic"], registry=r)
        self.events_out = Counter("trainmedic_events_out", "Events published to the bus", ["topic"], registry=r)
        self.dlq = Counter("trainmedic_dlq", "Messages set aside on trainmedic.dlq", ["reason"], registry=r)
        self.producer_buffered = Gauge(
            "trainmedic_producer_buffered", "Events waiting in the producer buffer (broker unreachable)", registry=r
        )
        self.producer_dropped = Counter(
            "trainmedic_producer_dropped", "Events dropped because the producer buffer was full", ["topic"], registry=r
        )
        self.producer_retries = Counter("trainmedic_producer_retries", "Producer send retries", registry=r)
        self.consumer_lag = Gauge("trainmedic_consumer_lag", "Unread records in owned partitions", registry=r)
        self.lines_in = Counter("trainmedic_lines_in", "Log and kernel lines scanned", ["source"], registry=r)
        self.findings = Counter("trainmedic_findings", "Findings by fault class", ["fault_class"], registry=r)
        self.diagnoses = Counter(
            "trainmedic_diagnoses", "Diagnoses published by fault class", ["fault_class"], registry=r
        )
        self.watch_errors = Counter(
            "trainmedic_watch_errors", "Watcher errors (API, file, scrape) by source", ["source", "kind"], registry=r
        )
        self.watch_relists = Counter(
            "trainmedic_watch_relists", "Kubernetes relists (410 Gone)", ["resource"], registry=r
        )
        self.fault_to_diagnosis = Histogram(
            "trainmedic_fault_to_diagnosis_seconds",
            "From the observation of the first fault line to its diagnosis published",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=r,
        )
        self.api_requests = Counter(
            "trainmedic_api_requests",
            "API requests by route template and status code",
            ["method", "route", "code"],
            registry=r,
        )
        self.actions = Counter(
            "trainmedic_actions",
            "Remediation action attempts by action and outcome (done, failed, retry)",
            ["name", "state"],
            registry=r,
        )
        self.alerts_in = Counter(
            "trainmedic_alerts_in", "Alerts received from Alertmanager webhooks by alert status", ["status"], registry=r
        )

        # Incident notifications (agent/notify.py). outcome: queued, duplicate, enqueue_failed, delivered,
        # retried, dead, resent (Alertmanager alerts still firing).
        self.notifications = Counter(
            "trainmedic_notifications", "Incident notifications by sink and outcome", ["sink", "outcome"], registry=r
        )
        # Notices a sink failed to deliver for good (reason: refused, gave_up), each paged through the
        # other sinks: a sink that needs fixing, and incidents someone may not have seen there.
        self.notify_sink_failed = Counter(
            "trainmedic_notify_sink_failed",
            "Notices a sink failed to deliver for good, by sink and reason (refused, gave_up)",
            ["sink", "reason"],
            registry=r,
        )
        self.webhook_failures = Counter(
            "trainmedic_webhook_failures", "Failed webhook requests by sink", ["sink"], registry=r
        )
        self.bus_backlog_records = Gauge(
            "trainmedic_bus_backlog_records",
            "In-process bus: records held per topic (unread or uncommitted)",
            ["topic"],
            registry=r,
        )
        self.bus_backlog_bytes = Gauge(
            "trainmedic_bus_backlog_bytes",
            "In-process bus: bytes held per topic (unread or uncommitted)",
            ["topic"],
            registry=r,
        )
        self.bus_backpressure = Counter(
            "trainmedic_bus_backpressure", "In-process bus: publishes that waited for room", ["topic"], registry=r
        )
        # Event loop lag (agent/looplag.py): how late a callback due now runs.
        self.loop_lag = Histogram(
            "trainmedic_event_loop_lag_seconds",
            "How late the event loop ran a timer that was due (a synchronous step held the loop)",
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=r,
        )
        self.loop_lag_last = Gauge(
            "trainmedic_event_loop_lag_last_seconds", "The event loop lag measured last", registry=r
        )
        # Entries held by each bounded in-memory structure (docs/architecture.md, "State and eviction").
        self.state_entries = Gauge(
            "trainmedic_state_entries", "Entries held in memory by kind of state", ["kind"], registry=r
        )
        self.responder_degraded = Counter(
            "trainmedic_responder_degraded",
            "Incidents the responder handled observe-only because it was over its bounds",
            registry=r,
        )
        self.ready = Gauge(
            "trainmedic_ready",
            "1 when the agent is ready (as /readyz answers), 0 while a required dependency is down",
            registry=r,
        )
        self.outbox_depth = Gauge(
            "trainmedic_outbox_depth", "Notifications waiting in the outbox (pending) by sink", ["sink"], registry=r
        )

    def exposition(self) -> bytes:
        for refresh in self.refreshers:
            refresh()
        return generate_latest(self.registry)
