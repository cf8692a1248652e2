"""`trainmedic run`: the daemon, one role or all of them in one process.

    node     (DaemonSet)  container logs, kernel messages, NVML device metrics -> bus
    cluster  (Deployment) pods, events, nodes, workloads; Prometheus device metrics -> bus
    brain    (Deployment, scaled out as a consumer group) bus -> detectors -> findings, diagnoses
    all      everything above in one process; the memory bus is the embedded default

Every component runs under a supervisor: a failure is logged with its traceback and the component
is restarted with exponential backoff (a watcher that loses the API server comes back; the rest of
the agent keeps going). A source that cannot work here (no /var/log/pods, no /dev/kmsg, no NVML
driver, no Prometheus configured) logs one line saying why and stays off.

SIGTERM / SIGINT stop gracefully: sources stop, the brain publishes its open windows as final and
commits, and the producer flushes what it buffered (bounded).

The parts: `agent` (`Agent`, the components of one process, with the bus and the Kubernetes client
they share), `build` (`build_agent`: the components a role runs), `supervise` (each component under
its supervisor, the agent run until it is stopped, the log format). `main` runs a role; this package
re-exports what the rest of trainmedic and its tests import.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys

from trainmedic.agent.config import Role, Settings
from trainmedic.agent.run.agent import Agent, SourceUnavailableError, make_bus
from trainmedic.agent.run.agent import _kube_api_client as _kube_api_client
from trainmedic.agent.run.build import build_agent, responder_settings
from trainmedic.agent.run.supervise import run_agent, setup_logging

log = logging.getLogger("trainmedic.run")


def main(settings: Settings, role: Role) -> int:
    """Blocking entry point of `trainmedic run`. A data file the role loads that cannot be used
    (agent/configcheck.py) refuses the start, as `run --check` does, with the same lines: exit 2."""
    from trainmedic.agent.configcheck import data_file_problems, refusal_lines

    refused = data_file_problems(settings, role)
    if refused:
        for line in refusal_lines(refused):
            print(line, file=sys.stderr)
        return 2
    setup_logging(settings)

    async def _main() -> None:
        agent = build_agent(settings, role)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, agent.stop.set)
        await run_agent(agent)

    asyncio.run(_main())
    return 0


__all__ = [
    "Agent",
    "SourceUnavailableError",
    "build_agent",
    "make_bus",
    "responder_settings",
    "run_agent",
]
