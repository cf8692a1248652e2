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
"""

from __future__ import annotations

import json
import os
import re
import stat
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, fields
from typing import Final, Literal

from trainmedic.models import I18nText

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

FORMATS: Final = ("hf_trainer", "deepspeed", "megatron", "dcp", "step_dir", "unknown")
"""`Checkpoint.format` values; `unknown` is a directory that could not be read at all."""

MAX_DEPTH: Final = 2
MAX_ENTRIES: Final = 10_000
DESCRIBE_LIMIT: Final = 200

# Reads are bounded too: a corrupt or hostile file never makes the scan slow or memory-hungry.
_MAX_JSON_BYTES: Final = 16 * 1024 * 1024
_MAX_DCP_METADATA_BYTES: Final = 64 * 1024 * 1024
_MAX_SAFETENSORS_HEADER: Final = 16 * 1024 * 1024
_MAX_POINTER_BYTES: Final = 4096
_MAX_VERIFIED_FILES: Final = 2_000  # truncation checks per scan (each is an open and a small read)

_TRAINER_STATE: Final = "trainer_state.json"
_DCP_METADATA: Final = ".metadata"
_DCP_METADATA_TMP: Final = ".metadata.tmp"
_TRACKER: Final = "latest_checkpointed_iteration.txt"
_DS_LATEST: Final = "latest"
_MEGATRON_CONFIG: Final = "metadata.json"

_STEP_NAME = re.compile(r"^(?:(?:checkpoint|ckpt|step|global_step|iter|iteration)[-_]?)?(\d{1,18})$", re.IGNORECASE)
_HF_NAME = re.compile(r"^checkpoint-(\d{1,18})$")
_DS_TAG_NAME = re.compile(r"^global_step(\d{1,18})$")
_FSDP_OPTIM_DIR = re.compile(r"^optimizer_\d+$")
_MEGATRON_ITER = re.compile(r"^iter_(\d{7,18})$")
_MEGATRON_RANK_DIR = re.compile(r"^mp_rank_(\d{2})(?:_(\d{3}))?(?:_(\d{3}))?$")
_DS_MP_MODEL = re.compile(r"^mp_rank_(\d+)_model_states\.pt$")
_DS_ZERO_OPTIM = re.compile(r"^(?:bf16_)?zero_pp_rank_(\d+)_mp_rank_(\d+)_?optim_states\.pt$")
_DS_ZERO_MODEL = re.compile(r"^zero_pp_rank_(\d+)_mp_rank_(\d+)_model_states\.pt$")
_DCP_FILE_REF = re.compile(rb"__\d{1,9}_\d{1,9}\.distcp")
_TRAINER_STEP_HEAD = re.compile(rb'"global_step"\s*:\s*(\d{1,18})\s*[,}]')

_PROGRESS_SUFFIXES: Final = (".tmp", ".partial", ".incomplete")
_WEIGHT_SUFFIXES: Final = (".pt", ".pth", ".bin", ".safetensors", ".ckpt")
_ZIP_SUFFIXES: Final = (".pt", ".pth", ".bin", ".ckpt")
# Files only the HF Trainer writes into checkpoint-N: with any of them and no trainer_state.json
# the directory is a Trainer save cut short, not a plain step directory.
_HF_FILES: Final = frozenset(
    {
        "optimizer.pt",
        "optimizer.bin",
        "scheduler.pt",
        "scaler.pt",
        "training_args.bin",
        "model.safetensors",
        "pytorch_model.bin",
        "adapter_model.safetensors",
        "adapter_model.bin",
        "adapter_config.json",
        "config.json",
        "rng_state.pth",
        _DS_LATEST,
        "zero_to_fp32.py",
    }
)
_HF_TRAINING_FILES: Final = frozenset({"training_args.bin", "optimizer.bin", "scheduler.bin"})


# -- the data model ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Checkpoint:
    """One checkpoint candidate under a checkpoint root.

    `path` is the candidate as reached from the root given (symlinks not resolved); `step` the
    training step (None where it cannot be told); `format` one of FORMATS; `reason` says in short
    English why an incomplete candidate cannot be used (None when complete), `reason_zh` the same
    in Chinese; `mtime` the newest modification time seen among the directory and the files
    examined; `size_bytes` the total size of the files examined (the walk is bounded, so a very
    large checkpoint may be undercounted). `as_dict()` keys are exactly the fields, so
    `Checkpoint(**c.as_dict())` round-trips.
    """

    path: str
    step: int | None
    format: str
    complete: bool
    reason: str | None
    mtime: float
    size_bytes: int
    reason_zh: str | None = None

    def reason_text(self) -> I18nText | None:
        """The reason in both languages, for reports and notifications."""
        if not self.reason:
            return None
        return I18nText(en=self.reason, zh=self.reason_zh or self.reason)

    def as_dict(self) -> dict[str, object]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def _sort_key(c: Checkpoint) -> tuple[int, float, str]:
    return (-1 if c.step is None else c.step, c.mtime, c.path)


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


# -- reasons ----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Reason:
    en: str
    zh: str


def _os_reason(what: str, err: OSError) -> _Reason:
    if isinstance(err, PermissionError):
        return _Reason(f"permission denied reading {what}", f"读取 {what} 时权限不足")
    text = err.strerror or type(err).__name__
    return _Reason(f"cannot read {what}: {text}", f"无法读取 {what}：{text}")


def _missing(name: str) -> _Reason:
    return _Reason(f"{name} missing", f"缺少 {name}")


def _budget_reason(limit: int) -> _Reason:
    return _Reason(
        f"not fully examined: scan stopped at the {limit}-entry limit",
        f"未完整检查：扫描达到 {limit} 个目录项的上限后停止",
    )


# -- bounded directory listing ------------------------------------------------------------------------

_Kind = Literal["dir", "file", "other", "broken"]


@dataclass(frozen=True, slots=True)
class _Entry:
    name: str
    path: str
    kind: _Kind
    size: int
    mtime: float
    symlink: bool
    key: tuple[int, int] | None  # (st_dev, st_ino) of the target, for loop and alias detection


@dataclass
class _Listing:
    path: str
    entries: dict[str, _Entry] = field(default_factory=dict)
    error: _Reason | None = None
    truncated: bool = False

    def files(self) -> list[_Entry]:
        return [e for e in self.entries.values() if e.kind == "file"]

    def dirs(self) -> list[_Entry]:
        return [e for e in self.entries.values() if e.kind == "dir"]

    def file(self, name: str) -> _Entry | None:
        e = self.entries.get(name)
        return e if e is not None and e.kind == "file" else None

    def dir(self, name: str) -> _Entry | None:
        e = self.entries.get(name)
        return e if e is not None and e.kind == "dir" else None


def _entry(de: os.DirEntry[str]) -> _Entry:
    try:
        symlink = de.is_symlink()
    except OSError:
        symlink = False
    try:
        st = de.stat()  # follows symlinks
    except OSError:
        return _Entry(de.name, de.path, "broken", 0, 0.0, symlink, None)
    if stat.S_ISDIR(st.st_mode):
        kind: _Kind = "dir"
    elif stat.S_ISREG(st.st_mode):
        kind = "file"
    else:
        kind = "other"
    return _Entry(
        de.name, de.path, kind, st.st_size if kind == "file" else 0, st.st_mtime, symlink, (st.st_dev, st.st_ino)
    )


class _Scanner:
    """os.scandir with one shared entry budget and a cache, so no directory is read twice."""

    def __init__(self, max_entries: int) -> None:
        self.limit = max_entries
        self.left = max_entries
        self.verify_left = _MAX_VERIFIED_FILES
        self._cache: dict[str, _Listing] = {}

    def list(self, path: str) -> _Listing:
        cached = self._cache.get(path)
        if cached is not None:
            return cached
        listing = _Listing(path)
        if self.left <= 0:
            listing.truncated = True
        else:
            try:
                with os.scandir(path) as it:
                    for de in it:
                        if self.left <= 0:
                            listing.truncated = True
                            break
                        self.left -= 1
                        listing.entries[de.name] = _entry(de)
            except OSError as err:
                listing.error = _os_reason(os.path.basename(path) or path, err)
        self._cache[path] = listing
        return listing


# -- small bounded reads ------------------------------------------------------------------------------


def _read_bytes(path: str, limit: int) -> bytes | OSError:
    try:
        with open(path, "rb") as fh:
            return fh.read(limit)
    except OSError as err:
        return err


def _read_json(entry: _Entry) -> tuple[object, _Reason | None]:
    if entry.size > _MAX_JSON_BYTES:
        return None, _Reason(f"{entry.name} is too large to check", f"{entry.name} 过大，无法检查")
    data = _read_bytes(entry.path, _MAX_JSON_BYTES + 1)
    if isinstance(data, OSError):
        return None, _os_reason(entry.name, data)
    try:
        return json.loads(data), None
    except (ValueError, RecursionError):
        return None, _Reason(f"{entry.name} is not valid JSON", f"{entry.name} 不是有效的 JSON")


def _read_pointer(entry: _Entry) -> str | None:
    """A small text pointer file (`latest`, the Megatron tracker); None when unreadable or odd."""
    data = _read_bytes(entry.path, _MAX_POINTER_BYTES + 1)
    if isinstance(data, OSError) or len(data) > _MAX_POINTER_BYTES:
        return None
    try:
        text = data.decode("utf-8").strip()
    except UnicodeDecodeError:
        return None
    return text or None


def _truncated(scanner: _Scanner, e: _Entry) -> _Reason | None:
    """Cheap structural check of a weights file; None when it looks whole (or cannot be told)."""
    name = e.name.lower()
    if not name.endswith((".safetensors", *_ZIP_SUFFIXES)) or scanner.verify_left <= 0:
        return None
    scanner.verify_left -= 1
    bad = _Reason(f"{e.name} is truncated", f"{e.name} 文件不完整（被截断）")
    try:
        with open(e.path, "rb") as fh:
            if name.endswith(".safetensors"):
                head = fh.read(8)
                if len(head) < 8:
                    return bad
                (n,) = struct.unpack("<Q", head)
                if n > _MAX_SAFETENSORS_HEADER:
                    return None
                if 8 + n > e.size:
                    return bad
                try:
                    header = json.loads(fh.read(n))
                except (ValueError, RecursionError):
                    return bad
                if not isinstance(header, dict):
                    return bad
                end = 0
                for k, v in header.items():
                    if k == "__metadata__" or not isinstance(v, dict):
                        continue
                    offsets = v.get("data_offsets")
                    if isinstance(offsets, list) and len(offsets) == 2 and isinstance(offsets[1], int):
                        end = max(end, offsets[1])
                return bad if 8 + n + end > e.size else None
            if fh.read(4) != b"PK\x03\x04":
                return None  # legacy (pre-zip) torch.save pickle: no structure to check
            # The end-of-central-directory record (22 bytes + its comment) closes every whole zip.
            n = min(e.size, 1024 + 22)
            fh.seek(e.size - n)
            tail = fh.read(n)
            at = tail.rfind(b"PK\x05\x06")
            if at < 0 or at + 22 > len(tail):
                return bad
            (comment,) = struct.unpack("<H", tail[at + 20 : at + 22])
            return None if at + 22 + comment == len(tail) else bad
    except OSError as err:
        return _os_reason(e.name, err)


# -- checks shared by the formats --------------------------------------------------------------------


@dataclass
class _Acc:
    """What a candidate's examination saw: total bytes and newest mtime."""

    size: int = 0
    mtime: float = 0.0

    def add(self, listing: _Listing) -> None:
        for e in listing.entries.values():
            if e.kind == "file":
                self.size += e.size
            self.mtime = max(self.mtime, e.mtime)


def _listing_problem(listing: _Listing, limit: int) -> _Reason | None:
    if listing.error is not None:
        return listing.error
    if listing.truncated:
        return _budget_reason(limit)
    return None


def _files_problem(scanner: _Scanner, listing: _Listing, where: str = "") -> _Reason | None:
    """In-progress markers, empty weights, truncated weights among a listing's files."""
    prefix = f"{where}/" if where else ""
    files = sorted(listing.files(), key=lambda e: e.name)
    for e in files:
        if e.name.lower().endswith(_PROGRESS_SUFFIXES):
            return _Reason(
                f"{prefix}{e.name} marks a save in progress",
                f"{prefix}{e.name} 表明保存仍在进行中",
            )
    for e in files:
        if e.size == 0 and e.name.lower().endswith(_WEIGHT_SUFFIXES):
            return _Reason(f"{prefix}{e.name} is empty (0 bytes)", f"{prefix}{e.name} 为空文件（0 字节）")
    for e in files:
        r = _truncated(scanner, e)
        if r is not None:
            return _Reason(prefix + r.en, prefix + r.zh)
    return None


def _gap_free(values: Iterable[int]) -> bool:
    s = set(values)
    return bool(s) and s == set(range(max(s) + 1))


def _full_grid(tuples: Sequence[tuple[int, ...]]) -> bool:
    """Every rank combination 0..n-1 per dimension is present (no missing shard)."""
    if not tuples or len({len(t) for t in tuples}) != 1:
        return False
    size = 1
    for dim in range(len(tuples[0])):
        col = [t[dim] for t in tuples]
        if not _gap_free(col):
            return False
        size *= max(col) + 1
    return len(set(tuples)) == size


# -- the formats -----------------------------------------------------------------------------------


class _Walk:
    def __init__(self, root: str, max_depth: int, max_entries: int) -> None:
        self.root = root
        self.max_depth = max_depth
        self.scanner = _Scanner(max_entries)
        self.visited: set[tuple[int, int]] = set()
        self.candidates: list[_Candidate] = []
        self.results: list[Checkpoint] = []

    # the search ------------------------------------------------------------------------------------

    def run(self) -> list[Checkpoint]:
        try:
            st = os.stat(self.root)
        except (FileNotFoundError, NotADirectoryError):
            return []
        except OSError as err:
            return [self._unknown(self.root, 0.0, _os_reason(self.root, err))]
        if not stat.S_ISDIR(st.st_mode):
            return []
        self.visited.add((st.st_dev, st.st_ino))
        listing = self.scanner.list(self.root)
        if listing.error is not None:
            return [self._unknown(self.root, st.st_mtime, listing.error)]
        name = os.path.basename(os.path.normpath(self.root))
        root_entry = _Entry(name, self.root, "dir", 0, st.st_mtime, False, (st.st_dev, st.st_ino))
        fmt = _content_format(listing, name, None)
        if fmt is not None:
            self.candidates.append(_Candidate(root_entry, _step_from_name(name), None))
        self._search(listing, _Context.of(listing, fmt), 0, _owned(listing, fmt))
        self._evaluate_all()
        return sorted(self.results, key=_sort_key)

    def _search(self, listing: _Listing, ctx: _Context, depth: int, owned: frozenset[str] = frozenset()) -> None:
        """Collect candidates among `listing`'s subdirectories (depth+1), descending once more at most.

        `owned` names subdirectories that belong to `listing` itself as a checkpoint (a Trainer
        checkpoint's DeepSpeed tag or FSDP shards): they are part of it, not candidates of their own.
        """
        if listing.truncated:
            self.results.append(self._unknown(listing.path, 0.0, _budget_reason(self.scanner.limit)))
        if depth >= self.max_depth:
            return
        # Real directories before symlinks, so an alias (checkpoint-best -> checkpoint-900) never
        # hides the real path.
        dirs = sorted((e for e in listing.dirs() if e.name not in owned), key=lambda e: (e.symlink, e.name))
        deferred: list[_Entry] = []
        found: list[_Candidate] = []
        for e in dirs:
            if e.key is None or e.key in self.visited:
                continue
            step = _step_from_name(e.name)
            named = e.name == ctx.ds_tag or (e.name == "release" and ctx.tracker_release)
            if step is not None or named:
                self.visited.add(e.key)
                found.append(_Candidate(e, step, ctx))
            else:
                deferred.append(e)
        for e in deferred:
            if e.key is None or e.key in self.visited:
                continue
            self.visited.add(e.key)
            sub = self.scanner.list(e.path)
            if sub.error is not None:
                self.results.append(self._unknown(e.path, e.mtime, sub.error))
                continue
            fmt = _content_format(sub, e.name, ctx)
            if fmt is not None:
                found.append(_Candidate(e, None, ctx))
            # A checkpoint may also hold others (a Trainer output_dir with its final
            # trainer_state.json next to checkpoint-N/), so look inside either way.
            self._search(sub, _Context.of(sub, fmt), depth + 1, _owned(sub, fmt))
        self.candidates.extend(found)
        self._pointer_targets(listing, ctx, found)

    def _pointer_targets(self, listing: _Listing, ctx: _Context, found: list[_Candidate]) -> None:
        """A tracker or `latest` naming a checkpoint that is not there is itself worth listing."""
        names = {c.entry.name for c in found}
        if ctx.ds_tag is not None and ctx.ds_tag not in names and ctx.ds_entry is not None:
            target = listing.entries.get(ctx.ds_tag)
            what = "is not a directory" if target is not None else "is missing"
            what_zh = "不是目录" if target is not None else "不存在"
            self.results.append(
                Checkpoint(
                    path=os.path.join(listing.path, ctx.ds_tag),
                    step=_step_from_name(ctx.ds_tag),
                    format="deepspeed",
                    complete=False,
                    reason=f"tag {ctx.ds_tag} named in `latest` {what}",
                    reason_zh=f"`latest` 指向的 {ctx.ds_tag} {what_zh}",
                    mtime=ctx.ds_entry.mtime,
                    size_bytes=0,
                )
            )
        n = ctx.tracker_step
        if n is not None and ctx.tracker_entry is not None and all(c.step != n for c in found):
            verl = any(c.entry.name.startswith("global_step_") for c in found)
            name = f"global_step_{n}" if verl else f"iter_{n:07d}"
            self.results.append(
                Checkpoint(
                    path=os.path.join(listing.path, name),
                    step=n,
                    format="step_dir" if verl else "megatron",
                    complete=False,
                    reason=f"{_TRACKER} names iteration {n} but {name} is missing",
                    reason_zh=f"{_TRACKER} 指向第 {n} 步，但 {name} 不存在",
                    mtime=ctx.tracker_entry.mtime,
                    size_bytes=0,
                )
            )

    def _unknown(self, path: str, mtime: float, reason: _Reason) -> Checkpoint:
        return Checkpoint(path, None, "unknown", False, reason.en, mtime, 0, reason.zh)

    # the examination -------------------------------------------------------------------------------

    def _evaluate_all(self) -> None:
        # Newest first: when the entry budget runs out, what is left unexamined is the oldest.
        order = sorted(self.candidates, key=lambda c: (c.step is None, -(c.step or 0), c.entry.name))
        for c in order:
            self.results.append(self._evaluate(c))

    def _evaluate(self, c: _Candidate) -> Checkpoint:
        acc = _Acc(mtime=c.entry.mtime)
        listing = self.scanner.list(c.entry.path)
        ctx = c.ctx
        fmt = _content_format(listing, c.entry.name, ctx) or _name_format(c.entry.name, ctx)
        step = c.step
        reason = _listing_problem(listing, self.scanner.limit)
        if reason is None:
            acc.add(listing)
            if c.entry.name.lower().endswith(_PROGRESS_SUFFIXES):
                reason = _Reason("directory name marks a save in progress", "目录名表明保存仍在进行中")
            elif fmt == "hf_trainer":
                reason, step = self._hf(listing, acc, step)
            elif fmt == "deepspeed":
                reason = self._deepspeed(listing)
            elif fmt == "megatron":
                reason = self._megatron(listing, acc)
            elif fmt == "dcp":
                reason = self._dcp(listing)
            else:
                reason = self._step_dir(listing, acc)
        if reason is None and ctx is not None and step is not None:
            reason = ctx.newer_than_pointer(step)
        return Checkpoint(
            path=c.entry.path,
            step=step,
            format=fmt,
            complete=reason is None,
            reason=None if reason is None else reason.en,
            reason_zh=None if reason is None else reason.zh,
            mtime=acc.mtime,
            size_bytes=acc.size,
        )

    def _sub(self, e: _Entry, acc: _Acc) -> tuple[_Listing, _Reason | None]:
        """List a subdirectory that is part of a candidate; the reason when it cannot be used."""
        sub = self.scanner.list(e.path)
        problem = _listing_problem(sub, self.scanner.limit)
        if problem is None:
            acc.add(sub)
            return sub, None
        return sub, _Reason(f"{e.name}/: {problem.en}", f"{e.name}/：{problem.zh}")

    def _hf(self, listing: _Listing, acc: _Acc, step: int | None) -> tuple[_Reason | None, int | None]:
        state = listing.file(_TRAINER_STATE)
        if state is None:
            return _missing(_TRAINER_STATE), step
        step_or_reason = _trainer_step(state)
        if isinstance(step_or_reason, _Reason):
            return step_or_reason, step
        step = step_or_reason
        problem = _files_problem(self.scanner, listing)
        if problem is not None:
            return problem, step
        files = {e.name for e in listing.files()}
        for index in sorted((e for e in listing.files() if e.name.endswith(".index.json")), key=lambda e: e.name):
            problem = _index_problem(listing, index)
            if problem is not None:
                return problem, step
        weights = any(
            n.endswith(".safetensors")
            or n.endswith(".index.json")
            or (n.endswith(".bin") and n not in _HF_TRAINING_FILES)
            or n.startswith("pytorch_model")
            for n in files
        )
        # Model or optimizer state kept in subdirectories: DeepSpeed tags, FSDP sharded (DCP) dirs.
        latest = listing.file(_DS_LATEST)
        if latest is not None:
            tag = _read_pointer(latest)
            if tag is None or not _safe_name(tag):
                return _Reason("`latest` is unreadable or invalid", "`latest` 无法读取或内容无效"), step
            named = listing.dir(tag)
            if named is None:
                return _Reason(
                    f"DeepSpeed tag {tag} named in `latest` is missing", f"`latest` 指向的 DeepSpeed 标签 {tag} 不存在"
                ), step
            ds_tags = [named]
        else:
            ds_tags = [e for e in listing.dirs() if _DS_TAG_NAME.match(e.name)]
        for entry in sorted(ds_tags, key=lambda e: e.name):
            sub, problem = self._sub(entry, acc)
            if problem is None:
                problem = self._deepspeed(sub)
                if problem is not None:
                    problem = _Reason(f"{entry.name}/: {problem.en}", f"{entry.name}/：{problem.zh}")
            if problem is not None:
                return problem, step
            weights = True
        for e in sorted(listing.dirs(), key=lambda e: e.name):
            if e.name.startswith("pytorch_model_fsdp") or _FSDP_OPTIM_DIR.match(e.name):
                sub, problem = self._sub(e, acc)
                if problem is None:
                    problem = self._dcp(sub)
                    if problem is not None:
                        problem = _Reason(f"{e.name}/: {problem.en}", f"{e.name}/：{problem.zh}")
                if problem is not None:
                    return problem, step
                if e.name.startswith("pytorch_model_fsdp"):
                    weights = True
        if not weights:
            return _Reason("no model weights found", "未找到模型权重文件"), step
        return None, step

    def _deepspeed(self, listing: _Listing) -> _Reason | None:
        problem = _files_problem(self.scanner, listing)
        if problem is not None:
            return problem
        names = [e.name for e in listing.files()]
        model = [n for n in names if n.endswith("model_states.pt")]
        if not model:
            return _Reason("no *model_states.pt file in the tag", "标签目录中没有 *model_states.pt 文件")
        mp_model = [int(m.group(1)) for n in names if (m := _DS_MP_MODEL.match(n))]
        if mp_model and not _gap_free(mp_model):
            return _Reason("mp_rank_*_model_states.pt ranks have a gap", "mp_rank_*_model_states.pt 的 rank 不连续")
        optim = [(int(m.group(2)), int(m.group(1))) for n in names if (m := _DS_ZERO_OPTIM.match(n))]
        zero_model = [(int(m.group(2)), int(m.group(1))) for n in names if (m := _DS_ZERO_MODEL.match(n))]
        if zero_model and not optim:
            return _Reason(
                "ZeRO optimizer states (*_optim_states.pt) missing", "缺少 ZeRO 优化器状态（*_optim_states.pt）"
            )
        for label, grid in (("optim_states", optim), ("zero model_states", zero_model)):
            if grid and not _full_grid(grid):
                return _Reason(f"ZeRO {label} files are missing a rank", f"ZeRO {label} 文件缺少某个 rank")
        if zero_model and set(zero_model) != set(optim):
            return _Reason("ZeRO model and optimizer state ranks differ", "ZeRO 模型状态与优化器状态的 rank 不一致")
        if mp_model and optim and {mp for mp, _ in optim} != set(mp_model):
            return _Reason(
                "model and optimizer states cover different mp ranks", "模型状态与优化器状态覆盖的 mp rank 不一致"
            )
        return None

    def _megatron(self, listing: _Listing, acc: _Acc) -> _Reason | None:
        problem = _files_problem(self.scanner, listing)
        if problem is not None:
            return problem
        ranks: list[tuple[tuple[int, ...], _Entry]] = []
        for e in listing.dirs():
            m = _MEGATRON_RANK_DIR.match(e.name)
            if m:
                ranks.append((tuple(int(g) for g in m.groups() if g is not None), e))
        if ranks:
            if not _full_grid([r for r, _ in ranks]):
                return _Reason("mp_rank_* shard directories are missing a rank", "mp_rank_* 分片目录缺少某个 rank")
            with_optim = 0
            for _, e in sorted(ranks, key=lambda r: r[0]):
                sub, problem = self._sub(e, acc)
                if problem is None:
                    problem = _files_problem(self.scanner, sub, e.name)
                if problem is None and sub.file("model_optim_rng.pt") is None:
                    problem = _missing(f"{e.name}/model_optim_rng.pt")
                if problem is not None:
                    return problem
                with_optim += sub.file("distrib_optim.pt") is not None
            if with_optim not in (0, len(ranks)):
                return _Reason(
                    "distrib_optim.pt missing in some mp_rank_* directories", "部分 mp_rank_* 目录缺少 distrib_optim.pt"
                )
            return None
        config = listing.file(_MEGATRON_CONFIG)
        if config is None:
            has_dcp = listing.file(_DCP_METADATA) is not None or any(
                e.name.endswith(".distcp") for e in listing.files()
            )
            if has_dcp:
                return _Reason(
                    f"{_MEGATRON_CONFIG} missing (written last by rank 0)",
                    f"缺少 {_MEGATRON_CONFIG}（由 rank 0 最后写入）",
                )
            return _Reason(
                "no mp_rank_* shard directories or metadata.json", "没有 mp_rank_* 分片目录，也没有 metadata.json"
            )
        data, problem = _read_json(config)
        if problem is not None:
            return problem
        if not isinstance(data, dict):
            return _Reason(f"{_MEGATRON_CONFIG} is not a JSON object", f"{_MEGATRON_CONFIG} 不是 JSON 对象")
        backend = data.get("sharded_backend")
        if (
            backend == "torch_dist"
            or listing.file(_DCP_METADATA) is not None
            or listing.file(_DCP_METADATA_TMP) is not None
        ):
            return self._dcp(listing, check_files=False)
        return None

    def _dcp(self, listing: _Listing, *, check_files: bool = True) -> _Reason | None:
        if listing.file(_DCP_METADATA_TMP) is not None:
            return _Reason(
                ".metadata.tmp present: the metadata write did not finish", "存在 .metadata.tmp：元数据尚未写完"
            )
        meta = listing.file(_DCP_METADATA)
        if meta is None:
            return _Reason(".metadata missing (the coordinator writes it last)", "缺少 .metadata（由协调进程最后写入）")
        if meta.size == 0:
            return _Reason(".metadata is empty (0 bytes)", ".metadata 为空文件（0 字节）")
        problem = _files_problem(self.scanner, listing) if check_files else None
        if problem is not None:
            return problem
        data_files = [e for e in listing.files() if e.name.endswith(".distcp")]
        if meta.size <= _MAX_DCP_METADATA_BYTES:
            raw = _read_bytes(meta.path, _MAX_DCP_METADATA_BYTES)
            if isinstance(raw, OSError):
                return _os_reason(_DCP_METADATA, raw)
            for ref in sorted({m.decode("ascii") for m in _DCP_FILE_REF.findall(raw)}):
                e = listing.file(ref)
                if e is None:
                    return _Reason(f"{ref} named in .metadata is missing", f".metadata 中记录的 {ref} 不存在")
                if e.size == 0:
                    return _Reason(f"{ref} named in .metadata is empty", f".metadata 中记录的 {ref} 为空文件")
        if not data_files:
            return _Reason("no .distcp data files", "没有 .distcp 数据文件")
        return None

    def _step_dir(self, listing: _Listing, acc: _Acc) -> _Reason | None:
        if not listing.entries:
            return _Reason("empty directory", "空目录")
        problem = _files_problem(self.scanner, listing)
        if problem is not None:
            return problem
        nonempty = any(e.size > 0 for e in listing.files())
        for e in sorted(listing.dirs(), key=lambda e: e.name):
            sub, problem = self._sub(e, acc)
            if problem is None:
                problem = _files_problem(self.scanner, sub, e.name)
            if problem is None and _looks_dcp(sub):
                problem = self._dcp(sub)
                if problem is not None:
                    problem = _Reason(f"{e.name}/: {problem.en}", f"{e.name}/：{problem.zh}")
            if problem is not None:
                return problem
            nonempty = nonempty or any(f.size > 0 for f in sub.files())
        if not nonempty:
            return _Reason("no non-empty file", "没有非空文件")
        return None


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
    data, problem = _read_json(entry)
    if problem is not None:
        return problem
    if not isinstance(data, dict):
        return _Reason(f"{_TRAINER_STATE} is not a JSON object", f"{_TRAINER_STATE} 不是 JSON 对象")
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
