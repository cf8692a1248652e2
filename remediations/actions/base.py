"""What an action is and what it runs against (see remediations/actions/__init__.py).

An action runs against the incident's journal, never against the incident store directly: the
journal is the responder's adapter over the store (remediations do not import the agent), with
the states as strings: planned, running, deleting, creating, done, skipped, failed. Each step is
journalled *before* the cluster changes, so `run()` called again after a crash carries on from the
state it finds. Failures are raised as the types of remediations.errors; an action whose journal is
past a delete (deleting, creating) is never failed by the responder (its error is held and paged).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ParamSpec, Protocol, TypeVar

from trainmedic.events import JobRef
from trainmedic.models import RootCause
from trainmedic.remediations.kube import KubeOps
from trainmedic.remediations.policy import Policy, PolicyContext
from trainmedic.remediations.policy_state import PolicyState
from trainmedic.remediations.stacks import StackSource

P = ParamSpec("P")
T = TypeVar("T")


@dataclass(frozen=True)
class Entry:
    """One action of the incident's plan, as the journal holds it."""

    seq: int
    name: str
    state: str
    params: dict[str, Any]
    result: dict[str, Any] | None = None


class Journal(Protocol):
    incident_id: str

    async def entries(self) -> list[Entry]:
        """Every action of the incident, read now."""
        ...

    async def update(
        self, seq: int, state: str, *, params: Mapping[str, Any] | None = None, result: Mapping[str, Any] | None = None
    ) -> None:
        """Record a step (journal first: awaited before the cluster changes; the store is written
        off the event loop, and the step is on disk when the await returns)."""
        ...


class RestartSettings(Protocol):
    wait_gone_s: float
    gone_deadline_s: float
    retry_after_s: float
    breaker_settle_s: float
    stack_timeout_s: float


class Runtime(Protocol):
    """What an action uses of the agent that runs it."""

    kube: KubeOps
    policy: Policy
    policy_state: PolicyState
    clock: Callable[[], float]

    @property
    def settings(self) -> RestartSettings: ...

    @property
    def stack_source(self) -> StackSource:
        """Exec into pods and read their logs (for stack dumps)."""
        ...

    async def job_pods(self, job: JobRef) -> list[dict[str, Any]]:
        """The job's pods as the API lists them now."""
        ...

    async def scene_path(self, incident_id: str) -> Path | None:
        """The incident's scene directory, where evidence taken later is added."""
        ...

    async def find_workload(self, job: JobRef) -> dict[str, Any] | None:
        """The job's workload object, whatever its kind (None: gone)."""
        ...

    async def restart_under_way(self, job: JobRef, incident_id: str) -> str | None:
        """Another incident than `incident_id` whose restart of the job is between its delete and its
        create (the job is being recreated now), or None."""
        ...

    async def replacement(
        self, incident_id: str, live: dict[str, Any], rc: RootCause
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """The body that recreates `live` (checkpoint, excluded nodes, memory), and what went into it."""
        ...

    async def policy_context(self, incident_id: str, rc: RootCause) -> PolicyContext:
        """The policy context of the incident as its plan recorded it."""
        ...

    async def in_policy(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """Run one step on the policy state (a reservation, its commit or release, a refusal
        recorded) off the event loop, one at a time with the plan-time decisions, so a reservation
        stays atomic with them. Once started, the step completes even if the caller is cancelled."""
        ...

    def save_body(self, incident_id: str, seq: int, body: Mapping[str, Any]) -> dict[str, Any]:
        """Keep the full replacement body outside the journal; the reference the journal keeps."""
        ...

    def load_body(self, params: Mapping[str, Any]) -> dict[str, Any]: ...

    def body_path(self, params: Mapping[str, Any]) -> Path | None:
        """Where the full replacement body the journal refers to is kept (None: in the journal itself,
        as written before bodies were kept apart)."""
        ...

    def drop_body(self, params: Mapping[str, Any]) -> None: ...


@dataclass(frozen=True)
class ActionCall:
    """One run of one action of one incident."""

    journal: Journal
    entry: Entry
    rc: RootCause
    job: JobRef | None
    runtime: Runtime

    @property
    def incident_id(self) -> str:
        return self.journal.incident_id

    @property
    def seq(self) -> int:
        return self.entry.seq

    async def state(self) -> str:
        return next(e.state for e in (await self.journal.entries()) if e.seq == self.seq)


@dataclass(frozen=True)
class ActionDef:
    """An action: its policy spec, its parameters, its preconditions, its run.

    `parameters` are the keys the plan records for it (the policy builds them). `preconditions`
    says in words what `run` checks before it changes anything (and raises on when unmet).
    """

    name: str
    spec: tuple[type[Any], ...]
    parameters: tuple[str, ...]
    preconditions: tuple[str, ...]
    run: Callable[[ActionCall], Awaitable[None]]
    # Whether the action changes the cluster (a blocked plan still notifies).
    mutating: bool = True
