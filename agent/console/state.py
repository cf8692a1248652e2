"""What the console's routes (agent/console/views.py) share: the page and evidence limits, `Console`
(the store, the settings and the services behind the pages), `Viewer` (who is looking), and the
helpers that read a request's `next` target and times.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from fastapi import Request

from trainmedic.agent.authlimit import AuthFailures, client_address
from trainmedic.agent.config import ApiSettings
from trainmedic.agent.console.pages import PREFIX, Refusal
from trainmedic.agent.console.security import SESSION_COOKIE, Links, Session, Sessions
from trainmedic.agent.store import IncidentStore

PAGE_SIZE = 50
MAX_PAGE = 10_000
MAX_EVIDENCE = 20
MAX_SCENE_FILES = 300
MAX_FILTER_CHARS = 253
# (node, incident id) -> True when released, False when the node was not quarantined.
ReleaseNode = Callable[[str, str], Awaitable[bool]]
Render = Callable[[str, str, str], str]


class _LoginFirst(Exception):
    def __init__(self, target: str) -> None:
        super().__init__(target)
        self.target = target


@dataclass(frozen=True)
class Viewer:
    """Who is asking: `session` when signed in through the browser, `bearer` with the API token,
    `open` where reads need no auth (api.read_auth false) and nobody signed in."""

    via: str
    name: str
    session: Session | None = None


@dataclass
class Console:
    store: IncidentStore | None
    settings: ApiSettings
    token: str | None
    sessions: Sessions
    links: Links | None
    render: Render | None
    release: ReleaseNode | None
    clock: Callable[[], float]
    # Wrong tokens per client address, shared with the API's bearer check (agent/authlimit.py).
    failures: AuthFailures

    # -- auth -------------------------------------------------------------------------------------

    def bearer_ok(self, request: Request) -> bool:
        value = request.headers.get("authorization", "")
        scheme, _, credentials = value.strip().partition(" ")
        if scheme.lower() != "bearer" or not credentials.strip():
            return False
        if self.token is None:
            return self.settings.allow_unauthenticated
        client = client_address(request.scope.get("client"))
        if self.failures.retry_after(client) is not None:
            return False  # throttled: not even a right token is looked at
        if hmac.compare_digest(credentials.strip().encode(), self.token.encode()):
            return True
        self.failures.failed(client)
        return False

    def session_of(self, request: Request) -> Session | None:
        return self.sessions.check(request.cookies.get(SESSION_COOKIE), now=self.clock())

    def viewer(self, request: Request) -> Viewer:
        """The reader of a page; sends the browser to the login page when reads need auth."""
        session = self.session_of(request)
        if session is not None:
            return Viewer("session", session.name, session)
        if self.bearer_ok(request):
            return Viewer("bearer", "api token")
        if not self.settings.read_auth:
            return Viewer("open", "")
        raise _LoginFirst(str(request.url.path) + (f"?{request.url.query}" if request.url.query else ""))

    def actor(self, request: Request, form: Mapping[str, Any]) -> Viewer:
        """The author of a change: the bearer token, or a session with its form's CSRF token."""
        if self.bearer_ok(request):
            return Viewer("bearer", "api token")
        session = self.session_of(request)
        if session is None:
            raise Refusal(401, "unauthorized")
        given = form.get("csrf")
        if not self.sessions.csrf_ok(session, given if isinstance(given, str) else None):
            raise Refusal(403, "csrf")
        return Viewer("session", session.name, session)

    def need_store(self) -> IncidentStore:
        if self.store is None:
            raise Refusal(503, "no_store")
        return self.store


def _safe_next(target: str | None) -> str:
    """Only console paths of this site (no scheme, no host, no `//`): never an open redirect."""
    if target and target.startswith(PREFIX + "/") and not target.startswith("//") and "\\" not in target:
        return target
    return f"{PREFIX}/incidents"


def _parse_time(raw: str | None) -> float | None:
    """`YYYY-MM-DDTHH:MM[:SS]` (an <input type="datetime-local">, read as UTC) or a date; None when empty."""
    if not raw:
        return None
    try:
        dt = datetime.fromisoformat(raw.strip())
    except ValueError as e:
        raise Refusal(400, "bad_time", value=raw[:40]) from e
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return dt.timestamp()


# -- the routes ------------------------------------------------------------------------------------


# A scene file is data: nothing in it runs, loads or frames anything.
SCENE_CSP = "default-src 'none'; sandbox; frame-ancestors 'self'"
