"""The circuit breaker under concurrent faults (`make bench` merges the figure into its JSON).

    python -m bench.breaker

* `breaker_concurrent_faults`: 32 nodes of a 64-node pool report Xid 79 within one second, each
  failing a different job, with `circuit_breaker.max_share: 0.1` in enforce mode; the figure is
  how many nodes the real responder (policy, SQLite incident store, in-memory policy state) quarantined.
  The goal is floor(0.1 x 64) = 6 exactly. The cluster is the in-memory stand-in of
  tests/remediations/respfix.py, whose every call yields to the loop as an API round trip does, so
  the 32 incidents interleave at each call.
* `breaker_concurrent_faults_two_brains`: the same faults handled by two brains that share nothing
  but the cluster (each its own incident store and policy state, the incidents dealt alternately):
  the claims on the nodes (`trainmedic.io/breaker-claim`) keep the sum at 6 as well.
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

for _p in (Path(__file__).resolve().parent.parent / "tests" / "remediations",):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

POOL = 64
FAILING = 32
SHARE = 0.1


async def _run(tmp: Path, brains: int = 1) -> int:
    from respfix import FakeKube, diagnosis, harness, node, policy

    kube = FakeKube(nodes={f"gpu-{i}": node(f"gpu-{i}") for i in range(POOL)})
    hs = []
    for b in range(brains):
        (tmp / f"brain-{b}").mkdir()
        hs.append(harness(tmp / f"brain-{b}", policy(f"circuit_breaker:\n  max_share: {SHARE}\n"), kube))
    try:
        await asyncio.gather(
            *(
                hs[i % brains].handle(diagnosis("train", f"job-{i}", f"gpu-{i}", t=1000.0 + i / FAILING))
                for i in range(FAILING)
            )
        )
    finally:
        for h in hs:
            h.store.close()
    return len(kube.quarantines)


def run_breaker() -> dict[str, Any]:
    figures: dict[str, int] = {}
    for brains, name in ((1, "breaker_concurrent_faults"), (2, "breaker_concurrent_faults_two_brains")):
        with tempfile.TemporaryDirectory(prefix="trainmedic-bench-breaker-") as tmp:
            figures[name] = asyncio.run(_run(Path(tmp), brains))
    return {
        **figures,
        "goals_breaker": {name: int(SHARE * POOL) for name in figures},
    }


if __name__ == "__main__":
    print(json.dumps(run_breaker(), indent=2))
