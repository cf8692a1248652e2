"""The sections of a report's context: root cause and vendor entry, findings and evidence with the
place, timeline, actions and skipped plans, metrics charts, checkpoint, recommendations, saved
stacks.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from trainmedic.agent.reporting.bundle import _Bundle
from trainmedic.agent.reporting.values import (
    _COLON,
    _RESTARTS,
    _SERIES_KEY,
    CHART_METRICS,
    CONTEXT_LINES,
    FAULT_METRICS,
    MAX_CHART_NODES,
    MAX_CHART_SERIES,
    MAX_EVIDENCE,
    MAX_LINE_CHARS,
    MAX_METRICS_PER_NODE,
    MAX_STACK_FILES,
    MAX_TIMELINE,
    _cut,
    _i18n,
    _int,
    _missing,
    _num,
    _str,
    _summary,
    _text_pair,
)
from trainmedic.agent.store import Incident, IncidentStore
from trainmedic.reports.report import LANGS, i18n, labels
from trainmedic.timefmt import parse_rfc3339
from trainmedic.udal import CatalogError, PluginError, get_plugin, lookup
from trainmedic.vendortext import elide, fill

# ------------------------------------------------------------------------------------------------
# Pieces of the context


def _located(rc: Mapping[str, Any]) -> dict[str, Any]:
    """What a root cause names and where it is, as both its stored forms hold it."""
    return {
        "fault_class": _str(rc.get("fault_class")),
        "chip": _str(rc.get("chip")),
        "code": _str(rc.get("code")),
        "vendor_action": _str(rc.get("vendor_action")),
        "action": _str(rc.get("action")),
        "node": _str(rc.get("node")),
        "device": _str(rc.get("device")),
        "rank": _int(rc.get("rank")),
    }


def _root_cause(incident: Incident, scene_findings: Mapping[str, Any] | None) -> dict[str, Any] | None:
    diag = incident.stored_diagnosis()
    rc = diag.get("root_cause") if diag is not None else None
    if isinstance(rc, Mapping):
        summary = _text_pair(rc.get("summary")) or _i18n(str(rc.get("code")), str(rc.get("code")))
        # Written before the catalog's placeholders were filled in: none shown raw.
        summary = {lang: elide(text) for lang, text in summary.items()}
        return {
            **_located(rc),
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
        **_located(en),
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
