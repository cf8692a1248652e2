"""The optimised matchers against a naive reference matcher, on random input.

The reference reads the normalised input line by line and runs every pattern of every single-line
rule (`continuation == 0`) on every line. Both engine paths (Hyperscan prefilter and `re` anchor
prefilter) must report the same findings: per (rule, code), the same number of occurrences, the
same first line and the same last line.
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from paths import DATA

import trainmedic.detectors.engine as engine_mod
from trainmedic.detectors.engine import Engine, normalize
from trainmedic.detectors.loader import RuleSet, load_rules
from trainmedic.detectors.schema import Rule
from trainmedic.models import Finding

# The real failure excerpts (tests/data/real-logs.jsonl, the repository's copy of the shared corpus).
CORPUS = DATA / "real-logs.jsonl"

# (rule_id, code) -> (count, first line, last line)
Summary = dict[tuple[str, str], tuple[int, int, int]]


# -- the reference matcher ------------------------------------------------------------------------


@dataclass(frozen=True)
class _RefRule:
    rule: Rule
    patterns: list[re.Pattern[str]]
    unless: list[re.Pattern[str]]

    def __repr__(self) -> str:  # keeps Hypothesis' failure reports short
        return f"_RefRule({self.rule.id!r})"


class _Missing(dict[str, str]):
    def __missing__(self, key: str) -> str:
        return "?"


def _ref_rules(rules: list[Rule]) -> list[_RefRule]:
    return [
        _RefRule(
            r,
            [re.compile(p, re.ASCII) for p in r.patterns],
            [re.compile(u, re.ASCII) for u in r.unless],
        )
        for r in rules
        if r.continuation == 0
    ]


def _strings(obj: object, out: list[str]) -> None:
    if isinstance(obj, str):
        out.append(obj)
    elif isinstance(obj, dict):
        for v in obj.values():
            _strings(v, out)
    elif isinstance(obj, list):
        for v in obj:
            _strings(v, out)


def _json_display(line: str) -> str | None:
    """The decoded string values of a JSON object line (groups are read from there when it matches)."""
    s = line.lstrip()
    if not s.startswith("{") or len(s) > engine_mod.MAX_JSON_LINE:
        return None
    try:
        obj = json.loads(s)
    except (ValueError, RecursionError):
        return None
    parts: list[str] = []
    _strings(obj, parts)
    return "\n".join(parts) if parts else None


def reference(rules: list[_RefRule], data: bytes) -> Summary:
    out: Summary = {}
    body = normalize(data)
    if not body:
        return out
    for line_no, raw in enumerate(body.split(b"\n"), start=1):
        line = raw.decode("utf-8", "replace").rstrip("\r")
        display: str | None = None
        display_done = False
        for ref in rules:
            match = next((m for p in ref.patterns if (m := p.search(line)) is not None), None)
            if match is None or any(u.search(line) for u in ref.unless):
                continue
            if not display_done:
                display, display_done = _json_display(line), True
            if display is not None:
                match = next((m for p in ref.patterns if (m := p.search(display)) is not None), match)
            groups = {k: v for k, v in match.groupdict().items() if v is not None}
            code = ref.rule.code.format_map(_Missing({**ref.rule.defaults, **groups}))
            key = (ref.rule.id, code)
            count, first, _last = out.get(key, (0, line_no, line_no))
            out[key] = (count + 1, first, line_no)
    return out


def summarize(findings: list[Finding], line_rules: set[str]) -> Summary:
    out: Summary = {}
    for f in findings:
        if f.rule_id not in line_rules:
            continue
        assert f.line_no is not None
        assert f.last_line_no is not None
        key = (f.rule_id, f.code)
        count, first, last = out.get(key, (0, f.line_no, f.last_line_no))
        out[key] = (count + f.count, min(first, f.line_no), max(last, f.last_line_no))
    return out


# -- input material -------------------------------------------------------------------------------


def _corpus_lines() -> list[str]:
    lines: list[str] = []
    if CORPUS.is_file():
        for row in CORPUS.read_text(encoding="utf-8").splitlines():
            if row.strip():
                lines.extend(str(json.loads(row)["text"]).splitlines())
    return [ln for ln in lines if ln.strip()]


def _example_lines(ruleset: RuleSet) -> list[str]:
    lines: list[str] = []
    for rule in ruleset.rules:
        for ex in rule.examples.match:
            lines.extend(ex.line.splitlines())
        for neg in rule.examples.no_match:
            lines.extend(neg.splitlines())
    return lines


_SHIPPED = load_rules()
FRAGMENTS: list[str] = sorted(set(_corpus_lines() + _example_lines(_SHIPPED)))
LINE_RULES = {r.id for r in _SHIPPED.rules if r.continuation == 0}

ANSI = [b"\x1b[31m", b"\x1b[0m", b"\x1b[1;32m", b"\x1b[38;5;208m", b"\x1b[K", b"\x1b]0;title\x07", b"\x1bM"]
ODD_BYTES = [b"\x00", b"\r", b"\xff", b"\xc3", b"\xe2\x84", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\t"]
FOLD_CHARS = ["İ", "ı", "ſ", "K"]

_MUTATIONS: list[Callable[[str], str]] = [
    lambda s: s,
    str.upper,
    str.lower,
    str.swapcase,
    lambda s: s.replace("i", "ı"),
    lambda s: s.replace("I", "İ"),
    lambda s: s.replace("s", "ſ"),
    lambda s: s.replace("K", "K").replace("k", "K"),
]

_fragment = st.tuples(st.sampled_from(FRAGMENTS), st.sampled_from(_MUTATIONS)).map(lambda t: t[1](t[0]))
_piece: st.SearchStrategy[bytes] = st.one_of(
    _fragment.map(lambda s: s.encode("utf-8")),
    # a truncated or split fragment
    st.tuples(_fragment, st.integers(0, 300), st.integers(0, 300)).map(
        lambda t: t[0][min(t[1], t[2]) : max(t[1], t[2])].encode("utf-8")
    ),
    st.text(alphabet=st.characters(codec="ascii"), max_size=30).map(lambda s: s.encode("ascii")),
    st.text(max_size=12).map(lambda s: s.encode("utf-8")),
    st.sampled_from(FOLD_CHARS).map(lambda s: s.encode("utf-8")),
    st.sampled_from(ANSI),
    st.sampled_from(ODD_BYTES),
    st.binary(max_size=12),
)


def _json_wrap(line: bytes) -> bytes:
    return json.dumps({"log": line.decode("utf-8", "replace")}).encode("utf-8")


_line: st.SearchStrategy[bytes] = st.lists(_piece, min_size=1, max_size=6).map(
    lambda parts: b"".join(parts).replace(b"\n", b" ")
)
_any_line = st.one_of(_line, _line, _line.map(_json_wrap))
_document: st.SearchStrategy[bytes] = st.lists(
    st.tuples(_any_line, st.sampled_from([b"\n", b"\r\n"])), max_size=12
).map(lambda rows: b"".join(a + b for a, b in rows))
# Sometimes the last line has no newline.
_documents = st.one_of(_document, st.tuples(_document, _line).map(lambda t: t[0] + t[1]))

_SETTINGS: dict[str, Any] = {
    "deadline": None,
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large],
}


# -- fixtures -------------------------------------------------------------------------------------


class _RefRules(list[_RefRule]):
    def __repr__(self) -> str:
        return f"<{len(self)} reference rules>"


@pytest.fixture(scope="module")
def ref_rules(shipped_ruleset: RuleSet) -> list[_RefRule]:
    return _RefRules(_ref_rules(shipped_ruleset.rules))


@pytest.fixture(scope="module", params=["fast", "re"])
def engine(request: pytest.FixtureRequest) -> Engine:
    name = "fast_engine" if request.param == "fast" else "re_engine"
    result: Engine = request.getfixturevalue(name)
    return result


# -- properties -----------------------------------------------------------------------------------


def test_fragments_are_available() -> None:
    assert len(FRAGMENTS) > 50
    assert LINE_RULES


@settings(max_examples=250, **_SETTINGS)
@given(data=_documents)
# A CRLF line a `$`-anchored pattern ends at: multi-line `$` in the prefilters stops before LF only.
@example(data=b"torch.distributed.elastic.multiprocessing.errors.ChildFailedError\r\n")
def test_mixed_input_matches_reference(engine: Engine, ref_rules: list[_RefRule], data: bytes) -> None:
    expected = reference(ref_rules, data)
    got = summarize(engine.scan_text(data), LINE_RULES)
    assert got == expected


@settings(max_examples=100, **_SETTINGS)
@given(data=st.binary(max_size=4096))
def test_random_binary_matches_reference(engine: Engine, ref_rules: list[_RefRule], data: bytes) -> None:
    expected = reference(ref_rules, data)
    got = summarize(engine.scan_text(data), LINE_RULES)
    assert got == expected


@settings(max_examples=100, **_SETTINGS)
@given(data=_documents)
def test_str_input_matches_bytes_input(engine: Engine, data: bytes) -> None:
    text = data.decode("utf-8", "replace")
    as_bytes = summarize(engine.scan_text(text.encode("utf-8")), LINE_RULES)
    assert summarize(engine.scan_text(text), LINE_RULES) == as_bytes


def _chunk_for(data: bytes, extra: int) -> int:
    return max((len(ln) for ln in data.split(b"\n")), default=0) + 1 + extra


@settings(max_examples=100, **_SETTINGS)
@given(data=_documents, extra=st.integers(1, 300))
def test_streamed_in_chunks_matches_reference(
    engine: Engine, ref_rules: list[_RefRule], data: bytes, extra: int
) -> None:
    """Chunks larger than the longest line: streaming must not change what is found, or where."""
    data = data.replace(b"\x1b]", b"")  # an OSC sequence may span lines; covered in test_robustness
    expected = reference(ref_rules, data)
    with mock.patch.object(engine_mod, "CHUNK_BYTES", _chunk_for(data, extra)):
        findings, _lines = engine.scan_stream(io.BytesIO(data))
    assert summarize(findings, LINE_RULES) == expected


@settings(max_examples=50, **_SETTINGS)
@given(data=_documents, extra=st.integers(1, 300))
def test_streamed_line_count(engine: Engine, data: bytes, extra: int) -> None:
    data = data.replace(b"\x1b]", b"")
    body = normalize(data)
    with mock.patch.object(engine_mod, "CHUNK_BYTES", _chunk_for(data, extra)):
        _findings, lines = engine.scan_stream(io.BytesIO(data))
    assert lines == body.count(b"\n") + (1 if body and not body.endswith(b"\n") else 0)


@pytest.mark.parametrize("data", [b"one line, no newline", b"a\nb", b"  indented\n  only", b"x\n"])
def test_stream_counts_a_last_line_without_newline(re_engine: Engine, data: bytes) -> None:
    _findings, lines = re_engine.scan_stream(io.BytesIO(data))
    assert lines == len(data.rstrip(b"\n").split(b"\n"))


# -- every shipped example on both paths ----------------------------------------------------------


def _example_params() -> list[Any]:
    params = []
    for rule in _SHIPPED.rules:
        for i, ex in enumerate(rule.examples.match):
            params.append(pytest.param(ex.line, id=f"{rule.id}-match{i}"))
        for i, neg in enumerate(rule.examples.no_match):
            params.append(pytest.param(neg, id=f"{rule.id}-no_match{i}"))
    return params


def _full(findings: list[Finding]) -> list[tuple[object, ...]]:
    return sorted(
        (f.rule_id, f.code, f.line_no, f.last_line_no, f.count, f.node, f.device, f.rank, f.text) for f in findings
    )


@pytest.mark.parametrize("line", _example_params())
def test_shipped_example_same_on_both_paths(fast_engine: Engine, re_engine: Engine, line: str) -> None:
    assert _full(fast_engine.scan_text(line)) == _full(re_engine.scan_text(line))


@pytest.mark.parametrize("line", _example_params())
def test_shipped_example_single_line_rules_match_reference(
    re_engine: Engine, ref_rules: list[_RefRule], line: str
) -> None:
    data = line.encode("utf-8")
    assert summarize(re_engine.scan_text(data), LINE_RULES) == reference(ref_rules, data)


_INDENTED_XID = b"  kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.\n"


@pytest.mark.parametrize("chunk", [100, 150, 200, 1000])
def test_stream_of_indented_lines_is_cut_at_line_ends(re_engine: Engine, chunk: int) -> None:
    """Every line is shorter than a chunk, so no line may be split between two chunks."""
    data = b"start\n" + b"  pad line\n" * 7 + _INDENTED_XID * 3
    with mock.patch.object(engine_mod, "CHUNK_BYTES", chunk):
        findings, lines = re_engine.scan_stream(io.BytesIO(data))
    assert [(f.rule_id, f.line_no, f.last_line_no, f.count) for f in findings] == [("nvidia.xid", 9, 11, 3)]
    assert lines == 11


def _anchored_examples() -> list[Any]:
    """Each rule example line of a pattern that ends with `$`, to be met with CRLF endings."""
    cases = []
    for rule in load_rules(run_examples=False).rules:
        if rule.continuation or not any("$" in p for p in rule.patterns):
            continue
        for i, ex in enumerate(rule.examples.match):
            if "\n" not in ex.line:
                cases.append(pytest.param(ex.line, id=f"{rule.id}-{i}"))
    return cases


@pytest.mark.parametrize("line", _anchored_examples())
def test_crlf_lines_are_found_as_lf_lines_are(engine: Engine, ref_rules: list[_RefRule], line: str) -> None:
    lf = (line + "\n").encode()
    crlf = (line + "\r\n").encode()
    assert summarize(engine.scan_text(crlf), LINE_RULES) == summarize(engine.scan_text(lf), LINE_RULES)
    assert summarize(engine.scan_text(crlf), LINE_RULES) == reference(ref_rules, crlf)


# NCCL's own INFO lines, many times over: in such a log the static anchor of a pattern ("NCCL INFO ")
# is everywhere and another of its anchors (" -> ") is rare, so a large chunk picks the other.
_NCCL_NOISE = [
    b"gpu-node-1:1787141:1787412 [2] NCCL INFO Setting affinity for GPU 2 to ffffffff,00000000\n",
    b"gpu-node-1:1787141:1787412 [2] NCCL INFO Channel 00/0 : 2[2] -> 3[3] via P2P/IPC\n",
    b"gpu-node-1:1787141:1787412 [2] NCCL INFO comm 0x55d1 rank 2 nRanks 8 nNodes 1 localRanks 8\n",
]


@pytest.mark.parametrize("noise", [0, 3000], ids=["fragments", "fragments-in-nccl-noise"])
def test_large_chunks_pick_their_own_anchors_and_still_match_reference(
    engine: Engine, ref_rules: list[_RefRule], noise: int
) -> None:
    """A chunk of at least CHOOSE_MIN_BYTES picks each pattern's anchor set by its own byte pairs;
    whichever it picks, the findings are the reference's."""
    body = ("\n".join(FRAGMENTS).encode("utf-8", "replace") + b"\n") * 4
    data = b"".join(_NCCL_NOISE) * noise + body + b"".join(_NCCL_NOISE) * noise
    assert len(data) >= engine_mod._AnchorPrefilter.CHOOSE_MIN_BYTES
    assert summarize(engine.scan_text(data), LINE_RULES) == reference(ref_rules, data)


def test_nccl_noise_moves_an_anchor_off_its_static_choice(re_engine: Engine) -> None:
    """The property above exercises the choice: in NCCL noise some pattern leaves its static anchor."""
    prefilter = re_engine._prefilters[False]
    assert isinstance(prefilter, engine_mod._AnchorPrefilter)
    data = b"".join(_NCCL_NOISE) * 3000
    static = {(a, tuple(p)) for a, p in prefilter.by_anchor.items() if not a.ci}
    assert prefilter._choices is not None
    picked = {(a, tuple(p)) for a, p in prefilter._choices.pick(engine_mod._Bigrams(data).counts)}
    assert picked != static
    assert any(a.literal == b"NCCL INFO " for a, _ in static)
    assert not any(a.literal == b"NCCL INFO " and pids for a, pids in picked)
