"""The vocabulary of a policy and the values its file holds: the modes (`Mode`) and action names
(`ActionName`, with `RESTARTING`, the actions that recreate the workload), the pool of all nodes,
the opt-out annotation (`opt_out`), the limits on ids, label keys and windows, and the readers of
the file's values with the pydantic types built on them: durations ("30s", "10m", "1h", "2d";
`parse_duration`, `format_duration`, `Duration`), Kubernetes memory quantities (`parse_quantity`,
`Quantity`) and fnmatch globs over codes and namespaces (`CodeGlob`, `NamespaceGlob`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from enum import StrEnum
from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator, Field

from trainmedic import quantity as shared_quantity

# The policy state keeps 30 days of history (policy_state.RETENTION_S): no window may be longer.
MAX_WINDOW_S = 30 * 86400.0
ID_RE = r"^[a-z0-9][a-z0-9_.-]{0,79}$"
# A label key: optional DNS-subdomain prefix and a name of at most 63 characters.
LABEL_KEY_RE = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
OPT_OUT_ANNOTATION = "trainmedic.io/remediate"
ALL_NODES_POOL = "all"


class Mode(StrEnum):
    OBSERVE = "observe"
    DRY_RUN = "dry-run"
    APPROVE = "approve"
    ENFORCE = "enforce"


class ActionName(StrEnum):
    QUARANTINE_NODE = "quarantine_node"
    RESTART_FROM_CHECKPOINT = "restart_from_checkpoint"
    RAISE_MEMORY_LIMIT = "raise_memory_limit"
    DUMP_STACKS = "dump_stacks"
    NOTIFY = "notify"


# Actions that recreate the workload (and so spend the restart budget).
RESTARTING = frozenset({ActionName.RESTART_FROM_CHECKPOINT, ActionName.RAISE_MEMORY_LIMIT})


_DURATION_RE = re.compile(r"^(\d+(?:\.\d+)?)(s|m|h|d)$")
_DURATION_UNIT = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(value: object) -> float:
    """Seconds in a duration such as "30s", "10m", "1h", "2d". Raises ValueError."""
    if not isinstance(value, str):
        raise ValueError(f"a duration is a number with a unit (30s, 10m, 1h, 2d), not {value!r}")
    m = _DURATION_RE.match(value.strip())
    if m is None:
        raise ValueError(f"bad duration {value!r}: use a number and a unit, e.g. 30s, 10m, 1h, 2d")
    return float(m.group(1)) * _DURATION_UNIT[m.group(2)]


def format_duration(seconds: float) -> str:
    """The shortest "1h30m"-style text for a number of seconds."""
    s = max(0, round(seconds))
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= size:
            parts.append(f"{s // size}{unit}")
            s %= size
    if s or not parts:
        parts.append(f"{s}s")
    return "".join(parts)


def _duration(value: object) -> float:
    seconds = parse_duration(value)
    if seconds <= 0:
        raise ValueError(f"duration {value!r} must be more than zero")
    if seconds > MAX_WINDOW_S:
        raise ValueError(f"duration {value!r} is longer than the 30 days of history the policy keeps")
    return seconds


Duration = Annotated[float, BeforeValidator(_duration)]


def parse_quantity(value: object) -> int:
    """Bytes in a Kubernetes memory quantity ("512Gi", "1.5G", "129e6", "1024"), rounded up: read by
    trainmedic.quantity, without a sign, a sub-unit suffix (n u m) or a negative exponent."""
    text = str(value).strip() if isinstance(value, (str, int)) and not isinstance(value, bool) else None
    bad = f"bad memory size {value!r}: use a Kubernetes quantity such as 512Gi, 64G or 1.5Ti"
    if text is None or text.startswith(("+", "-")) or text.endswith(("n", "u", "m")) or re.search("[eE][+-]", text):
        raise ValueError(bad)
    try:
        amount = shared_quantity.parse_quantity(text)
    except shared_quantity.BadQuantity as exc:
        raise ValueError(f"memory size {value!r} is too large" if exc.reason == "exponent" else bad) from None
    if amount <= 0:
        raise ValueError(f"memory size {value!r} must be more than zero")
    if amount > 2**63 - 1:
        raise ValueError(f"memory size {value!r} is too large")
    return math.ceil(amount)


def _quantity(value: object) -> str:
    parse_quantity(value)
    return str(value).strip()


Quantity = Annotated[str, BeforeValidator(_quantity)]


def _check_glob(pattern: str, literal: str, what: str) -> str:
    """A glob (fnmatch: * ? [...]) over `literal` characters, with every bracket closed."""
    if not pattern:
        raise ValueError(f"empty {what} pattern")
    if len(pattern) > 253:
        raise ValueError(f"{what} pattern is longer than 253 characters")
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if c == "[":
            j = i + 1
            if j < len(pattern) and pattern[j] == "!":
                j += 1
            if j < len(pattern) and pattern[j] == "]":
                j += 1
            while j < len(pattern) and pattern[j] != "]":
                j += 1
            if j >= len(pattern):
                raise ValueError(f"bad glob {pattern!r}: the '[' at position {i} is never closed")
            i = j + 1
            continue
        if c == "]":
            raise ValueError(f"bad glob {pattern!r}: ']' at position {i} closes no '['")
        if c not in "*?!" and not re.fullmatch(literal, c):
            raise ValueError(f"bad glob {pattern!r}: {c!r} cannot appear in a {what}")
        i += 1
    return pattern


def _code_glob(pattern: str) -> str:
    return _check_glob(pattern, r"[A-Za-z0-9_.:/+\-]", "code")


def _namespace_glob(pattern: str) -> str:
    return _check_glob(pattern, r"[a-z0-9\-]", "namespace")


CodeGlob = Annotated[str, AfterValidator(_code_glob)]
NamespaceGlob = Annotated[str, AfterValidator(_namespace_glob)]
RuleId = Annotated[str, Field(pattern=ID_RE)]


def opt_out(annotations: Mapping[str, Any] | None) -> bool:
    """Whether a workload's annotations opt it out of remediation."""
    value = (annotations or {}).get(OPT_OUT_ANNOTATION)
    return isinstance(value, str) and value.strip().lower() in ("false", "no", "off", "0")
