"""`run --check` and start-up load every data file the daemon loads and refuse broken ones (agent/configcheck.py).

Each broken file is refused with `file:line: problem`, by `run --check` (exit 1) and by the
daemon's start-up (exit 2) alike, with the same lines; the settings that were only in component
dataclasses reach their components from the configuration file and the environment.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest
import yaml
from paths import ROOT

from trainmedic.agent.cli import main
from trainmedic.agent.config import ConfigError, RemediateSettings, Role, load_settings
from trainmedic.agent.configcheck import data_file_problems, refusal_lines
from trainmedic.agent.responder import ResponderSettings
from trainmedic.detectors.hang_state import HangSettings
from trainmedic.remediations.policy import Mode

POLICY = (ROOT / "remediations" / "policy.yaml").read_text(encoding="utf-8")

GOOD_RULE = """version: 1
rules:
  - id: local.test.boom
    status: stable
    source: [container_log]
    chip: generic
    fault_class: app_error
    patterns: ['boom happened']
    code: boom
    action: restart_app
    severity: error
    message: {en: boom, zh: boom}
    examples:
      match:
        - line: 'boom happened'
          code: boom
"""


def _policy_with(old: str, new: str) -> str:
    assert old in POLICY
    return POLICY.replace(old, new, 1)


def _line_of(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


# (case, file kind, text, the line the problem must name, a word of the problem)
BROKEN = [
    ("policy-yaml-syntax", "policy", "version: 1\nmode: dry-run\nrules: [\n", 4, "YAML"),
    (
        "policy-unknown-field",
        "policy",
        _policy_with("mode: dry-run\n", "mode: dry-run\nmood: happy\n"),
        _line_of(_policy_with("mode: dry-run\n", "mode: dry-run\nmood: happy\n"), "mood: happy"),
        "mood",
    ),
    (
        "policy-unknown-action",
        "policy",
        _policy_with("    actions: [notify]\n", "    actions: [explode]\n"),
        _line_of(_policy_with("    actions: [notify]\n", "    actions: [explode]\n"), "actions: [explode]"),
        "explode",
    ),
    (
        "policy-unknown-fault-class",
        "policy",
        _policy_with("      fault_class: device_error\n", "      fault_class: gremlins\n"),
        _line_of(_policy_with("      fault_class: device_error\n", "      fault_class: gremlins\n"), "gremlins"),
        "should be",
    ),
    (
        "rule-bad-regex",
        "rules",
        GOOD_RULE.replace("patterns: ['boom happened']", "patterns: ['boom (happened']"),
        _line_of(GOOD_RULE, "patterns:"),
        "",
    ),
    (
        "rule-unknown-field",
        "rules",
        GOOD_RULE.replace("    code: boom\n", "    code: boom\n    colour: red\n"),
        3,
        "colour",
    ),
    ("rule-yaml-syntax", "rules", GOOD_RULE.replace("rules:\n", "rules: [\n"), 0, "YAML"),
]


def _config(tmp_path: Path, kind: str, text: str) -> tuple[Path, Path]:
    """A settings file naming the broken data file, and that file."""
    settings: dict[str, object] = {"kubernetes": {"enabled": False}, "api": {"enabled": False}}
    if kind == "policy":
        broken = tmp_path / "policy.yaml"
        settings["remediate"] = {"policy": str(broken)}
    else:
        (tmp_path / "rules").mkdir()
        broken = tmp_path / "rules" / "local.yaml"
        settings["detect"] = {"rule_dirs": [str(tmp_path / "rules")]}
    broken.write_text(text, encoding="utf-8")
    config = tmp_path / "trainmedic.yaml"
    config.write_text(yaml.safe_dump(settings), encoding="utf-8")
    return config, broken


def _assert_located(lines: list[str], broken: Path, line: int, word: str) -> None:
    located = [x for x in lines if f"{broken}:" in x]
    assert located, lines
    if line:
        assert any(f"{broken}:{line}:" in x for x in located), (line, located)
    else:
        assert all(x.split(f"{broken}:", 1)[1].split(":", 1)[0].isdigit() for x in located), located
    if word:
        assert any(word in x for x in located), located


@pytest.mark.parametrize(("case", "kind", "text", "line", "word"), BROKEN, ids=[b[0] for b in BROKEN])
def test_check_refuses_with_file_and_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str, kind: str, text: str, line: int, word: str
) -> None:
    config, broken = _config(tmp_path, kind, text)
    assert main(["run", "--check", "--config", str(config)]) == 1, case
    err = capsys.readouterr().err.splitlines()
    _assert_located(err, broken, line, word)
    assert any(x.startswith("refused:") for x in err) and any(x.startswith("已拒绝启动") for x in err)


@pytest.mark.parametrize(
    ("case", "kind", "text", "line", "word"), BROKEN[:2] + BROKEN[4:5], ids=["yaml", "field", "regex"]
)
def test_start_up_refuses_with_the_same_lines(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str, kind: str, text: str, line: int, word: str
) -> None:
    from trainmedic.agent import run

    config, broken = _config(tmp_path, kind, text)
    settings = load_settings(config, env={})
    assert run.main(settings, Role.ALL) == 2, case
    err = capsys.readouterr().err.splitlines()
    _assert_located(err, broken, line, word)
    assert err == refusal_lines(data_file_problems(settings, Role.ALL))


@pytest.mark.parametrize("role", [Role.ALL, Role.BRAIN, Role.NODE, Role.CLUSTER])
def test_shipped_files_load_for_every_role(role: Role) -> None:
    assert data_file_problems(load_settings(None, env={}), role) == []


@pytest.mark.parametrize(("role", "refused"), [(Role.BRAIN, True), (Role.NODE, False), (Role.CLUSTER, False)])
def test_only_the_roles_that_load_the_policy_refuse_it(tmp_path: Path, role: Role, refused: bool) -> None:
    config, _ = _config(tmp_path, "policy", "version: 1\nrules: [\n")
    assert bool(data_file_problems(load_settings(config, env={}), role)) is refused


@pytest.mark.parametrize(("enabled", "refused"), [(True, True), (False, False)])
def test_a_sink_secret_that_is_not_set_is_refused_when_notifying(enabled: bool, refused: bool) -> None:
    env = {
        "TRAINMEDIC_NOTIFY__ENABLED": str(enabled).lower(),
        "TRAINMEDIC_NOTIFY__SINKS": "[{kind: cloudevents, url: 'http://receiver:8080/', secret_env: NO_SUCH_VAR_14}]",
    }
    problems = data_file_problems(load_settings(None, env=env), Role.ALL)
    assert any("NO_SUCH_VAR_14" in str(p) for p in problems) is refused


# --- every component setting from the configuration -------------------------------------------

HANG_FIELDS = [f.name for f in fields(HangSettings)]


def _other_value(name: str, default: object) -> object:
    """A valid value unlike the default."""
    if name == "interval_quantile":
        return 0.95
    if isinstance(default, bool):
        return not default
    if isinstance(default, int | float):
        return default * 2 + 1
    return "/tmp/trainmedic-elsewhere"


@pytest.fixture(scope="module")
def hang_built() -> Iterator[tuple[HangSettings, HangSettings]]:
    """An agent built (not started) from environment values for every hang setting."""
    from trainmedic.agent.health import _close
    from trainmedic.agent.run import build_agent

    base = HangSettings()
    env = {
        "TRAINMEDIC_KUBERNETES__ENABLED": "false",
        "TRAINMEDIC_API__ENABLED": "false",
        "TRAINMEDIC_REMEDIATE__ENABLED": "false",
    }
    wanted: dict[str, Any] = {n: _other_value(n, getattr(base, n)) for n in HANG_FIELDS}
    env |= {
        f"TRAINMEDIC_DETECT__HANG__{n.upper()}": yaml.safe_dump(v).removesuffix("\n...\n").strip()
        for n, v in wanted.items()
    }
    agent = build_agent(load_settings(None, env=env), Role.ALL)
    try:
        assert agent.brain is not None
        yield HangSettings(**wanted), agent.brain.hang.settings
    finally:
        _close(agent)


@pytest.mark.parametrize("name", HANG_FIELDS)
def test_every_hang_setting_reaches_the_detector(hang_built: tuple[HangSettings, HangSettings], name: str) -> None:
    wanted, got = hang_built
    assert getattr(got, name) == getattr(wanted, name) != getattr(HangSettings(), name)


@pytest.mark.parametrize(
    ("yaml_text", "floor_s", "factor"),
    [
        ("detect: {hang_floor_s: 7}", 7.0, 4.0),
        ("detect: {hang_factor: 3}", 20.0, 3.0),
        ("detect: {hang: {floor_s: 9, factor: 5}}", 9.0, 5.0),
        ("detect: {hang: {floor_s: 9}, hang_floor_s: 11}", 11.0, 4.0),
    ],
)
def test_older_hang_names_still_set_the_hang_group(
    tmp_path: Path, yaml_text: str, floor_s: float, factor: float
) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(yaml_text, encoding="utf-8")
    hang = load_settings(config, env={}).detect.hang
    assert (hang.floor_s, hang.factor) == (floor_s, factor)


@pytest.mark.parametrize(
    ("env", "problem"),
    [
        ({"TRAINMEDIC_DETECT__HANG__FLOOR_SECONDS": "5"}, "detect.hang.floor_seconds"),
        ({"TRAINMEDIC_DETECT__HANG__LEARNED_MARGIN": "0.5"}, "learned_margin"),
        ({"TRAINMEDIC_DETECT__HANG__INTERVAL_QUANTILE": "2"}, "interval_quantile"),
    ],
)
def test_bad_hang_settings_are_refused(env: dict[str, str], problem: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_settings(None, env=env)
    assert any(problem in p for p in err.value.problems), err.value.problems


RESPONDER_ONLY = {"group", "handled_max"}  # from bus.group; the in-memory record of tests and the demo
RESPONDER_FIELDS = [f.name for f in fields(ResponderSettings) if f.name not in RESPONDER_ONLY]


@pytest.mark.parametrize("name", RESPONDER_FIELDS)
def test_every_responder_setting_is_in_the_remediate_group(name: str) -> None:
    assert name in RemediateSettings.model_fields


@pytest.mark.parametrize(
    ("name", "raw", "expected"),
    [
        ("stack_timeout_s", "33", 33.0),
        ("metrics_window_s", "120", 120.0),
        ("body_dir", "/srv/bodies", Path("/srv/bodies")),
        ("gone_deadline_s", "600", 600.0),
        ("approval_poll_s", "0.5", 0.5),
        ("retry_after_s", "3", 3.0),
        ("retry_deadline_s", "900", 900.0),
        ("retry_max_s", "120", 120.0),
        ("poll_ms", "250", 250),
        ("max_records", "7", 7),
        ("reports", "false", False),
        ("mode", "enforce", Mode.ENFORCE),
        ("scene_dir", "/srv/scenes", Path("/srv/scenes")),
        ("wait_gone_s", "5", 5.0),
        ("max_pending", "9", 9),
    ],
)
def test_each_responder_setting_reaches_the_responder(name: str, raw: str, expected: object) -> None:
    from trainmedic.agent.run import responder_settings

    settings = load_settings(None, env={f"TRAINMEDIC_REMEDIATE__{name.upper()}": raw, "TRAINMEDIC_BUS__GROUP": "g"})
    built = responder_settings(settings)
    assert getattr(built, name) == expected
    assert built.group == "g-responder"
