"""The training program's own failure (app_error), read from Python's traceback grammar and the
launchers' crash reports, and the exceptions Python itself reports as ignored."""

from __future__ import annotations

import pytest

from trainmedic.detectors.diagnose import diagnose_text
from trainmedic.detectors.engine import Engine
from trainmedic.models import FaultClass

DESTRUCTOR_FRAMES = """  File "/usr/lib/python3/site-packages/torch/utils/data/dataloader.py", line 1466, in __del__
    self._shutdown_workers()
  File "/usr/lib/python3/site-packages/torch/utils/data/dataloader.py", line 1449, in _shutdown_workers
    if w.is_alive():
  File "/usr/lib/python3.10/multiprocessing/process.py", line 160, in is_alive
    assert self._parent_pid == os.getpid(), 'can only test a child process'
AssertionError: can only test a child process
"""
RAISED_FRAMES = """  File "train.py", line 178, in train
    assert gradient_accumulation_steps % world_size == 0
AssertionError
"""


def _engine(path: str, fast_engine: Engine, re_engine: Engine) -> Engine:
    return fast_engine if path == "fast" else re_engine


@pytest.mark.parametrize(
    "text",
    [
        pytest.param(
            "Exception ignored in: <function _MultiProcessingDataLoaderIter.__del__ at 0x7f62eb6ed630>\n"
            "Traceback (most recent call last):\n" + DESTRUCTOR_FRAMES,
            id="unraisable-hook-header",
        ),
        # The header cut off: the outermost frame is a destructor, which Python cannot propagate from.
        pytest.param("Traceback (most recent call last):\n" + DESTRUCTOR_FRAMES, id="destructor-frame"),
    ],
)
@pytest.mark.parametrize("path", ["fast", "re"])
def test_an_exception_python_ignored_is_not_a_failure(
    text: str, path: str, fast_engine: Engine, re_engine: Engine
) -> None:
    assert diagnose_text(text, _engine(path, fast_engine, re_engine)).root_cause is None


@pytest.mark.parametrize("path", ["fast", "re"])
def test_the_same_exception_raised_by_the_program_is_one(path: str, fast_engine: Engine, re_engine: Engine) -> None:
    text = "rank 0 is initialized\nTraceback (most recent call last):\n" + RAISED_FRAMES
    rc = diagnose_text(text, _engine(path, fast_engine, re_engine)).root_cause
    assert rc is not None
    assert (rc.fault_class, rc.code) == (FaultClass.APP_ERROR, "python_exception")
    assert "train.py:178 in train" in rc.summary.en


@pytest.mark.parametrize(
    ("text", "code"),
    [
        pytest.param("Exception: expected value at line 1 column 1", "python_exception", id="base-exception"),
        pytest.param(
            'msg:\n    {\n      "message": "RuntimeError: raising error since --throw was specified",',
            "python_exception",
            id="elastic-error-file",
        ),
        pytest.param(
            "RuntimeError: Expected all tensors to be on the same device, "
            "but found at least two devices, cuda:0 and cpu!",
            "python_exception",
            id="device-named-in-message",
        ),
        pytest.param("2024-05-01T12:00:00.123456789Z stderr F KeyError: 'labels'", "python_exception", id="cri-stamp"),
        pytest.param("[1,0]<stderr>:ValueError: bad shape", "python_exception", id="mpirun-tag"),
        pytest.param(
            "terminate called without an active exception\nSIGABRT(6), PID: 2450054, Thread 2450054: ",
            "sigabrt",
            id="c10-fatal-signal",
        ),
        pytest.param(
            "mpirun noticed that process rank 1 with PID 0 on node n1 exited on signal 4 (Illegal instruction: 4).",
            "sigill",
            id="mpirun-signal",
        ),
        pytest.param(
            "torch.multiprocessing.spawn.ProcessExitedException: process 0 terminated with signal SIGSEGV",
            "sigsegv",
            id="spawn-signal",
        ),
    ],
)
@pytest.mark.parametrize("path", ["fast", "re"])
def test_the_programs_own_failure_in_every_wording(
    text: str, code: str, path: str, fast_engine: Engine, re_engine: Engine
) -> None:
    rc = diagnose_text(text, _engine(path, fast_engine, re_engine)).root_cause
    assert rc is not None
    assert (rc.fault_class, rc.code) == (FaultClass.APP_ERROR, code)


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("RuntimeError: CUDA error: an illegal memory access was encountered", id="cuda-library-error"),
        pytest.param("Exception: process 1 terminated with signal SIGKILL", id="killed-from-outside"),
        pytest.param("2024-05-01 12:00:00,123 - WARNING - ValueError: retrying with defaults", id="logged-warning"),
    ],
)
@pytest.mark.parametrize("path", ["fast", "re"])
def test_not_read_as_the_programs_own_failure(text: str, path: str, fast_engine: Engine, re_engine: Engine) -> None:
    rc = diagnose_text(text, _engine(path, fast_engine, re_engine)).root_cause
    assert rc is None or rc.fault_class is not FaultClass.APP_ERROR


@pytest.mark.parametrize(
    ("text", "fault_class", "code"),
    [
        # A launcher reporting a child's exit status: the workload failed, the child's own error is
        # not in view (never the program's exception, although Python prints it as one).
        pytest.param(
            "subprocess.CalledProcessError: Command '['/usr/bin/python', '-u', 'train.py', '--local_rank=1']' "
            "returned non-zero exit status 1.",
            FaultClass.UNKNOWN,
            "exit_1",
            id="called-process-error",
        ),
        pytest.param(
            "[ERROR] [launch.py:321:sigkill_handler] ['/usr/bin/python', '-u', 'train.py'] exits with return code = 1",
            FaultClass.UNKNOWN,
            "exit_1",
            id="deepspeed-exit",
        ),
        pytest.param(
            "[ERROR] [launch.py:324:sigkill_handler] ['/usr/bin/python3', '-u', 'clm.py'] exits with return code = -11",
            FaultClass.APP_ERROR,
            "sigsegv",
            id="deepspeed-signal",
        ),
        pytest.param(
            "srun: error: node12: task 3: Exited with exit code 2", FaultClass.UNKNOWN, "exit_2", id="srun-exit"
        ),
        pytest.param("srun: error: node12: task 3: Killed", FaultClass.PROCESS_KILLED, "sigkill", id="srun-killed"),
    ],
)
@pytest.mark.parametrize("path", ["fast", "re"])
def test_a_launchers_report_of_a_childs_exit(
    text: str, fault_class: FaultClass, code: str, path: str, fast_engine: Engine, re_engine: Engine
) -> None:
    rc = diagnose_text(text, _engine(path, fast_engine, re_engine)).root_cause
    assert rc is not None
    assert (rc.fault_class, rc.code) == (fault_class, code)


@pytest.mark.parametrize("path", ["fast", "re"])
def test_a_launchers_report_never_outranks_the_cause(path: str, fast_engine: Engine, re_engine: Engine) -> None:
    text = (
        "[E ProcessGroupNCCL.cpp:737] [Rank 2] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=86645, "
        "OpType=ALLREDUCE, Timeout(ms)=1800000) ran for 1805320 milliseconds before timing out.\n"
        "subprocess.CalledProcessError: Command '['/usr/bin/python', '-u', 'train.py', '--local_rank=1']' "
        "returned non-zero exit status 1.\n"
    )
    rc = diagnose_text(text, _engine(path, fast_engine, re_engine)).root_cause
    assert rc is not None
    assert rc.fault_class is FaultClass.HANG
