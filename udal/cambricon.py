"""Cambricon MLUs: CNCL and CNRT return codes, mlu-exporter metrics, device plugin resource.

Codes: `cncl:<NAME>` (cnclResult_t names, e.g. `cncl:CNCL_RET_ERR_SYS_SOCKET`), `cnrt:<name>` (every
cnrtRet_t, e.g. `cnrt:cnrtErrorNoMem`, from cambricon_cnrt_catalog.yaml), `cndrv:<CN_* name>` (every
CNresult of the driver API, cambricon_cndrv_catalog.yaml), `cndev:<NAME>` (cndevRet_t names such as
`cndev:CNDEV_ERROR_NO_DRIVER` from cambricon_cndev_catalog.yaml, and the rule names `cndev:XID_ERROR`,
`cndev:MLULINK_DOWN`, `cndev:DBE_VIOLATION`, whose CNDev event table was not found: those rows are
marked inferred), `cnrt_oom`, `mlu_oom`. Bare names (`CN_MEMORY_ERROR_OUT_OF_MEMORY`,
`CNDEV_ERROR_NO_DRIVER`, `CNCL_RET_ERR_SYSTEM`, `cnrtErrorNoMem`) get their prefix.

Node labels: Cambricon publishes no node-label convention that could be verified, so detection
uses the generic `ai.accelerator/chip-type=cambricon` label, a `cambricon.com/mlu.*` label if a
cluster sets one, or Node Feature Discovery's PCI vendor label for vendor id `cabc`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from trainmedic.models import Action
from trainmedic.udal.base import ChipPlugin, pci_vendor_present

# Cambricon publishes no resolution bucket for these codes: no vendor bucket to normalize.
ACTION_MAP: Mapping[str, Action] = {}

_PREFIXED = re.compile(r"^\s*(cncl|cndev|cndrv)\s*:\s*([A-Za-z0-9_]+)\s*$", re.IGNORECASE)
_BARE = re.compile(r"^\s*((CNCL_RET)|(CNDEV_(?:SUCCESS|ERROR))|(CN_))[A-Z0-9_]*\s*$")
_CNRT = re.compile(r"^\s*(?:cnrt\s*:\s*)?(cnrt(?:Success|Error[A-Za-z0-9]+))\s*$")

# Cambricon mlu-exporter (github.com/Cambricon/mlu-exporter, examples/metrics.yaml and
# pkg/collector/cndev.go) exports the names of metrics.yaml under the prefix given by --metrics-prefix,
# "mlu" in every shipped example. Labels: mlu (index), uuid, sn, model, type, driver, mcu, node (the
# --hostname / ENV_NODE_NAME value); MLU-Link series add link. Values: health 1 healthy / 0 sick;
# mlulink_status 1 enabled / 0 disabled (per link); memory in bytes. last_xid_error holds the value
# of the last xid of the device (like DCGM's XID_ERRORS gauge); xid_error_count is a counter per xid
# label value and is deliberately not mapped onto xid_errors.
_PREFIX = "mlu_"


class CambriconPlugin(ChipPlugin):
    name = "cambricon"
    resource_names = ("cambricon.com/mlu",)
    # Any resource whose name starts with cambricon.com/mlu counts as MLUs.
    resource_prefixes = ("cambricon.com/mlu",)
    node_label_keys = ("cambricon.com/mlu.present", "cambricon.com/mlu.model")
    visible_devices_env = "MLU_VISIBLE_DEVICES"
    env_prefixes = ("CNCL_",)
    # torch_mlu: "MLU out of memory. ... (MLU 0; ...)", devices "mlu:0".
    log_device_words = ("MLU",)
    device_types = ("mlu",)
    metric_names: Mapping[str, str] = {
        _PREFIX + "utilization": "accelerator_utilization",
        _PREFIX + "memory_used": "accelerator_memory_used",
        _PREFIX + "memory_total": "accelerator_memory_total",
        _PREFIX + "memory_free": "accelerator_memory_free",
        _PREFIX + "memory_utilization": "accelerator_memory_utilization",
        _PREFIX + "temperature": "accelerator_temperature",
        _PREFIX + "memory_temperature": "accelerator_memory_temperature",
        _PREFIX + "power_usage": "accelerator_power",
        _PREFIX + "frequency": "accelerator_clock",
        _PREFIX + "health": "health",
        _PREFIX + "mlulink_status": "link_status",
        _PREFIX + "mlulink_err_uncorrected_total": "link_errors",
        _PREFIX + "last_xid_error": "xid_errors",
        _PREFIX + "dram_ecc_sbe_count": "ecc_sbe",
        _PREFIX + "dram_ecc_dbe_count": "ecc_dbe",
        _PREFIX + "remapped_failed_rows": "row_remap_failure",
        _PREFIX + "remapped_pending_rows": "row_remap_pending",
        _PREFIX + "pcie_replay_count": "pcie_replay",
    }
    exporter_device_labels = ("mlu",)
    metric_codes: Mapping[str, tuple[str, ...]] = {
        "xid_errors": ("cndev:XID_ERROR",),
        "ecc_dbe": ("cndev:DBE_VIOLATION",),
        "link_status": ("cndev:MLULINK_DOWN",),
    }
    frameworks: Mapping[str, str] = {
        "pytorch": "torch_mlu (Cambricon PyTorch, formerly CATCH), CNCL backend",
        "deepspeed": "DeepSpeed on torch_mlu",
        "megatron": "Megatron-LM on torch_mlu",
    }
    action_map = ACTION_MAP
    catalog_file = "cambricon_catalog.yaml"
    extra_catalog_files = (
        "cambricon_cnrt_catalog.yaml",
        "cambricon_cndev_catalog.yaml",
        "cambricon_cndrv_catalog.yaml",
    )

    PCI_VENDOR_ID = "cabc"

    def normalize_code(self, code: str) -> str:
        match = _PREFIXED.match(code)
        if match:
            return f"{match.group(1).lower()}:{match.group(2).upper()}"
        match = _CNRT.match(code)
        if match:
            return f"cnrt:{match.group(1)}"
        match = _BARE.match(code)
        if match:
            family = "cncl" if match.group(2) else "cndev" if match.group(3) else "cndrv"
            return f"{family}:{code.strip()}"
        return code.strip()

    def detect_vendor(self, labels: Mapping[str, str]) -> bool:
        if any(key.startswith("cambricon.com/mlu") for key in labels):
            return True
        return pci_vendor_present(labels, self.PCI_VENDOR_ID)
