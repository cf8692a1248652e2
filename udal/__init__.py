"""Unified device abstraction: one plugin per accelerator family and its vendor error catalog.

Public API:
    CatalogEntry, ChipPlugin, CatalogError        the types (udal.base)
    load_plugins(), get_plugin(chip), lookup(chip, code), detect_chip(labels)   the registry

Code formats: NVIDIA `xid:<n>`, CUDA/NCCL names; Ascend `0x80C98000`, `EI0002`, `hccl:<n>`,
`ERR02200`; Cambricon `cncl:<NAME>`, `cndev:<NAME>`; generic `oom_killed`, ...; fake `fake:<n>`.
"""

from udal.base import (
    CORE_METRICS,
    GENERIC_CHIP_LABEL,
    METRIC_VOCABULARY,
    ORIGINS,
    Catalog,
    CatalogEntry,
    CatalogError,
    ChipPlugin,
    load_catalog_text,
    parse_catalog,
    parse_visible_devices,
)
from udal.registry import (
    BUILTIN_PLUGINS,
    ENTRY_POINT_GROUP,
    PluginError,
    clear_cache,
    detect_chip,
    discover,
    get_plugin,
    load_plugins,
    lookup,
)

__all__ = [
    "BUILTIN_PLUGINS",
    "CORE_METRICS",
    "ENTRY_POINT_GROUP",
    "GENERIC_CHIP_LABEL",
    "METRIC_VOCABULARY",
    "ORIGINS",
    "Catalog",
    "CatalogEntry",
    "CatalogError",
    "ChipPlugin",
    "PluginError",
    "clear_cache",
    "detect_chip",
    "discover",
    "get_plugin",
    "load_catalog_text",
    "load_plugins",
    "lookup",
    "parse_catalog",
    "parse_visible_devices",
]
