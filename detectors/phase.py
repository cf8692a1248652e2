"""Which phase a communication failure happened in: building the communicator, or training.

docs/contracts.md: a communication failure raised while the communicator, rendezvous or store is being
built is `comm_init` whatever the result code says; the same code during training is `comm_error`;
waiting on peers past a deadline during training is `hang`. The phase is decided here, once, for
every rule, from phase markers (rules/phases/phases.yaml) rather than by each rule's wording:

1. A marker on the finding's own line decides (a runtime marker wins over an init one there:
   NCCL's `ncclCommInitRank ... - Init COMPLETE` ends initialisation).
2. Otherwise the nearest marker around it decides: the frames of the traceback above it
   (`in init_process_group`, `in _store_based_barrier` / `in all_reduce`), NCCL's `init.cc:1234 -> 2`
   return-code trail, HCCL's `HcclCommInitRootInfo` lines, looking up to `BEFORE` lines back and
   `AFTER` lines ahead within the same text. Nearer lines win; at equal distance, the line before.
3. No marker: the rule's own class stands.

Only findings of phase-sensitive rules are resolved (a rule's `phase`, by default true for the
classes `comm_error` and `hang`), and only towards `comm_init`: a timeout or result code met while
the communicator is being built becomes an init failure; nothing is ever moved out of `comm_init`.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from trainmedic import cache
from trainmedic.datafile import format_error, node_line, parse_yaml
from trainmedic.errors import Problem, TrainmedicError
from trainmedic.models import FaultClass
from trainmedic.rules import RULES_DIR

PHASES_FILE = RULES_DIR / "phases" / "phases.yaml"
BEFORE = 30
AFTER = 8
MAX_LINE = 512  # bytes of a line looked at for markers (log lines can be megabytes)
# Classes a phase marker may turn into comm_init.
PHASE_SENSITIVE = frozenset({FaultClass.COMM_ERROR, FaultClass.HANG})


class Marker(BaseModel):
    model_config = ConfigDict(extra="forbid")

    pattern: str = Field(min_length=1)
    note: str = ""


class PhaseFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    version: int = Field(default=1, ge=1, le=1)
    # Markers of a communicator, rendezvous or store being built.
    init: list[Marker] = Field(min_length=1)
    # Markers of collectives running in training (or of initialisation having completed).
    runtime: list[Marker] = Field(min_length=1)


class PhaseError(TrainmedicError):
    """The phase marker file cannot be used; every problem is listed as file:line."""

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = problems
        super().__init__("; ".join(str(p) for p in problems))


class PhaseMarkers:
    """The init and runtime markers, each one alternation compiled over bytes at first use (the
    engine hands raw lines over without decoding them; most scans never need a phase)."""

    def __init__(self, init: list[str], runtime: list[str]) -> None:
        self.init_patterns = init
        self.runtime_patterns = runtime
        self._compiled: tuple[re.Pattern[bytes], re.Pattern[bytes]] | None = None

    def _regexes(self) -> tuple[re.Pattern[bytes], re.Pattern[bytes]]:
        if self._compiled is None:
            self._compiled = (_alternation(self.init_patterns), _alternation(self.runtime_patterns))
        return self._compiled

    @property
    def init(self) -> re.Pattern[bytes]:
        return self._regexes()[0]

    @property
    def runtime(self) -> re.Pattern[bytes]:
        return self._regexes()[1]

    def on_line(self, text: bytes) -> FaultClass | None:
        """COMM_ERROR when the line carries a runtime marker, COMM_INIT for an init one, else None.

        Runtime first: the lines that end initialisation name the init call too."""
        if self.runtime.search(text):
            return FaultClass.COMM_ERROR
        if self.init.search(text):
            return FaultClass.COMM_INIT
        return None

    def resolve(
        self, fault_class: FaultClass, line: bytes, neighbour: Callable[[int], FaultClass | None]
    ) -> FaultClass:
        """The class of a finding on `line`. `neighbour(k)` is the phase marked on the line k lines away
        (None: no marker there, or no such line)."""
        if fault_class not in PHASE_SENSITIVE:
            return fault_class
        phase = self.on_line(line[:MAX_LINE])
        k = 1
        while phase is None and k <= BEFORE:
            for offset in (-k, k) if k <= AFTER else (-k,):
                phase = neighbour(offset)
                if phase is not None:
                    break
            k += 1
        return FaultClass.COMM_INIT if phase is FaultClass.COMM_INIT else fault_class


def _alternation(patterns: list[str]) -> re.Pattern[bytes]:
    return re.compile("|".join(f"(?:{p})" for p in patterns).encode("utf-8"), re.ASCII)


def _check(markers: list[Marker], name: str, what: str, problems: list[Problem]) -> list[str]:
    for i, m in enumerate(markers):
        try:
            re.compile(m.pattern)
        except re.error as exc:
            problems.append(Problem(name, None, f"{what}.{i}: invalid regex {m.pattern!r}: {exc}"))
    return [m.pattern for m in markers]


def parse_phase_file(text: str, name: str) -> PhaseMarkers:
    root, data, problem = parse_yaml(text, name)
    if problem is not None:
        raise PhaseError([problem])
    try:
        spec = PhaseFile.model_validate(data)
    except ValidationError as exc:
        raise PhaseError([Problem(name, node_line(root, e["loc"]), format_error(e)) for e in exc.errors()]) from None
    problems: list[Problem] = []
    init = _check(spec.init, name, "init", problems)
    runtime = _check(spec.runtime, name, "runtime", problems)
    if problems:
        raise PhaseError(problems)
    return PhaseMarkers(init=init, runtime=runtime)


def load_phase_markers(path: Path = PHASES_FILE) -> PhaseMarkers:
    """The phase markers as the file reads now, like the rules beside them (a process that loads the
    rules again after an edit gets markers of the same edit); validated once per content
    (trainmedic.cache) and kept per content in the process, compiled at first use."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise PhaseError([Problem(str(path), None, f"cannot read: {exc.strerror or exc}")]) from None
    return _markers_of(str(path), data)


@functools.lru_cache(maxsize=4)
def _markers_of(path: str, data: bytes) -> PhaseMarkers:
    key = cache.make_key("phases", [path, data])
    hit = cache.load("phases", key)
    if isinstance(hit, tuple) and len(hit) == 2:
        return PhaseMarkers(init=list(hit[0]), runtime=list(hit[1]))
    markers = parse_phase_file(data.decode("utf-8", "replace"), Path(path).name)
    cache.store("phases", key, (markers.init_patterns, markers.runtime_patterns))
    return markers
