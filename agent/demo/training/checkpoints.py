"""The checkpoint files a simulated run writes (Hugging Face Trainer and Megatron layouts), whole or cut
short by a fault, and the names a job's resume settings use.
"""

from __future__ import annotations

import io
import json
import struct
import zipfile
from pathlib import Path

from trainmedic.agent.demo.emulator import JOB, VOLCANO_JOB

# Extended resources of the device plugins: NVIDIA k8s-device-plugin, Huawei ascend-device-plugin,
# Cambricon's.
ACCELERATORS = ("nvidia.com/gpu", "huawei.com/Ascend910", "cambricon.com/mlu")
RESUME_FROM_ENV = "TRAINMEDIC_RESUME_FROM"
RESUME_STEP_ENV = "TRAINMEDIC_RESUME_STEP"
MEGATRON_TRACKER = "latest_checkpointed_iteration.txt"
_WORKLOADS = (JOB, VOLCANO_JOB)


# -- checkpoints as the frameworks write them ---------------------------------------------------------


def _torch_save(path: Path, payload: bytes, *, cut: bool = False) -> None:
    """A zip-format torch.save file (PyTorch >= 1.6: archive/data.pkl, byteorder, data/<n>, version).
    `cut`: only the first half reached the disk (no end-of-central-directory record)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", b"\x80\x02}q\x00.")  # an empty dict, pickle protocol 2
        z.writestr("archive/byteorder", "little")
        z.writestr("archive/data/0", payload)
        z.writestr("archive/version", "3\n")
    data = buf.getvalue()
    path.write_bytes(data[: len(data) // 2] if cut else data)


def _safetensors(path: Path, n_bytes: int = 512) -> None:
    """A well-formed safetensors file: 8-byte header length, JSON header, then the tensor bytes."""
    header = {
        "__metadata__": {"format": "pt"},
        "model.embed_tokens.weight": {"dtype": "BF16", "shape": [n_bytes // 32, 16], "data_offsets": [0, n_bytes]},
    }
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(n_bytes))


def write_hf_checkpoint(
    root: Path, step: int, *, max_steps: int, save_steps: int, processes: int = 16, cut: bool = False
) -> Path:
    """`checkpoint-<step>/` as `Trainer._save_checkpoint` writes it: model, optimizer, scheduler, rng
    states, and trainer_state.json last. `cut`: the save stops inside optimizer.pt."""
    d = root / f"checkpoint-{step}"
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}))
    (d / "generation_config.json").write_text(json.dumps({"bos_token_id": 128000, "eos_token_id": 128009}))
    _safetensors(d / "model.safetensors")
    _torch_save(d / "training_args.bin", b"\x00" * 64)
    _torch_save(d / "optimizer.pt", b"\x01" * 4096, cut=cut)
    if cut:
        return d
    _torch_save(d / "scheduler.pt", b"\x02" * 64)
    for r in range(processes):
        _torch_save(d / f"rng_state_{r}.pth", b"\x03" * 32)
    state = {
        "best_metric": None,
        "best_model_checkpoint": None,
        "epoch": round(step * 3 / max_steps, 4),
        "eval_steps": 500,
        "global_step": step,
        "is_hyper_param_search": False,
        "is_local_process_zero": True,
        "is_world_process_zero": True,
        "log_history": [{"epoch": round(s * 3 / max_steps, 4), "step": s} for s in range(1, step + 1)][-50:],
        "logging_steps": 1,
        "max_steps": max_steps,
        "num_train_epochs": 3,
        "save_steps": save_steps,
        "total_flos": 1.2e15 * step,
        "train_batch_size": 4,
        "trial_name": None,
        "trial_params": None,
    }
    (d / "trainer_state.json").write_text(json.dumps(state, indent=2))
    return d


def write_megatron_checkpoint(root: Path, step: int, *, tp: int, cut: bool = False) -> Path:
    """`iter_<step:07d>/mp_rank_<tp>/model_optim_rng.pt` for each tensor-parallel rank, then rank 0
    writes `latest_checkpointed_iteration.txt` after the barrier. `cut`: half the ranks wrote."""
    d = root / f"iter_{step:07d}"
    ranks = range(tp // 2) if cut else range(tp)
    for r in ranks:
        sub = d / f"mp_rank_{r:02d}"
        sub.mkdir(parents=True, exist_ok=True)
        _torch_save(sub / "model_optim_rng.pt", b"\x04" * 2048, cut=cut and r == ranks[-1])
    if not cut:
        (root / MEGATRON_TRACKER).write_text(str(step))
    return d
