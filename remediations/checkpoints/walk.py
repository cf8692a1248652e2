"""`_Walk`: a checkpoint tree walked once (bounded by depth and entries), each candidate directory
judged complete or not, with the reason.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable

from trainmedic.remediations.checkpoints.files import (
    _DCP_FILE_REF,
    _DCP_METADATA,
    _DCP_METADATA_TMP,
    _DS_LATEST,
    _DS_MP_MODEL,
    _DS_TAG_NAME,
    _DS_ZERO_MODEL,
    _DS_ZERO_OPTIM,
    _FSDP_OPTIM_DIR,
    _HF_TRAINING_FILES,
    _MAX_DCP_METADATA_BYTES,
    _MEGATRON_CONFIG,
    _MEGATRON_RANK_DIR,
    _PROGRESS_SUFFIXES,
    _TRACKER,
    _TRAINER_STATE,
    Checkpoint,
    _Acc,
    _budget_reason,
    _Entry,
    _files_problem,
    _full_grid,
    _gap_free,
    _Listing,
    _listing_problem,
    _missing,
    _os_reason,
    _read_bytes,
    _read_json_object,
    _read_pointer,
    _Reason,
    _Scanner,
    _sort_key,
)
from trainmedic.remediations.checkpoints.formats import (
    _Candidate,
    _content_format,
    _Context,
    _index_problem,
    _looks_dcp,
    _name_format,
    _owned,
    _safe_name,
    _step_from_name,
    _trainer_step,
)

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

    def _checked_sub(self, e: _Entry, acc: _Acc, check: Callable[[_Listing], _Reason | None]) -> _Reason | None:
        """List a subdirectory and check it as `check` does; the reason, under its name, when it fails."""
        sub, problem = self._sub(e, acc)
        if problem is None:
            problem = check(sub)
            if problem is not None:
                problem = _Reason(f"{e.name}/: {problem.en}", f"{e.name}/：{problem.zh}")
        return problem

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
            problem = self._checked_sub(entry, acc, self._deepspeed)
            if problem is not None:
                return problem, step
            weights = True
        for e in sorted(listing.dirs(), key=lambda e: e.name):
            if e.name.startswith("pytorch_model_fsdp") or _FSDP_OPTIM_DIR.match(e.name):
                problem = self._checked_sub(e, acc, self._dcp)
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
        data, problem = _read_json_object(config)
        if problem is not None:
            return problem
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
