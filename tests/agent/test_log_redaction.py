"""The agent's own logging (agent/run/supervise.py setup_logging) never prints URL credentials: the
handler it installs makes every record's URLs safe, whichever logger the record comes from, and the
Prometheus watcher logs its URL in the safe form (metrics.prometheus_url is where Prometheus
credentials go)."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Literal

import pytest
from servers.prometheus import free_port

from trainmedic.agent.bus.memory import MemoryBus
from trainmedic.agent.config import Settings
from trainmedic.agent.run.supervise import setup_logging
from trainmedic.agent.watchers.metrics import PrometheusQueryError, PrometheusSource

SECRET = "PASS-w0rd-4f9c"
LogFormat = Literal["json", "text"]


@contextmanager
def agent_logging(log_format: LogFormat) -> Iterator[None]:
    """The agent's logging set up at DEBUG for the test, the root logger and the levels it changes
    put back afterwards."""
    root = logging.getLogger()
    quiet = ("aiokafka", "kafka", "kubernetes", "urllib3")
    saved = (root.handlers[:], root.level, {n: logging.getLogger(n).level for n in quiet})
    setup_logging(Settings(log_level="DEBUG", log_format=log_format))
    try:
        yield
    finally:
        for handler in root.handlers:
            if handler not in saved[0]:
                handler.flush()
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
        for name, level in saved[2].items():
            logging.getLogger(name).setLevel(level)


PROMETHEUS_URLS = pytest.mark.parametrize(
    "url",
    ["http://u:{secret}@127.0.0.1:{port}", "http://{secret}:x@127.0.0.1:{port}/prometheus"],
    ids=["password", "user"],
)


@PROMETHEUS_URLS
@pytest.mark.asyncio
async def test_a_prometheus_error_names_no_credentials(url: str) -> None:
    """The error a poll raises (logged, and kept where a scene's metrics could not be read) names
    the Prometheus in the safe form."""
    source = PrometheusSource(url.format(secret=SECRET, port=free_port()), bus=MemoryBus(), timeout_s=5)
    try:
        with pytest.raises(PrometheusQueryError) as info:
            await source.poll_once()
    finally:
        source.close()
    assert info.value.kind == "unreachable"
    assert "cannot connect to http://<redacted>@127.0.0.1:" in str(info.value)
    assert SECRET not in str(info.value)


@pytest.mark.parametrize("log_format", ["text", "json"])
@PROMETHEUS_URLS
@pytest.mark.asyncio
async def test_a_failing_poll_logs_no_prometheus_credentials(
    capsys: pytest.CaptureFixture[str], log_format: LogFormat, url: str
) -> None:
    """A real client polling a closed port: the warning names the Prometheus, its credentials masked."""
    prometheus_url = url.format(secret=SECRET, port=free_port())
    with agent_logging(log_format):
        source = PrometheusSource(prometheus_url, bus=MemoryBus(), interval_s=60, backoff_base_s=30, timeout_s=5)
        task = asyncio.create_task(source.run())
        try:
            deadline = time.monotonic() + 20
            while source.failures < 1:
                assert not task.done(), task
                assert time.monotonic() < deadline, "the poll did not fail"
                await asyncio.sleep(0.02)
        finally:
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            source.close()
    err = capsys.readouterr().err
    assert "prometheus http://<redacted>@127.0.0.1:" in err, err
    assert SECRET not in err


@pytest.mark.parametrize("log_format", ["text", "json"])
@pytest.mark.parametrize("logger_name", ["trainmedic.some.new.module", "somelibrary.client", ""])
@pytest.mark.parametrize("with_traceback", [False, True], ids=["message", "traceback"])
def test_the_agents_handler_redacts_urls_of_any_logger(
    capsys: pytest.CaptureFixture[str], log_format: LogFormat, logger_name: str, with_traceback: bool
) -> None:
    """A logger nobody registered (agent/urlsafe.py LOGGERS names a few): its record still goes out
    through the agent's handler with the URL's user info, query values and hook path masked."""
    urls = [
        f"https://bot:{SECRET}@hooks.example.com/x",
        f"https://prometheus.example:9090/api/v1/query?token={SECRET}",
        f"https://open.feishu.cn/open-apis/bot/v2/hook/{SECRET}",
    ]
    log = logging.getLogger(logger_name)
    with agent_logging(log_format):
        if with_traceback:
            try:
                raise ConnectionError(f"cannot reach {' '.join(urls)}")
            except ConnectionError:
                log.exception("posting failed")
        else:
            log.warning("posting to %s failed", " ".join(urls))
    err = capsys.readouterr().err
    assert SECRET not in err
    assert "https://<redacted>@hooks.example.com/x" in err
    assert "query?token=<redacted>" in err
    assert "open.feishu.cn/open-apis/bot/v2/hook/<redacted>" in err
    if log_format == "json":
        record = json.loads(err.strip().splitlines()[-1])
        assert record["logger"] == (logger_name or "root")
        assert ("exception" in record) == with_traceback
