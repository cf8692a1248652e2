"""A synthetic but realistic training-job log for throughput benchmarks.

The corpus is what a multi-node training job prints: step lines from torchrun / DeepSpeed / Megatron /
HF Trainer, tqdm progress, NCCL INFO init chatter, vLLM worker lines, Ascend plog lines, kernel and
kubelet syslog, Python warnings, checkpoint saves, ANSI-coloured lines, long lines (2-8 KB), Chinese
log text and benign lines full of alarming keywords. Exactly one line in a thousand is a fault line,
drawn from the real failure corpus and from the shipped rules' own examples; every fault line is
checked against the engine when the pool is built, so the findings the benchmark must reproduce are
known in advance.

Generation is deterministic for a given seed and line count.
"""

from __future__ import annotations

import json
import random
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from trainmedic.detectors.engine import Engine
from trainmedic.detectors.schema import Rule

# The shared corpus: ../shared next to the repository root.
DEFAULT_REAL_LOGS = Path(__file__).resolve().parent.parent.parent / "shared" / "corpus" / "real-logs.jsonl"
FAULT_EVERY = 1000  # one fault line per this many lines (0.1 %)
DEFAULT_SEED = 20240501

FindingKey = tuple[str, str]  # (rule_id, code)


@dataclass(frozen=True, slots=True)
class FaultLine:
    """One line known to be a fault, with the findings the engine gives it on its own."""

    text: str
    origin: str
    findings: tuple[FindingKey, ...]


@dataclass(frozen=True, slots=True)
class Corpus:
    path: Path
    lines: int
    bytes: int
    fault_lines: int
    expected: Counter[FindingKey]
    pool_size: int
    pool_from_real_logs: int
    pool_from_examples: int
    seed: int
    gen_seconds: float


# -- the fault pool ---------------------------------------------------------------------------------------


def fault_pool(rules: Sequence[Rule], real_logs: Path | None = DEFAULT_REAL_LOGS) -> list[FaultLine]:
    """Single lines from the real corpus (non-negative entries) and the rules' examples that the
    engine classifies as faults on their own; lines that give no finding are left out."""
    engine = Engine(rules, fast=False)
    candidates: list[tuple[str, str]] = []
    if real_logs is not None and real_logs.exists():
        for raw in real_logs.read_text(encoding="utf-8").splitlines():
            if not raw.strip():
                continue
            entry = json.loads(raw)
            if entry.get("label") == "negative":
                continue
            for line in str(entry.get("text", "")).split("\n"):
                candidates.append((line, f"real:{entry.get('id')}"))
    for rule in rules:
        for ex in rule.examples.match:
            for line in ex.line.split("\n"):
                candidates.append((line, f"example:{rule.id}"))
    pool: list[FaultLine] = []
    seen: set[str] = set()
    for raw_line, origin in candidates:
        line = raw_line.rstrip("\r")
        if not line.strip() or line in seen:
            continue
        seen.add(line)
        found = engine.scan_text(line)
        if not found:
            continue
        keys: list[FindingKey] = []
        for f in found:
            keys.extend([(f.rule_id, f.code)] * f.count)
        pool.append(FaultLine(line, origin, tuple(sorted(keys))))
    return pool


# -- benign lines ---------------------------------------------------------------------------------------

Gen = Callable[[random.Random, int], str]

_HOSTS = [f"gpu-node-{i:02d}" for i in range(16)] + [f"ascend-910b-{i:02d}" for i in range(8)]
_NICS = ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3", "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_7"]
_TRANSPORTS = [
    "SHM/direct/direct",
    "P2P/IPC",
    "P2P/CUMEM/read",
    "NET/IB/0/GDRDMA",
    "NET/IB/1",
    "P2P/direct pointer",
]
_PY_WARNINGS = [
    "/usr/local/lib/python3.10/dist-packages/torch/utils/checkpoint.py:429: UserWarning: torch.utils."
    "checkpoint: please pass in use_reentrant=True or use_reentrant=False explicitly. The default value "
    "of use_reentrant will be updated to be False in the future.",
    "/opt/conda/lib/python3.11/site-packages/transformers/modeling_utils.py:1141: FutureWarning: The "
    "`device` argument is deprecated and will be removed in v5 of Transformers.",
    "/usr/local/lib/python3.10/dist-packages/torch/distributed/fsdp/_state_dict_utils.py:773: UserWarning: "
    "When using ``NO_SHARD`` for ``ShardingStrategy``, full_state_dict will be returned.",
    "/opt/conda/lib/python3.11/site-packages/torch/_dynamo/variables/functions.py:663: UserWarning: "
    "Graph break due to unsupported builtin _operator.setitem.",
    "/usr/local/lib/python3.10/dist-packages/torch_npu/utils/storage.py:38: UserWarning: TypedStorage is "
    "deprecated. It will be removed in the future and UntypedStorage will be the only storage class.",
    "/opt/conda/lib/python3.11/site-packages/accelerate/accelerator.py:432: DeprecationWarning: "
    "`torch.cuda.amp.GradScaler(args...)` is deprecated. Please use `torch.amp.GradScaler('cuda', args...)`.",
]
_CHINESE = [
    "训练进度: 第 {e} 轮, 步骤 {s}/200000, 损失 {loss}, 学习率 {lr}, 吞吐 {tp} 样本/秒",
    "模型权重加载完成，耗时 {t} 秒，参数量 {p}B",
    "保存检查点到 /mnt/ckpt/step_{s}，耗时 {t} 秒",
    "数据集预处理完成：共 {n} 条样本，过滤 {k} 条过长样本",
    "显存占用 (mem_usage): {m}GB / 64GB，缓存 {c}GB",
    "集合通信初始化完成，world_size={w}，HCCL 超时时间 1800 秒",
    "评估结果: 准确率 {acc}%, 困惑度 {ppl}",
    "【提示】梯度裁剪阈值 1.0，本步梯度范数 {g}",
]
_KERNEL = [
    "IPv6: ADDRCONF(NETDEV_CHANGE): eth0: link becomes ready",
    "nvidia-peermem: module loaded, peer memory client registered",
    "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  535.129.03  Thu Oct 19 18:56:32 UTC 2023",
    "mlx5_core 0000:{b:02x}:00.0: mlx5e: IPSec ESP acceleration enabled",
    "mlx5_core 0000:{b:02x}:00.0 {nic}: Link up",
    "EXT4-fs (nvme0n1p1): mounted filesystem with ordered data mode. Opts: (null)",
    "cgroup: fork rejected by pids controller in /kubepods.slice/kubepods-burstable.slice",
    "nfs: server 10.0.0.{b} OK",
    'audit: type=1400 audit({t}.123:{n}): apparmor="STATUSapp" operation="profile_load"',
]
_NEAR_MISS = [
    "[INFO] RUNTIME({pid},python):2025-07-23-03:47:57.070.463 [npu_driver.cc:1098] {pid} MallocPhysical: "
    "Mem Alloc Size = {n}, flag = 0, deviceId = {d}",
    "mem_usage:cuda:{d} {m}GB mem_reserved:cuda:{d} {c}GB",
    "[INFO] HCCL({pid},python3):2025-07-23-03:47:57.070.463 [op_base.cc:191][{pid}]HCCL_EXEC_TIMEOUT is "
    "set to 0, HCCL execution timeout was set to never timeout",
    "  rdzv_configs     : {{'timeout': 900}}",
    "  max_restarts     : 3",
    "[rank{r}]:[I ProcessGroupNCCL.cpp:852] [PG 0 Rank {r}] ProcessGroupNCCL initialization options: "
    "NCCL_ASYNC_ERROR_HANDLING: 3, NCCL_DESYNC_DEBUG: 0, NCCL_ENABLE_TIMING: 0, NCCL_BLOCKING_WAIT: 0, "
    "TIMEOUT(ms): 600000, USE_HIGH_PRIORITY_STREAM: 0",
    "{host}:{pid}:{pid} [{d}] NCCL INFO NCCL_IB_TIMEOUT set by environment to 22.",
    "memory_summary: no out-of-memory events recorded on device {d}; retries=0",
    "pod_status: container=trainer state=terminated reason=Completed exit_code=0 restarts=0",
    "pod_status: container=trainer state=running restarts=0",
    "oom_score_adj set to -997 for pid {pid}",
    "DataLoader worker (pid {pid}) started with prefetch_factor=2",
    "Xid event monitor enabled for GPUs 0-7 (NVML event set)",
    "ECC mode: enabled; volatile uncorrectable count: 0; aggregate uncorrectable count: 0",
    "[W socket.cpp:697] [c10d] The client socket has failed to connect to [localhost]:29500 (errno: 99 - "
    "Cannot assign requested address).",
    "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC=600 TORCH_NCCL_ENABLE_MONITORING=1 NCCL_TIMEOUT=1800",
    "aclrtSynchronizeStream finished, error code is 0",
    "watchdog: step {s} heartbeat ok, collective SeqNum={n} completed in {t} ms",
    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True,max_split_size_mb:512 (avoids out of memory fragmentation)",
    "Memory cgroup stats for /kubepods.slice: anon {n}kB file 0kB kernel 1024kB",
]


def _pool(rng: random.Random, make: Callable[[random.Random], str]) -> list[str]:
    return [make(rng) for _ in range(POOL)]


POOL = 4096  # formatted values per numeric field; lines pick with getrandbits(12)
_PR = random.Random(DEFAULT_SEED)
_LR = _pool(_PR, lambda r: f"{1e-5 + 2.9e-4 * r.random():.6E}")
_LOSS = _pool(_PR, lambda r: f"{1.5 + 2 * r.random():.6E}")
_MS = _pool(_PR, lambda r: f"{3000 + 2000 * r.random():.1f}")
_F3 = _pool(_PR, lambda r: f"{0.1 + 2.9 * r.random():.3f}")
_F4 = _pool(_PR, lambda r: f"{40 + 10 * r.random():.4f}")
_GB = _pool(_PR, lambda r: f"{10 + 60 * r.random():.2f}")
_PCT = _pool(_PR, lambda r: f"{95 * r.random():.1f}")
_TPS = _pool(_PR, lambda r: f"{100 + 2900 * r.random():.1f}")
_HEX = _pool(_PR, lambda r: f"{r.getrandbits(44):x}")
_PID = _pool(_PR, lambda r: str(1000 + r.randrange(3_000_000)))
_IP = _pool(_PR, lambda r: f"{r.randrange(256)}.{r.randrange(1, 255)}")
_SMALL = [str(k) for k in range(POOL)]


_MILLI = [f"{k:03d}" for k in range(1000)]


@lru_cache(maxsize=256)
def _clock(s: int) -> tuple[int, int, int]:
    return s // 3600 % 24, s // 60 % 60, s % 60


@lru_cache(maxsize=256)
def _second(s: int, sep: str) -> str:
    h, m, sec = _clock(s)
    return f"2025-04-27{sep}{h:02d}:{m:02d}:{sec:02d}"


def _ts(i: int) -> str:
    """A log4j-style timestamp; the clock advances one second every 50 lines."""
    return _second(43200 + i // 50, " ") + "," + _MILLI[(i * 37) % 1000]


def _plog_ts(i: int) -> str:
    return _second(43200 + i // 50, "-") + "." + _MILLI[(i * 37) % 1000] + "." + _MILLI[i % 1000]


def _megatron(rng: random.Random, i: int) -> str:
    g = rng.getrandbits
    it = i // 8 + 1
    line = (
        f" iteration {it:8d}/  500000 | consumed samples: {it * 1024:12d} | elapsed time per iteration (ms): "
        f"{_MS[g(12)]} | learning rate: {_LR[g(12)]} | global batch size:  1024 | lm loss: {_LOSS[g(12)]} | "
        f"loss scale: 1.0 | grad norm: {_F3[g(12)]} | number of skipped iterations:   0 | number of nan "
        "iterations:   0 |"
    )
    return f"[default{g(3)}]:{line}" if g(1) else line


def _deepspeed(rng: random.Random, i: int) -> str:
    g = rng.getrandbits
    step = i // 8
    if g(1):
        return (
            f"[{_ts(i)}] [INFO] [logging.py:96:log_dist] [Rank 0] step={step}, skipped=0, "
            f"lr=[{_LR[g(12)]}], mom=[(0.9, 0.95)]"
        )
    return (
        f"[{_ts(i)}] [INFO] [timer.py:260:stop] epoch=0/micro_step={step * 4}/global_step={step}, "
        f"RunningAvgSamplesPerSec={_F4[g(12)]}, CurrSamplesPerSec={_F4[g(12)]}, "
        f"MemAllocated={_GB[g(12)]}GB, MaxMemAllocated={_GB[g(12)]}GB"
    )


def _hf_trainer(rng: random.Random, i: int) -> str:
    g = rng.getrandbits
    return (
        f"{{'loss': {_F3[g(12)]}, 'grad_norm': {_F4[g(12)]}, 'learning_rate': {_LR[g(12)]}, 'epoch': {i / 400000:.2f}}}"
    )


def _torchrun_rank(rng: random.Random, i: int) -> str:
    g = rng.getrandbits
    r = g(6)
    k = g(2)
    if k == 0:
        return f"[rank{r}]: Step {i // 16} | tokens/s/gpu {_TPS[g(12)]} | MFU {_PCT[g(12)]}%"
    if k == 1:
        return (
            f"[rank{r}]:[W427 {_ts(i)[11:]} reducer.cpp:1400] Warning: find_unused_parameters=True was "
            "specified in DDP constructor, but did not find any unused parameters in the forward pass."
        )
    if k == 2:
        return f"[rank{r}]: INFO:root:throughput {_TPS[g(12)]} samples/s, data time {_F3[g(12)]}s"
    return f"[rank{r}]: loading shard model-{g(4) + 1:05d}-of-00016.safetensors"


def _tqdm_frame(rng: random.Random, done: int, total: int) -> str:
    pct = done * 100 // total
    bar = "█" * (pct // 10) + ("▏▎▍▌▋▊▉"[rng.getrandbits(2)] if pct < 100 else "")
    return (
        f"{pct:3d}%|{bar:<10}| {done}/{total} [{done // 120:02d}:{done % 60:02d}<"
        f"{(total - done) // 60:02d}:00, {_F3[rng.getrandbits(12)]}it/s]"
    )


def _tqdm(rng: random.Random, i: int) -> str:
    frame = _tqdm_frame(rng, (i // 10) % 10000 + 1, 10000)
    return "Training: " + frame if rng.getrandbits(1) else frame


def _nccl(rng: random.Random, i: int) -> str:
    g = rng.getrandbits
    host = _HOSTS[g(4)]
    pid = _PID[g(12)]
    dev = g(3)
    head = f"{host}:{pid}:{pid}{g(2)} [{dev}] NCCL INFO "
    k = g(4)
    if k < 7:
        return f"{head}Channel {g(5):02d}/{g(1)} : {g(4)}[{dev}] -> {g(4)}[{g(3)}] via {_TRANSPORTS[k % 6]}"
    if k == 7:
        return (
            f"{head}NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB [2]mlx5_2:1/IB [3]mlx5_3:1/IB ; "
            f"OOB eth0:10.0.{_IP[g(12)]}<0>"
        )
    if k == 8:
        return (
            f"{head}comm 0x{_HEX[g(12)]} rank {g(7)} nranks 128 cudaDev {dev} nvmlDev {dev} "
            f"busId {16 + g(7):x}000 commId 0x{_HEX[g(12)]} - Init COMPLETE"
        )
    if k == 9:
        return f"{head}Setting affinity for GPU {dev} to ffffffff,00000000,ffffffff"
    if k == 10:
        return f"{head}Trees [0] {g(7)}/-1/-1->{g(7)}->{g(7)} [1] -1/-1/-1->{dev}->-1"
    if k == 11:
        return f"{head}Connected all rings"
    if k == 12:
        return f"{head}Connected all trees"
    if k == 13:
        return f"{head}Using network IB"
    if k == 14:
        return f"{head}cudaDriverVersion 12040"
    return f"{head}threadThresholds 8/8/64 | 1024/8/64 | 512 | 512; {g(5)} coll channels, 0 nvls channels"


def _vllm(rng: random.Random, i: int) -> str:
    g = rng.getrandbits
    pid = _PID[g(12)]
    ts = _ts(i)[5:16]
    k = g(2)
    if k == 0:
        return (
            f"INFO {ts} metrics.py:351] Avg prompt throughput: {_TPS[g(12)]} tokens/s, Avg generation "
            f"throughput: {_TPS[g(12)]} tokens/s, Running: {g(6)} reqs, Swapped: 0 reqs, "
            f"Pending: {g(3)} reqs, GPU KV cache usage: {_PCT[g(12)]}%, CPU KV cache usage: 0.0%."
        )
    if k == 1:
        return (
            f"(VllmWorkerProcess pid={pid}) INFO {ts} model_runner.py:1025] Loading model weights took {_GB[g(12)]} GB"
        )
    if k == 2:
        return (
            f"(VllmWorkerProcess pid={pid}) INFO {ts} worker.py:232] Memory profiling results: "
            f"total_gpu_memory=79.19GiB initial_memory_usage={_F3[g(12)]}GiB "
            f"peak_torch_memory={_GB[g(12)]}GiB "
            f"memory_usage_post_profile={_GB[g(12)]}GiB non_torch_memory=0.85GiB kv_cache_size=35.21GiB "
            "gpu_memory_utilization=0.90"
        )
    return f"(VllmWorkerProcess pid={pid}) INFO {ts} custom_all_reduce_utils.py:232] reading GPU P2P access cache"


def _ascend(rng: random.Random, i: int) -> str:
    g = rng.getrandbits
    pid = _PID[g(12)]
    ts = _plog_ts(i)
    k = g(3)
    if k < 2:
        return (
            f"[INFO] HCCL({pid},python):{ts} [hccl_socket.cc:100] [{pid}][HcclSocket][Listen] "
            f"socket type[1], listen on ip[192.168.{_IP[g(12)]}%eth0] and port[{60000 + g(4)}] success"
        )
    if k < 4:
        return (
            f"[INFO] RUNTIME({pid},python):{ts} [stream.cc:{_SMALL[g(11)]}] {pid} StreamSynchronize: "
            f"stream_id={g(6)}, device_id={g(3)}, timeout=-1"
        )
    if k == 4:
        return (
            f"[INFO] GE({pid},python):{ts} [graph_manager.cc:{_SMALL[g(12)]}]{pid} RunGraph: "
            f"graph_id={g(7)}, session_id=0, iterations_per_loop=1"
        )
    if k == 5:
        return f"[EVENT] PROFILING({pid},python):{ts} [msprof_callback.cc:152] >>> (tid:{pid}) Started to report task"
    return (
        f"[INFO] ASCENDCL({pid},python):{ts} [tensor_data_transfer.cc:{_SMALL[g(9)]}]{pid} "
        f"aclrtMemcpy: size={g(24)}, kind=ACL_MEMCPY_HOST_TO_DEVICE"
    )


def _syslog(rng: random.Random, i: int) -> str:
    g = rng.getrandbits
    host = _HOSTS[g(4)]
    h, m, s = _clock(43200 + i // 50)
    head = f"Apr 27 {h:02d}:{m:02d}:{s:02d} {host}"
    k = g(2)
    if k < 2:
        msg = _KERNEL[i % len(_KERNEL)].format(b=g(8), nic=_NICS[g(3)], t=1714200000 + i, n=_PID[g(12)])
        return f"{head} kernel: [{i / 100:12.6f}] {msg}"
    if k == 2:
        return (
            f"{head} kubelet[2345]: I0427 {h:02d}:{m:02d}:{s:02d}.{i % 1000000:06d} 2345 kubelet.go:2430] "
            f'"SyncLoop UPDATE" source="api" pods=["training/llama-70b-worker-{g(4)}"]'
        )
    return f"{head} systemd[1]: Started Session {_SMALL[g(12)]} of User root."


def _warning(rng: random.Random, i: int) -> str:
    k = rng.getrandbits(3)
    return "  warnings.warn(" if k >= len(_PY_WARNINGS) else _PY_WARNINGS[k]


def _checkpoint(rng: random.Random, i: int) -> str:
    step = i // 8
    k = rng.getrandbits(2)
    if k == 0:
        return (
            f"[{_ts(i)}] [INFO] [engine.py:3591:save_checkpoint] Saving model checkpoint: "
            f"/mnt/ckpt/global_step{step}/mp_rank_00_model_states.pt"
        )
    if k == 1:
        return f"saving checkpoint at iteration {step:7d} to /mnt/ckpt in torch format"
    if k == 2:
        return f"  successfully saved checkpoint from iteration {step:7d} to /mnt/ckpt [ t 1/8, p 1/1 ]"
    return f"Saving model checkpoint to output/checkpoint-{step}"


_ANSI_LEVELS = (
    "\x1b[1mINFO    \x1b[0m",
    "\x1b[33m\x1b[1mWARNING \x1b[0m",
    "\x1b[34m\x1b[1mDEBUG   \x1b[0m",
    "\x1b[1mINFO    \x1b[0m",
)


def _ansi(rng: random.Random, i: int) -> str:
    g = rng.getrandbits
    return (
        f"\x1b[32m{_ts(i)}\x1b[0m | {_ANSI_LEVELS[g(2)]} | \x1b[36mtrainer\x1b[0m:\x1b[36mtrain_step\x1b[0m:"
        f"\x1b[36m{50 + g(8)}\x1b[0m - \x1b[1mstep {i // 8} loss={_F3[g(12)]} lr={_LR[g(12)]}\x1b[0m"
    )


def _chinese(rng: random.Random, i: int) -> str:
    g = rng.getrandbits
    t = _CHINESE[g(3)]
    msg = t.format(
        e=i // 100000,
        s=i // 8,
        loss=_F3[g(12)],
        lr=_LR[g(12)],
        tp=_TPS[g(12)],
        t=_F3[g(12)],
        p=_F3[g(12)],
        n=_PID[g(12)],
        k=g(10),
        m=_GB[g(12)],
        c=_F3[g(12)],
        w=8 << g(4),
        acc=_PCT[g(12)],
        ppl=_F4[g(12)],
        g=_F3[g(12)],
    )
    return f"{_ts(i)} | INFO | {msg}"


def _near_miss(rng: random.Random, i: int) -> str:
    g = rng.getrandbits
    t = _NEAR_MISS[i % len(_NEAR_MISS)]
    return t.format(
        pid=_PID[g(12)],
        n=_PID[g(12)],
        d=g(3),
        m=_GB[g(12)],
        c=_GB[g(12)],
        r=g(6),
        host=_HOSTS[g(4)],
        s=i // 8,
        t=_MS[g(12)],
    )


def _docker_json(rng: random.Random, i: int) -> str:
    inner = _deepspeed(rng, i) if rng.getrandbits(1) else _tqdm(rng, i)
    record = {"log": inner + "\n", "stream": "stderr", "time": f"2025-04-27T12:00:{i % 60:02d}.{i:09d}Z"}
    return json.dumps(record, ensure_ascii=bool(rng.getrandbits(1)))


def _long(rng: random.Random, i: int) -> str:
    target = 2048 + rng.randrange(6144)
    k = rng.randrange(3)
    parts: list[str] = []
    size = 0
    if k == 0:  # tqdm redraws joined by carriage returns, as captured from a terminal
        total = 5000
        done = 1 + rng.randrange(total // 2)
        while size < target:
            frame = _tqdm_frame(rng, done, total)
            parts.append(frame)
            size += len(frame.encode("utf-8")) + 1
            done = min(total, done + 1 + rng.getrandbits(5))
        return "\r".join(parts)
    if k == 1:  # argparse Namespace dump
        j = 0
        while size < target:
            item = f"arg_{j}_{_ARG_NAMES[j % len(_ARG_NAMES)]}={_F4[rng.getrandbits(12)]}"
            parts.append(item)
            size += len(item) + 2
            j += 1
        return "Namespace(" + ", ".join(parts) + ")"
    j = 0  # DeepSpeed config dump
    while size < target:
        enabled = "true" if rng.getrandbits(1) else "false"
        item = f'"key_{j}": {{"enabled": {enabled}, "value": {rng.getrandbits(20)}}}'
        parts.append(item)
        size += len(item) + 2
        j += 1
    return f"[{_ts(i)}] [INFO] [config.py:1000:print]   json = {{" + ", ".join(parts) + "}"


_ARG_NAMES = ("lr", "dropout", "hidden", "heads", "seq", "tp", "pp")


# (generator, weight in lines per thousand)
TEMPLATES: list[tuple[Gen, float]] = [
    (_megatron, 80),
    (_deepspeed, 80),
    (_hf_trainer, 50),
    (_torchrun_rank, 60),
    (_tqdm, 60),
    (_nccl, 200),
    (_vllm, 60),
    (_ascend, 100),
    (_syslog, 60),
    (_warning, 40),
    (_checkpoint, 30),
    (_ansi, 30),
    (_chinese, 30),
    (_near_miss, 50),
    (_docker_json, 20),
    (_long, 2),
]


def benign_lines(n: int, seed: int) -> list[str]:
    """`n` benign lines (deterministic for the seed); used to check that no template matches a rule."""
    rng = random.Random(seed)
    gens = [g for g, _ in TEMPLATES]
    picks = rng.choices(range(len(gens)), weights=[w for _, w in TEMPLATES], k=n)
    return [gens[k](rng, i) for i, k in enumerate(picks)]


def write_corpus(path: Path, n_lines: int, pool: Sequence[FaultLine], *, seed: int = DEFAULT_SEED) -> Corpus:
    """Write `n_lines` lines to `path`: exactly n_lines // FAULT_EVERY fault lines from `pool`, the rest
    benign. Returns what was written and the findings the engine must report on it."""
    if not pool:
        raise ValueError("empty fault pool")
    t0 = time.perf_counter()
    rng = random.Random(seed)
    n_faults = n_lines // FAULT_EVERY
    fault_at = set(rng.sample(range(n_lines), n_faults))
    gens = [g for g, _ in TEMPLATES]
    picks = rng.choices(range(len(gens)), weights=[w for _, w in TEMPLATES], k=n_lines)
    expected: Counter[FindingKey] = Counter()
    size = 0
    with path.open("wb") as fh:
        batch: list[str] = []
        for i, k in enumerate(picks):
            if i in fault_at:
                fault = pool[rng.randrange(len(pool))]
                expected.update(fault.findings)
                batch.append(fault.text)
            else:
                batch.append(gens[k](rng, i))
            if len(batch) >= 65536:
                data = ("\n".join(batch) + "\n").encode("utf-8")
                size += len(data)
                fh.write(data)
                batch = []
        if batch:
            data = ("\n".join(batch) + "\n").encode("utf-8")
            size += len(data)
            fh.write(data)
    return Corpus(
        path=path,
        lines=n_lines,
        bytes=size,
        fault_lines=n_faults,
        expected=expected,
        pool_size=len(pool),
        pool_from_real_logs=sum(1 for f in pool if f.origin.startswith("real:")),
        pool_from_examples=sum(1 for f in pool if f.origin.startswith("example:")),
        seed=seed,
        gen_seconds=time.perf_counter() - t0,
    )
