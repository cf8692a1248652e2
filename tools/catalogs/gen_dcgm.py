"""Generate udal/nvidia_dcgm_catalog.yaml: every DCGM_FR_* health/diagnostic failure code.

Data transcribed from NVIDIA/DCGM: dcgmlib/dcgm_errors.h (enum dcgmError_t with its comments,
the *_MSG message formats and *_NEXT suggestions; 2024 header, codes 0-111) and
dcgmlib/src/dcgm_errors.c (dcgmErrorMeta: severity and category per code; 2025, codes 0-117).
Codes 112-117 have no message or suggestion in the header copy found; their description is the
enum comment of the 2025 list (go-dcgm pkg/dcgm health codes mirror it).
"""

from __future__ import annotations

from common import row, write

TRIAGE = "Run a field diagnostic on the GPU."
COOLING = "Verify that the cooling on this machine is functional, including external, thermal material interface, fans, and any other components."
BUG = "Please capture an nvidia-bug-report and send it to NVIDIA."
SYSTRIAGE = "Check DCGM and system logs for errors. Reset GPU. Restart DCGM. Rerun diagnostics."
CONFIG = "Check DCGM and system configuration. This error may be eliminated with an updated configuration."
DBE_NEXT = "Drain the GPU and reset it or reboot the node."

# (value, name, enum comment, message format, suggestion, severity, category)
D = [
    (0, "OK", "No error", "The operation completed successfully.", "N/A", "UNKNOWN", "NONE"),
    (1, "UNKNOWN", "Unknown error code", "Unknown error.", "", "UNKNOWN", "NONE"),
    (2, "UNRECOGNIZED", "Unrecognized error code", "Unrecognized error code.", "", "UNKNOWN", "NONE"),
    (3, "PCI_REPLAY_RATE", "Unacceptable rate of PCI errors", "Detected more than %u PCIe replays per minute for GPU %u : %d", "Reconnect PCIe card. Run system side PCIE diagnostic utilities to verify hops off the GPU board. If issue is on the board, run the field diagnostic.", "ISOLATE", "HARDWARE_PCIE"),
    (4, "VOLATILE_DBE_DETECTED", "Uncorrectable volatile double bit error", "Detected %d volatile double-bit ECC error(s) in GPU %u.", DBE_NEXT, "ISOLATE", "HARDWARE_MEMORY"),
    (5, "VOLATILE_SBE_DETECTED", "Unacceptable rate of volatile single bit errors", "More than %u single-bit ECC error(s) detected in GPU %u Volatile SBEs: %lld", "Monitor - this GPU can still perform workload.", "MONITOR", "HARDWARE_MEMORY"),
    (6, "PENDING_PAGE_RETIREMENTS", "Pending page retirements detected", "A pending retired page has been detected in GPU %u.", "Monitor - this GPU can still perform workload", "RESET", "HARDWARE_MEMORY"),
    (7, "RETIRED_PAGES_LIMIT", "Unacceptable total page retirements detected", "%u or more retired pages have been detected in GPU %u. ", TRIAGE, "ISOLATE", "HARDWARE_MEMORY"),
    (8, "RETIRED_PAGES_DBE_LIMIT", "Unacceptable total page retirements due to uncorrectable errors", "An excess of %u retired pages due to DBEs have been detected and more than one page has been retired due to DBEs in the past week in GPU %u.", TRIAGE, "ISOLATE", "HARDWARE_MEMORY"),
    (9, "CORRUPT_INFOROM", "Corrupt inforom found", "A corrupt InfoROM has been detected in GPU %u.", "Flash the InfoROM to clear this corruption.", "TRIAGE", "HARDWARE_OTHER"),
    (10, "CLOCK_THROTTLE_THERMAL", "Clocks being throttled due to overheating", "Detected clock throttling due to thermal violation in GPU %u.", COOLING, "MONITOR", "HARDWARE_THERMAL"),
    (11, "POWER_UNREADABLE", "Cannot get a reading for power from NVML", "Cannot reliably read the power usage for GPU %u.", SYSTRIAGE, "MONITOR", "HARDWARE_POWER"),
    (12, "CLOCK_THROTTLE_POWER", "Clock being throttled due to power restrictions", "Detected clock throttling due to power violation in GPU %u.", "Monitor the power conditions. This GPU can still perform workload.", "MONITOR", "HARDWARE_POWER"),
    (13, "NVLINK_ERROR_THRESHOLD", "Unacceptable rate of NVLink errors", "Detected %ld %s NvLink errors on GPU %u's NVLink which exceeds threshold of %u", "Monitor the NVLink. It can still perform workload.", "ISOLATE", "HARDWARE_NVLINK"),
    (14, "NVLINK_DOWN", "NVLink is down", "GPU %u's NvLink link %d is currently down", SYSTRIAGE, "TRIAGE", "HARDWARE_NVLINK"),
    (15, "NVSWITCH_FATAL_ERROR", "Fatal errors on the NVSwitch", "Detected fatal errors on NvSwitch %u link %u", TRIAGE, "ISOLATE", "HARDWARE_NVSWITCH"),
    (16, "NVSWITCH_NON_FATAL_ERROR", "Non-fatal errors on the NVSwitch", "Detected nonfatal errors on NvSwitch %u link %u", "Monitor the NVSwitch. It can still perform workload.", "MONITOR", "HARDWARE_NVSWITCH"),
    (17, "NVSWITCH_DOWN", "NVSwitch is down - NOT USED: DEPRECATED", "NvSwitch physical ID %u's NvLink port %d is currently down.", SYSTRIAGE, "MONITOR", "HARDWARE_NVSWITCH"),
    (18, "NO_ACCESS_TO_FILE", "Cannot access a file", "File %s could not be accessed directly: %s", "Check relevant permissions, access, and existence of the file.", "CONFIG", "SOFTWARE_OTHER"),
    (19, "NVML_API", "Error occurred on an NVML API - NOT USED: DEPRECATED", "Error calling NVML API %s: %s", "Check the error condition and ensure that appropriate libraries are present and accessible.", "MONITOR", "SOFTWARE_LIBRARY"),
    (20, "DEVICE_COUNT_MISMATCH", "Disagreement in GPU count between /dev and NVML", "The number of devices NVML returns is different than the number of devices in /dev.", "Check for the presence of cgroups, operating system blocks, and or unsupported / older cards", "CONFIG", "SOFTWARE_OTHER"),
    (21, "BAD_PARAMETER", "Bad parameter passed to API", "Bad parameter to function %s cannot be processed", BUG, "UNKNOWN", "INTERNAL_OTHER"),
    (22, "CANNOT_OPEN_LIB", "Cannot open a library that must be accessed", "Cannot open library %s: '%s'", "Check for the existence of the library and set LD_LIBRARY_PATH if needed.", "TRIAGE", "SOFTWARE_LIBRARY"),
    (23, "DENYLISTED_DRIVER", "A driver on the denylist (nouveau) is active", "Found driver on the denylist: %s", "Please load the appropriate driver.", "CONFIG", "SOFTWARE_CONFIG"),
    (24, "NVML_LIB_BAD", "NVML library is missing expected functions - NOT USED: DEPRECATED", "Cannot get pointer to %s from libnvidia-ml.so", "Make sure that the required version of libnvidia-ml.so is present and accessible on the system.", "ISOLATE", "SOFTWARE_LIBRARY"),
    (25, "GRAPHICS_PROCESSES", "Graphics processes are active on this GPU", "NVVS has detected processes with graphics contexts open running on at least one GPU. This may cause some tests to fail.", "Stop the graphics processes or run this diagnostic on a server that is not being used for display purposes.", "RESET", "SOFTWARE_OTHER"),
    (26, "HOSTENGINE_CONN", "Bad connection to nv-hostengine - NOT USED: DEPRECATED", "Could not connect to the host engine: '%s'", "If hostengine is run separately, please ensure that it is up and responsive.", "MONITOR", "INTERNAL_OTHER"),
    (27, "FIELD_QUERY", "Error querying a field from DCGM", "Could not query field %s for GPU %u", SYSTRIAGE, "MONITOR", "INTERNAL_OTHER"),
    (28, "BAD_CUDA_ENV", "The environment has variables that hurt CUDA", "Found CUDA performance-limiting environment variable '%s'.", "Please unset this environment variable to address test failures.", "CONFIG", "SOFTWARE_CUDA"),
    (29, "PERSISTENCE_MODE", "Persistence mode is disabled", "Persistence mode for GPU %u is disabled.", 'Enable persistence mode by running "nvidia-smi -i <gpuId> -pm 1 " as root.', "CONFIG", "SOFTWARE_OTHER"),
    (30, "LOW_BANDWIDTH", "The bandwidth is unacceptably low", "Bandwidth of GPU %u in direction %s of %.2f did not exceed minimum required bandwidth of %.2f.", "Verify that your minimum bandwidth setting is appropriate for the topology of each GPU. If so, and errors are consistent, please run a field diagnostic.", "TRIAGE", "HARDWARE_PCIE"),
    (31, "HIGH_LATENCY", "Latency is too high", "Latency type %s of GPU %u value %.2f exceeded maximum allowed latency of %.2f.", "Verify that your maximum latency setting is appropriate for the topology of each GPU. If so, and errors are consistent, please run a field diagnostic.", "TRIAGE", "HARDWARE_PCIE"),
    (32, "CANNOT_GET_FIELD_TAG", "Cannot find a tag for a field", "Unable to get field information for field id %hu", "", "MONITOR", "INTERNAL_OTHER"),
    (33, "FIELD_VIOLATION", "The value for the specified error field is above 0", "Detected %ld %s for GPU %u", SYSTRIAGE, "ISOLATE", "HARDWARE_OTHER"),
    (34, "FIELD_THRESHOLD", "The value for the specified field is above the threshold", "Detected %ld %s for GPU %u which is above the threshold %ld", SYSTRIAGE, "MONITOR", "PERF_VIOLATION"),
    (35, "FIELD_VIOLATION_DBL", "The value for the specified error field is above 0", "Detected %.1f %s for GPU %u", SYSTRIAGE, "ISOLATE", "PERF_VIOLATION"),
    (36, "FIELD_THRESHOLD_DBL", "The value for the specified field is above the threshold", "Detected %.1f %s for GPU %u which is above the threshold %.1f", SYSTRIAGE, "ISOLATE", "PERF_VIOLATION"),
    (37, "UNSUPPORTED_FIELD_TYPE", "Field type cannot be supported", "Field %s is not supported by this API because it is neither an int64 nor a double type.", SYSTRIAGE, "TRIAGE", "INTERNAL_OTHER"),
    (38, "FIELD_THRESHOLD_TS", "The value for the specified field is above the threshold", "%s met or exceeded the threshold of %lu per second: %lu at %.1f seconds into the test.", SYSTRIAGE, "ISOLATE", "PERF_THRESHOLD"),
    (39, "FIELD_THRESHOLD_TS_DBL", "The value for the specified field is above the threshold", "%s met or exceeded the threshold of %.1f per second: %.1f at %.1f seconds into the test.", SYSTRIAGE, "ISOLATE", "PERF_THRESHOLD"),
    (40, "THERMAL_VIOLATIONS", "Thermal violations detected", "There were thermal violations totaling %.1f seconds for GPU %u", COOLING, "MONITOR", "HARDWARE_THERMAL"),
    (41, "THERMAL_VIOLATIONS_TS", "Thermal violations detected with a timestamp", "Thermal violations totaling %.1f seconds started at %.1f seconds into the test for GPU %u", COOLING, "MONITOR", "HARDWARE_THERMAL"),
    (42, "TEMP_VIOLATION", "Temperature is too high", "Temperature %lld of GPU %u exceeded user-specified maximum allowed temperature %lld", "Verify that the user-specified temperature maximum is set correctly. If it is, check the cooling for this GPU and node: " + COOLING, "MONITOR", "HARDWARE_THERMAL"),
    (43, "THROTTLING_VIOLATION", "Non-benign clock throttling is occurring", "Clocks are being throttled for GPU %u because of clock throttling starting %.1f seconds into the test. %s", SYSTRIAGE, "MONITOR", "HARDWARE_OTHER"),
    (44, "INTERNAL", "An internal error was detected", "There was an internal error during the test: '%s'", SYSTRIAGE, "TRIAGE", "INTERNAL_OTHER"),
    (45, "PCIE_GENERATION", "PCIe generation is too low", "GPU %u is running at PCI link generation %d, which is below the minimum allowed link generation of %d (parameter '%s')", CONFIG, "TRIAGE", "HARDWARE_PCIE"),
    (46, "PCIE_WIDTH", "PCIe width is too low", "GPU %u is running at PCI link width %dX, which is below the minimum allowed link generation of %d (parameter '%s')", CONFIG, "CONFIG", "HARDWARE_PCIE"),
    (47, "ABORTED", "Test was aborted by a user signal", "Test was aborted early due to user signal", "", "CONFIG", "SOFTWARE_OTHER"),
    (48, "TEST_DISABLED", "This test is disabled for this GPU", "The %s test is skipped for this GPU.", CONFIG, "CONFIG", "SOFTWARE_CONFIG"),
    (49, "CANNOT_GET_STAT", "Cannot get telemetry for a needed value", "Unable to generate / collect stat %s for GPU %u", "If running a standalone nv-hostengine, verify that it is up and responsive.", "TRIAGE", "INTERNAL_OTHER"),
    (50, "STRESS_LEVEL", "Stress level is too low (bad performance)", "Max stress level of %.1f did not reach desired stress level of %.1f for GPU %u", SYSTRIAGE, "TRIAGE", "PERF_THRESHOLD"),
    (51, "CUDA_API", "Error calling the specified CUDA API", "Error using CUDA API %s", SYSTRIAGE, "MONITOR", "SOFTWARE_CUDA"),
    (52, "FAULTY_MEMORY", "Faulty memory detected on this GPU", "Found %d faulty memory elements on GPU %u", TRIAGE, "ISOLATE", "HARDWARE_MEMORY"),
    (53, "CANNOT_SET_WATCHES", "Unable to set field watches in DCGM - NOT USED: DEPRECATED", "Unable to add field watches to DCGM: %s", SYSTRIAGE, "MONITOR", "INTERNAL_OTHER"),
    (54, "CUDA_UNBOUND", "CUDA context is no longer bound", "Cuda GPU %d is no longer bound to a CUDA context...Aborting", SYSTRIAGE, "TRIAGE", "SOFTWARE_CUDA"),
    (55, "ECC_DISABLED", "ECC memory is disabled right now", "Skipping test %s because ECC is not enabled on GPU %u", 'Enable ECC memory by running "nvidia-smi -i <gpuId> -e 1" to enable. This may require a GPU reset or reboot to take effect.', "CONFIG", "HARDWARE_MEMORY"),
    (56, "MEMORY_ALLOC", "Cannot allocate memory on the GPU", "Couldn't allocate at least %.1f%% of GPU memory on GPU %u", SYSTRIAGE, "TRIAGE", "SOFTWARE_OTHER"),
    (57, "CUDA_DBE", "CUDA detected unrecovable double-bit error", "CUDA APIs have indicated that a double-bit ECC error has occured on GPU %u.", TRIAGE, "ISOLATE", "HARDWARE_MEMORY"),
    (58, "MEMORY_MISMATCH", "Memory error detected", "A memory mismatch was detected on GPU %u, but no error was reported by CUDA or NVML.", TRIAGE, "ISOLATE", "HARDWARE_MEMORY"),
    (59, "CUDA_DEVICE", "No CUDA device discoverable for existing GPU", "Unable to find a corresponding CUDA device for GPU %u: '%s'", "Make sure CUDA_VISIBLE_DEVICES is not preventing visibility of this GPU. Also check if CUDA libraries are compatible and correctly installed.", "TRIAGE", "SOFTWARE_CUDA"),
    (60, "ECC_UNSUPPORTED", "ECC memory is unsupported by this SKU", "ECC Memory is not turned on or is unsupported. Skipping test.", CONFIG, "CONFIG", "HARDWARE_MEMORY"),
    (61, "ECC_PENDING", "ECC memory is in a pending state - NOT USED: DEPRECATED", "ECC memory for GPU %u is in a pending state.", "Reboot to complete activation of the ECC memory.", "MONITOR", "HARDWARE_MEMORY"),
    (62, "MEMORY_BANDWIDTH", "Memory bandwidth is too low", "GPU %u only achieved a memory bandwidth of %.2f GB/s, failing to meet %.2f GB/s for test %d", SYSTRIAGE, "TRIAGE", "PERF_THRESHOLD"),
    (63, "TARGET_POWER", "Cannot hit the target power draw", "Max power of %.1f did not reach desired power minimum %s of %.1f for GPU %u", "Verify that the clock speeds and GPU utilization are high.", "TRIAGE", "HARDWARE_POWER"),
    (64, "API_FAIL", "The specified API call failed", "API call %s failed: '%s'", SYSTRIAGE, "TRIAGE", "SOFTWARE_OTHER"),
    (65, "API_FAIL_GPU", "The specified API call failed for the specified GPU", "API call %s failed for GPU %u: '%s'", SYSTRIAGE, "TRIAGE", "SOFTWARE_OTHER"),
    (66, "CUDA_CONTEXT", "Cannot create a CUDA context on this GPU", "GPU %u failed to create a CUDA context: %s", "Please make sure the correct driver version is installed and verify that no conflicting libraries are present.", "TRIAGE", "SOFTWARE_CUDA"),
    (67, "DCGM_API", "DCGM API failure", "Error using DCGM API %s", SYSTRIAGE, "TRIAGE", "INTERNAL_OTHER"),
    (68, "CONCURRENT_GPUS", "Need multiple GPUs to run this test", "Unable to run concurrent pair bandwidth test without 2 or more gpus. Skipping", CONFIG, "CONFIG", "SOFTWARE_CONFIG"),
    (69, "TOO_MANY_ERRORS", "More errors than fit in the return struct - NOT USED: DEPRECATED", "This API can only return up to four errors per system. Additional errors were found for this system that couldn't be communicated.", "", "MONITOR", "SOFTWARE_OTHER"),
    (70, "NVLINK_CRC_ERROR_THRESHOLD", "More than 100 CRC errors are happening per second", "%.1f %s NvLink errors found occuring per second on GPU %u, exceeding the limit of 100 per second.", TRIAGE, "ISOLATE", "HARDWARE_NVLINK"),
    (71, "NVLINK_ERROR_CRITICAL", "NVLink error for a field that should always be 0", "Detected %ld %s NvLink errors on GPU %u's NVLink (should be 0)", TRIAGE, "ISOLATE", "HARDWARE_NVLINK"),
    (72, "ENFORCED_POWER_LIMIT", "The enforced power limit is too low to hit the target", "Enforced power limit on GPU %u set to %.1f, which is too low to attempt to achieve target power %.1f", "If this enforced power limit is necessary, then this test cannot be run. If it is unnecessary, then raise the enforced power limit setting to be able to run this test.", "CONFIG", "HARDWARE_POWER"),
    (73, "MEMORY_ALLOC_HOST", "Cannot allocate memory on the host", "Cannot allocate %zu bytes on the host", "Manually kill processes or restart your machine.", "TRIAGE", "SOFTWARE_OTHER"),
    (74, "GPU_OP_MODE", "Bad GPU operating mode for running plugin - NOT USED: DEPRECATED", "Skipping plugin due to a GPU being in GPU Operating Mode: LOW_DP.", "Fix by running nvidia-smi as root with: nvidia-smi --gom=0 -i <gpu index>", "MONITOR", "SOFTWARE_CONFIG"),
    (75, "NO_MEMORY_CLOCKS", "No memory clocks with the needed MHz found - NOT USED: DEPRECATED", "No memory clocks <= %u MHZ were found in %u supported memory clocks.", "", "MONITOR", "HARDWARE_MEMORY"),
    (76, "NO_GRAPHICS_CLOCKS", "No graphics clocks with the needed MHz found - NOT USED: DEPRECATED", "No graphics clocks <= %u MHZ were found in %u supported graphics clocks for memory clock %u MHZ.", "", "MONITOR", "HARDWARE_OTHER"),
    (77, "HAD_TO_RESTORE_STATE", "Note that we had to restore a GPU's state", "Had to restore GPU state on NVML GPU(s): %s", SYSTRIAGE, "TRIAGE", "SOFTWARE_OTHER"),
    (78, "L1TAG_UNSUPPORTED", "L1TAG test is unsupported by this SKU", "This card does not support the L1 cache test. Skipping test.", CONFIG, "CONFIG", "SOFTWARE_OTHER"),
    (79, "L1TAG_MISCOMPARE", "L1TAG test failed on a miscompare", "Detected a miscompare failure in the L1 cache.", TRIAGE, "ISOLATE", "HARDWARE_MEMORY"),
    (80, "ROW_REMAP_FAILURE", "Row remapping failed (Ampere or newer GPUs)", "GPU %u had uncorrectable memory errors and row remapping failed.", TRIAGE, "ISOLATE", "HARDWARE_MEMORY"),
    (81, "UNCONTAINED_ERROR", "Uncontained error - XID 95", "GPU had an uncontained error (XID 95)", DBE_NEXT, "ISOLATE", "SOFTWARE_XID"),
    (82, "EMPTY_GPU_LIST", "No GPU information given to plugin", "No valid GPUs passed to plugin", CONFIG, "CONFIG", "SOFTWARE_CONFIG"),
    (83, "DBE_PENDING_PAGE_RETIREMENTS", "Pending page retirements due to a DBE", "Pending page retirements together with a DBE were detected on GPU %u.", "Drain the GPU and reset it or reboot the node to resolve this issue.", "RESET", "HARDWARE_MEMORY"),
    (84, "UNCORRECTABLE_ROW_REMAP", "Uncorrectable row remapping", "GPU %u had uncorrectable memory errors and %u rows were remapped", "", "RESET", "HARDWARE_MEMORY"),
    (85, "PENDING_ROW_REMAP", "Row remapping is pending", "GPU %u had memory errors and row remappings are pending", SYSTRIAGE, "RESET", "HARDWARE_MEMORY"),
    (86, "BROKEN_P2P_MEMORY_DEVICE", "P2P copy test detected an error writing to this GPU", "GPU %u was unsuccessfully written to in a peer-to-peer test: %s", BUG, "ISOLATE", "HARDWARE_OTHER"),
    (87, "BROKEN_P2P_WRITER_DEVICE", "P2P copy test detected an error writing from this GPU", "GPU %u unsuccessfully wrote data in a peer-to-peer test: %s", BUG, "ISOLATE", "HARDWARE_OTHER"),
    (88, "NVSWITCH_NVLINK_DOWN", "An NvLink is down for the specified NVSwitch - NOT USED: DEPRECATED", "NVSwitch %u's NvLink %u is down.", "Please check fabric manager and initialization logs to figure out why the link is down. You may also need to run a field diagnostic.", "ISOLATE", "HARDWARE_NVLINK"),
    (89, "EUD_BINARY_PERMISSIONS", "EUD binary permissions are incorrect", "", "", "TRIAGE", "SOFTWARE_EUD"),
    (90, "EUD_NON_ROOT_USER", "EUD plugin is not running as root", "", "", "TRIAGE", "SOFTWARE_EUD"),
    (91, "EUD_SPAWN_FAILURE", "EUD plugin failed to spawn the EUD binary", "", "", "TRIAGE", "SOFTWARE_EUD"),
    (92, "EUD_TIMEOUT", "EUD plugin timed out", "", "", "TRIAGE", "SOFTWARE_EUD"),
    (93, "EUD_ZOMBIE", "EUD process remains running after the plugin considers it finished", "", "", "TRIAGE", "SOFTWARE_EUD"),
    (94, "EUD_NON_ZERO_EXIT_CODE", "EUD process exited with a non-zero exit code", "", "", "TRIAGE", "SOFTWARE_EUD"),
    (95, "EUD_TEST_FAILED", "EUD test failed", "", "", "ISOLATE", "SOFTWARE_EUD"),
    (96, "FILE_CREATE_PERMISSIONS", "We cannot create a file in this directory.", "The DCGM Diagnostic does not have permissions to create a file in directory '%s'", "Please restart the hostengine with parameter --home-dir to specify a different home directory for the diagnostic or change permissions in the current directory to allow the user to write files there.", "CONFIG", "SOFTWARE_CONFIG"),
    (97, "PAUSE_RESUME_FAILED", "Pause/Resume failed", "", "", "TRIAGE", "INTERNAL_OTHER"),
    (98, "PCIE_H_REPLAY_VIOLATION", "PCIe test caught correctable errors", "GPU %u host-side PCIe replay violation, see dmesg for more information", "", "ISOLATE", "HARDWARE_PCIE"),
    (99, "GPU_EXPECTED_NVLINKS_UP", "Expected nvlinks up per gpu", "Only %u NvLinks are up out of the expected %u", "Ensure Fabric Manager is running. Check system logs, dmesg, and fabric-manager logs for more info.", "TRIAGE", "HARDWARE_NVLINK"),
    (100, "NVSWITCH_EXPECTED_NVLINKS_UP", "Expected nvlinks up per nvswitch", "NvSwitch %u - Only %u NvLinks are up out of the expected %u", "Ensure Fabric Manager is running. Check system logs, dmesg, and fabric-manager logs for more info.", "TRIAGE", "HARDWARE_NVLINK"),
    (101, "XID_ERROR", "XID error detected", "Detected XID %u for GPU %u", "Please consult the documentation for details of this XID.", "TRIAGE", "SOFTWARE_XID"),
    (102, "SBE_VIOLATION", "Single bit error detected", "Detected %ld %s for GPU %u", TRIAGE, "ISOLATE", "HARDWARE_MEMORY"),
    (103, "DBE_VIOLATION", "Double bit error detected", "Detected %ld %s for GPU %u", TRIAGE, "ISOLATE", "HARDWARE_MEMORY"),
    (104, "PCIE_REPLAY_VIOLATION", "PCIe replay errors detected", "Detected %ld %s for GPU %u", TRIAGE, "ISOLATE", "HARDWARE_PCIE"),
    (105, "SBE_THRESHOLD_VIOLATION", "SBE threshold violated", "Detected %ld %s for GPU %u which is above the threshold %ld", TRIAGE, "ISOLATE", "HARDWARE_MEMORY"),
    (106, "DBE_THRESHOLD_VIOLATION", "DBE threshold violated", "Detected %ld %s for GPU %u which is above the threshold %ld", TRIAGE, "ISOLATE", "HARDWARE_MEMORY"),
    (107, "PCIE_REPLAY_THRESHOLD_VIOLATION", "PCIE replay count violated", "Detected %ld %s for GPU %u which is above the threshold %ld", TRIAGE, "ISOLATE", "HARDWARE_PCIE"),
    (108, "CUDA_FM_NOT_INITIALIZED", "The fabricmanager is not initialized", "", "Ensure that the FabricManager is running without errors.", "MONITOR", "SOFTWARE_CUDA"),
    (109, "SXID_ERROR", "NvSwitch fatal error detected", "Detected fatal NvSwitch SXID %u", SYSTRIAGE, "ISOLATE", "SOFTWARE_XID"),
    (110, "GFLOPS_THRESHOLD_VIOLATION", "GPU GFLOPs threshold violated", "Detected %.2f %s for GPU %u which is below the threshold %.2f", "Please verify your user-specified variance tolerance is set appropriately; if so, and if errors are persistent, please run a field diagnostic.", "TRIAGE", "PERF_VIOLATION"),
    (111, "NAN_VALUE", "NaN value detected on this GPU", "Found %d NaN-value memory elements on GPU %u", TRIAGE, "ISOLATE", "HARDWARE_MEMORY"),
    (112, "FABRIC_MANAGER_TRAINING_ERROR", "Fabric Manager did not finish training", "", "", "CONFIG", "SOFTWARE_CUDA"),
    (113, "BROKEN_P2P_PCIE_MEMORY_DEVICE", "P2P copy test detected an error writing to this GPU over PCIE", "", "", "ISOLATE", "HARDWARE_PCIE"),
    (114, "BROKEN_P2P_PCIE_WRITER_DEVICE", "P2P copy test detected an error writing from this GPU over PCIE", "", "", "ISOLATE", "HARDWARE_PCIE"),
    (115, "BROKEN_P2P_NVLINK_MEMORY_DEVICE", "P2P copy test detected an error writing to this GPU over NVLink", "", "", "ISOLATE", "HARDWARE_NVLINK"),
    (116, "BROKEN_P2P_NVLINK_WRITER_DEVICE", "P2P copy test detected an error writing from this GPU over NVLink", "", "", "ISOLATE", "HARDWARE_NVLINK"),
    (117, "TEST_SKIPPED", "", "", "", "CONFIG", "SOFTWARE_CONFIG"),
]

ACTION_MAP = {
    "DCGM_ERROR_NONE": "ignore",
    "DCGM_ERROR_MONITOR": "ignore",
    "DCGM_ERROR_ISOLATE": "isolate_node",
    "DCGM_ERROR_UNKNOWN": "contact_support",
    "DCGM_ERROR_TRIAGE": "contact_support",
    "DCGM_ERROR_CONFIG": "contact_support",
    "DCGM_ERROR_RESET": "reset_device",
}
ORIGIN = {
    "HARDWARE_THERMAL": "thermal", "HARDWARE_MEMORY": "memory", "HARDWARE_NVLINK": "interconnect",
    "HARDWARE_NVSWITCH": "interconnect", "HARDWARE_PCIE": "hardware", "HARDWARE_POWER": "hardware",
    "HARDWARE_OTHER": "hardware", "PERF_THRESHOLD": "hardware", "PERF_VIOLATION": "hardware",
    "SOFTWARE_CONFIG": "system", "SOFTWARE_OTHER": "system", "SOFTWARE_EUD": "system",
    "SOFTWARE_LIBRARY": "driver", "SOFTWARE_CUDA": "driver", "SOFTWARE_XID": "driver",
    "INTERNAL_OTHER": "unknown", "NONE": "unknown",
}
SEV_ZH = {"MONITOR": "需监控", "ISOLATE": "应隔离 GPU", "UNKNOWN": "未识别", "TRIAGE": "需排查", "CONFIG": "需调整配置", "RESET": "需排空并复位 GPU"}
SEV_EN = {
    "MONITOR": "the GPU can still run work but must be monitored",
    "ISOLATE": "the GPU cannot run work and should be isolated",
    "UNKNOWN": "DCGM does not recognise the condition",
    "TRIAGE": "the error must be triaged",
    "CONFIG": "the condition comes from configuration",
    "RESET": "the GPU must be drained and reset",
}


def main() -> None:
    rows = []
    for value, name, comment, msg, nxt, sev, cat in D:
        code = f"DCGM_FR_{name}"
        vendor = f"DCGM_ERROR_{sev}"
        action = ACTION_MAP[vendor]
        fault_class = None if name == "OK" else "device_error"
        if name == "OK":
            vendor, action = "DCGM_ERROR_NONE", "ignore"
        desc = comment or "Test skipped"
        note = f"DCGM severity {vendor}, category DCGM_FR_EC_{cat} (dcgm_errors.c)."
        inferred = not comment
        if inferred:
            note += " The enum carries no comment for this code: the description is the name in words."
        if "DEPRECATED" in comment:
            note += " DCGM marks the code deprecated."
        if name == "OK":
            note = "The success value of dcgmError_t (severity table: DCGM_ERROR_UNKNOWN); mapped to DCGM_ERROR_NONE here."
        en = f"DCGM reported {code} ({value}): {desc.rstrip('.')}; DCGM's severity says {SEV_EN.get(sev, 'nothing')}."
        zh = f"DCGM 上报 {code}（{value}）：{desc.rstrip('.')}；DCGM 严重级别为{SEV_ZH.get(sev, '无')}。"
        if name == "OK":
            en, zh = "DCGM reported DCGM_FR_OK: no error.", "DCGM 上报 DCGM_FR_OK：无错误。"
        rows.append(
            row(
                f"dcgm:{code}",
                mnemonic=code,
                description=desc,
                vendor_action=vendor,
                action=action,
                origin=ORIGIN[cat],
                fault_class=fault_class,
                en=en,
                zh=zh,
                note=note,
                inferred=inferred,
                texts=[msg] if msg and name != "OK" else None,
                steps=[nxt] if nxt and nxt != "N/A" else None,
            )
        )
    header = """# NVIDIA DCGM failure codes for trainmedic (chip: nvidia). Loaded by udal/nvidia.py with nvidia_catalog.yaml.
#
# Source: NVIDIA Data Center GPU Manager (github.com/NVIDIA/DCGM), dcgmlib/dcgm_errors.h (enum dcgmError_t,
#   the DCGM_FR_*_MSG message formats and DCGM_FR_*_NEXT suggestions; header of 2024, codes 0-111, commit
#   18b87c71) and dcgmlib/src/dcgm_errors.c (table dcgmErrorMeta: severity and category of every code;
#   2025, codes 0-117, commit 0d22068b). Code `dcgm:DCGM_FR_<NAME>`; description = the enum comment,
#   texts = the message format (printf placeholders kept), steps = the suggestion (macros expanded), all
#   verbatim; vendor_action = DCGM's severity (dcgmErrorSeverity_t).
# Codes 112-117 (DCGM_FR_FABRIC_MANAGER_TRAINING_ERROR .. DCGM_FR_TEST_SKIPPED) are in the 2025 severity
#   table; no header copy with their message and suggestion was found, so they carry none.
# DCGM 4 renamed DCGM_FR_CLOCK_THROTTLE_THERMAL / _POWER and DCGM_FR_THROTTLING_VIOLATION to
#   DCGM_FR_CLOCKS_EVENT_THERMAL / _POWER / _VIOLATION; udal/nvidia.py maps the new names onto these rows.
# Generated by tools/catalogs/gen_dcgm.py. origin follows DCGM's category; severity and message are
#   trainmedic's.
#
# Normalization of DCGM's severity (also udal/nvidia.py):
#   DCGM_ERROR_NONE -> ignore     DCGM_ERROR_MONITOR -> ignore ("Can perform workload, but needs to be monitored.")
#   DCGM_ERROR_ISOLATE -> isolate_node ("Cannot perform workload. GPU should be isolated.")
#   DCGM_ERROR_RESET -> reset_device ("Drain and reset GPU")
#   DCGM_ERROR_TRIAGE, DCGM_ERROR_CONFIG, DCGM_ERROR_UNKNOWN -> contact_support (a person must triage or
#   change the node's configuration)
"""
    write(
        "nvidia_dcgm_catalog.yaml",
        header,
        {
            "chip": "nvidia",
            "source": {
                "title": "NVIDIA DCGM dcgm_errors.h (dcgmError_t, messages, suggestions) and dcgm_errors.c (severity)",
                "url": "https://github.com/NVIDIA/DCGM/blob/master/dcgmlib/dcgm_errors.h",
                "version": "dcgm_errors.h 2024 (codes 0-111); dcgm_errors.c 2025 (codes 0-117)",
            },
            "action_map": ACTION_MAP,
            "entries": rows,
        },
    )


if __name__ == "__main__":
    main()
