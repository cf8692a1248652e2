"""The incident page's parts, from the store's records: redacted, bounded, ready for the templates."""

from __future__ import annotations

import os
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from trainmedic.agent.store import Incident
from trainmedic.reports.notice import clean_text

MAX_EVIDENCE = 20
MAX_SCENE_FILES = 300


def when(t: float | None) -> str:
    if t is None:
        return "-"
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%S")


def size(nbytes: int) -> str:
    """Bytes for people: 812 B, 2.0 KiB, 3.4 MiB."""
    value = float(nbytes)
    for unit in ("B", "KiB", "MiB"):
        if value < 1024:
            return f"{nbytes} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"


def redacted(value: Any) -> Any:
    from trainmedic.remediations.scene import redact_object

    return redact_object(value)


def summary(incident: Incident, lang: str) -> tuple[str | None, str | None]:
    diagnosis = incident.stored_diagnosis() if isinstance(incident.diagnosis, Mapping) else None
    rc = diagnosis.get("root_cause") if diagnosis else None
    if not isinstance(rc, Mapping):
        return None, None

    def text(name: str) -> str | None:
        value = rc.get(name)
        if isinstance(value, Mapping):
            chosen = value.get(lang) or value.get("en")
            return clean_text(str(chosen)) if chosen else None
        return None

    return text("summary"), text("hint")


def evidence(incident: Incident) -> list[dict[str, Any]]:
    diagnosis = incident.stored_diagnosis() if isinstance(incident.diagnosis, Mapping) else None
    findings = diagnosis.get("findings") if diagnosis else None
    out = []
    for f in (findings or [])[:MAX_EVIDENCE]:
        if not isinstance(f, Mapping):
            continue
        place = " ".join(f"{k}={f[k]}" for k in ("node", "device", "rank") if f.get(k) is not None and f.get(k) != "")
        out.append(
            {
                "where": f"{f.get('file') or '-'}:{f.get('line_no') or '-'}",
                "place": place,
                "rule": str(f.get("rule_id") or "-"),
                "code": str(f.get("code") or "-"),
                "text": clean_text(str(redacted(str(f.get("text") or ""))), 2000),
            }
        )
    return out


def scene_files(scene_dir: str | None) -> tuple[str, list[dict[str, Any]]]:
    """("none" | "unreadable" | "ok", [{path, size}]) for the scene bundle (names and sizes only)."""
    if not scene_dir:
        return "none", []
    root = Path(scene_dir)
    if not root.is_dir():
        return "unreadable", []
    files: list[dict[str, Any]] = []
    try:
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames.sort()
            for name in sorted(filenames):
                p = Path(dirpath) / name
                try:
                    nbytes = p.stat().st_size
                except OSError:
                    continue
                files.append({"path": str(p.relative_to(root)), "size": nbytes})
                if len(files) >= MAX_SCENE_FILES:
                    return "ok", files
    except OSError:
        return "unreadable", files
    return "ok", files


# How a scene file is served: text as text (never as a page of this site), a saved report as the
# report it is (no script runs under REPORT_CSP), anything else as a download.
TEXT_SUFFIXES = frozenset({".log", ".txt", ".yaml", ".yml", ".json", ".md", ".csv", ".prom", ""})


def scene_file(scene_dir: str | None, rel: str) -> Path | None:
    """The regular file `rel` inside the incident's scene bundle, or None: nothing outside the
    bundle (`..`, an absolute path, a symbolic link anywhere on the way), no hidden or temporary
    file (a bundle being written), no directory."""
    if not scene_dir or not rel or len(rel) > 1024 or "\x00" in rel or "\\" in rel:
        return None
    parts_ = rel.split("/")
    if any(p in ("", ".", "..") or p.startswith(".") for p in parts_):
        return None
    root = Path(scene_dir)
    here = root
    try:
        if root.is_symlink() or not root.is_dir():
            return None
        for p in parts_:
            here = here / p
            if here.is_symlink():
                return None
        if not here.is_file() or not here.resolve().is_relative_to(root.resolve()):
            return None
    except (OSError, ValueError):
        return None
    return here


def scene_media(path: Path) -> tuple[str, bool]:
    """(media type, inline) for a scene file."""
    if path.suffix.lower() == ".html":
        return "text/html; charset=utf-8", True
    if path.suffix.lower() in TEXT_SUFFIXES or path.name in ("dmesg", "messages"):
        return "text/plain; charset=utf-8", True
    return "application/octet-stream", False


def actions(incident: Incident) -> list[dict[str, Any]]:
    out = []
    for a in incident.actions:
        params = redacted(a.params or {})
        result = redacted(a.result or {})
        out.append(
            {
                "seq": a.seq,
                "name": a.name,
                "state": a.state.value,
                "params": flat(params),
                "result": flat(result),
                "started": a.started,
                "finished": a.finished,
            }
        )
    return out


def flat(value: Any, limit: int = 400) -> str:
    """A short one-line rendering of an action's params or result (already redacted)."""
    if not value:
        return ""
    if isinstance(value, Mapping):
        text = ", ".join(f"{k}={flat(v, 120) if isinstance(v, Mapping | list) else v}" for k, v in value.items())
    elif isinstance(value, list):
        text = ", ".join(str(x) for x in value)
    else:
        text = str(value)
    return clean_text(text, limit)


def quarantined_node(incident: Incident, timeline: list[dict[str, Any]]) -> str | None:
    """The node this incident quarantined and nobody released yet (the console's release button)."""
    released = {str(e["detail"].get("node")) for e in timeline if e["kind"] == "node_released"}
    for a in incident.actions:
        if a.name == "quarantine_node" and a.state.value == "done":
            node = str((a.params or {}).get("node") or incident.node or "")
            if node and node not in released:
                return node
    return None


def timeline(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"t": e["t"], "kind": e["kind"], "detail": flat(redacted(e["detail"]), 300)} for e in entries]
