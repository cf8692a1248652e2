"""Every data file the daemon loads, loaded once before it starts: `run --check` and start-up refuse alike.

node-problem-detector refuses to start on a bad monitor config rather than run without it; so does
the agent. Before a process builds anything, `data_file_problems` loads what the role would load:

* brain roles: the log, kernel and Kubernetes-event rules (shipped and `detect.rule_dirs`), the
  progress / hang markers, the metric rules, the remediation policy with its hints (when
  `remediate.enabled`) and the notification sinks (their secrets, when `notify.enabled`);
* every role: the phase markers (the engine's comm_init context) and the chip plugins with their
  catalogs.

Each problem is `file:line: error: message` (the data files' own Problem, as `rules lint` prints it);
a role with any problem does not start, and `run --check` exits non-zero with the same lines.
"""

from __future__ import annotations

from pathlib import Path

from trainmedic.agent.config import Role, Settings
from trainmedic.errors import Problem, RuleLoadError

__all__ = ["REFUSED", "data_file_problems", "refusal_lines"]

REFUSED = (
    "refused: {n} problem(s) in the files the agent loads (above); fix them and start again",
    "已拒绝启动：代理加载的文件中有 {n} 个问题（见上）；修正后再启动",
)

BRAIN_ROLES = frozenset({Role.BRAIN, Role.ALL})


def _rules(settings: Settings) -> list[Problem]:
    from trainmedic.detectors.loader import load_rules

    try:
        load_rules([Path(d) for d in settings.detect.rule_dirs])
    except RuleLoadError as exc:
        return [p for p in exc.problems if not p.warning]
    return []


def _markers() -> list[Problem]:
    from trainmedic.detectors.hang_markers import load_markers

    try:
        load_markers()
    except RuleLoadError as exc:
        return [p for p in exc.problems if not p.warning]
    return []


def _phases() -> list[Problem]:
    from trainmedic.detectors.phase import PhaseError, load_phase_markers

    try:
        load_phase_markers()
    except PhaseError as exc:
        return list(exc.problems)
    return []


def _metric_rules() -> list[Problem]:
    from trainmedic.detectors import metric_rules

    try:
        metric_rules.MetricRules()
    except (ValueError, TypeError) as exc:
        return [Problem(metric_rules.__file__ or "detectors/metric_rules.py", None, str(exc))]
    return []


def _policy(settings: Settings) -> list[Problem]:
    from trainmedic.remediations.policy import PolicyError, load_policy

    try:
        load_policy(settings.remediate.policy)
    except PolicyError as exc:
        return [p for p in exc.problems if not p.warning]
    return []


def _sinks(settings: Settings) -> list[Problem]:
    from trainmedic.agent.notify import NotifyError, resolve_secret

    out = []
    for i, sink in enumerate(settings.notify.sinks):
        try:
            resolve_secret(sink)
        except NotifyError as exc:
            out.append(Problem(f"notify.sinks[{i}]", None, str(exc)))
    return out


def _catalogs() -> list[Problem]:
    from trainmedic.udal.base import CatalogError
    from trainmedic.udal.registry import PluginError, discover

    try:
        plugins = discover()
    except (PluginError, ImportError, AttributeError) as exc:
        return [Problem("trainmedic.chips", None, f"chip plugins: {exc}")]
    out = []
    for key, plugin in plugins.items():
        try:
            plugin.catalog()
        except CatalogError as exc:
            name = key.value if hasattr(key, "value") else str(key)
            text = str(exc)
            file, sep, rest = text.partition(": ")
            out.append(Problem(file, None, rest) if sep else Problem(f"chip {name}", None, text))
    return out


def data_file_problems(settings: Settings, role: Role) -> list[Problem]:
    """Every problem (warnings left out) in the data files `role` would load under `settings`."""
    problems: list[Problem] = []
    if role in BRAIN_ROLES:
        problems += _rules(settings)
        problems += _markers()
        problems += _metric_rules()
        if settings.remediate.enabled:
            problems += _policy(settings)
        if settings.notify.enabled:
            problems += _sinks(settings)
    problems += _phases()
    problems += _catalogs()
    return problems


def refusal_lines(problems: list[Problem]) -> list[str]:
    """The lines a refusal prints: each problem, then what happens, in English and Chinese."""
    en, zh = REFUSED
    return [f"trainmedic: {p}" for p in problems] + [en.format(n=len(problems)), zh.format(n=len(problems))]
