"""The progress-marker schema of the hang detector: what a marker of detectors/progress.yaml is,
what a match of one yields, and the limits of the marker file. Loading is detectors/hang_markers.py,
matching detectors/hang_matcher.py, the detector detectors/hang.py."""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

MARKERS_FILE = Path(__file__).with_name("progress.yaml")
MAX_MARKER_FILE_BYTES = 1024 * 1024
# Only the tail of a longer line is matched (a tqdm stream without newlines grows to 16 KiB chunks
# in CRI logs; its newest update is at the end).
MAX_LINE_CHARS = 65536
# A step that counts within an epoch is ordered as epoch * EPOCH_SCALE + step.
EPOCH_SCALE = 1_000_000_000
MAX_EVIDENCE_CHARS = 400

RULE_ID = "hang.no_progress"
CODE = "no_progress"

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_ALLOWED_GROUPS = frozenset({"step", "total", "epoch"})


# ------------------------------------------------------------------------------------------------
# The marker file
# ------------------------------------------------------------------------------------------------


class MarkerKind(StrEnum):
    PROGRESS = "progress"
    CHECKPOINT_START = "checkpoint_start"
    CHECKPOINT_END = "checkpoint_end"
    EVAL_START = "eval_start"
    EVAL_END = "eval_end"
    DONE = "done"
    # A run's banner: a (re)started run is loading; its cadence is learned anew.
    START = "start"
    # An epoch finished (the data loader restarts next): the pause that follows gets the epoch slack.
    EPOCH_END = "epoch_end"


_END_KINDS = frozenset({MarkerKind.CHECKPOINT_END, MarkerKind.EVAL_END})


def _check_pattern(pattern: str) -> str:
    try:
        rx = re.compile(pattern)
    except re.error as exc:
        raise ValueError(f"invalid regex {pattern!r}: {exc}") from None
    extra = set(rx.groupindex) - _ALLOWED_GROUPS
    if extra:
        raise ValueError(f"named groups {sorted(extra)} are not allowed (only step, total, epoch)")
    if rx.search("") is not None:
        raise ValueError("pattern matches an empty line")
    return pattern


class MarkerExample(BaseModel):
    """A line the marker must match, with the step (and epoch) it must extract when given."""

    model_config = ConfigDict(extra="forbid")

    line: str = Field(min_length=1)
    step: int | None = None
    epoch: int | None = None


class Marker(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(pattern=r"^[a-z0-9][a-z0-9_.-]*$", max_length=80)
    kind: MarkerKind
    framework: str = Field(min_length=1)
    # Where the wording comes from: the framework's file and function.
    source: str = Field(min_length=10)
    # Literal substrings; the pattern is only tried on lines holding one of them.
    keywords: list[Annotated[str, Field(min_length=2, pattern=r"^[^\n]+$")]] = Field(min_length=1)
    # Optional second gate: one of these must be in the line as well (cheap literal checks that
    # spare the regex on lines that only share a common keyword such as "step").
    requires: list[Annotated[str, Field(min_length=1)]] = Field(default_factory=list)
    pattern: Annotated[str, AfterValidator(_check_pattern)]
    examples: list[MarkerExample] = Field(min_length=1)
    no_match: list[str] = Field(default_factory=list)


class _MarkerFileHeader(BaseModel):
    model_config = ConfigDict(extra="forbid")

    version: int = Field(default=1, ge=1, le=1)
    markers: list[Any] = Field(default_factory=list)


@dataclass(frozen=True, slots=True)
class MarkerHit:
    """One marker found in one line."""

    marker_id: str
    kind: MarkerKind
    # Offset in the (ANSI-stripped) line, to order several markers of one line.
    pos: int
    step: int | None = None
    epoch: int | None = None
    total: int | None = None

    @property
    def position(self) -> int | None:
        """The step as an ordered number (epoch-relative steps folded into one scale)."""
        return _position(self.step, self.epoch)

    @property
    def step_text(self) -> str:
        return _step_text(self.step, self.epoch, self.total)


def _int_group(m: re.Match[str], name: str) -> int | None:
    if name not in m.re.groupindex:
        return None
    value = m.group(name)
    if value is None or len(value) > 18:
        return None
    return int(value)


def _number(m: re.Match[str], group: int) -> int | None:
    value = m.group(group)
    if value is None or len(value) > 18:
        return None
    return int(value)


def _position(step: int | None, epoch: int | None) -> int | None:
    if step is None:
        return None
    return step if epoch is None else epoch * EPOCH_SCALE + step


def _step_text(step: int | None, epoch: int | None, total: int | None) -> str:
    if step is None:
        return ""
    text = str(step) if total is None else f"{step}/{total}"
    return text if epoch is None else f"epoch {epoch} step {text}"
