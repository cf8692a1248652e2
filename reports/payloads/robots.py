"""The chat robots' messages: Feishu (an interactive card, signed), DingTalk (markdown, a signed URL),
WeCom (markdown) and Slack (Block Kit).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import urllib.parse
from collections.abc import Sequence
from typing import Any

from trainmedic.reports.notice import Notice, clean_text
from trainmedic.reports.payloads.chat import (
    _BOTH_SEP,
    _DINGTALK,
    _EMOJI,
    _MD,
    _SLACK,
    DIGEST_SUMMARY_CHARS,
    DINGTALK_MAX_BYTES,
    FEISHU_MAX_BYTES,
    SLACK_HEADER_MAX_CHARS,
    SLACK_SECTION_MAX_CHARS,
    TRUNCATED,
    WECOM_MAX_BYTES,
    _bodies,
    _cut,
    _Dialect,
    _field,
    _footer,
    _footer_ids,
    _md_escape,
    _prepare,
    _slack_escape,
    _titles,
    _top_severity,
    _utf8_len,
)

# -- Feishu / Lark

_FEISHU_TEMPLATE = {"critical": "red", "warning": "orange"}


def feishu_sign(secret: str, timestamp: int) -> str:
    """Feishu custom-bot signature: HMAC-SHA256 keyed with f"{timestamp}\\n{secret}" over nothing, base64."""
    key = f"{int(timestamp)}\n{secret}".encode()
    return base64.b64encode(hmac.new(key, b"", hashlib.sha256).digest()).decode("ascii")


def feishu_message(ns: Sequence[Notice], *, lang: str, secret: str | None, timestamp: int) -> dict[str, Any]:
    """An interactive card (header coloured by severity); `timestamp` and `sign` when `secret`."""
    langs, ns = _prepare(ns, lang)
    sev = _top_severity(ns)
    firing = any(n.firing for n in ns)
    template = _FEISHU_TEMPLATE.get(sev, "green" if not firing else "blue")
    title = _EMOJI.get(sev, "") + " " + _titles(ns, langs)
    footer = _footer(ns)
    budget = FEISHU_MAX_BYTES - _utf8_len(title) - _utf8_len(footer)
    elements: list[dict[str, Any]] = []
    for i, body in enumerate(_bodies(ns, langs, _MD, budget)):
        if i:
            elements.append({"tag": "hr"})
        elements.append({"tag": "div", "text": {"tag": "lark_md", "content": body}})
    elements.append({"tag": "note", "elements": [{"tag": "plain_text", "content": footer}]})
    message: dict[str, Any] = {
        "msg_type": "interactive",
        "card": {
            "config": {"wide_screen_mode": True},
            "header": {"template": template, "title": {"tag": "plain_text", "content": title}},
            "elements": elements,
        },
    }
    if secret:
        message = {"timestamp": str(int(timestamp)), "sign": feishu_sign(secret, timestamp), **message}
    return message


# -- DingTalk


def dingtalk_sign(secret: str, timestamp_ms: int) -> str:
    """DingTalk custom-robot signature (before URL encoding): HMAC-SHA256 keyed with the secret
    over f"{timestamp_ms}\\n{secret}", base64."""
    data = f"{int(timestamp_ms)}\n{secret}".encode()
    return base64.b64encode(hmac.new(secret.encode(), data, hashlib.sha256).digest()).decode("ascii")


def dingtalk_signed_url(url: str, secret: str, timestamp_ms: int) -> str:
    """The robot URL with `&timestamp=...&sign=...` (the signature URL-encoded) appended."""
    if not secret:
        raise ValueError("a DingTalk signing secret must be non-empty")
    sign_q = urllib.parse.quote_plus(dingtalk_sign(secret, timestamp_ms))
    sep = "&" if urllib.parse.urlsplit(url).query else ("" if url.endswith("?") else "?")
    return f"{url}{sep}timestamp={int(timestamp_ms)}&sign={sign_q}"


def _framed(ns: Sequence[Notice], langs: list[str], d: _Dialect, head: str, footer: str, sep: str, limit: int) -> str:
    """Head, one body per language and footer joined by `sep`, the bodies sharing what is left of `limit`
    bytes of UTF-8 (a markdown robot's message)."""
    budget = limit - _utf8_len(head) - _utf8_len(footer) - 2 * _utf8_len(sep)
    budget -= _utf8_len(_BOTH_SEP) * (len(langs) - 1)
    return sep.join([head, _BOTH_SEP.join(_bodies(ns, langs, d, budget)), footer])


def dingtalk_message(ns: Sequence[Notice], *, lang: str) -> dict[str, Any]:
    """msgtype markdown: `title` (the notification preview) and `text`."""
    langs, ns = _prepare(ns, lang)
    title = _titles(ns, langs)
    head = f"#### {_EMOJI.get(_top_severity(ns), '')} {title}"
    footer = f"###### {_footer(ns)}"
    text = _framed(ns, langs, _DINGTALK, head, footer, "\n\n", DINGTALK_MAX_BYTES)
    return {"msgtype": "markdown", "markdown": {"title": clean_text(title, 100), "text": text}}


# -- WeCom

_WECOM_COLOUR = {"critical": "warning", "warning": "comment"}


def wecom_message(ns: Sequence[Notice], *, lang: str) -> dict[str, Any]:
    """msgtype markdown; `content` at most WECOM_MAX_BYTES of UTF-8."""
    langs, ns = _prepare(ns, lang)
    sev = _top_severity(ns)
    colour = _WECOM_COLOUR.get(sev, "info")
    head = f'**<font color="{colour}">{_EMOJI.get(sev, "")} {_md_escape(_titles(ns, langs))}</font>**'
    footer = f'<font color="comment">{_footer(ns)}</font>'
    content = _framed(ns, langs, _MD, head, footer, "\n", WECOM_MAX_BYTES)
    # The parts are budgeted; this is the guarantee.
    content = _cut(content, WECOM_MAX_BYTES, _utf8_len, TRUNCATED[langs[-1]])
    return {"msgtype": "markdown", "markdown": {"content": content}}


# -- Slack


def slack_message(ns: Sequence[Notice], *, lang: str) -> dict[str, Any]:
    """Incoming-webhook message: `text` (the notification fallback) and Block Kit `blocks`:
    a header, one mrkdwn section per language (each at most 3000 characters), a context line."""
    langs, ns = _prepare(ns, lang)
    sev = _top_severity(ns)
    title = _cut(f"{_EMOJI.get(sev, '')} {_titles(ns, langs)}", SLACK_HEADER_MAX_CHARS, len, "…")
    blocks: list[dict[str, Any]] = [{"type": "header", "text": {"type": "plain_text", "text": title, "emoji": True}}]
    bodies = []
    for body in (_bodies(ns, [lg], _SLACK, SLACK_SECTION_MAX_CHARS)[0] for lg in langs):
        bodies.append(body)
        blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": body}})
    footer = "trainmedic · " + _slack_escape(_footer_ids(ns))
    blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": footer}]})
    fallback = _slack_escape(_titles(ns, langs))
    if len(ns) == 1:
        summary = _field(ns[0].text("summary", langs[0]), DIGEST_SUMMARY_CHARS)
        if summary:
            fallback += " — " + _slack_escape(summary)
    return {"text": _cut(fallback, SLACK_SECTION_MAX_CHARS, len, "…"), "blocks": blocks}
