"""Simulated training: a job's profile, its rank pods and incarnations, the `World` they share, and
`TrainingRun`, which writes the ranks' logs and checkpoints step by step.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from trainmedic.agent.demo.emulator import Cluster, FakeProcess, KubeApiError
from trainmedic.agent.demo.logs import HFTrainerLog, MegatronLog, hang_stack
from trainmedic.agent.demo.training.checkpoints import (
    RESUME_FROM_ENV,
    RESUME_STEP_ENV,
    write_hf_checkpoint,
    write_megatron_checkpoint,
)

# -- the world the controllers and processes share ----------------------------------------------------


@dataclass(frozen=True)
class JobProfile:
    """What a workload's training does (the demo's train.py)."""

    framework: Literal["hf", "megatron"]
    checkpoint_dir: str  # as the job sees it (its annotation)
    step_s: float = 0.04
    save_every: int = 10
    init_s: float = 0.15
    accelerators: int = 8
    tp: int = 8


@dataclass
class RankPod:
    """One pod of an incarnation: its object, node and rank (one 8-accelerator pod per node)."""

    pod: dict[str, Any]
    node: str | None = None
    rank: int = 0

    @property
    def name(self) -> str:
        return str(self.pod["metadata"]["name"])

    @property
    def container(self) -> str:
        return str(self.pod["spec"]["containers"][0]["name"])

    def env(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for e in self.pod["spec"]["containers"][0].get("env") or []:
            if isinstance(e, dict) and "value" in e:
                out[str(e["name"])] = str(e["value"])
        return out


@dataclass
class Incarnation:
    """One workload object (one uid) and what the controllers made of it."""

    resource: str
    namespace: str
    name: str
    uid: str
    workload: dict[str, Any]
    created_at: float
    pods: list[RankPod] = field(default_factory=list)
    scheduled_at: float | None = None
    unschedulable: str | None = None
    run: TrainingRun | None = None
    task: asyncio.Task[None] | None = None
    failed_reported: bool = False

    @property
    def nodes(self) -> list[str]:
        return [p.node for p in self.pods if p.node]


EventHook = Callable[[str, "Incarnation", Mapping[str, Any]], None]
CollectiveCheck = Callable[["TrainingRun"], Awaitable[bool]]


@dataclass
class World:
    """What the demo's controllers and training processes share: the shared checkpoint volume (job
    path prefix -> local directory), each workload's profile, the fault hooks and a progress hook."""

    mounts: dict[str, Path]
    profiles: dict[str, JobProfile] = field(default_factory=dict)
    # Called before each collective (the first one builds the communicator): False = it failed.
    collective_check: CollectiveCheck | None = None
    on_event: EventHook | None = None

    def local(self, job_path: str) -> Path:
        for prefix, local in sorted(self.mounts.items(), key=lambda kv: -len(kv[0])):
            if job_path == prefix or job_path.startswith(prefix.rstrip("/") + "/"):
                return local / job_path[len(prefix.rstrip("/")) :].lstrip("/")
        raise ValueError(f"{job_path} is on no volume of the demo cluster")

    def emit(self, what: str, inc: Incarnation, **detail: Any) -> None:
        if self.on_event is not None:
            self.on_event(what, inc, detail)


# -- the training processes of one incarnation ---------------------------------------------------------


class TrainingRun:
    """The job's processes: one per pod (torchrun with 8 workers), rank 0 reporting progress."""

    def __init__(self, cluster: Cluster, inc: Incarnation, profile: JobProfile, world: World) -> None:
        self.cluster = cluster
        self.inc = inc
        self.profile = profile
        self.world = world
        self.ranks = sorted(inc.pods, key=lambda p: p.rank)
        self.hf = HFTrainerLog()
        self.megatron = MegatronLog(tp=profile.tp)
        env = self.ranks[0].env() if self.ranks else {}
        self.resumed_from: str | None = env.get(RESUME_FROM_ENV) or None
        step = env.get(RESUME_STEP_ENV, "")
        self.resumed_step: int | None = int(step) if step.isdigit() else None
        self.step = self.resumed_step or 0
        self.state: Literal["starting", "training", "paused", "ended"] = "starting"
        self.saved: list[int] = []
        self.last_progress_at: float | None = None
        self.first_step_at: float | None = None
        self.steps_done = 0
        self.changed = asyncio.Event()
        self._save_fault: Callable[[TrainingRun], Awaitable[None]] | None = None

    # -- what the demo's scenarios use ---------------------------------------------------------------

    def log(self, rank: RankPod, *lines: str) -> None:
        """Lines printed by a rank's processes (ignored once its container is gone)."""
        with contextlib.suppress(KeyError, RuntimeError):
            self.cluster.write_log(rank.pod, rank.container, *lines)

    async def exit(self, rank: RankPod, exit_code: int, *, reason: str = "Error") -> None:
        """The rank's container ends (the kubelet reports it terminated)."""
        with contextlib.suppress(KeyError, RuntimeError, KubeApiError):
            await self.cluster.terminate(rank.pod, rank.container, reason=reason, exit_code=exit_code)

    def pause(self) -> float | None:
        """Stop making progress, processes still alive (a hang). Returns when the last step was logged."""
        if self.state in ("starting", "training"):
            self.state = "paused"
        self.changed.set()
        return self.last_progress_at

    @property
    def training(self) -> bool:
        return self.state == "training"

    def end(self) -> None:
        self.state = "ended"
        self.changed.set()

    def fail_during_next_save(self, action: Callable[[TrainingRun], Awaitable[None]]) -> None:
        """At the next checkpoint, the save is cut short and `action` runs (the fault)."""
        self._save_fault = action

    async def wait(self, predicate: Callable[[TrainingRun], bool], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while not predicate(self):
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self.changed.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(min(left, 0.25)):
                    await self.changed.wait()
        return True

    # -- the processes -----------------------------------------------------------------------------------

    def _root(self) -> Path:
        return self.world.local(self.profile.checkpoint_dir)

    async def run(self) -> None:
        try:
            await self._run()
        finally:
            if self.state != "paused":
                self.state = "ended"
            self.changed.set()

    async def _run(self) -> None:
        now = time.time()
        world_size = len(self.ranks)
        for r in self.ranks:
            if self.profile.framework == "hf":
                self.log(r, *self.hf.nccl_init(r.name, r.rank, now))
        lead = self.ranks[0]
        if self.profile.framework == "hf":
            if self.resumed_from:
                self.log(lead, *self.hf.resume(self.resumed_from, self.step, now))
            else:
                self.log(lead, *self.hf.banner(world_size * 8, now))
        else:
            self.log(lead, *self.megatron.banner(world_size * 8, now))
            if self.resumed_from:
                self.log(lead, *self.megatron.resume(self.profile.checkpoint_dir, self.step))
        if self.resumed_from:
            self.world.emit("resuming", self.inc, checkpoint=self.resumed_from, step=self.step)
        await asyncio.sleep(self.profile.init_s)
        while self.state in ("starting", "training"):
            check = self.world.collective_check
            if check is not None and not await check(self):
                self.state = "ended"
                return
            if self.state == "starting":
                self.state = "training"
            await asyncio.sleep(self.profile.step_s)
            if not self.training:  # paused or ended meanwhile
                break
            self.step += 1
            self.steps_done += 1
            t = time.time()
            if self.profile.framework == "hf":
                self.log(lead, self.hf.step(self.step))
            else:
                self.log(lead, self.megatron.step(self.step, self.profile.step_s * 1000 + 3.1 * (self.step % 7)))
            self.last_progress_at = t
            if self.first_step_at is None:
                self.first_step_at = t
                if self.resumed_from:
                    self.world.emit("resumed", self.inc, checkpoint=self.resumed_from, step=self.step)
            self.changed.set()
            if self.step % self.profile.save_every == 0 and not await self._save():
                return
        # Paused (a hang): the processes live on, silent, until their pods go.
        while self.state == "paused":
            self.changed.clear()
            await self.changed.wait()

    async def _save(self) -> bool:
        """Write the checkpoint of this step; False when the save was cut short by a fault."""
        root = self._root()
        job_root = self.profile.checkpoint_dir.rstrip("/")
        lead = self.ranks[0]
        now = time.time()
        fault, self._save_fault = self._save_fault, None
        cut = fault is not None
        if self.profile.framework == "hf":
            path = f"{job_root}/checkpoint-{self.step}"
            self.log(lead, *self.hf.saving(path, now))
            await asyncio.to_thread(
                write_hf_checkpoint,
                root,
                self.step,
                max_steps=self.hf.total_steps,
                save_steps=self.profile.save_every,
                processes=len(self.ranks) * 8,
                cut=cut,
            )
            if not cut:
                self.log(lead, *self.hf.saved(path, time.time()))
        else:
            self.log(lead, *self.megatron.saving(job_root, self.step))
            await asyncio.to_thread(write_megatron_checkpoint, root, self.step, tp=self.profile.tp, cut=cut)
            if not cut:
                self.log(lead, *self.megatron.saved(job_root, self.step))
        if fault is not None:
            self.state = "ended"
            self.changed.set()
            await fault(self)
            return False
        self.saved.append(self.step)
        self.changed.set()
        return True


def _processes(framework: str) -> list[FakeProcess]:
    """What /proc shows in a training container: torchrun (pid 1) and its 8 workers, which registered
    faulthandler for SIGUSR1 (so a stack dump does not kill them)."""
    script = "/app/src/llamafactory/launcher.py" if framework == "hf" else "/app/MindSpeed-LLM/pretrain_gpt.py"
    launcher = FakeProcess(
        1,
        f"/usr/bin/python3 /usr/local/bin/torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d {script}",
        handles_sigusr1=False,
    )
    workers = [
        FakeProcess(57 + i, f"/usr/bin/python3 -u {script} --local-rank={i}", stack=hang_stack(script))
        for i in range(8)
    ]
    return [launcher, *workers]
