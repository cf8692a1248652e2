"""The documentation in the repository: its links resolve, its coverage holds, its examples run.

README.md and docs/*.md are checked for relative links that lead nowhere (a file or a heading
anchor). docs/runbooks.md must have a section for every fault class of the vocabulary. Each
"how to add X" page carries a worked example between a `<!-- test: NAME -->` marker and the code
block after it; the tests here take that block out of the page and run it: the rule file goes
through `trainmedic rules test` and `diagnose`, the chip plugin is registered with
udal.registry.register, the sink builds and classifies messages, the action runs against a journal.
(docs/configuration.md is kept equal to the generated reference by tests/agent/test_configref.py.)
"""

from __future__ import annotations

import importlib
import json
import re
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from paths import ROOT

from trainmedic.events import JobRef
from trainmedic.models import FaultClass

DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]


def rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else str(path)


# ------------------------------------------------------------------------------------------------
# Markdown helpers

FENCE = re.compile(r"^(```|~~~)")
LINK = re.compile(r"(?<!!)\[(?P<text>[^\]\n]*)\]\((?P<target>[^)\s]+)(?:\s+\"[^\"]*\")?\)")
INLINE_CODE = re.compile(r"`[^`\n]*`")
HEADING = re.compile(r"^(#{1,6})\s+(?P<title>.+?)\s*#*\s*$")


def prose_lines(text: str) -> Iterator[tuple[int, str]]:
    """(line number, line) outside fenced code blocks."""
    in_fence = False
    for no, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line.lstrip()):
            in_fence = not in_fence
            continue
        if not in_fence:
            yield no, line


def slug(title: str) -> str:
    """A heading's anchor as GitHub makes it: lower case, punctuation dropped, spaces to hyphens."""
    text = title.strip().lower().replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    seen: dict[str, int] = {}
    out: set[str] = set()
    for _, line in prose_lines(text):
        m = HEADING.match(line)
        if not m:
            continue
        base = slug(m.group("title"))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(text: str) -> Iterator[tuple[int, str]]:
    """(line number, target) of every relative link in the prose (inline code ignored)."""
    for no, line in prose_lines(text):
        for m in LINK.finditer(INLINE_CODE.sub("", line)):
            target = m.group("target")
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):
                continue  # http:, https:, mailto: ...
            yield no, target


def broken_link(page: Path, target: str) -> str | None:
    """Why `target` (as written in `page`) leads nowhere; None when it resolves."""
    path_part, _, anchor = target.partition("#")
    dest = (page.parent / path_part).resolve() if path_part else page
    if not dest.exists():
        return f"{path_part}: no such file"
    if anchor:
        if dest.suffix != ".md" or dest.is_dir():
            return f"#{anchor}: anchors are checked in Markdown files only"
        if anchor not in anchors(dest.read_text(encoding="utf-8")):
            return f"#{anchor}: no such heading in {rel(dest)}"
    return None


def example(page: Path, name: str) -> str:
    """The code block right after `<!-- test: name -->` in `page`."""
    text = page.read_text(encoding="utf-8")
    m = re.search(rf"<!-- test: {re.escape(name)} -->\n```[a-z]*\n(.*?)\n```", text, re.S)
    assert m, f"{rel(page)}: no code block after <!-- test: {name} -->"
    return m.group(1) + "\n"


# ------------------------------------------------------------------------------------------------
# Links


def all_links() -> list[tuple[Path, int, str]]:
    return [(page, no, target) for page in PAGES for no, target in links(page.read_text(encoding="utf-8"))]


LINKS = all_links()


def test_the_pages_link_to_each_other() -> None:
    assert len(PAGES) >= 15, [rel(p) for p in PAGES]
    assert len(LINKS) >= 40, "the link check would prove nothing"
    readme_targets = {t.partition("#")[0] for p, _, t in LINKS if p.name == "README.md"}
    for page in DOCS.glob("*.md"):
        assert f"docs/{page.name}" in readme_targets, f"README.md's index does not list docs/{page.name}"


@pytest.mark.parametrize(("page", "line", "target"), LINKS, ids=[f"{rel(p)}:{n}:{t}" for p, n, t in LINKS])
def test_relative_link_resolves(page: Path, line: int, target: str) -> None:
    problem = broken_link(page, target)
    assert problem is None, f"{rel(page)}:{line}: link ({target}): {problem}"


@pytest.mark.parametrize(
    ("text", "target", "why"),
    [
        ("# A\n## B `c` (d)\n", "nope.md", "no such file"),
        ("# A\n## B `c` (d)\n", "#b-c-e", "no such heading"),
        ("# A\n```\n## Not a heading\n```\n", "#not-a-heading", "no such heading"),
    ],
    ids=["missing-file", "missing-heading", "heading-in-code"],
)
def test_the_link_check_finds_broken_links(tmp_path: Path, text: str, target: str, why: str) -> None:
    page = tmp_path / "page.md"
    page.write_text(text, encoding="utf-8")
    problem = broken_link(page, target)
    assert problem is not None and why in problem


def test_anchors_are_made_as_github_makes_them(tmp_path: Path) -> None:
    text = "# T\n## Fault classes (`fault_class`)\n## `trainmedic diagnose --logs PATH... --format json`\n## T\n"
    assert anchors(text) == {
        "t",
        "t-1",
        "fault-classes-fault_class",
        "trainmedic-diagnose---logs-path---format-json",
    }
    page = tmp_path / "p.md"
    page.write_text(text + "[x](#fault-classes-fault_class) `[y](#nope)`\n```\n[z](#nope)\n```\n", encoding="utf-8")
    assert list(links(page.read_text(encoding="utf-8"))) == [(5, "#fault-classes-fault_class")]


def test_readme_is_short() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= 200, f"README.md has {lines} lines: move the detail into docs/"


# ------------------------------------------------------------------------------------------------
# Runbooks


@pytest.mark.parametrize("fault_class", list(FaultClass), ids=str)
def test_runbooks_cover_every_fault_class(fault_class: FaultClass) -> None:
    text = (DOCS / "runbooks.md").read_text(encoding="utf-8")
    heading = re.search(rf"^## `{fault_class.value}`: .+$", text, re.M)
    assert heading, f"docs/runbooks.md has no section `## `{fault_class.value}`: ...`"
    body = text[heading.end() :].split("\n## ", 1)[0]
    assert "**trainmedic:**" in body and "**You:**" in body, (
        f"{fault_class.value}: say what trainmedic did and what to do"
    )


# ------------------------------------------------------------------------------------------------
# Worked example: a rule (docs/rules.md)


@pytest.fixture
def site_rules(tmp_path: Path) -> Path:
    d = tmp_path / "site-rules"
    d.mkdir()
    (d / "uploads.yaml").write_text(example(DOCS / "rules.md", "rule-example"), encoding="utf-8")
    return d


def test_rule_example_passes_rules_test(site_rules: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from trainmedic.agent.cli import main

    assert main(["rules", "test", "--rules", str(site_rules)]) == 0, capsys.readouterr().err
    assert "examples passed" in capsys.readouterr().out


def test_rule_example_diagnoses_its_line(site_rules: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from trainmedic.agent.cli import main

    log = tmp_path / "job.log"
    log.write_text(
        "[rank0]: step 300 loss 1.02\n"
        "[rank0]: ckpt-uploader: upload of checkpoint-300 to s3://team-ckpt/llama failed: AccessDenied\n",
        encoding="utf-8",
    )
    assert main(["diagnose", "--logs", str(log), "--rules", str(site_rules), "--format", "json"]) == 0
    rc = json.loads(capsys.readouterr().out)["root_cause"]
    assert rc["fault_class"] == "storage_error"
    assert rc["code"] == "ckpt_upload_denied"
    assert rc["action"] == "notify_owner"
    assert "checkpoint-300" in rc["summary"]


def test_rule_example_refused_when_broken(site_rules: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The check the page relies on does fail: the same file with its example line changed."""
    from trainmedic.agent.cli import main

    f = site_rules / "uploads.yaml"
    f.write_text(
        f.read_text(encoding="utf-8").replace("llama failed: AccessDenied'", "llama failed: Denied'"), encoding="utf-8"
    )
    assert main(["rules", "test", "--rules", str(site_rules)]) != 0
    assert "site.ckpt_upload_denied" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------
# Worked example: a chip plugin (docs/chips.md)


@pytest.fixture
def acme(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    from trainmedic.udal import registry

    pkg = tmp_path / "acme_trainmedic"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("", encoding="utf-8")
    (pkg / "plugin.py").write_text(example(DOCS / "chips.md", "chip-plugin"), encoding="utf-8")
    (pkg / "acme_catalog.yaml").write_text(example(DOCS / "chips.md", "chip-catalog"), encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    # The registry's run-time table is process state: this test's plugin must not outlive it.
    monkeypatch.setattr(registry, "_REGISTERED", dict(registry._REGISTERED))
    registry.register("acme", "acme_trainmedic.plugin:AcmePlugin")
    yield "acme"
    registry.clear_cache()
    for name in [m for m in sys.modules if m == "acme_trainmedic" or m.startswith("acme_trainmedic.")]:
        del sys.modules[name]
    importlib.invalidate_caches()


def test_chip_plugin_example_registers_and_works(acme: str) -> None:
    from trainmedic import udal
    from trainmedic.models import Action, FaultClass
    from trainmedic.udal import registry

    plugin = registry.get_plugin(acme)
    assert type(plugin).__name__ == "AcmePlugin" and plugin.name == "acme"
    assert acme in registry.load_plugins()
    assert registry.detect_chip({"acme.example/npu.present": "true"}) is plugin
    assert registry.detect_chip({"ai.accelerator/chip-type": "acme"}) is plugin
    assert registry.detect_chip({"acme.example/npu.present": "false"}) is not plugin
    entry = udal.lookup(acme, "acme:17")
    assert entry is not None
    assert entry.vendor_action == "ISOLATE" and entry.action is Action.ISOLATE_NODE
    assert entry.fault_class is FaultClass.DEVICE_ERROR
    assert udal.lookup(acme, "acme:99") is None
    found = udal.lookup_text(acme, "npu3: HBM uncorrectable ECC error at 0x1f000")
    assert found is not None and found.code == "acme:17"
    assert "Acme NPU driver error codes" in plugin.catalog_source()
    assert plugin.unified_metric("acme_npu_health") == "health"
    assert plugin.visible_devices({"ACME_VISIBLE_DEVICES": "0,2"}) == [0, 2]


def test_chip_plugin_example_is_a_chip_of_its_own(acme: str) -> None:
    from trainmedic.agent.bus.memory import MemoryBus
    from trainmedic.agent.watchers.k8s import node_status
    from trainmedic.agent.watchers.metrics import PrometheusSource
    from trainmedic.models import Chip
    from trainmedic.udal import registry

    assert Chip(acme) == "acme" and registry.get_plugin(acme).chip == "acme"
    node = {"metadata": {"name": "a-1", "labels": {}}, "status": {"capacity": {"acme.example/npu": "8"}}}
    status = node_status(node)
    assert (status.chip, status.accelerators) == ("acme", {"acme.example/npu": 8})
    source = PrometheusSource("http://x.invalid", bus=MemoryBus(), client=_NoClient())
    assert "acme_npu_hbm_ecc_uncorrected_total" in source.query


class _NoClient:
    def custom_query(self, query: str, params: dict[str, Any] | None = None) -> Any:
        return []

    def custom_query_range(self, query: str, start_time: Any, end_time: Any, step: str, params: Any = None) -> Any:
        return []


def test_chip_rule_example_diagnoses_under_the_chips_name(acme: str, tmp_path: Path) -> None:
    from trainmedic.detectors.diagnose import diagnose_text
    from trainmedic.detectors.engine import Engine
    from trainmedic.detectors.loader import load_rules
    from trainmedic.models import Action

    site = tmp_path / "site-rules"
    site.mkdir()
    (site / "acme.yaml").write_text(example(DOCS / "chips.md", "chip-rule"), encoding="utf-8")
    engine = Engine(load_rules([site], include_shipped=False).rules, fast=False)
    rc = diagnose_text("AcmeError: HBM uncorrectable ECC error on NPU 3, code 17\n", engine).root_cause
    assert rc is not None
    assert (rc.chip.value, rc.code, rc.vendor_action, rc.action, rc.device) == (
        "acme",
        "acme:17",
        "ISOLATE",
        Action.ISOLATE_NODE,
        "3",
    )


def test_chip_catalog_example_is_validated(acme: str, tmp_path: Path) -> None:
    from trainmedic.udal.base import CatalogError, load_catalog_text

    text = example(DOCS / "chips.md", "chip-catalog")
    assert set(load_catalog_text(text, "acme_catalog.yaml").entries) == {"acme:17", "acme:42"}
    with pytest.raises(CatalogError, match=r"acme_catalog\.yaml"):
        load_catalog_text(text.replace("action: isolate_node", "action: pray"), "acme_catalog.yaml")


# ------------------------------------------------------------------------------------------------
# Worked example: a sink (docs/notifications.md)


def sink_notice(incident: str, severity: str = "critical") -> Any:
    from trainmedic.reports.notice import Notice

    return Notice.from_dict(
        {
            "incident_id": incident,
            "status": "acting",
            "time": 1_700_000_000.0,
            "severity": severity,
            "fault_class": "device_error",
            "code": "xid:79",
            "chip": "nvidia",
            "node": "gpu-node-a",
            "namespace": "train",
            "job": "llama",
            "summary": {"en": "GPU has fallen off the bus", "zh": "GPU 掉卡"},
            "report_url": f"https://trainmedic.example.internal/api/v1/incidents/{incident}/report",
        }
    )


def test_sink_example_builds_and_classifies() -> None:
    from trainmedic.agent.config import SinkSettings
    from trainmedic.agent.notify import Sink

    scope: dict[str, Any] = {"__name__": "pager_sink"}
    exec(compile(example(DOCS / "notifications.md", "sink-example"), "docs/notifications.md", "exec"), scope)
    pager_cls = scope["PagerSink"]
    assert issubclass(pager_cls, Sink) and pager_cls.kind == "pager"
    # `pager` is not (yet) a kind the settings model accepts: built without its validation here.
    settings = SinkSettings.model_construct(
        kind="pager",  # type: ignore[arg-type]
        url="https://pager.example.internal/api/page",
        lang="en",
    )
    sink = pager_cls(settings, secret=None, source="trainmedic")

    one = sink.build([sink_notice("inc-1")], now=1_700_000_001.0)
    body = json.loads(one.body)
    assert body == {
        "title": "GPU has fallen off the bus",
        "severity": "critical",
        "incident": "inc-1",
        "url": "https://trainmedic.example.internal/api/v1/incidents/inc-1/report",
    }
    assert one.url == "https://pager.example.internal/api/page"
    assert one.headers["X-Trainmedic-Dedup-Key"] == "inc-1/acting"

    digest = sink.build([sink_notice("inc-1", "warning"), sink_notice("inc-2")], now=1_700_000_001.0)
    body = json.loads(digest.body)
    assert body["title"].startswith("2 trainmedic incidents") and body["severity"] == "critical"
    assert digest.count == 2

    ok = sink.classify(200, b'{"ok": true}', {}, now=0.0)
    refused = sink.classify(200, b'{"ok": false, "error": "unknown team"}', {}, now=0.0)
    busy = sink.classify(503, b"", {"retry-after": "7"}, now=0.0)
    assert ok.result == "delivered"
    assert refused.result == "dead" and "unknown team" in (refused.error or "")
    assert busy.result == "retry" and busy.retry_after == 7.0


def test_signature_snippet_is_the_tested_one() -> None:
    """docs/notifications.md quotes the receiver's check; tests/reports/test_payloads.py runs the
    copy in reports/payloads.py against real deliveries. The two must be the same code."""
    from trainmedic.reports import payloads

    doc = payloads.__doc__ or ""
    m = re.search(r"```python\n(.*?)```", doc, re.S)
    assert m
    page = (DOCS / "notifications.md").read_text(encoding="utf-8")
    quoted = re.search(r"In the receiver:\n\n```python\n(.*?)```", page, re.S)
    assert quoted, "docs/notifications.md lost the receiver snippet"

    def norm(code: str) -> list[str]:
        return [line.strip() for line in code.splitlines() if line.strip()]

    assert norm(quoted.group(1)) == norm(m.group(1))


# ------------------------------------------------------------------------------------------------
# Worked example: an action (docs/policy-and-actions.md)


class MemoryJournal:
    """The journal protocol over a list (the responder's is over the incident store)."""

    def __init__(self, incident_id: str, names: list[str]) -> None:
        from trainmedic.remediations.actions.base import Entry

        self.incident_id = incident_id
        self.rows = [Entry(seq=i, name=n, state="planned", params={}) for i, n in enumerate(names)]

    async def entries(self) -> list[Any]:
        return list(self.rows)

    async def update(
        self, seq: int, state: str, *, params: Mapping[str, Any] | None = None, result: Mapping[str, Any] | None = None
    ) -> None:
        from dataclasses import replace

        row = self.rows[seq]
        self.rows[seq] = replace(
            row,
            state=state,
            params=dict(params) if params is not None else row.params,
            result=dict(result) if result is not None else row.result,
        )


class WorkloadsRuntime:
    """The one thing the example action asks of the agent: the job's workload."""

    def __init__(self, workloads: dict[str, dict[str, Any]]) -> None:
        self.workloads = workloads
        self.calls = 0

    async def find_workload(self, job: JobRef) -> dict[str, Any] | None:
        self.calls += 1
        return self.workloads.get(f"{job.namespace}/{job.name}")


def load_action_example(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    (tmp_path / "record_workload.py").write_text(
        example(DOCS / "policy-and-actions.md", "action-example"), encoding="utf-8"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("record_workload", None)
    return importlib.import_module("record_workload")


def root_cause() -> Any:
    from trainmedic.models import RootCause

    return RootCause.model_validate(
        {
            "fault_class": "device_error",
            "chip": "nvidia",
            "code": "xid:79",
            "summary": {"en": "GPU has fallen off the bus", "zh": "GPU 掉卡"},
            "rule_id": "nvidia.xid",
            "severity": "critical",
        }
    )


@pytest.mark.parametrize(
    ("job", "workloads", "state", "result"),
    [
        (
            JobRef(namespace="train", name="llama"),
            {"train/llama": {"kind": "Job", "metadata": {"name": "llama", "uid": "u-1", "resourceVersion": "42"}}},
            "done",
            {"kind": "Job", "name": "llama", "uid": "u-1", "resource_version": "42"},
        ),
        (JobRef(namespace="train", name="gone"), {}, "skipped", {"reason": "the workload is gone"}),
        (None, {}, "skipped", {"reason": "no workload: a node-level incident"}),
    ],
    ids=["recorded", "gone", "node-level"],
)
@pytest.mark.asyncio
async def test_action_example_runs_against_a_journal(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    job: JobRef | None,
    workloads: dict[str, dict[str, Any]],
    state: str,
    result: dict[str, Any],
) -> None:
    from trainmedic.remediations.actions import ACTIONS
    from trainmedic.remediations.actions.base import ActionCall, ActionDef

    module = load_action_example(tmp_path, monkeypatch)
    action = module.ACTION
    assert isinstance(action, ActionDef) and action.name == "record_workload" and not action.mutating
    assert action.name not in ACTIONS, "the example names an action the project does not ship"
    spec = action.spec[0].model_validate({"action": "record_workload"})
    assert spec.action == "record_workload"

    journal = MemoryJournal("inc-1", ["record_workload", "notify"])
    runtime = WorkloadsRuntime(workloads)
    call = ActionCall(journal, journal.rows[0], root_cause(), job, runtime)  # type: ignore[arg-type]
    await action.run(call)
    assert journal.rows[0].state == state and journal.rows[0].result == result
    assert journal.rows[1].state == "planned", "an action touches only its own entry"

    # Run again (a replayed incident): the journal says it is settled, nothing is asked again.
    calls = runtime.calls
    await action.run(ActionCall(journal, journal.rows[0], root_cause(), job, runtime))  # type: ignore[arg-type]
    assert runtime.calls == calls and journal.rows[0].result == result


# ------------------------------------------------------------------------------------------------
# The README's example


def test_readme_diagnose_example_is_real_output(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every line the README shows of `trainmedic diagnose` is what the command prints now (a line
    cut short with `...` is a prefix of the real one)."""
    from trainmedic.agent.cli import main

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    m = re.search(r"```console\n\$ trainmedic (diagnose [^\n]+)\n(.*?)```", readme, re.S)
    assert m, "README.md lost its diagnose example"
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("TRAINMEDIC_LANG", "en")
    assert main([*m.group(1).split(), "--lang", "en"]) == 0
    real = capsys.readouterr().out.splitlines()
    shown = [line for line in m.group(2).splitlines() if line.strip()]
    assert len(shown) >= 8
    for line in shown:
        if line.endswith("..."):
            assert any(r.startswith(line[:-3]) for r in real), f"not the start of any output line: {line}"
        else:
            assert line in real, f"not in the output: {line}"


# ------------------------------------------------------------------------------------------------
# Worked example: a progress marker (docs/rules.md)


@pytest.mark.parametrize("with_shipped", [False, True], ids=["alone", "beside-the-shipped"])
def test_progress_marker_example_loads_and_reads_the_step(tmp_path: Path, with_shipped: bool) -> None:
    from trainmedic.detectors.hang_markers import load_markers
    from trainmedic.detectors.hang_schema import MARKERS_FILE

    entry = example(DOCS / "rules.md", "progress-marker-example")
    text = MARKERS_FILE.read_text(encoding="utf-8").rstrip("\n") + "\n" if with_shipped else "version: 1\nmarkers:\n"
    f = tmp_path / "progress.yaml"
    f.write_text(text + entry, encoding="utf-8")
    markers = load_markers(f)
    assert "site.trainloop_step" in markers.origins
    hits = [h for _, _, hs in markers.matcher.scan(["[rank3]: [trainloop] b=4242 ce=2.011 tok/s=50110"]) for h in hs]
    assert [(h.marker_id, h.step) for h in hits] == [("site.trainloop_step", 4242)]
    assert not markers.matcher.scan(["[trainloop] b=4242 eval_ce=2.402"])


def test_progress_marker_example_refused_when_broken(tmp_path: Path) -> None:
    from trainmedic.detectors.hang_markers import load_markers
    from trainmedic.errors import RuleLoadError

    entry = example(DOCS / "rules.md", "progress-marker-example").replace("step: 1200", "step: 1300")
    f = tmp_path / "progress.yaml"
    f.write_text("version: 1\nmarkers:\n" + entry, encoding="utf-8")
    with pytest.raises(RuleLoadError) as e:
        load_markers(f)
    assert any("site.trainloop_step" in str(p) or "1300" in str(p) for p in e.value.problems)
