"""`diagnose` sees a silence in a finished log through the log's own timestamps."""

from __future__ import annotations

import calendar
import gzip
import time
from pathlib import Path

import pytest

from trainmedic.detectors.diagnose import diagnose_paths, make_engine
from trainmedic.detectors.hang_static import line_time, silence_findings
from trainmedic.models import FaultClass

T0 = calendar.timegm((2026, 1, 1, 10, 0, 0, 0, 0, 0))


def _stamp(t: float) -> str:
    whole, ms = divmod(round(t * 1000), 1000)
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(whole)) + f",{ms:03d}"


def _megatron_log(steps: int, tail: list[tuple[float, str]]) -> list[str]:
    lines = [f"[{_stamp(T0)}] [INFO] starting", f"[{_stamp(T0 + 1)}] [before the start of training step] datetime: x"]
    t = T0 + 60.0
    for s in range(1, steps + 1):
        t += 2.0 + (0.1 if s % 3 else -0.1)
        lines.append(
            f"[{_stamp(t)}] iteration {s:8d}/{100000:8d} | consumed samples: {s * 64:12d} | "
            "elapsed time per iteration (ms): 2001.3 | lm loss: 2.110266E+00 |"
        )
    lines.extend(f"[{_stamp(t + dt)}] {text}" for dt, text in tail)
    return lines


WATCHDOG = (
    "[rank3]:[E ProcessGroupNCCL.cpp:607] [Rank 3] Watchdog caught collective operation timeout: "
    "WorkNCCL(SeqNum=1234, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600021 milliseconds "
    "before timing out."
)


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("2026-01-01 10:00:00,250 INFO x", T0 + 0.25),
        ("2026-01-01T10:00:00.5Z stdout F x", T0 + 0.5),
        ("[2026-01-01 10:00:00] iteration 1/2 |", T0),
        ("[INFO|trainer.py:2128] 2026-01-01 10:00:00,000 >> ***** Running training *****", T0),
        ("01/01/2026 10:00:00 - INFO - llamafactory - {'loss': 0.9}", T0),
        ("{'loss': 0.9455, 'epoch': 0.57}", None),
        ("2026-13-01 10:00:00 bad month", None),
    ],
)
def test_line_time(line: str, expected: float | None) -> None:
    assert line_time(line) == expected


def test_silence_before_the_error_is_a_hang_finding() -> None:
    lines = _megatron_log(317, [(601.0, WATCHDOG), (603.0, "Traceback (most recent call last):")])
    found = silence_findings(lines, file="rank3.log")
    assert len(found) == 1
    f = found[0]
    assert f.fault_class is FaultClass.HANG and f.code == "no_progress"
    assert f.message is not None and "603 s" in f.message.en
    assert f.groups["last_step"] == "317/100000"
    assert f.line_no == 319  # the last iteration line
    assert f.file == "rank3.log"


def test_log_that_ends_soon_after_its_last_step_has_no_finding() -> None:
    lines = _megatron_log(317, [(30.0, "saving final model"), (60.0, "exiting")])
    assert silence_findings(lines, file="x.log") == []


def test_log_without_timestamps_on_its_steps_has_no_finding() -> None:
    lines = [f"{{'loss': 0.5, 'epoch': {s / 100:.2f}}}" for s in range(300)] + [f"{_stamp(T0 + 5000)} the end"]
    assert silence_findings(lines, file="x.log") == []


def test_finished_training_has_no_finding() -> None:
    lines = _megatron_log(317, [(10.0, "[after training is done] datetime: x"), (3000.0, "upload done")])
    assert silence_findings(lines, file="x.log") == []


@pytest.mark.parametrize("gz", [False, True])
def test_diagnose_reports_the_silence(tmp_path: Path, gz: bool) -> None:
    text = "\n".join(_megatron_log(317, [(900.0, WATCHDOG)])) + "\n"
    path = tmp_path / ("train.log.gz" if gz else "train.log")
    path.write_bytes(gzip.compress(text.encode()) if gz else text.encode())
    diagnosis = diagnose_paths([str(path)], make_engine())
    hangs = [f for f in diagnosis.findings if f.code == "no_progress"]
    assert len(hangs) == 1
    assert hangs[0].message is not None and "900 s" in hangs[0].message.en
    assert diagnosis.root_cause is not None and diagnosis.root_cause.fault_class is FaultClass.HANG
