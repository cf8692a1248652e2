"""A fake chip for tests: a real plugin with a tiny catalog (codes `fake:<n>`).

It is registered under the name "fake" (chip value `generic`), recognised by the node label
`ai.accelerator/chip-type=fake` or `trainmedic.io/fake-accelerator=true`, uses
FAKE_VISIBLE_DEVICES and exports `fake_*` metrics.
"""

from __future__ import annotations

from collections.abc import Mapping

from trainmedic.models import Action, Chip
from trainmedic.udal.base import ChipPlugin

ACTION_MAP: Mapping[str, Action] = {
    "RESTART": Action.RESTART_APP,
    "RESET": Action.RESET_DEVICE,
    "IGNORE": Action.IGNORE,
    "ISOLATE": Action.ISOLATE_NODE,
}


class FakePlugin(ChipPlugin):
    # Its findings are reported as `generic`: a test double, not a chip of its own (so the Prometheus
    # source, which reads every chip's exporter by default, does not query `fake_*` series).
    chip = Chip.GENERIC
    name = "fake"
    resource_names = ("trainmedic.io/fake-accelerator",)
    node_label_keys = ("trainmedic.io/fake-accelerator",)
    visible_devices_env = "FAKE_VISIBLE_DEVICES"
    metric_names: Mapping[str, str] = {
        "fake_utilization": "accelerator_utilization",
        "fake_memory_used": "accelerator_memory_used",
        "fake_memory_total": "accelerator_memory_total",
        "fake_temperature": "accelerator_temperature",
        "fake_power": "accelerator_power",
        "fake_health": "health",
    }
    frameworks: Mapping[str, str] = {"pytorch": "torch (CPU, gloo)"}
    action_map = ACTION_MAP
    catalog_file = "fake_catalog.yaml"

    def detect_vendor(self, labels: Mapping[str, str]) -> bool:
        return labels.get("trainmedic.io/fake-accelerator", "").strip().lower() == "true"
