"""The configuration reference generated from the settings model (agent/configref.py).

Every setting must have a description (the reference is the documentation), every environment
variable it names must really set that setting through agent.config.load_settings, and the output
must be the same on every machine.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from paths import ROOT
from pydantic import BaseModel, Field

from trainmedic.agent.config import ConfigError, Settings, load_settings
from trainmedic.agent.configref import FieldDoc, field_docs, groups, missing_descriptions, reference_markdown

FIELDS = list(field_docs())


@pytest.mark.parametrize("f", FIELDS, ids=lambda f: f.path)
def test_every_setting_has_a_description(f: FieldDoc) -> None:
    assert f.description, f"{f.path}: give it a Field(description=...) in agent/config.py"
    assert f.type and f.default


def test_every_group_and_field_is_in_the_reference() -> None:
    text = reference_markdown()
    for g in groups():
        if g.path:
            assert f"`{g.path}`" in text
    for f in FIELDS:
        assert f"| `{f.name}` |" in text
        if f.env:
            assert f"`{f.env}`" in text
    for name in Settings.model_fields:
        assert f"`{name}`" in text


def test_reference_does_not_depend_on_the_machine() -> None:
    text = reference_markdown()
    assert text == reference_markdown()
    # node_name defaults to the host name at start: named, not evaluated.
    node = next(f for f in FIELDS if f.path == "node_name")
    assert node.default == "computed: `socket.gethostname()`"


def test_tables_are_well_formed() -> None:
    for line in reference_markdown().splitlines():
        if not line.startswith("|"):
            continue
        cells = re.split(r"(?<!\\)\|", line)
        assert len(cells) == 7, f"a row of 5 cells: {line}"


def env_cases() -> list[FieldDoc]:
    return [f for f in FIELDS if f.env]


def default_value(path: str) -> object:
    value: object = Settings()
    for part in path.split("."):
        value = getattr(value, part)
    return value


@pytest.mark.parametrize("f", env_cases(), ids=lambda f: f.env or f.path)
def test_environment_variable_sets_its_setting(f: FieldDoc) -> None:
    """The documented variable, given the default's value, is accepted for exactly that setting (a
    wrong group or name would be an unknown key, which load_settings refuses)."""
    current = default_value(f.path)
    if isinstance(current, BaseModel) or f.path == "node_name":
        raw = "some-node"
    elif hasattr(current, "get_secret_value"):
        raw = "s3cret"
    else:
        raw = yaml.safe_dump(current, default_flow_style=True).strip().removesuffix("...").strip()
    assert f.env is not None
    try:
        settings = load_settings(None, env={f.env: raw})
    except ConfigError as e:
        pytest.fail(f"{f.env}={raw!r}: {e.problems}")
    value: object = settings
    for part in f.path.split("."):
        value = getattr(value, part)
    if f.path == "node_name":
        assert value == "some-node"
    else:
        assert value == current


def test_list_items_have_no_variable_of_their_own() -> None:
    items = [g for g in groups() if g.path.endswith("[]")]
    assert items, "the notification sinks are documented as list items"
    for g in items:
        assert g.env_prefix is None
        assert all(f.env is None for f in g.fields)


class _Inner(BaseModel):
    """An inner group."""

    depth: int = Field(3, ge=1, description="How deep.")


class _Item(BaseModel):
    url: str = Field(description="Where | to.")


class _Model(BaseModel):
    plain: str = "x"
    inner: _Inner = Field(default_factory=_Inner)
    items: list[_Item] = Field(default_factory=list, description="Things.")
    choice: str | None = Field(None, description="Maybe.")


def test_walk_of_a_model() -> None:
    docs = {f.path: f for f in field_docs(_Model)}
    assert set(docs) == {"plain", "inner.depth", "items", "items[].url", "choice"}
    assert docs["inner.depth"].env == "TRAINMEDIC_INNER__DEPTH"
    assert docs["inner.depth"].type == "integer (>= 1)"
    assert docs["inner.depth"].default == "`3`"
    assert docs["items[].url"].env is None and docs["items[].url"].default == "(required)"
    assert docs["choice"].type == "string or null" and docs["choice"].default == "`null`"
    assert missing_descriptions(_Model) == ["plain"]
    text = reference_markdown(_Model)
    assert "Where \\| to." in text, "pipes are escaped in table cells"
    assert "An inner group." in text


def test_cli_prints_the_reference(capsys: pytest.CaptureFixture[str]) -> None:
    from trainmedic.agent.cli import main

    assert main(["config", "reference"]) == 0
    assert capsys.readouterr().out == reference_markdown()


@pytest.mark.parametrize(
    ("env", "shown", "hidden"),
    [
        ({"TRAINMEDIC_API__TOKEN": "tok-123456"}, "**********", "tok-123456"),
        ({"TRAINMEDIC_BUS__KIND": "kafka"}, "kind: kafka", None),
    ],
)
def test_cli_shows_effective_settings_without_secrets(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    env: dict[str, str],
    shown: str,
    hidden: str | None,
) -> None:
    from trainmedic.agent.cli import main

    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert main(["config", "show"]) == 0
    out = capsys.readouterr().out
    assert shown in out
    if hidden is not None:
        assert hidden not in out


def test_cli_show_lists_every_problem(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from trainmedic.agent.cli import main

    bad = tmp_path / "bad.yaml"
    bad.write_text("bus: {kind: carrier-pigeon}\napi: {port: -1}\n", encoding="utf-8")
    assert main(["config", "show", "--config", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "bus.kind" in err and "api.port" in err


def test_docs_page_is_the_generated_reference() -> None:
    page = ROOT / "docs" / "configuration.md"
    assert page.read_text(encoding="utf-8") == reference_markdown(), (
        "docs/configuration.md is stale: regenerate it with `trainmedic config reference > docs/configuration.md`"
    )


@pytest.mark.parametrize(
    ("url", "shown", "hidden"),
    [
        ("https://ops:PASSWORDSECRET@ops.example/hooks/x", "ops.example", "PASSWORDSECRET"),
        ("https://oapi.dingtalk.com/robot/send?access_token=TOKENSECRET", "oapi.dingtalk.com", "TOKENSECRET"),
        ("https://hooks.slack.com/services/T000/B000/SLACKSECRET", "hooks.slack.com/services/", "SLACKSECRET"),
        ("https://open.feishu.cn/open-apis/bot/v2/hook/FEISHUSECRET", "open.feishu.cn", "FEISHUSECRET"),
    ],
)
def test_cli_show_hides_credentials_in_urls(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], url: str, shown: str, hidden: str
) -> None:
    from trainmedic.agent.cli import main

    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"notify:\n  sinks:\n    - kind: cloudevents\n      url: '{url}'\n", encoding="utf-8")
    assert main(["config", "show", "--config", str(cfg)]) == 0
    out = capsys.readouterr().out
    assert shown in out and hidden not in out
