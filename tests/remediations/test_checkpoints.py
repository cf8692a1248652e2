"""Checkpoint discovery on real directory trees, one builder per framework's on-disk layout.

Each builder writes what the framework writes (file names and order from the sources named in
remediations/checkpoints.py); the weights are small but structurally real: zip archives like
`torch.save`, safetensors with a valid header, a pickled DCP `.metadata` naming its data files.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import shutil
import string
import struct
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from paths import ROOT

from trainmedic.models import I18nText
from trainmedic.remediations.checkpoints import (
    DESCRIBE_LIMIT,
    FORMATS,
    Checkpoint,
    describe,
    latest_complete,
    list_checkpoints,
)

# -- builders -----------------------------------------------------------------------------------------


def torch_zip(payload: bytes = b"\x80\x04K\x01.") -> bytes:
    """A file shaped like torch.save output (a zip archive with a pickle inside)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("archive/data.pkl", payload)
        zf.writestr("archive/version", b"3\n")
    return buf.getvalue()


def safetensors(nbytes: int = 16) -> bytes:
    header = json.dumps({"w": {"dtype": "F32", "shape": [nbytes // 4], "data_offsets": [0, nbytes]}}).encode()
    header += b" " * (-len(header) % 8)
    return struct.pack("<Q", len(header)) + header + b"\x00" * nbytes


def write(path: Path, data: bytes | str = b"x" * 32) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    return path


def ds_tag(tag: Path, *, mp: int = 1, dp: int = 2, zero3: bool = False, bf16: bool = False) -> Path:
    """DeepSpeed engine.save_checkpoint: model states per mp rank, ZeRO optimizer states per dp rank."""
    for m in range(mp):
        if zero3:
            for d in range(dp):
                write(tag / f"zero_pp_rank_{d}_mp_rank_{m:02d}_model_states.pt", torch_zip())
        else:
            write(tag / f"mp_rank_{m:02d}_model_states.pt", torch_zip())
        for d in range(dp):
            prefix = "bf16_" if bf16 else ""
            write(tag / f"{prefix}zero_pp_rank_{d}_mp_rank_{m:02d}_optim_states.pt", torch_zip())
    return tag


def ds_root(root: Path, tags: list[int], latest: str | None) -> Path:
    for n in tags:
        ds_tag(root / f"global_step{n}")
    write(root / "zero_to_fp32.py", "# copied by DeepSpeed\n")
    if latest is not None:
        write(root / "latest", latest)
    return root


def hf_checkpoint(d: Path, step: int, weights: str = "safetensors") -> Path:
    """Trainer._save_checkpoint: model, optimizer, scheduler, rng, then trainer_state.json last."""
    if weights == "safetensors":
        write(d / "model.safetensors", safetensors())
    elif weights == "bin":
        write(d / "pytorch_model.bin", torch_zip())
    elif weights == "sharded":
        shards = [f"model-0000{i}-of-00002.safetensors" for i in (1, 2)]
        for s in shards:
            write(d / s, safetensors())
        index = {"metadata": {"total_size": 32}, "weight_map": {"a.weight": shards[0], "b.weight": shards[1]}}
        write(d / "model.safetensors.index.json", json.dumps(index))
    elif weights == "sharded_bin":
        shards = [f"pytorch_model-0000{i}-of-00002.bin" for i in (1, 2)]
        for s in shards:
            write(d / s, torch_zip())
        write(d / "pytorch_model.bin.index.json", json.dumps({"weight_map": {"a": shards[0], "b": shards[1]}}))
    elif weights == "adapter":
        write(d / "adapter_model.safetensors", safetensors())
        write(d / "adapter_config.json", "{}")
    elif weights == "deepspeed":
        ds_tag(d / f"global_step{step}")
        write(d / "latest", f"global_step{step}")
    elif weights == "fsdp":
        dcp(d / "pytorch_model_fsdp_0")
        dcp(d / "optimizer_0")
    else:
        raise AssertionError(weights)
    if weights not in ("deepspeed", "fsdp"):
        write(d / "optimizer.pt", torch_zip())
    write(d / "scheduler.pt", torch_zip())
    write(d / "rng_state.pth", torch_zip())
    write(d / "training_args.bin", torch_zip())
    state = {"best_global_step": None, "epoch": 1.0, "global_step": step, "log_history": [{"loss": 1.0, "step": step}]}
    write(d / "trainer_state.json", json.dumps(state, indent=2, sort_keys=True))
    return d


def dcp(d: Path, ranks: int = 2, *, metadata: bool = True) -> Path:
    """torch.distributed.checkpoint FileSystemWriter: __<rank>_0.distcp per rank, .metadata last."""
    names = [f"__{r}_0.distcp" for r in range(ranks)]
    for n in names:
        write(d / n, b"\x80" * 64)
    if metadata:
        # Stand-in for the pickled torch Metadata: what matters here is the storage file names in it.
        storage = {f"param{r}": {"relative_path": n, "offset": 0, "length": 64} for r, n in enumerate(names)}
        write(d / ".metadata", pickle.dumps({"storage_data": storage}))
    return d


def megatron_iter(d: Path, *, tp: int = 1, pp: int = 1, distrib_optim: bool = False) -> Path:
    """Megatron-LM legacy format: iter_%07d/mp_rank_TT[_PPP]/model_optim_rng.pt."""
    for t in range(tp):
        for p in range(pp):
            rank = d / (f"mp_rank_{t:02d}" if pp == 1 else f"mp_rank_{t:02d}_{p:03d}")
            write(rank / "model_optim_rng.pt", torch_zip())
            if distrib_optim:
                write(rank / "distrib_optim.pt", torch_zip())
    return d


def megatron_dist(d: Path) -> Path:
    """Megatron-LM torch_dist format: DCP files and common.pt, then metadata.json from rank 0."""
    dcp(d)
    write(d / "common.pt", torch_zip())
    write(d / "metadata.json", json.dumps({"sharded_backend": "torch_dist", "sharded_backend_version": 1}))
    return d


def by_path(found: list[Checkpoint], root: Path) -> dict[str, Checkpoint]:
    return {os.path.relpath(c.path, root): c for c in found}


def only(found: list[Checkpoint]) -> Checkpoint:
    assert len(found) == 1, found
    return found[0]


# -- Hugging Face Trainer --------------------------------------------------------------------------


@pytest.mark.parametrize("weights", ["safetensors", "bin", "sharded", "sharded_bin", "adapter", "deepspeed", "fsdp"])
def test_hf_trainer_complete(tmp_path: Path, weights: str) -> None:
    hf_checkpoint(tmp_path / "checkpoint-500", 500, weights)
    c = only(list_checkpoints(tmp_path))
    assert (c.format, c.step, c.complete, c.reason) == ("hf_trainer", 500, True, None)
    assert c.size_bytes > 0
    assert latest_complete(tmp_path) == c


Step = Callable[[Path], object]  # builds or breaks something in a checkpoint directory


def _rm(name: str) -> Step:
    return lambda d: (d / name).unlink()


def _put(name: str, data: bytes | str) -> Step:
    return lambda d: write(d / name, data)


def _cut(name: str, keep: int) -> Step:
    def cut(d: Path) -> None:
        data = (d / name).read_bytes()
        (d / name).write_bytes(data[:keep])

    return cut


HF_BROKEN: list[tuple[str, str, Step, str]] = [
    ("no-state", "safetensors", _rm("trainer_state.json"), "trainer_state.json missing"),
    (
        "state-cut",
        "safetensors",
        _put("trainer_state.json", '{"global_step": 5'),
        "trainer_state.json is not valid JSON",
    ),
    ("state-list", "safetensors", _put("trainer_state.json", "[]"), "trainer_state.json is not a JSON object"),
    ("state-no-step", "safetensors", _put("trainer_state.json", "{}"), "trainer_state.json has no integer global_step"),
    ("state-str-step", "safetensors", _put("trainer_state.json", '{"global_step": "5"}'), "no integer global_step"),
    ("state-bool-step", "safetensors", _put("trainer_state.json", '{"global_step": true}'), "no integer global_step"),
    ("state-binary", "safetensors", _put("trainer_state.json", b"\xff\xfe\x00garbage"), "is not valid JSON"),
    (
        "missing-shard",
        "sharded",
        _rm("model-00002-of-00002.safetensors"),
        "shard model-00002-of-00002.safetensors listed in model.safetensors.index.json is missing",
    ),
    ("empty-shard", "sharded", _put("model-00001-of-00002.safetensors", b""), "is empty (0 bytes)"),
    ("index-cut", "sharded", _put("model.safetensors.index.json", '{"weight_map": {'), "index.json is not valid JSON"),
    ("index-no-map", "sharded", _put("model.safetensors.index.json", '{"metadata": {}}'), "has no valid weight_map"),
    (
        "index-escape",
        "sharded",
        _put("model.safetensors.index.json", '{"weight_map": {"a": "../model.safetensors"}}'),
        "names a shard outside the checkpoint",
    ),
    ("empty-weights", "safetensors", _put("model.safetensors", b""), "model.safetensors is empty (0 bytes)"),
    ("cut-safetensors", "safetensors", _cut("model.safetensors", 40), "model.safetensors is truncated"),
    ("cut-header", "safetensors", _cut("model.safetensors", 5), "model.safetensors is truncated"),
    ("cut-zip", "bin", _cut("pytorch_model.bin", 60), "pytorch_model.bin is truncated"),
    ("tmp-marker", "safetensors", _put("optimizer.pt.tmp", b"x"), "optimizer.pt.tmp marks a save in progress"),
    ("no-weights", "safetensors", _rm("model.safetensors"), "no model weights found"),
    ("ds-latest-missing", "deepspeed", _put("latest", "global_step9"), "DeepSpeed tag global_step9 named in `latest`"),
    (
        "ds-rank-missing",
        "deepspeed",
        _rm("global_step7/zero_pp_rank_0_mp_rank_00_optim_states.pt"),
        "global_step7/: ZeRO optim_states files are missing a rank",
    ),
    ("fsdp-no-metadata", "fsdp", _rm("pytorch_model_fsdp_0/.metadata"), "pytorch_model_fsdp_0/: .metadata missing"),
    ("fsdp-optim-tmp", "fsdp", _put("optimizer_0/.metadata.tmp", b"x"), "optimizer_0/: .metadata.tmp present"),
]


@pytest.mark.parametrize(("weights", "breakage", "reason"), [h[1:] for h in HF_BROKEN], ids=[h[0] for h in HF_BROKEN])
def test_hf_trainer_incomplete(tmp_path: Path, weights: str, breakage: Step, reason: str) -> None:
    d = hf_checkpoint(tmp_path / "checkpoint-7", 7, weights)
    breakage(d)
    c = only(list_checkpoints(tmp_path))
    assert c.format == "hf_trainer"
    assert not c.complete
    assert c.reason is not None and reason in c.reason
    assert c.reason_zh
    assert latest_complete(tmp_path) is None


def test_crash_mid_save_falls_back_to_the_previous_checkpoint(tmp_path: Path) -> None:
    """The job died while the Trainer was writing checkpoint-1500: only optimizer.pt made it."""
    hf_checkpoint(tmp_path / "checkpoint-1000", 1000)
    write(tmp_path / "checkpoint-1500" / "optimizer.pt", torch_zip())
    found = by_path(list_checkpoints(tmp_path), tmp_path)
    assert found["checkpoint-1500"].complete is False
    assert found["checkpoint-1500"].reason == "trainer_state.json missing"
    assert found["checkpoint-1500"].format == "hf_trainer"
    best = latest_complete(tmp_path)
    assert best is not None
    assert (best.path, best.step) == (str(tmp_path / "checkpoint-1000"), 1000)


def test_hf_step_comes_from_trainer_state(tmp_path: Path) -> None:
    hf_checkpoint(tmp_path / "checkpoint-10", 12)
    assert only(list_checkpoints(tmp_path)).step == 12


def test_hf_huge_trainer_state_is_read_from_head_and_tail(tmp_path: Path) -> None:
    """A very long run's log_history: trainer_state.json beyond the full-parse cap is still judged."""
    d = hf_checkpoint(tmp_path / "checkpoint-3", 3)
    history = [{"loss": 0.5, "step": i, "note": "x" * 1000} for i in range(17_000)]
    state = {"epoch": 1.0, "global_step": 3, "log_history": history}
    write(d / "trainer_state.json", json.dumps(state, indent=2, sort_keys=True))
    assert (d / "trainer_state.json").stat().st_size > 16 * 1024 * 1024
    assert only(list_checkpoints(tmp_path)).complete
    _cut("trainer_state.json", 17 * 1024 * 1024)(d)
    c = only(list_checkpoints(tmp_path))
    assert not c.complete and c.reason == "trainer_state.json is not valid JSON"


def test_hf_output_dir_with_final_state_and_checkpoints(tmp_path: Path) -> None:
    """output_dir holds the final model + trainer_state.json next to its checkpoint-N folders."""
    hf_checkpoint(tmp_path / "checkpoint-100", 100, "deepspeed")
    hf_checkpoint(tmp_path / "checkpoint-200", 200, "deepspeed")
    hf_checkpoint(tmp_path, 250)
    found = by_path(list_checkpoints(tmp_path), tmp_path)
    # The DeepSpeed tags inside each Trainer checkpoint are part of it, not candidates of their own.
    assert sorted(found) == [".", "checkpoint-100", "checkpoint-200"]
    assert all(c.complete for c in found.values())
    best = latest_complete(tmp_path)
    assert best is not None and best.step == 250


@pytest.mark.parametrize("weights", ["deepspeed", "fsdp"])
def test_root_is_a_trainer_checkpoint(tmp_path: Path, weights: str) -> None:
    """The annotation may name one checkpoint-N itself: its DeepSpeed tag / FSDP shards are part of it."""
    root = hf_checkpoint(tmp_path / "checkpoint-30", 30, weights)
    c = only(list_checkpoints(root))
    assert (c.path, c.format, c.step, c.complete) == (str(root), "hf_trainer", 30, True)


# -- DeepSpeed ------------------------------------------------------------------------------------------


def test_deepspeed_latest_complete(tmp_path: Path) -> None:
    ds_root(tmp_path, [100, 200], "global_step200")
    found = list_checkpoints(tmp_path)
    assert [(c.step, c.format, c.complete) for c in found] == [(100, "deepspeed", True), (200, "deepspeed", True)]
    best = latest_complete(tmp_path)
    assert best is not None and best.path == str(tmp_path / "global_step200")


def test_deepspeed_latest_points_to_missing_tag(tmp_path: Path) -> None:
    ds_root(tmp_path, [100, 200], "global_step300")
    found = by_path(list_checkpoints(tmp_path), tmp_path)
    assert found["global_step300"].complete is False
    assert found["global_step300"].reason == "tag global_step300 named in `latest` is missing"
    assert found["global_step300"].step == 300
    best = latest_complete(tmp_path)
    assert best is not None and best.step == 200


DS_HALF_WRITTEN: list[tuple[str, Step, str]] = [
    ("empty-model", _put("mp_rank_00_model_states.pt", b""), "mp_rank_00_model_states.pt is empty (0 bytes)"),
    ("cut-optim", _cut("zero_pp_rank_1_mp_rank_00_optim_states.pt", 30), "optim_states.pt is truncated"),
    ("no-model", _rm("mp_rank_00_model_states.pt"), "no *model_states.pt file in the tag"),
    ("optim-gap", _rm("zero_pp_rank_0_mp_rank_00_optim_states.pt"), "optim_states files are missing a rank"),
    ("tmp", _put("mp_rank_00_model_states.pt.tmp", b"x"), "marks a save in progress"),
    ("mp-gap", _put("mp_rank_02_model_states.pt", torch_zip()), "mp_rank_*_model_states.pt ranks have a gap"),
]


@pytest.mark.parametrize(("breakage", "reason"), [h[1:] for h in DS_HALF_WRITTEN], ids=[h[0] for h in DS_HALF_WRITTEN])
def test_deepspeed_latest_written_before_tag_complete(tmp_path: Path, breakage: Step, reason: str) -> None:
    ds_root(tmp_path, [100, 200, 300], "global_step300")
    breakage(tmp_path / "global_step300")
    found = by_path(list_checkpoints(tmp_path), tmp_path)
    assert found["global_step300"].complete is False
    assert found["global_step300"].reason is not None and reason in found["global_step300"].reason
    best = latest_complete(tmp_path)
    assert best is not None and best.step == 200


def test_deepspeed_tag_newer_than_latest_is_unfinished(tmp_path: Path) -> None:
    ds_root(tmp_path, [100, 200, 300], "global_step200")
    found = by_path(list_checkpoints(tmp_path), tmp_path)
    assert found["global_step300"].complete is False
    assert found["global_step300"].reason == "newer than the tag in `latest` (global_step200): the save did not finish"
    best = latest_complete(tmp_path)
    assert best is not None and best.step == 200


def test_deepspeed_tags_without_latest_are_listed(tmp_path: Path) -> None:
    ds_root(tmp_path, [100, 200], None)
    ds_tag(tmp_path / "global_step300", zero3=True)
    (tmp_path / "global_step300" / "zero_pp_rank_1_mp_rank_00_model_states.pt").unlink()
    found = list_checkpoints(tmp_path)
    assert [(c.step, c.complete) for c in found] == [(100, True), (200, True), (300, False)]
    best = latest_complete(tmp_path)
    assert best is not None and best.step == 200


@pytest.mark.parametrize(
    ("kwargs", "drop", "reason"),
    [
        ({"zero3": True, "dp": 4}, None, None),
        ({"bf16": True, "mp": 2}, None, None),
        ({"mp": 2, "dp": 2}, "zero_pp_rank_1_mp_rank_01_optim_states.pt", "optim_states files are missing a rank"),
        ({"zero3": True}, "zero_pp_rank_0_mp_rank_00_optim_states.pt", "missing a rank"),
        ({"zero3": True}, "zero_pp_rank_1_mp_rank_00_model_states.pt", "model and optimizer state ranks differ"),
        ({"zero3": True, "dp": 1}, "zero_pp_rank_0_mp_rank_00_optim_states.pt", "ZeRO optimizer states"),
        ({"mp": 2}, "mp_rank_01_model_states.pt", "cover different mp ranks"),
    ],
)
def test_deepspeed_rank_grid(tmp_path: Path, kwargs: dict[str, int], drop: str | None, reason: str | None) -> None:
    tag = ds_tag(tmp_path / "global_step5", **kwargs)  # type: ignore[arg-type]
    if drop is not None:
        (tag / drop).unlink()
    c = only(list_checkpoints(tmp_path))
    assert c.format == "deepspeed"
    if reason is None:
        assert c.complete, c.reason
    else:
        assert not c.complete
        assert c.reason is not None and reason in c.reason


def test_deepspeed_custom_tag_named_by_latest(tmp_path: Path) -> None:
    ds_tag(tmp_path / "best")
    write(tmp_path / "latest", "best\n")
    c = only(list_checkpoints(tmp_path))
    assert (c.format, c.step, c.complete) == ("deepspeed", None, True)


@pytest.mark.parametrize("pointer", ["../etc", "a/b", "", "\xff", "x" * 5000])
def test_deepspeed_odd_latest_is_ignored(tmp_path: Path, pointer: str) -> None:
    ds_root(tmp_path, [100], None)
    write(tmp_path / "latest", pointer.encode("utf-8", "surrogateescape") if pointer != "\xff" else b"\xff")
    found = list_checkpoints(tmp_path)
    assert [(c.step, c.complete) for c in found] == [(100, True)]


# -- Megatron-LM ----------------------------------------------------------------------------------------


def test_megatron_iter_newer_than_tracker_is_half_written(tmp_path: Path) -> None:
    for n in (1000, 2000, 3000):
        megatron_iter(tmp_path / f"iter_{n:07d}", tp=2)
    write(tmp_path / "latest_checkpointed_iteration.txt", "2000")
    found = by_path(list_checkpoints(tmp_path), tmp_path)
    assert found["iter_0003000"].complete is False
    assert found["iter_0003000"].reason == (
        "newer than latest_checkpointed_iteration.txt (2000): the save did not finish"
    )
    assert all(found[f"iter_{n:07d}"].complete for n in (1000, 2000))
    best = latest_complete(tmp_path)
    assert best is not None and (best.step, best.format) == (2000, "megatron")


def test_megatron_tracker_names_missing_iteration(tmp_path: Path) -> None:
    megatron_iter(tmp_path / "iter_0001000")
    write(tmp_path / "latest_checkpointed_iteration.txt", "2000\n")
    found = by_path(list_checkpoints(tmp_path), tmp_path)
    assert found["iter_0002000"].complete is False
    assert found["iter_0002000"].reason is not None and "iter_0002000 is missing" in found["iter_0002000"].reason
    best = latest_complete(tmp_path)
    assert best is not None and best.step == 1000


def test_megatron_release(tmp_path: Path) -> None:
    megatron_iter(tmp_path / "release", tp=2)
    write(tmp_path / "latest_checkpointed_iteration.txt", "release")
    c = only(list_checkpoints(tmp_path))
    assert (c.format, c.step, c.complete) == ("megatron", None, True)


@pytest.mark.parametrize("tracker", ["garbage", "", "-5"])
def test_megatron_unusable_tracker_judges_by_content(tmp_path: Path, tracker: str) -> None:
    megatron_iter(tmp_path / "iter_0000010")
    megatron_iter(tmp_path / "iter_0000020")
    write(tmp_path / "latest_checkpointed_iteration.txt", tracker)
    best = latest_complete(tmp_path)
    assert best is not None and best.step == 20


def _megatron_legacy(d: Path) -> None:
    megatron_iter(d, tp=2, pp=2, distrib_optim=True)


MEGATRON_CASES: list[tuple[str, Step, Step | None, str | None]] = [
    ("tp2-pp2", _megatron_legacy, None, None),
    ("tp1", megatron_iter, None, None),
    ("dist", megatron_dist, None, None),
    ("missing-pp-shard", _megatron_legacy, lambda d: shutil.rmtree(d / "mp_rank_01_001"), "missing a rank"),
    ("missing-rng-file", _megatron_legacy, _rm("mp_rank_00_001/model_optim_rng.pt"), "model_optim_rng.pt missing"),
    ("empty-rng-file", _megatron_legacy, _put("mp_rank_01_000/model_optim_rng.pt", b""), "is empty (0 bytes)"),
    ("partial-optim", _megatron_legacy, _rm("mp_rank_01_001/distrib_optim.pt"), "distrib_optim.pt missing in some"),
    ("cut-rng-file", _megatron_legacy, _cut("mp_rank_00_000/model_optim_rng.pt", 50), "is truncated"),
    ("dist-no-config", megatron_dist, _rm("metadata.json"), "metadata.json missing (written last by rank 0)"),
    ("dist-bad-config", megatron_dist, _put("metadata.json", "{"), "metadata.json is not valid JSON"),
    ("dist-config-list", megatron_dist, _put("metadata.json", "[1]"), "metadata.json is not a JSON object"),
    ("dist-lost-shard", megatron_dist, _rm("__1_0.distcp"), "__1_0.distcp named in .metadata is missing"),
    ("dist-no-metadata", megatron_dist, _rm(".metadata"), ".metadata missing"),
    ("empty-iter", lambda d: d.mkdir(), None, "no mp_rank_* shard directories or metadata.json"),
]


@pytest.mark.parametrize(
    ("build", "breakage", "reason"), [m[1:] for m in MEGATRON_CASES], ids=[m[0] for m in MEGATRON_CASES]
)
def test_megatron_iteration_dir(
    tmp_path: Path,
    build: Step,
    breakage: Step | None,
    reason: str | None,
) -> None:
    d = tmp_path / "iter_0000500"
    build(d)
    if breakage is not None:
        breakage(d)
    write(tmp_path / "latest_checkpointed_iteration.txt", "500")
    c = only(list_checkpoints(tmp_path))
    assert (c.format, c.step) == ("megatron", 500)
    if reason is None:
        assert c.complete, c.reason
    else:
        assert not c.complete
        assert c.reason is not None and reason in c.reason


# -- torch.distributed.checkpoint -----------------------------------------------------------------------


@pytest.mark.parametrize("name", ["step_100", "step-100", "100", "checkpoint_100", "checkpoint-100", "step100"])
def test_dcp_step_from_directory_name(tmp_path: Path, name: str) -> None:
    dcp(tmp_path / name, ranks=4)
    c = only(list_checkpoints(tmp_path))
    assert (c.format, c.step, c.complete) == ("dcp", 100, True)


DCP_BROKEN: list[tuple[str, Step, str]] = [
    ("no-metadata", _rm(".metadata"), ".metadata missing (the coordinator writes it last)"),
    ("metadata-tmp", _put(".metadata.tmp", b"\x80"), ".metadata.tmp present"),
    ("empty-metadata", _put(".metadata", b""), ".metadata is empty"),
    ("lost-rank-file", _rm("__2_0.distcp"), "__2_0.distcp named in .metadata is missing"),
    ("empty-rank-file", _put("__3_0.distcp", b""), "__3_0.distcp named in .metadata is empty"),
    ("partial-marker", _put("__1_0.distcp.partial", b"x"), "marks a save in progress"),
]


@pytest.mark.parametrize(("breakage", "reason"), [h[1:] for h in DCP_BROKEN], ids=[h[0] for h in DCP_BROKEN])
def test_dcp_incomplete(tmp_path: Path, breakage: Step, reason: str) -> None:
    dcp(tmp_path / "step_40", ranks=4)
    dcp(tmp_path / "step_50", ranks=4)
    breakage(tmp_path / "step_50")
    found = by_path(list_checkpoints(tmp_path), tmp_path)
    assert found["step_50"].format == "dcp"
    assert found["step_50"].complete is False
    assert found["step_50"].reason is not None and reason in found["step_50"].reason
    best = latest_complete(tmp_path)
    assert best is not None and best.step == 40


def test_dcp_empty_data_file_of_an_idle_rank_is_fine(tmp_path: Path) -> None:
    """A rank with nothing to write leaves an empty .distcp that .metadata never names."""
    d = dcp(tmp_path / "step_3", ranks=2)
    write(d / "__2_0.distcp", b"")
    assert only(list_checkpoints(tmp_path)).complete


def test_dcp_without_data_files(tmp_path: Path) -> None:
    write(tmp_path / "step_3" / ".metadata", pickle.dumps({"storage_data": {}}))
    c = only(list_checkpoints(tmp_path))
    assert not c.complete and c.reason == "no .distcp data files"


@pytest.mark.parametrize(("name", "step"), [("step_70", 70), ("final", None)])
def test_root_is_itself_a_checkpoint(tmp_path: Path, name: str, step: int | None) -> None:
    root = dcp(tmp_path / name)
    c = only(list_checkpoints(root))
    assert (c.path, c.format, c.step, c.complete) == (str(root), "dcp", step, True)


# -- plain step directories -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["step-5", "step_5", "global_step_5", "iter_5", "ckpt-5", "ckpt_5", "checkpoint-5", "checkpoint_5", "5"]
)
def test_step_dir_complete(tmp_path: Path, name: str) -> None:
    write(tmp_path / name / "model.pt", torch_zip())
    write(tmp_path / name / "notes.txt", "")
    c = only(list_checkpoints(tmp_path))
    assert (c.format, c.step, c.complete) == ("step_dir", 5, True)


def test_accelerate_save_state_layout(tmp_path: Path) -> None:
    """accelerate's project_dir/checkpoints/checkpoint_<i>: found one level down, a plain step dir."""
    d = tmp_path / "checkpoints" / "checkpoint_3"
    write(d / "model.safetensors", safetensors())
    write(d / "optimizer.bin", torch_zip())
    write(d / "random_states_0.pkl", b"\x80\x04N.")
    c = only(list_checkpoints(tmp_path))
    assert (c.format, c.step, c.complete) == ("step_dir", 3, True)


STEP_DIR_BROKEN: list[tuple[str, Step, str]] = [
    ("empty", lambda d: d.mkdir(), "empty directory"),
    ("only-empty-files", _put("notes.txt", b""), "no non-empty file"),
    ("empty-subdirs", lambda d: (d / "model").mkdir(parents=True), "no non-empty file"),
    ("zero-byte-weights", _put("model.pt", b""), "model.pt is empty (0 bytes)"),
    ("tmp", _put("model.pt.tmp", b"abc"), "model.pt.tmp marks a save in progress"),
    ("partial", _put("optim.partial", b"abc"), "marks a save in progress"),
    ("incomplete", _put("SAVE.INCOMPLETE", b""), "marks a save in progress"),
    ("nested-marker", _put("actor/model.pt.tmp", b"abc"), "actor/model.pt.tmp marks a save in progress"),
    ("nested-empty", _put("actor/model_world_size_2_rank_1.pt", b""), "actor/model_world_size_2_rank_1.pt is empty"),
    ("cut-zip", _put("model.pt", torch_zip()[:-10]), "model.pt is truncated"),
    ("cut-safetensors", _put("model.safetensors", safetensors()[:-4]), "model.safetensors is truncated"),
    ("bad-safetensors", _put("model.safetensors", struct.pack("<Q", 4) + b"[1,2"), "is truncated"),
    ("dcp-subdir", lambda d: dcp(d / "model", metadata=False), "model/: .metadata missing"),
]


@pytest.mark.parametrize(("build", "reason"), [h[1:] for h in STEP_DIR_BROKEN], ids=[h[0] for h in STEP_DIR_BROKEN])
def test_step_dir_incomplete(tmp_path: Path, build: Step, reason: str) -> None:
    write(tmp_path / "step-4" / "model.pt", torch_zip())
    build(tmp_path / "step-6")
    found = by_path(list_checkpoints(tmp_path), tmp_path)
    assert (found["step-6"].format, found["step-6"].complete) == ("step_dir", False)
    assert found["step-6"].reason is not None and reason in found["step-6"].reason
    best = latest_complete(tmp_path)
    assert best is not None and best.step == 4


def test_legacy_pickle_weights_are_accepted(tmp_path: Path) -> None:
    """Pre-zip torch.save files have no structure to check: non-empty is all that can be asked."""
    write(tmp_path / "step-1" / "model.pt", b"\x80\x02}q\x00.")
    assert only(list_checkpoints(tmp_path)).complete


def test_verl_tracker_beside_global_step_dirs(tmp_path: Path) -> None:
    """veRL: global_step_<N>/{actor,critic,data.pt} with latest_checkpointed_iteration.txt written last."""
    for n in (10, 20, 30):
        d = tmp_path / f"global_step_{n}"
        write(d / "actor" / "model_world_size_2_rank_0.pt", torch_zip())
        write(d / "actor" / "model_world_size_2_rank_1.pt", torch_zip())
        write(d / "data.pt", torch_zip())
    write(tmp_path / "latest_checkpointed_iteration.txt", "20")
    found = by_path(list_checkpoints(tmp_path), tmp_path)
    assert found["global_step_30"].complete is False
    assert found["global_step_30"].reason is not None and "newer than" in found["global_step_30"].reason
    best = latest_complete(tmp_path)
    assert best is not None and (best.step, best.format) == (20, "step_dir")


def test_verl_tracker_names_missing_step(tmp_path: Path) -> None:
    write(tmp_path / "global_step_10" / "data.pt", torch_zip())
    write(tmp_path / "latest_checkpointed_iteration.txt", "20")
    found = by_path(list_checkpoints(tmp_path), tmp_path)
    assert (
        found["global_step_20"].reason
        == "latest_checkpointed_iteration.txt names iteration 20 but global_step_20 is missing"
    )


# -- mixed roots, bounds, odd trees ---------------------------------------------------------------------


def test_mixed_formats_in_one_root(tmp_path: Path) -> None:
    hf_checkpoint(tmp_path / "checkpoint-100", 100)
    ds_tag(tmp_path / "global_step200")
    megatron_iter(tmp_path / "iter_0000300")
    dcp(tmp_path / "step_400")
    write(tmp_path / "step-500" / "model.pt", b"")  # the save the crash interrupted
    write(tmp_path / "logs" / "train.log", "loss=1.0\n")
    found = list_checkpoints(tmp_path)
    assert [(c.step, c.format, c.complete) for c in found] == [
        (100, "hf_trainer", True),
        (200, "deepspeed", True),
        (300, "megatron", True),
        (400, "dcp", True),
        (500, "step_dir", False),
    ]
    best = latest_complete(tmp_path)
    assert best is not None and best.path == str(tmp_path / "step_400")


def test_sorted_by_step_then_mtime(tmp_path: Path) -> None:
    a = hf_checkpoint(tmp_path / "a" / "checkpoint-9", 9)
    b = hf_checkpoint(tmp_path / "b" / "checkpoint-9", 9)
    now = time.time()
    for p in b.rglob("*"):
        os.utime(p, (now - 500, now - 500))
    os.utime(b, (now - 500, now - 500))
    found = list_checkpoints(tmp_path)
    assert [c.path for c in found] == [str(b), str(a)]
    best = latest_complete(tmp_path)
    assert best is not None and best.path == str(a)


def test_walk_depth_is_bounded(tmp_path: Path) -> None:
    hf_checkpoint(tmp_path / "checkpoints" / "checkpoint-5", 5)
    hf_checkpoint(tmp_path / "runs" / "deep" / "checkpoint-7", 7)  # three levels down: not searched
    found = by_path(list_checkpoints(tmp_path), tmp_path)
    assert list(found) == [os.path.join("checkpoints", "checkpoint-5")]
    deeper = by_path(list_checkpoints(tmp_path, max_depth=3), tmp_path)
    assert os.path.join("runs", "deep", "checkpoint-7") in deeper


def test_entry_budget_examines_newest_first(tmp_path: Path) -> None:
    for n in range(1, 41):
        for i in range(5):
            write(tmp_path / f"step-{n}" / f"part{i}.pt", torch_zip())
    found = list_checkpoints(tmp_path, max_entries=100)
    assert len(found) == 40
    best = latest_complete(tmp_path, max_entries=100)
    assert best is not None and best.step == 40
    skipped = [c for c in found if not c.complete]
    assert skipped and all(c.reason and "entry limit" in c.reason for c in skipped)
    assert max(c.step or 0 for c in skipped) < min(c.step or 0 for c in found if c.complete)


def test_huge_root_is_bounded(tmp_path: Path) -> None:
    for i in range(10_500):
        (tmp_path / f"f{i:05d}.log").touch()
    hf_checkpoint(tmp_path / "checkpoint-1", 1)
    started = time.monotonic()
    found = list_checkpoints(tmp_path)
    assert time.monotonic() - started < 10
    assert any(c.format == "unknown" and c.reason and "10000-entry limit" in c.reason for c in found)


def test_symlink_loops_and_aliases(tmp_path: Path) -> None:
    hf_checkpoint(tmp_path / "checkpoint-900", 900)
    (tmp_path / "checkpoint-best").symlink_to(tmp_path / "checkpoint-900", target_is_directory=True)
    (tmp_path / "loop").symlink_to(tmp_path, target_is_directory=True)
    (tmp_path / "nest").mkdir()
    (tmp_path / "nest" / "up").symlink_to(tmp_path / "nest", target_is_directory=True)
    (tmp_path / "nest" / "step-3").symlink_to(tmp_path / "checkpoint-900", target_is_directory=True)
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    found = list_checkpoints(tmp_path)
    assert [c.path for c in found] == [str(tmp_path / "checkpoint-900")]


def test_symlinked_checkpoint_outside_the_root_is_followed(tmp_path: Path) -> None:
    hf_checkpoint(tmp_path / "store" / "checkpoint-4", 4)
    root = tmp_path / "root"
    root.mkdir()
    (root / "checkpoint-4").symlink_to(tmp_path / "store" / "checkpoint-4", target_is_directory=True)
    c = only(list_checkpoints(root))
    assert (c.path, c.complete) == (str(root / "checkpoint-4"), True)


def test_special_files_never_block(tmp_path: Path) -> None:
    """A FIFO where a JSON or pointer file should be is skipped, never read (reading would hang)."""
    d = tmp_path / "checkpoint-2"
    d.mkdir()
    os.mkfifo(d / "trainer_state.json")
    os.mkfifo(tmp_path / "latest")
    os.mkfifo(tmp_path / "latest_checkpointed_iteration.txt")
    s = tmp_path / "step_3"
    dcp(s)
    (s / ".metadata").unlink()
    os.mkfifo(s / ".metadata")
    found = by_path(list_checkpoints(tmp_path), tmp_path)
    assert found["checkpoint-2"].reason == "no non-empty file"
    assert found["step_3"].reason is not None and ".metadata missing" in found["step_3"].reason


@pytest.mark.parametrize("kind", ["empty", "missing", "file"])
def test_roots_without_checkpoints(tmp_path: Path, kind: str) -> None:
    root = tmp_path / "ckpt"
    if kind == "empty":
        root.mkdir()
    elif kind == "file":
        root.write_text("not a directory")
    assert list_checkpoints(root) == []
    assert latest_complete(root) is None


def test_root_as_str_and_path_agree(tmp_path: Path) -> None:
    hf_checkpoint(tmp_path / "checkpoint-1", 1)
    assert list_checkpoints(str(tmp_path)) == list_checkpoints(tmp_path)


# -- permissions ------------------------------------------------------------------------------------------


_REPO = ROOT
_CHILD = """
import json, os, sys
from trainmedic.remediations.checkpoints import list_checkpoints
for p in sys.argv[2:]:
    try:
        os.listdir(p) if os.path.isdir(p) else open(p, "rb").close()
    except PermissionError:
        continue
    sys.exit(3)  # still readable: the capabilities were not dropped
print(json.dumps([c.as_dict() for c in list_checkpoints(sys.argv[1])]))
"""
_NO_DAC = "-dac_override,-dac_read_search"


class Denier:
    """chmod 000 on paths (restored afterwards), then list the root as a process those bits stop.

    Root reads past permission bits, so as root the listing runs in a child process started by
    util-linux `setpriv` without CAP_DAC_OVERRIDE / CAP_DAC_READ_SEARCH; where that cannot be done
    the test is skipped (the child itself checks that the paths are really unreadable).
    """

    def __init__(self) -> None:
        self.paths: list[Path] = []

    def __call__(self, path: Path) -> None:
        path.chmod(0)
        self.paths.append(path)

    def restore(self) -> None:
        for p in self.paths:
            p.chmod(0o755)

    def listing(self, root: Path) -> list[dict[str, object]]:
        if not any(_readable(p) for p in self.paths):
            return [c.as_dict() for c in list_checkpoints(root)]
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("running as root and util-linux setpriv is missing: permission bits cannot deny access")
        argv = [setpriv, f"--inh-caps={_NO_DAC}", f"--bounding-set={_NO_DAC}", sys.executable, "-c", _CHILD]
        done = subprocess.run(
            [*argv, str(root), *map(str, self.paths)],
            cwd=_REPO,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if done.returncode != 0:
            pytest.skip(f"cannot drop the capabilities that bypass permission bits: {done.stderr.strip()[-300:]}")
        listing: list[dict[str, object]] = json.loads(done.stdout)
        return listing


def _readable(path: Path) -> bool:
    try:
        if path.is_dir():
            os.listdir(path)
        else:
            path.read_bytes()
    except PermissionError:
        return False
    return True


@pytest.fixture
def deny() -> Iterator[Denier]:
    denier = Denier()
    yield denier
    denier.restore()


@pytest.mark.parametrize(
    ("target", "path", "fmt", "reason"),
    [
        ("checkpoint-5", "checkpoint-5", "step_dir", "permission denied reading checkpoint-5"),
        ("runs", "runs", "unknown", "permission denied reading runs"),
        ("checkpoint-5/trainer_state.json", "checkpoint-5", "hf_trainer", "permission denied reading trainer_state"),
        ("step_6/.metadata", "step_6", "dcp", "permission denied reading .metadata"),
        ("checkpoint-5/global_step5", "checkpoint-5", "hf_trainer", "permission denied reading global_step5"),
    ],
)
def test_unreadable_is_incomplete_not_raised(
    tmp_path: Path, deny: Denier, target: str, path: str, fmt: str, reason: str
) -> None:
    hf_checkpoint(tmp_path / "checkpoint-5", 5, "deepspeed")
    dcp(tmp_path / "step_6")
    hf_checkpoint(tmp_path / "runs" / "checkpoint-1", 1)
    hf_checkpoint(tmp_path / "checkpoint-2", 2)
    deny(tmp_path / target)
    found = {os.path.relpath(str(d["path"]), tmp_path): d for d in deny.listing(tmp_path)}
    assert (found[path]["format"], found[path]["complete"]) == (fmt, False)
    assert reason in str(found[path]["reason"])
    assert found["checkpoint-2"]["complete"] is True  # the rest of the root is still judged


def test_unreadable_root(tmp_path: Path, deny: Denier) -> None:
    root = tmp_path / "ckpt"
    hf_checkpoint(root / "checkpoint-1", 1)
    deny(root)
    found = deny.listing(root)
    assert [(d["path"], d["format"], d["complete"]) for d in found] == [(str(root), "unknown", False)]
    assert "permission denied" in str(found[0]["reason"])


# -- the data model and the scene listing ---------------------------------------------------------------


def _ckpt(step: int | None, mtime: float = 0.0, *, complete: bool = True) -> Checkpoint:
    return Checkpoint(
        path=f"/ckpt/step-{step}",
        step=step,
        format="step_dir",
        complete=complete,
        reason=None if complete else "empty directory",
        reason_zh=None if complete else "空目录",
        mtime=mtime,
        size_bytes=10,
    )


def test_as_dict_round_trips_and_is_json(tmp_path: Path) -> None:
    hf_checkpoint(tmp_path / "checkpoint-1", 1)
    write(tmp_path / "checkpoint-2" / "optimizer.pt", torch_zip())
    for c in list_checkpoints(tmp_path):
        d = c.as_dict()
        assert Checkpoint(**d) == c  # type: ignore[arg-type]
        assert json.loads(json.dumps(d)) == d
        assert set(d) == {"path", "step", "format", "complete", "reason", "reason_zh", "mtime", "size_bytes"}


def test_reason_text_is_bilingual() -> None:
    assert _ckpt(1).reason_text() is None
    assert _ckpt(1, complete=False).reason_text() == I18nText(en="empty directory", zh="空目录")


@pytest.mark.parametrize("count", [0, 1, DESCRIBE_LIMIT, DESCRIBE_LIMIT + 50])
def test_describe_keeps_the_newest(count: int) -> None:
    items = [_ckpt(i, mtime=float(i)) for i in range(count)][::-1]
    listing = describe(items)
    assert len(listing) == min(count, DESCRIBE_LIMIT)
    steps = [d["step"] for d in listing]
    assert steps == list(range(max(0, count - DESCRIBE_LIMIT), count))


# -- no tree makes it raise -------------------------------------------------------------------------------

_NAMES = st.sampled_from(
    [
        "checkpoint-1",
        "checkpoint-2",
        "global_step3",
        "global_step_4",
        "iter_0000005",
        "step_6",
        "7",
        "release",
        "runs",
        "mp_rank_00",
        "mp_rank_01_000",
        "pytorch_model_fsdp_0",
    ]
)
_FILES = st.sampled_from(
    [
        "trainer_state.json",
        "model.safetensors",
        "model.safetensors.index.json",
        "pytorch_model.bin",
        "latest",
        "latest_checkpointed_iteration.txt",
        ".metadata",
        ".metadata.tmp",
        "__0_0.distcp",
        "metadata.json",
        "mp_rank_00_model_states.pt",
        "zero_pp_rank_0_mp_rank_00_optim_states.pt",
        "model_optim_rng.pt",
        "x.tmp",
        "model.pt",
    ]
)
_CONTENT = st.one_of(
    st.binary(max_size=64),
    st.sampled_from([b"", b"{}", b'{"global_step": 3}', b"global_step3", b"5", b"release", torch_zip(), safetensors()]),
    st.text(alphabet=string.printable, max_size=40).map(str.encode),
)
_TREE = st.lists(
    st.tuples(st.lists(_NAMES, min_size=0, max_size=3), _FILES, _CONTENT),
    max_size=25,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tree=_TREE)
def test_random_trees_never_raise(tree: list[tuple[list[str], str, bytes]]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for dirs, name, content in tree:
            parent = root.joinpath(*dirs)
            if parent.exists() and not parent.is_dir():
                continue
            target = parent / name
            if target.exists() and target.is_dir():
                continue
            try:
                write(target, content)
            except (NotADirectoryError, IsADirectoryError, FileExistsError):
                continue
        found = list_checkpoints(root)
        assert found == sorted(found, key=lambda c: (-1 if c.step is None else c.step, c.mtime, c.path))
        for c in found:
            assert c.format in FORMATS
            assert c.complete == (c.reason is None)
            assert c.complete or c.reason_zh
        best = latest_complete(root)
        assert best is None or best.complete
