"""The data of an incident report: the incident store's record and the scene bundle, joined.

`report_context` gathers what `reports.report.render_report` needs into one JSON-ready dict
(texts for people as {"en": .., "zh": ..}, times as unix seconds), so the API, the CLI, the demo
and the benchmark render the same report from the same data, and a user's own template sees the
same fields as the shipped ones.

A report is written when things have gone wrong, so it must not fail because something else did:
a scene bundle that was never saved, half written, edited by hand or partly unreadable still gives
a report, whose "not in this report" section says what is missing and why. Everything read from
the bundle is bounded (the first MAX_EVIDENCE findings with CONTEXT_LINES lines either side, the
tail of each log for the last training step, a few charts of decimated series), so a 64-pod job
with 10,000-line logs renders in milliseconds.

`write_reports` writes report.{en,zh}.{md,html} atomically (a temporary file renamed into place).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from trainmedic.agent.store import Incident, IncidentStore
from trainmedic.remediations.scene import MANIFEST, SceneError, load_scene
from trainmedic.reports.report import FORMATS, LANGS, ReportError, i18n, labels, render_report
from trainmedic.timefmt import parse_rfc3339
from trainmedic.udal import CatalogError, PluginError, get_plugin, lookup
from trainmedic.vendortext import elide, fill

__all__ = [
    "CONTEXT_LINES",
    "MAX_EVIDENCE",
    "ReportError",
    "render_incident",
    "report_context",
    "write_reports",
]

CONTEXT_SCHEMA = 1
MAX_EVIDENCE = 50
CONTEXT_LINES = 3
MAX_LINE_CHARS = 2000
MAX_TIMELINE = 200
# Stack files linked from a report (one per pod; a 64-pod job links them all).
MAX_STACK_FILES = 256
MAX_TOP_LINKS = 8
MAX_CHART_NODES = 2
MAX_METRICS_PER_NODE = 3
MAX_CHART_SERIES = 16
# Where the last training step is looked for: the end of each saved container log.
STEP_TAIL_BYTES = 64 << 10
# A bundle file read for evidence is never read past this (the scene's own cap is 8 MiB).
MAX_READ_BYTES = 32 << 20
# Charted first: utilization (did the job stop working?), then what the fault class is about, then the rest.
CHART_METRICS = (
    "accelerator_utilization",
    "accelerator_memory_used",
    "accelerator_temperature",
    "accelerator_power",
    "accelerator_memory_utilization",
    "xid_errors",
    "health",
    "ecc_dbe",
    "ecc_sbe",
    "link_status",
    "network_status",
    "error_code",
)
FAULT_METRICS: dict[str, tuple[str, ...]] = {
    "device_error": ("xid_errors", "health", "ecc_dbe", "error_code", "accelerator_temperature"),
    "accelerator_oom": ("accelerator_memory_used", "accelerator_memory_utilization"),
    "comm_init": ("link_status", "network_status"),
    "comm_error": ("link_status", "network_status"),
    "hang": ("accelerator_power",),
    "node_failure": ("health", "accelerator_utilization"),
    "process_killed": ("accelerator_utilization",),
    "app_error": ("accelerator_utilization",),
    "storage_error": ("accelerator_utilization",),
    "unknown": ("accelerator_utilization",),
}
_RESTARTS = ("restart_from_checkpoint", "raise_memory_limit")
# "step 120", "step=120", "global_step: 120", "Step 12/100", "[step 5]", Megatron's "iteration  120/ 1000".
_STEP = re.compile(rb"(?i)(?:\bglobal[_ ]step|\bstep|\biteration|\biter)\s*[=:#]?\s*\[?\s*(\d{1,12})\b")
_COLON = {"en": ": ", "zh": "："}
_SERIES_KEY = re.compile(r"^(?P<name>[^{]+)\{(?P<device>[^}]*)\}$")


def _i18n(en: str, zh: str) -> dict[str, str]:
    return {"en": en, "zh": zh}


def _text_pair(value: Any) -> dict[str, str] | None:
    if isinstance(value, Mapping):
        en, zh = value.get("en"), value.get("zh")
        if isinstance(en, str) or isinstance(zh, str):
            return {"en": str(en or zh), "zh": str(zh or en)}
    if isinstance(value, str) and value:
        return {"en": value, "zh": value}
    return None


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    f = float(value)
    return f if math.isfinite(f) else None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _summary(obj: Any, limit: int = 300) -> str:
    """A short one-line `key=value` form of an action's params / result or a timeline detail."""
    if obj is None:
        return ""
    if not isinstance(obj, Mapping):
        return _cut(str(obj), limit)
    parts = []
    for k, v in obj.items():
        if k == "body" or v is None or (isinstance(v, list | tuple | Mapping) and not v):
            continue
        if isinstance(v, Mapping):
            inner = _summary(v, 120)
            if inner:
                parts.append(f"{k}=({inner})")
            continue
        if isinstance(v, list | tuple):
            if any(isinstance(x, Mapping | list) for x in v):
                parts.append(f"{k}=[{len(v)}]")
            else:
                shown = ",".join(str(x) for x in v[:8])
                parts.append(f"{k}={shown}{',…' if len(v) > 8 else ''}")
            continue
        if isinstance(v, float):
            parts.append(f"{k}={v:g}")
        else:
            parts.append(f"{k}={_cut(str(v), 120)}")
    return _cut(", ".join(parts), limit)


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _missing(what: str, en: str, zh: str) -> dict[str, Any]:
    return {"what": what, "reason": _i18n(en, zh)}


# ------------------------------------------------------------------------------------------------
# The scene bundle, read defensively


class _Bundle:
    """The parts of a scene bundle a report uses; every failure becomes a `missing` entry."""

    def __init__(self, scene_dir: str | None, missing: list[dict[str, Any]]) -> None:
        self.dir: Path | None = Path(scene_dir) if scene_dir else None
        self.manifest: dict[str, Any] | None = None
        self.missing = missing
        self.files: set[str] = set()
        self.line_counts: dict[str, int] = {}
        if self.dir is None:
            missing.append(
                _missing(
                    "scene",
                    "no scene bundle was saved for this incident; the evidence below is the diagnosis as recorded",
                    "此故障没有保存现场包；以下证据来自记录的诊断结果",
                )
            )
            return
        try:
            scene = load_scene(self.dir)
            self.manifest = scene.manifest
        except SceneError as exc:
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            self.manifest = self._raw_manifest()
            if self.manifest is None:
                missing.append(
                    _missing(
                        "scene",
                        f"the scene bundle cannot be used: {reason}",
                        f"现场包无法使用：{reason}",
                    )
                )
                return
            missing.append(
                _missing(
                    "scene",
                    f"the scene bundle does not check out ({reason}); what can be read is used",
                    f"现场包校验未通过（{reason}）；仍使用其中可读取的部分",
                )
            )
        for e in self.manifest.get("files") or []:
            if isinstance(e, Mapping) and isinstance(e.get("path"), str):
                self.files.add(e["path"])
                if isinstance(e.get("lines"), int) and not isinstance(e.get("lines"), bool):
                    self.line_counts[e["path"]] = int(e["lines"])
        for p in self.manifest.get("problems") or []:
            if isinstance(p, Mapping):
                reason_pair = _text_pair(p.get("reason")) or _i18n("not collected", "未收集")
                missing.append({"what": str(p.get("what") or "-"), "reason": reason_pair})

    def _raw_manifest(self) -> dict[str, Any] | None:
        assert self.dir is not None
        try:
            data = json.loads((self.dir / MANIFEST).read_bytes())
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) and isinstance(data.get("files"), list) else None

    @property
    def ok(self) -> bool:
        return self.manifest is not None

    def path(self, rel: Any) -> Path | None:
        """The file of the bundle at `rel`, only when the manifest lists it (no path escapes)."""
        if self.dir is None or not isinstance(rel, str) or rel not in self.files:
            return None
        parts = Path(rel).parts
        if not parts or rel.startswith("/") or ".." in parts:
            return None
        path = self.dir / rel
        try:
            # A link planted in a bundle must not lead a report outside it.
            if not path.resolve().is_relative_to(self.dir.resolve()):
                return None
        except OSError:
            return None
        return path

    def written_later(self, rel: Any) -> Path | None:
        """A file an action wrote into the bundle after its manifest (the stacks taken right before
        a restart): inside the bundle, a plain file, never a link out of it."""
        if self.dir is None or not isinstance(rel, str) or not rel or rel.startswith("/"):
            return None
        parts = Path(rel).parts
        if not parts or ".." in parts:
            return None
        path = self.dir / rel
        try:
            if path.is_symlink() or not path.is_file() or not path.resolve().is_relative_to(self.dir.resolve()):
                return None
        except OSError:
            return None
        return path

    def json(self, rel: str) -> Any:
        path = self.path(rel)
        if path is None:
            return None
        try:
            return json.loads(path.read_bytes()[:MAX_READ_BYTES])
        except (OSError, ValueError) as exc:
            self.missing.append(_missing(rel, f"cannot be read: {exc}"[:300], f"无法读取：{exc}"[:300]))
            return None

    def lines(self, rel: str, wanted: set[int]) -> dict[int, str] | None:
        """The lines (1-based) of a bundle file that are in `wanted`; None when it cannot be read."""
        path = self.path(rel)
        if path is None or not wanted:
            return None
        last = max(wanted)
        total = self.line_counts.get(rel)
        try:
            if total is not None and min(wanted) > total // 2:
                # The fault is usually at the end of a log: read back from the end, not the whole file.
                return self._lines_from_end(path, wanted, total)
            with open(path, "rb") as fh:
                data = fh.read(MAX_READ_BYTES)
        except OSError as exc:
            self.missing.append(
                _missing(rel, f"cannot be read: {exc.strerror or exc}", f"无法读取：{exc.strerror or exc}")
            )
            return None
        # One split in C up to the last line wanted (no Python work per line).
        lines = data.split(b"\n", last)
        n = len(lines)
        if n <= last and lines[-1] == b"":
            n -= 1  # the text ended with a newline: no line after it
        return {
            no: _cut(lines[no - 1].rstrip(b"\r").decode("utf-8", "replace"), MAX_LINE_CHARS)
            for no in sorted(wanted)
            if 1 <= no <= min(n, last)
        }

    @staticmethod
    def _lines_from_end(path: Path, wanted: set[int], total: int) -> dict[int, str]:
        need = total - min(wanted) + 2
        chunks: list[bytes] = []
        newlines = 0
        with open(path, "rb") as fh:
            pos = fh.seek(0, os.SEEK_END)
            while pos > 0 and newlines < need and sum(map(len, chunks)) < MAX_READ_BYTES:
                step = min(STEP_TAIL_BYTES, pos)
                pos -= step
                fh.seek(pos)
                chunk = fh.read(step)
                chunks.append(chunk)
                newlines += chunk.count(b"\n")
        data = b"".join(reversed(chunks))
        lines = data.split(b"\n")
        if data.endswith(b"\n"):
            lines.pop()
        first = 0 if pos == 0 else 1  # a partial first line is not used
        out = {}
        for no in sorted(wanted):
            i = len(lines) - 1 - (total - no)
            if first <= i < len(lines) and no <= total:
                out[no] = _cut(lines[i].rstrip(b"\r").decode("utf-8", "replace"), MAX_LINE_CHARS)
        return out

    def last_step(self) -> int | None:
        """The step of the last step-like line at the end of each saved container log, highest of all."""
        if self.manifest is None:
            return None
        best: int | None = None
        for pod in self.manifest.get("pods") or []:
            if not isinstance(pod, Mapping):
                continue
            for c in pod.get("containers") or []:
                if not isinstance(c, Mapping):
                    continue
                for key in ("log", "previous_log"):
                    step = self._tail_step(c.get(key))
                    if step is not None and (best is None or step > best):
                        best = step
        return best

    def _tail_step(self, rel: Any) -> int | None:
        path = self.path(rel)
        if path is None:
            return None
        try:
            with open(path, "rb") as fh:
                fh.seek(0, os.SEEK_END)
                size = fh.tell()
                fh.seek(max(0, size - STEP_TAIL_BYTES))
                data = fh.read(STEP_TAIL_BYTES)
        except OSError:
            return None
        for line in reversed(data.splitlines()):
            found = _STEP.findall(line)
            if found:
                return int(found[-1])
        return None


# ------------------------------------------------------------------------------------------------
# Pieces of the context


def _root_cause(incident: Incident, scene_findings: Mapping[str, Any] | None) -> dict[str, Any] | None:
    diag = incident.stored_diagnosis()
    rc = diag.get("root_cause") if diag is not None else None
    if isinstance(rc, Mapping):
        summary = _text_pair(rc.get("summary")) or _i18n(str(rc.get("code")), str(rc.get("code")))
        # Written before the catalog's placeholders were filled in: none shown raw.
        summary = {lang: elide(text) for lang, text in summary.items()}
        return {
            "fault_class": _str(rc.get("fault_class")),
            "chip": _str(rc.get("chip")),
            "code": _str(rc.get("code")),
            "vendor_action": _str(rc.get("vendor_action")),
            "action": _str(rc.get("action")),
            "node": _str(rc.get("node")),
            "device": _str(rc.get("device")),
            "rank": _int(rc.get("rank")),
            "ranks": [r for r in rc.get("ranks") or [] if isinstance(r, int)][:64],
            "nodes": [str(n) for n in rc.get("nodes") or []][:64],
            "severity": _str(rc.get("severity")),
            "severity_label": i18n("severity", rc["severity"]) if _str(rc.get("severity")) else None,
            "occurrences": _int(rc.get("occurrences")) or 1,
            "rule_id": _str(rc.get("rule_id")),
            "summary": summary,
            "hint": _text_pair(rc.get("hint")),
        }
    # The scene's findings.json carries the root cause in both languages (contract form).
    if scene_findings is None or not isinstance(scene_findings.get("root_cause"), Mapping):
        return None
    en: Mapping[str, Any] = scene_findings["root_cause"]
    zh_doc = scene_findings.get("root_cause_zh")
    zh: Mapping[str, Any] = zh_doc if isinstance(zh_doc, Mapping) else en
    return {
        "fault_class": _str(en.get("fault_class")),
        "chip": _str(en.get("chip")),
        "code": _str(en.get("code")),
        "vendor_action": _str(en.get("vendor_action")),
        "action": _str(en.get("action")),
        "node": _str(en.get("node")),
        "device": _str(en.get("device")),
        "rank": _int(en.get("rank")),
        "ranks": [],
        "nodes": [],
        "severity": None,
        "severity_label": None,
        "occurrences": 1,
        "rule_id": None,
        "summary": _i18n(
            elide(str(en.get("summary") or en.get("code"))), elide(str(zh.get("summary") or en.get("code")))
        ),
        "hint": _text_pair({"en": en.get("hint"), "zh": zh.get("hint")}) if en.get("hint") else None,
    }


def _vendor(rc: Mapping[str, Any] | None, evidence: Mapping[str, Any]) -> dict[str, Any] | None:
    """What the chip vendor's catalog says about the root cause's code (udal), or None. A verbatim
    message template's placeholders ("Reason: %s") are filled from the root cause's log line."""
    if rc is None or not rc.get("chip") or not rc.get("code"):
        return None
    try:
        entry = lookup(str(rc["chip"]), str(rc["code"]))
        source = get_plugin(str(rc["chip"])).catalog_source() if entry is not None else None
    except (CatalogError, PluginError, ValueError, OSError):
        return None
    if entry is None:
        return None
    line = next((str(e["text"]) for e in evidence["items"] if e["is_root"]), None)
    return {
        "code": entry.code,
        "mnemonic": entry.mnemonic,
        "description": fill(entry.description, line) or "-",
        "vendor_action": entry.vendor_action,
        "action": entry.action.value,
        "origin": entry.origin,
        "origin_label": i18n("origin", entry.origin),
        "message": {lang: elide(text) for lang, text in entry.message.model_dump().items()},
        "inferred": entry.inferred,
        # The catalog's notes are our prose: their ASCII arrows read as arrows in Markdown too.
        "note": elide(entry.note).replace(" -> ", " → ") if entry.note else None,
        "causes": [elide(c) for c in entry.causes],
        "steps": [elide(c) for c in entry.steps],
        "source": source,
    }


def _findings(incident: Incident, scene_findings: Mapping[str, Any] | None) -> tuple[list[Mapping[str, Any]], bool]:
    """The findings with their places: the scene's (line numbers in the bundle) when it has them."""
    if scene_findings is not None and isinstance(scene_findings.get("findings"), list):
        return [f for f in scene_findings["findings"] if isinstance(f, Mapping)], True
    diag = incident.stored_diagnosis()
    raw = diag.get("findings") if diag is not None else None
    return [f for f in raw or [] if isinstance(f, Mapping)], False


def _evidence(
    findings: Sequence[Mapping[str, Any]], in_scene: bool, rc: Mapping[str, Any] | None, bundle: _Bundle
) -> dict[str, Any]:
    shown = list(findings[:MAX_EVIDENCE])
    # One pass per file over the lines wanted from it.
    wanted: dict[str, set[int]] = {}
    for f in shown:
        ev = f.get("evidence") if in_scene else None
        if isinstance(ev, Mapping) and isinstance(ev.get("path"), str) and isinstance(ev.get("line"), int):
            hit = int(ev["line"])
            wanted.setdefault(ev["path"], set()).update(range(max(1, hit - CONTEXT_LINES), hit + CONTEXT_LINES + 1))
    read = {rel: bundle.lines(rel, lines) for rel, lines in wanted.items()}
    items = []
    for f in shown:
        ev = f.get("evidence") if in_scene else None
        file: str | None
        line: int | None
        context: list[dict[str, Any]] = []
        if isinstance(ev, Mapping) and isinstance(ev.get("path"), str) and isinstance(ev.get("line"), int):
            hit = int(ev["line"])
            file, line = str(ev["path"]), hit
            got = read.get(file) or {}
            for no in range(max(1, hit - CONTEXT_LINES), hit + CONTEXT_LINES + 1):
                if no in got:
                    context.append({"no": no, "text": got[no], "hit": no == hit})
            if hit not in got:
                context = []
        else:
            file, line = _str(f.get("file")), _int(f.get("line_no"))
        code = _str(f.get("code"))
        is_root = rc is not None and code == rc.get("code") and (rc.get("rule_id") in (None, f.get("rule_id")))
        items.append(
            {
                "file": file,
                "line": line,
                "where": f"{file or '-'}:{line if line is not None else '-'}",
                "rule_id": _str(f.get("rule_id")),
                "code": code,
                "fault_class": _str(f.get("fault_class")),
                "count": _int(f.get("count")) or 1,
                "pod": _str(f.get("pod")),
                "node": _str(f.get("node")),
                "rank": _int(f.get("rank")),
                "consequence_of": _str(f.get("consequence_of")),
                "is_root": bool(is_root),
                "text": _cut(str(f.get("text") or ""), MAX_LINE_CHARS),
                "context": context,
            }
        )
    return {
        "items": items,
        "total": len(findings),
        "hidden": max(0, len(findings) - len(shown)),
        "in_scene": in_scene,
    }


def _where(
    incident: Incident, rc: Mapping[str, Any] | None, evidence: Mapping[str, Any], bundle: _Bundle
) -> dict[str, Any]:
    pod = None
    for item in evidence["items"]:
        if item["is_root"] and item["pod"]:
            pod = item["pod"]
            break
    pods = [p for p in (bundle.manifest or {}).get("pods") or [] if isinstance(p, Mapping)]
    if pod is None and rc is not None and rc.get("rank") is not None:
        pod = next((str(p.get("name")) for p in pods if p.get("rank") == rc["rank"]), None)
    if pod is None and rc is not None and rc.get("node"):
        on_node = [str(p.get("name")) for p in pods if p.get("node") == rc["node"]]
        pod = on_node[0] if len(on_node) == 1 else None
    device, rank = (rc or {}).get("device"), (rc or {}).get("rank")
    place_from = None
    if rc is not None and (device is None or rank is None):
        found_device, found_rank, place_from = _place_in_lines(evidence, rank)
        device = device if device is not None else found_device
        rank = rank if rank is not None else found_rank
    return {
        "node": (rc or {}).get("node") or incident.node,
        "device": device,
        "place_from": place_from,
        "rank": rank,
        "pod": pod,
        "namespace": incident.namespace,
        "job": incident.job,
        "job_kind": incident.job_kind,
        "ranks": list((rc or {}).get("ranks") or []),
        "nodes": list((rc or {}).get("nodes") or []),
        "chain": [str(p) for p in (rc or {}).get("chain") or []],
        "candidates": [str(p) for p in (rc or {}).get("candidates") or []],
    }


# Where a runtime names the device (and rank) of the process it logs for: CANN's
# "(PID:1292364, Device:0, RankID:8)", "device_id=3", "Device ID: 3", "deviceId 3".
_DEVICE_IN_LINE = re.compile(r"\bDevice(?:[ _]?I[Dd])?\s*[:=]?\s*(\d{1,4})\b")
_RANK_IN_LINE = re.compile(r"\bRank(?:[ _]?I[Dd])\s*[:=]?\s*(\d{1,6})\b")


def _place_in_lines(evidence: Mapping[str, Any], rank: Any) -> tuple[str | None, int | None, str | None]:
    """The device (and rank) the root cause's own lines name, nearest the root line first, and
    where ("file:line"); a line that names another rank than the root cause's is not used."""
    for item in evidence["items"]:
        if not item["is_root"]:
            continue
        hit = item["line"]
        lines = [(c["no"], c["text"]) for c in item["context"]] or [(hit, item["text"])]
        lines.sort(key=lambda c: abs(c[0] - hit) if isinstance(hit, int) and isinstance(c[0], int) else 0)
        for no, text in lines:
            m = _DEVICE_IN_LINE.search(text)
            if m is None:
                continue
            r = _RANK_IN_LINE.search(text)
            if r is not None and isinstance(rank, int) and int(r.group(1)) != rank:
                continue
            where = f"{item['file'] or '-'}:{no if no is not None else '-'}"
            return m.group(1), int(r.group(1)) if r is not None else None, where
        return None, None, None
    return None, None, None


def _timeline_event(kind: str) -> dict[str, str]:
    names = labels()
    if kind.startswith("status:"):
        status = kind.split(":", 1)[1]
        head = names["timeline"]["status"]
        st = names["status"].get(status, {"en": status, "zh": status})
        return {lang: f"{head[lang]}{_COLON[lang]}{st[lang]}" for lang in LANGS}
    if kind.startswith("action:"):
        _, name, *rest = kind.split(":")
        state = rest[0] if rest else ""
        an = names["action"].get(name, {"en": name, "zh": name})
        sn = names["action_state"].get(state, {"en": state, "zh": state})
        return {lang: f"{an[lang]}{_COLON[lang]}{sn[lang]}" for lang in LANGS}
    return i18n("timeline", kind)


def _timeline(store: IncidentStore, incident: Incident) -> dict[str, Any]:
    entries = store.timeline(incident.id)
    hidden = max(0, len(entries) - MAX_TIMELINE)
    items = []
    for e in entries[hidden:]:
        kind = str(e.get("kind"))
        items.append(
            {
                "t": _num(e.get("t")),
                "kind": kind,
                "event": _timeline_event(kind),
                "detail": _summary(e.get("detail")),
            }
        )
    return {"items": items, "hidden": hidden}


def _actions(incident: Incident) -> list[dict[str, Any]]:
    out = []
    for a in incident.actions:
        out.append(
            {
                "seq": a.seq,
                "name": a.name,
                "label": i18n("action", a.name),
                "state": a.state.value,
                "state_label": i18n("action_state", a.state.value),
                "started": a.started,
                "finished": a.finished,
                "params": _summary({k: v for k, v in a.params.items() if k not in ("uid", "api_version")}),
                "result": _summary(a.result),
            }
        )
    return out


def _skipped(plan: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    out = []
    for s in (plan or {}).get("skipped") or []:
        if isinstance(s, Mapping) and s.get("name"):
            out.append(
                {
                    "name": str(s["name"]),
                    "label": i18n("action", s["name"]),
                    "reason": _text_pair(s.get("reason")) or _i18n("-", "-"),
                }
            )
    return out


def _metrics(bundle: _Bundle, rc: Mapping[str, Any] | None, missing: list[dict[str, Any]]) -> dict[str, Any]:
    doc = bundle.json("metrics.json") if bundle.ok and "metrics.json" in bundle.files else None
    nodes = doc.get("nodes") if isinstance(doc, Mapping) else None
    if not isinstance(nodes, Mapping) or not nodes:
        if bundle.ok and not any(str(m["what"]).startswith("metrics.json") for m in missing):
            missing.append(
                _missing("metrics.json", "no accelerator metrics in the scene bundle", "现场包中没有加速卡指标")
            )
        return {"available": False, "window": None, "charts": []}
    order: list[str] = []
    for n in [(rc or {}).get("node"), *((rc or {}).get("nodes") or []), *sorted(nodes)]:
        if n in nodes and n not in order:
            order.append(n)
    first = ["accelerator_utilization", *FAULT_METRICS.get(str((rc or {}).get("fault_class")), ())]
    priority = list(dict.fromkeys([*first, *CHART_METRICS]))
    charts = []
    for node in order[:MAX_CHART_NODES]:
        per_metric: dict[str, list[dict[str, Any]]] = {}
        series_map = nodes[node] if isinstance(nodes[node], Mapping) else {}
        for key, points in series_map.items():
            m = _SERIES_KEY.match(str(key))
            name, device = (m.group("name"), m.group("device")) if m else (str(key), "")
            if not isinstance(points, list):
                continue
            clean = [
                [float(p[0]), _num(p[1])]
                for p in points
                if isinstance(p, list | tuple) and len(p) == 2 and _num(p[0]) is not None
            ]
            per_metric.setdefault(name, []).append({"name": device or "-", "points": clean})
        ranked = [m for m in priority if m in per_metric] + sorted(m for m in per_metric if m not in priority)
        for metric in ranked[:MAX_METRICS_PER_NODE]:
            series = sorted(per_metric[metric], key=lambda s: _device_order(s["name"]))[:MAX_CHART_SERIES]
            charts.append({"node": node, "metric": metric, "series": series})
    window = doc.get("window") if isinstance(doc, Mapping) and isinstance(doc.get("window"), Mapping) else None
    return {"available": bool(charts), "window": dict(window) if window else None, "charts": charts}


def _device_order(name: str) -> tuple[int, int, str]:
    return (0, int(name), "") if name.isdigit() else (1, 0, name)


def _checkpoint(
    incident: Incident, bundle: _Bundle, fault_time: float | None, missing: list[dict[str, Any]]
) -> dict[str, Any]:
    listing_doc = bundle.json("checkpoints.json") if bundle.ok and "checkpoints.json" in bundle.files else None
    listing = None
    if isinstance(listing_doc, Mapping) and isinstance(listing_doc.get("checkpoints"), list):
        listing = [c for c in listing_doc["checkpoints"] if isinstance(c, Mapping)]
    elif bundle.ok:
        missing.append(
            _missing("checkpoints.json", "no checkpoint listing in the scene bundle", "现场包中没有检查点列表")
        )

    kind = "unknown"
    used: dict[str, Any] | None = None
    restart = next((a for a in incident.actions if a.name in _RESTARTS and a.state.value == "done"), None)
    if restart is not None and "checkpoint" in restart.params:
        path = _str(restart.params.get("checkpoint")) or _str((restart.result or {}).get("resumed_from"))
        if path is None:
            kind = "scratch"
        else:
            kind = "resumed"
            step = _int(restart.params.get("step"))
            used = {"path": path, "step": step, "mtime": None, "format": None, "size_bytes": None}
            for c in listing or []:
                if c.get("path") == path or (step is not None and c.get("step") == step and c.get("complete")):
                    used.update(
                        mtime=_num(c.get("mtime")), format=_str(c.get("format")), size_bytes=_int(c.get("size_bytes"))
                    )
                    break
    elif listing is not None:
        complete = [c for c in listing if c.get("complete")]
        if complete:
            best = max(complete, key=lambda c: (_int(c.get("step")) or -1, _num(c.get("mtime")) or 0.0))
            kind = "candidate"
            used = {
                "path": str(best.get("path")),
                "step": _int(best.get("step")),
                "mtime": _num(best.get("mtime")),
                "format": _str(best.get("format")),
                "size_bytes": _int(best.get("size_bytes")),
            }
        else:
            kind = "none"
    last_step = bundle.last_step()
    steps_lost: int | None = None
    if last_step is not None:
        if used is not None and used.get("step") is not None:
            steps_lost = max(0, last_step - int(used["step"]))
        elif kind in ("scratch", "none"):
            steps_lost = last_step
    time_lost = None
    if used is not None and used.get("mtime") is not None and fault_time is not None:
        time_lost = max(0.0, fault_time - float(used["mtime"]))
    incomplete = [c for c in listing or [] if not c.get("complete")]
    return {
        "kind": kind,
        "used": used,
        "last_step": last_step,
        "steps_lost": steps_lost,
        "time_lost_s": time_lost,
        "incomplete": [
            {
                "path": str(c.get("path")),
                "step": _int(c.get("step")),
                "reason": _text_pair({"en": c.get("reason"), "zh": c.get("reason_zh") or c.get("reason")}),
            }
            for c in incomplete[-5:]
        ],
    }


def _fault_time(incident: Incident, bundle: _Bundle, findings: Sequence[Mapping[str, Any]]) -> float | None:
    t = parse_rfc3339((bundle.manifest or {}).get("fault_time"))
    if t is not None:
        return t
    times = [x for x in (_num(f.get("timestamp")) for f in findings) if x is not None]
    if times:
        return min(times)
    start = _num(incident.diagnosis.get("window_start")) if isinstance(incident.diagnosis, Mapping) else None
    return start if start else incident.created


def _each(key: str, args: Mapping[str, Any]) -> dict[str, str]:
    """recommend.<key> in both languages; an argument may be a {"en", "zh"} pair."""
    entry = labels()["recommend"][key]
    out = {}
    for lang in LANGS:
        values = {k: (v[lang] if isinstance(v, Mapping) else v) for k, v in args.items()}
        out[lang] = entry[lang].format(**values)
    return out


def _recommendations(
    incident: Incident,
    rc: Mapping[str, Any] | None,
    plan: Mapping[str, Any] | None,
    bundle: _Bundle,
) -> list[dict[str, str]]:
    out: list[dict[str, str]] = []
    if rc is not None and rc.get("hint"):
        out.append(rc["hint"])
    # "Restart the application" beside a plan that restarts nothing (the policy holds the restart
    # back, e.g. an out-of-memory that would fail the same way) contradicts the report's own advice.
    plans_restart = any(a.name in _RESTARTS for a in incident.actions)
    if rc is not None and rc.get("action") and (rc["action"] != "restart_app" or plans_restart):
        meaning = i18n("normalized", rc["action"])
        if rc.get("vendor_action"):
            out.append(
                _each("vendor", {"vendor_action": rc["vendor_action"], "action": rc["action"], "meaning": meaning})
            )
        else:
            out.append(_each("normalized_only", {"action": rc["action"], "meaning": meaning}))
    for h in (plan or {}).get("hints") or []:
        pair = _text_pair(h)
        if pair:
            out.append(pair)
    status = incident.status.value
    if status == "awaiting_approval":
        out.append(_each("approve", {"id": incident.id}))
    elif status == "observed":
        out.append(_each("observed", {"mode": i18n("mode", incident.mode or "observe")}))
    elif status == "rejected":
        out.append(_each("rejected", {}))
    elif status == "failed":
        out.append(_each("failed", {}))
    elif status in ("acting", "open"):
        out.append(_each("acting", {}))
    blocked = _text_pair((plan or {}).get("blocked"))
    if blocked is not None:
        out.append(_each("blocked", {"reason": blocked}))
    if (plan or {}).get("page"):
        out.append(_each("page", {}))
    for a in incident.actions:
        if a.name == "quarantine_node" and a.state.value == "done":
            node = _str((a.result or {}).get("node")) or _str(a.params.get("node"))
            if node:
                out.append(_each("release", {"node": node, "id": incident.id}))
    if bundle.ok and bundle.dir is not None:
        out.append(_each("scene", {"dir": str(bundle.dir)}))
    seen: set[tuple[str, str]] = set()
    unique = []
    for r in out:
        key = (r["en"], r["zh"])
        if key not in seen:
            seen.add(key)
            unique.append(r)
    return unique


def _stacks(incident: Incident, bundle: _Bundle) -> list[dict[str, Any]]:
    """The Python stacks saved for the incident, as links relative to the bundle (where the report
    is written) with the full path: those the dump_stacks action took right before a restart first
    (the state the job was in when it was killed), then those taken with the scene."""
    out: list[dict[str, Any]] = []
    seen: set[str] = set()

    def add(rel: str, method: Any, when: str) -> None:
        if rel in seen or bundle.dir is None:
            return
        seen.add(rel)
        pod = Path(rel).stem
        out.append(
            {
                "path": rel,
                "full": str(bundle.dir / rel),
                "pod": pod,
                "method": _str(method),
                "when": i18n("labels", when),
            }
        )

    for a in incident.actions:
        result = a.result or {}
        if a.name != "dump_stacks" or a.state.value != "done" or not isinstance(result.get("files"), list):
            continue
        raw_methods = result.get("methods")
        methods: Mapping[str, Any] = raw_methods if isinstance(raw_methods, Mapping) else {}
        for rel in result["files"]:
            if bundle.written_later(rel) is not None:
                add(str(rel), methods.get(Path(str(rel)).stem), "stacks_before_restart")
    manifest_stacks = (bundle.manifest or {}).get("stacks")
    per_pod = manifest_stacks if isinstance(manifest_stacks, Mapping) else {}
    for rel in sorted(bundle.files):
        if rel.startswith("stacks/") and rel.endswith(".txt") and bundle.path(rel) is not None:
            dump = per_pod.get(Path(rel).stem)
            add(rel, dump.get("method") if isinstance(dump, Mapping) else None, "stacks_with_scene")
    return out[:MAX_STACK_FILES]


# ------------------------------------------------------------------------------------------------
# The top block: the outcome, what trainmedic did, what a person must still do


def _fmt(group: str, key: str, **args: Any) -> dict[str, str]:
    """<group>.<key> in both languages; an argument may be a {"en", "zh"} pair."""
    entry = labels()[group][key]
    return {
        lang: entry[lang].format(**{k: (v[lang] if isinstance(v, Mapping) else v) for k, v in args.items()})
        for lang in LANGS
    }


def _outcome_kind(incident: Incident, restarted: bool) -> str:
    status = incident.status.value
    if status == "resolved":
        return "healed" if restarted else "not_restarted"
    if status == "observed":
        return "observe_only"
    if status in ("awaiting_approval", "failed", "rejected", "blocked"):
        return status
    return "acting"


def _outcome(
    incident: Incident,
    rc: Mapping[str, Any] | None,
    plan: Mapping[str, Any] | None,
    checkpoint: Mapping[str, Any],
    where: Mapping[str, Any],
    stacks: Sequence[Mapping[str, Any]],
) -> dict[str, Any]:
    """How the incident ended, in words a person reads first: the outcome, what trainmedic did (the
    node it quarantined, where the job resumed, from which checkpoint and step) and what a person
    must still do, each with its exact command. The advice depends on the fault class and the
    outcome only, so two incidents of one kind read the same."""
    done = {a.name: a for a in incident.actions if a.state.value == "done"}
    restarted = any(n in done for n in _RESTARTS)
    kind = _outcome_kind(incident, restarted)
    node = _str(where.get("node")) or incident.node
    did: list[dict[str, str]] = []
    quarantined: str | None = None
    q = done.get("quarantine_node")
    if q is not None:
        quarantined = _str((q.result or {}).get("node")) or _str(q.params.get("node")) or node
        if quarantined:
            did.append(_fmt("outcome", "did_quarantine", node=quarantined))
    restart = done.get("restart_from_checkpoint") or done.get("raise_memory_limit")
    if restart is not None:
        used = checkpoint.get("used") if checkpoint.get("kind") == "resumed" else None
        if isinstance(used, Mapping):
            excluded = [str(n) for n in (restart.result or {}).get("excluded_nodes") or []]
            step = used.get("step")
            did.append(
                _fmt(
                    "outcome",
                    "did_resume",
                    checkpoint=str(used.get("path")),
                    step=_fmt("outcome", "did_resume_step", step=step) if step is not None else "",
                    nodes=_fmt("outcome", "did_resume_nodes", nodes=", ".join(excluded)) if excluded else "",
                )
            )
        elif restart.name == "raise_memory_limit":
            did.append(_fmt("outcome", "did_memory"))
        else:
            did.append(_fmt("outcome", "did_scratch"))
    stacks_taken = done.get("dump_stacks")
    stack_files = (stacks_taken.result or {}).get("files") if stacks_taken is not None else None
    if isinstance(stack_files, list):
        # Before the restart line: the stacks are of the processes the restart then killed.
        did.insert(len(did) - (1 if restart is not None else 0), _fmt("outcome", "did_stacks", n=len(stack_files)))
    if not did:
        did.append(_fmt("outcome", "did_nothing"))

    job_ref = f"{incident.namespace}/{incident.job}" if incident.job else incident.key
    fault = i18n("fault_class", incident.fault_class) if incident.fault_class else _i18n("fault", "故障")
    label = i18n("outcome", kind)
    headline = _fmt("outcome", "headline", outcome=label, fault=fault, where=node or job_ref)

    now: list[dict[str, Any]] = []

    def add(key: str, command: str | None = None, links: Sequence[Mapping[str, Any]] = (), **args: Any) -> None:
        now.append({"text": _fmt("now", key, **args), "command": command, "links": [dict(x) for x in links]})

    if kind == "awaiting_approval":
        add("approve", f"trainmedic approve {incident.id}")
    elif kind == "observe_only":
        add("observe", mode=i18n("mode", incident.mode or "observe"))
    elif kind == "failed":
        add("failed", f"trainmedic incidents {incident.id}")
    elif kind == "blocked":
        add("blocked", reason=_text_pair((plan or {}).get("blocked")) or _i18n("-", "-"))
    elif kind == "acting":
        add("acting", f"trainmedic incidents {incident.id}")
    fault_class = incident.fault_class or "unknown"
    if fault_class == "hang":
        if stacks:
            # The state the job was in when it was killed first; the rest are under Saved stacks.
            before = [st for st in stacks if st["when"] == i18n("labels", "stacks_before_restart")]
            add("hang", links=(before or list(stacks))[:MAX_TOP_LINKS])
        else:
            add("hang_no_stacks")
    elif fault_class in labels()["now"]:
        add(fault_class, node=node or "-")
    if quarantined:
        add("release", f"trainmedic release-node {quarantined} --incident {incident.id}", node=quarantined)
    if kind == "healed" and incident.job:
        add("watch", f"kubectl -n {incident.namespace} get {(incident.job_kind or 'job').lower()} {incident.job}")
    elif kind in ("not_restarted", "observe_only", "failed", "rejected", "blocked") and incident.job:
        add("resubmit")
    return {"kind": kind, "label": label, "headline": headline, "did": did, "now": now}


# ------------------------------------------------------------------------------------------------
# Public API


def report_context(store: IncidentStore, incident_id: str, *, now: float | None = None) -> dict[str, Any]:
    """Everything a report of the incident shows, as a JSON-ready dict (StoreError when there is no
    such incident). A missing or partial scene bundle is listed under `missing`, never an error."""
    incident = store.get(incident_id)
    missing: list[dict[str, Any]] = []
    bundle = _Bundle(incident.scene_dir, missing)
    scene_findings = None
    if bundle.ok:
        if "findings.json" in bundle.files:
            doc = bundle.json("findings.json")
            scene_findings = doc if isinstance(doc, Mapping) else None
        if scene_findings is None:
            missing.append(
                _missing(
                    "findings.json",
                    "the bundle's findings cannot be read; evidence is shown as the diagnosis recorded it",
                    "无法读取现场包中的发现；证据按诊断记录显示",
                )
            )
    rc = _root_cause(incident, scene_findings)
    stacks = _stacks(incident, bundle)
    if rc is not None and rc.get("fault_class") == "hang" and stacks:
        # The stacks are saved: the generic advice to go and take them would send the reader back
        # to a job that has been restarted since.
        rc["hint"] = i18n("recommend", "hang_stacks")
    findings, in_scene = _findings(incident, scene_findings)
    evidence = _evidence(findings, in_scene, rc, bundle)
    fault_time = _fault_time(incident, bundle, findings)
    plan = incident.plan if isinstance(incident.plan, Mapping) else None
    manifest = bundle.manifest or {}
    pods = [p for p in manifest.get("pods") or [] if isinstance(p, Mapping)]
    node_names: list[Any] = manifest["nodes"] if isinstance(manifest.get("nodes"), list) else []
    ctx: dict[str, Any] = {
        "schema": CONTEXT_SCHEMA,
        "generated_at": now if now is not None else store.clock(),
        "incident": {
            "id": incident.id,
            "key": incident.key,
            "status": incident.status.value,
            "status_label": i18n("status", incident.status.value),
            "mode": incident.mode,
            "mode_label": i18n("mode", incident.mode) if incident.mode else None,
            "namespace": incident.namespace,
            "job": incident.job,
            "job_kind": incident.job_kind,
            "node": incident.node,
            "fault_class": incident.fault_class,
            "fault_class_label": i18n("fault_class", incident.fault_class) if incident.fault_class else None,
            "code": incident.code,
            "chip": incident.chip,
            "created": incident.created,
            "updated": incident.updated,
            "revision": incident.revision,
            "scene_dir": incident.scene_dir,
            "approval": dict(incident.approval) if incident.approval else None,
        },
        "scale": {"pods": len(pods), "nodes": len(node_names)} if bundle.ok else None,
        "fault_time": fault_time,
        "root_cause": rc,
        "vendor": _vendor(rc, evidence),
        "where": _where(incident, rc, evidence, bundle),
        "timeline": _timeline(store, incident),
        "evidence": evidence,
        "metrics": _metrics(bundle, rc, missing),
        "actions": _actions(incident),
        "skipped": _skipped(plan),
        "checkpoint": _checkpoint(incident, bundle, fault_time, missing),
        "stacks": stacks,
        "recommendations": _recommendations(incident, rc, plan, bundle),
        "missing": missing,
    }
    ctx["outcome"] = _outcome(incident, rc, plan, ctx["checkpoint"], ctx["where"], ctx["stacks"])
    return ctx


def render_incident(
    store: IncidentStore,
    incident_id: str,
    *,
    fmt: str,
    lang: str,
    template_dir: str | Path | None = None,
) -> str:
    """One report of one incident (what the API and `trainmedic report` serve)."""
    return render_report(report_context(store, incident_id), fmt=fmt, lang=lang, template_dir=template_dir)


def default_report_dir(store: IncidentStore, incident: Incident) -> Path:
    """Beside the evidence (the scene bundle's directory) when there is one, else beside the store."""
    if incident.scene_dir and Path(incident.scene_dir).is_dir():
        return Path(incident.scene_dir)
    if store.path == ":memory:":
        raise ReportError(f"incident {incident.id}: no scene directory and an in-memory store; give out_dir")
    return Path(store.path).parent / "reports" / incident.id


def write_text_atomic(path: Path, text: str) -> None:
    """`text` at `path` whole or not at all: a temporary file beside it, flushed, renamed into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(text.encode("utf-8"))
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_reports(
    store: IncidentStore,
    incident_id: str,
    out_dir: Path | None = None,
    *,
    formats: Iterable[str] = FORMATS,
    langs: Iterable[str] = LANGS,
) -> dict[str, Path]:
    """report.{en,zh}.{md,html} of the incident in `out_dir` (default: `default_report_dir`).
    Returns {"en.md": path, ...}. StoreError for an unknown incident; ReportError / OSError when a
    report cannot be rendered or written."""
    ctx = report_context(store, incident_id)
    incident = store.get(incident_id)
    target = Path(out_dir) if out_dir is not None else default_report_dir(store, incident)
    out: dict[str, Path] = {}
    for lang in langs:
        for fmt in formats:
            text = render_report(ctx, fmt=fmt, lang=lang)
            path = target / f"report.{lang}.{fmt}"
            write_text_atomic(path, text)
            out[f"{lang}.{fmt}"] = path
    return out
