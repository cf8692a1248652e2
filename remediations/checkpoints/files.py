"""What a checkpoint listing reads: the limits, the file and directory names of each format,
`Checkpoint` and its order, and the bounded, defensive reads of a directory's entries and files (each problem a
`_Reason`).
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

FORMATS: Final = ("hf_trainer", "deepspeed", "megatron", "dcp", "step_dir", "unknown")


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


def _read_json_object(entry: _Entry) -> tuple[dict[str, object], _Reason | None]:
    """A JSON file that must hold an object: the object, or why it cannot be had."""
    data, problem = _read_json(entry)
    if problem is not None:
        return {}, problem
    if not isinstance(data, dict):
        return {}, _Reason(f"{entry.name} is not a JSON object", f"{entry.name} 不是 JSON 对象")
    return data, None


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
