"""Hang detection without an explicit error line: a running job that stops making progress.

Most hangs print nothing: an NCCL/HCCL collective waits forever (PyTorch's NCCL watchdog fires
after 10 minutes by default, when it is on at all), a rank is stuck in a storage write, a data
loader deadlocks. What is visible is the absence of the lines a healthy job prints at a steady
pace. This module learns that pace per job and reports the silence that outlasts it.

The deadline (decided here; figures from bench/hang.py, `python bench/hang.py`):

* It follows the job's own cadence: `base = max(factor x interval, floor_s)` with the shipped
  `factor = 4`, `floor_s = 20 s`, and `interval` a robust *high* quantile (`interval_quantile =
  0.9`) of the last `interval_samples` (64) step gaps. A job logging a step every 2 s is flagged
  about 20 s after its last step (30x sooner than the watchdog); one logging every 60 s after
  4 minutes. The high quantile (not the median) keeps jittery jobs and occasional slow steps (GC,
  a straggler) inside the bound; the floor keeps log-shipping delays and sub-second cadences from
  firing; the factor leaves room for a step up to 4x slower than nine in ten recent ones.
* Known pauses get slack instead of a longer deadline for everyone: checkpoint saves and
  evaluations (their markers, below), the pause after an epoch's last step (data-loader restart,
  reshuffle: `epoch_floor_s` = 180 s, or 1.5x the longest such pause seen), end-only evaluations
  at a round step until their period is learned, and pauses that recur at a regular step period
  (learned from three occurrences). A run's banner ("***** Running training *****", Megatron's
  "[before the start of training step]", DeepSpeed's "DeepSpeed info: version=", torchelastic's
  "will restart worker group") puts the job back in start-up: the cadence is learned anew.
* Measured on seeded 24-hour replays of twelve progress formats (saves of 30-300 s every 500
  steps, evaluations of 1-7 minutes every 1500 steps, epoch-boundary stalls, one restart): no false
  alarm, and a stop after a random step flagged after a median of about 20 s.

The rule (all times are passed in; no wall clock, no asyncio, so tests replay days in seconds):

* **Progress** is a line matching a `progress` marker of detectors/progress.yaml (a training step
  or a log interval: tqdm bars with or without a description, behind torchrun's prefixes, HF
  Trainer loss dicts, Megatron "iteration N/T |", DeepSpeed "step=N" / "steps: N", MindSpore
  "epoch: E step: N", veRL "step:N -", "Step N/T", ...). Checkpoint, evaluation, epoch-end,
  end-of-training and run-start markers come from the same file.
* **Interval**: the `interval_quantile` of the last `interval_samples` progress-to-progress gaps of
  each log stream (pooled over ranks). A gap that contains a checkpoint or evaluation marker, an
  evaluation bar or any other non-step progress is not sampled. It is the interval between
  progress *reports*, which equals the step time when every step is logged and
  `log_interval x step` otherwise.
* **Whole-job hang**: the job's most recent sign of progress (a progress line of any rank, or a
  checkpoint/evaluation marker) is older than `base`. Collective communication blocks every rank
  within one step of the others, so a real hang silences all of them; the bound is measured from
  the newest progress, which never fires while any rank moves. The finding is localised to the
  rank whose last progress is the oldest (the likeliest culprit).
* **Stalled rank**: a rank that has reported progress regularly (`min_reports` times) and is
  silent while another rank made progress after this rank's own deadline
  (`last + max(base, rank_floor_s)`; log shipping from different nodes lags by seconds). Ranks
  that printed a bar once (weight loading) and never again are forgotten, not reported. Only ranks
  with a known rank number take part (pod names change when a pod is replaced).
* **Checkpoint and evaluation**: while a phase is open (its start marker seen, no end marker yet,
  no progress past the step where it began) the deadline becomes
  `max(phase start + max(phase_factor x interval, phase_floor_s, learned_margin x longest
  observed phase of that kind), newest progress + base)`. A save line without an end line
  ("Saving model checkpoint to X", the usual case) counts as a phase until the next progress line.
  An evaluation bar ("Evaluating: 40%|...") opens an evaluation phase and each update is a sign of
  life. A phase seen only at its end (Megatron's "validation loss at iteration N", nanoGPT's eval
  line) is recognised afterwards: its duration is learned, and once three such phases came at a
  regular step period, a silence that starts at a step where the next one is due gets the phase
  deadline too. Until then, for a framework whose evaluations print only at their end, a silence
  that starts at a multiple of `round_steps` (evaluation intervals are round numbers) gets it.
* **Epoch boundary**: after an epoch's last step (a bar at its total, an epoch-relative counter at
  the last step of the previous epoch, or an `epoch_end` marker such as MindSpore's TimeMonitor
  line) the deadline is `max(base, epoch_floor_s, learned_margin x longest boundary pause)`.
* **Recurring pauses**: a gap that began at the job's newest step, longer than `factor x interval`
  and with no marker in it, is remembered with its step; once three came at a regular step
  period, a silence at the next due step may last `learned_margin x` the longest of them.
* **Utilisation**: when the job's accelerator utilisation was sampled at the end of the silence
  (the last `util_window_s` seconds, leaving out the first interval after the last progress, when
  the step in flight may still have been computing; at least two samples per device), a hang also
  requires every device series to be flat (population std-dev <= `flat_stddev` percentage
  points). Flat is not idle: a spinning NCCL kernel shows a steady 100 %. A device whose
  utilisation clearly varies is doing work without logging (a long unlogged evaluation): no
  finding until it goes flat. With no samples, log silence alone decides. A single stalled rank is
  judged on its log alone (which device a rank drives is not known; its node's others keep busy).
* **Before the first progress line** (start-up: image pull done, model and data loading, and again
  after a run's banner) and **after the end-of-training marker** (final save, upload, shutdown),
  and for jobs whose log format has no known marker at all, any log line is a sign of life and the
  bound is `max(startup_floor_s, floor_s)` of complete silence. The same long bound applies while
  the interval is not known yet (fewer than `min_interval_samples` gaps).
* Only running jobs are checked (`observe_job`); a job that is no longer running is forgotten. A
  rank whose pod changes (the pod was replaced) restarts the job's state in start-up mode.
* A finding fires once per stall and re-arms when progress resumes.

Limits: a checkpoint save or an evaluation that prints nothing at all (PyTorch Lightning's
ModelCheckpoint without verbose, a bare torch.save in a custom loop) and a data stall the log does
not mark (an epoch boundary of a job whose counter is global, e.g. HF Trainer's) are covered by
`floor_s` only until they have recurred three times at a regular step period; raise the floor or
add a marker. Per-line times (`times=`) make the interval exact; without them a batch's lines share
the batch time, which only makes the interval (and the bound) larger. `trainmedic diagnose` sees
the same silences in a finished log through its own timestamps (detectors/hang_static.py).

Modules: the marker schema (hang_schema), the regex rewrites (hang_regex), the matcher
(hang_matcher), the marker file (hang_markers), settings and per-job state (hang_state), this
detector. It stays one piece past 600 lines because its observation and check paths update the
same per-job state and must stay consistent with each other (the batch path is tested against a
line-by-line reference path).

Errors:

    RuleLoadError (trainmedic.errors)   progress.yaml is unusable: every problem with file:line

Size: one class, `HangDetector`, over one state (each rank's progress, the phase and the silence
bounds); its schema, matcher, regex rewriter and state already live in the hang_*.py modules.
"""

from __future__ import annotations

import logging
import statistics
from collections import deque
from collections.abc import Sequence
from dataclasses import replace

from trainmedic.detectors.hang_markers import ProgressMarkers, load_markers, parse_markers, shipped_markers
from trainmedic.detectors.hang_matcher import _KIND_BIT, ProgressMatcher, RawHit, _compile_marker, _Compiled
from trainmedic.detectors.hang_schema import (
    CODE,
    EPOCH_SCALE,
    MARKERS_FILE,
    MAX_EVIDENCE_CHARS,
    RULE_ID,
    Marker,
    MarkerExample,
    MarkerHit,
    MarkerKind,
    _position,
    _step_text,
)
from trainmedic.detectors.hang_state import (
    _CHECKPOINT,
    _EPOCH,
    _EVAL,
    _PHASE_OF,
    _STALL,
    HangSettings,
    _finite,
    _fold_progress,
    _Job,
    _Mode,
    _Phase,
    _quantile,
    _split_job_key,
    _Stream,
    _stream_key,
    seconds_text,
)
from trainmedic.models import Chip, FaultClass, Finding, I18nText, Severity, Source

# The marker schema, matcher and loader live in their own modules; their names stay importable
# from here, where other code and the tests have always found them.
__all__ = [
    "CODE",
    "EPOCH_SCALE",
    "MARKERS_FILE",
    "MAX_EVIDENCE_CHARS",
    "RULE_ID",
    "_KIND_BIT",
    "HangDetector",
    "HangSettings",
    "Marker",
    "MarkerExample",
    "MarkerHit",
    "MarkerKind",
    "ProgressMarkers",
    "ProgressMatcher",
    "RawHit",
    "_Compiled",
    "_compile_marker",
    "load_markers",
    "parse_markers",
    "shipped_markers",
]

log = logging.getLogger("trainmedic.detectors.hang")

# ------------------------------------------------------------------------------------------------
# The detector
# ------------------------------------------------------------------------------------------------


class HangDetector:
    """Stateful no-progress detector, one state per job. Not thread-safe; time is always passed in.

    `floor_s` and `factor` override the same fields of `settings`. Observations are O(1) per call
    (plus a C-level keyword scan of the lines); `check` is O(jobs), amortised O(1) per job.

    A batch goes through `ProgressMatcher.hits` and each hit through the state update in line
    order; a progress line that follows a counted step at the same time only moves the step on
    (`_fold_progress`). `reference=True` instead matches each line on its own with `match_line` and
    applies every hit in full: slower, the straightforward path the tests hold the batch path to.
    """

    def __init__(
        self,
        floor_s: float | None = None,
        factor: float | None = None,
        *,
        settings: HangSettings | None = None,
        markers: ProgressMarkers | None = None,
        reference: bool = False,
    ) -> None:
        base = settings or HangSettings()
        self.settings = replace(
            base,
            floor_s=base.floor_s if floor_s is None else floor_s,
            factor=base.factor if factor is None else factor,
        )
        self.markers = markers or shipped_markers()
        self._matcher = self.markers.matcher
        markers_ = self.markers.markers
        with_start = {m.framework for m in markers_ if m.kind is MarkerKind.EVAL_START}
        end_only = {m.framework for m in markers_ if m.kind is MarkerKind.EVAL_END} - with_start
        # Progress markers of frameworks whose evaluations show only at their end.
        self._end_only = frozenset(
            i for i, m in enumerate(markers_) if m.kind is MarkerKind.PROGRESS and m.framework in end_only
        )
        self.reference = reference
        self._jobs: dict[str, _Job] = {}
        # Counters for the pipeline's telemetry.
        self.stats: dict[str, int] = {
            "lines": 0,
            "marker_lines": 0,
            "util_samples": 0,
            "rejected": 0,
            "findings": 0,
        }

    # -- observations ---------------------------------------------------------------------------

    def observe_job(self, job_key: str, running: bool, t: float, *, chip: Chip | str | None = None) -> None:
        """Pod/workload status. Only running jobs can hang; a job that stopped is forgotten."""
        if not _finite(t):
            self._reject("non-finite time in observe_job")
            return
        if not running:
            self._jobs.pop(job_key, None)
            return
        job = self._job(job_key, t)
        if not job.running:
            job.running = True
            job.since = t
        self._set_chip(job, chip)

    def observe_lines(
        self,
        job_key: str,
        rank: int | None,
        pod: str | None,
        node: str | None,
        t: float,
        lines: Sequence[str],
        *,
        times: Sequence[float] | None = None,
    ) -> None:
        """One batch of one container's log lines (a LogBatch). `times`, when given, holds per-line times."""
        if not lines:
            return
        if not _finite(t):
            self._reject("non-finite time in observe_lines")
            return
        job = self._job(job_key, t)
        self.stats["lines"] += len(lines)
        skey = _stream_key(rank, pod, node)
        stream = self._stream(job, skey, rank, pod, node, t)
        stream.last_activity = max(stream.last_activity, t)
        job.last_activity = max(job.last_activity, t)
        if job.mode is not _Mode.TRAINING:
            # Any line is a sign of life before the first step and after the last one.
            job.fired = False
        if self.reference:
            found = self._reference_hits(lines)
        else:
            found = self._matcher.hits(lines, with_index=times is not None)
        if not found:
            return
        self.stats["marker_lines"] += len(found)
        progress = MarkerKind.PROGRESS
        on_progress, on_marker = self._on_progress, self._on_marker
        end_only = self._end_only
        fold = not self.reference
        # The time of the previous hit when it was a progress line counted as a step: a next one at
        # that same time only moves the step on (see _fold_progress).
        stepped: float | None = None
        for index, line, hits in found:
            lt = t
            if times is not None and 0 <= index < len(times) and _finite(times[index]):
                lt = float(times[index])
            for kind, _pos, step, epoch, total, marker in hits:
                if kind is not progress:
                    on_marker(job, skey, lt, kind, step, epoch, line)
                    stepped = None
                elif not (fold and lt == stepped and _fold_progress(job, stream, step, epoch, total, line)):
                    stepped = lt if on_progress(job, skey, stream, lt, step, epoch, total, line) else None
                    if marker in end_only:
                        job.end_only = True

    def _reference_hits(self, lines: Sequence[str]) -> list[tuple[int, str, list[RawHit]]]:
        """The batch's hits line by line: each piece of each line through `match_line`."""
        matcher = self._matcher
        index_of = {m.id: i for i, m in enumerate(matcher.markers)}
        out: list[tuple[int, str, list[RawHit]]] = []
        for index, text in enumerate(lines):
            for piece in text.split("\n"):
                if not matcher.has_keyword(piece):
                    continue  # lines are only looked at when their raw text holds a keyword
                hits = matcher.match_line(piece)
                if hits:
                    out.append(
                        (index, piece, [(h.kind, h.pos, h.step, h.epoch, h.total, index_of[h.marker_id]) for h in hits])
                    )
        return out

    def observe_utilization(
        self,
        job_key: str,
        node: str | None,
        device: str | None,
        t: float,
        value: float,
        *,
        chip: Chip | str | None = None,
    ) -> None:
        """One accelerator utilisation sample (percent, 0-100) of a device the job runs on."""
        if not (_finite(t) and _finite(value)):
            self._reject("non-finite utilisation sample")
            return
        job = self._jobs.get(job_key)
        if job is None:
            job = self._job(job_key, t)
        self._set_chip(job, chip)
        series = job.util.get((node, device))
        if series is None:
            series = job.util[(node, device)] = deque(maxlen=self.settings.util_samples)
        series.append((t, float(value)))
        horizon = t - self.settings.util_window_s
        while series and series[0][0] < horizon:
            series.popleft()
        self.stats["util_samples"] += 1

    def jobs(self) -> list[str]:
        """Keys of the jobs with state (for telemetry and tests)."""
        return list(self._jobs)

    def forget(self, job_key: str) -> None:
        """Drop a job's state (its owner saw it end, or go idle, and let it go)."""
        self._jobs.pop(job_key, None)

    def __len__(self) -> int:
        return len(self._jobs)

    # -- checking -------------------------------------------------------------------------------

    def check(self, now: float) -> list[Finding]:
        """New hang findings at time `now` (each stall fires once; progress re-arms it)."""
        if not _finite(now):
            self._reject("non-finite time in check")
            return []
        out: list[Finding] = []
        stale: list[str] = []
        for key, job in self._jobs.items():
            if not job.running:
                if now - max(job.last_activity, job.since) > self.settings.stale_s:
                    stale.append(key)
                continue
            if job.mode is _Mode.TRAINING and job.anchor is not None:
                out.extend(self._check_training(job, now))
            else:
                finding = self._check_silence(job, now)
                if finding is not None:
                    out.append(finding)
        for key in stale:
            del self._jobs[key]
        self.stats["findings"] += len(out)
        return out

    # -- internals: state -----------------------------------------------------------------------

    def _reject(self, why: str) -> None:
        self.stats["rejected"] += 1
        log.debug("hang detector: input set aside: %s", why)

    def _job(self, job_key: str, t: float) -> _Job:
        job = self._jobs.get(job_key)
        if job is None:
            job = self._jobs[job_key] = _Job(key=job_key, since=t)
            job.intervals = deque(maxlen=self.settings.interval_samples)
        return job

    @staticmethod
    def _set_chip(job: _Job, chip: Chip | str | None) -> None:
        if chip is None:
            return
        try:
            job.chip = Chip(chip)
        except ValueError:
            return

    def _stream(self, job: _Job, skey: str, rank: int | None, pod: str | None, node: str | None, t: float) -> _Stream:
        stream = job.streams.get(skey)
        if stream is not None:
            if rank is not None and pod and stream.pod and pod != stream.pod:
                # The rank runs in a new pod: the job restarted.
                job.reset_progress(t)
                stream = None
            else:
                if node and stream.node != node:
                    stream.node = node
                if pod and not stream.pod:
                    stream.pod = pod
                return stream
        elif rank is None and pod and len(job.streams) == 1 and job.mode is not _Mode.STARTUP:
            (other,) = job.streams.values()
            if other.rank is None and other.pod and other.pod != pod:
                # A single-pod job whose pod was replaced.
                job.reset_progress(t)
        stream = job.streams[skey] = _Stream(rank=rank, pod=pod, node=node, last_activity=t)
        return stream

    def _interval(self, job: _Job) -> float | None:
        if len(job.intervals) < self.settings.min_interval_samples:
            return None
        if job.median_dirty or job.median is None:
            job.median = _quantile(sorted(job.intervals), self.settings.interval_quantile)
            job.median_dirty = False
        return job.median

    def _base_bound(self, interval: float | None) -> float:
        s = self.settings
        if interval is None:
            return max(s.startup_floor_s, s.floor_s)
        return max(s.factor * interval, s.floor_s)

    def _phase_bound(self, job: _Job, kind: str, interval: float | None, base: float) -> float:
        s = self.settings
        learned = job.durations.get(kind)
        if kind == _STALL:
            return max(base, s.learned_margin * max(learned)) if learned else base
        if kind == _EPOCH:
            return max(base, s.epoch_floor_s, s.learned_margin * max(learned) if learned else 0.0)
        bound = max(s.phase_floor_s, base)
        if interval is not None:
            bound = max(bound, s.phase_factor * interval)
        if learned:
            bound = max(bound, s.learned_margin * max(learned))
        return bound

    def _due_phase(self, job: _Job) -> str | None:
        """A phase seen before at a regular step period that is due at the job's current step."""
        if job.max_step is None:
            return None
        for kind, steps in job.phase_steps.items():
            # A period is trusted once seen twice in a row (three phases at regular steps).
            if len(steps) < 3:
                continue
            period = steps[-1] - steps[-2]
            if period <= 0 or steps[-2] - steps[-3] != period:
                continue
            if job.max_step > steps[-1] and (job.max_step - steps[-1]) % period == 0:
                return kind
        return None

    # -- internals: markers ---------------------------------------------------------------------

    def _on_marker(
        self, job: _Job, skey: str, t: float, kind: MarkerKind, step: int | None, epoch: int | None, line: str
    ) -> None:
        """A checkpoint, evaluation, end-of-training or run-start marker."""
        if kind is MarkerKind.START:
            self._restart(job, t)
            return
        if job.mode is not _Mode.TRAINING:
            return  # before the first step and after the last one, markers are only signs of life
        if kind is MarkerKind.EPOCH_END:
            job.epoch_end_step = job.max_step
            job.evidence = line
            job.fired = False
            if job.anchor is None or t > job.anchor:
                job.anchor = t
            return
        if kind is MarkerKind.DONE:
            if job.phase is not None:
                self._close_phase(job, t)
            job.mode = _Mode.DONE
            job.fired = False
            job.lone_reported.clear()
            return
        phase_kind = _PHASE_OF[kind]
        job.evidence = line
        job.fired = False
        start_of_silence = job.anchor
        if job.anchor is None or t > job.anchor:
            job.anchor = t
        job.phase_mark = max(job.phase_mark, t)
        if kind in (MarkerKind.CHECKPOINT_START, MarkerKind.EVAL_START):
            phase = job.phase
            if phase is not None:
                if phase.kind == phase_kind:
                    return  # one phase printing several lines
                self._close_phase(job, t)
            named = _position(step, epoch)
            baseline = job.max_step if named is None or (job.max_step is not None and job.max_step > named) else named
            job.phase = _Phase(
                kind=phase_kind,
                start=t,
                baseline=baseline,
                opener=skey,
                step=named if named is not None else job.max_step,
            )
            self._note_phase_step(job, phase_kind)
            return
        # An end marker.
        if job.phase is not None:
            self._close_phase(job, t)
            return
        named = _position(step, epoch)
        if named is None:
            named = job.max_step
        if named is not None and job.last_phase_step.get(phase_kind) == named:
            return  # the end line of a phase already closed (by progress, or another rank's end line)
        # Seen only at its end: the phase filled the silence since the last progress.
        if start_of_silence is not None and t > start_of_silence:
            self._note_duration(job, phase_kind, t - start_of_silence)
        self._note_phase_step(job, phase_kind)
        if named is not None:
            job.last_phase_step[phase_kind] = named

    def _on_progress(
        self,
        job: _Job,
        skey: str,
        stream: _Stream,
        t: float,
        step: int | None,
        epoch: int | None,
        total: int | None,
        line: str,
    ) -> bool:
        """A progress line; True when it counted as a training step."""
        position = None if step is None else (step if epoch is None else epoch * EPOCH_SCALE + step)
        if job.mode is _Mode.DONE:
            if position is None or job.max_step is None or position <= job.max_step:
                return False  # a final evaluation bar; liveness is already counted
            job.mode = _Mode.TRAINING  # a new training stage continues past the previous end
        elif job.mode is _Mode.STARTUP:
            job.mode = _Mode.TRAINING
        job.evidence = line
        real = True
        phase = job.phase
        if phase is not None:
            other_bar = job.train_total is not None and total is not None and total != job.train_total
            if position is not None and phase.baseline is not None:
                closes = position > phase.baseline and not other_bar
            elif position is not None:
                closes = phase.kind == _CHECKPOINT
            else:
                # No step number: only the stream that opened the phase is ordered with it.
                closes = phase.kind == _CHECKPOINT and phase.opener == skey
            if closes:
                self._close_phase(job, t)
            else:
                real = False
        if real and position is not None:
            other_bar = job.train_total is not None and total is not None and total != job.train_total
            if other_bar or (job.max_step is not None and position < job.max_step):
                # Another bar (an evaluation without a start line) or a step going backwards: a sign
                # of life, not a step, unless it persists: a counter restarted in place after three
                # such lines, a bar of another length after longer than a checkpoint may take.
                if job.odd_streak == 0:
                    job.odd_since = t
                job.odd_streak += 1
                if job.odd_streak >= 3 and (not other_bar or t - job.odd_since >= self.settings.phase_floor_s):
                    job.odd_streak = 0
                    job.train_total = total
                    job.max_step = position
                    job.max_step_parts = (step, epoch, total)
                    stream.tainted = True
                else:
                    real = False
            else:
                job.odd_streak = 0
            if real and job.train_total is None and total is not None:
                job.train_total = total

        if stream.last_progress is None or t > stream.last_progress:
            stream.last_progress = t
        if job.anchor is None or t > job.anchor:
            job.anchor = t
        order = job.order
        order[skey] = None
        order.move_to_end(skey)
        job.fired = False
        if job.lone_reported:
            job.lone_reported.discard(skey)
        if not real:
            stream.tainted = True
            return False
        previous = stream.last_step_t
        if previous is not None and t > previous and not stream.tainted and job.phase_mark < previous:
            gap = t - previous
            if position is not None and job.max_step is not None and position > job.max_step:
                self._note_pause(job, gap, epoch)
            job.intervals.append(gap)
            job.median_dirty = True
        if previous is None or t >= previous:
            stream.last_step_t = t
        stream.tainted = False
        stream.reports += 1
        if epoch is not None and job.max_step_parts is not None:
            last_step, last_epoch, _total = job.max_step_parts
            if last_epoch is not None and last_step is not None and epoch > last_epoch:
                job.epoch_last = last_step  # the epoch moved on: its last step is known
        if position is not None and (job.max_step is None or position > job.max_step):
            job.max_step = position
            job.max_step_parts = (step, epoch, total)
        return True

    @staticmethod
    def _restart(job: _Job, t: float) -> None:
        """A run's banner: the job loads again (start-up bound), its cadence is learned anew."""
        job.forget_steps()
        job.since = max(job.since, t)
        job.phase_mark = max(job.phase_mark, t)
        job.intervals.clear()
        job.median = None
        job.median_dirty = False
        job.phase_steps.clear()
        job.last_phase_step.clear()
        job.epoch_last = None
        job.epoch_end_step = None
        job.fired = False
        job.lone_reported.clear()
        job.order.clear()
        for stream in job.streams.values():
            stream.last_progress = None
            stream.last_step_t = None
            stream.tainted = False
            stream.reports = 0

    def _close_phase(self, job: _Job, t: float) -> None:
        phase = job.phase
        if phase is None:
            return
        job.phase = None
        if phase.step is not None:
            job.last_phase_step[phase.kind] = phase.step
        if t > phase.start:
            self._note_duration(job, phase.kind, t - phase.start)
        job.phase_mark = max(job.phase_mark, t)

    def _note_pause(self, job: _Job, gap: float, epoch: int | None) -> None:
        """A step gap that began at the job's newest step: learn epoch ends and recurring pauses."""
        parts = job.max_step_parts
        if (parts is not None and epoch is not None and parts[1] is not None and epoch > parts[1]) or (
            self._at_epoch_end(job)
        ):
            # The gap after an epoch's last step: the boundary's pause.
            self._note_duration(job, _EPOCH, gap)
            return
        s = self.settings
        if gap * s.learned_margin <= s.floor_s:
            return  # its learned bound would not exceed the floor
        interval = self._interval(job)
        if interval is not None and gap > s.factor * interval:
            # Longer than the cadence explains and no marker in it: if such pauses recur at a
            # regular step period, the next one due is given their learned length.
            self._note_duration(job, _STALL, gap)
            self._note_phase_step(job, _STALL)

    def _round_step(self, job: _Job) -> bool:
        """An end-only evaluation may begin here: its period is not learned yet, the step is round."""
        step = job.max_step
        if step is None or step <= 0 or step % self.settings.round_steps:
            return False
        return len(job.phase_steps.get(_EVAL, ())) < 3

    @staticmethod
    def _at_epoch_end(job: _Job) -> bool:
        """Whether the job's newest step is the last of an epoch (or of its bar)."""
        if job.epoch_end_step is not None and job.epoch_end_step == job.max_step:
            return True
        parts = job.max_step_parts
        if parts is None:
            return False
        step, epoch, total = parts
        if step is None:
            return False
        if total is not None and step >= total:
            return True
        return epoch is not None and job.epoch_last is not None and step >= job.epoch_last

    def _note_duration(self, job: _Job, kind: str, duration: float) -> None:
        durations = job.durations.get(kind)
        if durations is None:
            durations = job.durations[kind] = deque(maxlen=self.settings.learned_phases)
        durations.append(duration)

    @staticmethod
    def _note_phase_step(job: _Job, kind: str) -> None:
        if job.max_step is None:
            return
        steps = job.phase_steps.get(kind)
        if steps is None:
            steps = job.phase_steps[kind] = deque(maxlen=3)
        if not steps or steps[-1] != job.max_step:
            steps.append(job.max_step)

    # -- internals: checks ----------------------------------------------------------------------

    def _check_silence(self, job: _Job, now: float) -> Finding | None:
        """Start-up, after training, or no marker known: any line is a sign of life."""
        if job.fired:
            return None
        anchor = max(job.last_activity, job.since)
        bound = max(self.settings.startup_floor_s, self.settings.floor_s)
        silence = now - anchor
        if silence <= bound:
            return None
        flat, judged = self._utilization_flat(job, now, anchor, 0.0)
        if not flat:
            return None
        job.fired = True
        stream = min(job.streams.values(), key=lambda s: s.last_activity, default=None)
        scope = "done" if job.mode is _Mode.DONE else "startup"
        return self._finding(
            job,
            scope=scope,
            stream=stream,
            stalled=[stream] if stream else [],
            silence=silence,
            bound=bound,
            interval=self._interval(job),
            phase=None,
            judged=judged,
            anchor=anchor,
            now=now,
        )

    def _check_training(self, job: _Job, now: float) -> list[Finding]:
        assert job.anchor is not None
        interval = self._interval(job)
        base = self._base_bound(interval)
        deadline = job.anchor + base
        bound = base
        phase_kind: str | None = None
        phase = job.phase
        if phase is not None:
            phase_deadline = phase.start + self._phase_bound(job, phase.kind, interval, base)
            if phase_deadline > deadline:
                deadline, bound, phase_kind = phase_deadline, phase_deadline - job.anchor, phase.kind
        else:
            due = self._due_phase(job)
            if due is None and self._at_epoch_end(job):
                due = _EPOCH
            elif due is None and job.end_only and self._round_step(job):
                due = _EVAL
            if due is not None:
                due_bound = self._phase_bound(job, due, interval, base)
                if job.anchor + due_bound > deadline:
                    deadline, bound, phase_kind = job.anchor + due_bound, due_bound, due
        if now > deadline:
            if job.fired:
                return []
            flat, judged = self._utilization_flat(job, now, job.anchor, interval or 0.0)
            if not flat:
                return []
            job.fired = True
            ranked = [job.streams[k] for k in job.order if k in job.streams]
            culprit = ranked[0] if ranked else min(job.streams.values(), key=lambda s: s.last_activity, default=None)
            return [
                self._finding(
                    job,
                    scope="job",
                    stream=culprit,
                    stalled=ranked or ([culprit] if culprit else []),
                    silence=now - job.anchor,
                    bound=bound,
                    interval=interval,
                    phase=phase_kind,
                    judged=judged,
                    anchor=job.anchor,
                    now=now,
                )
            ]
        if job.fired or phase is not None or phase_kind is not None or len(job.order) < 2:
            return []
        return self._check_lone(job, now, interval, max(base, self.settings.rank_floor_s))

    def _check_lone(self, job: _Job, now: float, interval: float | None, base: float) -> list[Finding]:
        newest_key = next(reversed(job.order))
        newest_stream = job.streams.get(newest_key)
        if newest_stream is None or newest_stream.last_progress is None:
            return []
        newest = newest_stream.last_progress
        stalled: list[tuple[str, _Stream]] = []
        forget: list[str] = []
        for skey in job.order:
            stream = job.streams.get(skey)
            if stream is None or stream.last_progress is None:
                forget.append(skey)
                continue
            if stream.last_progress + base >= newest:
                break  # this one and every later one moved recently enough
            if stream.reports < self.settings.min_reports or stream.rank is None:
                forget.append(skey)  # not a regular progress reporter (a bar at load time)
                continue
            if skey in job.lone_reported:
                continue
            stalled.append((skey, stream))
        for skey in forget:
            del job.order[skey]
        if not stalled:
            return []
        # Utilisation is not consulted for one rank: which device a rank drives is not known, and
        # its node's other devices keep working.
        confirmed = stalled
        job.lone_reported.update(k for k, _ in confirmed)
        first = confirmed[0][1]
        assert first.last_progress is not None
        return [
            self._finding(
                job,
                scope="rank",
                stream=first,
                stalled=[s for _, s in confirmed],
                silence=now - first.last_progress,
                bound=base,
                interval=interval,
                phase=None,
                judged=False,
                anchor=first.last_progress,
                now=now,
            )
        ]

    def _utilization_flat(self, job: _Job, now: float, since: float, grace: float) -> tuple[bool, bool]:
        """(flat or unknown, judged): every device series with >= 2 samples in the window is flat.

        The window is the end of the silence: at most `util_window_s` long, and it leaves out the
        first `grace` seconds after the last progress, when the step in flight may still have been
        computing (a hang can start anywhere within the step after the last report).
        """
        s = self.settings
        start = max(since + min(grace, (now - since) / 2), now - s.util_window_s)
        judged = False
        for series in job.util.values():
            values = [v for ts, v in series if start <= ts <= now]
            if len(values) < 2:
                continue
            judged = True
            if statistics.pstdev(values) > s.flat_stddev:
                return False, True
        return True, judged

    # -- internals: the finding -----------------------------------------------------------------

    def _finding(
        self,
        job: _Job,
        *,
        scope: str,
        stream: _Stream | None,
        stalled: Sequence[_Stream],
        silence: float,
        bound: float,
        interval: float | None,
        phase: str | None,
        judged: bool,
        anchor: float,
        now: float,
    ) -> Finding:
        namespace, name = _split_job_key(job.key)
        ranks = [s.rank for s in stalled if s.rank is not None]
        who = (
            f"rank {stream.rank}"
            if stream is not None and stream.rank is not None
            else (f"pod {stream.pod}" if stream is not None and stream.pod else "the job")
        )
        message = _message(scope, who, silence, bound, interval, phase)
        groups: dict[str, str] = {
            "scope": scope,
            "silence_s": f"{silence:.0f}",
            "bound_s": f"{bound:.0f}",
            "utilization": "flat" if judged else "no_samples",
        }
        if interval is not None:
            groups["interval_s"] = f"{interval:.1f}"
        if job.max_step_parts is not None:
            groups["last_step"] = _step_text(*job.max_step_parts)
        if ranks:
            groups["ranks"] = ",".join(str(r) for r in sorted(ranks)[:64])
        if phase:
            groups["phase"] = phase
        evidence = job.evidence or f"no progress for {silence:.0f} s (bound {bound:.0f} s)"
        if len(evidence) > MAX_EVIDENCE_CHARS:
            evidence = evidence[-MAX_EVIDENCE_CHARS:]
        return Finding(
            rule_id=RULE_ID,
            fault_class=FaultClass.HANG,
            chip=job.chip,
            code=CODE,
            source=Source.METRIC if judged else Source.CONTAINER_LOG,
            severity=Severity.WARNING if scope == "rank" else Severity.ERROR,
            text=evidence,
            node=stream.node if stream else None,
            rank=stream.rank if stream else None,
            pod=stream.pod if stream else None,
            namespace=namespace,
            job=name,
            timestamp=anchor,
            message=message,
            hint=_HINT,
            groups=groups,
        )


_HINT = I18nText(
    en=(
        "Dump the Python stacks of the stalled ranks (`py-spy dump --pid <pid>`) to see where they wait; "
        "check the collective-communication library (NCCL/HCCL) for a rank that left or a broken link, "
        "storage for a blocked checkpoint write, and the data loader. Restart from the last checkpoint "
        "if it does not recover."
    ),
    zh=(
        "用 `py-spy dump --pid <pid>` 抓取卡住 rank 的 Python 调用栈，确认卡在何处；检查集合通信（NCCL/HCCL）"
        "是否有 rank 退出或链路故障、存储是否阻塞了检查点写入、数据加载是否停滞。若无法恢复，从最近的检查点重启。"
    ),
)


def _message(scope: str, who: str, silence: float, bound: float, interval: float | None, phase: str | None) -> I18nText:
    s, b = seconds_text(silence), seconds_text(bound)
    if scope == "startup":
        return I18nText(
            en=f"No log output for {s} s and no training step yet: the job looks hung at start-up",
            zh=f"任务已 {s} 秒无日志输出且尚未开始训练，疑似在启动阶段卡死",
        )
    if scope == "done":
        return I18nText(
            en=f"No log output for {s} s after training finished: the job looks stuck in its final save or shutdown",
            zh=f"训练结束后已 {s} 秒无日志输出，疑似卡在最终保存或退出阶段",
        )
    # A pace under 10 ms is a burst of log lines, not a step rate: not worth saying.
    pace = seconds_text(interval) if interval is not None and interval >= 0.01 else None
    pace_en = f" (expected a step every {pace} s)" if pace else ""
    pace_zh = f"（正常每 {pace} 秒一步）" if pace else ""
    if scope == "rank":
        return I18nText(
            en=f"{who.capitalize()} has made no progress for {s} s while other ranks continue{pace_en}: "
            "a stalled or straggling rank",
            zh=f"{who} 已 {s} 秒无进展而其他 rank 仍在推进{pace_zh}，该 rank 疑似卡住或掉队",
        )
    if phase == _CHECKPOINT:
        return I18nText(
            en=f"No training progress for {s} s during a checkpoint save that has not finished "
            f"(allowed {b} s): the job looks hung",
            zh=f"训练已 {s} 秒无进展，检查点保存仍未结束（允许 {b} 秒），任务疑似卡死",
        )
    if phase == _EVAL:
        return I18nText(
            en=f"No training progress for {s} s during an evaluation that has not finished "
            f"(allowed {b} s): the job looks hung",
            zh=f"训练已 {s} 秒无进展，评估仍未结束（允许 {b} 秒），任务疑似卡死",
        )
    if phase == _EPOCH:
        return I18nText(
            en=f"No training progress for {s} s after the last step of an epoch (allowed {b} s){pace_en}: "
            "the job looks hung at the epoch boundary (data loader, sampler or evaluation)",
            zh=f"训练在一个 epoch 的最后一步之后已 {s} 秒无进展（允许 {b} 秒）{pace_zh}，"
            "疑似卡在 epoch 切换处（数据加载、采样或评估）",
        )
    return I18nText(
        en=f"No training progress for {s} s{pace_en}: the job looks hung",
        zh=f"训练已 {s} 秒无进展{pace_zh}，任务疑似卡死",
    )
