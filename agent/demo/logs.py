"""What the demo's simulated jobs and nodes print, in the shapes real ones print.

The detectors only ever see text, so the demo's training is only as convincing as its lines. The
healthy lines follow the frameworks' own formats (the Hugging Face Trainer as LLaMA-Factory runs it
on NVIDIA GPUs; Megatron-LM as MindSpeed-LLM runs it on Ascend NPUs); the fault lines are the real
ones of the failure corpus and the shipped rules' examples, with their numbers (pids, times, ranks)
made to fit the emulated cluster:

* Xid 79: the current driver's wording, as in rules/nvidia_xid.yaml and the NVSentinel report
  (github.com/NVIDIA/NVSentinel/issues/155), in an rsyslog kern.log line;
* NCCL watchdog: PyTorch's ProcessGroupNCCL timeout (github.com/hiyouga/LlamaFactory/issues/6269);
* CUDA OOM: torch >= 2.2's OutOfMemoryError message (github.com/pytorch/pytorch/issues/16417) and
  torchrun's ChildFailedError summary;
* HCCL EI0006: torch_npu's HcclAllreduce failure with ERR01100 and CANN's EI0006 "Getting socket
  times out" (github.com/vllm-project/vllm-ascend/issues/486).

Nothing here is random at import; callers pass the step, time and rank.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

_SITE = "/usr/local/lib/python3.10/dist-packages"

__all__ = [
    "HFTrainerLog",
    "MegatronLog",
    "cuda_oom_lines",
    "hang_stack",
    "hccl_ei0006_lines",
    "kern_log_line",
    "nccl_watchdog_lines",
    "torchrun_peer_stop_lines",
    "xid79_message",
]


def _hf_time(t: float) -> str:
    """The logging module's asctime: `2024-06-01 10:00:00,123`."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) + f",{int(t * 1000) % 1000:03d}"


def _loss(step: int, base: float, floor: float) -> float:
    """A plausible, deterministic training loss curve with a little wobble."""
    return floor + (base - floor) * math.exp(-step / 180.0) + 0.02 * math.sin(step * 1.7)


@dataclass(frozen=True)
class HFTrainerLog:
    """The Hugging Face Trainer's lines (transformers/trainer.py, trainer_callback.py) with
    LLaMA-Factory's logging prefix `[INFO|trainer.py:N] <asctime> >> `."""

    model: str = "Meta-Llama-3-8B-Instruct"
    total_steps: int = 3000
    examples: int = 192_000
    batch_per_device: int = 4
    accumulation: int = 4

    @staticmethod
    def _info(where: str, text: str, t: float) -> str:
        return f"[INFO|{where}] {_hf_time(t)} >> {text}"

    def nccl_init(self, host: str, rank: int, t: float) -> list[str]:
        pid = 57 + rank
        return [
            f"{host}:{pid}:{pid} [0] NCCL INFO Bootstrap : Using eth0:10.244.{rank + 1}.5<0>",
            f"{host}:{pid}:{pid} [0] NCCL INFO NCCL version 2.21.5+cuda12.4",
            f"{host}:{pid}:{pid + 40} [0] NCCL INFO Channel 00/32 :    0   8",
            f"{host}:{pid}:{pid + 40} [0] NCCL INFO Connected all rings",
            f"{host}:{pid}:{pid + 40} [0] NCCL INFO ncclCommInitRank comm 0x55d0c3a0 rank {rank * 8} nranks 16 "
            "cudaDev 0 nvmlDev 0 busId 18000 commId 0x5c1f2ba3e9d4f5a1 - Init COMPLETE",
        ]

    def banner(self, world: int, t: float) -> list[str]:
        total_batch = self.batch_per_device * self.accumulation * world
        return [
            self._info("trainer.py:2128", "***** Running training *****", t),
            self._info("trainer.py:2129", f"  Num examples = {self.examples:,}", t),
            self._info("trainer.py:2130", "  Num Epochs = 3", t),
            self._info("trainer.py:2131", f"  Instantaneous batch size per device = {self.batch_per_device}", t),
            self._info(
                "trainer.py:2134",
                f"  Total train batch size (w. parallel, distributed & accumulation) = {total_batch}",
                t,
            ),
            self._info("trainer.py:2135", f"  Gradient Accumulation steps = {self.accumulation}", t),
            self._info("trainer.py:2136", f"  Total optimization steps = {self.total_steps:,}", t),
            self._info("trainer.py:2137", "  Number of trainable parameters = 8,030,261,248", t),
        ]

    def resume(self, checkpoint: str, step: int, t: float) -> list[str]:
        """`Trainer._load_from_checkpoint` and `_inner_training_loop` when resuming."""
        return [
            self._info("trainer.py:2592", f"Loading model from {checkpoint}.", t),
            *self.banner(16, t),
            self._info("trainer.py:2151", "  Continuing training from checkpoint, will skip to saved global_step", t),
            self._info("trainer.py:2152", "  Continuing training from epoch 0", t),
            self._info("trainer.py:2153", f"  Continuing training from global step {step}", t),
        ]

    def step(self, step: int) -> str:
        """ProgressCallback.on_log: str(logs) every logging step."""
        loss = _loss(step, 2.3, 0.95)
        lr = 2e-05 * min(1.0, step / 100) * (1 - step / (self.total_steps + 1))
        epoch = step * 3 / self.total_steps
        return (
            f"{{'loss': {loss:.4f}, 'grad_norm': {0.9 + 0.1 * math.cos(step):.4f}, "
            f"'learning_rate': {lr:.4e}, 'epoch': {epoch:.2f}}}"
        )

    def saving(self, checkpoint: str, t: float) -> list[str]:
        return [self._info("trainer.py:3478", f"Saving model checkpoint to {checkpoint}", t)]

    def saved(self, checkpoint: str, t: float) -> list[str]:
        return [
            self._info("configuration_utils.py:472", f"Configuration saved in {checkpoint}/config.json", t),
            self._info(
                "modeling_utils.py:2598",
                f"Model weights saved in {checkpoint}/model.safetensors",
                t,
            ),
        ]


@dataclass(frozen=True)
class MegatronLog:
    """Megatron-LM's lines (megatron/training/training.py training_log, checkpointing.py), as
    MindSpeed-LLM prints them on Ascend."""

    total_iters: int = 5000
    global_batch: int = 128
    tp: int = 8

    def banner(self, world: int, t: float) -> list[str]:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))
        return [
            f"using world size: {world}, data-parallel size: {world // self.tp}, context-parallel size: 1, "
            f"tensor-model-parallel size: {self.tp}, pipeline-model-parallel size: 1 ",
            "> building Qwen2 model ...",
            f" > number of parameters on (tensor, pipeline) model parallel rank (0, 0): {1_172_000_000:d}",
            f"[after model, optimizer, and learning rate scheduler are built] datetime: {stamp} ",
            "training ...",
            f"[before the start of training step] datetime: {stamp} ",
        ]

    def resume(self, root: str, step: int) -> list[str]:
        return [
            f" loading checkpoint from {root} at iteration {step}",
            f"  successfully loaded checkpoint from {root} [ t 1/{self.tp}, p 1/1 ] at iteration {step}",
        ]

    def step(self, step: int, step_ms: float) -> str:
        loss = _loss(step, 9.5, 3.1)
        lr = 1.25e-4 * min(1.0, step / 200)
        return (
            f" iteration {step:8d}/{self.total_iters:8d} | consumed samples: {step * self.global_batch:12d} |"
            f" elapsed time per iteration (ms): {step_ms:.1f} | learning rate: {lr:.6E} |"
            f" global batch size: {self.global_batch:5d} | lm loss: {loss:.6E} | loss scale: 1.0 |"
            f" grad norm: {1.2 + 0.3 * math.cos(step):.3f} | number of skipped iterations:   0 |"
            " number of nan iterations:   0 |"
        )

    def saving(self, root: str, step: int) -> list[str]:
        return [f"saving checkpoint at iteration {step:7d} to {root} in torch format"]

    def saved(self, root: str, step: int) -> list[str]:
        return [f"  successfully saved checkpoint from iteration {step:7d} to {root} [ t 1/{self.tp}, p 1/1 ]"]


# -- fault lines ---------------------------------------------------------------------------------------


def kern_log_line(host: str, t: float, uptime_s: float, message: str) -> str:
    """One line of /var/log/kern.log as rsyslog writes it in its high-precision format."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t * 1e6) % 1_000_000:06d}+00:00"
    return f"{stamp} {host} kernel: [{uptime_s:12.6f}] {message}"


def xid79_message(pci: str, pid: int) -> str:
    return f"NVRM: Xid (PCI:{pci}): 79, pid={pid}, name=python, GPU has fallen off the bus."


def nccl_watchdog_lines(rank: int, t: float, seq: int) -> list[str]:
    """ProcessGroupNCCL's watchdog on a peer of the lost GPU (the collective never completes)."""
    stamp = time.strftime("%m%d %H:%M:%S", time.localtime(t)) + f".{int(t * 1e9) % 1_000_000_000:09d}"
    head = f"[rank{rank}]:[E{stamp} ProcessGroupNCCL.cpp:607]"
    timeout = (
        f"[Rank {rank}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum={seq}, OpType=ALLREDUCE, "
        f"NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600099 milliseconds before timing out."
    )
    return [
        f"{head} {timeout}",
        f"[rank{rank}]:[E{stamp} ProcessGroupNCCL.cpp:1664] [PG 0 (default_pg) Rank {rank}] Exception (either an "
        f"error or timeout) detected by watchdog at work: {seq}, last enqueued NCCL work: {seq}, "
        f"last completed NCCL work: {seq - 1}.",
        "terminate called after throwing an instance of 'c10::DistBackendError'",
        f"  what():  [PG 0 (default_pg) Rank {rank}] Process group watchdog thread terminated with exception: "
        + timeout,
    ]


def cuda_oom_lines(rank: int, host: str, t: float) -> list[str]:
    """A CUDA OOM in the backward pass of the Trainer's step, then torchrun's failure summary."""
    p = f"[rank{rank}]: "
    return [
        p + "Traceback (most recent call last):",
        p + '  File "/app/src/llamafactory/launcher.py", line 23, in <module>',
        p + "    launch()",
        p + '  File "/app/src/llamafactory/train/tuner.py", line 92, in run_exp',
        p + "    _training_function(config={'args': args, 'callbacks': callbacks})",
        p + '  File "/app/src/llamafactory/train/sft/workflow.py", line 96, in run_sft',
        p + "    train_result = trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)",
        p + f'  File "{_SITE}/transformers/trainer.py", line 2279, in _inner_training_loop',
        p + "    tr_loss_step = self.training_step(model, inputs, num_items_in_batch)",
        p + f'  File "{_SITE}/torch/autograd/__init__.py", line 347, in backward',
        p + "    _engine_run_backward(",
        p + "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.96 GiB. GPU 0 has a total capacity of "
        "79.11 GiB of which 1.02 GiB is free. Including non-PyTorch memory, this process has 78.08 GiB memory in "
        "use. Of the allocated memory 75.43 GiB is allocated by PyTorch, and 1.12 GiB is reserved by PyTorch but "
        "unallocated. If reserved but unallocated memory is large try setting "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory "
        "Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)",
        *torchrun_failure_lines(rank, host, t),
    ]


def torchrun_failure_lines(rank: int, host: str, t: float, script: str = "src/train.py") -> list[str]:
    """torchrun's failure summary for a worker that exited 1 (torch.distributed.elastic)."""
    stamp = time.strftime("%Y-%m-%d_%H:%M:%S", time.localtime(t))
    return [
        "E0601 10:00:00.000000 1 torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: 1) "
        f"local_rank: 0 (pid: {57 + rank}) of binary: /usr/bin/python3",
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
        "============================================================",
        f"{script} FAILED",
        "------------------------------------------------------------",
        "Root Cause (first observed failure):",
        "[0]:",
        f"  time      : {stamp}",
        f"  host      : {host}",
        f"  rank      : {rank} (local_rank: 0)",
        f"  exitcode  : 1 (pid: {57 + rank})",
        "  error_file: <N/A>",
        "  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html",
        "============================================================",
    ]


def key_error_lines(rank: int, host: str, t: float) -> list[str]:
    """A KeyError raised by LLaMA-Factory's data collator (a sample without "labels"), as a rank of
    torchrun prints it, then torchrun's failure summary."""
    p = f"[rank{rank}]: "
    return [
        p + "Traceback (most recent call last):",
        p + '  File "/app/src/llamafactory/launcher.py", line 23, in <module>',
        p + "    launch()",
        p + '  File "/app/src/llamafactory/train/tuner.py", line 92, in run_exp',
        p + "    _training_function(config={'args': args, 'callbacks': callbacks})",
        p + '  File "/app/src/llamafactory/train/sft/workflow.py", line 96, in run_sft',
        p + "    train_result = trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)",
        p + f'  File "{_SITE}/transformers/trainer.py", line 2240, in _inner_training_loop',
        p + "    for step, inputs in enumerate(epoch_iterator):",
        p + f'  File "{_SITE}/accelerate/data_loader.py", line 552, in __iter__',
        p + "    current_batch = next(dataloader_iter)",
        p + f'  File "{_SITE}/torch/utils/data/dataloader.py", line 701, in __next__',
        p + "    data = self._next_data()",
        p + f'  File "{_SITE}/torch/utils/data/_utils/fetch.py", line 55, in fetch',
        p + "    return self.collate_fn(data)",
        p + '  File "/app/src/llamafactory/data/collator.py", line 171, in __call__',
        p + '    label_len = len(feature["labels"])',
        p + "KeyError: 'labels'",
        *torchrun_failure_lines(rank, host, t),
    ]


def torchrun_peer_stop_lines(pid: int) -> list[str]:
    """torchrun on a healthy node when the rendezvous closes because another node failed."""
    return [
        f"W0601 10:00:00.000000 1 torch/distributed/elastic/multiprocessing/api.py:897] "
        f"Sending process {pid} closing signal SIGTERM",
    ]


def hccl_ei0006_lines(rank: int, device: int, pid: int, t: float) -> list[str]:
    """torch_npu's first HcclAllreduce failing to set up its links, and CANN's EI0006 behind it."""
    day = time.strftime("%Y-%m-%d-%H:%M:%S", time.localtime(t))
    frac = f"{int(t * 1000) % 1000:03d}.{int(t * 1e6) % 1000:03d}"
    p = f"[rank{rank}]: "
    return [
        p + "RuntimeError: InnerRunOpApi:torch_npu/csrc/framework/OpParamMaker.cpp:281 OPS function error: "
        "HcclAllreduce, error code is 6",
        p + f"[ERROR] {day} (PID:{pid}, Device:{device}, RankID:{rank}) ERR01100 OPS call acl api failed.",
        p + f"EI0006: [PID: {pid}] {day}.{frac} Getting socket times out. Reason: Remote Rank did not send the data "
        "in time. Please check the reason for the rank being stuck",
    ]


def hang_stack(script: str = "/app/src/llamafactory/launcher.py") -> str:
    """What faulthandler prints for a rank stuck in an all-reduce (its NCCL peer is gone)."""
    return "\n".join(
        [
            "Thread 0x00007f2b8dfff640 (most recent call first):",
            '  File "/usr/lib/python3.10/threading.py", line 324 in wait',
            '  File "/usr/lib/python3.10/queue.py", line 180 in get',
            f'  File "{_SITE}/torch/utils/data/_utils/pin_memory.py", line 54 in do_one_step',
            "",
            "Current thread 0x00007f2c1a6b7480 (most recent call first):",
            f'  File "{_SITE}/torch/distributed/distributed_c10d.py", line 2501 in all_reduce',
            f'  File "{_SITE}/torch/distributed/c10d_logger.py", line 83 in wrapper',
            f'  File "{_SITE}/accelerate/utils/operations.py", line 431 in _gpu_gather_one',
            f'  File "{_SITE}/transformers/trainer.py", line 2345 in _inner_training_loop',
            f'  File "{_SITE}/transformers/trainer.py", line 1938 in train',
            '  File "/app/src/llamafactory/train/sft/workflow.py", line 96 in run_sft',
            f'  File "{script}", line 23 in <module>',
        ]
    )
