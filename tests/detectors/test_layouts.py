"""Root cause down to node, device and rank on multi-node collections (tests/data/layouts, built from
the vendors' documented log formats; see its README). For each, the node, device and rank the root
must name, or "ambiguous" with its candidates: a false root cordons a healthy node."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from paths import DATA

from trainmedic.agent.cli import main
from trainmedic.detectors.diagnose import diagnose_paths, expand_inputs
from trainmedic.detectors.engine import Engine
from trainmedic.detectors.layout import Layout

LAYOUTS = DATA / "layouts"
AMBIGUOUS = "ambiguous"

# name: (fault_class, code, node, device, rank, chain) or (fault_class, code, AMBIGUOUS, candidates)
EXPECTED: dict[str, tuple[object, ...]] = {
    # Three ranks' LINK_ERROR_INFO rows name rank 3, whose plog says nothing: the rank table puts it
    # on node-b device 1.
    "ascend-2n-link-timeout": ("comm_init", "EI0006", "node-b", "1", 3, ["rank 0", "rank 3"]),
    # Sixteen nodes, each waiting on the one before: the end of the chain.
    "ascend-16n-chain": ("comm_init", "EI0006", "node-00", "0", 0, [f"rank {i}" for i in range(15, -1, -1)]),
    # A cycle: every member is a candidate, none is picked.
    "ascend-3n-cycle": ("comm_init", "EI0006", AMBIGUOUS, ["rank 0", "rank 1", "rank 2"]),
    # Two separate ends: both candidates.
    "ascend-4n-ambiguous": ("comm_init", "EI0006", AMBIGUOUS, ["rank 1", "rank 3"]),
    # A device error in node-c's device log (device 1: its folder; rank 5: the rank table); the
    # other ranks only time out (EI0002 naming remote rank 5) and are its evidence.
    "ascend-4n-device-error": ("device_error", "0x80C98000", "node-c", "1", 5, []),
    # node-b device 1 (rank 3) runs out of RoCE retransmissions (error CQE, EI0013, in its plog);
    # ranks 0 and 5 only time out waiting on rank 3 (EI0002): the link error is the root, the
    # timeouts its evidence.
    "ascend-3n-link-error": ("comm_error", "EI0013", "node-b", "1", 3, ["rank 0", "rank 3"]),
    # Peers known only by a host IP (gloo's "Connection closed by peer"): the rank table's server
    # with that IP is node-c (its device IPs are node-c's hccn_tool outputs), rank 2.
    "ascend-4n-ip-only-peer": ("comm_error", "peer_closed", "node-c", "0", 2, ["rank 0", "rank 2"]),
    # The host's filesystem went read-only: a node-level root, no device or rank.
    "host-2n-readonly-fs": ("storage_error", "fs_error", "node-b", None, None, []),
    # Benign host lines (link up, zero corrected errors, a conntrack notice) never become the root.
    "host-2n-benign-lines": ("accelerator_oom", "npu_oom", "node-b", "1", 3, []),
    # Older HCCL "abnormal device" lines on every waiting rank name serverId 10.40.0.2 (a host IP of
    # the rank table: node-b) and deviceId 1: rank 3, which printed nothing.
    "ascend-2n-abnormal-device": ("hang", "hccl_heartbeat_lost", "node-b", "1", 3, []),
    # NCCL INFO lines map host gpu-b's GPU at bus 3b000 (cudaDev 1) to rank 3: Xid 79 names rank 3.
    "nvidia-2n-xid79": ("device_error", "xid:79", "node-b", "0000:3b:00", 3, []),
}


def test_every_fixture_has_an_expectation() -> None:
    assert sorted(p.name for p in LAYOUTS.iterdir() if p.is_dir()) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_root_names_node_device_rank(name: str, re_engine: Engine) -> None:
    rc = diagnose_paths([str(LAYOUTS / name)], re_engine).root_cause
    assert rc is not None
    want = EXPECTED[name]
    assert (rc.fault_class.value, rc.code) == want[:2]
    if want[2] == AMBIGUOUS:
        assert rc.candidates == want[3]
        assert rc.rank is None
        assert rc.chain == []
        assert [p.place for p in rc.candidate_places] == want[3]
        return
    node, device, rank, chain = want[2:]
    assert (rc.node, rc.device, rc.rank) == (node, device, rank)
    assert rc.chain == chain
    assert rc.candidates == []
    if chain:
        assert rc.chain_places[-1].node == node
        assert rc.chain_places[-1].device == device


@pytest.mark.parametrize(
    ("name", "root_codes", "waiting"),
    [
        # The device error and the link error are the root; every timeout naming them is evidence.
        ("ascend-4n-device-error", {"0x80C98000"}, {0, 1, 2, 3, 4, 6, 7}),
        ("ascend-3n-link-error", {"EI0013"}, {0, 5}),
    ],
)
def test_peer_timeouts_are_evidence_not_roots(
    name: str, root_codes: set[str], waiting: set[int], re_engine: Engine
) -> None:
    diagnosis = diagnose_paths([str(LAYOUTS / name)], re_engine)
    assert diagnosis.root_cause is not None
    assert diagnosis.root_cause.code in root_codes
    timeouts = [f for f in diagnosis.findings if f.code == "EI0002"]
    assert {f.rank for f in timeouts} == waiting
    assert all(f.consequence_of == diagnosis.root_cause.code for f in timeouts)
    assert all(f.consequence_of is None for f in diagnosis.findings if f.code in root_codes)


@pytest.mark.parametrize(
    ("name", "lang", "expected"),
    [
        pytest.param(
            "ascend-2n-link-timeout",
            "en",
            "rank 0 (node node-a, device 0) -> rank 3 (node node-b, device 1)",
            id="chain-en",
        ),
        pytest.param(
            "ascend-2n-link-timeout",
            "zh",
            "rank 0（节点 node-a，设备 0） -> rank 3（节点 node-b，设备 1）",
            id="chain-zh",
        ),
        pytest.param(
            "ascend-3n-cycle",
            "en",
            "rank 0 (node node-a, device 0), rank 1 (node node-b, device 0)",
            id="candidates-en",
        ),
        pytest.param("ascend-3n-cycle", "zh", "候选根因", id="candidates-zh"),
    ],
)
def test_text_report_shows_chain_and_candidates(
    name: str, lang: str, expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["diagnose", "--logs", str(LAYOUTS / name), "--lang", lang]) == 0
    assert expected in capsys.readouterr().out


@pytest.mark.parametrize("name", ["ascend-2n-link-timeout", "nvidia-2n-xid79"])
def test_json_findings_carry_node_device_rank(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["diagnose", "--logs", str(LAYOUTS / name), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert {"node", "device", "rank"} <= set(doc["findings"][0])
    assert all(f["node"] is not None for f in doc["findings"])
    assert "chain_places" in doc["root_cause"] and "candidate_places" in doc["root_cause"]


@pytest.mark.parametrize(
    ("name", "question", "expected"),
    [
        # npu-smi info's process table: pid 3977003 ran on NPU 1 of node-b.
        pytest.param("ascend-2n-link-timeout", ("pid", "node-b", "3977003"), "1", id="npu-smi-pid"),
        # hccn_tool -i 1 -ip -g on node-b.
        pytest.param("ascend-2n-link-timeout", ("ip", "node-b", "1"), "192.168.11.11", id="hccn-ip"),
        # the rank table, its server placed by its device IPs.
        pytest.param("ascend-4n-ip-only-peer", ("rank", 2), ("node-c", "0"), id="rank-table"),
        # a host IP of the rank table's server (server_id).
        pytest.param("ascend-4n-ip-only-peer", ("where-ip", "10.20.0.13"), "rank 2", id="server-ip"),
        # NCCL INFO: rank 3 on host gpu-b, collected in node-b, cudaDev 1.
        pytest.param("nvidia-2n-xid79", ("rank", 3), ("node-b", "1"), id="nccl-info"),
        pytest.param("nvidia-2n-xid79", ("bus", "node-b", "0000:3b:00"), 3, id="nccl-bus-id"),
        pytest.param("nvidia-2n-xid79", ("host", "gpu-b"), "node-b", id="nccl-host"),
    ],
)
def test_layout_reads_the_tools(name: str, question: tuple[object, ...], expected: object) -> None:
    root = str(LAYOUTS / name)
    layout = Layout(expand_inputs([root]), root)
    kind, *args = question
    if kind == "pid":
        got: object = layout.pid_device.get((str(args[0]), str(args[1])))
    elif kind == "ip":
        got = layout.device_ip.get((str(args[0]), str(args[1])))
    elif kind == "rank":
        place = layout.ranks[int(str(args[0]))]
        got = (place.node, place.device)
    elif kind == "where-ip":
        got = layout.ip_places().get(str(args[0]))
    elif kind == "bus":
        got = layout.rank_of_bus(str(args[0]), str(args[1]))
    else:
        got = layout.node_of(str(args[0]))
    assert got == expected


GROUPED_TABLE = {
    "version": "1.0",
    "status": "completed",
    "server_group_list": [
        {
            "group_id": "2",
            "server_count": "1",
            "server_list": [
                {
                    "server_id": "10.9.0.2",
                    "server_ip": "10.9.0.2",
                    "device": [
                        {"device_id": "3", "device_ip": "192.168.9.3", "device_logical_id": "3", "rank_id": "7"}
                    ],
                }
            ],
        }
    ],
}


@pytest.mark.parametrize(
    ("files", "question", "expected"),
    [
        # hccn_tool output saved one file per device, no command echoed: the device from the file name.
        pytest.param(
            {"w1/environment_check/hccn_tool_i_2.txt": "ipaddr:192.168.5.2\nnetmask:255.255.255.0\n"},
            ("ip", "w1", "2"),
            "192.168.5.2",
            id="hccn-per-file",
        ),
        # MindCluster's global-ranktable (server_group_list): a server no folder is named after keeps
        # its id as its node; its only device's rank is the server IP's.
        pytest.param(
            {"global-ranktable.json": json.dumps(GROUPED_TABLE)}, ("rank", 7), ("10.9.0.2", "3"), id="grouped"
        ),
        pytest.param(
            {"global-ranktable.json": json.dumps(GROUPED_TABLE)}, ("where-ip", "10.9.0.2"), "rank 7", id="server"
        ),
        # A rank table that is not JSON is ignored, not an error.
        pytest.param({"hccl.json": '{"server_list": ['}, ("rank", 0), None, id="broken-table"),
        # An `npu-smi info` device-table row is not a process row.
        pytest.param(
            {
                "w1/npu_smi.txt": "| NPU     Chip              | Process id    |\n"
                "| 0     910B3               | OK            | 93.1 |\n"
            },
            ("pid", "w1", "910"),
            None,
            id="npu-smi-device-row",
        ),
        # NCCL's init line of older releases (no nvmlDev, no commId; NVIDIA/nccl issue 629).
        pytest.param(
            {
                "h1/rank15.log": "h1:193027:193119 [7] NCCL INFO comm 0x7fdf08000d00 rank 15 nranks 16 cudaDev 7 "
                "busId e7000 - Init COMPLETE\n"
            },
            ("bus", "h1", "0000:e7:00"),
            15,
            id="nccl-older-line",
        ),
        # A sub-communicator (a tensor-parallel pair) numbers its members from 0 again: only the world's
        # ranks are global ranks.
        pytest.param(
            {
                "h3/rank1.log": "h3:11:12 [1] NCCL INFO comm 0x1 rank 1 nranks 4 cudaDev 1 busId 2b000\n"
                "h3:11:13 [1] NCCL INFO comm 0x2 rank 0 nranks 2 cudaDev 1 busId 2b000 - Init COMPLETE\n",
                "h3/worker_rank0.log": "h3:10:12 [0] NCCL INFO comm 0x3 rank 0 nranks 4 cudaDev 0 busId 1a000\n",
            },
            ("rank", 0),
            ("h3", "0"),
            id="nccl-sub-communicator",
        ),
        # ... and of recent ones, prefixed with the API (NVIDIA/nccl-tests issue 252).
        pytest.param(
            {
                "h2/x.log": "h2:25146:25827 [0] NCCL INFO ncclCommInitRank comm 0x559d5aa8ca00 rank 4 nranks 8 "
                "cudaDev 0 "
                "nvmlDev 0 busId 42000 commId 0x996ee6f117cb8e1e - Init START\n"
            },
            ("rank", 4),
            ("h2", "0"),
            id="nccl-init-rank-prefix",
        ),
    ],
)
def test_layout_edge_cases(
    tmp_path: Path, files: dict[str, str], question: tuple[object, ...], expected: object
) -> None:
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text, encoding="utf-8")
    layout = Layout(expand_inputs([str(tmp_path)]), str(tmp_path))
    kind, *args = question
    if kind == "ip":
        got: object = layout.device_ip.get((str(args[0]), str(args[1])))
    elif kind == "rank":
        place = layout.ranks.get(int(str(args[0])))
        got = (place.node, place.device) if place else None
    elif kind == "where-ip":
        got = layout.ip_places().get(str(args[0]))
    elif kind == "pid":
        got = layout.pid_device.get((str(args[0]), str(args[1])))
    else:
        got = layout.rank_of_bus(str(args[0]), str(args[1]))
    assert got == expected


CLUSTER_EXCEPTION = (
    "[ERROR]HCCL(835695,all_reduce_test):2025-10-23-17:28:06.049.385[task_exception_handler.cc:610][835695]"
    "Cluster Exception Location[IP/ID]:[127.10.0.1/1], Arrival Time:[Thu Oct 23 17:25:58 2025], "
    "Discoverer:[127.10.0.1/2], ExceptionType:[Heartbeat Lost Occurred], Possible Reason:1. Process has exited, "
    "2. Network Disconnected\n"
)


@pytest.mark.parametrize(
    ("rel", "line", "expected"),
    [
        # NCCL's prefix is the reporter's own host: the file's rank stays.
        pytest.param(
            "node-b/rank3.log",
            "gpu-b:5103:5103 [1] NCCL WARN Cuda failure 'an illegal memory access was encountered'\n",
            ("gpu-b", "1", 3),
            id="nccl-prefix-is-the-reporter",
        ),
        # HCCL names the rank the others waited on: that rank, not the reporter's node and rank.
        pytest.param("node-a/rank2.log", CLUSTER_EXCEPTION, (None, None, 1), id="cluster-exception-is-elsewhere"),
    ],
)
def test_a_line_naming_another_place_is_that_place(
    tmp_path: Path, re_engine: Engine, rel: str, line: str, expected: tuple[object, ...]
) -> None:
    (tmp_path / rel).parent.mkdir(parents=True)
    (tmp_path / rel).write_text("step 1 loss 2.0\n" + line, encoding="utf-8")
    d = diagnose_paths([str(tmp_path)], re_engine)
    f = d.findings[0]
    assert (f.node, f.device, f.rank) == expected
