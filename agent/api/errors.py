"""The API's errors: `ApiError` (status, machine code, message in English and Chinese) and the JSON
body every error answer has, the generic texts for the statuses Starlette raises itself, and the
unknown-query-parameter check every API route runs (`_known_query`, the app's one dependency).

Errors are JSON: `{"error": <English>, "error_zh": <Chinese>, "code": <machine code>, "detail": ...}`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse

API_PREFIX = "/api/v1"


class ApiError(Exception):
    """An answer other than success, with its status, machine code and message in both languages."""

    def __init__(
        self,
        status: int,
        code: str,
        en: str,
        zh: str,
        *,
        detail: Any = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(en)
        self.status = status
        self.code = code
        self.en = en
        self.zh = zh
        self.detail = detail
        self.headers = dict(headers or {})

    def body(self) -> dict[str, Any]:
        out: dict[str, Any] = {"error": self.en, "error_zh": self.zh, "code": self.code}
        if self.detail is not None:
            out["detail"] = self.detail
        return out

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


# Generic texts for the statuses Starlette raises itself (unknown route, wrong method, bad form).
_STATUS_TEXT: dict[int, tuple[str, str, str]] = {
    400: ("bad_request", "the request cannot be used", "请求无法处理"),
    404: ("not_found", "no such resource", "资源不存在"),
    405: ("method_not_allowed", "method not allowed on this resource", "该资源不支持此方法"),
    409: ("conflict", "the incident is not in a state that allows this", "事件当前状态不允许此操作"),
    413: ("too_large", "request body too large", "请求体过大"),
    415: ("unsupported_media_type", "unsupported content type", "不支持的内容类型"),
    422: ("invalid_request", "the request does not match the API schema", "请求不符合 API 定义"),
    401: ("unauthorized", "a valid bearer token is required", "需要有效的令牌"),
    429: ("too_many_failures", "too many wrong tokens from this address (Retry-After)", "该地址错误令牌过多"),
    500: ("internal", "internal error (logged by the agent)", "内部错误（已记录在代理日志中）"),
    503: ("unavailable", "not available in this agent, or not ready", "该代理不提供此功能或尚未就绪"),
}


def _known_query(request: Request) -> None:
    """Refuse a query parameter the API route does not declare (a typo such as `?stauts=open` would
    otherwise be ignored silently and answer with everything)."""
    if not request.url.path.startswith(API_PREFIX):
        return
    route = request.scope.get("route")
    dependant = getattr(route, "dependant", None)
    if dependant is None:
        return
    # Declared parameters, and those a route reads itself and documents in its `openapi_extra`.
    extra = getattr(route, "openapi_extra", None) or {}
    known: set[str] = {p["name"] for p in extra.get("parameters", ()) if p.get("in") == "query" and "name" in p}
    stack = [dependant]
    while stack:
        d = stack.pop()
        known.update(p.alias for p in d.query_params)
        stack.extend(d.dependencies)
    unknown = sorted({k for k in request.query_params if k not in known})
    if unknown:
        raise ApiError(
            422,
            "invalid_request",
            "the request does not match the API schema",
            "请求不符合 API 定义",
            detail=[
                {"loc": ["query", k[:100]], "msg": "unknown query parameter", "type": "extra_forbidden"}
                for k in unknown[:20]
            ],
        )


def _not_found(incident_id: str) -> ApiError:
    return ApiError(404, "not_found", f"no incident {incident_id!r}", f"不存在事件 {incident_id!r}")


def _no_store() -> ApiError:
    return ApiError(
        503,
        "no_store",
        "the incident store is not available in this agent (remediate.store)",
        "该代理未启用事件存储（remediate.store）",
    )
