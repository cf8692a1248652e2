"""The on-disk compile cache (trainmedic/cache.py): hits, misses, invalidation, corruption, races,
the off switch, and the same findings with and without it. Also: `diagnose` stays light to import."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from paths import DATA, ROOT
from rulefix import rule, rule_file

import trainmedic.detectors.engine as engine_mod
import trainmedic.detectors.loader as loader_mod
import trainmedic.udal.base as udal_base
from trainmedic import cache
from trainmedic.datafile import node_line, parse_yaml
from trainmedic.detectors.engine import Engine, has_hyperscan
from trainmedic.detectors.loader import load_rules

REAL_LOGS = DATA / "real-logs.jsonl"
HEAVY = (
    *("fastapi", "uvicorn", "starlette", "kubernetes", "aiokafka", "httpx"),
    *("prometheus_client", "prometheus_api_client", "jinja2"),
)


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "cache"
    monkeypatch.setenv(cache.ENV_VAR, str(folder))
    return folder


def entries(folder: Path, kind: str) -> list[Path]:
    return sorted(folder.glob(f"{kind}-*.pickle")) if folder.exists() else []


def user_rules(tmp_path: Path, line: str = "x FROBNICATOR FAILED code=7") -> Path:
    d = tmp_path / "rules"
    d.mkdir(exist_ok=True)
    examples = f"    examples:\n      match:\n        - line: '{line}'\n          code: 'frob:7'\n"
    (d / "frob.yaml").write_text(rule_file(rule(examples=examples)), encoding="utf-8")
    return d


def no_parsing(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(path: Path) -> Any:
        raise AssertionError(f"{path} parsed although the rule set is cached")

    monkeypatch.setattr(loader_mod, "parse_rule_file", refuse)


def test_rules_miss_then_hit(cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = load_rules()
    assert len(entries(cache_dir, "rules")) == 1
    no_parsing(monkeypatch)
    second = load_rules()
    assert [r.id for r in second.rules] == [r.id for r in first.rules]
    assert second.origins == first.origins
    assert second.rules == first.rules


def test_user_rule_dir_is_part_of_the_key(cache_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d = user_rules(tmp_path)
    shipped = load_rules()
    with_user = load_rules([d])
    assert "test.frob" in [r.id for r in with_user.rules]
    assert "test.frob" not in [r.id for r in shipped.rules]
    assert len(entries(cache_dir, "rules")) == 2


def test_rule_file_change_invalidates(cache_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d = user_rules(tmp_path)
    before = load_rules([d], include_shipped=False)
    assert before.rules[0].examples.match[0].line == "x FROBNICATOR FAILED code=7"
    user_rules(tmp_path, line="y FROBNICATOR FAILED code=7")
    after = load_rules([d], include_shipped=False)
    assert after.rules[0].examples.match[0].line == "y FROBNICATOR FAILED code=7"
    assert len(entries(cache_dir, "rules")) == 2
    # Back to the first content: the first entry is used again, nothing parsed.
    user_rules(tmp_path)
    no_parsing(monkeypatch)
    assert load_rules([d], include_shipped=False).rules == before.rules


def test_rule_problems_are_not_cached(cache_dir: Path, tmp_path: Path) -> None:
    d = user_rules(tmp_path, line="FROBNICATOR OK")  # the example does not match: a load error
    with pytest.raises(Exception, match="rule"):
        load_rules([d], include_shipped=False)
    assert entries(cache_dir, "rules") == []


@pytest.mark.parametrize("garbage", [b"", b"not a pickle", cache._MAGIC + b"\x80\x04truncated"])
def test_corrupt_entries_are_rebuilt(cache_dir: Path, garbage: bytes) -> None:
    good = load_rules()
    Engine(good.rules)
    files = [p for p in cache_dir.iterdir() if p.suffix == ".pickle"]
    assert files
    for p in files:
        p.write_bytes(garbage)
    again = load_rules()
    assert again.rules == good.rules
    engine = Engine(again.rules)
    assert engine.scan_text("NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.")
    # Rewritten whole.
    assert all(p.read_bytes().startswith(cache._MAGIC) for p in entries(cache_dir, "rules"))


def test_entry_of_another_key_is_ignored(cache_dir: Path) -> None:
    cache.store("rules", "a" * 64, ["stale"])
    (cache_dir / f"rules-{'a' * 64}.pickle").rename(cache_dir / f"rules-{'b' * 64}.pickle")
    assert cache.load("rules", "b" * 64) is None
    assert cache.load("rules", "a" * 64) is None


def test_unwritable_cache_dir_is_not_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv(cache.ENV_VAR, str(blocker / "cache"))  # a folder under a file: never creatable
    assert load_rules().rules


def test_disable_switch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv(cache.ENV_VAR, "")
    assert cache.cache_dir() is None
    Engine(load_rules().rules)
    udal_base.load_package_catalog.__wrapped__("generic_catalog.yaml")
    assert not (tmp_path / "xdg").exists()
    assert not (tmp_path / "home").exists()


def test_default_location(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(cache.ENV_VAR, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache.cache_dir() == tmp_path / "xdg" / "trainmedic"
    monkeypatch.setenv("XDG_CACHE_HOME", "")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache.cache_dir() == tmp_path / "home" / ".cache" / "trainmedic"


def test_catalog_cached(cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    load = udal_base.load_package_catalog.__wrapped__  # past the in-process functools.cache
    first = load("nvidia_catalog.yaml")
    assert len(entries(cache_dir, "catalog")) == 1

    def refuse(text: str, filename: str) -> Any:
        raise AssertionError("catalog parsed although cached")

    monkeypatch.setattr(udal_base, "load_catalog_text", refuse)
    assert load("nvidia_catalog.yaml") == first


@pytest.mark.skipif(not has_hyperscan(), reason="hyperscan is not installed")
def test_hyperscan_database_cached(cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rules = load_rules().rules
    Engine(rules, fast=True)
    assert entries(cache_dir, "hyperscan")

    def refuse(items: Any, flags: int) -> Any:
        raise AssertionError("hyperscan compiled although cached")

    monkeypatch.setattr(engine_mod._HyperscanPrefilter, "_compile", staticmethod(refuse))
    engine = Engine(rules, fast=True)
    found = engine.scan_text("NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.")
    assert any(f.code == "xid:79" for f in found)


# -- the command as users run it ----------------------------------------------------------------------


def _real_lines(n: int) -> list[tuple[str, str]]:
    rows = [json.loads(line) for line in REAL_LOGS.read_text(encoding="utf-8").splitlines() if line.strip()]
    seen: dict[str, str] = {}
    for row in rows:
        seen.setdefault(str(row.get("chip")), row["text"])
    return list(seen.items())[:n]


def _diagnose(log: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trainmedic.agent.cli", "diagnose", "--logs", str(log), "--format", "json"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != cache.ENV_VAR}
    env.update(extra)
    return env


@pytest.mark.parametrize(("chip", "text"), _real_lines(4), ids=[c for c, _ in _real_lines(4)])
def test_same_findings_with_and_without_cache(tmp_path: Path, chip: str, text: str) -> None:
    log = tmp_path / "one.log"
    log.write_text(text + "\n", encoding="utf-8")
    uncached = _diagnose(log, _env(TRAINMEDIC_CACHE_DIR=""))
    cold = _diagnose(log, _env(TRAINMEDIC_CACHE_DIR=str(tmp_path / "cache")))
    warm = _diagnose(log, _env(TRAINMEDIC_CACHE_DIR=str(tmp_path / "cache")))
    assert uncached.returncode == cold.returncode == warm.returncode == 0, uncached.stderr + warm.stderr
    assert json.loads(uncached.stdout) == json.loads(cold.stdout) == json.loads(warm.stdout)
    assert entries(tmp_path / "cache", "rules")


def test_two_processes_build_at_once(tmp_path: Path) -> None:
    log = tmp_path / "one.log"
    log.write_text(_real_lines(1)[0][1] + "\n", encoding="utf-8")
    folder = tmp_path / "cache"
    cmd = [sys.executable, "-m", "trainmedic.agent.cli", "diagnose", "--logs", str(log), "--format", "json"]
    env = _env(TRAINMEDIC_CACHE_DIR=str(folder))
    procs = [
        subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [e for _, e in outs]
    assert json.loads(outs[0][0]) == json.loads(outs[1][0])
    # Whole entries only, no temporary file left behind, and a third process reads them.
    assert not list(folder.glob(".*.tmp"))
    for p in folder.glob("*.pickle"):
        assert p.read_bytes().startswith(cache._MAGIC)
    third = _diagnose(log, env)
    assert third.returncode == 0 and json.loads(third.stdout) == json.loads(outs[0][0])


@pytest.mark.parametrize("fmt", ["json", "text"])
def test_diagnose_does_not_import_heavy_modules(tmp_path: Path, fmt: str) -> None:
    log = tmp_path / "one.log"
    log.write_text(_real_lines(1)[0][1] + "\n", encoding="utf-8")
    probe = (
        "import contextlib, io, json, sys\n"
        "from trainmedic.agent.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        f"    rc = main(['diagnose', '--logs', {str(log)!r}, '--format', {fmt!r}])\n"
        f"print(json.dumps([rc, sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r})]))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=ROOT,
        env=_env(TRAINMEDIC_CACHE_DIR=str(tmp_path / "cache")),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    rc, heavy = json.loads(out.stdout.strip().splitlines()[-1])
    assert rc == 0
    expected = ["jinja2"] if fmt == "text" else []  # the text format is rendered with a template
    assert sorted({m.split(".")[0] for m in heavy}) == expected


# -- libyaml: the same data, the same lines, the same messages ------------------------------------------


def test_parse_yaml_lines_with_libyaml() -> None:
    text = "version: 1\nrules:\n  - id: a\n    colour: red\n"
    root, data, problem = parse_yaml(text, "f.yaml")
    assert problem is None
    assert data == yaml.safe_load(text)
    assert node_line(root, ["rules", 0, "colour"]) == 4
    assert node_line(root, ["rules", 0]) == 3


@pytest.mark.parametrize("text", ["a: b: c\n", "a:\n  - x\n - y\n", "k: [1, 2\n", "a: 'x\n"])
def test_parse_yaml_syntax_errors_as_before(text: str) -> None:
    _, _, problem = parse_yaml(text, "f.yaml")
    assert problem is not None
    with pytest.raises(yaml.MarkedYAMLError) as info:
        yaml.safe_load(text)
    mark = info.value.problem_mark or info.value.context_mark
    assert problem.line == (mark.line + 1 if mark else None)
    assert str(info.value.problem) in problem.message


@pytest.mark.skipif(not has_hyperscan(), reason="hyperscan is not installed")
def test_unloadable_hyperscan_database_is_compiled_afresh(cache_dir: Path) -> None:
    rules = load_rules().rules
    Engine(rules, fast=True)
    for p in entries(cache_dir, "hyperscan"):
        key = p.stem.removeprefix("hyperscan-")
        cache.store("hyperscan", key, (b"not a hyperscan database", []))
    engine = Engine(rules, fast=True)
    found = engine.scan_text("NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.")
    assert any(f.code == "xid:79" for f in found)


def test_cache_dir_variable_is_not_a_setting() -> None:
    from trainmedic.agent.config import load_settings

    load_settings(env={cache.ENV_VAR: "/somewhere"})
    load_settings(env={cache.ENV_VAR: ""})


def test_old_entries_are_pruned(cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cache, "KEEP_PER_KIND", 3)
    for i in range(5):
        cache.store("rules", f"{i:064x}", i)
        os.utime(cache_dir / f"rules-{i:064x}.pickle", (1000 + i, 1000 + i))
    cache.store("catalog", "c" * 64, "other kind")
    assert cache.load("rules", f"{0:064x}") is None  # pruned: the oldest
    kept = {p.name for p in entries(cache_dir, "rules")}
    assert kept == {f"rules-{i:064x}.pickle" for i in (2, 3, 4)}
    assert cache.load("catalog", "c" * 64) == "other kind"
