"""What a collected layout says about where each file's lines come from: node, device, rank, IPs.

Operators hand over what a cluster collected, one folder per node (the folder name is the node):

    DIR/<node>/
        process_log/{run,debug}/plog/plog-<pid>_<time>.log     CANN process logs (no device in them)
        process_log/{run,debug}/device-<id>/device-<pid>_<time>.log
                                   CANN device logs: process <pid> ran on device <id>
        environment_check/         tool outputs: `npu-smi info` (its process table: NPU -> pid, its
                                   bus ids), `hccn_tool -i N -ip -g` (device N's RoCE address,
                                   `ipaddr:<ip>`), and a HCCL rank table (hccl.json, rank_table*.json)
        rank<R>*.log, ...          each rank's training console (the rank from the name)
        messages*, dmesg*, sysmonitor.log, nvidia-bug-report*   host logs of the node

Sources of the formats: CANN "Log Reference" (plog and device-log names), HCCL User Guide
"ranktable file configuration" (`server_list[].device[]` with `device_id`, `device_ip`, `rank_id`;
MindCluster's hccl.json and global-ranktable add `server_group_list`), the Ascend HDK "hccn_tool"
reference (`hccn_tool -i <devid> -ip -g` prints `ipaddr:` and `netmask:`), the `npu-smi info`
process table (`| NPU Chip | Process id | Process name | Process memory(MB) |`), and NCCL's
NCCL_DEBUG=INFO init lines (`host:pid:tid [cudaDev] NCCL INFO comm 0x.. rank R nranks N cudaDev D
nvmlDev D busId B ... - Init START|COMPLETE`, `NCCL INFO Bootstrap : Using eth0:10.0.0.1<0>`).

From these the layout knows: a process's device (plog pid -> device), each device's IP, each rank's
node, device and IP, each host IP's node. `diagnose` uses it to place findings whose lines do not say
where they came from, and the wait graph uses it to turn peers known only by an IP into nodes and
ranks (detectors/waitgraph.py).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

# A rank in a log file's name: rank3.log, rank_3.txt, worker-rank-3.out, log_rank03 (torchrun's
# --log-dir writes attempt_0/<local_rank>/stdout.log, which names no global rank).
_RANK_IN_NAME = re.compile(r"(?:^|[^a-z])rank[-_]?(\d{1,5})(?:[^0-9]|$)", re.IGNORECASE)
# Folders of a collection that hold logs, not a node's (torchrun's --log-dir, CANN's layout).
_NOT_A_NODE = re.compile(
    r"^(?:ranks?|logs?|attempt_\d+|process_log|debug|run|plog|device-\d+|stdout|stderr|tmp|\d+"
    r"|environment_check|layout|_unscheduled)$",
    re.IGNORECASE,
)
_RANK_DIR_PARENT = re.compile(r"^(?:ranks?|attempt_\d+|local_?ranks?)$", re.IGNORECASE)

# CANN's log layout (Ascend "Log Reference"): process logs `plog/plog-<pid>_<time>.log` and device
# logs `device-<id>/device-<pid>_<time>.log`; a process's device is the folder of its device log.
_PLOG = re.compile(r"^plog-(\d{1,10})_\d+\.log$")
_DEVICE_LOG = re.compile(r"^device-(\d{1,10})_\d+\.log$")
_DEVICE_DIR = re.compile(r"^device-(\d{1,3})$")

# `npu-smi info`: the process table's rows `| <npu> <chip> | <pid> | <name> | <memory> |` and the
# device table's second row of each NPU `| <chip> | <bus id> | ...`.
_NPU_SMI_PROC = re.compile(rb"^\|\s*(\d{1,3})\s+(\d{1,3})\s*\|\s*(\d{1,10})\s*\|\s*[^|\s][^|]*\|\s*\d+\s*\|\s*$", re.M)
# `hccn_tool -i <dev> -ip -g`, as echoed by a collection script (`$ hccn_tool -i 3 -ip -g`), then
# its output `ipaddr:192.168.1.3`.
_HCCN_CMD = re.compile(rb"hccn_tool\s+-i\s+(\d{1,3})\s+-ip\s+-g")
_HCCN_IP = re.compile(rb"^\s*ipaddr\s*:\s*(\d{1,3}(?:\.\d{1,3}){3})\s*$", re.M)
_HCCN_NAME = re.compile(r"hccn(?:_tool)?[-_.]?(?:i[-_.]?)?(\d{1,3})(?:\D|$)", re.IGNORECASE)
# NCCL_DEBUG=INFO: `host:pid:tid [dev] NCCL INFO [ncclCommInitRank ]comm 0x.. rank R nranks N cudaDev D
# [nvmlDev D] busId B` and `host:pid:tid [dev] NCCL INFO Bootstrap : Using eth0:10.0.0.1<0>`.
_NCCL_COMM = re.compile(
    rb"([A-Za-z0-9][A-Za-z0-9._-]*):\d+:\d+ \[\d{1,3}\] NCCL INFO (?:ncclCommInitRank )?comm 0x[0-9a-f]+ "
    rb"rank (\d{1,6}) nranks (\d{1,6}) cudaDev (\d{1,3})"
    rb"(?: nvmlDev \d{1,3})?(?: busId ([0-9a-fA-F]{1,16}))?"
)
_NCCL_BOOTSTRAP = re.compile(
    rb"([A-Za-z0-9][A-Za-z0-9._-]*):\d+:\d+ \[\d{1,3}\] NCCL INFO Bootstrap : Using [^:\s]+:(\d{1,3}(?:\.\d{1,3}){3})<"
)
_IPV4 = re.compile(r"^\d{1,3}(?:\.\d{1,3}){3}$")
# Files read for what they say about the layout (besides their names): bounded.
MAX_LAYOUT_BYTES = 8 << 20


@dataclass(frozen=True, slots=True)
class Place:
    """Where something ran, as far as the layout knows."""

    node: str | None = None
    device: str | None = None
    rank: int | None = None
    ip: str | None = None


def place_of(name: str, root: str | None) -> tuple[str | None, int | None]:
    """(node, rank) a file's place in a collected layout says: under DIR/<node>/..., the first folder
    below DIR is the node (one folder per node, as MindCluster and nvidia-bug-report collections lay
    them out); a rank in the file name is the rank. The logs' own words win over both."""
    node = None
    path = Path(name)
    if root is not None:
        # root "": the name is already relative to the collection (an upload's file name).
        rel: tuple[str, ...] = path.relative_to(root).parts if root else () if path.is_absolute() else path.parts
        if rel and rel[0] == "layout" and len(rel) > 2:
            rel = rel[1:]  # a scene bundle's layout/<node>/...
        if len(rel) > 1 and not _NOT_A_NODE.match(rel[0]):
            node = rel[0]
    m = _RANK_IN_NAME.search(path.name)
    if m:
        return node, int(m.group(1))
    # torchrun --log-dir: <dir>/<run>/attempt_<n>/<rank>/std{out,err}.log (and a plain ranks/<n>/).
    parent, grand = path.parent.name, path.parent.parent.name
    if parent.isdigit() and _RANK_DIR_PARENT.match(grand):
        return node, int(parent)
    return node, None


class Layout:
    """What a collection's file names and tool outputs say about where each file's lines come from."""

    def __init__(self, names: Sequence[str], root: str | None, blobs: Iterable[tuple[str, bytes]] = ()) -> None:
        """`names`: every file of the collection; their contents are read where they may describe the
        layout (tool outputs, rank tables, logs with NCCL INFO lines) unless `blobs` gives them."""
        self.root = root
        self.pid_device: dict[tuple[str | None, str], str] = {}
        self.device_ip: dict[tuple[str | None, str], str] = {}
        self.bus_id: dict[tuple[str | None, str], str] = {}
        self.ranks: dict[int, Place] = {}
        self.ips: dict[str, Place] = {}
        # Hosts the logs name (NCCL's prefix) -> the node folder they were found in.
        self.hosts: dict[str, str] = {}
        self.nodes: set[str] = set()
        given = dict(blobs)
        self._tables: list[tuple[str | None, bytes]] = []
        self._comms: list[tuple[int, Place]] = []
        for name in names:
            path = Path(name)
            node, _ = place_of(name, root)
            m = _DEVICE_LOG.match(path.name)
            d = _DEVICE_DIR.match(path.parent.name)
            if m and d:
                if node is not None:
                    self.nodes.add(node)
                self.pid_device.setdefault((node, m.group(1)), d.group(1))
                continue
            if _PLOG.match(path.name):
                if node is not None:
                    self.nodes.add(node)
                continue
            data = given.get(name)
            self.learn(node, name, read_head(name) if data is None else data)
        self.finish()

    def learn(self, node: str | None, name: str, data: bytes | None) -> None:
        """What one file (or text) of `node` says: tool outputs, rank tables, NCCL INFO lines. Call
        `finish` once every file is learnt."""
        if node is not None:
            self.nodes.add(node)
        if not data:
            return
        if name.endswith(".json") and b"server_list" in data:
            self._tables.append((node, data))
            return
        self._learn_tools(name, node, data)
        self._learn_nccl(node, data)

    def finish(self) -> None:
        """Rank tables last (their servers are placed by what the tool outputs said), then the
        devices' addresses."""
        # A rank of NCCL's lines is a global rank only in the largest communicator (the world); the
        # others (tensor- or data-parallel groups) number their members from 0 again.
        world = max((size for size, _ in self._comms), default=0)
        for size, place in self._comms:
            if size == world and place.rank is not None:
                self.ranks.setdefault(place.rank, place)
        self._comms = []
        for node, data in self._tables:
            self._learn_rank_table(node, data)
        self._tables = []
        for (node, device), ip in self.device_ip.items():
            self.ips.setdefault(ip, Place(node=node, device=device, rank=self.rank_of(node, device), ip=ip))

    # -- what the files say ----------------------------------------------------------------------

    def _learn_tools(self, name: str, node: str | None, data: bytes) -> None:
        if b"Process id" in data:  # the header of `npu-smi info`'s process table
            for m in _NPU_SMI_PROC.finditer(data):
                self.pid_device.setdefault((node, m.group(3).decode()), m.group(1).decode())
        if b"ipaddr" in data:
            marks = [(m.start(), m.group(1).decode()) for m in _HCCN_CMD.finditer(data)]
            by_name = _HCCN_NAME.search(Path(name).name)
            for m in _HCCN_IP.finditer(data):
                before = [dev for pos, dev in marks if pos < m.start()]
                device = before[-1] if before else (by_name.group(1) if by_name else None)
                if device is not None:
                    self.device_ip.setdefault((node, device), m.group(1).decode())

    def _learn_nccl(self, node: str | None, data: bytes) -> None:
        if b"NCCL INFO" not in data:
            return
        for m in _NCCL_COMM.finditer(data):
            host, rank, size, dev = m.group(1).decode(), int(m.group(2)), int(m.group(3)), m.group(4).decode()
            where = node or host
            if node is not None:
                self.hosts.setdefault(host, node)
            if m.group(5):
                self.bus_id.setdefault((where, dev), m.group(5).decode())
            self._comms.append((size, Place(node=where, device=dev, rank=rank)))
        for m in _NCCL_BOOTSTRAP.finditer(data):
            host, ip = m.group(1).decode(), m.group(2).decode()
            self.ips.setdefault(ip, Place(node=node or host, ip=ip))

    def _learn_rank_table(self, node: str | None, data: bytes) -> None:
        try:
            doc = json.loads(data)
        except ValueError:
            return
        if not isinstance(doc, dict):
            return
        servers: list[object] = list(doc.get("server_list") or [])
        for group in doc.get("server_group_list") or []:
            if isinstance(group, dict):
                servers.extend(group.get("server_list") or [])
        for server in servers:
            if not isinstance(server, dict):
                continue
            devices = [d for d in server.get("device") or [] if isinstance(d, dict)]
            host = str(server.get("server_id") or server.get("host_ip") or server.get("server_ip") or "") or None
            where = self._server_node(host, server, devices)
            # The server's own (host) addresses: peers that name a host, not a device, are this node,
            # and its rank when it runs only one.
            ranks = [str(d.get("rank_id", "")) for d in devices]
            only = int(ranks[0]) if len(ranks) == 1 and ranks[0].isdigit() else None
            only_dev = str(devices[0].get("device_id", "")) if len(devices) == 1 else ""
            for key in ("server_id", "host_ip", "server_ip"):
                addr = str(server.get(key) or "")
                if _IPV4.match(addr):
                    self.ips.setdefault(
                        addr, Place(node=where, device=only_dev if only_dev.isdigit() else None, rank=only, ip=addr)
                    )
            for dev in devices:
                rank_s, dev_id, ip = (str(dev.get(k, "")) for k in ("rank_id", "device_id", "device_ip"))
                rank = int(rank_s) if rank_s.isdigit() else None
                device = dev_id if dev_id.isdigit() else None
                place = Place(node=where, device=device, rank=rank, ip=ip or None)
                if rank is not None:
                    self.ranks.setdefault(rank, place)
                if ip:
                    self.ips.setdefault(ip, place)
                    if where is not None and device is not None:
                        self.device_ip.setdefault((where, device), ip)

    def _server_node(self, host: str | None, server: dict[str, object], devices: list[dict[str, object]]) -> str | None:
        """The node folder of a rank table's server: the folder of that name, else the node whose
        `hccn_tool` outputs hold the server's device IPs, else the node whose host IP it is."""
        if host is not None and host in self.nodes:
            return host
        ips = {str(d.get("device_ip")) for d in devices if d.get("device_ip")}
        owners = {n for (n, _), ip in self.device_ip.items() if ip in ips and n is not None}
        if len(owners) == 1:
            return owners.pop()
        for key in ("host_ip", "server_ip", "server_id"):
            known = self.ips.get(str(server.get(key) or ""))
            if known is not None and known.node is not None:
                return known.node
        return host

    # -- questions -------------------------------------------------------------------------------

    def device_of(self, name: str, node: str | None) -> str | None:
        """The device of a CANN plog (through its process's device log or `npu-smi info`), or of a
        device log (its folder)."""
        m = _PLOG.match(Path(name).name)
        if m is None:
            d = _DEVICE_DIR.match(Path(name).parent.name)
            return d.group(1) if d and _DEVICE_LOG.match(Path(name).name) else None
        return self.pid_device.get((node, m.group(1)))

    def rank_of(self, node: str | None, device: str | None) -> int | None:
        """The rank that ran on `device` of `node`, where a rank table or NCCL INFO line says it."""
        if device is None:
            return None
        found = [r for r, p in self.ranks.items() if p.device == device and p.node == node]
        return found[0] if len(found) == 1 else None

    def rank_of_bus(self, node: str | None, pci: str) -> int | None:
        """The rank whose GPU sits at `pci` (`0000:3b:00`, as localize normalises it) on `node`, where
        NCCL INFO lines gave each rank's bus id."""
        devices = {d for (n, d), bus in self.bus_id.items() if n == node and _nccl_bus(bus) == pci}
        if len(devices) != 1:
            return None
        return self.rank_of(node, devices.pop())

    def node_of(self, host: str | None) -> str | None:
        """The node folder a host name (NCCL's prefix) or a server IP (a rank table's, an HCCL line's)
        of the logs stands for."""
        if host is None:
            return None
        if host in self.hosts:
            return self.hosts[host]
        known = self.ips.get(host)
        return known.node if known is not None and known.node is not None else host

    def rank_places(self) -> dict[int, Place]:
        return dict(self.ranks)

    def ip_places(self) -> dict[str, str]:
        """IP -> the place the wait graph calls it: "rank R" where the rank is known, else the node."""
        out: dict[str, str] = {}
        for ip, place in self.ips.items():
            if place.rank is not None:
                out[ip] = f"rank {place.rank}"
            elif place.node is not None:
                out[ip] = place.node
        return out


def _nccl_bus(bus: str) -> str:
    """NCCL's busId (the PCI address's hex digits run together, `3b000`: domain, bus, device,
    function) as `0000:3b:00`."""
    digits = bus.lower().rjust(9, "0")
    return f"{digits[-9:-5]}:{digits[-5:-3]}:{digits[-3:-1]}"


def read_head(name: str) -> bytes | None:
    """The head of a file that may describe the layout; None for the others (not read at all)."""
    path = Path(name)
    if name == "-":
        return None
    try:
        with open(path, "rb") as fh:
            head = fh.read(MAX_LAYOUT_BYTES)
    except OSError:
        return None
    if head[:2] == b"\x1f\x8b":
        return None
    return head


__all__ = ["Layout", "Place", "place_of", "read_head"]
