"""A job's resume settings (`resume_spec`: the annotations that say how it resumes from a checkpoint)
and its arguments' template rendered for one checkpoint.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from trainmedic.remediations.workloads.kinds import (
    _ENV_NAME,
    _PLACEHOLDER,
    ANN_CHECKPOINT_DIR,
    ANN_REMEDIATE,
    ANN_RESUME_ARGS,
    ANN_RESUME_CONTAINER,
    ANN_RESUME_ENV,
    DEFAULT_RESUME_ENV,
    MAX_TEMPLATE_CHARS,
    RESUME_STEP_ENV,
    InvalidResumeTemplate,
    _annotations,
)

# -- reading the workload's declarations -----------------------------------------------------------


class CheckpointRef(Protocol):
    """What a restart needs of a checkpoint (remediations.checkpoints.Checkpoint has it)."""

    @property
    def path(self) -> str: ...

    @property
    def step(self) -> int | None: ...


@dataclass(frozen=True)
class ResumeSpec:
    """What a workload declares about resuming (its `trainmedic.io/*` annotations).

    Reading never fails: an annotation that cannot be used is listed in `problems` (and a value of
    `trainmedic.io/remediate` that is neither true nor false counts as an opt-out: first, do no
    harm); `recreate_body` refuses what cannot be applied.
    """

    checkpoint_dir: str | None
    env: str = DEFAULT_RESUME_ENV
    args: str | None = None
    container: str | None = None
    opt_out: bool = False
    problems: tuple[str, ...] = ()

    @property
    def containers(self) -> tuple[str, ...] | None:
        """The container names `trainmedic.io/resume-container` selects (a comma list), or None: all."""
        if self.container is None:
            return None
        names = tuple(n.strip() for n in self.container.split(",") if n.strip())
        return names or None


_TRUE = {"true", "yes", "on", "1", "enabled"}
_FALSE = {"false", "no", "off", "0", "disabled"}


def resume_spec(obj: Mapping[str, Any]) -> ResumeSpec:
    """The resume declarations of a workload (see ResumeSpec); never raises on annotation content."""
    ann = _annotations(obj)
    problems: list[str] = []

    def text(key: str) -> str | None:
        value = ann.get(key)
        if value is None:
            return None
        value = value.strip()
        return value or None

    env = text(ANN_RESUME_ENV) or DEFAULT_RESUME_ENV
    env_problem = _env_problem(env)
    if env_problem is not None:
        problems.append(env_problem)
    args = text(ANN_RESUME_ARGS)
    if args is not None:
        problems.extend(_template_problems(args))
    opt_out = False
    remediate = text(ANN_REMEDIATE)
    if remediate is not None:
        low = remediate.lower()
        if low in _FALSE:
            opt_out = True
        elif low not in _TRUE:
            opt_out = True
            problems.append(f'{ANN_REMEDIATE}: {remediate!r} is neither "true" nor "false"; taken as an opt-out')
    return ResumeSpec(
        checkpoint_dir=text(ANN_CHECKPOINT_DIR),
        env=env,
        args=args,
        container=text(ANN_RESUME_CONTAINER),
        opt_out=opt_out,
        problems=tuple(problems),
    )


def _env_problem(env: str) -> str | None:
    if not _ENV_NAME.match(env):
        return f"{ANN_RESUME_ENV}: {env!r} is not a valid environment variable name"
    if env == RESUME_STEP_ENV:
        return f"{ANN_RESUME_ENV}: {env!r} is where trainmedic puts the step; choose another name"
    return None


def _template_problems(template: str) -> list[str]:
    if len(template) > MAX_TEMPLATE_CHARS:
        return [f"{ANN_RESUME_ARGS}: longer than {MAX_TEMPLATE_CHARS} characters"]
    rest = _PLACEHOLDER.sub("", template)
    stray = re.search(r"\{[^{}]*\}?|\}", rest)
    if stray is not None:
        return [
            f"{ANN_RESUME_ARGS}: {stray.group(0)!r} is not allowed; the only placeholders are "
            "{checkpoint} and {step}, and braces cannot appear otherwise"
        ]
    try:
        shlex.split(template)
    except ValueError as exc:
        return [f"{ANN_RESUME_ARGS}: cannot be split into arguments ({exc})"]
    return []


def render_resume_args(template: str, checkpoint: str, step: int | None) -> list[str]:
    """The args a resume template stands for.

    The template is split shell-style first and the placeholders filled per argument, so a path with
    spaces stays one argument. Only `{checkpoint}` and `{step}` are allowed; any other brace is an
    InvalidResumeTemplate (a typo such as `{ckpt}` must not reach the trainer as a literal).
    """
    problems = _template_problems(template)
    if problems:
        raise InvalidResumeTemplate(
            problems[0], f"{ANN_RESUME_ARGS} 模板无效：只允许 {{checkpoint}} 与 {{step}} 占位符（{problems[0]}）"
        )
    if step is None and "{step}" in template:
        msg = f"{ANN_RESUME_ARGS} uses {{step}} but the checkpoint {checkpoint} has no known step"
        raise InvalidResumeTemplate(msg, f"{ANN_RESUME_ARGS} 使用了 {{step}}，但检查点 {checkpoint} 的步数未知")
    values = {"checkpoint": checkpoint, "step": "" if step is None else str(step)}
    return [_PLACEHOLDER.sub(lambda m: values[m.group(1)], token) for token in shlex.split(template)]
