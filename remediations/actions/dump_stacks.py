"""dump_stacks: the Python stacks of the job's training processes, taken into the incident's scene
right before a restart kills them (`stacks-before-restart/<pod>.txt` and `index.json` there).

How (remediations.stacks, through the pod exec API): `py-spy dump` of each Python process, else the
faulthandler dump a process registered for SIGUSR1 (only sent where /proc shows the handler: the
default action of SIGUSR1 would kill the process). The text goes through the scene's redaction.

Preconditions: none that can stop what follows. No workload, no running pod, no exec, no py-spy,
RBAC forbidding exec, a timeout: the journal records why and the action ends `skipped` (or `done`
with what could be taken); it never raises, so the restart after it always runs.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trainmedic.remediations.actions.base import ActionCall, ActionDef
from trainmedic.remediations.policy import DumpStacksSpec
from trainmedic.remediations.scene import redact_text
from trainmedic.remediations.stacks import StackDump, dump_stacks

log = logging.getLogger("trainmedic.responder")

SUBDIR = "stacks-before-restart"
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def _running(pod: Mapping[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") == "Running"


def _save(scene: Path, dumps: Mapping[str, StackDump]) -> list[str]:
    """Write each pod's stacks (redacted) and an index; the files written, relative to the scene."""
    out = scene / SUBDIR
    out.mkdir(parents=True, exist_ok=True)
    files: list[str] = []
    index: dict[str, Any] = {}
    for name, dump in sorted(dumps.items()):
        entry = dump.as_dict()
        if dump.text:
            text, _ = redact_text(dump.text)
            rel = f"{SUBDIR}/{_UNSAFE.sub('_', name)[:200]}.txt"
            tmp = scene / f"{rel}.tmp"
            tmp.write_text(text, encoding="utf-8")
            os.replace(tmp, scene / rel)
            files.append(rel)
            entry["file"] = rel
        index[name] = entry
    (out / "index.json").write_text(json.dumps(index, ensure_ascii=False, indent=2, sort_keys=True), encoding="utf-8")
    return files


async def _take(call: ActionCall) -> dict[str, Any]:
    rt, job = call.runtime, call.job
    assert job is not None
    pods = [p for p in await rt.job_pods(job) if _running(p)]
    if not pods:
        return {"reason": "no running pod of the job: nothing to take stacks from", "pods": 0}
    timeout = rt.settings.stack_timeout_s
    # dump_stacks bounds each pod by `timeout` and never raises; the outer bound is for the exec layer.
    dumps = await asyncio.wait_for(dump_stacks(rt.stack_source, pods, timeout_s=timeout), timeout=2 * timeout + 5)
    taken = {n: d for n, d in dumps.items() if d.text}
    scene = await rt.scene_path(call.incident_id)
    if scene is None:
        return {"reason": "the incident has no scene directory to keep the stacks in", "pods": len(pods)}
    files = await asyncio.to_thread(_save, scene, dumps)
    result: dict[str, Any] = {
        "pods": len(pods),
        "dumped": len(taken),
        "files": files,
        "methods": {n: d.method.value for n, d in taken.items() if d.method is not None},
    }
    if not taken:
        reasons = sorted({d.reason.en for d in dumps.values() if d.reason is not None})
        result["reason"] = "no stack could be taken: " + ("; ".join(reasons) or "unknown")
    return result


async def run(call: ActionCall) -> None:
    if call.job is None:
        await call.journal.update(call.seq, "skipped", result={"reason": "the incident has no workload"})
        return
    await call.journal.update(call.seq, "running")
    try:
        result = await _take(call)
    except asyncio.CancelledError:
        raise
    except Exception as e:  # noqa: BLE001 - evidence is best effort: it never holds the restart back
        log.warning("incident %s: stacks not taken: %s: %s", call.incident_id, type(e).__name__, e)
        result = {"reason": f"stacks not taken: {type(e).__name__}: {e}"}
    await call.journal.update(call.seq, "done" if result.get("dumped") else "skipped", result=result)


ACTION = ActionDef(
    name="dump_stacks",
    spec=(DumpStacksSpec,),
    parameters=("job_key",),
    preconditions=(),
    run=run,
)

__all__ = ["ACTION", "SUBDIR", "run"]
