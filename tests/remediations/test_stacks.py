"""Stack dumps of a hung job: exec over the Kubernetes websocket protocol (the emulator's pods/exec),
py-spy when the image has it, the SIGUSR1 / faulthandler fallback read back from the log, and the
reasons recorded when neither works. The /proc listing and the SIGUSR1 path also run for real
against a local Python process (a "container" made of the test's own child processes)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from servers.kube import Cluster, ExecReply, FakeProcess, KubeEmulator, require_kmock

from trainmedic.remediations.kube import KubeOps
from trainmedic.remediations.stacks import (
    PROCESS_LIST_SCRIPT,
    ExecResult,
    StackMethod,
    StackSettings,
    dump_stacks,
    exec_in_pod,
    faulthandler_blocks,
    parse_process_list,
)

PY_SPY_DUMP = """Process 1: python train.py
Python v3.10.12 (/usr/bin/python3.10)

Thread 0x7F5E3A8E7740 (active): "MainThread"
    all_reduce (torch/distributed/distributed_c10d.py:2050)
    train_step (train.py:88)
    <module> (train.py:120)
"""
FAST = StackSettings(settle_s=0.05, log_polls=20)


# -- through the emulator -----------------------------------------------------------------------------


class ApiSource:
    """exec over the API (remediations.stacks.exec_in_pod), logs through KubeOps."""

    def __init__(self, api: Any) -> None:
        self.api = api
        self.ops = KubeOps(api, attempts=1)

    async def exec(
        self, namespace: str, pod: str, container: str, command: list[str], *, timeout_s: float
    ) -> ExecResult:
        return await exec_in_pod(self.api, namespace, pod, container, command, timeout_s=timeout_s)

    async def pod_log(
        self,
        namespace: str,
        pod: str,
        container: str,
        *,
        tail_lines: int,
        previous: bool = False,
        limit_bytes: int = 1 << 20,
    ) -> str:
        return await self.ops.pod_log(
            namespace, pod, container, tail_lines=tail_lines, previous=previous, limit_bytes=limit_bytes
        )


@pytest_asyncio.fixture
async def kube() -> AsyncIterator[KubeEmulator]:
    require_kmock()
    async with KubeEmulator() as k:
        yield k


@pytest_asyncio.fixture
async def running(kube: KubeEmulator) -> tuple[Cluster, list[dict[str, Any]]]:
    """A 2-pod Job, both pods running on gpu-1."""
    cluster = Cluster(kube)
    await cluster.add_node("gpu-1", gpus=8)
    job = await cluster.create_job("train", "llama", completions=2)
    pods = await cluster.create_job_pods(job)
    for p in pods:
        await cluster.bind(p, "gpu-1")
        await cluster.start(p, events=False)
        cluster.write_log(p, "trainer", "step 1 loss 2.3", "step 2 loss 2.2")
    objs = [await kube.call("GET", f"/api/v1/namespaces/train/pods/{p['metadata']['name']}") for p in pods]
    return cluster, objs


def _name(pod: dict[str, Any]) -> str:
    return str(pod["metadata"]["name"])


@pytest.mark.asyncio
async def test_py_spy_present_gives_its_dump(kube: KubeEmulator, running: tuple[Cluster, list[dict[str, Any]]]) -> None:
    cluster, pods = running

    def container(name: str, argv: list[str]) -> ExecReply:
        if argv[:2] == ["py-spy", "dump"]:
            return ExecReply(stdout=PY_SPY_DUMP)
        return ExecReply(exit_code=127, stderr="not expected")

    for p in pods:
        cluster.on_exec(p, container)
    dumps = await dump_stacks(ApiSource(kube.api_client()), pods, timeout_s=10, settings=FAST)
    assert set(dumps) == {_name(p) for p in pods}
    for d in dumps.values():
        assert d.method is StackMethod.PY_SPY and d.reason is None
        assert d.container == "trainer" and d.pids == [1]
        assert "all_reduce (torch/distributed/distributed_c10d.py:2050)" in d.text
    assert {r["command"][0] for r in cluster.exec_requests} == {"py-spy"}
    assert all(r["container"] == "trainer" for r in cluster.exec_requests)


@pytest.mark.asyncio
async def test_without_py_spy_the_sigusr1_dump_is_read_back_from_the_log(
    kube: KubeEmulator, running: tuple[Cluster, list[dict[str, Any]]]
) -> None:
    cluster, pods = running
    dumps = await dump_stacks(ApiSource(kube.api_client()), pods[:1], timeout_s=10, settings=FAST)
    d = dumps[_name(pods[0])]
    assert d.method is StackMethod.SIGUSR1, d.attempts
    assert d.pids == [1] and d.reason is None
    assert d.text.startswith("Thread 0x00007f5e2effd640 (most recent call first):")
    assert 'File "/workspace/train.py", line 88 in train_step' in d.text
    # The dump comes from the log, without the training lines around it.
    assert "step 1 loss" not in d.text
    commands = [r["command"] for r in cluster.exec_requests]
    assert commands == [
        ["py-spy", "dump", "--pid", "1"],
        ["sh", "-c", PROCESS_LIST_SCRIPT],
        ["sh", "-c", "kill -USR1 1"],
    ]


@pytest.mark.asyncio
async def test_a_second_dump_is_told_apart_from_the_first(
    kube: KubeEmulator, running: tuple[Cluster, list[dict[str, Any]]]
) -> None:
    """A process stuck in the same place prints the same stack twice: the second dump still finds
    its own (the lines after the log's end before the signal), not nothing."""
    _cluster, pods = running
    source = ApiSource(kube.api_client())
    first = await dump_stacks(source, pods[:1], timeout_s=10, settings=FAST)
    second = await dump_stacks(source, pods[:1], timeout_s=10, settings=FAST)
    assert first[_name(pods[0])].method is second[_name(pods[0])].method is StackMethod.SIGUSR1
    assert second[_name(pods[0])].text == first[_name(pods[0])].text


@pytest.mark.asyncio
async def test_exec_forbidden_is_recorded(kube: KubeEmulator, running: tuple[Cluster, list[dict[str, Any]]]) -> None:
    cluster, pods = running
    cluster.forbid_exec(pods[0])
    dumps = await dump_stacks(ApiSource(kube.api_client()), pods, timeout_s=10, settings=FAST)
    d = dumps[_name(pods[0])]
    assert d.method is None and d.reason is not None
    assert "not allowed" in d.reason.en and "403" in d.reason.en and "pods/exec" in d.reason.en
    assert "exec" in d.reason.zh
    # One refused try, nothing more; the other pod is dumped as usual.
    assert len(d.attempts) == 1
    assert dumps[_name(pods[1])].method is StackMethod.SIGUSR1


@pytest.mark.parametrize(
    ("processes", "expected"),
    [
        ([FakeProcess(1, "python train.py", handles_sigusr1=False)], "SIGUSR1"),
        ([FakeProcess(1, "/bin/bash /entrypoint.sh")], "no Python process"),
    ],
    ids=["no-handler", "no-python"],
)
@pytest.mark.asyncio
async def test_no_signal_is_sent_to_a_process_that_would_die_of_it(
    kube: KubeEmulator,
    running: tuple[Cluster, list[dict[str, Any]]],
    processes: list[FakeProcess],
    expected: str,
) -> None:
    cluster, pods = running
    cluster.set_processes(pods[0], "trainer", processes)
    dumps = await dump_stacks(ApiSource(kube.api_client()), pods[:1], timeout_s=10, settings=FAST)
    d = dumps[_name(pods[0])]
    assert d.method is None and d.reason is not None and expected in d.reason.en
    assert not any("kill" in " ".join(r["command"]) for r in cluster.exec_requests)


@pytest.mark.asyncio
async def test_a_container_without_shell_or_py_spy(
    kube: KubeEmulator, running: tuple[Cluster, list[dict[str, Any]]]
) -> None:
    cluster, pods = running
    missing = (
        "OCI runtime exec failed: exec failed: unable to start container process: "
        'exec: "{}": executable file not found in $PATH: unknown'
    )

    cluster.on_exec(pods[0], lambda _c, argv: ExecReply(exit_code=None, failure=missing.format(argv[0])))
    dumps = await dump_stacks(ApiSource(kube.api_client()), pods[:1], timeout_s=10, settings=FAST)
    d = dumps[_name(pods[0])]
    assert d.method is None and d.reason is not None
    assert d.reason.en == "the container has neither py-spy nor a shell"


@pytest.mark.asyncio
async def test_a_pod_without_running_container_is_not_exec_d(
    kube: KubeEmulator, running: tuple[Cluster, list[dict[str, Any]]]
) -> None:
    cluster, pods = running
    await cluster.terminate(pods[0], "trainer", reason="Error", exit_code=1)
    obj = await kube.call("GET", f"/api/v1/namespaces/train/pods/{_name(pods[0])}")
    dumps = await dump_stacks(ApiSource(kube.api_client()), [obj], timeout_s=10, settings=FAST)
    assert dumps[_name(pods[0])].reason is not None
    assert dumps[_name(pods[0])].reason.en == "no running container in the pod"  # type: ignore[union-attr]
    assert cluster.exec_requests == []


# -- exec_in_pod ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        (ExecReply(stdout="out\n", stderr="err\n"), ExecResult(stdout="out\n", stderr="err\n", exit_code=0)),
        (ExecReply(stderr="boom\n", exit_code=3), ExecResult(stderr="boom\n", exit_code=3)),
        (ExecReply(stdout="é" * 40_000), ExecResult(stdout="é" * 40_000, exit_code=0)),
    ],
    ids=["success", "exit-3", "multi-frame-utf8"],
)
@pytest.mark.asyncio
async def test_exec_reads_channels_and_exit_status(
    kube: KubeEmulator, running: tuple[Cluster, list[dict[str, Any]]], reply: ExecReply, expected: ExecResult
) -> None:
    cluster, pods = running
    cluster.on_exec(pods[0], lambda _c, _argv: reply)
    result = await exec_in_pod(kube.api_client(), "train", _name(pods[0]), "trainer", ["true"], timeout_s=5)
    assert result == expected
    assert cluster.exec_requests[-1]["protocols"] == "v4.channel.k8s.io"


@pytest.mark.parametrize(
    ("pod", "container", "status", "text"),
    [
        ("no-such-pod", "trainer", 404, "refused (404)"),
        (None, "sidecar", 400, "is not valid for pod"),
    ],
    ids=["pod-gone", "bad-container"],
)
@pytest.mark.asyncio
async def test_exec_refused_by_the_api_server(
    kube: KubeEmulator,
    running: tuple[Cluster, list[dict[str, Any]]],
    pod: str | None,
    container: str,
    status: int,
    text: str,
) -> None:
    _cluster, pods = running
    result = await exec_in_pod(kube.api_client(), "train", pod or _name(pods[0]), container, ["true"], timeout_s=5)
    assert result.status == status and result.exit_code is None
    assert result.error is not None and text in result.error


@pytest.mark.asyncio
async def test_exec_is_bounded_in_time_and_bytes(
    kube: KubeEmulator, running: tuple[Cluster, list[dict[str, Any]]]
) -> None:
    cluster, pods = running
    cluster.on_exec(pods[0], lambda _c, _argv: ExecReply(stdout="late", delay_s=5))
    started = time.monotonic()
    slow = await exec_in_pod(kube.api_client(), "train", _name(pods[0]), "trainer", ["sleep"], timeout_s=0.3)
    assert time.monotonic() - started < 2
    assert slow.exit_code is None and slow.error is not None and "timed out after 0.3 s" in slow.error

    cluster.on_exec(pods[0], lambda _c, _argv: ExecReply(stdout="x" * 300_000, stderr="tail"))
    big = await exec_in_pod(
        kube.api_client(), "train", _name(pods[0]), "trainer", ["cat"], timeout_s=5, max_bytes=100_000
    )
    assert big.truncated and len(big.stdout) == 100_000 and big.stderr == ""
    # The exit status after the cut output is still read.
    assert big.exit_code == 0


@pytest.mark.asyncio
async def test_exec_cannot_connect() -> None:
    from kubernetes import client as kclient

    api: Any = kclient.ApiClient(kclient.Configuration(host="http://127.0.0.1:9"))
    try:
        result = await exec_in_pod(api, "ns", "p", "c", ["true"], timeout_s=2)
    finally:
        api.close()
    assert result.exit_code is None and result.error is not None and "cannot connect" in result.error


# -- pure helpers --------------------------------------------------------------------------------------


def test_process_list_parsing() -> None:
    text = (
        "1\t0000000000000202\tpython train.py --cfg a.yaml\n"
        "27\t0000000180004a02\t/usr/bin/python3 -u worker.py\n"
        "31\t-\tpython stuck.py\n"
        "garbage line\n"
        "\n"
    )
    procs = parse_process_list(text)
    assert [(p.pid, p.handles_sigusr1) for p in procs] == [(1, True), (27, True), (31, None)]
    assert procs[0].cmdline == "python train.py --cfg a.yaml"


@pytest.mark.parametrize("prefix", ["", "[rank3]:", "[default0]:"])
def test_faulthandler_blocks_are_found_among_log_lines(prefix: str) -> None:
    log = "\n".join(
        [
            "step 10 loss 1.0",
            f"{prefix}Thread 0x00007f5e2effd640 (most recent call first):",
            f'{prefix}  File "/usr/lib/python3.10/threading.py", line 320 in wait',
            "",
            f"{prefix}Current thread 0x00007f5e3a8e7740 (most recent call first):",
            f'{prefix}  File "train.py", line 88 in train_step',
            "step 11 loss 0.9",
        ]
    )
    blocks = faulthandler_blocks(log)
    assert "loss" not in blocks
    assert blocks.count("most recent call first") == 2
    assert f'{prefix}  File "train.py", line 88 in train_step' in blocks


# -- for real: the listing script and SIGUSR1 against local Python processes ---------------------------


@pytest.fixture
def python_children(tmp_path: Path) -> Any:
    """Two Python children: one registered faulthandler for SIGUSR1 (stderr to a log file), one did not."""
    log = tmp_path / "container.log"
    code = (
        "import faulthandler, signal, sys, time\n"
        "faulthandler.register(signal.SIGUSR1)\n"
        "def train_step():\n"
        "    time.sleep(120)\n"
        "print('step 1 loss 2.0', flush=True)\n"
        "train_step()\n"
    )
    with open(log, "wb") as fh:
        handled = subprocess.Popen([sys.executable, "-c", code], stdout=fh, stderr=fh)
    plain = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    deadline = time.monotonic() + 10
    while b"step 1" not in log.read_bytes() and time.monotonic() < deadline:
        time.sleep(0.02)
    yield handled, plain, log
    for p in (handled, plain):
        p.kill()
        p.wait()


class LocalContainer:
    """A 'container' of this machine whose processes are only the given children: the real shell
    runs the commands, its /proc listing is cut down to those pids, signals go only to them."""

    def __init__(self, pids: set[int], log: Path) -> None:
        self.pids = pids
        self.log = log
        self.signalled: list[int] = []

    async def exec(
        self, namespace: str, pod: str, container: str, command: list[str], *, timeout_s: float
    ) -> ExecResult:
        if command[:2] == ["sh", "-c"] and command[2].startswith("kill "):
            pids = [int(x) for x in command[2].split()[2:]]
            assert set(pids) <= self.pids, "a signal for a process outside the container"
            self.signalled += pids
        try:
            r = await asyncio.to_thread(subprocess.run, command, capture_output=True, text=True, timeout=timeout_s)
        except FileNotFoundError:
            return ExecResult(error=f'exec: "{command[0]}": executable file not found in $PATH')
        out = r.stdout
        if command[:2] == ["sh", "-c"] and command[2] == PROCESS_LIST_SCRIPT:
            out = "".join(
                line + "\n"
                for line in out.splitlines()
                if line.split("\t")[0].isdigit() and int(line.split("\t")[0]) in self.pids
            )
        return ExecResult(stdout=out, stderr=r.stderr, exit_code=r.returncode)

    async def pod_log(
        self, namespace: str, pod: str, container: str, *, tail_lines: int, previous: bool = False, limit_bytes: int = 0
    ) -> str:
        lines = self.log.read_text(errors="replace").splitlines()
        return "".join(line + "\n" for line in lines[-tail_lines:])


def test_the_process_listing_script_reads_proc(python_children: Any) -> None:
    handled, plain, _log = python_children
    out = subprocess.run(["sh", "-c", PROCESS_LIST_SCRIPT], capture_output=True, text=True, timeout=30, check=True)
    procs = {p.pid: p for p in parse_process_list(out.stdout)}
    assert procs[handled.pid].handles_sigusr1 is True
    assert procs[plain.pid].handles_sigusr1 is False
    assert "faulthandler.register" in procs[handled.pid].cmdline
    # The shell running the script does not list itself.
    assert not any("[p]ython" in p.cmdline for p in procs.values())


@pytest.mark.skipif(sys.platform != "linux", reason="/proc and SigCgt are Linux")
@pytest.mark.asyncio
async def test_sigusr1_dump_of_a_real_python_process(python_children: Any) -> None:
    handled, plain, log = python_children
    local = LocalContainer({handled.pid, plain.pid}, log)
    pod = {
        "metadata": {"name": "local", "namespace": "here"},
        "spec": {"containers": [{"name": "main"}]},
        "status": {"containerStatuses": [{"name": "main", "state": {"running": {}}}]},
    }
    dumps = await dump_stacks(local, [pod], timeout_s=30, settings=FAST)
    d = dumps["local"]
    assert d.method is StackMethod.SIGUSR1, (d.attempts, d.reason)
    assert d.pids == [handled.pid] and local.signalled == [handled.pid]
    assert "in train_step" in d.text and "most recent call first" in d.text
    assert "step 1 loss" not in d.text
    # Both processes are alive: the one without a handler was never signalled.
    assert handled.poll() is None and plain.poll() is None
    os.kill(handled.pid, signal.SIGTERM)
