"""What each ops sink receives for one or more notices: built as dicts, never as JSON text.

Pure functions over `Notice` (reports/notice.py): no clock (times are arguments), no I/O. The
outbox (agent/outbox.py) sends them; whatever it sends, it encodes once with `encode_body` and
signs exactly those bytes.

* CloudEvents 1.0, structured content mode (`application/cloudevents+json`), one event per notice,
  or the JSON batch format (`application/cloudevents-batch+json`) for several. `id` is the
  notice's dedup key (`<incident>/<status>`), so a receiver drops the duplicates that
  at-least-once delivery can produce by (`source`, `id`), as the spec asks of consumers.
* The signature: HMAC-SHA256 with a shared secret over ``f"{timestamp}."`` + body, sent as
  ``X-Trainmedic-Signature: v1=<hex>`` with ``X-Trainmedic-Timestamp: <unix seconds>``. The
  timestamp is inside the MAC, so a captured request cannot be replayed later than the receiver's
  window (300 s by default) and the body cannot be changed; inside the window, replays are the
  duplicates the CloudEvent `id` already removes. Several comma-separated ``v1=`` values are
  accepted (secret rotation). A receiver needs no trainmedic code to check it:

```python
import hashlib
import hmac
import time


def verify(secret: bytes, headers: dict[str, str], body: bytes, tolerance_s: float = 300) -> bool:
    ts = headers.get("X-Trainmedic-Timestamp", "")
    sig = headers.get("X-Trainmedic-Signature", "")
    if not ts.isdigit() or abs(time.time() - int(ts)) > tolerance_s:
        return False  # missing, malformed or outside the replay window
    mac = hmac.new(secret, ts.encode() + b"." + body, hashlib.sha256).hexdigest()
    return any(hmac.compare_digest("v1=" + mac, s.strip()) for s in sig.split(","))
```

* Alertmanager `POST /api/v2/alerts` (postableAlerts): one alert per incident. Its labels identify
  the alert, so they never change over the incident's life (the `severity` label is the fault's
  own, `Notice.base_severity`); status and texts are annotations. A resolved or rejected incident
  is sent with `endsAt`; a firing one without, and Alertmanager ends it after its
  `resolve_timeout` unless it is sent again.
* Chat robots (Feishu / Lark, DingTalk, WeCom, Slack): one message for 1..N notices; N > 1 is a
  digest (counts by severity, fault class and status, the first `DIGEST_ITEMS` incidents, then
  "... and M more"), which is how a 500-node outage stays a handful of messages. `lang` is "en",
  "zh" or "both". Every message carries the word "trainmedic", so a robot's keyword security can
  use it. Each robot's size limit is met by cutting the longest field with a marker, never by
  cutting a JSON document or a UTF-8 character in half. Log-derived text cannot mention or ping
  anyone (`<@user>`, `<at id=all>`, `<!channel>` are defused); other Markdown in it is kept.
  Where the notice has them (`api.public_url`, docs/console.md), a message links to the incident's
  console page and, for a plan awaiting approval, to its signed approve link; both sit on the
  reference line, which stays whole when the other lines are cut to fit.

The parts: `cloudevents` (CloudEvents, the body's encoding and its signature), `alertmanager` (alerts
of Alertmanager's API), `chat` (the text of a chat message: one notice, or a digest of many, within a
robot's size limits), `robots` (Feishu, DingTalk, WeCom and Slack messages and their signatures).
This package re-exports what the rest of trainmedic and its tests import.
"""

from trainmedic.reports.payloads.alertmanager import alertmanager_alerts
from trainmedic.reports.payloads.chat import _L as _L
from trainmedic.reports.payloads.chat import (
    DIGEST_ITEMS,
    DINGTALK_MAX_BYTES,
    FEISHU_MAX_BYTES,
    SLACK_HEADER_MAX_CHARS,
    SLACK_SECTION_MAX_CHARS,
    WECOM_MAX_BYTES,
    notice_text,
)
from trainmedic.reports.payloads.cloudevents import (
    CLOUDEVENT_CONTENT_TYPE,
    CLOUDEVENTS_BATCH_CONTENT_TYPE,
    LANGS,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    cloudevent,
    cloudevents_batch,
    encode_body,
    sign,
    signature_headers,
    verify,
)
from trainmedic.reports.payloads.robots import (
    dingtalk_message,
    dingtalk_sign,
    dingtalk_signed_url,
    feishu_message,
    feishu_sign,
    slack_message,
    wecom_message,
)

__all__ = [
    "CLOUDEVENTS_BATCH_CONTENT_TYPE",
    "CLOUDEVENT_CONTENT_TYPE",
    "DIGEST_ITEMS",
    "DINGTALK_MAX_BYTES",
    "FEISHU_MAX_BYTES",
    "LANGS",
    "SIGNATURE_HEADER",
    "SLACK_HEADER_MAX_CHARS",
    "SLACK_SECTION_MAX_CHARS",
    "TIMESTAMP_HEADER",
    "WECOM_MAX_BYTES",
    "alertmanager_alerts",
    "cloudevent",
    "cloudevents_batch",
    "dingtalk_message",
    "dingtalk_sign",
    "dingtalk_signed_url",
    "encode_body",
    "feishu_message",
    "feishu_sign",
    "notice_text",
    "sign",
    "signature_headers",
    "slack_message",
    "verify",
    "wecom_message",
]
