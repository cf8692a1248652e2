"""Diagnose: the CLI's core over uploaded texts.

`POST /api/v1/diagnose` runs the same core as the CLI (`detectors.diagnose.make_engine`, the engine's
streamed scan, `detectors.correlator.correlate`) and answers with `Diagnosis.contract_dict`, so a log
gives the same JSON whether it is uploaded or passed to `trainmedic diagnose --logs`. `_read_logs`
takes the uploaded logs (multipart file parts or JSON); gzip uploads are inflated with a bound
(`_inflate`); `diagnose_blobs` classifies and correlates them as one job.
"""

from __future__ import annotations

import io
import zlib
from collections.abc import Sequence

from fastapi import Request
from pydantic import ValidationError
from starlette.datastructures import UploadFile

from trainmedic.agent.api.errors import ApiError
from trainmedic.agent.api.models import DiagnoseJson
from trainmedic.agent.config import ApiSettings
from trainmedic.detectors.diagnose import attribute, correlate_placed
from trainmedic.detectors.engine import Engine
from trainmedic.detectors.layout import Layout
from trainmedic.models import Diagnosis, Finding

MAX_NAME = 255
# Uploaded gzip logs may inflate to this many times the body limit, in total.
INFLATE_FACTOR = 4


def _inflate(data: bytes, limit: int, name: str) -> bytes:
    """Gunzip `data` (every member, as gzip.open reads a concatenation) into at most `limit` bytes."""
    too_large = ApiError(
        413,
        "too_large",
        f"{name}: the uploaded logs inflate to more than {INFLATE_FACTOR} x api.max_body_bytes",
        f"{name}：上传的日志解压后超过 api.max_body_bytes 的 {INFLATE_FACTOR} 倍",
    )
    out: list[bytes] = []
    size = 0
    rest = data
    try:
        while rest:
            if size >= limit:
                raise too_large
            d = zlib.decompressobj(16 + zlib.MAX_WBITS)
            # max_length > 0 always (0 would mean "no limit").
            chunk = d.decompress(rest, limit - size + 1)
            size += len(chunk)
            out.append(chunk)
            if size > limit or d.unconsumed_tail:
                raise too_large
            if not d.eof:
                raise zlib.error("truncated gzip stream")
            rest = d.unused_data.lstrip(b"\x00")
    except zlib.error as e:
        raise ApiError(
            400, "bad_gzip", f"{name}: not a readable gzip file: {e}", f"{name}：不是可读取的 gzip 文件：{e}"
        ) from e
    return b"".join(out)


def diagnose_blobs(blobs: Sequence[tuple[str, bytes]], engine: Engine) -> Diagnosis:
    """Classify named texts and correlate all findings as one job: what `diagnose_paths` does for files
    (the engine's streamed scan, then `correlate`), for texts that arrived over the network."""
    findings: list[Finding] = []
    ranks: dict[int, str | None] = {}
    lines = 0
    layout = Layout([name for name, _ in blobs], "", blobs)
    for name, data in blobs:
        found, n = engine.scan_stream(io.BytesIO(data), file=name)
        findings.extend(attribute(found, name, "", ranks, layout))
        lines += n
    return correlate_placed(findings, lines, ranks, [layout])


def _name(raw: str | None, index: int) -> str:
    name = (raw or "").strip().replace("\x00", "")[:MAX_NAME]
    return name or f"log-{index + 1}"


async def _read_logs(request: Request, settings: ApiSettings) -> tuple[list[tuple[str, bytes]], str]:
    """The uploaded logs (multipart file parts, or JSON {"logs": {name: text}}) and the language."""
    ctype = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    inflate_limit = settings.max_body_bytes * INFLATE_FACTOR
    blobs: list[tuple[str, bytes]] = []
    lang = request.query_params.get("lang", "en")
    if lang not in ("en", "zh"):
        raise ApiError(
            400,
            "bad_request",
            f"lang must be en or zh, not {lang[:20]!r}",
            f"lang 只能是 en 或 zh，而不是 {lang[:20]!r}",
        )
    if ctype == "application/json":
        raw = await request.body()
        try:
            parsed = DiagnoseJson.model_validate_json(raw)
        except ValidationError as e:
            first = e.errors()[0]
            where = ".".join(str(x) for x in first.get("loc", ())) or "body"
            raise ApiError(
                400,
                "bad_request",
                f"the JSON body is not usable: {where}: {first.get('msg', 'invalid')}",
                f"JSON 请求体无法使用：{where}：{first.get('msg', 'invalid')}",
            ) from e
        lang = parsed.lang
        for i, (name, text) in enumerate(parsed.logs.items()):
            blobs.append((_name(name, i), text.encode("utf-8", "surrogatepass")))
    elif ctype == "multipart/form-data":
        # One more than allowed, so that too many files get this API's own answer below.
        form = await request.form(max_files=settings.max_files + 1, max_fields=8, max_part_size=settings.max_body_bytes)
        try:
            for i, (key, value) in enumerate(form.multi_items()):
                if isinstance(value, UploadFile):
                    blobs.append((_name(value.filename or key, i), await value.read()))
                elif key == "lang":
                    lang = value
                else:
                    raise ApiError(
                        400,
                        "bad_request",
                        f"form field {key!r} is not a file: send each log as a file part (curl -F logs=@train.log)",
                        f"表单字段 {key!r} 不是文件：请以文件形式上传每个日志（curl -F logs=@train.log）",
                    )
        finally:
            await form.close()
    else:
        raise ApiError(
            415,
            "unsupported_media_type",
            'send the logs as multipart/form-data files or as JSON {"logs": {"name": "text"}}',
            '请以 multipart/form-data 文件或 JSON {"logs": {"名称": "文本"}} 形式提交日志',
        )
    if lang not in ("en", "zh"):
        raise ApiError(
            400, "bad_request", f"lang must be en or zh, not {lang!r}", f"lang 只能是 en 或 zh，而不是 {lang!r}"
        )
    if not blobs:
        raise ApiError(400, "no_logs", "no logs were given", "未提交任何日志")
    if len(blobs) > settings.max_files:
        raise ApiError(
            400,
            "too_many_files",
            f"more than {settings.max_files} logs in one request (api.max_files)",
            f"单次请求的日志超过 {settings.max_files} 个（api.max_files）",
        )
    out: list[tuple[str, bytes]] = []
    budget = inflate_limit
    for name, raw in blobs:
        data = _inflate(raw, max(budget, 0), name) if raw[:2] == b"\x1f\x8b" else raw
        budget -= len(data)
        out.append((name, data))
    return out, lang
