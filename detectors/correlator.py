"""Correlation: many findings from many ranks and nodes of one job become one root cause.

The reasoning, in order:

1. Enrich: each finding's (chip, code) is looked up in the vendor catalog (udal), which gives the
   vendor's own action bucket, the normalized action, the origin (hardware / application / ...) and
   whether the code is by nature a consequence of an earlier error (Xid 45). The fault class stays
   the rule's.
2. Explain consequences: a consequence code (Xid 45 "preemptive cleanup, due to previous errors")
   is explained by any other device error of the same job, or by the Xid named in its own
   "caused by previous Xid N" trailer; collective timeouts and communication errors are explained by
   any stronger cause (a rank that died of a device error or OOM leaves its peers waiting).
3. Rank: hardware device errors > lost nodes > host OOM kills > accelerator OOM > storage faults >
   application-caused device errors (Xid 13/31/43, illegal address) > communication init > the
   program's own exceptions and crashes > ranks killed from outside > communication errors > hangs >
   "the workload failed and nothing says why".
   Within one weight, the earliest finding wins (the first observed failure).
4. Localise: node / device / rank of the winning finding, plus every rank and node where the same
   code was seen.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from trainmedic.detectors import waitgraph
from trainmedic.models import (
    SEVERITY_RANK,
    Action,
    Diagnosis,
    FaultClass,
    Finding,
    I18nText,
    Place,
    RootCause,
)
from trainmedic.vendortext import fill

CLASS_WEIGHT: dict[FaultClass, int] = {
    FaultClass.DEVICE_ERROR: 90,
    # A lost node takes its ranks with it; a device error on it is the more precise cause.
    FaultClass.NODE_FAILURE: 85,
    FaultClass.HOST_OOM: 80,
    FaultClass.ACCELERATOR_OOM: 75,
    # A full or broken disk surfaces as an OSError traceback: the storage fault is the cause.
    FaultClass.STORAGE_ERROR: 72,
    FaultClass.COMM_INIT: 60,
    # The program's own exception outranks what its peers then see (closed connections, timeouts,
    # the launcher's SIGTERM to the survivors).
    FaultClass.APP_ERROR: 58,
    FaultClass.PROCESS_KILLED: 50,
    FaultClass.COMM_ERROR: 40,
    FaultClass.HANG: 20,
    # The workload failed and no line explains it: a cause only when there is nothing else.
    FaultClass.UNKNOWN: 2,
}
APPLICATION_DEVICE_ERROR_WEIGHT = 70
IGNORABLE_WEIGHT = 8
# Below every class, `unknown` included: a consequence's cause, when in view, is the better root.
CONSEQUENCE_WEIGHT = 1
# Symptoms that a stronger cause elsewhere in the job explains.
SYMPTOM_CLASSES = frozenset({FaultClass.HANG, FaultClass.COMM_ERROR, FaultClass.PROCESS_KILLED, FaultClass.UNKNOWN})


if TYPE_CHECKING:
    from trainmedic import udal


def enrich(finding: Finding) -> tuple[Finding, udal.CatalogEntry | None]:
    """The finding with the vendor's action and class applied from the chip catalog."""
    from trainmedic import udal  # deferred: `diagnose` of logs without findings never loads the catalogs

    entry = udal.lookup(finding.chip, finding.code)
    if entry is None:
        return finding, None
    # The rule's fault class stands: it sees the context (an HCCL return code raised by
    # HcclCommInitRootInfo is an init failure, the same code from an all-reduce is not).
    update: dict[str, object] = {"vendor_action": entry.vendor_action, "action": entry.action}
    return finding.model_copy(update=update), entry


def weight(finding: Finding, entry: udal.CatalogEntry | None) -> int:
    if finding.consequence_of is not None:
        return CONSEQUENCE_WEIGHT
    if finding.priority is not None:
        base = finding.priority
    else:
        base = CLASS_WEIGHT[finding.fault_class]
        if finding.fault_class is FaultClass.DEVICE_ERROR and entry is not None and entry.origin == "application":
            base = APPLICATION_DEVICE_ERROR_WEIGHT
    if finding.action is Action.IGNORE:
        base = min(base, IGNORABLE_WEIGHT)
    return base * 4 + SEVERITY_RANK[finding.severity]


def correlate(
    findings: Sequence[Finding],
    *,
    lines_scanned: int = 0,
    ranks_seen: Iterable[int] = (),
    rank_nodes: Mapping[int, str] | None = None,
    rank_devices: Mapping[int, str] | None = None,
    ip_places: Mapping[str, str] | None = None,
) -> Diagnosis:
    """Reduce the findings of one job (or one `diagnose` run) to a diagnosis. `ranks_seen`: every
    rank whose log was read (a scene bundle, a directory of per-rank logs), so that a hang can name
    the rank that is missing from the timeouts; `rank_nodes`: the node each rank's log came from;
    `rank_devices`: the device each rank ran on and `ip_places`: what an IP is ("rank 3" or a
    node), where the collected layout says them (detectors/layout.py)."""
    enriched = [enrich(f) for f in findings]
    _explain_consequences(enriched)
    _explain_teardown([f for f, _ in enriched])
    _explain_launcher_teardown([f for f, _ in enriched])
    weights = [weight(f, e) for f, e in enriched]
    if not enriched:
        return Diagnosis(root_cause=None, findings=[], distinct_findings=0, lines_scanned=lines_scanned)
    best = _best(enriched, weights)
    root_finding, root_entry = enriched[best]
    root = _root_cause(root_finding, root_entry, [f for f, _ in enriched])
    _localise_origin(root, [f for f, _ in enriched])
    places = Places(dict(rank_nodes or {}), dict(rank_devices or {}), dict(ip_places or {}))
    reported = (root.node, root.device, root.rank)
    if root.fault_class is FaultClass.HANG:
        _localise_stalled(root, [f for f, _ in enriched], set(ranks_seen), places)
    if root.fault_class in COMM_CLASSES:
        _follow_waits(root, [f for f, _ in enriched], places)
    if (root.node, root.device, root.rank) != reported:
        _replace_where(root, reported)
    for i, (f, _) in enumerate(enriched):
        if i != best and f.consequence_of is None and f.fault_class in SYMPTOM_CLASSES and weights[i] < weights[best]:
            f.consequence_of = root.code
    ordered = [enriched[i][0] for i in sorted(range(len(enriched)), key=lambda i: (-weights[i], i))]
    return Diagnosis(root_cause=root, findings=ordered, distinct_findings=len(ordered), lines_scanned=lines_scanned)


# Exit codes (torch elastic's -<signal>, or the process's own) each cause leaves on the rank it hit.
EXIT_CODES: dict[str, frozenset[str]] = {
    "sigkill": frozenset({"-9", "137"}),
    "oom_killer": frozenset({"-9", "137"}),
    "memcg_oom": frozenset({"-9", "137"}),
    "oom_killed": frozenset({"-9", "137"}),
    "sigterm": frozenset({"-15", "143"}),
    "sigsegv": frozenset({"-11", "139"}),
    "sigabrt": frozenset({"-6", "134"}),
    "sigbus": frozenset({"-7", "135"}),
    "sigfpe": frozenset({"-8", "136"}),
    "sigill": frozenset({"-4", "132"}),
    "python_exception": frozenset({"1"}),
    "collective_mismatch": frozenset({"1"}),
}
# Rules whose findings name the rank that failed first (torch elastic's failure summary).
ORIGIN_RULES = frozenset({"generic.elastic_failure", "generic.elastic_failure_exit1"})


def _best(enriched: list[tuple[Finding, udal.CatalogEntry | None]], weights: list[int]) -> int:
    """The root: the highest weight; among equals the earliest by the logs' own timestamps when they
    carry them, else the first in input order (file order, then line order)."""
    top = max(weights)
    tied = [i for i, w in enumerate(weights) if w == top]
    timed = [i for i in tied if enriched[i][0].timestamp is not None]
    if timed:
        return min(timed, key=lambda i: (enriched[i][0].timestamp or 0.0, i))
    return tied[0]


def _localise_origin(root: RootCause, findings: list[Finding]) -> None:
    """Name the rank that failed first when the root itself does not: torch elastic's earliest
    failure block (its "Root Cause (first observed failure)"), on the root's node if it has one."""
    if root.rank is not None or len(root.ranks) > 1:
        return
    blocks = [f for f in findings if f.rule_id in ORIGIN_RULES and f.rank is not None]
    if root.node is not None:
        blocks = [f for f in blocks if f.node == root.node]
    # The block whose exit code the cause explains (a SIGKILL: -9; an exception: 1) before the
    # earliest: torch elastic times a killed rank when it notices, after the peer it took down.
    exits = EXIT_CODES.get(root.code)
    if exits is not None:
        blocks = [f for f in blocks if f.groups.get("exit", "1" if f.code == "exit_1" else None) in exits] or blocks
    if not blocks:
        return
    first = min(blocks, key=lambda f: f.timestamp if f.timestamp is not None else float("inf"))
    root.rank = first.rank
    if root.node is None:
        root.node = first.node


COMM_CLASSES = frozenset({FaultClass.COMM_INIT, FaultClass.COMM_ERROR, FaultClass.HANG, FaultClass.PROCESS_KILLED})


@dataclass(frozen=True, slots=True)
class Places:
    """What the collected layout says about ranks and IPs (detectors/layout.py)."""

    nodes: dict[int, str] = field(default_factory=dict)
    devices: dict[int, str] = field(default_factory=dict)
    ips: dict[str, str] = field(default_factory=dict)


def _follow_waits(root: RootCause, findings: list[Finding], places: Places) -> None:
    """Name the place the others waited on (detectors/waitgraph.py), or list the candidates."""
    graph = waitgraph.build(findings, places.ips)
    if not graph.edges:
        return
    roots, decided = graph.roots()
    if decided:
        (place,) = roots
        root.chain = graph.chain(place)
        if place.startswith("rank ") and place[5:].isdigit():
            _move_to_rank(root, int(place[5:]), findings, places)
        else:
            where = _where_is(place, findings, places)
            if (where.node, where.device) != (root.node, root.device):
                root.node, root.device = where.node, where.device
        root.chain_places = [_where_is(p, findings, places) for p in root.chain]
        arrow = " → ".join(root.chain)
        root.summary = I18nText(
            en=f"{root.summary.en} Wait chain: {arrow}; {place} waited on nobody.",
            zh=f"{root.summary.zh}等待链：{arrow}；{place} 未等待任何对端。",
        )
    elif roots:
        root.candidates = roots
        root.candidate_places = [_where_is(p, findings, places) for p in roots]
        root.rank = None
        # A node or device is named only when every candidate shares it.
        cand_nodes = {c.node for c in root.candidate_places}
        cand_devices = {(c.node, c.device) for c in root.candidate_places}
        root.node = cand_nodes.pop() if len(cand_nodes) == 1 else None
        root.device = cand_devices.pop()[1] if len(cand_devices) == 1 else None
        listed = ", ".join(roots)
        root.summary = I18nText(
            en=f"{root.summary.en} The waits do not single out one place; candidates: {listed}.",
            zh=f"{root.summary.zh}等待关系无法确定唯一根因；候选：{listed}。",
        )


def _where_is(place: str, findings: list[Finding], places: Places) -> Place:
    """A wait-graph place ("rank 3", a node, an unresolved IP) with its node, device and rank."""
    if place.startswith("rank ") and place[5:].isdigit():
        rank = int(place[5:])
        node, device = _rank_home(rank, findings, places)
        return Place(place=place, node=node, device=device, rank=rank)
    host, sep, device = place.rpartition("/")
    if sep and host and device.isdigit():
        # HCCL's `server/device`: the device of a server, the server resolved where the layout knows it.
        known = places.ips.get(host)
        node = known if known is not None and not known.startswith("rank ") else host
        return Place(place=place, node=node, device=device)
    known = places.ips.get(place)
    return Place(place=place, node=known if known is not None and not known.startswith("rank ") else place)


def _rank_home(rank: int, findings: list[Finding], places: Places) -> tuple[str | None, str | None]:
    """The node and device of a rank: from the findings that carry both, else the layout's."""
    nodes = {f.node for f in findings if f.rank == rank and f.node}
    devices = {f.device for f in findings if f.rank == rank and f.device}
    node = nodes.pop() if len(nodes) == 1 else places.nodes.get(rank)
    device = devices.pop() if len(devices) == 1 else places.devices.get(rank)
    if node is None or device is None:
        # HCCL names a rank's place as `server/device` beside its number (the transport manager's
        # localIpAddr / remoteIpAddr): the server resolved where the layout knows it.
        homes = {
            (where.node, where.device)
            for f in findings
            for ip_key, rank_key in (("src_ip", "rank"), ("peer_ip", "peer_rank"))
            if f.groups.get(rank_key) == str(rank)
            and (where := _where_is(f.groups.get(ip_key) or "", findings, places)).device is not None
        }
        if len(homes) == 1:
            ((home_node, home_device),) = homes
            node = node if node is not None else home_node
            device = device if device is not None else home_device
    return node, device


def _move_to_rank(root: RootCause, rank: int, findings: list[Finding], places: Places) -> None:
    """The root is another rank than the finding that reported it: its node and device are that
    rank's own (from the findings that carry both, else the layout's), not the reporter's."""
    if root.rank == rank:
        return
    root.rank = rank
    root.node, root.device = _rank_home(rank, findings, places)


def _localise_stalled(root: RootCause, findings: list[Finding], ranks_seen: set[int], places: Places) -> None:
    """Ranks that wait on a collective report a timeout; the rank that stalled does not. When every
    rank whose log was read reports one but a single rank, that rank is where to look."""
    waiting = {f.rank for f in findings if f.fault_class is FaultClass.HANG and f.rank is not None}
    silent = ranks_seen - waiting
    if len(ranks_seen) < 2 or len(silent) != 1 or not waiting:
        return
    (rank,) = silent
    _move_to_rank(root, rank, findings, places)
    en, zh = (
        f" Rank {rank} reported no timeout while its peers waited: look at rank {rank} first.",
        (f"rank {rank} 没有上报超时而其他 rank 都在等待：请先检查 rank {rank}。"),
    )
    root.summary = I18nText(en=root.summary.en + en, zh=root.summary.zh + zh)


# Exit codes of a rank the launcher stopped: SIGKILL and SIGTERM, as torch elastic (-N) or a shell
# (128 + N) reports them.
KILL_EXITS = frozenset({"-9", "-15", "137", "143"})
TERM_EXITS = frozenset({"-15", "143"})
KILL_CODES = frozenset({"sigkill", "sigterm"})


def _block_exit(f: Finding) -> str:
    return f.groups.get("exit", "1" if f.code == "exit_1" else "")


def _explain_teardown(findings: list[Finding]) -> None:
    """torch elastic stops the surviving workers once one has failed: SIGTERM to each, then SIGKILL to
    those still alive after the grace period (torch/distributed/elastic/multiprocessing/api.py,
    `close`). Its failure summary then lists the survivors as killed (-15, -9), timed after the rank
    that failed first. When the summary shows that shape (the earliest block is not a kill, every kill
    block is later, and at least one survivor was sent SIGTERM), the kills are the launcher's
    teardown, a consequence of the first failure and never its cause."""
    blocks = [f for f in findings if f.rule_id in ORIGIN_RULES and f.timestamp is not None]
    if not blocks:
        return
    first = min(blocks, key=lambda f: f.timestamp or 0.0)
    if _block_exit(first) in KILL_EXITS:
        return
    kills = [f for f in blocks if _block_exit(f) in KILL_EXITS]
    if not kills or not any(_block_exit(f) in TERM_EXITS for f in kills):
        return
    if any((f.timestamp or 0.0) <= (first.timestamp or 0.0) for f in kills):
        return
    for f in findings:
        if f.fault_class is FaultClass.PROCESS_KILLED and f.code in KILL_CODES and f.consequence_of is None:
            f.consequence_of = first.code


# A launcher's report that one process failed and the job was torn down (rules/process_killed.yaml,
# generic.launcher_rank_aborted: Open MPI, horovodrun, Slurm's kill-on-bad-exit, Paddle, msrun).
LAUNCHER_TEARDOWN_RULES = frozenset({"generic.launcher_rank_aborted"})
TEARDOWN_KILL_CODES = KILL_CODES | {"batch_cancelled"}


def _explain_launcher_teardown(findings: list[Finding]) -> None:
    """After such a report the launcher or the batch system kills the processes still running (srun's
    "tasks ...: Terminated", a container's exit 137): kills reported after it, by the logs' own clock or
    later in the same file, are that teardown, a consequence of the failure and never its cause. A
    kill before the report may be what made the process fail: it stays a candidate."""
    reports = [f for f in findings if f.rule_id in LAUNCHER_TEARDOWN_RULES and f.consequence_of is None]
    if not reports:
        return
    for f in findings:
        if f.fault_class is not FaultClass.PROCESS_KILLED or f.code not in TEARDOWN_KILL_CODES:
            continue
        if f.consequence_of is None and any(_later(f, r) for r in reports):
            f.consequence_of = reports[0].code


def _later(f: Finding, than: Finding) -> bool:
    """Whether `f` was reported after `than`: by timestamps when both carry one, else by line in one file."""
    if f.timestamp is not None and than.timestamp is not None:
        return f.timestamp > than.timestamp
    if f.file == than.file and f.line_no is not None and than.line_no is not None:
        return f.line_no > than.line_no
    return False


def _explain_consequences(enriched: list[tuple[Finding, udal.CatalogEntry | None]]) -> None:
    causes = [
        f for f, e in enriched if f.fault_class is FaultClass.DEVICE_ERROR and not (e is not None and e.consequence)
    ]
    for f, e in enriched:
        if e is None or not e.consequence:
            continue
        same_place = [c for c in causes if c.device == f.device or c.node == f.node]
        pick = same_place or causes
        if pick:
            f.consequence_of = pick[0].code


def _root_cause(root: Finding, entry: udal.CatalogEntry | None, findings: list[Finding]) -> RootCause:
    same = [f for f in findings if f.code == root.code and f.fault_class is root.fault_class]
    ranks = sorted({f.rank for f in same if f.rank is not None})
    nodes = sorted({f.node for f in same if f.node is not None})
    devices = sorted({f.device for f in same if f.device is not None})
    rank = root.rank if root.rank is not None else (ranks[0] if len(ranks) == 1 else None)
    node = root.node if root.node is not None else (nodes[0] if len(nodes) == 1 else None)
    device = root.device if root.device is not None else (devices[0] if len(devices) == 1 else None)
    # A cause seen on several ranks (a collective timeout, every rank out of shared memory) does not
    # say which rank is at fault: the ranks are listed, none is picked.
    if len(ranks) > 1:
        rank = None
    what = root.message or I18nText(en=root.code, zh=root.code)
    where_en, where_zh = _where(node, device, rank, ranks)
    en, zh = f"{what.en.rstrip('.')}{where_en}.", f"{what.zh.rstrip('。')}{where_zh}。"
    if entry is not None:
        # What the vendor says it means: its own words in English, our rendering in Chinese.
        label = f"{root.code} {entry.mnemonic}" if entry.mnemonic else root.code
        # The vendor's own words, its placeholders ("Reason: %s") filled from the line it was found in.
        said = fill(entry.description, root.text).strip().rstrip(".")
        en += f" Vendor: {label}: {said}." if said else f" Vendor: {label}."
        zh += f"厂商说明（{label}）：{entry.message.zh}"
    summary = I18nText(en=en, zh=zh)
    return RootCause(
        fault_class=root.fault_class,
        chip=root.chip,
        code=root.code,
        vendor_action=root.vendor_action,
        action=root.action,
        node=node,
        device=device,
        rank=rank,
        summary=summary,
        vendor_causes=[fill(c, root.text).strip() for c in entry.causes] if entry is not None else [],
        vendor_steps=[fill(c, root.text).strip() for c in entry.steps] if entry is not None else [],
        hint=root.hint,
        rule_id=root.rule_id,
        severity=root.severity,
        occurrences=sum(f.count for f in same),
        ranks=ranks,
        nodes=nodes,
    )


def _replace_where(root: RootCause, reported: tuple[str | None, str | None, int | None]) -> None:
    """The summary names where the root is, not where the finding that reported it was."""
    node, device, rank = reported
    ranks = root.ranks if rank is None else []
    old_en, old_zh = _where(node, device, rank, ranks)
    if not old_en:
        return
    shown = [] if root.rank is not None or root.candidates else root.ranks
    new_en, new_zh = _where(root.node, root.device, root.rank, shown)
    root.summary = I18nText(
        en=root.summary.en.replace(old_en, new_en, 1), zh=root.summary.zh.replace(old_zh, new_zh, 1)
    )


def _where(node: str | None, device: str | None, rank: int | None, ranks: list[int]) -> tuple[str, str]:
    en: list[str] = []
    zh: list[str] = []
    if node:
        en.append(f"node {node}")
        zh.append(f"节点 {node}")
    if device:
        en.append(f"device {device}")
        zh.append(f"设备 {device}")
    if rank is not None:
        en.append(f"rank {rank}")
        zh.append(f"rank {rank}")
    elif len(ranks) > 1:
        shown = ", ".join(map(str, ranks[:8])) + (" ..." if len(ranks) > 8 else "")
        en.append(f"seen on ranks {shown}")
        zh.append(f"出现在 rank {shown}")
    if not en:
        return "", ""
    return " (" + ", ".join(en) + ")", "（" + "，".join(zh) + "）"
