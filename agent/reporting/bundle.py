"""The scene bundle as a report reads it: `_Bundle`, bounded, never failing (what it cannot read goes
to the report's 'not in this report' section).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trainmedic.agent.reporting.values import (
    _STEP,
    MAX_LINE_CHARS,
    MAX_READ_BYTES,
    STEP_TAIL_BYTES,
    _cut,
    _i18n,
    _missing,
    _text_pair,
)
from trainmedic.remediations.scene import MANIFEST, SceneError, load_scene

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
