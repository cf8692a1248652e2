"""The rule file schema: what a YAML file under rules/ may say, and nothing more.

A rule file is `{version: 1, rules: [Rule, ...]}`. Unknown keys are rejected everywhere, so a typo
is an error at load time, never a silently ignored setting (node-problem-detector, pySigma).
Regexes use Python `re` syntax; named groups feed the `code` / `message` / `hint` templates and
localisation (`node`, `device`, `rank`, `pci`).
"""

from __future__ import annotations

import re
import string
from enum import StrEnum
from typing import Annotated

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from trainmedic.models import Action, Chip, FaultClass, I18nText, Severity, Source

# Named groups with a meaning of their own: they localise the finding.
LOCATION_GROUPS = frozenset({"node", "device", "rank", "pci"})
MAX_CONTINUATION_LINES = 5


class RuleStatus(StrEnum):
    EXPERIMENTAL = "experimental"
    STABLE = "stable"


def _as_list(value: object) -> object:
    return [value] if isinstance(value, str) else value


def _check_regex(pattern: str) -> str:
    try:
        re.compile(pattern)
    except re.error as exc:
        raise ValueError(f"invalid regex {pattern!r}: {exc}") from None
    return pattern


# Validated one by one, so an error points at the offending item (and its YAML line).
Regex = Annotated[str, AfterValidator(_check_regex)]


class MatchExample(BaseModel):
    """A text that must produce a finding of this rule, with the expected class and code.

    `line` may hold several lines (a block string) for rules that join continuation lines.
    `groups` optionally pins localisation values, e.g. `{device: "3", rank: "1"}`.
    """

    model_config = ConfigDict(extra="forbid", defer_build=True)

    line: str = Field(min_length=1)
    code: str = Field(min_length=1)
    fault_class: FaultClass | None = None
    groups: dict[str, str] = Field(default_factory=dict)


class Examples(BaseModel):
    model_config = ConfigDict(extra="forbid", defer_build=True)

    match: list[MatchExample] = Field(default_factory=list)
    # Near misses: keyword-rich lines that must NOT produce a finding of this rule.
    no_match: list[str] = Field(default_factory=list)


class Rule(BaseModel):
    model_config = ConfigDict(extra="forbid", defer_build=True)

    id: str = Field(pattern=r"^[a-z0-9][a-z0-9_.-]*$", max_length=80)
    status: RuleStatus
    source: Annotated[list[Source], BeforeValidator(_as_list)] = Field(min_length=1)
    chip: Chip
    fault_class: FaultClass
    patterns: Annotated[list[Regex], BeforeValidator(_as_list)] = Field(min_length=1)
    # A line matching any of these is not a finding of this rule (e.g. "this is not a failure").
    unless: Annotated[list[Regex], BeforeValidator(_as_list)] = Field(default_factory=list)
    # Template over the named groups, e.g. "xid:{xid}"; `defaults` fills groups a pattern lacks.
    code: str = Field(min_length=1)
    defaults: dict[str, str] = Field(default_factory=dict)
    severity: Severity
    message: I18nText
    hint: I18nText
    # Used when the code is not in the chip's vendor catalog (the catalog wins when it is).
    action: Action | None = None
    vendor_action: str | None = None
    # Correlation weight override (0-100); by default the fault class decides (detectors.correlator).
    priority: int | None = Field(default=None, ge=0, le=100)
    # Phase-sensitive (detectors/phase.py): the class becomes comm_init when the failure happened while
    # a communicator, rendezvous or store was being built. Default: true for comm_error and hang.
    phase: bool | None = None
    # The chip catalog's class for the code wins over `fault_class` when the code is catalogued
    # (generic code extractors: any Xid, any CANN error code); `fault_class` is the fallback.
    catalog_class: bool = False
    # A Python exception: name the frame of the user's code that raised it (the last traceback frame
    # above the line that is not in an installed library), appended to the message.
    user_frame: bool = False
    # Join up to N following continuation lines before extracting groups (multi-line messages).
    continuation: int = Field(default=0, ge=0, le=MAX_CONTINUATION_LINES)
    references: list[str] = Field(default_factory=list)
    tags: list[str] = Field(default_factory=list)
    examples: Examples = Field(default_factory=Examples)

    @model_validator(mode="after")
    def _templates_resolve(self) -> Rule:
        """Every placeholder in code/message/hint is a named group of every pattern or a default."""
        fields = {
            "code": self.code,
            "message.en": self.message.en,
            "message.zh": self.message.zh,
            "hint.en": self.hint.en,
            "hint.zh": self.hint.zh,
        }
        problems = []
        for i, pattern in enumerate(self.patterns):
            known = set(re.compile(pattern).groupindex) | set(self.defaults) | {"code"}
            for name, template in fields.items():
                for placeholder in template_fields(template):
                    if placeholder not in known:
                        problems.append(
                            f"{name} uses {{{placeholder}}} but pattern {i} has no such named "
                            "group and `defaults` does not set it"
                        )
        if problems:
            raise ValueError("; ".join(sorted(set(problems))))
        return self

    def compiled(self) -> list[re.Pattern[str]]:
        return [re.compile(p) for p in self.patterns]


class RuleFile(BaseModel):
    model_config = ConfigDict(extra="forbid", defer_build=True)

    version: int = Field(default=1, ge=1, le=1)
    rules: list[Rule] = Field(default_factory=list)


def template_fields(template: str) -> list[str]:
    """Names used as `{name}` placeholders in a str.format template."""
    names = []
    for _, name, _, _ in string.Formatter().parse(template):
        if name is not None and name != "":
            names.append(name)
    return names
