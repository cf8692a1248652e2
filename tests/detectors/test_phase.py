"""Phase from context (detectors/phase.py): the same communication failure is comm_init while the
communicator, rendezvous or store is being built, and keeps its own class in training."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainmedic.detectors.diagnose import diagnose_text
from trainmedic.detectors.engine import Engine
from trainmedic.detectors.phase import MAX_LINE, PhaseError, load_phase_markers, parse_phase_file
from trainmedic.models import FaultClass

NCCL_ERROR = (
    "RuntimeError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1269, "
    "unhandled system error, NCCL version 2.14.3"
)
INIT_TRACEBACK = f"""Traceback (most recent call last):
  File "train.py", line 12, in <module>
    dist.init_process_group("nccl")
  File "/usr/lib/python3/site-packages/torch/distributed/distributed_c10d.py", line 602, in init_process_group
    default_pg = _new_process_group_helper(
{NCCL_ERROR}"""
RUNTIME_TRACEBACK = f"""Traceback (most recent call last):
  File "train.py", line 80, in <module>
    loss.backward()
  File "/usr/lib/python3/site-packages/torch/distributed/distributed_c10d.py", line 1536, in all_reduce
    work = default_pg.allreduce([tensor], opts)
{NCCL_ERROR}"""
NCCL_INIT_TRAIL = """node-1:2342:2390 [0] NCCL INFO Bootstrap : Using eth0:10.0.0.1<0>
node-1:2342:2390 [0] NCCL WARN socketStartConnect: Connect to 10.0.0.2<43017> failed : Connection refused
node-1:2342:2390 [0] NCCL INFO init.cc:1090 -> 2
"""
AFTER_INIT = """node-1:2342:2390 [0] NCCL INFO comm 0x5581 rank 0 nranks 2 cudaDev 0 busId 1000 - Init COMPLETE
step 10 loss 2.1
node-1:2342:2390 [0] misc/socket.cc:49 NCCL WARN socketProgress: Connection closed by remote peer node-2<57557>
"""


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(INIT_TRACEBACK, FaultClass.COMM_INIT, id="traceback-in-init_process_group"),
        pytest.param(RUNTIME_TRACEBACK, FaultClass.COMM_ERROR, id="traceback-in-all_reduce"),
        pytest.param(NCCL_ERROR, FaultClass.COMM_ERROR, id="no-context"),
        pytest.param(NCCL_INIT_TRAIL, FaultClass.COMM_INIT, id="nccl-init-trail"),
        pytest.param(AFTER_INIT, FaultClass.COMM_ERROR, id="after-init-complete"),
        pytest.param(
            "node-3:1234:1234 [0] NCCL WARN Bootstrap : no socket interface found", FaultClass.COMM_INIT, id="same-line"
        ),
    ],
)
@pytest.mark.parametrize("path", ["fast", "re"])
def test_phase_decides_init_or_runtime(
    text: str, expected: FaultClass, path: str, fast_engine: Engine, re_engine: Engine
) -> None:
    engine = fast_engine if path == "fast" else re_engine
    rc = diagnose_text(text, engine).root_cause
    assert rc is not None
    assert rc.fault_class is expected


# A witness ("connection closed by peer", ranked below the peer's own failure in training) raised while
# Horovod builds its gloo controller in hvd.init(); the process then aborts (terminate / SIGABRT).
HOROVOD_INIT = """[0]<stderr>:  File "/usr/lib/python3/dist-packages/horovod/common/basics.py", line 60 in init
[0]<stderr>:  File "/work/train.py", line 16 in <module>
[0]<stderr>:terminate called after throwing an instance of 'gloo::IoException'
[0]<stderr>:  what():  [/src/third_party/gloo/gloo/transport/tcp/pair.cc:572] Connection closed by peer [10.0.0.5]:53666
[0]<stderr>:Fatal Python error: Aborted
"""
HOROVOD_TRAINING = HOROVOD_INIT.replace("line 60 in init", "line 90 in allreduce").replace(
    'train.py", line 16 in <module>', 'train.py", line 80 in train_step'
)


@pytest.mark.parametrize("path", ["fast", "re"])
def test_a_witness_in_init_is_an_init_failure_above_the_abort(
    path: str, fast_engine: Engine, re_engine: Engine
) -> None:
    engine = fast_engine if path == "fast" else re_engine
    rc = diagnose_text(HOROVOD_INIT, engine).root_cause
    assert rc is not None
    assert (rc.fault_class, rc.code) == (FaultClass.COMM_INIT, "peer_closed")
    # The same lines in training: the witness keeps its low rank, the abort the process raised wins.
    rc = diagnose_text(HOROVOD_TRAINING, engine).root_cause
    assert rc is not None
    assert rc.fault_class is FaultClass.APP_ERROR


def test_runtime_marker_wins_on_the_same_line() -> None:
    markers = load_phase_markers()
    line = b"NCCL INFO ncclCommInitRank comm 0x1 rank 0 nranks 8 - Init COMPLETE"
    assert markers.on_line(line) is FaultClass.COMM_ERROR


def test_only_comm_error_and_hang_move() -> None:
    markers = load_phase_markers()
    line = b"File x.py, line 1, in init_process_group"
    assert markers.resolve(FaultClass.APP_ERROR, line, lambda _k: None) is FaultClass.APP_ERROR
    assert markers.resolve(FaultClass.HANG, line, lambda _k: None) is FaultClass.COMM_INIT


@pytest.mark.parametrize(
    ("text", "where"),
    [
        pytest.param("version: 1\ninit: []\nruntime: [{pattern: x}]\n", "phases.yaml:2", id="empty-init"),
        pytest.param("version: 1\ninit: [{pattern: '('}]\nruntime: [{pattern: x}]\n", "init.0", id="bad-regex"),
        pytest.param(
            "version: 1\ninit: [{pattern: x}]\nruntime: [{pattern: x}]\nextra: 1\n", "phases.yaml:4", id="unknown-key"
        ),
    ],
)
def test_a_broken_phase_file_is_refused_with_its_place(text: str, where: str, tmp_path: Path) -> None:
    with pytest.raises(PhaseError) as err:
        parse_phase_file(text, "phases.yaml")
    assert where in str(err.value)


# Fragments that make up marker lines and near-misses: every literal the markers need, cut and case-changed.
_FRAGMENTS = [
    "ncclCommInitRank",
    "init.cc:1090 -> 2",
    "Bootstrap : Using eth0",
    "in init_process_group",
    "in all_reduce",
    "Init COMPLETE",
    "Rendezvous complete",
    "rendezvous",
    "TCPStore",
    "HcclCommInitRootInfo",
    "topo info exchange",
    "WorkNCCL(SeqNum=5, OpType=ALLREDUCE",
    "[TaskExecStage]",
    "HcclAllReduce",
    "nccl",
    "INIT",
    "ialize",
    "步骤",
    "█",
    " ",
]
_marker_line = st.lists(st.one_of(st.sampled_from(_FRAGMENTS), st.text(max_size=12)), max_size=12).map("".join)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=_marker_line, pad=st.integers(min_value=0, max_value=520))
def test_the_fast_paths_marker_gate_never_hides_a_marker(fast_engine: Engine, text: str, pad: int) -> None:
    """The fast path asks Hyperscan whether a line may carry a phase marker before the markers' regexes
    run; it must answer yes wherever they match, also for lines cut at MAX_LINE inside a character."""
    line = ("x" * pad + text).encode("utf-8", "surrogatepass")
    expected = load_phase_markers().on_line(engine_prefix(line))
    assert fast_engine._phase_marked(line) is expected


def engine_prefix(line: bytes) -> bytes:
    from trainmedic.detectors.engine import _utf8_prefix

    return _utf8_prefix(line, MAX_LINE)


def test_markers_follow_the_file_as_the_rules_do(tmp_path: Path) -> None:
    """A process that loads the rules again after an edit sees the phase markers of the same edit."""
    path = tmp_path / "phases.yaml"
    runtime = "runtime:\n  - pattern: '\\bInit COMPLETE\\b'\n"
    path.write_text("version: 1\ninit:\n  - pattern: '\\bMPI_Init\\b'\n" + runtime)
    line = b"*** An error occurred in MPI_Init"
    assert load_phase_markers(path).on_line(line) is FaultClass.COMM_INIT
    path.write_text("version: 1\ninit:\n  - pattern: '\\bncclCommInitRank\\b'\n" + runtime)
    assert load_phase_markers(path).on_line(line) is None
