"""Framework-aware advice for failures a restart cannot fix (device OOM first of all).

An accelerator OOM is the job's own doing: restarting it as is fails again. What helps depends on
the framework (DeepSpeed's ZeRO stage and offload, Megatron's --micro-batch-size and recompute,
Hugging Face's per_device_train_batch_size and gradient_checkpointing, ...) and on what the
allocator reported (a large "reserved but unallocated" share means fragmentation, which
`expandable_segments` fixes without touching the model). The knowledge is data (`hints.yaml`):
frameworks are recognised by regexes on the finding texts, rule ids, log file / pod names and any
extra log lines the caller has (the scene's log tail); each hint names the frameworks, chips,
text patterns or computed signals it applies to. Hints marked `generic` are given only when no
framework is recognised.

The file is validated like the rule files: unknown keys, bad regexes, unknown frameworks or
signals and duplicate ids are all reported with file:line, and a broken file refuses to load.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from trainmedic.datafile import format_error, node_line, parse_yaml, read_data_file, repeated_keys
from trainmedic.errors import Problem, TrainmedicError
from trainmedic.models import Chip, FaultClass, Finding, I18nText

HINTS_FILE = Path(__file__).with_name("hints.yaml")
MAX_HINT_FILE_BYTES = 1024 * 1024
# Bounds on what is searched, so a huge log tail cannot make hint lookup slow.
MAX_TEXTS = 2000
MAX_TEXT_CHARS = 4096
ID_RE = r"^[a-z0-9][a-z0-9_.-]{0,79}$"


class HintError(TrainmedicError):
    """A hints file that cannot be used. Carries every problem found, not just the first."""

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = problems
        errors = [p for p in problems if not p.warning]
        super().__init__(f"{len(errors)} problem(s) in the hints file; first: {errors[0] if errors else '-'}")


# --- computed signals -------------------------------------------------------------------------

_SIZE = r"(?P<{name}>\d+(?:\.\d+)?) ?(?P<{name}_unit>[KMGTP]?i?B|bytes)"
_TRIED = re.compile(r"Tried to allocate " + _SIZE.format(name="tried"))
# torch >= 2.2: "... and 1.32 GiB is reserved by PyTorch but unallocated."
_UNALLOCATED = re.compile(_SIZE.format(name="free") + r" is reserved by PyTorch but unallocated")
# torch 1.x and torch_npu: "(GPU 0; ...; 28.82 GiB already allocated; ...; 29.97 GiB reserved in total by PyTorch)"
_ALLOCATED = re.compile(_SIZE.format(name="alloc") + r" already allocated")
_RESERVED = re.compile(_SIZE.format(name="res") + r" reserved in total by PyTorch")
_UNITS = {
    "B": 1,
    "bytes": 1,
    "KB": 1000,
    "MB": 1000**2,
    "GB": 1000**3,
    "TB": 1000**4,
    "PB": 1000**5,
    "KiB": 1024,
    "MiB": 1024**2,
    "GiB": 1024**3,
    "TiB": 1024**4,
    "PiB": 1024**5,
}


def _bytes(m: re.Match[str], name: str) -> float:
    return float(m.group(name)) * _UNITS.get(m.group(f"{name}_unit"), 1)


def fragmentation(texts: Iterable[str]) -> bool:
    """The caching allocator held enough free-but-reserved memory for the failed allocation.

    That is the case `expandable_segments:True` is for: the memory is there, but not in one
    piece. Read from PyTorch's (and torch_npu's) own OOM message.
    """
    for text in texts:
        tried = _TRIED.search(text)
        if tried is None:
            continue
        unalloc = _UNALLOCATED.search(text)
        if unalloc is not None:
            spare = _bytes(unalloc, "free")
        else:
            alloc, res = _ALLOCATED.search(text), _RESERVED.search(text)
            if alloc is None or res is None:
                continue
            spare = _bytes(res, "res") - _bytes(alloc, "alloc")
        if spare > 0 and spare >= _bytes(tried, "tried"):
            return True
    return False


SIGNALS: dict[str, Callable[[Sequence[str]], bool]] = {"fragmentation": fragmentation}


# --- the file schema --------------------------------------------------------------------------


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class FrameworkSpec(_Model):
    id: str = Field(pattern=ID_RE)
    name: str = Field(min_length=1)
    patterns: list[str] = Field(min_length=1)


class WhenSpec(_Model):
    """Every condition given must hold; within one list, any item may."""

    frameworks: list[str] = Field(default_factory=list)
    chips: list[Chip] = Field(default_factory=list)
    patterns: list[str] = Field(default_factory=list)
    signals: list[str] = Field(default_factory=list)
    # Only when no framework is recognised (the generic advice).
    generic: bool = False


class HintSpec(_Model):
    id: str = Field(pattern=ID_RE)
    fault_class: FaultClass = FaultClass.ACCELERATOR_OOM
    when: WhenSpec = Field(default_factory=WhenSpec)
    en: str = Field(min_length=1)
    zh: str = Field(min_length=1)
    source: str | None = None


class HintFile(_Model):
    version: int = Field(1, ge=1, le=1)
    frameworks: list[FrameworkSpec] = Field(default_factory=list)
    hints: list[HintSpec] = Field(default_factory=list)


@dataclass(frozen=True)
class Framework:
    id: str
    name: str
    patterns: tuple[re.Pattern[str], ...]

    def seen_in(self, texts: Sequence[str]) -> bool:
        return any(p.search(t) for p in self.patterns for t in texts)


@dataclass(frozen=True)
class Hint:
    id: str
    fault_class: FaultClass
    text: I18nText
    frameworks: frozenset[str]
    chips: frozenset[Chip]
    patterns: tuple[re.Pattern[str], ...]
    signals: tuple[str, ...]
    generic: bool


@dataclass(frozen=True)
class HintBook:
    """The validated hints, in file order."""

    frameworks: tuple[Framework, ...]
    hints: tuple[Hint, ...]
    source: str = "-"

    def recognise(self, texts: Sequence[str]) -> list[str]:
        """Ids of the frameworks the texts show, in file order."""
        return [fw.id for fw in self.frameworks if fw.seen_in(texts)]

    def select(self, fault_class: FaultClass, findings: Sequence[Finding], texts: Iterable[str] = ()) -> list[Hint]:
        corpus = evidence_texts(findings, texts)
        frameworks = set(self.recognise(corpus))
        chips = {f.chip for f in findings if f.fault_class is fault_class} or {f.chip for f in findings}
        signal_cache: dict[str, bool] = {}

        def signal(name: str) -> bool:
            if name not in signal_cache:
                signal_cache[name] = SIGNALS[name](corpus)
            return signal_cache[name]

        out: list[Hint] = []
        for hint in self.hints:
            if hint.fault_class is not fault_class:
                continue
            if hint.generic and frameworks:
                continue
            if hint.frameworks and not hint.frameworks & frameworks:
                continue
            if hint.chips and not hint.chips & chips:
                continue
            if hint.patterns and not any(p.search(t) for p in hint.patterns for t in corpus):
                continue
            if hint.signals and not any(signal(s) for s in hint.signals):
                continue
            out.append(hint)
        return out


def evidence_texts(findings: Sequence[Finding], texts: Iterable[str] = ()) -> list[str]:
    """What framework recognition reads: finding texts, rule ids, file / pod / job names, extra lines."""
    out: list[str] = []
    for f in findings:
        out.extend(s for s in (f.text, f.rule_id, f.file, f.pod, f.job) if s)
    for t in texts:
        if len(out) >= MAX_TEXTS:
            break
        if t:
            out.append(t)
    return [t[:MAX_TEXT_CHARS] for t in out[:MAX_TEXTS]]


def _compile(pattern: str) -> tuple[re.Pattern[str] | None, str | None]:
    try:
        rx = re.compile(pattern)
    except re.error as exc:
        return None, f"bad regex {pattern!r}: {exc}"
    if rx.search("") is not None:
        return None, f"regex {pattern!r} matches an empty text"
    return rx, None


def _duplicate_ids(root: Any, data: dict[str, Any], name: str) -> list[Problem]:
    """Ids used twice within `frameworks` or within `hints`, read from the raw document."""
    return [
        Problem(name, line, f"duplicate id {ident!r}, first defined at line {first}")
        for section in ("frameworks", "hints")
        for ident, line, first in repeated_keys(root, data.get(section), section, "id", {})
    ]


def parse_hints(text: str, name: str) -> HintBook:
    """Validate a hints document. Raises HintError with every problem found."""
    root, data, problem = parse_yaml(text, name)
    if problem is not None:
        raise HintError([problem])
    if not isinstance(data, dict):
        raise HintError([Problem(name, 1, "a hints file is a mapping with `version`, `frameworks` and `hints`")])
    problems: list[Problem] = _duplicate_ids(root, data, name)
    try:
        spec = HintFile.model_validate(data)
    except ValidationError as exc:
        for err in exc.errors():
            problems.append(Problem(name, node_line(root, err["loc"]), format_error(err)))
        problems.sort(key=lambda p: p.line or 0)
        raise HintError(problems) from None

    frameworks: list[Framework] = []

    def compile_all(patterns: list[str], loc: list[int | str]) -> tuple[re.Pattern[str], ...]:
        out: list[re.Pattern[str]] = []
        for j, p in enumerate(patterns):
            rx, err = _compile(p)
            if err is not None:
                problems.append(Problem(name, node_line(root, [*loc, j]), err))
            elif rx is not None:
                out.append(rx)
        return tuple(out)

    for i, fw in enumerate(spec.frameworks):
        frameworks.append(Framework(fw.id, fw.name, compile_all(fw.patterns, ["frameworks", i, "patterns"])))
    known = {fw.id for fw in frameworks}
    hints: list[Hint] = []
    for i, h in enumerate(spec.hints):
        for j, fw_id in enumerate(h.when.frameworks):
            if fw_id not in known:
                problems.append(
                    Problem(
                        name, node_line(root, ["hints", i, "when", "frameworks", j]), f"unknown framework {fw_id!r}"
                    )
                )
        for j, sig in enumerate(h.when.signals):
            if sig not in SIGNALS:
                problems.append(
                    Problem(
                        name,
                        node_line(root, ["hints", i, "when", "signals", j]),
                        f"unknown signal {sig!r} (known: {', '.join(sorted(SIGNALS))})",
                    )
                )
        if h.when.generic and h.when.frameworks:
            problems.append(
                Problem(name, node_line(root, ["hints", i, "when"]), "a generic hint cannot also name frameworks")
            )
        hints.append(
            Hint(
                id=h.id,
                fault_class=h.fault_class,
                text=I18nText(en=h.en.strip(), zh=h.zh.strip()),
                frameworks=frozenset(h.when.frameworks),
                chips=frozenset(h.when.chips),
                patterns=compile_all(h.when.patterns, ["hints", i, "when", "patterns"]),
                signals=tuple(h.when.signals),
                generic=h.when.generic,
            )
        )
    if problems:
        raise HintError(problems)
    return HintBook(tuple(frameworks), tuple(hints), name)


def load_hints(path: str | Path | None = None) -> HintBook:
    """Load a hints file (None: the shipped one). Raises HintError with every problem found."""
    p = HINTS_FILE if path is None else Path(path)
    got = read_data_file(p, MAX_HINT_FILE_BYTES)
    if isinstance(got, Problem):
        raise HintError([got])
    return parse_hints(got[1], str(p))


@lru_cache(maxsize=1)
def default_hints() -> HintBook:
    """The shipped hints, loaded once."""
    return load_hints(None)


def hints_for(
    fault_class: FaultClass, findings: Sequence[Finding], texts: Iterable[str] = (), *, book: HintBook | None = None
) -> list[I18nText]:
    """The hints for a fault class, chosen from what the findings (and extra log lines) show."""
    return [h.text for h in (book or default_hints()).select(fault_class, findings, texts)]


def oom_hints(
    findings: Sequence[Finding], texts: Iterable[str] = (), *, book: HintBook | None = None
) -> list[I18nText]:
    """Advice for an accelerator OOM: framework-specific when the framework shows, generic otherwise."""
    return hints_for(FaultClass.ACCELERATOR_OOM, findings, texts, book=book)


def recognise_frameworks(
    findings: Sequence[Finding], texts: Iterable[str] = (), *, book: HintBook | None = None
) -> list[str]:
    return (book or default_hints()).recognise(evidence_texts(findings, texts))


__all__ = [
    "HINTS_FILE",
    "SIGNALS",
    "Framework",
    "Hint",
    "HintBook",
    "HintError",
    "default_hints",
    "evidence_texts",
    "fragmentation",
    "hints_for",
    "load_hints",
    "oom_hints",
    "parse_hints",
    "recognise_frameworks",
]
