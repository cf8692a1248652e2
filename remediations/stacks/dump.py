"""The stack dump of a pod's Python processes (`dump_stacks`): the processes listed, py-spy or
faulthandler's SIGUSR1 tried per container within a budget, the methods' settings and results.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

from trainmedic.models import I18nText
from trainmedic.remediations.stacks.podexec import SIGUSR1_MASK, ExecResult

# Lists the container's Python processes, one per line: "<pid>\t<SigCgt hex>\t<command line>".
# POSIX sh with builtins only (plus `tr` when the image has it, for readable command lines), so it
# runs in busybox and slim images alike. The pattern is written *[p]ython* so the shell running this
# script (whose own command line holds the script) never lists itself.
PROCESS_LIST_SCRIPT = (
    "T=$(command -v tr 2>/dev/null); n=0; "
    "for d in /proc/[0-9]*; do "
    '[ -r "$d/cmdline" ] || continue; '
    'if [ -n "$T" ]; then c=$("$T" \'\\000\\n\\t\' \'   \' 2>/dev/null < "$d/cmdline"); '
    'else IFS= read -r c 2>/dev/null < "$d/cmdline"; fi; '
    'case "$c" in *[p]ython*) ;; *) continue ;; esac; '
    "s=-; "
    'while read -r k v; do if [ "$k" = SigCgt: ]; then s=$v; break; fi; done 2>/dev/null < "$d/status"; '
    'printf \'%s\\t%s\\t%s\\n\' "${d#/proc/}" "$s" "$c"; '
    "n=$((n + 1)); [ $n -ge 256 ] && break; "
    "done; true"
)


# ------------------------------------------------------------------------------------------------
# stacks


class StackSource(Protocol):
    """What a stack dump needs: exec in a container, and the container's log (for SIGUSR1 dumps)."""

    async def exec(
        self, namespace: str, pod: str, container: str, command: list[str], *, timeout_s: float
    ) -> ExecResult: ...

    async def pod_log(
        self,
        namespace: str,
        pod: str,
        container: str,
        *,
        tail_lines: int,
        previous: bool = False,
        limit_bytes: int = ...,
    ) -> str: ...


class StackMethod(StrEnum):
    PY_SPY = "py-spy"
    SIGUSR1 = "sigusr1"


@dataclass(frozen=True, kw_only=True)
class StackSettings:
    """How hard a stack dump tries."""

    # Python processes dumped per container at most (torchrun: the launcher plus one per device).
    max_pids: int = 16
    # Wait after SIGUSR1 before reading the log back, and how many times to look again.
    settle_s: float = 1.0
    log_polls: int = 3
    # Log lines read back around a SIGUSR1 dump (before and after the signal).
    log_tail_lines: int = 5000
    log_limit_bytes: int = 4 << 20
    # Containers tried per pod (sidecars first-listed are skipped once a dump is taken).
    max_containers: int = 4
    # Pods dumped at the same time.
    concurrency: int = 16
    # Characters of stack text kept per pod.
    max_text: int = 1 << 20


@dataclass
class StackDump:
    """One pod's stacks, or why there are none. `attempts` lists what was tried, in order."""

    namespace: str
    pod: str
    container: str | None = None
    method: StackMethod | None = None
    text: str = ""
    pids: list[int] = field(default_factory=list)
    attempts: list[str] = field(default_factory=list)
    reason: I18nText | None = None

    def as_dict(self) -> dict[str, object]:
        return {
            "namespace": self.namespace,
            "pod": self.pod,
            "container": self.container,
            "method": self.method.value if self.method else None,
            "pids": self.pids,
            "attempts": self.attempts,
            "reason": self.reason.model_dump() if self.reason else None,
        }


@dataclass(frozen=True, slots=True)
class PythonProcess:
    pid: int
    cmdline: str
    # None: the listing could not read /proc/<pid>/status.
    handles_sigusr1: bool | None


def parse_process_list(text: str) -> list[PythonProcess]:
    """The output of PROCESS_LIST_SCRIPT; malformed lines are skipped."""
    out: list[PythonProcess] = []
    for line in text.splitlines():
        parts = line.split("\t", 2)
        if len(parts) < 2 or not parts[0].isdigit():
            continue
        try:
            mask: int | None = int(parts[1], 16)
        except ValueError:
            mask = None
        out.append(
            PythonProcess(
                pid=int(parts[0]),
                cmdline=parts[2].strip() if len(parts) > 2 else "",
                handles_sigusr1=None if mask is None else bool(mask & SIGUSR1_MASK),
            )
        )
    return sorted(out, key=lambda p: p.pid)


_RUNNER_PREFIX = r"(?:\[[A-Za-z]+\d+\]:)?"
_FH_HEADER = re.compile(
    _RUNNER_PREFIX
    + r"(?:(?:Current thread|Thread) 0x[0-9a-fA-F]+(?: \[[^\]\n]*\])?|Stack|Current thread's C stack trace)"
    + r" \(most recent call first\):\s*$"
)
_FH_FRAME = re.compile(_RUNNER_PREFIX + r"  \S")


def faulthandler_blocks(text: str) -> str:
    """The faulthandler stack blocks found in log text (headers and their frame lines), joined."""
    blocks: list[str] = []
    current: list[str] = []
    for line in text.splitlines():
        if _FH_HEADER.match(line):
            if current:
                blocks.append("\n".join(current))
            current = [line]
        elif current and _FH_FRAME.match(line):
            current.append(line)
        elif current:
            blocks.append("\n".join(current))
            current = []
    if current:
        blocks.append("\n".join(current))
    return "\n\n".join(b for b in blocks if "\n" in b)


def _new_lines(before: list[str], after: list[str]) -> list[str]:
    """The lines of `after` that were appended after `before` was read (a log only grows).

    When the whole log fit in `before`, `after` starts with it. Otherwise both are tails: the new
    lines are what follows the longest prefix of `after` that ends `before` (a log made only of one
    block repeated is ambiguous; the longest overlap reads the fewest lines as new)."""
    if after[: len(before)] == before:
        return after[len(before) :]
    for overlap in range(min(len(before), len(after)), 0, -1):
        if after[:overlap] == before[-overlap:]:
            return after[overlap:]
    return after


def _not_found(r: ExecResult, program: str) -> bool:
    """The program is not in the image (the shell says 127, the runtime says not found)."""
    text = f"{r.stderr}\n{r.error or ''}".lower()
    return r.exit_code in (126, 127) or (
        r.exit_code is None and ("not found" in text or "no such file" in text) and program in text
    )


def _forbidden(r: ExecResult) -> bool:
    return r.status is not None and r.status >= 400


def _reason(en: str, zh: str) -> I18nText:
    return I18nText(en=en, zh=zh)


def _containers(pod: Mapping[str, Any], limit: int) -> list[str]:
    spec = pod.get("spec")
    containers = spec.get("containers") if isinstance(spec, Mapping) else None
    names = [
        str(c["name"])
        for c in (containers if isinstance(containers, list) else [])
        if isinstance(c, Mapping) and c.get("name")
    ]
    status = pod.get("status")
    statuses = status.get("containerStatuses") if isinstance(status, Mapping) else None
    running = {
        str(s.get("name"))
        for s in (statuses if isinstance(statuses, list) else [])
        if isinstance(s, Mapping) and isinstance(s.get("state"), Mapping) and "running" in s["state"]
    }
    if statuses:
        names = [n for n in names if n in running]
    return names[:limit]


class _Budget:
    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.deadline = time.monotonic() + timeout_s

    def left(self) -> float:
        return self.deadline - time.monotonic()


async def _dump_container(
    source: StackSource,
    dump: StackDump,
    container: str,
    budget: _Budget,
    settings: StackSettings,
) -> bool:
    """Try the methods in one container; True when a dump was taken or trying more is pointless."""
    ns, pod = dump.namespace, dump.pod

    async def run(command: list[str]) -> ExecResult | None:
        left = budget.left()
        if left <= 0.05:
            dump.attempts.append(f"{container}: time is up ({budget.timeout_s:g} s)")
            return None
        try:
            return await source.exec(ns, pod, container, command, timeout_s=left)
        except Exception as exc:  # noqa: BLE001 - a source without exec, or a client bug: recorded, not raised
            return ExecResult(error=f"{type(exc).__name__}: {exc}")

    def note(label: str, r: ExecResult) -> None:
        outcome = f"exit {r.exit_code}" if r.exit_code is not None else (r.error or "no result")
        detail = (r.stderr.strip().splitlines() or [""])[-1][:200] if r.exit_code not in (0, None) else ""
        dump.attempts.append(f"{container}: {label}: {outcome}" + (f" ({detail})" if detail else ""))

    # 1. py-spy on pid 1.
    r = await run(["py-spy", "dump", "--pid", "1"])
    if r is None:
        return True
    note("py-spy dump --pid 1", r)
    if _forbidden(r):
        dump.reason = _reason(
            f"exec into the pod is not allowed: {r.error}",
            f"不允许在 Pod 中执行命令（exec）：{r.error}",
        )
        return True
    if r.ok and r.stdout.strip():
        dump.method, dump.container, dump.pids = StackMethod.PY_SPY, container, [1]
        dump.text = r.stdout
        return True
    has_py_spy = not _not_found(r, "py-spy")

    # 2. The container's Python processes.
    r = await run(["sh", "-c", PROCESS_LIST_SCRIPT])
    if r is None:
        return True
    note("list python processes", r)
    if not r.ok:
        if _not_found(r, "sh"):
            dump.reason = (
                _reason(
                    "the container has no shell to find its Python processes, and py-spy found no Python at pid 1",
                    "容器内没有 shell，无法查找 Python 进程；py-spy 在 1 号进程上也未找到 Python",
                )
                if has_py_spy
                else _reason(
                    "the container has neither py-spy nor a shell",
                    "容器内既没有 py-spy 也没有 shell",
                )
            )
        else:
            dump.reason = _reason(
                f"listing the container's processes failed: {r.error or r.stderr.strip()[:200]}",
                f"列出容器内进程失败：{r.error or r.stderr.strip()[:200]}",
            )
        return False
    procs = parse_process_list(r.stdout)[: settings.max_pids]
    if not procs:
        dump.reason = _reason("no Python process runs in the container", "容器内没有运行中的 Python 进程")
        return False

    # 3. py-spy on each Python process.
    if has_py_spy:
        texts: list[str] = []
        for p in procs:
            if p.pid == 1:
                continue  # tried first
            r = await run(["py-spy", "dump", "--pid", str(p.pid)])
            if r is None:
                break
            note(f"py-spy dump --pid {p.pid}", r)
            if r.ok and r.stdout.strip():
                texts.append(f"# pid {p.pid}: {p.cmdline}\n{r.stdout.rstrip()}")
                dump.pids.append(p.pid)
        if texts:
            dump.method, dump.container = StackMethod.PY_SPY, container
            dump.text = "\n\n".join(texts)
            return True

    # 4. SIGUSR1 to the processes that handle it (faulthandler.register), read back from the log.
    handled = [p for p in procs if p.handles_sigusr1]
    if not handled:
        dump.reason = _reason(
            ("py-spy could not dump the Python processes and " if has_py_spy else "py-spy is not installed and ")
            + "none of them handles SIGUSR1 (faulthandler.register(signal.SIGUSR1) was not called), "
            "so no signal was sent: it would have killed them",
            ("py-spy 无法获取 Python 进程的调用栈，且" if has_py_spy else "容器内未安装 py-spy，且")
            + "没有进程处理 SIGUSR1（未调用 faulthandler.register(signal.SIGUSR1)），"
            "因此没有发送信号：发送会终止这些进程",
        )
        return False
    try:
        before = (
            await source.pod_log(
                ns, pod, container, tail_lines=settings.log_tail_lines, limit_bytes=settings.log_limit_bytes
            )
        ).splitlines()
    except Exception as exc:  # noqa: BLE001 - recorded, the dump is taken anyway
        dump.attempts.append(f"{container}: log before SIGUSR1: {type(exc).__name__}: {exc}")
        before = []
    pids = " ".join(str(p.pid) for p in handled)
    r = await run(["sh", "-c", f"kill -USR1 {pids}"])
    if r is None:
        return True
    note(f"kill -USR1 {pids}", r)
    if not r.ok:
        dump.reason = _reason(
            f"sending SIGUSR1 failed: {r.error or r.stderr.strip()[:200]}",
            f"发送 SIGUSR1 失败：{r.error or r.stderr.strip()[:200]}",
        )
        return False
    for _ in range(max(1, settings.log_polls)):
        if budget.left() <= 0:
            break
        await asyncio.sleep(min(settings.settle_s, max(budget.left(), 0.0)))
        try:
            after = await source.pod_log(
                ns, pod, container, tail_lines=settings.log_tail_lines, limit_bytes=settings.log_limit_bytes
            )
        except Exception as exc:  # noqa: BLE001
            dump.attempts.append(f"{container}: log after SIGUSR1: {type(exc).__name__}: {exc}")
            continue
        text = faulthandler_blocks("\n".join(_new_lines(before, after.splitlines())))
        if text:
            dump.method, dump.container = StackMethod.SIGUSR1, container
            dump.pids = [p.pid for p in handled]
            dump.text = text
            return True
    dump.reason = _reason(
        "SIGUSR1 was sent but no stack appeared in the container's log",
        "已发送 SIGUSR1，但容器日志中未出现调用栈",
    )
    return False


async def _dump_pod(
    source: StackSource,
    pod: Mapping[str, Any],
    timeout_s: float,
    settings: StackSettings,
) -> StackDump:
    meta = pod.get("metadata")
    meta = meta if isinstance(meta, Mapping) else {}
    dump = StackDump(namespace=str(meta.get("namespace") or "default"), pod=str(meta.get("name") or "?"))
    containers = _containers(pod, settings.max_containers)
    if not containers:
        dump.reason = _reason("no running container in the pod", "Pod 中没有运行中的容器")
        return dump
    budget = _Budget(timeout_s)
    for container in containers:
        try:
            done = await _dump_container(source, dump, container, budget, settings)
        except Exception as exc:  # noqa: BLE001 - never fail the scene for a stack dump
            dump.attempts.append(f"{container}: {type(exc).__name__}: {exc}")
            dump.reason = _reason(f"the stack dump failed: {exc}", f"获取调用栈失败：{exc}")
            done = False
        if done or dump.method is not None:
            break
    if dump.method is not None:
        dump.reason = None
        if len(dump.text) > settings.max_text:
            dump.text = dump.text[: settings.max_text] + "\n[... cut]"
    elif dump.reason is None:
        dump.reason = _reason("no stack could be taken", "未能获取调用栈")
    return dump


async def dump_stacks(
    source: StackSource,
    pods: Sequence[Mapping[str, Any]],
    *,
    timeout_s: float,
    settings: StackSettings | None = None,
) -> dict[str, StackDump]:
    """The stacks of every pod's Python processes, keyed by pod name; `timeout_s` bounds each pod
    (pods are dumped side by side, `settings.concurrency` at a time). Never raises."""
    settings = settings or StackSettings()
    gate = asyncio.Semaphore(max(1, settings.concurrency))

    async def one(pod: Mapping[str, Any]) -> StackDump:
        async with gate:
            return await _dump_pod(source, pod, timeout_s, settings)

    dumps = await asyncio.gather(*(one(p) for p in pods if isinstance(p, Mapping)))
    return {d.pod: d for d in dumps}
