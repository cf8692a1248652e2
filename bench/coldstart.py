"""How long `trainmedic diagnose` takes as a fresh process: `diagnose_cold_s`.

    python -m bench.coldstart [--repeats N]        (make bench runs it through bench/run.py)

The command is the one users type, `trainmedic diagnose --logs ONE_LINE_FILE --format json`, on one
real log line (the first row of tests/data/real-logs.jsonl, a CUDA OOM), each run a new process:

- `diagnose_cold_s`: median wall time with a warm compile cache (trainmedic/cache.py), the usual
  case: every run after the first on a machine, and after every run of the daemon;
- `diagnose_first_run_s`: median wall time with an empty cache (a new cache folder per run): the
  rule files and the catalog it needs are parsed, the examples run, the Hyperscan database compiled;
- `diagnose_nocache_s`: median wall time with the cache turned off (`TRAINMEDIC_CACHE_DIR=`);
- `diagnose_cold_cpu_s`: median CPU time (user + system) of the warm runs, steadier under load.

Bytecode is written and reused as in an installed package (PYTHONDONTWRITEBYTECODE is dropped for
the runs; `--no-bytecode` keeps it), so the figure is the program's start, not Python compiling it.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
REAL_LOGS = ROOT / "tests" / "data" / "real-logs.jsonl"
GOAL_DIAGNOSE_COLD_S = 0.3


def _command(log: Path) -> list[str]:
    script = Path(sys.executable).parent / "trainmedic"
    head = [str(script)] if script.is_file() else [sys.executable, "-m", "trainmedic.agent.cli"]
    return [*head, "diagnose", "--logs", str(log), "--format", "json"]


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _once(cmd: list[str], env: dict[str, str], cpu: list[float] | None = None) -> float:
    c0 = _children_cpu()
    t0 = time.perf_counter()
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False)
    elapsed = time.perf_counter() - t0
    if cpu is not None:
        cpu.append(_children_cpu() - c0)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {out.returncode}: {out.stderr.strip()[-500:]}")
    json.loads(out.stdout)
    return elapsed


def run_coldstart(repeats: int = 7, *, bytecode: bool = True) -> dict[str, Any]:
    first_row = json.loads(REAL_LOGS.read_text(encoding="utf-8").splitlines()[0])
    base = {k: v for k, v in os.environ.items() if k != "TRAINMEDIC_CACHE_DIR"}
    if bytecode:
        base.pop("PYTHONDONTWRITEBYTECODE", None)
    with tempfile.TemporaryDirectory(prefix="trainmedic-coldstart-") as tmp:
        work = Path(tmp)
        log = work / "one.log"
        log.write_text(first_row["text"] + "\n", encoding="utf-8")
        cmd = _command(log)
        nocache_env = dict(base, TRAINMEDIC_CACHE_DIR="")
        _once(cmd, nocache_env)  # bytecode written, files in the page cache
        nocache = [_once(cmd, nocache_env) for _ in range(max(1, repeats // 2))]
        first = [
            _once(cmd, dict(base, TRAINMEDIC_CACHE_DIR=str(work / f"empty-{i}"))) for i in range(max(1, repeats // 2))
        ]
        warm_env = dict(base, TRAINMEDIC_CACHE_DIR=str(work / "warm"))
        _once(cmd, warm_env)
        warm_cpu: list[float] = []
        warm = [_once(cmd, warm_env, warm_cpu) for _ in range(repeats)]
    cold = statistics.median(warm)
    return {
        "diagnose_cold_s": round(cold, 3),
        # CPU seconds (user + system) of the same runs: steadier than wall time on a shared machine.
        "diagnose_cold_cpu_s": round(statistics.median(warm_cpu), 3),
        "diagnose_first_run_s": round(statistics.median(first), 3),
        "diagnose_nocache_s": round(statistics.median(nocache), 3),
        "diagnose_cold_runs_s": [round(x, 3) for x in warm],
        "diagnose_command": " ".join([Path(cmd[0]).name, *cmd[1:3], "ONE_LINE_FILE", *cmd[4:]]),
        "meets_diagnose_cold_goal": cold <= GOAL_DIAGNOSE_COLD_S,
        "goals_coldstart": {"diagnose_cold_s": GOAL_DIAGNOSE_COLD_S},
    }


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="`trainmedic diagnose` as a fresh process, as one JSON object.")
    ap.add_argument("--repeats", type=int, default=7, help="timed runs with a warm cache (median reported)")
    ap.add_argument("--no-bytecode", action="store_true", help="keep PYTHONDONTWRITEBYTECODE as it is set")
    args = ap.parse_args(argv)
    print(json.dumps(run_coldstart(max(1, args.repeats), bytecode=not args.no_bytecode), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
