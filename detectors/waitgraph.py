"""Who waited on whom: the wait graph of a communication fault, and the rank at its end.

When one rank or device fails, its peers time out or lose their connections, and each peer's log
names whom it was waiting on: HCCL's link-error table (the destination that never answered), its
"remote rank" in a notify-wait timeout, gloo's "Connection closed by peer [ip]", a store connection
to MASTER_ADDR. Every such finding is an edge waiter -> waited. The root is the place others wait on
that waits on nobody (a sink); every member of a cycle is a candidate when there is no sink; two or
more sinks are candidates too. The graph never picks among candidates: a false root cordons a healthy
node. IP-only peers are resolved to ranks where another finding names both (HCCL prints
`ip(rank)`).

Edges come from named groups of the findings, never from a rule's wording:
  the finding's own rank, and `peer_rank`       HCCL link-error rows (`src_ip` / `peer_ip` map IPs)
  the finding's own rank, and `remote_rank`     HCCL notify-wait timeouts (EI0002)
  the finding's own rank or node, and `peer`    gloo / c10d connections to a peer's address
  the finding's own rank or node, and each of `missing_ranks`
                                                HCCL's topology exchange naming the ranks that never
                                                reached the root ("Failed to connect agent[1,3,]")
  `src_server`/`src_device` -> `dst_server`/`dst_device`
                                                HCCL's connect-timeout detection result, which names
                                                both ends as server and device (place `server/device`,
                                                HCCL's own `localIpAddr[server/device]` spelling)
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from trainmedic.models import Finding


@dataclass
class WaitGraph:
    edges: set[tuple[str, str]] = field(default_factory=set)

    @property
    def places(self) -> set[str]:
        return {p for edge in self.edges for p in edge}

    def roots(self) -> tuple[list[str], bool]:
        """(places at the end of the waits, decided): one sink decides; several sinks, or only
        cycles, are candidates."""
        out = defaultdict(set)
        for a, b in self.edges:
            out[a].add(b)
        sinks = sorted(p for p in self.places if not out[p])
        if len(sinks) == 1:
            return sinks, True
        if sinks:
            return sinks, False
        return sorted(_cycle_members(out)), False

    def chain(self, root: str) -> list[str]:
        """The longest simple path of waits ending at `root`, as places (first waiter first)."""
        into: dict[str, set[str]] = defaultdict(set)
        for a, b in self.edges:
            into[b].add(a)
        best: list[str] = [root]
        stack: list[list[str]] = [[root]]
        while stack:
            path = stack.pop()
            extended = False
            for prev in sorted(into[path[0]]):
                if prev not in path and len(path) < 64:
                    stack.append([prev, *path])
                    extended = True
            if not extended and (len(path), _order(best)) > (len(best), _order(path)):
                best = path
        return best


def _order(path: list[str]) -> list[tuple[int, str]]:
    """Natural order of places ("rank 2" before "rank 10"): ties between equal chains are stable."""
    return [(int(p[5:]), "") if p.startswith("rank ") and p[5:].isdigit() else (1 << 30, p) for p in path]


def _cycle_members(out: dict[str, set[str]]) -> set[str]:
    members: set[str] = set()
    for start in list(out):
        seen: set[str] = set()
        stack = [start]
        while stack:
            node = stack.pop()
            for nxt in out.get(node, ()):
                if nxt == start:
                    members.add(start)
                elif nxt not in seen:
                    seen.add(nxt)
                    stack.append(nxt)
    return members


def _rank(value: str | int | None) -> str | None:
    if value is None:
        return None
    text = str(value).strip()
    return f"rank {int(text)}" if text.isdigit() else None


def build(findings: Iterable[Finding], ip_places: Mapping[str, str] | None = None) -> WaitGraph:
    """The graph of the findings' waits. `ip_places`: what the collected layout says an IP is
    ("rank 3" from a rank table, a node from its tool outputs); the findings' own `ip(rank)` pairs
    come first."""
    found = list(findings)
    ip_rank: dict[str, str] = dict(ip_places or {})
    for f in found:
        g = f.groups
        for ip_key, rank_key in (("src_ip", "rank"), ("peer_ip", "peer_rank")):
            r = _rank(g.get(rank_key)) if rank_key in g else None
            if g.get(ip_key) and r:
                ip_rank[g[ip_key]] = r
    graph = WaitGraph()

    def place(ip_or_rank: str | None) -> str | None:
        if ip_or_rank is None:
            return None
        return ip_rank.get(ip_or_rank, ip_or_rank)

    for f in found:
        g = f.groups
        own = _rank(f.rank) or place(g.get("src_ip")) or f.node
        if g.get("missing_ranks"):
            for r in str(g["missing_ranks"]).split(","):
                waited_rank = _rank(r)
                if own and waited_rank and own != waited_rank:
                    graph.edges.add((own, waited_rank))
            continue
        if g.get("dst_server") and g.get("dst_device"):
            # Both ends named by the line itself (the reporter may be a third device).
            if g.get("src_server") and g.get("src_device"):
                own = place(f"{g['src_server']}/{g['src_device']}")
            waited = place(f"{g['dst_server']}/{g['dst_device']}")
        elif "peer_rank" in g:
            waited = _rank(g.get("peer_rank")) or place(g.get("peer_ip"))
        elif "remote_rank" in g:
            waited = _rank(g.get("remote_rank"))
        elif "peer" in g:
            waited = place(g["peer"].strip("[]() ").split(",")[0].split(":")[0] or None)
        else:
            continue
        if own and waited and own != waited:
            graph.edges.add((own, waited))
    return graph
