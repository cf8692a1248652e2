"""Plugin registry: chip plugins are found through the `trainmedic.chips` entry points.

Without installed distribution metadata (a source checkout that was never pip-installed) the
entry points are absent and the built-in plugins are used instead. The result is cached.
"""

from __future__ import annotations

import functools
import importlib
from typing import TYPE_CHECKING

from trainmedic.models import Chip
from udal.base import CatalogEntry, ChipPlugin

if TYPE_CHECKING:
    from importlib.metadata import EntryPoint

ENTRY_POINT_GROUP = "trainmedic.chips"

# name -> "module:Class", the same table pyproject.toml declares.
BUILTIN_PLUGINS: dict[str, str] = {
    "nvidia": "udal.nvidia:NvidiaPlugin",
    "ascend": "udal.ascend:AscendPlugin",
    "cambricon": "udal.cambricon:CambriconPlugin",
    "generic": "udal.generic:GenericPlugin",
}

# Plugins added at run time beside the discovered ones, name -> "module:Class". The test suite
# registers the `fake` test double (udal/fake.py) here: it is not an entry point, so no installed
# agent ever treats a node labelled `trainmedic.io/fake-accelerator` as a chip.
_REGISTERED: dict[str, str] = {}


class PluginError(RuntimeError):
    """An entry point does not name a ChipPlugin subclass."""


def _instantiate(name: str, obj: object) -> ChipPlugin:
    if not (isinstance(obj, type) and issubclass(obj, ChipPlugin)):
        raise PluginError(f"entry point {ENTRY_POINT_GROUP}:{name} does not name a ChipPlugin subclass")
    return obj()


def _load_target(target: str) -> object:
    module_name, _, attr = target.partition(":")
    return getattr(importlib.import_module(module_name), attr)


def _key(name: str) -> Chip | str:
    try:
        return Chip(name)
    except ValueError:
        return name


def entry_points(group: str) -> list[EntryPoint]:
    """The installed entry points of `group` (importlib.metadata, imported when first needed: a
    `diagnose` that finds nothing never loads a plugin)."""
    from importlib.metadata import entry_points as installed

    return list(installed(group=group))


def discover(eps: list[EntryPoint] | None = None) -> dict[Chip | str, ChipPlugin]:
    """Plugins from the entry points (or the built-ins when none are installed); not cached."""
    found = list(entry_points(group=ENTRY_POINT_GROUP)) if eps is None else eps
    plugins: dict[Chip | str, ChipPlugin] = {}
    if found:
        for ep in found:
            plugins[_key(ep.name)] = _instantiate(ep.name, ep.load())
    else:
        for name, target in BUILTIN_PLUGINS.items():
            plugins[_key(name)] = _instantiate(name, _load_target(target))
    return plugins


def register(name: str, target: str) -> None:
    """Add a plugin ("module:Class") beside the discovered ones, e.g. a test double; clears the cache."""
    _REGISTERED[name] = target
    clear_cache()


@functools.cache
def _cached() -> dict[Chip | str, ChipPlugin]:
    plugins = discover()
    for name, target in _REGISTERED.items():
        plugins[_key(name)] = _instantiate(name, _load_target(target))
    return plugins


def load_plugins() -> dict[Chip | str, ChipPlugin]:
    """All chip plugins keyed by Chip (or by name for registered non-chip plugins such as the tests'
    "fake"); cached."""
    return dict(_cached())


def clear_cache() -> None:
    _cached.cache_clear()


def get_plugin(chip: Chip | str) -> ChipPlugin:
    """The plugin for a chip (or plugin name); the generic plugin when there is none."""
    plugins = _cached()
    key = _key(chip.value if isinstance(chip, Chip) else str(chip).strip().lower())
    plugin = plugins.get(key)
    if plugin is not None:
        return plugin
    generic = plugins.get(Chip.GENERIC)
    if generic is None:
        generic = _instantiate("generic", _load_target(BUILTIN_PLUGINS["generic"]))
    return generic


def lookup(chip: Chip | str, code: str) -> CatalogEntry | None:
    """The catalog entry for a code of a chip (None when the chip's catalog lacks it)."""
    return get_plugin(chip).lookup(code)


def lookup_text(chip: Chip | str, text: str) -> CatalogEntry | None:
    """The catalog entry whose vendor message text occurs in a log line (None when none does)."""
    return get_plugin(chip).lookup_text(text)


def detect_chip(labels: dict[str, str]) -> ChipPlugin | None:
    """The first real chip plugin whose detection matches these node labels."""
    for plugin in _cached().values():
        if plugin.detect(labels):
            return plugin
    return None
