"""Classification throughput, one core per path: `make bench` (python bench/run.py).

Steps:
1. Write a synthetic training-job log (bench/corpus.py; 1,000,000 lines by default, 0.1 % faults).
2. For each path (Hyperscan fast path, pure `re` path) start a worker process (bench/worker.py)
   pinned to one CPU: it compiles the shipped rules, warms up with one scan, times `--repeats` scans
   and reports per-repeat wall and CPU seconds, the findings and its peak RSS.
3. Run GNU grep over the same file with the same patterns translated to POSIX ERE (bench/ere.py),
   `LC_ALL=C grep -E -c -f PATTERNS FILE`, pinned to the same CPU, the same number of repeats.
   (`-c` rather than output to /dev/null: GNU grep stops at the first match when its output is
   /dev/null, which would measure nothing.) The grep runs together get `--grep-limit` seconds
   (default 120; 0: no limit): past it the run is killed and the JSON says so
   (`grep_timed_out_after_s`, and `grep_lines_per_s_below`: grep did not get through the file at
   that rate) with the grep rates null, rather than the bench hanging on a slow machine.
   The engine is built as `Engine(rules, fast=...)`, i.e. with its defaults (hard-wrap view on);
   `--no-unwrap` measures `unwrap=False`, the setting the pipeline uses for container logs.
4. The event-pipeline figures (unless --no-pipeline): bench/pipeline.py runs a producer and a brain
   as processes around the real tansu broker (`pipeline_lines_per_s`, `fault_to_diagnosis_p50_ms`,
   `fault_to_diagnosis_p99_ms`), and bench/rss.py measures `trainmedic run --role all` watching
   1,000 pods of the emulated API server (`agent_rss_mb_1000_pods`).
5. The self-healing figures (unless --no-remediation): bench/remediation.py runs the real agent
   against the emulated API server (`diagnosis_to_reschedule_p50_ms`, `_p99_ms`: a final Xid 79
   diagnosis to the recreated Job's create reaching the API, with the phases from the incident's
   timeline) and saves a 64-pod scene bundle through the API and from memory
   (`scene_bundle_64_pods_s`, `scene_bundle_64_pods_local_s`); in the same runs, the webhook to a
   local receiver (`diagnosis_to_webhook_p99_ms`) and the report of the 64-pod incident
   (`report_render_ms`).
6. The start-up figures (unless --no-coldstart): bench/coldstart.py times `trainmedic diagnose` of
   one line as a fresh process (`diagnose_cold_s` with a warm compile cache, `diagnose_first_run_s`).
7. The hang-detection figures (unless --no-hang): bench/hang.py replays seeded 24-hour jobs of every
   progress format through the shipped hang detector under fake time (`hang_detect_s`,
   `hang_false_alarms_24h`).
8. The real-plane figures (unless --no-realplane): bench/realplane.py starts the real control plane
   (tests/servers/kubeplane.py: etcd, kube-apiserver, controller-manager, scheduler, KWOK nodes) and
   runs the agent as deployed against it (`real_fault_to_pods_running_p50_s` / `_p99_s` over
   `--real-repetitions` Xid 79 incidents, `real_node_lost_to_pods_running_s`, the watch figure), then
   (not with --quick) a plane of 1,000 KWOK nodes and 5,000 running pods (`agent_rss_mb_5000_pods`,
   `agent_watch_events_per_s_5000_pods`); null with `realplane_error` where the binaries are not
   built (`make cluster`).
9. The console figures (unless --no-console): bench/console.py serves the web console over 10,000
   incidents in the SQLite store (`console_list_p99_ms`, `console_incident_p99_ms`, server time).
10. Print one JSON object on stdout (medians, ratios, corpus and machine facts, per-repeat figures)
   and write it to bench/results.json. Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# `python bench/run.py` puts bench/ on the path, not the repository root that holds the package.
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import corpus as corpus_mod  # noqa: E402
from bench import heldout as heldout_mod  # noqa: E402
from bench.ere import Unconvertible, to_ere  # noqa: E402
from trainmedic.detectors.engine import has_hyperscan  # noqa: E402
from trainmedic.detectors.loader import load_rules  # noqa: E402
from trainmedic.detectors.schema import Rule  # noqa: E402

DEFAULT_LINES = 1_000_000
QUICK_LINES = 100_000
GOAL_FAST_LINES_PER_S = 1_400_000
GOAL_RE_LINES_PER_S = 400_000
RESULTS = ROOT / "bench" / "results.json"
GREP = "grep"
DEFAULT_GREP_LIMIT_S = 120.0


def log(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def pick_cpu(requested: int | None) -> int:
    allowed = sorted(os.sched_getaffinity(0))
    if requested is not None:
        if requested not in allowed:
            raise SystemExit(f"--cpu {requested} is not in this process's affinity set {allowed}")
        return requested
    # The last CPU of the set: CPU 0 tends to take more of the machine's interrupts and housekeeping.
    return allowed[-1]


def _median(values: Sequence[float]) -> float:
    return float(statistics.median(values)) if values else float("nan")


def _rate(lines: int, seconds: Sequence[float]) -> list[float]:
    return [lines / s if s > 0 else float("inf") for s in seconds]


# -- classification workers ----------------------------------------------------------------------------


def run_worker(kind: str, corpus: Path, repeats: int, cpu: int, profile: bool, no_unwrap: bool) -> dict[str, Any]:
    cmd = [
        sys.executable,
        "-m",
        "bench.worker",
        kind,
        str(corpus),
        "--repeats",
        str(repeats),
        "--cpu",
        str(cpu),
    ]
    if profile:
        cmd.append("--profile")
    if no_unwrap:
        cmd.append("--no-unwrap")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    proc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True, check=False)
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    if not lines:
        raise RuntimeError(f"{kind} worker exited {proc.returncode} without a result")
    result: dict[str, Any] = json.loads(lines[-1])
    if proc.returncode != 0 and "error" not in result:
        result["error"] = f"worker exited {proc.returncode}"
    return result


def _path_figures(prefix: str, res: dict[str, Any] | None, data_bytes: int) -> dict[str, Any]:
    if res is None or "error" in res:
        return {
            f"{prefix}_lines_per_s": None,
            f"{prefix}_error": None if res is None else res["error"],
        }
    lines = int(res["lines"])
    wall = [float(s) for s in res["wall_s"]]
    cpu = [float(s) for s in res["cpu_s"]]
    med_wall = _median(wall)
    return {
        f"{prefix}_lines_per_s": round(lines / med_wall),
        f"{prefix}_mb_per_s": round(data_bytes / med_wall / 1e6, 1),
        f"{prefix}_cpu_lines_per_s": round(lines / _median(cpu)),
        f"{prefix}_runs_s": [round(s, 4) for s in wall],
        f"{prefix}_runs_cpu_s": [round(s, 4) for s in cpu],
        f"{prefix}_runs_lines_per_s": [round(r) for r in _rate(lines, wall)],
        f"{prefix}_peak_rss_mb": round(float(res["peak_rss_mb"]), 1),
        f"{prefix}_rss_after_compile_mb": res["rss_after_compile_mb"],
        f"{prefix}_import_s": round(float(res["import_s"]), 3),
        f"{prefix}_load_rules_s": round(float(res["load_rules_s"]), 3),
        f"{prefix}_compile_s": round(float(res["compile_s"]), 3),
        f"{prefix}_warmup_s": round(float(res["warmup_s"]), 3),
        f"{prefix}_lines_seen": lines,
    }


def _findings(res: dict[str, Any] | None) -> Counter[tuple[str, str]] | None:
    if res is None or "error" in res:
        return None
    return Counter({(str(r), str(c)): int(n) for r, c, n in res["findings"]})


# -- grep ------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GrepPatterns:
    expressions: list[str]
    total: int
    skipped: list[dict[str, str]]


def grep_env() -> dict[str, str]:
    env = dict(os.environ)
    env["LC_ALL"] = "C"
    return env


def grep_patterns(rules: Sequence[Rule]) -> GrepPatterns:
    """Every rule pattern as ERE; those ERE cannot express, or grep rejects, are skipped and listed."""
    exprs: list[str] = []
    skipped: list[dict[str, str]] = []
    total = 0
    for rule in rules:
        for pattern in rule.patterns:
            total += 1
            try:
                expr = to_ere(pattern)
            except Unconvertible as exc:
                skipped.append({"rule_id": rule.id, "pattern": pattern, "reason": str(exc)})
                continue
            check = subprocess.run(
                [GREP, "-E", "-e", expr, os.devnull],
                env=grep_env(),
                capture_output=True,
                text=True,
                check=False,
            )
            if check.returncode > 1 or check.stderr.strip():
                reason = check.stderr.strip() or f"grep exited {check.returncode}"
                skipped.append({"rule_id": rule.id, "pattern": pattern, "reason": reason})
                continue
            exprs.append(expr)
    return GrepPatterns(exprs, total, skipped)


class GrepTimedOut(Exception):
    """A grep run was killed at the deadline after `elapsed_s` seconds without reaching the end."""

    def __init__(self, elapsed_s: float) -> None:
        super().__init__(f"grep killed after {elapsed_s:.1f} s")
        self.elapsed_s = elapsed_s


def _grep_once(cmd: list[str], cpu: int, timeout_s: float | None = None) -> tuple[float, float, int, float]:
    """(wall s, CPU s, matching lines, peak RSS MB) of one pinned grep run; killed (GrepTimedOut) when
    it runs past `timeout_s`."""

    def pin() -> None:
        os.sched_setaffinity(0, {cpu})

    t0 = time.perf_counter()
    # The parent is single-threaded here (the previous run's timer thread has been joined), so a
    # preexec_fn is safe.
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, env=grep_env(), preexec_fn=pin)  # noqa: PLW1509
    assert proc.stdout is not None
    killed = threading.Event()

    def kill() -> None:
        killed.set()
        proc.kill()

    timer = threading.Timer(max(timeout_s, 0.0), kill) if timeout_s is not None else None
    if timer is not None:
        timer.start()
    try:
        out = proc.stdout.read()
        _, status, usage = os.wait4(proc.pid, 0)
    finally:
        if timer is not None:
            timer.cancel()
            timer.join()
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    proc.stdout.close()
    if killed.is_set():
        raise GrepTimedOut(wall)
    if proc.returncode > 1:
        raise RuntimeError(f"grep exited {proc.returncode}")
    return wall, usage.ru_utime + usage.ru_stime, int(out.strip() or 0), usage.ru_maxrss / 1024


def run_grep(
    pats: GrepPatterns,
    corpus: Path,
    workdir: Path,
    repeats: int,
    cpu: int,
    limit_s: float | None = DEFAULT_GREP_LIMIT_S,
    lines: int = 0,
) -> dict[str, Any]:
    """The warm-up and the timed repeats of grep within `limit_s` seconds in all (None: no limit).
    Past the limit: `timed_out_after_s` and `lines_per_s_below` (the `lines` of the file were not
    read at that rate by the run that was killed) instead of the timings."""
    patfile = workdir / "patterns.ere"
    patfile.write_text("".join(e + "\n" for e in pats.expressions), encoding="utf-8")
    cmd = [GREP, "-E", "-c", "-f", str(patfile), str(corpus)]
    deadline = None if limit_s is None else time.perf_counter() + limit_s

    def once() -> tuple[float, float, int, float]:
        left = None if deadline is None else deadline - time.perf_counter()
        if left is not None and left <= 0:
            raise GrepTimedOut(0.0)  # no time left to start another run
        return _grep_once(cmd, cpu, left)

    try:
        once()  # warm-up (page cache, binary)
        runs = [once() for _ in range(repeats)]
    except GrepTimedOut as exc:
        return {
            "timed_out_after_s": limit_s,
            "lines_per_s_below": round(lines / exc.elapsed_s) if exc.elapsed_s > 0 else None,
        }
    return {
        "wall_s": [r[0] for r in runs],
        "cpu_s": [r[1] for r in runs],
        "matching_lines": runs[0][2],
        "peak_rss_mb": max(r[3] for r in runs),
    }


def grep_version() -> str | None:
    try:
        out = subprocess.run([GREP, "--version"], capture_output=True, text=True, check=False).stdout
    except OSError:
        return None
    return out.splitlines()[0] if out else None


# -- the benchmark -------------------------------------------------------------------------------------


def _hyperscan_version() -> str | None:
    try:
        return importlib.metadata.version("hyperscan")
    except importlib.metadata.PackageNotFoundError:
        return None


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return round(a / b, 2)


def run(args: argparse.Namespace) -> dict[str, Any]:
    started = time.perf_counter()
    load_start = os.getloadavg()[0]
    n_lines = QUICK_LINES if args.quick and args.lines is None else (args.lines or DEFAULT_LINES)
    cpu = pick_cpu(args.cpu)
    hs = has_hyperscan()

    rules = load_rules().rules
    workdir = Path(tempfile.mkdtemp(prefix="trainmedic-bench-"))
    corpus_path = workdir / "training-job.log"
    try:
        log(f"{len(rules)} rules; building the fault pool")
        pool = corpus_mod.fault_pool(rules)
        log(f"writing {n_lines:,} lines to {corpus_path}")
        corpus = corpus_mod.write_corpus(corpus_path, n_lines, pool, seed=args.seed)
        mb = corpus.bytes / 1e6
        log(f"corpus: {mb:.1f} MB, {corpus.fault_lines} fault lines, written in {corpus.gen_seconds:.1f} s")

        fast_res: dict[str, Any] | None = None
        if hs:
            log(f"fast path (Hyperscan) on CPU {cpu}, {args.repeats} repeats")
            fast_res = run_worker("fast", corpus_path, args.repeats, cpu, args.profile, args.no_unwrap)
        else:
            log("hyperscan is not installed: no fast-path figures")
        raw_res: dict[str, Any] | None = None
        if hs:
            log(f"raw Hyperscan scan (same patterns, no line bookkeeping) on CPU {cpu}, {args.repeats} repeats")
            raw_res = run_worker("raw", corpus_path, args.repeats, cpu, False, args.no_unwrap)
        log(f"re path on CPU {cpu}, {args.repeats} repeats")
        re_res = run_worker("re", corpus_path, args.repeats, cpu, args.profile, args.no_unwrap)

        pats = grep_patterns(rules)
        limit = args.grep_limit if args.grep_limit > 0 else None
        log(
            f"grep -E with {len(pats.expressions)}/{pats.total} patterns on CPU {cpu}, {args.repeats} repeats"
            + (f", at most {limit:g} s" if limit is not None else "")
        )
        grep_res = run_grep(pats, corpus_path, workdir, args.repeats, cpu, limit, corpus.lines)
        if "timed_out_after_s" in grep_res:
            log(f"grep did not finish within {limit:g} s: its figures are left out")
    finally:
        if args.keep:
            log(f"kept {workdir}")
        else:
            for p in workdir.iterdir():
                p.unlink()
            workdir.rmdir()

    fast = _path_figures("classify_fast", fast_res, corpus.bytes)
    slow = _path_figures("classify_re", re_res, corpus.bytes)
    grep_done = "wall_s" in grep_res
    grep_wall = [float(s) for s in grep_res.get("wall_s", [])]
    grep_cpu = [float(s) for s in grep_res.get("cpu_s", [])]
    grep_rate = round(corpus.lines / _median(grep_wall)) if grep_done else None

    raw_mb = None
    if raw_res is not None and "error" not in raw_res:
        raw_mb = round(corpus.bytes / _median([float(s) for s in raw_res["wall_s"]]) / 1e6, 1)
    fast_found, re_found = _findings(fast_res), _findings(re_res)
    paths_agree = None if fast_found is None or re_found is None else fast_found == re_found
    profiles = {
        kind: res.get("profile_top", [])
        for kind, res in (("fast", fast_res), ("re", re_res))
        if res is not None and res.get("profile_top")
    }
    peaks = [v for v in (fast.get("classify_fast_peak_rss_mb"), slow.get("classify_re_peak_rss_mb")) if v is not None]
    fast_rate = fast["classify_fast_lines_per_s"]
    re_rate = slow["classify_re_lines_per_s"]
    affinity = sorted(os.sched_getaffinity(0))
    result: dict[str, Any] = {
        "classify_fast_lines_per_s": fast_rate,
        "classify_re_lines_per_s": re_rate,
        "grep_lines_per_s": grep_rate,
        "classify_peak_rss_mb": max(peaks) if peaks else None,
        "fast_vs_grep": _ratio(fast_rate, grep_rate),
        "hyperscan_raw_mb_per_s": raw_mb,
        "fast_vs_raw": _ratio(fast.get("classify_fast_mb_per_s"), raw_mb),
        "re_vs_grep": _ratio(re_rate, grep_rate),
        "goal_fast_lines_per_s": GOAL_FAST_LINES_PER_S,
        "goal_re_lines_per_s": GOAL_RE_LINES_PER_S,
        "meets_fast_goal": None if fast_rate is None else fast_rate >= GOAL_FAST_LINES_PER_S,
        "meets_re_goal": None if re_rate is None else re_rate >= GOAL_RE_LINES_PER_S,
        "paths_agree": paths_agree,
        "findings_match_corpus": all(f is None or f == corpus.expected for f in (fast_found, re_found)),
        "findings_stable": all(r is None or bool(r.get("stable")) for r in (fast_res, re_res)),
        "findings_expected": sum(corpus.expected.values()),
        "findings_found_re": None if re_found is None else sum(re_found.values()),
        "findings_found_fast": None if fast_found is None else sum(fast_found.values()),
        # corpus
        "lines": corpus.lines,
        "bytes": corpus.bytes,
        "fault_lines": corpus.fault_lines,
        "fault_fraction": corpus.fault_lines / corpus.lines if corpus.lines else 0.0,
        "corpus_seed": corpus.seed,
        "corpus_gen_s": round(corpus.gen_seconds, 2),
        "fault_pool_size": corpus.pool_size,
        "fault_pool_from_real_logs": corpus.pool_from_real_logs,
        "fault_pool_from_examples": corpus.pool_from_examples,
        # rules
        "rules": len(rules),
        "patterns": sum(len(r.patterns) for r in rules),
        "engine_unwrap": (re_res or {}).get("unwrap"),
        # machine
        "cores": os.cpu_count(),
        "cores_affinity": len(affinity),
        "affinity": affinity,
        "pinned_cpu": cpu,
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "hyperscan_present": hs,
        "hyperscan_version": _hyperscan_version(),
        "grep_version": grep_version(),
        "loadavg_1m_start": round(load_start, 2),
        "loadavg_1m_end": round(os.getloadavg()[0], 2),
        # method
        "repeats": args.repeats,
        "statistic": "median of repeats, wall clock; *_cpu_lines_per_s use process CPU time",
        **fast,
        **slow,
        "grep_patterns_used": len(pats.expressions),
        "grep_patterns_total": pats.total,
        "grep_patterns_skipped": pats.skipped,
        "grep_cpu_lines_per_s": round(corpus.lines / _median(grep_cpu)) if grep_done else None,
        "grep_mb_per_s": round(corpus.bytes / _median(grep_wall) / 1e6, 1) if grep_done else None,
        "grep_runs_s": [round(s, 4) for s in grep_wall],
        "grep_runs_cpu_s": [round(s, 4) for s in grep_cpu],
        "grep_runs_lines_per_s": [round(r) for r in _rate(corpus.lines, grep_wall)],
        "grep_matching_lines": grep_res.get("matching_lines"),
        "grep_peak_rss_mb": round(float(grep_res["peak_rss_mb"]), 1) if grep_done else None,
        "grep_command": "LC_ALL=C grep -E -c -f PATTERNS FILE",
        "grep_limit_s": args.grep_limit if args.grep_limit > 0 else None,
        "grep_timed_out_after_s": grep_res.get("timed_out_after_s"),
        "grep_lines_per_s_below": grep_res.get("lines_per_s_below"),
        "bench_seconds": round(time.perf_counter() - started, 1),
    }
    if profiles:
        result["profile_top"] = profiles
    log("diagnosis accuracy on the held-out real excerpts (bench/heldout.py)")
    result.update(heldout_mod.figures())
    return result


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description="Rule-engine throughput per core, as one JSON object.")
    ap.add_argument("--lines", type=int, default=None, help=f"corpus size in lines (default {DEFAULT_LINES:,})")
    ap.add_argument("--quick", action="store_true", help=f"smoke run on {QUICK_LINES:,} lines")
    ap.add_argument("--repeats", type=int, default=3, help="timed repeats per path (median reported)")
    ap.add_argument("--cpu", type=int, default=None, help="CPU to pin to (default: the last one allowed)")
    ap.add_argument("--seed", type=int, default=corpus_mod.DEFAULT_SEED, help="corpus seed")
    ap.add_argument("--output", type=Path, default=RESULTS, help="where to write the JSON (default bench/results.json)")
    ap.add_argument("--profile", action="store_true", help="add a cProfile top list per path (one extra scan)")
    ap.add_argument(
        "--no-unwrap", action="store_true", help="Engine(..., unwrap=False): no hard-wrap view, as the pipeline runs it"
    )
    ap.add_argument("--keep", action="store_true", help="keep the generated corpus and pattern file")
    ap.add_argument(
        "--grep-limit",
        type=float,
        default=DEFAULT_GREP_LIMIT_S,
        help=f"seconds for all grep runs together (default {DEFAULT_GREP_LIMIT_S:g}; 0: no limit)",
    )
    ap.add_argument("--no-pipeline", action="store_true", help="no event-pipeline figures")
    ap.add_argument("--no-remediation", action="store_true", help="no self-healing figures")
    ap.add_argument("--no-coldstart", action="store_true", help="no `trainmedic diagnose` start-up figures")
    ap.add_argument("--no-hang", action="store_true", help="no hang-detection figures")
    ap.add_argument("--no-realplane", action="store_true", help="no figures on the real control plane")
    ap.add_argument("--no-console", action="store_true", help="no web console figures")
    ap.add_argument(
        "--real-repetitions",
        type=int,
        default=None,
        help="Xid 79 incidents on the real control plane (default 5; 2 with --quick)",
    )
    args = ap.parse_args(argv)
    if args.repeats < 1:
        ap.error("--repeats must be at least 1")
    if args.grep_limit < 0:
        ap.error("--grep-limit must not be negative")
    if args.lines is not None and args.lines < 1:
        ap.error("--lines must be at least 1")
    if args.real_repetitions is not None and args.real_repetitions < 1:
        ap.error("--real-repetitions must be at least 1")
    return args


GOAL_PIPELINE_LINES_PER_S = 200_000
GOAL_FAULT_TO_DIAGNOSIS_P99_MS = 100
GOAL_AGENT_RSS_MB = 250


def run_pipeline_figures(args: argparse.Namespace) -> dict[str, Any]:
    """The event-pipeline figures (bench/pipeline.py through tansu; bench/rss.py against kmock)."""
    from bench.pipeline import run_pipeline
    from bench.rss import run_rss

    log("pipeline through the tansu broker (producer, brain, broker share the machine)")
    out = run_pipeline(quick=args.quick, repeats=args.repeats)
    log("agent memory with 1,000 watched pods (trainmedic run --role all against kmock)")
    out.update(run_rss())
    out["goals_pipeline"] = {
        "pipeline_lines_per_s": GOAL_PIPELINE_LINES_PER_S,
        "fault_to_diagnosis_p99_ms": GOAL_FAULT_TO_DIAGNOSIS_P99_MS,
        "agent_rss_mb_1000_pods": GOAL_AGENT_RSS_MB,
    }
    return out


def run_remediation_figures(args: argparse.Namespace) -> dict[str, Any]:
    """The self-healing figures (bench/remediation.py: the real agent and save_scene against kmock).
    A failure is reported in the JSON (`remediation_error`) rather than losing the figures above."""
    from bench.remediation import (
        GOAL_DIAGNOSIS_TO_RESCHEDULE_P99_MS,
        GOAL_DIAGNOSIS_TO_WEBHOOK_P99_MS,
        GOAL_SCENE_BUNDLE_64_PODS_S,
        run_remediation,
    )

    log("self-healing: diagnosis to reschedule, scene bundle of a 64-pod job (against kmock)")
    try:
        out = run_remediation(iterations=10 if args.quick else 30, repeats=args.repeats)
    except Exception as exc:  # noqa: BLE001 - reported in the JSON
        log(f"self-healing figures failed: {type(exc).__name__}: {exc}")
        out = {"remediation_error": f"{type(exc).__name__}: {exc}"}
    p99, scene_s = out.get("diagnosis_to_reschedule_p99_ms"), out.get("scene_bundle_64_pods_s")
    out["meets_diagnosis_to_reschedule_goal"] = None if p99 is None else p99 <= GOAL_DIAGNOSIS_TO_RESCHEDULE_P99_MS
    out["meets_scene_bundle_goal"] = None if scene_s is None else scene_s <= GOAL_SCENE_BUNDLE_64_PODS_S
    hook = out.get("diagnosis_to_webhook_p99_ms")
    out["meets_diagnosis_to_webhook_goal"] = None if hook is None else hook <= GOAL_DIAGNOSIS_TO_WEBHOOK_P99_MS
    out["goals_remediation"] = {
        "diagnosis_to_webhook_p99_ms": GOAL_DIAGNOSIS_TO_WEBHOOK_P99_MS,
        "diagnosis_to_reschedule_p99_ms": GOAL_DIAGNOSIS_TO_RESCHEDULE_P99_MS,
        "scene_bundle_64_pods_s": GOAL_SCENE_BUNDLE_64_PODS_S,
    }
    return out


GOAL_REAL_FAULT_TO_PODS_RUNNING_P99_S = 5.0
GOAL_AGENT_RSS_MB_5000_PODS = 300.0


def run_realplane_figures(args: argparse.Namespace) -> dict[str, Any]:
    """The self-healing figures on the real control plane (bench/realplane.py); null figures and
    `realplane_error` when the plane is not built or fails, never an exception."""
    from bench.realplane import run_realplane

    reps = args.real_repetitions or (2 if args.quick else 5)
    log(f"self-healing on the real control plane: {reps} Xid 79 incidents and a lost node (bench/realplane.py)")
    # The scale figures (1,000 KWOK nodes, 5,000 pods) take minutes: not in a --quick smoke run.
    out = run_realplane(repetitions=reps, scale_pods=0 if args.quick else 5000)
    if args.quick:
        out["scale_skipped"] = "--quick"
    p99 = out.get("real_fault_to_pods_running_p99_s")
    out["meets_real_fault_to_pods_running_goal"] = None if p99 is None else p99 <= GOAL_REAL_FAULT_TO_PODS_RUNNING_P99_S
    rss = out.get("agent_rss_mb_5000_pods")
    out["meets_agent_rss_5000_pods_goal"] = None if rss is None else rss <= GOAL_AGENT_RSS_MB_5000_PODS
    out["goals_realplane"] = {
        "real_fault_to_pods_running_p99_s": GOAL_REAL_FAULT_TO_PODS_RUNNING_P99_S,
        "agent_rss_mb_5000_pods": GOAL_AGENT_RSS_MB_5000_PODS,
    }
    return out


# Figures that `make soak` (bench/soak.py) merges into the same file: a bench run does not make them,
# so it keeps them rather than dropping the last soak's measurements.
SOAK_PREFIXES = ("soak_", "responder_")


def with_soak_figures(result: dict[str, Any], path: Path) -> dict[str, Any]:
    """`result` plus the soak's figures already in `path` (those this run did not make itself)."""
    try:
        before = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return result
    if not isinstance(before, dict):
        return result
    kept = {k: v for k, v in before.items() if k.startswith(SOAK_PREFIXES) and k not in result}
    return {**result, **kept}


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    result = run(args)
    if not args.no_pipeline:
        result.update(run_pipeline_figures(args))
    if not args.no_remediation:
        result.update(run_remediation_figures(args))
        from bench.breaker import run_breaker

        result.update(run_breaker())
    if not args.no_coldstart:
        from bench.coldstart import run_coldstart

        log("`trainmedic diagnose` of one line as a fresh process (bench/coldstart.py)")
        result.update(run_coldstart(repeats=max(5, args.repeats)))
    if not args.no_hang:
        from bench.hang import measure as measure_hang

        log("hang detection: 24-hour replays of every progress format under fake time (bench/hang.py)")
        result.update(measure_hang((1,) if args.quick else (1, 2, 3)))
    if not args.no_realplane:
        result.update(run_realplane_figures(args))
    if not args.no_console:
        from bench.console import run_console

        log("web console: list and incident pages over 10,000 incidents in SQLite (bench/console.py)")
        result.update(run_console(requests=100 if args.quick else 300))
    result = with_soak_figures(result, args.output)
    text = json.dumps(result, indent=2, ensure_ascii=False)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(text + "\n", encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
