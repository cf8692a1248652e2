"""Reading a bundle: `load_scene` checks a saved bundle's manifest and files and returns a
LoadedScene, whose texts (SceneLog) `trainmedic diagnose --scene DIR` diagnoses again.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from trainmedic.models import Source
from trainmedic.remediations.scene.model import _YAML_LOADER, MANIFEST, SCHEMA_VERSION, SceneError

# ------------------------------------------------------------------------------------------------
# load_scene


@dataclass(frozen=True, slots=True)
class SceneLog:
    """A text of the bundle to diagnose again, with where it came from."""

    path: Path
    rel: str
    source: Source
    pod: str | None = None
    namespace: str | None = None
    container: str | None = None
    node: str | None = None
    rank: int | None = None
    previous: bool = False
    # Kernel sections: the lines of the file that are this node's (all of layout/<node>/dmesg; a
    # range of kernel.log in bundles written before).
    first_line: int = 1
    last_line: int | None = None


@dataclass(frozen=True)
class LoadedScene:
    dir: Path
    manifest: dict[str, Any]

    @property
    def incident_id(self) -> str:
        return str(self.manifest["incident_id"])

    @property
    def files(self) -> list[dict[str, Any]]:
        return list(self.manifest["files"])

    def file(self, rel: str) -> Path:
        return self.dir / rel

    def has(self, rel: str) -> bool:
        return any(e["path"] == rel for e in self.files)

    def _yaml(self, rel: str) -> Any:
        try:
            return yaml.load(self.file(rel).read_bytes(), Loader=_YAML_LOADER)  # noqa: S506 - a safe loader
        except (OSError, yaml.YAMLError) as exc:
            raise SceneError(f"{self.file(rel)}: cannot be read: {exc}".splitlines()[0]) from exc

    def events(self) -> list[dict[str, Any]]:
        if not self.has("events.yaml"):
            return []
        data = self._yaml("events.yaml")
        return [e for e in data if isinstance(e, dict)] if isinstance(data, list) else []

    def pods(self) -> list[dict[str, Any]]:
        out = []
        for e in self.files:
            if e.get("kind") == "pod":
                obj = self._yaml(e["path"])
                if isinstance(obj, dict):
                    out.append(obj)
        return out

    def nodes(self) -> list[dict[str, Any]]:
        out = []
        for e in self.files:
            if e.get("kind") == "node":
                obj = self._yaml(e["path"])
                if isinstance(obj, dict):
                    out.append(obj)
        return out

    def workload(self) -> dict[str, Any] | None:
        if not self.has("objects/workload.yaml"):
            return None
        obj = self._yaml("objects/workload.yaml")
        return obj if isinstance(obj, dict) else None

    def logs(self) -> list[SceneLog]:
        """Kernel sections (node by node), then every container log (previous before current)."""
        out: list[SceneLog] = []
        for s in self.manifest.get("kernel_sections") or []:
            rel = s.get("path", "kernel.log") if isinstance(s, dict) else None
            if isinstance(rel, str) and self.has(rel) and isinstance(s.get("first_line"), int):
                out.append(
                    SceneLog(
                        path=self.file(rel),
                        rel=rel,
                        source=Source.KERNEL,
                        node=str(s.get("node") or "") or None,
                        first_line=int(s["first_line"]),
                        last_line=int(s["last_line"]) if isinstance(s.get("last_line"), int) else None,
                    )
                )
        for p in self.manifest.get("pods") or []:
            if not isinstance(p, dict):
                continue
            rank = p.get("rank")
            for c in p.get("containers") or []:
                for key, previous in (("previous_log", True), ("log", False)):
                    rel = c.get(key) if isinstance(c, dict) else None
                    if isinstance(rel, str):
                        out.append(
                            SceneLog(
                                path=self.file(rel),
                                rel=rel,
                                source=Source.CONTAINER_LOG,
                                pod=str(p.get("name")),
                                namespace=str(p.get("namespace") or "default"),
                                container=str(c.get("name")),
                                node=p.get("node") if isinstance(p.get("node"), str) else None,
                                rank=rank if isinstance(rank, int) else None,
                                previous=previous,
                            )
                        )
        return out


def _check_manifest(manifest: Any, where: Path) -> dict[str, Any]:
    if not isinstance(manifest, dict):
        raise SceneError(f"{where}: not a JSON object")
    if manifest.get("schema_version") != SCHEMA_VERSION:
        raise SceneError(f"{where}: schema_version {manifest.get('schema_version')!r} is not {SCHEMA_VERSION}")
    if not isinstance(manifest.get("incident_id"), str):
        raise SceneError(f"{where}: incident_id is missing")
    files = manifest.get("files")
    if not isinstance(files, list):
        raise SceneError(f"{where}: files is missing")
    for e in files:
        rel = e.get("path") if isinstance(e, dict) else None
        if not isinstance(rel, str) or not rel or rel.startswith("/") or ".." in Path(rel).parts:
            raise SceneError(f"{where}: a file entry has no usable path: {e!r}"[:300])
        if not isinstance(e.get("sha256"), str) or not isinstance(e.get("bytes"), int):
            raise SceneError(f"{where}: {rel}: sha256 or bytes missing")
    return manifest


def _iter_entries(scene_dir: Path, manifest: dict[str, Any]) -> Iterator[tuple[dict[str, Any], Path]]:
    for e in manifest["files"]:
        yield e, scene_dir / e["path"]


def load_scene(path: Path | str, *, verify: bool = False) -> LoadedScene:
    """A saved bundle: its manifest checked, every file it lists present (and with `verify`, of the
    size and sha256 the manifest records). SceneError with a one-line reason otherwise."""
    scene_dir = Path(path)
    if not scene_dir.is_dir():
        raise SceneError(f"{scene_dir}: not a directory")
    where = scene_dir / MANIFEST
    try:
        raw = where.read_bytes()
    except OSError as exc:
        raise SceneError(f"{where}: cannot be read: {exc.strerror or exc}") from exc
    try:
        manifest = json.loads(raw)
    except ValueError as exc:
        raise SceneError(f"{where}: not valid JSON: {exc}") from exc
    manifest = _check_manifest(manifest, where)
    for e, file in _iter_entries(scene_dir, manifest):
        try:
            size = file.stat().st_size
        except OSError as exc:
            raise SceneError(f"{file}: listed in the manifest but cannot be read: {exc.strerror or exc}") from exc
        if size != e["bytes"]:
            raise SceneError(f"{file}: {size} bytes, the manifest says {e['bytes']}")
        if verify:
            digest = hashlib.sha256(file.read_bytes()).hexdigest()
            if digest != e["sha256"]:
                raise SceneError(f"{file}: content does not match its sha256 in the manifest")
    return LoadedScene(dir=scene_dir, manifest=manifest)
