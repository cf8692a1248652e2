"""The errors of the Kubernetes operations, and `classify`, which maps what the official client
raised onto them (`retry_after` and `api_message` read the answer; the watchers' errors use them too).

Errors carry their retry semantics, as kopf's do (STYLE.md):

    KubeError (TrainmedicError)
    +-- PermanentKubeError      retrying will not help: raised at once
    |   +-- KubeForbidden       403: names the verb, resource and scope, and the RBAC rule missing
    |   +-- KubeNotFound        404: the object (or the API: a CRD not installed) is not there
    |   +-- KubeInvalid         400/422: the API's own message
    |   +-- ReleaseRefused      the node was quarantined by another incident
    +-- TemporaryKubeError      429 (Retry-After honoured), 5xx, connection refused/reset,
    |                           timeouts, a garbled response: retried with exponential backoff and
    |                           jitter up to `attempts`, then raised with the delay to wait
    +-- ConflictError           409: somebody else wrote first (re-read and re-apply)

KubeOps' retrying call (client.py) acts on the branch `classify` picks.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import time
from typing import TYPE_CHECKING, Any

import pydantic
import urllib3.exceptions
from kubernetes.client.exceptions import ApiException

from trainmedic.backoff import parse_retry_after
from trainmedic.errors import PermanentError, TemporaryError, TrainmedicError
from trainmedic.models import I18nText

if TYPE_CHECKING:
    from trainmedic.remediations.kube.resources import JSON, _What

# ------------------------------------------------------------------------------------------------
# Errors with retry semantics


class KubeError(TrainmedicError):
    """A Kubernetes operation failed; the subclass says what the caller does next."""

    def __init__(self, message: str, *, status: int | None = None, hint: I18nText | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.hint = hint


class PermanentKubeError(KubeError, PermanentError):
    """Retrying will not help (RBAC, a missing object, an invalid request)."""


class KubeForbidden(PermanentKubeError):
    """403: the agent's service account lacks an RBAC rule; the message names it, `need` holds the
    rule alone ("pods/log: get") and `scope` where it is missing ("namespace train", "cluster scope")."""

    need: str | None = None
    scope: str | None = None


class KubeNotFound(PermanentKubeError):
    """404: the object is not there (or the API is not served: a CRD that is not installed)."""


class KubeInvalid(PermanentKubeError):
    """400/422: the API refused the request as invalid; the message is the API's own."""


class ReleaseRefused(PermanentKubeError):
    """The node is quarantined by another incident than the one asking to release it."""


class TemporaryKubeError(KubeError, TemporaryError):
    """Worth retrying after `delay` seconds (the server's Retry-After when it sent one)."""

    def __init__(self, message: str, *, delay: float | None = None, status: int | None = None) -> None:
        super().__init__(message, status=status)
        self.delay = delay


class ConflictError(KubeError, TemporaryError):
    """409: the object changed since it was read, or one of that name already exists (read it again
    and decide again: temporary, no delay)."""

    delay = None

    def __init__(self, message: str) -> None:
        super().__init__(message, status=409)


# ------------------------------------------------------------------------------------------------
# Classifying what the client raised


class _Malformed(ValueError):
    """A 2xx response whose body is not the JSON object expected (a proxy's HTML page, a cut body)."""


def retry_after(headers: Any, cap: float) -> float | None:
    """Retry-After as seconds (delta-seconds or an HTTP date), capped; None when absent or unreadable."""
    raw = None
    with contextlib.suppress(Exception):
        raw = headers.get("Retry-After") if headers is not None else None
    return parse_retry_after(raw, now=time.time(), cap=cap)


def api_message(exc: ApiException, limit: int = 500) -> str:
    """The Status message of an API error body, else the HTTP reason (bounded)."""
    body = getattr(exc, "body", None)
    if isinstance(body, bytes):
        body = body.decode("utf-8", "replace")
    if isinstance(body, str) and body:
        with contextlib.suppress(ValueError):
            doc = json.loads(body)
            if isinstance(doc, dict) and doc.get("message"):
                return str(doc["message"])[:limit]
    return str(exc.reason or "")[:limit]


def classify(exc: BaseException, what: _What, *, retry_after_max: float = 60.0) -> KubeError | None:
    """The KubeError an exception raised by a client call stands for; None for a programming error."""
    if isinstance(exc, KubeError):
        return exc
    if isinstance(exc, ApiException):
        status = int(exc.status or 0)
        message = api_message(exc)
        if status == 403:
            return what.forbidden(message)
        if status == 401:
            return PermanentKubeError(
                f"unauthorized: {what.verb} {what.target}: the API server rejected the agent's credentials ({message})",
                status=401,
            )
        if status == 404:
            extra = " (is its CRD installed?)" if what.res.custom else ""
            return KubeNotFound(f"{what.verb} {what.target}: not found{extra} ({message})", status=404)
        if status == 409:
            return ConflictError(f"{what.verb} {what.target}: conflict ({message})")
        if status in (400, 422):
            return KubeInvalid(f"{what.verb} {what.target}: invalid ({status}): {message}", status=status)
        if status in {0, 408, 429} or status >= 500:
            return TemporaryKubeError(
                f"{what.verb} {what.target}: {status or 'transport error'} {message}".rstrip(),
                delay=retry_after(exc.headers, retry_after_max),
                status=status or None,
            )
        return PermanentKubeError(f"{what.verb} {what.target}: {status} {message}", status=status)
    if isinstance(exc, urllib3.exceptions.HTTPError | OSError | http.client.HTTPException):
        return TemporaryKubeError(f"{what.verb} {what.target}: connection error: {exc}")
    if isinstance(exc, _Malformed):
        return TemporaryKubeError(f"{what.verb} {what.target}: malformed response: {exc}")
    if isinstance(exc, pydantic.ValidationError):
        errors = exc.errors()
        detail = f"{'.'.join(str(x) for x in errors[0]['loc'])}: {errors[0]['msg']}" if errors else str(exc)
        return PermanentKubeError(f"{what.verb} {what.target}: invalid request arguments: {detail}")
    return None


def _json_object(data: bytes) -> JSON:
    try:
        doc = json.loads(data)
    except ValueError as exc:
        raise _Malformed(f"not JSON ({len(data)} bytes: {data[:80]!r})") from exc
    if not isinstance(doc, dict):
        raise _Malformed(f"expected a JSON object, got {type(doc).__name__}")
    return doc
