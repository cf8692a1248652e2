"""The circuit breaker under concurrent faults (`make bench` merges the figure into its JSON).

    python -m bench.breaker

* `breaker_concurrent_faults`: 32 nodes of a 64-node pool report Xid 79 within one second, each
  failing a different job, with `circuit_breaker.max_share: 0.1` in enforce mode; the figure is
  how many nodes the real responder (policy, SQLite incident store, in-memory policy state) quarantined.
  The goal is floor(0.1 x 64) = 6 exactly. The cluster is the in-memory stand-in of
  tests/remediations/respfix.py, whose every call yields to the loop as an API round trip does, so
  the 32 incidents interleave at each call.
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


async def _run(tmp: Path) -> int:
    from respfix import FakeKube, diagnosis, harness, node, policy

    kube = FakeKube(nodes={f"gpu-{i}": node(f"gpu-{i}") for i in range(POOL)})
    h = harness(tmp, policy(f"circuit_breaker:\n  max_share: {SHARE}\n"), kube)
    try:
        await asyncio.gather(
            *(h.handle(diagnosis("train", f"job-{i}", f"gpu-{i}", t=1000.0 + i / FAILING)) for i in range(FAILING))
        )
    finally:
        h.store.close()
    return len(kube.quarantines)


def run_breaker() -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="trainmedic-bench-breaker-") as tmp:
        quarantined = asyncio.run(_run(Path(tmp)))
    return {
        "breaker_concurrent_faults": quarantined,
        "goals_breaker": {"breaker_concurrent_faults": int(SHARE * POOL)},
    }


if __name__ == "__main__":
    print(json.dumps(run_breaker(), indent=2))
