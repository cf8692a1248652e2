"""Huawei Ascend NPUs: MindCluster fault codes and levels, CANN HCCL codes, npu-exporter metrics.

Codes: device fault codes as `0x80C98000` (upper-case hex, MindCluster level in vendor_action),
CANN error codes verbatim (`EI0002`, `EJ0001`, `EL0004`, `EE9999`, `EZ9999`, `E19999`), ACL / runtime /
GE return codes as `acl:<n>` (`acl:507015`; written in logs as the number or the ACL_ERROR_* name),
HcclResult return values as `hccl:<n>`, torch_npu codes `ERR02200` etc., and `npu_oom`. The catalog is
four files (ascend_catalog.yaml first, ascend_acl_catalog.yaml, ascend_cann_catalog.yaml,
ascend_hccl_guide_catalog.yaml).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping

from trainmedic.models import Action
from trainmedic.udal.base import ChipPlugin, load_package_catalogs, pci_vendor_present

# MindCluster fault level -> normalized action (also the action_map of ascend_catalog.yaml).
ACTION_MAP: Mapping[str, Action] = {
    "NotHandleFault": Action.IGNORE,
    "RestartRequest": Action.RESTART_APP,
    "RestartBusiness": Action.RESTART_APP,
    "FreeRestartNPU": Action.RESET_DEVICE,
    "RestartNPU": Action.RESET_DEVICE,
    "SeparateNPU": Action.ISOLATE_NODE,
    "PreSeparateNPU": Action.ISOLATE_NODE,
    # Sub-health: the chip keeps working and the running job is not interrupted; MindCluster
    # applies the job's sub-health strategy, so nobody needs to be woken.
    "SubHealthFault": Action.IGNORE,
}

_HEX8 = re.compile(r"^(?:0x)?([0-9a-fA-F]{8})$")
_CANN = re.compile(r"^[A-Za-z][A-Za-z0-9]\d{4}$")
_ACL_NUMBER = re.compile(r"^\s*(?:acl\s*:\s*)?([1-5]\d{5})\s*$", re.IGNORECASE)
_ACL_NAME = re.compile(r"^\s*(?:acl\s*:\s*)?(ACL_(?:ERROR|RT|SUCCESS)\w*)\s*$")
_HCCL_RET = re.compile(r"^\s*hccl\s*[: ]\s*(\d+)\s*$", re.IGNORECASE)


@functools.cache
def _acl_names(files: tuple[str, ...]) -> dict[str, str]:
    """ACL_ERROR_* name -> `acl:<n>` code, from the mnemonics of the acl rows (built once)."""
    names = {"ACL_SUCCESS": "acl:0", "ACL_ERROR_NONE": "acl:0", "ACL_RT_SUCCESS": "acl:0"}
    for entry in load_package_catalogs(files).entries.values():
        if entry.code.startswith("acl:") and entry.mnemonic:
            names[entry.mnemonic] = entry.code
    return names


class AscendPlugin(ChipPlugin):
    name = "ascend"
    # MindCluster Ascend Device Plugin extended resources.
    resource_names = (
        "huawei.com/Ascend910",
        "huawei.com/Ascend310P",
        "huawei.com/Ascend310",
    )
    # Every huawei.com/Ascend* resource (vNPU templates such as huawei.com/Ascend910-4c).
    resource_prefixes = ("huawei.com/Ascend",)
    # MindCluster node labels: accelerator=huawei-Ascend910, node.kubernetes.io/npu.chip.name=910B3,
    # servertype=Ascend910B-20, accelerator-type=module-910b-8.
    node_label_keys = ("accelerator", "node.kubernetes.io/npu.chip.name", "servertype", "accelerator-type")
    visible_devices_env = "ASCEND_RT_VISIBLE_DEVICES"
    visible_devices_env_fallbacks = ("ASCEND_VISIBLE_DEVICES",)
    env_prefixes = ("HCCL_",)
    # torch_npu: "NPU out of memory. ... (NPU 0; 60.97 GiB total capacity ...)", devices "npu:0".
    log_device_words = ("NPU",)
    device_types = ("npu",)
    # MindCluster NPU Exporter (github.com/Ascend/ascend-npu-exporter, collector/npu_collector.go, and
    # the MindCluster "Prometheus Metrics" API page). Chip series carry the labels id (physical chip
    # id), model_name, vdie_id, pcie_bus_info, namespace, pod_name, container_name; none names the
    # node, so Prometheus' target labels (kubernetes_node, node, instance) must. Values:
    # health_status 1 healthy / 0 unhealthy, link_status 1 UP / 0 DOWN, network_status 1 reachable /
    # 0 not; since MindCluster 26.1 those three report -1 when the DCMI / hccn_tool call fails.
    # error_code is the first current fault code as a decimal number (0x80C98000 -> 2160689152).
    # Memory is in MB. hbm_utilization, hbm_temperature and the HBM ECC counters come from the hbm
    # metrics group (newer releases).
    metric_names: Mapping[str, str] = {
        "npu_chip_info_utilization": "accelerator_utilization",
        "npu_chip_info_hbm_used_memory": "accelerator_memory_used",
        "npu_chip_info_hbm_total_memory": "accelerator_memory_total",
        "npu_chip_info_hbm_utilization": "accelerator_memory_utilization",
        "npu_chip_info_used_memory": "device_ddr_memory_used",
        "npu_chip_info_total_memory": "device_ddr_memory_total",
        "npu_chip_info_temperature": "accelerator_temperature",
        "npu_chip_info_hbm_temperature": "accelerator_memory_temperature",
        "npu_chip_info_power": "accelerator_power",
        "npu_chip_info_voltage": "accelerator_voltage",
        "npu_chip_info_aicore_current_freq": "accelerator_clock",
        "npu_chip_info_hbm_ecc_single_bit_error_cnt": "ecc_sbe",
        "npu_chip_info_hbm_ecc_double_bit_error_cnt": "ecc_dbe",
        "npu_chip_info_health_status": "health",
        "npu_chip_info_link_status": "link_status",
        "npu_chip_info_network_status": "network_status",
        "npu_chip_info_error_code": "error_code",
    }
    exporter_device_labels = ("id",)
    frameworks: Mapping[str, str] = {
        "pytorch": "torch_npu (Ascend Extension for PyTorch), HCCL backend",
        "mindspore": "MindSpore (Ascend)",
        "deepspeed": "DeepSpeed on torch_npu",
        "megatron": "MindSpeed (Megatron on torch_npu)",
    }
    action_map = ACTION_MAP
    catalog_file = "ascend_catalog.yaml"
    extra_catalog_files = ("ascend_acl_catalog.yaml", "ascend_cann_catalog.yaml", "ascend_hccl_guide_catalog.yaml")

    PCI_VENDOR_ID = "19e5"

    def normalize_code(self, code: str) -> str:
        text = code.strip()
        hccl = _HCCL_RET.match(text)
        if hccl:
            return f"hccl:{int(hccl.group(1))}"
        acl = _ACL_NUMBER.match(text)
        if acl:
            return f"acl:{int(acl.group(1))}"
        name = _ACL_NAME.match(text)
        if name:
            return _acl_names(self.catalog_files()).get(name.group(1), text)
        hex8 = _HEX8.match(text)
        if hex8:
            return f"0x{hex8.group(1).upper()}"
        if _CANN.match(text) or text.upper().startswith("ERR"):
            return text.upper()
        return text

    def detect_vendor(self, labels: Mapping[str, str]) -> bool:
        if labels.get("accelerator", "").strip().lower().startswith("huawei-ascend"):
            return True
        if labels.get("node.kubernetes.io/npu.chip.name", "").strip():
            return True
        if labels.get("servertype", "").strip().lower().startswith("ascend"):
            return True
        return pci_vendor_present(labels, self.PCI_VENDOR_ID)
