"""The web console's server time with a large store (`make bench` merges the figures into its JSON).

    python -m bench.console [--incidents 10000] [--requests 300]

* `console_list_p99_ms`: GET /console/incidents, a mix of the list as people use it (no filter,
  each filter alone, two together, a time range, deep pages), through the whole app (auth
  middleware, SQLite query, Jinja2 page) over httpx's ASGI transport, so it is the server's time
  without a network; p50 and p99 of `--requests` requests after a warm-up.
* `console_incident_p99_ms`: GET /console/incidents/{id} of random incidents (outcome, actions,
  timeline, evidence; the report is a separate request of the page's frame).

The store holds `--incidents` incidents (10,000 by default) written in one transaction with the
store's own schema: a diagnosis with evidence lines, a plan of two actions, and six timeline rows
each, spread over 500 nodes, 2,000 jobs, every status, four chips and six fault classes.
Goal: 100 ms each (issue 16).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

GOAL_CONSOLE_P99_MS = 100.0
TOKEN = "bench-console-token"
STATUSES = ("open", "observed", "awaiting_approval", "rejected", "acting", "resolved", "blocked", "failed")
CLASSES = ("device_error", "accelerator_oom", "comm_init", "comm_error", "hang", "node_failure")
CHIPS = ("nvidia", "ascend", "cambricon", "generic")


def _diagnosis(i: int, fault: str, chip: str, node: str) -> dict[str, Any]:
    line = f"NVRM: Xid (PCI:0000:3b:00): 79, pid={2000 + i}, name=python, GPU has fallen off the bus."
    return {
        "root_cause": {
            "fault_class": fault,
            "chip": chip,
            "code": "xid:79",
            "summary": {"en": f"{node}: GPU 0000:3b:00 reported Xid 79", "zh": f"{node}：GPU 0000:3b:00 上报 Xid 79"},
            "hint": {"en": "Drain the node and reset the GPU", "zh": "排空节点并重置 GPU"},
            "rule_id": "nvidia.xid.79",
            "severity": "critical",
        },
        "findings": [
            {"rule_id": "nvidia.xid.79", "file": f"rank-{k}.log", "line_no": 100 + k, "code": "xid:79", "text": line}
            for k in range(4)
        ],
        "distinct_findings": 4,
        "lines_scanned": 120_000,
    }


def seed(path: Path, n: int, *, now: float, rng: random.Random) -> list[str]:
    """`n` incidents in a new store at `path` (the store's schema, one transaction); their ids."""
    from trainmedic.agent.store import IncidentStore

    IncidentStore(path).close()  # the schema, as the agent creates it
    import sqlite3

    db = sqlite3.connect(path)
    ids = []
    with db:
        for i in range(n):
            iid = f"{i:08x}{rng.getrandbits(64):016x}"
            ids.append(iid)
            fault, chip = rng.choice(CLASSES), rng.choice(CHIPS)
            node, job = f"gpu-{rng.randrange(500)}", f"job-{rng.randrange(2000)}"
            created = now - (n - i) * 60.0
            status = rng.choice(STATUSES)
            plan = {"actions": ["quarantine_node", "restart_job"], "fault_class": fault}
            db.execute(
                "INSERT INTO incidents (id, key, status, created, updated, diagnosis, namespace, job, job_kind, "
                "node, fault_class, code, chip, mode, revision, plan) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    iid,
                    f"job:train/{job}",
                    status,
                    created,
                    created + 30.0,
                    json.dumps(_diagnosis(i, fault, chip, node)),
                    "train",
                    job,
                    "PyTorchJob",
                    node,
                    fault,
                    "xid:79",
                    chip,
                    "enforce",
                    1,
                    json.dumps(plan),
                ),
            )
            for seq, (name, params) in enumerate((("quarantine_node", {"node": node}), ("restart_job", {"job": job}))):
                db.execute(
                    "INSERT INTO actions (incident_id, seq, name, state, params, result, started, finished) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    (iid, seq, name, "done", json.dumps(params), json.dumps({"node": node}), created, created + 5),
                )
            for k, kind in enumerate(("detected", "scene_saved", "planned", "action:quarantine_node:done")):
                db.execute(
                    "INSERT INTO timeline (incident_id, t, kind, detail) VALUES (?, ?, ?, ?)",
                    (iid, created + k, kind, json.dumps({"revision": 1})),
                )
            for k, kind in enumerate(("action:restart_job:done", f"status:{status}")):
                db.execute(
                    "INSERT INTO timeline (incident_id, t, kind, detail) VALUES (?, ?, ?, ?)",
                    (iid, created + 10 + k, kind, json.dumps({"resumed_from": "checkpoint-20"})),
                )
    db.close()
    return ids


def _list_queries(rng: random.Random, now: float, n: int) -> list[dict[str, str]]:
    def iso(t: float) -> str:
        return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M")

    shapes: list[Callable[[], dict[str, str]]] = [
        lambda: {},
        lambda: {"status": rng.choice(STATUSES)},
        lambda: {"fault_class": rng.choice(CLASSES)},
        lambda: {"chip": rng.choice(CHIPS)},
        lambda: {"node": f"gpu-{rng.randrange(500)}"},
        lambda: {"job": f"train/job-{rng.randrange(2000)}"},
        lambda: {"status": rng.choice(STATUSES), "chip": rng.choice(CHIPS)},
        lambda: {"since": iso(now - n * 60.0 * rng.random()), "until": iso(now)},
        lambda: {"page": str(rng.randrange(1, max(2, n // 50)))},
        lambda: {"status": rng.choice(STATUSES), "page": "5"},
    ]
    return [rng.choice(shapes)() for _ in range(n)]


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


async def _measure(path: Path, ids: list[str], *, requests: int, now: float, rng: random.Random) -> dict[str, Any]:
    import httpx

    from trainmedic.agent.api import create_app
    from trainmedic.agent.config import ApiSettings
    from trainmedic.agent.store import IncidentStore
    from trainmedic.agent.telemetry import Telemetry

    store = IncidentStore(path)
    app = create_app(store=store, telemetry=Telemetry(), settings=ApiSettings(token=TOKEN), env={})
    headers = {"Authorization": f"Bearer {TOKEN}"}
    out: dict[str, list[float]] = {"list": [], "incident": []}
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://bench") as c:
            lists = _list_queries(rng, now, requests + 20)
            pages = [rng.choice(ids) for _ in range(requests + 20)]
            for k in range(requests + 20):
                t0 = time.perf_counter()
                r = await c.get("/console/incidents", params=lists[k], headers=headers)
                t1 = time.perf_counter()
                if r.status_code != 200:
                    raise RuntimeError(f"list {lists[k]}: HTTP {r.status_code}")
                q = await c.get(f"/console/incidents/{pages[k]}", headers=headers)
                t2 = time.perf_counter()
                if q.status_code != 200:
                    raise RuntimeError(f"incident {pages[k]}: HTTP {q.status_code}")
                if k >= 20:  # the first requests warm the templates and SQLite's cache
                    out["list"].append((t1 - t0) * 1e3)
                    out["incident"].append((t2 - t1) * 1e3)
    finally:
        store.close()
    result: dict[str, Any] = {}
    for name, values in out.items():
        result[f"console_{name}_p50_ms"] = round(statistics.median(values), 2)
        result[f"console_{name}_p99_ms"] = round(_pct(values, 0.99), 2)
    return result


def run_console(*, incidents: int = 10_000, requests: int = 300, seed_value: int = 16) -> dict[str, Any]:
    rng = random.Random(seed_value)
    now = time.time()
    with tempfile.TemporaryDirectory(prefix="trainmedic-bench-console-") as tmp:
        path = Path(tmp) / "incidents.db"
        t0 = time.perf_counter()
        ids = seed(path, incidents, now=now, rng=rng)
        seeded = time.perf_counter() - t0
        figures = asyncio.run(_measure(path, ids, requests=requests, now=now, rng=rng))
    figures.update(
        console_incidents=incidents,
        console_requests=requests,
        console_seed_s=round(seeded, 2),
        console_method="httpx ASGI transport in process (server time, no network), bearer auth, "
        "list queries mixed over filters and pages",
        meets_console_goal=figures["console_list_p99_ms"] <= GOAL_CONSOLE_P99_MS
        and figures["console_incident_p99_ms"] <= GOAL_CONSOLE_P99_MS,
        goals_console={"console_list_p99_ms": GOAL_CONSOLE_P99_MS, "console_incident_p99_ms": GOAL_CONSOLE_P99_MS},
    )
    return figures


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Console server time with a large incident store.")
    ap.add_argument("--incidents", type=int, default=10_000)
    ap.add_argument("--requests", type=int, default=300)
    args = ap.parse_args(argv)
    if args.incidents < 1 or args.requests < 1:
        ap.error("--incidents and --requests must be at least 1")
    print(json.dumps(run_console(incidents=args.incidents, requests=args.requests), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
