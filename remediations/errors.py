"""What an action's failure means for the incident, in one tree (kopf's model, STYLE.md).

    RemediationError (TrainmedicError)
    +-- TemporaryActionError  try again after `delay` seconds; the action keeps its journal state
    |                         (`escalate`: past its deadline, a person is told, the wait goes on;
    |                         None: the responder's own deadline, `retry_deadline_s`, decides;
    |                         `backoff`: the delay doubles with each try, up to `retry_max_s`)
    +-- PermanentActionError  retrying will not help: the action fails, the incident ends `failed`
    |   |                     and a person is paged
    |   +-- StalePlan         the job is not the one the plan was made for (resubmitted meanwhile,
    |                         absent when the plan was made, or being deleted by someone else)
    +-- ActionBlocked         the policy refuses at the moment of acting (circuit breaker, restart
    |                         budget, lifetime cap, a wait past its deadline): the remaining changes
    |                         are skipped, the incident ends `blocked` and a person is paged
    +-- FatalActionError      the agent itself cannot go on with the incident (its store is
                              unusable): logged and raised to the worker

Each is also on a branch of trainmedic.errors' one tree (TemporaryError / PermanentError /
FatalError), which every layer raises on. `classify` turns anything an action raised into one of
these by that branch alone: a Kubernetes 5xx or a watch to relist is temporary, a workload the
adapters cannot handle or an RBAC refusal permanent, and any exception outside the tree is permanent
too, so an incident is never left `acting` by an error nobody expected.

One exception to "permanent fails the action": a restart whose journal is past its delete
(`deleting`, `creating`). The job is gone and the journal's body is the only full copy of its
spec, so nothing may end the journal there: the action turns such an error into a
TemporaryActionError that escalates at once and backs off, and the responder treats any permanent
error it still gets from an action in those states the same way.
"""

from __future__ import annotations

import sqlite3

from trainmedic.errors import FatalError, PermanentError, TemporaryError, TrainmedicError, retry_meaning
from trainmedic.models import I18nText


class RemediationError(TrainmedicError):
    """An action could not be carried out; the subclass says what happens next."""


class TemporaryActionError(RemediationError, TemporaryError):
    """Try again after `delay`; with `escalate`, a person is told now (the wait passed its deadline)
    while the action keeps waiting: its journal must be carried to the end, not dropped."""

    def __init__(
        self,
        message: str,
        *,
        delay: float | None = None,
        escalate: bool | None = None,
        backoff: bool = False,
        why: I18nText | None = None,
    ) -> None:
        TemporaryError.__init__(self, message, delay=delay)
        # True: escalate now; False: the action judges its own deadline and it has not passed;
        # None: the responder's deadline for temporary failures (`retry_deadline_s`) decides.
        self.escalate = escalate
        self.backoff = backoff
        # What a person is told when it escalates, in both languages (None: the message).
        self.why = why


class PermanentActionError(RemediationError, PermanentError):
    pass


class StalePlan(PermanentActionError):
    """The job is not the one the plan was made for; `why` says how in both languages."""

    def __init__(self, message: str, *, why: I18nText | None = None) -> None:
        super().__init__(message)
        self.why = why


class ActionBlocked(RemediationError):
    def __init__(self, why: I18nText) -> None:
        super().__init__(why.en)
        self.why = why


class FatalActionError(RemediationError, FatalError):
    pass


def classify(exc: BaseException) -> RemediationError:
    """The retry meaning of an exception an action raised, read from trainmedic.errors' one tree
    (the Kubernetes layer, the workload adapters, the watchers and the sinks all raise on it); the
    incident store's own failures are fatal; anything outside the tree is permanent."""
    if isinstance(exc, RemediationError):
        return exc
    kind = retry_meaning(exc)
    if kind is TemporaryError:
        return TemporaryActionError(str(exc), delay=getattr(exc, "delay", None))
    if kind is FatalError or isinstance(exc, sqlite3.Error):
        return FatalActionError(f"the incident store failed: {exc}" if isinstance(exc, sqlite3.Error) else str(exc))
    if kind is PermanentError or isinstance(exc, TrainmedicError):
        return PermanentActionError(str(exc))
    return PermanentActionError(f"{type(exc).__name__}: {exc}")


__all__ = [
    "ActionBlocked",
    "FatalActionError",
    "PermanentActionError",
    "RemediationError",
    "StalePlan",
    "TemporaryActionError",
    "classify",
]
