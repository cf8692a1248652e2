"""`diagnose`: point the engine at logs (files, directories, stdin) and correlate what it finds.

The same core serves the CLI, the API's upload endpoint and scene re-diagnosis.
"""

from __future__ import annotations

import gzip
import sys
from collections.abc import Iterable, Iterator, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import BinaryIO

from detectors.correlator import correlate
from detectors.engine import Engine
from detectors.loader import load_rules
from trainmedic.errors import InputError
from trainmedic.models import Diagnosis, Finding

MAX_FILES = 10_000
SKIP_DIRS = frozenset({".git", "__pycache__", "node_modules"})


def make_engine(rule_dirs: Sequence[Path] = (), *, fast: bool | None = None) -> Engine:
    return Engine(load_rules(rule_dirs).rules, fast=fast)


def expand_inputs(paths: Sequence[str]) -> list[str]:
    """Files to read, in a stable order: each PATH is a file, a directory (recursive) or `-`."""
    if not paths:
        raise InputError("no input given (use --logs PATH, a directory, or - for stdin)")
    out: list[str] = []
    for p in paths:
        if p == "-":
            out.append(p)
            continue
        path = Path(p)
        if path.is_dir():
            found = sorted(
                f
                for f in path.rglob("*")
                if f.is_file()
                and not any(part in SKIP_DIRS or part.startswith(".") for part in f.relative_to(path).parts)
            )
            if not found:
                raise InputError(f"{p}: directory holds no files")
            out.extend(str(f) for f in found)
        elif path.is_file():
            out.append(str(path))
        elif path.exists():
            raise InputError(f"{p}: not a regular file or directory")
        else:
            raise InputError(f"{p}: no such file or directory")
        if len(out) > MAX_FILES:
            raise InputError(f"more than {MAX_FILES} files given; point at a narrower directory")
    return out


def _open(name: str, stack: ExitStack) -> BinaryIO:
    if name == "-":
        return sys.stdin.buffer
    try:
        fh: BinaryIO = stack.enter_context(open(name, "rb"))  # noqa: SIM115
        if fh.read(2) == b"\x1f\x8b":
            fh.seek(0)
            return stack.enter_context(gzip.open(fh, "rb"))  # type: ignore[return-value]
        fh.seek(0)
        return fh
    except OSError as exc:
        raise InputError(f"{name}: cannot read: {exc.strerror or exc}") from exc


def scan_inputs(engine: Engine, names: Iterable[str]) -> Iterator[tuple[list[Finding], int]]:
    for name in names:
        with ExitStack() as stack:
            stream = _open(name, stack)
            try:
                yield engine.scan_stream(stream, file="<stdin>" if name == "-" else name)
            except (OSError, EOFError, gzip.BadGzipFile) as exc:
                raise InputError(f"{name}: cannot read: {exc}") from exc


def diagnose_paths(paths: Sequence[str], engine: Engine) -> Diagnosis:
    """Classify every input and correlate all findings as one job."""
    names = expand_inputs(paths)
    findings: list[Finding] = []
    lines = 0
    for found, n in scan_inputs(engine, names):
        findings.extend(found)
        lines += n
    return correlate(findings, lines_scanned=lines)


def diagnose_text(text: str | bytes, engine: Engine, *, name: str = "<text>") -> Diagnosis:
    findings = engine.scan_text(text, file=name)
    lines = (text.count("\n") if isinstance(text, str) else text.count(b"\n")) + 1
    return correlate(findings, lines_scanned=lines)
