"""One error tree (trainmedic/errors.py): every layer's errors sit on exactly one branch, and the
branch alone says what happens next (the delay of a temporary error travels with it)."""

from __future__ import annotations

import importlib
import inspect

import pytest

from trainmedic.agent.notify import DeliveryFailed, DeliveryRefused, Outcome
from trainmedic.agent.watchers.k8s import ResourceGone, TemporaryWatchError
from trainmedic.errors import FatalError, PermanentError, TemporaryError, TrainmedicError, retry_meaning
from trainmedic.remediations.errors import FatalActionError, PermanentActionError, TemporaryActionError, classify
from trainmedic.remediations.kube import TemporaryKubeError

BRANCHES = (TemporaryError, PermanentError, FatalError)
LAYERS = (
    "trainmedic.remediations.kube.errors",
    "trainmedic.remediations.workloads",
    "trainmedic.remediations.errors",
    "trainmedic.agent.watchers.k8s.errors",
    "trainmedic.agent.watchers.kernel",
    "trainmedic.agent.watchers.metrics",
    "trainmedic.agent.watchers.nvml",
    "trainmedic.agent.notify",
    "trainmedic.agent.outbox",
)
# A layer's common base (each subclass picks its branch) and the policy's refusal (a fourth outcome:
# the incident ends `blocked`, a person is paged).
BASES = {"KubeError", "WatchError", "RemediationError", "ActionBlocked"}


def layer_errors() -> list[type[TrainmedicError]]:
    out: list[type[TrainmedicError]] = []
    for name in LAYERS:
        module = importlib.import_module(name)
        for _, obj in inspect.getmembers(module, inspect.isclass):
            if issubclass(obj, TrainmedicError) and obj.__module__ == name and obj.__name__ not in BASES:
                out.append(obj)
    return out


@pytest.mark.parametrize("cls", layer_errors(), ids=lambda c: f"{c.__module__}.{c.__name__}")
def test_every_layer_error_is_on_exactly_one_branch(cls: type[BaseException]) -> None:
    assert sum(issubclass(cls, b) for b in BRANCHES) == 1, f"{cls.__name__}: subclass one of {BRANCHES}"


@pytest.mark.parametrize(
    ("exc", "branch", "delay"),
    [
        (TemporaryKubeError("503", delay=7.0), TemporaryError, 7.0),
        (TemporaryWatchError("429", retry_after=3.0), TemporaryError, 3.0),
        (ResourceGone("410"), TemporaryError, 0.0),
        (Outcome("retry", 429, "HTTP 429", 12.0).as_error(), TemporaryError, 12.0),
        (Outcome("retry", None, "timeout").as_error(), TemporaryError, None),
        (Outcome("dead", 404, "HTTP 404").as_error(), PermanentError, None),
    ],
)
def test_the_branch_and_the_delay_travel_with_the_error(exc: BaseException, branch: type, delay: float | None) -> None:
    assert retry_meaning(exc) is branch
    if branch is TemporaryError:
        assert isinstance(exc, TemporaryError) and exc.delay == delay
        err = classify(exc)
        assert isinstance(err, TemporaryActionError) and err.delay == delay


@pytest.mark.parametrize(
    ("exc", "action_error"),
    [
        (DeliveryFailed("5xx"), TemporaryActionError),
        (DeliveryRefused("404"), PermanentActionError),
        (importlib.import_module("trainmedic.agent.outbox").OutboxError("unreadable"), FatalActionError),
        (importlib.import_module("trainmedic.agent.watchers.k8s").PermanentWatchError("403"), PermanentActionError),
        (ValueError("nobody expected this"), PermanentActionError),
    ],
)
def test_classify_reads_only_the_branch(exc: BaseException, action_error: type) -> None:
    assert type(classify(exc)) is action_error


def test_outcome_delivered_is_no_error() -> None:
    assert Outcome("delivered", 200).as_error() is None
