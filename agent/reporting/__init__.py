"""The data of an incident report: the incident store's record and the scene bundle, joined.

`report_context` gathers what `reports.report.render_report` needs into one JSON-ready dict
(texts for people as {"en": .., "zh": ..}, times as unix seconds), so the API, the CLI, the demo
and the benchmark render the same report from the same data, and a user's own template sees the
same fields as the shipped ones.

A report is written when things have gone wrong, so it must not fail because something else did:
a scene bundle that was never saved, half written, edited by hand or partly unreadable still gives
a report, whose "not in this report" section says what is missing and why. Everything read from
the bundle is bounded (the first MAX_EVIDENCE findings with CONTEXT_LINES lines either side, the
tail of each log for the last training step, a few charts of decimated series), so a 64-pod job
with 10,000-line logs renders in milliseconds.

`write_reports` writes report.{en,zh}.{md,html} atomically (a temporary file renamed into place).

The parts: `values` (limits, the JSON-ready value helpers), `bundle` (`_Bundle`, the scene bundle read
defensively), `sections` (each piece of the context: root cause, evidence and place, timeline,
actions, metrics, checkpoint, recommendations, stacks), `outcome` (the top block), `context` (the
entry points). This package re-exports what the rest of trainmedic and its tests import.
"""

from trainmedic.agent.reporting.bundle import _Bundle as _Bundle
from trainmedic.agent.reporting.context import (
    default_report_dir,
    render_incident,
    report_context,
    write_reports,
    write_text_atomic,
)
from trainmedic.agent.reporting.values import CONTEXT_LINES, CONTEXT_SCHEMA, MAX_EVIDENCE
from trainmedic.reports.report import ReportError

__all__ = [
    "CONTEXT_LINES",
    "CONTEXT_SCHEMA",
    "MAX_EVIDENCE",
    "ReportError",
    "default_report_dir",
    "render_incident",
    "report_context",
    "write_reports",
    "write_text_atomic",
]
