"""Reading a policy: `load_policy` (a file, or the shipped `policy.yaml` next to this package, with
its hints) and `parse_policy` (a document), which validate it like the rule files do: every problem
is listed with its file and line (the schema's errors, duplicate ids and namespaces, rules a
catch-all makes unreachable, the last as warnings), and a policy with any error raises
`PolicyError` instead of loading.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from trainmedic.datafile import format_error, node_line, parse_yaml, read_data_file, repeated_keys
from trainmedic.errors import Problem, TrainmedicError
from trainmedic.remediations.hints import HintBook, HintError, default_hints, load_hints
from trainmedic.remediations.policy.core import Policy
from trainmedic.remediations.policy.schema import PolicyFile
from trainmedic.remediations.policy.values import ActionName

# The shipped default lives next to the package: remediations/policy.yaml.
POLICY_FILE = Path(__file__).parent.with_name("policy.yaml")
MAX_POLICY_FILE_BYTES = 1024 * 1024


class PolicyError(TrainmedicError):
    """A policy (or its hints file) that cannot be used. Carries every problem found."""

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = problems
        errors = [p for p in problems if not p.warning]
        lines = "\n".join(f"  {p}" for p in errors)
        super().__init__(f"the remediation policy cannot be used: {len(errors)} problem(s)\n{lines}")


def _clean_loc(loc: Sequence[int | str]) -> list[int | str]:
    """Drop the tag a discriminated union adds after an action's index."""
    out: list[int | str] = []
    for i, part in enumerate(loc):
        if i >= 2 and loc[i - 2] == "actions" and isinstance(loc[i - 1], int) and part in ActionName._value2member_map_:
            continue
        out.append(part)
    return out


def _ids(root: Any, data: Mapping[str, Any], name: str) -> list[Problem]:
    """Duplicate ids across rules and escalation rules, and repeated namespace entries."""
    seen: dict[str, int | None] = {}
    problems = [
        Problem(name, line, f"duplicate id {ident!r}, first defined at line {first}", ident)
        for section in ("escalation", "rules")
        for ident, line, first in repeated_keys(root, data.get(section), section, "id", seen)
    ]
    problems.extend(
        Problem(name, line, f"namespace {pattern!r} is listed twice, first at line {first}")
        for pattern, line, first in repeated_keys(root, data.get("namespaces"), "namespaces", "match", {})
    )
    return problems


def _unreachable(spec: PolicyFile, root: Any, name: str) -> list[Problem]:
    for i, rule in enumerate(spec.rules):
        if rule.match.is_catch_all and i + 1 < len(spec.rules):
            return [
                Problem(
                    name,
                    node_line(root, ["rules", j, "id"]),
                    f"rule is never reached: catch-all rule {rule.id!r} comes first",
                    later.id,
                    warning=True,
                )
                for j, later in enumerate(spec.rules[i + 1 :], start=i + 1)
            ]
    return []


def parse_policy(text: str, name: str = "<policy>", *, hints: HintBook | None = None) -> Policy:
    """Validate a policy document. Raises PolicyError listing every problem with its line."""
    root, data, problem = parse_yaml(text, name)
    if problem is not None:
        raise PolicyError([problem])
    if not isinstance(data, dict):
        raise PolicyError([Problem(name, 1, "a policy file is a mapping with `mode`, `rules`, `budgets`, ...")])
    problems: list[Problem] = []
    spec: PolicyFile | None = None
    try:
        spec = PolicyFile.model_validate(data)
    except ValidationError as exc:
        for err in exc.errors():
            loc = _clean_loc(err["loc"])
            rule_id = None
            if len(loc) >= 2 and loc[0] in ("rules", "escalation") and isinstance(loc[1], int):
                items = data.get(str(loc[0]))
                item = items[loc[1]] if isinstance(items, list) and loc[1] < len(items) else None
                rule_id = item.get("id") if isinstance(item, dict) and isinstance(item.get("id"), str) else None
            problems.append(Problem(name, node_line(root, loc), format_error({**err, "loc": loc}), rule_id))
    problems.extend(_ids(root, data, name))
    if spec is not None:
        problems.extend(_unreachable(spec, root, name))
    if spec is None or any(not p.warning for p in problems):
        problems.sort(key=lambda p: (p.line or 0, p.message))
        raise PolicyError(problems)
    return Policy(spec, hints or default_hints(), name, tuple(problems))


def load_policy(path: str | Path | None = None, *, hints_path: str | Path | None = None) -> Policy:
    """Load a policy file (None: the shipped default) and its hints. Raises PolicyError."""
    p = POLICY_FILE if path is None else Path(path)
    try:
        book = default_hints() if hints_path is None else load_hints(hints_path)
    except HintError as exc:
        raise PolicyError(exc.problems) from None
    got = read_data_file(p, MAX_POLICY_FILE_BYTES)
    if isinstance(got, Problem):
        raise PolicyError([got])
    return parse_policy(got[1], str(p), hints=book)
