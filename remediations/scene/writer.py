"""The writer: the files of the partial bundle, written in worker threads, within the bundle's caps;
and the commit that renames a whole bundle into place.

Atomic: the bundle is built in `<root>/.<incident_id>.partial/` and renamed into place once whole
(the manifest written last), so a crash leaves a partial directory, never a bundle that looks
complete; the next call starts it afresh. A complete bundle is never rewritten: a second call
returns it as it is.

Bounded and best effort: a per-file cap (a log over it keeps its tail), a total cap (bulky files
past it are skipped), a cap per line, undecodable bytes replaced; a pod whose log cannot be read,
metrics that are not available, an exec that is forbidden are each a `problems` entry, never a
failure of the bundle.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import yaml

from trainmedic.remediations.scene.model import _YAML_DUMPER, MANIFEST, SCHEMA_VERSION, SceneSettings
from trainmedic.remediations.scene.redact import _redact_obj, _Redactor
from trainmedic.remediations.scene.text import _count_lines, _prepare_text

T = TypeVar("T")


# ------------------------------------------------------------------------------------------------
# The writer: files of the partial bundle, written in threads, with the budget and the entries


class _Abandoned(Exception):
    """The bundle is being abandoned (the build failed or was cancelled): write nothing more."""


class _Writer:
    def __init__(self, base: Path, settings: SceneSettings, redactor: _Redactor) -> None:
        self.base = base
        self.settings = settings
        self.redactor = redactor
        self.entries: list[dict[str, Any]] = []
        self.problems: list[dict[str, Any]] = []
        self.total = 0
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._inflight = 0
        self._closed = False

    # -- bookkeeping (any thread) --

    def problem(self, what: str, en: str, zh: str) -> None:
        with self._lock:
            self.problems.append({"what": what, "reason": {"en": en, "zh": zh}})

    def _enter(self) -> None:
        with self._lock:
            if self._closed:
                raise _Abandoned
            self._inflight += 1

    def _leave(self) -> None:
        with self._lock:
            self._inflight -= 1
            self._idle.notify_all()

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` in a worker thread, counted so that `abandon` can wait for it."""

        def guarded() -> T:
            self._enter()
            try:
                return fn(*args)
            finally:
                self._leave()

        return await asyncio.to_thread(guarded)

    def _wait_idle(self) -> None:
        with self._lock:
            self._closed = True
            while self._inflight:
                self._idle.wait()

    async def abandon(self) -> None:
        """Stop: nothing is written after this returns (threads in flight are waited for)."""
        with self._lock:
            self._closed = True
        await asyncio.shield(asyncio.to_thread(self._wait_idle))

    # -- files (worker threads) --

    def _reserve(self, rel: str, size: int, bulky: bool) -> bool:
        with self._lock:
            if bulky and self.total + size > self.settings.max_total_bytes:
                self.problems.append(
                    {
                        "what": rel,
                        "reason": {
                            "en": f"left out: the bundle's total cap ({self.settings.max_total_bytes} bytes) "
                            "is reached",
                            "zh": f"未保存：已达到现场包总大小上限（{self.settings.max_total_bytes} 字节）",
                        },
                    }
                )
                return False
            self.total += size
            return True

    def _write(self, rel: str, data: bytes) -> str:
        path = self.base / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        digest = hashlib.sha256(data).hexdigest()
        with open(path, "wb") as fh:
            fh.write(data)
            if self.settings.durable:
                fh.flush()
                os.fsync(fh.fileno())
        return digest

    def put_text(
        self,
        rel: str,
        kind: str,
        raw: bytes,
        *,
        tail_lines: int | None = None,
        bulky: bool = True,
        meta: Mapping[str, Any] | None = None,
        needles: Sequence[bytes] = (),
    ) -> tuple[dict[str, Any] | None, dict[int, tuple[int, int]]]:
        """A text file: cleaned, redacted, bounded. Returns its entry and where the needles are
        (index -> first and last line number), or (None, {}) when it was left out."""
        data, truncated, cut, redactions = _prepare_text(raw, self.settings, self.redactor, tail_lines)
        if not self._reserve(rel, len(data), bulky):
            return None, {}
        entry: dict[str, Any] = {
            "path": rel,
            "kind": kind,
            "bytes": len(data),
            "sha256": self._write(rel, data),
            "truncated": truncated,
            "lines": _count_lines(data),
            "redactions": redactions,
        }
        if cut:
            entry["cut_lines"] = cut
        entry.update(meta or {})
        hits: dict[int, tuple[int, int]] = {}
        for i, needle in enumerate(needles):
            first = data.find(needle) if needle else -1
            if first >= 0:
                last = data.rfind(needle)
                hits[i] = (data.count(b"\n", 0, first) + 1, data.count(b"\n", 0, last) + 1)
        with self._lock:
            self.entries.append(entry)
        return entry, hits

    def put_data(
        self,
        rel: str,
        kind: str,
        obj: Any,
        *,
        fmt: str,
        bulky: bool,
        meta: Mapping[str, Any] | None = None,
        redactions: int | None = None,
    ) -> dict[str, Any] | None:
        """A YAML or JSON file: every string redacted first (the syntax stays valid); never cut.

        `redactions` given: the caller has redacted the strings of `obj` already (bulk numeric data
        such as metrics, whose walk would cost more than the file), so it is written compact as is."""
        counter = [0]
        if redactions is None:
            clean = _redact_obj(obj, self.settings, counter, self.redactor)
        else:
            clean, counter[0] = obj, redactions
        try:
            if fmt == "yaml":
                text = yaml.dump(clean, Dumper=_YAML_DUMPER, sort_keys=False, allow_unicode=True, width=4096)
            elif redactions is not None:
                # No indent: the C encoder (the indented one is pure Python, ~10x slower on big arrays).
                text = json.dumps(clean, ensure_ascii=False, separators=(",", ":"), allow_nan=False) + "\n"
            else:
                text = json.dumps(clean, ensure_ascii=False, indent=1, allow_nan=False) + "\n"
        except (yaml.YAMLError, TypeError, ValueError) as exc:
            self.problem(rel, f"cannot be serialized: {exc}", f"无法序列化：{exc}")
            return None
        data = text.encode("utf-8", "replace")
        if len(data) > self.settings.max_file_bytes:
            self.problem(
                rel,
                f"left out: {len(data)} bytes is over the per-file cap ({self.settings.max_file_bytes})",
                f"未保存：{len(data)} 字节超过单文件上限（{self.settings.max_file_bytes}）",
            )
            return None
        if not self._reserve(rel, len(data), bulky):
            return None
        entry: dict[str, Any] = {
            "path": rel,
            "kind": kind,
            "bytes": len(data),
            "sha256": self._write(rel, data),
            "truncated": False,
            "redactions": counter[0],
        }
        entry.update(meta or {})
        with self._lock:
            self.entries.append(entry)
        return entry


# ------------------------------------------------------------------------------------------------
# The commit: the manifest last, then the rename


def _read_complete(final: Path) -> dict[str, Any] | None:
    try:
        manifest = json.loads((final / MANIFEST).read_bytes())
    except (OSError, ValueError):
        return None
    return manifest if isinstance(manifest, dict) and manifest.get("schema_version") == SCHEMA_VERSION else None


def _fresh_dir(path: Path) -> None:
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)


def _fsync_tree(path: Path) -> None:
    for d, _dirs, _files in os.walk(path):
        fd = os.open(d, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _commit(partial: Path, final: Path, manifest: dict[str, Any], durable: bool) -> dict[str, Any]:
    data = (json.dumps(manifest, ensure_ascii=False, indent=1, allow_nan=False) + "\n").encode()
    with open(partial / MANIFEST, "wb") as fh:
        fh.write(data)
        if durable:
            fh.flush()
            os.fsync(fh.fileno())
    if durable:
        _fsync_tree(partial)
    try:
        os.rename(partial, final)
    except OSError:
        existing = _read_complete(final)
        if existing is None:
            raise
        shutil.rmtree(partial, ignore_errors=True)
        return existing
    if durable:
        _fsync_dir(final.parent)
    return manifest


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
