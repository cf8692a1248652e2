"""A third-party chip for the tests: the imaginary Zeta NPU, shipped outside udal.

Nothing in trainmedic names it: everything it knows about the chip comes from this plugin once it is
registered (`udal.registry.register("zeta", "zetachip:ZetaPlugin")`), as an installed package's
`trainmedic.chips` entry point would be found.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

from trainmedic.models import Action
from trainmedic.udal.base import Catalog, ChipPlugin, TextIndex, load_catalog_text

CATALOG = """\
chip: zeta
source:
  title: Zeta NPU driver error codes (test data)
  url: https://docs.zeta.example/npu/errors
  version: '1.0'
action_map:
  RESET: reset_device
entries:
- code: zeta:7
  description: HBM double-bit ECC error
  vendor_action: RESET
  action: reset_device
  origin: hardware
  fault_class: device_error
  severity: critical
  message:
    en: 'Zeta NPU reported a double-bit ECC error: reset the device.'
    zh: Zeta NPU 报告双比特 ECC 错误：请复位该设备。
"""


@functools.cache
def _catalog() -> Catalog:
    return load_catalog_text(CATALOG, "zeta_catalog.yaml")


class ZetaPlugin(ChipPlugin):
    name = "zeta"
    resource_names = ("zeta.example/npu",)
    resource_prefixes = ("zeta.example/vnpu-",)
    node_label_keys = ("zeta.example/npu.present",)
    visible_devices_env = "ZETA_VISIBLE_DEVICES"
    env_prefixes = ("ZCCL_",)
    metric_names: Mapping[str, str] = {
        "zeta_npu_utilization": "accelerator_utilization",
        "zeta_npu_ecc_dbe_total": "ecc_dbe",
        "zeta_npu_health": "health",
    }
    exporter_device_labels = ("npu",)
    metric_codes: Mapping[str, tuple[str, ...]] = {"ecc_dbe": ("zeta:7",)}
    log_device_words = ("ZPU",)
    device_types = ("zeta",)
    action_map: Mapping[str, Action] = {"RESET": Action.RESET_DEVICE}
    catalog_file = "zeta_catalog.yaml"

    def detect_vendor(self, labels: Mapping[str, str]) -> bool:
        return labels.get("zeta.example/npu.present", "") == "true"

    def exporter_labels_match(self, labels: Mapping[str, str]) -> bool:
        return labels.get("model", "").startswith("Zeta ")

    def _catalog(self) -> Catalog:
        return _catalog()

    def _text_index(self) -> TextIndex:
        return TextIndex(self.catalog())
