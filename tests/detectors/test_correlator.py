"""Correlation: findings of one job reduce to one root cause, localised, with consequences explained."""

from __future__ import annotations

import pytest

from trainmedic.detectors.correlator import correlate
from trainmedic.detectors.diagnose import diagnose_text
from trainmedic.detectors.engine import Engine
from trainmedic.models import Action, FaultClass

WATCHDOG = (
    "[rank{r}]:[E1206 18:44:12.715298746 ProcessGroupNCCL.cpp:607] [Rank {r}] Watchdog caught collective "
    "operation timeout: WorkNCCL(SeqNum=7753, OpType=ALLREDUCE, NumelIn=544997376, NumelOut=544997376, "
    "Timeout(ms)=600000) ran for 600061 milliseconds before timing out."
)


def xid_line(
    n: int, *, node: str = "gpu-node-07", pci: str = "0000:3b:00", rest: str = "pid=2211, name=python3"
) -> str:
    return f"Nov 21 03:12:45 {node} kernel: NVRM: Xid (PCI:{pci}): {n}, {rest}"


def test_empty_input_has_no_root_cause(re_engine: Engine) -> None:
    assert diagnose_text("", re_engine).root_cause is None
    assert correlate([]).root_cause is None


def test_device_error_outranks_the_timeouts_it_causes(re_engine: Engine) -> None:
    """Xid 79 on one node of a 2 x 8 job: the 15 other ranks time out; the Xid is the cause."""
    lines = [WATCHDOG.format(r=r) for r in range(16) if r != 11]
    lines.insert(7, xid_line(79, rest="pid=0, GPU has fallen off the bus."))
    d = diagnose_text("\n".join(lines), re_engine)
    rc = d.root_cause
    assert rc is not None
    assert (rc.fault_class, rc.code, rc.node, rc.device) == (
        FaultClass.DEVICE_ERROR,
        "xid:79",
        "gpu-node-07",
        "0000:3b:00",
    )
    assert rc.vendor_action == "RESTART_BM"
    assert rc.action is Action.REBOOT_NODE
    watchdog = [f for f in d.findings if f.code == "nccl_watchdog"]
    assert watchdog
    assert all(f.consequence_of == "xid:79" for f in watchdog)


def test_repeats_fold_into_one_finding(re_engine: Engine) -> None:
    """800,000 identical Xid 95 lines are one event."""
    text = (xid_line(95, rest="pid=1, Ch 00000008, errorString CTX SWITCH TIMEOUT") + "\n") * 800_000
    d = diagnose_text(text, re_engine)
    assert len(d.findings) == 1
    assert d.findings[0].count == 800_000
    assert d.root_cause is not None
    assert d.root_cause.code == "xid:95"
    assert d.root_cause.occurrences == 800_000


def test_xid45_after_another_xid_is_a_consequence(re_engine: Engine) -> None:
    text = "\n".join(
        [
            xid_line(79, rest="pid=0, GPU has fallen off the bus."),
            xid_line(45, rest="pid=2211, name=python3, Ch 00000001"),
            xid_line(45, rest="pid=2212, name=python3, Ch 00000002"),
        ]
    )
    d = diagnose_text(text, re_engine)
    assert d.root_cause is not None
    assert d.root_cause.code == "xid:79"
    assert all(f.consequence_of == "xid:79" for f in d.findings if f.code == "xid:45")


def test_xid45_names_its_cause(re_engine: Engine) -> None:
    d = diagnose_text(xid_line(45, rest="pid=1818990, name=python3, Ch 00000001 caused by previous Xid 149"), re_engine)
    assert d.root_cause is not None
    assert d.root_cause.code == "xid:149"


def test_xid45_alone_is_reported_but_not_acted_on(re_engine: Engine) -> None:
    d = diagnose_text(xid_line(45), re_engine)
    assert d.root_cause is not None
    assert d.root_cause.code == "xid:45"
    assert d.root_cause.action is Action.IGNORE


@pytest.mark.parametrize("app", [13, 31, 43])
@pytest.mark.parametrize("hw", [48, 64, 79, 94, 95])
def test_hardware_xid_outranks_application_xid(re_engine: Engine, app: int, hw: int) -> None:
    """Xid 13/31/43 come from the application; 48/64/79/94/95 from the hardware."""
    text = "\n".join([xid_line(app, pci="0000:1a:00"), xid_line(hw, pci="0000:3b:00")])
    d = diagnose_text(text, re_engine)
    assert d.root_cause is not None
    assert d.root_cause.code == f"xid:{hw}"
    assert d.root_cause.device == "0000:3b:00"


@pytest.mark.parametrize("app", [13, 31])
def test_application_xid_alone_says_restart_the_app(re_engine: Engine, app: int) -> None:
    d = diagnose_text(xid_line(app), re_engine)
    assert d.root_cause is not None
    assert d.root_cause.code == f"xid:{app}"
    assert d.root_cause.action is Action.RESTART_APP


def test_oom_on_one_rank_outranks_peers_timeouts(re_engine: Engine) -> None:
    lines = [WATCHDOG.format(r=r) for r in (0, 1, 2, 4, 5, 6, 7)]
    lines.append(
        "[rank3]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.88 GiB. GPU 3 has a total "
        "capacity of 79.10 GiB of which 1.29 GiB is free."
    )
    d = diagnose_text("\n".join(lines), re_engine)
    rc = d.root_cause
    assert rc is not None
    assert (rc.fault_class, rc.code, rc.rank, rc.device) == (FaultClass.ACCELERATOR_OOM, "cuda_oom", 3, "3")


def test_host_oom_kill_outranks_comm_errors(re_engine: Engine) -> None:
    text = "\n".join(
        [
            "RuntimeError: NCCL error in: /pytorch/torch/lib/c10d/ProcessGroupNCCL.cpp:825, unhandled system error, "
            "NCCL version 2.7.8",
            "[Thu Mar 14 01:57:55 2019] Out of memory: Kill process 89746 (python) score 1031 or sacrifice child",
            "[Thu Mar 14 01:57:55 2019] Killed process 89746 (python) total-vm:118026216kB, anon-rss:109819332kB",
        ]
    )
    d = diagnose_text(text, re_engine)
    assert d.root_cause is not None
    assert d.root_cause.fault_class is FaultClass.HOST_OOM


def test_hang_on_many_ranks_is_not_pinned_to_one_rank(re_engine: Engine) -> None:
    d = diagnose_text("\n".join(WATCHDOG.format(r=r) for r in range(8)), re_engine)
    rc = d.root_cause
    assert rc is not None
    assert rc.fault_class is FaultClass.HANG
    assert rc.rank is None
    assert rc.ranks == list(range(8))


def test_summary_and_hint_in_both_languages(re_engine: Engine) -> None:
    d = diagnose_text(xid_line(79, rest="pid=0, GPU has fallen off the bus."), re_engine)
    rc = d.root_cause
    assert rc is not None
    assert rc.hint is not None
    assert "gpu-node-07" in rc.summary.en
    assert "gpu-node-07" in rc.summary.zh
    assert any("\u4e00" <= ch <= "\u9fff" for ch in rc.summary.zh)
    assert any("\u4e00" <= ch <= "\u9fff" for ch in rc.hint.zh)
    assert rc.contract_dict("zh")["summary"] == rc.summary.zh


@pytest.mark.parametrize(
    ("line", "code", "causes", "steps"),
    [
        # HCCL EI0007: the catalog (HCCL error-code reference) gives a cause; EI0006 steps only.
        (
            "[ERROR] HCCL(9,python):2024-05-01 EI0007: Failed to allocate resource[notify] with info [x]. "
            "Reason: Memory resources are exhausted.",
            "EI0007",
            1,
            0,
        ),
        (
            "[ERROR] HCCL(1,python):2024-05-01 EI0006: Getting socket times out. Reason: Remote Rank did not send "
            "the data in time.",
            "EI0006",
            0,
            3,
        ),
        # NVIDIA's Xid catalog publishes no cause list: empty, not invented.
        ("NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=python, GPU has fallen off the bus.", "xid:79", 0, 0),
    ],
)
def test_the_root_cause_carries_the_vendors_causes_and_steps(line: str, code: str, causes: int, steps: int) -> None:
    from trainmedic import udal
    from trainmedic.detectors.diagnose import diagnose_text, make_engine

    rc = diagnose_text(line, make_engine()).root_cause
    assert rc is not None and rc.code == code
    entry = udal.lookup(rc.chip, rc.code)
    assert entry is not None
    assert len(rc.vendor_causes) == causes == len(entry.causes)
    assert len(rc.vendor_steps) == steps == len(entry.steps)
    assert rc.vendor_steps == [s.strip() for s in entry.steps]
    d = rc.contract_dict()
    assert d["vendor_causes"] == rc.vendor_causes and d["vendor_steps"] == rc.vendor_steps


SLURM_TASK_FAILURE = (
    "[2026-04-29T23:36:37.809] error: *** STEP 52222788.0 ON nid002888 CANCELLED AT 2026-04-29T23:36:37"
    " DUE TO TASK FAILURE ***\n"
    "srun: error: nid002888: tasks 0-57,59-63: Terminated\n"
    "srun: Force Terminated StepId=52222788.0"
)
OMPI_FIRST_FAILURE = """--------------------------------------------------------------------------
mpirun detected that one or more processes exited with non-zero status, thus causing
the job to be terminated. The first process to do so was:

  Process name: [[29973,1],0]
  Exit code:    1
--------------------------------------------------------------------------
Killed"""
KILLED_THEN_REPORT = """Killed
mpirun detected that one or more processes exited with non-zero status, thus causing
the job to be terminated. The first process to do so was:"""


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(SLURM_TASK_FAILURE, (FaultClass.UNKNOWN, "rank_aborted"), id="slurm-kill-on-bad-exit"),
        pytest.param(OMPI_FIRST_FAILURE, (FaultClass.UNKNOWN, "rank_aborted"), id="mpirun-then-kill"),
        # A kill before the report may be what made the process fail: it stays the cause.
        pytest.param(KILLED_THEN_REPORT, (FaultClass.PROCESS_KILLED, "sigkill"), id="kill-then-mpirun"),
    ],
)
def test_the_kills_a_launcher_sends_after_reporting_a_failure_are_its_teardown(
    re_engine: Engine, text: str, expected: tuple[FaultClass, str]
) -> None:
    d = diagnose_text(text, re_engine)
    rc = d.root_cause
    assert rc is not None
    assert (rc.fault_class, rc.code) == expected
    if expected[1] == "rank_aborted":
        kills = [f for f in d.findings if f.fault_class is FaultClass.PROCESS_KILLED]
        assert kills and all(f.consequence_of == "rank_aborted" for f in kills)
