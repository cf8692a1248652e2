"""Hang detection figures, under fake time: `python bench/hang.py` (also part of `make bench`).

A seeded model of a real training job, replayed through the shipped `HangDetector` (its default
settings) with `check()` called every second of fake time, as the brain's tick does:

* a step every ~2 s (log-normal jitter, now and then a slow step), one progress line per step in
  the job's format (FORMATS: tqdm bars with and without a description, behind torchrun's
  `[default0]:` / `[rank0]:` prefixes, with `\\r` redraws; HF Trainer dicts; Megatron; MindSpore;
  DeepSpeed (engine and pipeline); veRL; LLaMA-Factory; plain `Step N/T`);
* a checkpoint save every CKPT_EVERY steps taking 30-300 s, with the format's save lines;
* an evaluation every EVAL_EVERY steps taking 1-7 minutes, with its own bar (or the format's own
  evaluation lines; Megatron prints only the result at the end);
* a data-loading pause at every epoch boundary: 20-150 s where the log shows the epoch (a
  per-epoch bar or epoch-relative counter), 4-14 s where it does not (such a pause has to fit the
  floor until it has recurred three times and its period is learned);
* one restart: the job fails (a traceback); with an odd seed its pod is replaced (the job is not
  running for 1-5 minutes), with an even seed torchrun restarts the workers in place (its "will
  restart worker group" line, then 1-5 minutes of rendezvous); the job loads the model for 30-120 s,
  prints its banner and resumes from its last checkpoint's step.

Figures:

* `hang_false_alarms_24h`: hang findings over healthy 24-hour replays, every format, SEEDS seeds.
* `hang_detect_s`: the median, over every format and seed, of the time from the job's last step
  to the hang finding when the job stops after a random step (between hour 2 and hour 22 of the
  same replay). `hang_detect_max_s` is the largest.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from trainmedic.detectors.hang import HangDetector  # noqa: E402
from trainmedic.models import Finding  # noqa: E402

JOB = "job:train/llama"
DAY = 24 * 3600.0
STEP_S = 2.0
TICK_S = 1.0
CKPT_EVERY = 500
EVAL_EVERY = 1500
STEPS_PER_EPOCH = 2000
SEEDS = (1, 2, 3)
GOAL_DETECT_S = 30.0


# ------------------------------------------------------------------------------------------------
# Formats: what the job prints
# ------------------------------------------------------------------------------------------------


def _bar(n: int, total: int, rate: str = "2.00s/it") -> str:
    pct = min(100, n * 100 // max(total, 1))
    filled = pct // 10
    return f"{pct:3d}%|{'█' * filled}{' ' * (10 - filled)}| {n}/{total} [00:10<00:20, {rate}]"


@dataclass(frozen=True)
class Format:
    """How one framework prints a step, a save, an evaluation and its start banner."""

    name: str
    # (global step, total steps, epoch, step within the epoch, steps per epoch) -> lines
    step: Callable[[int, int, int, int, int], list[str]]
    ckpt_start: Callable[[int], list[str]]
    ckpt_end: Callable[[int], list[str]] = lambda _s: []
    eval_start: Callable[[int], list[str]] = lambda _s: []
    # (bar position, bar length) -> lines: evaluation progress, every few seconds
    eval_tick: Callable[[int, int], list[str]] | None = None
    eval_end: Callable[[int], list[str]] = lambda _s: []
    banner: tuple[str, ...] = ()
    # Whether the log shows where an epoch ends (per-epoch bar or epoch-relative counter).
    shows_epoch: bool = False
    # veRL: the validation runs inside the step, its result is in the step's own line.
    eval_in_step: bool = False


def _eval_bar(prefix: str = "") -> Callable[[int, int], list[str]]:
    return lambda k, n: [f"{prefix}Evaluating: {_bar(k, n, '2.00it/s')}"]


def _generic_save(prefix: str = "") -> Callable[[int], list[str]]:
    return lambda s: [f"{prefix}[2026-01-01 10:00:00,000] [INFO] [Rank 0] Saving checkpoint to /ckpt/step_{s}"]


FORMATS: dict[str, Format] = {
    f.name: f
    for f in [
        Format(
            "tqdm_desc",
            step=lambda s, t, _e, _k, _n: [f"Training: {_bar(s, t)}"],
            ckpt_start=_generic_save(),
            eval_tick=_eval_bar(),
        ),
        Format(
            "tqdm_epoch",
            step=lambda _s, _t, e, k, n: [f"Epoch {e}: {_bar(k, n, '5.10it/s, loss=0.31')}"],
            ckpt_start=_generic_save(),
            eval_tick=_eval_bar(),
            shows_epoch=True,
        ),
        Format(
            "torchrun_default0_bar",
            step=lambda s, t, _e, _k, _n: [f"[default0]:\r{_bar(s - 1, t)}\r{_bar(s, t)}"],
            ckpt_start=lambda s: [f"[default0]:Saving model checkpoint to /out/checkpoint-{s}"],
            eval_start=lambda _s: ["[default0]:***** Running Evaluation *****", "[default0]:  Num examples = 800"],
            eval_tick=lambda k, n: [f"[default0]:\r{_bar(k, n, '2.00it/s')}"],
            eval_end=lambda _s: ["[default0]:{'eval_loss': 0.4412, 'eval_runtime': 95.1, 'epoch': 0.5}"],
            banner=("[default0]:***** Running training *****", "[default0]:  Num examples = 64,000"),
        ),
        Format(
            "torchrun_rank0_bar",
            step=lambda s, t, _e, _k, _n: [f"[rank0]:Training: {_bar(s, t)}\r[rank0]:Training: {_bar(s, t)}"],
            ckpt_start=_generic_save("[rank0]:"),
            eval_tick=_eval_bar("[rank0]:"),
        ),
        Format(
            "hf_trainer_dict",
            step=lambda s, _t, _e, _k, _n: [
                f"{{'loss': {0.5 + 1.0 / s:.4f}, 'grad_norm': 1.21, 'learning_rate': 2e-05, "
                f"'epoch': {s / STEPS_PER_EPOCH:.2f}}}"
            ],
            ckpt_start=lambda s: [
                f"[INFO|trainer.py:3984] 2026-01-01 10:00:00,000 >> Saving model checkpoint to /out/checkpoint-{s}"
            ],
            eval_start=lambda _s: ["[INFO|trainer.py:4307] 2026-01-01 10:00:00,000 >> ***** Running Evaluation *****"],
            eval_tick=lambda k, n: [f"\r{_bar(k, n, '2.00it/s')}"],
            eval_end=lambda _s: [
                "{'eval_loss': 0.4412, 'eval_runtime': 95.1, 'eval_samples_per_second': 8.4, 'epoch': 0.5}"
            ],
            banner=("[INFO|trainer.py:2128] 2026-01-01 10:00:00,000 >> ***** Running training *****",),
        ),
        Format(
            "llamafactory",
            step=lambda s, _t, _e, _k, _n: [
                f"[INFO|2026-01-01 10:00:00] llamafactory.train.callbacks:143 >> {{'loss': 0.9455, "
                f"'learning_rate': 1.8294e-04, 'epoch': {s / STEPS_PER_EPOCH:.2f}, 'throughput': 1234.56}}"
            ],
            ckpt_start=lambda s: [
                f"[INFO|trainer.py:3984] 2026-01-01 10:00:00,000 >> Saving model checkpoint to saves/checkpoint-{s}"
            ],
            eval_start=lambda _s: ["[INFO|trainer.py:4307] 2026-01-01 10:00:00,000 >> ***** Running Evaluation *****"],
            eval_tick=lambda k, n: [f"\r{_bar(k, n, '2.00it/s')}"],
            eval_end=lambda _s: ["{'eval_loss': 0.4412, 'eval_runtime': 95.1, 'epoch': 0.5}"],
            banner=("[INFO|trainer.py:2128] 2026-01-01 10:00:00,000 >> ***** Running training *****",),
        ),
        Format(
            "megatron",
            step=lambda s, t, _e, _k, _n: [
                f" [2026-01-01 10:00:00] iteration {s:8d}/{t:8d} | consumed samples: {s * 64:12d} | "
                "elapsed time per iteration (ms): 2001.3 | learning rate: 1.000E-04 | global batch size:    64 | "
                "lm loss: 2.110266E+00 | loss scale: 1.0 | grad norm: 1.234 |"
            ],
            ckpt_start=lambda s: [f"saving checkpoint at iteration {s:7d} to /ckpt in torch format"],
            ckpt_end=lambda s: [f"  successfully saved checkpoint from iteration {s:7d} to /ckpt"],
            eval_end=lambda s: [
                "-" * 100,
                f" validation loss at iteration {s} | lm loss value: 2.141563E+00 | lm loss PPL: 8.51E+00 | ",
                "-" * 100,
            ],
            banner=("[before the start of training step] datetime: 2026-01-01 10:00:00 ",),
        ),
        Format(
            "mindspore",
            step=lambda _s, _t, e, k, n: (
                [f"epoch: {e} step: {k}, loss is {2.31 - e * 0.1:.4f}"]
                + ([f"epoch time: {n * 2006.173:.3f} ms, per step time: 2006.173 ms"] if k == n else [])
            ),
            ckpt_start=lambda _s: ["- INFO - ......Saving ckpt......"],
            ckpt_end=lambda s: [f"- INFO - Finish saving ckpt of epoch 1 step {s} using 12.3 s"],
            eval_tick=_eval_bar(),
            shows_epoch=True,
        ),
        Format(
            "deepspeed",
            step=lambda s, _t, _e, _k, _n: [
                f"[2026-01-01 10:00:00,000] [INFO] [logging.py:96:log_dist] [Rank 0] step={s}, skipped=0, "
                "lr=[0.0001], mom=[(0.9, 0.999)]"
            ],
            ckpt_start=lambda s: [
                "[2026-01-01 10:00:00,000] [INFO] [logging.py:96:log_dist] [Rank 0] "
                f"[Torch] Checkpoint global_step{s} is about to be saved!"
            ],
            ckpt_end=lambda s: [
                "[2026-01-01 10:00:00,000] [INFO] [torch_checkpoint_engine.py:33:commit] "
                f"[Torch] Checkpoint global_step{s} is ready now!"
            ],
            eval_tick=_eval_bar(),
            banner=(
                "[2026-01-01 10:00:00,000] [INFO] [logging.py:96:log_dist] [Rank 0] DeepSpeed info: version=0.16.4, "
                "git-hash=unknown, git-branch=unknown",
            ),
        ),
        Format(
            "deepspeed_pipe",
            step=lambda s, _t, _e, _k, _n: [f"steps: {s} loss: 0.5123 iter time (s): 2.011 samples/sec: 127.310"],
            ckpt_start=_generic_save(),
            eval_tick=_eval_bar(),
            banner=(
                "[2026-01-01 10:00:00,000] [INFO] [logging.py:96:log_dist] [Rank 0] DeepSpeed info: version=0.16.4, "
                "git-hash=unknown, git-branch=unknown",
            ),
        ),
        Format(
            "verl",
            step=lambda s, _t, _e, _k, _n: [
                f"(TaskRunner pid=2351) step:{s} - actor/entropy:0.510 - actor/pg_loss:0.013 - timing_s/step:2.001"
            ],
            ckpt_start=lambda s: [
                f"(TaskRunner pid=2351) local_global_step_folder: checkpoints/verl/gsm8k/global_step_{s}"
            ],
            eval_start=lambda s: [
                "(TaskRunner pid=2351) test_gen_batch meta info: {'eos_token_id': 151645, 'pad_token_id': 151643, "
                f"'recompute_log_prob': False, 'do_sample': False, 'validate': True, 'global_steps': {s}}}"
            ],
            eval_tick=lambda _k, _n: ["(TaskRunner pid=2351) validation generation end"],
            eval_in_step=True,
        ),
        Format(
            "plain_step",
            step=lambda s, t, _e, _k, _n: [f"2026-01-01 10:00:00 INFO Step {s}/{t}"],
            ckpt_start=_generic_save(),
            eval_tick=_eval_bar(),
        ),
    ]
}


# ------------------------------------------------------------------------------------------------
# The job model
# ------------------------------------------------------------------------------------------------


@dataclass
class Replay:
    """A generated run: time-ordered events, and what the generator knows about it."""

    fmt: str
    seed: int
    end: float
    # (time, "lines", [lines]) or (time, "job", running)
    events: list[tuple[float, str, Any]] = field(default_factory=list)
    steps: int = 0
    # The time of the last progress line, when the job was stopped (a real hang).
    stop_at: float | None = None
    stop_step: int | None = None
    # Whether the step before the stop was the last of an epoch.
    stop_at_epoch_end: bool = False
    longest_ckpt_s: float = 0.0
    longest_eval_s: float = 0.0
    longest_epoch_pause_s: float = 0.0
    restart_at: float | None = None

    def lines(self, t: float, *lines: str) -> None:
        self.events.append((t, "lines", list(lines)))


RESTART_LINE = (
    "[2026-01-01 10:00:00,000] torch.distributed.elastic.agent.server.api: [INFO] [default] Worker group "
    "FAILED. 2/3 attempts left; will restart worker group"
)
_NOISE = (
    "/usr/lib/python3.10/site-packages/torch/utils/data/dataloader.py:557: UserWarning: "
    "This DataLoader will create 16 worker processes",
    "ins-7df6:3018453:3024011 [0] NCCL INFO Channel 01 : 0[1020] -> 1[1040] via P2P/IPC",
)


def generate(fmt: Format, seed: int, *, hours: float = 24.0, stop: bool = False) -> Replay:
    """A seeded run of `hours`; with `stop`, the job hangs after a random step between hour 2 and
    hour `hours - 2` (no line after it, the job still running)."""
    rng = random.Random(f"{fmt.name}:{seed}")
    run = Replay(fmt=fmt.name, seed=seed, end=hours * 3600.0)
    total = int(run.end / STEP_S)
    stop_time = rng.uniform(2 * 3600.0, run.end - 2 * 3600.0) if stop else math.inf
    restart_time = rng.uniform(0.25 * run.end, 0.75 * run.end)
    t = 0.0
    run.events.append((0.0, "job", True))

    def startup(t0: float) -> float:
        for k in range(rng.randint(4, 12)):
            run.lines(t0 + k * rng.uniform(3.0, 10.0), _NOISE[k % 2])
        t0 += rng.uniform(30.0, 120.0)
        if fmt.banner:
            run.lines(t0, *fmt.banner)
        return t0 + rng.uniform(1.0, 5.0)

    t = startup(5.0)
    step = 0
    last_ckpt = 0
    restarted = False
    while t < run.end:
        step += 1
        dt = STEP_S * rng.lognormvariate(0.0, 0.08)
        if rng.random() < 0.005:
            dt *= rng.uniform(1.5, 3.0)  # a slow step: garbage collection, a straggler
        if fmt.eval_in_step and step % EVAL_EVERY == 0:
            # veRL validates inside the step, before the step's line.
            e_len = rng.uniform(60.0, 420.0)
            run.lines(t + 0.5, *fmt.eval_start(step))
            k = 0
            while (k + 1) * 20.0 < e_len and fmt.eval_tick is not None:
                k += 1
                run.lines(t + k * 20.0, *fmt.eval_tick(k, 0))
            dt += e_len
            run.longest_eval_s = max(run.longest_eval_s, e_len)
        t += dt
        if t >= run.end:
            break
        epoch, in_epoch = divmod(step - 1, STEPS_PER_EPOCH)
        lines = fmt.step(step, total, epoch + 1, in_epoch + 1, STEPS_PER_EPOCH)
        if fmt.eval_in_step and step % EVAL_EVERY == 0:
            lines = [
                ln.replace(" - timing_s", " - val-core/openai/gsm8k/reward/mean@1:0.734 - timing_s") for ln in lines
            ]
        run.lines(t, *lines)
        run.steps += 1
        if rng.random() < 0.01:
            run.lines(t + rng.uniform(0.0, 1.0), _NOISE[0])
        if t >= stop_time:
            run.stop_at, run.stop_step = t, step
            run.stop_at_epoch_end = step % STEPS_PER_EPOCH == 0
            run.end = t + 3600.0
            return run
        if not restarted and t >= restart_time:
            # The job fails, is rescheduled and resumes from its last checkpoint.
            restarted = True
            run.restart_at = t
            run.lines(
                t + 1.0,
                "Traceback (most recent call last):",
                "RuntimeError: CUDA error: an illegal memory access was encountered",
            )
            if seed % 2:
                # The pod is replaced: the job is not running until the new pod is.
                run.events.append((t + 3.0, "job", False))
                t += 3.0 + rng.uniform(60.0, 300.0)
                run.events.append((t, "job", True))
            else:
                # torchrun restarts the workers in place: the same pod's log goes on.
                run.lines(t + 3.0, RESTART_LINE)
                t += 3.0 + rng.uniform(60.0, 300.0)
            t = startup(t)
            step = last_ckpt
            continue
        if not fmt.eval_in_step and step % EVAL_EVERY == 0:
            t += 0.2
            e_len = rng.uniform(60.0, 420.0)
            run.lines(t, *fmt.eval_start(step))
            if fmt.eval_tick is not None:
                n = max(1, int(e_len / 5.0))
                for k in range(1, n + 1):
                    run.lines(t + k * 5.0, *fmt.eval_tick(k, n))
            t += e_len
            run.lines(t, *fmt.eval_end(step))
            run.longest_eval_s = max(run.longest_eval_s, e_len)
        if step % CKPT_EVERY == 0:
            t += 0.1
            pause = rng.uniform(30.0, 300.0)
            run.lines(t, *fmt.ckpt_start(step))
            t += pause
            run.lines(t, *fmt.ckpt_end(step))
            run.longest_ckpt_s = max(run.longest_ckpt_s, pause)
            last_ckpt = step
        if step % STEPS_PER_EPOCH == 0:
            pause = rng.uniform(20.0, 150.0) if fmt.shows_epoch else rng.uniform(4.0, 14.0)
            t += pause
            run.longest_epoch_pause_s = max(run.longest_epoch_pause_s, pause)
    run.events.sort(key=lambda e: e[0])
    return run


def replay(run: Replay, det: HangDetector | None = None) -> list[tuple[float, Finding]]:
    """Feed the events in time order, calling check() every TICK_S of fake time."""
    det = det if det is not None else HangDetector()
    out: list[tuple[float, Finding]] = []
    next_check = TICK_S
    for t, kind, arg in sorted(run.events, key=lambda e: e[0]):
        if t > run.end:
            break
        while next_check <= t:
            out.extend((next_check, f) for f in det.check(next_check))
            next_check += TICK_S
        if kind == "lines":
            det.observe_lines(JOB, 0, "llama-worker-0", "node-0", t, arg)
        else:
            det.observe_job(JOB, bool(arg), t)
    while next_check <= run.end:
        out.extend((next_check, f) for f in det.check(next_check))
        next_check += TICK_S
    return out


def runs(seeds: tuple[int, ...] = SEEDS, *, stop: bool) -> Iterator[Replay]:
    for fmt in FORMATS.values():
        for seed in seeds:
            yield generate(fmt, seed, stop=stop)


def measure(seeds: tuple[int, ...] = SEEDS) -> dict[str, Any]:
    """The figures, as `make bench` reports them."""
    started = time.perf_counter()
    false_alarms = 0
    alarms: list[str] = []
    for run in runs(seeds, stop=False):
        found = replay(run)
        false_alarms += len(found)
        alarms.extend(f"{run.fmt}/{run.seed}@{t:.0f}s" for t, _f in found)
    detect: dict[str, float] = {}
    missed: list[str] = []
    for run in runs(seeds, stop=True):
        assert run.stop_at is not None
        found = replay(run)
        if not found:
            missed.append(f"{run.fmt}/{run.seed}")
            continue
        detect[f"{run.fmt}/{run.seed}"] = found[0][0] - run.stop_at
    values = sorted(detect.values())
    return {
        "hang_detect_s": round(statistics.median(values), 1) if values else None,
        "hang_detect_max_s": round(values[-1], 1) if values else None,
        "hang_detect_runs": len(values),
        "hang_detect_missed": missed,
        "hang_false_alarms_24h": false_alarms,
        "hang_false_alarm_runs": alarms[:20],
        "hang_replays_24h": len(FORMATS) * len(seeds),
        "hang_formats": list(FORMATS),
        "hang_step_s": STEP_S,
        "meets_hang_detect_goal": bool(values) and statistics.median(values) <= GOAL_DETECT_S,
        "goal_hang_detect_s": GOAL_DETECT_S,
        "hang_bench_seconds": round(time.perf_counter() - started, 1),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Hang detection delay and false alarms under fake time, as JSON.")
    ap.add_argument("--seeds", type=int, default=len(SEEDS), help="seeded runs per format (default %(default)s)")
    args = ap.parse_args(argv)
    print(json.dumps(measure(tuple(range(1, args.seeds + 1))), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
