"""Collection: `save_scene` gathers an incident's pods' logs, events, accelerator metrics, kernel
lines, objects and (for a hang) stacks, and writes them through the writer into one bundle.

Fast: logs are fetched concurrently (bounded) and cleaned, redacted, hashed and written in worker
threads, with no per-line Python work on the common path: line scans are numpy passes, and the
redaction regexes run only on the lines that Hyperscan (or, without it, literal triggers) finds
may hold a secret.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Coroutine, Mapping, Sequence
from pathlib import Path
from typing import Any

from trainmedic.events import DiagnosisEvent
from trainmedic.models import Finding, Source
from trainmedic.remediations.scene.model import (
    _ID,
    MANIFEST,
    SCHEMA_VERSION,
    SceneError,
    SceneInputs,
    SceneResult,
    SceneSettings,
    SceneSource,
)
from trainmedic.remediations.scene.pods import _log_rel, _map, _name, _pod_infos, _PodInfo, _safe
from trainmedic.remediations.scene.redact import _Redactor, _redactor, redact_text
from trainmedic.remediations.scene.text import event_order
from trainmedic.remediations.scene.writer import _commit, _fresh_dir, _read_complete, _Writer
from trainmedic.remediations.stacks import StackDump, StackSettings, dump_stacks
from trainmedic.timefmt import rfc3339


def _fault_time(d: DiagnosisEvent, now: float) -> float:
    times = [f.timestamp for f in d.diagnosis.findings if f.timestamp is not None and math.isfinite(f.timestamp)]
    if times:
        return min(times)
    return d.window_start if d.window_start and math.isfinite(d.window_start) else now


def _needle(finding: Finding, redactor: _Redactor) -> bytes:
    """The part of a finding's text to look for in the saved files (its first line, without the
    ellipses of a clipped text, redacted as the files are)."""
    first = finding.text.split("\n", 1)[0]
    piece = max(first.split("…"), key=len).strip()
    if len(piece) < 8:
        return b""
    piece, _ = redactor.redact_str(piece)
    return piece.encode("utf-8", "replace")


# ------------------------------------------------------------------------------------------------
# save_scene


async def save_scene(
    root: Path | str,
    inputs: SceneInputs,
    source: SceneSource,
    settings: SceneSettings = SceneSettings(),  # noqa: B008 - frozen: one shared default is safe
) -> SceneResult:
    """Save (once) the scene of an incident under `root/<incident_id>/` and return it.

    Idempotent: a complete bundle is returned unchanged (`created` False). What cannot be collected
    is listed in the manifest's `problems`; only a bad incident id, an unwritable root, or the task
    being cancelled stop it (then only a `.partial` directory is left, which the next call replaces).
    """
    if not _ID.match(inputs.incident_id):
        raise SceneError(f"incident id {inputs.incident_id!r} cannot name a directory (letters, digits, . _ -)")
    root = Path(root)
    final = root / inputs.incident_id
    existing = await asyncio.to_thread(_read_complete, final)
    if existing is not None:
        return SceneResult(dir=final, manifest=existing, created=False)
    if final.exists():
        raise SceneError(f"{final} exists but holds no complete scene bundle (no readable {MANIFEST})")
    partial = root / f".{inputs.incident_id}.partial"
    try:
        await asyncio.to_thread(_fresh_dir, partial)
    except OSError as exc:
        raise SceneError(f"cannot create {partial}: {exc.strerror or exc}") from exc
    writer = _Writer(partial, settings, _redactor())
    started = time.monotonic()
    try:
        manifest = await _build(writer, inputs, source, settings)
        manifest["collect_s"] = round(time.monotonic() - started, 3)
        manifest = await writer.run(_commit, partial, final, manifest, settings.durable)
    except BaseException:
        await writer.abandon()
        raise
    return SceneResult(dir=final, manifest=manifest, created=True)


async def _build(writer: _Writer, inputs: SceneInputs, source: SceneSource, settings: SceneSettings) -> dict[str, Any]:
    d = inputs.diagnosis
    fault = _fault_time(d, inputs.now)
    pods = _pod_infos(inputs)
    redactor = writer.redactor

    job: dict[str, Any] | None = None
    if d.job is not None:
        job = {"namespace": d.job.namespace, "name": d.job.name, "kind": d.job.kind, "api_version": d.job.api_version}
    elif inputs.workload is not None:
        meta = _map(inputs.workload.get("metadata"))
        job = {
            "namespace": meta.get("namespace"),
            "name": meta.get("name"),
            "kind": inputs.workload.get("kind"),
            "api_version": inputs.workload.get("apiVersion"),
        }

    # Stacks first: for a hang they exist only while the processes live, and SIGUSR1 dumps land in
    # the logs collected next.
    stacks: dict[str, StackDump] = {}
    if inputs.hang and settings.stacks and pods:
        stacks = await dump_stacks(
            source,
            [p for p in inputs.pods if isinstance(p, Mapping)],
            timeout_s=settings.stack_timeout_s,
            settings=StackSettings(concurrency=settings.concurrency),
        )

    findings = list(d.diagnosis.findings)
    needles = [_needle(f, redactor) for f in findings]
    evidence: dict[int, dict[str, Any]] = {}

    node_names = sorted(
        {p.node for p in pods if p.node}
        | {n for n in (_name(x) for x in inputs.nodes if isinstance(x, Mapping)) if n}
        | set(inputs.kernel_lines)
    )

    await _all(
        _collect_logs(writer, pods, source, settings, findings, needles, evidence),
        _collect_events(writer, inputs, pods, node_names, source, settings),
        _collect_metrics(writer, node_names, fault, inputs.now, source, settings),
    )
    # Every node's kernel lines in the window around the fault, one file per node, written in one job
    # off the event loop (a large job has hundreds of nodes).
    kernel_sections = await writer.run(_write_kernel, writer, inputs, fault, settings, findings, needles, evidence)
    await writer.run(_write_objects, writer, inputs, pods)
    await writer.run(_write_stacks, writer, stacks, pods)
    await writer.run(
        lambda: writer.put_data(
            "checkpoints.json", "checkpoints", {"checkpoints": list(inputs.checkpoints)}, fmt="json", bulky=False
        )
    )
    await writer.run(
        lambda: writer.put_data(
            "findings.json", "findings", _findings_doc(d, findings, evidence), fmt="json", bulky=False
        )
    )

    rc = d.diagnosis.root_cause
    entries = sorted(writer.entries, key=lambda e: str(e["path"]))
    by_path = {str(e["path"]): e for e in entries}
    return {
        "schema_version": SCHEMA_VERSION,
        "incident_id": inputs.incident_id,
        "created": rfc3339(inputs.now),
        "fault_time": rfc3339(fault),
        "job": job,
        "diagnosis_id": d.diagnosis_id,
        "root_cause": rc.contract_dict("en") if rc else None,
        "hang": inputs.hang,
        "pods": [
            {
                "name": p.name,
                "namespace": p.namespace,
                "node": p.node,
                "rank": p.rank,
                "uid": p.uid,
                "object": f"objects/pods/{p.file}.yaml" if f"objects/pods/{p.file}.yaml" in by_path else None,
                "containers": [
                    {
                        "name": c["name"],
                        "restarts": c["restarts"],
                        "log": _present(by_path, _log_rel(p, c, previous=False)),
                        "previous_log": _present(by_path, _log_rel(p, c, previous=True)),
                    }
                    for c in p.containers
                ],
            }
            for p in pods
        ],
        "nodes": node_names,
        "kernel_sections": kernel_sections,
        "stacks": {name: dump.as_dict() for name, dump in sorted(stacks.items())},
        "files": entries,
        "problems": sorted(writer.problems, key=lambda p: str(p["what"])),
        "limits": settings.limits(),
        "total_bytes": writer.total,
    }


async def _all(*coros: Coroutine[Any, Any, None]) -> None:
    """Run side by side; when one fails (or this is cancelled), the others are cancelled and waited
    for before the failure goes on, so nothing keeps writing into an abandoned bundle."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        await asyncio.gather(*tasks)
    except BaseException:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


def _present(by_path: Mapping[str, Any], rel: str) -> str | None:
    return rel if rel in by_path else None


async def _collect_logs(
    writer: _Writer,
    pods: list[_PodInfo],
    source: SceneSource,
    settings: SceneSettings,
    findings: list[Finding],
    needles: list[bytes],
    evidence: dict[int, dict[str, Any]],
) -> None:
    gate = asyncio.Semaphore(max(1, settings.concurrency))

    async def one(p: _PodInfo, c: dict[str, Any], previous: bool) -> None:
        rel = _log_rel(p, c, previous=previous)
        mine = [
            i
            for i, f in enumerate(findings)
            if f.pod == p.name and (f.namespace in (None, p.namespace)) and needles[i] and i not in evidence
        ]
        async with gate:
            try:
                text = await source.pod_log(
                    p.namespace,
                    p.name,
                    c["name"],
                    tail_lines=settings.log_lines,
                    previous=previous,
                    limit_bytes=settings.max_file_bytes,
                )
            except Exception as exc:  # noqa: BLE001 - one pod's log is a problem entry, not a failure
                writer.problem(
                    rel,
                    f"the log could not be read: {type(exc).__name__}: {exc}"[:500],
                    f"无法读取日志：{type(exc).__name__}: {exc}"[:500],
                )
                return
            if previous and not text:
                writer.problem(
                    rel,
                    "the previous instance's log is gone (or was empty)",
                    "上一次运行的容器日志已不存在（或为空）",
                )
                return
            raw = text.encode("utf-8", "replace") if isinstance(text, str) else bytes(text)
            meta = {"pod": p.name, "namespace": p.namespace, "container": c["name"], "previous": previous}
            entry, hits = await writer.run(
                lambda: writer.put_text(
                    rel,
                    "previous_log" if previous else "log",
                    raw,
                    tail_lines=settings.log_lines,
                    meta=meta,
                    needles=[needles[i] for i in mine],
                )
            )
        if entry is None:
            return
        for j, (first, last) in hits.items():
            i = mine[j]
            # The current instance's log wins over the previous one's.
            if i not in evidence or not previous:
                evidence[i] = {"path": rel, "line": first, "last_line": last}

    jobs = [
        one(p, c, prev) for p in pods for c in p.containers for prev in ((False, True) if c["restarted"] else (False,))
    ]
    await _all(*jobs)


async def _collect_events(
    writer: _Writer,
    inputs: SceneInputs,
    pods: list[_PodInfo],
    nodes: list[str],
    source: SceneSource,
    settings: SceneSettings,
) -> None:
    wanted: dict[str, set[tuple[str, str]]] = {}
    d = inputs.diagnosis
    if d.job is not None and d.job.kind != "Pod":
        wanted.setdefault(d.job.namespace, set()).add((d.job.kind, d.job.name))
    for p in pods:
        wanted.setdefault(p.namespace, set()).add(("Pod", p.name))
    if nodes:
        # The kubelet and node-problem-detector record node events in the default namespace.
        wanted.setdefault("default", set()).update(("Node", n) for n in nodes)
    if not wanted:
        return
    events: dict[tuple[str, str], dict[str, Any]] = {}
    for ns, involved in sorted(wanted.items()):
        try:
            found = await source.list_events(ns, involved=involved)
        except Exception as exc:  # noqa: BLE001 - recorded
            writer.problem(
                f"events.yaml ({ns})",
                f"events could not be listed: {type(exc).__name__}: {exc}"[:500],
                f"无法列出事件：{type(exc).__name__}: {exc}"[:500],
            )
            continue
        for e in found if isinstance(found, list) else []:
            if isinstance(e, Mapping):
                meta = _map(e.get("metadata"))
                key = (str(meta.get("namespace") or ns), str(meta.get("name") or len(events)))
                events[key] = dict(e)
    ordered = sorted(events.values(), key=event_order)
    if len(ordered) > settings.max_events:
        writer.problem(
            "events.yaml",
            f"{len(ordered)} events, the newest {settings.max_events} kept",
            f"共 {len(ordered)} 条事件，保留最新的 {settings.max_events} 条",
        )
        ordered = ordered[-settings.max_events :]
    await writer.run(lambda: writer.put_data("events.yaml", "events", ordered, fmt="yaml", bulky=True))


async def _collect_metrics(
    writer: _Writer, nodes: list[str], fault: float, now: float, source: SceneSource, settings: SceneSettings
) -> None:
    """The nodes' accelerator metrics from `metrics_window_s` before the fault to `metrics_after_s`
    after it (no later than the scene's time): read concurrently (bounded by `concurrency`: one range
    query per node, a Prometheus round trip each), cleaned and written off the event loop (tens of
    thousands of points for a large job)."""
    if not nodes:
        return
    start, end = fault - settings.metrics_window_s, max(fault, min(now, fault + settings.metrics_after_s))
    gate = asyncio.Semaphore(max(1, settings.concurrency))

    async def read(node: str) -> Any:
        async with gate:
            try:
                return await source.metrics_range(node, start, end, settings.metrics_step_s)
            except NotImplementedError:
                return None
            except Exception as exc:  # noqa: BLE001 - recorded
                writer.problem(
                    f"metrics.json ({node})",
                    f"metrics could not be read: {type(exc).__name__}: {exc}"[:500],
                    f"无法读取指标：{type(exc).__name__}: {exc}"[:500],
                )
                return _UNREADABLE

    read_all = await asyncio.gather(*(read(node) for node in nodes))
    missing = [node for node, series in zip(nodes, read_all, strict=True) if series is None]
    if missing:
        writer.problem(
            "metrics.json",
            f"no metrics source for node(s) {', '.join(missing)}",
            f"节点 {', '.join(missing)} 没有可用的指标来源",
        )
    found = [(node, series) for node, series in zip(nodes, read_all, strict=True) if series not in (None, _UNREADABLE)]
    if not found:
        return

    def write() -> None:
        out: dict[str, dict[str, list[list[float | None]]]] = {}
        redactions = 0
        for node, series in found:
            node_out: dict[str, list[list[float | None]]] = {}
            for raw_name, points in list(_map(series).items())[: settings.max_metric_series]:
                name, n = writer.redactor.redact_str(str(raw_name))
                redactions += n
                node_out[name] = _clean_points(points, settings.max_metric_points)
            node_name, n = writer.redactor.redact_str(node)
            redactions += n
            out[node_name] = node_out
        doc = {"window": {"start": start, "end": end, "step": settings.metrics_step_s}, "nodes": out}
        writer.put_data("metrics.json", "metrics", doc, fmt="json", bulky=True, redactions=redactions)

    await writer.run(write)


_UNREADABLE = object()
_INF = math.inf


def _clean_points(points: Any, limit: int) -> list[list[float | None]]:
    """The last `limit` points of a series as [time, value] floats (Prometheus sends the value as a
    string); a non-finite value becomes None (JSON has no NaN), a malformed point is dropped."""
    if not isinstance(points, Sequence) or isinstance(points, str | bytes):
        return []
    clean: list[list[float | None]] = []
    append = clean.append
    for pt in (points if isinstance(points, list | tuple) else list(points))[-limit:]:
        try:
            v = float(pt[1])
            append([float(pt[0]), v if -_INF < v < _INF else None])
        except (TypeError, ValueError, IndexError, KeyError):
            continue
    return clean


def _write_kernel(
    writer: _Writer,
    inputs: SceneInputs,
    fault: float,
    settings: SceneSettings,
    findings: list[Finding],
    needles: list[bytes],
    evidence: dict[int, dict[str, Any]],
) -> list[dict[str, Any]]:
    lo, hi = fault - settings.kernel_before_s, fault + settings.kernel_after_s
    per_node: list[tuple[str, list[tuple[float, str]]]] = []
    for node in sorted(inputs.kernel_lines):
        kept = []
        for item in inputs.kernel_lines[node]:
            try:
                t, line = float(item[0]), str(item[1])
            except (TypeError, ValueError, IndexError):
                continue
            if lo <= t <= hi:
                kept.append((t, line))
        if kept:
            kept.sort(key=lambda x: x[0])
            per_node.append((node, kept))
    if not per_node:
        return []
    share = max(1, settings.max_kernel_lines // len(per_node))
    sections: list[dict[str, Any]] = []
    for node, lines in per_node:
        rel = kernel_rel(node)
        kept = lines
        if len(kept) > share:
            writer.problem(
                rel,
                f"{len(kept)} kernel lines in the window, the last {share} kept",
                f"时间窗口内共 {len(kept)} 行内核日志，保留最后 {share} 行",
            )
            kept = kept[-share:]
        raw = ("\n".join(line.replace("\r", "") for _, line in kept) + "\n").encode("utf-8", "replace")
        # A kernel finding's evidence is in its own node's file; one without a node in the first that has it.
        mine = [
            i
            for i, f in enumerate(findings)
            if f.source is Source.KERNEL and needles[i] and i not in evidence and f.node in (node, None)
        ]
        entry, hits = writer.put_text(rel, "kernel", raw, meta={"node": node}, needles=[needles[i] for i in mine])
        if entry is None:
            continue
        sections.append(
            {
                "node": node,
                "path": rel,
                "first_line": 1,
                "last_line": entry["lines"],
                "first_time": kept[0][0],
                "last_time": kept[-1][0],
            }
        )
        for j, (first, last) in hits.items():
            evidence[mine[j]] = {"path": rel, "line": first, "last_line": last}
    return sections


def kernel_rel(node: str) -> str:
    """Where a node's kernel lines go: `layout/<node>/dmesg`, beside that node's container logs."""
    return f"layout/{_safe(node)}/dmesg"


def _write_objects(writer: _Writer, inputs: SceneInputs, pods: list[_PodInfo]) -> None:
    if inputs.workload is not None:
        writer.put_data("objects/workload.yaml", "workload", inputs.workload, fmt="yaml", bulky=False)
    else:
        writer.problem("objects/workload.yaml", "no workload object was given", "未提供工作负载对象")
    by_name = {p.name: p for p in pods}
    for pod in inputs.pods:
        name = _name(pod) if isinstance(pod, Mapping) else None
        if name is None or name not in by_name:
            continue
        writer.put_data(
            f"objects/pods/{by_name[name].file}.yaml", "pod", pod, fmt="yaml", bulky=False, meta={"pod": name}
        )
    used: set[str] = set()
    for node in inputs.nodes:
        name = _name(node) if isinstance(node, Mapping) else None
        if name is None:
            continue
        file = _safe(name)
        while file in used:
            file += "_"
        used.add(file)
        writer.put_data(f"objects/nodes/{file}.yaml", "node", node, fmt="yaml", bulky=False, meta={"node": name})


def _write_stacks(writer: _Writer, stacks: Mapping[str, StackDump], pods: list[_PodInfo]) -> None:
    files = {p.name: p.file for p in pods}
    for name, dump in sorted(stacks.items()):
        head = [
            f"# pod: {dump.namespace}/{dump.pod}",
            f"# container: {dump.container or '-'}",
            f"# method: {dump.method.value if dump.method else 'none'}",
            f"# pids: {' '.join(map(str, dump.pids)) or '-'}",
        ]
        if dump.reason is not None:
            head.append(f"# reason: {dump.reason.en}")
            writer.problem(f"stacks/{files.get(name, _safe(name))}.txt", dump.reason.en, dump.reason.zh)
        head += [f"# tried: {a}" for a in dump.attempts]
        body = "\n".join(head) + "\n\n" + dump.text + ("\n" if dump.text and not dump.text.endswith("\n") else "")
        writer.put_text(
            f"stacks/{files.get(name, _safe(name))}.txt",
            "stacks",
            body.encode("utf-8", "replace"),
            meta={"pod": name, "method": dump.method.value if dump.method else None},
        )


def _findings_doc(d: DiagnosisEvent, findings: list[Finding], evidence: Mapping[int, dict[str, Any]]) -> dict[str, Any]:
    rc = d.diagnosis.root_cause
    doc: dict[str, Any] = {
        "diagnosis_id": d.diagnosis_id,
        "revision": d.revision,
        "final": d.final,
        "window_start": d.window_start,
        "window_end": d.window_end,
        "root_cause": rc.contract_dict("en") if rc else None,
        "root_cause_zh": rc.contract_dict("zh") if rc else None,
        "findings": [],
    }
    for i, f in enumerate(findings):
        item = f.contract_dict()
        item.update(
            {
                "last_line_no": f.last_line_no,
                "timestamp": f.timestamp,
                "node": f.node,
                "device": f.device,
                "pod": f.pod,
                "namespace": f.namespace,
                "rank": f.rank,
                "severity": f.severity.value,
                "consequence_of": f.consequence_of,
                "evidence": evidence.get(i),
            }
        )
        doc["findings"].append(item)
    if d.error_lines or d.exit_codes:
        # An `unknown` diagnosis: what there is (each rank's last error lines, the exit codes).
        doc["error_lines"] = {rank: [redact_text(x)[0] for x in lines] for rank, lines in d.error_lines.items()}
        doc["exit_codes"] = dict(d.exit_codes)
    return doc
