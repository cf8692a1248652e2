"""The hang detector: marker file validation, matcher paths, and day-long replays on a fake clock.

Each framework style generates a healthy 24 h run at test time (steps with jitter, checkpoint
pauses up to 10 x the step time, evaluation phases, tqdm lines with carriage returns, several
ranks, varying utilisation) that is replayed through the detector with a check every few seconds
of fake time: it must stay silent. The same run with a real stall must give exactly one finding,
inside the bound. The batch path is held to the line-by-line reference: the matcher on random,
keyword-dense and large batches, the detector on the generated runs shipped in batches (with and
without per-line times) and on random batches.
"""

from __future__ import annotations

import functools
import math
import os
import random
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainmedic.detectors.hang import (
    EPOCH_SCALE,
    HangDetector,
    HangSettings,
    Marker,
    MarkerHit,
    MarkerKind,
    ProgressMatcher,
    _compile_marker,
    _Compiled,
    load_markers,
    parse_markers,
    shipped_markers,
)
from trainmedic.errors import RuleLoadError
from trainmedic.models import Chip, FaultClass, Finding, Severity, Source

JOB = "job:train/llama"
PERIOD = 5.0  # seconds of fake time between two check() calls
DAY = 24 * 3600.0


def _fast_available() -> bool:
    try:
        import hyperscan  # noqa: F401
    except ImportError:
        return False
    return True


def _require_fast() -> None:
    if not _fast_available():
        if os.environ.get("CI", "").lower() not in ("", "0", "false"):
            pytest.fail("CI is set but the hyperscan module is not importable")
        pytest.skip("hyperscan is not installed")


# ------------------------------------------------------------------------------------------------
# The marker file
# ------------------------------------------------------------------------------------------------

MARKERS = shipped_markers()


@functools.cache
def _matcher(fast: bool) -> ProgressMatcher:
    return ProgressMatcher(MARKERS.markers, fast=fast)


@pytest.mark.parametrize("marker", MARKERS.markers, ids=lambda m: m.id)
@pytest.mark.parametrize("fast", [False, True], ids=["re", "hyperscan"])
def test_shipped_marker_examples(marker: object, fast: bool) -> None:
    from trainmedic.detectors.hang import Marker

    assert isinstance(marker, Marker)
    if fast:
        _require_fast()
    matcher = _matcher(fast)
    assert len(marker.source) > 20 and marker.framework
    for ex in marker.examples:
        hits = [h for _, _, hs in matcher.scan(ex.line.split("\n")) for h in hs if h.marker_id == marker.id]
        assert hits, f"{marker.id}: example not matched: {ex.line!r}"
        if ex.step is not None:
            assert hits[0].step == ex.step
        if ex.epoch is not None:
            assert hits[0].epoch == ex.epoch
    for neg in marker.no_match:
        assert not [h for _, _, hs in matcher.scan([neg]) for h in hs if h.marker_id == marker.id]


def test_shipped_markers_cover_the_frameworks() -> None:
    by_framework: dict[str, set[MarkerKind]] = {}
    for m in MARKERS.markers:
        by_framework.setdefault(m.framework, set()).add(m.kind)
    for fw in ("transformers", "megatron", "deepspeed", "mindspore", "mindformers", "verl", "lightning", "generic"):
        assert MarkerKind.PROGRESS in by_framework[fw], fw
    for fw in ("transformers", "megatron", "deepspeed", "mindformers", "verl", "lightning", "nanogpt"):
        assert MarkerKind.CHECKPOINT_START in by_framework[fw] or MarkerKind.CHECKPOINT_END in by_framework[fw], fw


_VALID = """\
version: 1
markers:
  - id: x.step
    kind: progress
    framework: x
    source: 'somewhere/train.py, print(f"step {n}")'
    keywords: ['step ']
    pattern: '\\bstep (?P<step>\\d+)\\b'
    examples:
      - line: 'step 12 done'
        step: 12
"""


@pytest.mark.parametrize(
    ("edit", "message", "line"),
    [
        pytest.param(("kind: progress", "kind: progres"), "kind", 4, id="bad-kind"),
        pytest.param(("    keywords:", "    colour: red\n    keywords:"), "unknown key", 7, id="unknown-key"),
        pytest.param(("(?P<step>\\d+)\\b'", "(?P<step>\\d+\\b'"), "invalid regex", 8, id="bad-regex"),
        pytest.param(("(?P<step>", "(?P<rank>"), "not allowed", 8, id="bad-group"),
        pytest.param(("step: 12", "step: 13"), "gives step 12, expected 13", 3, id="wrong-step"),
        pytest.param(("'step 12 done'", "'stop 12'"), "example does not match", 3, id="no-match"),
        pytest.param(("        step: 12\n", "        step: 12\n    no_match: ['step 3']\n"), "no_match", 3, id="neg"),
        pytest.param(("version: 1", "version: 2"), "version", 1, id="version"),
        pytest.param(("  - id: x.step", "  - id: X Step"), "id", 3, id="bad-id"),
        pytest.param(("markers:", "markers: [\n"), "YAML syntax", None, id="yaml-syntax"),
    ],
)
def test_marker_file_errors_name_file_and_line(
    tmp_path: Path, edit: tuple[str, str], message: str, line: int | None
) -> None:
    old, new = edit
    assert old in _VALID
    path = tmp_path / "progress.yaml"
    path.write_text(_VALID.replace(old, new, 1), encoding="utf-8")
    with pytest.raises(RuleLoadError) as info:
        load_markers(path)
    problems = [p for p in info.value.problems if not p.warning]
    assert problems
    assert any(message in p.message for p in problems), [str(p) for p in problems]
    if line is not None:
        assert any(p.line == line for p in problems if message in p.message), [str(p) for p in problems]
    assert str(path) in str(problems[0])


def test_marker_file_duplicate_id_and_shadowed_example() -> None:
    text = _VALID + _VALID.split("markers:\n", 1)[1]
    _, problems = parse_markers(text, "dup.yaml")
    assert any("duplicate id" in p.message for p in problems)
    shadow = _VALID + _VALID.split("markers:\n", 1)[1].replace("x.step", "x.step2")
    _, problems = parse_markers(shadow, "shadow.yaml")
    assert any("taken by x.step" in p.message for p in problems), [str(p) for p in problems]


@pytest.mark.parametrize(
    "content",
    [b"", b"\xff\xfe\x00binary", b"- just a list", b"version: 1\nmarkers: []\n"],
    ids=["empty", "binary", "list", "no-markers"],
)
def test_unusable_marker_file(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "m.yaml"
    path.write_bytes(content)
    with pytest.raises(RuleLoadError):
        load_markers(path)


_FRAGMENTS = [
    "  12%|█▏        | 120/1000 [02:00<14:40,  1.00s/it]",
    "\r 13%|█▎        | 130/1000 [02:10<14:30,  1.00s/it]",
    "Loading checkpoint shards:  50%|#####     | 1/2 [00:00<00:00,  5.83it/s]",
    " iteration      100/  500000 | consumed samples: 6400 |",
    "saving checkpoint at iteration     500 to /ckpt",
    "  successfully saved checkpoint from iteration     500 to /ckpt",
    " validation loss at iteration 500 | lm loss value: 1.0 |",
    "[Rank 0] step=10, skipped=0, lr=[0.1], mom=[(0.9, 0.999)]",
    "[Torch] Checkpoint global_step10 is about to be saved!",
    "{'loss': 1.2, 'epoch': 0.5}",
    "{'eval_loss': 1.0}",
    "***** Running Evaluation *****",
    "step:12 - actor/pg_loss:0.1 - val-core/x:1.0",
    "Epoch 2:  50%|█████     | 50/100 [00:10<00:10,  5.00it/s]",
    "iter 100: loss 2.75, time 30.1ms",
    "\x1b[31mstep:  1  \x1b[32mloss: 12.25",
    "NCCL INFO Channel 01 : 2[1040] -> 0[1020] via SHM",
    "warning: last step was slow",
    "épsilon ✓ 中文 \ud800 surrogate",
    "\r",
    "",
]


@pytest.mark.skipif(not _fast_available(), reason="hyperscan is not installed")
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.lists(st.sampled_from(_FRAGMENTS) | st.text(max_size=30), max_size=4).map("".join),
        min_size=1,
        max_size=12,
    )
)
def test_fast_path_equals_re_path(lines: list[str]) -> None:
    assert _matcher(True).scan(lines) == _matcher(False).scan(lines)


# Fragments that exercise the batch path's edge cases: a keyword that only appears once colours
# are stripped, newlines inside a batch line, keywords overlapping each other.
_EDGE_FRAGMENTS = [
    "\x1b[1mste\x1b[0mp 3 loss 2",
    "\x1b[1;3Step 4 loss",
    "\n",
    "Epoch - val",
    "stepstep=5, skipped=1",
    "trainer:train_step:12 - step 7 loss=1.0",
    " iteration 5/10 | x | per iteration (ms) | skipped iterations: 0 |",
    "step:3 - actor/x:1 - val-core/y:2",
    "ſtep 9 loss",
    "STEP 10 LOSS",
]

_BATCH_LINES = st.lists(
    st.lists(st.sampled_from(_FRAGMENTS + _EDGE_FRAGMENTS) | st.text(max_size=20), max_size=5).map("".join),
    min_size=1,
    max_size=12,
)


def _line_by_line(matcher: ProgressMatcher, lines: list[str]) -> list[tuple[int, str, list[MarkerHit]]]:
    """The straightforward path: each piece of each line on its own through `match_line`."""
    out: list[tuple[int, str, list[MarkerHit]]] = []
    for index, text in enumerate(lines):
        for piece in text.split("\n"):
            if matcher.has_keyword(piece):
                hits = matcher.match_line(piece)
                if hits:
                    out.append((index, piece, hits))
    return out


@pytest.mark.parametrize("fast", [False, True], ids=["re", "hyperscan"])
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lines=_BATCH_LINES)
def test_batch_scan_equals_line_by_line(fast: bool, lines: list[str]) -> None:
    if fast:
        _require_fast()
    matcher = _matcher(fast)
    assert matcher.scan(lines) == _line_by_line(matcher, lines)


@pytest.mark.parametrize("fast", [False, True], ids=["re", "hyperscan"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_keyword_dense_lines_equal_line_by_line(fast: bool, seed: int) -> None:
    """Lines made of keywords in any order and number (garbage, or a tqdm stream without newlines)."""
    if fast:
        _require_fast()
    rng = random.Random(seed)
    matcher = _matcher(fast)
    words = list(matcher.keywords) + _FRAGMENTS[:14]
    lines = [" ".join(rng.choice(words) for _ in range(rng.choice([3, 40, 400]))) for _ in range(30)]
    assert matcher.scan(lines) == _line_by_line(matcher, lines)


# Patterns that take each way `_accelerate` has of running a regex faster, and ways around them.
_TRICKY_PATTERNS = [
    r"\bstep (?P<step>\d+)",  # \b then a literal: rewritten with a literal prefix
    r"\B_x(?P<step>\d)",  # \B before a non-word character
    r"\b-(?P<step>\d+)",  # \b before a non-word character
    r"\bab\b",
    r"(?i)\b(?:global[_ ]?)?(?:step|iter|iteration)\b\s*(?P<step>\d+)",  # a case-insensitive start set
    r"(?:^|[\s)])step:(?P<step>\d+)",  # split, the other alternative a character set
    r".?step:(?P<step>\d)",  # a start literal up to one character in
    r"(?:^|[\r\]]|#015)[ \t]*(?P<step>\d{1,3})%\|",  # split: `^...` at offset 0, `[\r\]]...` searched
    r"(?:\A|x|[ab])c(?P<step>\d)?",
    r"(?:[\r]|^)\s*(?P<step>\d)",  # the start-only alternative is not first: not split
    r"(?:^|\]:)\s*saving",
    r"x?y?(?P<step>\d)z",
    r"\bab|cd\b",
    r"(?<=a)b+",
    r"st(?=e)",
]
_TRICKY_TEXT = st.text(alphabet="stepSTEPiterITERglobal_abcdnvxyz -:)\r]%|#0123456789\nſKİ\u212a", max_size=40)


@functools.cache
def _tricky(pattern: str, kind: MarkerKind) -> _Compiled:
    marker = Marker(
        id="t.tricky",
        kind=kind,
        framework="tests",
        source="tests/detectors/test_hang.py, _TRICKY_PATTERNS",
        keywords=["xx"],
        pattern=pattern,
        examples=[{"line": "step 1 ab cd x1z"}],
    )
    return _compile_marker(0, marker, re.compile(pattern), ())


@pytest.mark.parametrize(
    ("pattern", "how"),
    [
        (r"\bstep (?P<step>\d+)", "prefixed"),
        (r"\B_x(?P<step>\d)", "prefixed"),
        (r"(?i)\b(?:global[_ ]?)?(?:step|iter|iteration)\b\s*(?P<step>\d+)", "starts"),
        (r"(?:^|[\s)])step:(?P<step>\d+)", "split"),
        (r".?step:(?P<step>\d)", "starts"),
        (r"(?:^|[\r\]]|#015)[ \t]*(?P<step>\d{1,3})%\|", "split"),
        (r"(?:[\r]|^)\s*(?P<step>\d)", "plain"),
        (r"(?:^|\]:)\s*saving", "split"),
    ],
)
def test_how_a_pattern_is_accelerated(pattern: str, how: str) -> None:
    spec = _tricky(pattern, MarkerKind.PROGRESS)
    got = "split" if spec.head is not None else "prefixed" if spec.prefixed else "starts" if spec.starts else "plain"
    assert got == how


@pytest.mark.parametrize("kind", [MarkerKind.PROGRESS, MarkerKind.CHECKPOINT_START], ids=["last", "first"])
@pytest.mark.parametrize("pattern", _TRICKY_PATTERNS)
@settings(max_examples=100, deadline=None)
@given(text=st.lists(_TRICKY_TEXT | st.sampled_from(_EDGE_FRAGMENTS), max_size=4).map("".join))
def test_accelerated_regex_finds_what_the_pattern_finds(pattern: str, kind: MarkerKind, text: str) -> None:
    spec = _tricky(pattern, kind)
    rx = re.compile(pattern)
    want: re.Match[str] | None = None
    if kind is MarkerKind.PROGRESS:
        for want in rx.finditer(text):  # noqa: B007
            pass
    else:
        want = rx.search(text)
    got = spec.find(text)
    assert (got and (got.span(), got.groups())) == (want and (want.span(), want.groups()))


def test_scan_reports_line_index_and_epoch_scale() -> None:
    lines = ["noise", "noise step", "Epoch 3: 100%|██████████| 57/57 [00:20<00:00, 2.85it/s]", "x"]
    ((index, line, hits),) = MARKERS.matcher.scan(lines)
    assert index == 2 and line == lines[2]
    assert hits[0].position == 3 * EPOCH_SCALE + 57
    assert hits[0].step_text == "epoch 3 step 57/57"


# ------------------------------------------------------------------------------------------------
# A fake-clock replay harness
# ------------------------------------------------------------------------------------------------


@dataclass(order=True)
class Ev:
    t: float
    seq: int
    kind: str = field(compare=False)
    args: tuple[object, ...] = field(compare=False)


@dataclass
class Run:
    """A generated run: its events, and what the generator knows about it."""

    events: list[Ev] = field(default_factory=list)
    end: float = DAY
    interval: float = 0.0  # nominal seconds between two progress reports
    last_progress: float = 0.0  # time of the last marker line before a stall
    stall_at: float | None = None
    ckpt_start: float | None = None  # the unfinished checkpoint's start, for that scenario
    max_pause: float = 0.0  # the longest checkpoint pause of the run
    lone_rank: int | None = None
    seq: int = 0

    def add(self, t: float, kind: str, *args: object) -> None:
        self.seq += 1
        self.events.append(Ev(t, self.seq, kind, args))

    def lines(self, t: float, rank: int | None, text: str | list[str], *, marker: bool = False) -> None:
        self.add(t, "lines", rank, [text] if isinstance(text, str) else text)
        if marker:
            self.last_progress = max(self.last_progress, t)


def replay(det: HangDetector, run: Run, *, until: float | None = None) -> list[tuple[float, Finding]]:
    """Feed the events in time order, calling check() every PERIOD seconds of fake time."""
    out: list[tuple[float, Finding]] = []
    next_check = PERIOD
    end = run.end if until is None else until
    for ev in sorted(run.events):
        if ev.t > end:
            break
        while next_check <= ev.t:
            out.extend((next_check, f) for f in det.check(next_check))
            next_check += PERIOD
        if ev.kind in ("lines", "batch"):
            rank, lines, *more = ev.args
            assert isinstance(lines, list)
            times = more[0] if more else None
            assert times is None or isinstance(times, list)
            r = rank if isinstance(rank, int) else None
            pod = f"llama-worker-{r}" if r is not None else "llama-driver"
            det.observe_lines(JOB, r, pod, f"node-{(r or 0) // 8}", ev.t, lines, times=times)
        elif ev.kind == "util":
            unode, device, value = ev.args
            assert isinstance(unode, str) and isinstance(device, str) and isinstance(value, float)
            det.observe_utilization(JOB, unode, device, ev.t, value)
        elif ev.kind == "job":
            (running,) = ev.args
            det.observe_job(JOB, bool(running), ev.t)
    while next_check <= end:
        out.extend((next_check, f) for f in det.check(next_check))
        next_check += PERIOD
    return out


# ------------------------------------------------------------------------------------------------
# Framework styles
# ------------------------------------------------------------------------------------------------


def _bar(step: int, total: int) -> str:
    pct = min(100, step * 100 // max(total, 1))
    filled = pct // 10
    return f"{pct:3d}%|{'█' * filled}{' ' * (10 - filled)}| {step}/{total} [01:00<02:00,  1.00s/it]"


@dataclass
class Style:
    name: str
    step_s: float
    log_every: int  # steps per progress report
    progress_ranks: tuple[int | None, ...]
    marker_ranks: tuple[int | None, ...]
    ckpt_every: int
    eval_every: int
    eval_s: tuple[float, float]
    progress: Callable[[int, int, random.Random], list[str]]
    ckpt_start: Callable[[int], str] | None = None
    ckpt_end: Callable[[int, float], str] | None = None
    eval_start: Callable[[int], str] | None = None
    eval_progress: Callable[[int, int], str] | None = None
    eval_end: Callable[[int], str] | None = None
    # veRL: the validation shows in the step's own line, printed after it.
    eval_in_step_line: bool = False
    world: int = 8

    @property
    def total(self) -> int:
        return int(DAY / self.step_s) + 1000


def _hf_progress(step: int, total: int, rng: random.Random) -> list[str]:
    chunk = "".join("\r" + _bar(s, total) for s in range(step - 9, step + 1))
    out = [chunk]
    if step % 50 == 0:
        out.append(f"{{'loss': {rng.uniform(0.5, 2):.4f}, 'grad_norm': 1.2, 'learning_rate': 4.9e-05, 'epoch': 0.5}}")
    return out


def _lightning_progress(step: int, total: int, rng: random.Random) -> list[str]:
    per_epoch = 2000
    epoch, n = divmod(step - 1, per_epoch)
    updates = [
        f"\rEpoch {epoch}: {_bar(k, per_epoch)[:-1]}, v_num=0, loss={rng.uniform(0.5, 2):.3f}]"
        for k in range(max(1, n + 1 - 39), n + 2)
    ]
    return ["".join(updates)]


STYLES: dict[str, Style] = {
    "hf_trainer": Style(
        name="hf_trainer",
        step_s=2.0,
        log_every=10,
        progress_ranks=(0,),
        marker_ranks=(0,),
        ckpt_every=500,
        eval_every=1000,
        eval_s=(60.0, 160.0),
        progress=_hf_progress,
        ckpt_start=lambda s: (
            f"[INFO|trainer.py:3478] 2024-08-13 05:24:45,906 >> Saving model checkpoint to /out/checkpoint-{s}"
        ),
        eval_start=lambda s: "[INFO|trainer.py:3719] 2024-08-13 05:24:45,906 >> ***** Running Evaluation *****",
        eval_progress=lambda i, n: "\r" + _bar(i, n),
        eval_end=lambda s: "{'eval_loss': 0.4218, 'eval_runtime': 12.3, 'epoch': 0.5}",
    ),
    "megatron": Style(
        name="megatron",
        step_s=4.0,
        log_every=10,
        progress_ranks=(7,),
        marker_ranks=(0,),
        ckpt_every=500,
        eval_every=1000,
        eval_s=(20.0, 60.0),
        progress=lambda s, total, rng: [
            f" [2024-04-09 19:15:44] iteration {s:8d}/{total:8d} | consumed samples: {s * 64:12d} | "
            f"elapsed time per iteration (ms): {rng.uniform(3800, 4200):.1f} | lm loss: 4.110266E-01 |"
        ],
        ckpt_start=lambda s: f"saving checkpoint at iteration {s:7d} to /ckpt in torch_dist format",
        ckpt_end=lambda s, secs: f"  successfully saved checkpoint from iteration {s:7d} to /ckpt",
        eval_end=lambda s: f" validation loss at iteration {s} | lm loss value: 5.741563E+00 | lm loss PPL: 3.1E+02 | ",
    ),
    "deepspeed": Style(
        name="deepspeed",
        step_s=3.0,
        log_every=10,
        progress_ranks=(0,),
        marker_ranks=(0,),
        ckpt_every=400,
        eval_every=0,
        eval_s=(0.0, 0.0),
        progress=lambda s, total, rng: [
            f"[2023-07-24 13:21:33,260] [INFO] [logging.py:96:log_dist] [Rank 0] step={s}, skipped=0, "
            "lr=[0.0001], mom=[(0.9, 0.999)]",
            f"[2023-07-24 13:21:33,260] [INFO] [timer.py:215:stop] epoch=0/micro_step={s}/global_step={s}, "
            "RunningAvgSamplesPerSec=199.08, CurrSamplesPerSec=216.75, MemAllocated=0.06GB",
        ],
        ckpt_start=lambda s: (
            f"[2023-07-24 13:21:33,261] [INFO] [logging.py:96:log_dist] [Rank 0] [Torch] Checkpoint global_step{s} "
            "is about to be saved!"
        ),
        ckpt_end=lambda s, secs: (
            f"[2023-07-24 13:21:33,440] [INFO] [torch_checkpoint_engine.py:33:commit] [Torch] Checkpoint "
            f"global_step{s} is ready now!"
        ),
    ),
    "mindformers": Style(
        name="mindformers",
        step_s=5.0,
        log_every=1,
        progress_ranks=tuple(range(8)),
        marker_ranks=tuple(range(8)),
        ckpt_every=300,
        eval_every=0,
        eval_s=(0.0, 0.0),
        progress=lambda s, total, rng: [
            f"2025-04-07 15:34:27,308 - [mindformers/core/callback/callback.py:529] - INFO - "
            f"{{ Epoch:[{(s - 1) // 5000 + 1:3d}/ 99], step:[{(s - 1) % 5000 + 1:5d}/ 5000], "
            f"loss: {rng.uniform(1, 3):5.3f}, per_step_time: 5000ms, lr: 1e-05, overflow cond: False, loss_scale: 1.0"
        ],
        ckpt_start=lambda s: (
            "2025-04-07 15:40:02,110 - [mindformers/core/callback/callback.py:1801] - INFO - ......Saving ckpt......"
        ),
        ckpt_end=lambda s, secs: (
            "2025-04-07 15:40:14,502 - [mindformers/core/callback/callback.py:1760] - INFO - "
            f"Finish saving ckpt of epoch {(s - 1) // 5000 + 1} step {(s - 1) % 5000 + 1} using {secs:.3f} seconds"
        ),
    ),
    "verl": Style(
        name="verl",
        step_s=90.0,
        log_every=1,
        progress_ranks=(None,),
        marker_ranks=(None,),
        ckpt_every=20,
        eval_every=10,
        eval_s=(30.0, 120.0),
        progress=lambda s, total, rng: [
            f"(TaskRunner pid=2351) step:{s} - actor/entropy:{rng.uniform(0.3, 0.6):.3f} - actor/pg_loss:0.013 - "
            "timing_s/step:90.000"
        ],
        ckpt_start=lambda s: f"(TaskRunner pid=2351) local_global_step_folder: checkpoints/verl/gsm8k/global_step_{s}",
        eval_in_step_line=True,
        world=1,
    ),
    "lightning": Style(
        name="lightning",
        step_s=0.5,
        log_every=40,
        progress_ranks=(0,),
        marker_ranks=(0,),
        ckpt_every=2000,
        eval_every=2000,
        eval_s=(40.0, 90.0),
        progress=_lightning_progress,
        ckpt_start=lambda s: (
            f"Epoch {(s - 1) // 2000}, global step {s}: 'val_loss' reached 0.12345 (best 0.12345), saving model to "
            f"'/ckpt/epoch={(s - 1) // 2000}-step={s}.ckpt' as top 1"
        ),
        eval_progress=lambda i, n: "\rValidation DataLoader 0: " + _bar(i, n),
    ),
    "nanogpt": Style(
        name="nanogpt",
        step_s=10.0,
        log_every=1,
        progress_ranks=(0,),
        marker_ranks=(0,),
        ckpt_every=250,
        eval_every=250,
        eval_s=(10.0, 30.0),
        progress=lambda s, total, rng: [
            f"iter {s}: loss {rng.uniform(1, 3):.4f}, time {rng.uniform(9000, 11000):.2f}ms, mfu 31.20%"
        ],
        ckpt_start=lambda s: "saving checkpoint to out-owt",
        eval_end=lambda s: f"step {s}: train loss 2.8123, val loss 2.8571",
    ),
}

_NOISE = [
    "ins-7df6eojsifuykig9:3018453:3024011 [2] NCCL INFO Channel 01 : 2[1040] -> 0[1020] via SHM/direct/direct",
    "/usr/lib/python3.10/site-packages/torch/nn/modules/module.py:1432: UserWarning: Positional args are deprecated",
    "2023-03-20 20:38:19,874] [WARNING] [stage3.py:1939:step] 13 pytorch allocator cache flushes since last step.",
    "Loading checkpoint shards: 100%|##########| 4/4 [00:09<00:00,  2.40s/it]",
]


def generate(
    style: Style,
    *,
    seed: int,
    hours: float = 24.0,
    stall: str | None = None,
    step_s: float | None = None,
    step_change: tuple[float, float] | None = None,
    stall_steps: tuple[int, int] | None = None,
) -> Run:
    """A healthy run; `stall`: None | "all" | "rank" | "checkpoint" (a save that never ends)."""
    rng = random.Random(seed)
    run = Run(end=hours * 3600.0)
    base_step = step_s or style.step_s
    run.interval = base_step * style.log_every
    run.add(0.0, "job", True)
    devices = [(f"node-{n}", str(d)) for n in range(max(1, style.world // 8)) for d in range(min(8, style.world))]
    # Start-up: every rank loads the model (bars with a description), NCCL chatter.
    for r in range(style.world):
        rank = r if style.progress_ranks != (None,) else None
        for k in range(3):
            run.lines(5.0 + 30 * k + rng.uniform(0, 5), rank, _NOISE[3 if k == 1 else 0])
    t = 120.0
    phases: list[tuple[float, float, str]] = []  # (start, end, kind) for utilisation
    total = style.total
    stall_step: int | None = None
    stall_kind = stall
    if stall is not None:
        lo = int(2 * 3600 / base_step)
        hi = int((hours - 2) * 3600 / (base_step * 1.6))  # pauses make the run slower than its step
        if stall_steps is not None:
            lo, hi = stall_steps
        while True:
            cand = rng.randrange(lo, hi)
            cand -= cand % style.log_every
            near = [p for p in (style.ckpt_every, style.eval_every) if p]
            if stall == "checkpoint":
                cand -= cand % style.ckpt_every
                break
            if all(abs(cand - (cand // p) * p) > 2 * style.log_every and (cand // p + 1) * p - cand > 2 for p in near):
                break
        stall_step = cand
    lone_rank = 3 if stall == "rank" else None
    run.lone_rank = lone_rank
    step = 0
    while t < run.end:
        step += 1
        cur = base_step
        if step_change is not None and t > step_change[0]:
            cur = step_change[1]
        dt = cur * rng.uniform(0.9, 1.1)
        val_here = style.eval_in_step_line and style.eval_every and step % style.eval_every == 0
        save_here = style.ckpt_every and step % style.ckpt_every == 0
        if val_here:
            # veRL: validation and the save run inside the step, before its line is printed.
            dt += rng.uniform(*style.eval_s)
        if save_here and style.eval_in_step_line and style.ckpt_start is not None:
            pause = rng.uniform(2.0, 10.0) * cur
            run.lines(t + dt, None, style.ckpt_start(step), marker=True)
            if stall_kind == "checkpoint" and step == stall_step:
                run.ckpt_start = t + dt
                run.stall_at = t + dt + 1.0
                break
            phases.append((t + dt, t + dt + pause, "ckpt"))
            run.max_pause = max(run.max_pause, pause)
            dt += pause
        t += dt
        if t >= run.end:
            break
        rank_t: dict[int | None, float] = {}  # a rank's own lines stay in order
        if step % style.log_every == 0:
            for rank in style.progress_ranks:
                if rank is not None and rank == lone_rank and stall_step is not None and step > stall_step:
                    continue
                skew = 0.0 if rank is None else rng.uniform(0, 0.5)
                lines = style.progress(step, total, rng)
                if val_here:
                    lines = [lines[0].replace(" - timing_s", " - val-core/openai/gsm8k/reward/mean@1:0.734 - timing_s")]
                run.lines(t + skew, rank, lines, marker=True)
                rank_t[rank] = t + skew
        if rng.random() < cur / 30.0:
            run.lines(t + rng.uniform(0, 1), rng.randrange(style.world) if style.world > 1 else None, _NOISE[2])
        if stall_step is not None and step == stall_step and stall_kind == "all":
            run.stall_at = t + 1.0
            break
        if style.eval_every and step % style.eval_every == 0 and not style.eval_in_step_line:
            t += 0.2
            e_len = rng.uniform(*style.eval_s)
            for rank in style.marker_ranks:
                if style.eval_start is not None:
                    run.lines(max(t, rank_t.get(rank, 0.0) + 0.01), rank, style.eval_start(step), marker=True)
            if style.eval_progress is not None:
                n = 100
                k = 0
                while (k + 1) * 10.0 < e_len:
                    k += 1
                    run.lines(t + k * 10.0, style.marker_ranks[0], style.eval_progress(min(n, k * 7), n), marker=True)
            phases.append((t, t + e_len, "eval"))
            t += e_len
            if style.eval_end is not None:
                for rank in (style.progress_ranks[-1],):
                    run.lines(t, rank, style.eval_end(step), marker=True)
        if save_here and not style.eval_in_step_line and style.ckpt_start is not None:
            t += 0.1
            pause = rng.uniform(2.0, 10.0) * cur
            for rank in style.marker_ranks:
                at = max(t + (0 if rank is None else rng.uniform(0, 0.3)), rank_t.get(rank, 0.0) + 0.01)
                run.lines(at, rank, style.ckpt_start(step), marker=True)
            if stall_kind == "checkpoint" and step == stall_step:
                run.ckpt_start = t
                run.stall_at = t + 1.0
                break
            phases.append((t, t + pause, "ckpt"))
            run.max_pause = max(run.max_pause, pause)
            t += pause
            if style.ckpt_end is not None:
                for rank in style.marker_ranks:
                    end_t = t + (0 if rank is None else rng.uniform(0, 0.3))
                    run.lines(end_t, rank, style.ckpt_end(step, pause), marker=True)
                t += 0.3
    # Utilisation: varying while training and evaluating, flat and low while saving; after a stall,
    # flat (a spinning collective shows a steady 100 %).
    stop = run.stall_at if run.stall_at is not None and stall_kind != "rank" else run.end
    ts = 0.0
    pi = 0
    phases.sort()
    while ts < run.end:
        while pi < len(phases) and phases[pi][1] < ts:
            pi += 1
        saving = pi < len(phases) and phases[pi][0] <= ts <= phases[pi][1] and phases[pi][2] == "ckpt"
        for node, dev in devices:
            if ts >= stop:
                value = 100.0
            elif saving:
                value = 1.0
            else:
                value = rng.uniform(55.0, 100.0)
            run.add(ts, "util", node, dev, value)
        ts += 15.0
    return run


def _settings(**kw: float) -> HangSettings:
    # The median and 3 intervals: these replays check the cadence logic against exact bounds (the
    # shipped defaults are checked in tests/detectors/test_hang_replay.py).
    base: dict[str, float] = {
        "floor_s": 60.0,
        "factor": 3.0,
        "interval_quantile": 0.5,
        "startup_floor_s": 900.0,
        "phase_floor_s": 120.0,
    }
    base.update(kw)
    return HangSettings(**base)  # type: ignore[arg-type]


def _detector(*, reference: bool = False, **kw: float) -> HangDetector:
    s = _settings(**kw)
    return HangDetector(s.floor_s, s.factor, settings=s, reference=reference)


STYLE_IDS = list(STYLES)


# ------------------------------------------------------------------------------------------------
# 24 h replays
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("style", STYLE_IDS)
def test_healthy_day_has_no_finding(style: str) -> None:
    run = generate(STYLES[style], seed=11)
    det = _detector()
    found = replay(det, run)
    assert found == [], [(t, f.message.en if f.message else "") for t, f in found]
    assert run.max_pause >= 8 * STYLES[style].step_s  # the run did have long checkpoint pauses


@pytest.mark.parametrize("style", STYLE_IDS)
@pytest.mark.parametrize("seed", [3, 4])
def test_stall_fires_once_within_the_bound(style: str, seed: int) -> None:
    sty = STYLES[style]
    run = generate(sty, seed=seed, stall="all")
    assert run.stall_at is not None
    det = _detector()
    found = replay(det, run)
    assert len(found) == 1, [(t, f.message.en if f.message else "") for t, f in found]
    at, finding = found[0]
    silence = at - run.last_progress
    lo = max(3 * run.interval * 0.9, 60.0)
    hi = max(3 * run.interval * 1.1, 60.0) + PERIOD
    assert lo < silence <= hi, (silence, lo, hi)
    interval = float(finding.groups["interval_s"])
    assert run.interval * 0.85 <= interval <= run.interval * 1.15
    # Exactly the detector's own bound (interval_s is rounded to 0.1 s), at the first check after it.
    bound = max(3 * interval, 60.0)
    assert bound - 0.15 < silence <= bound + 0.15 + PERIOD
    assert finding.timestamp == pytest.approx(run.last_progress)
    assert finding.groups["scope"] == "job"
    assert finding.severity is Severity.ERROR
    assert finding.source is Source.METRIC  # the utilisation was sampled, and flat
    assert finding.groups["utilization"] == "flat"


@pytest.mark.parametrize("style", ["hf_trainer", "megatron", "deepspeed", "mindformers", "verl", "nanogpt"])
def test_stall_in_a_checkpoint_that_never_finishes(style: str) -> None:
    sty = STYLES[style]
    run = generate(sty, seed=5, stall="checkpoint")
    assert run.ckpt_start is not None
    det = _detector()
    found = replay(det, run)
    assert len(found) == 1, [(t, f.message.en if f.message else "") for t, f in found]
    at, finding = found[0]
    assert finding.groups.get("phase") == "checkpoint"
    assert "checkpoint" in (finding.message.en if finding.message else "")
    since_start = at - run.ckpt_start
    interval = run.interval
    lo = max(20 * interval * 0.9, 120.0)
    hi = max(20 * interval * 1.1, 120.0, 1.5 * (run.max_pause + 1.2 * interval)) + PERIOD + 1.0
    assert lo < since_start <= hi, (since_start, lo, hi)


def test_single_silent_rank_is_reported_alone() -> None:
    sty = STYLES["mindformers"]
    run = generate(sty, seed=7, stall="rank", hours=8)
    det = _detector()
    found = replay(det, run)
    assert len(found) == 1, [(t, f.message.en if f.message else "") for t, f in found]
    _, finding = found[0]
    assert finding.rank == 3 and finding.pod == "llama-worker-3"
    assert finding.groups["scope"] == "rank" and finding.groups["ranks"] == "3"
    assert finding.severity is Severity.WARNING
    assert finding.message is not None and "other ranks continue" in finding.message.en


def test_step_time_change_is_learned() -> None:
    sty = STYLES["nanogpt"]
    # 20 s steps for 10 h (1800 steps), then 40 s steps (2x, within the 3x factor).
    change = (10 * 3600.0, 40.0)
    healthy = generate(sty, seed=8, step_s=20.0, step_change=change)
    assert replay(_detector(), healthy) == []
    # A stall 3 to 8 hours after the change: the bound follows the new pace.
    run = generate(sty, seed=8, step_s=20.0, step_change=change, stall="all", stall_steps=(1800 + 270, 1800 + 720))
    assert run.stall_at is not None and run.stall_at > change[0] + 2 * 3600
    found = replay(_detector(), run)
    assert len(found) == 1
    at, finding = found[0]
    assert 36.0 <= float(finding.groups["interval_s"]) <= 44.0
    assert 3 * 36.0 < at - run.last_progress <= 3 * 44.0 + PERIOD


# ------------------------------------------------------------------------------------------------
# Focused scenarios
# ------------------------------------------------------------------------------------------------


def _steps(det: HangDetector, t0: float, n: int, every: float, *, rank: int | None = 0, start: int = 1) -> float:
    t = t0
    for i in range(n):
        t = t0 + i * every
        det.observe_lines(JOB, rank, f"llama-worker-{rank}", "node-0", t, [f"iter {start + i}: loss 2.0, time 1ms"])
    return t


def _run_checks(det: HangDetector, start: float, end: float) -> list[tuple[float, Finding]]:
    out: list[tuple[float, Finding]] = []
    t = start
    while t <= end:
        out.extend((t, f) for f in det.check(t))
        t += PERIOD
    return out


def test_varying_utilisation_without_logs_does_not_fire_until_flat() -> None:
    det = _detector()
    det.observe_job(JOB, True, 0.0)
    last = _steps(det, 10.0, 200, 30.0)
    rng = random.Random(1)
    # Logs stop; the devices keep working (an unlogged evaluation) for 3 hours, then go flat.
    flat_from = last + 3 * 3600
    t = last
    found: list[tuple[float, Finding]] = []
    while t < flat_from + 900 and not found:
        if int(t - last) % 15 == 0:
            for d in range(8):
                value = 100.0 if t >= flat_from else rng.uniform(20.0, 95.0)
                det.observe_utilization(JOB, "node-0", str(d), t, value)
        found = [(t, f) for f in det.check(t)]
        t += PERIOD
    assert len(found) == 1
    at, f = found[0]
    assert at >= flat_from, at - flat_from
    assert at - flat_from <= det.settings.util_window_s + 15.0 + PERIOD
    assert f.groups["utilization"] == "flat" and f.source is Source.METRIC


def test_without_utilisation_samples_silence_alone_decides() -> None:
    det = _detector()
    det.observe_job(JOB, True, 0.0, chip="ascend")
    last = _steps(det, 10.0, 50, 30.0)
    found = _run_checks(det, last, last + 400)
    assert len(found) == 1
    at, f = found[0]
    assert 90.0 < at - last <= 90.0 + PERIOD
    assert f.source is Source.CONTAINER_LOG and f.groups["utilization"] == "no_samples"
    assert f.chip is Chip.ASCEND
    assert f.fault_class is FaultClass.HANG and f.rule_id == "hang.no_progress" and f.code == "no_progress"
    assert f.namespace == "train" and f.job == "llama"
    assert f.rank == 0 and f.node == "node-0" and f.pod == "llama-worker-0"
    assert f.groups["last_step"] == "50" and f.groups["interval_s"] == "30.0"
    assert f.message is not None and f.hint is not None
    assert "No training progress for" in f.message.en and "expected a step every 30 s" in f.message.en
    assert "训练已" in f.message.zh and "正常每 30 秒一步" in f.message.zh
    assert f.text == "iter 50: loss 2.0, time 1ms"


def test_fires_once_and_rearms_when_progress_resumes() -> None:
    det = _detector()
    det.observe_job(JOB, True, 0.0)
    last = _steps(det, 10.0, 50, 30.0)
    assert len(_run_checks(det, last, last + 1000)) == 1
    last = _steps(det, last + 1005, 20, 30.0, start=51)
    assert len(_run_checks(det, last, last + 1000)) == 1


@pytest.mark.parametrize("running", [None, False], ids=["never-running", "stopped"])
def test_a_job_that_is_not_running_never_fires(running: bool | None) -> None:
    det = _detector()
    if running is not None:
        det.observe_job(JOB, True, 0.0)
    last = _steps(det, 10.0, 50, 30.0)
    if running is False:
        det.observe_job(JOB, False, last + 1)
        assert det.jobs() == []
    assert _run_checks(det, last, last + DAY / 4) == []


def test_finished_job_state_is_cleared() -> None:
    det = _detector()
    det.observe_job(JOB, True, 0.0)
    last = _steps(det, 10.0, 50, 30.0)
    det.observe_utilization(JOB, "node-0", "0", last, 50.0)
    det.observe_job(JOB, False, last + 10)
    assert det.jobs() == []
    # A late batch of the finished job recreates state, but the job is not running: nothing fires,
    # and the state is dropped once stale.
    det.observe_lines(JOB, 0, "llama-worker-0", "node-0", last + 20, ["late line"])
    assert _run_checks(det, last + 20, last + 20 + det.settings.stale_s + 2 * PERIOD) == []
    assert det.jobs() == []


def test_startup_silence_uses_the_startup_floor() -> None:
    det = _detector()
    det.observe_job(JOB, True, 100.0)
    det.observe_lines(JOB, 0, "llama-worker-0", "node-0", 130.0, ["NCCL INFO Bootstrap : Using eth0"])
    found = _run_checks(det, 130.0, 130.0 + 2000)
    assert len(found) == 1
    at, f = found[0]
    assert 900.0 < at - 130.0 <= 900.0 + PERIOD
    assert f.groups["scope"] == "startup" and "start-up" in (f.message.en if f.message else "")


def test_done_marker_switches_to_the_long_bound() -> None:
    det = _detector()
    det.observe_job(JOB, True, 0.0)
    last = _steps(det, 10.0, 50, 30.0)
    det.observe_lines(JOB, 0, "llama-worker-0", "node-0", last + 5, ["[after training is done] datetime: 2024-04-09"])
    found = _run_checks(det, last + 5, last + 5 + 2000)
    assert len(found) == 1
    at, f = found[0]
    assert 900.0 < at - (last + 5) <= 900.0 + PERIOD
    assert f.groups["scope"] == "done"


def test_pod_replaced_restarts_in_startup_mode() -> None:
    det = _detector()
    det.observe_job(JOB, True, 0.0)
    last = _steps(det, 10.0, 50, 30.0)
    # Rank 0 comes back in a new pod and loads for 10 minutes without progress.
    det.observe_lines(JOB, 0, "llama-worker-0-retry", "node-1", last + 60, ["Loading checkpoint shards:   0%|"])
    assert _run_checks(det, last + 60, last + 60 + 800) == []


def test_end_only_evaluation_period_is_learned() -> None:
    """Evaluations seen only at their end: after three at a regular period, the next ones are expected."""
    det = _detector()
    det.observe_job(JOB, True, 0.0)
    t = 10.0
    found: list[tuple[float, Finding]] = []
    for i in range(1, 6001):
        t += 4.0
        if i % 10 == 0:
            det.observe_lines(JOB, 7, "llama-worker-7", "node-0", t, [f" iteration {i:8d}/{60000:8d} | lm loss: 1 |"])
        if i % 1000 == 0:
            ev = 80.0 if i <= 3000 else 600.0  # 600 s >> base bound (120 s) but < 20 x interval
            found += _run_checks(det, t + PERIOD, t + ev)
            t += ev
            det.observe_lines(JOB, 7, "llama-worker-7", "node-0", t, [f" validation loss at iteration {i} | x |"])
        if i % 50 == 0:
            found += _run_checks(det, t, t)
    assert found == []


def test_lone_rank_needs_regular_reports() -> None:
    """A rank that printed a bar once at load time and never again is not a stalled rank."""
    det = _detector()
    det.observe_job(JOB, True, 0.0)
    det.observe_lines(JOB, 5, "llama-worker-5", "node-0", 20.0, ["  0%|          | 0/1000 [00:00<?, ?it/s]"])
    last = _steps(det, 30.0, 300, 10.0)
    assert _run_checks(det, 30.0, last) == []


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param(("lines", math.nan), id="nan-time"),
        pytest.param(("util", math.inf), id="inf-util"),
        pytest.param(("huge", 0.0), id="huge-line"),
        pytest.param(("binary", 0.0), id="binary"),
    ],
)
def test_bad_input_is_set_aside(bad: tuple[str, float]) -> None:
    kind, value = bad
    det = _detector()
    det.observe_job(JOB, True, 0.0)
    if kind == "lines":
        det.observe_lines(JOB, 0, "p", "n", value, ["iter 1: loss 2"])
        assert det.stats["rejected"] == 1
    elif kind == "util":
        det.observe_utilization(JOB, "n", "0", 1.0, value)
        assert det.stats["rejected"] == 1
    elif kind == "huge":
        started = time.perf_counter()
        det.observe_lines(JOB, 0, "p", "n", 1.0, ["step " * 400_000 + "\r" + "  5%|#| 5/100 [00:01<00:10]" * 50_000])
        assert time.perf_counter() - started < 5.0
    else:
        det.observe_lines(JOB, 0, "p", "n", 1.0, ["\x00\xff\ud800 iter 3: loss \x1b[31m2", "\x1b" * 1000])
    assert det.check(2.0) == []
    assert det.check(math.nan) == []


def test_settings_are_validated() -> None:
    with pytest.raises(ValueError, match="floor_s"):
        HangSettings(floor_s=-1)
    with pytest.raises(ValueError, match="learned_margin"):
        HangSettings(learned_margin=0.5)
    det = HangDetector(120.0, 4.0)
    assert det.settings.floor_s == 120.0 and det.settings.factor == 4.0


def _mixed_lines(n: int, marker_fraction: float, seed: int = 1) -> Iterator[list[str]]:
    rng = random.Random(seed)
    marks = [
        " iteration      100/  500000 | consumed samples: 6400 | elapsed time per iteration (ms): 3851.3 | loss: 4 |",
        "[Rank 0] step=10, skipped=10, lr=[0.0001], mom=[(0.9, 0.999)]",
        "  12%|█▏        | 120/1000 [02:00<14:40,  1.00s/it]",
        "{'loss': 0.9455, 'learning_rate': 0.0001829405685450202, 'epoch': 0.57}",
    ]
    batch: list[str] = []
    for _ in range(n):
        batch.append(rng.choice(marks) if rng.random() < marker_fraction else rng.choice(_NOISE[:3]))
        if len(batch) == 100:
            yield batch
            batch = []
    if batch:
        yield batch


@pytest.mark.parametrize("fast", [False, True], ids=["re", "hyperscan"])
def test_observe_lines_throughput_smoke(fast: bool) -> None:
    """A generous floor (the measured figures are 10-20x higher); it catches a per-line regression."""
    if fast:
        _require_fast()
    s = _settings()
    det = HangDetector(s.floor_s, s.factor, settings=s, markers=None)
    det._matcher = _matcher(fast)
    det.observe_job(JOB, True, 0.0)
    batches = list(_mixed_lines(100_000, 0.02))
    started = time.perf_counter()
    for i, batch in enumerate(batches):
        det.observe_lines(JOB, i % 8, f"p{i % 8}", "n", float(i), batch)
    rate = 100_000 / (time.perf_counter() - started)
    assert rate > 50_000, rate


def test_evaluation_bar_without_a_start_line_is_not_a_step() -> None:
    """HF evaluation bars (another total) while the start line is not logged: liveness, not steps."""
    det = _detector(phase_floor_s=600.0)
    det.observe_job(JOB, True, 0.0)
    t = 10.0
    for step in range(10, 3010, 10):
        t += 20.0
        det.observe_lines(JOB, 0, "w0", "n0", t, ["\r" + _bar(step, 5000)])
        if step % 1000 == 0:
            for k in range(1, 31):  # a 5 minute evaluation, one bar update every 10 s
                t += 10.0
                det.observe_lines(JOB, 0, "w0", "n0", t, ["\r" + _bar(k * 3, 90)])
            t += 5.0
            det.observe_lines(JOB, 0, "w0", "n0", t, ["{'eval_loss': 0.42, 'epoch': 0.5}"])
        assert det.check(t + 1.0) == []
    job = det._jobs[JOB]
    assert job.max_step == 3000 and job.train_total == 5000
    assert 19.0 <= float(det._interval(job) or 0) <= 21.0


def test_many_keyword_hits_hand_over_to_the_re_path() -> None:
    _require_fast()
    lines = ["noise step step step step"] * 2000 + [" iteration      100/  500000 | x |"]
    fast, slow = _matcher(True), _matcher(False)
    assert fast.scan(lines) == slow.scan(lines)
    assert [h.marker_id for _, _, hs in fast.scan(lines) for h in hs] == ["megatron.iteration"]


def test_per_line_times_give_the_interval() -> None:
    """Lines batched every 60 s with their own times: the interval is the step time, not the batch time."""
    det = _detector()
    det.observe_job(JOB, True, 0.0)
    step = 0
    for batch in range(1, 40):
        t0 = batch * 60.0
        lines = [f"iter {step + k}: loss 2.0" for k in range(1, 4)]
        det.observe_lines(JOB, 0, "w0", "n0", t0, lines, times=[t0 - 40.0, t0 - 20.0, t0])
        step += 3
    assert det._interval(det._jobs[JOB]) == pytest.approx(20.0)


# ------------------------------------------------------------------------------------------------
# The batch path against the line-by-line reference
# ------------------------------------------------------------------------------------------------
def _mixed_batch(seed: int, n: int, *, newlines: bool) -> list[str]:
    """Lines of every style (steps, saves, evaluations, bars), noise and edge cases, shuffled."""
    rng = random.Random(seed)
    pool: list[str] = []
    for style in STYLES.values():
        for step in range(1, 40):
            pool.extend(style.progress(step, style.total, rng))
        pool.extend(f(100) for f in (style.ckpt_start, style.eval_start, style.eval_end) if f is not None)
        if style.ckpt_end is not None:
            pool.append(style.ckpt_end(100, 12.0))
        if style.eval_progress is not None:
            pool.append(style.eval_progress(3, 10))
    pool += _NOISE + _FRAGMENTS + _EDGE_FRAGMENTS
    return [line for line in (rng.choice(pool) for _ in range(n)) if newlines or "\n" not in line]


@pytest.mark.parametrize("fast", [False, True], ids=["re", "hyperscan"])
@pytest.mark.parametrize("newlines", [False, True], ids=["lines", "newlines-inside"])
@pytest.mark.parametrize("seed", [1, 2])
def test_large_batches_equal_line_by_line(fast: bool, newlines: bool, seed: int) -> None:
    """Batches of 500 lines (the keyword occurrences are mapped to lines with numpy there)."""
    if fast:
        _require_fast()
    matcher = _matcher(fast)
    lines = _mixed_batch(seed, 1500, newlines=newlines)
    for start in range(0, len(lines), 500):
        batch = lines[start : start + 500]
        found = matcher.scan(batch)
        assert len(found) > 100
        assert found == _line_by_line(matcher, batch)


def batched(run: Run, window_s: float, *, line_times: bool) -> Run:
    """The run's log lines as each container's log shipper sends them: every rank's lines of up to
    `window_s` seconds in one batch, at the time of its last line, with per-line times or without."""
    out = replace(run, events=[], seq=0)
    pending: dict[object, tuple[float, list[str], list[float]]] = {}

    def flush(rank: object) -> None:
        _, lines, times = pending.pop(rank)
        out.add(times[-1], "batch", rank, lines, times if line_times else None)

    for ev in sorted(run.events):
        if ev.kind != "lines":
            out.add(ev.t, ev.kind, *ev.args)
            continue
        rank, lines = ev.args
        assert isinstance(lines, list)
        if rank in pending and ev.t - pending[rank][0] > window_s:
            flush(rank)
        _, batch, times = pending.setdefault(rank, (ev.t, [], []))
        batch.extend(lines)
        times.extend([ev.t] * len(lines))
    for rank in list(pending):
        flush(rank)
    return out


def _state(det: HangDetector) -> dict[str, object]:
    """What the detector learned about the job, for comparing two detectors."""
    job = det._jobs[JOB]
    return {
        "mode": job.mode,
        "max_step": (job.max_step, job.max_step_parts, job.train_total, job.odd_streak),
        "anchor": job.anchor,
        "evidence": job.evidence,
        "phase": (job.phase, job.phase_mark, {k: list(v) for k, v in job.durations.items()}),
        "phase_steps": ({k: list(v) for k, v in job.phase_steps.items()}, job.last_phase_step),
        "order": list(job.order),
        "streams": {
            k: (s.last_progress, s.last_step_t, s.tainted, s.reports, s.last_activity) for k, s in job.streams.items()
        },
        "fired": (job.fired, sorted(job.lone_reported)),
    }


_EQUIVALENCE_RUNS = [pytest.param(style, None, 11, id=f"{style}-healthy") for style in STYLES] + [
    pytest.param(style, "all", 3, id=f"{style}-stall") for style in STYLES
]


@pytest.mark.parametrize("line_times", [True, False], ids=["line-times", "batch-time"])
@pytest.mark.parametrize(("style", "stall", "seed"), _EQUIVALENCE_RUNS)
def test_batch_path_equals_line_by_line_reference(style: str, stall: str | None, seed: int, line_times: bool) -> None:
    hours = 4 if stall is None else 6  # the stall falls between 2 and 4 hours in
    run = batched(generate(STYLES[style], seed=seed, stall=stall, hours=hours), 90.0, line_times=line_times)
    fast, reference = _detector(), _detector(reference=True)
    found = replay(fast, run)
    assert found == replay(reference, run)
    if stall is not None:
        assert found  # the comparison covers findings, not only their absence
    interval = fast._interval(fast._jobs[JOB])
    assert interval is not None
    assert interval == pytest.approx(reference._interval(reference._jobs[JOB]), rel=1e-12)
    assert _state(fast) == _state(reference)


_PROGRESS_LINES: list[Callable[[int, int], str]] = [
    lambda n, total: f" iteration {n:8d}/{total:8d} | lm loss: 1.0 |",
    lambda n, total: f"iter {n}: loss 2.0, time 10ms",
    lambda n, total: "\r" + _bar(n, total),
    lambda n, total: f"[Rank 0] step={n}, skipped=0, lr=[0.1], mom=[(0.9, 0.999)]",
    lambda n, total: f"{{ Epoch:[  1/ 99], step:[{n:5d}/{total:5d}], loss: 1.0, per_step_time: 5000ms",
]
_OTHER_LINES: list[Callable[[int], str]] = [
    lambda n: f"saving checkpoint at iteration {n:7d} to /ckpt",
    lambda n: f"  successfully saved checkpoint from iteration {n:7d} to /ckpt",
    lambda n: f" validation loss at iteration {n} | lm loss value: 1.0 |",
    lambda n: "***** Running Evaluation *****",
    lambda n: "{'eval_loss': 0.42, 'epoch': 0.5}",
    lambda n: "[after training is done] datetime: 2024-04-09",
    lambda n: "NCCL INFO Channel 01 : 2[1040] -> 0[1020] via SHM",
]

# One log line: (progress?, template, step change, bar length).
_LINE = st.tuples(st.booleans(), st.integers(0, 6), st.integers(-3, 30), st.sampled_from([1000, 1000, 1000, 90]))
# One batch: (rank, seconds since the previous one, per-line times?, lines).
_BATCH = st.tuples(
    st.sampled_from([0, 0, 1, 2]),
    st.sampled_from([0.0, 0.0, 5.0, 20.0, 30.0, 400.0]),
    st.booleans(),
    st.lists(_LINE, min_size=1, max_size=12),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_BATCH, min_size=1, max_size=40))
def test_batch_path_equals_line_by_line_on_random_batches(batches: list[tuple[int, float, bool, list[Any]]]) -> None:
    """Steps forward, backwards, bars of another length, phases and end markers, same and new times."""
    fast, reference = _detector(), _detector(reference=True)
    for det in (fast, reference):
        det.observe_job(JOB, True, 0.0)
    t, step = 10.0, 0
    found: list[list[Finding]] = [[], []]
    for rank, gap, line_times, spec in batches:
        t += gap
        lines: list[str] = []
        for progress, template, change, total in spec:
            step = max(0, step + change)
            if progress:
                lines.append(_PROGRESS_LINES[template % len(_PROGRESS_LINES)](step, total))
            else:
                lines.append(_OTHER_LINES[template](step))
        times = [t - 0.5 * (len(lines) - i) for i in range(len(lines))] if line_times else None
        for i, det in enumerate((fast, reference)):
            det.observe_lines(JOB, rank, f"llama-worker-{rank}", "node-0", t, lines, times=times)
            found[i] += det.check(t + 1.0)
    for i, det in enumerate((fast, reference)):
        found[i] += det.check(t + 3000.0)
    assert found[0] == found[1]
    assert fast._interval(fast._jobs[JOB]) == reference._interval(reference._jobs[JOB])
    assert _state(fast) == _state(reference)
