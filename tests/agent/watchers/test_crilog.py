"""The CRI container-log tailer on real files in a temp /var/log/pods and a real MemoryBus.

Each test plays kubelet and the runtime: it writes CRI lines, renames, truncates, removes
directories, and drives the tailer with `poll_once()` so every step is deterministic. Time-based
behaviour (attribution grace, publish backoff) runs on looptime's fake loop clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
import os
import shutil
import threading
import tracemalloc
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from paths import DATA

from trainmedic.agent.bus.memory import MemoryBus
from trainmedic.agent.jobindex import JobIndex
from trainmedic.agent.telemetry import Telemetry
from trainmedic.agent.watchers.crilog import CriLogTailer
from trainmedic.agent.watchers.follow import FileFollower, PositionStore, Rfc3339
from trainmedic.events import MAX_MESSAGE_BYTES, Event, JobRef, LogBatch, Topic, decode

NS, POD, UID = "train", "llama-worker-1", "0f1e2d3c-aaaa-bbbb-cccc-1234567890ab"
JOB = JobRef(namespace=NS, name="llama")
T0 = 1704110400  # 2024-01-01T12:00:00Z


@pytest.fixture(autouse=True)
def _no_stray_event_loop() -> None:
    """looptime's plugin asks the loop policy for the current loop before every test; in a sync test
    none is set and Python 3.11's policy then creates one that nobody closes (a ResourceWarning,
    so an error, in whichever later test happens to collect it). Saying "no loop" up front avoids it."""
    asyncio.set_event_loop(None)


def ts(i: int) -> str:
    return f"2024-01-01T12:00:{i // 1000 % 60:02d}.{i % 1000:03d}000000Z"


def cri(text: str | bytes, *, stream: str = "stdout", tag: str = "F", i: int = 0) -> bytes:
    body = text.encode() if isinstance(text, str) else text
    return f"{ts(i)} {stream} {tag} ".encode() + body + b"\n"


def split_cri(text: str, *, part: int = 16 << 10, stream: str = "stdout", i: int = 0) -> bytes:
    """A long line as the runtime writes it: P parts of `part` bytes, then the F part."""
    data = text.encode()
    chunks = [data[k : k + part] for k in range(0, len(data), part)] or [b""]
    return b"".join(cri(c, stream=stream, tag="F" if n == len(chunks) - 1 else "P", i=i) for n, c in enumerate(chunks))


def pod_info(uid: str = UID, name: str = POD, rank: int = 1) -> dict[str, Any]:
    return {
        "metadata": {
            "namespace": NS,
            "name": name,
            "uid": uid,
            "labels": {"batch.kubernetes.io/job-name": JOB.name, "batch.kubernetes.io/job-completion-index": str(rank)},
        },
        "spec": {"nodeName": "gpu-node-a"},
    }


@dataclass
class Env:
    root: Path
    bus: MemoryBus
    index: JobIndex
    telemetry: Telemetry
    tmp: Path

    def container(self, container: str = "trainer", *, pod: str = POD, uid: str = UID, ns: str = NS) -> Path:
        d = self.root / f"{ns}_{pod}_{uid}" / container
        d.mkdir(parents=True, exist_ok=True)
        return d

    def tailer(self, **kw: Any) -> CriLogTailer:
        opts: dict[str, Any] = {
            "bus": self.bus,
            "node": "gpu-node-a",
            "job_index": self.index,
            "telemetry": self.telemetry,
            "producer": "node/gpu-node-a",
            "poll_interval": 0.0,
            "start_at": "start",
            "attribution_grace": 0.0,
            "position_flush_interval": 0.0,
        }
        opts.update(kw)
        return CriLogTailer(self.root, **opts)

    async def events(self) -> list[Event]:
        """Everything published on trainmedic.logs so far (a fresh consumer group reads it all)."""
        c = self.bus.consumer([Topic.LOGS], f"observer-{id(object())}")
        await c.start()
        out: list[Event] = []
        while recs := await c.getmany(timeout_ms=0, max_records=100_000):
            out.extend(decode(r.value) for r in recs)
        await c.stop()
        return out

    async def batches(self) -> list[LogBatch]:
        out = []
        for ev in await self.events():
            assert isinstance(ev.payload, LogBatch)
            out.append(ev.payload)
        return out

    async def lines(self, container: str | None = None) -> list[str]:
        return [ln for b in await self.batches() if container in (None, b.container) for ln in b.lines]


@pytest.fixture
def env(tmp_path: Path) -> Env:
    root = tmp_path / "pods"
    root.mkdir()
    return Env(
        root=root,
        bus=MemoryBus(partitions=1, orphan_records=1_000_000, orphan_bytes=64 << 20),
        index=JobIndex(),
        telemetry=Telemetry(),
        tmp=tmp_path,
    )


async def drain(tailer: CriLogTailer) -> None:
    """Poll until everything written so far is read and published."""
    for _ in range(1000):
        if not await tailer.poll_once():
            return
    raise AssertionError("the tailer never caught up")


def append(path: Path, data: bytes) -> None:
    with path.open("ab") as f:
        f.write(data)


# -- the basics ---------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_full_lines_become_one_batch_with_every_field(env: Env) -> None:
    log = env.container() / "0.log"
    append(log, cri("step 1 loss 2.5", i=1) + cri("step 2 loss 2.4", stream="stderr", i=2) + cri("", i=3))
    tailer = env.tailer()
    await tailer.poll_once()
    events = await env.events()
    assert len(events) == 1
    ev = events[0]
    b = ev.payload
    assert isinstance(b, LogBatch)
    assert (b.node, b.namespace, b.pod, b.container) == ("gpu-node-a", NS, POD, "trainer")
    assert b.file == str(log)
    assert b.first_line == 1
    assert b.lines == ["step 1 loss 2.5", "step 2 loss 2.4", ""]
    assert b.times == pytest.approx([T0 + 0.001, T0 + 0.002, T0 + 0.003])
    assert ev.key == f"pod:{NS}/{POD}"
    assert ev.producer == "node/gpu-node-a"
    assert tailer.stats.malformed == 0


@pytest.mark.asyncio
async def test_batches_are_cut_by_line_count_and_number_their_first_line(env: Env) -> None:
    log = env.container() / "0.log"
    append(log, b"".join(cri(f"line {i}", i=i) for i in range(25)))
    await env.tailer(batch_lines=10).poll_once()
    batches = await env.batches()
    assert [len(b.lines) for b in batches] == [10, 10, 5]
    assert [b.first_line for b in batches] == [1, 11, 21]
    assert [ln for b in batches for ln in b.lines] == [f"line {i}" for i in range(25)]


@pytest.mark.asyncio
async def test_batches_are_cut_by_bytes(env: Env) -> None:
    log = env.container() / "0.log"
    append(log, b"".join(cri("x" * 1000, i=i) for i in range(10)))
    await env.tailer(batch_bytes=3000).poll_once()
    assert [len(b.lines) for b in await env.batches()] == [3, 3, 3, 1]


@pytest.mark.parametrize(
    ("ts_text", "expected"),
    [
        (b"2024-01-01T12:00:00.123456789Z", T0 + 0.123456789),
        (b"2024-01-01T12:00:00Z", float(T0)),
        (b"2024-01-01T20:00:00.5+08:00", T0 + 0.5),
        (b"2024-01-01T12:00:00,25Z", T0 + 0.25),
        (b"not-a-time", None),
        (b"2024-13-01T12:00:00Z", None),
        (b"2024-01-01T12:00:00.12x4Z", None),
        (b"", None),
    ],
)
def test_rfc3339_timestamps(ts_text: bytes, expected: float | None) -> None:
    got = Rfc3339()(ts_text)
    if expected is None:
        assert got is None
    else:
        assert got == pytest.approx(expected, abs=1e-6)


# -- partial lines ------------------------------------------------------------------------------


@pytest.mark.parametrize("parts", [2, 3, 100])
@pytest.mark.asyncio
async def test_partial_lines_are_joined(env: Env, parts: int) -> None:
    text = "".join(chr(ord("a") + k % 26) * 16 for k in range(parts * 64))  # parts x 1 KiB
    log = env.container() / "0.log"
    append(log, cri("before", i=1) + split_cri(text, part=1024, i=2) + cri("after", i=3))
    tailer = env.tailer()
    await tailer.poll_once()
    batches = await env.batches()
    assert [ln for b in batches for ln in b.lines] == ["before", text, "after"]
    assert batches[0].times[1] == pytest.approx(T0 + 0.002)


@pytest.mark.asyncio
async def test_partial_at_eof_waits_for_its_end(env: Env) -> None:
    log = env.container() / "0.log"
    append(log, cri("first", i=1) + cri("tail of a long ", tag="P", i=2) + cri("line ", tag="P", i=2))
    tailer = env.tailer()
    await tailer.poll_once()
    assert await env.lines() == ["first"]
    append(log, cri("that ends later", i=3) + cri("next", i=4))
    await tailer.poll_once()
    assert await env.lines() == ["first", "tail of a long line that ends later", "next"]


@pytest.mark.asyncio
async def test_stdout_and_stderr_partials_are_joined_separately(env: Env) -> None:
    log = env.container() / "0.log"
    append(
        log,
        cri("out-1 ", tag="P")
        + cri("err-1 ", stream="stderr", tag="P")
        + cri("out-2", tag="F")
        + cri("whole err", stream="stderr", tag="P")
        + cri(" line", stream="stderr", tag="F")
        + cri("plain"),
    )
    await env.tailer().poll_once()
    assert await env.lines() == ["out-1 out-2", "err-1 whole err line", "plain"]


@pytest.mark.asyncio
async def test_a_partial_that_never_ends_is_published_after_the_timeout(env: Env) -> None:
    log = env.container() / "0.log"
    append(log, cri("killed mid-line: Traceback ", tag="P"))
    tailer = env.tailer(partial_timeout=0.0)
    await tailer.poll_once()
    assert await env.lines() == ["killed mid-line: Traceback "]
    assert tailer.stats.stale_partials == 1


# -- bad input ----------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_huge_logical_line_is_capped_and_memory_stays_bounded(env: Env) -> None:
    cap = 64 << 10
    log = env.container() / "0.log"
    with log.open("wb") as f:
        f.write(cri("before"))
        f.write(split_cri("y" * (10 << 20)))  # a 10 MB line in 640 P parts
        f.write(cri("after"))
    tailer = env.tailer(max_line_bytes=cap)
    tracemalloc.start()
    try:
        await drain(tailer)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    lines = await env.lines()
    assert lines[0] == "before"
    assert lines[1].startswith("y" * cap)
    assert "line cut at" in lines[1]
    assert len(lines[1]) < cap + 200
    assert lines[2:] == ["after"]
    assert tailer.stats.cut_lines == 1
    assert tailer.stats.dropped_bytes == (10 << 20) - cap
    assert peak < 8 << 20, f"peak {peak} bytes while reading a 10 MB line"


@pytest.mark.asyncio
async def test_huge_physical_line_without_cri_split_is_cut(env: Env) -> None:
    cap = 32 << 10
    log = env.container() / "0.log"
    append(log, cri("z" * (3 << 20)) + cri("after"))
    tailer = env.tailer(max_line_bytes=cap)
    await drain(tailer)
    lines = await env.lines()
    assert len(lines) == 2
    assert lines[0].startswith("z" * 1000)
    assert "line cut at" in lines[0]
    assert len(lines[0]) < cap + 200
    assert lines[1] == "after"
    assert tailer.stats.cut_lines == 1


@pytest.mark.parametrize(
    "junk",
    [
        b"no timestamp at all",
        b"\x00\x01\x02\xff\xfe binary \x80\x81",
        b"2024-01-01T12:00:00Z stdout",
        b"2024-01-01T12:00:00Z stdin F wrong stream",
        b"2024-01-01T12:00:00Z stdout X wrong tag",
        b"",
    ],
    ids=["text", "binary", "short", "stream", "tag", "empty"],
)
@pytest.mark.asyncio
async def test_malformed_lines_are_passed_on_and_counted(env: Env, junk: bytes) -> None:
    log = env.container() / "0.log"
    append(log, cri("good 1") + junk + b"\n" + cri("good 2"))
    tailer = env.tailer()
    await tailer.poll_once()
    lines = await env.lines()
    assert lines == ["good 1", junk.decode("utf-8", "replace"), "good 2"]
    assert tailer.stats.malformed == 1
    assert env.telemetry.watch_errors.labels(source="crilog", kind="malformed")._value.get() == 1


@pytest.mark.asyncio
async def test_invalid_utf8_is_replaced_and_counted(env: Env) -> None:
    log = env.container() / "0.log"
    append(log, cri(b"caf\xe9 \xff\xfe ok") + cri("fine"))
    tailer = env.tailer()
    await tailer.poll_once()
    assert await env.lines() == ["caf\ufffd \ufffd\ufffd ok", "fine"]
    assert tailer.stats.invalid_utf8 == 1
    assert tailer.stats.malformed == 0


@pytest.mark.asyncio
async def test_multibyte_character_split_across_partials_survives(env: Env) -> None:
    data = "日志行".encode()
    log = env.container() / "0.log"
    append(log, cri(data[:4], tag="P") + cri(data[4:]))
    await env.tailer().poll_once()
    assert await env.lines() == ["日志行"]


@pytest.mark.asyncio
async def test_an_event_never_exceeds_the_bus_message_limit(env: Env) -> None:
    # (The tests read the topic after the tailer ran, so their bus keeps what no group has read yet.)
    # NULs are escaped as \\u0000 in JSON: 200 KB of them encode to 1.2 MB.
    log = env.container() / "0.log"
    append(log, cri(b"\x00" * (200 << 10)) + b"".join(cri(b"\x01" * 1000, i=i) for i in range(400)))
    await drain(env.tailer(max_line_bytes=256 << 10, batch_bytes=1 << 20))
    events = await env.events()
    assert all(len(ev.encode()) <= MAX_MESSAGE_BYTES for ev in events)
    lines = [ln for ev in events for ln in ev.payload.lines]  # type: ignore[union-attr]
    assert len(lines) == 401


# -- rotation, truncation, restarts, pods coming and going ---------------------------------------


@pytest.mark.parametrize("late_lines", [0, 3], ids=["clean", "late-writes"])
@pytest.mark.asyncio
async def test_rotation_by_rename_loses_and_repeats_nothing(env: Env, late_lines: int) -> None:
    d = env.container()
    log = d / "0.log"
    tailer = env.tailer(rotate_wait=60.0)
    writer = log.open("ab", buffering=0)
    n = 0

    def write(k: int) -> None:
        nonlocal n
        for _ in range(k):
            writer.write(cri(f"line {n}", i=n))
            n += 1

    write(10)
    await tailer.poll_once()
    write(5)  # not read yet when the rename happens
    rotated = d / "0.log.20240101-120000"
    os.rename(log, rotated)
    write(late_lines)  # the runtime has not reopened yet
    old = writer
    writer = log.open("ab", buffering=0)
    write(4)
    await tailer.poll_once()
    writer_late = old
    for _ in range(late_lines):
        writer_late.write(cri(f"line {n}", i=n))  # a write that raced the reopen
        n += 1
    write(2)
    await tailer.poll_once()
    old.close()
    writer.close()

    batches = await env.batches()
    lines = [ln for b in batches for ln in b.lines]
    assert sorted(lines, key=lambda s: int(s.split()[1])) == [f"line {k}" for k in range(n)]
    assert len(lines) == len(set(lines))
    assert {b.file for b in batches} == {str(log), str(rotated)}
    assert tailer.stats.rotations == 1
    new_file = [b for b in batches if b.file == str(log) and b.first_line == 1]
    assert new_file, "the new file is numbered from line 1"


@pytest.mark.asyncio
async def test_rotation_while_the_writer_keeps_writing(env: Env) -> None:
    """A writer thread appends and rotates (like kubelet + runtime) while the tailer polls."""
    d = env.container()
    log = d / "0.log"
    total, rotate_every = 3000, 700
    done = threading.Event()

    def writer() -> None:
        f = log.open("ab", buffering=0)
        for k in range(total):
            f.write(cri(f"line {k} " + "x" * (k % 50), i=k))
            if k % rotate_every == rotate_every - 1:
                os.rename(log, d / f"0.log.2024010112{k:04d}")
                f.write(cri(f"late {k}", i=k))  # written to the renamed file before the reopen
                f.close()
                f = log.open("ab", buffering=0)
        f.close()
        done.set()

    tailer = env.tailer(rotate_wait=60.0, read_budget=16 << 10)
    log.touch()
    await tailer.poll_once()  # following 0.log before the first line is written
    t = threading.Thread(target=writer)
    t.start()
    try:
        while not done.is_set():
            await tailer.poll_once()
            await asyncio.sleep(0.001)
    finally:
        t.join()
    await drain(tailer)
    lines = await env.lines()
    expected = [f"line {k} " + "x" * (k % 50) for k in range(total)]
    expected += [f"late {k}" for k in range(total) if k % rotate_every == rotate_every - 1]
    assert sorted(lines) == sorted(expected)
    assert tailer.stats.rotations >= 1


@pytest.mark.asyncio
async def test_gzipped_and_old_rotated_files_are_not_read(env: Env) -> None:
    d = env.container()
    with gzip.open(d / "0.log.20231231-000000.gz", "wb") as g:
        g.write(cri("from the gz"))
    (d / "0.log.20231231-120000").write_bytes(cri("from an old rotated file"))
    (d / "0.log").write_bytes(cri("live"))
    await env.tailer().poll_once()
    assert await env.lines() == ["live"]


@pytest.mark.asyncio
async def test_truncation_restarts_from_the_beginning(env: Env, caplog: pytest.LogCaptureFixture) -> None:
    log = env.container() / "0.log"
    append(log, b"".join(cri(f"old {i}") for i in range(5)))
    tailer = env.tailer()
    await tailer.poll_once()
    with log.open("wb") as f:  # truncate, then the writer goes on
        f.write(cri("new 0") + cri("new 1"))
    with caplog.at_level("INFO", logger="trainmedic.watchers.follow"):
        await tailer.poll_once()
    assert await env.lines() == [f"old {i}" for i in range(5)] + ["new 0", "new 1"]
    assert tailer.stats.truncations == 1
    assert "truncated" in caplog.text
    assert (await env.batches())[-1].first_line == 1


@pytest.mark.asyncio
async def test_container_restart_creates_a_new_file(env: Env) -> None:
    d = env.container()
    append(d / "0.log", cri("first run") + cri("Killed"))
    tailer = env.tailer()
    await tailer.poll_once()
    append(d / "1.log", cri("second run"))
    await tailer.poll_once()
    batches = await env.batches()
    assert [(b.file, b.first_line, b.lines) for b in batches] == [
        (str(d / "0.log"), 1, ["first run", "Killed"]),
        (str(d / "1.log"), 1, ["second run"]),
    ]


@pytest.mark.asyncio
async def test_pod_appearing_late_is_read_from_its_start(env: Env) -> None:
    early = env.container(pod="early", uid="u-early")
    append(early / "0.log", cri("before the agent started"))
    tailer = env.tailer(start_at="end")
    await tailer.poll_once()
    append(early / "0.log", cri("after start"))
    late = env.container(pod="late", uid="u-late")
    append(late / "0.log", cri("late pod line 1") + cri("late pod line 2"))
    await tailer.poll_once()
    by_pod = {(b.pod, tuple(b.lines)) for b in await env.batches()}
    assert by_pod == {("early", ("after start",)), ("late", ("late pod line 1", "late pod line 2"))}


@pytest.mark.asyncio
async def test_removed_pod_is_drained_then_forgotten(env: Env) -> None:
    d = env.container()
    append(d / "0.log", cri("one"))
    store = env.tmp / "positions.json"
    tailer = env.tailer(position_store=store)
    await tailer.poll_once()
    append(d / "0.log", cri("two: written just before the pod went away"))
    shutil.rmtree(d.parent)
    await tailer.poll_once()
    await tailer.poll_once()
    assert await env.lines() == ["one", "two: written just before the pod went away"]
    assert tailer._pods == {}
    assert json.loads(store.read_text())["files"] == {}


@pytest.mark.asyncio
async def test_start_at_end_skips_what_was_there(env: Env) -> None:
    log = env.container() / "0.log"
    append(log, cri("old") + b"2024-01-01T12:00:00Z stdout F half a li")  # the writer is mid-line
    tailer = env.tailer(start_at="end")
    await tailer.poll_once()
    append(log, b"ne\n" + cri("new"))
    await tailer.poll_once()
    batches = await env.batches()
    assert [ln for b in batches for ln in b.lines] == ["new"]
    assert batches[0].first_line == 3


@pytest.mark.asyncio
async def test_directories_that_are_not_pods_are_ignored(env: Env) -> None:
    (env.root / "not-a-pod-dir" / "c").mkdir(parents=True)
    (env.root / "not-a-pod-dir" / "c" / "0.log").write_bytes(cri("ignored"))
    (env.root / "stray-file.log").write_bytes(cri("ignored"))
    append(env.container() / "0.log", cri("kept"))
    await env.tailer().poll_once()
    assert await env.lines() == ["kept"]


@pytest.mark.asyncio
async def test_missing_root_is_waited_for(env: Env) -> None:
    shutil.rmtree(env.root)
    tailer = env.tailer()
    await tailer.poll_once()
    append(env.container() / "0.log", cri("hello"))
    await tailer.poll_once()
    assert await env.lines() == ["hello"]


# -- job attribution -----------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_lines_of_a_known_pod_carry_its_job_and_rank(env: Env) -> None:
    env.index.update_pod(pod_info(rank=3))
    append(env.container() / "0.log", cri("hello"))
    await env.tailer(attribution_grace=5.0).poll_once()
    (ev,) = await env.events()
    assert isinstance(ev.payload, LogBatch)
    assert ev.payload.job == JOB
    assert ev.payload.rank == 3
    assert ev.key == JOB.key


@pytest.mark.asyncio
async def test_a_pod_known_only_by_name_with_another_uid_is_not_taken(env: Env) -> None:
    env.index.update_pod(pod_info(uid="an-older-pod-of-the-same-name"))
    append(env.container() / "0.log", cri("hello"))
    await env.tailer(attribution_grace=0.0).poll_once()
    (ev,) = await env.events()
    assert isinstance(ev.payload, LogBatch)
    assert ev.payload.job is None
    assert ev.key == f"pod:{NS}/{POD}"


@pytest.mark.looptime
@pytest.mark.asyncio
async def test_lines_wait_for_the_job_index_within_the_grace(env: Env) -> None:
    append(env.container() / "0.log", cri("first line, before the pod watch caught up"))
    tailer = env.tailer(attribution_grace=5.0)
    await tailer.poll_once()
    assert await env.events() == []
    await asyncio.sleep(2.0)
    env.index.update_pod(pod_info(rank=0))
    await tailer.poll_once()
    (ev,) = await env.events()
    assert isinstance(ev.payload, LogBatch)
    assert ev.payload.job == JOB
    assert ev.payload.rank == 0
    assert ev.key == JOB.key


@pytest.mark.looptime
@pytest.mark.asyncio
async def test_lines_of_an_unknown_pod_go_out_by_pod_after_the_grace(env: Env) -> None:
    log = env.container() / "0.log"
    append(log, cri("orphan 1"))
    tailer = env.tailer(attribution_grace=5.0)
    loop = asyncio.get_running_loop()
    start = loop.time()
    await tailer.poll_once()
    await asyncio.sleep(4.9)
    await tailer.poll_once()
    assert await env.events() == []
    await asyncio.sleep(0.1)
    await tailer.poll_once()
    assert loop.time() - start == pytest.approx(5.0)
    append(log, cri("orphan 2"))
    await tailer.poll_once()  # once the grace is over, nothing more is held
    events = await env.events()
    assert [ev.key for ev in events] == [f"pod:{NS}/{POD}"] * 2
    assert [ln for ev in events for ln in ev.payload.lines] == ["orphan 1", "orphan 2"]  # type: ignore[union-attr]
    assert tailer.stats.unattributed_batches == 2


# -- positions and restarts ----------------------------------------------------------------------


class StallingBus(MemoryBus):
    """A bus that accepts `accept` events, then hangs in publish (the agent is killed there)."""

    def __init__(self, accept: int) -> None:
        super().__init__(partitions=1)
        self.accept = accept

    async def publish(self, topic: str, event: Event) -> None:
        if self.accept <= 0:
            await asyncio.Event().wait()
        self.accept -= 1
        await super().publish(topic, event)


class FlakyBus(MemoryBus):
    def __init__(self, failures: int) -> None:
        super().__init__(partitions=1)
        self.failures = failures

    async def publish(self, topic: str, event: Event) -> None:
        if self.failures > 0:
            self.failures -= 1
            raise ConnectionError("broker unreachable")
        await super().publish(topic, event)


class Crash(BaseException):
    """The agent process dying (nothing catches it, nothing runs after it)."""


class CrashingBus(MemoryBus):
    """Accepts `accept` events, then the process dies: before the next one is accepted, or just
    after it was (accepted by the bus, but the tailer never learns it)."""

    def __init__(self, accept: int, *, after_accept: bool) -> None:
        super().__init__(partitions=1)
        self.accept = accept
        self.after_accept = after_accept

    async def publish(self, topic: str, event: Event) -> None:
        if self.accept <= 0:
            if self.after_accept:
                await super().publish(topic, event)
            raise Crash
        self.accept -= 1
        await super().publish(topic, event)


@pytest.mark.parametrize("after_accept", [False, True], ids=["before-accept", "after-accept"])
@pytest.mark.parametrize("accepted", [0, 1, 3, 7])
@pytest.mark.asyncio
async def test_restart_after_a_crash_loses_nothing(env: Env, accepted: int, after_accept: bool) -> None:
    log = env.container() / "0.log"
    total = 200
    append(log, b"".join(cri(f"line {k}", i=k) for k in range(total)))
    store = env.tmp / "state" / "positions.json"
    first = CrashingBus(accept=accepted, after_accept=after_accept)
    t1 = env.tailer(bus=first, position_store=store, batch_lines=25)
    with pytest.raises(Crash):
        await t1.poll_once()

    append(log, b"".join(cri(f"line {k}", i=k) for k in range(total, total + 10)))
    t2 = env.tailer(position_store=store, batch_lines=25, start_at="end")
    await t2.poll_once()
    after = await env.lines()
    env.bus = first
    before = await env.lines()
    seen = before + after
    assert set(seen) == {f"line {k}" for k in range(total + 10)}, "no line lost across the crash"
    assert len(seen) - len(set(seen)) == (25 if after_accept else 0), "only the batch in flight is sent twice"


@pytest.mark.parametrize("accepted", [0, 1, 3, 7])
@pytest.mark.asyncio
async def test_restart_after_a_stop_loses_nothing(env: Env, accepted: int) -> None:
    log = env.container() / "0.log"
    total = 200
    append(log, b"".join(cri(f"line {k}", i=k) for k in range(total)))
    store = env.tmp / "state" / "positions.json"
    first = StallingBus(accept=accepted)
    t1 = env.tailer(bus=first, position_store=store, batch_lines=25)
    task = asyncio.create_task(t1.run())
    while first.published < accepted:
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.05)
    task.cancel()  # the agent is stopped with one batch in flight
    with contextlib.suppress(asyncio.CancelledError):
        await task

    append(log, b"".join(cri(f"line {k}", i=k) for k in range(total, total + 10)))
    t2 = env.tailer(position_store=store, batch_lines=25, start_at="end")
    await t2.poll_once()

    after = await env.lines()  # what the restarted agent published (on env.bus)
    env.bus = first
    before = await env.lines()  # what the first one got accepted before it died
    assert len(before) == 25 * accepted
    seen = before + after
    assert set(seen) == {f"line {k}" for k in range(total + 10)}, "no line lost across the restart"
    assert len(seen) == len(set(seen)), "a graceful stop saves what was accepted: nothing is sent twice"


@pytest.mark.asyncio
async def test_a_line_still_being_joined_is_not_committed(env: Env) -> None:
    log = env.container() / "0.log"
    store = env.tmp / "positions.json"
    first = cri("complete")
    append(log, first + cri("the head of a long line, ", tag="P"))
    t1 = env.tailer(position_store=store)
    await t1.poll_once()
    (pos,) = json.loads(store.read_text())["files"].values()
    assert (pos["offset"], pos["line"]) == (len(first), 1)
    append(log, cri("and its end"))
    t2 = env.tailer(position_store=store, start_at="end")
    await t2.poll_once()
    assert await env.lines() == ["complete", "the head of a long line, and its end"]
    (pos,) = json.loads(store.read_text())["files"].values()
    assert (pos["offset"], pos["line"]) == (log.stat().st_size, 3)


@pytest.mark.asyncio
async def test_restart_finds_a_file_rotated_while_the_agent_was_down(env: Env) -> None:
    d = env.container()
    log = d / "0.log"
    store = env.tmp / "positions.json"
    append(log, b"".join(cri(f"line {k}") for k in range(5)))
    t1 = env.tailer(position_store=store)
    await t1.poll_once()
    await t1.save_positions()
    append(log, b"".join(cri(f"line {k}") for k in range(5, 8)))  # unread when the agent stops
    os.rename(log, d / "0.log.20240101-130000")
    append(log, cri("line 8"))

    t2 = env.tailer(position_store=store, start_at="end")
    await t2.poll_once()
    assert await env.lines() == [f"line {k}" for k in range(9)]


@pytest.mark.asyncio
async def test_restart_reads_a_container_that_started_while_the_agent_was_down(env: Env) -> None:
    store = env.tmp / "positions.json"
    append(env.container("a") / "0.log", cri("a1", i=1))
    t1 = env.tailer(position_store=store, start_at="end")
    await t1.poll_once()
    await t1.save_positions()
    saved = PositionStore(store).load()
    assert saved.saved_at is not None
    # The new container's first line is stamped after the store was saved.
    stamp = b"2099-01-01T00:00:00.000000001Z stdout F b started while the agent was down\n"
    append(env.container("b") / "0.log", stamp)
    t2 = env.tailer(position_store=store, start_at="end")
    await t2.poll_once()
    assert await env.lines() == ["b started while the agent was down"]


@pytest.mark.parametrize(
    "content", [b"{not json", b'{"v": 99}', b"[]", b'{"v": 1, "files": {"1:2": {"path": 3}}}', b"\xff\xfe"]
)
@pytest.mark.asyncio
async def test_an_unusable_position_store_is_set_aside(env: Env, content: bytes) -> None:
    store = env.tmp / "positions.json"
    store.write_bytes(content)
    append(env.container() / "0.log", cri("hello"))
    tailer = env.tailer(position_store=store)
    await tailer.poll_once()
    assert await env.lines() == ["hello"]
    assert (env.tmp / "positions.json.corrupt").read_bytes() == content
    assert json.loads(store.read_text())["v"] == 1


@pytest.mark.looptime
@pytest.mark.asyncio
async def test_a_failing_bus_is_retried_with_backoff(env: Env) -> None:
    bus = FlakyBus(failures=2)
    append(env.container() / "0.log", cri("must not be lost"))
    tailer = env.tailer(bus=bus)
    loop = asyncio.get_running_loop()
    start = loop.time()
    await tailer.poll_once()
    assert 0.5 * 0.8 + 1.0 * 0.8 <= loop.time() - start <= 0.5 * 1.2 + 1.0 * 1.2
    env.bus = bus
    assert await env.lines() == ["must not be lost"]
    assert tailer.stats.publish_errors == 2


@pytest.mark.asyncio
async def test_run_tails_until_cancelled_and_saves_positions(env: Env) -> None:
    log = env.container() / "0.log"
    store = env.tmp / "positions.json"
    tailer = env.tailer(position_store=store, read_interval=0.01, position_flush_interval=60.0)
    task = asyncio.create_task(tailer.run())
    append(log, cri("hello"))
    for _ in range(500):
        if await env.lines():
            break
        await asyncio.sleep(0.01)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert await env.lines() == ["hello"]
    (pos,) = json.loads(store.read_text())["files"].values()
    assert pos == {"path": str(log), "offset": log.stat().st_size, "line": 1}


# -- the shared follower on its own -----------------------------------------------------------------


def test_follower_hands_out_exact_offsets(tmp_path: Path) -> None:
    p = tmp_path / "f.log"
    p.write_bytes(b"a\nbb\nccc")
    f = FileFollower(p, chunk_bytes=3)
    res = f.read(0.0)
    got = [(ln, s.start, s.end) for s in res.segments for ln in s.lines]
    assert [g[0] for g in got] == [b"a", b"bb"]
    assert res.segments[-1].end == 5
    assert f.positions()[0].offset == 5
    append(p, b"\n")
    res = f.read(0.0)
    assert [(s.lines, s.first_line, s.start, s.end) for s in res.segments] == [([b"ccc"], 3, 5, 9)]
    f.close()


# -- real content ---------------------------------------------------------------------------------


def _corpus() -> Iterator[tuple[str, str]]:
    for row in (DATA / "real-logs.jsonl").read_text().splitlines():
        obj = json.loads(row)
        yield obj["id"], obj["text"]


@pytest.mark.parametrize(("text"), [t for _, t in _corpus()], ids=[i for i, _ in _corpus()])
@pytest.mark.asyncio
async def test_real_failure_logs_round_trip(env: Env, text: str) -> None:
    """Every line of the real-log corpus, written as the runtime would (long ones in P parts)."""
    lines = text.split("\n")
    log = env.container() / "0.log"
    append(log, b"".join(split_cri(ln, part=64, stream="stderr", i=k) for k, ln in enumerate(lines)))
    await env.tailer().poll_once()
    assert await env.lines() == lines


@pytest.mark.parametrize("catch_up", [True, False])
def test_a_rotation_between_the_stat_and_the_open_of_the_new_file_loses_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, catch_up: bool
) -> None:
    """The follower sees the name point at a new file (stat), drains the old one, then opens the name:
    if the writer rotates once more in between, the file the stat saw is renamed away before it was
    ever opened. With catch_up (the CRI tailer's setting) it is read all the same, before the newer
    one; without, it is lost, as documented."""
    import trainmedic.agent.watchers.follow as follow_mod

    log = tmp_path / "0.log"
    log.write_bytes(b"a1\n")
    follower = follow_mod.FileFollower(log, catch_up=catch_up, rotate_wait=60.0)
    lines = [ln for seg in follower.read(0.0).segments for ln in seg.lines]
    os.rename(log, tmp_path / "0.log.20240101-000001")
    log.write_bytes(b"b1\nb2\n")
    real_open = os.open
    raced: list[str] = []

    def racing_open(path: Any, flags: int, *args: Any) -> int:
        if os.fspath(path) == str(log) and not raced:
            raced.append("rotated again")  # the writer: 0.log -> .000002, a new 0.log
            os.rename(log, tmp_path / "0.log.20240101-000002")
            log.write_bytes(b"c1\n")
        return real_open(path, flags, *args)

    monkeypatch.setattr(os, "open", racing_open)  # the writer races every open of the name
    for _ in range(10):
        res = follower.read(1.0)
        lines += [ln for seg in res.segments for ln in seg.lines]
        if not res.more:
            break
    follower.close()
    assert raced
    if catch_up:
        assert lines == [b"a1", b"b1", b"b2", b"c1"]
    else:
        assert lines == [b"a1", b"c1"]
