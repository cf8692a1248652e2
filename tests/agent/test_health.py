"""Readiness, `run --check`, `--version` and the `incidents` listing a person reads on a terminal."""

from __future__ import annotations

import http.server
import re
import socket
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

from trainmedic import __version__
from trainmedic.agent.cli import main, when
from trainmedic.agent.config import Role, Settings, load_settings
from trainmedic.agent.health import bootstrap_hosts, preflight, readiness
from trainmedic.agent.run import build_agent
from trainmedic.agent.store import IncidentStore

RFC3339 = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(Z|[+-]\d\d:\d\d)")


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _settings(tmp_path: Path, **groups: dict[str, Any]) -> Settings:
    """Settings with every host source off unless `groups` turns one on, stores in `tmp_path`."""
    env = {
        "TRAINMEDIC_REMEDIATE__STORE": str(tmp_path / "store.db"),
        "TRAINMEDIC_REMEDIATE__SCENE_DIR": str(tmp_path / "scenes"),
        "TRAINMEDIC_LOGS__ROOT": str(tmp_path / "no-pods"),
        "TRAINMEDIC_KERNEL__SOURCE": "'off'",
        "TRAINMEDIC_METRICS__NVML": "false",
        "TRAINMEDIC_KUBERNETES__ENABLED": "false",
        "TRAINMEDIC_API__ENABLED": "false",
    }
    for group, fields in groups.items():
        for k, v in fields.items():
            env[f"TRAINMEDIC_{group.upper()}__{k.upper()}"] = str(v)
    return load_settings(None, env=env)


# ------------------------------------------------------------------------------------------------
# --version and times


@pytest.mark.parametrize("argv", [["--version"], ["version"]])
def test_version(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    try:
        rc = main(argv)
    except SystemExit as e:  # argparse's version action exits 0
        rc = int(e.code or 0)
    assert rc == 0
    assert __version__ in capsys.readouterr().out


@pytest.mark.parametrize(
    ("t", "utc", "expected"),
    [
        (0.0, True, "1970-01-01T00:00:00Z"),
        (1_790_000_000.4, True, "2026-09-21T14:13:20Z"),
        (None, True, "-"),
    ],
)
def test_times_are_rfc3339(t: float | None, utc: bool, expected: str) -> None:
    assert when(t, utc=utc) == expected


@pytest.mark.parametrize("tz", ["UTC", "Asia/Shanghai", "America/New_York"])
def test_local_times_carry_their_offset(tz: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    monkeypatch.setenv("TZ", tz)
    time.tzset()
    try:
        text = when(1_790_000_000.0)
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()
    assert RFC3339.fullmatch(text), text
    assert text.endswith({"UTC": "Z", "Asia/Shanghai": "+08:00", "America/New_York": "-04:00"}[tz])


@pytest.mark.parametrize("control", ["\x1b[2J", "\u009b31m", "\x07", "\r"])
@pytest.mark.parametrize("show", [False, True])
def test_incidents_print_rfc3339_and_no_control_characters(
    tmp_path: Path, control: str, show: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "s.db"
    store = IncidentStore(path)
    store.open_incident(
        "inc-0001",
        key="job:train/llama",
        diagnosis={"revision": 1},
        revision=1,
        namespace="train",
        job=f"llama{control}",
        fault_class="device_error",
        code="xid:79",
        node=f"gpu-2{control}",
    )
    store.close()
    argv = ["incidents", "--store", str(path), "--utc"] + (["inc-0001"] if show else [])
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "llama" in out and "gpu-2" in out
    assert RFC3339.search(out) and re.search(r"\d{10}\.\d", out) is None
    assert [c for c in out if (ord(c) < 32 and c not in "\n\t") or 0x7F <= ord(c) <= 0x9F] == []


# ------------------------------------------------------------------------------------------------
# run --check


def _levels(settings: Settings, role: Role) -> dict[str, str]:
    return {c.name: c.level for c in preflight(settings, role, timeout=1.0)}


@pytest.mark.parametrize("role", [Role.ALL])
def test_check_fails_when_every_source_is_off(tmp_path: Path, role: Role) -> None:
    levels = _levels(_settings(tmp_path), role)
    assert levels["sources"] == "fail"
    assert levels["container-logs"] == "off"


@pytest.mark.parametrize("role", [Role.ALL])
def test_check_passes_with_a_source(tmp_path: Path, role: Role) -> None:
    (tmp_path / "pods").mkdir()
    levels = _levels(_settings(tmp_path, logs={"root": tmp_path / "pods"}), role)
    assert "sources" not in levels
    assert levels["container-logs"] == "ok"
    assert "fail" not in levels.values()


@pytest.mark.parametrize("role", [Role.BRAIN, Role.NODE])
def test_check_fails_when_the_broker_is_unreachable(tmp_path: Path, role: Role) -> None:
    port = _closed_port()
    (tmp_path / "pods").mkdir()
    settings = _settings(
        tmp_path, bus={"kind": "kafka", "bootstrap": f"127.0.0.1:{port}"}, logs={"root": tmp_path / "pods"}
    )
    assert _levels(settings, role)[f"kafka 127.0.0.1:{port}"] == "fail"


@pytest.mark.parametrize("role", [Role.BRAIN])
def test_check_passes_when_the_broker_listens(tmp_path: Path, role: Role) -> None:
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        port = srv.getsockname()[1]
        settings = _settings(tmp_path, bus={"kind": "kafka", "bootstrap": f"127.0.0.1:{port}"})
        assert _levels(settings, role)[f"kafka 127.0.0.1:{port}"] == "ok"


@pytest.mark.parametrize("mounted", [True, False])
def test_check_reads_the_checkpoint_mounts(tmp_path: Path, mounted: bool) -> None:
    from trainmedic.agent.health import checkpoint_checks

    local = tmp_path / "ckpt"
    if mounted:
        local.mkdir()
    settings = _settings(tmp_path)
    settings.remediate.checkpoint_path_map = {"/mnt/ckpt": str(local)}
    (check,) = checkpoint_checks(settings)
    assert check.level == ("ok" if mounted else "fail")
    assert str(local) in check.name and check.en and check.zh


@pytest.mark.parametrize("pods", [True, False])
def test_run_check_exit_status_and_bilingual_message(
    tmp_path: Path, pods: bool, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "c.yaml"
    (tmp_path / "pods").mkdir()
    config.write_text(
        f"logs: {{root: {tmp_path / 'pods' if pods else tmp_path / 'none'}}}\n"
        "kernel: {source: 'off'}\nmetrics: {nvml: false}\nkubernetes: {enabled: false}\napi: {enabled: false}\n"
        f"remediate: {{store: {tmp_path / 's.db'}, scene_dir: {tmp_path / 'scenes'}}}\n",
        encoding="utf-8",
    )
    rc = main(["run", "--config", str(config), "--check"])
    out, err = capsys.readouterr()
    assert rc == (0 if pods else 1)
    if pods:
        assert "check OK" in out and "检查通过" in out
    else:
        assert "check FAILED" in err and "检查未通过" in err


@pytest.mark.parametrize(
    ("bootstrap", "expected"),
    [
        ("kafka-0:9092,kafka-1:9093", [("kafka-0", 9092), ("kafka-1", 9093)]),
        ("kafka", [("kafka", 9092)]),
        ("[::1]:9092", [("::1", 9092)]),
    ],
)
def test_bootstrap_hosts(bootstrap: str, expected: list[tuple[str, int]]) -> None:
    assert bootstrap_hosts(bootstrap) == expected


# ------------------------------------------------------------------------------------------------
# /readyz and trainmedic_ready


async def _readyz(agent: Any) -> httpx.Response:
    from trainmedic.agent import api

    app = api.create_app(store=None, telemetry=agent.telemetry, settings=agent.settings.api, ready=readiness(agent))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://trainmedic") as c:
        return await c.get("/readyz")


def _gauge(agent: Any) -> float:
    return float(agent.telemetry.registry.get_sample_value("trainmedic_ready") or 0.0)


@pytest.mark.asyncio
@pytest.mark.parametrize(("pods", "ready"), [(True, True), (False, False)])
async def test_readyz_is_503_while_every_source_is_off(tmp_path: Path, pods: bool, ready: bool) -> None:
    (tmp_path / "pods").mkdir()
    settings = _settings(tmp_path, logs={"root": tmp_path / ("pods" if pods else "none")}, remediate={"enabled": False})
    agent = build_agent(settings, Role.ALL)
    agent.brain = None  # the brain joins its group only when run; readiness of the sources alone
    agent.started.set()
    r = await _readyz(agent)
    assert (r.status_code == 200) is ready
    assert _gauge(agent) == (1.0 if ready else 0.0)
    if not ready:
        body = r.json()
        assert body["code"] == "not_ready"
        assert any("every source is off" in w for w in body["detail"]["waiting"])
        assert any("所有数据源均已关闭" in w for w in body["detail"]["waiting_zh"])


@pytest.mark.asyncio
@pytest.mark.parametrize("role", [Role.NODE])
async def test_readyz_is_503_while_kafka_is_unreachable(tmp_path: Path, role: Role) -> None:
    (tmp_path / "pods").mkdir()
    port = _closed_port()
    settings = _settings(
        tmp_path, bus={"kind": "kafka", "bootstrap": f"127.0.0.1:{port}"}, logs={"root": tmp_path / "pods"}
    )
    agent = build_agent(settings, role)
    agent.started.set()
    await agent.bus.start()
    try:
        r = await _readyz(agent)
    finally:
        await agent.bus.stop()
    assert r.status_code == 503
    assert any(f"127.0.0.1:{port} is unreachable" in w for w in r.json()["detail"]["waiting"])
    assert _gauge(agent) == 0.0


# ------------------------------------------------------------------------------------------------
# run --check reads the Kubernetes API once with the agent's credentials


def _client(url: str) -> Any:
    from kubernetes import client as kclient

    return kclient.ApiClient(kclient.Configuration(host=url))


@pytest.mark.asyncio
@pytest.mark.parametrize("role", [Role.ALL, Role.BRAIN])
async def test_check_reads_the_api_server(tmp_path: Path, role: Role) -> None:
    import asyncio

    from servers.kube import KubeEmulator, require_kmock

    require_kmock()
    (tmp_path / "pods").mkdir()
    env: dict[str, Any] = {"logs": {"root": tmp_path / "pods"}, "kubernetes": {"enabled": "true"}}
    if role is Role.BRAIN:
        env["bus"] = {"kind": "kafka", "bootstrap": f"127.0.0.1:{_closed_port()}"}
    settings = _settings(tmp_path, **env)
    async with KubeEmulator() as kube:
        checks = await asyncio.to_thread(preflight, settings, role, api_client=kube.api_client(), timeout=5.0)
    (api,) = [c for c in checks if c.name == "kubernetes-api"]
    assert api.level == "ok", api.en
    assert ("nodes" if role is Role.BRAIN else "pods") in api.en


class _Refuse(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b'{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"Forbidden","code":403}'
        self.send_response(403)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        return


@pytest.mark.parametrize("server", ["forbidden", "unreachable"])
def test_check_fails_when_the_api_server_refuses_or_is_away(tmp_path: Path, server: str) -> None:
    from trainmedic.agent.health import kube_check

    if server == "forbidden":
        httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Refuse)
        thread = threading.Thread(target=httpd.serve_forever, daemon=True)
        thread.start()
        url = f"http://127.0.0.1:{httpd.server_address[1]}"
    else:
        url = f"http://127.0.0.1:{_closed_port()}"
    try:
        check = kube_check(_client(url), Role.CLUSTER, timeout=2.0)
    finally:
        if server == "forbidden":
            httpd.shutdown()
            httpd.server_close()
    assert check.level == "fail"
    assert ("RBAC" in check.en and "RBAC" in check.zh) if server == "forbidden" else "unreachable" in check.en


@pytest.mark.parametrize(
    ("mode", "image", "mapped", "expected"),
    [
        ("auto", "trainmedic:1", False, {"checkpoint reader": "ok"}),
        ("pod", "trainmedic:1", False, {"checkpoint reader": "ok"}),
        ("pod", None, False, {"checkpoint reader": "off", "checkpoints": "off"}),
        ("auto", None, False, {"checkpoints": "off"}),
        ("off", "trainmedic:1", False, {"checkpoints": "off"}),
        ("auto", "trainmedic:1", True, {"checkpoint reader": "ok", "checkpoints ": "ok"}),
    ],
)
def test_check_names_the_checkpoint_reader(
    tmp_path: Path, mode: str, image: str | None, mapped: bool, expected: dict[str, str]
) -> None:
    from trainmedic.agent.health import checkpoint_checks

    settings = _settings(tmp_path)
    settings.remediate.checkpoint_reader = mode  # type: ignore[assignment]
    settings.remediate.checkpoint_reader_image = image
    if mapped:
        (tmp_path / "ckpt").mkdir()
        settings.remediate.checkpoint_path_map = {"/mnt/ckpt": str(tmp_path / "ckpt")}
    checks = checkpoint_checks(settings)
    got = {("checkpoints " if c.name.startswith("checkpoints ") else c.name): c.level for c in checks}
    assert got == expected
    assert all(c.en and c.zh for c in checks)
