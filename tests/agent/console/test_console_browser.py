"""The web console in a real browser: Debian's Chromium driven by `playwright` against the API served
by uvicorn on a loopback port. Login, the list's filters, the incident page, approving a pending plan,
a refused form with a forged CSRF token, the signed approve link, live updates, and screenshots of
the English and Chinese reports at desktop and phone width (no horizontal overflow, CJK glyphs drawn)."""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from servers.chromium import ARGS, require_chromium

from trainmedic.agent.api import ApiServer, create_app
from trainmedic.agent.config import ApiSettings
from trainmedic.agent.console.security import message_links
from trainmedic.agent.reporting import report_context
from trainmedic.agent.store import ActionState, IncidentStatus, IncidentStore
from trainmedic.agent.telemetry import Telemetry
from trainmedic.detectors.diagnose import make_engine
from trainmedic.reports.report import render_report

TOKEN = "br0wser-t0ken"
XID79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid=2876, name=python, GPU has fallen off the bus."
PENDING = "pend0000browser0001"
RESOLVED = "reso0000browser0002"
WIDTHS = {"desktop": 1280, "phone": 390}
# Where screenshots are kept when set (they go to the test's tmp_path otherwise).
SHOTS_ENV = "TRAINMEDIC_SCREENSHOTS"

# The page's own horizontal overflow, and whether CJK text is drawn with real glyphs: two different
# ideographs of the page must rasterise differently from each other and from a code point no font
# has (where no CJK font is installed, all three come out as the same missing-glyph box).
OVERFLOW_JS = "() => [document.scrollingElement.scrollWidth, window.innerWidth]"
CJK_JS = """() => {
  const text = document.body.innerText;
  const chars = [...new Set(Array.from(text).filter(c => /[\\u4e00-\\u9fff]/.test(c)))];
  if (chars.length < 2) { return 'fewer than two CJK characters on the page'; }
  const family = getComputedStyle(document.body).fontFamily;
  const draw = (c) => {
    const canvas = document.createElement('canvas');
    canvas.width = 48; canvas.height = 48;
    const ctx = canvas.getContext('2d');
    ctx.font = '40px ' + family;
    ctx.fillStyle = '#000';
    ctx.fillText(c, 2, 40);
    return Array.from(ctx.getImageData(0, 0, 48, 48).data).join(',');
  };
  const a = draw(chars[0]), b = draw(chars[1]), none = draw('\\u{10FFFD}');
  if (a === b) { return 'two CJK characters look the same: ' + chars[0] + chars[1]; }
  if (a === none || b === none) { return 'CJK characters drawn as missing glyphs'; }
  return 'ok';
}"""


def _diagnosis() -> dict[str, Any]:
    from trainmedic.agent.api import diagnose_blobs

    engine = make_engine(())
    d = diagnose_blobs([("train.log", (XID79 + "\n").encode())], engine)
    return d.model_dump(mode="json")


@dataclass
class Console:
    url: str
    store: IncidentStore
    settings: ApiSettings
    page: Any
    browser: Any


def _seed(store: IncidentStore) -> None:
    diagnosis = _diagnosis()
    for iid, job, node, status in (
        (PENDING, "llama", "gpu-1", IncidentStatus.AWAITING_APPROVAL),
        (RESOLVED, "gpt", "gpu-2", IncidentStatus.RESOLVED),
    ):
        store.open_incident(
            iid,
            key=f"job:train/{job}",
            diagnosis=diagnosis,
            revision=1,
            namespace="train",
            job=job,
            job_kind="PyTorchJob",
            node=node,
            fault_class="device_error",
            code="xid:79",
            chip="nvidia",
        )
        store.set_plan(
            iid,
            {"actions": ["quarantine_node", "restart_job"], "fault_class": "device_error"},
            "approve" if status is IncidentStatus.AWAITING_APPROVAL else "enforce",
            [("quarantine_node", {"node": node}), ("restart_job", {"job": job})],
        )
        if status is IncidentStatus.RESOLVED:
            store.update_action(iid, 0, ActionState.DONE, result={"node": node})
            store.update_action(iid, 1, ActionState.DONE, result={"resumed_from": "checkpoint-20"})
        store.set_status(iid, status)


@pytest_asyncio.fixture
async def console(tmp_path: Path) -> AsyncIterator[Console]:
    chromium = require_chromium()
    from playwright.async_api import async_playwright

    store = IncidentStore(tmp_path / "incidents.db")
    _seed(store)
    settings = ApiSettings(token=TOKEN, port=0, public_url="http://127.0.0.1")

    def render(incident_id: str, fmt: str, lang: str) -> str:
        return render_report(report_context(store, incident_id), fmt=fmt, lang=lang)

    app = create_app(store=store, telemetry=Telemetry(), settings=settings, render=render, env={})
    async with ApiServer(app, settings) as server, async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=chromium, args=ARGS)
        try:
            context = await browser.new_context(viewport={"width": 1280, "height": 900})
            page = await context.new_page()
            page.set_default_timeout(20_000)
            yield Console(url=server.url, store=store, settings=settings, page=page, browser=browser)
        finally:
            await browser.close()
    store.close()


async def _login(c: Console, name: str = "alice") -> None:
    await c.page.goto(f"{c.url}/console/incidents")
    assert "/console/login" in c.page.url
    await c.page.fill("input[name=name]", name)
    await c.page.fill("input[name=token]", TOKEN)
    await c.page.click("#login button[type=submit]")
    await c.page.wait_for_url("**/console/incidents")


async def _ids(c: Console) -> set[str]:
    return set(await c.page.eval_on_selector_all("tr[data-id]", "rows => rows.map(r => r.dataset.id)"))


@pytest.mark.asyncio
async def test_login_and_the_list(console: Console) -> None:
    await _login(console)
    assert await _ids(console) == {PENDING, RESOLVED}
    cookies = await console.page.context.cookies()
    session = next(c for c in cookies if c["name"] == "trainmedic_session")
    assert session["httpOnly"] and session["sameSite"] == "Strict" and session["path"] == "/console"
    assert TOKEN not in await console.page.content()


@pytest.mark.parametrize(
    ("field", "value", "expected"), [("status", "awaiting_approval", {PENDING}), ("node", "gpu-2", {RESOLVED})]
)
@pytest.mark.asyncio
async def test_list_filters_in_the_browser(console: Console, field: str, value: str, expected: set[str]) -> None:
    await _login(console)
    if field == "status":
        await console.page.select_option("select[name=status]", value)
    else:
        await console.page.fill(f"input[name={field}]", value)
    await console.page.click("#filters button[type=submit]")
    await console.page.wait_for_url(f"**{field}={value}**")
    assert await _ids(console) == expected


@pytest.mark.asyncio
async def test_incident_page_and_approve_through_the_ui(console: Console) -> None:
    await _login(console, "alice")
    await console.page.click(f"tr[data-id={PENDING}] a")
    await console.page.wait_for_url(f"**/console/incidents/{PENDING}")
    assert await console.page.is_visible("#outcome")
    assert "GPU has fallen off the bus" in await console.page.inner_text("#evidence")
    # The report, framed: the same page `trainmedic report` writes, under the session's auth.
    frame = console.page.frame_locator("#report iframe")
    await frame.locator(f"text={PENDING}").first.wait_for()
    await console.page.fill("#approve-form input[name=comment]", "go ahead")
    await console.page.click("#approve")
    await console.page.wait_for_url("**done=approved")
    assert await console.page.is_visible("#done")
    incident = console.store.get(PENDING)
    assert incident.status is IncidentStatus.ACTING
    assert incident.approval is not None and incident.approval["by"] == "alice"
    assert incident.approval["comment"] == "go ahead"


@pytest.mark.asyncio
async def test_a_forged_csrf_token_is_refused_in_the_browser(console: Console) -> None:
    await _login(console)
    await console.page.goto(f"{console.url}/console/incidents/{PENDING}")
    await console.page.eval_on_selector("#approve-form input[name=csrf]", "el => { el.value = 'forged'; }")
    await console.page.click("#approve")
    await console.page.wait_for_selector("#message")
    assert "CSRF" in await console.page.inner_text("#message")
    assert console.store.get(PENDING).status is IncidentStatus.AWAITING_APPROVAL


@pytest.mark.asyncio
async def test_signed_link_confirmation_in_the_browser(console: Console) -> None:
    links = message_links(console.settings, token=TOKEN, env={})
    assert links is not None
    url = links[1](PENDING, time.time())
    assert url is not None
    path = url.removeprefix("http://127.0.0.1")
    # No session: the link alone authorises its one decision, after a press of the button.
    await console.page.goto(f"{console.url}{path}")
    assert await console.page.is_visible("#confirm-form")
    assert console.store.get(PENDING).status is IncidentStatus.AWAITING_APPROVAL
    await console.page.fill("#confirm-form input[name=by]", "carol")
    await console.page.click("#confirm-button")
    await console.page.wait_for_selector("#message.ok")
    assert console.store.get(PENDING).status is IncidentStatus.ACTING
    await console.page.goto(f"{console.url}{path}")
    assert "once" in await console.page.inner_text("#message")


@pytest.mark.asyncio
async def test_live_updates(console: Console) -> None:
    await _login(console)
    await console.page.goto(f"{console.url}/console/incidents/{PENDING}")
    assert await console.page.is_visible("#approve-form")
    # Another hand decides (the CLI, the API): the open page follows without a reload by the person.
    console.store.approve(PENDING, by="bob", approve=False)
    await console.page.wait_for_selector("#decision >> text=bob", timeout=30_000)
    assert not await console.page.is_visible("#approve-form")


def _shots_dir(tmp_path: Path) -> Path:
    where = Path(os.environ.get(SHOTS_ENV) or tmp_path)
    where.mkdir(parents=True, exist_ok=True)
    return where


@pytest.mark.parametrize("width", list(WIDTHS))
@pytest.mark.parametrize("lang", ["en", "zh"])
@pytest.mark.parametrize("what", ["report", "incident", "list"])
@pytest.mark.asyncio
async def test_pages_fit_the_screen_and_draw_cjk(
    console: Console, tmp_path: Path, what: str, lang: str, width: str
) -> None:
    await _login(console)
    context = console.page.context
    page = await context.new_page()
    await page.set_viewport_size({"width": WIDTHS[width], "height": 900})
    path = {
        "report": f"/console/incidents/{RESOLVED}/report?lang={lang}",
        "incident": f"/console/incidents/{RESOLVED}?lang={lang}",
        "list": f"/console/incidents?lang={lang}",
    }[what]
    await page.goto(f"{console.url}{path}")
    await page.wait_for_load_state("load")
    shot = _shots_dir(tmp_path) / f"{what}-{lang}-{width}.png"
    await page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 0
    scroll_width, inner_width = await page.evaluate(OVERFLOW_JS)
    assert scroll_width <= inner_width, f"{what} ({lang}, {width}) is {scroll_width} px wide in {inner_width} px"
    if lang == "zh":
        assert await page.evaluate(CJK_JS) == "ok"
    await page.close()


@pytest.mark.asyncio
async def test_a_link_from_another_site_lands_on_the_page_when_signed_in(console: Console) -> None:
    """A chat's web page is another site: the SameSite=Strict cookie is held back on that navigation,
    and the console's one reload from its own site brings it (no second login)."""
    await _login(console)
    other_site = console.url.replace("127.0.0.1", "localhost")
    await console.page.goto(f"{other_site}/console/login")
    target = f"{console.url}/console/incidents/{PENDING}"
    await console.page.set_content(f'<a id="chat-link" href="{target}">incident</a>')
    await console.page.click("#chat-link")
    await console.page.wait_for_selector("#outcome")
    assert console.page.url == target


@pytest.mark.parametrize(("ci", "outcome"), [("true", pytest.fail.Exception), ("", pytest.skip.Exception)])
def test_a_missing_chromium_fails_under_ci_and_skips_elsewhere(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, ci: str, outcome: type[BaseException]
) -> None:
    monkeypatch.setenv("CI", ci)
    monkeypatch.setenv("TRAINMEDIC_CHROMIUM", str(tmp_path / "no-such-chromium"))
    with pytest.raises(outcome):
        require_chromium()
