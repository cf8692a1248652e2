"""Host faults of a node (rules/host_node.yaml): a kernel or host-daemon line in a node's folder of a
collected layout becomes a node-level finding naming that node, and the benign neighbours of those
lines (link up, corrected-error counts, mount notices, conntrack start-up notices) never become a
finding, let alone a root cause. Lines are written as the kernel prints them (the format strings of
the sources rules/host_node.yaml names; the MCE lines as public dmesg excerpts show them)."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainmedic.detectors.diagnose import diagnose_paths
from trainmedic.detectors.engine import Engine

NODE = "node-07"

# (kernel message, fault class, code)
FAULTS = [
    (
        "EXT4-fs error (device sda2): ext4_find_entry:1455: inode #2: comm systemd: reading directory lblock 0",
        "storage_error",
        "fs_error",
    ),
    ("EXT4-fs (sda2): Remounting filesystem read-only", "storage_error", "fs_error"),
    (
        'XFS (dm-3): metadata I/O error in "xfs_imap_to_bp+0x5c/0xa0 [xfs]" at daddr 0x1f6b0 len 32 error 5',
        "storage_error",
        "fs_error",
    ),
    ("Buffer I/O error on dev sdb1, logical block 0, lost async page write", "storage_error", "fs_error"),
    (
        "python3: page allocation failure: order:4, mode:0x40dc0(GFP_KERNEL|__GFP_COMP|__GFP_ZERO), "
        "nodemask=(null),cpuset=/,mems_allowed=0-1",
        "host_oom",
        "page_alloc_failure",
    ),
    (
        "vmalloc error: size 8392704, vm_struct allocation failed, mode:0xdc0(GFP_KERNEL|__GFP_ZERO), "
        "nodemask=(null),cpuset=/,mems_allowed=0",
        "host_oom",
        "page_alloc_failure",
    ),
    ("nf_conntrack: nf_conntrack: table full, dropping packet", "node_failure", "conntrack_full"),
    ("ixgbe 0000:5e:00.0 enp94s0f0: NIC Link is Down", "node_failure", "nic_link_down"),
    ("mlx5_core 0000:3b:00.0 ens1f0np0: Link down", "node_failure", "nic_link_down"),
    (
        "EDAC MC1: 1 UE memory read error on CPU_SrcID#1_Ha#0_Chan#2_DIMM#0 (channel:2 slot:0 page:0x9b2d47 "
        "offset:0x0 grain:32 - OVERFLOW err_code:0000:009f)",
        "node_failure",
        "machine_check",
    ),
    ("[Hardware Error]: Uncorrected, software restartable error.", "node_failure", "machine_check"),
    ("watchdog: BUG: soft lockup - CPU#12 stuck for 22s! [python3:48211]", "node_failure", "kernel_lockup"),
    ("INFO: task jbd2/sda2-8:512 blocked for more than 120 seconds.", "node_failure", "kernel_lockup"),
]

# Lines a healthy node prints: none is a fault.
BENIGN = [
    "ixgbe 0000:5e:00.0 enp94s0f0: NIC Link is Up 10 Gbps, Flow Control: RX/TX",
    "mlx5_core 0000:3b:00.0 ens1f0np0: Link up",
    "IPv6: ADDRCONF(NETDEV_CHANGE): ens1f0np0: link becomes ready",
    "EDAC MC0: 1 CE memory read error on CPU_SrcID#0_MC#0_Chan#1_DIMM#0 (channel:1 slot:0 page:0x1f6e8e "
    "offset:0x0 grain:32 syndrome:0x0 -  err_code:0101:0091 socket:0 imc:0 rank:0 bg:1 ba:3 row:1c6a col:3c8)",
    "EDAC MC0: 0 UE memory read error on CPU_SrcID#0_Ha#0_Chan#0_DIMM#0",
    "EDAC sbridge: Seeking for: PCI ID 8086:3ca0",
    "mce: [Hardware Error]: Machine check events logged",
    "[Hardware Error]: Corrected error, no action required.",
    "[Hardware Error]: Deferred error, no action required.",
    "mce: CPU0: Core temperature above threshold, cpu clock throttled (total events = 1)",
    "mce: CPU0: Core temperature/speed normal",
    "EXT4-fs (sda1): mounted filesystem with ordered data mode. Opts: (null)",
    "EXT4-fs (dm-0): re-mounted. Opts: errors=remount-ro",
    "XFS (sdb1): Mounting V5 Filesystem",
    "XFS (sdb1): Ending clean mount",
    "nf_conntrack: default automatic helper assignment has been turned off for security reasons and "
    "CT-based  firewall rule not found. Use the iptables CT target to attach helpers instead.",
    "nf_conntrack version 0.5.0 (65536 buckets, 262144 max)",
]


def _collection(tmp_path: Path, file_name: str, lines: list[str]) -> Path:
    """A two-node collection: `lines` as the kernel log of NODE (syslog form in `messages`, dmesg
    form otherwise); the other node logs training progress only."""
    root = tmp_path / "collected"
    (root / "node-01").mkdir(parents=True)
    (root / "node-01" / "rank0.log").write_text("epoch 1 step 10 loss 2.1\n")
    (root / NODE).mkdir()
    if file_name == "messages":
        text = "".join(f"Nov 22 17:40:{i:02d} {NODE} kernel: {line}\n" for i, line in enumerate(lines))
    else:
        text = "".join(f"[{5012 + i}.330416] {line}\n" for i, line in enumerate(lines))
    (root / NODE / file_name).write_text(text)
    return root


@pytest.mark.parametrize("file_name", ["messages", "dmesg"])
@pytest.mark.parametrize(("line", "fault_class", "code"), FAULTS, ids=[f[0][:40] for f in FAULTS])
def test_host_fault_is_a_node_level_root(
    tmp_path: Path, re_engine: Engine, file_name: str, line: str, fault_class: str, code: str
) -> None:
    root = _collection(tmp_path, file_name, [*BENIGN[:3], line])
    rc = diagnose_paths([str(root)], re_engine).root_cause
    assert rc is not None
    assert (rc.fault_class.value, rc.code) == (fault_class, code)
    assert (rc.node, rc.device, rc.rank) == (NODE, None, None)


@pytest.mark.parametrize("file_name", ["messages", "dmesg"])
@pytest.mark.parametrize("line", BENIGN, ids=[b[:40] for b in BENIGN])
def test_benign_host_line_is_no_finding(tmp_path: Path, re_engine: Engine, file_name: str, line: str) -> None:
    diagnosis = diagnose_paths([str(_collection(tmp_path, file_name, [line]))], re_engine)
    assert diagnosis.findings == []
    assert diagnosis.root_cause is None


def test_benign_host_lines_leave_the_real_root_alone(tmp_path: Path, re_engine: Engine) -> None:
    """Every benign line on one node, an NPU out-of-memory on the other: the OOM is the root."""
    root = _collection(tmp_path, "messages", BENIGN)
    (root / "node-01" / "rank0.log").write_text(
        "RuntimeError: NPU out of memory. Tried to allocate 2.00 GiB (NPU 0; 60.97 GiB total capacity; "
        "58.10 GiB already allocated)\n"
    )
    rc = diagnose_paths([str(root)], re_engine).root_cause
    assert rc is not None
    assert (rc.fault_class.value, rc.node, rc.rank) == ("accelerator_oom", "node-01", 0)
