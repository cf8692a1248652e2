"""Where a line came from: node, device and rank, read off the line's own prefixes.

Named groups of the matching rule win; these generic extractors fill what they leave open. They
know the prefixes training stacks put on lines: torchrun `[rank3]:` / `[default3]:`, torch_npu
`(PID:.., Device:0, RankID:1)`, NCCL `host:pid:tid [dev]`, `[Rank 3]` in watchdog messages,
torch elastic's `host : ...` block, syslog hostnames, Ray `ip=...`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from trainmedic.udal.registry import device_patterns

_RANK = [
    re.compile(r"^\s*\[(?:rank|default)(\d{1,6})\]:", re.ASCII),
    re.compile(r"RankID:(\d{1,6})\b", re.ASCII),
    re.compile(r"\[(?:PG [^\]]*?)?Rank (\d{1,6})\]", re.ASCII),
    re.compile(r"\brank\s*:\s*(\d{1,6})\b", re.ASCII),
]
# Between these two, the chips' own device patterns (udal.registry.device_patterns: "(GPU 0;",
# "NPU 3 has a total capacity", "cuda:1", built from each plugin's words).
_DEVICE_FIRST = [re.compile(r"\bDevice:(\d{1,3})\b", re.ASCII)]
_DEVICE_LAST = [re.compile(r"\bdeviceId=(\d{1,3})\b", re.ASCII)]
_NCCL_PREFIX = re.compile(r"^(?:\S+\s+)?([A-Za-z0-9][A-Za-z0-9._-]*):\d+:\d+ \[(\d{1,3})\] ", re.ASCII)
_NODE = [
    # syslog: "Mar 27 17:40:36 gpu-node-3 kernel: ..."
    re.compile(r"^[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d ([A-Za-z0-9][A-Za-z0-9._-]*) kernel:", re.ASCII),
    # torch elastic failure block: "host      : worker-1"
    re.compile(r"^\s*host\s*:\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*$", re.ASCII),
    re.compile(r"\bip=(\d{1,3}(?:\.\d{1,3}){3})\b", re.ASCII),
]
_PCI_DEVICE = re.compile(r"^(?:PCI:)?([0-9a-fA-F]{4}:)?([0-9a-fA-F]{2}:[0-9a-fA-F]{2})(?:\.\d)?$", re.ASCII)


@dataclass(frozen=True, slots=True)
class Location:
    node: str | None = None
    device: str | None = None
    rank: int | None = None


def _first(patterns: Sequence[re.Pattern[str]], text: str) -> str | None:
    for p in patterns:
        m = p.search(text)
        if m:
            return m.group(1)
    return None


def localize(text: str, groups: dict[str, str]) -> Location:
    node = groups.get("node")
    device = groups.get("device")
    rank_s = groups.get("rank")
    nccl = _NCCL_PREFIX.search(text)
    if node is None:
        node = nccl.group(1) if nccl else _first(_NODE, text)
    if device is None:
        device = _first(_DEVICE_FIRST, text) or _first(device_patterns(), text) or _first(_DEVICE_LAST, text)
        if device is None and nccl:
            device = nccl.group(2)
        if device is None and groups.get("pci"):
            device = normalize_pci(groups["pci"])
    if rank_s is None:
        rank_s = _first(_RANK, text)
    rank = int(rank_s) if rank_s is not None and rank_s.lstrip("-").isdigit() else None
    if rank is not None and rank < 0:
        rank = None
    return Location(node=node, device=device, rank=rank)


def normalize_pci(pci: str) -> str:
    """`PCI:0000:3b:00` / `0000:3b:00.0` / `3b:00` -> `0000:3b:00` (domain:bus:device)."""
    m = _PCI_DEVICE.match(pci.strip())
    if not m:
        return pci
    domain = (m.group(1) or "0000:").lower()
    return f"{domain}{m.group(2).lower()}"
