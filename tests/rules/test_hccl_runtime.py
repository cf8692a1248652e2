"""CANN runtime faults in plog / device-log form (rules/ascend_cann.yaml, rules/ascend_hccl.yaml): an AI
CPU task exception is one root naming its device and operator, not the return code that comes with it;
a runtime exception on an AI Core or vector core is a device exception; an error CQE is an execution
fault naming the local device even when the plog printed only communicator initialisation before it.
Lines as CANN troubleshooting and the HCCL User Guide print them."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainmedic.detectors.diagnose import diagnose_paths
from trainmedic.detectors.engine import Engine

INIT = (
    "[INFO] HCCL(16243,python):2025-11-22-17:37:00.448.967 [op_base.cc:1292] [16243]Entry-HcclCommInitRootInfoInner:"
    "ranks[8], rank[3], rootinfo: host ip[10.0.0.1] port[60000] nicDeploy[1] identifier[10.0.0.1%enp_60000_0_1], "
    "deviceLogicId[3]"
)

CASES = {
    "aicpu": (
        [
            "[ERROR] RUNTIME(16243,python):2025-11-22-17:41:01.790.101 [engine.cc:1103]16282 ReportExceptProc:Task "
            "exception! device_id=3, stream_id=7, task_id=2, type=1, retCode=0x2a, [aicpu exception].",
            "[ERROR] RUNTIME(16243,python):2025-11-22-17:41:01.791.220 [task.cc:777]16282 PrintAicpuErrorInfo:Aicpu "
            "kernel execute failed, device_id=3, stream_id=7, task_id=2, flip_num=0, fault so_name=, fault "
            "kernel_name=, fault op_name=Unique, extend_info=(info_type:4, info_len:6, msg_info:Unique).",
            "[ERROR] RUNTIME(16243,python):2025-11-22-17:41:01.794.500 [api_c.cc:661]16243 rtStreamSynchronize:"
            "[EXEC][DEFAULT]ErrCode=507018, desc=[aicpu exception], InnerCode=0x715002a",
            "[ERROR] RUNTIME(16243,python):2025-11-22-17:41:01.794.532 [error_message_manage.cc:49]16243 "
            "FuncErrorReason:[EXEC][DEFAULT]rtStreamSynchronize execute failed, reason=[aicpu exception]",
        ],
        ("device_error", "aicpu_exception", "3"),
    ),
    "vector-core": (
        [
            "       Kernel task happen error, retCode=0x31, [vector core exception].[FUNC:PreCheckTaskErr]"
            "[FILE:davinci_kernel_task.cc][LINE:1729]",
            "       rtStreamSynchronize execute failed, reason=[vector core exception][FUNC:FuncErrorReason]"
            "[FILE:error_message_manage.cc][LINE:53]",
        ],
        ("device_error", "device_exception", None),
    ),
    "error-cqe-after-init": (
        [
            INIT,
            "[ERROR] ROCE(16243,python):2025-11-22-17:41:12.776.612 [hns_roce_lite.c:630]"
            "hns_roce_lite_handle_error_cqe(630) : error cqe status: 0x15",
            "[ERROR] HCCL(16243,python):2025-11-22-17:41:13.001.310 [task_exception_handler.cc:612] [16243]Execution "
            "Error ROCE CQE(EI0013): An error CQE occurred during operator execution. Local information: server "
            "10.0.0.1, device ID 3, device IP 192.168.1.13. Peer information: server 10.0.0.2, device ID 0, device "
            "IP 192.168.2.10.",
        ],
        ("comm_error", "EI0013", "3"),
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_runtime_fault_root(name: str, tmp_path: Path, re_engine: Engine) -> None:
    lines, (fault_class, code, device) = CASES[name]
    log = tmp_path / "plog-16243_20251122173500123.log"
    log.write_text("".join(f"{line}\n" for line in lines))
    diagnosis = diagnose_paths([str(log)], re_engine)
    rc = diagnosis.root_cause
    assert rc is not None
    assert (rc.fault_class.value, rc.code, rc.device) == (fault_class, code, device)
    # One failure, one non-consequence root: the return code or the other forms never outrank it.
    assert {f.code for f in diagnosis.findings} - {code, "acl:507018"} == set()


ROOTS = {
    # The runtime's side of a notify-wait timeout: a hang on the device that waited, whose origin is
    # elsewhere; the model-stream failure that comes with it is no second cause.
    "notify-wait": (
        [
            "[ERROR] RUNTIME(935255,python):2023-05-11-20:08:58.101.548 [engine.cc:1361]935255 ReportExceptProc:Real "
            "task exception! device_id=2, stream_id=1113, task_id=2, task_type=14 (NOTIFY_WAIT)",
            "[ERROR] RUNTIME(935255,python):2023-05-11-20:08:58.101.557 [engine.cc:1366]935255 ReportExceptProc:Task "
            "exception! device_id=2, stream_id=1867, task_id=1, type=13(MODEL_EXECUTE), failuremode =0, "
            "retCode=0x91, [the model stream execute failed]",
            "[ERROR] RUNTIME(935255,python):2023-05-11-20:08:58.102.344 [task.cc:4106]935255 PrintErrorInfo:Notify "
            "wait execute failed, device_id=2, stream_id=1113, task_id=2, flip_num=0, notify_id=535",
        ],
        ("hang", "EI0002", "2"),
    ),
    # HCCL's consistency check: the ranks' collectives differ; the link setup failures it causes are not
    # the cause, and a restart as is fails the same way (notify the owner).
    "parameter-conflict": (
        [
            INIT,
            "[ERROR] HCCL(3743927,python):2025-10-25-16:11:16.831.640 [rank_consistentcy_checker.cc:429] [3743951]"
            "[InitChannelStage][ParameterConflict]CMD information tag check fail. "
            "local[AllGather_10.0.0.1%enp_60000_0_1], remote[AllReduce_10.0.0.1%enp_60000_0_1]",
            "[ERROR] HCCL(3743927,python):2025-10-25-16:11:16.831.666 [rank_consistentcy_checker.cc:439] [3743951]"
            "[InitChannelStage][ParameterConflict]CMD information cmdType check fail. local[6], remote[2]",
            "[ERROR] HCCL(3743927,python):2025-10-25-16:11:16.842.108 [hccl_communicator_host.cc:6370] [3743951]"
            "[AllocAlgResource]Alloc transports failed, tag[AllGather_10.0.0.1%enp_60000_0_1_device]",
        ],
        ("app_error", "EI0005", None),
    ),
}


# The runtime's SDMA copy failure (EI0012) with the task-exception lines HCCL prints for it: the SDMA
# error is the root, not the notify timeout those lines would otherwise mean.
ROOTS["sdma-runtime"] = (
    [
        "[ERROR] RUNTIME(57096,python3.10):2025-05-12-20:55:44.705.025 [task_info.cc:1170]57288 "
        "PrintSdmaErrorInfoForFftsPlusTask:fftsplus task execute failed, dev_id=5, stream_id=50, task_id=21, "
        "context_id=18, thread_id=0, err_type=4[fftsplus sdma error]",
        "[ERROR] HCCL(57096,python3.10):2025-05-12-20:55:44.706.132 [task_exception_handler.cc:947] [57288]"
        "[TaskExecStage][Timeout][Host]Task run failed, base information is streamID:[32], taskID[21], "
        "tag[AllGather_group_name_0], AlgType(level 0-1-2):[fullmesh-ring-H-D].",
    ],
    ("comm_error", "EI0012", "5"),
)


# A taken port while the communicator is set up: the vendor code (EI0019, with its causes and steps),
# not the catch-all setup failure of the lines around it.
ROOTS["port-taken"] = (
    [
        "[ERROR] HCCL(3626636,all_reduce_test):2025-11-21-13:18:47.639.860 [hccl_socket.cc:110] [3626636]"
        "[InitChannelStage][RanktableDetect] socket type[2], listen on ip[192.168.1.100%enp53s0f2] and specific "
        "port[60000] fail. Please check the port status and whether the port is being used by other process.",
        "[ERROR] HCCL(3626636,all_reduce_test):2025-11-21-13:18:47.639.882 [op_base.cc:1071] [3626636]"
        "[InitGroupStage][RanktableDetect]HcclGetRootInfo failed, ret[7]",
    ],
    ("comm_init", "EI0019", None),
)


@pytest.mark.parametrize("name", sorted(ROOTS))
def test_hccl_root_among_its_consequences(name: str, tmp_path: Path, re_engine: Engine) -> None:
    lines, (fault_class, code, device) = ROOTS[name]
    log = tmp_path / "plog-935255_20230511200800123.log"
    log.write_text("".join(f"{line}\n" for line in lines))
    rc = diagnose_paths([str(log)], re_engine).root_cause
    assert rc is not None
    assert (rc.fault_class.value, rc.code, rc.device) == (fault_class, code, device)
