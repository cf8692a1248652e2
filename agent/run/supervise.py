"""Each component under a supervisor (restarted with backoff after a failure, off for good when its
source is unavailable here), the agent run until SIGTERM / SIGINT and drained, and the log format.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

from trainmedic.agent.config import Settings
from trainmedic.agent.run.agent import Agent, SourceUnavailableError
from trainmedic.agent.urlsafe import redacting_handler
from trainmedic.backoff import Backoff

log = logging.getLogger("trainmedic.run")


def _unavailable_errors() -> tuple[type[Exception], ...]:
    from trainmedic.agent.watchers.kernel import KernelSourceUnavailable
    from trainmedic.agent.watchers.nvml import SourceUnavailable

    return (SourceUnavailableError, KernelSourceUnavailable, SourceUnavailable)


UNAVAILABLE = _unavailable_errors()


async def supervise(name: str, factory: Callable[[], Awaitable[None]], stop: asyncio.Event) -> None:
    """Run a component until `stop`; restart it with backoff when it fails."""
    backoff = Backoff(1.0, 60.0)
    while not stop.is_set():
        started = time.monotonic()
        try:
            await factory()
            if stop.is_set():
                return
            log.warning("component %s returned; restarting", name)
        except asyncio.CancelledError:
            raise
        except UNAVAILABLE as e:
            log.warning("%s is off: %s", name, e)
            return
        except Exception:
            log.exception("component %s failed; restarting in %.0f s", name, backoff.current)
        if time.monotonic() - started > 60:
            backoff.reset()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), backoff.next())


async def run_agent(agent: Agent, *, drain_timeout_s: float = 20.0) -> None:
    """Run every component until `agent.stop` is set, then shut down gracefully."""
    await agent.bus.start()
    for name, why in agent.disabled.items():
        log.warning("%s is off: %s", name, why)
    tasks = {
        name: asyncio.create_task(supervise(name, factory, agent.stop), name=f"trainmedic:{name}")
        for name, factory in agent.components.items()
        if name not in ("brain", "responder")
    }
    brain_task = (
        asyncio.create_task(supervise("brain", agent.components["brain"], agent.stop), name="trainmedic:brain")
        if "brain" in agent.components
        else None
    )
    responder_task = (
        asyncio.create_task(
            supervise("responder", agent.components["responder"], agent.stop), name="trainmedic:responder"
        )
        if "responder" in agent.components
        else None
    )
    log.info(
        "trainmedic %s running: %s (bus: %s)",
        agent.role.value,
        ", ".join(agent.components) or "nothing",
        agent.bus.name,
    )
    agent.started.set()
    try:
        await agent.stop.wait()
    finally:
        # Sources first (nothing new comes in), then the brain drains and commits, then the bus flushes.
        for t in tasks.values():
            t.cancel()
        await asyncio.gather(*tasks.values(), return_exceptions=True)
        # The brain publishes its open windows as final; the responder finishes what it started.
        for task in (brain_task, responder_task):
            if task is None:
                continue
            try:
                await asyncio.wait_for(task, drain_timeout_s)
            except (TimeoutError, asyncio.CancelledError):
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        if agent.notifier is not None:
            # What the responder queued last goes out now; what cannot stays in the outbox for next time.
            await agent.notifier.flush(drain_timeout_s)
            await agent.notifier.aclose()
            agent.notifier.outbox.close()
        if agent.responder is not None:
            agent.responder.close()
        await agent.bus.stop()
        log.info("trainmedic %s stopped", agent.role.value)


class JsonFormatter(logging.Formatter):
    """One JSON object per log line: time, level, logger, message (+ exception)."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            # exc_text first: the URL filter leaves the traceback there with its URLs made safe.
            out["exception"] = record.exc_text or self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False)


def setup_logging(settings: Settings) -> None:
    """The agent's logging: one stderr handler on the root logger, in `settings.log_format` at
    `settings.log_level`. The handler makes the URLs of every record it writes safe (user info,
    query values, hook paths masked: agent/urlsafe.py), whichever logger the record comes from, so
    a module that logs a URL with credentials (metrics.prometheus_url, a webhook) cannot leak them."""
    handler = redacting_handler(logging.StreamHandler(sys.stderr))
    if settings.log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(settings.log_level)
    # The clients' own chatter stays at WARNING.
    for noisy in ("aiokafka", "kafka", "kubernetes", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
