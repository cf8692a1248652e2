# ruff: noqa: E501
"""Generate udal/cambricon_cnrt_catalog.yaml: every cnrtRet_t of Cambricon CNRT.

Transcribed from cnrt.h (CNRT 6.14.1, CNRT_MAJOR_VERSION 6 / MINOR 14 / PATCH 1): enum cnrtRet_t, each
value with its doc comment ("/*!< ... */"), verbatim.
"""

from __future__ import annotations

from common import row, write

# (name, value, doc comment)
CNRT = [
    ("cnrtSuccess", 0, "The API call returns with no errors."),
    ("cnrtErrorNotReady", 1, "This indicates that the device or resource requested is busy now."),
    ("cnrtErrorInit", 100002, "This indicates that initialization of CNRT fails."),
    ("cnrtErrorNoDevice", 100004, "This indicates that no device is found."),
    (
        "cnrtErrorDeviceInvalid",
        100005,
        "This indicates that the device ordinal passed to the API is out of range [0, cnrtGetDeviceCount() - 1].",
    ),
    (
        "cnrtErrorArgsInvalid",
        100006,
        "This indicates that one of the parameters passed to the API is invalid or out of range.",
    ),
    ("cnrtErrorSys", 100007, "This indicates that it fails to call system API."),
    ("cnrtErrorSysNoMem", 100010, "This indicates that there is insufficient host memory."),
    ("cnrtErrorInvalidResourceHandle", 100014, "This indicates that resource handle passed to the API is invalid."),
    (
        "cnrtErrorIllegalState",
        100015,
        "This indicates that a resource required by the API is not in a valid state to perform the request operation.",
    ),
    ("cnrtErrorNotSupport", 100050, "This indicates that the feature is not supported now."),
    ("cnrtErrorOpsNotPermitted", 100051, "This indicates that the attempted operation is not permitted."),
    ("cnrtErrorQueue", 100060, "This indicates that it fails to get the default queue."),
    ("cnrtErrorNoMem", 100100, "This indicates that there is insufficient MLU device memory."),
    ("cnrtErrorAssert", 100128, "This indicates that a device-side assert is triggered during kernel execution."),
    ("cnrtErrorKernelTrap", 100132, "This indicates that a device-side code proceeds to a specific trap."),
    ("cnrtErrorKernelUserTrap", 100133, "This indicates that a device-side code proceeds to a user specific trap."),
    ("cnrtErrorNotFound", 100301, "This indicates that specific resources are not found."),
    ("cnrtErrorInvalidKernel", 100302, "This indicates that the kernel handle is invalid."),
    (
        "cnrtErrorUnsupportedKernelVersion",
        100303,
        "This indicates that the kernel is compiled with an unsupported toolchain.",
    ),
    ("cnrtErrorNoKernel", 101312, "This indicates that CNCC has not registered the kernel to CNRT."),
    (
        "cnrtErrorNoModule",
        101315,
        "This indicates that CNCC has not registered the module to CNRT or fails to load the module.",
    ),
    (
        "cnrtErrorQueueCaptureUnsupported",
        100360,
        "This indicates that the operation is not permitted when the queue is capturing.",
    ),
    (
        "cnrtErrorQueueCaptureInvalidated",
        100361,
        "This indicates that the current capture sequence on the queue has been invalidated due to previous error.",
    ),
    (
        "cnrtErrorQueueCaptureWrongThread",
        100362,
        "This indicates that the current capture sequence on the queue does not begin with ::cnrtQueueCaptureModeRelaxed mode, and ends in a different thread.",
    ),
    ("cnrtErrorQueueCaptureMerged", 100363, "This indicates that two independent capture sequences are merged."),
    (
        "cnrtErrorQueueCaptureUnjoined",
        100364,
        "This indicates that the capture sequence contains at least a fork that is not joined to the primary queue.",
    ),
    (
        "cnrtErrorQueueCaptureIsolation",
        100365,
        "This indicates that a queue in capture sequence is trying to create a dependency which crosses the queue capture boundary.",
    ),
    (
        "cnrtErrorQueueCaptureUnmatched",
        100366,
        "This indicates that the queue in capture sequence is not the initially captured one.",
    ),
    (
        "cnrtErrorTaskTopoEntityUpdateFailure",
        100400,
        "This indicates that the TaskTopo update is not performed because it includes changes which violate constraints specific to TaskTopo entity update.",
    ),
    (
        "cnrtErrorSetOnActiveProcess",
        632002,
        "This indicates that it fails to set device flag because the process is still active.",
    ),
    ("cnrtErrorDevice", 632006, "This indicates that current resource is not from the current device."),
    ("cnrtErrorNoAttribute", 632009, "This indicates that the attribute queried does not exist."),
    (
        "cnrtErrorMemcpyDirectionInvalid",
        632013,
        "This indicates that memory copying direction passed to the API is not in ::cnrtMemTransDir_t.",
    ),
    ("cnrtErrorBusy", 632014, "Deprecated. This indicates that the device or resource is busy."),
    ("cnrtErrorCndrvFuncCall", 632015, "This indicates that it fails to call CNDrv API."),
    ("cnrtErrorCndevFuncCall", 632017, "This indicates that it fails to call CNDev API."),
    ("cnrtErrorNoCnrtContext", 632019, "This indicates that no CNRT Context is found."),
    ("cnrtErrorCndrvFuncNotFound", 632020, "This indicates that CNDrv API is not found."),
    ("cnrtErrorInvalidSymbol", 632100, "This indicates that the symbol name/identifier passed to the API is invalid."),
    ("cnrtErrorUnknown", 999991, "Unknown error."),
]

CLASS = {
    "cnrtSuccess": (None, "unknown", "ignore"),
    "cnrtErrorNotReady": (None, "unknown", "ignore"),
    "cnrtErrorInit": ("device_error", "driver", "contact_support"),
    "cnrtErrorNoDevice": ("device_error", "driver", "contact_support"),
    "cnrtErrorSys": ("device_error", "system", "restart_app"),
    "cnrtErrorSysNoMem": ("host_oom", "memory", "restart_app"),
    "cnrtErrorNoMem": ("accelerator_oom", "memory", "restart_app"),
    "cnrtErrorKernelTrap": ("device_error", "application", "restart_app"),
    "cnrtErrorCndrvFuncCall": ("device_error", "driver", "restart_app"),
    "cnrtErrorCndevFuncCall": ("device_error", "driver", "restart_app"),
    "cnrtErrorCndrvFuncNotFound": ("device_error", "driver", "contact_support"),
    "cnrtErrorBusy": ("device_error", "driver", "restart_app"),
    "cnrtErrorUnknown": ("device_error", "unknown", "restart_app"),
}


def main() -> None:
    rows = []
    for name, value, doc in CNRT:
        fault_class, origin, action = CLASS.get(name, ("app_error", "application", "notify_owner"))
        words = doc.rstrip(".").replace("::", "")
        rows.append(
            row(
                f"cnrt:{name}",
                mnemonic=str(value),
                description=doc,
                action=action,
                origin=origin,
                fault_class=fault_class,
                en=f"CNRT returned {name} ({value}): {words}.",
                zh=f"CNRT 返回 {name}（{value}）：{words}。",
                note="cnrtRet_t value and doc comment of cnrt.h; action chosen by trainmedic.",
            )
        )
    header = """# Cambricon CNRT return codes for trainmedic (chip: cambricon). Loaded by udal/cambricon.py with
# cambricon_catalog.yaml.
#
# Source: Cambricon CNRT (Neuware runtime) cnrt.h, enum cnrtRet_t ("Describes the return values of CNRT
#   APIs"), CNRT 6.14.1 (CNRT_MAJOR_VERSION 6, CNRT_MINOR_VERSION 14, CNRT_PATCH_VERSION 1), read from a
#   public copy of the Neuware header (code search); the URL below is the Cambricon SDK documentation root
#   that cambricon_catalog.yaml cites, not a page checked for this table.
#   Code `cnrt:<name>`; mnemonic = the numeric value; description = the enum's doc comment, verbatim.
#   The older CNRT_RET_ERR_* names (cnrtRet_t of CNRT 4.x) were not found and are not listed.
# Cambricon publishes no action bucket: vendor_action is null; action / fault_class / severity / message
#   are trainmedic's. Generated by tools/catalogs/gen_cnrt.py.
"""
    write(
        "cambricon_cnrt_catalog.yaml",
        header,
        {
            "chip": "cambricon",
            "source": {
                "title": "Cambricon CNRT cnrt.h enum cnrtRet_t",
                "url": "https://www.cambricon.com/docs/sdk_1.15.0/",
                "version": "CNRT 6.14.1",
            },
            "action_map": {},
            "entries": rows,
        },
    )


if __name__ == "__main__":
    main()
