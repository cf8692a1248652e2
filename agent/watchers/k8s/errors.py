"""Kubernetes watch errors, with their retry semantics (kopf-style), and `classify`, which maps
what a list or watch raised onto them:

    WatchError (TrainmedicError; each below is also on a branch of trainmedic.errors' one tree)
    +-- ResourceGone            410: the resourceVersion expired -> relist and diff, at once
    |                           (TemporaryError, delay 0)
    +-- TemporaryWatchError     429, 5xx, connection refused/reset, broken stream -> back off with
    |                           jitter (Retry-After honoured: its `delay`), then resume (TemporaryError)
    +-- PermanentWatchError     (PermanentError) 400/401/403/422: credentials, RBAC, a bad selector -> logged as a
        |                       configuration error naming the resource and verb, re-checked slowly
        |                       (a 401/403 after a list that worked is first retried at the backoff
        |                       pace a few times: a restarting API server refuses until its caches fill)
        +-- MissingResource     404: the API is not served (Volcano / Kubeflow CRD not installed)
                                -> logged once, re-checked slowly, never fatal

What the reflector (reflector.py) does with each is in `Reflector._handle_error`.
"""

from __future__ import annotations

import http.client

import urllib3.exceptions
from kubernetes.client.exceptions import ApiException

from trainmedic.errors import PermanentError, TemporaryError, TrainmedicError
from trainmedic.remediations.kube import api_message, retry_after


class WatchError(TrainmedicError):
    """A list or watch failed; the subclass says what the reflector does next."""

    kind: str = "error"


class ResourceGone(WatchError, TemporaryError):
    """410 Gone: the resourceVersion is too old. Relist and diff (at once)."""

    kind = "gone"

    def __init__(self, message: str) -> None:
        TemporaryError.__init__(self, message, delay=0.0)


class TemporaryWatchError(WatchError, TemporaryError):
    """Worth retrying after a delay (the server's Retry-After when it sent one)."""

    def __init__(self, message: str, *, retry_after: float | None = None, kind: str = "temporary") -> None:
        TemporaryError.__init__(self, message, delay=retry_after)
        self.kind = kind

    @property
    def retry_after(self) -> float | None:
        return self.delay


class PermanentWatchError(WatchError, PermanentError):
    """A configuration problem (credentials, RBAC, selector): retrying soon will not help."""

    def __init__(self, message: str, *, kind: str = "permanent") -> None:
        super().__init__(message)
        self.kind = kind


class MissingResource(PermanentWatchError):
    """The API server does not serve this resource (a CRD that is not installed)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, kind="missing")


def classify(exc: BaseException, *, resource: str, verb: str, retry_after_max: float = 300.0) -> WatchError | None:
    """The WatchError an exception raised by a list or watch stands for; None for a programming error."""
    if isinstance(exc, WatchError):
        return exc
    where = f"{verb} {resource}"
    if isinstance(exc, ApiException):
        status = int(exc.status or 0)
        message = api_message(exc, limit=300)
        if status == 410:
            return ResourceGone(f"{where}: 410 Gone ({message})")
        if status == 404:
            return MissingResource(f"{where}: the API server does not serve {resource} (404: {message})")
        if status in (401, 403):
            what = "Unauthorized" if status == 401 else "Forbidden"
            return PermanentWatchError(
                f"{where}: {status} {what}: {message}. The agent's credentials or RBAC do not allow "
                f"'{verb}' on '{resource}' (check the service account and its ClusterRole)",
                kind="forbidden" if status == 403 else "unauthorized",
            )
        if status in (400, 422):
            return PermanentWatchError(
                f"{where}: {status} Bad Request: {message} (check the label and field selectors)",
                kind="bad_request",
            )
        return TemporaryWatchError(
            f"{where}: {status or 'transport'} {message}",
            retry_after=retry_after(exc.headers, retry_after_max) if status in (429, 503) or status >= 500 else None,
            kind=f"api_{status}",
        )
    if isinstance(exc, urllib3.exceptions.HTTPError | OSError | http.client.HTTPException):
        return TemporaryWatchError(f"{where}: connection error: {exc}", kind="connection")
    if isinstance(exc, ValueError):
        return TemporaryWatchError(f"{where}: malformed response: {exc}", kind="malformed")
    return None
