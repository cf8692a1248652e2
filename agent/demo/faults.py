"""The demo's faults: `Scenario` (the job, its profile and what is expected) and each fault's
injection (Xid, OOM, HCCL link down, hang, lost node, application error), in `SCENARIOS`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from trainmedic.agent.demo.emulator import JOB, VOLCANO_JOB
from trainmedic.agent.demo.logs import (
    cuda_oom_lines,
    hccl_ei0006_lines,
    key_error_lines,
    nccl_watchdog_lines,
    torchrun_peer_stop_lines,
    xid79_message,
)
from trainmedic.agent.demo.stage import HANG_FLOOR_S, MOUNT, QUIET_FLOOR_S, DemoCluster
from trainmedic.agent.demo.training import JobProfile, TrainingRun


@dataclass(frozen=True)
class Scenario:
    """One fault: its job, how it is injected, and what the policy is expected to do about it."""

    fault: str
    title: tuple[str, str]
    job: str
    resource: str
    profile: JobProfile
    fault_class: str
    quarantine: bool
    restart: bool
    incidents: int = 1
    hang_floor_s: float = QUIET_FLOOR_S
    # (cluster, the running training) -> the description of what was injected (en, zh)
    inject: Callable[[DemoCluster, TrainingRun], Awaitable[tuple[str, str]]] | None = None
    ready: Callable[[TrainingRun], bool] = lambda run: len(run.saved) >= 2


async def _inject_xid(dc: DemoCluster, run: TrainingRun) -> tuple[str, str]:
    """Xid 79 on the second node while the next checkpoint is written: the save never completes."""
    bad = run.ranks[1]
    cut: list[int] = []
    done = asyncio.Event()

    async def fault(r: TrainingRun) -> None:
        cut.append(r.step)
        dc.t0 = time.time()
        dc.progress.t0 = dc.t0
        dc.kernels.write(bad.node or "?", xid79_message("0000:3b:00", 57))
        dc.devices_fail(bad.node, "xid", at=dc.t0, devices=["0"])
        dc.devices_fail(r.ranks[0].node, "idle", at=dc.t0)
        await asyncio.sleep(0.05)
        # The peer's collective never completes; its watchdog aborts the process (time compressed).
        r.log(r.ranks[0], *nccl_watchdog_lines(0, time.time(), 7753))
        await r.exit(r.ranks[0], 134)
        await r.exit(bad, 1)
        done.set()

    run.fail_during_next_save(fault)
    async with asyncio.timeout(10):
        await done.wait()
    return (
        f"Xid 79 on {bad.node} (GPU 0000:3b:00 has fallen off the bus) while checkpoint-{cut[0]} was being written",
        f"{bad.node} 上出现 Xid 79（GPU 0000:3b:00 掉卡），此时正在写 checkpoint-{cut[0]}",
    )


async def _inject_oom(dc: DemoCluster, run: TrainingRun) -> tuple[str, str]:
    lead, peer = run.ranks[0], run.ranks[1]
    dc.t0 = time.time()
    dc.progress.t0 = dc.t0
    # Device memory filled over the last minute; the process is gone after.
    dc.devices_fail(lead.node, "oom", at=dc.t0, devices=["0"])
    dc.devices_fail(peer.node, "idle", at=dc.t0)
    run.end()
    step = run.step + 1
    run.log(lead, *cuda_oom_lines(0, lead.name, time.time()))
    await run.exit(lead, 1)
    run.log(peer, *torchrun_peer_stop_lines(57))
    await run.exit(peer, 1)
    return (
        f"CUDA out of memory on rank 0 ({lead.node}) at step {step}",
        f"rank 0（{lead.node}）在第 {step} 步显存不足（CUDA OOM）",
    )


def _hccl_link_down(broken: str) -> Callable[[TrainingRun], Awaitable[bool]]:
    """A node whose RoCE link is down: any job with a rank there fails its next collective."""

    async def check(run: TrainingRun) -> bool:
        bad = next((r for r in run.ranks if r.node == broken), None)
        if bad is None:
            return True
        pid = 1_292_363 + bad.rank
        run.log(bad, *hccl_ei0006_lines(bad.rank * 8, 0, pid, time.time()))
        await run.exit(bad, 1)
        for other in run.ranks:
            if other is not bad:
                await run.exit(other, 1)
        return False

    return check


async def _inject_hccl(dc: DemoCluster, run: TrainingRun) -> tuple[str, str]:
    broken = run.ranks[1].node or "?"
    dc.t0 = time.time()
    dc.progress.t0 = dc.t0
    dc.devices_fail(broken, "link", at=dc.t0)
    dc.world.collective_check = _hccl_link_down(broken)
    return (
        f"the RoCE link of {broken} goes down: HCCL cannot build its links (EI0006), on every restart there",
        f"{broken} 的 RoCE 链路中断：HCCL 无法建链（EI0006），在该节点上每次重启都会失败",
    )


async def _inject_hang(dc: DemoCluster, run: TrainingRun) -> tuple[str, str]:
    last = run.pause()
    dc.t0 = last if last is not None else time.time()
    dc.progress.t0 = dc.t0
    for r in run.ranks:
        dc.devices_fail(r.node, "idle", at=dc.t0)
    return (
        f"every rank blocks in all_reduce after step {run.step}: no more steps, no error line, the pods keep running",
        f"第 {run.step} 步之后所有 rank 卡在 all_reduce：不再有进展，没有任何报错，Pod 仍在运行",
    )


async def _inject_node_lost(dc: DemoCluster, run: TrainingRun) -> tuple[str, str]:
    """The second node stops heartbeating: its rank is gone with it (no line, no exit: its pod stays
    Running in the API); the node lifecycle controller marks the node; the peer's collective times out."""
    lost, peer = run.ranks[1], run.ranks[0]
    node = lost.node or "?"
    dc.t0 = time.time()
    dc.progress.t0 = dc.t0
    dc.devices_fail(node, "lost", at=dc.t0)
    dc.devices_fail(peer.node, "idle", at=dc.t0)
    run.end()
    await dc.cluster.lose_node(node)
    await asyncio.sleep(0.05)
    run.log(peer, *nccl_watchdog_lines(0, time.time(), 7753))
    await run.exit(peer, 1)
    return (
        f"{node} stops answering: Ready goes Unknown, tainted unreachable; the rank there is lost",
        f"{node} 失联：Ready 变为 Unknown，被打上 unreachable 污点；该节点上的 rank 丢失",
    )


async def _inject_app_error(dc: DemoCluster, run: TrainingRun) -> tuple[str, str]:
    """Rank 8 (the second pod) raises KeyError in the data collator; torchrun stops the peer."""
    bad, peer = run.ranks[1], run.ranks[0]
    dc.t0 = time.time()
    dc.progress.t0 = dc.t0
    for r in (bad, peer):
        dc.devices_fail(r.node, "idle", at=dc.t0)
    run.end()
    step = run.step + 1
    run.log(bad, *key_error_lines(8, bad.node or "?", time.time()))
    await run.exit(bad, 1)
    run.log(peer, *torchrun_peer_stop_lines(57))
    await run.exit(peer, 1)
    return (
        f"rank 8 ({bad.node}) raises KeyError: 'labels' in the data collator at step {step}",
        f"rank 8（{bad.node}）在第 {step} 步的数据整理函数中抛出 KeyError: 'labels'",
    )


def _hf(job: str) -> JobProfile:
    return JobProfile("hf", f"{MOUNT}/{job}")


SCENARIOS: dict[str, Scenario] = {
    "xid": Scenario(
        "xid",
        ("an NVIDIA GPU falls off the bus (Xid 79) in a 16-GPU fine-tune", "16 卡微调中一块 NVIDIA GPU 掉卡（Xid 79）"),
        "llama3-8b-sft",
        JOB,
        _hf("llama3-8b-sft"),
        "device_error",
        quarantine=True,
        restart=True,
        inject=_inject_xid,
    ),
    "oom": Scenario(
        "oom",
        ("CUDA out of memory in a 16-GPU fine-tune", "16 卡微调中 CUDA 显存不足"),
        "llama3-70b-lora",
        JOB,
        _hf("llama3-70b-lora"),
        "accelerator_oom",
        quarantine=False,
        restart=False,
        inject=_inject_oom,
        ready=lambda run: len(run.saved) >= 1 and run.step % run.profile.save_every >= 3,
    ),
    "hccl": Scenario(
        "hccl",
        (
            "HCCL link failures on one Ascend node (EI0006) in a 16-NPU pre-training",
            "16 卡昇腾预训练中单个节点 HCCL 建链失败（EI0006）",
        ),
        "qwen2-72b-pretrain",
        VOLCANO_JOB,
        JobProfile("megatron", f"{MOUNT}/qwen2-72b-pretrain"),
        "comm_init",
        quarantine=True,
        restart=True,
        incidents=3,
        inject=_inject_hccl,
        ready=lambda run: len(run.saved) >= 2 and run.step % run.profile.save_every >= 3,
    ),
    "hang": Scenario(
        "hang",
        ("a 16-GPU fine-tune hangs without an error line", "16 卡微调静默卡死（没有任何报错）"),
        "llama3-8b-dpo",
        JOB,
        _hf("llama3-8b-dpo"),
        "hang",
        quarantine=False,
        restart=True,
        hang_floor_s=HANG_FLOOR_S,
        inject=_inject_hang,
        ready=lambda run: len(run.saved) >= 1 and run.step % run.profile.save_every >= 5,
    ),
    "node-lost": Scenario(
        "node-lost",
        ("a GPU node stops answering in a 16-GPU pre-training", "16 卡预训练中一个 GPU 节点失联"),
        "llama3-8b-pt",
        JOB,
        _hf("llama3-8b-pt"),
        "node_failure",
        quarantine=True,
        restart=True,
        inject=_inject_node_lost,
        ready=lambda run: len(run.saved) >= 1 and run.step % run.profile.save_every >= 3,
    ),
    "app-error": Scenario(
        "app-error",
        ("a rank raises a Python exception in a 16-GPU fine-tune", "16 卡微调中一个 rank 抛出 Python 异常"),
        "qwen2-7b-sft",
        JOB,
        _hf("qwen2-7b-sft"),
        "app_error",
        quarantine=False,
        restart=False,
        inject=_inject_app_error,
        ready=lambda run: len(run.saved) >= 1 and run.step % run.profile.save_every >= 3,
    ),
}
