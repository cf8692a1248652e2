"""Rule loading: every problem of a bad rule file is reported with its file and line."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
from rulefix import rule, rule_file

from trainmedic.agent.cli import main
from trainmedic.detectors.loader import load_rules
from trainmedic.errors import Problem, RuleLoadError


def line_of(text: str, needle: str, nth: int = 1) -> int:
    """1-based line number of the nth line containing `needle`."""
    hits = [i for i, ln in enumerate(text.splitlines(), start=1) if needle in ln]
    assert len(hits) >= nth, f"{needle!r} not in the test file"
    return hits[nth - 1]


def load_errors(*files: tuple[str, str], tmp_path: Path) -> list[Problem]:
    for name, text in files:
        (tmp_path / name).write_text(text, encoding="utf-8")
    with pytest.raises(RuleLoadError) as info:
        load_rules([tmp_path], include_shipped=False)
    errors = [p for p in info.value.problems if not p.warning]
    assert errors, info.value.problems
    return errors


@dataclass(frozen=True)
class Case:
    text: str
    needle: str  # the problem's line is the line holding this text (also accepted: `alt_needle`'s)
    message: tuple[str, ...]  # words the message must contain (case-insensitive)
    alt_needle: str | None = None
    nth: int = 1


_EMPTY_MATCH = rule(patterns=(r"(?P<num>\d*)",), examples="    examples: {match: [{line: '7', code: 'frob:7'}]}\n")

CASES = {
    "unknown-top-level-key": Case(
        rule_file(rule(), header="version: 1\ncolour: red\n"), "colour:", ("colour", "unknown")
    ),
    "unknown-rule-key": Case(rule_file(rule(extra="    colour: red\n")), "colour:", ("colour", "unknown")),
    "bad-regex-first-pattern": Case(
        rule_file(rule(patterns=(r"FROB (unclosed",))), "FROB (unclosed", ("regex", "unclosed")
    ),
    "bad-regex-second-pattern": Case(
        rule_file(rule(patterns=(r"FROBNICATOR FAILED code=(?P<num>\d+)", r"FROB (?P<num>\d+"))),
        r"FROB (?P<num>\d+",
        ("regex",),
    ),
    "bad-unless-regex": Case(rule_file(rule(extra="    unless: ['ok [']\n")), "unless:", ("regex",)),
    "code-placeholder-not-a-group": Case(
        rule_file(rule(code="frob:{nope}")), "code: 'frob:{nope}'", ("{nope}",), alt_needle="- id: test.frob"
    ),
    "pattern-matches-empty-line": Case(
        rule_file(_EMPTY_MATCH), r"(?P<num>\d*)", ("empty",), alt_needle="- id: test.frob"
    ),
    "stable-without-examples": Case(rule_file(rule(examples="")), "- id: test.frob", ("stable", "example")),
    "failing-match-example": Case(
        rule_file(rule(examples="    examples:\n      match:\n        - {line: 'FROBNICATOR OK', code: 'frob:7'}\n")),
        "FROBNICATOR OK",
        ("does not match", "FROBNICATOR OK"),
        alt_needle="- id: test.frob",
    ),
    "no-match-example-matches": Case(
        rule_file(
            rule(
                examples=(
                    "    examples:\n      match: [{line: 'FROBNICATOR FAILED code=1', code: 'frob:1'}]\n"
                    "      no_match: ['FROBNICATOR FAILED code=2']\n"
                )
            )
        ),
        "no_match: ['FROBNICATOR FAILED code=2']",
        ("no_match", "code=2"),
        alt_needle="- id: test.frob",
    ),
    "wrong-example-code": Case(
        rule_file(rule(examples="    examples:\n      match: [{line: 'FROBNICATOR FAILED code=1', code: 'frob:9'}]\n")),
        "frob:9",
        ("frob:1", "frob:9"),
        alt_needle="- id: test.frob",
    ),
    "yaml-syntax-error": Case(rule_file(rule(extra="    tags: [unclosed, \n    bad: : :\n")), "bad: : :", ("yaml",)),
    "invalid-enum-value": Case(rule_file(rule(fault_class="gpu_oom")), "fault_class: gpu_oom", ("fault_class",)),
    "invalid-status": Case(rule_file(rule(status="beta")), "status: beta", ("status",)),
    "bad-id": Case(rule_file(rule(rule_id="Bad Id!")), "- id: Bad Id!", ("id",)),
    "version-2": Case(rule_file(rule(), header="version: 2\n"), "version: 2", ("version",)),
    "non-mapping-file": Case("- just\n- a list\n", "- just", ("mapping",)),
    "rules-not-a-list": Case("version: 1\nrules: {a: 1}\n", "rules:", ("list",)),
    "duplicate-id-in-file": Case(rule_file(rule(), rule()), "- id: test.frob", ("duplicate", "rules.yaml:3"), nth=2),
}


@pytest.mark.parametrize("case", list(CASES.values()), ids=list(CASES))
def test_bad_rule_file(tmp_path: Path, case: Case) -> None:
    errors = load_errors(("rules.yaml", case.text), tmp_path=tmp_path)
    path = str(tmp_path / "rules.yaml")
    lines = {line_of(case.text, case.needle, case.nth)}
    if case.alt_needle is not None:
        lines.add(line_of(case.text, case.alt_needle))

    def fits(p: Problem) -> bool:
        return all(word.lower() in p.message.lower() for word in case.message)

    relevant = [p for p in errors if fits(p)]
    assert relevant, [str(p) for p in errors]
    assert [(p.file, p.line) for p in relevant if p.file == path and p.line in lines], [str(p) for p in relevant]


def test_duplicate_id_across_files(tmp_path: Path) -> None:
    first = rule_file(rule("test.other"), rule())
    second = rule_file(rule())
    errors = load_errors(("a.yaml", first), ("b.yaml", second), tmp_path=tmp_path)
    dup = [p for p in errors if "duplicate" in p.message]
    assert [(p.file, p.line, p.rule_id) for p in dup] == [(str(tmp_path / "b.yaml"), 3, "test.frob")]
    first_line = line_of(first, "- id: test.frob")
    assert f"{tmp_path / 'a.yaml'}:{first_line}" in dup[0].message


def test_all_problems_of_a_file_at_once(tmp_path: Path) -> None:
    text = rule_file(
        rule("test.one", patterns=("ONE (broken",)),
        rule("test.two", extra="    colour: red\n"),
        rule("test.three", fault_class="gpu_oom"),
        rule("test.good"),
    )
    errors = load_errors(("rules.yaml", text), tmp_path=tmp_path)
    assert {p.rule_id for p in errors} == {"test.one", "test.two", "test.three"}
    by_rule = {p.rule_id: p.line for p in errors}
    assert by_rule["test.one"] == line_of(text, "ONE (broken")
    assert by_rule["test.two"] == line_of(text, "colour: red")
    assert by_rule["test.three"] == line_of(text, "fault_class: gpu_oom")


def test_problems_of_several_files_at_once(tmp_path: Path) -> None:
    errors = load_errors(
        ("a.yaml", rule_file(rule("test.a", fault_class="gpu_oom"))),
        ("b.yaml", "- not a mapping\n"),
        tmp_path=tmp_path,
    )
    assert {Path(p.file).name for p in errors} == {"a.yaml", "b.yaml"}


def test_experimental_rule_without_examples_is_a_warning(tmp_path: Path) -> None:
    text = rule_file(rule(status="experimental", examples=""))
    (tmp_path / "rules.yaml").write_text(text, encoding="utf-8")
    ruleset = load_rules([tmp_path], include_shipped=False)
    assert [r.id for r in ruleset.rules] == ["test.frob"]
    assert [(p.file, p.line, p.rule_id) for p in ruleset.warnings] == [
        (str(tmp_path / "rules.yaml"), line_of(text, "- id: test.frob"), "test.frob")
    ]
    assert "example" in ruleset.warnings[0].message


def test_empty_rule_file_is_reported(tmp_path: Path) -> None:
    """An empty file is named, as a warning (the directory still loads) or as an error."""
    (tmp_path / "empty.yaml").write_text("", encoding="utf-8")
    (tmp_path / "good.yaml").write_text(rule_file(rule()), encoding="utf-8")
    try:
        problems = load_rules([tmp_path], include_shipped=False).warnings
    except RuleLoadError as exc:
        problems = exc.problems
    assert [p.file for p in problems if "empty" in p.message.lower()] == [str(tmp_path / "empty.yaml")]


def test_good_user_rule_loads(tmp_path: Path) -> None:
    (tmp_path / "mine.yml").write_text(rule_file(rule()), encoding="utf-8")
    ruleset = load_rules([tmp_path], include_shipped=False)
    assert [r.id for r in ruleset.rules] == ["test.frob"]
    assert ruleset.origins["test.frob"] == (str(tmp_path / "mine.yml"), 3)


def test_missing_rule_directory(tmp_path: Path) -> None:
    with pytest.raises(RuleLoadError) as info:
        load_rules([tmp_path / "nope"], include_shipped=False)
    assert any(p.file == str(tmp_path / "nope") for p in info.value.problems)


# -- the command line -----------------------------------------------------------------------------


def _bad_dir(tmp_path: Path) -> tuple[Path, str]:
    d = tmp_path / "rules"
    d.mkdir()
    text = rule_file(rule(fault_class="gpu_oom"), rule("test.two", extra="    colour: red\n"))
    (d / "bad.yaml").write_text(text, encoding="utf-8")
    return d, text


@pytest.mark.parametrize("command", ["lint", "test"])
def test_cli_rules_bad_dir(tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str) -> None:
    d, text = _bad_dir(tmp_path)
    rc = main(["rules", command, "--rules", str(d)])
    _out, err = capsys.readouterr()
    assert rc == 1
    bad = d / "bad.yaml"
    assert f"{bad}:{line_of(text, 'fault_class: gpu_oom')}: error" in err
    assert f"{bad}:{line_of(text, 'colour: red')}: error" in err


@pytest.mark.parametrize("command", ["lint", "test", "list"])
def test_cli_rules_shipped(capsys: pytest.CaptureFixture[str], command: str) -> None:
    rc = main(["rules", command])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert out


@pytest.mark.parametrize("command", ["lint", "test"])
def test_cli_rules_good_user_dir(tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str) -> None:
    (tmp_path / "mine.yaml").write_text(rule_file(rule()), encoding="utf-8")
    shipped = len(load_rules().rules)
    rc = main(["rules", command, "--rules", str(tmp_path)])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert f"{shipped + 1} rules" in out


def test_cli_rules_list_shows_user_rule(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "mine.yaml").write_text(rule_file(rule()), encoding="utf-8")
    rc = main(["rules", "list", "--rules", str(tmp_path)])
    out, _err = capsys.readouterr()
    assert rc == 0
    listed = [ln.split()[0] for ln in out.splitlines() if ln.strip()]
    assert "test.frob" in listed
    assert "nvidia.xid" in listed
    assert "mine.yaml:3" in next(ln for ln in out.splitlines() if ln.startswith("test.frob"))


def test_cli_diagnose_with_bad_rules(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d, _text = _bad_dir(tmp_path)
    log = tmp_path / "job.log"
    log.write_text("hello\n", encoding="utf-8")
    rc = main(["diagnose", "--engine", "re", "--rules", str(d), "--logs", str(log)])
    out, err = capsys.readouterr()
    assert rc == 2
    assert out == ""
    assert str(d / "bad.yaml") in err
