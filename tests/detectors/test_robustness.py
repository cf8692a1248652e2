"""Hostile and degenerate input: a result or a clear error, never an exception, a hang or a silent drop."""

from __future__ import annotations

import functools
import gzip
import io
import json
import random
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainmedic.agent.cli import main
from trainmedic.detectors.engine import Engine, _valid_utf8
from trainmedic.models import Finding

XID_79 = b"kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.\n"
TEN_MB = 10 * 1024 * 1024
FIVE_MB = 5 * 1024 * 1024


def _junk(size: int, seed: int = 20240601) -> bytes:
    return random.Random(seed).randbytes(size)


@functools.cache
def _xid95_lines(n: int) -> bytes:
    """One Xid 95 kernel line per second of a day, repeated: only timestamp and pid vary."""
    rows = []
    for i in range(n):
        h, m, s = (i // 3600) % 24, (i // 60) % 60, i % 60
        rows.append(
            f"Mar 27 {h:02d}:{m:02d}:{s:02d} gpu-node-3 kernel: NVRM: Xid (PCI:0000:3b:00): 95, "
            f"pid={1000 + i}, name=python3, Uncontained: FBHUB. RST: No, D-RST: No\n".encode()
        )
    return b"".join(rows)


def _keys(findings: list[Finding]) -> list[tuple[str, str, int | None, int]]:
    return sorted((f.rule_id, f.code, f.line_no, f.count) for f in findings)


@pytest.fixture(scope="module", params=["fast", "re"])
def engine(request: pytest.FixtureRequest) -> Engine:
    result: Engine = request.getfixturevalue("fast_engine" if request.param == "fast" else "re_engine")
    return result


# -- the engine -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        pytest.param(b"x" * TEN_MB, [], id="10MB-line"),
        pytest.param(b"x" * TEN_MB + b" " + XID_79, [("nvidia.xid", "xid:79", 1, 1)], id="10MB-line-fault-at-end"),
        pytest.param(b"\n" * 100_000, [], id="only-newlines"),
        pytest.param(b"", [], id="empty"),
        pytest.param(b"\xff\xfe\xc3(\xa0\xa1\xe2\x28\xa1" * 1000, [], id="invalid-utf8"),
        pytest.param(b"\x00" * 100_000, [], id="nul-bytes"),
        pytest.param(b"\xff\xfe\x00\x00" + XID_79, [("nvidia.xid", "xid:79", 1, 1)], id="invalid-utf8-then-fault"),
        pytest.param(b"abc\x00def\n\x00" + XID_79, [("nvidia.xid", "xid:79", 2, 1)], id="nul-then-fault"),
        pytest.param(b"a\r\r\n\r" + XID_79.replace(b"\n", b"\r\n"), [("nvidia.xid", "xid:79", 2, 1)], id="cr"),
    ],
)
def test_engine_degenerate_input(engine: Engine, data: bytes, expected: list[tuple[str, str, int, int]]) -> None:
    assert _keys(engine.scan_text(data)) == expected


def test_engine_random_junk(engine: Engine) -> None:
    findings = engine.scan_text(_junk(FIVE_MB))
    assert isinstance(findings, list)


def test_engine_stream_random_junk(engine: Engine) -> None:
    _findings, lines = engine.scan_stream(io.BytesIO(_junk(FIVE_MB)))
    assert lines > 0


def test_engine_folds_100k_repeats(engine: Engine) -> None:
    findings = [f for f in engine.scan_text(_xid95_lines(100_000)) if f.rule_id == "nvidia.xid"]
    assert len(findings) == 1
    (f,) = findings
    assert (f.code, f.count, f.line_no, f.last_line_no, f.node) == (
        "xid:95",
        100_000,
        1,
        100_000,
        "gpu-node-3",
    )


def _example_prefix_soup() -> str:
    """Half of every shipped example line, all on one line: many partial matches, no full one."""
    from trainmedic.detectors.loader import load_rules

    halves = []
    for rule in load_rules().rules:
        for ex in rule.examples.match:
            line = ex.line.splitlines()[0]
            halves.append(line[: len(line) // 2])
    return " ".join(halves)


@pytest.mark.parametrize(
    "make_line",
    [
        pytest.param(lambda: "NVRM: Xid (PCI:0000:3b:00): " * 50_000, id="xid-prefix"),
        pytest.param(lambda: "NVRM: Xid (" * 100_000, id="xid-paren"),
        pytest.param(lambda: "CUDA out of memory. Tried to allocate " * 30_000, id="oom-prefix"),
        pytest.param(lambda: "[rank3]: RankID:" * 60_000, id="rank-prefixes"),
        pytest.param(lambda: "NCCL WARN " * 100_000, id="nccl-warn"),
        pytest.param(lambda: "(" * 200_000 + "NPU " * 50_000, id="parens"),
        pytest.param(lambda: _example_prefix_soup() * 50, id="example-prefix-soup"),
    ],
)
def test_engine_long_line_of_partial_matches(
    fast_engine: Engine, re_engine: Engine, make_line: Callable[[], str]
) -> None:
    line = make_line()
    assert _keys(fast_engine.scan_text(line)) == _keys(re_engine.scan_text(line))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.binary(max_size=20_000))
def test_engine_random_bytes_never_raise(engine: Engine, data: bytes) -> None:
    assert isinstance(engine.scan_text(data), list)
    assert isinstance(engine.scan_stream(io.BytesIO(data))[0], list)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=st.text(alphabet=st.characters(), max_size=2000))
def test_engine_random_text_never_raises(engine: Engine, text: str) -> None:
    assert isinstance(engine.scan_text(text), list)


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("\ud800 " + XID_79.decode(), id="high-surrogate"),
        pytest.param("abc\udfff\n" + XID_79.decode(), id="low-surrogate-outside-escape-range"),
    ],
)
def test_engine_str_with_lone_surrogate(engine: Engine, text: str) -> None:
    """A str may hold lone surrogates (e.g. from json.loads('"\\ud800"')): a result, not an exception."""
    assert [f.code for f in engine.scan_text(text) if f.rule_id == "nvidia.xid"] == ["xid:79"]


@pytest.mark.parametrize(
    "nested",
    [
        pytest.param("[" * 100_000 + "]" * 100_000, id="lists"),
        pytest.param('{"a":' * 100_000 + "1" + "}" * 100_000, id="dicts"),
    ],
)
def test_engine_deeply_nested_json_line(engine: Engine, nested: str) -> None:
    line = '{"log": "NVRM: Xid (PCI:0000:3b:00): 79, pid=1", "x": ' + nested + "}"
    assert [f.code for f in engine.scan_text(line) if f.rule_id == "nvidia.xid"] == ["xid:79"]


def test_engine_escape_sequence_across_lines_keeps_lines(engine: Engine) -> None:
    """An OSC escape (ESC ] ... BEL) never spans lines: stripping it must not drop or renumber lines."""
    data = b"\x1b]0;title\nline2\n" + XID_79 + b"\x07\n" + XID_79
    findings = [f for f in engine.scan_text(data) if f.rule_id == "nvidia.xid"]
    assert [(f.line_no, f.last_line_no, f.count) for f in findings] == [(3, 5, 2)]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(
            "Mar 27 10:00:00 gpu-node-3.cluster.local kernel: NVRM: Xid (PCI:0000:3b\n"
            ":00): 79, pid=1234, GPU has fallen off the bus.\n",
            [("nvidia.xid", 1, 2)],
            id="xid-wrapped-mid-line",
        ),
        pytest.param(
            "[INFO] HCCL(16,python):2025-04-27-15:01:25.767.291 [hccl_socket.cc:100] [16][HcclSocket][Listen] "
            "socket type[1], listen on ip[192.168.189.78%eth0] and port[60015] success\n"
            "RuntimeError: [enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: can't allocate memory\n",
            [("ascend.hccl_socket_listen", None, None)],
            id="exception-header-is-a-new-record",
        ),
        pytest.param(
            "(VllmWorkerProcess pid=2678037) INFO 04-27 12:14 worker.py:232] Memory profiling results: "
            "gpu_memory_utilization=0.90\n"
            "node_status: node=gpu-2 ready=Unknown reason=NodeStatusUnknown\n",
            [("generic.node.status_unknown", None, None)],
            id="match-inside-one-line-is-that-lines-own",
        ),
    ],
)
def test_engine_hard_wrapped_lines(
    engine: Engine, text: str, expected: list[tuple[str, int | None, int | None]]
) -> None:
    """Pasted logs are put back together across a terminal's hard wrap, and only there: a match that
    lies inside one physical line is judged on that line alone (its `unless` and anchors apply), and a
    line that opens a record of its own (`RuntimeError: `, `node_status: `) is never a wrap's tail.
    `expected` names the rule and where it matched; no line numbers: the rule must not match at all."""
    rule_id = expected[0][0]
    found = [(f.rule_id, f.line_no, f.last_line_no) for f in engine.scan_text(text) if f.rule_id == rule_id]
    assert found == [e for e in expected if e[1] is not None]


# -- the command line -----------------------------------------------------------------------------


def _serve(monkeypatch: pytest.MonkeyPatch, engine: Engine) -> None:
    """Serve a session engine to `diagnose` (building the Hyperscan database costs seconds)."""

    def make_engine(rule_dirs: Any = (), *, fast: bool | None = None) -> Engine:
        assert not rule_dirs
        return engine

    monkeypatch.setattr("trainmedic.detectors.diagnose.make_engine", make_engine)


@pytest.fixture(params=["fast", "re"])
def cli_engine(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    engine: Engine = request.getfixturevalue("fast_engine" if request.param == "fast" else "re_engine")
    _serve(monkeypatch, engine)
    return str(request.param)


def _diagnose_json(capsys: pytest.CaptureFixture[str], engine: str, *paths: str) -> dict[str, Any]:
    rc = main(["diagnose", "--engine", engine, "--format", "json", "--logs", *paths])
    out, err = capsys.readouterr()
    assert rc == 0, err
    doc = json.loads(out)
    assert isinstance(doc, dict)
    assert set(doc) >= {"root_cause", "findings"}
    return doc


def _codes(doc: dict[str, Any]) -> set[str]:
    return {f["code"] for f in doc["findings"]}


def _write(path: Path, data: bytes) -> str:
    path.write_bytes(data)
    return str(path)


@pytest.mark.parametrize(
    ("data", "codes"),
    [
        pytest.param(b"x" * TEN_MB, set(), id="10MB-line"),
        pytest.param(b"x" * TEN_MB + b" " + XID_79, {"xid:79"}, id="10MB-line-fault-at-end"),
        pytest.param(_junk(FIVE_MB), None, id="5MB-junk"),
        pytest.param(b"\xff\xfe\xc3(\xa0\xa1" * 1000 + b"\n", set(), id="invalid-utf8"),
        pytest.param(b"\x00" * 10_000, set(), id="nul-bytes"),
        pytest.param(b"\n" * 10_000, set(), id="only-newlines"),
        pytest.param(b"", set(), id="empty"),
        pytest.param(b"\xc3\x00\xff\n" + XID_79, {"xid:79"}, id="junk-then-fault"),
    ],
)
def test_cli_diagnose_file(
    cli_engine: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], data: bytes, codes: set[str] | None
) -> None:
    """`codes` None: random junk, where only a well-formed answer is required."""
    doc = _diagnose_json(capsys, cli_engine, _write(tmp_path / "job.log", data))
    if codes is not None:
        assert _codes(doc) == codes
        assert (doc["root_cause"] is None) == (not codes)


def test_cli_repeated_fault_folds(
    re_engine: Engine, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _serve(monkeypatch, re_engine)
    doc = _diagnose_json(capsys, "re", _write(tmp_path / "kern.log", _xid95_lines(100_000)))
    xid = [f for f in doc["findings"] if f["rule_id"] == "nvidia.xid"]
    assert [(f["code"], f["count"], f["line_no"]) for f in xid] == [("xid:95", 100_000, 1)]
    assert doc["root_cause"]["code"] == "xid:95"
    assert doc["root_cause"]["node"] == "gpu-node-3"


def test_cli_empty_stdin(cli_engine: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    fake = io.TextIOWrapper(io.BytesIO(b""))
    monkeypatch.setattr(sys, "stdin", fake)
    doc = _diagnose_json(capsys, cli_engine, "-")
    assert doc == {"root_cause": None, "findings": []}


def test_cli_stdin_with_fault(
    cli_engine: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"hello\n" + XID_79)))
    doc = _diagnose_json(capsys, cli_engine, "-")
    assert [(f["code"], f["line_no"], f["file"]) for f in doc["findings"]] == [("xid:79", 2, "<stdin>")]


def test_cli_gzip_file(cli_engine: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path / "kern.log.gz", gzip.compress(b"boot\n" * 1000 + XID_79))
    doc = _diagnose_json(capsys, cli_engine, path)
    assert [(f["code"], f["line_no"]) for f in doc["findings"]] == [("xid:79", 1001)]


def test_cli_gzip_without_suffix(cli_engine: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = _diagnose_json(capsys, cli_engine, _write(tmp_path / "rotated.1", gzip.compress(XID_79)))
    assert _codes(doc) == {"xid:79"}


def test_cli_directory_of_logs(cli_engine: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _write(tmp_path / "a.log", b"hello\n")
    (tmp_path / "node-1").mkdir()
    _write(tmp_path / "node-1" / "kern.log", b"boot\n" + XID_79)
    _write(tmp_path / "node-1" / "old.log.gz", gzip.compress(XID_79.replace(b"79", b"48")))
    doc = _diagnose_json(capsys, cli_engine, str(tmp_path))
    assert _codes(doc) == {"xid:79", "xid:48"}
    assert {Path(f["file"]).name for f in doc["findings"]} == {"kern.log", "old.log.gz"}


@pytest.mark.parametrize("fmt", ["text", "markdown"])
def test_cli_human_formats(cli_engine: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], fmt: str) -> None:
    rc = main(["diagnose", "--engine", cli_engine, "--format", fmt, "--logs", _write(tmp_path / "k.log", XID_79)])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert "79" in out


def _assert_unusable(rc: int, capsys: pytest.CaptureFixture[str], mention: str) -> None:
    out, err = capsys.readouterr()
    assert rc == 2
    assert out == ""
    assert err.count("\n") == 1, err
    assert err.startswith("trainmedic:")
    assert mention in err


@pytest.mark.parametrize("fmt", ["json", "text"])
def test_cli_nonexistent_path(cli_engine: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], fmt: str) -> None:
    missing = str(tmp_path / "nope.log")
    rc = main(["diagnose", "--engine", cli_engine, "--format", fmt, "--logs", missing])
    _assert_unusable(rc, capsys, "nope.log")


def test_cli_nonexistent_among_good(cli_engine: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = _write(tmp_path / "k.log", XID_79)
    rc = main(["diagnose", "--engine", cli_engine, "--format", "json", "--logs", good, str(tmp_path / "nope")])
    _assert_unusable(rc, capsys, "nope")


def test_cli_empty_directory(cli_engine: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "empty").mkdir()
    rc = main(["diagnose", "--engine", cli_engine, "--format", "json", "--logs", str(tmp_path / "empty")])
    _assert_unusable(rc, capsys, "empty")


def test_cli_corrupt_gzip(cli_engine: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path / "bad.gz", gzip.compress(_junk(100_000))[:5000])
    rc = main(["diagnose", "--engine", cli_engine, "--format", "json", "--logs", path])
    _assert_unusable(rc, capsys, "bad.gz")


def test_cli_real_engine_build(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Without the cached engine: `diagnose` loads the shipped rules itself."""
    doc = _diagnose_json(capsys, "re", _write(tmp_path / "k.log", b"x\n" + XID_79))
    assert [(f["code"], f["line_no"]) for f in doc["findings"]] == [("xid:79", 2)]
    assert doc["root_cause"]["fault_class"] == "device_error"


_utf8ish = st.lists(
    st.one_of(st.binary(max_size=6), st.text(max_size=6).map(lambda t: t.encode("utf-8", "surrogatepass"))), max_size=40
).map(b"".join)


@settings(max_examples=500, deadline=None)
@given(data=_utf8ish)
def test_utf8_check_agrees_with_the_decoder(data: bytes) -> None:
    """normalize() checks only the non-ASCII runs of a chunk; it must agree with a full decode."""
    try:
        data.decode("utf-8")
        valid = True
    except UnicodeDecodeError:
        valid = False
    assert _valid_utf8(data) is valid
