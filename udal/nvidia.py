"""NVIDIA GPUs: Xid catalog, CUDA and NCCL codes, dcgm-exporter metrics, GPU Feature Discovery labels.

Codes: `xid:<n>` (NVIDIA Xid catalog), `sxid:<n>` (NVSwitch SXids), `dcgm:DCGM_FR_<NAME>` (DCGM
failure codes), `cuda:<cudaErrorName>` (every cudaError_t), the older `cuda_oom`,
`cuda_ecc_uncorrectable`, `cuda_illegal_address`, `cuda_launch_failure`, `gpu_fallen_off_bus`, NCCL
`ncclResult_t` names (`ncclSystemError`, ...), `nccl_watchdog` and `nccl_ib_completion`. The catalog is
four files (nvidia_catalog.yaml first); `lookup_text` finds a row by its cudaGetErrorString /
ncclGetErrorString / DCGM message text. NCCL codes live here rather than in the generic plugin
because NCCL is NVIDIA's library and only runs on NVIDIA GPUs.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from trainmedic.models import Action
from trainmedic.udal.base import ChipPlugin, pci_vendor_present

# Vendor bucket (Xid catalog "Resolution Bucket (Immediate Action)") -> normalized action.
# The same table heads nvidia_catalog.yaml (action_map); the loader checks every row against it.
ACTION_MAP: Mapping[str, Action] = {
    "RESTART_APP": Action.RESTART_APP,
    "RESET_GPU": Action.RESET_DEVICE,
    "RESTART_BM": Action.REBOOT_NODE,
    "RESTART_VM": Action.REBOOT_NODE,
    "IGNORE": Action.IGNORE,
    "CONTACT_SUPPORT": Action.CONTACT_SUPPORT,
    # "Solo: RESTART_FM; Not solo: IGNORE (follow other Xid)": a consequence of another Xid.
    "WORKFLOW_XID_45": Action.IGNORE,
    # "Solo: RESET_GPU; w/ 63 or 64: DRAIN_AND_RESET".
    "WORKFLOW_XID_48": Action.RESET_DEVICE,
    # Xid 74: "A GPU reset or node reboot is needed to clear this error".
    "WORKFLOW_NVLINK_ERR": Action.RESET_DEVICE,
    # Xid 144-150 decode sheet: every fatal sub-code resolves to RESET_GPU.
    "WORKFLOW_NVLINK5_ERR": Action.RESET_DEVICE,
    # A person must check seating/connectors, or update firmware/software.
    "CHECK_MECHANICALS": Action.CONTACT_SUPPORT,
    "UPDATE_SWFW": Action.CONTACT_SUPPORT,
    # "If UVM/vGPU is being utilized, RESET_GPU; otherwise IGNORE": CUDA training uses UVM.
    "CHECK_UVM": Action.RESET_DEVICE,
    # Informational; the action is named in the Xid 154 message (see xid154_action).
    "XID_154": Action.IGNORE,
    # DCGM severity (dcgm_errors.h dcgmErrorSeverity_t), vendor bucket of the dcgm:* rows.
    "DCGM_ERROR_NONE": Action.IGNORE,
    "DCGM_ERROR_MONITOR": Action.IGNORE,
    "DCGM_ERROR_ISOLATE": Action.ISOLATE_NODE,
    "DCGM_ERROR_UNKNOWN": Action.CONTACT_SUPPORT,
    "DCGM_ERROR_TRIAGE": Action.CONTACT_SUPPORT,
    "DCGM_ERROR_CONFIG": Action.CONTACT_SUPPORT,
    "DCGM_ERROR_RESET": Action.RESET_DEVICE,
}

# DCGM 4 renamed three failure codes; the catalog rows carry the names of the header transcribed.
DCGM_RENAMED: Mapping[str, str] = {
    "DCGM_FR_CLOCKS_EVENT_THERMAL": "DCGM_FR_CLOCK_THROTTLE_THERMAL",
    "DCGM_FR_CLOCKS_EVENT_POWER": "DCGM_FR_CLOCK_THROTTLE_POWER",
    "DCGM_FR_CLOCKS_EVENT_VIOLATION": "DCGM_FR_THROTTLING_VIOLATION",
}

# Xid 154 message: "GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)".
XID154_ACTIONS: Mapping[str, Action] = {
    "none": Action.IGNORE,
    "drain p2p": Action.RESTART_APP,
    "drain and reset": Action.RESET_DEVICE,
    "gpu reset required": Action.RESET_DEVICE,
    "node reboot required": Action.REBOOT_NODE,
}

_XID154_TO = re.compile(r"to\s+0x[0-9a-fA-F]+\s*\(([^)]*)\)")
_XID_CODE = re.compile(r"^\s*xid\s*[: ]\s*(\d+)\s*$", re.IGNORECASE)
_SXID_CODE = re.compile(r"^\s*sxid\s*[: ]\s*(\d+)\s*$", re.IGNORECASE)
_DCGM_CODE = re.compile(r"^\s*(?:dcgm\s*:\s*)?(DCGM_FR_[A-Z0-9_]+)\s*$", re.IGNORECASE)
_CUDA_CODE = re.compile(r"^\s*(?:cuda\s*:\s*)?(cuda(?:Error[A-Za-z0-9]+|Success))\s*$")


def xid154_action(message: str) -> Action | None:
    """The recovery action an Xid 154 line names ("... to 0x2 (Node Reboot Required)")."""
    match = _XID154_TO.search(message)
    if match is None:
        return None
    return XID154_ACTIONS.get(match.group(1).strip().lower())


# ncclResult_t values (nccl.h): the number NCCL's debug trail prints, and the name the catalog keys.
NCCL_RESULTS: dict[int, str] = {
    1: "ncclUnhandledCudaError",
    2: "ncclSystemError",
    3: "ncclInternalError",
    4: "ncclInvalidArgument",
    5: "ncclInvalidUsage",
    6: "ncclRemoteError",
    7: "ncclInProgress",
    8: "ncclTimeout",
}


class NvidiaPlugin(ChipPlugin):
    name = "nvidia"
    # NVIDIA k8s-device-plugin extended resource (MIG strategy "mixed" adds nvidia.com/mig-<profile>;
    # time-slicing with renameByDefault advertises nvidia.com/gpu.shared).
    resource_names = ("nvidia.com/gpu",)
    resource_prefixes = ("nvidia.com/gpu", "nvidia.com/mig-")
    # GPU Feature Discovery labels.
    node_label_keys = ("nvidia.com/gpu.present", "nvidia.com/gpu.product", "nvidia.com/gpu.count")
    visible_devices_env = "CUDA_VISIBLE_DEVICES"
    visible_devices_env_fallbacks = ("NVIDIA_VISIBLE_DEVICES",)
    env_prefixes = ("NCCL_",)
    # PyTorch: "CUDA out of memory. ... (GPU 0; 79.35 GiB total capacity ...)", "GPU 3 has a total
    # capacity of ...", devices "cuda:1".
    log_device_words = ("GPU",)
    device_types = ("cuda",)
    # dcgm-exporter (github.com/NVIDIA/dcgm-exporter, etc/default-counters.csv): the exporter names each
    # series after its DCGM field and labels it gpu (index), UUID, device (nvidia<N>), modelName,
    # Hostname (NODE_NAME when set), plus namespace/pod/container when it maps GPUs to pods.
    # In the default list: clocks, temperatures, power, PCIe replays, utilization, FB free/used,
    # XID_ERRORS, NVLINK_BANDWIDTH_TOTAL, the remapped-rows fields. Commented out of the default list
    # (enable them in the counters CSV for the ECC / retirement / NVLink-error rules to see anything):
    # ECC_*_VOL_TOTAL, RETIRED_PENDING, NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL. DCGM_FI_DEV_FB_TOTAL is a DCGM
    # field absent from the list. DCGM_FI_DEV_XID_ERRORS is a gauge holding the value of the LAST Xid
    # ("Value of the last XID error encountered"), not a count. DCGM_FI_DEV_NVLINK_LINK_STATUS is a
    # per-link entity field (labels nvlink/nvswitch, no gpu) with a 4-state enum, so it is not mapped;
    # NVML gives link state per GPU (agent/watchers/nvml.py).
    metric_names: Mapping[str, str] = {
        "DCGM_FI_DEV_GPU_UTIL": "accelerator_utilization",
        "DCGM_FI_DEV_MEM_COPY_UTIL": "accelerator_memory_utilization",
        "DCGM_FI_DEV_FB_USED": "accelerator_memory_used",
        "DCGM_FI_DEV_FB_FREE": "accelerator_memory_free",
        "DCGM_FI_DEV_FB_TOTAL": "accelerator_memory_total",
        "DCGM_FI_DEV_GPU_TEMP": "accelerator_temperature",
        "DCGM_FI_DEV_MEMORY_TEMP": "accelerator_memory_temperature",
        "DCGM_FI_DEV_POWER_USAGE": "accelerator_power",
        "DCGM_FI_DEV_SM_CLOCK": "accelerator_clock",
        "DCGM_FI_DEV_XID_ERRORS": "xid_errors",
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": "ecc_sbe",
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": "ecc_dbe",
        "DCGM_FI_DEV_ROW_REMAP_FAILURE": "row_remap_failure",
        "DCGM_FI_DEV_RETIRED_PENDING": "retired_pages_pending",
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": "pcie_replay",
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": "link_bandwidth",
        "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": "link_errors",
    }
    exporter_device_labels = ("gpu",)
    # Xid 48: "DBE (Double Bit Error) ECC Error"; Xid 64: "ECC page retirement or row remapper
    # recording failure".
    metric_codes: Mapping[str, tuple[str, ...]] = {"ecc_dbe": ("xid:48",), "row_remap_failure": ("xid:64",)}
    frameworks: Mapping[str, str] = {
        "pytorch": "torch (CUDA build), NCCL backend",
        "deepspeed": "DeepSpeed on torch (CUDA)",
        "megatron": "Megatron-LM / Megatron-Core on torch (CUDA)",
        "jax": "jax[cuda]",
        "tensorflow": "tensorflow (CUDA build)",
        "mindspore": "MindSpore GPU build (CUDA)",
    }
    action_map = ACTION_MAP
    catalog_file = "nvidia_catalog.yaml"
    extra_catalog_files = ("nvidia_cuda_catalog.yaml", "nvidia_dcgm_catalog.yaml", "nvidia_sxid_catalog.yaml")

    PCI_VENDOR_ID = "10de"

    def normalize_code(self, code: str) -> str:
        match = _XID_CODE.match(code)
        if match:
            return f"xid:{int(match.group(1))}"
        match = _SXID_CODE.match(code)
        if match:
            return f"sxid:{int(match.group(1))}"
        match = _DCGM_CODE.match(code)
        if match:
            name = match.group(1).upper()
            return f"dcgm:{DCGM_RENAMED.get(name, name)}"
        match = _CUDA_CODE.match(code)
        if match:
            return f"cuda:{match.group(1)}"
        text = code.strip()
        if text.startswith("nccl:") and text[5:].isdigit():
            # ncclResult_t by number (NCCL's "file.cc:line -> N" trail), nccl.h order.
            return NCCL_RESULTS.get(int(text[5:]), text)
        return text

    def exporter_labels_match(self, labels: Mapping[str, str]) -> bool:
        """dcgm-exporter's labels: a `UUID` of an NVIDIA GPU (GPU-...) or an NVIDIA `modelName`."""
        return labels.get("UUID", "").startswith("GPU-") or "nvidia" in labels.get("modelName", "").lower()

    def detect_vendor(self, labels: Mapping[str, str]) -> bool:
        if labels.get("nvidia.com/gpu.present", "").strip().lower() == "true":
            return True
        if labels.get("nvidia.com/gpu.product", "").strip():
            return True
        return pci_vendor_present(labels, self.PCI_VENDOR_ID)
