"""Settings: defaults, YAML, environment overrides, every problem listed."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainmedic.agent.config import ConfigError, Role, check_role, load_settings


def test_defaults_are_the_embedded_setup() -> None:
    s = load_settings(None, env={})
    assert s.bus.kind == "memory"
    assert s.detect.window_s == 30.0
    assert check_role(s, Role.ALL) == []


def test_yaml_then_environment_overrides(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("bus:\n  kind: kafka\n  bootstrap: a:9092\nmetrics:\n  interval_s: 5\n")
    env = {
        "TRAINMEDIC_BUS__BOOTSTRAP": "b:9092,c:9092",
        "TRAINMEDIC_NODE_NAME": "gpu-node-3",
        "TRAINMEDIC_KUBERNETES__NAMESPACES": "[train, eval]",
        "TRAINMEDIC_LANG": "zh",  # not a setting: the CLI's language, ignored here
        "OTHER": "x",
    }
    s = load_settings(cfg, env=env)
    assert s.bus.kind == "kafka"
    assert s.bus.bootstrap == "b:9092,c:9092"
    assert s.node_name == "gpu-node-3"
    assert s.kubernetes.namespaces == ["train", "eval"]
    assert s.metrics.interval_s == 5


def test_every_problem_is_listed(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("bus:\n  kind: rabbit\n  partitions: 0\nlogs:\n  typo: 1\nunknown_group: {}\n")
    with pytest.raises(ConfigError) as ei:
        load_settings(cfg, env={"TRAINMEDIC_DETECT__WINDOW_S": "-1"})
    where = {p.split(":")[0] for p in ei.value.problems}
    assert where == {"bus.kind", "bus.partitions", "logs.typo", "unknown_group", "detect.window_s"}


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("bus: [unclosed\n", "not valid YAML"),
        ("- a list\n", "top level must be a mapping"),
    ],
)
def test_unusable_files(tmp_path: Path, text: str, needle: str) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(text)
    with pytest.raises(ConfigError, match=needle):
        load_settings(cfg, env={})


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_settings(tmp_path / "nope.yaml", env={})


@pytest.mark.parametrize("role", [Role.NODE, Role.CLUSTER, Role.BRAIN])
def test_split_roles_need_kafka(role: Role) -> None:
    s = load_settings(None, env={})
    assert check_role(s, role)
    s = load_settings(None, env={"TRAINMEDIC_BUS__KIND": "kafka"})
    assert check_role(s, role) == []


@pytest.mark.parametrize(
    ("kind", "url", "secrets"),
    [
        ("cloudevents", "https://hookuser:PASSWORDSECRET@events.example.invalid/in", ("PASSWORDSECRET", "hookuser")),
        ("cloudevents", "https://ev.example.invalid/in?token=QUERYSECRET&sig=QUERYSIG", ("QUERYSECRET", "QUERYSIG")),
        ("slack", "https://chat.example.invalid/services/T0SECRET1/B0SECRET2/XSECRET3", ("T0SECRET1", "XSECRET3")),
        ("feishu", "https://chat.example.invalid/open-apis/bot/v2/hook/HOOKSECRET-1234", ("HOOKSECRET",)),
    ],
)
def test_config_show_prints_no_url_credentials(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str, url: str, secrets: tuple[str, ...]
) -> None:
    from trainmedic.agent.cli import main

    cfg = tmp_path / "trainmedic.yaml"
    cfg.write_text(f"notify:\n  sinks:\n    - kind: {kind}\n      url: '{url}'\n")
    assert main(["config", "show", "--config", str(cfg)]) == 0
    out = capsys.readouterr().out
    assert "example.invalid" in out
    for secret in secrets:
        assert secret not in out, f"{secret} shown"
