"""Plugin registry: a chip is one plugin, found through the `trainmedic.chips` entry points.

The one table of the built-in plugins is the `[project.entry-points."trainmedic.chips"]` table of
pyproject.toml; installed, it is read back with importlib.metadata like any other distribution's
entry points, so a third-party chip is one more entry point in its own package. A source tree that
was never installed (no distribution metadata on the path: `PYTHONPATH=. python -m ...` from a
checkout) has no entry points at all; only then is that table read from the tree's pyproject.toml
(the fallback: without it such a tree would know no chip, not even `generic`).

Everything chip-specific the rest of trainmedic needs (resource names, visible-devices variables,
exporter metric names and device labels, log device words, catalog codes) is asked of the plugins
here, never written elsewhere. The result is cached; `register` adds a plugin at run time (the test
suite's `fake`) and clears the cache.
"""

from __future__ import annotations

import functools
import importlib
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from trainmedic.models import CHIP_NAME, Chip
from trainmedic.udal.base import CatalogEntry, ChipPlugin

if TYPE_CHECKING:
    from importlib.metadata import EntryPoint

ENTRY_POINT_GROUP = "trainmedic.chips"
DISTRIBUTION = "trainmedic"

# Plugins added at run time beside the discovered ones, name -> "module:Class". The test suite
# registers the `fake` test double (udal/fake.py) here: it is not an entry point, so no installed
# agent ever treats a node labelled `trainmedic.io/fake-accelerator` as a chip.
_REGISTERED: dict[str, str] = {}


class PluginError(RuntimeError):
    """An entry point does not name a ChipPlugin subclass, or no chip plugin can be found at all."""


def _instantiate(name: str, obj: object) -> ChipPlugin:
    if not (isinstance(obj, type) and issubclass(obj, ChipPlugin)):
        raise PluginError(f"entry point {ENTRY_POINT_GROUP}:{name} does not name a ChipPlugin subclass")
    plugin = obj()
    if plugin.name != name:
        raise PluginError(f"entry point {ENTRY_POINT_GROUP}:{name} names plugin {plugin.name!r}: the names must agree")
    return plugin


def _load_target(target: str) -> object:
    module_name, _, attr = target.partition(":")
    return getattr(importlib.import_module(module_name), attr)


def entry_points(group: str) -> list[EntryPoint]:
    """The installed entry points of `group` (importlib.metadata, imported when first needed: a
    `diagnose` that finds nothing never loads a plugin)."""
    from importlib.metadata import entry_points as installed

    return list(installed(group=group))


def _source_tree_table() -> dict[str, str]:
    """The entry-point table of the pyproject.toml of the source tree this module lies in."""
    for folder in Path(__file__).resolve().parents:
        candidate = folder / "pyproject.toml"
        if not candidate.is_file():
            continue
        project = tomllib.loads(candidate.read_text(encoding="utf-8")).get("project", {})
        if project.get("name") == DISTRIBUTION:
            return dict(project.get("entry-points", {}).get(ENTRY_POINT_GROUP, {}))
    raise PluginError(
        f"no chip plugin: no {ENTRY_POINT_GROUP} entry points are installed and no {DISTRIBUTION} "
        "pyproject.toml lies above udal/ (install trainmedic, e.g. pip install -e .)"
    )


def _ours(ep: EntryPoint) -> bool:
    return ep.dist is not None and ep.dist.name == DISTRIBUTION


def builtin_plugins() -> dict[str, str]:
    """The plugins trainmedic itself ships, name -> "module:Class": its distribution's entry points,
    or, in a source tree that was never installed, the same table read from pyproject.toml."""
    ours = {ep.name: ep.value for ep in entry_points(ENTRY_POINT_GROUP) if _ours(ep)}
    return ours or _source_tree_table()


def discover(eps: list[EntryPoint] | None = None) -> dict[str, ChipPlugin]:
    """Plugins by name from the entry points, plus the source tree's table when none of them is
    trainmedic's own (a tree that was never installed, perhaps beside an installed chip); not cached."""
    found = list(entry_points(group=ENTRY_POINT_GROUP)) if eps is None else eps
    plugins = {ep.name: _instantiate(ep.name, ep.load()) for ep in found}
    if not any(_ours(ep) for ep in found):
        for name, target in _source_tree_table().items():
            if name not in plugins:
                plugins[name] = _instantiate(name, _load_target(target))
    return plugins


def register(name: str, target: str) -> None:
    """Add a plugin ("module:Class") beside the discovered ones, e.g. a test double; clears the cache."""
    if not CHIP_NAME.match(name):
        raise ValueError(f"{name!r} is not a chip name (lower-case letters, digits, _ and -)")
    _REGISTERED[name] = target
    clear_cache()


def unregister(name: str) -> None:
    """Remove a plugin added with `register` (nothing when there is none); clears the cache."""
    _REGISTERED.pop(name, None)
    clear_cache()


@functools.cache
def _cached() -> dict[str, ChipPlugin]:
    plugins = discover()
    for name, target in _REGISTERED.items():
        plugins[name] = _instantiate(name, _load_target(target))
    return plugins


def load_plugins() -> dict[str, ChipPlugin]:
    """All chip plugins keyed by name (a `Chip` is its name: `plugins[Chip.NVIDIA]` works); cached."""
    return dict(_cached())


def clear_cache() -> None:
    _cached.cache_clear()
    _resource_index.cache_clear()
    _device_patterns.cache_clear()


def is_chip(name: str) -> bool:
    """True when `name` is the name of a known chip plugin (what `Chip(name)` accepts)."""
    return name in _cached()


def get_plugin(chip: Chip | str) -> ChipPlugin:
    """The plugin for a chip (or plugin name); the generic plugin when there is none."""
    plugins = _cached()
    plugin = plugins.get(str(chip).strip().lower())
    if plugin is not None:
        return plugin
    return plugins[Chip.GENERIC]


def lookup(chip: Chip | str, code: str) -> CatalogEntry | None:
    """The catalog entry for a code of a chip (None when the chip's catalog lacks it)."""
    return get_plugin(chip).lookup(code)


def lookup_text(chip: Chip | str, text: str) -> CatalogEntry | None:
    """The catalog entry whose vendor message text occurs in a log line (None when none does)."""
    return get_plugin(chip).lookup_text(text)


def detect_chip(labels: Mapping[str, str]) -> ChipPlugin | None:
    """The first real chip plugin whose detection matches these node labels."""
    for plugin in _cached().values():
        if plugin.detect(labels):
            return plugin
    return None


# -- per-chip facts, asked of every plugin -----------------------------------------------------------


@functools.cache
def _resource_index() -> tuple[tuple[str, bool, ChipPlugin], ...]:
    out: list[tuple[str, bool, ChipPlugin]] = []
    for plugin in _cached().values():
        out.extend((name, False, plugin) for name in plugin.resource_names)
        out.extend((prefix, True, plugin) for prefix in plugin.resource_prefixes)
    return tuple(out)


def plugin_of_resource(resource: str) -> ChipPlugin | None:
    """The plugin whose device plugin advertises this extended resource (`nvidia.com/gpu`, a MIG
    slice `nvidia.com/mig-1g.10gb`, `huawei.com/Ascend910`), else None."""
    for key, prefix, plugin in _resource_index():
        if resource == key or (prefix and resource.startswith(key)):
            return plugin
    return None


def plugin_of_exporter_labels(labels: Mapping[str, str]) -> ChipPlugin | None:
    """The plugin whose exporter's labels these are (an alert about a series), else None."""
    for plugin in _cached().values():
        if plugin.exporter_labels_match(labels):
            return plugin
    return None


def visible_devices_envs() -> tuple[str, ...]:
    """Every chip's visible-devices variables (CUDA_VISIBLE_DEVICES, ASCEND_RT_VISIBLE_DEVICES, ...)."""
    names: dict[str, None] = {}
    for plugin in _cached().values():
        for key in (plugin.visible_devices_env, *plugin.visible_devices_env_fallbacks):
            if key:
                names[key] = None
    return tuple(names)


def env_prefixes() -> tuple[str, ...]:
    """Every chip's collective-library variable prefixes (NCCL_, HCCL_, CNCL_, ...)."""
    return tuple(dict.fromkeys(p for plugin in _cached().values() for p in plugin.env_prefixes))


def exporter_device_labels() -> tuple[str, ...]:
    """Every chip exporter's device-index labels (dcgm-exporter `gpu`, npu-exporter `id`, ...)."""
    return tuple(dict.fromkeys(label for p in _cached().values() for label in p.exporter_device_labels))


@functools.cache
def _device_patterns() -> tuple[re.Pattern[str], ...]:
    words = sorted({w for p in _cached().values() for w in p.log_device_words}, key=lambda w: (-len(w), w))
    types = sorted({t for p in _cached().values() for t in p.device_types}, key=lambda t: (-len(t), t))
    out: list[re.Pattern[str]] = []
    if words:
        alternatives = "|".join(re.escape(w) for w in words)
        out.append(re.compile(rf"\((?:{alternatives}) (\d{{1,3}});", re.ASCII))
        out.append(re.compile(rf"\b(?:{alternatives}) (\d{{1,3}}) has a total capacity", re.ASCII))
    if types:
        out.append(re.compile(rf"\b(?:{'|'.join(re.escape(t) for t in types)}):(\d{{1,3}})\b", re.ASCII))
    return tuple(out)


def device_patterns() -> tuple[re.Pattern[str], ...]:
    """Patterns whose group 1 is a device index as the chips' frameworks write it: PyTorch's OOM
    text "(GPU 0; ...", "NPU 3 has a total capacity", a device "cuda:1" / "npu:0" / "mlu:2"."""
    return _device_patterns()
