"""Reports as a browser shows them, at phone width: nothing runs off the page, however long the
vendor's mnemonic, the scene path or a stack file's name; the saved stacks are links that open.
Debian's Chromium driven by `playwright` (tests/servers/chromium.py): skipped where it is missing,
failed under CI=true."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from servers.chromium import ARGS, require_chromium

from trainmedic.agent.reporting import report_context
from trainmedic.agent.store import ActionState, IncidentStatus, IncidentStore
from trainmedic.reports.report import LANGS, render_report

PHONE = 390
XID79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid=2876, name=python, GPU has fallen off the bus."
# A long unbroken word in prose (a mnemonic), a long path and a long pod name.
DEEP = "scenes-kept-for-a-long-time/" + "/".join(["a-very-long-directory-name-without-any-break"] * 3)
POD = "llama3-70b-pretrain-with-a-rather-long-name-worker-0-abcdef"


@pytest.fixture
def report_dir(tmp_path: Path) -> Iterator[tuple[IncidentStore, Path]]:
    scene = tmp_path / DEEP
    (scene / "stacks-before-restart").mkdir(parents=True)
    (scene / "stacks-before-restart" / f"{POD}.txt").write_text("Thread 0x1 (most recent call first):\n")
    (scene / "manifest.json").write_text('{"files": [], "pods": []}')
    store = IncidentStore(tmp_path / "s.db")
    # A hang (its stacks are linked from the top block) whose summary carries a vendor mnemonic.
    rc = {
        "fault_class": "hang",
        "chip": "nvidia",
        "code": "xid:79",
        "action": "reboot_node",
        "vendor_action": "RESTART_BM",
        "node": "gpu-2",
        "device": "0000:3b:00",
        "summary": {
            "en": "GPU 0000:3b:00 reported Xid 79. Vendor: xid:79 ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS: gone.",
            "zh": "GPU 0000:3b:00 上报 Xid 79。厂商说明（xid:79 ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS）：掉卡。",
        },
        "hint": {"en": "Keep `nvidia-smi -q` output.", "zh": "保存 `nvidia-smi -q` 输出。"},
    }
    finding = {"file": "kernel.log", "line_no": 7, "code": "xid:79", "rule_id": "nvidia.xid", "text": XID79 * 3}
    store.open_incident(
        "inc-phone",
        key="job:train/llama",
        diagnosis={"root_cause": rc, "findings": [finding]},
        revision=1,
        namespace="train",
        job="llama3-70b-pretrain-with-a-rather-long-name",
        job_kind="Job",
        node="gpu-2",
        fault_class="hang",
        code="xid:79",
        chip="nvidia",
    )
    store.set_scene("inc-phone", str(scene), {"files": 0})
    store.set_plan("inc-phone", {"mode": "enforce"}, "enforce", [("dump_stacks", {}), ("quarantine_node", {})])
    store.update_action(
        "inc-phone", 0, ActionState.DONE, result={"files": [f"stacks-before-restart/{POD}.txt"], "dumped": 1}
    )
    store.update_action("inc-phone", 1, ActionState.DONE, result={"node": "gpu-2"})
    store.set_status("inc-phone", IncidentStatus.RESOLVED)
    yield store, scene
    store.close()


@pytest.mark.asyncio
@pytest.mark.parametrize("lang", LANGS)
async def test_report_fits_a_phone_and_its_stack_links_open(report_dir: tuple[IncidentStore, Path], lang: str) -> None:
    chromium = require_chromium()
    from playwright.async_api import async_playwright

    store, scene = report_dir
    page_path = scene / f"report.{lang}.html"
    page_path.write_text(render_report(report_context(store, "inc-phone"), fmt="html", lang=lang), encoding="utf-8")
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=chromium, args=ARGS)
        try:
            page = await browser.new_page(viewport={"width": PHONE, "height": 900})
            page.set_default_timeout(10_000)
            await page.goto(page_path.as_uri())
            scroll, inner = await page.evaluate("() => [document.scrollingElement.scrollWidth, window.innerWidth]")
            assert scroll <= inner, f"the {lang} report is {scroll} px wide on a {inner} px phone"
            link = page.locator("#outcome a").first
            href = await link.get_attribute("href")
            assert href == f"stacks-before-restart/{POD}.txt"
            await link.click()
            await page.wait_for_load_state("load")
            assert "most recent call first" in await page.content()
        finally:
            await browser.close()
