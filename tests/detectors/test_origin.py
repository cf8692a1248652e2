"""The origin of a job's failure: the rank that failed first, the rank that stalled, the node a
collected layout names. A peer that waited is never named in its place."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainmedic.detectors.diagnose import diagnose_paths, diagnose_text
from trainmedic.detectors.engine import Engine
from trainmedic.detectors.layout import place_of
from trainmedic.models import FaultClass

ELASTIC = """torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
train.py FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2024-05-09_10:20:03
  host      : gpu-node-2
  rank      : 3 (local_rank: 1)
  exitcode  : -9 (pid: 2899)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 2899
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2024-05-09_10:19:57
  host      : gpu-node-1
  rank      : 1 (local_rank: 1)
  exitcode  : -9 (pid: 2893)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 2893
============================================================
"""


@pytest.mark.parametrize("path", ["fast", "re"])
def test_the_first_observed_failure_names_the_rank(path: str, fast_engine: Engine, re_engine: Engine) -> None:
    rc = diagnose_text(ELASTIC, fast_engine if path == "fast" else re_engine).root_cause
    assert rc is not None
    assert rc.fault_class is FaultClass.PROCESS_KILLED
    assert (rc.rank, rc.node) == (1, "gpu-node-1")


TEARDOWN = """torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
train.py FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-09-07_13:03:29
  host      : node-a
  rank      : 0 (local_rank: 0)
  exitcode  : -9 (pid: 14689)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 14689
[2]:
  time      : 2026-09-07_13:03:29
  host      : node-a
  rank      : 2 (local_rank: 2)
  exitcode  : -15 (pid: 14691)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 14691
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-09-07_13:02:58
  host      : node-a
  rank      : {first_rank} (local_rank: 1)
  exitcode  : {first_exit} (pid: 14690)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================
"""


@pytest.mark.parametrize(
    ("first_exit", "expected", "code"),
    [
        # A rank exits 1 first; the launcher then SIGTERMs the survivors and SIGKILLs the one that
        # outlived the grace period: the kills are its teardown, the job failed of rank 1's exit.
        pytest.param("1", FaultClass.UNKNOWN, "exit_1", id="exit-1-first"),
        pytest.param("2", FaultClass.UNKNOWN, "exit_2", id="exit-2-first"),
        # The first failure is itself a kill: a kill from outside, never read as teardown.
        pytest.param("-9", FaultClass.PROCESS_KILLED, "sigkill", id="kill-first"),
    ],
)
@pytest.mark.parametrize("path", ["fast", "re"])
def test_the_launchers_teardown_kills_are_not_the_cause(
    first_exit: str, expected: FaultClass, code: str, path: str, fast_engine: Engine, re_engine: Engine
) -> None:
    text = TEARDOWN.format(first_rank=1, first_exit=first_exit)
    rc = diagnose_text(text, fast_engine if path == "fast" else re_engine).root_cause
    assert rc is not None
    assert (rc.fault_class, rc.code, rc.rank) == (expected, code, 1)


@pytest.mark.parametrize("path", ["fast", "re"])
def test_kills_without_a_sigterm_to_survivors_stay_a_cause(path: str, fast_engine: Engine, re_engine: Engine) -> None:
    # No survivor was sent SIGTERM: nothing shows the launcher tearing the group down, so a rank
    # SIGKILLed after another's exit 1 is still read as killed from outside.
    text = (
        TEARDOWN.format(first_rank=1, first_exit="1")
        .replace("-15 (pid", "-9 (pid")
        .replace("Signal 15 (SIGTERM)", "Signal 9 (SIGKILL)")
    )
    rc = diagnose_text(text, fast_engine if path == "fast" else re_engine).root_cause
    assert rc is not None
    assert rc.fault_class is FaultClass.PROCESS_KILLED


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        p = root / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text, encoding="utf-8")


GLOO_TIMEOUT = (
    "RuntimeError: [../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] "
    "Timed out waiting 20000ms for recv operation to complete\n"
)


@pytest.mark.parametrize(("ranks", "stalled"), [(4, 2), (2, 0), (8, 7)])
def test_the_rank_missing_from_the_timeouts_is_named(
    ranks: int, stalled: int, tmp_path: Path, re_engine: Engine
) -> None:
    files = {f"rank{r}.log": ("step 41\n" if r == stalled else "step 41\n" + GLOO_TIMEOUT) for r in range(ranks)}
    _write(tmp_path, files)
    rc = diagnose_paths([str(tmp_path)], re_engine).root_cause
    assert rc is not None
    assert rc.fault_class is FaultClass.HANG
    assert rc.rank == stalled
    assert f"rank {stalled}" in rc.summary.en


def test_when_two_ranks_are_silent_no_rank_is_picked(tmp_path: Path, re_engine: Engine) -> None:
    _write(tmp_path, {"rank0.log": GLOO_TIMEOUT, "rank1.log": GLOO_TIMEOUT, "rank2.log": "ok\n", "rank3.log": "ok\n"})
    rc = diagnose_paths([str(tmp_path)], re_engine).root_cause
    assert rc is not None
    assert rc.rank is None


def test_the_node_folder_localises_what_the_line_does_not(tmp_path: Path, re_engine: Engine) -> None:
    _write(
        tmp_path,
        {
            "worker-0/dmesg": "[ 12.0] NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.\n",
            "worker-1/dmesg": "[ 11.0] usb 1-1: new device\n",
        },
    )
    rc = diagnose_paths([str(tmp_path)], re_engine).root_cause
    assert rc is not None
    assert (rc.code, rc.node, rc.device) == ("xid:79", "worker-0", "0000:3b:00")


@pytest.mark.parametrize(
    ("name", "root", "expected"),
    [
        ("/c/node-a/process_log/debug/plog/plog-12_2024.log", "/c", ("node-a", None)),
        ("/c/node-a/rank_3.log", "/c", ("node-a", 3)),
        ("/c/rank-12.txt", "/c", (None, 12)),
        ("/c/train.log", "/c", (None, None)),
        ("/c/logs/worker_rank07.out", None, (None, 7)),
        ("/c/frank1.log", "/c", (None, None)),
    ],
)
def test_place_of_a_file_in_a_collected_layout(
    name: str, root: str | None, expected: tuple[str | None, int | None]
) -> None:
    assert place_of(name, root) == expected


WATCHDOG = (
    "[rank{r}]:[E ProcessGroupNCCL.cpp:616] [Rank {r}] Watchdog caught collective operation timeout: "
    "WorkNCCL(SeqNum=4242, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600104 "
    "milliseconds before timing out.\n"
)


@pytest.mark.parametrize("nodes", [2, 4, 16])
def test_a_device_error_explains_its_peers_timeouts(nodes: int, tmp_path: Path, re_engine: Engine) -> None:
    bad = nodes - 1
    files = {f"worker-{n}/rank{n}.log": "step 41\n" + WATCHDOG.format(r=n) for n in range(nodes) if n != bad}
    files[f"worker-{bad}/dmesg"] = "[ 88.1] NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, GPU has fallen off the bus.\n"
    files[f"worker-{bad}/rank{bad}.log"] = "step 41\n"
    _write(tmp_path, files)
    diagnosis = diagnose_paths([str(tmp_path)], re_engine)
    rc = diagnosis.root_cause
    assert rc is not None
    assert (rc.fault_class, rc.code, rc.node, rc.device) == (
        FaultClass.DEVICE_ERROR,
        "xid:79",
        f"worker-{bad}",
        "0000:3b:00",
    )
    waits = [f for f in diagnosis.findings if f.fault_class is FaultClass.HANG]
    assert len(waits) == nodes - 1
    assert all(f.consequence_of == "xid:79" for f in waits)


def test_a_plog_takes_its_device_from_the_process_device_log(tmp_path: Path, re_engine: Engine) -> None:
    """CANN's layout: plog-<pid>_<time>.log, and device-<id>/device-<pid>_<time>.log for the same pid."""
    _write(
        tmp_path,
        {
            "node-3/process_log/debug/plog/plog-4242_20250101.log": (
                "[ERROR] HCCL(4242,python):2025-11-22-17:37:04.448.967 [hccl_socket_manager.cc:599] [3] "
                "| 10.0.0.1(1) | 16666 | 10.0.0.3(3) | 0 | server | time out | DISABLE |\n"
            ),
            "node-3/process_log/debug/device-5/device-4242_20250101.log": "[INFO] RUNTIME device up\n",
            "node-3/process_log/debug/device-2/device-1111_20250101.log": "[INFO] RUNTIME device up\n",
        },
    )
    diagnosis = diagnose_paths([str(tmp_path)], re_engine)
    row = next(f for f in diagnosis.findings if f.rule_id == "ascend.hccl_link_error_row")
    assert (row.node, row.device, row.rank) == ("node-3", "5", 3)
