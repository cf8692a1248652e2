"""The responder's settings (`ResponderSettings`, the `remediate` settings group) and the names its
parts share: the file-safe form of an incident id (replacement bodies are named by it), the actions
that restart a job (a restart already under way holds a job's pods and its other restarts), and the
shape of the metrics reader the scene collector calls. Only data lives here; the behaviour is in
the modules beside it.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from trainmedic.remediations.policy import ActionName, Mode

_UNSAFE_NAME = re.compile(r"[^A-Za-z0-9._-]")
_RESTARTS = frozenset({ActionName.RESTART_FROM_CHECKPOINT, ActionName.RAISE_MEMORY_LIMIT})

MetricsRange = Callable[[str, float, float, float], Awaitable[Mapping[str, list[tuple[float, float]]]]]


@dataclass
class ResponderSettings:
    """How the responder acts on diagnoses (the `remediate` settings group)."""

    group: str = "trainmedic-responder"
    scene_dir: Path = Path("/var/lib/trainmedic/scenes")
    # Overrides the policy file's mode when set (observe | dry-run | approve | enforce).
    mode: Mode | None = None
    log_lines: int = 10_000
    stacks: bool = True
    stack_timeout_s: float = 20.0
    metrics_window_s: float = 900.0
    metrics_after_s: float = 60.0
    metrics_step_s: float = 15.0
    # Checkpoint paths as the job declares them -> as this agent sees them (shared volume mounts).
    checkpoint_path_map: dict[str, str] = field(default_factory=dict)
    # How checkpoints are listed: "off" only here; "pod" by a reader pod (remediations/
    # checkpoint_reader.py, trainmedic's image `checkpoint_reader_image`); "auto" a reader pod when
    # the directory is not visible here. No image: never a reader pod.
    checkpoint_reader: str = "auto"
    checkpoint_reader_image: str | None = None
    checkpoint_reader_timeout_s: float = 120.0
    wait_gone_s: float = 120.0
    # Where the full replacement body of a restart waits between the delete and the create (env
    # values included): the agent's own state directory, mode 0600, never the incident store (served
    # by the API, published to the sinks), which keeps the redacted body and a reference to this
    # file. None: `restart-bodies` beside `scene_dir`.
    body_dir: Path | None = None
    # A workload still terminating this long after its delete (a foreign finalizer, a long grace
    # period) is escalated to a person; the responder keeps waiting and creates the replacement
    # once it is gone (the journal keeps the body).
    gone_deadline_s: float = 3600.0
    approval_poll_s: float = 2.0
    # Between writing a node's circuit-breaker claim and reading the pool's claims back: longer than
    # a write takes to land and than the brains' clocks differ (remediations/actions/quarantine_node.py).
    breaker_settle_s: float = 2.0
    # A node-level fault as a Node condition and an Event on the Node (node-problem-detector style):
    # None when the mode acts (approve, enforce); True in every mode; False never.
    node_conditions: bool | None = None
    # An action that failed temporarily is tried again after this long.
    retry_after_s: float = 10.0
    # An action failing temporarily this long after its first retry (an API answering 5xx or 409 for
    # good, a restart waiting on another incident's replacement) is escalated to a person: the
    # incident is blocked and pages, and the action goes on being tried. An action with a deadline
    # of its own (a deleted workload still terminating: `gone_deadline_s`) keeps that one.
    retry_deadline_s: float = 1800.0
    # The longest wait between two tries of an action whose tries back off (a restart past its
    # delete whose replacement the cluster refuses: the delay doubles from `retry_after_s`).
    retry_max_s: float = 600.0
    poll_ms: int = 100
    max_records: int = 100
    # Write report.{en,zh}.{md,html} into the scene directory when an incident settles.
    reports: bool = True
    # Incidents of different jobs handled at once (each job's stay serial); the API client's
    # connection pool is sized to it.
    max_concurrent: int = 16
    # Diagnoses waiting for a turn. Past it, the oldest waiting one is handled observe-only (its
    # incident says why), and past twice as many the responder stops reading until it catches up
    # (the bus holds the rest, bounded): never an unbounded queue.
    max_pending: int = 200
    # Incident ids and final statuses remembered in `handled` (tests, the demo).
    handled_max: int = 10_000
