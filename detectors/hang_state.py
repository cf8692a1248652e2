"""Settings and per-job state of the hang detector (detectors/hang.py)."""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Annotated

from pydantic import ConfigDict, Field
from pydantic.dataclasses import dataclass as pydantic_dataclass

from trainmedic.detectors.hang_schema import EPOCH_SCALE, MarkerKind
from trainmedic.models import Chip

# ------------------------------------------------------------------------------------------------
# Settings
# ------------------------------------------------------------------------------------------------


@pydantic_dataclass(frozen=True, config=ConfigDict(extra="forbid"))
class HangSettings:
    """Tuning of the hang detector (`detect.hang`). All durations in seconds.

    The settings group of the configuration file is this class itself (agent/config.py), so every
    field is settable from the file and the environment without a copy of it."""

    # A silence must outlast max(factor x interval, floor_s) to be a hang (the interval is the
    # `interval_quantile` of the recent step gaps). With a step every 2 s: 20 s.
    floor_s: Annotated[float, Field(gt=0, description="Shortest silence that can be a hang.")] = 20.0
    factor: Annotated[
        float,
        Field(gt=0, description="A hang is silence longer than this many step intervals (their `interval_quantile`)."),
    ] = 4.0
    interval_quantile: Annotated[
        float,
        Field(
            ge=0.5, le=1, description="Quantile of the recent step gaps taken as the job's step interval (0.5 to 1)."
        ),
    ] = 0.9
    startup_floor_s: Annotated[
        float,
        Field(
            gt=0,
            description="Log silence tolerated before the first progress line, after the end-of-training marker, "
            "for jobs without any known marker and while the interval is not learned yet.",
        ),
    ] = 1800.0
    min_interval_samples: Annotated[
        int, Field(ge=1, description="Progress gaps needed before the step interval is trusted.")
    ] = 3
    interval_samples: Annotated[
        int, Field(ge=1, description="Recent progress gaps the step interval is computed from.")
    ] = 64
    phase_factor: Annotated[
        float,
        Field(
            gt=0,
            description="An open checkpoint or evaluation phase may last max(phase_factor x interval, "
            "phase_floor_s, learned_margin x longest observed phase).",
        ),
    ] = 20.0
    phase_floor_s: Annotated[
        float, Field(gt=0, description="Shortest deadline of an open checkpoint or evaluation phase.")
    ] = 900.0
    learned_margin: Annotated[
        float, Field(ge=1, description="Margin (>= 1) over the longest phase or epoch-boundary pause seen so far.")
    ] = 1.5
    learned_phases: Annotated[
        int, Field(ge=1, description="Phase durations remembered per kind (the longest is used).")
    ] = 8
    min_reports: Annotated[
        int, Field(ge=1, description="Progress reports a rank needs before it can be reported as a lone stalled rank.")
    ] = 3
    rank_floor_s: Annotated[
        float,
        Field(
            gt=0,
            description="Shortest lag behind the other ranks that makes a lone stalled rank (log shipping lags "
            "between nodes).",
        ),
    ] = 60.0
    epoch_floor_s: Annotated[
        float,
        Field(
            gt=0,
            description="Slack after the last step of an epoch (data loader restart, reshuffle): "
            "max(base, epoch_floor_s, learned_margin x longest boundary pause seen).",
        ),
    ] = 180.0
    round_steps: Annotated[
        int,
        Field(
            ge=1,
            description="Frameworks that print only an evaluation's result: until its period is learned, a silence "
            "beginning at a multiple of this step gets the phase deadline.",
        ),
    ] = 100
    util_window_s: Annotated[
        float, Field(gt=0, description="Window at the end of a silence in which device utilisation is judged.")
    ] = 120.0
    flat_stddev: Annotated[
        float,
        Field(ge=0, description="Std-dev (percentage points) below which a device utilisation series counts as flat."),
    ] = 5.0
    util_samples: Annotated[int, Field(ge=1, description="Utilisation samples kept per device series.")] = 512
    stale_s: Annotated[
        float,
        Field(
            gt=0, description="State of a job that is not (or no longer) known to run is dropped after this silence."
        ),
    ] = 3600.0

    def __post_init__(self) -> None:
        for name in (
            "floor_s",
            "factor",
            "startup_floor_s",
            "phase_factor",
            "phase_floor_s",
            "util_window_s",
            "rank_floor_s",
            "epoch_floor_s",
        ):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"HangSettings.{name} must be a positive number, got {value!r}")
        if self.learned_margin < 1 or not math.isfinite(self.learned_margin):
            raise ValueError(f"HangSettings.learned_margin must be >= 1, got {self.learned_margin!r}")
        if not (0.5 <= self.interval_quantile <= 1.0):
            raise ValueError(f"HangSettings.interval_quantile must be in [0.5, 1], got {self.interval_quantile!r}")
        if self.flat_stddev < 0 or not math.isfinite(self.flat_stddev):
            raise ValueError(f"HangSettings.flat_stddev must be >= 0, got {self.flat_stddev!r}")
        for name in (
            "min_interval_samples",
            "interval_samples",
            "learned_phases",
            "min_reports",
            "util_samples",
            "round_steps",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"HangSettings.{name} must be >= 1")
        if self.interval_samples < self.min_interval_samples:
            raise ValueError("HangSettings.interval_samples must be >= min_interval_samples")
        if self.stale_s <= 0:
            raise ValueError("HangSettings.stale_s must be positive")


# ------------------------------------------------------------------------------------------------
# Per-job state
# ------------------------------------------------------------------------------------------------


class _Mode(Enum):
    STARTUP = "startup"
    TRAINING = "training"
    DONE = "done"


_CHECKPOINT = "checkpoint"
_EVAL = "eval"
# Pseudo-phases: the pause after an epoch's last step, and unexplained pauses that recur at a
# regular step period (learned like end-only phases).
_EPOCH = "epoch"
_STALL = "stall"
_PHASE_OF = {
    MarkerKind.CHECKPOINT_START: _CHECKPOINT,
    MarkerKind.CHECKPOINT_END: _CHECKPOINT,
    MarkerKind.EVAL_START: _EVAL,
    MarkerKind.EVAL_END: _EVAL,
}


@dataclass(slots=True)
class _Stream:
    """One log stream of the job (one rank's container)."""

    rank: int | None
    pod: str | None
    node: str | None
    last_activity: float
    # Last sign of progress (steps, evaluation bars); the lone-rank check uses it.
    last_progress: float | None = None
    # Last real training step, the start of the next interval sample.
    last_step_t: float | None = None
    # Something other than a plain step happened since last_step_t: the next gap is not sampled.
    tainted: bool = False
    reports: int = 0


@dataclass(slots=True)
class _Phase:
    kind: str
    start: float
    # Progress beyond this step ends the phase: the job's step when the phase began, or the step the
    # marker names when it is later (the marker of one rank can arrive before another rank's
    # progress line of that same step).
    baseline: int | None
    opener: str
    # The step the marker names (or the baseline): an end marker naming it is the same phase.
    step: int | None


@dataclass(slots=True)
class _Job:
    key: str
    since: float
    running: bool = False
    mode: _Mode = _Mode.STARTUP
    chip: Chip = Chip.GENERIC
    last_activity: float = -math.inf
    streams: dict[str, _Stream] = field(default_factory=dict)
    # Streams that reported progress, oldest progress first (move_to_end on each report).
    order: OrderedDict[str, None] = field(default_factory=OrderedDict)
    # Newest sign of progress of any stream, or checkpoint/evaluation marker (training mode).
    anchor: float | None = None
    max_step: int | None = None
    # (step, epoch, total) of max_step, formatted only when a finding shows it.
    max_step_parts: tuple[int | None, int | None, int | None] | None = None
    train_total: int | None = None
    odd_streak: int = 0
    odd_since: float = 0.0
    intervals: deque[float] = field(default_factory=deque)
    median: float | None = None
    median_dirty: bool = False
    phase: _Phase | None = None
    phase_mark: float = -math.inf
    durations: dict[str, deque[float]] = field(default_factory=dict)
    phase_steps: dict[str, deque[int]] = field(default_factory=dict)
    last_phase_step: dict[str, int] = field(default_factory=dict)
    # The last step of an epoch (epoch-relative counters), learned when the epoch number moves on.
    epoch_last: int | None = None
    # Progress comes from a framework whose evaluations show only at their end.
    end_only: bool = False
    # The step after which an epoch_end marker came.
    epoch_end_step: int | None = None
    fired: bool = False
    lone_reported: set[str] = field(default_factory=set)
    util: dict[tuple[str | None, str | None], deque[tuple[float, float]]] = field(default_factory=dict)
    evidence: str = ""

    def forget_steps(self) -> None:
        """Back to start-up, no step seen and no phase open (a restart, a run's banner)."""
        self.mode = _Mode.STARTUP
        self.anchor = None
        self.max_step = None
        self.max_step_parts = None
        self.train_total = None
        self.odd_streak = 0
        self.phase = None

    def reset_progress(self, t: float) -> None:
        """A restart: back to start-up; keep what was learned about the pace and the phases."""
        self.forget_steps()
        self.streams.clear()
        self.order.clear()
        self.fired = False
        self.lone_reported.clear()
        self.since = t
        self.last_activity = t


def _quantile(ordered: Sequence[float], q: float) -> float:
    """The q-quantile of sorted values, linearly interpolated (numpy's default method)."""
    at = (len(ordered) - 1) * q
    lo = math.floor(at)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (at - lo)


def _stream_key(rank: int | None, pod: str | None, node: str | None) -> str:
    if rank is not None:
        return f"rank:{rank}"
    if pod:
        return f"pod:{pod}"
    return f"node:{node}" if node else "-"


def _finite(x: float) -> bool:
    return isinstance(x, int | float) and math.isfinite(x)


def _split_job_key(job_key: str) -> tuple[str | None, str | None]:
    if job_key.startswith("job:") and "/" in job_key:
        ns, _, name = job_key[4:].partition("/")
        return ns or None, name or None
    return None, None


def _fold_progress(
    job: _Job, stream: _Stream, step: int | None, epoch: int | None, total: int | None, line: str
) -> bool:
    """`HangDetector._on_progress` for a progress line that follows, at the same time, one counted as
    a step (of the same stream, with nothing in between): of all it does, only this is left to do
    when the step moves forward (the mode, phase, anchor, order, interval and last step time are
    already what it would set). False, with nothing changed, when the general path is needed."""
    if step is not None:
        position = step if epoch is None else epoch * EPOCH_SCALE + step
        max_step = job.max_step
        if max_step is not None and position < max_step:
            return False
        train_total = job.train_total
        if train_total is None:
            if total is not None:
                job.train_total = total
        elif total is not None and total != train_total:
            return False
        job.odd_streak = 0
        if max_step is None or position > max_step:
            parts = job.max_step_parts
            if epoch is not None and parts is not None and parts[1] is not None and epoch > parts[1]:
                job.epoch_last = parts[0]  # the epoch moved on: its last step is known
            job.max_step = position
            job.max_step_parts = (step, epoch, total)
    job.evidence = line
    stream.reports += 1
    return True


def seconds_text(value: float) -> str:
    """A duration in seconds for a message: whole seconds from 10 s, one decimal from 1 s, two
    significant digits below ("0.25"), so a fast step never reads "a step every 0 s"."""
    if value >= 10:
        return f"{value:.0f}"
    if value >= 1:
        return f"{value:.1f}".removesuffix(".0")
    return f"{value:.2g}"
