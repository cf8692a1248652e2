"""Incident notifications: every incident state the responder publishes reaches every configured
sink (CloudEvents, Alertmanager, Feishu / DingTalk / WeCom / Slack robots), at least once, without
paging anyone 500 times.

    Responder._publish --> Notifier.enqueue --> outbox (SQLite, committed) --> one loop per sink --> HTTP

Durability. `enqueue` returns only after the notice is committed in the outbox (agent/outbox.py),
one row per sink, UNIQUE by the notice's dedup key: a replayed incident event is queued once. A row
is marked delivered only after its receiver said so; one that was in flight when the agent died is
sent again by the next agent (at least once), carrying the same dedup key (CloudEvent `id`, header
`X-Trainmedic-Dedup-Key`) so receivers can drop the repeat.

Failures. 2xx is delivered. 408, 429, 5xx, connection errors and timeouts are temporary: the sink
pauses with exponential backoff and full jitter (`retry_initial_s` doubling up to `retry_max_s`;
a receiver's Retry-After is honoured, capped at `retry_max_s`), and a notice still undelivered
`give_up_after_s` after it was queued is given up. Other 4xx are permanent: the notice is dead at
once. Chat robots answer HTTP 200 with an error in the body (Feishu `code`, DingTalk / WeCom
`errcode`); their rate-limit codes are temporary, the rest permanent. Every delivery and every
give-up lands in the incident's timeline (`notified`, `notify_failed`) and in telemetry. A notice one
sink will never deliver still reaches a person: every other sink gets a short "sink X failed
permanently: ..." page of it, whatever statuses that sink takes (timeline `notify_escalated`,
counter `trainmedic_notify_sink_failed_total`).

Grouping and rate limits. Each sink has a token bucket of `burst` messages per `window_s`. While
tokens last, each notice goes out alone, as soon as it is queued (a single incident reaches a local
receiver within milliseconds). When the bucket is empty the sink switches to digests: everything
pending goes out as one message (chat robots: a digest; CloudEvents: batch mode; Alertmanager:
one POST of all alerts) when the next token is due, then at most one message per window while
notices keep coming; a window with nothing to send ends the storm. A 500-node outage is a handful
of messages. Alertmanager groups alerts itself, so every POST carries everything pending; and as
it ends an alert that is not repeated within its resolve_timeout, the latest state of incidents
still firing is re-sent every `resend_s` (for `resend_for_s`), the way Prometheus repeats its alerts.

Secrets (signing secrets, robot URLs, which embed tokens, extra headers) never reach a log line,
an error record or a timeline: those name the sink, never its URL.

The parts: `sinks` (the receivers' formats: `Sink` and its kinds, the outcome of a delivery and its
errors, the dedup key, the sinks' secrets), `notifier` (`Notifier`: the outbox drained by one loop per
sink, with its token bucket, digests, retries and escalation). `build_notifier` builds one from the
settings; this package re-exports what the rest of trainmedic and its tests import.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping

from trainmedic.agent.config import ApiSettings, NotifySettings
from trainmedic.agent.notify.notifier import Notifier
from trainmedic.agent.notify.sinks import (
    DEDUP_HEADER,
    SINK_TYPES,
    DeliveryFailed,
    DeliveryRefused,
    Message,
    NotifyError,
    Outcome,
    Sink,
    backoff_delay,
    dedup_key_of,
    resolve_secret,
)
from trainmedic.agent.outbox import Outbox
from trainmedic.agent.store import IncidentStore
from trainmedic.agent.telemetry import Telemetry
from trainmedic.agent.urlsafe import install_log_filters
from trainmedic.backoff import parse_retry_after

log = logging.getLogger("trainmedic.notify")
# Webhook URLs carry credentials: no log record of httpx, httpcore or this module shows them.
install_log_filters()


def build_notifier(
    settings: NotifySettings,
    *,
    store_path: str,
    store: IncidentStore | None,
    telemetry: Telemetry,
    clock: Callable[[], float] = time.time,
    api: ApiSettings | None = None,
    env: Mapping[str, str] | None = None,
) -> Notifier | None:
    """The notifier of `trainmedic run` (None when no sink is configured or notifications are off).
    With `api.public_url`, messages link to the console's incident page and carry a signed approve
    link for plans awaiting approval.

    Raises NotifyError / OutboxError when it cannot be built (the agent logs why and goes on)."""
    if not settings.enabled or not settings.sinks:
        return None
    base = settings.report_base_url.rstrip("/") if settings.report_base_url else None

    def report_url(incident_id: str) -> str | None:
        return f"{base}/api/v1/incidents/{incident_id}/report?format=html" if base else None

    links = None
    if api is not None:
        from trainmedic.agent.api import resolve_token
        from trainmedic.agent.console.security import message_links

        links = message_links(api, token=resolve_token(api, env), env=env)
    outbox = Outbox(store_path, clock=clock)
    try:
        return Notifier(
            settings,
            outbox=outbox,
            store=store,
            telemetry=telemetry,
            clock=clock,
            report_url=report_url,
            env=env,
            incident_url=links.incident_url if links else None,
            approve_url=links.approve_url if links else None,
            reject_url=links.reject_url if links else None,
        )
    except NotifyError:
        outbox.close()
        raise


__all__ = [
    "DEDUP_HEADER",
    "SINK_TYPES",
    "DeliveryFailed",
    "DeliveryRefused",
    "Message",
    "Notifier",
    "NotifyError",
    "Outcome",
    "Sink",
    "backoff_delay",
    "build_notifier",
    "dedup_key_of",
    "parse_retry_after",
    "resolve_secret",
]
