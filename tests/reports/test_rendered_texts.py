"""Every text a report shows a person, as the report shows it: each shipped rule's summary and hint
(from the rule's own examples, through the engine and the correlator), the advice of hints.yaml, the
per-class "what now" and every chip's catalog entry (explanation, description, causes, steps, note),
in both languages. Rendered HTML shows no literal backtick (a code span is <code>), nothing escaped
twice (`&amp;lt;`, a visible `&lt;`), no raw placeholder (`%s`, `{xid}`); Markdown keeps the code
spans as code spans."""

from __future__ import annotations

import html
import re
from collections.abc import Iterator
from functools import cache
from html.parser import HTMLParser
from typing import Any

import pytest

from trainmedic.agent.reporting import report_context
from trainmedic.agent.store import IncidentStatus, IncidentStore
from trainmedic.detectors.correlator import correlate
from trainmedic.detectors.engine import Engine
from trainmedic.detectors.loader import load_rules
from trainmedic.models import Finding
from trainmedic.remediations.hints import default_hints
from trainmedic.reports.report import LANGS, render_report
from trainmedic.udal import builtin_plugins, get_plugin
from trainmedic.vendortext import elide, fill

FAULT_CLASSES = [
    "device_error",
    "node_failure",
    "accelerator_oom",
    "host_oom",
    "comm_init",
    "comm_error",
    "hang",
    "process_killed",
    "storage_error",
    "app_error",
    "unknown",
]
PLACEHOLDER = re.compile(r"%(?:\d+\$)?[-+#0]*\d*(?:\.\d+)?(?:l|ll|z|h)?[sdiux]\b|\{[A-Za-z_][A-Za-z_0-9]*\}")


class _Text(HTMLParser):
    """The text a browser shows: what is outside tags, entities decoded; <code> spans left out
    separately so a backtick inside real code (a log line) is not counted."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.prose: list[str] = []
        self._skip = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in ("code", "pre", "style", "title", "svg"):
            self._skip += 1

    def handle_endtag(self, tag: str) -> None:
        if tag in ("code", "pre", "style", "title", "svg"):
            self._skip -= 1

    def handle_data(self, data: str) -> None:
        if not self._skip:
            self.prose.append(data)


def _html_problems(out: str, what: str) -> list[str]:
    problems = []
    if "&amp;lt;" in out or "&amp;gt;" in out or "&amp;amp;" in out:
        problems.append(f"{what}: escaped twice")
    parser = _Text()
    parser.feed(out)
    prose = "".join(parser.prose)
    for bad in ("`", "&lt;", "&gt;"):
        if bad in prose:
            at = prose.index(bad)
            problems.append(f"{what}: {bad!r} shown as text: …{prose[max(0, at - 60) : at + 60]}…")
    whole = html.unescape(re.sub(r"<style>.*?</style>", "", out, flags=re.S))
    m = PLACEHOLDER.search(re.sub(r"<[^>]+>", "", whole))
    if m:
        problems.append(f"{what}: raw placeholder {m.group(0)!r}")
    return problems


def _md_problems(out: str, what: str) -> list[str]:
    # Outside code spans and fences, no escaped backtick: a code span of ours stays a code span.
    prose = re.sub(r"(?ms)^(`{3,})text$.*?^\1$", "", out)
    prose = re.sub(r"(`+)(?!`).*?(?<!`)\1(?!`)", "", prose)
    problems = []
    if "\\`" in prose:
        at = prose.index("\\`")
        problems.append(f"{what}: code span escaped as text: …{prose[max(0, at - 60) : at + 60]}…")
    m = PLACEHOLDER.search(prose)
    if m:
        problems.append(f"{what}: raw placeholder {m.group(0)!r}")
    return problems


def _own_md_problems(texts: list[str], what: str) -> list[str]:
    """Our own advice in Markdown: a command is a code span, so its `<pid>` reads as it is in the
    Markdown source too, never as `&lt;pid&gt;` (outside text is entity-escaped on purpose)."""
    from trainmedic.reports.report import _FILTERS

    out = []
    for text in texts:
        md = re.sub(r"(`+)(?!`).*?(?<!`)\1(?!`)", "", str(_FILTERS["md_rich"](text)))
        if "&lt;" in md or "&gt;" in md:
            out.append(f"{what}: markup escaped in Markdown: {text[:120]}")
    return out


@cache
def _examples() -> dict[str, list[tuple[str, Finding]]]:
    """fault class -> (rule id, finding) for every match example of every shipped rule."""
    rules = load_rules(run_examples=False)
    engine = Engine(rules.rules, fast=False)
    out: dict[str, list[tuple[str, Finding]]] = {}
    for rule in rules.rules:
        for ex in rule.examples.match:
            for f in engine.scan_text(ex.line):
                if f.rule_id == rule.id:
                    out.setdefault(f.fault_class.value, []).append((rule.id, f))
                    break
    return out


def _render(store: IncidentStore, iid: str, lang: str, what: str) -> list[str]:
    ctx = report_context(store, iid)
    return _html_problems(render_report(ctx, fmt="html", lang=lang), f"{what} html") + _md_problems(
        render_report(ctx, fmt="md", lang=lang), f"{what} md"
    )


@pytest.fixture
def store() -> Iterator[IncidentStore]:
    s = IncidentStore(":memory:")
    yield s
    s.close()


def _open(store: IncidentStore, iid: str, diagnosis: dict[str, Any], fault_class: str, hints: list[Any]) -> None:
    store.open_incident(
        iid,
        key="job:train/llama",
        diagnosis=diagnosis,
        revision=1,
        namespace="train",
        job="llama",
        job_kind="Job",
        node="gpu-2",
        fault_class=fault_class,
    )
    store.set_plan(iid, {"mode": "enforce", "hints": hints}, "enforce", [])
    store.set_status(iid, IncidentStatus.FAILED)


def test_every_fault_class_has_rule_examples() -> None:
    assert sorted(_examples()) == sorted(FAULT_CLASSES)


@pytest.mark.parametrize("lang", LANGS)
@pytest.mark.parametrize("fault_class", FAULT_CLASSES)
def test_rule_texts_and_advice_render_clean(store: IncidentStore, fault_class: str, lang: str) -> None:
    advice = [h.text.model_dump() for h in default_hints().hints if h.fault_class.value == fault_class]
    problems: list[str] = []
    for i, (rule_id, finding) in enumerate(_examples()[fault_class]):
        d = correlate([finding])
        assert d.root_cause is not None, rule_id
        iid = f"r{i:05d}"
        _open(store, iid, d.model_dump(mode="json"), fault_class, advice if i == 0 else [])
        problems += _render(store, iid, lang, rule_id)
        own = [str(getattr(d.root_cause.hint, lang))] if d.root_cause.hint else []
        own += [a[lang] for a in advice] if i == 0 else []
        problems += _own_md_problems(own, rule_id)
    assert problems == []


@pytest.mark.parametrize("lang", LANGS)
@pytest.mark.parametrize("chip", sorted(builtin_plugins()))
def test_catalog_texts_render_clean(store: IncidentStore, chip: str, lang: str) -> None:
    problems: list[str] = []
    for i, entry in enumerate(get_plugin(chip).catalog().values()):
        fault_class = entry.fault_class.value if entry.fault_class is not None else "unknown"
        rc = {
            "fault_class": fault_class,
            "chip": chip,
            "code": entry.code,
            "action": entry.action.value,
            "vendor_action": entry.vendor_action,
            "summary": {"en": f"{entry.code}: {entry.description}", "zh": f"{entry.code}：{entry.message.zh}"},
            "hint": None,
        }
        iid = f"c{i:05d}"
        _open(store, iid, {"root_cause": rc, "findings": []}, fault_class, [])
        ctx = report_context(store, iid)
        assert ctx["vendor"] is not None and ctx["vendor"]["code"] == entry.code
        problems += _html_problems(render_report(ctx, fmt="html", lang=lang), f"{entry.code} html")
        problems += _md_problems(render_report(ctx, fmt="md", lang=lang), f"{entry.code} md")
    assert problems == []


@pytest.mark.parametrize(
    ("text", "fmt", "expected"),
    [
        ("Keep `nvidia-smi -q` output", "html", "Keep <code>nvidia-smi -q</code> output"),
        ("Run `py-spy dump --pid <pid>`", "html", "Run <code>py-spy dump --pid &lt;pid&gt;</code>"),
        ("an odd ` backtick", "html", "an odd ` backtick"),
        ("Keep `nvidia-smi -q` output", "md", "Keep `nvidia-smi -q` output"),
        ("Run `py-spy dump --pid <pid>`", "md", "Run `py-spy dump --pid <pid>`"),
    ],
)
def test_code_spans_in_rich_text(text: str, fmt: str, expected: str) -> None:
    from trainmedic.reports.report import _FILTERS

    assert str(_FILTERS["html_rich" if fmt == "html" else "md_rich"](text)) == expected


@pytest.mark.parametrize(
    ("template", "line", "expected"),
    [
        (
            "Getting socket times out. Reason: %s.",
            "EI0006: Getting socket times out. Reason: Remote Rank did not send the data in time. Please check",
            "Getting socket times out. Reason: Remote Rank did not send the data in time.",
        ),
        (
            "Value %s for parameter %s is invalid. Reason: %s",
            "E10001: Value 3 for parameter batch is invalid. Reason: too big",
            "Value 3 for parameter batch is invalid. Reason: too big",
        ),
        ("%s failed. Reason: %s.", "E10059: Conv2D failed. Reason: bad shape.", "Conv2D failed. Reason: bad shape."),
        ("Reason: %s.", "a line that does not follow the template", "Reason: …."),
        ("Reason: %s.", None, "Reason: …."),
        ("%s", "anything", ""),
        ("no placeholder at 100% load", "x", "no placeholder at 100% load"),
    ],
)
def test_vendor_template_filled_from_the_line(template: str, line: str | None, expected: str) -> None:
    assert fill(template, line) == expected


def test_elide_keeps_percent_signs_that_are_not_placeholders() -> None:
    assert elide("at 100% for %d s, %1$s") == "at 100% for … s, …"


@pytest.mark.parametrize("fault_class", FAULT_CLASSES)
def test_restart_advice_follows_the_shipped_policy(store: IncidentStore, fault_class: str) -> None:
    """Whatever the root cause's normalized action, a report advises restarting the application
    only where the shipped policy's plan restarts the job (an OOM it will not restart is not told
    to restart), and a hint never sends the reader to look up the catalog entry shown beside it."""
    from trainmedic.remediations.policy import PolicyContext, load_policy
    from trainmedic.remediations.policy_state import MemoryPolicyState

    policy = load_policy()
    restarts = {"restart_from_checkpoint", "raise_memory_limit"}
    problems: list[str] = []
    for i, (rule_id, finding) in enumerate(_examples()[fault_class]):
        d = correlate([finding])
        rc = d.root_cause
        assert rc is not None
        ctx = PolicyContext(namespace="train", job_key="job:train/llama", node=rc.node or "gpu-2", now=1.0e9)
        plan = policy.decide(f"p{i:05d}", rc, d.findings, ctx, MemoryPolicyState())
        iid = f"p{i:05d}"
        store.open_incident(
            iid,
            key="job:train/llama",
            diagnosis=d.model_dump(mode="json"),
            revision=1,
            namespace="train",
            job="llama",
            fault_class=fault_class,
        )
        store.set_plan(iid, plan.as_dict(), plan.mode.value, [(a.name.value, dict(a.params)) for a in plan.actions])
        report = report_context(store, iid)
        recs = " ".join(r["en"] for r in report["recommendations"])
        restarting = any(a.name.value in restarts for a in plan.actions)
        if "`restart_app`" in recs and not restarting:
            problems.append(f"{rule_id}: restart_app advised, the plan restarts nothing")
        hint = (report["root_cause"] or {}).get("hint") or {}
        if report["vendor"] is not None and re.search(r"(?i)\blook\b.{0,40}\bup\b.{0,60}\bcatalog", hint.get("en", "")):
            problems.append(f"{rule_id}: the hint sends the reader to the catalog entry the report shows")
    assert problems == []
