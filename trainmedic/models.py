"""The shared vocabulary of trainmedic: fault classes, chips, actions, findings, diagnoses.

This is the one leaf module every other package may import (see docs/architecture.md). It imports
nothing from the project at import time (a chip name that is not built in is checked with the chip
registry when it is met, see `Chip`). The string values are contracts: other tools read them from JSON.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from enum import StrEnum
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, GetCoreSchemaHandler, GetJsonSchemaHandler
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema, core_schema


class FaultClass(StrEnum):
    """Chip-neutral failure class (docs/contracts.md)."""

    ACCELERATOR_OOM = "accelerator_oom"
    HOST_OOM = "host_oom"
    DEVICE_ERROR = "device_error"
    COMM_INIT = "comm_init"
    COMM_ERROR = "comm_error"
    HANG = "hang"
    # A node lost or unhealthy: NotReady, unreachable taints, kubelet silent, node gone.
    NODE_FAILURE = "node_failure"
    # A rank killed from outside with no OOM evidence (SIGKILL, SIGTERM, preemption).
    PROCESS_KILLED = "process_killed"
    # Checkpoint or data I/O failed: disk full, stale NFS handle, EIO, read-only fs, quota.
    STORAGE_ERROR = "storage_error"
    # The program failed by itself: Python exception, native crash, collective mismatch.
    APP_ERROR = "app_error"
    # The workload failed and nothing explains it; the evidence is attached all the same.
    UNKNOWN = "unknown"


# What a chip's (a chip plugin's) name may look like.
CHIP_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,39}$")


class _ChipType(type):
    def __iter__(cls) -> Iterator[Chip]:
        """The built-in chips (the names the JSON contracts list); installed plugins may add more."""
        return iter(BUILTIN_CHIPS)


class Chip(str, metaclass=_ChipType):
    """A chip's name: an open set, one name per chip plugin (udal/registry.py).

    The built-in names are constants (`Chip.NVIDIA` ...), and `Chip("nvidia") is Chip.NVIDIA`. Any
    other name must be the name of a chip plugin the registry knows (an installed `trainmedic.chips`
    entry point, or one added with `udal.registry.register`); anything else is a ValueError, so a
    rule, catalog, policy or hint that names an unknown chip is refused at load. The registry is
    asked only for a name that is not built in (imported then, not by this leaf module at import).
    """

    __slots__ = ()

    NVIDIA: ClassVar[Chip]
    ASCEND: ClassVar[Chip]
    CAMBRICON: ClassVar[Chip]
    GENERIC: ClassVar[Chip]

    def __new__(cls, name: object) -> Chip:
        if isinstance(name, Chip):
            return name
        text = str(name)
        known = _CHIPS.get(text)
        if known is not None:
            return known
        if not CHIP_NAME.match(text):
            raise ValueError(f"{text!r} is not a chip name (lower-case letters, digits, _ and -)")
        from trainmedic.udal.registry import is_chip  # the registry imports this module: asked at run time

        if not is_chip(text):
            raise ValueError(f"{text!r} is not a chip: no chip plugin of that name is installed")
        # Not interned: a plugin added at run time may go again (udal.registry.unregister).
        return str.__new__(cls, text)

    @classmethod
    def _builtin(cls, name: str) -> Chip:
        return _CHIPS.setdefault(name, str.__new__(cls, name))

    @property
    def value(self) -> str:
        """The name as a plain string (what JSON carries)."""
        return str.__str__(self)

    def __repr__(self) -> str:
        return f"Chip({str.__repr__(self)})"

    def __str__(self) -> str:
        return str.__str__(self)

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        return core_schema.no_info_after_validator_function(
            cls,
            core_schema.str_schema(),
            serialization=core_schema.plain_serializer_function_ser_schema(str.__str__, when_used="json"),
        )

    @classmethod
    def __get_pydantic_json_schema__(cls, schema: CoreSchema, handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        return {
            "type": "string",
            "title": "Chip",
            "description": "A chip plugin's name: nvidia, ascend, cambricon, generic, or an installed plugin's.",
            "examples": [c.value for c in BUILTIN_CHIPS],
        }


_CHIPS: dict[str, Chip] = {}
Chip.NVIDIA = Chip._builtin("nvidia")
Chip.ASCEND = Chip._builtin("ascend")
Chip.CAMBRICON = Chip._builtin("cambricon")
Chip.GENERIC = Chip._builtin("generic")
BUILTIN_CHIPS: tuple[Chip, ...] = (Chip.NVIDIA, Chip.ASCEND, Chip.CAMBRICON, Chip.GENERIC)


class Action(StrEnum):
    """Normalized remediation bucket every vendor bucket maps onto."""

    IGNORE = "ignore"
    RESTART_APP = "restart_app"
    RESET_DEVICE = "reset_device"
    REBOOT_NODE = "reboot_node"
    ISOLATE_NODE = "isolate_node"
    CONTACT_SUPPORT = "contact_support"
    # The job's owner must act (fix the code, free the disk): a restart as is would fail the same way.
    NOTIFY_OWNER = "notify_owner"


class Source(StrEnum):
    """Where an input line or event came from."""

    CONTAINER_LOG = "container_log"
    KERNEL = "kernel"
    K8S_EVENT = "k8s_event"
    POD_STATUS = "pod_status"
    METRIC = "metric"


class Severity(StrEnum):
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"
    CRITICAL = "critical"


SEVERITY_RANK: dict[Severity, int] = {
    Severity.INFO: 0,
    Severity.WARNING: 1,
    Severity.ERROR: 2,
    Severity.CRITICAL: 3,
}


class I18nText(BaseModel):
    """A user-facing text in both languages the project speaks."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    en: str = Field(min_length=1)
    zh: str = Field(min_length=1)

    def get(self, lang: str) -> str:
        return self.zh if lang == "zh" else self.en


class Finding(BaseModel):
    """One rule match on one input line (or a few joined continuation lines).

    `line_no` is 1-based within `file`; `text` is the matched line after preprocessing
    (ANSI stripped, continuation lines joined), bounded in length.
    """

    model_config = ConfigDict(extra="forbid")

    rule_id: str
    fault_class: FaultClass
    chip: Chip
    code: str
    source: Source
    severity: Severity
    line_no: int | None = None
    text: str = ""
    file: str | None = None
    node: str | None = None
    device: str | None = None
    rank: int | None = None
    pod: str | None = None
    namespace: str | None = None
    job: str | None = None
    timestamp: float | None = None
    vendor_action: str | None = None
    action: Action | None = None
    message: I18nText | None = None
    hint: I18nText | None = None
    # Correlation weight override from the rule (0-100); None lets the fault class decide.
    priority: int | None = None
    # Named-group values of the match (code/message templates, localisation).
    groups: dict[str, str] = Field(default_factory=dict)
    # Identical findings (same rule, code and place) are folded into one: how many, and the last line.
    count: int = 1
    last_line_no: int | None = None
    # Set by the correlator: this finding is explained by another one (e.g. Xid 45 after Xid 79).
    consequence_of: str | None = None

    def contract_dict(self) -> dict[str, object]:
        """The finding in the `diagnose --format json` shape of docs/contracts.md (plus `file` and `count`, and
        `node`, `device`, `rank` where the logs or their layout say them, else null)."""
        return {
            "rule_id": self.rule_id,
            "fault_class": self.fault_class.value,
            "chip": self.chip.value,
            "code": self.code,
            "source": self.source.value,
            "line_no": self.line_no,
            "text": self.text,
            "file": self.file,
            "count": self.count,
            "node": self.node,
            "device": self.device,
            "rank": self.rank,
        }


class Place(BaseModel):
    """A place of a wait chain or a candidate: what the wait graph calls it ("rank 3", a node, an
    IP it could not resolve) and its node, device and rank where the logs say them."""

    model_config = ConfigDict(extra="forbid")

    place: str
    node: str | None = None
    device: str | None = None
    rank: int | None = None

    def contract_dict(self) -> dict[str, object]:
        return {"place": self.place, "node": self.node, "device": self.device, "rank": self.rank}

    def label(self, lang: str = "en") -> str:
        """`rank 2 (worker-2, device 2)`: the place and where it is (zh: `rank 2（worker-2，设备 2）`)."""
        parts = where_words(self.node if self.node != self.place else None, self.device, None, lang)
        if not parts:
            return self.place
        return f"{self.place}（{'，'.join(parts)}）" if lang == "zh" else f"{self.place} ({', '.join(parts)})"


def where_words(node: str | None, device: str | None, rank: int | None, lang: str = "en") -> list[str]:
    """`node X`, `device D`, `rank R` (zh: 节点、设备), for what is known."""
    words = ("节点", "设备", "rank") if lang == "zh" else ("node", "device", "rank")
    return [f"{w} {v}" for w, v in zip(words, (node, device, rank), strict=True) if v is not None]


class RootCause(BaseModel):
    """The one cause a diagnosis settles on, localised."""

    model_config = ConfigDict(extra="forbid")

    fault_class: FaultClass
    chip: Chip
    code: str
    vendor_action: str | None = None
    action: Action | None = None
    node: str | None = None
    device: str | None = None
    rank: int | None = None
    summary: I18nText
    hint: I18nText | None = None
    rule_id: str
    severity: Severity
    # How many findings (lines) support this cause, across how many ranks / nodes.
    occurrences: int = 1
    ranks: list[int] = Field(default_factory=list)
    nodes: list[str] = Field(default_factory=list)
    # Communication faults: the chain of waits that ends at the root ("rank 2", "rank 1", "rank 0"),
    # or, when the wait graph cannot decide, the places it could be (nothing is picked then).
    chain: list[str] = Field(default_factory=list)
    candidates: list[str] = Field(default_factory=list)
    # The same places with their node, device and rank (the chain's first, then the candidates').
    chain_places: list[Place] = Field(default_factory=list)
    candidate_places: list[Place] = Field(default_factory=list)
    # The vendor's possible causes and ordered handling steps for the code, verbatim from its
    # catalog (udal), placeholders filled from the line; empty where the vendor publishes none.
    vendor_causes: list[str] = Field(default_factory=list)
    vendor_steps: list[str] = Field(default_factory=list)

    def contract_dict(self, lang: str = "en") -> dict[str, object]:
        return {
            "fault_class": self.fault_class.value,
            "chip": self.chip.value,
            "code": self.code,
            "vendor_action": self.vendor_action,
            "action": self.action.value if self.action else None,
            "node": self.node,
            "device": self.device,
            "rank": self.rank,
            "summary": self.summary.get(lang),
            "hint": self.hint.get(lang) if self.hint else None,
            "chain": list(self.chain),
            "candidates": list(self.candidates),
            "chain_places": [p.contract_dict() for p in self.chain_places],
            "candidate_places": [p.contract_dict() for p in self.candidate_places],
            "vendor_causes": list(self.vendor_causes),
            "vendor_steps": list(self.vendor_steps),
        }


class Diagnosis(BaseModel):
    """What the correlator concludes from the findings of one job (or one diagnose run)."""

    model_config = ConfigDict(extra="forbid")

    root_cause: RootCause | None
    findings: list[Finding]
    # Findings the correlator kept as evidence after de-duplication, with their repeat counts.
    distinct_findings: int = 0
    lines_scanned: int = 0

    def contract_dict(self, lang: str = "en") -> dict[str, object]:
        return {
            "root_cause": self.root_cause.contract_dict(lang) if self.root_cause else None,
            "findings": [f.contract_dict() for f in self.findings],
        }
