"""The web console over HTTP (httpx over ASGI): login and sessions, the incident list's filters and
pages, the incident page, approvals and node release with CSRF, signed approve links, the links in
chat messages, and that no page shows a secret. The browser tests are in test_console_browser.py."""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from trainmedic.agent.api import create_app
from trainmedic.agent.config import ApiSettings
from trainmedic.agent.console.pages import LABELS
from trainmedic.agent.console.security import SESSION_COOKIE, Links, Sessions, console_key, message_links
from trainmedic.agent.store import ActionState, IncidentStatus, IncidentStore
from trainmedic.agent.telemetry import Telemetry
from trainmedic.reports import payloads
from trainmedic.reports.notice import Notice

TOKEN = "c0nsole-t0ken"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
SECRET_VALUE = "hunter2-do-not-show"
BASE = "http://trainmedic.test"
T0 = 1_790_000_000.0


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


def diagnosis(summary: str, *, text: str = "NVRM: Xid 79, GPU has fallen off the bus") -> dict[str, Any]:
    return {
        "root_cause": {
            "summary": {"en": summary, "zh": f"中文：{summary}"},
            "hint": {"en": "Drain the node", "zh": "请排空节点"},
        },
        "findings": [{"file": "train.log", "line_no": 7, "rule_id": "nvidia.xid79", "code": "xid:79", "text": text}],
    }


def seed(store: IncidentStore, n: int, **kw: Any) -> str:
    iid = str(kw.pop("iid", f"inc{n:05d}aaaa"))
    store.open_incident(
        iid,
        key=f"job:{kw.get('namespace', 'train')}/{kw.get('job', f'job-{n}')}",
        diagnosis=diagnosis(kw.pop("summary", f"fault number {n}")),
        revision=1,
        namespace=kw.pop("namespace", "train"),
        job=kw.pop("job", f"job-{n}"),
        node=kw.pop("node", f"gpu-{n % 3}"),
        fault_class=kw.pop("fault_class", "device_error"),
        code=kw.pop("code", "xid:79"),
        chip=kw.pop("chip", "nvidia"),
    )
    status = kw.pop("status", None)
    if status is not None:
        store.set_status(iid, IncidentStatus(status))
    return iid


@pytest.fixture
def store(tmp_path: Path) -> Iterator[IncidentStore]:
    s = IncidentStore(tmp_path / "incidents.db", clock=Clock())
    yield s
    s.close()


@pytest.fixture
def pending(store: IncidentStore) -> str:
    """An incident whose plan waits for approval, with a secret in its plan's parameters."""
    iid = seed(store, 1, iid="pend1234abcd")
    store.set_plan(
        iid,
        {"actions": ["quarantine_node", "restart_job"]},
        "approve",
        [
            ("quarantine_node", {"node": "gpu-1"}),
            ("restart_job", {"env": [{"name": "WANDB_API_KEY", "value": SECRET_VALUE}]}),
        ],
    )
    store.set_status(iid, IncidentStatus.AWAITING_APPROVAL)
    return iid


def render(incident_id: str, fmt: str, lang: str) -> str:
    return f"<!doctype html><html><body><h1>report {incident_id} {lang}</h1></body></html>"


class Releases:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    async def __call__(self, node: str, incident_id: str) -> bool:
        self.calls.append((node, incident_id))
        return True


def make_app(store: IncidentStore | None, settings: ApiSettings | None = None, **kw: Any) -> FastAPI:
    kw.setdefault("render", render)
    return create_app(store=store, telemetry=Telemetry(), settings=settings or ApiSettings(token=TOKEN), env={}, **kw)


@contextlib.asynccontextmanager
async def client(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=BASE) as c:
        yield c


async def login(c: httpx.AsyncClient, name: str = "alice") -> str:
    """Sign in through the form; the session cookie (the client keeps it too)."""
    r = await c.post("/console/login", data={"token": TOKEN, "name": name, "next": "/console/incidents"})
    assert r.status_code == 303, r.text
    return str(r.cookies[SESSION_COOKIE])


def csrf_of(html: str) -> str:
    m = re.search(r'name="csrf" value="([^"]+)"', html)
    assert m, "no CSRF field in the page"
    return m.group(1)


# ------------------------------------------------------------------------------------------------
# Login and sessions


@pytest.mark.asyncio
async def test_login_sets_a_strict_httponly_expiring_cookie(store: IncidentStore) -> None:
    async with client(make_app(store)) as c:
        page = await c.get("/console/login")
        assert page.status_code == 200 and 'name="token"' in page.text
        r = await c.post("/console/login", data={"token": TOKEN, "name": "alice", "next": "/console/incidents?x=1"})
    assert r.status_code == 303 and r.headers["location"] == "/console/incidents?x=1"
    cookie = r.headers["set-cookie"]
    assert cookie.startswith(f"{SESSION_COOKIE}=")
    for attr in ("HttpOnly", "SameSite=strict", "Path=/console", "Max-Age=43200"):
        assert attr.lower() in cookie.lower(), cookie
    assert TOKEN not in cookie


@pytest.mark.parametrize(("token", "name", "status"), [("wrong", "alice", 401), ("", "alice", 401), (TOKEN, "", 400)])
@pytest.mark.asyncio
async def test_login_refused(store: IncidentStore, token: str, name: str, status: int) -> None:
    async with client(make_app(store)) as c:
        r = await c.post("/console/login", data={"token": token, "name": name})
    assert r.status_code == status
    assert SESSION_COOKIE not in r.headers.get("set-cookie", "")
    assert 'role="alert"' in r.text


@pytest.mark.parametrize("target", ["//evil.example/x", "https://evil.example/", "/api/v1/incidents", "/console\\x"])
@pytest.mark.asyncio
async def test_login_never_redirects_off_the_console(store: IncidentStore, target: str) -> None:
    async with client(make_app(store)) as c:
        r = await c.post("/console/login", data={"token": TOKEN, "name": "a", "next": target})
    assert r.headers["location"] == "/console/incidents"


@pytest.mark.asyncio
async def test_login_without_any_token_configured_is_impossible(store: IncidentStore) -> None:
    async with client(make_app(store, ApiSettings())) as c:
        page = await c.get("/console/login")
        r = await c.post("/console/login", data={"token": "anything", "name": "a"})
    assert "api.token" in page.text and 'name="token"' not in page.text
    assert r.status_code == 401


@pytest.mark.parametrize("path", ["/console/incidents", "/console/incidents/pend1234abcd", "/console/changes"])
@pytest.mark.asyncio
async def test_reads_need_a_session_or_the_token(store: IncidentStore, pending: str, path: str) -> None:
    async with client(make_app(store)) as c:
        anon = await c.get(path)
        bearer = await c.get(path, headers=AUTH)
        await login(c)
        session = await c.get(path)
    if path.endswith("changes"):
        assert anon.status_code == 401
    else:
        assert anon.status_code == 303 and anon.headers["location"].startswith("/console/login?next=")
    assert bearer.status_code == 200 and session.status_code == 200


@pytest.mark.asyncio
async def test_reads_are_open_when_read_auth_is_off(store: IncidentStore, pending: str) -> None:
    async with client(make_app(store, ApiSettings(token=TOKEN, read_auth=False))) as c:
        page = await c.get(f"/console/incidents/{pending}")
        # Reads are open, changes are not: no decision form for an anonymous reader, and a POST is refused.
        post = await c.post(f"/console/incidents/{pending}/approve", data={"by": "x"})
    assert page.status_code == 200 and 'id="approve-form"' not in page.text
    assert post.status_code == 401
    assert store.get(pending).status is IncidentStatus.AWAITING_APPROVAL


def test_sessions_expire_and_end_with_a_new_token() -> None:
    key = b"k" * 32
    sessions = Sessions(key, token="t1", ttl_s=60)
    _, cookie = sessions.issue("alice", now=T0)
    assert sessions.check(cookie, now=T0 + 59) is not None
    assert sessions.check(cookie, now=T0 + 60) is None
    assert Sessions(key, token="t2", ttl_s=60).check(cookie, now=T0) is None
    assert Sessions(b"x" * 32, token="t1", ttl_s=60).check(cookie, now=T0) is None
    body, mac = cookie.split(".")
    assert sessions.check(body[:-2] + "AA." + mac, now=T0) is None


@pytest.mark.asyncio
async def test_api_routes_still_need_the_bearer_token_with_a_console_session(
    store: IncidentStore, pending: str
) -> None:
    async with client(make_app(store)) as c:
        await login(c)
        r = await c.post(f"/api/v1/incidents/{pending}/approve", json={"by": "x"})
        listed = await c.get("/api/v1/incidents")
    assert r.status_code == 401 and listed.status_code == 401
    assert store.get(pending).status is IncidentStatus.AWAITING_APPROVAL


# ------------------------------------------------------------------------------------------------
# The list


@pytest.fixture
def varied(store: IncidentStore) -> dict[str, str]:
    ids = {
        "xid": seed(store, 1, fault_class="device_error", chip="nvidia", node="gpu-1", job="llama", status="resolved"),
        "oom": seed(store, 2, fault_class="accelerator_oom", chip="nvidia", node="gpu-2", job="gpt"),
        "hccl": seed(store, 3, fault_class="comm_init", chip="ascend", node="npu-1", job="pangu", status="blocked"),
        "other": seed(store, 4, fault_class="hang", chip="ascend", node="npu-2", job="pangu", namespace="research"),
    }
    return ids


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ({}, {"xid", "oom", "hccl", "other"}),
        ({"status": "resolved"}, {"xid"}),
        ({"status": "blocked"}, {"hccl"}),
        ({"fault_class": "accelerator_oom"}, {"oom"}),
        ({"chip": "ascend"}, {"hccl", "other"}),
        ({"node": "gpu-2"}, {"oom"}),
        ({"job": "pangu"}, {"hccl", "other"}),
        ({"job": "research/pangu"}, {"other"}),
        ({"chip": "ascend", "status": "blocked"}, {"hccl"}),
        ({"node": "no-such-node"}, set()),
    ],
)
@pytest.mark.asyncio
async def test_list_filters(
    store: IncidentStore, varied: dict[str, str], query: dict[str, str], expected: set[str]
) -> None:
    async with client(make_app(store)) as c:
        r = await c.get("/console/incidents", params=query, headers=AUTH)
    assert r.status_code == 200
    shown = set(re.findall(r'<tr data-id="([^"]+)"', r.text))
    assert shown == {varied[k] for k in expected}
    if not expected:
        assert LABELS["en"]["none_found"] in r.text


@pytest.mark.asyncio
async def test_list_time_range(store: IncidentStore, varied: dict[str, str]) -> None:
    # The seeding clock ticks one second per store write; the time range is read as UTC.
    created = {k: store.get(v).created for k, v in varied.items()}
    from datetime import UTC, datetime

    def iso(t: float) -> str:
        return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S")

    async with client(make_app(store)) as c:
        r = await c.get(
            "/console/incidents", params={"since": iso(created["oom"]), "until": iso(created["other"])}, headers=AUTH
        )
        bad = await c.get("/console/incidents", params={"since": "yesterday"}, headers=AUTH)
    assert set(re.findall(r'<tr data-id="([^"]+)"', r.text)) == {varied["oom"], varied["hccl"]}
    assert bad.status_code == 400 and "yesterday" in bad.text


@pytest.mark.parametrize(("page", "rows"), [(1, 50), (2, 50), (3, 20), (99, 0)])
@pytest.mark.asyncio
async def test_list_pages_newest_first(store: IncidentStore, page: int, rows: int) -> None:
    for n in range(120):
        seed(store, n)
    async with client(make_app(store)) as c:
        r = await c.get("/console/incidents", params={"page": page}, headers=AUTH)
    shown = re.findall(r'<tr data-id="inc(\d+)aaaa"', r.text)
    assert len(shown) == rows
    if rows:
        first = 119 - (page - 1) * 50
        assert [int(x) for x in shown] == list(range(first, first - rows, -1))
    assert "120" in r.text


@pytest.mark.asyncio
async def test_list_in_chinese(store: IncidentStore, varied: dict[str, str]) -> None:
    async with client(make_app(store)) as c:
        r = await c.get("/console/incidents", params={"lang": "zh"}, headers=AUTH)
        again = await c.get("/console/incidents", headers=AUTH)
    assert "中文：fault number 1" in r.text and LABELS["zh"]["incidents"] in r.text
    assert 'lang="zh-CN"' in again.text  # the choice is remembered in a cookie


# ------------------------------------------------------------------------------------------------
# The incident page


@pytest.mark.parametrize("shape", ["bare", "event"])
@pytest.mark.asyncio
async def test_incident_page_reads_either_stored_shape(store: IncidentStore, shape: str) -> None:
    """The responder stores the whole diagnosis event (the diagnosis under `diagnosis`); the page
    shows its root cause and evidence as it does for a bare diagnosis."""
    bare = diagnosis("GPU gpu-7 fell off the bus")
    stored = bare if shape == "bare" else {"kind": "diagnosis", "key": "job:train/j", "diagnosis": bare}
    store.open_incident(
        "shape0000aaaa",
        key="job:train/j",
        diagnosis=stored,
        revision=1,
        namespace="train",
        job="j",
        node="gpu-7",
        fault_class="device_error",
        code="xid:79",
        chip="nvidia",
    )
    async with client(make_app(store)) as c:
        r = await c.get("/console/incidents/shape0000aaaa", headers=AUTH)
    assert r.status_code == 200
    assert "GPU gpu-7 fell off the bus" in r.text and "Drain the node" in r.text
    assert "train.log:7" in r.text


@pytest.mark.asyncio
async def test_incident_page_parts(store: IncidentStore, pending: str, tmp_path: Path) -> None:
    scene = tmp_path / "scene"
    (scene / "logs").mkdir(parents=True)
    (scene / "manifest.json").write_text("{}")
    (scene / "logs" / "train.log").write_text("x" * 2048)
    store.set_scene(pending, str(scene))
    async with client(make_app(store)) as c:
        r = await c.get(f"/console/incidents/{pending[:6]}", headers=AUTH)
        report = await c.get(f"/console/incidents/{pending}/report?lang=zh", headers=AUTH)
    assert r.status_code == 200
    html = r.text
    for part in ('id="outcome"', 'id="decision"', 'id="plan"', 'id="timeline"', 'id="evidence"', 'id="scene"'):
        assert part in html
    assert "fault number 1" in html and "Drain the node" in html
    assert "train.log:7" in html and "GPU has fallen off the bus" in html
    assert "logs/train.log" in html and "2.0 KiB" in html
    assert "scene_saved" in html and "planned" in html
    assert f'src="/console/incidents/{pending}/scene/report.html?lang=en"' in html
    assert f'href="/console/incidents/{pending}/scene/logs/train.log"' in html
    assert report.status_code == 200 and f"report {pending} zh" in report.text
    assert "frame-ancestors 'self'" in report.headers["content-security-policy"]
    assert r.headers["referrer-policy"] == "no-referrer" and r.headers["cache-control"] == "no-store"


@pytest.mark.parametrize(
    "where",
    ["params", "timeline", "evidence"],
)
@pytest.mark.asyncio
async def test_no_page_shows_a_secret(store: IncidentStore, pending: str, where: str) -> None:
    if where == "timeline":
        store.note(pending, "restart_body", {"env": [{"name": "HF_TOKEN", "value": SECRET_VALUE}]})
    if where == "evidence":
        iid = seed(store, 9, iid="evid1234abcd")
        store.open_incident(
            iid,
            key="job:train/job-9",
            diagnosis=diagnosis("x", text=f"export AWS_SECRET_ACCESS_KEY={SECRET_VALUE}"),
            revision=2,
        )
    async with client(make_app(store)) as c:
        pages = [await c.get(f"/console/incidents/{i}", headers=AUTH) for i in (pending, "evid1234abcd")]
        pages.append(await c.get("/console/incidents", headers=AUTH))
    for p in pages:
        if p.status_code == 200:
            assert SECRET_VALUE not in p.text
            assert TOKEN not in p.text


@pytest.mark.asyncio
async def test_unknown_incident_is_a_404_page(store: IncidentStore) -> None:
    async with client(make_app(store)) as c:
        r = await c.get("/console/incidents/nope-nope", headers=AUTH)
    assert r.status_code == 404 and r.headers["content-type"].startswith("text/html")


@pytest.mark.asyncio
async def test_without_a_store_pages_say_so(store: IncidentStore) -> None:
    async with client(make_app(None)) as c:
        r = await c.get("/console/incidents", headers=AUTH)
    assert r.status_code == 503 and "remediate.store" in r.text


@pytest.mark.asyncio
async def test_changes_follow_the_store(store: IncidentStore, pending: str) -> None:
    async with client(make_app(store)) as c:
        before = (await c.get("/console/changes", headers=AUTH)).json()
        one = (await c.get("/console/changes", params={"incident": pending}, headers=AUTH)).json()
        store.set_status(pending, IncidentStatus.ACTING)
        after = (await c.get("/console/changes", headers=AUTH)).json()
        one_after = (await c.get("/console/changes", params={"incident": pending}, headers=AUTH)).json()
    assert before["count"] == after["count"] == 1
    assert after["updated"] > before["updated"]
    assert one["status"] == "awaiting_approval" and one_after["status"] == "acting"


# ------------------------------------------------------------------------------------------------
# Decisions, release and CSRF


@pytest.mark.parametrize(
    ("verb", "status", "decision"), [("approve", "acting", "approved"), ("reject", "rejected", "rejected")]
)
@pytest.mark.asyncio
async def test_decision_through_the_form(
    store: IncidentStore, pending: str, verb: str, status: str, decision: str
) -> None:
    async with client(make_app(store)) as c:
        await login(c, "alice")
        page = await c.get(f"/console/incidents/{pending}")
        r = await c.post(
            f"/console/incidents/{pending}/{verb}", data={"csrf": csrf_of(page.text), "by": "alice", "comment": "去吧"}
        )
        done = await c.get(r.headers["location"])
        again = await c.post(f"/console/incidents/{pending}/{verb}", data={"csrf": csrf_of(page.text), "by": "alice"})
    assert r.status_code == 303 and r.headers["location"] == f"/console/incidents/{pending}?done={decision}"
    incident = store.get(pending)
    assert incident.status.value == status
    assert (
        incident.approval is not None and incident.approval["by"] == "alice" and incident.approval["comment"] == "去吧"
    )
    assert 'id="done"' in done.text
    assert again.status_code == 409


@pytest.mark.asyncio
async def test_decision_with_the_bearer_token_needs_no_csrf(store: IncidentStore, pending: str) -> None:
    async with client(make_app(store)) as c:
        r = await c.post(f"/console/incidents/{pending}/approve", data={"by": "ci"}, headers=AUTH)
    assert r.status_code == 303
    assert store.get(pending).approval == {**(store.get(pending).approval or {}), "by": "ci"}


@pytest.mark.parametrize("case", ["no-session", "no-csrf", "wrong-csrf", "other-session-csrf", "bad-token-header"])
@pytest.mark.asyncio
async def test_changes_without_auth_or_csrf_are_refused(store: IncidentStore, pending: str, case: str) -> None:
    app = make_app(store, release_node=Releases())
    async with client(app) as other:
        await login(other, "mallory")
        foreign = csrf_of((await other.get(f"/console/incidents/{pending}")).text)
    async with client(app) as c:
        headers: dict[str, str] = {}
        data: dict[str, str] = {"by": "x"}
        if case not in {"no-session", "bad-token-header"}:
            await login(c)
        if case == "wrong-csrf":
            data["csrf"] = "A" * 43
        if case == "other-session-csrf":
            data["csrf"] = foreign
        if case == "bad-token-header":
            headers = {"Authorization": "Bearer not-the-token"}
        results = [
            await c.post(f"/console/incidents/{pending}/{verb}", data=data, headers=headers)
            for verb in ("approve", "reject", "release")
        ]
        logout = await c.post("/console/logout", data=data, headers=headers)
    expected = 401 if case in ("no-session", "bad-token-header") else 403
    assert [r.status_code for r in results] == [expected] * 3
    assert logout.status_code == expected
    assert store.get(pending).status is IncidentStatus.AWAITING_APPROVAL
    assert store.get(pending).approval is None


@pytest.fixture
def quarantined(store: IncidentStore) -> str:
    iid = seed(store, 5, iid="quar1234abcd", node="gpu-7")
    store.set_plan(iid, {"actions": ["quarantine_node"]}, "enforce", [("quarantine_node", {"node": "gpu-7"})])
    store.update_action(iid, 0, ActionState.DONE, result={"node": "gpu-7"})
    store.set_status(iid, IncidentStatus.RESOLVED)
    return iid


@pytest.mark.asyncio
async def test_release_a_quarantined_node(store: IncidentStore, quarantined: str) -> None:
    releases = Releases()
    async with client(make_app(store, release_node=releases)) as c:
        await login(c, "bob")
        page = await c.get(f"/console/incidents/{quarantined}")
        assert 'id="release-form"' in page.text
        r = await c.post(f"/console/incidents/{quarantined}/release", data={"csrf": csrf_of(page.text)})
        after = await c.get(f"/console/incidents/{quarantined}")
        again = await c.post(f"/console/incidents/{quarantined}/release", data={"csrf": csrf_of(page.text)})
    assert r.status_code == 303 and releases.calls == [("gpu-7", quarantined)]
    assert store.timeline(quarantined)[-1]["kind"] == "node_released"
    assert store.timeline(quarantined)[-1]["detail"] == {"node": "gpu-7", "by": "bob", "changed": True}
    assert 'id="release-form"' not in after.text
    assert again.status_code == 409 and releases.calls == [("gpu-7", quarantined)]


@pytest.mark.asyncio
async def test_release_without_a_cluster_says_how(store: IncidentStore, quarantined: str) -> None:
    async with client(make_app(store)) as c:
        page = await c.get(f"/console/incidents/{quarantined}", headers=AUTH)
        r = await c.post(f"/console/incidents/{quarantined}/release", headers=AUTH)
    assert f"trainmedic release-node gpu-7 --incident {quarantined}" in page.text
    assert r.status_code == 503


# ------------------------------------------------------------------------------------------------
# Signed approve links


def link_path(
    settings: ApiSettings, incident_id: str, *, now: float, token: str = TOKEN, action: str = "approve"
) -> str:
    links = message_links(settings, token=token, env={})
    assert links is not None
    url = (links.approve_url if action == "approve" else links.reject_url)(incident_id, now)
    assert url is not None and url.startswith(f"{settings.public_url}/console/link/")
    return url[len(str(settings.public_url)) :]


PUBLIC = ApiSettings(token=TOKEN, public_url="https://trainmedic.example")


@pytest.mark.parametrize("action", ["approve", "reject"])
@pytest.mark.asyncio
async def test_signed_link_confirms_then_decides_once(store: IncidentStore, pending: str, action: str) -> None:
    import time

    path = link_path(PUBLIC, pending, now=time.time(), action=action)
    async with client(make_app(store, PUBLIC)) as c:
        # Opening the link (a chat preview does this too) changes nothing.
        first = await c.get(path)
        second = await c.get(path)
        assert store.get(pending).status is IncidentStatus.AWAITING_APPROVAL
        assert first.status_code == second.status_code == 200 and 'id="confirm-form"' in first.text
        assert SECRET_VALUE not in first.text
        r = await c.post(path, data={"csrf": csrf_of(first.text), "by": "carol"})
        reused = await c.post(path, data={"csrf": csrf_of(first.text), "by": "carol"})
        reopened = await c.get(path)
    done = "link_done" if action == "approve" else "link_done_reject"
    assert LABELS["en"]["confirm_button" if action == "approve" else "confirm_button_reject"] in first.text
    assert r.status_code == 200 and LABELS["en"][done] in r.text
    incident = store.get(pending)
    assert incident.status is (IncidentStatus.ACTING if action == "approve" else IncidentStatus.REJECTED)
    assert incident.approval is not None and incident.approval["by"] == f"carol ({action} link)"
    assert reused.status_code == 410 and reopened.status_code == 410
    assert LABELS["en"]["link_used"] in reused.text


@pytest.mark.parametrize("case", ["expired", "forged", "tampered", "other-key", "no-csrf", "no-name", "not-pending"])
@pytest.mark.asyncio
async def test_signed_links_that_cannot_be_used(store: IncidentStore, pending: str, case: str) -> None:
    import time

    now = time.time()
    path = link_path(PUBLIC, pending, now=now - PUBLIC.approve_link_ttl_s - 1 if case == "expired" else now)
    token = path.rsplit("/", 1)[1]
    if case == "forged":
        path = "/console/link/eyJpIjoieCJ9.AAAA"
    if case == "tampered":
        mac = token.split(".")[1]
        other = Links(b"z" * 32, ttl_s=60).make("resolved-one", "approve", now=now).split(".")[0]
        path = f"/console/link/{other}.{mac}"
    if case == "other-key":
        path = link_path(PUBLIC, pending, now=now, token="another-token")
    if case == "not-pending":
        store.approve(pending, by="dave")
    async with client(make_app(store, PUBLIC)) as c:
        page = await c.get(path)
        csrf = csrf_of(page.text) if page.status_code == 200 else "x"
        data = {"csrf": "" if case == "no-csrf" else csrf, "by": "" if case == "no-name" else "eve"}
        r = await c.post(path, data=data)
    expected = {
        "expired": (410, 410),
        "forged": (403, 403),
        "tampered": (403, 403),
        "other-key": (403, 403),
        "no-csrf": (200, 403),
        "no-name": (200, 400),
        "not-pending": (409, 403),
    }[case]
    assert (page.status_code, r.status_code) == expected
    assert r.headers["content-type"].startswith("text/html")
    status = store.get(pending).status
    assert status is (IncidentStatus.ACTING if case == "not-pending" else IncidentStatus.AWAITING_APPROVAL)
    if case != "not-pending":
        assert store.get(pending).approval is None


@pytest.mark.parametrize("first", ["approve", "reject"])
@pytest.mark.asyncio
async def test_the_other_decision_link_is_refused_once_one_was_used(
    store: IncidentStore, pending: str, first: str
) -> None:
    """A message carries both links: once one decided, the other finds no plan waiting (409)."""
    import time

    now = time.time()
    other = "reject" if first == "approve" else "approve"
    async with client(make_app(store, PUBLIC)) as c:
        used = link_path(PUBLIC, pending, now=now, action=first)
        page = await c.get(used)
        assert (await c.post(used, data={"csrf": csrf_of(page.text), "by": "carol"})).status_code == 200
        later = await c.get(link_path(PUBLIC, pending, now=now, action=other))
    assert later.status_code == 409
    assert store.get(pending).status is (IncidentStatus.ACTING if first == "approve" else IncidentStatus.REJECTED)


def test_links_need_a_key_and_a_public_url() -> None:
    assert message_links(ApiSettings(token=TOKEN), token=TOKEN, env={}) is None
    no_key = message_links(ApiSettings(public_url="https://t.example"), token=None, env={})
    assert no_key is not None and no_key[0]("abc") == "https://t.example/console/incidents/abc"
    assert no_key[1]("abc", T0) is None
    # A configured console secret is used rather than the token; each purpose has its own key.
    with_secret = ApiSettings(token=TOKEN, console_secret="s" * 32)
    assert console_key(with_secret, TOKEN, {}) != console_key(ApiSettings(token=TOKEN), TOKEN, {})


# ------------------------------------------------------------------------------------------------
# Links in chat messages


def awaiting_notice(**kw: Any) -> Notice:
    return Notice(
        incident_id="pend1234abcd",
        status="awaiting_approval",
        time=T0,
        severity="critical",
        fault_class="device_error",
        code="xid:79",
        chip="nvidia",
        vendor_action=None,
        action=None,
        node="gpu-1",
        device=None,
        rank=None,
        namespace="train",
        job="llama",
        job_kind="PyTorchJob",
        summary={"en": "GPU fell off the bus", "zh": "GPU 掉卡"},
        hint=None,
        mode="approve",
        actions=(),
        scene_dir=None,
        **kw,
    )


@pytest.mark.parametrize("kind", ["feishu", "dingtalk", "wecom", "slack", "cloudevents"])
@pytest.mark.parametrize("lang", ["en", "zh"])
def test_chat_messages_link_the_incident_and_the_decision_links(kind: str, lang: str) -> None:
    links = message_links(PUBLIC, token=TOKEN, env={})
    assert links is not None
    page, approve = links.incident_url("pend1234abcd"), links.approve_url("pend1234abcd", T0)
    reject = links.reject_url("pend1234abcd", T0)
    n = awaiting_notice(incident_url=page, approve_url=approve, reject_url=reject)
    body = {
        "feishu": lambda: payloads.feishu_message([n], lang=lang, secret=None, timestamp=int(T0)),
        "dingtalk": lambda: payloads.dingtalk_message([n], lang=lang),
        "wecom": lambda: payloads.wecom_message([n], lang=lang),
        "slack": lambda: payloads.slack_message([n], lang=lang),
        "cloudevents": lambda: payloads.cloudevent(n, source="trainmedic"),
    }[kind]()
    text = payloads.encode_body(body).decode()
    assert page in text and str(approve) in text and str(reject) in text
    if kind != "cloudevents":
        words = payloads._L[lang]
        assert words["console"] in text and words["approve"] in text and words["reject"] in text
    # The notice survives the outbox's round trip with its links.
    assert Notice.from_dict(n.as_dict()) == n


def test_only_a_plan_awaiting_approval_carries_an_approve_link() -> None:
    n = awaiting_notice(incident_url="https://t/console/incidents/x", approve_url="https://t/console/link/abc.def")
    resolved = Notice.from_dict({**n.as_dict(), "status": "resolved"})
    text = payloads.notice_text([resolved], lang="en")[1]
    assert "https://t/console/incidents/x" in text and "console/link" not in text
    # Without a console, stored notices and CloudEvents look as before (no new keys).
    assert "incident_url" not in awaiting_notice().as_dict()


def test_labels_have_both_languages() -> None:
    assert set(LABELS["en"]) == set(LABELS["zh"])
    for lang in ("en", "zh"):
        for k, v in LABELS[lang].items():
            assert v.strip(), f"{lang}.{k} is empty"


@pytest.mark.asyncio
async def test_console_can_be_turned_off(store: IncidentStore) -> None:
    async with client(make_app(store, ApiSettings(token=TOKEN, console=False))) as c:
        r = await c.get("/console/login")
    assert r.status_code == 404


@pytest.mark.parametrize(("status", "approve_link"), [("awaiting_approval", True), ("blocked", False)])
@pytest.mark.asyncio
async def test_the_notifier_queues_notices_with_the_console_links(
    store: IncidentStore, pending: str, tmp_path: Path, status: str, approve_link: bool
) -> None:
    """`trainmedic run` builds its notifier with api settings: the queued notice links the incident's
    page and, while a plan awaits approval, carries an approve link that this console accepts."""
    import time

    from trainmedic.agent.config import NotifySettings
    from trainmedic.agent.notify import build_notifier
    from trainmedic.events import IncidentEvent, JobRef, make_event

    settings = NotifySettings.model_validate({"sinks": [{"kind": "slack", "url": "http://127.0.0.1:9/hook"}]})
    notifier = build_notifier(
        settings, store_path=str(tmp_path / "outbox.db"), store=None, telemetry=Telemetry(), api=PUBLIC, env={}
    )
    assert notifier is not None
    try:
        payload = IncidentEvent(incident_id=pending, status=status, job=JobRef(namespace="train", name="llama"))
        await notifier.enqueue(make_event(payload, producer="test", at=time.time()))
        (item,) = notifier.outbox.due("slack", now=time.time() + 1, limit=10)
    finally:
        await notifier.aclose()
        notifier.outbox.close()
    notice = item.notice
    assert notice.incident_url == f"https://trainmedic.example/console/incidents/{pending}"
    assert (notice.approve_url is not None) is (notice.reject_url is not None) is approve_link
    if notice.approve_url is not None and notice.reject_url is not None:
        async with client(make_app(store, PUBLIC)) as c:
            for url in (notice.approve_url, notice.reject_url):
                page = await c.get(url.removeprefix("https://trainmedic.example"))
                assert page.status_code == 200 and 'id="confirm-form"' in page.text


@pytest.mark.parametrize(("site", "status"), [("cross-site", 200), ("same-origin", 303), (None, 303)])
@pytest.mark.asyncio
async def test_a_link_from_another_site_reloads_once_for_the_strict_cookie(
    store: IncidentStore, pending: str, site: str | None, status: int
) -> None:
    headers = {"Sec-Fetch-Site": site} if site else {}
    async with client(make_app(store)) as c:
        r = await c.get(f"/console/incidents/{pending}", headers=headers)
    assert r.status_code == status
    if status == 200:
        assert '<meta http-equiv="refresh" content="0">' in r.text and pending not in r.text


def test_a_version_1_store_is_upgraded_in_place(tmp_path: Path) -> None:
    """A store written before the console (schema 1) gains the list indexes and the used-links table,
    and its incidents stay as they were."""
    import sqlite3

    from trainmedic.agent.store import MIGRATIONS

    path = tmp_path / "v1.db"
    db = sqlite3.connect(path)
    with db:
        db.execute("CREATE TABLE incident_schema_version (version INTEGER NOT NULL)")
        for statement in MIGRATIONS[0].split(";"):
            if statement.strip():
                db.execute(statement)
        db.execute("INSERT INTO incident_schema_version (version) VALUES (1)")
        db.execute(
            "INSERT INTO incidents (id, key, status, created, updated, diagnosis) VALUES (?, ?, ?, ?, ?, ?)",
            ("old1234abcd", "job:a/b", "awaiting_approval", T0, T0, '{"root_cause": null}'),
        )
    db.close()
    store = IncidentStore(path)
    try:
        assert store.schema_version == len(MIGRATIONS) == 2
        total, rows = store.search(filters={"status": "awaiting_approval"})
        assert total == 1 and rows[0].id == "old1234abcd" and rows[0].summary_en is None
        store.approve("old1234abcd", by="x", link_nonce="n1")
        assert store.link_used("n1")
        plan = store._db.execute(
            "EXPLAIN QUERY PLAN SELECT id FROM incidents WHERE chip = ? ORDER BY created DESC", ("x",)
        )
        assert "incidents_chip" in " ".join(str(r) for r in plan.fetchall())
    finally:
        store.close()


def test_a_used_link_nonce_decides_nothing(store: IncidentStore, pending: str) -> None:
    from trainmedic.agent.store import LinkUsedError

    other = seed(store, 2, iid="pend2222abcd", status="awaiting_approval")
    store.approve(pending, by="a", link_nonce="same")
    with pytest.raises(LinkUsedError):
        store.approve(other, by="b", link_nonce="same")
    assert store.get(other).status is IncidentStatus.AWAITING_APPROVAL and store.get(other).approval is None


@pytest.mark.parametrize(
    "path", ["/console/../api/v1/incidents/{id}/approve", "/console/%2e%2e/api/v1/incidents/{id}/approve"]
)
@pytest.mark.asyncio
async def test_the_console_prefix_opens_no_api_route(store: IncidentStore, pending: str, path: str) -> None:
    """The API's middleware leaves /console/... to the console; a path that only starts with it (as a
    client may send it, not normalised) reaches no API route."""
    app = make_app(store)
    raw = path.format(id=pending)
    sent: list[dict[str, Any]] = []
    body = b'{"by": "mallory"}'
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": raw.replace("%2e", "."),
        "raw_path": raw.encode(),
        "query_string": b"",
        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        "server": ("testserver", 80),
        "client": ("127.0.0.1", 1234),
        "root_path": "",
    }

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: Any) -> None:
        sent.append(dict(message))

    await app(scope, receive, send)
    assert sent[0]["status"] == 404
    assert store.get(pending).status is IncidentStatus.AWAITING_APPROVAL


def stack_report(incident_id: str, fmt: str, lang: str) -> str:
    """A report that links a saved stack dump relatively, as reports/templates/report.html.j2 does."""
    return f'<!doctype html><html><body><a href="stacks/rank%201.txt">stack</a> {incident_id} {lang}</body></html>'


@pytest.fixture
def with_scene(store: IncidentStore, pending: str, tmp_path: Path) -> Path:
    scene = tmp_path / "scenes" / pending
    (scene / "stacks").mkdir(parents=True)
    (scene / "layout" / "node-a").mkdir(parents=True)
    (scene / "manifest.json").write_text('{"files": []}')
    (scene / "stacks" / "rank 1.txt").write_text("Thread 0x7f (most recent call first):\n  File train.py\n")
    (scene / "layout" / "node-a" / "dmesg").write_text("NVRM: Xid 79\n")
    (scene / "layout" / "node-a" / "rank0.log").write_text("<script>alert(1)</script>\n")
    (scene / "bundle.tar.gz").write_bytes(b"\x1f\x8b\x08\x00")
    (scene / ".manifest.json.tmp").write_text("{}")
    (tmp_path / "scenes" / "secret.txt").write_text(SECRET_VALUE)
    (tmp_path / "outside.txt").write_text(SECRET_VALUE)
    (scene / "layout" / "escape.log").symlink_to(tmp_path / "outside.txt")
    (scene / "linked").symlink_to(tmp_path / "scenes", target_is_directory=True)
    store.set_scene(pending, str(scene))
    return scene


@pytest.mark.asyncio
async def test_the_reports_relative_links_reach_the_scene_files(
    store: IncidentStore, pending: str, with_scene: Path
) -> None:
    async with client(make_app(store, render=stack_report)) as c:
        report_url = f"/console/incidents/{pending}/scene/report.html?lang=en"
        report = await c.get(report_url, headers=AUTH)
        assert report.status_code == 200
        href = re.search(r'href="([^"]+)"', report.text)
        assert href is not None
        stack = await c.get(str(httpx.URL(BASE + report_url).join(href.group(1))), headers=AUTH)
    assert stack.status_code == 200
    assert stack.text.startswith("Thread 0x7f")
    assert stack.headers["content-type"] == "text/plain; charset=utf-8"


@pytest.mark.parametrize(
    ("rel", "media"),
    [
        ("layout/node-a/dmesg", "text/plain; charset=utf-8"),
        ("manifest.json", "text/plain; charset=utf-8"),
        # A log holding markup is text, never a page of this site.
        ("layout/node-a/rank0.log", "text/plain; charset=utf-8"),
        ("bundle.tar.gz", "application/octet-stream"),
    ],
)
@pytest.mark.asyncio
async def test_scene_files_are_served_as_data(
    store: IncidentStore, pending: str, with_scene: Path, rel: str, media: str
) -> None:
    async with client(make_app(store)) as c:
        r = await c.get(f"/console/incidents/{pending}/scene/{rel}", headers=AUTH)
    assert r.status_code == 200
    assert r.content == (with_scene / rel).read_bytes()
    assert r.headers["content-type"] == media
    assert (
        "sandbox" in r.headers["content-security-policy"]
        and "default-src 'none'" in r.headers["content-security-policy"]
    )
    assert r.headers["x-content-type-options"] == "nosniff"
    assert r.headers["content-disposition"].startswith(
        "attachment" if media == "application/octet-stream" else "inline"
    )


@pytest.mark.parametrize(
    "rel",
    [
        "../secret.txt",
        "..%2Fsecret.txt",
        "%2e%2e/secret.txt",
        "stacks/../../secret.txt",
        "layout/escape.log",
        "linked/secret.txt",
        ".manifest.json.tmp",
        "stacks",
        "stacks/",
        "missing.log",
        "%2Ftmp%2Fsecret.txt",
        "stacks%5C..%5C..%5Csecret.txt",
    ],
)
@pytest.mark.asyncio
async def test_nothing_outside_the_scene_bundle_is_served(
    store: IncidentStore, pending: str, with_scene: Path, rel: str
) -> None:
    async with client(make_app(store)) as c:
        r = await c.get(f"/console/incidents/{pending}/scene/{rel}", headers=AUTH)
    assert r.status_code == 404
    assert SECRET_VALUE not in r.text


@pytest.mark.asyncio
async def test_scene_files_need_a_session_or_the_token(store: IncidentStore, pending: str, with_scene: Path) -> None:
    async with client(make_app(store)) as c:
        r = await c.get(f"/console/incidents/{pending}/scene/layout/node-a/dmesg")
    assert r.status_code in (303, 401)
    assert "Xid 79" not in r.text
