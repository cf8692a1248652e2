"""What a directory's name and contents say about a checkpoint: its format (Hugging Face Trainer,
DeepSpeed, Megatron, DCP, a step directory), its step, the files it owns, its index's problems.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from trainmedic.remediations.checkpoints.files import (
    _DCP_METADATA,
    _DCP_METADATA_TMP,
    _DS_LATEST,
    _DS_TAG_NAME,
    _FSDP_OPTIM_DIR,
    _HF_FILES,
    _HF_NAME,
    _MAX_JSON_BYTES,
    _MEGATRON_CONFIG,
    _MEGATRON_ITER,
    _MEGATRON_RANK_DIR,
    _STEP_NAME,
    _TRACKER,
    _TRAINER_STATE,
    _TRAINER_STEP_HEAD,
    _Entry,
    _Listing,
    _os_reason,
    _read_bytes,
    _read_json,
    _read_json_object,
    _read_pointer,
    _Reason,
)


@dataclass(frozen=True, slots=True)
class _Context:
    """What a directory holding checkpoints says about them: the DeepSpeed / Megatron pointers."""

    ds_entry: _Entry | None
    ds_tag: str | None
    ds_step: int | None
    tracker_entry: _Entry | None
    tracker_step: int | None
    tracker_release: bool

    @classmethod
    def of(cls, listing: _Listing, fmt: str | None) -> _Context:
        """`fmt` is the listing's own format when it is a checkpoint itself: a Trainer checkpoint's
        `latest` names its own DeepSpeed tag, not a sibling checkpoint."""
        ds_entry = listing.file(_DS_LATEST) if fmt != "hf_trainer" else None
        tag = _read_pointer(ds_entry) if ds_entry is not None else None
        if tag is not None and not _safe_name(tag):
            tag = None
        tracker = listing.file(_TRACKER)
        text = _read_pointer(tracker) if tracker is not None else None
        tracker_step = int(text) if text is not None and re.fullmatch(r"\d{1,18}", text) else None
        return cls(
            ds_entry=ds_entry if tag is not None else None,
            ds_tag=tag,
            ds_step=_step_from_name(tag) if tag is not None else None,
            tracker_entry=tracker if tracker_step is not None else None,
            tracker_step=tracker_step,
            tracker_release=text == "release",
        )

    def newer_than_pointer(self, step: int) -> _Reason | None:
        if self.tracker_step is not None and step > self.tracker_step:
            return _Reason(
                f"newer than {_TRACKER} ({self.tracker_step}): the save did not finish",
                f"比 {_TRACKER} 记录的第 {self.tracker_step} 步更新：保存未完成",
            )
        if self.ds_step is not None and step > self.ds_step:
            return _Reason(
                f"newer than the tag in `latest` ({self.ds_tag}): the save did not finish",
                f"比 `latest` 指向的 {self.ds_tag} 更新：保存未完成",
            )
        return None


@dataclass(frozen=True, slots=True)
class _Candidate:
    entry: _Entry
    step: int | None  # from the name; a format may know better (trainer_state.json)
    ctx: _Context | None  # the directory holding it (None for the root itself)


def _step_from_name(name: str) -> int | None:
    m = _STEP_NAME.match(name)
    return int(m.group(1)) if m else None


def _safe_name(name: str) -> bool:
    return name not in (".", "..") and "/" not in name and "\\" not in name and "\x00" not in name


def _looks_dcp(listing: _Listing) -> bool:
    return (
        listing.file(_DCP_METADATA) is not None
        or listing.file(_DCP_METADATA_TMP) is not None
        or any(e.name.endswith(".distcp") for e in listing.files())
    )


def _content_format(listing: _Listing, name: str, ctx: _Context | None) -> str | None:
    """The format a directory's own files show; None when they show none (maybe a container)."""
    if listing.error is not None:
        return None
    files = {e.name for e in listing.files()}
    dirs = {e.name for e in listing.dirs()}
    if _TRAINER_STATE in files:
        return "hf_trainer"
    if any(_MEGATRON_RANK_DIR.match(d) for d in dirs):
        return "megatron"
    megatron_named = bool(_MEGATRON_ITER.match(name)) or (name == "release" and ctx is not None and ctx.tracker_release)
    if _MEGATRON_CONFIG in files and (megatron_named or _looks_dcp(listing)):
        return "megatron"
    if _looks_dcp(listing):
        return "megatron" if megatron_named and ctx is not None and ctx.tracker_entry is not None else "dcp"
    if any(f.endswith("model_states.pt") for f in files):
        return "deepspeed"
    if _HF_NAME.match(name) and (
        files & _HF_FILES
        or any(f.endswith(".index.json") or f.startswith(("rng_state", "pytorch_model")) for f in files)
        or any(_DS_TAG_NAME.match(d) or d.startswith("pytorch_model_fsdp") for d in dirs)
    ):
        return "hf_trainer"
    return None


def _owned(listing: _Listing, fmt: str | None) -> frozenset[str]:
    """Subdirectories a checkpoint of format `fmt` keeps its own state in."""
    if fmt != "hf_trainer":
        return frozenset()
    return frozenset(
        e.name
        for e in listing.dirs()
        if _DS_TAG_NAME.match(e.name) or e.name.startswith("pytorch_model_fsdp") or _FSDP_OPTIM_DIR.match(e.name)
    )


def _name_format(name: str, ctx: _Context | None) -> str:
    """The format a candidate's name implies when its files do not tell (e.g. an empty directory)."""
    if _DS_TAG_NAME.match(name) or (ctx is not None and name == ctx.ds_tag):
        return "deepspeed"
    if _MEGATRON_ITER.match(name) or (name == "release" and ctx is not None and ctx.tracker_release):
        return "megatron"
    return "step_dir"


def _trainer_step(entry: _Entry) -> int | _Reason:
    """trainer_state.json's global_step, or why it cannot be had."""
    no_step = _Reason(f"{_TRAINER_STATE} has no integer global_step", f"{_TRAINER_STATE} 中没有整数 global_step")
    if entry.size > _MAX_JSON_BYTES:
        # A very long run's log_history: the Trainer writes keys sorted, so global_step comes early,
        # and a whole file ends with the closing brace.
        head = _read_bytes(entry.path, 64 * 1024)
        if isinstance(head, OSError):
            return _os_reason(_TRAINER_STATE, head)
        try:
            with open(entry.path, "rb") as fh:
                fh.seek(max(0, entry.size - 64))
                tail = fh.read()
        except OSError as err:
            return _os_reason(_TRAINER_STATE, err)
        if not tail.rstrip().endswith(b"}"):
            return _Reason(f"{_TRAINER_STATE} is not valid JSON", f"{_TRAINER_STATE} 不是有效的 JSON")
        m = _TRAINER_STEP_HEAD.search(head)
        return int(m.group(1)) if m else no_step
    data, problem = _read_json_object(entry)
    if problem is not None:
        return problem
    step = data.get("global_step")
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        return no_step
    return step


def _index_problem(listing: _Listing, index: _Entry) -> _Reason | None:
    """Every shard a sharded-weights index lists must be there and non-empty."""
    index_name = index.name
    data, problem = _read_json(index)
    if problem is not None:
        return problem
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        return _Reason(f"{index_name} has no valid weight_map", f"{index_name} 中没有有效的 weight_map")
    for shard in sorted(set(weight_map.values())):
        if not _safe_name(shard):
            return _Reason(
                f"{index_name} names a shard outside the checkpoint", f"{index_name} 引用了检查点目录之外的分片"
            )
        e = listing.file(shard)
        if e is None:
            return _Reason(
                f"shard {shard} listed in {index_name} is missing", f"{index_name} 列出的分片 {shard} 不存在"
            )
        if e.size == 0:
            return _Reason(f"shard {shard} is empty (0 bytes)", f"分片 {shard} 为空文件（0 字节）")
    return None
