"""Kernel message sources on real files, a FIFO, stubs and subprocesses, with a real MemoryBus.

/dev/kmsg is played by a regular file or a FIFO in kmsg format, or by a stub whose read() raises
BrokenPipeError (an overrun), passed through the source's `opener`. journalctl is played by a small
script that prints recorded `journalctl -k -o json` lines, and run for real where it is installed.
What the sources publish is fed to the shipped rule engine: Xid 79 and the OOM killer must be found.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import stat
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from paths import DATA

from trainmedic.agent.bus.memory import MemoryBus
from trainmedic.agent.jobindex import JobIndex
from trainmedic.agent.telemetry import Telemetry
from trainmedic.agent.watchers.kernel import (
    JournaldSource,
    KernelFileSource,
    KernelSourceUnavailable,
    KmsgParser,
    KmsgSource,
    parse_journal_entry,
    parse_kmsg_record,
    record_lines,
)
from trainmedic.detectors.diagnose import make_engine
from trainmedic.detectors.engine import Engine
from trainmedic.events import MAX_MESSAGE_BYTES, Event, JobRef, KernelBatch, Topic, decode, node_key

KMSG = DATA / "kmsg" / "xid-oom.kmsg"
JOURNAL = DATA / "kmsg" / "journalctl-k.json"
NODE = "gpu-node-a"
BOOT = 1_700_000_000.0
XID79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid=2876, name=python, GPU has fallen off the bus."


@pytest.fixture(autouse=True)
def _no_stray_event_loop() -> None:
    """looptime's plugin asks the loop policy for the current loop before every test; in a sync test
    none is set and Python 3.11's policy then creates one that nobody closes (a ResourceWarning,
    so an error, in whichever later test happens to collect it). Saying "no loop" up front avoids it."""
    asyncio.set_event_loop(None)


@pytest.fixture(scope="module")
def engine() -> Engine:
    return make_engine(fast=False)


@dataclass
class Env:
    bus: MemoryBus
    index: JobIndex
    telemetry: Telemetry
    tmp: Path

    def common(self) -> dict[str, Any]:
        return {
            "bus": self.bus,
            "node": NODE,
            "job_index": self.index,
            "telemetry": self.telemetry,
            "producer": f"node/{NODE}",
        }

    async def events(self) -> list[Event]:
        c = self.bus.consumer([Topic.KERNEL], f"observer-{id(object())}")
        await c.start()
        out: list[Event] = []
        while recs := await c.getmany(timeout_ms=0, max_records=100_000):
            out.extend(decode(r.value) for r in recs)
        await c.stop()
        return out

    async def batches(self) -> list[KernelBatch]:
        out = []
        for ev in await self.events():
            assert isinstance(ev.payload, KernelBatch)
            out.append(ev.payload)
        return out

    async def lines(self) -> list[str]:
        return [ln for b in await self.batches() for ln in b.lines]

    async def wait_lines(self, n: int, timeout: float = 10.0) -> list[str]:
        async with asyncio.timeout(timeout):
            while len(lines := await self.lines()) < n:
                await asyncio.sleep(0.01)
        return lines


@pytest.fixture
def env(tmp_path: Path) -> Env:
    return Env(bus=MemoryBus(partitions=1), index=JobIndex(), telemetry=Telemetry(), tmp=tmp_path)


@contextlib.asynccontextmanager
async def running(source: Any) -> AsyncIterator[asyncio.Task[None]]:
    """Run a source's run() in a task; cancel it (and see it end cleanly) on exit."""
    task = asyncio.create_task(source.run())
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def pod(name: str, job: str, node: str) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "train", "name": name, "uid": f"uid-{name}", "labels": {"job-name": job}},
        "spec": {"nodeName": node},
    }


def kmsg_records() -> list[str]:
    """The sample's records, each with its dictionary lines (what one read() of the device returns)."""
    out: list[str] = []
    for line in KMSG.read_text().splitlines(keepends=True):
        if line.startswith(" ") and out:
            out[-1] += line
        else:
            out.append(line)
    return out


def expected_kmsg_lines() -> list[str]:
    return [
        "pool invoked oom-killer: gfp_mask=0x6200ca(GFP_HIGHUSER_MOVABLE), order=0, oom_score_adj=0",
        " oom_kill_process.cold.33+0xb/0x10",
        "[  pid  ]   uid  tgid total_vm      rss pgtables_bytes swapents oom_score_adj name",
        "oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),cpuset=/,mems_allowed=0,global_oom,"
        "task_memcg=/user.slice/user-21417.slice/user@21417.service,task=perl,pid=1440763,uid=21417",
        "Out of memory: Killed process 1440763 (perl) total-vm:87033376kB, anon-rss:60356340kB, file-rss:0kB, "
        "shmem-rss:0kB, UID:21417 pgtables:169956kB oom_score_adj:0",
        "oom_reaper: reaped process 1440763 (perl), now anon-rss:0kB, file-rss:0kB, shmem-rss:0kB",
        XID79,
        "NVRM: The NVIDIA GPU 0000:b3:00.0",
        " NVRM: (PCI ID: 10de:26b5) installed in this system has",
        " NVRM: fallen off the bus and is not responding to commands.",
        "NVRM: Xid (PCI:0000:dc:00): 45, pid=1818990, name=python3, Ch 00000001 caused by previous Xid 149",
        "NVRM: Xid (PCI:0000:ed:00): 45, pid=1818992, name=python3, Ch 0000000c caused by previous Xid 145",
        "NVRM: Xid (PCI:0000:ba:00): 45, pid=1818989, name=python3, Ch 00000002 caused by previous Xid 145",
        "NVRM: Xid (PCI:0000:97:00): 45, pid=1818987, name=python3, Ch 00000003 caused by previous Xid 145",
        "trainmedic test: path C:\\data 日志",
    ]


def findings(engine: Engine, lines: list[str]) -> set[tuple[str, str]]:
    return {(f.rule_id, f.code) for f in engine.scan_text("\n".join(lines) + "\n")}


# -- kmsg parsing ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (b"6,339,5140900,-;NVRM: loading", (6, 339, 5140900, "-", "NVRM: loading")),
        (b"3,48217,5203117822,-,caller=T2876;NVRM: Xid", (3, 48217, 5203117822, "-", "NVRM: Xid")),
        (b"4,1,2,c;a\\x0ab", (4, 1, 2, "c", "a\nb")),
        (b"6,1,2,-;back\\x5cslash \\xe6\\x97\\xa5", (6, 1, 2, "-", "back\\slash 日")),
        (b"6,1,2,-;bad \\xff byte", (6, 1, 2, "-", "bad \ufffd byte")),
        (b"6,1,2,-;semi;colons;kept", (6, 1, 2, "-", "semi;colons;kept")),
        (b"30,7,2,-;", (30, 7, 2, "-", "")),
    ],
)
def test_kmsg_records_parse(line: bytes, expected: tuple[int, int, int, str, str]) -> None:
    rec = parse_kmsg_record(line)
    assert rec is not None
    assert (rec.prio, rec.seq, rec.usec, rec.flags, rec.message) == expected


@pytest.mark.parametrize(
    "line",
    [b"no semicolon here", b"6,1;too few fields", b"x,1,2,-;not a number", b"6,-1,2,-;negative", b";", b""],
)
def test_kmsg_junk_is_not_a_record(line: bytes) -> None:
    assert parse_kmsg_record(line) is None


def test_kmsg_continuation_lines_belong_to_the_previous_record() -> None:
    recs = KmsgParser().feed(KMSG.read_bytes())
    xid = next(r for r in recs if "Xid" in r.message and ": 79," in r.message)
    assert xid.fields == {"SUBSYSTEM": "pci", "DEVICE": "+pci:0000:3b:00.0"}
    assert (xid.facility, xid.level) == (0, 3)
    assert [r.seq for r in recs] == list(range(48211, 48224))


def test_kmsg_parser_joins_records_split_across_reads() -> None:
    data = KMSG.read_bytes()
    whole = KmsgParser().feed(data)
    p = KmsgParser()
    pieces = [r for k in range(0, len(data), 7) for r in p.feed(data[k : k + 7])]
    assert pieces == whole


@pytest.mark.parametrize(
    ("message", "lines"),
    [
        ("one line", ["one line"]),
        ("first\nsecond\nthird", ["first", " second", " third"]),
        ("trailing newline\n", ["trailing newline"]),
    ],
)
def test_multi_line_messages_become_indented_continuations(message: str, lines: list[str]) -> None:
    assert record_lines(message) == lines


# -- KmsgSource -------------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_kmsg_file_stand_in_publishes_lines_the_shipped_rules_match(env: Env, engine: Engine) -> None:
    source = KmsgSource(KMSG, **env.common(), start_at="start", boot_time=BOOT, boot_id="b1")
    async with running(source):
        lines = await env.wait_lines(15)
    assert lines == expected_kmsg_lines()
    found = findings(engine, lines)
    assert ("nvidia.xid", "xid:79") in found
    assert ("generic.host_oom.kernel_oom_killer", "oom_killer") in found
    assert ("nvidia.gpu_fallen_off_bus", "gpu_fallen_off_bus") in found
    assert ("nvidia.xid_caused_by", "xid:149") in found
    b = (await env.batches())[0]
    assert b.node == NODE
    assert b.source == "kmsg"
    assert b.first_line == 48211  # kmsg has no line numbers: the first record's sequence number
    assert b.times[0] == pytest.approx(BOOT + 5203.117)
    assert b.times[6] == pytest.approx(BOOT + 5203.117822)


@pytest.mark.asyncio
async def test_kmsg_starts_at_the_end_by_default(env: Env) -> None:
    dev = env.tmp / "kmsg"
    recs = kmsg_records()
    dev.write_text("".join(recs[:6]))
    source = KmsgSource(dev, **env.common(), boot_time=BOOT, boot_id="b1")
    async with running(source):
        await asyncio.sleep(0.3)
        with dev.open("a") as f:
            f.write(recs[6])
        lines = await env.wait_lines(1)
    assert lines == [XID79]


@pytest.mark.asyncio
async def test_kmsg_from_a_fifo(env: Env) -> None:
    fifo = env.tmp / "kmsg.fifo"
    os.mkfifo(fifo)
    writer = os.open(fifo, os.O_RDWR)  # holds the FIFO open so the reader's open does not block
    try:
        source = KmsgSource(fifo, **env.common(), start_at="start", boot_time=BOOT, boot_id="b1")
        async with running(source):
            for rec in kmsg_records():
                os.write(writer, rec.encode())  # one record per write, like the device
            lines = await env.wait_lines(15)
    finally:
        os.close(writer)
    assert lines == expected_kmsg_lines()


class OverrunKmsg:
    """/dev/kmsg after the ring wrapped: two records, EPIPE, then records from a later sequence."""

    def __init__(self) -> None:
        self.reads: list[bytes | type[BaseException]] = [
            b"6,100,1000,-;first\n",
            b"6,101,2000,-;second\n",
            BrokenPipeError,
            b"3,109,9000,-;" + XID79.encode() + b"\n SUBSYSTEM=pci\n",
            b"6,110,9100,-;after the gap\n",
        ]
        self.closed = False

    def read(self, size: int = -1, /) -> bytes:
        if not self.reads:
            return b""
        item = self.reads.pop(0)
        if isinstance(item, bytes):
            return item
        raise item()

    def close(self) -> None:
        self.closed = True


@pytest.mark.asyncio
async def test_kmsg_overrun_is_logged_with_the_number_missed(env: Env, caplog: pytest.LogCaptureFixture) -> None:
    stub = OverrunKmsg()
    source = KmsgSource("/dev/kmsg", **env.common(), opener=lambda _p: stub, boot_time=BOOT, boot_id="b1")
    with caplog.at_level("WARNING", logger="trainmedic.watchers.kernel"):
        async with running(source):
            lines = await env.wait_lines(4)
    assert lines == ["first", "second", XID79, "after the gap"]
    assert source.missed == 7
    assert "7 kernel messages were overwritten" in caplog.text
    assert "(EPIPE)" in caplog.text
    assert env.telemetry.watch_errors.labels(source="kmsg", kind="overrun")._value.get() == 7
    assert stub.closed


@pytest.mark.asyncio
async def test_kmsg_junk_lines_are_passed_on_and_counted(env: Env) -> None:
    dev = env.tmp / "kmsg"
    dev.write_bytes(b"6,1,10,-;good\nthis is not a record\n\xff\xfe\n6,2,20,-;also good\n")
    source = KmsgSource(dev, **env.common(), start_at="start", boot_time=BOOT, boot_id="b1")
    async with running(source):
        lines = await env.wait_lines(4)
    assert sorted(lines) == sorted(["good", "also good", "this is not a record", "\ufffd\ufffd"])
    assert source.malformed == 2


@pytest.mark.parametrize(("boot_id", "expected"), [("b1", ["third"]), ("b2", ["first", "second", "third"])])
@pytest.mark.asyncio
async def test_kmsg_resumes_after_the_remembered_sequence_of_the_same_boot(
    env: Env, boot_id: str, expected: list[str]
) -> None:
    dev = env.tmp / "kmsg"
    store = env.tmp / "kernel-positions.json"
    dev.write_text("6,1,10,-;first\n6,2,20,-;second\n")
    first = KmsgSource(dev, **env.common(), start_at="start", position_store=store, boot_time=BOOT, boot_id="b1")
    async with running(first):
        await env.wait_lines(2)
        # The cursor is recorded once the publish is acknowledged, just after the lines reach the bus.
        for _ in range(500):
            if first.positions.store is not None and first.positions.store.cursors.get("kmsg"):
                break
            await asyncio.sleep(0.01)
    assert json.loads(store.read_text())["cursors"]["kmsg"] == {"boot_id": "b1", "seq": 2}
    with dev.open("a") as f:
        f.write("6,3,30,-;third\n")
    env.bus = MemoryBus(partitions=1)
    again = KmsgSource(dev, **env.common(), start_at="end", position_store=store, boot_time=BOOT, boot_id=boot_id)
    async with running(again):
        await env.wait_lines(len(expected))
        await asyncio.sleep(0.2)
    assert await env.lines() == expected


@pytest.mark.asyncio
async def test_kernel_events_never_exceed_the_bus_message_limit(env: Env) -> None:
    # Control characters come escaped from kmsg and are escaped again (\\u0001) in JSON: 6 bytes each.
    dev = env.tmp / "kmsg"
    escaped = "\\x01" * 16000
    dev.write_text("".join(f"6,{k},{k},-;{escaped}\n" for k in range(1, 61)))
    source = KmsgSource(dev, **env.common(), start_at="start", boot_time=BOOT, boot_id="b1", batch_bytes=64 << 20)
    async with running(source):
        lines = await env.wait_lines(60)
    assert lines == ["\x01" * 16000] * 60
    sizes = [len(ev.encode()) for ev in await env.events()]
    assert all(s <= MAX_MESSAGE_BYTES for s in sizes)


@pytest.mark.asyncio
async def test_kmsg_that_cannot_be_opened_is_a_clear_error(env: Env) -> None:
    source = KmsgSource(env.tmp / "no-such-kmsg", **env.common())
    with pytest.raises(KernelSourceUnavailable, match=r"cannot open .*no-such-kmsg"):
        await source.run()


# -- fan-out to jobs --------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_one_copy_per_job_on_the_node_with_the_same_id(env: Env) -> None:
    env.index.update_pod(pod("a-0", "job-a", NODE))
    env.index.update_pod(pod("a-1", "job-a", NODE))
    env.index.update_pod(pod("b-0", "job-b", NODE))
    env.index.update_pod(pod("c-0", "job-c", "another-node"))
    env.bus = MemoryBus(partitions=4)
    source = KmsgSource(KMSG, **env.common(), start_at="start", boot_time=BOOT, boot_id="b1", batch_lines=100)
    async with running(source):
        async with asyncio.timeout(10):
            while len(await env.events()) < 2:
                await asyncio.sleep(0.01)
        await asyncio.sleep(0.1)
    events = await env.events()
    by_key = {ev.key: ev for ev in events}
    job_a, job_b = JobRef(namespace="train", name="job-a"), JobRef(namespace="train", name="job-b")
    assert set(by_key) == {job_a.key, job_b.key}
    assert len({ev.id for ev in events}) == 1
    payloads = {ev.key: ev.payload for ev in events}
    assert payloads[job_a.key].job == job_a  # type: ignore[union-attr]
    assert payloads[job_b.key].job == job_b  # type: ignore[union-attr]
    assert payloads[job_a.key].lines == payloads[job_b.key].lines  # type: ignore[union-attr]


@pytest.mark.asyncio
async def test_keyed_by_the_node_when_no_job_runs_there(env: Env) -> None:
    env.index.update_pod(pod("c-0", "job-c", "another-node"))
    source = KmsgSource(KMSG, **env.common(), start_at="start", boot_time=BOOT, boot_id="b1")
    async with running(source):
        await env.wait_lines(15)
    events = await env.events()
    assert {ev.key for ev in events} == {node_key(NODE)}
    assert all(ev.payload.job is None for ev in events)  # type: ignore[union-attr]


# -- a kernel log file ------------------------------------------------------------------------------

SYSLOG = "Mar 27 17:40:36 gpu-node-a kernel: "


def kern_lines(texts: list[str]) -> str:
    return "".join(SYSLOG + t + "\n" for t in texts)


@pytest.mark.asyncio
async def test_kernel_file_follows_rotation_and_truncation(env: Env, engine: Engine) -> None:
    path = env.tmp / "kern.log"
    path.write_text(kern_lines(["old line before the agent started"]))
    source = KernelFileSource(path, **env.common())
    await source.poll_once()
    with path.open("a") as f:
        f.write(kern_lines(["NVRM: Xid (PCI:0000:3b:00): 79, pid=2876, name=python, GPU has fallen off the bus."]))
    await source.poll_once()
    # logrotate (create): rename, a new file; the old one gets one last write
    os.rename(path, env.tmp / "kern.log.1")
    with (env.tmp / "kern.log.1").open("a") as f:
        f.write(kern_lines(["late line in the rotated file"]))
    path.write_text(kern_lines(["Out of memory: Killed process 1440763 (perl) total-vm:87033376kB"]))
    await source.poll_once()
    # copytruncate
    path.write_text(kern_lines(["after truncation"]))
    await source.poll_once()
    lines = await env.lines()
    assert lines == [
        SYSLOG + XID79,
        SYSLOG + "late line in the rotated file",
        SYSLOG + "Out of memory: Killed process 1440763 (perl) total-vm:87033376kB",
        SYSLOG + "after truncation",
    ]
    found = findings(engine, lines)
    assert ("nvidia.xid", "xid:79") in found
    assert ("generic.host_oom.kernel_oom_killer", "oom_killer") in found
    batches = await env.batches()
    assert [b.first_line for b in batches] == [2, 3, 1, 1]
    assert all(b.source == "kernel_file" for b in batches)


@pytest.mark.asyncio
async def test_kernel_file_times_come_from_rfc3339_stamps(env: Env) -> None:
    path = env.tmp / "messages"
    path.write_text("")
    source = KernelFileSource(path, **env.common(), start_at="start")
    with path.open("a") as f:
        f.write("2024-04-29T14:55:41.679700+02:00 gpu-node-a kernel: Out of memory: Killed process 1 (x)\n")
        f.write(SYSLOG + "no usable stamp\n")
    await source.poll_once()
    (b,) = await env.batches()
    assert b.times[0] == pytest.approx(1714395341.6797)
    assert b.times[1] > 1714395341.6797  # the time it was read


@pytest.mark.asyncio
async def test_kernel_file_that_appears_later_is_read_from_its_start(env: Env) -> None:
    path = env.tmp / "kern.log"
    source = KernelFileSource(path, **env.common())
    await source.poll_once()
    path.write_text(kern_lines(["first line of a new file"]))
    await source.poll_once()
    assert await env.lines() == [SYSLOG + "first line of a new file"]


@pytest.mark.asyncio
async def test_kernel_file_resumes_from_the_position_store(env: Env) -> None:
    path = env.tmp / "kern.log"
    store = env.tmp / "pos.json"
    path.write_text(kern_lines(["one", "two"]))
    first = KernelFileSource(path, **env.common(), start_at="start", position_store=store)
    await first.poll_once()
    await first.positions.save(force=True)
    with path.open("a") as f:
        f.write(kern_lines(["three"]))
    os.rename(path, env.tmp / "kern.log.1")  # rotated while the agent was down
    path.write_text(kern_lines(["four"]))
    again = KernelFileSource(path, **env.common(), position_store=store)
    await again.poll_once()
    assert await env.lines() == [SYSLOG + t for t in ("one", "two", "three", "four")]


# -- journald ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "message", "t", "cursor"),
    [
        (
            '{"MESSAGE":"hello","__REALTIME_TIMESTAMP":"1714395341678628","__CURSOR":"s=1;i=2"}',
            "hello",
            1714395341.678628,
            "s=1;i=2",
        ),
        ('{"MESSAGE":[78,86,82,77,255]}', "NVRM\ufffd", None, None),
        ('{"MESSAGE":["first",[115,101,99,111,110,100]]}', "first\nsecond", None, None),
        ('{"MESSAGE":"a\\nb","__REALTIME_TIMESTAMP":"nope"}', "a\nb", None, None),
    ],
    ids=["string", "byte-array", "repeated-field", "bad-time"],
)
def test_journal_entries_parse(line: str, message: str, t: float | None, cursor: str | None) -> None:
    entry = parse_journal_entry(line)
    assert entry is not None
    assert entry.message == message
    assert entry.time == (pytest.approx(t) if t is not None else None)
    assert entry.cursor == cursor


@pytest.mark.parametrize(
    "line", ["not json", "[1, 2]", '{"__CURSOR": "no message"}', '{"MESSAGE": 42}', '{"MESSAGE": [1, "x", {}]}']
)
def test_journal_junk_is_not_an_entry(line: str) -> None:
    entry = parse_journal_entry(line)
    assert entry is None or entry.message == "x"


def test_recorded_journal_lines_parse() -> None:
    entries = [parse_journal_entry(ln) for ln in JOURNAL.read_text().splitlines()]
    assert all(e is not None and e.cursor and e.time for e in entries)
    messages = [e.message for e in entries if e is not None]
    assert XID79 in messages
    assert "Out of memory: Kill process 89746 (python) score 1031 or sacrifice child\ufffd" in messages


FAKE_JOURNALCTL = """\
import os, sys, time
log = os.environ["FAKE_JOURNAL_LOG"]
with open(log, "a") as f:
    f.write(" ".join(sys.argv[1:]) + "\\n")
runs = sum(1 for _ in open(log))
lines = open(os.environ["FAKE_JOURNAL_DATA"]).read().splitlines()
half = len(lines) // 2
if runs == 1:
    print("\\n".join(lines[:half]), flush=True)
    print("Failed to follow: simulated failure", file=sys.stderr, flush=True)
    sys.exit(1)
print("\\n".join(lines[half:]), flush=True)
time.sleep(3600)
"""


@pytest.fixture
def fake_journalctl(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Path, Path]]:
    script = tmp_path / "journalctl"
    script.write_text(f"#!{sys.executable}\n" + FAKE_JOURNALCTL)
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    log = tmp_path / "argv.log"
    monkeypatch.setenv("FAKE_JOURNAL_LOG", str(log))
    monkeypatch.setenv("FAKE_JOURNAL_DATA", str(JOURNAL))
    yield script, log


@pytest.mark.asyncio
async def test_journald_restarts_after_the_last_cursor(
    env: Env, engine: Engine, fake_journalctl: tuple[Path, Path], caplog: pytest.LogCaptureFixture
) -> None:
    script, argv_log = fake_journalctl
    store = env.tmp / "journal-pos.json"
    source = JournaldSource(**env.common(), command=[str(script)], position_store=store, backoff_initial=0.05)
    with caplog.at_level("WARNING", logger="trainmedic.watchers.kernel"):
        async with running(source):
            lines = await env.wait_lines(13)
            async with asyncio.timeout(10):
                while not store.exists():
                    await asyncio.sleep(0.01)
    entries = [parse_journal_entry(ln) for ln in JOURNAL.read_text().splitlines()]
    runs = argv_log.read_text().splitlines()
    assert runs[0] == "-k -f -o json --all --no-pager --no-tail"
    half = len(entries) // 2
    assert runs[1] == f"-k -f -o json --all --no-pager --no-tail --after-cursor={entries[half - 1].cursor}"  # type: ignore[union-attr]
    assert "simulated failure" in caplog.text
    assert len(lines) == len(set(lines)) == 13
    found = findings(engine, lines)
    assert ("nvidia.xid", "xid:79") in found
    assert ("generic.host_oom.kernel_oom_killer", "oom_killer") in found
    assert ("nvidia.gpu_fallen_off_bus", "gpu_fallen_off_bus") in found
    b = (await env.batches())[0]
    assert b.source == "journald"
    assert b.times[0] == pytest.approx(1714395341.678628)
    assert json.loads(store.read_text())["cursors"]["journald"] == entries[-1].cursor  # type: ignore[union-attr]


@pytest.mark.asyncio
async def test_journald_sets_aside_junk_and_oversized_entries(
    env: Env, fake_journalctl: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    script, _ = fake_journalctl
    good = JOURNAL.read_text().splitlines()
    data = env.tmp / "journal.json"
    data.write_text("\n".join([good[0], "not json at all", "[1, 2]", good[1], "x" * (3 << 20), good[6]]) + "\n")
    monkeypatch.setenv("FAKE_JOURNAL_DATA", str(data))
    source = JournaldSource(**env.common(), command=[str(script)], backoff_initial=0.01, max_entry_bytes=1 << 20)
    async with running(source):
        lines = await env.wait_lines(3)
        await asyncio.sleep(0.1)
    assert lines[-1] == XID79
    assert len(await env.lines()) == 3
    assert source.malformed == 3


@pytest.mark.asyncio
async def test_kernel_file_run_follows_until_cancelled(env: Env) -> None:
    path = env.tmp / "kern.log"
    store = env.tmp / "pos.json"
    path.write_text("")
    source = KernelFileSource(path, **env.common(), poll_interval=0.01, position_store=store)
    async with running(source):
        await asyncio.sleep(0.05)
        with path.open("a") as f:
            f.write(kern_lines([XID79]))
        lines = await env.wait_lines(1)
    assert lines == [SYSLOG + XID79]
    (pos,) = json.loads(store.read_text())["files"].values()
    assert pos["offset"] == path.stat().st_size


@pytest.mark.parametrize(("start_at", "flag"), [("start", "--no-tail"), ("end", "--lines=0")])
def test_journald_command_line(env: Env, start_at: Any, flag: str) -> None:
    source = JournaldSource(**env.common(), start_at=start_at)
    assert source.argv() == ["journalctl", "-k", "-f", "-o", "json", "--all", "--no-pager", flag]
    source.cursor = "s=1;i=2"
    assert source.argv()[-2:] == ["--no-tail", "--after-cursor=s=1;i=2"]


@pytest.mark.asyncio
async def test_journald_without_journalctl_is_a_clear_error(env: Env) -> None:
    source = JournaldSource(**env.common(), command=[str(env.tmp / "no-such-journalctl")])
    with pytest.raises(KernelSourceUnavailable, match="not found: journald kernel messages need journalctl"):
        await source.run()


@pytest.mark.asyncio
async def test_journald_smoke_with_the_real_journalctl(env: Env) -> None:
    if shutil.which("journalctl") is None:
        pytest.skip("journalctl is not installed here")
    source = JournaldSource(**env.common(), start_at="end", backoff_initial=0.05)
    async with running(source) as task:
        await asyncio.sleep(1.0)
        assert not task.done(), "journalctl -k -f should keep running"
    assert all(isinstance(b, KernelBatch) for b in await env.batches())
