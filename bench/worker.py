"""One classification path, measured in a process of its own (`python -m bench.worker`).

The parent (bench/run.py) starts one worker per path, so each path's peak RSS is its own and the
imports of one cannot warm the other. The worker pins itself to one CPU, loads and compiles the
shipped rules, scans the corpus once to warm up, then times `--repeats` scans and prints one JSON
object on stdout.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import resource
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any


def _vm_kib(field: str) -> int | None:
    """A `Vm*` figure of this process from /proc (KiB), where the platform has one."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _cpu_seconds() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def measure(
    path_kind: str, corpus: Path, repeats: int, cpu: int | None, profile: bool, unwrap: bool | None = None
) -> dict[str, Any]:
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    t0 = time.perf_counter()
    from trainmedic.detectors.engine import CHUNK_BYTES, Engine, has_hyperscan
    from trainmedic.detectors.loader import load_rules

    import_s = time.perf_counter() - t0
    fast = path_kind in ("fast", "raw")
    if fast and not has_hyperscan():
        return {"path": path_kind, "error": "hyperscan is not installed"}

    t0 = time.perf_counter()
    rules = load_rules().rules
    load_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    # unwrap=None keeps the engine's default (what `Engine(rules, fast=...)` does).
    engine = Engine(rules, fast=fast) if unwrap is None else Engine(rules, fast=fast, unwrap=unwrap)
    compile_s = time.perf_counter() - t0
    rss_compiled_kib = _vm_kib("VmRSS")

    def scan() -> tuple[Counter[tuple[str, str]], int]:
        if path_kind == "raw":
            # The same Hyperscan database over the same bytes, chunk by chunk, and nothing else.
            hits = lines = 0
            with corpus.open("rb") as fh:
                while block := fh.read(CHUNK_BYTES):
                    hits += engine.prefilter_hits(block)
                    lines += block.count(b"\n")
            return Counter({("prefilter", "hits"): hits}), lines
        with corpus.open("rb") as fh:
            found, n_lines = engine.scan_stream(fh, file=str(corpus))
        counts: Counter[tuple[str, str]] = Counter()
        for f in found:
            counts[(f.rule_id, f.code)] += f.count
        return counts, n_lines

    t0 = time.perf_counter()
    reference, n_lines = scan()
    warmup_s = time.perf_counter() - t0

    wall: list[float] = []
    cpu_s: list[float] = []
    stable = True
    for _ in range(repeats):
        c0 = _cpu_seconds()
        t0 = time.perf_counter()
        counts, n = scan()
        wall.append(time.perf_counter() - t0)
        cpu_s.append(_cpu_seconds() - c0)
        stable = stable and counts == reference and n == n_lines

    # ru_maxrss is in KiB on Linux; read before the optional profiling scan.
    peak_rss_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    top: list[str] = []
    if profile:
        prof = cProfile.Profile()
        prof.enable()
        scan()
        prof.disable()
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(15)
        top = [line.rstrip() for line in buf.getvalue().splitlines() if line.strip()]

    return {
        "path": path_kind,
        "pid": os.getpid(),
        "cpu": cpu,
        "affinity": sorted(os.sched_getaffinity(0)),
        "unwrap": getattr(engine, "unwrap", None),
        "rules": len(rules),
        "patterns": sum(len(r.patterns) for r in rules),
        "import_s": import_s,
        "load_rules_s": load_s,
        "compile_s": compile_s,
        "warmup_s": warmup_s,
        "lines": n_lines,
        "wall_s": wall,
        "cpu_s": cpu_s,
        "stable": stable,
        "findings": sorted([rule_id, code, count] for (rule_id, code), count in reference.items()),
        "rss_after_compile_mb": None if rss_compiled_kib is None else rss_compiled_kib / 1024,
        "peak_rss_mb": peak_rss_kib / 1024,
        "profile_top": top,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("path", choices=("fast", "re", "raw"))
    ap.add_argument("corpus", type=Path)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--cpu", type=int, default=None)
    ap.add_argument("--profile", action="store_true", help="one extra scan under cProfile")
    ap.add_argument("--no-unwrap", action="store_true", help="Engine(..., unwrap=False), as the pipeline runs it")
    args = ap.parse_args(argv)
    result = measure(args.path, args.corpus, args.repeats, args.cpu, args.profile, False if args.no_unwrap else None)
    json.dump(result, sys.stdout)
    sys.stdout.write("\n")
    return 0 if "error" not in result else 1


if __name__ == "__main__":
    sys.exit(main())
