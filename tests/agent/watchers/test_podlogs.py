"""Training pods' logs followed through the API (agent/watchers/podlogs.py). The emulator serves the
pods/log subresource through the test's kubelet stand-in (follow, previous, timestamps,
sinceSeconds, tailLines), so restarts, stream drops and deletions are played for real."""

from __future__ import annotations

import time
from typing import Any

import pytest
from servers.kube import Cluster, EventRecorder, wait_until

from trainmedic.agent.watchers.podlogs import PodLogFollower, container_state, parse_log_line
from trainmedic.events import JobRef, LogBatch

from .conftest import StartFollower


def lines_of(recorder: EventRecorder, pod: str | None = None) -> list[str]:
    return [ln for b in recorder.payloads(LogBatch) if pod is None or b.pod == pod for ln in b.lines]


async def training_pod(cluster: Cluster, *, completions: int = 1, start: bool = True) -> dict[str, Any]:
    job = await cluster.create_job("train", "llama", completions=completions)
    pods = await cluster.create_job_pods(job)
    pod = pods[-1]
    await cluster.bind(pod, "gpu-1")
    if start:
        await cluster.start(pod, events=False)
    return pod


@pytest.mark.asyncio
async def test_follows_a_training_container_with_job_rank_and_node(
    cluster: Cluster, start_follower: StartFollower, recorder: EventRecorder
) -> None:
    follower = await start_follower()
    pod = await training_pod(cluster, completions=2)
    await wait_until(lambda: cluster.open_log_streams(pod) == 1, what="the log followed")
    cluster.write_log(pod, "trainer", "step 1 loss 2.31", "step 2 loss 2.12")
    batch = await recorder.wait_for(lambda p: isinstance(p, LogBatch))
    assert batch.lines == ["step 1 loss 2.31", "step 2 loss 2.12"]
    assert (batch.namespace, batch.pod, batch.container, batch.node) == (
        "train",
        pod["metadata"]["name"],
        "trainer",
        "gpu-1",
    )
    assert (batch.job, batch.rank, batch.file, batch.first_line) == (
        JobRef(namespace="train", name="llama"),
        1,
        "api",
        1,
    )
    assert len(batch.times) == 2 and abs(batch.times[0] - time.time()) < 30
    assert recorder.events[-1][1].key == "job:train/llama"
    cluster.write_log(pod, "trainer", "step 3 loss 1.98")
    nxt = await recorder.wait_for(lambda p: isinstance(p, LogBatch) and p.first_line == 3)
    assert nxt.lines == ["step 3 loss 1.98"]
    (req,) = cluster.log_requests
    assert (req["follow"], req["timestamps"], req["container"]) == ("true", "true", "trainer")
    assert list(follower.followers) == [("train", pod["metadata"]["name"], "trainer")]


@pytest.mark.parametrize(("start_at", "expected"), [("end", ["new"]), ("start", ["old", "new"])])
@pytest.mark.asyncio
async def test_a_container_running_before_the_follower_starts(
    start_at: str, expected: list[str], cluster: Cluster, start_follower: StartFollower, recorder: EventRecorder
) -> None:
    pod = await training_pod(cluster)
    cluster.write_log(pod, "trainer", "old", at_ns=time.time_ns() - 3_600_000_000_000)
    # Its start is long past: patch it so (the stand-in stamps "now").
    p = cluster.pods[("train", pod["metadata"]["name"])]
    p.containers["trainer"].state = {"running": {"startedAt": "2025-01-01T00:00:00Z"}}
    await cluster.touch_pod(pod)
    await start_follower(start_at=start_at)
    await wait_until(lambda: cluster.open_log_streams(pod) == 1, what="the log followed")
    cluster.write_log(pod, "trainer", "new")
    await recorder.wait_for(lambda p: isinstance(p, LogBatch) and "new" in p.lines)
    assert lines_of(recorder) == expected


@pytest.mark.asyncio
async def test_a_restarted_container_is_followed_in_its_new_instance(
    cluster: Cluster, start_follower: StartFollower, recorder: EventRecorder
) -> None:
    await start_follower()
    pod = await training_pod(cluster)
    await wait_until(lambda: cluster.open_log_streams(pod) == 1, what="the log followed")
    cluster.write_log(pod, "trainer", "epoch 1", "CUDA out of memory. Tried to allocate 2.00 GiB")
    await recorder.wait_for(lambda p: isinstance(p, LogBatch) and len(lines_of(recorder)) == 2)
    await cluster.terminate(pod, "trainer", reason="OOMKilled", exit_code=137, restart=True)
    await cluster.restart(pod)
    await wait_until(lambda: cluster.open_log_streams(pod) == 1, what="the new instance followed")
    cluster.write_log(pod, "trainer", "resumed from checkpoint step 1200")
    fresh = await recorder.wait_for(lambda p: isinstance(p, LogBatch) and "resumed" in p.lines[0])
    assert fresh.first_line == 1  # a new instance's log starts over
    assert lines_of(recorder) == [
        "epoch 1",
        "CUDA out of memory. Tried to allocate 2.00 GiB",
        "resumed from checkpoint step 1200",
    ]


@pytest.mark.asyncio
async def test_a_dropped_stream_resumes_without_duplicates(
    cluster: Cluster, start_follower: StartFollower, recorder: EventRecorder
) -> None:
    await start_follower()
    pod = await training_pod(cluster)
    await wait_until(lambda: cluster.open_log_streams(pod) == 1, what="the log followed")
    stamp = time.time_ns()
    cluster.write_log(pod, "trainer", "a", at_ns=stamp)
    cluster.write_log(pod, "trainer", "b", "c", at_ns=stamp + 1)  # two lines, one timestamp
    await recorder.wait_for(lambda p: isinstance(p, LogBatch) and "c" in p.lines)
    assert cluster.drop_log_streams(pod) == 1
    cluster.write_log(pod, "trainer", "c2", at_ns=stamp + 1)  # the same stamp again, written while disconnected
    cluster.write_log(pod, "trainer", "d")
    await recorder.wait_for(lambda p: isinstance(p, LogBatch) and "d" in p.lines)
    await wait_until(lambda: cluster.open_log_streams(pod) == 1, what="following again")
    cluster.write_log(pod, "trainer", "e")
    last = await recorder.wait_for(lambda p: isinstance(p, LogBatch) and "e" in p.lines)
    assert lines_of(recorder) == ["a", "b", "c", "c2", "d", "e"]
    assert last.first_line == 6
    resumed = cluster.log_requests[1]
    assert "sinceSeconds" in resumed and "tailLines" not in resumed


@pytest.mark.asyncio
async def test_lines_of_an_instance_that_crashed_unseen_are_read_afterwards(
    cluster: Cluster, start_follower: StartFollower, recorder: EventRecorder
) -> None:
    await start_follower()
    pod = await training_pod(cluster, start=False)
    # Start, log and crash in one go: whether the follower saw it running or not, every line once.
    await cluster.start(pod, events=False)
    cluster.write_log(pod, "trainer", "RuntimeError: NCCL error: unhandled system error")
    await cluster.terminate(pod, "trainer", reason="Error", exit_code=1, restart=True)
    await recorder.wait_for(lambda p: isinstance(p, LogBatch))
    await cluster.restart(pod)
    await wait_until(lambda: cluster.open_log_streams(pod) == 1, what="the new instance followed")
    cluster.write_log(pod, "trainer", "second run")
    await recorder.wait_for(lambda p: isinstance(p, LogBatch) and "second run" in p.lines)
    assert lines_of(recorder) == ["RuntimeError: NCCL error: unhandled system error", "second run"]


@pytest.mark.parametrize(("catch_up_s", "expected"), [(60.0, ["fatal: Xid 79"]), (0.0, [])], ids=["recent", "too-old"])
@pytest.mark.asyncio
async def test_a_crash_just_before_the_follower_started(
    catch_up_s: float, expected: list[str], cluster: Cluster, start_follower: StartFollower, recorder: EventRecorder
) -> None:
    pod = await training_pod(cluster)
    cluster.write_log(pod, "trainer", "fatal: Xid 79")
    await cluster.terminate(pod, "trainer", reason="Error", exit_code=1, restart=True)
    await start_follower(catch_up_s=catch_up_s)
    await cluster.restart(pod)
    await wait_until(lambda: cluster.open_log_streams(pod) == 1, what="the new instance followed")
    cluster.write_log(pod, "trainer", "marker")
    await recorder.wait_for(lambda p: isinstance(p, LogBatch) and "marker" in p.lines)
    assert lines_of(recorder) == [*expected, "marker"]
    assert ("previous" in cluster.log_requests[0]) == bool(expected)


@pytest.mark.asyncio
async def test_following_stops_when_the_pod_goes_away(
    cluster: Cluster, start_follower: StartFollower, recorder: EventRecorder
) -> None:
    follower = await start_follower()
    pod = await training_pod(cluster)
    await wait_until(lambda: cluster.open_log_streams(pod) == 1, what="the log followed")
    p = cluster.pods[("train", pod["metadata"]["name"])]
    stream = p.containers["trainer"].instances[-1]
    await cluster.delete_pod(pod)
    await wait_until(lambda: not follower.followers, what="follower stopped")
    requests = len(cluster.log_requests)
    assert not stream.streams
    await cluster.create_pod("train", "unrelated")  # the follower is alive and quiet
    await wait_until(lambda: len(follower._handler.pods) == 0, what="pod forgotten")
    assert len(cluster.log_requests) == requests


@pytest.mark.asyncio
async def test_bare_pods_are_not_followed(cluster: Cluster, start_follower: StartFollower) -> None:
    follower = await start_follower()
    await cluster.create_pod("train", "notebook")
    await cluster.bind("train/notebook", "gpu-1")
    await cluster.start("train/notebook", events=False)
    pod = await training_pod(cluster)
    await wait_until(lambda: cluster.open_log_streams(pod) == 1, what="the training pod followed")
    assert [k[1] for k in follower.followers] == [pod["metadata"]["name"]]
    assert {r["pod"] for r in cluster.log_requests} == {pod["metadata"]["name"]}


@pytest.mark.asyncio
async def test_batches_hold_at_most_512_lines_and_long_lines_are_cut(
    cluster: Cluster, start_follower: StartFollower, recorder: EventRecorder
) -> None:
    await start_follower(max_line_bytes=1000)
    pod = await training_pod(cluster)
    await wait_until(lambda: cluster.open_log_streams(pod) == 1, what="the log followed")
    cluster.write_log(pod, "trainer", *(f"line {i}" for i in range(1, 1201)), "x" * 5000, "tail\x00\u00e9")
    await recorder.wait_for(lambda p: isinstance(p, LogBatch) and "tail\x00\u00e9" in p.lines)
    batches = recorder.payloads(LogBatch)
    assert max(len(b.lines) for b in batches) <= 512
    assert [b.first_line for b in batches] == [
        1,
        *(1 + sum(len(x.lines) for x in batches[:i]) for i in range(1, len(batches))),
    ]
    lines = lines_of(recorder)
    assert len(lines) == 1202 and lines[0] == "line 1" and lines[1199] == "line 1200"
    assert lines[1200].endswith(" [truncated]") and len(lines[1200]) < 1100


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (b"2024-01-02T03:04:05.123456789Z hello world", (1704164645123456789, "hello world")),
        (b"2024-01-02T03:04:05Z x", (1704164645000000000, "x")),
        (b"2024-01-02T03:04:05.5Z trimmed fraction", (1704164645500000000, "trimmed fraction")),
        (b"2024-01-02T04:04:05.5+01:00 offset", (1704164645500000000, "offset")),
        (b"no stamp here", (None, "no stamp here")),
        (b"\xff\xfe binary", (None, "\ufffd\ufffd binary")),
        (b"2024-01-02T03:04:05Z crlf\r", (1704164645000000000, "crlf")),
    ],
    ids=["nano", "seconds", "trimmed", "offset", "unstamped", "binary", "crlf"],
)
def test_parse_log_line(raw: bytes, expected: tuple[int | None, str]) -> None:
    assert parse_log_line(raw) == expected


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        (
            {"restartCount": 0, "containerID": "c://a", "state": {"running": {"startedAt": "2025-01-01T00:00:00Z"}}},
            ("running", "c://a", None),
        ),
        (
            {
                "restartCount": 2,
                "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                "lastState": {"terminated": {"exitCode": 137, "containerID": "c://b"}},
            },
            ("waiting", "c://b", "c://b"),
        ),
        (
            {
                "restartCount": 3,
                "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                "lastState": {"terminated": {"exitCode": 1}},
            },
            ("waiting", "#3", "#3"),
        ),
        (
            {
                "restartCount": 1,
                "containerID": "c://c",
                "state": {"running": {}},
                "lastState": {"terminated": {"exitCode": 1}},
            },
            ("running", "c://c", "#0"),
        ),
        (
            {"restartCount": 0, "state": {"terminated": {"exitCode": 0, "containerID": "c://d"}}},
            ("terminated", "c://d", None),
        ),
        ({"restartCount": "x", "state": "nonsense"}, ("waiting", None, None)),
    ],
    ids=["running", "crashloop", "crashloop-no-id", "restarted", "terminated", "malformed"],
)
def test_container_state_names_the_instances_the_kubelet_serves(
    status: dict[str, Any], expected: tuple[str, str | None, str | None]
) -> None:
    st = container_state(status)
    assert (st.state, st.current_id, st.last_id) == expected


def test_follower_is_constructible_without_a_loop_running() -> None:
    # run.py builds components before the loop runs them.
    from kubernetes.client import ApiClient, Configuration

    from trainmedic.agent.bus.memory import MemoryBus
    from trainmedic.agent.telemetry import Telemetry

    f = PodLogFollower(ApiClient(Configuration(host="http://127.0.0.1:1")), bus=MemoryBus(), telemetry=Telemetry())
    assert not f.ready.is_set() and not f.followers
