"""Generate udal/cambricon_cndev_catalog.yaml (cndevRet_t) and udal/cambricon_cndrv_catalog.yaml (CNresult).

Transcribed from Cambricon's public headers as found by code search: cndev.h (enum cndevRet_t with the
long-form doc comments of recent CNDev releases) and cn_api.h of CNDrv 2.15.5 (CN_MAJOR_VERSION 2,
CN_MINOR_VERSION 15, CN_PATCH_VERSION 5; enum CNresult). Description = the comment's text, verbatim
(joined to one line); "The causes include" lists become `causes`; advice sentences of cndev.h become `steps`.
"""

from __future__ import annotations

from common import row, write

# (name, value, description, steps)
CNDEV = [
    ("CNDEV_SUCCESS", 0, "This indicates that the API has been executed successfully.", []),
    (
        "CNDEV_ERROR_NO_DRIVER",
        1,
        "This indicates that the MLU driver was not loaded or failed to load.",
        [
            "You need to reload the driver.",
            "This error is usually returned by the ::cndevInit call. Make sure the driver is successfully installed.",
        ],
    ),
    (
        "CNDEV_ERROR_LOW_DRIVER_VERSION",
        2,
        "This indicates that the version of MLU driver is below the minimum supported version.",
        [
            "Upgrade the driver to the minimum supported version, which can be obtained by calling ::cndevGetLowestSupportDriverVersion."
        ],
    ),
    (
        "CNDEV_ERROR_UNSUPPORTED_API_VERSION",
        3,
        "This indicates an unsupported or invalid version for this API.",
        [
            "Use the correct version number for the API.",
            "Refer to CNDEV_VERSION_<X> for information about version number.",
        ],
    ),
    (
        "CNDEV_ERROR_UNINITIALIZED",
        4,
        "This indicates that CNDev has not been initialized.",
        ["Make sure that ::cndevInit is successfully called."],
    ),
    (
        "CNDEV_ERROR_INVALID_ARGUMENT",
        5,
        "This indicates invalid value for parameter, such as a NULL pointer or an invalid range of values.",
        [],
    ),
    ("CNDEV_ERROR_INVALID_DEVICE_ID", 6, "This indicates that the device handle is invalid.", []),
    (
        "CNDEV_ERROR_UNKNOWN",
        7,
        "This indicates an unknown internal error.",
        ["Check the health status of the device or the driver."],
    ),
    (
        "CNDEV_ERROR_MALLOC",
        8,
        "This indicates the memory failed to be allocated.",
        ["Make sure there is sufficient memory on the host."],
    ),
    (
        "CNDEV_ERROR_INSUFFICIENT_SPACE",
        9,
        "This indicates that CNDev does not have enough space or resources. Common cases are insufficient host memory for application, insufficient buffer passed in, and insufficient resources for device creation in MIM mode.",
        [],
    ),
    (
        "CNDEV_ERROR_NOT_SUPPORTED",
        10,
        "This indicates that the current operation is not supported. The operation may not be supported by the current platform or the driver. And this operation may not be performed at the current device status. For example, when you perform an operation on physical machines in MIM mode.",
        [
            "You need to check the API constraints, or check the driver version or the platform.",
            "If the requirements are not met, update the environment.",
        ],
    ),
    (
        "CNDEV_ERROR_INVALID_LINK",
        11,
        "This indicates that the link port is invalid.",
        ["Check the link parameter that was passed in to the API."],
    ),
    (
        "CNDEV_ERROR_NO_DEVICES",
        12,
        "This indicates that no usable MLU device is detected because the driver failed to be loaded or the device node failed to be mapped.",
        [
            "Reload the driver or make sure the device node is successfully mapped.",
            "This error is usually returned by ::cndevInit. In this case, make sure the driver is successfully installed.",
        ],
    ),
    (
        "CNDEV_ERROR_NO_PERMISSION",
        13,
        "This indicates that the current user does not have permissions to perform this operation. This error usually occurs when configuration APIs check the privileged permissions.",
        ["Check whether the operation requires the sudo or root account, and check the constraints of the API."],
    ),
    (
        "CNDEV_ERROR_NOT_FOUND",
        14,
        "This indicates that the resources or data to be requested cannot be found. For example, this error occurs when a device handle is not found, which is being obtained through UUID.",
        ["Check the validity of parameters that are passed in and check the drive health status."],
    ),
    (
        "CNDEV_ERROR_IN_USE",
        15,
        "This indicates that the operation cannot be performed because the MLU device is in use. This error occurs only when you call APIs to perform setting, creating, or destroying operations, and it will not appear when you perform information-obtaining operation.",
        [],
    ),
    (
        "CNDEV_ERROR_DUPLICATE",
        16,
        "This indicates that the instance name is duplicated. This error usually occurs when you call configuration APIs. For example, this error is returned when the instance to create based on profile ID already exists. It also occurs when the register count passed to ::cndevRegisteEvents exceeds the upper limit.",
        [],
    ),
    (
        "CNDEV_ERROR_TIMEOUT",
        17,
        "This indicates that a timeout occurs. This error occurs when the operation timed out you call ::cndevEventWait or ::cndevResetDevice. For ::cndevEventWait, it means that no event is reported during the specified timeout. For ::cndevResetDevice, it usually means that the device driver does not run properly.",
        ["In this case, check the device status."],
    ),
    ("CNDEV_ERROR_IN_PROBLEM", 18, "This indicates that MLU device is in problem.", []),
]
CNDEV_CLASS = {
    "CNDEV_SUCCESS": (None, "unknown", "ignore"),
    "CNDEV_ERROR_NO_DRIVER": ("device_error", "driver", "contact_support"),
    "CNDEV_ERROR_LOW_DRIVER_VERSION": ("device_error", "driver", "contact_support"),
    "CNDEV_ERROR_UNKNOWN": ("device_error", "unknown", "contact_support"),
    "CNDEV_ERROR_MALLOC": ("host_oom", "memory", "restart_app"),
    "CNDEV_ERROR_NO_DEVICES": ("device_error", "driver", "contact_support"),
    "CNDEV_ERROR_TIMEOUT": ("device_error", "driver", "contact_support"),
    "CNDEV_ERROR_IN_PROBLEM": ("device_error", "hardware", "isolate_node"),
    "CNDEV_ERROR_IN_USE": ("device_error", "system", "restart_app"),
}

# (name, value, description, causes)
CNDRV = [
    (
        "CN_SUCCESS",
        0,
        "This indicates that the API has been executed successfully. In the query APIs, it also indicates the completion of asynchronous operation (see ::cnQueryQueue and ::cnQueryNotifier).",
        [],
    ),
    (
        "CN_ERROR_NOT_READY",
        1,
        "This indicates that asynchronous operations have not been completed, and it is not an error.",
        [],
    ),
    (
        "CN_ERROR_NOT_INITIALIZED",
        100002,
        "This indicates that CNDrv has not been initialized with ::cnInit or CNDrv fails to be initialized.",
        [],
    ),
    ("CN_ERROR_DEINITIALIZED", 100003, "This indicates that the MLU driver has been uninstalled or broken down.", []),
    ("CN_ERROR_NO_DEVICE", 100004, "This indicates that MLU driver cannot detect any usable MLU device.", []),
    ("CN_ERROR_INVALID_DEVICE", 100005, "This indicates that the device handle is invalid.", []),
    (
        "CN_ERROR_INVALID_VALUE",
        100006,
        "This indicates that parameters passed to this API are not within an acceptable value range.",
        [],
    ),
    ("CN_ERROR_OPERATING_SYSTEM", 100007, "This indicates that an OS call fails.", []),
    (
        "CN_ERROR_SYSTEM_NOT_READY",
        100008,
        "This indicates that the system is not ready to start any MLU task. To continue using MLU, verify that the MLU driver has been installed successfully.",
        [],
    ),
    (
        "CN_ERROR_SYSTEM_DRIVER_MISMATCH",
        100009,
        "This indicates that there is a mismatch between CNDrv and MLU driver.",
        [],
    ),
    ("CN_ERROR_SYSTEM_OUT_OF_MEMORY", 100010, "This indicates that the system cannot allocate enough host memory.", []),
    ("CN_ERROR_INVALID_ADDRESS", 100011, "This indicates that the host address is invalid.", []),
    ("CN_ERROR_FILE_NOT_FOUND", 100012, "This indicates that the specified file cannot be found.", []),
    (
        "CN_ERROR_COMPAT_NOT_SUPPORT_ON_SYSTEM",
        100013,
        "This indicates compatibility problems with the system. The reason may be that cross-generation MLU devices exist among visible MLU devices (the major computing capabilities are different).",
        [],
    ),
    (
        "CN_ERROR_INVALID_HANDLE",
        100014,
        "This indicates that a resource handle passed to the API call is not valid. Resource handles are opaque types like ::CNqueue and ::CNcontext.",
        [],
    ),
    (
        "CN_ERROR_ILLEGAL_STATE",
        100015,
        "This indicates that the resource required by the API call is not in a valid state to perform the request operation.",
        [],
    ),
    (
        "CN_ERROR_ECC_UNCORRECTABLE",
        100016,
        "This indicates that an uncorrectable ECC error was detected during execution.",
        [],
    ),
    (
        "CN_OPS_ERROR_NOT_SUPPORTED",
        100050,
        "This indicates that the operation is not supported on the current system, device or driver.",
        [],
    ),
    ("CN_OPS_ERROR_NOT_PERMITTED", 100051, "This indicates that the operation is not permitted.", []),
    ("CN_OPS_ERROR_TIMEOUT", 100052, "This indicates that the timeout for the operation has lapsed.", []),
    (
        "CN_OPS_ERROR_OUT_OF_RESOURCES",
        100053,
        "This indicates that CNDrv has insufficient resources to do the operation.",
        ["Insufficient MLU memory.", "Insufficient host memory."],
    ),
    (
        "CN_QUEUE_ERROR_INVALID",
        100060,
        "This indicates that the queue handle is invalid.",
        [
            "The queue handle is not created by ::cnCreateQueue() or ::cnCreateQueueWithPriority().",
            "The queue handle is destroyed by calling ::cnDestroyQueue(), or the context of the queue has been destroyed.",
            "The kernels of the queue fail to be executed.",
        ],
    ),
    (
        "CN_QUEUE_ERROR_OUT_OF_RESOURCES",
        100061,
        "This indicates that CNDrv has insufficient resources to create a queue.",
        ["Insufficient MLU memory.", "Insufficient host memory."],
    ),
    (
        "CN_NOTIFIER_ERROR_INVALID",
        100080,
        "This indicates that the notifier handle is invalid.",
        [
            "The notifier handle is not created by ::cnCreateNotifier().",
            "The notifier handle has been destroyed by calling ::cnDestroyNotifier().",
            "The context of the notifier has been destroyed.",
        ],
    ),
    (
        "CN_NOTIFIER_ERROR_OUT_OF_RESOURCES",
        100081,
        "This indicates that CNDrv has insufficient resources to create a notifier.",
        ["Insufficient MLU memory.", "The number of notifiers created exceeds the limit."],
    ),
    ("CN_MEMORY_ERROR_OUT_OF_MEMORY", 100100, "This indicates that CNDrv can not allocate enough MLU memory.", []),
    (
        "CN_MEMORY_ERROR_OUT_OF_PROCESS_MAX_MEMORY",
        100101,
        "This indicates that current MLU memory usage exceeds the maximum MLU memory usage of the current process via the MLU_PROCESS_MAX_MEMORY_USAG environment variable.",
        [],
    ),
    (
        "CN_MEMORY_ERROR_INVALID_ADDRESS",
        100102,
        "This indicates that the MLU address is invalid.",
        [
            "The MLU address is not allocated by ::cnMalloc, ::cnMallocNode, ::cnMallocConstant, ::cnMallocNodeConstant, ::cnZmallocNode, or ::cnZmalloc.",
            "The MLU address is released by calling ::cnFreeHost.",
        ],
    ),
    (
        "CN_INVOKE_ERROR_OUT_OF_RESOURCES",
        100120,
        "This indicates that there are insufficient resources to invoke the kernel.",
        [
            "Insufficient MLU memory for the local memory of this kernel.",
            "The count of the parameters is too large.",
            "The ::KernelClass of the kernel is so large that the current device is not supported. See the device attribute ::CN_DEVICE_ATTRIBUTE_MAX_CLUSTER_COUNT_PER_UNION_TASK for more information.",
        ],
    ),
    (
        "CN_INVOKE_ERROR_EXECUTED_TIMEOUT",
        100121,
        "This indicates that the kernel takes too long to execute.",
        ["The argument of the kernel is invalid.", "The instruction of the kernel is invalid."],
    ),
    (
        "CN_INVOKE_ERROR_TIMEOUT",
        100122,
        "This indicates that the kernel takes too long to invoke.",
        [
            "The current queue is full and there are too many kernels to execute.",
            "The argument of the kernel is invalid.",
        ],
    ),
    (
        "CN_INVOKE_ERROR_ILLEGAL_INSTRUCTION",
        100123,
        "This indicates that while executing a kernel, the device runs into an illegal instruction.",
        [],
    ),
    (
        "CN_INVOKE_ERROR_ADDRESS_SPACE",
        100124,
        "This indicates that while executing a kernel, the device runs into an instruction that will use an MLU memory address (global or local) that is not allowed address space.",
        [],
    ),
    (
        "CN_INVOKE_NO_TINYCORE",
        100125,
        "This indicates that an error occurs on the device with tiny core disabled when executing a kernel.",
        [],
    ),
    ("CN_INVOKE_ERROR_INVALID_PC", 100126, "This indicates that the instruction is illegal when fetched.", []),
    (
        "CN_INVOKE_ERROR_ILLEGAL_OPERAND",
        100127,
        "This indicates that while executing a kernel, the device runs into an instruction that has illegal operand.",
        [],
    ),
    (
        "CN_INVOKE_ERROR_ASSERT",
        100128,
        "This indicates that a device-side assert is triggered during kernel execution.",
        [],
    ),
    (
        "CN_INVOKE_ERROR_MEMORY_MISALIGNED_ADDRESS",
        100130,
        "This indicates that while executing a kernel, the device runs into an instruction that uses a misaligned MLU memory address.",
        [],
    ),
    (
        "CN_INVOKE_ERROR_MEMORY_ILLEGAL_ADDRESS",
        100131,
        "This indicates that while executing a kernel, the device runs into an instruction that uses an illegal MLU memory address (global or local).",
        [],
    ),
    (
        "CN_INVOKE_ERROR_KERNEL_TRAP",
        100132,
        "This indicates that while executing a kernel, the device-side code proceeds to a specific trap.",
        [],
    ),
    (
        "CN_INVOKE_ERROR_KERNEL_USER_TRAP",
        100133,
        "This indicates that while executing a kernel, the device-side code proceeds to a user specific trap.",
        [],
    ),
    ("CN_INVOKE_ERROR_STACK_OVERFLOW", 100134, "This indicates that it exceeds the stack size limit.", []),
    (
        "CN_INVOKE_ERROR_OUT_OF_RANGE_ADDRESS",
        100135,
        "This indicates that while executing a kernel, the device runs into an instruction that will use an MLU memory address (global or local) that is out of current space range.",
        ["address is out of range.", "address adding offset is out of range."],
    ),
    ("CN_INVOKE_ERROR_NAN", 100136, "This indicates that the device encounters NaN.", []),
    ("CN_INVOKE_ERROR_POSITIVE_INF", 100137, "This indicates that the device encounters positive infinity.", []),
    ("CN_INVOKE_ERROR_NEGATIVE_INF", 100138, "This indicates that the device encounters negative infinity.", []),
    ("CN_INVOKE_ERROR", 100200, "This indicates that an exception occurs on the device when executing a kernel.", []),
    (
        "CN_CONTEXT_ERROR_INVALID",
        100201,
        "This mostly indicates that the current thread is not bound to a valid context. This also indicates that the context handle is invalid.",
        [
            "It fails to call ::cnCtxCreate() or ::cnCtxSetCurrent() to bind the context to the current thread.",
            "The context bound to the current thread has been destroyed by calling ::cnCtxDestroy().",
            "The context handle has not been created by ::cnCtxCreate().",
            "The context handle has been destroyed by ::cnCtxDestroy().",
        ],
    ),
    (
        "CN_CONTEXT_ERROR_OUT_OF_RESOURCES",
        100202,
        "This indicates that CNDrv has insufficient resources to create a context.",
        ["Insufficient thread key.", "Insufficient MLU memory."],
    ),
    ("CN_ERROR_INVALID_FATBIN", 100300, "This indicates that the fat binary compilation fails.", []),
    ("CN_ERROR_NOT_FOUND", 100301, "This indicates that the specified symbol is not found.", []),
    (
        "CN_ERROR_INVALID_KERNEL",
        100302,
        "This indicates that the kernel handle is invalid.",
        ["The kernel handle is not acquired by ::cnModuleGetKernel."],
    ),
    (
        "CN_FATBIN_ERROR_UNSUPPORTED_VERSION",
        100303,
        "This indicates that the fat binary is compiled with an unsupported toolchain.",
        [],
    ),
    ("CN_FATBIN_ERROR_NO_KERNEL", 101312, "This indicates that the fat binary source is invalid.", []),
    ("CN_FATBIN_INVALID_IMAGE", 101313, "This indicates that the fat binary image is invalid.", []),
    ("CN_FATBIN_LIBCNBIN_NOT_FOUND", 101314, "This indicates that CNBin library is not found.", []),
    (
        "CN_FATBIN_INVALID_ARCH",
        101315,
        "This indicates that the architecture option passed into CNCC when compiling does not match the current MLU platform.",
        [],
    ),
    (
        "CN_ERROR_QUEUE_CAPTURE_UNSUPPORTED",
        100360,
        "This indicates that the operation is not permitted when the queue is capturing.",
        [],
    ),
    (
        "CN_ERROR_QUEUE_CAPTURE_INVALIDATED",
        100361,
        "This indicates that the current capture sequence on the queue has been invalidated due to previous error.",
        [],
    ),
    (
        "CN_ERROR_QUEUE_CAPTURE_WRONG_THREAD",
        100362,
        "This indicates that the current capture sequence on the queue does not begin with the CN_QUEUE_CAPTURE_MODE_RELAXED mode, and ends in a different thread.",
        [],
    ),
    ("CN_ERROR_QUEUE_CAPTURE_MERGED", 100363, "This indicates that two independent capture sequences are merged.", []),
    (
        "CN_ERROR_QUEUE_CAPTURE_UNJOINED",
        100364,
        "This indicates that the capture sequence contains at least a fork that is not joined to the primary queue.",
        [],
    ),
    (
        "CN_ERROR_QUEUE_CAPTURE_ISOLATION",
        100365,
        "This indicates that a queue in capture sequence is trying to create a dependency which crosses the queue capture boundary.",
        [],
    ),
    (
        "CN_ERROR_QUEUE_CAPTURE_UNMATCHED",
        100366,
        "This indicates that the queue in capture sequence is not the initially captured one.",
        [],
    ),
    (
        "CN_ERROR_TASK_TOPO_ENTITY_UPDATE_FAILURE",
        100400,
        "This indicates that the TaskTopo update is not performed because it includes changes which violate constraints specific to TaskTopo entity update.",
        [],
    ),
    (
        "CN_NCS_ACK_TASK_TIMEOUT",
        101410,
        "This indicates that the NCS task experiences timeout. You can set the timeout period.",
        [],
    ),
    ("CN_NCS_ACK_QP_INVALID", 101411, "This indicates that the QPair is invalid.", []),
    ("CN_NCS_ACK_QP_BUSY", 101412, "This indicates that the QPair is busy.", []),
    ("CN_NCS_ACK_QP_NOT_EXISTS", 101413, "This indicates that the QPair does not exist.", []),
    ("CN_NCS_ACK_TEMPLATE_INVALID", 101414, "This indicates that the template is invalid.", []),
    ("CN_NCS_ACK_TEMPLATE_NOT_EXISTS", 101415, "This indicates that the template does not exist.", []),
    ("CN_NCS_ACK_PARAM_INVALID", 101416, "This indicates that the parameter is invalid when launching a task.", []),
    (
        "CN_NCS_ACK_DECS_CNT_ERR",
        101417,
        "This indicates that the counts of descriptions are invalid.",
        ["The counts of descriptions of receive task and send task are not equal."],
    ),
    ("CN_NCS_ACK_SRC_ADDR_ERR", 101418, "This indicates that the source address of send task is invalid.", []),
    ("CN_NCS_ACK_DST_ADDR_ERR", 101419, "This indicates that the destination address of receive task is invalid.", []),
    ("CN_NCS_ACK_KERNEL_ERR", 101420, "This indicates that the kernel is invalid.", []),
    (
        "CN_NCS_ACK_TRIGGER_CNT_ERR",
        101421,
        "This indicates that the trigger count of send task is not as expected.",
        [],
    ),
    ("CN_NCS_ACK_REMOTE_ERR", 101422, "This indicates that the remote task of the current task experiences error.", []),
    ("CN_NCS_ACK_LINK_UNCORR_ERR", 101423, "This indicates some mistakes that cannot be corrected on link layer.", []),
    (
        "CN_NCS_ACK_LINK_ERR",
        101424,
        "This indicates that a link error occurs when a task is running.",
        ["The SerDes error.", "CN_NCS_ACK_LINK_UNCORR_ERR."],
    ),
    ("CN_NCS_ACK_TASK_EXIST", 101425, "This indicates that the NCS tasks already exist.", []),
    ("CN_NCS_ACK_TASK_TYPE_INVALID", 101426, "This indicates that the type of NCS tasks is invalid.", []),
    (
        "CN_NCS_ACK_DESC_NOT_MATCH",
        101427,
        "This indicates that descriptions do not match.",
        [
            "The counts of descriptions of receive task and send task are not equal.",
            "The total data sizes of descriptions of receive task and send task are not equal.",
        ],
    ),
    ("CN_NCS_ACK_OTHER", 101449, "This indicates other errors.", []),
    ("CN_TCDP_ACK_INTERNAL_ERROR", 101450, "This indicates an internal fatal error of TCDP.", []),
    ("CN_TCDP_ACK_TCDP_HANDLE_INVALID", 101451, "This indicates the TCDP handle is invalid.", []),
    ("CN_TCDP_ACK_TCDP_NO_RESOURCE", 101452, "This indicates that there is no slot resource left for TCDP.", []),
    (
        "CN_TCDP_ACK_TCDP_RESEND_EXCEED_MAX_NUM",
        101453,
        "This indicates that TCDP resend cnt exceeds max resend cnt.",
        [],
    ),
    ("CN_TCDP_ACK_TCDP_PROXY_ERROR", 101454, "This indicates a TCDP proxy error.", []),
    ("CN_TCDP_ACK_TCDP_FATAL_ERROR", 101455, "This indicates a TCDP fatal error.", []),
    ("CN_TCDP_ACK_OTHER", 101500, "This indicates other TCDP errors.", []),
    ("CN_NCS_HW_ERROR", 101600, "This indicates hardware error.", []),
    ("CN_NCS_PORT_NOT_IN_RANGE", 101601, "This indicates that the port ID is not in the range.", []),
    (
        "CN_NCS_PORT_LINK_ERR",
        101602,
        "This indicates link error when creating/modifing a QPair.",
        [
            "The SerDes link error.",
            "The port is not enabled or configured.",
            "QP socket client connect failed.",
            "CN_NCS_ACK_LINK_UNCORR_ERR.",
        ],
    ),
    (
        "CN_NCS_QP_CREATE_PARAM_INVALID",
        101603,
        "This indicates that the parameter is invalid when creating a QPair.",
        [],
    ),
    (
        "CN_NCS_QP_CREATE_NO_RESOURCE",
        101604,
        "This indicates that the hardware has no resource when creating a QPair.",
        [],
    ),
    ("CN_NCS_QP_MODIFY_PAIRING", 101605, "This indicates that the QPair modify timeout.", []),
    ("CN_NCS_QP_MODIFY_LQP_INVALID", 101606, "This indicates that the local QPair is invalid.", []),
    ("CN_NCS_QP_MODIFY_RQP_INVALID", 101607, "This indicates that the remote QPair is invalid.", []),
    (
        "CN_NCS_QP_MODIFY_NO_RESOURCE",
        101608,
        "This indicates that the hardware has no resource when modifying a QPair.",
        [],
    ),
    (
        "CN_NCS_QP_DESTROY_PARAM_INVALID",
        101609,
        "This indicates that the parameter is invalid when destroying a QPair.",
        [],
    ),
    ("CN_NCS_QP_DESTROY_NOT_EXISTS", 101610, "This indicates that the QPair does not exist.", []),
    ("CN_NCS_QP_DESTROY_BUSY", 101611, "This indicates that the QPair is busy.", []),
    ("CN_NCS_QP_DESTROY_USER_INVALID", 101612, "This indicates that the QPair user is not expected.", []),
    (
        "CN_NCS_TEMPLATE_CREATE_PARAM_INVALID",
        101613,
        "This indicates that the parameter is invalid when creating a template.",
        [],
    ),
    (
        "CN_NCS_TEMPLATE_CREATE_NO_RESOURCE",
        101614,
        "This indicates that the hardware has no resource when creating a template.",
        [],
    ),
    (
        "CN_NCS_TEMPLATE_CREATE_LOAD_ERR",
        101615,
        "This indicates template loading error.",
        ["Hardware error.", "CN_NCS_TEMPLATE_CREATE_PARAM_INVALID."],
    ),
    (
        "CN_NCS_TEMPLATE_DESTROY_PARAM_INVALID",
        101616,
        "This indicates that the parameter is invalid when destroying a template.",
        [],
    ),
    ("CN_NCS_TEMPLATE_DESTROY_NOT_EXISTS", 101617, "This indicates that the template does not exist.", []),
    (
        "CN_NCS_TEMPLATE_DESTROY_BUSY",
        101618,
        "This indicates that the template is busy.",
        ["The template is occupied by other NCS tasks."],
    ),
    (
        "CN_NCS_TEMPLATE_DESTROY_USER_INVALID",
        101619,
        "This indicates that the user of the template is not expected.",
        [],
    ),
    ("CN_NCS_PORT_OB_DISABLED", 101620, "This indicates that the port is disabled based on external setting.", []),
    ("CN_NCS_PORT_IB_DISABLED", 101621, "This indicates that the port is disabled based on internal setting.", []),
    ("CN_NCS_PORT_DISABLED", 101622, "This indicates that the port is disabled.", []),
    ("CN_NCS_UNSUPPORT", 101623, "This indicates that NCS is not supported on current platform.", []),
    (
        "CN_NCS_GET_LQP_INVALID",
        101624,
        "This indicates that the QPair parameter passed in is invalid when QPair error is injected",
        [],
    ),
    (
        "CN_NCS_INPLACEBUFF_IS_NOT_CONTINUOUS_ERROR",
        101625,
        "This indicates that the physical address of the inplace buffer is not continuous.",
        [],
    ),
    (
        "CN_NCS_QP_IS_INJECTING_ERROR",
        101626,
        "This indicates that the QPair error injection fails. QPair status and link should be checked..",
        [],
    ),
    ("CN_TCDP_HW_ERROR", 101700, "This result indicates hardware error.", []),
    ("CN_TCDP_NO_RESOURCE", 101701, "This result indicates that there is no slot resource left for TCDP.", []),
    (
        "CN_TCDP_INVALID_PARAM",
        101702,
        "This result indicates that a parameter passed to the TCDP API call is not valid.",
        [],
    ),
    ("CN_TCDP_SLOT_NOT_EXIST", 101703, "This result indicates that slot in TCDP handle does not exist.", []),
    ("CN_TCDP_USER_INVALID", 101704, "This result indicates that the TCDP handle does not belong to current user.", []),
    ("CN_TCDP_QP_BUSY", 101705, "This result indicates that the QP is busy.", []),
    ("CN_TCDP_UNSUPPORT", 101706, "This result indicates that TCDP is not supported on current platform.", []),
    ("CN_NCS_UPDATE_TOPOLOGY", 101800, "This result indicates that an error occurs when updating topology.", []),
    ("CN_NCS_LAUNCH_KERNEL", 101801, "This indicates that an error occurs when launching a kernel.", []),
    ("CN_NCS_GET_PORT_INFO", 101802, "This indicates that an error occurs when getting port information.", []),
    ("CN_NCS_GET_DEVICE_UUID", 101803, "This indicates that an error occurs when getting the device UUID.", []),
    ("CN_NCS_PORT_ID_INVALID", 101804, "This indicates that the port ID is invalid.", []),
    ("CN_NCS_DESC_INVALID", 101805, "This indicates that the task description is invalid.", []),
    ("CN_NCS_ERROR", 101898, "This indicates unknown error of NCS.", []),
    ("CN_NCS_INTERNAL_ERROR", 101899, "This indicates internal fatal error of NCS.", []),
    ("CN_ERROR_UNKNOWN", 200000, "This indicates an unknown error.", []),
]
CNDRV_CLASS = {
    "CN_SUCCESS": (None, "unknown", "ignore"),
    "CN_ERROR_NOT_READY": (None, "unknown", "ignore"),
    "CN_ERROR_NOT_INITIALIZED": ("device_error", "driver", "contact_support"),
    "CN_ERROR_DEINITIALIZED": ("device_error", "driver", "reboot_node"),
    "CN_ERROR_NO_DEVICE": ("device_error", "driver", "contact_support"),
    "CN_ERROR_OPERATING_SYSTEM": ("device_error", "system", "restart_app"),
    "CN_ERROR_SYSTEM_NOT_READY": ("device_error", "driver", "contact_support"),
    "CN_ERROR_SYSTEM_DRIVER_MISMATCH": ("device_error", "driver", "contact_support"),
    "CN_ERROR_SYSTEM_OUT_OF_MEMORY": ("host_oom", "memory", "restart_app"),
    "CN_ERROR_COMPAT_NOT_SUPPORT_ON_SYSTEM": ("device_error", "system", "contact_support"),
    "CN_ERROR_ECC_UNCORRECTABLE": ("device_error", "hardware", "reset_device"),
    "CN_OPS_ERROR_TIMEOUT": ("hang", "unknown", "restart_app"),
    "CN_OPS_ERROR_OUT_OF_RESOURCES": ("accelerator_oom", "memory", "restart_app"),
    "CN_QUEUE_ERROR_OUT_OF_RESOURCES": ("accelerator_oom", "memory", "restart_app"),
    "CN_NOTIFIER_ERROR_OUT_OF_RESOURCES": ("accelerator_oom", "memory", "restart_app"),
    "CN_CONTEXT_ERROR_OUT_OF_RESOURCES": ("accelerator_oom", "memory", "restart_app"),
    "CN_MEMORY_ERROR_OUT_OF_MEMORY": ("accelerator_oom", "memory", "restart_app"),
    "CN_MEMORY_ERROR_OUT_OF_PROCESS_MAX_MEMORY": ("accelerator_oom", "memory", "notify_owner"),
    "CN_INVOKE_ERROR_EXECUTED_TIMEOUT": ("device_error", "application", "restart_app"),
    "CN_INVOKE_ERROR_TIMEOUT": ("hang", "unknown", "restart_app"),
    "CN_INVOKE_ERROR": ("device_error", "unknown", "restart_app"),
    "CN_ERROR_UNKNOWN": ("device_error", "unknown", "restart_app"),
    "CN_NCS_HW_ERROR": ("device_error", "interconnect", "reset_device"),
    "CN_TCDP_HW_ERROR": ("device_error", "interconnect", "reset_device"),
    "CN_NCS_ACK_LINK_UNCORR_ERR": ("comm_error", "interconnect", "reset_device"),
    "CN_NCS_ACK_LINK_ERR": ("comm_error", "interconnect", "restart_app"),
    "CN_NCS_PORT_LINK_ERR": ("comm_error", "interconnect", "restart_app"),
    "CN_NCS_ACK_REMOTE_ERR": ("comm_error", "interconnect", "restart_app"),
    "CN_NCS_ACK_TASK_TIMEOUT": ("hang", "interconnect", "restart_app"),
    "CN_NCS_QP_MODIFY_PAIRING": ("comm_init", "interconnect", "restart_app"),
}
for _n in (
    "ILLEGAL_INSTRUCTION",
    "ADDRESS_SPACE",
    "INVALID_PC",
    "ILLEGAL_OPERAND",
    "MEMORY_MISALIGNED_ADDRESS",
    "MEMORY_ILLEGAL_ADDRESS",
    "KERNEL_TRAP",
    "STACK_OVERFLOW",
    "OUT_OF_RANGE_ADDRESS",
    "NAN",
    "POSITIVE_INF",
    "NEGATIVE_INF",
):
    CNDRV_CLASS[f"CN_INVOKE_ERROR_{_n}"] = ("device_error", "application", "restart_app")
CNDRV_CLASS["CN_INVOKE_ERROR_ASSERT"] = ("app_error", "application", "notify_owner")
CNDRV_CLASS["CN_INVOKE_ERROR_KERNEL_USER_TRAP"] = ("app_error", "application", "notify_owner")


def _words(text: str) -> str:
    return text.replace("::", "").rstrip(".")


def main() -> None:
    rows = []
    for name, value, desc, steps in CNDEV:
        fault_class, origin, action = CNDEV_CLASS.get(name, ("app_error", "application", "notify_owner"))
        first = desc.split(". ")[0].rstrip(".")
        rows.append(
            row(
                f"cndev:{name}",
                mnemonic=str(value),
                description=desc,
                action=action,
                origin=origin,
                fault_class=fault_class,
                en=f"CNDev returned {name} ({value}): {_words(first)}.",
                zh=f"CNDev 返回 {name}（{value}）：{_words(first)}。",
                note="cndevRet_t value and doc comment of cndev.h; action chosen by trainmedic.",
                steps=steps or None,
            )
        )
    header = """# Cambricon CNDev return codes for trainmedic (chip: cambricon). Loaded by udal/cambricon.py with
# cambricon_catalog.yaml.
#
# Source: Cambricon CNDev (device management library) cndev.h, enum cndevRet_t (CNDEV_SUCCESS ..
#   CNDEV_ERROR_IN_PROBLEM = 18) with its doc comments, read from a public copy of the header (code
#   search); the URL below is the Cambricon SDK documentation root that cambricon_catalog.yaml cites.
#   Code `cndev:<CNDEV_* name>`; mnemonic = the numeric value; description = the comment's statement,
#   steps = its advice sentences, verbatim. The CNDev xid / event table was NOT found: the rows
#   cndev:XID_ERROR, MLULINK_DOWN and DBE_VIOLATION stay inferred rows of cambricon_catalog.yaml.
# No vendor bucket: vendor_action is null; action / fault_class / severity / message are trainmedic's.
# Generated by tools/catalogs/gen_cambricon.py.
"""
    body = {
        "chip": "cambricon",
        "source": {
            "title": "Cambricon CNDev cndev.h enum cndevRet_t",
            "url": "https://www.cambricon.com/docs/sdk_1.15.0/",
            "version": "cndev.h with CNDEV_ERROR_IN_PROBLEM (18)",
        },
        "action_map": {},
        "entries": rows,
    }
    write("cambricon_cndev_catalog.yaml", header, body)

    rows = []
    for name, value, desc, causes in CNDRV:
        fault_class, origin, action = CNDRV_CLASS.get(name, ("app_error", "application", "notify_owner"))
        first = desc.split(". ")[0].rstrip(".")
        rows.append(
            row(
                f"cndrv:{name}",
                mnemonic=str(value),
                description=desc,
                action=action,
                origin=origin,
                fault_class=fault_class,
                en=f"CNDrv returned {name} ({value}): {_words(first)}.",
                zh=f"CNDrv 返回 {name}（{value}）：{_words(first)}。",
                note="CNresult value and doc comment of cn_api.h; action chosen by trainmedic.",
                causes=causes or None,
            )
        )
    header = """# Cambricon CNDrv (driver API) return codes for trainmedic (chip: cambricon). Loaded by udal/cambricon.py
# with cambricon_catalog.yaml.
#
# Source: Cambricon CNDrv cn_api.h, enum CNresult ("The return values for CNDrv APIs"), CNDrv 2.15.5
#   (CN_MAJOR_VERSION 2, CN_MINOR_VERSION 15, CN_PATCH_VERSION 5), read from a public copy of the header
#   (code search); the URL below is the Cambricon SDK documentation root that cambricon_catalog.yaml cites.
#   Code `cndrv:<CN_* name>`; mnemonic = the numeric value; description = the doc comment, verbatim;
#   its "The causes include" items = causes.
# No vendor bucket: vendor_action is null; action / fault_class / severity / message are trainmedic's.
# Generated by tools/catalogs/gen_cambricon.py.
"""
    body = {
        "chip": "cambricon",
        "source": {
            "title": "Cambricon CNDrv cn_api.h enum CNresult",
            "url": "https://www.cambricon.com/docs/sdk_1.15.0/",
            "version": "CNDrv 2.15.5",
        },
        "action_map": {},
        "entries": rows,
    }
    write("cambricon_cndrv_catalog.yaml", header, body)


if __name__ == "__main__":
    main()
