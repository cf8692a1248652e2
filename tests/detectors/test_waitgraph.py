"""The wait graph of a communication fault (detectors/waitgraph.py) on multi-node layouts built from
HCCL's documented log formats: the root is the rank the others waited on that waits on nobody; cycles
and several ends give candidates, never a pick."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainmedic.detectors.diagnose import diagnose_paths
from trainmedic.detectors.engine import Engine

ROW = (
    "[ERROR] HCCL(3977573,python):2025-11-22-17:37:04.448.967 [hccl_socket_manager.cc:599] [3977663] "
    "| {dst_ip}({dst}) | 16666 | {src_ip}({src}) | 0 | server | time out | DISABLE |\n"
)
TIMEOUT = (
    "[ERROR] HCCL(3977573,python):2025-11-22-17:37:04.447.996 [hccl_socket_manager.cc:816] [3977663]"
    "[Wait][LinkEstablish]wait socket establish timeout, role[0] rank[{src}] timeout[120 s]\n"
)


def _ip(rank: int) -> str:
    return f"192.168.2.{10 + rank}"


def _layout(tmp_path: Path, waits: list[tuple[int, int]], nodes: int) -> Path:
    for n in range(nodes):
        (tmp_path / f"worker-{n}").mkdir()
    for src, dst in waits:
        plog = tmp_path / f"worker-{src}" / "plog-1_2025.log"
        with plog.open("a", encoding="utf-8") as fh:
            fh.write(TIMEOUT.format(src=src))
            fh.write(ROW.format(dst_ip=_ip(dst), dst=dst, src_ip=_ip(src), src=src))
    for n in range(nodes):
        (tmp_path / f"worker-{n}" / f"rank{n}.log").write_text("step 12 loss 1.0\n", encoding="utf-8")
    return tmp_path


@pytest.mark.parametrize(
    ("waits", "nodes", "root", "chain"),
    [
        pytest.param([(2, 1), (1, 0)], 3, 0, ["rank 2", "rank 1", "rank 0"], id="chain-of-3"),
        pytest.param([(1, 0), (2, 0), (3, 0)], 4, 0, ["rank 1", "rank 0"], id="star-on-0"),
        pytest.param([(i, i - 1) for i in range(15, 0, -1)], 16, 0, [f"rank {i}" for i in range(15, -1, -1)], id="16"),
        pytest.param([(0, 5), (1, 5), (6, 5)], 8, 5, ["rank 0", "rank 5"], id="root-in-the-middle"),
    ],
)
def test_the_root_is_the_rank_waited_on(
    tmp_path: Path, re_engine: Engine, waits: list[tuple[int, int]], nodes: int, root: int, chain: list[str]
) -> None:
    rc = diagnose_paths([str(_layout(tmp_path, waits, nodes))], re_engine).root_cause
    assert rc is not None
    assert rc.fault_class.value == "comm_init"
    assert rc.rank == root
    assert rc.node == f"worker-{root}"  # the root's own node, not the reporter's
    assert rc.chain == chain
    assert rc.candidates == []
    assert " → ".join(chain) in rc.summary.en


@pytest.mark.parametrize(
    ("waits", "candidates"),
    [
        pytest.param([(0, 1), (1, 0)], ["rank 0", "rank 1"], id="cycle-of-2"),
        pytest.param([(0, 1), (1, 2), (2, 0)], ["rank 0", "rank 1", "rank 2"], id="cycle-of-3"),
        pytest.param([(2, 0), (3, 1)], ["rank 0", "rank 1"], id="two-ends"),
    ],
)
def test_an_undecided_graph_lists_candidates_and_picks_none(
    tmp_path: Path, re_engine: Engine, waits: list[tuple[int, int]], candidates: list[str]
) -> None:
    rc = diagnose_paths([str(_layout(tmp_path, waits, 4))], re_engine).root_cause
    assert rc is not None
    assert rc.candidates == candidates
    assert rc.rank is None
    assert rc.chain == []
    assert "candidates" in rc.summary.en


def test_an_ip_only_peer_is_resolved_to_its_rank(tmp_path: Path, re_engine: Engine) -> None:
    # Rank 2 knows rank 1 only by IP (a gloo connection); rank 1's HCCL row says 192.168.2.11 is rank 1
    # and that it waited on rank 0.
    _layout(tmp_path, [(1, 0)], 3)
    (tmp_path / "worker-2" / "rank2.log").write_text(
        "[rank2]: RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:598] "
        f"Connection closed by peer [{_ip(1)}]:54321\n",
        encoding="utf-8",
    )
    rc = diagnose_paths([str(tmp_path)], re_engine).root_cause
    assert rc is not None
    assert rc.rank == 0
    assert rc.chain == ["rank 2", "rank 1", "rank 0"]


def test_notify_wait_timeouts_name_the_remote_rank(tmp_path: Path, re_engine: Engine) -> None:
    for r in (0, 1, 3):
        (tmp_path / f"rank{r}.log").write_text(
            "EI0002: [PID: 2969] 2025-10-11-15:09:34.713.335 The wait execution of the Notify register times "
            "out. Reason: The Notify register has not received the Notify record from remote rank: [2].\n",
            encoding="utf-8",
        )
    rc = diagnose_paths([str(tmp_path)], re_engine).root_cause
    assert rc is not None
    assert rc.fault_class.value == "hang"
    assert rc.rank == 2
    assert rc.chain[-1] == "rank 2"


DETECT = (
    "[ERROR] HCCL(17528,python3):2026-03-18-10:34:43.141.966 [detect_connect_anomalies.cc:132] [18744]This node "
    "(server {me}, device ID {my_dev}) detects that srcRank (server {src}, device ID {src_dev}) fails to connect to "
    "dstRank (server {dst}, device ID {dst_dev}). Continue to analyze the fault based on the logs of srcRank and "
    "dstRank.\n"
)
TRANSPORT = (
    "[ERROR] HCCL(17528,python3):2026-03-18-10:34:43.142.013 [transport_manager.cc:1325] [18744][InitChannelStage]"
    "[Timeout]Transport init error! createLink para:rank[{rank}]-localUserrank[{rank}]-localIpAddr[{src}/{src_dev}], "
    "remoteRank[{peer}]-remoteUserrank[{peer}]-remoteIpAddr[{dst}/{dst_dev}], machineType[1], linkMode[1], "
    "isUsedRdma[0], tag[HcomAllReduce_6629421139219749105_0]\n"
)


def _detect(src: tuple[str, int], dst: tuple[str, int], me: tuple[str, int] | None = None) -> str:
    me = me or src
    return DETECT.format(me=me[0], my_dev=me[1], src=src[0], src_dev=src[1], dst=dst[0], dst_dev=dst[1])


@pytest.mark.parametrize(
    ("reports", "node", "device", "chain"),
    [
        # Two servers probe: each of server .1's devices 1 and 2 cannot reach device 3 of server .2,
        # which itself reports nothing: the root is that device, named by server and device.
        pytest.param(
            {"a": [(("10.0.0.1", 1), ("10.0.0.2", 3)), (("10.0.0.1", 2), ("10.0.0.2", 3))], "b": []},
            "10.0.0.2",
            "3",
            ["10.0.0.1/1", "10.0.0.2/3"],
            id="two-waiters-one-device",
        ),
        # A chain across three servers, reported by a fourth device that is on none of its ends.
        pytest.param(
            {"a": [(("10.0.0.1", 0), ("10.0.0.2", 0))], "b": [(("10.0.0.2", 0), ("10.0.0.3", 5))], "c": []},
            "10.0.0.3",
            "5",
            ["10.0.0.1/0", "10.0.0.2/0", "10.0.0.3/5"],
            id="chain-of-3-servers",
        ),
    ],
)
def test_hccl_connect_detection_names_the_device_others_could_not_reach(
    tmp_path: Path,
    re_engine: Engine,
    reports: dict[str, list[tuple[tuple[str, int], tuple[str, int]]]],
    node: str,
    device: str,
    chain: list[str],
) -> None:
    for folder, pairs in reports.items():
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "plog-1_2026.log").write_text(
            "".join(_detect(src, dst) for src, dst in pairs) or "[INFO] HCCL(1,python3): nothing wrong\n",
            encoding="utf-8",
        )
    rc = diagnose_paths([str(tmp_path)], re_engine).root_cause
    assert rc is not None
    assert (rc.fault_class.value, rc.code) == ("comm_init", "EI0006")
    assert (rc.node, rc.device, rc.rank) == (node, device, None)
    assert rc.chain == chain
    assert rc.candidates == []


def test_hccl_connect_detection_maps_server_and_device_to_the_rank_of_the_transport_line(
    tmp_path: Path, re_engine: Engine
) -> None:
    # Rank 1 (server .1, device 1) timed out towards rank 0 (server .2, device 0); the probe result says
    # the same pair by server and device. One place per rank, not two.
    (tmp_path / "plog-1_2026.log").write_text(
        TRANSPORT.format(rank=1, src="10.0.0.1", src_dev=1, peer=0, dst="10.0.0.2", dst_dev=0)
        + _detect(("10.0.0.1", 1), ("10.0.0.2", 0)),
        encoding="utf-8",
    )
    rc = diagnose_paths([str(tmp_path)], re_engine).root_cause
    assert rc is not None
    assert rc.chain == ["rank 1", "rank 0"]
    assert (rc.rank, rc.node, rc.device) == (0, "10.0.0.2", "0")
    assert [(p.node, p.device) for p in rc.chain_places] == [("10.0.0.1", "1"), ("10.0.0.2", "0")]


def test_hccl_devices_that_could_not_reach_each_other_are_both_candidates(tmp_path: Path, re_engine: Engine) -> None:
    (tmp_path / "plog-1_2026.log").write_text(
        _detect(("10.0.0.1", 1), ("10.0.0.2", 0)) + _detect(("10.0.0.2", 0), ("10.0.0.1", 1)), encoding="utf-8"
    )
    rc = diagnose_paths([str(tmp_path)], re_engine).root_cause
    assert rc is not None
    assert rc.candidates == ["10.0.0.1/1", "10.0.0.2/0"]
    assert [(p.node, p.device) for p in rc.candidate_places] == [("10.0.0.1", "1"), ("10.0.0.2", "0")]
    assert (rc.node, rc.device, rc.rank) == (None, None, None)


AGENT_MISSING = (
    "[ERROR] HCCL(1041085,all_reduce_test):2025-11-21-01:20:01.630.122 [topoinfo_exchange_base.cc:145] [1041085]"
    '[InitGroupStage][RanktableDetect] TopoDetect ERROR occur !!! fault_type[1], fault_info["Failed to connect '
    'agent[{missing},]"]\n'
)


@pytest.mark.parametrize(
    ("missing", "rank", "candidates"),
    [
        pytest.param("2", 2, [], id="one-rank-missing"),
        pytest.param("1,3", None, ["rank 1", "rank 3"], id="two-ranks-missing"),
    ],
)
def test_the_ranks_that_never_reached_the_root_are_the_root_or_its_candidates(
    tmp_path: Path, re_engine: Engine, missing: str, rank: int | None, candidates: list[str]
) -> None:
    for n in range(4):
        (tmp_path / f"worker-{n}").mkdir()
        (tmp_path / f"worker-{n}" / f"rank{n}.log").write_text("step 12 loss 1.0\n", encoding="utf-8")
    (tmp_path / "worker-0" / "plog-1041085_2025.log").write_text(
        AGENT_MISSING.format(missing=missing), encoding="utf-8"
    )
    rc = diagnose_paths([str(tmp_path)], re_engine).root_cause
    assert rc is not None
    assert rc.fault_class.value == "comm_init"
    assert rc.rank == rank and rc.candidates == candidates
    if rank is not None:
        assert rc.node == f"worker-{rank}"
