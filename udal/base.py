"""Core types of the unified device abstraction: catalog entries, the chip plugin base, the loader.

Exceptions:

    CatalogError (ValueError)   a catalog data file is missing, malformed, or has an invalid row;
                                the message names the file and the row's key (code or index).
"""

from __future__ import annotations

import abc
import functools
import re
from collections.abc import Mapping, Sequence
from importlib import resources
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from trainmedic import cache
from trainmedic.datafile import load_yaml
from trainmedic.models import Action, Chip, FaultClass, I18nText, Severity

Origin = Literal["hardware", "application", "driver", "system", "interconnect", "thermal", "memory", "unknown"]

ORIGINS: tuple[str, ...] = (
    "hardware",
    "application",
    "driver",
    "system",
    "interconnect",
    "thermal",
    "memory",
    "unknown",
)

# The one metric vocabulary every plugin maps its exporter's names onto. Values keep the exporter's
# own unit (memory: MiB for DCGM and NVML, MB for npu-exporter, bytes for mlu-exporter), so compare
# a device with itself over time, not chips with each other. Semantics the detectors rely on:
#   xid_errors            the value of the LAST Xid seen on the device (DCGM_FI_DEV_XID_ERRORS is a
#                         gauge "Value of the last XID error encountered", not a count); 0 = none yet
#   ecc_sbe, ecc_dbe      error counters (volatile: reset by a driver reload or device reset)
#   health                1 healthy, 0 unhealthy; a negative value means the exporter could not read it
#                         (npu-exporter 26.1 reports -1 when the DCMI call fails)
#   link_status           1 up / active, 0 down / inactive (negative: unknown), per link where the
#                         exporter has one (the sample's device is then "<device>/link<N>")
#   network_status        1 reachable, 0 not (Ascend RoCE port health check)
#   row_remap_failure     > 0 once row remapping has failed; row_remap_pending > 0 while a remap waits
#                         for a reset; retired_pages_pending > 0 while a page retirement waits for one
METRIC_VOCABULARY: frozenset[str] = frozenset(
    {
        "accelerator_utilization",
        "accelerator_memory_used",
        "accelerator_memory_total",
        "accelerator_memory_free",
        "accelerator_memory_utilization",
        "accelerator_temperature",
        "accelerator_memory_temperature",
        "accelerator_power",
        "accelerator_voltage",
        "accelerator_clock",
        "device_ddr_memory_used",
        "device_ddr_memory_total",
        "xid_errors",
        "ecc_sbe",
        "ecc_dbe",
        "row_remap_failure",
        "row_remap_pending",
        "retired_pages_pending",
        "pcie_replay",
        "health",
        "link_status",
        "link_errors",
        "link_bandwidth",
        "network_status",
        "error_code",
    }
)

# Every real chip plugin must map at least these.
CORE_METRICS: frozenset[str] = frozenset(
    {
        "accelerator_utilization",
        "accelerator_memory_used",
        "accelerator_memory_total",
        "accelerator_temperature",
        "accelerator_power",
    }
)

# Generic node label naming the chip (value = a chip plugin's name), understood by every plugin.
GENERIC_CHIP_LABEL = "ai.accelerator/chip-type"


class CatalogError(ValueError):
    """A catalog data file cannot be used; the message names the file and the bad row."""


class CatalogEntry(BaseModel):
    """One vendor error code with the vendor's words and trainmedic's normalization.

    `vendor_action` is the vendor's own bucket verbatim (None where the vendor publishes none);
    `action` is trainmedic's normalized action. `inferred` marks a row whose content is not a
    transcription of a vendor table (the reason is in `note`).
    """

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    chip: Chip
    code: str = Field(min_length=1)
    mnemonic: str | None = None
    description: str = Field(min_length=1)
    vendor_action: str | None = None
    action: Action
    origin: Origin
    fault_class: FaultClass | None = None
    severity: Severity
    message: I18nText
    consequence: bool = False
    inferred: bool = False
    note: str | None = None
    # The vendor's possible causes and ordered handling steps, verbatim, where published.
    causes: tuple[str, ...] = ()
    steps: tuple[str, ...] = ()
    # The vendor's exact message strings for this code (cudaGetErrorString, ncclGetErrorString, a
    # DCGM message format with its printf placeholders), used by `lookup_text`.
    texts: tuple[str, ...] = ()


class CatalogSource(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    title: str = Field(min_length=1)
    url: str = Field(min_length=1)
    version: str = Field(min_length=1)


class Catalog(BaseModel):
    """A loaded catalog file: its source, its vendor-bucket mapping and its entries by code."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    chip: Chip
    source: CatalogSource
    action_map: dict[str, Action]
    entries: dict[str, CatalogEntry]


def _where(loc: tuple[int | str, ...]) -> str:
    return ".".join(str(p) for p in loc) or "<row>"


def parse_catalog(data: object, filename: str) -> Catalog:
    """Validate catalog data (already parsed YAML); raise CatalogError naming file and key."""
    if not isinstance(data, dict):
        raise CatalogError(f"{filename}: top level must be a mapping")
    unknown = set(data) - {"chip", "source", "action_map", "entries"}
    if unknown:
        raise CatalogError(f"{filename}: unknown top-level keys {sorted(unknown)}")
    try:
        chip = Chip(str(data.get("chip")))
        source = CatalogSource.model_validate(data.get("source"))
        raw_map = data.get("action_map") or {}
        if not isinstance(raw_map, dict):
            raise CatalogError(f"{filename}: action_map must be a mapping")
        action_map = {str(k): Action(v) for k, v in raw_map.items()}
    except (ValueError, ValidationError) as exc:
        if isinstance(exc, CatalogError):
            raise
        raise CatalogError(f"{filename}: header: {exc}") from exc
    rows = data.get("entries")
    if not isinstance(rows, list) or not rows:
        raise CatalogError(f"{filename}: entries must be a non-empty list")
    entries: dict[str, CatalogEntry] = {}
    for index, row in enumerate(rows):
        key = row.get("code", f"#{index}") if isinstance(row, dict) else f"#{index}"
        if not isinstance(row, dict):
            raise CatalogError(f"{filename}: entry {key}: must be a mapping")
        try:
            entry = CatalogEntry.model_validate({"chip": chip.value, **row})
        except ValidationError as exc:
            details = "; ".join(f"{_where(e['loc'])}: {e['msg']}" for e in exc.errors())
            raise CatalogError(f"{filename}: entry {key}: {details}") from exc
        if entry.code in entries:
            raise CatalogError(f"{filename}: entry {key}: duplicate code")
        if entry.vendor_action is not None and entry.vendor_action in action_map:
            expected = action_map[entry.vendor_action]
            if entry.action != expected:
                raise CatalogError(
                    f"{filename}: entry {key}: action {entry.action.value} disagrees with action_map "
                    f"{entry.vendor_action} -> {expected.value}"
                )
        entries[entry.code] = entry
    return Catalog(chip=chip, source=source, action_map=action_map, entries=entries)


def load_catalog_text(text: str, filename: str) -> Catalog:
    import yaml  # not needed when the catalog comes from the cache

    try:
        data: Any = load_yaml(text)
    except yaml.YAMLError:
        try:  # the message as the pure-Python parser words it
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise CatalogError(f"{filename}: not valid YAML: {exc}") from exc
    return parse_catalog(data, filename)


@functools.cache
def load_package_catalog(filename: str) -> Catalog:
    """Load a catalog shipped as package data next to the plugins (cached: loaded once)."""
    try:
        text = resources.files("trainmedic.udal").joinpath(filename).read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise CatalogError(f"{filename}: catalog file not found in package udal") from exc
    # Parsed and validated once per content: later processes unpickle it (trainmedic/cache.py).
    key = cache.make_key("catalog", [filename, text])
    catalog = cache.load("catalog", key)
    if isinstance(catalog, Catalog):
        return catalog
    catalog = load_catalog_text(text, filename)
    cache.store("catalog", key, catalog)
    return catalog


def merge_catalogs(catalogs: Sequence[Catalog], names: Sequence[str]) -> Catalog:
    """One catalog from several files of one chip: the first file's source, the union of the
    action maps (a vendor bucket mapped two ways is an error) and of the entries (codes unique)."""
    first = catalogs[0]
    action_map: dict[str, Action] = {}
    entries: dict[str, CatalogEntry] = {}
    for catalog, name in zip(catalogs, names, strict=True):
        if catalog.chip != first.chip:
            raise CatalogError(f"{name}: chip {catalog.chip.value} differs from {first.chip.value}")
        for bucket, action in catalog.action_map.items():
            if action_map.setdefault(bucket, action) != action:
                raise CatalogError(f"{name}: action_map {bucket} disagrees with another file of the chip")
        for code, entry in catalog.entries.items():
            if code in entries:
                raise CatalogError(f"{name}: entry {code}: duplicate code across the chip's files")
            entries[code] = entry
    return Catalog(chip=first.chip, source=first.source, action_map=action_map, entries=entries)


@functools.cache
def load_package_catalogs(filenames: tuple[str, ...]) -> Catalog:
    """The merged catalog of a plugin's files (cached: loaded once per process)."""
    return merge_catalogs([load_package_catalog(f) for f in filenames], filenames)


_PRINTF = re.compile(r"%[-+ #0]*\d*(?:\.\d+)?(?:hh|h|ll|l|z)?[diuxXfgeEcsp]|%%")
# Vendor texts shorter than this are not indexed: "timeout" or "no error" would match anything.
MIN_TEXT_LENGTH = 12


class TextIndex:
    """Finds the entry whose vendor text occurs in a log line; the longest vendor text wins.

    Literal texts match as exact substrings. A text with printf placeholders (DCGM's message
    formats) matches with each placeholder standing for a run of characters; its length is that of
    its literal parts. Texts shorter than MIN_TEXT_LENGTH, and texts shared by several entries (which
    would name no single code), are not indexed.
    """

    def __init__(self, entries: Mapping[str, CatalogEntry]) -> None:
        owners: dict[str, set[str]] = {}
        by_text: dict[str, CatalogEntry] = {}
        for entry in entries.values():
            for text in entry.texts:
                owners.setdefault(text, set()).add(entry.code)
                by_text.setdefault(text, entry)
        items: list[tuple[int, str, str, re.Pattern[str] | None, CatalogEntry]] = []
        for text, entry in by_text.items():
            literal = _PRINTF.sub("", text)
            if len(owners[text]) > 1 or len(literal.strip()) < MIN_TEXT_LENGTH:
                continue
            if _PRINTF.search(text):
                parts = _PRINTF.split(text)
                holes = _PRINTF.findall(text)
                regex = re.escape(parts[0])
                for hole, part in zip(holes, parts[1:], strict=True):
                    regex += (".+?" if hole.endswith("s") else r"\S+?") + re.escape(part)
                anchor = max(parts, key=len)
                items.append((len(literal), entry.code, anchor, re.compile(regex), entry))
            else:
                items.append((len(literal), entry.code, text, None, entry))
        items.sort(key=lambda item: (-item[0], item[1]))
        self._items = [(anchor, pattern, entry) for _, _, anchor, pattern, entry in items]

    def __len__(self) -> int:
        return len(self._items)

    def find(self, line: str) -> CatalogEntry | None:
        for literal, pattern, entry in self._items:
            if literal in line and (pattern is None or pattern.search(line)):
                return entry
        return None


def parse_visible_devices(value: str | None) -> list[int] | None:
    """Parse a *_VISIBLE_DEVICES value into device indices.

    None means "not restricted or not expressible as indices": the variable is unset, "all", or
    names devices by UUID (GPU-..., MIG-...). "", "none" and "void" mean no device.
    """
    if value is None:
        return None
    text = value.strip()
    if text.lower() in ("", "none", "void", "nodevfiles"):
        return []
    if text.lower() == "all":
        return None
    indices: list[int] = []
    for part in text.split(","):
        item = part.strip()
        if not item:
            continue
        if not item.isdigit():
            return None
        indices.append(int(item))
    return indices


class ChipPlugin(abc.ABC):
    """One accelerator family: how to recognise it and what its vendor's codes mean.

    Subclasses set the class attributes and `catalog_file`; the catalog is loaded lazily once.
    """

    # The plugin's name is the chip's name (`Chip(name)`, the `chip` of its findings); the entry
    # point must carry the same name. A plugin may report its findings as another chip by setting
    # `chip` (the test suite's `fake` is a `generic` chip with a name of its own).
    name: str
    # Kubernetes extended resources of the chip's device plugin: exact names, and prefixes (MIG
    # profiles `nvidia.com/mig-<profile>`, Ascend vNPU templates): a node resource that is one of
    # them counts as this chip's accelerators.
    resource_names: tuple[str, ...] = ()
    resource_prefixes: tuple[str, ...] = ()
    node_label_keys: tuple[str, ...] = ()
    visible_devices_env: str = ""
    visible_devices_env_fallbacks: tuple[str, ...] = ()
    # Environment variable prefixes of the chip's collective library (NCCL_, HCCL_, CNCL_): kept,
    # with the visible-devices variables, in a scene's redacted copy of a pod's environment.
    env_prefixes: tuple[str, ...] = ()
    metric_names: Mapping[str, str] = {}
    # The labels that carry the device index on the exporter's series, first found wins (dcgm-exporter
    # `gpu`); identity labels (`UUID`, `uuid`, `vdie_id`) are the source's chip-neutral fallback.
    exporter_device_labels: tuple[str, ...] = ()
    # Catalog rows whose vendor bucket and action apply when a unified metric turns bad (a rising
    # `ecc_dbe` on an NVIDIA GPU is the event Xid 48 reports), first found wins.
    metric_codes: Mapping[str, tuple[str, ...]] = {}
    # How the chip's frameworks name a device in logs: the word before an index (PyTorch's OOM text
    # "(GPU 0; ..." / "NPU 3 has a total capacity") and the device type before ":<index>" ("cuda:1").
    log_device_words: tuple[str, ...] = ()
    device_types: tuple[str, ...] = ()
    frameworks: Mapping[str, str] = {}
    action_map: Mapping[str, Action] = {}
    catalog_file: str = ""
    # Further catalog files of the same chip, merged with `catalog_file` (codes unique across them).
    extra_catalog_files: tuple[str, ...] = ()

    @property
    def chip(self) -> Chip:
        """The chip its findings are reported as: its own name unless the class says another."""
        return Chip(self.name)

    def catalog_files(self) -> tuple[str, ...]:
        return (self.catalog_file, *self.extra_catalog_files)

    def _catalog(self) -> Catalog:
        if not self.extra_catalog_files:
            return load_package_catalog(self.catalog_file)
        return load_package_catalogs(self.catalog_files())

    def _text_index(self) -> TextIndex:
        return _text_index(self.catalog_files())

    def lookup_text(self, text: str) -> CatalogEntry | None:
        """The entry whose vendor message text occurs in this log line (longest text wins)."""
        return self._text_index().find(text)

    def catalog(self) -> Mapping[str, CatalogEntry]:
        return self._catalog().entries

    def lookup(self, code: str) -> CatalogEntry | None:
        return self._catalog().entries.get(self.normalize_code(code))

    def normalize_code(self, code: str) -> str:
        """Canonical form of a code as written in logs; plugins override for their formats."""
        return code.strip()

    def catalog_source(self) -> str:
        src = self._catalog().source
        return f"{src.title} ({src.version}): {src.url}"

    def detect(self, labels: Mapping[str, str]) -> bool:
        """True when the node labels say this node carries this chip.

        The generic label `ai.accelerator/chip-type` wins when present; otherwise the vendor's own
        labels decide (`detect_vendor`).
        """
        generic = labels.get(GENERIC_CHIP_LABEL, "").strip().lower()
        if generic:
            return generic == self.name
        return self.detect_vendor(labels)

    def detect_vendor(self, labels: Mapping[str, str]) -> bool:
        """Chip detection from the vendor's own labels; plugins override."""
        return False

    def visible_devices(self, env: Mapping[str, str]) -> list[int] | None:
        for key in (self.visible_devices_env, *self.visible_devices_env_fallbacks):
            if key and key in env:
                return parse_visible_devices(env[key])
        return None

    def unified_metric(self, vendor_metric: str) -> str | None:
        return self.metric_names.get(vendor_metric)

    def exporter_labels_match(self, labels: Mapping[str, str]) -> bool:
        """True when an alert's labels, copied from an exporter's series, say it is about this chip
        (labels only that exporter sets); plugins override."""
        return False


@functools.cache
def _text_index(filenames: tuple[str, ...]) -> TextIndex:
    catalog = load_package_catalog(filenames[0]) if len(filenames) == 1 else load_package_catalogs(filenames)
    return TextIndex(catalog.entries)


_NFD_PCI_PREFIX = "feature.node.kubernetes.io/pci-"


def pci_vendor_present(labels: Mapping[str, str], vendor_id: str) -> bool:
    """Node Feature Discovery PCI label `feature.node.kubernetes.io/pci-<class>_<vendor>.present=true`."""
    suffix = f"_{vendor_id.lower()}.present"
    return any(
        key.startswith(_NFD_PCI_PREFIX) and key.lower().endswith(suffix) and value.strip().lower() == "true"
        for key, value in labels.items()
    )
