"""Localisation: node, device and rank read off the prefixes real training stacks print."""

from __future__ import annotations

import pytest

from trainmedic.detectors.localize import Location, localize, normalize_pci


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(
            "[rank3]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.",
            Location(rank=3),
            id="torchrun-rank",
        ),
        pytest.param("[default5]:RuntimeError: NCCL error", Location(rank=5), id="torchrun-default"),
        pytest.param(
            "[rank12]:[W reducer.cpp:1389] Warning: find_unused_parameters=True",
            Location(rank=12),
            id="rank-2-digits",
        ),
        pytest.param(
            "[ERROR] RUNTIME(540989,python):2024-06-12-10:22:33.123 [PID:540989, Device:0, RankID:1] (PID:540989, "
            "Device:0, RankID:1) ERROR: EL0004 FAIL_ALLOC_MEMORY",
            Location(device="0", rank=1),
            id="torch-npu",
        ),
        pytest.param(
            "EI0006: Getting socket times out. (PID:540989, Device:0, RankID:1) ERR02200 DIST call hccl api failed.",
            Location(device="0", rank=1),
            id="torch-npu-hccl",
        ),
        pytest.param(
            "(PID:12, Device:7, RankID:-1) ERROR: EL0004 FAIL_ALLOC_MEMORY",
            Location(device="7"),
            id="rankid-minus-1",
        ),
        pytest.param(
            "ng30903:3063028:3066152 [3] NCCL INFO NET/IB : No device found.",
            Location(node="ng30903", device="3"),
            id="nccl-prefix",
        ),
        pytest.param(
            "worker-0:1234:5678 [0] misc/socket.cc:484 NCCL WARN socketStartConnect: Connect to 10.0.0.2<45678> failed",
            Location(node="worker-0", device="0"),
            id="nccl-warn",
        ),
        pytest.param(
            "[rank1]: ng30903:3063028:3066152 [1] NCCL INFO Channel 00/02",
            Location(node="ng30903", device="1", rank=1),
            id="nccl-after-rank-prefix",
        ),
        pytest.param(
            "[Rank 4] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1, OpType=ALLREDUCE) ran for "
            "600000 milliseconds before timing out.",
            Location(rank=4),
            id="watchdog",
        ),
        pytest.param(
            "[PG 0 Rank 2] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5)",
            Location(rank=2),
            id="watchdog-pg",
        ),
        pytest.param(
            "RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 31.74 GiB total capacity; "
            "30.53 GiB already allocated)",
            Location(device="0"),
            id="cuda-oom-old",
        ),
        pytest.param(
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.88 GiB. GPU 3 has a total capacity "
            "of 21.96 GiB of which 1.29 GiB is free.",
            Location(device="3"),
            id="cuda-oom-new",
        ),
        pytest.param(
            "RuntimeError: NPU out of memory. Tried to allocate 2.00 GiB (NPU 6; 60.97 GiB total capacity;",
            Location(device="6"),
            id="npu-oom",
        ),
        pytest.param(
            "Mar 27 17:40:36 gpu-node-3 kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.",
            Location(node="gpu-node-3"),
            id="syslog",
        ),
        pytest.param(
            "Mar  7 07:40:36 node7.cluster.local kernel: NVRM: Xid (PCI:0000:3b:00): 48",
            Location(node="node7.cluster.local"),
            id="syslog-single-digit-day",
        ),
        pytest.param("  host      : worker-1", Location(node="worker-1"), id="elastic-host"),
        pytest.param("  rank      : 3 (local_rank: 3)", Location(rank=3), id="elastic-rank"),
        pytest.param(
            "(RayTrainWorker pid=1234, ip=10.0.0.5) RuntimeError: CUDA error: an illegal memory access",
            Location(node="10.0.0.5"),
            id="ray-ip",
        ),
        pytest.param("RuntimeError: CUDA error on cuda:2", Location(device="2"), id="cuda-colon"),
        pytest.param("nothing to see here", Location(), id="nothing"),
        pytest.param("", Location(), id="empty"),
        pytest.param("Mar 27 17:40:36 kernel: NVRM: Xid (PCI:0000:01:00): 62", Location(), id="syslog-without-host"),
    ],
)
def test_localize_prefixes(text: str, expected: Location) -> None:
    assert localize(text, {}) == expected


@pytest.mark.parametrize(
    ("text", "groups", "expected"),
    [
        pytest.param("[rank3]: boom", {"rank": "7"}, Location(rank=7), id="rank-group"),
        pytest.param(
            "ng30903:1:2 [3] NCCL WARN x",
            {"node": "other", "device": "5"},
            Location(node="other", device="5"),
            id="node-device-groups",
        ),
        pytest.param(
            "Mar 27 17:40:36 gpu-node-3 kernel: NVRM: Xid (PCI:0000:3b:00): 79",
            {"pci": "PCI:0000:3B:00"},
            Location(node="gpu-node-3", device="0000:3b:00"),
            id="pci-group-fills-device",
        ),
        pytest.param(
            "(GPU 1; 31.74 GiB total capacity",
            {"pci": "0000:3b:00"},
            Location(device="1"),
            id="text-device-beats-pci",
        ),
        pytest.param("(PID:1, Device:0, RankID:1)", {"rank": "-1"}, Location(device="0"), id="negative-rank-group"),
        pytest.param("[rank3]: x", {"rank": "abc"}, Location(), id="non-numeric-rank-group"),
    ],
)
def test_localize_groups_win(text: str, groups: dict[str, str], expected: Location) -> None:
    assert localize(text, groups) == expected


@pytest.mark.parametrize(
    ("pci", "expected"),
    [
        ("PCI:0000:3b:00", "0000:3b:00"),
        ("0000:3b:00.0", "0000:3b:00"),
        ("0000:3B:00.0", "0000:3b:00"),
        ("3b:00", "0000:3b:00"),
        ("3b:00.1", "0000:3b:00"),
        ("PCI:0001:DC:00", "0001:dc:00"),
        ("  0000:70:00  ", "0000:70:00"),
        ("0003:00", "0003:00"),
        ("not-a-pci", "not-a-pci"),
        ("", ""),
    ],
)
def test_normalize_pci(pci: str, expected: str) -> None:
    assert normalize_pci(pci) == expected
