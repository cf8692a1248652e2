"""Unified device abstraction: one plugin per accelerator family and its vendor error catalog.

Public API:
    CatalogEntry, ChipPlugin, CatalogError        the types (udal.base)
    load_plugins(), get_plugin(chip), lookup(chip, code), lookup_text(chip, text),
    detect_chip(labels), is_chip(name), builtin_plugins(), register(name, "module:Class"),
    plugin_of_resource(name), visible_devices_envs(), env_prefixes(), device_patterns() ...
                                                                               the registry

Code formats: NVIDIA `xid:<n>`, `sxid:<n>`, `dcgm:DCGM_FR_<NAME>`, `cuda:<cudaErrorName>`, NCCL names;
Ascend `0x80C98000`, `EI0002`, `EZ9999`, `E19999`, `acl:<n>`, `hccl:<n>`, `ERR02200`; Cambricon
`cncl:<NAME>`, `cndev:<NAME>`, `cnrt:<cnrtRet_t name>`; generic `oom_killed`, ...; fake `fake:<n>`.
"""

from trainmedic.udal.base import (
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
from trainmedic.udal.registry import (
    ENTRY_POINT_GROUP,
    PluginError,
    builtin_plugins,
    clear_cache,
    detect_chip,
    discover,
    get_plugin,
    is_chip,
    load_plugins,
    lookup,
    lookup_text,
    register,
)

__all__ = [
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
    "builtin_plugins",
    "clear_cache",
    "detect_chip",
    "discover",
    "get_plugin",
    "is_chip",
    "load_catalog_text",
    "load_plugins",
    "lookup",
    "lookup_text",
    "parse_catalog",
    "parse_visible_devices",
    "register",
]
