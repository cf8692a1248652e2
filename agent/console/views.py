"""The console's routes (all under /console, none in the OpenAPI schema).

    GET  /console                         -> the incident list
    GET  /console/login, POST /console/login, POST /console/logout
    GET  /console/incidents               list: status, fault class, chip, node, job, time range, pages
    GET  /console/incidents/{id}          the incident: outcome, plan, decision, timeline, evidence, scene
    GET  /console/incidents/{id}/report   the incident's HTML report
    GET  /console/incidents/{id}/scene/report.html
                                          the same report (framed by the incident page), where the
                                          report's relative links (saved stacks) reach the bundle
    GET  /console/incidents/{id}/scene/PATH
                                          a file of the incident's scene bundle (redacted evidence):
                                          text as text/plain, a saved report under the report's CSP
    POST /console/incidents/{id}/approve|reject|release
    GET  /console/changes[?incident=ID]   {"updated", "count"}: what the live-update script polls
    GET  /console/link/{token}            a signed approve link: a confirmation page (never a change)
    POST /console/link/{token}            the confirmation: approves once
    GET  /console/static/console.css|console.js

Auth: reads need a session (or the bearer token) unless `api.read_auth` is false; every POST
needs the bearer token, or a session and the form's CSRF token. A signed link authorises its one
decision by itself, and its form carries a CSRF token of its own. Decisions go through the same
store call as `POST /api/v1/incidents/{id}/approve` and `trainmedic approve`; release through the
same `KubeOps.release_node` as `trainmedic release-node --incident`.

The limits, the console's state (`Console`, `Viewer`) and the request helpers are in
agent/console/state.py.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import math
import os
import time
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import quote, urlencode

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, Response

from trainmedic.agent.authlimit import AuthFailures, client_address
from trainmedic.agent.config import ApiSettings
from trainmedic.agent.console import parts
from trainmedic.agent.console.pages import (
    HEADERS,
    LABELS,
    PREFIX,
    REPORT_CSP,
    STATIC,
    Refusal,
    lang_of,
    page,
    redirect,
    refusal_page,
    secure_cookie,
)
from trainmedic.agent.console.security import MAX_NAME_CHARS, SESSION_COOKIE, LinkProblem, Links, Sessions, console_key
from trainmedic.agent.console.state import (
    MAX_FILTER_CHARS,
    MAX_PAGE,
    PAGE_SIZE,
    SCENE_CSP,
    Console,
    ReleaseNode,
    Render,
    _LoginFirst,
    _parse_time,
    _safe_next,
)
from trainmedic.agent.store import LIST_FILTERS, Incident, IncidentStatus, IncidentStore, LinkUsedError, StoreError
from trainmedic.reports.notice import STATUS_TEXT, clean_text, label

log = logging.getLogger("trainmedic.console")


def mount_console(
    app: FastAPI,
    *,
    store: IncidentStore | None,
    settings: ApiSettings,
    token: str | None,
    render: Render | None = None,
    release: ReleaseNode | None = None,
    env: Mapping[str, str] | None = None,
    clock: Callable[[], float] = time.time,
    failures: AuthFailures | None = None,
) -> Console:
    """Add the console's routes to `app` (the API calls this in create_app, sharing its throttle of
    wrong tokens: `failures`)."""
    key = console_key(settings, token, env)
    if key is None:
        # No secret anywhere: sessions are signed with a key of this process (they end at a restart);
        # approve links, which another process must check, are off.
        key = os.urandom(32)
        links = None
    else:
        links = Links(key, ttl_s=settings.approve_link_ttl_s)
    console = Console(
        store=store,
        settings=settings,
        token=token,
        sessions=Sessions(key, token=token, ttl_s=settings.session_ttl_s),
        links=links,
        render=render,
        release=release,
        clock=clock,
        failures=(
            failures
            if failures is not None
            else AuthFailures(limit=settings.auth_failure_limit, window_s=settings.auth_failure_window_s)
        ),
    )
    app.state.console = console
    router = APIRouter(prefix=PREFIX, include_in_schema=False)

    @app.exception_handler(Refusal)
    async def _refused(request: Request, exc: Refusal) -> Response:
        if request.url.path == f"{PREFIX}/changes":
            return JSONResponse({"error": exc.key}, status_code=exc.status, headers=dict(HEADERS))
        return refusal_page(request, exc)

    @app.exception_handler(_LoginFirst)
    async def _login_first(request: Request, exc: _LoginFirst) -> Response:
        if request.url.path == f"{PREFIX}/changes":
            return JSONResponse({"error": "unauthorized"}, status_code=401, headers=dict(HEADERS))
        if request.headers.get("sec-fetch-site") == "cross-site" and request.method == "GET":
            # Followed from another site: the Strict session cookie was held back; this site's own
            # reload sends it (and comes back same-origin, so this happens once).
            return page(request, "bounce.html.j2")
        return redirect(f"{PREFIX}/login?{urlencode({'next': exc.target})}")

    async def form_of(request: Request) -> dict[str, str]:
        form = await request.form(max_files=0, max_fields=16, max_part_size=64 * 1024)
        try:
            return {k: v for k, v in form.items() if isinstance(v, str)}
        finally:
            await form.close()

    @router.get("")
    async def root() -> Response:
        return redirect(f"{PREFIX}/incidents")

    @router.get("/static/{name}")
    async def static(name: str) -> Response:
        entry = STATIC.get(name)
        if entry is None:
            raise Refusal(404, "not_found")
        media, path = entry
        return Response(path.read_bytes(), media_type=media, headers={"Cache-Control": "max-age=300"})

    # -- login ------------------------------------------------------------------------------------

    def login_screen(request: Request, *, error: str | None = None, status: int = 200) -> HTMLResponse:
        notice = None
        if token is None:
            notice = "login_open" if settings.allow_unauthenticated else "login_no_token"
        return page(
            request,
            "login.html.j2",
            status,
            error=error,
            notice=notice,
            can_login=token is not None or settings.allow_unauthenticated,
            next=_safe_next(request.query_params.get("next")),
        )

    @router.get("/login")
    async def login_form(request: Request) -> Response:
        return login_screen(request)

    @router.post("/login")
    async def login(request: Request) -> Response:
        form = await form_of(request)
        given = form.get("token", "")
        name = clean_text(form.get("name", ""), MAX_NAME_CHARS)
        client = client_address(request.scope.get("client"))
        wait = console.failures.retry_after(client) if token is not None else None
        if wait is not None:
            # Too many wrong tokens from this address: not even a right one is looked at.
            screen = login_screen(request, error="login_throttled", status=429)
            screen.headers["Retry-After"] = str(max(1, math.ceil(wait)))
            return screen
        if token is not None:
            valid = hmac.compare_digest(given.strip().encode(), token.encode())
        else:
            valid = settings.allow_unauthenticated
        if not valid:
            if token is not None:
                console.failures.failed(client)
            log.warning("console: a sign-in with an invalid token was refused")
            return login_screen(request, error="login_failed", status=401)
        if not name:
            return login_screen(request, error="name_needed", status=400)
        _, cookie = console.sessions.issue(name, now=clock())
        response = redirect(_safe_next(form.get("next")))
        response.set_cookie(
            SESSION_COOKIE,
            cookie,
            max_age=int(settings.session_ttl_s),
            path=PREFIX,
            httponly=True,
            samesite="strict",
            secure=secure_cookie(request, settings),
        )
        return response

    @router.post("/logout")
    async def logout(request: Request) -> Response:
        console.actor(request, await form_of(request))
        response = redirect(f"{PREFIX}/login")
        response.delete_cookie(SESSION_COOKIE, path=PREFIX, httponly=True, samesite="strict")
        return response

    # -- the list ---------------------------------------------------------------------------------

    @router.get("/incidents")
    async def incidents(request: Request) -> Response:
        viewer = console.viewer(request)
        s = console.need_store()
        q = request.query_params
        filters: dict[str, str] = {}
        for name in LIST_FILTERS:
            value = (q.get(name) or "").strip()[:MAX_FILTER_CHARS]
            if value:
                filters[name] = value
        if "status" in filters and filters["status"] not in {st.value for st in IncidentStatus}:
            raise Refusal(400, "bad_filter", name="status")
        since, until = _parse_time(q.get("since")), _parse_time(q.get("until"))
        try:
            page_no = min(max(int(q.get("page") or 1), 1), MAX_PAGE)
        except ValueError:
            page_no = 1

        def query() -> tuple[int, list[Any], dict[str, list[str]], tuple[float, int]]:
            total, rows = s.search(
                filters=filters, since=since, until=until, offset=(page_no - 1) * PAGE_SIZE, limit=PAGE_SIZE
            )
            choices = {c: s.distinct(c) for c in ("fault_class", "chip")}
            return total, rows, choices, s.last_change()

        total, rows, choices, (updated, count) = await asyncio.to_thread(query)
        pages = max(1, -(-total // PAGE_SIZE))
        base = {k: v for k, v in q.items() if k != "page" and v}

        def page_url(n: int) -> str:
            return f"{PREFIX}/incidents?{urlencode({**base, 'page': n})}"

        return page(
            request,
            "list.html.j2",
            viewer=viewer,
            csrf=console.sessions.csrf(viewer.session) if viewer.session else "",
            rows=rows,
            total=total,
            page=page_no,
            pages=pages,
            newer=page_url(page_no - 1) if page_no > 1 else None,
            older=page_url(page_no + 1) if page_no < pages else None,
            filters={n: q.get(n) or "" for n in (*LIST_FILTERS, "since", "until")},
            statuses=[st.value for st in IncidentStatus],
            choices=choices,
            live_url=f"{PREFIX}/changes",
            live_since=updated,
            live_count=count,
        )

    # -- one incident ----------------------------------------------------------------------------

    def find(s: IncidentStore, incident_id: str) -> Incident:
        incident = s.find(incident_id)
        if incident is None:
            raise Refusal(404, "not_found")
        return incident

    @router.get("/incidents/{incident_id}")
    async def incident_page(request: Request, incident_id: str) -> Response:
        viewer = console.viewer(request)
        s = console.need_store()
        lang = lang_of(request)

        def load() -> dict[str, Any]:
            incident = find(s, incident_id)
            timeline = s.timeline(incident.id)
            summary, hint = parts.summary(incident, lang)
            scene_state, scene_files = parts.scene_files(incident.scene_dir)
            plan = incident.plan if isinstance(incident.plan, Mapping) else {}
            blocked = plan.get("blocked")
            return {
                "incident": incident,
                "summary": summary,
                "hint": hint,
                "blocked": (blocked.get(lang) or blocked.get("en")) if isinstance(blocked, Mapping) else blocked,
                "actions": parts.actions(incident),
                "timeline": parts.timeline(timeline),
                "evidence": parts.evidence(incident),
                "scene_state": scene_state,
                "scene_files": scene_files,
                "quarantined": parts.quarantined_node(incident, timeline),
            }

        data = await asyncio.to_thread(load)
        incident = data["incident"]
        return page(
            request,
            "incident.html.j2",
            viewer=viewer,
            csrf=console.sessions.csrf(viewer.session) if viewer.session else "",
            lang=lang,
            done=request.query_params.get("done") if request.query_params.get("done") in _DONE else None,
            can_release=console.release is not None,
            report_url=f"{PREFIX}/incidents/{incident.id}/scene/report.html?lang={lang}",
            scene_url=f"{PREFIX}/incidents/{incident.id}/scene/",
            live_url=f"{PREFIX}/changes?{urlencode({'incident': incident.id})}",
            live_since=incident.updated,
            live_count=0,
            **data,
        )

    @router.get("/incidents/{incident_id}/report")
    async def report(request: Request, incident_id: str) -> Response:
        console.viewer(request)
        s = console.need_store()
        lang = "zh" if request.query_params.get("lang") == "zh" else "en"
        incident = await asyncio.to_thread(find, s, incident_id)
        if console.render is None:
            raise Refusal(503, "no_reports")
        try:
            html = await asyncio.to_thread(console.render, incident.id, "html", lang)
        except Exception as e:  # a template or scene file that cannot be read: say so, keep serving
            log.exception("console: report of incident %s (%s) failed", incident.id, lang)
            raise Refusal(500, "report_failed") from e
        return HTMLResponse(html, headers={**HEADERS, "Content-Security-Policy": REPORT_CSP})

    @router.get("/incidents/{incident_id}/scene/{rel:path}")
    async def scene_file(request: Request, incident_id: str, rel: str) -> Response:
        if rel == "report.html":
            return await report(request, incident_id)
        console.viewer(request)
        s = console.need_store()
        incident = await asyncio.to_thread(find, s, incident_id)
        path = await asyncio.to_thread(parts.scene_file, incident.scene_dir, rel)
        if path is None:
            raise Refusal(404, "not_found")
        media, inline = parts.scene_media(path)
        disposition = "inline" if inline else "attachment"
        headers = {
            **HEADERS,
            "Content-Security-Policy": REPORT_CSP if media.startswith("text/html") else SCENE_CSP,
            "Content-Disposition": f"{disposition}; filename*=UTF-8''{quote(path.name)}",
        }
        return FileResponse(path, media_type=media, headers=headers)

    @router.get("/changes")
    async def changes(request: Request) -> Response:
        console.viewer(request)
        s = console.need_store()
        incident_id = request.query_params.get("incident")
        if incident_id:
            incident = await asyncio.to_thread(s.find, incident_id)
            if incident is None:
                raise Refusal(404, "not_found")
            body = {"updated": incident.updated, "count": 0, "status": incident.status.value}
        else:
            updated, count = await asyncio.to_thread(s.last_change)
            body = {"updated": updated, "count": count}
        return JSONResponse(body, headers=dict(HEADERS))

    async def decide(request: Request, incident_id: str, approve: bool) -> Response:
        form = await form_of(request)
        actor = console.actor(request, form)
        s = console.need_store()
        by = clean_text(form.get("by") or actor.name, MAX_NAME_CHARS) or actor.name
        comment = clean_text(form.get("comment", ""), 4000)

        def run() -> Incident:
            incident = find(s, incident_id)
            try:
                # The same call as POST /api/v1/incidents/{id}/approve and `trainmedic approve`.
                return s.approve(incident.id, by=by, approve=approve, comment=comment)
            except StoreError as e:
                current = s.find(incident.id)
                status = current.status.value if current is not None else incident.status.value
                raise Refusal(409, "conflict", status=status) from e

        incident = await asyncio.to_thread(run)
        done = "approved" if approve else "rejected"
        return redirect(f"{PREFIX}/incidents/{incident.id}?done={done}")

    @router.post("/incidents/{incident_id}/approve")
    async def approve(request: Request, incident_id: str) -> Response:
        return await decide(request, incident_id, True)

    @router.post("/incidents/{incident_id}/reject")
    async def reject(request: Request, incident_id: str) -> Response:
        return await decide(request, incident_id, False)

    @router.post("/incidents/{incident_id}/release")
    async def release_route(request: Request, incident_id: str) -> Response:
        from trainmedic.remediations.kube import KubeError

        form = await form_of(request)
        actor = console.actor(request, form)
        s = console.need_store()
        incident = await asyncio.to_thread(find, s, incident_id)
        timeline = await asyncio.to_thread(s.timeline, incident.id)
        node = parts.quarantined_node(incident, timeline)
        if node is None:
            raise Refusal(409, "not_quarantined")
        if console.release is None:
            raise Refusal(503, "release_unavailable", node=node, id=incident.id)
        try:
            # The same call as `trainmedic release-node NODE --incident ID`.
            released = await console.release(node, incident.id)
        except KubeError as e:
            hint = e.hint.get(lang_of(request)) if e.hint is not None else str(e)
            raise Refusal(409, "release_failed", reason=clean_text(hint, 500)) from e
        await asyncio.to_thread(
            s.note, incident.id, "node_released", {"node": node, "by": actor.name, "changed": released}
        )
        return redirect(f"{PREFIX}/incidents/{incident.id}?done=released")

    # -- signed approve links ---------------------------------------------------------------------

    def checked_link(request: Request, link_token: str) -> Any:
        if console.links is None:
            raise Refusal(503, "link_unavailable")
        try:
            return console.links.check(link_token, now=clock())
        except LinkProblem as e:
            raise Refusal(410 if e.code == "expired" else 403, f"link_{e.code}") from e

    @router.get("/link/{link_token}")
    async def link_page(request: Request, link_token: str) -> Response:
        link = checked_link(request, link_token)
        s = console.need_store()
        lang = lang_of(request)

        def load() -> tuple[Incident, bool]:
            return find(s, link.incident_id), s.link_used(link.nonce)

        incident, used = await asyncio.to_thread(load)
        if used:
            raise Refusal(410, "link_used")
        if incident.status is not IncidentStatus.AWAITING_APPROVAL:
            raise Refusal(409, "link_not_pending", status=label(STATUS_TEXT, incident.status.value, lang))
        summary, hint = parts.summary(incident, lang)
        assert console.links is not None
        session = console.session_of(request)
        return page(
            request,
            "confirm.html.j2",
            lang=lang,
            incident=incident,
            summary=summary,
            hint=hint,
            actions=parts.actions(incident),
            link_csrf=console.links.csrf(link),
            link_sfx="" if link.action == "approve" else "_reject",
            expires=link.expires,
            name=session.name if session else "",
        )

    @router.post("/link/{link_token}")
    async def link_confirm(request: Request, link_token: str) -> Response:
        link = checked_link(request, link_token)
        form = await form_of(request)
        assert console.links is not None
        if not console.links.csrf_ok(link, form.get("csrf")):
            raise Refusal(403, "csrf")
        s = console.need_store()
        lang = lang_of(request)
        name = clean_text(form.get("by", ""), MAX_NAME_CHARS)
        if not name:
            raise Refusal(400, "name_needed")

        def run() -> Incident:
            incident = find(s, link.incident_id)
            if s.link_used(link.nonce):
                raise Refusal(410, "link_used")
            approve = link.action == "approve"
            try:
                return s.approve(
                    incident.id,
                    by=f"{name} ({link.action} link)",
                    approve=approve,
                    comment=f"{'approved' if approve else 'rejected'} through a signed link",
                    link_nonce=link.nonce,
                )
            except LinkUsedError as e:
                raise Refusal(410, "link_used") from e
            except StoreError as e:
                current = s.find(incident.id)
                status = current.status.value if current is not None else incident.status.value
                raise Refusal(409, "link_not_pending", status=label(STATUS_TEXT, status, lang)) from e

        incident = await asyncio.to_thread(run)
        return page(
            request,
            "message.html.j2",
            title=LABELS[lang]["approval"],
            message=LABELS[lang]["link_done" if link.action == "approve" else "link_done_reject"],
            ok=True,
            incident_url=f"{PREFIX}/incidents/{incident.id}",
        )

    app.include_router(router)
    return console


_DONE = frozenset({"approved", "rejected", "released"})


__all__ = [
    "ReleaseNode",
    "mount_console",
]
