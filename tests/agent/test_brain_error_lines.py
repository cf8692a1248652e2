"""The error-looking lines kept for an `unknown` diagnosis are found in one pass over a batch, the
same lines the line-by-line pattern finds."""

from __future__ import annotations

import pytest

from trainmedic.agent.brain import _ERROR_LINE, error_lines_of


@pytest.mark.parametrize(
    "lines",
    [
        ["[rank0]: step 1 loss 2.0", "Traceback (most recent call last):", "  File x.py"],
        ["RuntimeError: CUDA error", "ValueError", "MyErrorClass happened", "ERROR: boom", "Errors: none"],
        ["process exited with 1", "sys.exit code 3", "nexit status", "exit status 137", "_exitcode 2"],
        ["E1206 18:44:12 fail", "XE1206 18:44:12 no", "[E1206 18:44:12.75 ProcessGroupNCCL.cpp]", "E12 1"],
        ["Killed", "Segmentation fault (core dumped)", "Aborted", "FATAL x", "Fatal y", "Exception", "Exceptional"],
        ["ok", "", "Error", "exitcode", "E0000 00:"],
    ],
)
def test_error_lines_are_found_as_line_by_line(lines: list[str]) -> None:
    assert error_lines_of(lines) == [line for line in lines if _ERROR_LINE.search(line)]
