"""A real Prometheus (the Debian `prometheus` binary) on a free loopback port, for tests.

The tests configure it to scrape their exporters every second, start it with a throw-away TSDB in a
temporary directory, wait until it is ready and has scraped every target once, and stop it
(SIGTERM, then SIGKILL). Where the binary is missing, `require_prometheus()` skips the test, or
fails it under CI=true, where `make test` must have installed it (DESIGN.md "Real components").
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import pytest

ENV_BINARY = "TRAINMEDIC_PROMETHEUS"


def find_prometheus() -> str | None:
    """$TRAINMEDIC_PROMETHEUS, `prometheus` on PATH, or the Debian package's /usr/bin/prometheus."""
    explicit = os.environ.get(ENV_BINARY)
    if explicit:
        return explicit if os.access(explicit, os.X_OK) else None
    found = shutil.which("prometheus")
    if found:
        return found
    return "/usr/bin/prometheus" if os.access("/usr/bin/prometheus", os.X_OK) else None


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def require_prometheus() -> str:
    binary = find_prometheus()
    if binary is None:
        reason = "the prometheus binary is missing (make servers installs the Debian package)"
        if in_ci():
            pytest.fail(f"CI is set but {reason}")
        pytest.skip(reason)
    return binary


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class Target:
    """One scrape target: an exporter's host:port and the target labels Prometheus adds."""

    address: str
    labels: Mapping[str, str] = field(default_factory=dict)
    job: str = "accelerators"


class PrometheusServer:
    def __init__(
        self,
        binary: str,
        workdir: Path,
        targets: Sequence[Target],
        *,
        port: int | None = None,
        scrape_interval: str = "1s",
    ) -> None:
        self.binary = binary
        self.workdir = workdir
        self.targets = list(targets)
        self.port = port or free_port()
        self.scrape_interval = scrape_interval
        self._proc: subprocess.Popen[bytes] | None = None
        self.log_path = workdir / "prometheus.log"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _config(self) -> dict[str, Any]:
        jobs: dict[str, list[dict[str, Any]]] = {}
        for t in self.targets:
            jobs.setdefault(t.job, []).append({"targets": [t.address], "labels": dict(t.labels)})
        return {
            "global": {"scrape_interval": self.scrape_interval, "evaluation_interval": self.scrape_interval},
            "scrape_configs": [
                {"job_name": job, "scrape_interval": self.scrape_interval, "static_configs": static}
                for job, static in jobs.items()
            ],
        }

    def start(self, timeout: float = 30.0) -> Self:
        self.workdir.mkdir(parents=True, exist_ok=True)
        config = self.workdir / "prometheus.yml"
        # JSON is YAML: no YAML writer needed.
        config.write_text(json.dumps(self._config(), indent=2))
        with self.log_path.open("ab") as log:
            self._proc = subprocess.Popen(
                [
                    self.binary,
                    f"--config.file={config}",
                    f"--storage.tsdb.path={self.workdir / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    "--log.level=warn",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"prometheus exited with {self._proc.returncode}: {self.log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as r:
                    if r.status == 200:
                        return self
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"prometheus not ready after {timeout}s: {self.log_tail()}")

    def query(self, promql: str) -> list[dict[str, Any]]:
        """An instant query through the HTTP API (the test's own view, independent of the code under test)."""
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        with urllib.request.urlopen(url, timeout=5) as r:
            body = json.loads(r.read())
        result: list[dict[str, Any]] = body["data"]["result"]
        return result

    def wait_for(
        self, promql: str, predicate: Callable[[list[dict[str, Any]]], bool], timeout: float = 15.0
    ) -> list[dict[str, Any]]:
        """Poll `promql` until `predicate(result)` holds."""
        deadline = time.monotonic() + timeout
        result: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            try:
                result = self.query(promql)
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                result = []
            if predicate(result):
                return result
            time.sleep(0.1)
        raise TimeoutError(f"{promql}: condition not met within {timeout}s; last result {result}")

    def wait_scraped(self, timeout: float = 15.0) -> None:
        """Until every target has been scraped successfully once."""
        want = {t.address for t in self.targets}
        self.wait_for(
            "up == 1",
            lambda r: want <= {str(s["metric"].get("instance")) for s in r},
            timeout,
        )

    def log_tail(self, limit: int = 2000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-limit:]
        except OSError:
            return ""

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
