"""URLs that are safe to print: webhook URLs carry their credentials (user:password@, a token in the
query, the path of a Slack or Feishu hook), and neither a log line nor `trainmedic config show` may
show them.

`safe_url` keeps what identifies the receiver (scheme, host, port, the path up to the credential)
and masks the rest; `redact_urls` does it for every URL in a text. `redacting_handler` puts the
filter on the handlers the agent installs when it sets up its logging (agent/run/supervise.py,
the demo's --verbose), so every record they write is clean whichever module logged it;
`install_log_filters` also puts it on the loggers that print request URLs (httpx at INFO, httpcore
at DEBUG) and on trainmedic's notifier, outbox, API and Prometheus watcher, so those records are
clean whatever handler (a test's caplog, a site's) writes them.
"""

from __future__ import annotations

import logging
import re
import traceback
import urllib.parse

from trainmedic.hookurls import hook_paths

MASK = "<redacted>"
_URL = re.compile(r"""[A-Za-z][A-Za-z0-9+.-]{1,15}://[^\s'"<>`]+""")
# Hooks whose path is the credential (trainmedic/hookurls.py, the table the scene's text redaction
# shares): everything after the prefix goes, whatever the host.
_HOOK_PATHS = re.compile(rf"^(?P<keep>{hook_paths()})(?P<rest>.*)$")
# A path segment that looks like a token (long, or letters and digits mixed at some length).
_TOKENISH = re.compile(r"^(?=[A-Za-z0-9_=-]{24,}$)|^(?=.{12,}$)(?=.*[0-9])(?=.*[A-Za-z])[A-Za-z0-9_=-]+$")


def safe_url(url: str) -> str:
    """`url` with user info, query values, fragment and credential-like path parts masked."""
    try:
        parts = urllib.parse.urlsplit(url)
        host = parts.hostname or ""
        port = parts.port
    except ValueError:
        return MASK
    netloc = (f"[{host}]" if ":" in host else host) + (f":{port}" if port else "")
    if parts.username is not None or parts.password is not None:
        netloc = f"{MASK}@{netloc}"
    path = parts.path
    hook = _HOOK_PATHS.match(path)
    if hook and hook.group("rest"):
        path = hook.group("keep") + MASK
    else:
        path = "/".join(MASK if _TOKENISH.match(seg) else seg for seg in path.split("/"))
    query = ""
    if parts.query:
        pairs = urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
        query = "&".join(f"{k}={MASK}" for k, _ in pairs) if pairs else MASK
    return urllib.parse.urlunsplit((parts.scheme, netloc, path, query, MASK if parts.fragment else ""))


def redact_urls(text: str) -> str:
    """Every URL in `text` made safe (see `safe_url`)."""
    if "://" not in text:
        return text
    return _URL.sub(lambda m: safe_url(m.group(0)), text)


class UrlRedactingFilter(logging.Filter):
    """Rewrites a record's message (and its traceback and stack) with its URLs made safe. On a
    logger it cleans that logger's own records; on a handler, every record the handler writes."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a malformed record is the logging module's to report
            return True
        clean = redact_urls(message)
        if clean != message:
            record.msg = clean
            record.args = None
        if record.exc_info and not record.exc_text:
            record.exc_text = redact_urls("".join(traceback.format_exception(*record.exc_info))).rstrip("\n")
        if record.stack_info:
            record.stack_info = redact_urls(record.stack_info)
        return True


# Loggers that print request URLs. A logger's filters apply to its own records only, so the
# children httpcore logs through are named one by one.
LOGGERS = (
    "httpx",
    "httpcore",
    "httpcore.connection",
    "httpcore.http11",
    "httpcore.http2",
    "httpcore.proxy",
    "httpcore.socks",
    "trainmedic.notify",
    "trainmedic.outbox",
    "trainmedic.api",
    "trainmedic.watchers.metrics",
)
_FILTER = UrlRedactingFilter()


def install_log_filters() -> None:
    """Put the URL filter on every logger of `LOGGERS` (idempotent)."""
    for name in LOGGERS:
        logger = logging.getLogger(name)
        if _FILTER not in logger.filters:
            logger.addFilter(_FILTER)


def redacting_handler(handler: logging.Handler) -> logging.Handler:
    """`handler` with the URL filter on it (idempotent), and the loggers of `LOGGERS` filtered too:
    every record the agent's own logging writes has its URLs made safe, whichever logger it comes
    from, and the libraries' records are clean for any other handler as well."""
    if _FILTER not in handler.filters:
        handler.addFilter(_FILTER)
    install_log_filters()
    return handler


def redact_config(value: object) -> object:
    """A settings dump (dicts, lists, strings) with the URLs in its strings made safe."""
    if isinstance(value, dict):
        return {k: redact_config(v) for k, v in value.items()}
    if isinstance(value, list):
        return [redact_config(v) for v in value]
    if isinstance(value, str):
        return redact_urls(value)
    return value


__all__ = [
    "MASK",
    "UrlRedactingFilter",
    "install_log_filters",
    "redact_config",
    "redact_urls",
    "redacting_handler",
    "safe_url",
]
