"""Exceptions shared across packages. Each names what went wrong and where, in one line.

What the code that catches an error must do is carried by the error's type, in one tree for every
layer (the Kubernetes client, the watchers, the workload adapters, the sinks, the actions), the way
kopf's errors tell its framework what to do:

    TrainmedicError
    +-- TemporaryError      try again after `delay` seconds (None: the caller's own backoff); 429,
    |                       5xx, a connection lost, a watch to relist, a workload still terminating
    +-- PermanentError      retrying will not help: RBAC forbidden, the object or API missing, an
    |                       invalid request, a workload another controller owns, a sink's 4xx; an
    |                       incident it stops ends `failed` and pages a person
    +-- FatalError          the agent itself cannot go on with the work (its store is unusable)
    +-- (input and data-file errors: RuleLoadError, InputError, PolicyError, ... reported, not retried)

Each layer's own errors (remediations.kube.errors.KubeError, agent.watchers.k8s.errors.WatchError,
remediations.workloads.WorkloadError, agent.notify, remediations.errors) subclass one of the three,
so `retry_meaning` answers for any of them.
"""

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


class TemporaryError(TrainmedicError):
    """Worth trying again after `delay` seconds (None: the caller's own backoff decides)."""

    delay: float | None = None

    def __init__(self, message: str, *, delay: float | None = None) -> None:
        super().__init__(message)
        self.delay = delay


class PermanentError(TrainmedicError):
    """Retrying will not help; whatever it stopped has failed (an incident: `failed`, and paged)."""


class FatalError(TrainmedicError):
    """The agent cannot go on with this work at all (its own store is unusable)."""


def retry_meaning(exc: BaseException) -> type[TemporaryError] | type[PermanentError] | type[FatalError] | None:
    """Which branch of the tree `exc` is on; None for an error outside it (callers treat that as
    permanent: an error nobody expected is never retried forever)."""
    for kind in (FatalError, TemporaryError, PermanentError):
        if isinstance(exc, kind):
            return kind
    return None
