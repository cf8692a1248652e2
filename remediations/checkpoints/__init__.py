"""Checkpoint discovery: which saved checkpoint a failed training job can restart from.

A job declares its checkpoint root (`trainmedic.io/checkpoint-dir`). A crash usually lands in the
middle of a save, so the newest directory on disk is often half-written: restarting from it fails
again or silently loads garbage. This module lists every candidate under the root and judges each
one complete or not from what the framework writes *last* during a save, without importing torch
(pure stdlib: os.scandir, json, a few byte reads).

What each framework writes, and in which order (read from the framework sources):

* Hugging Face Trainer (`transformers/trainer.py`, `Trainer._save_checkpoint`; folder regex
  `^checkpoint\\-(\\d+)$` from `trainer_utils.get_last_checkpoint`): `checkpoint-<global_step>/`
  gets the model (`model.safetensors`, `pytorch_model.bin`, or shards listed in
  `model.safetensors.index.json` / `pytorch_model.bin.index.json` under `weight_map`; PEFT
  `adapter_model.*`; FSDP `pytorch_model_fsdp_*`; DeepSpeed `latest` + `global_step<N>/`), then
  `optimizer.pt`, `scheduler.pt`, `scaler.pt`, `rng_state*.pth`, and `trainer_state.json` LAST.
  So: no parsable trainer_state.json with an integer `global_step` -> incomplete; every shard an
  index lists must exist; the step is trainer_state's `global_step`.
* DeepSpeed (`deepspeed/runtime/engine.py`, `DeepSpeedEngine.save_checkpoint`): tag directory
  (default `global_step<N>`) with `mp_rank_XX_model_states.pt`, ZeRO `[bf16_]zero_pp_rank_D_mp_rank_XX_optim_states.pt`
  (ZeRO-3 also `zero_pp_rank_D_mp_rank_XX_model_states.pt`); after a barrier, rank 0 writes the
  tag name into `latest`. A tag newer than the one `latest` names is a save that did not finish;
  `latest` naming a missing or broken tag falls back to the previous complete tag. Rank files must
  form a gap-free grid (ranks 0..n-1; a missing *last* rank cannot be told from file names).
* Megatron-LM (`megatron/training/checkpointing.py`, `get_checkpoint_name`, `save_checkpoint`;
  `megatron/core/dist_checkpointing/serialization.py`): `iter_%07d/` (or `release/`) holding
  `mp_rank_TT[_PPP][_EEE]/model_optim_rng.pt` (+ `distrib_optim.pt`), or the distributed format
  (torch_dist: `.metadata` + `__R_N.distcp` + `common.pt`, then `metadata.json` by rank 0 last).
  After a barrier rank 0 writes `latest_checkpointed_iteration.txt` (an integer or `release`):
  an iteration directory newer than the tracker is a half-written save. veRL
  (`verl/trainer/ppo/ray_trainer.py`, `_save_checkpoint`) writes the same tracker file next to
  `global_step_<N>/` folders, so the tracker rule applies to every step directory beside it.
* torch.distributed.checkpoint (`torch/distributed/checkpoint/filesystem.py`,
  `_FileSystemWriter.finish`): every rank writes `__<rank>_<n>.distcp`, then the coordinator writes
  `.metadata.tmp` and renames it to `.metadata`. No `.metadata` (or a leftover `.metadata.tmp`)
  -> incomplete; each `.distcp` name recorded in `.metadata` must exist and be non-empty (the
  pickled metadata is scanned for file names, never unpickled). A rank with nothing to write may
  leave an empty `.distcp`, so empty data files alone are not a fault.
* Plain step directories (`step-N`, `step_N`, `global_step_N`, `iter_N`, `ckpt-N`, `checkpoint_N`
  as written by `accelerate.save_state`, `N`, and `checkpoint-N` without any Trainer file): there
  is no commit marker, so the heuristic is: complete when the directory (or one of its immediate
  subdirectories) holds at least one non-empty file and nothing marks a save in progress: no
  `*.tmp` / `*.partial` / `*.incomplete` file, no zero-byte weights file (`.pt`, `.pth`, `.bin`,
  `.safetensors`, `.ckpt`), no truncated weights file (see below), no DCP subdirectory without
  `.metadata`, and, when a tracker (`latest_checkpointed_iteration.txt` or `latest`) sits beside
  it, a step not newer than the tracker's.

Truncation is checked cheaply where the format allows: a `.safetensors` file must be as long as
its header says (8-byte length + JSON header + the largest `data_offsets` end); a zip-format
`torch.save` file (`PK\\x03\\x04` at the start) must end with a zip end-of-central-directory record.

The root may itself be a checkpoint (e.g. it holds `.metadata` or `trainer_state.json`); it is
listed and its subdirectories are still searched (a Trainer output_dir keeps its final state next
to its `checkpoint-N/` folders). The walk is bounded: candidates at most `max_depth` (2) levels
below the root, at most `max_entries` (10,000) directory entries read in all, symlink loops cut
by (device, inode), newest candidates examined first so a huge tree still yields the latest
complete checkpoint; a candidate left unexamined when the budget runs out is listed as incomplete
with that reason.
Nothing raises on bad trees: unreadable directories and files become incomplete entries with a
reason (English in `reason`, Chinese in `reason_zh`), and a root that does not exist gives [].

The parts: `files` (the limits, the file and directory names of each format, `Checkpoint`, and the
bounded, defensive reads of a listing and its files), `walk` (`_Walk`: the tree walked once, each
candidate judged complete or not, and why), `formats` (what a directory's name and contents say about
its format and step). This package keeps the entry points and re-exports every public name.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from trainmedic.remediations.checkpoints.files import (
    DESCRIBE_LIMIT,
    FORMATS,
    MAX_DEPTH,
    MAX_ENTRIES,
    Checkpoint,
    _sort_key,
)
from trainmedic.remediations.checkpoints.walk import _Walk

__all__ = [
    "DESCRIBE_LIMIT",
    "FORMATS",
    "MAX_DEPTH",
    "MAX_ENTRIES",
    "Checkpoint",
    "describe",
    "latest_complete",
    "latest_of",
    "list_checkpoints",
]


"""`Checkpoint.format` values; `unknown` is a directory that could not be read at all."""


def list_checkpoints(
    root: str | os.PathLike[str], *, max_depth: int = MAX_DEPTH, max_entries: int = MAX_ENTRIES
) -> list[Checkpoint]:
    """Every checkpoint candidate under `root`, complete or not, sorted by (step, mtime) ascending.

    A root that does not exist (or is not a directory) gives []; the caller reports that. A root
    that cannot be listed gives one incomplete entry of format `unknown` saying why.
    """
    return _Walk(os.fspath(root), max(0, max_depth), max(1, max_entries)).run()


def latest_complete(
    root: str | os.PathLike[str], *, max_depth: int = MAX_DEPTH, max_entries: int = MAX_ENTRIES
) -> Checkpoint | None:
    """The complete checkpoint with the highest step (ties: newest mtime), or None."""
    return latest_of(list_checkpoints(root, max_depth=max_depth, max_entries=max_entries))


def latest_of(checkpoints: Iterable[Checkpoint]) -> Checkpoint | None:
    """The complete checkpoint with the highest step (ties: newest mtime) of a listing, or None."""
    complete = [c for c in checkpoints if c.complete]
    return max(complete, key=_sort_key) if complete else None


def describe(checkpoints: Iterable[Checkpoint], limit: int = DESCRIBE_LIMIT) -> list[dict[str, object]]:
    """The scene's checkpoint listing: the newest `limit` candidates as dicts, ascending like list_checkpoints."""
    ordered = sorted(checkpoints, key=_sort_key)
    kept = ordered[-limit:] if limit > 0 else []
    return [c.as_dict() for c in kept]
