"""The console's keys, session cookies, CSRF tokens and signed approve links.

One key (`api.console_secret`, its `_env` / `_file` forms, or else derived from the API token) is
split into one sub-key per purpose with HMAC-SHA256 (``HMAC(key, "trainmedic-console/<purpose>")``),
so a value signed for one purpose is never accepted for another.

* A session is the cookie ``trainmedic_session``: ``b64url(json) "." b64url(mac)`` where the JSON
  holds a random session id, the name the person gave at login, the expiry and a fingerprint of
  the API token (a new token ends every session). HttpOnly, SameSite=Strict, Path=/console, Secure
  on https.
* A CSRF token is ``HMAC(csrf key, session id)``: every mutating form carries it, and a POST whose
  token does not match its session's is refused. Calls with the bearer token in the Authorization
  header need none (a browser never adds that header by itself).
* An approve link is ``/console/link/<b64url(json)>.<b64url(mac)>`` with the incident, the action,
  the expiry and a random nonce. The store records the nonce when the link is used, in the same
  transaction as the decision, so a link works once.

Everything compares MACs in constant time; a value that does not parse is treated as forged.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import logging
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from trainmedic.agent.config import ApiSettings, secret_setting

log = logging.getLogger("trainmedic.console")

SESSION_COOKIE = "trainmedic_session"
MAX_NAME_CHARS = 200
# Longest signed value accepted (cookies and links); anything longer is refused unread.
MAX_SIGNED_CHARS = 2048


def resolve_console_secret(settings: ApiSettings, env: Mapping[str, str] | None = None) -> str | None:
    """`console_secret`, else the variable `console_secret_env` names, else the file `console_secret_file`."""
    return secret_setting(
        settings.console_secret,
        settings.console_secret_env,
        settings.console_secret_file,
        what="api.console_secret",
        env=env,
    )


def console_key(settings: ApiSettings, token: str | None, env: Mapping[str, str] | None = None) -> bytes | None:
    """The console's key: the configured console secret, else one derived from the API token; None
    when neither is configured (no signed links then; sessions get a key of their own process)."""
    secret = resolve_console_secret(settings, env)
    if secret:
        return hashlib.sha256(b"trainmedic-console-secret\x00" + secret.encode("utf-8")).digest()
    if token:
        return hmac.new(token.encode("utf-8"), b"trainmedic-console-key", hashlib.sha256).digest()
    return None


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class Signer:
    """Signs and checks JSON values for one purpose."""

    def __init__(self, key: bytes, purpose: str) -> None:
        self._key = hmac.new(key, f"trainmedic-console/{purpose}".encode(), hashlib.sha256).digest()

    def mac(self, data: bytes) -> bytes:
        return hmac.new(self._key, data, hashlib.sha256).digest()

    def sign(self, value: Mapping[str, Any]) -> str:
        raw = json.dumps(value, separators=(",", ":"), sort_keys=True).encode()
        return f"{_b64(raw)}.{_b64(self.mac(raw))}"

    def unsign(self, signed: str) -> dict[str, Any] | None:
        """The value, or None when it is malformed or its MAC does not match (forged or another key)."""
        if not signed or len(signed) > MAX_SIGNED_CHARS or signed.count(".") != 1:
            return None
        body, mac = signed.split(".")
        try:
            raw, given = _unb64(body), _unb64(mac)
        except (binascii.Error, ValueError):
            return None
        if not hmac.compare_digest(given, self.mac(raw)):
            return None
        try:
            value = json.loads(raw)
        except ValueError:
            return None
        return value if isinstance(value, dict) else None


@dataclass(frozen=True)
class Session:
    sid: str
    name: str
    expires: float


class Sessions:
    """Session cookies and their CSRF tokens."""

    def __init__(self, key: bytes, *, token: str | None, ttl_s: float) -> None:
        self._cookies = Signer(key, "session")
        self._csrf = Signer(key, "csrf")
        self.ttl_s = ttl_s
        # A fingerprint of the API token: sessions end when the token changes.
        self._token_fp = _b64(Signer(key, "token").mac((token or "").encode()))[:16]

    def issue(self, name: str, *, now: float) -> tuple[Session, str]:
        session = Session(sid=secrets.token_urlsafe(18), name=name[:MAX_NAME_CHARS], expires=now + self.ttl_s)
        cookie = self._cookies.sign({"sid": session.sid, "n": session.name, "e": session.expires, "t": self._token_fp})
        return session, cookie

    def check(self, cookie: str | None, *, now: float) -> Session | None:
        if not cookie:
            return None
        value = self._cookies.unsign(cookie)
        if value is None or value.get("t") != self._token_fp:
            return None
        sid, name, expires = value.get("sid"), value.get("n"), value.get("e")
        if not isinstance(sid, str) or not isinstance(name, str) or not isinstance(expires, int | float):
            return None
        if now >= float(expires):
            return None
        return Session(sid=sid, name=name, expires=float(expires))

    def csrf(self, session: Session) -> str:
        return _b64(self._csrf.mac(session.sid.encode()))

    def csrf_ok(self, session: Session, given: str | None) -> bool:
        return bool(given) and hmac.compare_digest(str(given).encode(), self.csrf(session).encode())


@dataclass(frozen=True)
class Link:
    incident_id: str
    action: str
    expires: float
    nonce: str


class LinkProblem(Exception):
    """A signed link that cannot be used; `code` is forged, expired or used."""

    def __init__(self, code: str) -> None:
        super().__init__(code)
        self.code = code


class Links:
    """Signed, single-use, expiring links (the approve and reject links in chat messages)."""

    ACTIONS = frozenset({"approve", "reject"})

    def __init__(self, key: bytes, *, ttl_s: float) -> None:
        self._signer = Signer(key, "link")
        self._csrf = Signer(key, "link-csrf")
        self.ttl_s = ttl_s

    def make(self, incident_id: str, action: str, *, now: float) -> str:
        if action not in self.ACTIONS:
            raise ValueError(f"unknown link action {action!r}")
        return self._signer.sign(
            {"i": incident_id, "a": action, "e": int(now + self.ttl_s), "n": secrets.token_urlsafe(12)}
        )

    def check(self, token: str, *, now: float) -> Link:
        """The link's contents; LinkProblem("forged") or ("expired") when it cannot be used."""
        value = self._signer.unsign(token)
        if value is None:
            raise LinkProblem("forged")
        incident_id, action, expires, nonce = value.get("i"), value.get("a"), value.get("e"), value.get("n")
        if (
            not isinstance(incident_id, str)
            or action not in self.ACTIONS
            or not isinstance(expires, int)
            or not isinstance(nonce, str)
            or not nonce
        ):
            raise LinkProblem("forged")
        if now >= expires:
            raise LinkProblem("expired")
        return Link(incident_id=incident_id, action=str(action), expires=float(expires), nonce=nonce)

    def csrf(self, link: Link) -> str:
        return _b64(self._csrf.mac(link.nonce.encode()))

    def csrf_ok(self, link: Link, given: str | None) -> bool:
        return bool(given) and hmac.compare_digest(str(given).encode(), self.csrf(link).encode())


class MessageLinks(NamedTuple):
    """What chat messages link to: the incident's console page, and for a plan awaiting approval
    the signed approve and reject links (None where no key is configured)."""

    incident_url: Callable[[str], str]
    approve_url: Callable[[str, float], str | None]
    reject_url: Callable[[str, float], str | None]


def message_links(
    settings: ApiSettings, *, token: str | None, env: Mapping[str, str] | None = None
) -> MessageLinks | None:
    """The links for messages, from api.public_url and the console key; None when no public URL is
    configured. The decision links are None where no key is configured."""
    if not settings.public_url or not settings.console:
        return None
    base = settings.public_url.rstrip("/")
    key = console_key(settings, token, env)
    links = Links(key, ttl_s=settings.approve_link_ttl_s) if key is not None else None

    def incident_url(incident_id: str) -> str:
        return f"{base}/console/incidents/{incident_id}"

    def decision_url(action: str) -> Callable[[str, float], str | None]:
        def url(incident_id: str, now: float) -> str | None:
            if links is None:
                return None
            return f"{base}/console/link/{links.make(incident_id, action, now=now)}"

        return url

    return MessageLinks(incident_url, decision_url("approve"), decision_url("reject"))
