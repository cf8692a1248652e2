"""Load rule files into a validated RuleSet, collecting every problem with its file and line.

Loading refuses to start on any error: unknown keys, bad regexes, unresolved templates, duplicate
ids, patterns that match an empty line, stable rules without examples, and examples that fail
(the examples are run through the real engine). Warnings (e.g. an experimental rule without
examples) are reported but do not block.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from trainmedic import cache
from trainmedic.datafile import format_error, node_line, parse_yaml, read_data_file, short_text
from trainmedic.detectors.schema import Rule, RuleFile, RuleStatus
from trainmedic.errors import Problem, RuleLoadError
from trainmedic.rules import RULES_DIR

MAX_RULE_FILE_BYTES = 4 * 1024 * 1024


@dataclass
class RuleSet:
    """Validated rules, in load order, with where each one came from."""

    rules: list[Rule] = field(default_factory=list)
    origins: dict[str, tuple[str, int | None]] = field(default_factory=dict)
    warnings: list[Problem] = field(default_factory=list)

    def by_id(self, rule_id: str) -> Rule:
        for rule in self.rules:
            if rule.id == rule_id:
                return rule
        raise KeyError(rule_id)


def rule_files(dirs: Iterable[Path]) -> list[Path]:
    files: list[Path] = []
    for d in dirs:
        if d.is_file():
            files.append(d)
        else:
            files.extend(sorted(p for p in d.glob("*.y*ml") if p.suffix in (".yaml", ".yml")))
    return files


def parse_rule_file(path: Path) -> tuple[list[tuple[Rule, int | None]], list[Problem]]:
    """Parse one file. Returns the valid rules (with their line) and every problem found."""
    name = str(path)
    problems: list[Problem] = []
    got = read_data_file(path, MAX_RULE_FILE_BYTES, name)
    if isinstance(got, Problem):
        return [], [got]
    _, text = got
    root, data, problem = parse_yaml(text, name)
    if problem is not None:
        return [], [problem]
    if data is None:
        return [], [Problem(name, None, "empty rule file", warning=True)]
    if not isinstance(data, dict):
        return [], [Problem(name, 1, "a rule file is a mapping with `version` and `rules`")]

    # Validate rule by rule so one bad rule does not hide the others.
    rules_data = data.get("rules")
    header = {k: v for k, v in data.items() if k != "rules"}
    try:
        RuleFile.model_validate({**header, "rules": []})
    except ValidationError as exc:
        for err in exc.errors():
            problems.append(Problem(name, node_line(root, err["loc"]), format_error(err)))
    if rules_data is None:
        return [], [*problems, Problem(name, 1, "no `rules:` list", warning=True)]
    if not isinstance(rules_data, list):
        return [], [*problems, Problem(name, node_line(root, ["rules"]), "`rules` must be a list")]

    good: list[tuple[Rule, int | None]] = []
    for i, item in enumerate(rules_data):
        line = node_line(root, ["rules", i])
        rule_id = item.get("id") if isinstance(item, dict) else None
        try:
            rule = Rule.model_validate(item)
        except ValidationError as exc:
            for err in exc.errors():
                problems.append(
                    Problem(name, node_line(root, ["rules", i, *err["loc"]]), format_error(err), str(rule_id))
                )
            continue
        problems.extend(_lint_rule(rule, name, line))
        good.append((rule, line))
    return good, problems


def _lint_rule(rule: Rule, file: str, line: int | None) -> list[Problem]:
    out: list[Problem] = []
    for i, pattern in enumerate(rule.compiled()):
        if pattern.search("") is not None:
            out.append(Problem(file, line, f"pattern {i} matches an empty line", rule.id))
    if not rule.examples.match:
        if rule.status is RuleStatus.STABLE:
            out.append(Problem(file, line, "stable rule without `examples.match`", rule.id))
        else:
            out.append(Problem(file, line, "experimental rule without examples", rule.id, warning=True))
    return out


def load_rules(
    extra_dirs: Sequence[Path] = (),
    *,
    include_shipped: bool = True,
    run_examples: bool = True,
) -> RuleSet:
    """Load the shipped rules plus users' rule directories. Raises RuleLoadError with every problem.

    A rule set that loads without error is kept in the on-disk cache (trainmedic/cache.py), keyed
    by the path and bytes of every rule file: the next process with the same files skips parsing,
    validation and the examples. Problems are never cached: they are found and reported afresh."""
    dirs = ([RULES_DIR] if include_shipped else []) + [Path(d) for d in extra_dirs]
    key = _cache_key(dirs, run_examples)
    cached = cache.load("rules", key) if key is not None else None
    if isinstance(cached, RuleSet):
        return cached
    ruleset = _load_rules(dirs, run_examples=run_examples)
    if key is not None:
        cache.store("rules", key, ruleset)
    return ruleset


def _cache_key(dirs: Sequence[Path], run_examples: bool) -> str | None:
    """The rule set's cache key: every directory given and every rule file's path and bytes."""
    if cache.cache_dir() is None:
        return None
    parts: list[bytes | str] = [f"examples={run_examples}"]
    parts.extend(f"dir={d}:{d.exists()}" for d in dirs)
    for path in rule_files(d for d in dirs if d.exists()):
        try:
            parts.extend((str(path), path.read_bytes()))
        except OSError:
            return None  # the loader reports it
    return cache.make_key("rules", parts)


def _load_rules(dirs: Sequence[Path], *, run_examples: bool) -> RuleSet:
    problems: list[Problem] = []
    ruleset = RuleSet()
    for d in dirs:
        if not d.exists():
            problems.append(Problem(str(d), None, "rule directory does not exist"))
    files = rule_files(d for d in dirs if d.exists())
    if not files:
        problems.append(Problem(", ".join(map(str, dirs)) or "-", None, "no rule files found"))
    for path in files:
        rules, file_problems = parse_rule_file(path)
        problems.extend(file_problems)
        for rule, line in rules:
            if rule.id in ruleset.origins:
                first_file, first_line = ruleset.origins[rule.id]
                problems.append(
                    Problem(str(path), line, f"duplicate id, first defined at {first_file}:{first_line}", rule.id)
                )
                continue
            ruleset.origins[rule.id] = (str(path), line)
            ruleset.rules.append(rule)
    if run_examples and ruleset.rules:
        problems.extend(check_examples(ruleset))
    errors = [p for p in problems if not p.warning]
    ruleset.warnings = [p for p in problems if p.warning]
    if errors:
        raise RuleLoadError(problems)
    return ruleset


def check_examples(ruleset: RuleSet) -> list[Problem]:
    """Run every embedded example through the real engine (the `re` path); one problem per failure."""
    from trainmedic.detectors.engine import Engine  # the engine depends on the schema, not on the loader

    engine = Engine(ruleset.rules, fast=False)
    problems: list[Problem] = []
    for rule in ruleset.rules:
        file, line = ruleset.origins[rule.id]
        for ex in rule.examples.match:
            hits = [f for f in engine.scan_text(ex.line) if f.rule_id == rule.id]
            if not hits:
                problems.append(Problem(file, line, f"example does not match: {short_text(ex.line)}", rule.id))
                continue
            if not any(h.code == ex.code for h in hits):
                got = sorted({h.code for h in hits})
                problems.append(
                    Problem(
                        file, line, f"example gives code {got}, expected {ex.code!r}: {short_text(ex.line)}", rule.id
                    )
                )
            expected_class = ex.fault_class or rule.fault_class
            if not any(h.fault_class == expected_class for h in hits):
                problems.append(
                    Problem(
                        file, line, f"example gives class {hits[0].fault_class}, expected {expected_class}", rule.id
                    )
                )
            for group, value in ex.groups.items():
                got_values = {_group_value(h, group) for h in hits}
                if value not in got_values:
                    problems.append(
                        Problem(
                            file,
                            line,
                            f"example group {group}={sorted(map(str, got_values))}, "
                            f"expected {value!r}: {short_text(ex.line)}",
                            rule.id,
                        )
                    )
        for neg in rule.examples.no_match:
            if any(f.rule_id == rule.id for f in engine.scan_text(neg)):
                problems.append(Problem(file, line, f"no_match example matches: {short_text(neg)}", rule.id))
    return problems


def _group_value(finding: Any, group: str) -> str | None:
    value = finding.groups.get(group) if hasattr(finding, "groups") else None
    if value is None and group in ("node", "device", "rank"):
        value = getattr(finding, group, None)
    return None if value is None else str(value)


__all__ = ["RuleSet", "format_error", "load_rules", "node_line", "parse_yaml", "short_text"]
