"""The sinks of incident notifications: each receiver's message (CloudEvents, Alertmanager, Feishu /
DingTalk / WeCom / Slack robots), how its answer is read (`Outcome`: delivered, retry or dead), the
dedup key and headers, and the sinks' secrets.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from trainmedic.agent.config import SinkSettings
from trainmedic.backoff import backoff_delay as shared_backoff_delay
from trainmedic.backoff import parse_retry_after
from trainmedic.errors import PermanentError, TemporaryError
from trainmedic.reports import payloads
from trainmedic.reports.notice import Notice

DEDUP_HEADER = "X-Trainmedic-Dedup-Key"
DEDUP_COUNT_HEADER = "X-Trainmedic-Dedup-Count"
AFFECTED_NODES_HEADER = "X-Trainmedic-Affected-Nodes"
AFFECTED_JOBS_HEADER = "X-Trainmedic-Affected-Jobs"
USER_AGENT = "trainmedic-notifier/1"
# The most of a receiver's answer that is read (its error text is recorded, cut).
MAX_RESPONSE_BYTES = 64 << 10

# Chat robots answer HTTP 200 (Feishu also 400) with an error code in the JSON body. These codes
# are rate limits or "system busy", worth retrying; any other non-zero code is permanent.
# Feishu custom bot: 11232 frequency limit of the message service (100/min, 5/s per bot), 230020
# per-chat rate limit, 99991400 the open platform's request frequency limit.
FEISHU_RETRY_CODES = frozenset({11232, 230020, 99991400})
# DingTalk custom robot: -1 system busy, 130101 "send too fast, exceed 20 times per minute",
# 90002 / 90018 the platform's frequency limits.
DINGTALK_RETRY_CODES = frozenset({-1, 130101, 90002, 90018})
# WeCom group robot: -1 system busy, 45009 "api freq out of limit" (20 messages a minute per robot),
# 45033 too many concurrent calls.
WECOM_RETRY_CODES = frozenset({-1, 45009, 45033})


class NotifyError(PermanentError):
    """The notifier cannot be built as configured (a missing secret)."""


# -- one request and what became of it --------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    """What one delivery attempt came to."""

    result: Literal["delivered", "retry", "dead"]
    http: int | None = None
    error: str | None = None
    # Seconds the receiver asked us to wait (Retry-After), when it did.
    retry_after: float | None = None

    def as_error(self) -> DeliveryFailed | DeliveryRefused | None:
        """What a failed delivery means, in trainmedic.errors' one tree (None: delivered): the
        notifier acts on that, as every other layer does."""
        if self.result == "delivered":
            return None
        message = self.error or (f"HTTP {self.http}" if self.http is not None else "delivery failed")
        if self.result == "dead":
            return DeliveryRefused(message, http=self.http)
        return DeliveryFailed(message, delay=self.retry_after, http=self.http)


class DeliveryFailed(TemporaryError):
    """A delivery worth trying again (429, 5xx, a timeout, a robot's rate-limit code), after `delay`
    when the receiver named one (Retry-After), else after the sink's backoff."""

    def __init__(self, message: str, *, delay: float | None = None, http: int | None = None) -> None:
        super().__init__(message, delay=delay)
        self.http = http


class DeliveryRefused(PermanentError):
    """The receiver refused the notice for good (any other 4xx, a robot's other codes): it is dead."""

    def __init__(self, message: str, *, http: int | None = None) -> None:
        super().__init__(message)
        self.http = http


@dataclass
class Message:
    """One HTTP request carrying 1..N notices."""

    url: str
    body: bytes
    headers: dict[str, str]
    count: int


def dedup_key_of(notices: Sequence[Notice]) -> str:
    """The dedup key a message carries: the notice's own, or one derived from a digest's members
    (the same digest retried carries the same key)."""
    if len(notices) == 1:
        return notices[0].dedup_key
    digest = hashlib.sha256("\n".join(sorted(n.dedup_key for n in notices)).encode()).hexdigest()
    return f"digest:{digest[:32]}"


def backoff_delay(failures: int, *, initial: float, maximum: float, rng: random.Random) -> float:
    """Exponential backoff with full jitter: uniform(0, min(maximum, initial * 2**(failures-1)))."""
    return shared_backoff_delay(failures - 1, base=initial, cap=maximum, jitter=(0.0, 1.0), rng=rng)


# -- sinks: what to send, and how to read the answer ------------------------------------------------


class Sink:
    """How one kind of receiver is addressed, what it gets, and what its answers mean."""

    kind: ClassVar[str] = ""
    content_type: ClassVar[str] = "application/json; charset=utf-8"
    # Every message carries everything pending (the receiver groups by itself).
    batches_always: ClassVar[bool] = False
    # The latest state of incidents still firing is sent again every `resend_s` (Alertmanager ends an
    # alert that is not repeated within its resolve_timeout).
    resends: ClassVar[bool] = False

    def __init__(self, settings: SinkSettings, *, secret: str | None, source: str) -> None:
        self.settings = settings
        self.name = settings.sink_name
        self.secret = secret
        self.source = source
        self.statuses = settings.effective_statuses
        self.burst = settings.effective_burst
        self.window_s = settings.window_s
        self.max_batch = settings.max_batch
        self.timeout_s = settings.timeout_s
        self.resend_s = settings.resend_s if self.resends else 0.0
        self.resend_for_s = settings.resend_for_s

    def payload(self, notices: Sequence[Notice], *, now: float) -> Any:
        raise NotImplementedError

    def url(self, *, now: float) -> str:
        return self.settings.url

    def extra_headers(self, body: bytes, *, now: float) -> dict[str, str]:
        return {}

    def build(self, notices: Sequence[Notice], *, now: float) -> Message:
        body = payloads.encode_body(self.payload(notices, now=now))
        headers = {
            "Content-Type": self.content_type,
            "User-Agent": USER_AGENT,
            DEDUP_HEADER: dedup_key_of(notices),
            DEDUP_COUNT_HEADER: str(len(notices)),
        }
        if len(notices) > 1:
            # A digest says how wide the outage is, whatever its format.
            headers[AFFECTED_NODES_HEADER] = str(len({n.node for n in notices if n.node}))
            headers[AFFECTED_JOBS_HEADER] = str(len({(n.namespace, n.job) for n in notices if n.job}))
        headers.update({k: v.get_secret_value() for k, v in self.settings.headers.items()})
        headers.update(self.extra_headers(body, now=now))
        return Message(url=self.url(now=now), body=body, headers=headers, count=len(notices))

    def classify(self, status: int, body: bytes, headers: Mapping[str, str], *, now: float) -> Outcome:
        """An HTTP answer as an outcome (subclasses read chat robots' error codes)."""
        retry_after = parse_retry_after(headers.get("retry-after"), now=now)
        if 200 <= status < 300:
            return Outcome("delivered", status)
        error = f"HTTP {status}: {_snippet(body)}".rstrip(": ")
        if status in (408, 429) or status >= 500:
            return Outcome("retry", status, error, retry_after)
        return Outcome("dead", status, error)


class CloudEventsSink(Sink):
    kind = "cloudevents"
    content_type = payloads.CLOUDEVENT_CONTENT_TYPE

    def build(self, notices: Sequence[Notice], *, now: float) -> Message:
        msg = super().build(notices, now=now)
        if len(notices) > 1:
            msg.headers["Content-Type"] = payloads.CLOUDEVENTS_BATCH_CONTENT_TYPE
        return msg

    def payload(self, notices: Sequence[Notice], *, now: float) -> Any:
        if len(notices) == 1:
            return payloads.cloudevent(notices[0], source=self.source)
        return payloads.cloudevents_batch(notices, source=self.source)

    def extra_headers(self, body: bytes, *, now: float) -> dict[str, str]:
        if not self.secret:
            return {}
        return payloads.signature_headers(self.secret.encode(), body, timestamp=int(now))


class AlertmanagerSink(Sink):
    kind = "alertmanager"
    batches_always = True
    resends = True

    def url(self, *, now: float) -> str:
        base = self.settings.url.rstrip("/")
        return base if base.endswith("/api/v2/alerts") else base + "/api/v2/alerts"

    def payload(self, notices: Sequence[Notice], *, now: float) -> Any:
        return payloads.alertmanager_alerts(notices, now=now)


class _ChatSink(Sink):
    # The JSON body fields holding the robot's result code, and the codes worth retrying.
    code_fields: ClassVar[tuple[str, ...]] = ("errcode",)
    retry_codes: ClassVar[frozenset[int]] = frozenset()

    def classify(self, status: int, body: bytes, headers: Mapping[str, str], *, now: float) -> Outcome:
        code, message = _robot_code(body, self.code_fields)
        if code is not None and code != 0 and (200 <= status < 300 or 400 <= status < 500):
            error = f"HTTP {status}, code {code}: {message or '-'}"
            if code in self.retry_codes:
                return Outcome("retry", status, error, parse_retry_after(headers.get("retry-after"), now=now))
            return Outcome("dead", status, error)
        return super().classify(status, body, headers, now=now)


class FeishuSink(_ChatSink):
    kind = "feishu"
    code_fields = ("code", "StatusCode")
    retry_codes = FEISHU_RETRY_CODES

    def payload(self, notices: Sequence[Notice], *, now: float) -> Any:
        return payloads.feishu_message(notices, lang=self.settings.lang, secret=self.secret, timestamp=int(now))


class DingTalkSink(_ChatSink):
    kind = "dingtalk"
    retry_codes = DINGTALK_RETRY_CODES

    def url(self, *, now: float) -> str:
        if not self.secret:
            return self.settings.url
        return payloads.dingtalk_signed_url(self.settings.url, self.secret, int(now * 1000))

    def payload(self, notices: Sequence[Notice], *, now: float) -> Any:
        return payloads.dingtalk_message(notices, lang=self.settings.lang)


class WeComSink(_ChatSink):
    kind = "wecom"
    retry_codes = WECOM_RETRY_CODES

    def payload(self, notices: Sequence[Notice], *, now: float) -> Any:
        return payloads.wecom_message(notices, lang=self.settings.lang)


class SlackSink(Sink):
    # Slack's incoming webhooks use plain HTTP statuses (400 invalid_payload, 404 channel_not_found,
    # 429 with Retry-After), so the base classification applies.
    kind = "slack"

    def payload(self, notices: Sequence[Notice], *, now: float) -> Any:
        return payloads.slack_message(notices, lang=self.settings.lang)


SINK_TYPES: dict[str, type[Sink]] = {
    t.kind: t for t in (CloudEventsSink, AlertmanagerSink, FeishuSink, DingTalkSink, WeComSink, SlackSink)
}


def _robot_code(body: bytes, fields: Sequence[str]) -> tuple[int | None, str | None]:
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None, None
    if not isinstance(data, dict):
        return None, None
    for name in fields:
        value = data.get(name)
        if isinstance(value, int) and not isinstance(value, bool):
            msg = data.get("msg") or data.get("errmsg") or data.get("StatusMessage")
            return value, _snippet(str(msg).encode()) if msg is not None else None
    return None, None


def _snippet(body: bytes, limit: int = 300) -> str:
    text = body[: limit * 4].decode("utf-8", "replace").strip().replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def resolve_secret(settings: SinkSettings, env: Mapping[str, str] | None = None) -> str | None:
    """The sink's signing secret from `secret` or the variable named by `secret_env`."""
    if settings.secret is not None:
        return settings.secret.get_secret_value() or None
    if settings.secret_env:
        value = (os.environ if env is None else env).get(settings.secret_env)
        if not value:
            raise NotifyError(
                f"notify sink {settings.sink_name}: environment variable {settings.secret_env} (secret_env) is not set"
            )
        return value
    return None
