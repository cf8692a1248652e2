"""How the console answers: its words in both languages, its Jinja2 pages, headers and refusals."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from fastapi import Request
from fastapi.responses import HTMLResponse, RedirectResponse
from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape

from trainmedic.agent.config import ApiSettings
from trainmedic.agent.console import parts
from trainmedic.datafile import load_yaml
from trainmedic.reports.notice import ACTION_STATE_TEXT, FAULT_TEXT, STATUS_TEXT, label

PREFIX = "/console"
LANG_COOKIE = "trainmedic_lang"
_HERE = Path(__file__).parent
STATIC = {
    "console.css": ("text/css; charset=utf-8", _HERE / "static" / "console.css"),
    "console.js": ("text/javascript; charset=utf-8", _HERE / "static" / "console.js"),
}
CSP = (
    "default-src 'none'; style-src 'self'; script-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "frame-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
# The report is a self-contained page with its own inline style and no script.
REPORT_CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:; frame-ancestors 'self'; base-uri 'none'"
HEADERS = {
    "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
    # Links carry signed tokens: never send a console URL to another site.
    "Referrer-Policy": "no-referrer",
}


def _labels() -> dict[str, dict[str, str]]:
    data = load_yaml((_HERE / "labels.yaml").read_text(encoding="utf-8"))
    return {lang: {str(k): str(v) for k, v in data[lang].items()} for lang in ("en", "zh")}


LABELS = _labels()

_env = Environment(
    loader=PackageLoader("trainmedic.agent.console", "templates"),
    undefined=StrictUndefined,
    autoescape=select_autoescape(default=True, default_for_string=True),
    trim_blocks=True,
    lstrip_blocks=True,
)
_env.filters["when"] = parts.when
_env.filters["size"] = parts.size


class Refusal(Exception):
    """A console request answered with a page other than the one asked for."""

    def __init__(self, http: int, key: str, /, **fmt: Any) -> None:
        super().__init__(key)
        self.status = http
        self.key = key
        self.fmt = fmt


def lang_of(request: Request) -> str:
    asked = request.query_params.get("lang") or request.cookies.get(LANG_COOKIE)
    if asked in ("en", "zh"):
        return asked
    return "zh" if request.headers.get("accept-language", "").lower().startswith("zh") else "en"


def secure_cookie(request: Request, settings: ApiSettings) -> bool:
    """Whether cookies get the Secure flag: on https, or behind a public https URL."""
    return request.url.scheme == "https" or (settings.public_url or "").startswith("https:")


def page(request: Request, template: str, status: int = 200, *, csp: str = CSP, **ctx: Any) -> HTMLResponse:
    lang = ctx.pop("lang", None) or lang_of(request)
    words = LABELS[lang]

    def t(key: str, **fmt: Any) -> str:
        text = words[key]
        return text.format(**fmt) if fmt else text

    def status_label(value: str | None) -> str:
        return label(STATUS_TEXT, value, lang)

    def fault_label(value: str | None) -> str:
        return label(FAULT_TEXT, value, lang)

    def state_label(value: str | None) -> str:
        return label(ACTION_STATE_TEXT, value, lang)

    other = "en" if lang == "zh" else "zh"
    query = dict(request.query_params)
    query["lang"] = other
    html = _env.get_template(template).render(
        t=t,
        lang=lang,
        switch_url=f"{request.url.path}?{urlencode(query)}",
        status_label=status_label,
        fault_label=fault_label,
        state_label=state_label,
        prefix=PREFIX,
        viewer=ctx.pop("viewer", None),
        csrf=ctx.pop("csrf", ""),
        **ctx,
    )
    response = HTMLResponse(html, status_code=status, headers={**HEADERS, "Content-Security-Policy": csp})
    if request.query_params.get("lang") in ("en", "zh"):
        response.set_cookie(LANG_COOKIE, lang, max_age=365 * 86_400, path=PREFIX, samesite="strict")
    return response


def refusal_page(request: Request, exc: Refusal) -> HTMLResponse:
    lang = lang_of(request)
    message = LABELS[lang][exc.key].format(**exc.fmt) if exc.fmt else LABELS[lang][exc.key]
    return page(request, "message.html.j2", exc.status, title=LABELS[lang]["error"], message=message, ok=False)


def redirect(url: str) -> RedirectResponse:
    return RedirectResponse(url, status_code=303, headers=dict(HEADERS))
