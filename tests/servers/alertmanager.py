"""A real Alertmanager (Debian's `prometheus-alertmanager`) on a free loopback port, for tests.

Tests push alerts to its /api/v2/alerts and read them back, or route them to a webhook receiver of
their own (a real HTTP server) to see the v4 notification payload Alertmanager sends. Each server has
its own temporary storage and configuration, no cluster listener (HA gossip off), and is stopped with
SIGTERM, then SIGKILL. Where the binary is missing, `require_alertmanager()` skips the test, or fails
it under CI=true, where `make test` must have installed it (DESIGN.md "Real components").

    async with AlertmanagerServer(webhook_config("http://127.0.0.1:8080/hook", token="t")) as am:
        await am.post_alerts([{"labels": {"alertname": "X"}}])
        await am.wait_for_alerts(lambda alerts: len(alerts) == 1)
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import pytest

from servers.prometheus import free_port, in_ci

ENV_BINARY = "TRAINMEDIC_ALERTMANAGER"

NULL_CONFIG: dict[str, Any] = {
    "route": {"receiver": "null", "group_wait": "0s", "group_interval": "1s", "repeat_interval": "1h"},
    "receivers": [{"name": "null"}],
}


def find_alertmanager() -> str | None:
    """$TRAINMEDIC_ALERTMANAGER, `prometheus-alertmanager` or `alertmanager` on PATH, or the Debian path."""
    explicit = os.environ.get(ENV_BINARY)
    if explicit:
        return explicit if os.access(explicit, os.X_OK) else None
    for name in ("prometheus-alertmanager", "alertmanager"):
        found = shutil.which(name)
        if found:
            return found
    debian = "/usr/bin/prometheus-alertmanager"
    return debian if os.access(debian, os.X_OK) else None


def require_alertmanager() -> str:
    binary = find_alertmanager()
    if binary is None:
        reason = "the alertmanager binary is missing (make servers installs prometheus-alertmanager)"
        if in_ci():
            pytest.fail(f"CI is set but {reason}")
        pytest.skip(reason)
    return binary


def webhook_config(
    url: str,
    *,
    token: str | None = None,
    group_by: Sequence[str] = ("alertname",),
    group_wait: str = "0s",
    group_interval: str = "1s",
    repeat_interval: str = "1h",
    send_resolved: bool = True,
    max_alerts: int = 0,
) -> dict[str, Any]:
    """A configuration routing every alert to one webhook receiver (bearer `token` when given)."""
    hook: dict[str, Any] = {"url": url, "send_resolved": send_resolved, "max_alerts": max_alerts}
    if token is not None:
        hook["http_config"] = {"authorization": {"type": "Bearer", "credentials": token}}
    return {
        "route": {
            "receiver": "webhook",
            "group_by": list(group_by),
            "group_wait": group_wait,
            "group_interval": group_interval,
            "repeat_interval": repeat_interval,
        },
        "receivers": [{"name": "webhook", "webhook_configs": [hook]}],
    }


class AlertmanagerServer:
    """`async with AlertmanagerServer(config) as am:` a started, ready Alertmanager at `am.url`."""

    def __init__(
        self,
        config: Mapping[str, Any] | None = None,
        *,
        binary: str | None = None,
        workdir: Path | None = None,
        port: int | None = None,
    ) -> None:
        self.config: dict[str, Any] = dict(config) if config is not None else json.loads(json.dumps(NULL_CONFIG))
        self._binary = binary
        self._workdir = workdir
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self.port = port or free_port()
        self._proc: subprocess.Popen[bytes] | None = None
        self.log_path: Path | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self, timeout: float = 30.0) -> Self:
        """Start and wait until /-/ready answers 200 (blocking; `async with` runs it in a thread)."""
        try:
            return self._start(timeout)
        except BaseException:
            self.stop()
            raise

    def _start(self, timeout: float) -> Self:
        binary = self._binary or require_alertmanager()
        if self._workdir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="trainmedic-am-")
            self._workdir = Path(self._tmp.name)
        workdir = self._workdir
        workdir.mkdir(parents=True, exist_ok=True)
        config = workdir / "alertmanager.yml"
        config.write_text(json.dumps(self.config, indent=2))  # JSON is YAML
        self.log_path = workdir / "alertmanager.log"
        with self.log_path.open("ab") as log:
            self._proc = subprocess.Popen(
                [
                    binary,
                    f"--config.file={config}",
                    f"--storage.path={workdir / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    "--cluster.listen-address=",
                    "--log.level=warn",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"alertmanager exited with {self._proc.returncode}: {self.log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as r:
                    if r.status == 200:
                        return self
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.05)
        raise RuntimeError(f"alertmanager not ready after {timeout}s: {self.log_tail()}")

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None
            self._workdir = None

    async def __aenter__(self) -> Self:
        return await asyncio.to_thread(self.start)

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await asyncio.to_thread(self.stop)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # -- the test's own view through the v2 API ------------------------------------------------

    def _request(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            f"{self.url}{path}", data=data, method=method, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=5) as r:
            raw = r.read()
        return json.loads(raw) if raw.strip() else None

    async def post_alerts(self, alerts: Sequence[Mapping[str, Any]]) -> None:
        """POST /api/v2/alerts (postable alerts: labels, annotations, startsAt, endsAt, generatorURL)."""
        await asyncio.to_thread(self._request, "POST", "/api/v2/alerts", [dict(a) for a in alerts])

    async def alerts(self) -> list[dict[str, Any]]:
        """GET /api/v2/alerts: the alerts Alertmanager holds (active, silenced, inhibited)."""
        result: list[dict[str, Any]] = await asyncio.to_thread(self._request, "GET", "/api/v2/alerts")
        return result

    async def wait_for_alerts(
        self, predicate: Callable[[list[dict[str, Any]]], bool], timeout: float = 15.0
    ) -> list[dict[str, Any]]:
        """Poll GET /api/v2/alerts until `predicate(alerts)` holds."""
        deadline = time.monotonic() + timeout
        alerts: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            try:
                alerts = await self.alerts()
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                alerts = []
            if predicate(alerts):
                return alerts
            await asyncio.sleep(0.05)
        raise TimeoutError(f"alertmanager: condition not met within {timeout}s; last alerts {alerts}")

    def log_tail(self, limit: int = 2000) -> str:
        if self.log_path is None:
            return ""
        try:
            return self.log_path.read_text(errors="replace")[-limit:]
        except OSError:
            return ""
