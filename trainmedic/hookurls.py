"""Chat and automation webhooks whose URL is their credential: the one table that both the URL
masking of log records and settings (agent/urlsafe.py) and the text redaction of scene bundles,
the API and the console (remediations/scene/redact.py) are built from.

Whoever has such a URL can post to the channel, so everything after `path` (the rest of the path,
and the query where the credential is a query parameter) is masked:

    Slack           hooks.slack.com/services/<T>/<B>/<secret>  (also /workflows/, /triggers/)
    Feishu / Lark   open.feishu.cn/open-apis/bot/v2/hook/<token>, open.larksuite.com/... the same
    Discord         discord.com/api/webhooks/<id>/<token>  (discordapp.com, /api/v10/webhooks/)
    WeCom           qyapi.weixin.qq.com/cgi-bin/webhook/send?key=<key>
    DingTalk        oapi.dingtalk.com/robot/send?access_token=<token>
    any host        /hooks/<key>, /hook/<key>, /webhook/<key> at the start of the path
                    (Mattermost, Rocket.Chat, n8n and most self-hosted receivers)

`path` is a regular expression (lower case; matched case-insensitively in texts) from the path's
first slash up to the credential (a plain literal for the hooks of any host); `hosts` are host names
(empty: any host, matched only where the path starts right after the host); `query` names the query
parameter that carries the credential.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class HookUrl:
    service: str
    hosts: tuple[str, ...]
    path: str
    query: str | None = None


HOOK_URLS: tuple[HookUrl, ...] = (
    HookUrl("slack", ("hooks.slack.com",), r"/(?:services|workflows|triggers)/"),
    HookUrl("feishu", ("open.feishu.cn", "open.larksuite.com"), r"/open-apis/bot/v2/hook/"),
    HookUrl("discord", ("discord.com", "discordapp.com"), r"/api/(?:v[0-9]+/)?webhooks/"),
    HookUrl("wecom", ("qyapi.weixin.qq.com",), r"/cgi-bin/webhook/send", query="key"),
    HookUrl("dingtalk", ("oapi.dingtalk.com",), r"/robot/send", query="access_token"),
    # Any host: literal paths (also the literals that find candidates in a text).
    HookUrl("generic", (), "/hooks/"),
    HookUrl("generic", (), "/hook/"),
    HookUrl("generic", (), "/webhook/"),
)


def hook_paths() -> str:
    """A regular expression of every hook's `path` (any host): what a webhook URL of the settings
    keeps of its path before the mask."""
    return "|".join(h.path for h in HOOK_URLS)


def hosted_hooks() -> str:
    """A regular expression of `<host>[:port]<path>[?<query>=]` for the hooks of known hosts: the
    part of a URL in a text that is kept before the mask (what follows it is the credential)."""
    out = []
    for h in HOOK_URLS:
        if not h.hosts:
            continue
        hosts = "|".join(re.escape(host) for host in h.hosts)
        query = rf"(?:\?{re.escape(h.query)}=)?" if h.query else ""
        out.append(rf"(?:{hosts})(?::[0-9]+)?{h.path}{query}")
    return "|".join(out)


def any_host_hooks() -> str:
    """A regular expression of the `path` of the hooks of any host."""
    return "|".join(h.path for h in HOOK_URLS if not h.hosts)


def hook_hosts() -> tuple[str, ...]:
    """The known hosts, lower case (literals: one of them is in every hosted hook URL)."""
    return tuple(host for h in HOOK_URLS for host in h.hosts)


def any_host_literals() -> tuple[str, ...]:
    """The paths of the hooks of any host (literals: one of them is in every such hook URL)."""
    return tuple(h.path for h in HOOK_URLS if not h.hosts)


__all__ = ["HOOK_URLS", "HookUrl", "any_host_hooks", "any_host_literals", "hook_hosts", "hook_paths", "hosted_hooks"]
