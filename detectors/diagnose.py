"""`diagnose`: point the engine at logs (files, directories, stdin) and correlate what it finds.

The same core serves the CLI, the API's upload endpoint and scene re-diagnosis: `diagnose_paths`
for plain files (whatever they hold), `diagnose_inputs` for texts whose origin is known (a scene
bundle's container logs with their pod, rank and node, its kernel lines node by node, its events).
"""

from __future__ import annotations

import gzip
import sys
from collections.abc import Iterable, Iterator, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from trainmedic.detectors.correlator import correlate
from trainmedic.detectors.engine import Engine
from trainmedic.detectors.hang_static import silence_findings_in
from trainmedic.detectors.layout import Layout, Place, place_of, read_head
from trainmedic.detectors.loader import load_rules
from trainmedic.errors import InputError
from trainmedic.models import Diagnosis, Finding, Source

MAX_FILES = 10_000
SKIP_DIRS = frozenset({".git", "__pycache__", "node_modules"})


def make_engine(rule_dirs: Sequence[Path] = (), *, fast: bool | None = None, unwrap: bool = True) -> Engine:
    """The engine over the shipped rules plus `rule_dirs`. `unwrap=False` for logs a container runtime
    captured (never hard-wrapped by a terminal), as the brain scans them."""
    return Engine(load_rules(rule_dirs).rules, fast=fast, unwrap=unwrap)


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


def attribute(
    found: list[Finding], name: str, root: str | None, ranks: dict[int, str | None], layout: Layout | None = None
) -> list[Finding]:
    """The findings of one file with the node, rank and device its place in the layout gives
    (`place_of`; a CANN plog's device through its process's device log or `npu-smi info`; a rank
    through the rank table or NCCL INFO lines), where the lines do not say; the rank joins `ranks`
    (rank -> node: the ranks whose logs were read)."""
    node, rank = place_of(name, root)
    if rank is not None:
        ranks[rank] = ranks.get(rank) or node
    if layout is None:
        if node is None and rank is None:
            return found
        return [
            f.model_copy(update={"node": f.node or node, "rank": f.rank if f.rank is not None else rank}) for f in found
        ]
    device = layout.device_of(name, node)
    out = []
    for f in found:
        # A host name the line names (NCCL's prefix) is the node folder it was collected in; a server
        # IP it names is the node the rank table or tool outputs place it on.
        line_node = layout.node_of(f.node) if f.node is not None else None
        # A line that names another place than its file's (HCCL's "Cluster Exception Location" naming
        # the rank the others waited on, an abnormal device on another server) is that place's: the
        # file's node, device and rank are the reporter's, not its.
        # Only a rule's own `node` / `rank` groups name another place: the generic prefixes (NCCL's
        # `host:pid:tid`, torchrun's `[rank3]:`) are the reporter's own.
        foreign = ("node" in f.groups and line_node is not None and node is not None and line_node != node) or (
            "rank" in f.groups and f.rank is not None and rank is not None and f.rank != rank
        )
        if not foreign and "node" in f.groups and line_node is not None and f.device is not None and rank is not None:
            # ... or names a server and a device other than the file's rank's own (when the layout
            # knows it): an abnormal device on this same node.
            own = layout.ranks.get(rank)
            foreign = own is not None and own.node == line_node and own.device not in (None, f.device)
        f_node = line_node or (None if foreign else node)
        f_device = f.device or (None if foreign else device)
        f_rank = f.rank if f.rank is not None else (None if foreign else rank)
        if f_rank is None:
            f_rank = layout.rank_of(f_node, f_device)
        if f_rank is None and f_device is not None and ":" in f_device:
            f_rank = layout.rank_of_bus(f_node, f_device)
        if f_rank is not None and (f_device is None or f_node is None):
            known = layout.ranks.get(f_rank)
            if known is not None and (f_node is None or known.node == f_node):
                f_node = f_node or known.node
                f_device = f_device or known.device
        changed = (f_node, f_device, f_rank) != (f.node, f.device, f.rank)
        out.append(f.model_copy(update={"node": f_node, "device": f_device, "rank": f_rank}) if changed else f)
    return out


def diagnose_paths(paths: Sequence[str], engine: Engine) -> Diagnosis:
    """Classify every input and correlate all findings as one job."""
    findings: list[Finding] = []
    ranks: dict[int, str | None] = {}
    lines = 0
    layouts: list[Layout] = []
    for path in paths:
        root = path if path != "-" and Path(path).is_dir() else None
        names = expand_inputs([path])
        layout = Layout(names, root)
        layouts.append(layout)
        for name, (found, n) in zip(names, scan_inputs(engine, names), strict=True):
            # A log whose own timestamps show its steps stopped long before it ends (hang_static).
            silent = silence_findings_in([name])
            findings.extend(attribute([*found, *silent], name, root, ranks, layout))
            lines += n
    return correlate_placed(findings, lines, ranks, layouts)


def correlate_placed(
    findings: list[Finding], lines: int, ranks: dict[int, str | None], layouts: Sequence[Layout]
) -> Diagnosis:
    """`correlate` with what the collected layouts say about ranks and IPs (the first one wins)."""
    rank_places: dict[int, Place] = {}
    ip_places: dict[str, str] = {}
    for layout in layouts:
        for rank, place in layout.rank_places().items():
            rank_places.setdefault(rank, place)
        for ip, where in layout.ip_places().items():
            ip_places.setdefault(ip, where)
    nodes = known_nodes(ranks)
    for rank, place in rank_places.items():
        if place.node is not None:
            nodes.setdefault(rank, place.node)
    return correlate(
        findings,
        lines_scanned=lines,
        ranks_seen=ranks,
        rank_nodes=nodes,
        rank_devices={r: p.device for r, p in rank_places.items() if p.device is not None},
        ip_places=ip_places,
    )


def known_nodes(ranks: dict[int, str | None]) -> dict[int, str]:
    return {r: n for r, n in ranks.items() if n is not None}


def diagnose_text(text: str | bytes, engine: Engine, *, name: str = "<text>") -> Diagnosis:
    findings = engine.scan_text(text, file=name)
    lines = (text.count("\n") if isinstance(text, str) else text.count(b"\n")) + 1
    return correlate(findings, lines_scanned=lines)


@dataclass(frozen=True, slots=True)
class LogInput:
    """One text to classify, with what is known for certain about where it came from (a scene
    bundle knows each log's pod, rank and node; the lines themselves may say more)."""

    # Reported as the findings' `file`.
    name: str
    # Read from this file (only lines first_line..last_line when last_line is set) ...
    path: str | None = None
    # ... or classify this text.
    text: bytes | None = None
    # Only rules for this source apply (as the brain's per-source engines); None: every rule.
    source: Source | None = None
    node: str | None = None
    pod: str | None = None
    namespace: str | None = None
    rank: int | None = None
    # The number, within `name`, of the text's first line.
    first_line: int = 1
    last_line: int | None = None


# The brain scans pod statuses and core/v1 events with one engine (rules of either source).
_SOURCE_GROUPS: dict[Source, frozenset[Source]] = {
    Source.POD_STATUS: frozenset({Source.POD_STATUS, Source.K8S_EVENT}),
    Source.K8S_EVENT: frozenset({Source.POD_STATUS, Source.K8S_EVENT}),
}


def _section(path: str, first: int, last: int | None, cache: dict[str, list[bytes]]) -> bytes:
    lines = cache.get(path)
    if lines is None:
        try:
            with open(path, "rb") as fh:
                lines = cache[path] = fh.read().split(b"\n")
        except OSError as exc:
            raise InputError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    return b"\n".join(lines[max(first, 1) - 1 : last])


def diagnose_inputs(inputs: Sequence[LogInput], engine: Engine) -> Diagnosis:
    """Classify attributed texts and correlate all findings as one job. Findings take the input's
    node, pod and namespace (what the source knows for certain) and its rank unless the line names
    one (torchrun's `[rank3]:` is more precise than the pod's), as the brain attributes them."""
    sources = {r.id: frozenset(r.source) for r in engine.rules}
    findings: list[Finding] = []
    lines = 0
    cache: dict[str, list[bytes]] = {}
    # What the texts say about the layout (NCCL INFO lines, tool outputs), each with its known node.
    layout = Layout([], None)
    for item in inputs:
        if item.text is not None:
            found = engine.scan_text(item.text, file=item.name)
            lines += item.text.count(b"\n") + 1
            layout.learn(item.node, item.name, item.text)
        elif item.path is not None and (item.first_line > 1 or item.last_line is not None):
            data = _section(item.path, item.first_line, item.last_line, cache)
            found = engine.scan_text(data, file=item.name)
            lines += data.count(b"\n") + 1
            layout.learn(item.node, item.name, data)
        elif item.path is not None:
            found, n = next(scan_inputs(engine, [item.path]))
            lines += n
            layout.learn(item.node, item.name, read_head(item.path))
        else:
            continue
        wanted = _SOURCE_GROUPS.get(item.source, frozenset({item.source})) if item.source else None
        offset = item.first_line - 1
        for f in found:
            if wanted is not None and not (sources.get(f.rule_id, frozenset()) & wanted):
                continue
            update: dict[str, object] = {
                "file": item.name,
                "line_no": (f.line_no or 1) + offset,
                "last_line_no": (f.last_line_no or f.line_no or 1) + offset,
                "node": item.node or f.node,
                "pod": item.pod or f.pod,
                "namespace": item.namespace or f.namespace,
                "rank": f.rank if f.rank is not None else item.rank,
            }
            if item.source is not None:
                update["source"] = item.source
            findings.append(f.model_copy(update=update))
    layout.finish()
    for i, f in enumerate(findings):
        rank = layout.rank_of(f.node, f.device) if f.rank is None else None
        if rank is not None:
            findings[i] = f.model_copy(update={"rank": rank})
    ranks = {item.rank: item.node for item in inputs if item.rank is not None}
    return correlate_placed(findings, lines, ranks, [layout])
