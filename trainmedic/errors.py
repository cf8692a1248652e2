"""Exceptions shared across packages. Each names what went wrong and where, in one line."""

from __future__ import annotations

from dataclasses import dataclass


class TrainmedicError(Exception):
    """Base of every error trainmedic raises on purpose."""


@dataclass(frozen=True, slots=True)
class Problem:
    """One problem found in a data file (rule file, catalog, policy), located as file:line."""

    file: str
    line: int | None
    message: str
    rule_id: str | None = None
    warning: bool = False

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        kind = "warning" if self.warning else "error"
        rule = f" [{self.rule_id}]" if self.rule_id else ""
        return f"{where}: {kind}{rule}: {self.message}"


class RuleLoadError(TrainmedicError):
    """Rule files that cannot be used. Carries every problem found, not just the first."""

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = problems
        errors = [p for p in problems if not p.warning]
        super().__init__(f"{len(errors)} problem(s) in rule files; first: {errors[0] if errors else '-'}")


class InputError(TrainmedicError):
    """Input that cannot be diagnosed (missing path, unreadable file, nothing to read)."""
