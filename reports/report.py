"""Incident reports: one Markdown document and one self-contained HTML page per incident and language.

The input is a plain, JSON-ready context (built by `agent.reporting.report_context` from the
incident store and the scene bundle); this module only renders it, so the API, the CLI, the demo
and the benchmark all produce the same pages from the same data.

Safety, because every text in an incident comes from the outside (log lines, pod names, messages
of the API server, vendor strings):

* the shipped templates run with StrictUndefined, so a field the context lacks is an error, never
  a silently blank section;
* HTML is autoescaped, and the page is inert: no script, no external resource, and a
  Content-Security-Policy that forbids both even if something slipped through;
* Markdown has no escaping of its own: the templates pass every outside text through `md`
  (HTML-significant characters as entities, Markdown punctuation backslash-escaped) or `md_code`
  (a code span whose fence is longer than any backtick run inside), and log lines go into fenced
  blocks whose fence is longer than any inside them, so a `<script>` in a log shows as text in any
  Markdown renderer;
* a user-supplied template directory is rendered in Jinja2's SandboxedEnvironment (no attribute
  access to internals such as `__class__`), with the same StrictUndefined and autoescaping.

The charts are inline SVG from `reports.chart` (HTML) and sparklines with min/max tables
(Markdown).
"""

from __future__ import annotations

import math
import re
import time
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from functools import cache, lru_cache
from pathlib import Path
from typing import Any, Literal

import yaml
from jinja2 import (
    Environment,
    FileSystemLoader,
    PackageLoader,
    StrictUndefined,
    TemplateError,
    pass_context,
)
from jinja2.runtime import Context
from jinja2.sandbox import SandboxedEnvironment
from markupsafe import Markup, escape

from trainmedic.datafile import load_yaml
from trainmedic.errors import TrainmedicError
from trainmedic.reports.chart import Series, format_value, sparkline, svg_chart

__all__ = [
    "FORMATS",
    "LABELS_FILE",
    "LANGS",
    "ReportError",
    "i18n",
    "label",
    "labels",
    "md_code",
    "md_fence",
    "md_link",
    "md_text",
    "render_report",
    "template_name",
]

Format = Literal["md", "html"]
Lang = Literal["en", "zh"]
FORMATS: tuple[str, ...] = ("md", "html")
LANGS: tuple[str, ...] = ("en", "zh")
LABELS_FILE = Path(__file__).with_name("report_labels.yaml")
_GROUPS = (
    "labels",
    "status",
    "mode",
    "action",
    "action_state",
    "fault_class",
    "severity",
    "origin",
    "normalized",
    "timeline",
    "metric",
    "recommend",
    "outcome",
    "now",
)
CHART_WIDTH = 720
CHART_HEIGHT = 220


class ReportError(TrainmedicError):
    """A report that cannot be rendered: unknown format or language, a template that is missing,
    uses a field the context lacks, or tries something the sandbox forbids."""


# ------------------------------------------------------------------------------------------------
# Labels (reports/report_labels.yaml)


@cache
def labels() -> dict[str, dict[str, dict[str, str]]]:
    """{group: {key: {"en": ..., "zh": ...}}}; ReportError when an entry lacks a language."""
    try:
        text = LABELS_FILE.read_text(encoding="utf-8")
        try:
            data = load_yaml(text)
        except yaml.YAMLError:
            data = yaml.safe_load(text)  # the problem as the pure-Python parser words it
    except (OSError, yaml.YAMLError) as exc:
        raise ReportError(f"{LABELS_FILE}: cannot be read: {exc}".splitlines()[0]) from exc
    if not isinstance(data, dict):
        raise ReportError(f"{LABELS_FILE}: not a mapping")
    out: dict[str, dict[str, dict[str, str]]] = {}
    for group in _GROUPS:
        entries = data.get(group)
        if not isinstance(entries, dict):
            raise ReportError(f"{LABELS_FILE}: group {group!r} is missing")
        out[group] = {}
        for key, text in entries.items():
            if not isinstance(text, dict) or not all(isinstance(text.get(lang), str) and text[lang] for lang in LANGS):
                raise ReportError(f"{LABELS_FILE}: {group}.{key}: needs a non-empty text for each of {LANGS}")
            out[group][str(key)] = {lang: str(text[lang]) for lang in LANGS}
    return out


def label(group: str, key: object, lang: str) -> str:
    """The text of a label, or the key itself when the group has no such entry (a new status)."""
    entry = labels()[group].get(str(key))
    return entry[lang] if entry else str(key)


def i18n(group: str, key: object, **fmt: object) -> dict[str, str]:
    """A label in both languages, formatted with `fmt` (values used as they are)."""
    entry = labels()[group].get(str(key))
    if entry is None:
        return {lang: str(key) for lang in LANGS}
    return {lang: entry[lang].format(**fmt) if fmt else entry[lang] for lang in LANGS}


# ------------------------------------------------------------------------------------------------
# Escaping


_MD_PUNCT = re.compile(r"([\\`*_\[\]|])")
_BACKTICKS = re.compile(r"`+")


def md_text(value: object) -> str:
    """Outside text for Markdown prose or a table cell: one line, HTML-significant characters as
    entities (safe in every renderer, also those that do not honour `\\<`), Markdown punctuation
    backslash-escaped."""
    text = _one_line(value)
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return _MD_PUNCT.sub(r"\\\1", text)


def md_code(value: object) -> str:
    """Outside text as a Markdown code span (literal in every renderer), on one line. Pipes are
    escaped so the span also holds inside a table cell."""
    text = _one_line(value).replace("|", "\\|")
    if not text:
        return ""
    longest = max((len(m) for m in _BACKTICKS.findall(text)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def md_fence(lines: Sequence[str]) -> str:
    """A fence for a code block holding `lines`: longer than any backtick run at a line start."""
    longest = 0
    for chunk in lines:
        for line in str(chunk).splitlines():
            m = _BACKTICKS.match(line.lstrip())
            if m:
                longest = max(longest, len(m.group(0)))
    return "`" * max(3, longest + 1)


def md_link(value: object) -> str:
    """A relative link target for Markdown's `<...>` form: no angle bracket, no line break, and
    characters that would end it percent-encoded."""
    return urllib.parse.quote(_one_line(value), safe="/._-~")


def _one_line(value: object) -> str:
    text = "" if value is None else str(value)
    return " ".join(text.splitlines()) if ("\n" in text or "\r" in text) else text


def _rich_parts(value: object) -> list[tuple[bool, str]]:
    """A text with `code` spans as (is_code, text) parts. A backtick without its closing one is
    text (the parts are then no code), so an odd backtick in a log-derived text stays as it was."""
    parts = _one_line(value).split("`")
    if len(parts) % 2 == 0:
        parts[-2:] = [parts[-2] + "`" + parts[-1]]
    return [(bool(i % 2), part) for i, part in enumerate(parts) if part or not i % 2]


def _md_rich(value: object) -> str:
    """A text with `code` spans (hints, advice, recommendations): code spans kept as code spans,
    the rest escaped."""
    return "".join(md_code(part) if code else md_text(part) for code, part in _rich_parts(value))


def _html_rich(value: object) -> Markup:
    """The same text in HTML: each code span as <code>, the rest escaped, never a literal backtick
    for a span."""
    return Markup("").join(
        Markup("<code>{}</code>").format(part) if code else escape(part) for code, part in _rich_parts(value)
    )


# ------------------------------------------------------------------------------------------------
# Filters (shared by the shipped and the sandboxed environments; all pure)


@pass_context
def _tr(ctx: Context, value: object) -> str:
    """An {"en": .., "zh": ..} text in the report's language (the other one when it is missing)."""
    if value is None:
        return ""
    if isinstance(value, Mapping):
        lang = str(ctx.get("lang", "en"))
        text = value.get(lang) or value.get("en") or value.get("zh")
        return "" if text is None else str(text)
    return str(value)


@pass_context
def _t(ctx: Context, key: str, **fmt: object) -> str:
    """A heading or field label (group `labels`) in the report's language, formatted with `fmt`."""
    text = label("labels", key, str(ctx.get("lang", "en")))
    return text.format(**fmt) if fmt else text


def _dt(value: object) -> str:
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(value))


def _hms(value: object) -> str:
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
        return "-"
    return time.strftime("%H:%M:%S", time.gmtime(value))


@pass_context
def _dur(ctx: Context, value: object) -> str:
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
        return "-"
    zh = ctx.get("lang") == "zh"
    if 0 <= value < 0.5:
        return label("labels", "under_a_second", "zh" if zh else "en")
    s = max(0, round(float(value)))
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    if zh:
        if h:
            return f"{h} 小时 {m} 分钟"
        return f"{m} 分 {sec} 秒" if m else f"{sec} 秒"
    if h:
        return f"{h} h {m:02d} min"
    return f"{m} min {sec:02d} s" if m else f"{sec} s"


def _num(value: object) -> str:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return "-" if value is None else str(value)
    return format_value(float(value))


_FILTERS: dict[str, Callable[..., Any]] = {
    "tr": _tr,
    "md": md_text,
    "md_code": md_code,
    "md_link": md_link,
    "md_rich": _md_rich,
    "html_rich": _html_rich,
    "dt": _dt,
    "hms": _hms,
    "dur": _dur,
    "num": _num,
}


def _autoescape(name: str | None) -> bool:
    return name is not None and name.endswith((".html.j2", ".html", ".htm", ".xml", ".svg"))


def _configure(env: Environment) -> Environment:
    env.filters.update(_FILTERS)
    env.globals["t"] = _t
    env.globals["md_fence"] = md_fence
    return env


@cache
def _shipped_env() -> Environment:
    return _configure(
        Environment(
            loader=PackageLoader("trainmedic.reports", "templates"),
            undefined=StrictUndefined,
            autoescape=_autoescape,  # noqa: S701 - on for every HTML template (by name); Markdown escapes by filter
            trim_blocks=True,
            lstrip_blocks=True,
            keep_trailing_newline=True,
        )
    )


@lru_cache(maxsize=8)
def _sandbox_env(template_dir: str) -> Environment:
    return _configure(
        SandboxedEnvironment(
            loader=FileSystemLoader(template_dir),
            undefined=StrictUndefined,
            autoescape=_autoescape,
            trim_blocks=True,
            lstrip_blocks=True,
            keep_trailing_newline=True,
        )
    )


def template_name(fmt: str) -> str:
    """The template a format is rendered from (the same name in a user's template directory)."""
    return f"report.{fmt}.j2"


# ------------------------------------------------------------------------------------------------
# Charts


def _charts(ctx: Mapping[str, Any], fmt: str, lang: str) -> list[dict[str, Any]]:
    metrics = ctx.get("metrics") if isinstance(ctx.get("metrics"), Mapping) else None
    if not metrics:
        return []
    fault = ctx.get("fault_time")
    fault_time = float(fault) if isinstance(fault, int | float) and not isinstance(fault, bool) else None
    out: list[dict[str, Any]] = []
    for chart in metrics.get("charts") or []:
        if not isinstance(chart, Mapping):
            continue
        metric = str(chart.get("metric", ""))
        node = str(chart.get("node", ""))
        title = f"{label('metric', metric, lang)} · {node}"
        series = [
            Series(name=str(s.get("name", "")), points=[tuple(p) for p in s.get("points") or [] if len(p) == 2])
            for s in chart.get("series") or []
            if isinstance(s, Mapping)
        ]
        item: dict[str, Any] = {"title": title, "node": node, "metric": metric}
        if fmt == "html":
            # reports.chart escapes every text it writes (the tests parse its output as XML).
            item["svg"] = Markup(  # noqa: S704
                svg_chart(
                    series,
                    fault_time=fault_time,
                    title=title,
                    width=CHART_WIDTH,
                    height=CHART_HEIGHT,
                    fault_label=label("labels", "fault_mark", lang),
                    empty_label=label("labels", "no_data", lang),
                )
            )
        rows = []
        for s in series:
            values = [v for t, v in s.points if v is not None and (fault_time is None or t <= fault_time)]
            every = [v for _, v in s.points if v is not None]
            rows.append(
                {
                    "name": s.name,
                    "min": min(every) if every else None,
                    "max": max(every) if every else None,
                    "last": values[-1] if values else None,
                    "spark": sparkline(s.points),
                }
            )
        item["rows"] = rows
        out.append(item)
    return out


# ------------------------------------------------------------------------------------------------
# Rendering


def render_report(
    ctx: Mapping[str, Any],
    *,
    fmt: Format | str,
    lang: Lang | str,
    template_dir: str | Path | None = None,
) -> str:
    """The report of one incident (`ctx` from agent.reporting.report_context) as Markdown or HTML.

    `template_dir`: a directory holding the user's own `report.md.j2` / `report.html.j2`, rendered
    sandboxed with the same variables and filters as the shipped templates. ReportError with a
    one-line reason when the format, language or template cannot be used.
    """
    if fmt not in FORMATS:
        raise ReportError(f"unknown report format {fmt!r} (one of {', '.join(FORMATS)})")
    if lang not in LANGS:
        raise ReportError(f"unknown report language {lang!r} (one of {', '.join(LANGS)})")
    if template_dir is not None:
        path = Path(template_dir)
        if not path.is_dir():
            raise ReportError(f"template directory {path} does not exist")
        env = _sandbox_env(str(path.resolve()))
    else:
        env = _shipped_env()
    name = template_name(fmt)
    try:
        template = env.get_template(name)
        variables = dict(ctx)
        variables.update(lang=lang, fmt=fmt, charts=_charts(ctx, fmt, lang))
        return template.render(variables)
    except TemplateError as exc:
        where = f"{template_dir}/{name}" if template_dir is not None else name
        raise ReportError(f"report template {where}: {type(exc).__name__}: {exc}".splitlines()[0]) from exc
