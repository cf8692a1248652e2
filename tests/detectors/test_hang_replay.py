"""The hang detector with its shipped defaults on 24-hour replays of every common progress format
(bench/hang.py's seeded job model), under fake time; and the progress formats line by line."""

from __future__ import annotations

import pytest

from bench.hang import FORMATS, STEP_S, TICK_S, generate, replay
from trainmedic.detectors.hang import HangDetector, HangSettings, MarkerKind, shipped_markers
from trainmedic.models import FaultClass

JOB = "job:train/llama"


def _messages(found: list[tuple[float, object]]) -> list[tuple[float, str]]:
    out = []
    for t, f in found:
        message = getattr(f, "message", None)
        out.append((t, message.en if message else ""))
    return out


# ------------------------------------------------------------------------------------------------
# Every common format is a step
# ------------------------------------------------------------------------------------------------

STEP_LINES = {
    "tqdm_epoch": ("Epoch 1:  37%|███▋      | 37/100 [00:07<00:12,  5.10it/s, loss=0.31]", 37),
    "tqdm_training": ("Training: 5%|▌ | 50/1000 [00:10<03:10,  5.00it/s]", 50),
    "tqdm_default0": ("[default0]:  5%|▌         | 50/1000 [01:40<31:40,  2.00s/it]", 50),
    "tqdm_rank0_redraw": (
        "[rank0]:Training:  5%|▌         | 49/1000 [01:38<31:42,  2.00s/it]\r"
        "[rank0]:Training:  5%|▌         | 50/1000 [01:40<31:40,  2.00s/it]",
        50,
    ),
    "hf_dict": ("{'loss': 0.53, 'grad_norm': 1.7, 'learning_rate': 2e-05, 'epoch': 0.12}", None),
    "megatron": (
        " iteration      120/    1000 | consumed samples:         7680 | elapsed time per iteration (ms): 2001.3 |",
        120,
    ),
    "mindspore": ("epoch: 1 step: 20, loss is 2.31", 20),
    "deepspeed_engine": ("[Rank 0] step=120, skipped=0, lr=[0.0001], mom=[(0.9, 0.999)]", 120),
    "deepspeed_pipe": ("steps: 120 loss: 0.51 iter time (s): 2.011 samples/sec: 127.310", 120),
    "verl_llamafactory": ("step:120 - actor/pg_loss:0.013 - timing_s/step:2.001", 120),
    "plain": ("Step 120/1000", 120),
}


@pytest.mark.parametrize("name", list(STEP_LINES))
def test_common_format_is_a_step(name: str) -> None:
    line, step = STEP_LINES[name]
    hits = [h for _, _, hs in shipped_markers().matcher.scan([line]) for h in hs]
    progress = [h for h in hits if h.kind is MarkerKind.PROGRESS]
    assert progress, hits
    assert progress[0].step == step


@pytest.mark.parametrize(
    ("line", "kind"),
    [
        (
            "[INFO|trainer.py:3984] 2026-01-01 >> Saving model checkpoint to /out/checkpoint-500",
            MarkerKind.CHECKPOINT_START,
        ),
        ("saving checkpoint at iteration     500 to /ckpt in torch format", MarkerKind.CHECKPOINT_START),
        ("[2026-01-01 10:00:00,000] [INFO] [Rank 0] Saving checkpoint to /ckpt/step_500", MarkerKind.CHECKPOINT_START),
        ("***** Running Evaluation *****", MarkerKind.EVAL_START),
        ("Evaluating:  40%|████      | 20/50 [00:10<00:15,  2.00it/s]", MarkerKind.EVAL_START),
        (" validation loss at iteration 500 | lm loss value: 5.741563E+00 | ", MarkerKind.EVAL_END),
        ("[INFO|trainer.py:2128] 2026-01-01 >> ***** Running training *****", MarkerKind.START),
        ("epoch time: 4012345.678 ms, per step time: 2006.173 ms", MarkerKind.EPOCH_END),
    ],
)
def test_pause_and_restart_markers(line: str, kind: MarkerKind) -> None:
    hits = [h for _, _, hs in shipped_markers().matcher.scan([line]) for h in hs]
    assert kind in {h.kind for h in hits}, hits


def test_evaluation_bar_is_not_a_training_step() -> None:
    hits = [
        h
        for _, _, hs in shipped_markers().matcher.scan(["Evaluating:  40%|████      | 20/50 [00:10<00:15,  2.00it/s]"])
        for h in hs
    ]
    assert MarkerKind.PROGRESS not in {h.kind for h in hits}


# ------------------------------------------------------------------------------------------------
# 24-hour replays, shipped defaults
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_healthy_day_has_no_hang_finding(fmt: str) -> None:
    # An even seed: torchrun restarts the workers in place, the job never stops running.
    run = generate(FORMATS[fmt], seed=8)
    found = replay(run)
    assert found == [], _messages(found)  # type: ignore[arg-type]
    # The day had what the model promises: long saves, long evaluations, a restart.
    assert run.longest_ckpt_s >= 100.0
    assert run.longest_eval_s >= 120.0
    assert run.restart_at is not None
    assert run.steps > 30_000


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("seed", [1, 2])
def test_stop_is_caught_within_the_bound(fmt: str, seed: int) -> None:
    run = generate(FORMATS[fmt], seed=seed, stop=True)
    assert run.stop_at is not None and run.stop_step is not None
    found = replay(run)
    assert len(found) == 1, _messages(found)  # type: ignore[arg-type]
    at, finding = found[0]
    assert finding.fault_class is FaultClass.HANG and finding.code == "no_progress"
    detect = at - run.stop_at
    bound = float(finding.groups["bound_s"])
    assert detect <= bound + TICK_S + 1.0
    if run.stop_at_epoch_end:
        assert bound <= max(HangSettings().epoch_floor_s, 1.5 * run.longest_epoch_pause_s) + 1.0
    elif fmt == "megatron" and run.stop_step % HangSettings().round_steps == 0:
        assert bound <= HangSettings().phase_floor_s + 1.0
    else:
        assert detect <= 30.0, (detect, finding.groups)


# ------------------------------------------------------------------------------------------------
# The deadline, piece by piece
# ------------------------------------------------------------------------------------------------


def _steps(det: HangDetector, t: float, first: int, n: int, line: str = "Step {s}/100000") -> float:
    for s in range(first, first + n):
        det.observe_lines(JOB, 0, "pod-0", "node-0", t, [line.format(s=s)])
        t += STEP_S
    return t - STEP_S


def _first_finding(det: HangDetector, start: float, end: float) -> float | None:
    t = start
    while t <= end:
        if det.check(t):
            return t
        t += TICK_S
    return None


def test_deadline_follows_a_high_quantile_of_the_cadence() -> None:
    det = HangDetector()
    det.observe_job(JOB, True, 0.0)
    t = 10.0
    # 80 % of steps take 2 s, 20 % take 8 s: the deadline follows the slow ones (4 x 8 s).
    for s in range(1, 200):
        t += 8.0 if s % 5 == 0 else 2.0
        det.observe_lines(JOB, 0, "pod-0", "node-0", t, [f"Step {s}/100000"])
    at = _first_finding(det, t, t + 100)
    assert at is not None
    assert 30.0 <= at - t <= 34.0


def test_floor_applies_to_a_fast_cadence() -> None:
    det = HangDetector()
    det.observe_job(JOB, True, 0.0)
    last = _steps(det, 10.0, 1, 100)
    at = _first_finding(det, last, last + 100)
    assert at is not None and at - last == pytest.approx(HangSettings().floor_s + TICK_S, abs=TICK_S)


def test_run_banner_resets_the_cadence() -> None:
    det = HangDetector()
    det.observe_job(JOB, True, 0.0)
    last = _steps(det, 10.0, 1, 100)
    det.observe_lines(JOB, 0, "pod-0", "node-0", last + 5.0, ["***** Running training *****"])
    # Loading again: the start-up bound applies, not the 20 s one.
    assert _first_finding(det, last + 5.0, last + 600.0) is None
    t = _steps(det, last + 300.0, 1, 2)
    assert _first_finding(det, t, t + 600.0) is None  # two steps: the cadence is not known yet


def test_epoch_end_gets_slack() -> None:
    det = HangDetector()
    det.observe_job(JOB, True, 0.0)
    last = _steps(det, 10.0, 1, 100, "Epoch 0: {s}%|#| {s}/100 [00:01<00:01, 1.00it/s]")
    # Step 100 of 100: the data loader restarts; 60 s of silence is not a hang.
    assert _first_finding(det, last, last + 60.0) is None
    at = _first_finding(det, last + 60.0, last + 400.0)
    assert at is not None and at - last == pytest.approx(HangSettings().epoch_floor_s + TICK_S, abs=TICK_S)


def test_epoch_length_is_learned_from_an_epoch_relative_counter() -> None:
    det = HangDetector()
    det.observe_job(JOB, True, 0.0)
    t = _steps(det, 10.0, 1, 50, "epoch: 1 step: {s}, loss is 2.0")
    t = _steps(det, t + 40.0, 1, 50, "epoch: 2 step: {s}, loss is 2.0")
    assert _first_finding(det, t, t + 120.0) is None  # step 50 of epoch 2 is an epoch's last step
    det2 = HangDetector()
    det2.observe_job(JOB, True, 0.0)
    t = _steps(det2, 10.0, 1, 50, "epoch: 1 step: {s}, loss is 2.0")
    t = _steps(det2, t + 40.0, 1, 30, "epoch: 2 step: {s}, loss is 2.0")
    at = _first_finding(det2, t, t + 120.0)
    assert at is not None and at - t <= 30.0  # mid-epoch


def test_recurring_unmarked_pause_is_learned() -> None:
    det = HangDetector()
    det.observe_job(JOB, True, 0.0)
    t = 10.0
    for block in range(4):
        t = _steps(det, t, block * 100 + 1, 100)
        t += 17.0  # an unmarked pause after every 100th step, under the floor
    t = _steps(det, t, 401, 100)
    # Step 500 is due for the pause (period 100): 1.5 x 17 s allowed.
    at = _first_finding(det, t, t + 60.0)
    assert at is not None and 25.0 <= at - t <= 27.0


@pytest.mark.parametrize("reference", [False, True])
def test_epoch_length_is_learned_within_one_batch(reference: bool) -> None:
    det = HangDetector(reference=reference)
    det.observe_job(JOB, True, 0.0)
    t = _steps(det, 10.0, 1, 48, "epoch: 1 step: {s}, loss is 2.0")
    # The epoch's last steps and the next epoch's first arrive in one batch, at one time.
    batch = [f"epoch: 1 step: {s}, loss is 2.0" for s in (49, 50)] + ["epoch: 2 step: 1, loss is 2.0"]
    det.observe_lines(JOB, 0, "pod-0", "node-0", t + 2.0, batch)
    t = _steps(det, t + 4.0, 2, 49, "epoch: 2 step: {s}, loss is 2.0")
    assert _first_finding(det, t, t + 120.0) is None  # step 50 is the epoch's last
