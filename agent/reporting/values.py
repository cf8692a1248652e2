"""Constants, the JSON-ready value helpers and the 'missing' record every section of a report uses."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

CONTEXT_SCHEMA = 1
MAX_EVIDENCE = 50
CONTEXT_LINES = 3
MAX_LINE_CHARS = 2000
MAX_TIMELINE = 200
# Stack files linked from a report (one per pod; a 64-pod job links them all).
MAX_STACK_FILES = 256
MAX_TOP_LINKS = 8
MAX_CHART_NODES = 2
MAX_METRICS_PER_NODE = 3
MAX_CHART_SERIES = 16
# Where the last training step is looked for: the end of each saved container log.
STEP_TAIL_BYTES = 64 << 10
# A bundle file read for evidence is never read past this (the scene's own cap is 8 MiB).
MAX_READ_BYTES = 32 << 20
# Charted first: utilization (did the job stop working?), then what the fault class is about, then the rest.
CHART_METRICS = (
    "accelerator_utilization",
    "accelerator_memory_used",
    "accelerator_temperature",
    "accelerator_power",
    "accelerator_memory_utilization",
    "xid_errors",
    "health",
    "ecc_dbe",
    "ecc_sbe",
    "link_status",
    "network_status",
    "error_code",
)
FAULT_METRICS: dict[str, tuple[str, ...]] = {
    "device_error": ("xid_errors", "health", "ecc_dbe", "error_code", "accelerator_temperature"),
    "accelerator_oom": ("accelerator_memory_used", "accelerator_memory_utilization"),
    "comm_init": ("link_status", "network_status"),
    "comm_error": ("link_status", "network_status"),
    "hang": ("accelerator_power",),
    "node_failure": ("health", "accelerator_utilization"),
    "process_killed": ("accelerator_utilization",),
    "app_error": ("accelerator_utilization",),
    "storage_error": ("accelerator_utilization",),
    "unknown": ("accelerator_utilization",),
}
_RESTARTS = ("restart_from_checkpoint", "raise_memory_limit")
# "step 120", "step=120", "global_step: 120", "Step 12/100", "[step 5]", Megatron's "iteration  120/ 1000".
_STEP = re.compile(rb"(?i)(?:\bglobal[_ ]step|\bstep|\biteration|\biter)\s*[=:#]?\s*\[?\s*(\d{1,12})\b")
_COLON = {"en": ": ", "zh": "："}
_SERIES_KEY = re.compile(r"^(?P<name>[^{]+)\{(?P<device>[^}]*)\}$")


def _i18n(en: str, zh: str) -> dict[str, str]:
    return {"en": en, "zh": zh}


def _text_pair(value: Any) -> dict[str, str] | None:
    if isinstance(value, Mapping):
        en, zh = value.get("en"), value.get("zh")
        if isinstance(en, str) or isinstance(zh, str):
            return {"en": str(en or zh), "zh": str(zh or en)}
    if isinstance(value, str) and value:
        return {"en": value, "zh": value}
    return None


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    f = float(value)
    return f if math.isfinite(f) else None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _summary(obj: Any, limit: int = 300) -> str:
    """A short one-line `key=value` form of an action's params / result or a timeline detail."""
    if obj is None:
        return ""
    if not isinstance(obj, Mapping):
        return _cut(str(obj), limit)
    parts = []
    for k, v in obj.items():
        if k == "body" or v is None or (isinstance(v, list | tuple | Mapping) and not v):
            continue
        if isinstance(v, Mapping):
            inner = _summary(v, 120)
            if inner:
                parts.append(f"{k}=({inner})")
            continue
        if isinstance(v, list | tuple):
            if any(isinstance(x, Mapping | list) for x in v):
                parts.append(f"{k}=[{len(v)}]")
            else:
                shown = ",".join(str(x) for x in v[:8])
                parts.append(f"{k}={shown}{',…' if len(v) > 8 else ''}")
            continue
        if isinstance(v, float):
            parts.append(f"{k}={v:g}")
        else:
            parts.append(f"{k}={_cut(str(v), 120)}")
    return _cut(", ".join(parts), limit)


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _missing(what: str, en: str, zh: str) -> dict[str, Any]:
    return {"what": what, "reason": _i18n(en, zh)}
