"""The `trainmedic demo` command: each fault in turn, a summary, and an exit code that means it.

Exit 0 only when every fault was detected and, where the policy heals (quarantine, restart from
checkpoint), the job is training again; 1 otherwise, with each problem on stderr; 2 when the demo
cannot run here (kmock missing, an unknown fault).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sys
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from trainmedic.agent.demo.output import Lang, Progress, duration, text
from trainmedic.agent.demo.scenario import FAULTS, FaultResult, Inspect, run_fault
from trainmedic.agent.urlsafe import redacting_handler
from trainmedic.errors import TrainmedicError

if TYPE_CHECKING:
    from trainmedic.agent.demo.receiver import WebhookReceiver

__all__ = [
    "CLUSTERS",
    "EXIT_FAILED",
    "EXIT_OK",
    "EXIT_UNUSABLE",
    "FAULTS",
    "REAL_FAULTS",
    "DemoOutcome",
    "DemoUnavailable",
    "fresh_dir",
    "main",
    "parse_faults",
    "run_demo",
]

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_UNUSABLE = 2


class DemoUnavailable(TrainmedicError):
    """The demo cannot run on this machine (kmock missing, no loopback port)."""


@dataclass
class DemoOutcome:
    workdir: Path
    results: list[FaultResult] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return bool(self.results) and all(r.ok for r in self.results)

    @property
    def exit_code(self) -> int:
        return EXIT_OK if self.ok else EXIT_FAILED


CLUSTERS = ("emulator", "real")
# The faults `--cluster real` runs (agent/demo/realplane.py); the others need the emulator's
# training processes (exit codes, hangs, HCCL links) that KWOK's pods do not have.
REAL_FAULTS = ("xid", "node-lost")


def parse_faults(value: str, cluster: str = "emulator") -> list[str]:
    """`all`, one fault, or a comma list; ValueError names the unknown ones (and, on the real
    plane, the ones it does not run)."""
    known = REAL_FAULTS if cluster == "real" else FAULTS
    names = [v.strip() for v in value.split(",") if v.strip()]
    if not names or names == ["all"]:
        return list(known)
    unknown = [n for n in names if n not in FAULTS]
    if unknown:
        raise ValueError(f"unknown fault(s) {', '.join(unknown)}; choose from {', '.join(FAULTS)} or all")
    other = [n for n in names if n not in known]
    if other:
        raise ValueError(
            f"--cluster real runs {', '.join(known)} (or all); {', '.join(other)} run on the emulated cluster only"
        )
    return names


async def run_demo(
    faults: Sequence[str],
    *,
    workdir: Path | None = None,
    lang: Lang = "en",
    json_lines: bool = False,
    out: TextIO | None = None,
    timeout_s: float = 45.0,
    inspect: Inspect | None = None,
    cluster: str = "emulator",
) -> DemoOutcome:
    """Run the faults one after another (each on a fresh cluster and agent) and return their results.
    Progress lines (or, with `json_lines`, one JSON object per fault) go to `out` (stdout). With
    `cluster="real"`, on one real control plane for the run (agent/demo/realplane.py)."""
    from trainmedic.agent.demo.emulator import kmock_available

    if cluster not in CLUSTERS:
        raise ValueError(f"unknown cluster {cluster!r}; choose from {', '.join(CLUSTERS)}")
    known = REAL_FAULTS if cluster == "real" else FAULTS
    unknown = [f for f in faults if f not in known]
    if unknown:
        raise ValueError(f"unknown fault(s) {', '.join(unknown)}")
    if cluster == "real":
        from trainmedic.agent.demo.realplane import unavailable_reason

        reason = unavailable_reason()  # before anything is made: a clear refusal, nothing left behind
        if reason is not None:
            raise DemoUnavailable(reason[1] if lang == "zh" else reason[0])
        return await _drive(
            faults,
            lambda root, progress: _real_plane(root, progress, timeout_s),
            workdir=workdir,
            prefix="trainmedic-demo-real-",
            title="real_title",
            lang=lang,
            json_lines=json_lines,
            out=out,
        )
    if not kmock_available():
        raise DemoUnavailable("the demo needs kmock, the Kubernetes API emulator: pip install 'trainmedic[demo]'")

    @contextlib.asynccontextmanager
    async def emulated(_root: Path, _progress: Progress) -> AsyncIterator[RunOne]:
        async def one(fault: str, where: Path, progress: Progress, receiver: WebhookReceiver) -> FaultResult:
            return await run_fault(fault, where, progress, receiver=receiver, timeout_s=timeout_s, inspect=inspect)

        yield one

    return await _drive(
        faults,
        emulated,
        workdir=workdir,
        prefix="trainmedic-demo-",
        title="title",
        lang=lang,
        json_lines=json_lines,
        out=out,
    )


# One fault's run on a prepared cluster: (fault, its fresh folder, progress, the webhook receiver).
RunOne = Callable[[str, Path, Progress, "WebhookReceiver"], Awaitable[FaultResult]]
# What runs the faults: set up once for the run (root folder, progress), torn down after the last.
Prepare = Callable[[Path, Progress], AbstractAsyncContextManager[RunOne]]


@contextlib.asynccontextmanager
async def _real_plane(root: Path, progress: Progress, timeout_s: float) -> AsyncIterator[RunOne]:
    """One real control plane for the whole run (agent/demo/realplane.py)."""
    from trainmedic.agent.demo.realplane import RealPlaneDemo, RealPlaneUnavailable, run_real_fault

    demo = RealPlaneDemo(fresh_dir(root, "plane"), progress)
    try:
        try:
            await demo.start()
        except RealPlaneUnavailable as e:
            raise DemoUnavailable(str(e)) from e

        async def one(fault: str, where: Path, progress: Progress, receiver: WebhookReceiver) -> FaultResult:
            return await run_real_fault(demo, fault, where, progress, receiver=receiver, timeout_s=timeout_s)

        yield one
    finally:
        await demo.stop()


async def _drive(
    faults: Sequence[str],
    prepare: Prepare,
    *,
    workdir: Path | None,
    prefix: str,
    title: str,
    lang: Lang,
    json_lines: bool,
    out: TextIO | None,
) -> DemoOutcome:
    """The run both clusters share: the work folder, the progress heading, the local webhook
    receiver, each fault in a fresh folder (one JSON line each with `json_lines`), the summary."""
    from trainmedic.agent.demo.receiver import WebhookReceiver

    stream = out if out is not None else sys.stdout
    root = workdir if workdir is not None else Path(tempfile.mkdtemp(prefix=prefix))
    root.mkdir(parents=True, exist_ok=True)
    progress = Progress(lang, quiet=json_lines, out=stream)
    progress.plain(title, n=len(faults))
    progress.plain("workdir", dir=root)
    outcome = DemoOutcome(root)
    try:
        receiver = WebhookReceiver()
        await receiver.start()
    except OSError as e:
        raise DemoUnavailable(f"cannot start the local webhook receiver: {e.strerror or e}") from e
    try:
        async with prepare(root, progress) as run_one:
            for fault in faults:
                result = await run_one(fault, fresh_dir(root, fault), progress, receiver)
                outcome.results.append(result)
                if json_lines:
                    stream.write(json.dumps(result.as_json(), ensure_ascii=False) + "\n")
                    stream.flush()
    finally:
        await receiver.stop()
    if not json_lines:
        _summary(outcome, progress)
    return outcome


def fresh_dir(root: Path, name: str) -> Path:
    """root/name, or root/name-2, -3, ... when an earlier run left one there (its store and
    checkpoints must not leak into this run)."""
    path, n = root / name, 1
    while path.exists() and any(path.iterdir()):
        n += 1
        path = root / f"{name}-{n}"
    return path


def _summary(outcome: DemoOutcome, progress: Progress) -> None:
    lang = progress.lang
    progress.heading("summary")
    for r in outcome.results:
        key = "outcome_failed" if not r.ok else ("outcome_healed" if r.healed else "outcome_notified")
        detail = "; ".join(r.problems) if not r.ok else f"{r.fault_class} {r.code} @ {r.node}"
        progress.out.write(
            text(
                "summary_row",
                lang,
                fault=r.fault,
                outcome=text(key, lang),
                detect=duration(r.detect_ms),
                recover=duration(r.recover_ms),
                detail=detail,
            )
            + "\n"
        )
    progress.plain("kept", dir=outcome.workdir)


def main(
    faults: str = "all",
    *,
    json_lines: bool = False,
    lang: Lang = "en",
    workdir: Path | None = None,
    verbose: bool = False,
    timeout_s: float | None = None,
    cluster: str = "emulator",
) -> int:
    """Blocking entry point of `trainmedic demo` (`cluster`: emulator or real)."""
    if timeout_s is None:
        timeout_s = 240.0 if cluster == "real" else 45.0
    try:
        if cluster not in CLUSTERS:
            raise ValueError(f"unknown cluster {cluster!r}; choose from {', '.join(CLUSTERS)}")
        names = parse_faults(faults, cluster)
    except ValueError as e:
        print(f"trainmedic: demo: {e}", file=sys.stderr)
        return EXIT_UNUSABLE
    # The agent logs what it does; the demo prints it as stages instead (--verbose shows both).
    logger = logging.getLogger("trainmedic")
    level, propagate = logger.level, logger.propagate
    handler: logging.Handler | None = None
    if verbose:
        handler = redacting_handler(logging.StreamHandler(sys.stderr))
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False
    else:
        logger.setLevel(logging.CRITICAL)
    try:
        outcome = asyncio.run(
            run_demo(names, workdir=workdir, lang=lang, json_lines=json_lines, timeout_s=timeout_s, cluster=cluster)
        )
    except DemoUnavailable as e:
        print(f"trainmedic: demo: {e}", file=sys.stderr)
        return EXIT_UNUSABLE
    finally:
        logger.setLevel(level)
        logger.propagate = propagate
        if handler is not None:
            logger.removeHandler(handler)
    for r in outcome.results:
        for p in r.problems:
            print(f"trainmedic: demo: {r.fault}: {p}", file=sys.stderr)
    if not outcome.ok:
        failed = [r.fault for r in outcome.results if not r.ok]
        print(f"trainmedic: demo: failed: {', '.join(failed)}", file=sys.stderr)
    return outcome.exit_code
